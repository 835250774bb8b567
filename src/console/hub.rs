//! The console's one look at the deployment (docs/operations.md#console): a task that reads
//! every subscription through the [`Backend`] after each change the broker reports (joins,
//! leaves, promotions, step-downs, deletes; at a gateway also the cluster's lines), and every
//! [`TICK`] while a console is open, never more often than every [`MIN_SPACING`]. Each look
//! becomes a [`Snapshot`] that every open page renders from, so the number of consoles open
//! does not multiply what the broker or JetStream is asked. Between looks it keeps each
//! subscription's rates (`rates.rs`) and each SINGLETON's leadership timeline.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use tokio::sync::{Notify, watch};

use super::{
    rates::Rates,
    timeline::{Seen, Timeline, Who},
    view::{BrokerFigures, GatewayFigures, Pool},
};
use crate::{
    backend::{Backend, Storage},
    broker::{Activity, Description},
    clock::Clock,
    cluster::values::SubValue,
    core::Mode,
    transport::TransportStats,
};

/// How often the console looks while a page is open (rates move every look).
pub const TICK: Duration = Duration::from_secs(1);

/// The least time between two looks: changes that come faster are seen together.
pub const MIN_SPACING: Duration = Duration::from_millis(100);

/// A gateway lists the stream's consumers (every subscription, with its backlog) at most this
/// often; looks in between take the lines and this gateway's own members only.
pub const GATEWAY_LISTING_EVERY: Duration = Duration::from_secs(2);

/// The longest metadata a timeline keeps of a member (the line shows it whole).
pub const TIMELINE_METADATA_CHARS: usize = 200;

/// One subscription at one look: cheap to clone (a look copies every record).
#[derive(Debug, Clone)]
pub struct SubRecord {
    /// As `DescribeSubscription` would describe it (at a gateway: without its line), when its
    /// membership or leadership last changed.
    pub description: Arc<Description>,
    /// What publishes and acks moved since, as of this look.
    pub activity: Activity,
    /// Cluster mode, SINGLETON: its line as this gateway's copy of the bucket holds it.
    pub line: Option<Arc<SubValue>>,
    /// Published (queued) and acked a second, at the last read of its activity.
    pub rates: (f64, f64),
}

impl SubRecord {
    /// A record of `description`, its activity as described.
    pub fn new(description: Description) -> Self {
        let view = &description.view;
        let activity = Activity {
            queued_messages: view.queued_messages,
            in_flight: view.in_flight,
            counters: view.counters,
        };
        Self {
            description: Arc::new(description),
            activity,
            line: None,
            rates: (0.0, 0.0),
        }
    }

    fn id(&self) -> &Arc<str> {
        &self.description.view.subscription_id
    }
}

/// Everything one look saw.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// When, in ms since the Unix epoch by the broker's clock.
    pub now_ms: u64,
    /// Whether a look was taken yet.
    pub ready: bool,
    /// Broker-wide figures.
    pub broker: BrokerFigures,
    /// Cluster mode: the gateway.
    pub gateway: Option<GatewayFigures>,
    /// Every subscription, in id order.
    pub subs: Vec<SubRecord>,
}

impl Default for BrokerFigures {
    fn default() -> Self {
        Self {
            subscriptions: 0,
            connections: 0,
            members: 0,
            publish_rate: 0.0,
            memory: Pool { used: 0, limit: 0 },
            drop_oldest_memory: Pool { used: 0, limit: 0 },
            storage: String::new(),
        }
    }
}

impl Snapshot {
    /// `embedded` or `gateway`.
    pub fn deployment(&self) -> &'static str {
        if self.gateway.is_some() {
            "gateway"
        } else {
            "embedded"
        }
    }

    /// The subscription `id`, if this look saw it.
    pub fn find(&self, id: &str) -> Option<&SubRecord> {
        self.subs
            .binary_search_by(|r| (*r.description.view.subscription_id).cmp(id))
            .ok()
            .map(|at| &self.subs[at])
    }

    /// A snapshot of these subscriptions (sorted here), for the view's tests.
    #[cfg(test)]
    pub fn for_tests(mut subs: Vec<SubRecord>) -> Self {
        subs.sort_by(|a, b| {
            a.description
                .view
                .subscription_id
                .cmp(&b.description.view.subscription_id)
        });
        Self {
            ready: true,
            subs,
            ..Self::default()
        }
    }
}

