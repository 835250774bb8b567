//! SINGLETON subscriptions across gateways: the shell that runs this gateway's
//! [`Coordinator`] over the KV backplane ([`NatsBackplane`]) and carries out what it decides on
//! the local broker.
//!
//! - A singleton member that joins here joins the local (arbitrated) subscription on standby
//!   and is announced to the coordinator, which appends it to the subscription's line in the
//!   bucket. When the line makes it active, [`Upstream::activate`] sends its confirmation with
//!   the cluster's epoch and the bridge starts pulling for it.
//! - When a member leaves, the bridge first gives back what this gateway held (when no active
//!   member remains here), then tells the coordinator ([`Handle::left`]), whose write promotes
//!   the next member in the line, on whichever gateway it is.
//! - When this gateway's lease lapses, nothing is done for a singleton member until it is
//!   renewed (docs/semantics.md#cluster-lease-lapse); when it ends for good (deleted by another
//!   gateway, or lapsed for `--gateway-lapse-patience`, 0 by default), the coordinator ends every local member with
//!   `UNAVAILABLE` ([`Upstream::end_member`]) and fences itself; this shell then starts a new
//!   incarnation, with a new gateway id, for members that join afterwards.
//!
//! - The shell publishes the lease it holds ([`LeaseGate`]) after every input: a member
//!   joins only while it is valid (and waits for it, bounded, when it is not), and the bridge
//!   hands a message to a member, or sends JetStream an ack, only while it is valid at that
//!   moment by the clock read then (docs/semantics.md#cluster-lease-checks).
//!
//! Time is the gateway's monotonic clock (tokio's), from when the shell started.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use tokio::{
    sync::{mpsc, oneshot},
    task::JoinSet,
};
use tokio_stream::StreamExt;

use crate::cluster::gateway::{
    control::fence::{Fences, Recording},
    control::leaders::Leaders,
    control::lease::LeaseGate,
    control::waits::HandOverWaiter,
    control::waits::{AfterActivation, Deferred, Telling, recorded, step_down_activated},
};
use crate::{
    broker::{HandedOver, LeadershipWatch, Upstream},
    cluster::{
        backplane::{Backplane, BoxFuture, KvError, Revision, Watch},
        coordinator::{Command, Config, Coordinator, Effect, EndStatus, Op, Proclaimed, RequestId},
        nats::NatsBackplane,
        values::GatewayId,
    },
    core::{Error, MemberId},
};

/// What the gateway tells the coordinator.
#[derive(Debug)]
enum Input {
    /// A member joined while incarnation `.2`'s lease was valid, with metadata and priority
    /// `.3`; `.4` is told once it is in the line (or why it cannot be).
    Joined(
        Arc<str>,
        MemberId,
        u64,
        (Arc<str>, u32),
        oneshot::Sender<Result<(), Error>>,
    ),
    /// A local active member replaces its metadata; told once the line holds it.
    Proclaim(
        Arc<str>,
        MemberId,
        Arc<str>,
        oneshot::Sender<Result<(), Error>>,
    ),
    Left(Arc<str>, MemberId, Vec<(u64, u32)>),
    /// A local member stepping down holds nothing, and what waited here went back (with these
    /// attempts): the line may move past it.
    Yielded(Arc<str>, MemberId, Vec<(u64, u32)>),
    /// A `HandOver`, asked of the line as the bucket's leader held it at revision `.1` (or
    /// later): told the outcome once the line shows it.
    HandOver(
        Arc<str>,
        Revision,
        oneshot::Sender<Result<HandedOver, Error>>,
    ),
    /// Someone watches the subscription's leadership: told its state now, then each change.
    Watch(Arc<str>, oneshot::Sender<LeadershipWatch>),
    /// The fence record of an activation's epoch is stored: the member may be activated.
    Recorded(Arc<str>, MemberId, crate::broker::Activation),
    /// What this gateway's copy of the line says: whether a member is active, and the epoch.
    Line(Arc<str>, oneshot::Sender<Option<(bool, u64)>>),
    /// The record of a stepped-down member's ended epoch is stored: the member is told, at
    /// its place in line `.2`.
    SteppedDown(Arc<str>, MemberId, u32),
    /// A console asks for this gateway's copy of every line, as it stands (docs/operations.md#console).
    Lines(oneshot::Sender<ClusterLines>),
}

