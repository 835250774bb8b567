//! Ack-free subscriptions (docs/semantics.md#ack-free): the core keeps what a member holds in the member's own
//! list, in delivery order, instead of the in-flight map; settling, refusing and giving back
//! must behave exactly as they do for a subscription whose members ack.

use super::*;
use crate::core::AckMode;

fn ack_free(mode: Mode) -> Subscription {
    let spec = SubscriptionSpec {
        ack_mode: AckMode::None,
        ..spec(mode)
    };
    Subscription::new("s".into(), spec, limits(), Floors::default(), NOW)
}

/// `a` (window 2) holds 1 and 3, `b` (window 2) holds 2 and 4.
fn two_members() -> (Subscription, MemberId, MemberId) {
    let mut s = ack_free(Mode::Queue);
    let spec = s.spec().clone();
    let (a, _) = s.join(&spec, window(2)).unwrap();
    let (b, _) = s.join(&spec, window(2)).unwrap();
    for id in 1..=4 {
        let _ = s.enqueue(msg(id));
    }
    assert_eq!(
        s.in_flight_ids().collect::<Vec<_>>(),
        [(1, a), (2, b), (3, a), (4, b)]
    );
    s.check_invariants().unwrap();
    (s, a, b)
}

// A message given back by a leaving member reaches the next one behind what that one already
// holds, so its list is out of id order; when it leaves too, both go back in publish order.
#[test]
fn a_leaving_member_gives_back_its_unwritten_messages_in_publish_order() {
    let (mut s, a, b) = two_members();
    assert!(delivered(&s.leave(a, NOW)).is_empty(), "b's window is full");
    assert_eq!(s.queued_ids().collect::<Vec<_>>(), [1, 3]);
    // b's stream writes 2: 1 comes in behind 4.
    assert_eq!(delivered(&s.ack(Some(b), 2).unwrap()), [(b, 1, 2, 2)]);
    assert_eq!(s.in_flight_ids().collect::<Vec<_>>(), [(1, b), (4, b)]);
    s.check_invariants().unwrap();
    // 4 and 1 go back to the head, ahead of 3, which waited there.
    let _ = s.leave(b, NOW);
    assert_eq!(s.queued_ids().collect::<Vec<_>>(), [1, 4, 3]);
    let spec = s.spec().clone();
    let (c, fx) = s.join(&spec, window(3)).unwrap();
    assert_eq!(
        delivered(&fx),
        [(c, 1, 3, 3), (c, 4, 2, 3), (c, 3, 2, 3)],
        "queue order, each attempt one more"
    );
    s.check_invariants().unwrap();
}

// Settling out of delivery order, by another member, without a member, or an id not held:
// the same answers and counters as the in-flight map gives.
#[test]
fn settling_finds_any_held_message_and_refuses_as_the_map_does() {
    let (mut s, a, b) = two_members();
    let before = (s.queued(), s.in_flight(), *s.counters());
    assert!(matches!(
        s.ack(Some(a), 2),
        Err(Error::NotHolder { member, holder, .. }) if member == a && holder == b
    ));
    assert_eq!(s.counters().stale_acks, before.2.stale_acks + 1);
    assert!(matches!(s.ack(Some(a), 9), Err(Error::NotInFlight { .. })));
    assert_eq!((s.queued(), s.in_flight()), (before.0, before.1));
    // Not the first a holds: found behind it.
    s.ack(Some(a), 3).unwrap();
    // No fence: found wherever it is.
    s.ack(None, 4).unwrap();
    assert_eq!(s.in_flight_ids().collect::<Vec<_>>(), [(1, a), (2, b)]);
    assert_eq!(s.holder(2), Some(b));
    assert_eq!(s.holder(3), None);
    assert_eq!(s.counters().acked, 2);
    s.check_invariants().unwrap();
    // A nack gives it back to the head of the queue and redelivers it.
    let fx = s.nack(Some(b), 2).unwrap();
    assert_eq!(delivered(&fx), [(a, 2, 2, 1)]);
    assert_eq!(s.in_flight_ids().collect::<Vec<_>>(), [(1, a), (2, a)]);
    assert_eq!(s.drain(), 2);
    assert_eq!((s.queued(), s.in_flight(), s.held_bytes()), (0, 0, 0));
    s.check_invariants().unwrap();
}

/// One way to corrupt [`two_members`]' state, and how the checker must describe the result.
type Corruption = (fn(&mut Subscription, MemberId, MemberId), &'static str);

#[test]
fn checker_rejects_broken_ack_free_bookkeeping() {
    let cases: [Corruption; 3] = [
        (
            |s, _, _| s.unwritten += 1,
            "5 unwritten messages counted, members hold 4",
        ),
        (
            |s, a, _| {
                let record = s.members.get_mut(&a).unwrap().unwritten.pop_back().unwrap();
                s.unwritten -= 1;
                s.in_flight.insert(record.message.system_id(), record);
            },
            "an ack-free subscription keeps records in the in-flight map",
        ),
        (
            |s, a, b| {
                let record = s.members.get_mut(&a).unwrap().unwritten.pop_back().unwrap();
                s.members.get_mut(&b).unwrap().unwritten.push_back(record);
            },
            "member 2 holds a record naming another member",
        ),
    ];
    for (corrupt, expected) in cases {
        let (mut s, a, b) = two_members();
        corrupt(&mut s, a, b);
        assert_eq!(s.check_invariants(), Err(expected.to_string()));
    }
}

/// An ack-free subscription with room for `max_messages`, dropping the oldest past them.
fn ack_free_dropping(max_messages: u64) -> Subscription {
    let spec = SubscriptionSpec {
        ack_mode: AckMode::None,
        overflow: crate::core::Overflow::DropOldest,
        ..spec(Mode::Broadcast)
    };
    let lim = QueueLimits {
        max_messages,
        ..limits()
    };
    Subscription::new("s".into(), spec, lim, Floors::default(), NOW)
}

fn withdrawn_and_dropped(effects: &[Effect]) -> Vec<(Option<MemberId>, SystemId)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Withdraw { member, system_id } => Some((Some(*member), *system_id)),
            Effect::Dropped {
                system_id,
                reason: DropReason::Overflow,
            } => Some((None, *system_id)),
            _ => None,
        })
        .collect()
}

