//! `Broker::publish_each`: a run of publishes routed and locked once must answer, queue and
//! count exactly as the same publishes made one by one.

use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::{
    clock::VirtualClock,
    core::{AckMode, MemberOptions, Overflow, Pattern, Topic},
};

fn broker(limits: Limits) -> Broker {
    Broker::new(limits, Arc::new(VirtualClock::new(1_700_000_000_000)))
}

fn request(id: &str, pattern: &str, max_in_flight: u32) -> OpenRequest {
    OpenRequest {
        subscription_id: id.into(),
        spec: SubscriptionSpec {
            mode: crate::core::Mode::Queue,
            consumer_group: "g".into(),
            patterns: vec![Pattern::parse(pattern).unwrap()],
            max_delivery_attempts: 0,
            dead_letter_topic: None,
            ack_mode: Default::default(),
            overflow: Default::default(),
        },
        member: MemberOptions {
            max_in_flight,
            ..MemberOptions::default()
        },
        metadata: std::sync::Arc::from(""),
    }
}

fn draft(topic: &str, payload_len: usize) -> Draft {
    Draft::new(
        Topic::parse(topic).unwrap(),
        bytes::Bytes::from(vec![7u8; payload_len]),
        Default::default(),
        &Limits::default(),
    )
    .unwrap()
}

fn publish_each(broker: &Broker, drafts: Vec<Draft>) -> Vec<Result<Published, Error>> {
    let mut results = Vec::new();
    broker.publish_each(drafts, &mut results);
    results
}

/// The system ids `member` receives, until it has `count` of them (5 s at most).
async fn received(member: &mut MemberStream, count: usize) -> Vec<SystemId> {
    let mut ids = Vec::new();
    while ids.len() < count {
        let frame = tokio::time::timeout(Duration::from_secs(5), member.next())
            .await
            .unwrap_or_else(|_| panic!("no frame within 5 s after {} of {count}", ids.len()));
        match frame {
            Some(Outbound::Message { message, .. }) => ids.push(message.system_id()),
            Some(Outbound::Confirm { .. }) => {}
            other => panic!("unexpected frame {other:?}"),
        }
    }
    ids
}

// A run to one topic with a full queue in the middle: the refused publishes are answered in
// their place and the later ones still go through (a refusal ends nothing), with ids rising.
#[tokio::test]
async fn a_refusal_inside_a_run_is_answered_in_its_place_and_the_run_goes_on() {
    let broker = broker(Limits {
        max_queue_messages: 2,
        ..Limits::default()
    });
    let _a = broker.open(&request("a", "t.a", 1), None).unwrap();
    let _b = broker.open(&request("b", "t.b", 1), None).unwrap();
    let topics = ["t.a", "t.a", "t.a", "t.b", "t.a", "t.b"];
    let results = publish_each(&broker, topics.iter().map(|t| draft(t, 10)).collect());
    let shape: Vec<_> = results
        .iter()
        .map(|r| match r {
            Ok(published) => Ok(published.queued_for),
            Err(Error::QueueFull { subscription, .. }) => Err(subscription.clone()),
            Err(other) => panic!("unexpected refusal {other}"),
        })
        .collect();
    assert_eq!(
        shape,
        vec![Ok(1), Ok(1), Err("a".into()), Ok(1), Err("a".into()), Ok(1)]
    );
    let ids: Vec<_> = results.iter().flatten().map(|p| p.system_id).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids {ids:?}");
    let a = broker.describe("a").unwrap().counters;
    let b = broker.describe("b").unwrap().counters;
    assert_eq!((a.enqueued, a.rejected_full), (2, 2));
    assert_eq!((b.enqueued, b.rejected_full), (2, 0));
    let (_, totals) = broker.list();
    assert_eq!((totals.published, totals.rejected_publishes), (4, 2));
}

// More drafts to one topic than one round of locks takes: every one is queued, in order.
#[tokio::test]
async fn a_run_longer_than_one_round_of_locks_is_published_whole_and_in_order() {
    let broker = broker(Limits::default());
    let count = 3 * RUN_LIMIT + 5;
    let mut member = broker
        .open(&request("s", "t.x", count as u32), None)
        .unwrap();
    let results = publish_each(&broker, (0..count).map(|_| draft("t.x", 8)).collect());
    let ids: Vec<_> = results.into_iter().map(|r| r.unwrap().system_id).collect();
    assert_eq!(received(&mut member, count).await, ids);
}

