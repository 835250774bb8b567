//! Shell tests on tokio's paused clock: idle expiry, shutdown, atomic publish, dead letters.

use std::time::Duration;

use super::*;
use crate::{
    clock::VirtualClock,
    core::{MemberOptions, Mode, Pattern, Topic},
};

fn broker(limits: Limits) -> Broker {
    Broker::new(limits, Arc::new(VirtualClock::new(1_700_000_000_000)))
}

/// Default limits whose general pool (what reject-publish subscriptions draw on:
/// docs/semantics.md#memory-budget) is exactly `general` bytes.
fn general_budget(general: u64) -> Limits {
    let mut limits = Limits {
        max_memory_bytes: general,
        ..Limits::default()
    };
    while limits.general_memory_bytes() < general {
        limits.max_memory_bytes += 1;
    }
    assert_eq!(limits.general_memory_bytes(), general);
    limits
}

fn request(id: &str, mode: Mode, pattern: &str) -> OpenRequest {
    OpenRequest {
        subscription_id: id.into(),
        spec: SubscriptionSpec {
            mode,
            consumer_group: "g".into(),
            patterns: vec![Pattern::parse(pattern).unwrap()],
            max_delivery_attempts: 0,
            dead_letter_topic: None,
            ack_mode: Default::default(),
            overflow: Default::default(),
        },
        member: MemberOptions::default(),
        metadata: std::sync::Arc::from(""),
    }
}

/// The member's next frame; a missing frame fails the test instead of hanging it (after 5 s, or
/// at once on the paused clock, which jumps ahead as soon as nothing else can run).
async fn recv(member: &mut MemberStream) -> Option<Outbound> {
    tokio::time::timeout(Duration::from_secs(5), member.next())
        .await
        .expect("no frame within 5 s")
}

fn draft(topic: &str) -> Draft {
    Draft::new(
        Topic::parse(topic).unwrap(),
        bytes::Bytes::from_static(b"x"),
        Default::default(),
        &Limits::default(),
    )
    .unwrap()
}

// docs/semantics.md#idle-expiry: the queue outlives its last member for idle_timeout, then the subscription expires,
// counted; the expiry task wakes by itself.
#[tokio::test(start_paused = true)]
async fn idle_subscription_expires_on_its_own_after_the_timeout() {
    let limits = Limits {
        idle_timeout: Duration::from_secs(300),
        ..Limits::default()
    };
    let broker = broker(limits);
    let expiry = tokio::spawn(broker.clone().run_expiry());
    let member = broker
        .open(&request("s", Mode::Singleton, "a.*"), None)
        .unwrap();
    drop(member);
    broker.publish(draft("a.b")).unwrap();
    tokio::time::sleep(Duration::from_secs(299)).await;
    let view = broker.describe("s").unwrap();
    assert_eq!(view.queued_messages, 1, "queue kept during the idle time");
    assert_eq!(view.expires_in, Some(Duration::from_secs(1)));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(matches!(
        broker.describe("s"),
        Err(Error::SubscriptionNotFound(_))
    ));
    let (_, stats) = broker.list();
    assert_eq!(
        (stats.subscriptions_expired, stats.messages_expired),
        (1, 1)
    );
    // Unrouted now: the index no longer holds the expired subscription.
    assert_eq!(broker.publish(draft("a.b")).unwrap().queued_for, 0);
    expiry.abort();
}

// docs/semantics.md#singleton-invariant-5: a subscription recreated after expiry hands out higher epochs.
#[tokio::test(start_paused = true)]
async fn epochs_keep_increasing_across_expiry_and_recreation() {
    let broker = broker(Limits {
        idle_timeout: Duration::from_secs(1),
        ..Limits::default()
    });
    let mut first = broker
        .open(&request("s", Mode::Singleton, "a.*"), None)
        .unwrap();
    let Some(Outbound::Confirm {
        epoch: e1,
        member_id: m1,
        ..
    }) = recv(&mut first).await
    else {
        panic!("expected confirmation");
    };
    drop(first);
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(broker.expire_idle(), 1);
    let mut second = broker
        .open(&request("s", Mode::Singleton, "a.*"), None)
        .unwrap();
    let Some(Outbound::Confirm {
        epoch: e2,
        member_id: m2,
        ..
    }) = recv(&mut second).await
    else {
        panic!("expected confirmation");
    };
    assert!(e2 > e1 && m2 > m1, "epoch {e1}->{e2}, member {m1}->{m2}");
}

