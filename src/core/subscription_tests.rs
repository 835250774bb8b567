//! Unit tests of the group state machine, one per docs/semantics.md#subscriptions, docs/semantics.md#delivery and docs/semantics.md#singleton bullet.

use std::time::Duration;

use super::*;
use crate::core::{Envelope, Headers, Pattern, Topic};

const NOW: Duration = Duration::from_secs(1);

fn spec(mode: Mode) -> SubscriptionSpec {
    SubscriptionSpec {
        mode,
        consumer_group: if mode == Mode::Broadcast {
            String::new()
        } else {
            "g".into()
        },
        patterns: vec![Pattern::parse("jobs.>").unwrap()],
        max_delivery_attempts: 0,
        dead_letter_topic: None,
        ack_mode: crate::core::AckMode::Explicit,
        overflow: crate::core::Overflow::RejectPublish,
    }
}

fn limits() -> QueueLimits {
    QueueLimits {
        max_messages: 100,
        max_bytes: 10_000,
        max_members: 10,
        idle_timeout: Duration::from_secs(60),
    }
}

fn sub(mode: Mode) -> Subscription {
    Subscription::new(
        "s".into(),
        spec(mode),
        limits(),
        Floors::default(),
        Duration::ZERO,
    )
}

fn msg(id: SystemId) -> Message {
    let envelope = Envelope::new(Topic::parse("jobs.a").unwrap(), Headers::new());
    Message::new(id, 0, envelope, b"0123456789")
}

fn window(n: u32) -> MemberOptions {
    MemberOptions {
        max_in_flight: n,
        notify_standby: false,
        priority: 0,
    }
}

fn join(s: &mut Subscription) -> (MemberId, Vec<Effect>) {
    let spec = s.spec().clone();
    let r = s.join(&spec, MemberOptions::default()).unwrap();
    s.check_invariants().unwrap();
    r
}

/// Deliveries in `effects` as (member, system id, attempt, epoch).
fn delivered(effects: &[Effect]) -> Vec<(MemberId, SystemId, u32, Epoch)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Deliver {
                member,
                message,
                attempt,
                epoch,
            } => Some((*member, message.system_id(), *attempt, *epoch)),
            _ => None,
        })
        .collect()
}

fn confirms(effects: &[Effect]) -> Vec<(MemberId, Epoch)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Confirm { member, epoch } => Some((*member, *epoch)),
            _ => None,
        })
        .collect()
}

// docs/semantics.md#singleton: the first member becomes active; later ones wait and receive nothing.
#[test]
fn first_singleton_member_is_confirmed_and_standbys_get_nothing() {
    let mut s = sub(Mode::Singleton);
    let (a, fx) = join(&mut s);
    assert_eq!(
        fx,
        vec![Effect::Confirm {
            member: a,
            epoch: 1
        }]
    );
    let (_b, fx) = join(&mut s);
    assert!(fx.is_empty(), "standby must get no frame: {fx:?}");
    let fx = s.enqueue(msg(1));
    assert_eq!(delivered(&fx), vec![(a, 1, 1, 1)]);
    let fx = s.enqueue(msg(2));
    assert!(
        fx.is_empty(),
        "window of 1 is full, standby gets nothing: {fx:?}"
    );
    s.check_invariants().unwrap();
}

// docs/semantics.md#singleton: on active close, the earliest standby gets confirm (higher epoch), then the
// redelivered in-flight message with attempt 2, then the rest in order.
#[test]
fn active_leaving_promotes_earliest_standby_with_redelivery_first() {
    let mut s = sub(Mode::Singleton);
    let (a, _) = join(&mut s);
    let (b, _) = join(&mut s);
    let (c, _) = join(&mut s);
    let _ = s.enqueue(msg(1));
    let _ = s.enqueue(msg(2));
    let fx = s.leave(a, NOW);
    s.check_invariants().unwrap();
    assert_eq!(
        fx,
        vec![
            Effect::Confirm {
                member: b,
                epoch: 2
            },
            Effect::Deliver {
                member: b,
                message: msg(1),
                attempt: 2,
                epoch: 2
            }
        ]
    );
    let fx = s.ack(Some(b), 1).unwrap();
    assert_eq!(delivered(&fx), vec![(b, 2, 1, 2)]);
    // C is still on standby and has received nothing.
    assert_eq!(s.active_members().collect::<Vec<_>>(), vec![b]);
    let fx = s.leave(b, NOW);
    assert_eq!(confirms(&fx), vec![(c, 3)]);
    assert_eq!(delivered(&fx), vec![(c, 2, 2, 3)]);
    assert_eq!(s.counters().promotions, 2);
}

