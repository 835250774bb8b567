//! The shell's loop: it feeds the coordinator this gateway's inputs, the bucket's watch and
//! the time, and carries out what it decides on the backplane, the fence records and the local
//! broker.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use tokio::{sync::mpsc, task::JoinSet};
use tokio_stream::StreamExt;

use crate::cluster::gateway::{
    control::fence::Recording,
    control::leaders::Leaders,
    control::lease::LeaseGate,
    control::waits::HandOverWaiter,
    control::waits::{AfterActivation, Deferred, Telling, recorded, step_down_activated},
};
use crate::{
    broker::Upstream,
    cluster::{
        backplane::{Backplane, BoxFuture, KvError, Watch},
        coordinator::{Command, Config, Coordinator, Effect, EndStatus, Op, Proclaimed, RequestId},
        values::{GatewayId, Key},
    },
    core::{Error, MemberId},
};

use super::{ClusterLines, Input, Leased, Proclaiming, Waiting, watched};
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
pub(super) struct Views {
    pub(super) lease: Arc<LeaseGate>,
    pub(super) current_id: Arc<std::sync::atomic::AtomicU64>,
    pub(super) leased: Leased,
}

pub(super) async fn run(
    backplane: Arc<dyn Backplane>,
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
        tracing::info!(gateway = id.0, lease = ?config.lease, "singleton coordination started");
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
                        if let Some(Key::Line(sub)) = Key::parse(&e.key) {
                            leaders.line_changed(&coordinator, &sub);
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
                            && matches!(key, Key::Lease(_))
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
    backplane: &Arc<dyn Backplane>,
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
        let ending = match (&op, &key) {
            (Op::Delete(_), Key::Line(sub)) => coordinator
                .line(sub)
                .map(|line| (sub.clone(), line.epoch))
                .filter(|&(_, epoch)| epoch != 0)
                .map(|ended| (recording.clone(), ended)),
            _ => None,
        };
        // A lease renewal not answered within a sixth of the lease is followed by another
        // (Coordinator::write_slow), several within the lease, so the gateway renews as soon as
        // NATS has elected the bucket's next leader; the slow one runs on, and its answer still
        // counts when it comes.
        let renewal = matches!((&key, &op), (Key::Lease(_), Op::Update(..)));
        if renewal {
            let bound = coordinator.config().lease / 6;
            slow.spawn(async move {
                tokio::time::sleep(bound).await;
                id
            });
        }
        // A renewal (or this gateway's first lease) is sent at once, ahead of queued writes.
        let own_lease = key == Key::Lease(coordinator.id());
        writes.submit(own_lease, async move {
            let spelled = key.to_string();
            let result = match op {
                Op::Create(value) => backplane.create(&spelled, value).await,
                Op::Update(value, expected) => backplane.update(&spelled, value, expected).await,
                Op::Delete(expected) => backplane.delete(&spelled, expected).await,
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