/// Opens the first member of `broker`'s singleton `s`: its member id, epoch and stream.
async fn first_confirmation(broker: &Broker) -> (MemberId, Epoch, MemberStream) {
    let mut member = broker
        .open(&request("s", Mode::Singleton, "a.*"), None)
        .unwrap();
    let Some(Outbound::Confirm {
        epoch, member_id, ..
    }) = recv(&mut member).await
    else {
        panic!("expected confirmation");
    };
    (member_id, epoch, member)
}

// docs/semantics.md#restart-identity: a restarted broker (a new one, its clock read later) hands out epochs, member ids and
// system ids above every one its predecessor handed out, with no state carried over; within a
// run they still count up by one.
#[tokio::test(start_paused = true)]
async fn a_restarted_broker_hands_out_higher_ids_than_before() {
    let start_ms = 1_767_225_600_000;
    let before = Broker::new(Limits::default(), Arc::new(VirtualClock::new(start_ms)));
    let (m1, e1, first) = first_confirmation(&before).await;
    assert_eq!((m1, e1), (start_ms * 1000 + 1, start_ms * 1000 + 1));
    let mut standby = before
        .open(&request("s", Mode::Singleton, "a.*"), None)
        .unwrap();
    drop(first);
    let Some(Outbound::Confirm {
        epoch: e2,
        member_id: m2,
        ..
    }) = recv(&mut standby).await
    else {
        panic!("expected the standby's promotion");
    };
    assert_eq!((m2, e2), (m1 + 1, e1 + 1), "consecutive within a run");
    let id1 = before.publish(draft("a.b")).unwrap().system_id;
    before.shutdown();
    drop(before);

    // One second later, on the wall clock.
    let after = Broker::new(
        Limits::default(),
        Arc::new(VirtualClock::new(start_ms + 1000)),
    );
    let (m3, e3, _member) = first_confirmation(&after).await;
    let id2 = after.publish(draft("a.b")).unwrap().system_id;
    assert!(
        e3 > e2 && m3 > m2 && id2 > id1,
        "epoch {e2}->{e3}, member {m2}->{m3}, system id {id1}->{id2}"
    );
}

// docs/semantics.md#overflow-policies: a refused publish changes nothing on any matching subscription, including those
// checked before the full one.
#[tokio::test]
async fn refused_publish_queues_on_no_subscription() {
    let broker = broker(Limits {
        max_queue_messages: 1,
        ..Limits::default()
    });
    let _a = broker
        .open(&request("a", Mode::Queue, "t.*"), None)
        .unwrap();
    let _b = broker
        .open(&request("b", Mode::Queue, "t.>"), None)
        .unwrap();
    // Fills only "b" (t.* needs exactly two tokens); "a" has room and is checked first.
    broker.publish(draft("t.x.y")).unwrap();
    let err = broker.publish(draft("t.y")).unwrap_err();
    assert!(
        matches!(&err, Error::QueueFull { subscription, .. } if subscription == "b"),
        "{err}"
    );
    let a = broker.describe("a").unwrap();
    assert_eq!((a.counters.enqueued, a.counters.rejected_full), (0, 0));
    assert_eq!(broker.describe("b").unwrap().counters.rejected_full, 1);
}

// docs/semantics.md#limits-table: the byte limit counts the whole message (topic, payload, headers with their
// overhead), and a refused publish names the limit.
#[tokio::test]
async fn byte_limit_counts_topic_payload_and_headers() {
    let headers: crate::core::Headers = [("k".to_string(), "vv".to_string())].into();
    let limits = Limits::default();
    let message = |payload: &'static [u8]| {
        Draft::new(
            Topic::parse("a.b").unwrap(),
            bytes::Bytes::from_static(payload),
            headers.clone(),
            &limits,
        )
        .unwrap()
    };
    // 3 (topic) + 4 (payload) + 1 + 2 + 64 (one header) = 74 bytes.
    assert_eq!(message(b"xxxx").size(), 74);
    let broker = broker(Limits {
        max_queue_bytes: 74 + 73,
        ..Limits::default()
    });
    // No member: everything stays queued.
    drop(
        broker
            .open(&request("s", Mode::Queue, "a.*"), None)
            .unwrap(),
    );
    broker.publish(message(b"xxxx")).unwrap();
    assert_eq!(broker.describe("s").unwrap().queued_bytes, 74);
    let err = broker.publish(message(b"xxxx")).unwrap_err();
    assert!(
        matches!(
            err,
            Error::QueueFull {
                limit: "max_queue_bytes",
                ..
            }
        ),
        "{err}"
    );
    // One byte less fits exactly.
    broker.publish(message(b"xxx")).unwrap();
    assert_eq!(broker.describe("s").unwrap().queued_bytes, 74 + 73);
}

