//! Drop-oldest and the two memory pools against the broker's public API with a virtual clock
//! (docs/semantics.md#ack-free, #overflow-policies, #memory-budget). Each test was first written
//! against a broken version, which it failed: the comment above it says what broke.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use tinybroker::{
    broker::{Broker, Fence, MemberStream, Outbound},
    clock::{TokioClock, VirtualClock},
    core::{
        AckMode, Draft, Envelope, Floors, Headers, Limits, MemberOptions, Message, Mode,
        OpenRequest, Overflow, Pattern, QueueLimits, Subscription, SubscriptionSpec, Topic,
    },
};

const KIB: usize = 1024;

fn broker(limits: Limits) -> Broker {
    Broker::new(limits, Arc::new(VirtualClock::new(1_700_000_000_000)))
}

fn spec(mode: Mode, pattern: &str, ack_mode: AckMode, overflow: Overflow) -> SubscriptionSpec {
    SubscriptionSpec {
        mode,
        consumer_group: if mode == Mode::Broadcast {
            String::new()
        } else {
            "g".into()
        },
        patterns: vec![Pattern::parse(pattern).unwrap()],
        max_delivery_attempts: 0,
        dead_letter_topic: None,
        ack_mode,
        overflow,
    }
}

fn request(id: &str, spec: SubscriptionSpec, window: u32) -> OpenRequest {
    OpenRequest {
        subscription_id: id.into(),
        spec,
        member: MemberOptions {
            max_in_flight: window,
            notify_standby: false,
            priority: 0,
        },
        metadata: std::sync::Arc::from(""),
    }
}

fn ack_free(id: &str, mode: Mode, pattern: &str, window: u32) -> OpenRequest {
    request(
        id,
        spec(mode, pattern, AckMode::None, Overflow::DropOldest),
        window,
    )
}

fn draft(topic: &str, size: usize) -> Draft {
    Draft::new(
        Topic::parse(topic).unwrap(),
        Bytes::from(vec![b'x'; size]),
        Headers::new(),
        &Limits::default(),
    )
    .unwrap()
}

/// Every message frame waiting on `member` now (the stream is not blocked: it reads all).
fn drain(member: &mut MemberStream) -> Vec<u64> {
    let mut got = Vec::new();
    while let Some(frame) = member.try_next() {
        if let Outbound::Message { message, .. } = frame {
            got.push(message.system_id());
        }
    }
    got
}

// ---------------------------------------------------------------------------------------------
// Case 1. docs/semantics.md#ack-free: "a reader that stalls and resumes gets the newest
// messages (and at most the few frames the transport already held when it stalled), never the
// first ones with the latest lost". A member's stream takes *every* frame of its outlet at once
// (`MemberStream::poll_frame` → `take_frames` swaps the whole outlet into `taken`) and the core
// counts each one written (acked) right then; `Withdraw` can only reach the outlet. So a reader
// that stalls right after its stream polled keeps up to a whole window of the oldest frames,
// then a gap, then the newest: with the default ack-free window of 256 that is 255 stale
// frames. Through gRPC the same happens whenever a slow reader's HTTP/2 window opens once
// (hostile::overflow::a_stalled_ack_free_reader_that_read_once_gets_a_gap_in_the_middle).
#[tokio::test(start_paused = true)]
async fn a_stream_that_polled_once_keeps_no_more_than_one_take_of_stale_frames() {
    let limits = Limits {
        max_queue_messages: 300,
        ..Limits::default()
    };
    let broker = broker(limits);
    let mut member = broker
        .open(&ack_free("feed", Mode::Broadcast, "t.*", 256), None)
        .unwrap();
    assert!(matches!(member.try_next(), Some(Outbound::Confirm { .. })));
    let first = broker.publish(draft("t.a", 16)).unwrap().system_id;
    for _ in 1..256 {
        broker.publish(draft("t.a", 16)).unwrap();
    }
    // The transport asks for one frame (it writes one, then the socket blocks).
    let Some(Outbound::Message { message, .. }) = member.try_next() else {
        panic!("a message frame first");
    };
    assert_eq!(message.system_id(), first);
    // The reader is stalled; 1,000 more arrive. Drop-oldest must keep the newest 300.
    let mut last = 0;
    for _ in 0..1000 {
        last = broker.publish(draft("t.a", 16)).unwrap().system_id;
    }
    let dropped = broker.describe("feed").unwrap().counters.dropped_overflow;
    // The reader resumes.
    let got = drain(&mut member);
    let run = got
        .iter()
        .rev()
        .zip((0..=last).rev())
        .take_while(|(id, want)| **id == *want)
        .count();
    let before = &got[..got.len() - run];
    eprintln!(
        "{dropped} dropped; got {} frames: {} before the final run ({:?}..{:?}), then a run of {run} ending #{}",
        got.len(),
        before.len(),
        before.first().map(|id| id - first + 1),
        before.last().map(|id| id - first + 1),
        last - first + 1,
    );
    assert!(
        before.len() < tinybroker::broker::ACK_FREE_TAKE,
        "after one frame was written, {} of the oldest frames came back (#{}..#{}), then a \
         gap, then the newest {run}: drop-oldest dropped the middle",
        before.len(),
        before.first().unwrap() - first + 1,
        before.last().unwrap() - first + 1
    );
}