// docs/semantics.md#singleton: later joiners never take over from the active member.
#[test]
fn late_joiner_never_preempts() {
    let mut s = sub(Mode::Singleton);
    let (a, _) = join(&mut s);
    for _ in 0..3 {
        let (_, fx) = join(&mut s);
        assert!(fx.is_empty());
    }
    assert_eq!(s.active_members().collect::<Vec<_>>(), vec![a]);
    assert_eq!(s.epoch(), 1);
}

// docs/semantics.md#singleton: promotion follows join order, even when a standby in the middle leaves first.
#[test]
fn promotion_skips_departed_standbys_and_follows_join_order() {
    let mut s = sub(Mode::Singleton);
    let (a, _) = join(&mut s);
    let (b, _) = join(&mut s);
    let (c, _) = join(&mut s);
    let (d, _) = join(&mut s);
    assert!(
        s.leave(b, NOW).is_empty(),
        "a standby leaving changes nothing visible"
    );
    assert_eq!(confirms(&s.leave(a, NOW)), vec![(c, 2)]);
    assert_eq!(confirms(&s.leave(c, NOW)), vec![(d, 3)]);
    s.check_invariants().unwrap();
}

// docs/semantics.md#singleton-invariant-5: epochs never go back, also after a period with no members.
#[test]
fn epochs_keep_increasing_after_the_group_empties() {
    let mut s = sub(Mode::Singleton);
    let (a, _) = join(&mut s);
    let _ = s.leave(a, NOW);
    let (b, fx) = join(&mut s);
    assert_eq!(
        fx,
        vec![Effect::Confirm {
            member: b,
            epoch: 2
        }]
    );
    assert!(b > a);
    // A subscription recreated under the same id starts above the old one's floors.
    let again = Subscription::new("s".into(), spec(Mode::Singleton), limits(), s.floors(), NOW);
    let mut again = again;
    let (c, fx) = join(&mut again);
    assert!(c > b);
    assert_eq!(confirms(&fx), vec![(c, 3)]);
}

// docs/semantics.md#standby-notice: notify_standby (off by default) tells a standby its place in line.
#[test]
fn standby_notice_only_when_asked() {
    let mut s = sub(Mode::Singleton);
    let spec = s.spec().clone();
    let _ = s.join(&spec, MemberOptions::default()).unwrap();
    let ask = MemberOptions {
        max_in_flight: 1,
        notify_standby: true,
        priority: 0,
    };
    let (b, fx) = s.join(&spec, ask).unwrap();
    assert_eq!(
        fx,
        vec![Effect::Standby {
            member: b,
            position: 1
        }]
    );
    let (c, fx) = s.join(&spec, ask).unwrap();
    assert_eq!(
        fx,
        vec![Effect::Standby {
            member: c,
            position: 2
        }]
    );
}

// docs/semantics.md#singleton: a singleton subscription has one total order across all matched topics; redelivered
// messages come first.
#[test]
fn singleton_delivers_in_publish_order_with_window() {
    let mut s = sub(Mode::Singleton);
    let spec = s.spec().clone();
    let (a, _) = s.join(&spec, window(3)).unwrap();
    let mut got = Vec::new();
    for id in 1..=5 {
        got.extend(delivered(&s.enqueue(msg(id))));
    }
    assert_eq!(got.iter().map(|d| d.1).collect::<Vec<_>>(), vec![1, 2, 3]);
    // Ack out of order: the next in publish order follows.
    assert_eq!(delivered(&s.ack(Some(a), 2).unwrap()), vec![(a, 4, 1, 1)]);
    let (b, _) = s.join(&spec, window(3)).unwrap();
    let fx = s.leave(a, NOW);
    // In-flight 1, 3, 4 come back at the head in their original order, then 5.
    assert_eq!(
        delivered(&fx),
        vec![(b, 1, 2, 2), (b, 3, 2, 2), (b, 4, 2, 2)]
    );
    assert_eq!(s.queued_ids().collect::<Vec<_>>(), vec![5]);
    s.check_invariants().unwrap();
}

