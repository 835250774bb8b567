//! Fuzz targets for tinybroker. Each is a plain function of the input bytes, so the main
//! package's `cargo test` replays the committed corpus (`fuzz/corpus/<target>/`) and any crash
//! artifacts (`fuzz/artifacts/<target>/`) through the same code on stable Rust, without
//! cargo-fuzz.

use std::{collections::BTreeSet, time::Duration};

use arbitrary::{Arbitrary, Unstructured};
use prost::Message as _;
use tinybroker::{
    broker::Broker,
    clock::TokioClock,
    core::{
        AckMode, Effect, Envelope, Error, Headers, IdFloor, Limits, MemberOptions, Message, Mode,
        Overflow, Pattern, PatternIndex, QueueLimits, Subscription, SubscriptionSpec, Topic,
    },
    pb, service,
};

#[derive(Debug, Arbitrary)]
enum Op {
    Join {
        window: u8,
        notify: bool,
    },
    Leave {
        pick: u8,
    },
    Publish {
        size: u8,
    },
    Ack {
        member: Option<u8>,
        pick: u8,
    },
    Nack {
        member: Option<u8>,
        pick: u8,
    },
    AckRaw {
        member: Option<u8>,
        system_id: u16,
    },
    Tick {
        ms: u16,
    },
    /// The broker restarts: the subscription is gone, and the new run reads a wall clock moved
    /// `micros` forward, or back.
    Restart {
        micros: u16,
        back: bool,
    },
    /// docs/semantics.md#releases: a give-back that keeps the attempt, once per attempt.
    Release {
        member: Option<u8>,
        pick: u8,
    },
    /// docs/semantics.md#priority: a member that may outrank the active one.
    JoinRanked {
        window: u8,
        priority: u8,
    },
    /// docs/semantics.md#hand-over: a `HandOver` request.
    HandOver,
    /// The shell's hand-over deadline, for the step-down in progress or (`stale`) an older one.
    StepDownOverdue {
        stale: bool,
    },
}

/// The wall clock at the first run's start, in microseconds since the Unix epoch.
const START_MICROS: u64 = 1_767_225_600_000_000;

#[derive(Debug, Arbitrary)]
struct Machine {
    mode: u8,
    max_attempts: u8,
    max_messages: u8,
    max_members: u8,
    ops: Vec<Op>,
}

