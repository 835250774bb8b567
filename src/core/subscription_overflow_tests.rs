//! The drop-oldest overflow policy (docs/semantics.md#overflow-policies: "an explicit, documented drop policy").

use super::*;
use crate::core::Overflow;

fn dropping(max_messages: u64, max_bytes: u64) -> Subscription {
    let mut lim = limits();
    lim.max_messages = max_messages;
    lim.max_bytes = max_bytes;
    let spec = SubscriptionSpec {
        overflow: Overflow::DropOldest,
        ..spec(Mode::Queue)
    };
    Subscription::new("s".into(), spec, lim, Floors::default(), NOW)
}

fn dropped(effects: &[Effect]) -> Vec<SystemId> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Dropped {
                system_id,
                reason: DropReason::Overflow,
            } => Some(*system_id),
            _ => None,
        })
        .collect()
}

// A drop-oldest subscription never refuses a publish; the oldest queued message makes room.
#[test]
fn drop_oldest_never_refuses_and_evicts_the_head() {
    let mut s = dropping(2, 10_000);
    assert!(s.check_publish(10_000_000).is_ok());
    let _ = s.enqueue(msg(1));
    let _ = s.enqueue(msg(2));
    assert!(s.check_capacity(16).is_err(), "full by count");
    let fx = s.enqueue(msg(3));
    assert_eq!(dropped(&fx), vec![1]);
    assert_eq!(s.queued_ids().collect::<Vec<_>>(), vec![2, 3]);
    assert_eq!(s.counters().dropped_overflow, 1);
    assert_eq!(s.counters().enqueued, 3);
    s.check_invariants().unwrap();
}

// Bytes too: as many of the oldest as it takes are dropped.
#[test]
fn drop_oldest_evicts_enough_bytes() {
    let mut s = dropping(100, 40); // each message is 16 bytes
    let _ = s.enqueue(msg(1));
    let _ = s.enqueue(msg(2));
    let big = Message::new(3, 0, msg(3).envelope().clone(), &[0u8; 30]); // 36 bytes: both must go
    let fx = s.enqueue(big);
    assert_eq!(dropped(&fx), vec![1, 2]);
    assert_eq!(s.held_bytes(), 36);
    s.check_invariants().unwrap();
}

// In-flight messages are never dropped: when they alone fill the queue, the new message is the
// one dropped, and counted.
#[test]
fn drop_oldest_keeps_in_flight_and_drops_the_newcomer() {
    let mut s = dropping(1, 10_000);
    let spec = s.spec().clone();
    let (a, _) = s.join(&spec, window(1)).unwrap();
    let _ = s.enqueue(msg(1));
    assert_eq!(s.holder(1), Some(a));
    let fx = s.enqueue(msg(2));
    assert_eq!(dropped(&fx), vec![2]);
    assert_eq!(s.counters().dropped_overflow, 1);
    assert_eq!(s.counters().enqueued, 1, "the newcomer was never queued");
    assert_eq!(s.in_flight(), 1);
    s.check_invariants().unwrap();
}

// Dead letters into a drop-oldest subscription make room the same way instead of being dropped.
#[test]
fn internal_publishes_make_room_under_drop_oldest() {
    let mut s = dropping(1, 10_000);
    let _ = s.enqueue(msg(1));
    let fx = s.enqueue_or_drop(msg(2));
    assert_eq!(dropped(&fx), vec![1]);
    assert_eq!(s.counters().dropped_full, 0);
    assert_eq!(s.queued_ids().collect::<Vec<_>>(), vec![2]);
}

// The reject-publish default refuses instead, naming the limit.
#[test]
fn reject_publish_refuses_when_full() {
    let mut lim = limits();
    lim.max_messages = 1;
    let mut s = Subscription::new("s".into(), spec(Mode::Queue), lim, Floors::default(), NOW);
    let _ = s.enqueue(msg(1));
    let err = s.check_publish(16).unwrap_err();
    assert!(err.to_string().contains("max_queue_messages"), "{err}");
}