// ---------------------------------------------------------------------------------------------
// Case 2. docs/semantics.md#ack-free: "the **oldest** message is dropped for each new one ...
// the queue's head, or a frame waiting for the member's socket that its stream has not written
// yet, whichever is older". `drop_oldest` looks only at the *front* of each member's unwritten
// list, which is in delivery order, not id order: a message given back by a leaving member
// reaches the next one behind newer ones (the core's own test says so). Then a newer message
// is dropped while an older one is kept.
#[test]
fn drop_oldest_drops_the_queue_head_or_the_longest_waiting_frame_whichever_is_older() {
    let limits = QueueLimits {
        max_messages: 4,
        max_bytes: 1 << 20,
        max_members: 10,
        idle_timeout: Duration::from_secs(60),
    };
    let spec = spec(Mode::Queue, "jobs.>", AckMode::None, Overflow::DropOldest);
    let mut s = Subscription::new("s".into(), spec.clone(), limits, Floors::default(), NOW);
    let msg = |id: u64| {
        let envelope = Envelope::new(Topic::parse("jobs.a").unwrap(), Headers::new());
        Message::new(id, 0, envelope, b"0123456789")
    };
    let window = |n| MemberOptions {
        max_in_flight: n,
        priority: 0,
        notify_standby: false,
    };
    let (a, _) = s.join(&spec, window(2)).unwrap();
    let (b, _) = s.join(&spec, window(2)).unwrap();
    for id in 1..=4 {
        let _ = s.enqueue(msg(id));
    }
    // a holds 1 and 3, b holds 2 and 4. a leaves: 1 and 3 go back to the queue.
    let _ = s.leave(a, NOW);
    // b's stream writes 2: 1 is delivered to b behind 4, so b's unwritten list is [4, 1].
    let _ = s.ack(Some(b), 2).unwrap();
    assert_eq!(
        s.in_flight_ids().collect::<Vec<_>>(),
        [(1, b), (4, b)],
        "b holds 1 and 4; 3 is queued"
    );
    // At the limit (4 held: 1, 3, 4 and the new one), three new messages arrive.
    for id in 5..=7 {
        let _ = s.enqueue(msg(id));
    }
    s.check_invariants().unwrap();
    let mut held: Vec<u64> = s
        .in_flight_ids()
        .map(|(id, _)| id)
        .chain(s.queued_ids())
        .collect();
    held.sort_unstable();
    // The queue's head or the frame that has waited longest in a member's outlet, whichever
    // has the lower id: 3 (queued) goes, then 4, which waited in b's outlet longer than 1 (a
    // leaving member gave 1 back, delivered behind 4).
    assert_eq!(
        held,
        [1, 5, 6, 7],
        "the frames that waited longest and the queue's head go first"
    );
}