// docs/semantics.md#redelivery-order: after a nack and its redelivery the member holds 2 then 1; when it leaves, the
// promoted member still gets them in publish order (1, 2), then 3. Requeuing in delivery order
// handed B 2 before 1.
#[test]
fn failover_after_a_nack_keeps_publish_order() {
    let mut s = sub(Mode::Singleton);
    let spec = s.spec().clone();
    let (a, _) = s.join(&spec, window(2)).unwrap();
    let (b, _) = s.join(&spec, window(2)).unwrap();
    for id in 1..=3 {
        s.enqueue(msg(id));
    }
    assert_eq!(delivered(&s.nack(Some(a), 1).unwrap()), vec![(a, 1, 2, 1)]);
    let fx = s.leave(a, NOW);
    assert_eq!(confirms(&fx), vec![(b, 2)]);
    assert_eq!(delivered(&fx), vec![(b, 1, 3, 2), (b, 2, 2, 2)]);
    assert_eq!(delivered(&s.ack(Some(b), 1).unwrap()), vec![(b, 3, 1, 2)]);
    s.check_invariants().unwrap();
}

// Inspection reads running totals: queued bytes follow enqueue, delivery, ack, nack and leave.
#[test]
fn queued_bytes_is_a_running_total() {
    let mut s = sub(Mode::Queue);
    let spec = s.spec().clone();
    let size = msg(1).size() as u64;
    for id in 1..=4 {
        s.enqueue(msg(id));
    }
    assert_eq!(s.queued_bytes(), 4 * size);
    let (a, _) = s.join(&spec, window(2)).unwrap();
    assert_eq!(s.queued_bytes(), 2 * size);
    s.nack(Some(a), 1).unwrap();
    assert_eq!(s.queued_bytes(), 2 * size);
    s.ack(Some(a), 2).unwrap();
    assert_eq!((s.queued_bytes(), s.held_bytes()), (size, 3 * size));
    s.leave(a, NOW);
    assert_eq!(s.queued_bytes(), 3 * size);
    s.check_invariants().unwrap();
}

// docs/semantics.md#acks: Ack releases for good; an ack of something not in flight is NOT_FOUND and changes nothing.
#[test]
fn unknown_ack_is_not_found_and_changes_nothing() {
    let mut s = sub(Mode::Queue);
    let (a, _) = join(&mut s);
    let _ = s.enqueue(msg(1));
    let before = (s.queued(), s.in_flight(), *s.counters());
    let err = s.ack(Some(a), 99).unwrap_err();
    assert!(
        matches!(err, Error::NotInFlight { system_id: 99, .. }),
        "{err}"
    );
    assert_eq!(before, (s.queued(), s.in_flight(), *s.counters()));
    s.ack(Some(a), 1).unwrap();
    assert!(
        matches!(s.ack(Some(a), 1), Err(Error::NotInFlight { .. })),
        "double ack"
    );
    assert_eq!(s.counters().acked, 1);
    assert_eq!(s.held_bytes(), 0);
}

// docs/semantics.md#fencing: acks are fenced; a demoted member's late ack cannot release the new holder's copy.
#[test]
fn stale_ack_from_departed_member_cannot_release_new_holders_copy() {
    let mut s = sub(Mode::Singleton);
    let (a, _) = join(&mut s);
    let (b, _) = join(&mut s);
    let _ = s.enqueue(msg(1));
    let _ = s.leave(a, NOW);
    let err = s.ack(Some(a), 1).unwrap_err();
    assert!(matches!(err, Error::NotHolder { member, holder, .. } if member == a && holder == b));
    let err = s.nack(Some(a), 1).unwrap_err();
    assert!(matches!(err, Error::NotHolder { .. }));
    assert_eq!(s.in_flight_ids().collect::<Vec<_>>(), vec![(1, b)]);
    assert_eq!(s.counters().stale_acks, 2);
    assert_eq!(s.counters().acked, 0);
    s.ack(Some(b), 1).unwrap();
    s.check_invariants().unwrap();
}

// docs/semantics.md#fencing: an unfenced ack (no member id) releases whoever holds the message.
#[test]
fn unfenced_ack_releases_the_current_holder() {
    let mut s = sub(Mode::Singleton);
    let (a, _) = join(&mut s);
    let _ = s.enqueue(msg(1));
    let _ = s.enqueue(msg(2));
    assert_eq!(delivered(&s.ack(None, 1).unwrap()), vec![(a, 2, 1, 1)]);
}

// docs/semantics.md#nacks: Nack puts the message back at the head with attempt + 1.
#[test]
fn nack_redelivers_at_the_head_with_next_attempt() {
    let mut s = sub(Mode::Singleton);
    let (a, _) = join(&mut s);
    let _ = s.enqueue(msg(1));
    let _ = s.enqueue(msg(2));
    let fx = s.nack(Some(a), 1).unwrap();
    assert_eq!(delivered(&fx), vec![(a, 1, 2, 1)]);
    assert_eq!(s.counters().nacked, 1);
    assert_eq!(s.counters().redelivered, 1);
}