/// This gateway's copy of the cluster's lines, for a console (docs/operations.md#console).
#[derive(Debug, Clone, Default)]
pub struct ClusterLines {
    /// This gateway's id (its incarnation) when asked.
    pub this_gateway: u64,
    /// Whether this gateway held its lease and had caught up with the bucket: when not, the
    /// copy may be behind.
    pub current: bool,
    /// How many gateways hold a lease, as this gateway last saw the bucket.
    pub gateways: usize,
    /// Every subscription's line, by subscription id.
    pub lines: std::collections::BTreeMap<Arc<str>, crate::cluster::values::SubValue>,
}

/// The gateway's line to its coordinator shell: cheap to clone.
#[derive(Debug, Clone)]
pub(in crate::cluster::gateway) struct Handle {
    inputs: mpsc::UnboundedSender<Input>,
    /// This gateway's id now (its lease is `lease.<id>`), for a delete's question to every
    /// gateway (`delete`).
    current_id: Arc<std::sync::atomic::AtomicU64>,
    lease: Arc<LeaseGate>,
    /// The gateways holding a lease, as this gateway's watch of the bucket last saw them.
    leased: Leased,
}

/// Joins waiting for their place in the line, or proclamations for the line to hold them:
/// each answered once, by its member.
type Waiting = BTreeMap<(Arc<str>, MemberId), oneshot::Sender<Result<(), Error>>>;

/// Proclamations waiting for the line to hold them, by member: several of one member may
/// overlap, and the line holding the latest answers every one of them (the earlier ones were
/// replaced by the member itself).
type Proclaiming = BTreeMap<(Arc<str>, MemberId), Vec<oneshot::Sender<Result<(), Error>>>>;

/// The ids of the gateways holding a lease (`lease.<id>` keys), kept from the coordination
/// bucket's watch; `None` until the watch has delivered.
type Leased = Arc<std::sync::Mutex<Option<std::collections::BTreeSet<u64>>>>;

/// Applies one watched entry to the leased set: a lease key written adds its gateway, one
/// deleted removes it.
fn watched(leased: &Leased, key: &str, value: Option<&[u8]>) {
    let Some(gateway) = key
        .strip_prefix("lease.")
        .and_then(|g| g.parse::<u64>().ok())
    else {
        return;
    };
    let mut leased = leased
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let set = leased.get_or_insert_with(Default::default);
    if value.is_some_and(|v| !v.is_empty()) {
        set.insert(gateway);
    } else {
        set.remove(&gateway);
    }
}