const NOW: Duration = Duration::from_secs(1);

// ---------------------------------------------------------------------------------------------
// Case 3. docs/semantics.md#ack-free: "A slow member never blocks publishers, to itself or to
// any other subscription". Issue 26 item 1 asked that "what ack-free subscriptions hold never
// makes a publish to any subscription fail: when the budget is short, drop-oldest makes room
// first (from the subscriptions whose policy allows it)". The drop-oldest pool is shared, but
// each subscription may only drop *its own* messages: abandoned ack-free subscriptions (members
// gone, kept for --idle-timeout, 5 minutes by default) that fill the pool make every other
// drop-oldest subscription on the broker drop *every* new message, also one whose reader is
// live, idle and reads each message the moment it is published. The publish says it was
// queued (`queued_for` 1); the reader gets nothing, for as long as the laggards live.
#[tokio::test(start_paused = true)]
async fn abandoned_ack_free_queues_make_room_for_a_live_reader_elsewhere() {
    let limits = Limits {
        max_memory_bytes: 4 << 20,
        ..Limits::default()
    };
    let pool = limits.drop_oldest_memory_bytes();
    let broker = broker(limits);
    // One abandoned ack-free subscription (its member left; its queue is kept).
    drop(
        broker
            .open(&ack_free("abandoned", Mode::Queue, "feed.>", 256), None)
            .unwrap(),
    );
    for _ in 0..(pool as usize / (4 * KIB)) + 10 {
        broker.publish(draft("feed.prices", 4 * KIB)).unwrap();
    }
    assert!(broker.list().1.memory_drop_oldest_bytes + 5000 > pool);
    // A healthy ack-free reader on another topic, reading every message at once.
    let mut live = broker
        .open(&ack_free("live", Mode::Broadcast, "alerts.*", 256), None)
        .unwrap();
    assert!(matches!(live.try_next(), Some(Outbound::Confirm { .. })));
    let mut got = Vec::new();
    for _ in 0..20 {
        // The same size as the backlog's messages: the pool's last few bytes do not fit one.
        let published = broker.publish(draft("alerts.fire", 4 * KIB)).unwrap();
        assert_eq!(published.queued_for, 1);
        got.extend(drain(&mut live));
    }
    let counters = broker.describe("live").unwrap().counters;
    assert_eq!(
        got.len(),
        20,
        "a live, idle ack-free reader got {} of 20 messages (dropped_overflow {}): another \
         subscription's abandoned backlog holds the drop-oldest pool",
        got.len(),
        counters.dropped_overflow
    );
}

// ---------------------------------------------------------------------------------------------
// docs/semantics.md#memory-budget, where the abandoned backlogs match the same publish as the
// live reader (a black-box review: 8 abandoned ack-free queues and a live reader on one topic
// family; the live reader got 62 of 900 messages, its own few unwritten frames dropped first and
// the abandoned queues, locked by the same publish, out of the eviction's reach). Abandoned
// backlogs make room first, also those the publish itself reaches.
#[tokio::test(start_paused = true)]
async fn abandoned_queues_on_the_same_topic_make_room_before_a_live_reader_loses_anything() {
    let limits = Limits {
        max_memory_bytes: 8 << 20,
        ..Limits::default()
    };
    let pool = limits.drop_oldest_memory_bytes();
    let broker = broker(limits);
    for i in 0..8 {
        drop(
            broker
                .open(
                    &ack_free(&format!("gone{i}"), Mode::Queue, "t.>", 256),
                    None,
                )
                .unwrap(),
        );
    }
    let mut live = broker
        .open(&ack_free("live", Mode::Broadcast, "t.*", 256), None)
        .unwrap();
    assert!(matches!(live.try_next(), Some(Outbound::Confirm { .. })));
    // Fill the pool: each publish reaches all nine.
    for _ in 0..(pool as usize / (9 * 16 * KIB)) + 20 {
        broker.publish(draft("t.fill", 16 * KIB)).unwrap();
        drain(&mut live);
    }
    assert!(broker.list().1.memory_drop_oldest_bytes + 9 * 17 * KIB as u64 > pool);
    let mut got = 0;
    for size in [4 * KIB, 16 * KIB, 64 * KIB] {
        for _ in 0..100 {
            broker.publish(draft("t.x", size)).unwrap();
            got += drain(&mut live).len();
        }
    }
    let counters = broker.describe("live").unwrap().counters;
    assert_eq!(
        (got, counters.dropped_overflow),
        (300, 0),
        "the live reader lost messages while abandoned queues held the pool"
    );
    assert!(broker.list().1.memory_drop_oldest_bytes <= pool);
}