/// What the hub keeps between looks.
#[derive(Debug, Default)]
struct State {
    /// Every subscription as last seen, by id.
    records: BTreeMap<Arc<str>, SubRecord>,
    /// When the last listing of every subscription was (none yet: the next look lists).
    listed_at: Option<tokio::time::Instant>,
    /// When activity was last read (rates are per second over the time between).
    active_at: Option<tokio::time::Instant>,
}

/// The console's look at the deployment, shared by every page.
pub struct Hub {
    backend: Backend,
    clock: Arc<dyn Clock>,
    transport: Arc<TransportStats>,
    state: tokio::sync::Mutex<State>,
    /// Rates and timelines as of the last look, for rendering (never held across an await).
    shown: Mutex<Shown>,
    snapshot: watch::Sender<Arc<Snapshot>>,
    /// Counts looks begun.
    begun: std::sync::atomic::AtomicU64,
    /// Counts looks done, also those that found nothing moved (and sent no snapshot).
    looks: watch::Sender<u64>,
    /// The next look reads every subscription's activity, however recent the last read.
    fresh: std::sync::atomic::AtomicBool,
    /// When the last look was, in ms since the Unix epoch (0: none yet).
    looked_ms: std::sync::atomic::AtomicU64,
    viewers: AtomicUsize,
    wake: Notify,
}

/// What pages read besides the snapshot, kept up to date by each look: rates and timelines.
#[derive(Debug, Default)]
struct Shown {
    rates: BTreeMap<Arc<str>, Rates>,
    broker_rate: Rates,
    timelines: BTreeMap<Arc<str>, Timeline>,
    /// Cluster mode: the epoch each line last asked to end (`hand_over`).
    handovers: BTreeMap<Arc<str>, u64>,
}

/// An open page: the hub looks every [`TICK`] while one is held.
pub struct Viewer(Arc<Hub>);