/// `group_state_machine`: an arbitrary sequence of operations applied to one subscription's
/// core, with broker restarts (the clock passed in); docs/semantics.md#singleton-invariants and the core's
/// bookkeeping are asserted after every step, and ids stay above every earlier run's whenever
/// the clock at restart is past them.
pub fn group_state_machine(data: &[u8]) {
    let Ok(machine) = Machine::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    let mode = [Mode::Singleton, Mode::Queue, Mode::Broadcast][usize::from(machine.mode % 3)];
    let spec = SubscriptionSpec {
        mode,
        consumer_group: "g".into(),
        patterns: vec![Pattern::parse("a.>").expect("valid pattern")],
        max_delivery_attempts: u32::from(machine.max_attempts % 5),
        dead_letter_topic: (machine.max_attempts % 2 == 1)
            .then(|| Topic::parse("dead.a").expect("valid topic")),
        // Ack-free keeps what members hold in their own lists, not the in-flight map: the
        // same operations must keep the same invariants.
        ack_mode: if machine.max_members & 0x80 != 0 {
            AckMode::None
        } else {
            AckMode::Explicit
        },
        overflow: if machine.max_messages & 0x80 != 0 {
            Overflow::DropOldest
        } else {
            Overflow::RejectPublish
        },
    };
    let limits = QueueLimits {
        max_messages: u64::from(machine.max_messages % 16) + 1,
        max_bytes: 4096,
        max_members: usize::from(machine.max_members % 8) + 1,
        idle_timeout: Duration::from_secs(10),
    };
    let mut now = Duration::ZERO;
    let mut wall = START_MICROS;
    let floor = IdFloor::at_start(wall);
    let mut sub = Subscription::new("s".into(), spec.clone(), limits, floor.floors(), now);
    let mut members: Vec<u64> = Vec::new();
    let mut next_id = floor.last_system_id();
    let mut last_epoch = floor.floors().epoch;
    // The wall clock at this run's start, and the highest id of any kind the earlier runs
    // handed out.
    let mut run_start = wall;
    let mut highest_before = 0;
    for op in machine.ops {
        let effects = match op {
            Op::Join { window, notify } => {
                let options = MemberOptions {
                    max_in_flight: u32::from(window % 4),
                    notify_standby: notify,
                    priority: 0,
                };
                match sub.join(&spec, options) {
                    Ok((member, fx)) => {
                        members.push(member);
                        fx
                    }
                    Err(Error::BroadcastTaken(_) | Error::TooManyMembers { .. }) => vec![],
                    Err(e) => panic!("unexpected join error: {e}"),
                }
            }
            Op::JoinRanked { window, priority } => {
                let options = MemberOptions {
                    max_in_flight: u32::from(window % 4),
                    notify_standby: true,
                    priority: u32::from(priority % 3),
                };
                let active = sub.active_members().next();
                match sub.join(&spec, options) {
                    Ok((member, fx)) => {
                        members.push(member);
                        // A takeover begins only from a member that outranks the active one,
                        // and never completes holding a message.
                        if fx.iter().any(|e| matches!(e, Effect::SteppingDown { .. })) {
                            assert!(active.is_some() && mode == Mode::Singleton, "{fx:?}");
                        }
                        fx
                    }
                    Err(Error::BroadcastTaken(_) | Error::TooManyMembers { .. }) => vec![],
                    Err(e) => panic!("unexpected join error: {e}"),
                }
            }
            Op::HandOver => {
                let before = (sub.active_members().next(), sub.epoch());
                match sub.hand_over() {
                    Ok((step, fx)) => {
                        assert_eq!(Some(step.member), before.0, "the active member steps down");
                        fx
                    }
                    Err(Error::HandOverRefused { .. } | Error::NotSingleton { .. }) => {
                        assert_eq!(
                            before,
                            (sub.active_members().next(), sub.epoch()),
                            "a refused hand-over changed the leadership"
                        );
                        vec![]
                    }
                    Err(e) => panic!("unexpected hand-over error: {e}"),
                }
            }
            Op::StepDownOverdue { stale } => match (sub.stepping_down(), stale) {
                (Some(step), false) => sub.step_down_overdue(step.seq),
                (Some(step), true) => {
                    let fx = sub.step_down_overdue(step.seq.wrapping_sub(1));
                    assert!(fx.is_empty(), "a stale deadline acted: {fx:?}");
                    fx
                }
                (None, _) => sub.step_down_overdue(1),
            },
            Op::Leave { pick } if !members.is_empty() => {
                let member = members.remove(usize::from(pick) % members.len());
                sub.leave(member, now)
            }
            Op::Leave { .. } => vec![],
            Op::Publish { size } => {
                next_id += 1;
                let envelope =
                    Envelope::new(Topic::parse("a.b").expect("valid topic"), Headers::new());
                let message = Message::new(next_id, 0, envelope, &vec![0; usize::from(size)]);
                match sub.check_publish(message.size()) {
                    Ok(()) => sub.enqueue(message),
                    Err(_) => sub.enqueue_or_drop(message),
                }
            }
            Op::Ack { member, pick } | Op::Nack { member, pick } | Op::Release { member, pick } => {
                let held: Vec<(u64, u64)> = sub.in_flight_ids().collect();
                if held.is_empty() {
                    continue;
                }
                let (system_id, holder) = held[usize::from(pick) % held.len()];
                let fence = member.map(|m| {
                    if m % 2 == 0 {
                        holder
                    } else {
                        holder + u64::from(m)
                    }
                });
                let result = match op {
                    Op::Nack { .. } => sub.nack(fence, system_id),
                    Op::Release { .. } => sub.release(fence, system_id),
                    _ => sub.ack(fence, system_id),
                };
                match (result, fence) {
                    (Ok(fx), Some(f)) => {
                        assert_eq!(f, holder, "fenced ack from a non-holder was accepted");
                        fx
                    }
                    (Ok(fx), None) => fx,
                    (Err(Error::NotHolder { .. }), Some(f)) => {
                        assert_ne!(f, holder, "the holder's own ack was refused");
                        vec![]
                    }
                    (Err(e), _) => panic!("unexpected ack error: {e}"),
                }
            }
            Op::AckRaw { member, system_id } => {
                let before = (sub.queued(), sub.in_flight());
                // Near this run's ids, so some name real members and messages.
                let near = |n: u64| run_start + n;
                match sub.ack(
                    member.map(|m| near(u64::from(m))),
                    near(u64::from(system_id)),
                ) {
                    Ok(fx) => fx,
                    Err(_) => {
                        assert_eq!(
                            before,
                            (sub.queued(), sub.in_flight()),
                            "a refused ack changed state"
                        );
                        vec![]
                    }
                }
            }
            Op::Tick { ms } => {
                now += Duration::from_millis(u64::from(ms));
                wall += u64::from(ms) * 1000;
                vec![]
            }
            Op::Restart { micros, back } => {
                wall = if back {
                    wall.saturating_sub(u64::from(micros))
                } else {
                    wall + u64::from(micros)
                };
                let handed_out = sub.floors();
                highest_before = [next_id, handed_out.epoch, handed_out.member_id]
                    .into_iter()
                    .fold(highest_before, u64::max);
                run_start = wall;
                let floor = IdFloor::at_start(wall);
                sub = Subscription::new("s".into(), spec.clone(), limits, floor.floors(), now);
                members.clear();
                next_id = floor.last_system_id();
                // Within the new run epochs go up from its floor; across runs only as far as the
                // clock assumption holds (checked below).
                last_epoch = floor.floors().epoch;
                vec![]
            }
        };
        for (at, effect) in effects.iter().enumerate() {
            if let Effect::Confirm { epoch, .. } = effect {
                assert!(
                    *epoch > last_epoch,
                    "epoch went from {last_epoch} to {epoch}"
                );
                last_epoch = *epoch;
            }
            // docs/semantics.md#hand-over: a step-down ends the epoch it held and the next
            // effect confirms its successor.
            if let Effect::SteppedDown { epoch, .. } = effect {
                assert_eq!(
                    *epoch, last_epoch,
                    "stepped down from an epoch not the last"
                );
                assert!(
                    matches!(effects.get(at + 1), Some(Effect::Confirm { .. })),
                    "a step-down without a successor: {effects:?}"
                );
            }
        }
        // docs/semantics.md#restart-identity across restarts: a run that started past every id the earlier runs handed out
        // hands out only ids above them.
        if run_start >= highest_before {
            let floors = sub.floors();
            let fresh = [floors.epoch, floors.member_id, next_id];
            assert!(
                fresh
                    .iter()
                    .all(|id| *id == run_start || *id > highest_before),
                "ids {fresh:?} after a restart, earlier runs reached {highest_before}"
            );
        }
        if let Err(e) = sub.check_invariants() {
            panic!("invariant broken: {e}");
        }
    }
}