// A round's hold is bounded by its insertions: fewer messages a round the wider the fan-out,
// never none.
#[test]
fn a_round_queues_fewer_messages_the_more_subscriptions_match() {
    use super::publish::{ROUND_INSERTIONS, round_len};
    assert_eq!(round_len(0), RUN_LIMIT);
    assert_eq!(round_len(1), RUN_LIMIT);
    assert_eq!(round_len(8), 32);
    assert_eq!(round_len(ROUND_INSERTIONS), 1);
    assert_eq!(round_len(10 * ROUND_INSERTIONS), 1);
    for matched in 1..2 * ROUND_INSERTIONS {
        assert!(round_len(matched) * matched <= ROUND_INSERTIONS.max(matched));
    }
}

// Shutdown refuses every publish of a run, as it refuses a single one.
#[tokio::test]
async fn a_run_after_shutdown_is_refused_whole() {
    let broker = broker(Limits::default());
    let _a = broker.open(&request("a", "t.a", 1), None).unwrap();
    broker.shutdown();
    let results = publish_each(&broker, vec![draft("t.a", 1), draft("t.b", 1)]);
    assert_eq!(
        results,
        vec![Err(Error::ShuttingDown), Err(Error::ShuttingDown)]
    );
}

// Two threads publish runs at once to overlapping subscriptions: ids still rise along every
// queue (each run takes its ids while it holds every lock it needs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_runs_keep_ids_rising_along_every_queue() {
    const PER_THREAD: usize = 500;
    let broker = broker(Limits {
        max_queue_messages: 10_000,
        ..Limits::default()
    });
    let total = 2 * PER_THREAD as u32;
    let mut both = broker.open(&request("both", "t.*", total), None).unwrap();
    let mut only_x = broker.open(&request("x", "t.x", total), None).unwrap();
    std::thread::scope(|scope| {
        for topic in ["t.x", "t.y"] {
            let broker = &broker;
            scope.spawn(move || {
                // Runs of 7: several rounds each, interleaving with the other thread's.
                for _ in 0..PER_THREAD / 5 {
                    let results = publish_each(broker, (0..5).map(|_| draft(topic, 4)).collect());
                    assert!(results.iter().all(Result::is_ok), "{results:?}");
                }
            });
        }
    });
    let seen = received(&mut both, 2 * PER_THREAD).await;
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "out of order: {seen:?}"
    );
    let seen = received(&mut only_x, PER_THREAD).await;
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "out of order: {seen:?}"
    );
}

/// A queue subscription with a poison policy (two attempts, then `dead.x`).
fn spec_request(id: &str, pattern: &str, overflow: Overflow, ack_mode: AckMode) -> OpenRequest {
    let mut request = request(id, pattern, 3);
    request.spec.max_delivery_attempts = 2;
    request.spec.dead_letter_topic = Some(Topic::parse("dead.x").unwrap());
    request.spec.ack_mode = ack_mode;
    request.spec.overflow = overflow;
    request
}

proptest! {
    // The run is an optimisation only: any sequence of topics and sizes gets the same answers,
    // counters, depths and totals from `publish_each` as from `publish` called once per draft
    // on an identical broker, against queue limits by count and bytes, the memory budget, the
    // drop-oldest policy, ack-free delivery and a dead-letter topic that is itself published to.
    #[test]
    fn publish_each_answers_and_counts_as_publishing_one_by_one(
        drafts in proptest::collection::vec((0usize..4, 0usize..2_000), 0..150),
        budget in 20_000u64..80_000,
    ) {
        let limits = Limits {
            max_queue_messages: 20,
            max_queue_bytes: 8_000,
            max_memory_bytes: budget,
            // The drafts' sizes: the drop-oldest pool then keeps its share of the budget.
            max_message_bytes: 2_100,
            ..Limits::default()
        };
        let topics = ["t.a", "t.b", "u.a", "dead.x"];
        let requests = [
            ("a", "t.a", Overflow::RejectPublish, AckMode::Explicit),
            ("drop", "t.*", Overflow::DropOldest, AckMode::Explicit),
            ("free", ">", Overflow::DropOldest, AckMode::None),
            ("u", "u.a", Overflow::RejectPublish, AckMode::None),
        ];
        let one_by_one = broker(limits.clone());
        let in_runs = broker(limits);
        let _members: Vec<_> = [&one_by_one, &in_runs]
            .iter()
            .flat_map(|b| {
                requests
                    .iter()
                    .map(|(id, p, o, a)| b.open(&spec_request(id, p, *o, *a), None).unwrap())
            })
            .collect();
        let make = || drafts.iter().map(|&(t, len)| draft(topics[t], len)).collect::<Vec<_>>();
        let relative = |broker: &Broker, results: Vec<Result<Published, Error>>| {
            let floor = broker.id_floor().last_system_id();
            results
                .into_iter()
                .map(|r| r.map(|p| (p.system_id - floor, p.queued_for)))
                .collect::<Vec<_>>()
        };
        let expected: Vec<_> = make().into_iter().map(|d| one_by_one.publish(d)).collect();
        let mut got = Vec::new();
        in_runs.publish_each(make(), &mut got);
        prop_assert_eq!(relative(&in_runs, got), relative(&one_by_one, expected));
        for (id, ..) in requests {
            let want = one_by_one.describe(id).unwrap();
            let got = in_runs.describe(id).unwrap();
            prop_assert_eq!(got.counters, want.counters);
            prop_assert_eq!(
                (got.queued_messages, got.queued_bytes, got.in_flight),
                (want.queued_messages, want.queued_bytes, want.in_flight)
            );
        }
        prop_assert_eq!(in_runs.list().1, one_by_one.list().1);
    }
}