// docs/semantics.md#dead-letters: poison messages are dead-lettered after max_delivery_attempts, or dropped and counted.
#[test]
fn poison_message_is_dead_lettered_after_max_attempts() {
    let mut sp = spec(Mode::Singleton);
    sp.max_delivery_attempts = 2;
    sp.dead_letter_topic = Some(Topic::parse("dead.jobs").unwrap());
    let mut s = Subscription::new("s".into(), sp.clone(), limits(), Floors::default(), NOW);
    let (a, _) = s.join(&sp, MemberOptions::default()).unwrap();
    let (b, _) = s.join(&sp, MemberOptions::default()).unwrap();
    let _ = s.enqueue(msg(1));
    let _ = s.enqueue(msg(2));
    let fx = s.leave(a, NOW); // attempt 1 failed
    assert_eq!(delivered(&fx), vec![(b, 1, 2, 2)]);
    let fx = s.nack(Some(b), 1).unwrap(); // attempt 2 failed: poisoned
    assert_eq!(
        fx[0],
        Effect::DeadLetter {
            message: msg(1),
            attempts: 2
        }
    );
    assert_eq!(delivered(&fx), vec![(b, 2, 1, 2)]);
    assert_eq!(s.counters().dead_lettered, 1);
    s.check_invariants().unwrap();

    sp.dead_letter_topic = None;
    let mut s = Subscription::new("s".into(), sp.clone(), limits(), Floors::default(), NOW);
    let (a, _) = s.join(&sp, MemberOptions::default()).unwrap();
    let _ = s.enqueue(msg(1));
    let _ = s.nack(Some(a), 1).unwrap();
    let fx = s.nack(Some(a), 1).unwrap();
    assert_eq!(
        fx,
        vec![Effect::Dropped {
            system_id: 1,
            reason: DropReason::MaxDeliveryAttempts
        }]
    );
    assert_eq!(s.counters().dropped_max_attempts, 1);
    assert_eq!((s.queued(), s.in_flight(), s.held_bytes()), (0, 0, 0));
}

// docs/semantics.md#modes: queue mode gives each message to exactly one member, spread over those with space.
#[test]
fn queue_mode_spreads_messages_round_robin() {
    let mut s = sub(Mode::Queue);
    let (a, fa) = join(&mut s);
    let (b, fb) = join(&mut s);
    assert_eq!(confirms(&fa), vec![(a, 1)]);
    assert_eq!(
        confirms(&fb),
        vec![(b, 2)],
        "queue members are confirmed at once"
    );
    let mut got = Vec::new();
    for id in 1..=3 {
        got.extend(delivered(&s.enqueue(msg(id))));
    }
    assert_eq!(got, vec![(a, 1, 1, 1), (b, 2, 1, 2)]);
    assert_eq!(s.queued(), 1);
    // B acks first: the waiting message goes to B, the one with space.
    assert_eq!(delivered(&s.ack(Some(b), 2).unwrap()), vec![(b, 3, 1, 2)]);
    // A member leaving hands its in-flight message to the others.
    let _ = s.ack(Some(b), 3).unwrap();
    assert_eq!(delivered(&s.leave(a, NOW)), vec![(b, 1, 2, 2)]);
    s.check_invariants().unwrap();
}

// docs/semantics.md#modes: a broadcast subscription id names one live stream.
#[test]
fn broadcast_allows_one_live_stream_per_id() {
    let mut s = sub(Mode::Broadcast);
    let (a, fx) = join(&mut s);
    assert_eq!(confirms(&fx), vec![(a, 1)]);
    let spec = s.spec().clone();
    assert!(matches!(
        s.join(&spec, MemberOptions::default()),
        Err(Error::BroadcastTaken(_))
    ));
    let _ = s.leave(a, NOW);
    assert!(s.join(&spec, MemberOptions::default()).is_ok());
}

// docs/semantics.md#joining-rules: joining with different patterns, mode or group is refused, saying what differs.
#[test]
fn joining_with_different_settings_names_every_difference() {
    let mut s = sub(Mode::Singleton);
    let _ = join(&mut s);
    let mut other = spec(Mode::Queue);
    other.consumer_group = "h".into();
    other.patterns = vec![Pattern::parse("jobs.*").unwrap()];
    let err = s
        .join(&other, MemberOptions::default())
        .unwrap_err()
        .to_string();
    for needle in [
        "mode is SINGLETON, request asks QUEUE",
        "consumer_group",
        "topic_patterns",
    ] {
        assert!(err.contains(needle), "{err}");
    }
    assert_eq!(s.member_count(), 1, "a refused join changes nothing");
}