// docs/semantics.md#overflow-policies: once a member's frames wait for its stream (nothing queued, its
// window of unwritten frames full), a new message replaces the oldest unwritten one: the frame
// is withdrawn, the message dropped and counted, and the new one delivered in its place. Before,
// the newcomer was dropped, so a reader that resumed got the first messages, never the latest.
#[test]
fn a_stalled_ack_free_member_keeps_the_newest_unwritten_frames() {
    let mut s = ack_free_dropping(3);
    let spec = s.spec().clone();
    let (a, _) = s.join(&spec, window(3)).unwrap();
    for id in 1..=3 {
        let _ = s.enqueue(msg(id));
    }
    assert_eq!(s.queued(), 0);
    let fx = s.enqueue(msg(4));
    assert_eq!(withdrawn_and_dropped(&fx), [(Some(a), 1), (None, 1)]);
    assert_eq!(delivered(&fx), [(a, 4, 1, 1)]);
    assert_eq!(
        s.in_flight_ids().collect::<Vec<_>>(),
        [(2, a), (3, a), (4, a)]
    );
    assert_eq!(s.counters().dropped_overflow, 1);
    s.check_invariants().unwrap();
    // The stream writes 2 (settling it): 5 then fits without a drop.
    let _ = s.ack(Some(a), 2).unwrap();
    let fx = s.enqueue(msg(5));
    assert!(withdrawn_and_dropped(&fx).is_empty(), "{fx:?}");
    s.check_invariants().unwrap();
}

// The oldest goes first, queued or unwritten: a message a leaving member gave back waits at the
// queue's head with a lower id than the next member's unwritten frames, so it goes first.
#[test]
fn drop_oldest_compares_the_queue_head_with_the_unwritten_frames() {
    let mut s = ack_free_dropping(3);
    let spec = s.spec().clone();
    let (a, _) = s.join(&spec, window(1)).unwrap();
    let _ = s.enqueue(msg(1));
    let _ = s.enqueue(msg(2));
    let _ = s.enqueue(msg(3));
    assert_eq!(s.in_flight_ids().collect::<Vec<_>>(), [(1, a)]);
    assert_eq!(s.queued_ids().collect::<Vec<_>>(), [2, 3]);
    let fx = s.enqueue(msg(4));
    assert_eq!(withdrawn_and_dropped(&fx), [(Some(a), 1), (None, 1)]);
    assert_eq!(
        delivered(&fx),
        [(a, 2, 1, 1)],
        "the window refills from the queue"
    );
    let fx = s.enqueue(msg(5));
    assert_eq!(withdrawn_and_dropped(&fx), [(Some(a), 2), (None, 2)]);
    s.check_invariants().unwrap();
}

// docs/semantics.md#memory-budget: the drop-oldest pool granted `room` bytes; the oldest
// messages make the rest, and with no room and nothing to drop the newcomer is dropped.
#[test]
fn enqueue_within_drops_until_the_granted_room_suffices() {
    let mut s = ack_free_dropping(100);
    let one = msg(1).size() as u64 + MESSAGE_OVERHEAD;
    let mut out = Vec::new();
    s.enqueue_within(msg(1), one, &mut out);
    s.enqueue_within(msg(2), one, &mut out);
    assert!(withdrawn_and_dropped(&out).is_empty());
    out.clear();
    // No room granted: the oldest (1) makes it.
    s.enqueue_within(msg(3), 0, &mut out);
    assert_eq!(withdrawn_and_dropped(&out), [(None, 1)]);
    assert_eq!(s.queued_ids().collect::<Vec<_>>(), [2, 3]);
    // Half the room: one drop is enough.
    out.clear();
    s.enqueue_within(msg(4), one / 2, &mut out);
    assert_eq!(withdrawn_and_dropped(&out), [(None, 2)]);
    assert_eq!(s.message_footprint(), 2 * one);
    // Nothing held and no room: the newcomer itself is dropped, never refused.
    let mut empty = ack_free_dropping(100);
    out.clear();
    empty.enqueue_within(msg(9), 0, &mut out);
    assert_eq!(withdrawn_and_dropped(&out), [(None, 9)]);
    assert_eq!(empty.counters().dropped_overflow, 1);
    assert_eq!(empty.message_footprint(), 0);
    s.check_invariants().unwrap();
    empty.check_invariants().unwrap();
}