impl Handle {
    /// The gateways holding a lease, as the bucket's watch last saw them (`None` before it
    /// delivered): whom an announcement waits for (`announce`), without a listing of the
    /// bucket per join.
    pub(in crate::cluster::gateway) fn leased_gateways(
        &self,
    ) -> Option<std::collections::BTreeSet<u64>> {
        self.leased
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// A singleton member joined the local subscription (on standby), admitted while
    /// `incarnation`'s lease was valid ([`LeaseGate::wait_valid`]). If that incarnation has
    /// ended by the time the coordinator hears of it, the member is ended with `UNAVAILABLE`
    /// rather than appended to the line late, behind members that joined later elsewhere.
    /// Resolves once the member is in the line (a closed channel: it was ended first; an
    /// error: the line has no room for its metadata).
    pub(in crate::cluster::gateway) fn joined(
        &self,
        subscription: Arc<str>,
        member: MemberId,
        incarnation: u64,
        (metadata, priority): (Arc<str>, u32),
    ) -> oneshot::Receiver<Result<(), Error>> {
        let (in_line, told) = oneshot::channel();
        let _ = self.inputs.send(Input::Joined(
            subscription,
            member,
            incarnation,
            (metadata, priority),
            in_line,
        ));
        told
    }

    /// Local member `member`, stepping down, holds nothing, and what this gateway held went
    /// back; `carry` as for [`Handle::left`].
    pub(in crate::cluster::gateway) fn yielded(
        &self,
        subscription: Arc<str>,
        member: MemberId,
        carry: Vec<(u64, u32)>,
    ) {
        let _ = self
            .inputs
            .send(Input::Yielded(subscription, member, carry));
    }

    /// Asks `subscription`'s active member, at whichever gateway, to hand over
    /// (docs/semantics.md#cluster-priority-and-hand-over); resolves with the outcome once this
    /// gateway's copy of the line shows it.
    ///
    /// # Errors
    /// [`Error::HandOverRefused`] as the line says; [`Error::Unavailable`] when the shell
    /// stopped, or this gateway lost its lease, before the outcome was known.
    pub(in crate::cluster::gateway) async fn hand_over(
        &self,
        subscription: Arc<str>,
        at_least: Revision,
    ) -> Result<HandedOver, Error> {
        let (reply, answer) = oneshot::channel();
        let _ = self
            .inputs
            .send(Input::HandOver(subscription.clone(), at_least, reply));
        answer.await.unwrap_or_else(|_| {
            Err(Error::Unavailable(format!(
                "this gateway lost its place in the cluster before the hand-over of subscription {subscription:?} was seen; it may yet happen: watch its leadership"
            )))
        })
    }

    /// Local active member `member` replaces its metadata in the line
    /// (docs/semantics.md#member-metadata). Resolves once the line holds it (a closed
    /// channel: the member left, or was ended, first).
    pub(in crate::cluster::gateway) fn proclaim(
        &self,
        subscription: Arc<str>,
        member: MemberId,
        metadata: Arc<str>,
    ) -> oneshot::Receiver<Result<(), Error>> {
        let (done, told) = oneshot::channel();
        let _ = self
            .inputs
            .send(Input::Proclaim(subscription, member, metadata, done));
        told
    }

    /// This gateway's lease as the shell last published it.
    pub(in crate::cluster::gateway) fn lease(&self) -> &Arc<LeaseGate> {
        &self.lease
    }

    /// A singleton member left, and what it held was given back; `carry` names the attempts
    /// those messages' next deliveries must carry at least.
    pub(in crate::cluster::gateway) fn left(
        &self,
        subscription: Arc<str>,
        member: MemberId,
        carry: Vec<(u64, u32)>,
    ) {
        let _ = self.inputs.send(Input::Left(subscription, member, carry));
    }

    /// Watches subscription `subscription`'s leadership as the coordination bucket records
    /// it: its line's active member and epoch, from this gateway's watch of the bucket.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when the shell has stopped.
    pub(in crate::cluster::gateway) async fn watch(
        &self,
        subscription: Arc<str>,
    ) -> Result<LeadershipWatch, Error> {
        let (reply, answer) = oneshot::channel();
        let _ = self.inputs.send(Input::Watch(subscription, reply));
        answer.await.map_err(|_| {
            Error::Unavailable("this gateway's singleton coordination has stopped".into())
        })
    }

    /// Whether this gateway's copy of `subscription`'s line has an active member, and its
    /// epoch; `None` with no line (or no coordination).
    pub(in crate::cluster::gateway) async fn line(
        &self,
        subscription: Arc<str>,
    ) -> Option<(bool, u64)> {
        let (reply, answer) = oneshot::channel();
        let _ = self.inputs.send(Input::Line(subscription, reply));
        answer.await.ok().flatten()
    }

    /// This gateway's copy of every line, for a console; `None` once the shell stopped.
    pub(in crate::cluster::gateway) async fn lines(&self) -> Option<ClusterLines> {
        let (reply, answer) = oneshot::channel();
        let _ = self.inputs.send(Input::Lines(reply));
        answer.await.ok()
    }

    /// This gateway's incarnation now (the id its lease is kept under).
    pub(in crate::cluster::gateway) fn incarnation(&self) -> Arc<std::sync::atomic::AtomicU64> {
        self.current_id.clone()
    }
}

/// Starts the shell; it runs until every [`Handle`] is dropped.
pub(in crate::cluster::gateway) fn spawn(
    backplane: NatsBackplane,
    broker: Upstream,
    config: Config,
    fences: Arc<Fences>,
) -> (Handle, tokio::task::JoinHandle<()>) {
    let (inputs, rx) = mpsc::unbounded_channel();
    let current_id = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let start = tokio::time::Instant::now();
    let lease = Arc::new(LeaseGate::new(start));
    let gate = lease.clone();
    broker.gate_singleton_deliveries(Arc::new(move || gate.valid_term()));
    let leased: Leased = Arc::default();
    let task = tokio::spawn(run(
        backplane,
        broker,
        config,
        rx,
        start,
        Views {
            lease: lease.clone(),
            current_id: current_id.clone(),
            leased: leased.clone(),
        },
        Recording::new(
            fences,
            lease.clone(),
            {
                let inputs = inputs.clone();
                move |subscription, member, activation| {
                    let _ = inputs.send(Input::Recorded(subscription, member, activation));
                }
            },
            {
                let inputs = inputs.clone();
                move |subscription, member, position| {
                    let _ = inputs.send(Input::SteppedDown(subscription, member, position));
                }
            },
        ),
    ));
    (
        Handle {
            inputs,
            current_id,
            lease,
            leased,
        },
        task,
    )
}

use crate::cluster::gateway::control::writes::Writes;

/// How long a gateway whose lease create was not confirmed waits before its next incarnation.
const NEW_INCARNATION_PAUSE: Duration = Duration::from_secs(1);

/// A gateway id for a new incarnation: random, so unique for the life of the bucket with
/// overwhelming probability (the OS seeds std's hasher keys).
fn fresh_id() -> GatewayId {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    // Keep it within JSON's exact integers, for anyone reading the bucket with other tools.
    GatewayId(hasher.finish() >> 11)
}

/// What the shell publishes for the rest of the gateway to read: the lease, the incarnation's
/// id, the leased gateways.
struct Views {
    lease: Arc<LeaseGate>,
    current_id: Arc<std::sync::atomic::AtomicU64>,
    leased: Leased,
}

async fn run(
    backplane: NatsBackplane,
    broker: Upstream,
    config: Config,
    mut inputs: mpsc::UnboundedReceiver<Input>,
    start: tokio::time::Instant,
    views: Views,
    recording: Recording,
) {
    let Views {
        lease,
        current_id,
        leased,
    } = views;
    let now = || start.elapsed();
    let mut incarnation = 0;
    // The watched subscriptions' leadership, and since when each live line has had its
    // active member and epoch (docs/semantics.md#watching-leadership).
    let mut leaders = Leaders::default();
    loop {
        let id = fresh_id();
        current_id.store(id.0, std::sync::atomic::Ordering::Relaxed);
        incarnation += 1;
        lease.publish(incarnation, None);
        let mut coordinator = Coordinator::new(id, config, now());
        tracing::info!(gateway = id.0, bucket = backplane.bucket(), lease = ?config.lease, "singleton coordination started");
        let mut watch: Option<Watch> = None;
        // (Re)opening the watch is one more event of the loop, never a wait outside it: the
        // lease's timer, renewals and members are served meanwhile, so a gateway whose lease
        // lapses while NATS is slow to answer still stops acting, and ends its members, on time.
        let mut opening: Option<BoxFuture<'_, Result<Watch, KvError>>> = Some(backplane.watch(""));
        let mut writes = Writes::default();
        // Renewals' deadlines (a sixth of the lease): one past it is followed by another.
        let mut slow: JoinSet<RequestId> = JoinSet::new();
        // Joins to answer once their member is in the line; dropped with the incarnation (the
        // member was ended, and its stream says so).
        let mut joining: Waiting = BTreeMap::new();
        // Proclamations to answer once the line holds them; dropped with the incarnation.
        let mut proclaiming: Proclaiming = BTreeMap::new();
        // Hand-overs to answer once the line shows their outcome; dropped with the
        // incarnation (they are answered UNAVAILABLE).
        let mut handing_over: Vec<HandOverWaiter> = Vec::new();
        // Leadership questions (hand-overs, watches, the line) asked before this gateway's
        // copy of the lines caught up with its lease (docs/semantics.md#cluster-leadership-current):
        // answered once it has; dropped with the incarnation (answered UNAVAILABLE).
        let mut parked: Vec<Input> = Vec::new();
        let mut after_activation: AfterActivation = BTreeMap::new();
        let mut telling: Telling = Telling::default();
        // Whether the lease is lapsed, as last logged, and the lapses counted in the metrics.
        let mut lapsed = false;
        let mut counted = (0, 0);
        // Activations whose fence record was stored while the lease was lapsed
        // (docs/semantics.md#cluster-lease-lapse).
        let mut deferred: Deferred = Vec::new();
        loop {
            // Bounded: a question whose asker gave up (after its 5 s) goes.
            parked.retain(|question| !asker_gone(question));
            if !parked.is_empty() && coordinator.caught_up(now()) {
                let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut parked)
                    .into_iter()
                    .partition(|question| answerable(question, now(), &coordinator));
                parked = waiting;
                for question in ready {
                    answer(
                        question,
                        now(),
                        &mut coordinator,
                        &mut leaders,
                        &mut handing_over,
                    );
                }
            }
            handing_over.retain_mut(|waiter| !waiter.answered(&mut coordinator));
            if !deferred.is_empty() && coordinator.may_act(now()) {
                for (sub, member, activation) in std::mem::take(&mut deferred) {
                    if coordinator.still_active(&sub, member, activation.epoch)
                        && let Err(error) = broker.activate(&sub, member, activation)
                    {
                        tracing::debug!(subscription = %sub, member, %error, "could not activate a member");
                    }
                    recording.settled(&sub, member);
                    step_down_activated(
                        now(),
                        &mut coordinator,
                        &broker,
                        &mut after_activation,
                        &sub,
                        member,
                    );
                }
            }
            // The gate first: a lease that ended closes it before its members are ended, one
            // renewed opens it before an activation goes out.
            lease.publish(incarnation, coordinator.lease_valid_until());
            carry_out(
                now(),
                &mut coordinator,
                &backplane,
                &broker,
                (&mut writes, &mut slow),
                (
                    &mut joining,
                    &mut proclaiming,
                    &mut after_activation,
                    &mut telling,
                ),
                &recording,
            );
            for (sub, member, activation) in std::mem::take(&mut telling.released) {
                recorded(
                    now(),
                    &mut coordinator,
                    &broker,
                    &recording,
                    (&mut deferred, &mut after_activation),
                    sub,
                    member,
                    activation,
                );
            }
            let (lapses, renewed) = coordinator.lapses();
            broker.count_lease_lapses(lapses - counted.0, renewed - counted.1);
            counted = (lapses, renewed);
            if coordinator.is_lapsed() != lapsed {
                lapsed = !lapsed;
                if lapsed {
                    // Its view of the lines may fall behind from now on: every watch here ends
                    // UNAVAILABLE (watch again, at any gateway), and new ones wait for a lease.
                    leaders.cut_off();
                    tracing::warn!(
                        gateway = id.0,
                        patience = ?config.lapse_patience,
                        "this gateway's cluster lease lapsed unrenewed (NATS not answering, or its coordination bucket electing a leader): its singleton members get nothing until it is renewed"
                    );
                } else {
                    tracing::info!(
                        gateway = id.0,
                        "this gateway's cluster lease was renewed after a lapse: its singleton members go on"
                    );
                }
            }
            if coordinator.is_fenced() {
                // Its view of the bucket is not current: every watch here ends UNAVAILABLE,
                // and no record of an activation here is written any more.
                leaders.cut_off();
                recording.lost_all();
                if coordinator.was_leased() {
                    tracing::error!(
                        gateway = id.0,
                        "this gateway's cluster lease ended (deleted by another gateway that found it stale, or not renewed within the lapse patience): its singleton members were ended with UNAVAILABLE; starting a new incarnation"
                    );
                } else {
                    // Never leased: its lease create was not confirmed (NATS unreachable or
                    // slow), and a create is never repeated. Pause before the next one, so an
                    // answer that comes at once (no responders) does not make a tight loop.
                    tracing::warn!(
                        gateway = id.0,
                        pause = ?NEW_INCARNATION_PAUSE,
                        "NATS did not confirm this gateway's cluster lease: its singleton members were ended with UNAVAILABLE; starting a new incarnation after a pause"
                    );
                    tokio::time::sleep(NEW_INCARNATION_PAUSE).await;
                }
                break;
            }
            if watch.is_none() && opening.is_none() {
                let backplane = &backplane;
                opening = Some(Box::pin(async move {
                    tokio::time::sleep(config.retry).await;
                    backplane.watch("").await
                }));
            }
            let deadline = coordinator.poll_timeout().map(|t| start + t);
            tokio::select! {
                // The timer first: after a pause of the process, the lease is checked before
                // any input that waited is taken.
                biased;
                () = sleep_until(deadline) => coordinator.tick(now()),
                input = inputs.recv() => match input {
                    Some(Input::Joined(sub, member, admitted, (metadata, priority), in_line)) if admitted == incarnation => {
                        // A line is one value of the bucket: its metadata is bounded
                        // (docs/semantics.md#cluster-metadata).
                        if !coordinator.metadata_room(&sub, metadata.len()) {
                            let _ = in_line.send(Err(no_room(&sub, metadata.len())));
                            continue;
                        }
                        coordinator.member_joined_with(now(), &sub, member, metadata.to_string(), priority);
                        joining.insert((sub, member), in_line);
                    }
                    // Admitted under a lease that has ended since: its place would come late.
                    Some(Input::Joined(sub, member, ..)) => end_member(&broker, &sub, member),
                    Some(Input::Proclaim(sub, member, metadata, done)) => {
                        match coordinator.proclaim(now(), &sub, member, metadata.to_string()) {
                            Proclaimed::Taken => {
                                proclaiming.entry((sub, member)).or_default().push(done);
                            }
                            // Gone: the closed channel says so.
                            Proclaimed::NotHere => {}
                            Proclaimed::NoRoom => {
                                let _ = done.send(Err(no_room(&sub, metadata.len())));
                            }
                        }
                    }
                    Some(Input::Left(sub, member, carry)) => {
                        recording.lost(&sub, member);
                        after_activation.remove(&(sub.clone(), member));
                        for (sub, member, activation) in telling.told(&sub, member) {
                            recorded(now(), &mut coordinator, &broker, &recording, (&mut deferred, &mut after_activation), sub, member, activation);
                        }
                        joining.remove(&(sub.clone(), member));
                        proclaiming.remove(&(sub.clone(), member));
                        coordinator.member_left_carrying(now(), &sub, member, carry);
                    }
                    Some(Input::Yielded(sub, member, carry)) => {
                        coordinator.member_yielded(now(), &sub, member, carry);
                    }
                    Some(Input::Lines(reply)) => {
                        let at = now();
                        let _ = reply.send(ClusterLines {
                            this_gateway: coordinator.id().0,
                            current: coordinator.may_act(at) && coordinator.caught_up(at),
                            gateways: coordinator.live_gateways(),
                            lines: coordinator.lines().map(|(sub, line)| (Arc::from(sub), line.clone())).collect(),
                        });
                    }
                    Some(question @ (Input::HandOver(..) | Input::Watch(..) | Input::Line(..))) => {
                        if answerable(&question, now(), &coordinator) {
                            answer(question, now(), &mut coordinator, &mut leaders, &mut handing_over);
                        } else if parked.len() < MAX_PARKED {
                            parked.push(question);
                        } else {
                            // Dropped: its asker is answered UNAVAILABLE.
                            tracing::warn!("{MAX_PARKED} leadership questions already wait for this gateway's copy of the lines to catch up: one more is refused");
                        }
                    }
                    Some(Input::Recorded(sub, member, activation)) => {
                        // A member not yet told it stepped down is told first.
                        if let Some((sub, member, activation)) = telling.hold((sub, member, activation)) {
                            recorded(now(), &mut coordinator, &broker, &recording, (&mut deferred, &mut after_activation), sub, member, activation);
                        }
                    }
                    Some(Input::SteppedDown(sub, member, position)) => {
                        broker.stepped_down(&sub, member, position);
                        for (sub, member, activation) in telling.told(&sub, member) {
                            recorded(now(), &mut coordinator, &broker, &recording, (&mut deferred, &mut after_activation), sub, member, activation);
                        }
                    }
                    None => return,
                },
                opened = async { opening.as_mut()?.await.into() }, if opening.is_some() => {
                    opening = None;
                    match opened {
                        Some(Ok(w)) => {
                            // A new watch delivers every key again.
                            *leased.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = None;
                            watch = Some(w);
                        }
                        Some(Err(error)) => tracing::warn!(%error, "cannot watch the coordination bucket; retrying"),
                        None => {}
                    }
                }
                entry = async { watch.as_mut()?.next().await }, if watch.is_some() => match entry {
                    Some(Ok(e)) => {
                        watched(&leased, &e.key, e.value.as_deref());
                        coordinator.backplane_changed(now(), &e.key, e.value.as_deref(), e.revision);
                        if let Some(sub) = e.key.strip_prefix("sub.") {
                            leaders.line_changed(&coordinator, sub);
                            // A console looks again (docs/operations.md#console).
                            broker.note_change();
                        }
                    }
                    Some(Err(error)) => tracing::warn!(%error, "the coordination watch lost contact; it resumes"),
                    None => watch = None,
                },
                Some(Ok(id)) = slow.join_next(), if !slow.is_empty() => coordinator.write_slow(now(), id),
                done = writes.next(), if !writes.is_empty() => {
                    if let Some((request, key, result)) = done {
                        if let Err(error) = &result
                            && key.starts_with("lease.")
                        {
                            tracing::warn!(gateway = id.0, %key, %error, "a write of this gateway's cluster lease failed");
                        }
                        coordinator.write_result(now(), request, result);
                    }
                }
            }
        }
    }
}