// docs/semantics.md#limits-table: bounded queues; a full subscription refuses with the limit named.
#[test]
fn capacity_limits_messages_and_bytes() {
    let mut lim = limits();
    lim.max_messages = 2;
    let mut s = Subscription::new("s".into(), spec(Mode::Queue), lim, Floors::default(), NOW);
    let _ = s.enqueue(msg(1));
    let _ = s.enqueue(msg(2));
    let err = s.check_capacity(10).unwrap_err();
    assert!(
        err.to_string().contains("max_queue_messages limit of 2"),
        "{err}"
    );
    let fx = s.enqueue_or_drop(msg(3));
    assert_eq!(
        fx,
        vec![Effect::Dropped {
            system_id: 3,
            reason: DropReason::QueueFull
        }]
    );
    assert_eq!(s.counters().dropped_full, 1);

    let mut lim = limits();
    lim.max_bytes = 30;
    let mut s = Subscription::new("s".into(), spec(Mode::Queue), lim, Floors::default(), NOW);
    let _ = s.enqueue(msg(1)); // 16 bytes
    let err = s.check_capacity(16).unwrap_err();
    assert!(
        err.to_string().contains("max_queue_bytes limit of 30"),
        "{err}"
    );
    assert!(s.check_capacity(14).is_ok());
}

// docs/semantics.md#limits-table: max members per subscription.
#[test]
fn member_limit_is_enforced() {
    let mut lim = limits();
    lim.max_members = 2;
    let mut s = Subscription::new(
        "s".into(),
        spec(Mode::Singleton),
        lim,
        Floors::default(),
        NOW,
    );
    let _ = join(&mut s);
    let _ = join(&mut s);
    let spec = s.spec().clone();
    assert!(matches!(
        s.join(&spec, MemberOptions::default()),
        Err(Error::TooManyMembers { max: 2, .. })
    ));
}

// docs/semantics.md#idle-expiry: a subscription without members expires after its idle time, keeping its queue till then.
#[test]
fn idle_subscription_expires_after_its_timeout() {
    let mut s = sub(Mode::Singleton);
    let (a, _) = join(&mut s);
    assert_eq!(s.expires_at(), None);
    let _ = s.enqueue(msg(1));
    let _ = s.leave(a, NOW);
    assert_eq!(s.expires_at(), Some(NOW + Duration::from_secs(60)));
    assert!(!s.is_expired(NOW + Duration::from_secs(59)));
    assert!(s.is_expired(NOW + Duration::from_secs(60)));
    // Rejoining in time keeps the queue (the message comes back with attempt 2).
    let (b, fx) = join(&mut s);
    assert_eq!(delivered(&fx), vec![(b, 1, 2, 2)]);
    assert_eq!(s.expires_at(), None);
    assert_eq!(s.drain(), 1);
}

// docs/semantics.md#windows: a window larger than 1 lets that many unacked messages flow.
#[test]
fn window_limits_unacked_messages_per_member() {
    let mut s = sub(Mode::Queue);
    let spec = s.spec().clone();
    let (a, _) = s.join(&spec, window(2)).unwrap();
    let mut got = Vec::new();
    for id in 1..=4 {
        got.extend(delivered(&s.enqueue(msg(id))));
    }
    assert_eq!(got, vec![(a, 1, 1, 1), (a, 2, 1, 1)]);
    assert_eq!(delivered(&s.ack(Some(a), 1).unwrap()), vec![(a, 3, 1, 1)]);
    s.check_invariants().unwrap();
}

#[path = "subscription_bookkeeping_tests.rs"]
mod bookkeeping;

#[path = "subscription_overflow_tests.rs"]
mod overflow;

#[path = "subscription_ack_free_tests.rs"]
mod ack_free;

#[test]
fn room_is_the_active_members_free_window_less_the_queue() {
    let mut s = sub(Mode::Queue);
    assert_eq!(s.room(), 0, "no member, no room");
    let spec = s.spec().clone();
    let (a, _) = s.join(&spec, window(3)).unwrap();
    s.join(&spec, window(2)).unwrap();
    assert_eq!(s.room(), 5);
    s.enqueue(msg(1));
    s.enqueue(msg(2));
    assert_eq!(s.room(), 3, "two in flight");
    for id in 3..=7 {
        s.enqueue(msg(id));
    }
    assert_eq!(
        s.room(),
        0,
        "five in flight, two queued: full and then some"
    );
    s.ack(Some(a), 1).unwrap();
    assert_eq!(s.room(), 0, "the ack let a queued message in");
    s.check_invariants().unwrap();
}