// ---------------------------------------------------------------------------------------------
// Case 4. A message larger than the drop-oldest pool is dropped at every drop-oldest
// subscription, also to a live reader with an empty window, and the publish answers `queued_for`
// as if it were queued. Nothing checks the pool against --max-message-bytes: `serve
// --max-memory-bytes 4MiB` (default --max-message-bytes 1 MiB, pool 1 MiB) accepts the
// configuration, and every 1 MiB message to an ack-free subscriber is lost. Before 90bd837 the
// same message was delivered (it fit the one budget).
#[tokio::test(start_paused = true)]
async fn the_largest_message_reaches_an_ack_free_reader_at_a_small_budget() {
    let limits = Limits {
        max_memory_bytes: 4 << 20,
        ..Limits::default()
    };
    assert!(
        limits.drop_oldest_memory_bytes()
            >= limits.max_message_bytes as u64 + tinybroker::core::subscription::MESSAGE_OVERHEAD,
        "the drop-oldest pool holds at least one largest message"
    );
    let broker = broker(limits.clone());
    let mut live = broker
        .open(&ack_free("live", Mode::Broadcast, "big.*", 256), None)
        .unwrap();
    let mut acked = broker
        .open(
            &request(
                "acked",
                spec(
                    Mode::Broadcast,
                    "big.*",
                    AckMode::Explicit,
                    Overflow::RejectPublish,
                ),
                1,
            ),
            None,
        )
        .unwrap();
    assert!(matches!(live.try_next(), Some(Outbound::Confirm { .. })));
    assert!(matches!(acked.try_next(), Some(Outbound::Confirm { .. })));
    // The largest message the broker accepts.
    let size = limits.max_message_bytes - "big.one".len();
    let draft = Draft::new(
        Topic::parse("big.one").unwrap(),
        Bytes::from(vec![b'x'; size]),
        Headers::new(),
        &limits,
    )
    .unwrap();
    let published = broker.publish(draft).unwrap();
    assert_eq!(published.queued_for, 2);
    assert!(
        matches!(acked.try_next(), Some(Outbound::Message { .. })),
        "the acked subscriber gets it"
    );
    let got = drain(&mut live);
    assert_eq!(
        got,
        [published.system_id],
        "the ack-free reader with an empty window got nothing (dropped_overflow {})",
        broker.describe("live").unwrap().counters.dropped_overflow
    );
}

// ---------------------------------------------------------------------------------------------
// Case 5. `make_room` drops before it knows whether dropping can make enough room: a
// message that cannot fit the drop-oldest pool even when the subscription holds nothing first
// drops *every* message the subscription holds, then itself. docs/semantics.md#overflow-policies
// says the oldest are dropped "to make room"; here nothing is made room for, and the whole
// backlog is lost for nothing. One 1 MiB publish (the default --max-message-bytes) at
// --max-memory-bytes 4MiB empties every drop-oldest subscription on its topic.
#[tokio::test(start_paused = true)]
async fn a_message_that_cannot_fit_drops_only_itself() {
    // The queue's own byte limit is below one message: nothing dropping can make it fit.
    let limits = Limits {
        max_memory_bytes: 4 << 20,
        max_queue_bytes: 512 << 10,
        ..Limits::default()
    };
    let broker = broker(limits.clone());
    drop(
        broker
            .open(&ack_free("backlog", Mode::Queue, "feed.*", 256), None)
            .unwrap(),
    );
    for _ in 0..100 {
        broker.publish(draft("feed.a", KIB)).unwrap();
    }
    assert_eq!(broker.describe("backlog").unwrap().queued_messages, 100);
    let size = limits.max_message_bytes - "feed.a".len();
    let big = Draft::new(
        Topic::parse("feed.a").unwrap(),
        Bytes::from(vec![b'x'; size]),
        Headers::new(),
        &limits,
    )
    .unwrap();
    broker.publish(big).unwrap();
    let view = broker.describe("backlog").unwrap();
    assert_eq!(
        view.queued_messages,
        100,
        "one message that could never fit dropped the {} messages held, then itself \
         (dropped_overflow {})",
        100 - view.queued_messages,
        view.counters.dropped_overflow
    );
}