// docs/semantics.md#shutdown: shutdown ends every stream with ShuttingDown and refuses new work.
#[tokio::test]
async fn shutdown_ends_streams_and_refuses_new_work() {
    let broker = broker(Limits::default());
    let mut member = broker
        .open(&request("s", Mode::Singleton, "a.*"), None)
        .unwrap();
    assert!(matches!(
        recv(&mut member).await,
        Some(Outbound::Confirm { .. })
    ));
    broker.shutdown();
    assert_eq!(
        recv(&mut member).await,
        Some(Outbound::End(Error::ShuttingDown))
    );
    assert_eq!(recv(&mut member).await, None);
    assert_eq!(broker.publish(draft("a.b")), Err(Error::ShuttingDown));
    assert!(matches!(
        broker.open(&request("t", Mode::Queue, "a.*"), None),
        Err(Error::ShuttingDown)
    ));
}

// docs/semantics.md#dead-letters: a dead letter whose topic matches its own subscription does not loop back into it.
#[tokio::test]
async fn dead_letter_skips_its_own_subscription() {
    let broker = broker(Limits::default());
    let mut req = request("loop", Mode::Singleton, "jobs.>");
    req.spec.max_delivery_attempts = 1;
    req.spec.dead_letter_topic = Some(Topic::parse("jobs.dead").unwrap());
    let mut member = broker.open(&req, None).unwrap();
    let _ = recv(&mut member).await;
    let mut watcher = broker
        .open(&request("watch", Mode::Queue, "jobs.dead"), None)
        .unwrap();
    let _ = recv(&mut watcher).await;
    let id = broker.publish(draft("jobs.x")).unwrap().system_id;
    assert!(matches!(
        recv(&mut member).await,
        Some(Outbound::Message { .. })
    ));
    broker
        .nack("loop", Fence::Member(member.member_id()), id)
        .unwrap();
    let Some(Outbound::Message { message, .. }) = recv(&mut watcher).await else {
        panic!("watcher should get the dead letter");
    };
    assert_eq!(message.topic().as_str(), "jobs.dead");
    let view = broker.describe("loop").unwrap();
    assert_eq!(
        (view.queued_messages, view.in_flight, view.counters.enqueued),
        (0, 0, 1)
    );
}