#[test]
fn an_upstream_attempt_is_carried_and_one_past_the_limit_is_retired() {
    let mut s = sub(Mode::Queue);
    let (_, _) = join(&mut s);
    let effects = s.enqueue_attempt(msg(1), 3);
    assert!(
        matches!(effects.as_slice(), [Effect::Deliver { attempt: 3, .. }]),
        "{effects:?}"
    );
    let mut limited = spec(Mode::Queue);
    limited.max_delivery_attempts = 2;
    let mut s = Subscription::new("s".into(), limited, limits(), Floors::default(), NOW);
    join(&mut s);
    let effects = s.enqueue_attempt(msg(1), 3);
    assert_eq!(
        effects,
        vec![Effect::Dropped {
            system_id: 1,
            reason: DropReason::MaxDeliveryAttempts
        }]
    );
    assert_eq!(s.counters().dropped_max_attempts, 1);
    assert_eq!(s.held_bytes(), 0);
    s.check_invariants().unwrap();
}

// Cluster mode (docs/semantics.md#cluster-mode): an arbitrated singleton never picks its own active member. Joining,
// even first, waits on standby; the cluster's choice comes in with its epoch; the active
// member's leaving promotes nobody here, and what it held can be taken out, in publish order,
// to go back upstream ahead of anything newer.
#[test]
fn an_arbitrated_singleton_activates_only_whom_the_cluster_names() {
    let mut s = sub(Mode::Singleton);
    s.arbitrate();
    assert!(s.is_arbitrated());
    let (first, effects) = join(&mut s);
    assert!(confirms(&effects).is_empty(), "{effects:?}");
    let (second, _) = join(&mut s);
    assert_eq!(s.active_members().count(), 0);
    assert!(
        s.enqueue(msg(1)).is_empty(),
        "no active member: nothing delivered"
    );

    let effects = s.activate(second, 41, false).unwrap();
    s.check_invariants().unwrap();
    assert_eq!(confirms(&effects), vec![(second, 41)]);
    assert_eq!(delivered(&effects), vec![(second, 1, 1, 41)]);
    assert!(s.activate(first, 42, true).is_err(), "two active members");
    assert!(s.activate(99, 42, true).is_err(), "no such member");
    s.enqueue(msg(2));
    s.enqueue(msg(3));

    let effects = s.leave(second, NOW);
    s.check_invariants().unwrap();
    assert!(
        confirms(&effects).is_empty(),
        "nobody promoted: {effects:?}"
    );
    assert_eq!(s.active_members().count(), 0);
    let taken: Vec<(SystemId, u32)> = s
        .take_queued()
        .into_iter()
        .map(|(m, attempt)| (m.system_id(), attempt))
        .collect();
    assert_eq!(taken, vec![(1, 2), (2, 1), (3, 1)]);
    assert_eq!(s.queued(), 0);
    assert_eq!(s.queued_bytes(), 0);
    s.check_invariants().unwrap();

    let effects = s.activate(first, 42, true).unwrap();
    assert_eq!(confirms(&effects), vec![(first, 42)]);
    assert_eq!(s.epoch(), 42);
    assert_eq!(
        s.counters().promotions,
        1,
        "the line's first activation is no promotion, the take-over is"
    );
}

#[test]
fn a_subscription_that_is_not_arbitrated_refuses_activation() {
    let mut s = sub(Mode::Singleton);
    let (first, _) = join(&mut s);
    let (second, _) = join(&mut s);
    assert!(s.activate(second, 7, true).is_err());
    assert_eq!(s.active_members().collect::<Vec<_>>(), vec![first]);
    let mut q = sub(Mode::Queue);
    q.arbitrate();
    assert!(!q.is_arbitrated(), "only singletons are arbitrated");
}

// Cluster mode: a message that comes with more deliveries than `max_delivery_attempts` allows
// (JetStream's count) is retired at once, its dead letter naming the deliveries it had; one at
// exactly the limit still gets its last attempt.
#[test]
fn a_message_past_its_attempts_on_arrival_is_retired_naming_what_it_had() {
    let mut sp = spec(Mode::Queue);
    sp.max_delivery_attempts = 3;
    sp.dead_letter_topic = Some(Topic::parse("dead.jobs").unwrap());
    let mut s = Subscription::new("s".into(), sp.clone(), limits(), Floors::default(), NOW);
    let (a, _) = s.join(&sp, MemberOptions::default()).unwrap();
    let fx = s.enqueue_attempt(msg(1), 5);
    assert_eq!(
        fx,
        vec![Effect::DeadLetter {
            message: msg(1),
            attempts: 4
        }]
    );
    let fx = s.enqueue_attempt(msg(2), 3);
    let got: Vec<_> = delivered(&fx).iter().map(|d| (d.0, d.1, d.2)).collect();
    assert_eq!(got, [(a, 2, 3)], "its last attempt");
    s.check_invariants().unwrap();
}