/// `topic_patterns`: arbitrary strings through the parsers (which must never panic) and, for the
/// valid ones, the routing index against naive matching.
pub fn topic_patterns(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(texts) = Vec::<String>::arbitrary(&mut u) else {
        return;
    };
    let mut patterns = Vec::new();
    let mut topics = Vec::new();
    for text in &texts {
        if let Ok(p) = Pattern::parse(text) {
            assert_eq!(p.as_str(), text);
            patterns.push(p);
        }
        if let Ok(t) = Topic::parse(text) {
            assert!(
                Pattern::parse(text).is_ok(),
                "a valid topic is a valid (literal) pattern"
            );
            topics.push(t);
        }
    }
    // Every pattern under key 0 and under its own key, so entries share nodes and keys.
    let mut index = PatternIndex::new();
    for (key, p) in patterns.iter().enumerate() {
        index.insert(p, key + 1);
        index.insert(p, 0);
    }
    let agrees = |index: &PatternIndex<usize>, held: &dyn Fn(usize) -> bool, shared: bool| {
        if let Err(e) = index.check() {
            panic!("index shape: {e}");
        }
        for topic in &topics {
            let mut naive: BTreeSet<usize> = patterns
                .iter()
                .enumerate()
                .filter(|(k, p)| held(*k) && p.matches(topic))
                .map(|(k, _)| k + 1)
                .collect();
            if shared && patterns.iter().any(|p| p.matches(topic)) {
                naive.insert(0);
            }
            assert_eq!(index.matches(topic), naive);
        }
    };
    agrees(&index, &|_| true, true);
    // Removing every other pattern's own entry, then all, keeps it in shape and empties it.
    for (key, p) in patterns.iter().enumerate().filter(|(k, _)| k % 2 == 1) {
        index.remove(p, &(key + 1));
    }
    agrees(&index, &|k| k % 2 == 0, true);
    for (key, p) in patterns.iter().enumerate() {
        index.remove(p, &(key + 1));
        index.remove(p, &0);
    }
    assert!(index.is_empty());
    agrees(&index, &|_| false, false);
}