// docs/semantics.md#memory-budget / issue 16 (an exact memory budget): four threads publish at once, each to its own
// subscription, until the budget refuses them. Together they queue exactly what the budget has
// room for, and the account ends at or under it (the loom model in tests/loom.rs checks every
// interleaving of two such publishes; this runs real threads at scale).
#[test]
fn concurrent_publishers_fill_the_budget_exactly_and_never_pass_it() {
    use crate::core::subscription::{MEMBER_OVERHEAD, MESSAGE_OVERHEAD, subscription_cost};
    const THREADS: usize = 4;
    let requests: Vec<_> = (0..THREADS)
        .map(|i| request(&format!("s{i}"), Mode::Queue, &format!("t{i}")))
        .collect();
    let empty: u64 = requests
        .iter()
        .map(|r| subscription_cost(&r.spec) + MEMBER_OVERHEAD)
        .sum();
    let one = draft("t0").size() as u64 + MESSAGE_OVERHEAD;
    let room = 1_000;
    let max = empty + room * one + one / 2;
    let broker = broker(Limits {
        max_queue_messages: 10_000,
        ..general_budget(max)
    });
    // Standby-free queue members that never read: every message stays held.
    let members: Vec<_> = requests
        .iter()
        .map(|r| {
            let mut r = r.clone();
            r.member.max_in_flight = 1;
            broker.open(&r, None).unwrap()
        })
        .collect();
    let before = broker.list().1.memory_accounted_bytes;
    let start = std::sync::Barrier::new(THREADS);
    let accepted: u64 = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|i| {
                let (broker, start) = (&broker, &start);
                scope.spawn(move || {
                    start.wait();
                    let mut accepted = 0u64;
                    while broker.publish(draft(&format!("t{i}"))).is_ok() {
                        accepted += 1;
                    }
                    accepted
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    let after = broker.list().1.memory_accounted_bytes;
    assert!(after <= max, "account {after} over the budget {max}");
    assert_eq!(accepted, (max - before) / one, "accepted {accepted}");
    drop(members);
}

// docs/semantics.md#memory-budget / issue 16 (an exact memory budget): a dead letter takes memory like a publish. It is
// not refused back to anyone, so where the budget has no room for it, it is dropped and counted
// (`dropped_full`) instead of taking the account over `max_memory_bytes`.
#[tokio::test]
async fn a_dead_letter_with_no_room_in_the_budget_is_dropped_and_counted() {
    use crate::core::subscription::{MEMBER_OVERHEAD, MESSAGE_OVERHEAD, subscription_cost};
    let mut poison = request("poison", Mode::Singleton, "jobs.>");
    poison.spec.max_delivery_attempts = 1;
    poison.spec.dead_letter_topic = Some(Topic::parse("dead.jobs").unwrap());
    let sink = request("sink", Mode::Queue, "dead.>");
    let empty =
        subscription_cost(&poison.spec) + subscription_cost(&sink.spec) + 2 * MEMBER_OVERHEAD;
    let one = draft("jobs.x").size() as u64 + MESSAGE_OVERHEAD;
    let max = empty + one;
    let broker = broker(general_budget(max));
    let mut member = broker.open(&poison, None).unwrap();
    let _ = recv(&mut member).await;
    let _sink = broker.open(&sink, None).unwrap();
    let id = broker.publish(draft("jobs.x")).unwrap().system_id;
    assert!(matches!(
        recv(&mut member).await,
        Some(Outbound::Message { .. })
    ));
    // The dead letter carries headers saying where it came from, so it is larger than the
    // message it replaces and the budget has no room for it.
    broker
        .nack("poison", Fence::Member(member.member_id()), id)
        .unwrap();
    let (_, stats) = broker.list();
    assert!(
        stats.memory_accounted_bytes <= max,
        "account {} over the budget {max}",
        stats.memory_accounted_bytes
    );
    let view = broker.describe("sink").unwrap();
    assert_eq!(
        (view.queued_messages, view.counters.dropped_full),
        (0, 1),
        "{view:?}"
    );
}

// Issue: acks guessed for messages not yet written must not wedge a member. An ack for a frame
// still waiting in the member's outlet is refused and changes nothing, so the outlet never holds
// more than the window: what the core has in flight and what the stream carries agree.
#[test]
fn ack_for_a_frame_not_yet_written_is_refused() {
    let broker = broker(Limits::default());
    let mut member = broker
        .open(&request("blind", Mode::Queue, "a.*"), Some(7))
        .unwrap();
    let me = Fence::Member(member.member_id());
    assert!(matches!(member.try_next(), Some(Outbound::Confirm { .. })));
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(broker.publish(draft("a.b")).unwrap().system_id);
    }
    // Window 1: the first is in flight but its frame was not taken; guessed acks are refused,
    // by member and by connection alike.
    for fence in [me, Fence::Connection(7)] {
        let refused = broker.ack("blind", fence, ids[0]).unwrap_err();
        assert!(matches!(refused, Error::NotYetSent { .. }), "{refused}");
    }
    let refused = broker.ack("blind", me, ids[1]).unwrap_err();
    assert!(matches!(refused, Error::NotInFlight { .. }), "{refused}");
    let view = broker.describe("blind").unwrap();
    assert_eq!((view.in_flight, view.queued_messages), (1, 4));
    // Each message, once taken, can be acked, and exactly one more follows.
    for id in &ids {
        match member.try_next() {
            Some(Outbound::Message { message, .. }) => assert_eq!(message.system_id(), *id),
            other => panic!("expected message {id}, got {other:?}"),
        }
        assert_eq!(member.try_next(), None, "window 1 holds one frame");
        broker.ack("blind", me, *id).unwrap();
    }
    assert_eq!(broker.describe("blind").unwrap().counters.acked, 5);
}

// docs/semantics.md#ack-free (ack-free): taking a frame settles it, and the window refills at once.
#[test]
fn ack_free_member_settles_what_it_takes() {
    let broker = broker(Limits::default());
    let mut req = request("free", Mode::Broadcast, "a.*");
    req.spec.ack_mode = crate::core::AckMode::None;
    req.spec.overflow = crate::core::Overflow::DropOldest;
    req.member.max_in_flight = 2;
    let mut member = broker.open(&req, None).unwrap();
    assert!(matches!(member.try_next(), Some(Outbound::Confirm { .. })));
    for _ in 0..5 {
        broker.publish(draft("a.b")).unwrap();
    }
    let view = broker.describe("free").unwrap();
    assert_eq!((view.in_flight, view.queued_messages), (2, 3));
    let mut got = 0;
    while let Some(Outbound::Message { .. }) = member.try_next() {
        got += 1;
    }
    assert_eq!(got, 5);
    let view = broker.describe("free").unwrap();
    assert_eq!(
        (view.in_flight, view.queued_messages, view.counters.acked),
        (0, 0, 5)
    );
    let refused = broker
        .ack("free", Fence::Member(member.member_id()), 1)
        .unwrap_err();
    assert!(matches!(refused, Error::AckFree(_)), "{refused}");
}

// docs/semantics.md#memory-budget: the broker-wide memory budget counts what subscriptions really hold and refuses,
// naming max_memory_bytes, what would go over it; the account returns to zero when everything
// is released.
#[tokio::test(start_paused = true)]
async fn memory_budget_refuses_past_it_and_accounts_every_release() {
    use crate::core::subscription::{MEMBER_OVERHEAD, MESSAGE_OVERHEAD, subscription_cost};
    let req = request("m", Mode::Queue, "a.*");
    let empty = subscription_cost(&req.spec) + MEMBER_OVERHEAD;
    let per_message = draft("a.b").size() as u64 + MESSAGE_OVERHEAD;
    let broker = broker(Limits {
        idle_timeout: Duration::from_secs(1),
        ..general_budget(empty + 3 * per_message)
    });
    let mut member = broker.open(&req, None).unwrap();
    let accounted = |b: &Broker| b.list().1.memory_accounted_bytes;
    assert_eq!(accounted(&broker), empty);
    for _ in 0..3 {
        broker.publish(draft("a.b")).unwrap();
    }
    let refused = broker.publish(draft("a.b")).unwrap_err();
    assert!(matches!(refused, Error::MemoryBudget { .. }), "{refused}");
    assert!(
        refused.to_string().contains("max_memory_bytes"),
        "{refused}"
    );
    assert_eq!(broker.list().1.rejected_publishes, 1);
    // A delivered, acked message frees its share.
    assert!(matches!(member.try_next(), Some(Outbound::Confirm { .. })));
    let Some(Outbound::Message { message, .. }) = member.try_next() else {
        panic!("expected a message");
    };
    broker
        .ack("m", Fence::Member(member.member_id()), message.system_id())
        .unwrap();
    assert_eq!(accounted(&broker), empty + 2 * per_message);
    broker.publish(draft("a.b")).unwrap();
    // Leaving and expiring release the rest, down to nothing.
    drop(member);
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(broker.expire_idle(), 1);
    assert_eq!(accounted(&broker), 0);
}

// docs/semantics.md#idle-expiry with expiry scheduled by deadline: a subscription that regains a member before its
// deadline is not expired, one that loses it again gets a new deadline, and members joining and
// leaving other subscriptions never expire anything early. The schedule holds exactly the
// member-less subscriptions.
#[tokio::test(start_paused = true)]
async fn expiry_follows_each_subscriptions_own_deadline_through_churn() {
    let broker = broker(Limits {
        idle_timeout: Duration::from_secs(10),
        ..Limits::default()
    });
    let open = |id: &str| broker.open(&request(id, Mode::Queue, "a.*"), None).unwrap();
    drop(open("early"));
    tokio::time::advance(Duration::from_secs(5)).await;
    drop(open("late"));
    let rejoined = open("early");
    assert_eq!(lock(&broker.inner.idle).len(), 1, "only `late` is idle");
    tokio::time::advance(Duration::from_secs(6)).await;
    assert_eq!(
        broker.expire_idle(),
        0,
        "`early` has a member, `late` is not due"
    );
    drop(rejoined);
    tokio::time::advance(Duration::from_secs(5)).await;
    assert_eq!(
        broker.expire_idle(),
        1,
        "`late` is due, `early` left 5 s ago"
    );
    assert!(broker.describe("late").is_err());
    assert!(broker.describe("early").is_ok());
    tokio::time::advance(Duration::from_secs(5)).await;
    assert_eq!(broker.expire_idle(), 1);
    assert_eq!(lock(&broker.inner.idle).len(), 0);
}

/// The id of a message frame, or a panic naming what came instead.
fn message_id(frame: Option<Outbound>) -> (SystemId, u32) {
    match frame {
        Some(Outbound::Message {
            message, attempt, ..
        }) => (message.system_id(), attempt),
        other => panic!("expected a message, got {other:?}"),
    }
}

// Review of issue 17 part 1: the unsent set of a `Settle` is a snapshot taken before any of its
// ids is applied, but applying an ack or a nack delivers new frames to the same member (the
// window freed, or the nacked message redelivered at the head). A later id of the same settle
// naming such a frame must be refused as not yet sent, as it is when sent in its own settle;
// with the snapshot it is applied to a copy the client never saw: the nack bumps an attempt
// nobody received and the outlet holds the same message twice.
#[test]
fn a_settle_cannot_nack_a_frame_its_own_earlier_ids_delivered() {
    let broker = broker(Limits::default());
    let mut req = request("snap", Mode::Queue, "a.*");
    req.member.max_in_flight = 2;
    let mut member = broker.open(&req, None).unwrap();
    let settler = member.settler();
    assert!(matches!(member.try_next(), Some(Outbound::Confirm { .. })));
    let a = broker.publish(draft("a.b")).unwrap().system_id;
    let b = broker.publish(draft("a.b")).unwrap().system_id;
    let c = broker.publish(draft("a.b")).unwrap().system_id;
    assert_eq!(message_id(member.try_next()), (a, 1));
    assert_eq!(message_id(member.try_next()), (b, 1));
    assert_eq!(member.try_next(), None, "window 2: c waits");

    // Acking a lets c into the outlet; the same settle's nack of c guesses a frame not written.
    let refused = settler.settle(&[a], &[c], &[]).unwrap();
    assert!(
        matches!(refused.as_slice(), [(id, Settlement::Nack, Error::NotYetSent { .. })] if *id == c),
        "nack of the unsent c must be refused: {refused:?}"
    );
    assert_eq!(
        message_id(member.try_next()),
        (c, 1),
        "c once, first attempt"
    );
    assert_eq!(member.try_next(), None, "no second copy of c");

    // Nacking b twice: the first puts b back and redelivers it to this member, unsent; the
    // second names that unsent copy.
    let refused = settler.settle(&[], &[b, b], &[]).unwrap();
    assert!(
        matches!(refused.as_slice(), [(id, Settlement::Nack, Error::NotYetSent { .. })] if *id == b),
        "the second nack of b names a frame not yet written: {refused:?}"
    );
    assert_eq!(message_id(member.try_next()), (b, 2));
    assert_eq!(member.try_next(), None, "no second copy of b");
    let view = broker.describe("snap").unwrap();
    assert_eq!(view.counters.nacked, 1);
}

// Review of issue 17 part 1, the ack side of the stale unsent set: an ack that frees the window
// lets the next queued message into the outlet, and a later ack of the same settle that guesses
// its id releases it before its frame is written. The member then has more frames unwritten
// than its window (each such settle of a window's worth of guessed ids pulls a window's worth
// of queued messages into the outlet, acked, out of the queue's accounting), and the client
// later receives a message the broker already counts as acked.
#[test]
fn a_settle_cannot_ack_a_frame_its_own_earlier_acks_delivered() {
    let broker = broker(Limits::default());
    let mut req = request("guess", Mode::Queue, "a.*");
    req.member.max_in_flight = 2;
    let mut member = broker.open(&req, None).unwrap();
    let settler = member.settler();
    assert!(matches!(member.try_next(), Some(Outbound::Confirm { .. })));
    let ids: Vec<SystemId> = (0..5)
        .map(|_| broker.publish(draft("a.b")).unwrap().system_id)
        .collect();
    assert_eq!(message_id(member.try_next()).0, ids[0]);
    assert_eq!(message_id(member.try_next()).0, ids[1]);
    assert_eq!(member.try_next(), None, "window 2");

    // ids[2] enters the outlet when ids[0] is acked; the same settle guesses it.
    let refused = settler.settle(&[ids[0], ids[2]], &[], &[]).unwrap();
    assert!(
        matches!(refused.as_slice(), [(id, Settlement::Ack, Error::NotYetSent { .. })] if *id == ids[2]),
        "the ack of the unwritten {} must be refused: {refused:?}",
        ids[2]
    );
    assert_eq!(broker.describe("guess").unwrap().counters.acked, 1);
    assert_eq!(message_id(member.try_next()).0, ids[2]);
    assert_eq!(
        member.try_next(),
        None,
        "one unwritten frame at most: b is in flight and written, the window is 2"
    );
}

// Cluster mode feeds a subscription from upstream: the message keeps the id it was given,
// reaches only the subscription named (not every match of its topic), carries the attempt
// upstream counted, and never takes an id from the broker's own counter.
#[tokio::test(start_paused = true)]
async fn injected_messages_keep_their_id_and_attempt_and_reach_one_subscription() {
    let broker = broker(Limits::default()).upstream();
    let mut a = broker
        .open(&request("a", Mode::Queue, "x.*"), None)
        .unwrap();
    let mut other = broker
        .open(&request("b", Mode::Queue, "x.*"), None)
        .unwrap();
    assert!(matches!(recv(&mut a).await, Some(Outbound::Confirm { .. })));
    assert!(matches!(
        recv(&mut other).await,
        Some(Outbound::Confirm { .. })
    ));
    assert_eq!(broker.room("a"), Some(1));
    assert_eq!(broker.room("nope"), None);
    assert!(broker.has_member("a", a.member_id()));
    assert!(!broker.has_member("a", a.member_id() + 1));
    assert!(!broker.has_member("gone", a.member_id()));
    let live = std::sync::atomic::AtomicBool::new(true);
    let message = draft("x.y").into_message(42, 7);
    broker.inject("a", message, 3, &live).unwrap();
    match recv(&mut a).await {
        Some(Outbound::Message {
            message, attempt, ..
        }) => assert_eq!((message.system_id(), attempt), (42, 3)),
        other => panic!("{other:?}"),
    }
    assert_eq!(broker.room("a"), Some(0));
    assert_eq!(other.try_next(), None, "only the named subscription");
    assert!(matches!(
        broker.inject("gone", draft("x.y").into_message(43, 7), 1, &live),
        Err(Error::SubscriptionNotFound(_))
    ));
    // A feeder whose subscription expired (its claim cleared) cannot feed one of the same
    // name: the message is refused and nothing is queued, charged or counted.
    let stale = std::sync::atomic::AtomicBool::new(false);
    let before = broker.list().1.memory_accounted_bytes;
    assert!(matches!(
        broker.inject("a", draft("x.y").into_message(44, 7), 1, &stale),
        Err(Error::SubscriptionNotFound(_))
    ));
    assert_eq!(broker.list().1.memory_accounted_bytes, before);
    assert_eq!(broker.describe("a").unwrap().queued_messages, 0);
    broker.ack("a", Fence::Member(a.member_id()), 42).unwrap();
    let own = broker.publish(draft("z.z")).unwrap();
    assert_eq!(own.system_id, broker.id_floor().last_system_id() + 1);
}

/// The shared encoding a message frame carries, or a panic naming what came instead.
fn shared_of(frame: Option<Outbound>) -> Option<SharedEncoding> {
    match frame {
        Some(Outbound::Message { shared, .. }) => shared,
        other => panic!("expected a message, got {other:?}"),
    }
}

// Issue 16: the frames delivering one publish to several subscriptions share one encoding slot
// (filled through one, seen through the others); a message queued for one subscription only has
// none to share.
#[test]
fn a_fanned_out_publish_shares_one_encoding() {
    let broker = broker(Limits::default());
    let mut members: Vec<_> = ["p", "q", "r"]
        .iter()
        .map(|id| {
            let mut member = broker
                .open(&request(id, Mode::Broadcast, "a.*"), None)
                .unwrap();
            assert!(matches!(member.try_next(), Some(Outbound::Confirm { .. })));
            member
        })
        .collect();
    broker.publish(draft("a.b")).unwrap();
    let shared: Vec<_> = members
        .iter_mut()
        .map(|m| shared_of(m.try_next()).expect("shared across subscriptions"))
        .collect();
    assert!(shared.iter().all(|s| s.get().is_none()));
    shared[0].get_or_init(|| Box::new([1, 2, 3]));
    assert!(shared.iter().all(|s| s.get() == Some(&[1, 2, 3][..])));

    let mut alone = broker
        .open(&request("alone", Mode::Queue, "solo.*"), None)
        .unwrap();
    assert!(matches!(alone.try_next(), Some(Outbound::Confirm { .. })));
    broker.publish(draft("solo.x")).unwrap();
    assert!(shared_of(alone.try_next()).is_none(), "nothing to share");
}

// docs/semantics.md#memory-budget: drop-oldest subscriptions' messages come out of their own
// share of the budget, so however much they hold, a reject-publish subscription's publish is
// taken while the general pool has room; and past their share they drop their oldest (counted)
// instead of refusing. Both pools stay within their limits exactly.
#[test]
fn drop_oldest_queues_fill_only_their_share_and_never_refuse() {
    use crate::core::{AckMode, Overflow};
    let limits = Limits {
        max_memory_bytes: 1 << 20,
        ..Limits::default()
    };
    let share = limits.drop_oldest_memory_bytes();
    let broker = broker(limits);
    let mut lagging = Vec::new();
    for i in 0..4 {
        let mut r = request(&format!("feed{i}"), Mode::Queue, "feed.>");
        r.spec.ack_mode = AckMode::None;
        r.spec.overflow = Overflow::DropOldest;
        // Its member leaves: the queue stays (idle expiry) and nobody drains it.
        lagging.push(broker.open(&r, None).unwrap().member_id());
    }
    let strict = broker.open(&request("orders", Mode::Queue, "orders.*"), None);
    let _strict = strict.unwrap();
    let big = |topic: &str| {
        Draft::new(
            Topic::parse(topic).unwrap(),
            bytes::Bytes::from(vec![0u8; 8 * 1024]),
            Default::default(),
            &Limits::default(),
        )
        .unwrap()
    };
    for _ in 0..200 {
        let published = broker.publish(big("feed.x")).unwrap();
        assert_eq!(published.queued_for, 4);
        let (_, stats) = broker.list();
        assert!(
            stats.memory_drop_oldest_bytes <= share,
            "{} over the share {share}",
            stats.memory_drop_oldest_bytes
        );
    }
    let dropped: u64 = (0..4)
        .map(|i| broker.describe(&format!("feed{i}")).unwrap())
        .map(|v| v.counters.dropped_overflow)
        .sum();
    assert!(dropped > 0);
    // 200 × 4 × 8 KiB went to a share of 256 KiB: what is held is within a message of it.
    let (_, stats) = broker.list();
    let one = big("feed.x").size() as u64 + crate::core::subscription::MESSAGE_OVERHEAD;
    assert!(stats.memory_drop_oldest_bytes + one > share, "{stats:?}");
    // The reject-publish subscription still has all of the general pool's room.
    for _ in 0..40 {
        broker.publish(big("orders.new")).unwrap();
    }
    assert_eq!(broker.list().1.rejected_publishes, 0);
    // Each pool's account is exactly what its subscriptions' footprints say.
    let held: u64 = (0..4)
        .map(|i| broker.describe(&format!("feed{i}")).unwrap())
        .map(|v| v.queued_bytes + v.queued_messages * crate::core::subscription::MESSAGE_OVERHEAD)
        .sum();
    assert_eq!(broker.list().1.memory_drop_oldest_bytes, held);
    drop(lagging);
}

// docs/semantics.md#deleting: a broker shutting down deletes nothing (UNAVAILABLE, as every
// call then), and the subscription is still there to describe.
#[test]
fn delete_while_shutting_down_is_refused_and_changes_nothing() {
    let broker = broker(Limits::default());
    drop(
        broker
            .open(&request("idle", Mode::Queue, "a.*"), None)
            .unwrap(),
    );
    broker.shutdown();
    let refused = broker.delete("idle");
    assert!(matches!(refused, Err(Error::ShuttingDown)), "{refused:?}");
    assert!(broker.describe("idle").is_ok());
}

// docs/semantics.md#deleting: a delete gives back every byte the subscription had in both
// pools of the memory budget, takes its patterns out of the routing index and its expiry timer
// out of the schedule, counts what it discarded (not as expired), and refuses, changing
// nothing, while a member is joined.
#[tokio::test(start_paused = true)]
async fn delete_gives_back_both_pools_and_unroutes_the_subscription() {
    let broker = broker(Limits {
        idle_timeout: Duration::from_secs(1),
        ..Limits::default()
    });
    let mut acked = broker
        .open(&request("acked", Mode::Queue, "a.*"), None)
        .unwrap();
    let mut drop_oldest = request("free", Mode::Queue, "a.*");
    drop_oldest.spec.ack_mode = AckMode::None;
    drop_oldest.spec.overflow = crate::core::Overflow::DropOldest;
    let free = broker.open(&drop_oldest, None).unwrap();
    for _ in 0..3 {
        broker.publish(draft("a.b")).unwrap();
    }
    assert!(matches!(
        recv(&mut acked).await,
        Some(Outbound::Confirm { .. })
    ));
    let refused = broker.delete("acked");
    assert!(
        matches!(refused, Err(Error::MembersJoined { members: 1, .. })),
        "{refused:?}"
    );
    assert_eq!(broker.describe("acked").unwrap().members.len(), 1);
    drop(acked);
    drop(free);
    let (_, before) = broker.list();
    assert!(before.memory_drop_oldest_bytes > 0, "{before:?}");
    assert_eq!(broker.delete("acked").unwrap().discarded_messages, 3);
    assert_eq!(broker.delete("free").unwrap().discarded_messages, 3);
    let (views, after) = broker.list();
    assert!(views.is_empty());
    assert_eq!(
        (after.memory_accounted_bytes, after.memory_drop_oldest_bytes),
        (0, 0),
        "both pools are back to nothing"
    );
    assert_eq!(
        (after.subscriptions_deleted, after.messages_deleted),
        (2, 6)
    );
    assert_eq!(
        broker.publish(draft("a.b")).unwrap().queued_for,
        0,
        "unrouted"
    );
    assert!(matches!(
        broker.delete("acked"),
        Err(Error::SubscriptionNotFound(_))
    ));
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(
        broker.expire_idle(),
        0,
        "no expiry timer outlives the delete"
    );
    assert_eq!(broker.list().1.subscriptions_expired, 0);
}