// ---------------------------------------------------------------------------------------------
// Case 6 (docs). docs/semantics.md#dead-letters: "A dead letter that finds a full queue or no
// room in the memory budget is dropped and counted there (`dropped_full`)". Into a drop-oldest
// subscription whose pool share is used up (here by another subscription), a dead letter is
// dropped and counted as `dropped_overflow`; `dropped_full` stays 0.
#[tokio::test(start_paused = true)]
async fn a_dead_letter_into_a_drop_oldest_subscription_makes_room_like_any_message() {
    let limits = Limits {
        max_memory_bytes: 1 << 20,
        ..Limits::default()
    };
    let pool = limits.drop_oldest_memory_bytes();
    let broker = broker(limits);
    // The pool, filled by an abandoned ack-free queue.
    drop(
        broker
            .open(&ack_free("hog", Mode::Queue, "hog.*", 256), None)
            .unwrap(),
    );
    for _ in 0..(pool as usize / KIB) + 10 {
        broker.publish(draft("hog.a", KIB)).unwrap();
    }
    // An abandoned drop-oldest queue on the dead-letter topic: it holds nothing.
    drop(
        broker
            .open(&ack_free("dlq", Mode::Queue, "dead.*", 256), None)
            .unwrap(),
    );
    // A job with one attempt, nacked: dead-lettered to dead.jobs.
    let mut jobs = spec(
        Mode::Queue,
        "jobs.*",
        AckMode::Explicit,
        Overflow::RejectPublish,
    );
    jobs.max_delivery_attempts = 1;
    jobs.dead_letter_topic = Some(Topic::parse("dead.jobs").unwrap());
    let mut worker = broker.open(&request("jobs", jobs, 1), None).unwrap();
    assert!(matches!(worker.try_next(), Some(Outbound::Confirm { .. })));
    let id = broker.publish(draft("jobs.a", 10)).unwrap().system_id;
    assert!(matches!(worker.try_next(), Some(Outbound::Message { .. })));
    broker
        .nack("jobs", Fence::Member(worker.member_id()), id)
        .unwrap();
    let jobs = broker.describe("jobs").unwrap().counters;
    assert_eq!(jobs.dead_lettered, 1);
    let dlq = broker.describe("dlq").unwrap();
    // A drop-oldest subscription makes room for a dead letter as for any message: the hog's
    // oldest go (docs/semantics.md#dead-letters), and the dead letter is queued.
    assert_eq!(dlq.queued_messages, 1, "{:?}", dlq.counters);
    assert_eq!(dlq.counters.dropped_full, 0, "{:?}", dlq.counters);
}