impl Drop for Viewer {
    fn drop(&mut self) {
        self.0.viewers.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Hub {
    /// A hub over `backend`; [`run`](Self::run) it.
    pub fn new(backend: Backend, clock: Arc<dyn Clock>, transport: Arc<TransportStats>) -> Self {
        Self {
            backend,
            clock,
            transport,
            state: tokio::sync::Mutex::new(State::default()),
            shown: Mutex::new(Shown::default()),
            snapshot: watch::Sender::new(Arc::new(Snapshot::default())),
            begun: std::sync::atomic::AtomicU64::new(0),
            looks: watch::Sender::new(0),
            fresh: std::sync::atomic::AtomicBool::new(false),
            looked_ms: std::sync::atomic::AtomicU64::new(0),
            viewers: AtomicUsize::new(0),
            wake: Notify::new(),
        }
    }

    /// The backend it looks at.
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// Counts an open page until dropped, and looks now if none was open.
    pub fn viewer(self: &Arc<Self>) -> Viewer {
        if self.viewers.fetch_add(1, Ordering::Relaxed) == 0 {
            self.wake.notify_one();
        }
        Viewer(self.clone())
    }

    /// The latest look, and each next one.
    pub fn snapshots(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.snapshot.subscribe()
    }

    /// The next look, asked for now and waited for up to `patience` (then the latest): what
    /// an answer to a request, or a page's first event, shows is what was true when it came,
    /// not what the last look saw (publishes and acks do not wake the hub).
    pub async fn current(&self, patience: Duration) -> Arc<Snapshot> {
        let mut looks = self.looks.subscribe();
        // Looks run one at a time: the first to begin after now is done when this many are.
        let after = self.begun.load(Ordering::SeqCst) + 1;
        self.fresh.store(true, Ordering::SeqCst);
        self.wake.notify_one();
        let _ = tokio::time::timeout(patience, looks.wait_for(|done| *done >= after)).await;
        self.snapshot.borrow().clone()
    }

    fn shown(&self) -> std::sync::MutexGuard<'_, Shown> {
        self.shown.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// When a subscription's current leader began, as its timeline has it.
    pub fn since(&self, id: &str) -> Option<u64> {
        self.shown().timelines.get(id).and_then(Timeline::since)
    }

    /// A subscription's timeline (newest first) and a rate a second over the last
    /// three minutes before `now_ms` (oldest first).
    pub fn history(&self, id: &str, now_ms: u64) -> (Vec<super::timeline::Reign>, Vec<(f32, f32)>) {
        let shown = self.shown();
        (
            shown
                .timelines
                .get(id)
                .map(|t| t.reigns().cloned().collect())
                .unwrap_or_default(),
            shown
                .rates
                .get(id)
                .map(|r| r.series(now_ms))
                .unwrap_or_default(),
        )
    }

    /// `record` with what this broker holds of it now (its members' windows and times), for a
    /// subscription's page.
    pub fn fresh(&self, record: &SubRecord) -> SubRecord {
        match self.backend.broker().describe(record.id()) {
            Ok(view) => SubRecord {
                description: Arc::new(Description {
                    view,
                    ..(*record.description).clone()
                }),
                ..record.clone()
            },
            Err(_) => record.clone(),
        }
    }

    /// Looks after each change and every [`TICK`] while a page is open, until the broker stops.
    pub async fn run(self: Arc<Self>) {
        let mut changes = self.backend.broker().changes();
        loop {
            let looked = tokio::time::Instant::now();
            self.look().await;
            let open = self.viewers.load(Ordering::Relaxed) > 0;
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { return },
                () = tokio::time::sleep(TICK), if open => {}
                () = self.wake.notified() => {}
            }
            tokio::time::sleep_until(looked + MIN_SPACING).await;
        }
    }

    /// One look: the subscriptions whose membership or leadership changed described again
    /// (every one at the first look, after more than the broker remembers, and at a gateway
    /// at each listing), every subscription's activity read when a second passed, the lines
    /// taken at a gateway; then a new snapshot.
    async fn look(&self) {
        self.begun.fetch_add(1, Ordering::SeqCst);
        let mut state = self.state.lock().await;
        let state = &mut *state;
        let broker = self.backend.broker();
        let changed = broker.take_changes();
        let gateway = matches!(self.backend, Backend::Gateway(_));
        let listing_due = state.listed_at.is_none()
            || changed.everything
            || (gateway
                && self.viewers.load(Ordering::Relaxed) > 0
                && state
                    .listed_at
                    .is_none_or(|at| at.elapsed() >= GATEWAY_LISTING_EVERY));
        let now_ms = self.clock.unix_millis();
        let mut follow: BTreeSet<Arc<str>> = BTreeSet::new();
        let mut complete = false;
        let mut removed = false;
        let mut recreated: Vec<Arc<str>> = Vec::new();
        let mut listed_moved = false;
        if listing_due {
            match self.backend.list_all().await {
                Ok((descriptions, _)) => {
                    let lines: BTreeMap<Arc<str>, Option<Arc<SubValue>>> = state
                        .records
                        .iter()
                        .map(|(id, r)| (id.clone(), r.line.clone()))
                        .collect();
                    let before = std::mem::take(&mut state.records);
                    state.records = descriptions
                        .into_iter()
                        .map(|d| {
                            let mut record = SubRecord::new(d);
                            record.line = lines.get(record.id()).cloned().flatten();
                            (record.id().clone(), record)
                        })
                        .collect();
                    // Followed (and shown anew): what the listing found new or changed.
                    for (id, record) in &state.records {
                        if before
                            .get(id)
                            .is_none_or(|b| !same_shown(&b.description, &record.description))
                        {
                            follow.insert(id.clone());
                        }
                    }
                    listed_moved = before.len() != state.records.len()
                        || before.keys().any(|id| !state.records.contains_key(id));
                    state.listed_at = Some(tokio::time::Instant::now());
                    complete = true;
                }
                Err(error) => {
                    tracing::warn!(%error, "console: the subscriptions could not be listed; the last listing stands");
                }
            }
        }
        if !complete {
            for id in changed.ids {
                match broker.describe(&id) {
                    Ok(view) => {
                        // Deleted and made again under its id since the last look: its
                        // counters start again, and so do its rates and timeline.
                        // (At a gateway the local copy comes and goes with its members;
                        // the cluster's line carries the timeline.)
                        if !gateway
                            && state.records.get(&id).is_some_and(|r| {
                                let before = &r.activity.counters;
                                view.counters.enqueued < before.enqueued
                                    || view.counters.promotions < before.promotions
                                    || view.counters.delivered < before.delivered
                            })
                        {
                            recreated.push(id.clone());
                        }
                        let upstream = state
                            .records
                            .get(&id)
                            .and_then(|r| r.description.upstream.clone());
                        let mut record = SubRecord::new(Description {
                            upstream,
                            ..Description::from(view)
                        });
                        record.line = state.records.get(&id).and_then(|r| r.line.clone());
                        state.records.insert(id.clone(), record);
                    }
                    // Gone from this broker: embedded, gone; at a gateway, described from
                    // JetStream at the next listing.
                    Err(_) if !gateway => {
                        removed |= state.records.remove(&id).is_some();
                    }
                    Err(_) => {}
                }
                follow.insert(id);
            }
        }
        let lines = self.backend.cluster_lines().await;
        if let Some(lines) = &lines {
            for (id, record) in &mut state.records {
                if record.description.view.spec.mode != Mode::Singleton {
                    continue;
                }
                let line = lines.lines.get(&**id);
                if record.line.as_deref() != line {
                    record.line = line.cloned().map(Arc::new);
                    follow.insert(id.clone());
                }
            }
        }
        let due = self.fresh.swap(false, Ordering::SeqCst)
            || state
                .active_at
                .is_none_or(|at| at.elapsed() >= TICK - MIN_SPACING);
        let (activity, stats) = if due {
            state.active_at = Some(tokio::time::Instant::now());
            let (activity, stats) = broker.activity();
            (Some(activity), stats)
        } else {
            (None, broker.stats_now())
        };
        // Whether anything a page shows moved: when not, no new snapshot (and no page
        // renders again); relative times move on in the page itself.
        let mut moved = listed_moved || !follow.is_empty();
        let mut shown = self.shown();
        for id in &recreated {
            shown.timelines.remove(id);
            shown.rates.remove(id);
            shown.handovers.remove(id);
        }
        if let Some(activity) = activity {
            // Both in id order: walked together.
            let mut records = state.records.iter_mut().peekable();
            for (id, now) in activity {
                while records.peek().is_some_and(|(k, _)| ***k < *id) {
                    records.next();
                }
                let Some((_, record)) = records.peek_mut().filter(|(k, _)| ***k == *id) else {
                    continue;
                };
                if record.activity == now && record.rates == (0.0, 0.0) {
                    continue;
                }
                if record.activity != now {
                    record.activity = now;
                    moved = true;
                }
                let rates = shown.rates.entry(id).or_default();
                rates.sample(now.counters.enqueued, now.counters.acked, now_ms);
                if record.rates != rates.now() {
                    record.rates = rates.now();
                    moved = true;
                }
            }
            shown.broker_rate.sample(stats.published, 0, now_ms);
        }
        self.follow(
            &mut shown,
            &state.records,
            &follow,
            now_ms,
            complete || removed,
        );
        let publish_rate = shown.broker_rate.now().0;
        drop(shown);
        let this_gateway = lines.as_ref().map(|l| l.this_gateway);
        let gateway_figures = match &self.backend {
            Backend::Gateway(g) => Some(GatewayFigures {
                id: this_gateway.unwrap_or(0),
                nats: g.connected_to(),
                stream: g.stream().0,
                gateways: lines.as_ref().map_or(0, |l| l.gateways),
                current: lines.as_ref().is_some_and(|l| l.current),
            }),
            Backend::Embedded(_) => None,
        };
        let broker_figures = BrokerFigures {
            subscriptions: state.records.len(),
            connections: self.transport.snapshot().connections_open,
            members: stats.members,
            publish_rate,
            memory: Pool {
                used: stats.memory_accounted_bytes,
                limit: stats.max_memory_bytes,
            },
            drop_oldest_memory: Pool {
                used: stats.memory_drop_oldest_bytes,
                limit: stats.max_drop_oldest_memory_bytes,
            },
            storage: storage_text(&self.backend.storage()),
        };
        let previous = self.snapshot.borrow().clone();
        let moved = moved
            || !previous.ready
            || previous.broker != broker_figures
            || previous.gateway != gateway_figures
            || previous.subs.len() != state.records.len();
        self.looked_ms.store(now_ms, Ordering::Relaxed);
        if moved {
            self.snapshot.send_replace(Arc::new(Snapshot {
                now_ms,
                ready: true,
                broker: broker_figures,
                gateway: gateway_figures,
                subs: state.records.values().cloned().collect(),
            }));
        }
        self.looks.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Timelines after a look, for the subscriptions in `follow`; with `prune`, a timeline
    /// or rate of a subscription no longer recorded is gone.
    fn follow(
        &self,
        state: &mut Shown,
        records: &BTreeMap<Arc<str>, SubRecord>,
        follow: &BTreeSet<Arc<str>>,
        now_ms: u64,
        prune: bool,
    ) {
        for id in follow {
            let Some(record) = records.get(id) else {
                continue;
            };
            let view = &record.description.view;
            if view.spec.mode != Mode::Singleton {
                continue;
            }
            let seen = match &record.line {
                Some(line) => {
                    let asked = state.handovers.insert(id.clone(), line.hand_over);
                    seen_in_line(line, asked.unwrap_or(0) != 0 || line.hand_over != 0)
                }
                None if matches!(self.backend, Backend::Gateway(_)) => continue,
                // Embedded: the broker counts every step-down as a hand-over, for priority
                // too; which it was is read from the priorities (a HandOver's successor is
                // of the active member's priority, a higher one would have taken over).
                None => seen_in_view(&record.description),
            };
            state
                .timelines
                .entry(id.clone())
                .or_default()
                .observe(now_ms, &seen);
        }
        if prune {
            state.timelines.retain(|id, _| records.contains_key(id));
            state.rates.retain(|id, _| records.contains_key(id));
            state.handovers.retain(|id, _| records.contains_key(id));
        }
    }
}

/// Whether two descriptions show the same on a page (a memberless subscription's countdown
/// to expiry is not shown).
fn same_shown(a: &Description, b: &Description) -> bool {
    let (x, y) = (&a.view, &b.view);
    x.subscription_id == y.subscription_id
        && x.spec == y.spec
        && x.members == y.members
        && x.epoch == y.epoch
        && x.queued_messages == y.queued_messages
        && x.in_flight == y.in_flight
        && x.counters == y.counters
        && x.metadata == y.metadata
        && x.stepping_down == y.stepping_down
        && x.joined_unix_ms == y.joined_unix_ms
        && a.upstream == b.upstream
        && a.active_member == b.active_member
        && a.active_metadata == b.active_metadata
}

fn truncated(text: &str) -> String {
    text.chars().take(TIMELINE_METADATA_CHARS).collect()
}

/// What a look at an embedded (or this gateway's local) SINGLETON saw.
fn seen_in_view(description: &Description) -> Seen {
    let view = &description.view;
    let who = |member| Who {
        member,
        gateway: None,
    };
    let active = view.members.iter().find(|m| m.active);
    Seen {
        active: active.map(|m| who(m.member_id)),
        epoch: active.map_or(view.epoch, |m| m.epoch),
        metadata: active
            .and_then(|m| view.metadata.get(&m.member_id))
            .map(|m| truncated(m))
            .unwrap_or_default(),
        line: view
            .members
            .iter()
            .map(|m| (who(m.member_id), m.priority))
            .collect(),
        handed_over: false,
        took_over: false,
    }
}

/// What a look at a SINGLETON's line in the coordination bucket saw.
fn seen_in_line(line: &SubValue, handed_over: bool) -> Seen {
    let who = |uid: crate::cluster::values::MemberUid| Who {
        member: uid.member,
        gateway: Some(uid.gateway.0),
    };
    Seen {
        active: line.active.map(who),
        epoch: line.epoch,
        metadata: truncated(line.active_meta()),
        line: line
            .line
            .iter()
            .map(|uid| (who(*uid), line.priority_of(*uid)))
            .collect(),
        handed_over,
        took_over: line.took_over,
    }
}

/// Where confirmed messages are kept, in words.
fn storage_text(storage: &Storage) -> String {
    match storage {
        Storage::Memory => "memory (this process)".into(),
        Storage::JetStream {
            stream,
            storage,
            replicas,
            ..
        } => format!("JetStream stream {stream}, {storage} storage, {replicas} replica(s)"),
    }
}