// Runs on one thread, single publishes on another, and subscriptions opened and dropped on a
// third: ids rise along every queue, each thread's messages keep their order in every queue,
// and the long-lived subscriber gets everything that was answered.
#[test]
fn runs_singles_and_churning_subscriptions_keep_ids_rising_along_every_queue() {
    const ROUNDS: usize = 300;
    let b = broker(Limits {
        max_queue_messages: 1_000_000,
        max_queue_bytes: u64::MAX / 4,
        max_memory_bytes: u64::MAX / 4,
        ..Limits::default()
    });
    let mut all = b
        .open(
            &spec_request("all", "t.*", Overflow::RejectPublish, AckMode::None),
            None,
        )
        .unwrap();
    let answered = std::sync::Mutex::new(Vec::new());
    let churned = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        let (b, answered, churned) = (&b, &answered, &churned);
        scope.spawn(move || {
            for round in 0..ROUNDS {
                let mut results = Vec::new();
                let topics = ["t.x", "t.x", "t.x", "t.y", "t.y", "t.x"];
                b.publish_each(topics.iter().map(|t| draft(t, round % 50)), &mut results);
                answered
                    .lock()
                    .unwrap()
                    .extend(results.into_iter().map(|r| (0, r.unwrap().system_id)));
            }
        });
        scope.spawn(move || {
            for round in 0..ROUNDS * 3 {
                let topic = if round % 2 == 0 { "t.x" } else { "t.y" };
                let id = b.publish(draft(topic, 10)).unwrap().system_id;
                answered.lock().unwrap().push((1, id));
            }
        });
        scope.spawn(move || {
            for round in 0..ROUNDS / 3 {
                let id = format!("churn{round}");
                let mut m = b
                    .open(
                        &spec_request(&id, "t.x", Overflow::DropOldest, AckMode::None),
                        None,
                    )
                    .unwrap();
                std::thread::yield_now();
                let mut ids = Vec::new();
                while let Some(frame) = m.try_next() {
                    if let Outbound::Message { message, .. } = frame {
                        ids.push(message.system_id());
                    }
                }
                churned.lock().unwrap().push(ids);
                drop(m);
            }
        });
    });
    let mut ids = Vec::new();
    let total = answered.lock().unwrap().len();
    while ids.len() < total {
        match all.try_next() {
            Some(Outbound::Message { message, .. }) => ids.push(message.system_id()),
            Some(_) => {}
            None => break,
        }
    }
    assert_eq!(
        ids.len(),
        total,
        "the subscriber of t.* got {} of {total}",
        ids.len()
    );
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "ids out of order along the queue"
    );
    // Each publisher's answers rise, and the queue holds them in its answer order.
    for publisher in [0, 1] {
        let mine: Vec<_> = answered
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, _)| *p == publisher)
            .map(|(_, id)| *id)
            .collect();
        assert!(mine.windows(2).all(|w| w[0] < w[1]));
    }
    for seen in churned.lock().unwrap().iter() {
        assert!(
            seen.windows(2).all(|w| w[0] < w[1]),
            "churned queue out of order {seen:?}"
        );
    }
}