// The shell counts an ack its connection fence refused as stale, beside the core's own.
#[test]
fn a_stale_ack_noted_by_the_shell_is_counted() {
    let mut s = sub(Mode::Queue);
    let before = s.counters().stale_acks;
    s.note_stale();
    s.note_stale();
    assert_eq!(s.counters().stale_acks, before + 2);
}

// docs/semantics.md#releases: a release gives the message back to the head like a nack, but its
// next delivery carries the same attempt; counted as `released`, not `nacked`. Its member is
// leaving: it is sent nothing more, so the message goes to the next member.
#[test]
fn a_release_redelivers_at_the_head_with_the_same_attempt() {
    let mut s = sub(Mode::Singleton);
    let (a, _) = join(&mut s);
    let (b, _) = join(&mut s);
    let _ = s.enqueue(msg(1));
    let _ = s.enqueue(msg(2));
    let fx = s.release(Some(a), 1).unwrap();
    assert_eq!(
        delivered(&fx),
        vec![],
        "not back to the member that released it"
    );
    let c = *s.counters();
    assert_eq!((c.released, c.nacked, c.redelivered), (1, 0, 0));
    s.check_invariants().unwrap();
    let fx = s.leave(a, NOW);
    assert_eq!(delivered(&fx), vec![(b, 1, 1, 2)], "the same attempt");
    // After a nack (attempt 2), the first release at attempt 2 keeps it too.
    let fx = s.nack(Some(b), 1).unwrap();
    assert_eq!(delivered(&fx), vec![(b, 1, 2, 2)]);
    let (c, _) = join(&mut s);
    let _ = s.release(Some(b), 1).unwrap();
    let fx = s.leave(b, NOW);
    assert_eq!(delivered(&fx), vec![(c, 1, 2, 3)]);
    s.check_invariants().unwrap();
}

// docs/semantics.md#releases: a member that released is sent nothing more; other members are.
#[test]
fn a_member_that_released_is_sent_nothing_more() {
    let mut s = sub(Mode::Queue);
    let (a, _) = s.join(&spec(Mode::Queue), window(4)).unwrap();
    let (b, _) = s.join(&spec(Mode::Queue), window(4)).unwrap();
    let fx = s.enqueue(msg(1));
    assert_eq!(delivered(&fx), vec![(a, 1, 1, 1)]);
    let fx = s.release(Some(a), 1).unwrap();
    assert_eq!(delivered(&fx), vec![(b, 1, 1, 2)]);
    let fx = s.enqueue(msg(2));
    let fx2 = s.enqueue(msg(3));
    assert_eq!(delivered(&fx), vec![(b, 2, 1, 2)]);
    assert_eq!(delivered(&fx2), vec![(b, 3, 1, 2)]);
    assert_eq!(s.room(), 1, "only b's free window counts");
    s.check_invariants().unwrap();
}

// docs/semantics.md#releases: the bound. The first release at an attempt keeps it; the second
// at the same attempt counts one, as a nack; so a message released over and over (each time by
// a member that then leaves, as a closing client does) is delivered at most twice per attempt
// and still reaches its dead letter.
#[test]
fn a_message_released_over_and_over_reaches_its_dead_letter() {
    let mut sp = spec(Mode::Queue);
    sp.max_delivery_attempts = 3;
    sp.dead_letter_topic = Some(Topic::parse("dead.jobs").unwrap());
    let mut s = Subscription::new("s".into(), sp.clone(), limits(), Floors::default(), NOW);
    let (mut member, _) = s.join(&sp, MemberOptions::default()).unwrap();
    let fx = s.enqueue(msg(1));
    let mut attempts = delivered(&fx).iter().map(|d| d.2).collect::<Vec<_>>();
    let mut releases = 0;
    let dead = loop {
        let fx = s.release(Some(member), 1).unwrap();
        releases += 1;
        s.check_invariants().unwrap();
        if let Some(Effect::DeadLetter { attempts, .. }) = fx.first() {
            break *attempts;
        }
        let (next, fx) = s.join(&sp, MemberOptions::default()).unwrap();
        let _ = s.leave(member, NOW);
        member = next;
        attempts.extend(delivered(&fx).iter().map(|d| d.2));
        assert!(releases < 100, "never dead-lettered: attempts {attempts:?}");
    };
    assert_eq!(attempts, vec![1, 1, 2, 2, 3, 3]);
    assert_eq!((releases, dead), (6, 3));
    let c = *s.counters();
    assert_eq!((c.released, c.nacked, c.dead_lettered), (6, 0, 1));
    assert_eq!((s.queued(), s.in_flight(), s.held_bytes()), (0, 0, 0));
}