/// The most leadership questions that wait at once for this gateway's copy of the lines to
/// catch up (each bounded by its asker's 5 s).
const MAX_PARKED: usize = 10_000;

/// Whether the one who asked `question` gave up waiting for the answer.
fn asker_gone(question: &Input) -> bool {
    match question {
        Input::HandOver(_, _, reply) => reply.is_closed(),
        Input::Watch(_, reply) => reply.is_closed(),
        Input::Line(_, reply) => reply.is_closed(),
        _ => false,
    }
}

/// Whether a leadership question may be answered now: this gateway's copy of the lines has
/// caught up with its lease, and a hand-over's with the line as it was when it was asked.
fn answerable(question: &Input, now: Duration, coordinator: &Coordinator) -> bool {
    coordinator.caught_up(now)
        && match question {
            Input::HandOver(_, at_least, _) => coordinator.has_seen(*at_least),
            _ => true,
        }
}

/// Answers a leadership question from this gateway's copy of the lines, which has caught up
/// with its lease. A hand-over whose asker gave up meanwhile is not started.
fn answer(
    question: Input,
    now: Duration,
    coordinator: &mut Coordinator,
    leaders: &mut Leaders,
    handing_over: &mut Vec<HandOverWaiter>,
) {
    match question {
        Input::HandOver(sub, _, reply) if !reply.is_closed() => {
            match coordinator.hand_over(now, &sub) {
                Ok((previous, epoch)) => {
                    handing_over.push(HandOverWaiter::new(sub, previous, epoch, reply));
                }
                Err(reason) => {
                    let _ = reply.send(Err(Error::HandOverRefused {
                        subscription: sub.to_string(),
                        reason,
                    }));
                }
            }
        }
        Input::Watch(sub, reply) => {
            let _ = reply.send(leaders.watch(coordinator, sub));
        }
        Input::Line(sub, reply) => {
            let line = coordinator
                .line(&sub)
                .map(|v| (v.active.is_some(), v.epoch));
            let _ = reply.send(line);
        }
        _ => {}
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Runs the coordinator's writes and applies its effects to the local broker.
fn carry_out(
    now: Duration,
    coordinator: &mut Coordinator,
    backplane: &NatsBackplane,
    broker: &Upstream,
    (writes, slow): (&mut Writes, &mut JoinSet<RequestId>),
    (joining, proclaiming, after_activation, telling): (
        &mut Waiting,
        &mut Proclaiming,
        &mut AfterActivation,
        &mut Telling,
    ),
    recording: &Recording,
) {
    while let Some(Command { id, key, op }) = coordinator.poll_command() {
        let backplane = backplane.clone();
        // A line this write empties: its epoch ends (docs/semantics.md#cluster-fenced-publish).
        let ending = match &op {
            Op::Delete(_) => key
                .strip_prefix("sub.")
                .and_then(|sub| Some((sub.to_string(), coordinator.line(sub)?.epoch)))
                .filter(|&(_, epoch)| epoch != 0)
                .map(|ended| (recording.clone(), ended)),
            _ => None,
        };
        // A lease renewal not answered within a sixth of the lease is followed by another
        // (Coordinator::write_slow), several within the lease, so the gateway renews as soon as
        // NATS has elected the bucket's next leader; the slow one runs on, and its answer still
        // counts when it comes.
        let renewal = key.starts_with("lease.") && matches!(op, Op::Update(..));
        if renewal {
            let bound = coordinator.config().lease / 6;
            slow.spawn(async move {
                tokio::time::sleep(bound).await;
                id
            });
        }
        // A renewal (or this gateway's first lease) is sent at once, ahead of queued writes.
        let own_lease = key == crate::cluster::coordinator::lease_key(coordinator.id());
        writes.submit(own_lease, async move {
            let result = match op {
                Op::Create(value) => backplane.create(&key, value).await,
                Op::Update(value, expected) => backplane.update(&key, value, expected).await,
                Op::Delete(expected) => backplane.delete(&key, expected).await,
            };
            if result.is_ok()
                && let Some((recording, (subscription, epoch))) = ending
            {
                recording.ended(subscription, epoch);
            }
            (id, key, result)
        });
    }
    while let Some(effect) = coordinator.poll_effect() {
        match effect {
            Effect::InLine {
                subscription,
                member,
            } => {
                if let Some(in_line) = joining.remove(&(Arc::from(subscription), member)) {
                    let _ = in_line.send(Ok(()));
                }
            }
            Effect::Proclaimed {
                subscription,
                member,
            } => {
                for done in proclaiming
                    .remove(&(Arc::from(subscription), member))
                    .unwrap_or_default()
                {
                    let _ = done.send(Ok(()));
                }
            }
            Effect::Activate {
                subscription,
                member,
                epoch,
                carry,
                promoted,
                took_over,
            } => {
                let activation = crate::broker::Activation {
                    epoch,
                    carry,
                    promoted,
                    took_over,
                };
                // Its epoch's fence record first (docs/semantics.md#cluster-fenced-publish):
                // activated by Input::Recorded once JetStream stored it.
                recording.activate(subscription, member, activation);
            }
            Effect::Standby {
                subscription,
                member,
                position,
            } => broker.place_in_line(&subscription, member, position),
            Effect::StepDown {
                subscription,
                member,
                cause,
            } => {
                if !broker.step_down(&subscription, member, cause) {
                    if recording.activating(&subscription, member) {
                        // Not active here yet (its fence record is on its way): confirmed
                        // first, then it steps down. Yielding now would move the line past a
                        // member never confirmed with the epoch a hand-over's answer names.
                        after_activation.insert((Arc::from(subscription.as_str()), member), cause);
                    } else {
                        // Never to be active here: it holds nothing.
                        coordinator.member_yielded(now, &subscription, member, Vec::new());
                    }
                }
            }
            Effect::CallOffStepDown {
                subscription,
                member,
            } => {
                after_activation.remove(&(Arc::from(subscription.as_str()), member));
                broker.call_off_step_down(&subscription, member);
            }
            Effect::SteppedDown {
                subscription,
                member,
                position,
                epoch,
            } => {
                // Told once its epoch's record says it ended; an activation that follows
                // (promoted again at once) waits for that (Input::SteppedDown).
                telling.insert(Arc::from(subscription.as_str()), member);
                recording.stepped_down(subscription, member, position, epoch);
            }
            Effect::End {
                subscription,
                member,
                status,
            } => {
                recording.lost(&subscription, member);
                let key = (Arc::from(subscription.as_str()), member);
                after_activation.remove(&key);
                let released = telling.told(&key.0, member);
                telling.released.extend(released);
                let in_line = joining.remove(&key);
                proclaiming.remove(&key);
                match status {
                    EndStatus::Unavailable => end_member(broker, &subscription, member),
                    EndStatus::LineFull => {
                        // Joins at several gateways at once filled the line together
                        // (docs/semantics.md#cluster-metadata): this one never entered it.
                        let error = line_full(&subscription);
                        if let Some(in_line) = in_line {
                            let _ = in_line.send(Err(error.clone()));
                        }
                        broker.end_member(&subscription, member, &error);
                    }
                }
            }
        }
    }
}

/// A line has no room for `bytes` more of metadata (docs/semantics.md#cluster-metadata).
fn no_room(subscription: &str, bytes: usize) -> Error {
    Error::cluster(
        crate::core::ErrorKind::ResourceExhausted,
        format!(
            "subscription {subscription:?}'s line holds too much member metadata to take {bytes} bytes more: in cluster mode a singleton's members together carry at most {} bytes (the line is one value of the coordination bucket); use less metadata",
            crate::cluster::coordinator::MAX_LINE_METADATA
        ),
    )
}

/// A line whose value would pass its size bound with this member (docs/semantics.md#cluster-metadata).
fn line_full(subscription: &str) -> Error {
    Error::cluster(
        crate::core::ErrorKind::ResourceExhausted,
        format!(
            "subscription {subscription:?}'s line is full: with this member its value in the coordination bucket would pass {} bytes (members joining at several gateways at once carried too much metadata together); the member did not join: use less metadata",
            crate::cluster::coordinator::MAX_LINE_BYTES
        ),
    )
}

fn end_member(broker: &Upstream, subscription: &str, member: MemberId) {
    broker.end_member(
        subscription,
        member,
        &Error::Unavailable(
            "this gateway lost its place in the cluster (its lease lapsed, or the cluster removed this member): rejoin, at any gateway"
                .into(),
        ),
    );
}

/// Coordinator timing for a gateway lease of `lease`: renewals every third of it, a clock
/// drift bound of 1 %, and a margin of a tenth of the lease (at least 100 ms) for timers and
/// processing.
pub fn config(lease: Duration, lapse_patience: Duration) -> Config {
    Config {
        lease,
        max_drift_percent: 1,
        margin: (lease / 10).max(Duration::from_millis(100)),
        retry: (lease / 20).max(Duration::from_millis(50)),
        lapse_patience,
    }
}