/// `requests`: arbitrary bytes decoded as each request message, validated as the service does,
/// and applied to a broker. Nothing may panic, and the broker must stay consistent.
pub fn requests(data: &[u8]) {
    let limits = Limits {
        max_queue_messages: 8,
        max_subscriptions: 4,
        max_members_per_subscription: 3,
        max_message_bytes: 256,
        ..Limits::default()
    };
    let broker = Broker::new(limits.clone(), std::sync::Arc::new(TokioClock::new()));
    let mut streams = Vec::new();
    let mut u = Unstructured::new(data);
    // `arbitrary` hands out zeroes once the data runs out, so stop at the end explicitly.
    while !u.is_empty() {
        let (Ok(kind), Ok(bytes)) = (u8::arbitrary(&mut u), <&[u8]>::arbitrary(&mut u)) else {
            break;
        };
        // Three connections, so acks that name no member meet the connection fence.
        let connection = Some(u64::from(kind / 7 % 3));
        match kind % 7 {
            0 => {
                if let Ok(request) = pb::PublishRequest::decode(bytes)
                    && let Ok(draft) = service::draft(request, &limits)
                {
                    // docs/semantics.md#fenced-publish: stored only with the active epoch (one
                    // thread here, so nothing is promoted between the look and the publish).
                    let fence = draft.fence().cloned();
                    let leading = fence.as_ref().map(|f| {
                        broker.describe(&f.subscription_id).ok().is_some_and(|v| {
                            v.spec.mode == Mode::Singleton
                                && v.members.iter().any(|m| m.active)
                                && v.epoch == f.epoch
                        })
                    });
                    let stored = broker.publish(draft);
                    if let Some(leading) = leading {
                        assert!(
                            stored.is_err() || leading,
                            "a publish fenced by {fence:?} was stored while that epoch did not lead"
                        );
                        assert!(
                            !leading || !matches!(stored, Err(Error::Fenced { .. })),
                            "a publish fenced by the active epoch was refused: {stored:?}"
                        );
                    }
                }
            }
            1 => {
                if let Ok(batch) = pb::PublishBatchRequest::decode(bytes)
                    && batch.messages.len() <= limits.max_batch_messages
                {
                    let drafts: Result<Vec<_>, _> = batch
                        .messages
                        .into_iter()
                        .map(|m| service::draft(m, &limits))
                        .collect();
                    if let Ok(drafts) = drafts {
                        let _ = broker.publish_batch(drafts);
                    }
                }
            }
            2 => {
                if let Ok(request) = pb::OpenSubscription::decode(bytes)
                    && let Ok(open) = service::open_request(request, &limits)
                    && let Ok(stream) = broker.open(&open, connection)
                {
                    streams.push(stream);
                }
            }
            3 => {
                if let Ok(ack) = pb::Ack::decode(bytes)
                    && let Ok(fence) = service::fence(
                        &ack.subscription_id,
                        ack.system_id,
                        ack.member_id,
                        connection,
                    )
                {
                    let _ = broker.ack(&ack.subscription_id, fence, ack.system_id);
                }
            }
            4 => {
                if let Ok(nack) = pb::Nack::decode(bytes)
                    && let Ok(fence) = service::fence(
                        &nack.subscription_id,
                        nack.system_id,
                        nack.member_id,
                        connection,
                    )
                {
                    let _ = broker.nack(&nack.subscription_id, fence, nack.system_id);
                }
            }
            5 => {
                if !streams.is_empty() {
                    let i = bytes.first().map_or(0, |b| usize::from(*b)) % streams.len();
                    drop(streams.remove(i));
                }
            }
            _ if kind % 2 == 0 => {
                if let Ok(request) = pb::DescribeSubscriptionRequest::decode(bytes) {
                    let _ = broker.describe(&request.subscription_id);
                }
            }
            _ => {
                if let Ok(request) = pb::ProclaimRequest::decode(bytes)
                    && let Ok(p) = service::proclamation(request, &limits)
                {
                    let _ = broker.proclaim(&p.subscription_id, p.member, p.epoch, p.metadata);
                }
            }
        }
    }
    let (views, stats) = broker.list();
    assert_eq!(stats.subscriptions as usize, views.len());
    for view in views {
        let singleton = view.spec.mode == Mode::Singleton;
        let active = view.members.iter().filter(|m| m.active).count();
        assert!(
            !singleton || view.members.is_empty() || active == 1,
            "singleton with {active} active"
        );
        assert!(view.queued_messages + view.in_flight <= limits.max_queue_messages);
        // docs/semantics.md#member-metadata: only singleton members carry metadata, within the
        // bound, and only members of the subscription.
        for (member, metadata) in &view.metadata {
            assert!(
                metadata.is_empty() || singleton,
                "metadata on a {:?}",
                view.spec.mode
            );
            assert!(metadata.len() <= tinybroker::core::MAX_METADATA_BYTES);
            assert!(view.members.iter().any(|m| m.member_id == *member));
        }
    }
    drop(streams);
}