// docs/semantics.md#releases: a release is fenced and refused exactly as a nack, and a refused
// one changes nothing (a stale release is counted as stale, and does not stop deliveries).
#[test]
fn a_release_is_fenced_and_refused_like_a_nack() {
    let mut s = sub(Mode::Singleton);
    let (a, _) = join(&mut s);
    let (b, _) = join(&mut s);
    let _ = s.enqueue(msg(1));
    assert!(matches!(
        s.release(Some(a), 9),
        Err(Error::NotInFlight { system_id: 9, .. })
    ));
    let _ = s.leave(a, NOW);
    let before = (s.queued(), s.in_flight(), s.counters().released);
    let err = s.release(Some(a), 1).unwrap_err();
    assert!(matches!(err, Error::NotHolder { member, holder, .. } if member == a && holder == b));
    assert_eq!(before, (s.queued(), s.in_flight(), s.counters().released));
    assert_eq!(s.counters().stale_acks, 1);
    // b got it as attempt 2 (a left holding it); b's release keeps 2 for the next member.
    let (c, _) = join(&mut s);
    assert_eq!(delivered(&s.release(Some(b), 1).unwrap()), vec![]);
    let fx = s.leave(b, NOW);
    assert_eq!(delivered(&fx), vec![(c, 1, 2, 3)]);
    s.check_invariants().unwrap();
}

// docs/semantics.md#releases: a released message that goes back with its member's leave counts
// the leave (attempt + 1) and gets a fresh release at the new attempt; one handed over from
// another gateway (cluster mode's carry) arrives with its release at that attempt used.
#[test]
fn a_leave_after_a_release_counts_and_a_handed_over_message_has_its_release_used() {
    let mut s = sub(Mode::Queue);
    let (a, _) = join(&mut s);
    let _ = s.enqueue(msg(1));
    let _ = s.release(Some(a), 1).unwrap();
    let (b, fx) = join(&mut s);
    assert_eq!(delivered(&fx), vec![(b, 1, 1, 2)]);
    let (c, _) = join(&mut s);
    let fx = s.leave(b, NOW);
    assert_eq!(delivered(&fx), vec![(c, 1, 2, 3)], "the leave counts");
    let _ = s.release(Some(c), 1).unwrap();
    let (d, fx) = join(&mut s);
    assert_eq!(delivered(&fx), vec![(d, 1, 2, 4)], "a fresh release at 2");

    let mut s = sub(Mode::Queue);
    let (a, _) = join(&mut s);
    let fx = s.enqueue_handed_over(msg(1), 2);
    assert_eq!(delivered(&fx), vec![(a, 1, 2, 1)]);
    let _ = s.release(Some(a), 1).unwrap();
    let (b, fx) = join(&mut s);
    assert_eq!(
        delivered(&fx),
        vec![(b, 1, 3, 2)],
        "its release at 2 was used"
    );
    s.check_invariants().unwrap();
}

// docs/semantics.md#releases and #redelivery-order: a singleton member that releases what it
// prefetched (in any order) and then leaves holding a later id hands the next active member one
// order: publish order.
#[test]
fn released_messages_reach_the_next_singleton_member_in_publish_order() {
    let mut s = sub(Mode::Singleton);
    let (a, _) = s.join(&spec(Mode::Singleton), window(4)).unwrap();
    let (b, _) = s.join(&spec(Mode::Singleton), window(4)).unwrap();
    for id in 1..=4 {
        let _ = s.enqueue(msg(id));
    }
    let _ = s.release(Some(a), 3).unwrap();
    let _ = s.release(Some(a), 1).unwrap();
    let _ = s.release(Some(a), 4).unwrap();
    s.check_invariants().unwrap();
    let fx = s.leave(a, NOW); // still holding 2: it counts
    assert_eq!(
        delivered(&fx),
        vec![(b, 1, 1, 2), (b, 2, 2, 2), (b, 3, 1, 2), (b, 4, 1, 2)]
    );
    s.check_invariants().unwrap();
}

#[path = "subscription_step_down_tests.rs"]
mod step_down;