// ---------------------------------------------------------------------------------------------
// Held: both pools stay within their limits under concurrent publishers, readers that come and
// go, acks, and a few KiB of budget; and the account returns to the empty subscriptions' cost,
// then to 0 after expiry.
#[test]
fn held_pools_stay_within_limits_and_return_to_zero_under_concurrency() {
    for (budget, percent, size) in [
        (8 * KIB as u64, 1u8, 1usize),
        (8 * KIB as u64, 99, 1),
        (64 * KIB as u64, 25, 4 * KIB),
        (64 * KIB as u64, 50, 1),
        (1 << 20, 25, 60 * KIB),
    ] {
        let limits = Limits {
            max_memory_bytes: budget,
            drop_oldest_memory_percent: percent,
            max_queue_messages: 50,
            idle_timeout: Duration::ZERO,
            ..Limits::default()
        };
        let general = limits.general_memory_bytes();
        let pool = limits.drop_oldest_memory_bytes();
        let broker = Broker::new(limits, Arc::new(TokioClock::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        let ids = ["d0", "d1", "r0", "r1", "ad"];
        for (i, id) in ids.iter().enumerate() {
            let (broker, stop) = (broker.clone(), stop.clone());
            let id = id.to_string();
            threads.push(std::thread::spawn(move || {
                let spec = match &id[..1] {
                    "d" => spec(Mode::Queue, "x.>", AckMode::None, Overflow::DropOldest),
                    "a" => spec(Mode::Queue, "x.>", AckMode::Explicit, Overflow::DropOldest),
                    _ => spec(
                        Mode::Queue,
                        "x.>",
                        AckMode::Explicit,
                        Overflow::RejectPublish,
                    ),
                };
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let Ok(mut member) = broker.open(&request(&id, spec.clone(), 3), None) else {
                        std::thread::yield_now();
                        continue;
                    };
                    for _ in 0..(n % 7) {
                        match member.try_next() {
                            Some(Outbound::Message { message, .. })
                                if spec.ack_mode != AckMode::None =>
                            {
                                let m = member.member_id();
                                let _ = if (n + i as u64).is_multiple_of(3) {
                                    broker.nack(&id, Fence::Member(m), message.system_id())
                                } else {
                                    broker.ack(&id, Fence::Member(m), message.system_id())
                                };
                            }
                            _ => {}
                        }
                    }
                    drop(member);
                }
            }));
        }
        for p in 0..3 {
            let (broker, stop) = (broker.clone(), stop.clone());
            threads.push(std::thread::spawn(move || {
                let mut k = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    k += 1;
                    let _ = broker.publish(draft("x.y", 1 + (size * (k + p)) % size.max(1)));
                }
            }));
        }
        let watcher = {
            let (broker, stop) = (broker.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut worst = (0u64, 0u64);
                while !stop.load(Ordering::Relaxed) {
                    let stats = broker.list().1;
                    let g = stats.memory_accounted_bytes - stats.memory_drop_oldest_bytes;
                    worst = (worst.0.max(g), worst.1.max(stats.memory_drop_oldest_bytes));
                }
                worst
            })
        };
        std::thread::sleep(Duration::from_millis(700));
        stop.store(true, Ordering::Relaxed);
        for t in threads {
            t.join().unwrap();
        }
        let (worst_general, worst_pool) = watcher.join().unwrap();
        assert!(
            worst_general <= general && worst_pool <= pool,
            "{budget}/{percent}%: general {worst_general} of {general}, pool {worst_pool} of {pool}"
        );
        let stats = broker.list().1;
        eprintln!(
            "{budget} B at {percent}%, {size} B: worst general {worst_general}/{general}, pool {worst_pool}/{pool}; after: {stats:?}"
        );
        // Everyone left; idle timeout zero: everything expires and the account is 0.
        std::thread::sleep(Duration::from_millis(5));
        broker.expire_idle();
        let stats = broker.list().1;
        assert_eq!(stats.subscriptions, 0, "{stats:?}");
        assert_eq!(stats.memory_accounted_bytes, 0, "{stats:?}");
        assert_eq!(stats.memory_drop_oldest_bytes, 0, "{stats:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Case 7 (issue 25 item 6, stale words). `tinybroker --help` opens with "A single-node,
// in-memory gRPC message broker", though `serve --nats` runs stateless gateways over NATS
// JetStream (Cargo.toml's description was fixed, src/main.rs's `about` was not).
#[test]
fn the_binary_does_not_call_itself_single_node_in_memory() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tinybroker"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        !help.contains("single-node, in-memory"),
        "--help: {}",
        help.lines().next().unwrap_or("")
    );
}
