//! The console's one look at the deployment (docs/operations.md#console): a task that reads
//! every subscription through the [`Backend`] after each change the broker reports (joins,
//! leaves, promotions, step-downs, deletes; at a gateway also the cluster's lines), and every
//! [`TICK`] while a console is open, never more often than every [`MIN_SPACING`]. Each look
//! becomes a [`Snapshot`] that every open page renders from, so the number of consoles open
//! does not multiply what the broker or JetStream is asked. Between looks it keeps each
//! subscription's rates ([`RATE_SAMPLES`] of them) and each SINGLETON's leadership timeline.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use tokio::sync::{Notify, watch};

use super::{
    timeline::{Seen, Timeline, Who},
    view::{BrokerFigures, GatewayFigures, Pool},
};
use crate::{
    backend::{Backend, Storage},
    broker::{BrokerStats, Description},
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

/// Rate samples kept per subscription (one per look at least a second after the last: three
/// minutes at one a second).
pub const RATE_SAMPLES: usize = 180;

/// The longest metadata a timeline keeps of a member (the line shows it whole).
pub const TIMELINE_METADATA_CHARS: usize = 200;

/// One subscription at one look.
#[derive(Debug, Clone)]
pub struct SubRecord {
    /// As `DescribeSubscription` would describe it (at a gateway: without its line).
    pub description: Description,
    /// Cluster mode, SINGLETON: its line as this gateway's copy of the bucket holds it.
    pub line: Option<SubValue>,
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
    /// Why the last look could not list the subscriptions (JetStream did not answer), if so.
    pub trouble: Option<String>,
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

/// A subscription's rates.
#[derive(Debug, Clone, Default)]
struct Rates {
    /// Counters at the last sample: queued, acked, and when (ms).
    last: Option<(u64, u64, u64)>,
    /// Per second, oldest first.
    samples: VecDeque<(f32, f32)>,
}

impl Rates {
    fn now(&self) -> (f64, f64) {
        self.samples
            .back()
            .map_or((0.0, 0.0), |&(p, a)| (f64::from(p), f64::from(a)))
    }

    fn sample(&mut self, queued: u64, acked: u64, now_ms: u64) {
        match self.last {
            Some((q, a, at)) if now_ms.saturating_sub(at) >= 900 => {
                let seconds = (now_ms - at) as f64 / 1000.0;
                let per = |now: u64, then: u64| (now.saturating_sub(then) as f64 / seconds) as f32;
                self.samples.push_back((per(queued, q), per(acked, a)));
                while self.samples.len() > RATE_SAMPLES {
                    self.samples.pop_front();
                }
                self.last = Some((queued, acked, now_ms));
            }
            Some(_) => {}
            None => self.last = Some((queued, acked, now_ms)),
        }
    }
}

/// What the hub keeps between looks.
#[derive(Debug, Default)]
struct State {
    rates: BTreeMap<Arc<str>, Rates>,
    broker_rate: Rates,
    timelines: BTreeMap<Arc<str>, Timeline>,
    /// Embedded: each subscription's completed hand-overs at the last look; cluster mode: the
    /// epoch its line last asked to end.
    handovers: BTreeMap<Arc<str>, u64>,
    /// When a gateway last listed every subscription.
    listed_at: Option<tokio::time::Instant>,
}

/// The console's look at the deployment, shared by every page.
pub struct Hub {
    backend: Backend,
    clock: Arc<dyn Clock>,
    transport: Arc<TransportStats>,
    state: Mutex<State>,
    snapshot: watch::Sender<Arc<Snapshot>>,
    viewers: AtomicUsize,
    wake: Notify,
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
            state: Mutex::new(State::default()),
            snapshot: watch::Sender::new(Arc::new(Snapshot::default())),
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

    /// The latest look, once one was taken (waiting up to `patience` for the first).
    pub async fn ready(&self, patience: Duration) -> Arc<Snapshot> {
        let mut snapshots = self.snapshots();
        let _ = tokio::time::timeout(patience, snapshots.wait_for(|s| s.ready)).await;
        snapshots.borrow().clone()
    }

    /// A subscription's current rates (published, acked per second) and its leader's start.
    pub fn extra(&self, id: &str) -> ((f64, f64), Option<u64>) {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        (
            state.rates.get(id).map_or((0.0, 0.0), Rates::now),
            state.timelines.get(id).and_then(Timeline::since),
        )
    }

    /// A subscription's timeline (newest first) and rate samples (oldest first).
    pub fn history(&self, id: &str) -> (Vec<super::timeline::Reign>, Vec<(f32, f32)>) {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        (
            state
                .timelines
                .get(id)
                .map(|t| t.reigns().cloned().collect())
                .unwrap_or_default(),
            state
                .rates
                .get(id)
                .map(|r| r.samples.iter().copied().collect())
                .unwrap_or_default(),
        )
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

    /// One look: a new snapshot, rates and timelines brought up to date.
    async fn look(&self) {
        let previous = self.snapshot.borrow().clone();
        let gateway = matches!(self.backend, Backend::Gateway(_));
        let list_all = !gateway || {
            let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            state
                .listed_at
                .is_none_or(|at| at.elapsed() >= GATEWAY_LISTING_EVERY)
        };
        let (descriptions, stats, trouble, complete) = if list_all {
            match self.backend.list_all().await {
                Ok((descriptions, stats)) => (descriptions, stats, None, true),
                Err(error) => {
                    let (local, stats) = self.local_merged(&previous);
                    (local, stats, Some(error.to_string()), false)
                }
            }
        } else {
            let (merged, stats) = self.local_merged(&previous);
            (merged, stats, previous.trouble.clone(), false)
        };
        let lines = self.backend.cluster_lines().await;
        let now_ms = self.clock.unix_millis();
        let mut subs: Vec<SubRecord> = descriptions
            .into_iter()
            .map(|description| {
                let line = lines.as_ref().and_then(|l| {
                    (description.view.spec.mode == Mode::Singleton)
                        .then(|| l.lines.get(&*description.view.subscription_id).cloned())
                        .flatten()
                });
                SubRecord { description, line }
            })
            .collect();
        subs.sort_by(|a, b| {
            a.description
                .view
                .subscription_id
                .cmp(&b.description.view.subscription_id)
        });
        let this_gateway = lines.as_ref().map(|l| l.this_gateway);
        let gateway_figures = match &self.backend {
            Backend::Gateway(g) => {
                let (stream, _) = g.stream();
                let gateways = lines.as_ref().map_or(0, |l| l.gateways);
                Some(GatewayFigures {
                    id: this_gateway.unwrap_or(0),
                    nats: g.connected_to(),
                    stream,
                    gateways,
                    current: lines.as_ref().is_some_and(|l| l.current),
                })
            }
            Backend::Embedded(_) => None,
        };
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if list_all && complete {
            state.listed_at = Some(tokio::time::Instant::now());
        }
        self.follow(&mut state, &subs, now_ms, complete);
        state.broker_rate.sample(stats.published, 0, now_ms);
        let broker = BrokerFigures {
            subscriptions: subs.len(),
            connections: self.transport.snapshot().connections_open,
            members: stats.members,
            publish_rate: state.broker_rate.now().0,
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
        drop(state);
        self.snapshot.send_replace(Arc::new(Snapshot {
            now_ms,
            ready: true,
            broker,
            gateway: gateway_figures,
            subs,
            trouble,
        }));
    }

    /// A gateway's look between listings: the last listing, with this gateway's own
    /// subscriptions as its broker holds them now.
    fn local_merged(&self, previous: &Snapshot) -> (Vec<Description>, BrokerStats) {
        let (local, stats) = self.backend.broker().list();
        let mut all: BTreeMap<Arc<str>, Description> = previous
            .subs
            .iter()
            .map(|r| {
                (
                    r.description.view.subscription_id.clone(),
                    r.description.clone(),
                )
            })
            .collect();
        for view in local {
            let id = view.subscription_id.clone();
            let upstream = all.get(&id).and_then(|d| d.upstream.clone());
            all.insert(
                id,
                Description {
                    upstream,
                    ..Description::from(view)
                },
            );
        }
        (all.into_values().collect(), stats)
    }

    /// Rates and timelines after a look at `subs`; with `complete`, a subscription not seen is
    /// gone.
    fn follow(&self, state: &mut State, subs: &[SubRecord], now_ms: u64, complete: bool) {
        let mut seen_ids = BTreeSet::new();
        for record in subs {
            let view = &record.description.view;
            let id = view.subscription_id.clone();
            seen_ids.insert(id.clone());
            state.rates.entry(id.clone()).or_default().sample(
                view.counters.enqueued,
                view.counters.acked,
                now_ms,
            );
            if view.spec.mode != Mode::Singleton {
                continue;
            }
            let seen = match &record.line {
                Some(line) => {
                    let asked = state.handovers.insert(id.clone(), line.hand_over);
                    seen_in_line(line, asked.unwrap_or(0) != 0 || line.hand_over != 0)
                }
                None if matches!(self.backend, Backend::Gateway(_)) => continue,
                None => {
                    let before = state.handovers.insert(id.clone(), view.counters.handovers);
                    seen_in_view(
                        &record.description,
                        before.is_some_and(|b| b < view.counters.handovers),
                    )
                }
            };
            state
                .timelines
                .entry(id)
                .or_default()
                .observe(now_ms, &seen);
        }
        if complete {
            for (id, timeline) in &mut state.timelines {
                if !seen_ids.contains(id) {
                    timeline.deleted(now_ms);
                }
            }
            state.timelines.retain(|id, _| seen_ids.contains(id));
            state.rates.retain(|id, _| seen_ids.contains(id));
            state.handovers.retain(|id, _| seen_ids.contains(id));
        }
    }
}

fn truncated(text: &str) -> String {
    text.chars().take(TIMELINE_METADATA_CHARS).collect()
}

/// What a look at an embedded (or this gateway's local) SINGLETON saw.
fn seen_in_view(description: &Description, handed_over: bool) -> Seen {
    let view = &description.view;
    let active = view.members.iter().find(|m| m.active);
    Seen {
        active: active.map(|m| Who {
            member: m.member_id,
            gateway: None,
        }),
        epoch: active.map_or(view.epoch, |m| m.epoch),
        metadata: active
            .and_then(|m| view.metadata.get(&m.member_id))
            .map(|m| truncated(m))
            .unwrap_or_default(),
        since_ms: None,
        line: view
            .members
            .iter()
            .map(|m| {
                (
                    Who {
                        member: m.member_id,
                        gateway: None,
                    },
                    m.priority,
                )
            })
            .collect(),
        handed_over,
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
        since_ms: None,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_per_second_over_the_time_between_samples_and_bounded() {
        let mut rates = Rates::default();
        rates.sample(0, 0, 1_000);
        rates.sample(10, 5, 1_500); // too soon: not a sample
        rates.sample(20, 10, 3_000);
        assert_eq!(rates.now(), (10.0, 5.0));
        for i in 0..(RATE_SAMPLES as u64 * 2) {
            rates.sample(20 + i, 10, 4_000 + i * 1_000);
        }
        assert_eq!(rates.samples.len(), RATE_SAMPLES);
        // A counter that went back (a subscription made again) is no negative rate.
        rates.sample(0, 0, 1_000_000);
        assert_eq!(rates.now(), (0.0, 0.0));
    }
}
