//! Queue and broadcast modes, acks, nacks, dead letters and batches over the wire (docs/semantics.md#subscriptions and docs/semantics.md#delivery).

use std::collections::BTreeSet;

use tinybroker::pb::{self, DeliveryMode};
use tonic::Code;

use crate::harness::*;

// docs/semantics.md#modes: queue mode gives each message to exactly one member, spread over members with space.
over_carriages! {
async fn queue_mode_delivers_each_message_once_spread_over_members(carriage: Carriage) {
    let server = TestServer::start().await;
    let client = server.client().await;
    let q = || open("workers", DeliveryMode::Queue, "pool", &["work.>"]);
    let mut a = client.subscribe_via(carriage, q()).await.unwrap();
    let mut b = client.subscribe_via(carriage, q()).await.unwrap();
    a.confirmed().await;
    b.confirmed().await;
    let mut published = BTreeSet::new();
    for n in 0..10 {
        published.insert(client.publish("work.item", &n.to_string()).await.system_id);
    }
    let mut seen_a = Vec::new();
    let mut seen_b = Vec::new();
    // Each member acks what it gets; with a window of 1 both must take part.
    while seen_a.len() + seen_b.len() < 10 {
        tokio::select! {
            m = a.message() => { a.ack(m.system_id).await; seen_a.push(m.system_id); }
            m = b.message() => { b.ack(m.system_id).await; seen_b.push(m.system_id); }
        }
    }
    assert!(
        !seen_a.is_empty() && !seen_b.is_empty(),
        "a={seen_a:?} b={seen_b:?}"
    );
    let all: BTreeSet<u64> = seen_a.iter().chain(&seen_b).copied().collect();
    assert_eq!(all.len(), 10, "no message twice");
    assert_eq!(all, published);
    let info = client.describe("workers").await.unwrap();
    assert_eq!(info.counters.unwrap().acked, 10);
    assert_eq!(
        info.active_member_id, 0,
        "no single active member in queue mode"
    );
}
}

// docs/semantics.md#modes: queue mode, a member leaving hands its in-flight messages to the others.
over_carriages! {
async fn queue_member_leaving_hands_in_flight_to_others(carriage: Carriage) {
    let server = TestServer::start().await;
    let client = server.client().await;
    let q = || open("handoff", DeliveryMode::Queue, "pool", &["work.>"]);
    let mut a = client.subscribe_via(carriage, q()).await.unwrap();
    a.confirmed().await;
    let id = client.publish("work.x", "x").await.system_id;
    assert_eq!(a.message().await.system_id, id);
    let mut b = client.subscribe_via(carriage, q()).await.unwrap();
    b.confirmed().await;
    drop(a);
    let m = b.message().await;
    assert_eq!((m.system_id, m.delivery_attempt), (id, 2));
}
}

// docs/semantics.md#modes: broadcast gives every stream every message; a second open of a live id is refused.
over_carriages! {
async fn broadcast_gives_every_stream_every_message(carriage: Carriage) {
    let server = TestServer::start().await;
    let client = server.client().await;
    let bc = |id: &str| open(id, DeliveryMode::Broadcast, "", &["news.*"]);
    let mut a = client.subscribe_via(carriage, bc("tv")).await.unwrap();
    let mut b = client.subscribe_via(carriage, bc("radio")).await.unwrap();
    a.confirmed().await;
    b.confirmed().await;
    assert_code(
        client.subscribe_via(carriage, bc("tv")).await.map(|_| ()),
        Code::AlreadyExists,
        "tv",
    );
    let r = client.publish("news.today", "hello").await;
    assert_eq!(r.queued_for, 2);
    let (ma, mb) = (a.message().await, b.message().await);
    assert_eq!((ma.system_id, mb.system_id), (r.system_id, r.system_id));
    assert_eq!(ma.topic, "news.today");
    assert!(ma.published_at.is_some());
    // One subscriber going away does not disturb the other.
    drop(a);
    let r = client.publish("news.tomorrow", "again").await;
    b.ack(mb.system_id).await;
    assert_eq!(b.message().await.system_id, r.system_id);
}
}

// docs/semantics.md#topics-and-patterns: routing follows NATS pattern semantics over the wire.
#[tokio::test]
async fn patterns_route_as_nats_does() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut star = client
        .subscribe(open("star", DeliveryMode::Broadcast, "", &["schedule.*"]))
        .await
        .unwrap();
    star.confirmed().await;
    assert_eq!(client.publish("schedule", "x").await.queued_for, 0);
    assert_eq!(client.publish("schedule.a.b", "x").await.queued_for, 0);
    let r = client.publish("schedule.daily", "x").await;
    assert_eq!(r.queued_for, 1);
    assert_eq!(star.message().await.system_id, r.system_id);
}

// docs/semantics.md#acks: ack of a message not in flight is NOT_FOUND; the window holds the next until the ack.
over_carriages! {
async fn unknown_ack_is_not_found_and_window_gates_delivery(carriage: Carriage) {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut a = client.subscribe_via(carriage, singleton("win")).await.unwrap();
    a.confirmed().await;
    let first = client.publish("jobs.a", "1").await.system_id;
    let second = client.publish("jobs.a", "2").await.system_id;
    assert_eq!(a.message().await.system_id, first);
    assert_code(
        client.ack("win", a.member_id, second).await,
        Code::NotFound,
        "not in flight",
    );
    assert_code(
        client.ack("nope", a.member_id, first).await,
        Code::NotFound,
        "nope",
    );
    let info = client.describe("win").await.unwrap();
    assert_eq!(
        (info.in_flight, info.queued_messages),
        (1, queued_here(1)),
        "window of 1 holds the second"
    );
    a.ack(first).await;
    assert_eq!(a.message().await.system_id, second);
    assert_code(
        client.ack("win", a.member_id, first).await,
        Code::NotFound,
        "not in flight",
    );
}
}

// docs/semantics.md#windows: a larger window lets that many unacked messages flow.
over_carriages! {
async fn max_in_flight_window_allows_several_unacked(carriage: Carriage) {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut req = singleton("wide");
    req.max_in_flight = 3;
    let mut a = client.subscribe_via(carriage, req).await.unwrap();
    a.confirmed().await;
    for n in 0..4 {
        client.publish("jobs.w", &n.to_string()).await;
    }
    for _ in 0..3 {
        a.message().await;
    }
    let info = client.describe("wide").await.unwrap();
    assert_eq!((info.in_flight, info.queued_messages), (3, queued_here(1)));
    assert_eq!(info.members[0].max_in_flight, 3);
}
}

// docs/semantics.md#nacks: Nack returns the message to the head with delivery_attempt + 1.
over_carriages! {
async fn nack_redelivers_at_the_head(carriage: Carriage) {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut a = client.subscribe_via(carriage, singleton("nack")).await.unwrap();
    a.confirmed().await;
    let first = client.publish("jobs.n", "1").await.system_id;
    client.publish("jobs.n", "2").await;
    assert_eq!(a.message().await.system_id, first);
    a.nack(first).await;
    let again = a.message().await;
    assert_eq!((again.system_id, again.delivery_attempt), (first, 2));
    assert_code(
        client.nack("nack", a.member_id, 999).await,
        Code::NotFound,
        "999",
    );
}
}

// docs/semantics.md#dead-letters: a poison message is published to the dead-letter topic with headers saying why.
over_carriages! {
async fn poison_message_goes_to_the_dead_letter_topic(carriage: Carriage) {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut dlq = client
        .subscribe_via(carriage, open("dlq", DeliveryMode::Queue, "ops", &["dead.>"]))
        .await
        .unwrap();
    dlq.confirmed().await;
    let mut req = singleton("poison");
    req.max_delivery_attempts = 2;
    req.dead_letter_topic = "dead.jobs".into();
    let mut a = client.subscribe_via(carriage, req).await.unwrap();
    a.confirmed().await;
    let id = client.publish("jobs.bad", "boom").await.system_id;
    for attempt in 1..=2 {
        let m = a.message().await;
        assert_eq!((m.system_id, m.delivery_attempt), (id, attempt));
        a.nack(id).await;
    }
    let dead = dlq.message().await;
    assert_eq!(dead.topic, "dead.jobs");
    assert_eq!(dead.payload, b"boom".as_slice());
    assert_eq!(
        dead.headers["tinybroker-dead-letter-subscription"],
        "poison"
    );
    assert_eq!(dead.headers["tinybroker-dead-letter-topic"], "jobs.bad");
    assert_eq!(dead.headers["tinybroker-dead-letter-attempts"], "2");
    assert_eq!(
        dead.headers["tinybroker-dead-letter-system-id"],
        id.to_string()
    );
    let counters = client.describe("poison").await.unwrap().counters.unwrap();
    assert_eq!(counters.dead_lettered, 1);
}
}

// docs/semantics.md#dead-letters: a dead letter whose topic matches its own subscription's patterns skips it (no
// loop), reaches the others, and a member joining later without max_delivery_attempts or
// dead_letter_topic gets the subscription's own (through gateways: a member on the other
// gateway, where the subscription did not exist yet).
#[tokio::test]
async fn dead_letters_skip_their_own_subscription_and_joins_inherit_the_settings() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut watch = client
        .subscribe(open("watch", DeliveryMode::Queue, "ops", &["jobs.dead"]))
        .await
        .unwrap();
    watch.confirmed().await;
    let mut req = open("loop", DeliveryMode::Queue, "workers", &["jobs.>"]);
    req.max_delivery_attempts = 1;
    req.dead_letter_topic = "jobs.dead".into();
    let mut first = client.subscribe(req).await.unwrap();
    first.confirmed().await;
    let poison = client.publish("jobs.x", "boom").await.system_id;
    assert_eq!(first.message().await.system_id, poison);
    first.nack(poison).await;
    let dead = watch.message().await;
    assert_eq!(
        (dead.topic.as_str(), &dead.payload[..]),
        ("jobs.dead", &b"boom"[..])
    );
    watch.ack(dead.system_id).await;
    // The next message "loop" gets is the one published after: not its own dead letter.
    let after = client.publish("jobs.y", "next").await.system_id;
    let got = first.message().await;
    assert_eq!((got.system_id, &got.payload[..]), (after, &b"next"[..]));
    first.ack(after).await;
    drop(first);
    // A later member names neither setting: it joins with the subscription's.
    let mut later = client
        .at_publishers()
        .subscribe(open("loop", DeliveryMode::Queue, "workers", &["jobs.>"]))
        .await
        .unwrap();
    later.confirmed().await;
    let poison = client.publish("jobs.z", "again").await.system_id;
    assert_eq!(later.message().await.system_id, poison);
    later.nack(poison).await;
    let dead = watch.message().await;
    assert_eq!(
        dead.headers["tinybroker-dead-letter-system-id"],
        poison.to_string()
    );
    assert_eq!(dead.headers["tinybroker-dead-letter-attempts"], "1");
}

// docs/semantics.md#dead-letters: a dead letter skips only the subscription it came from. A message a client
// publishes with the `tinybroker-dead-letter-*` headers (a dead letter sent back to its topic
// with its headers, to be tried again) is an ordinary message: the subscription named in them
// gets it like any other.
#[tokio::test]
async fn a_dead_letter_published_again_reaches_the_subscription_it_names() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut dlq = client
        .subscribe(open("dlq", DeliveryMode::Queue, "ops", &["dead.>"]))
        .await
        .unwrap();
    dlq.confirmed().await;
    let mut req = open("orders", DeliveryMode::Queue, "workers", &["orders.>"]);
    req.max_delivery_attempts = 1;
    req.dead_letter_topic = "dead.orders".into();
    let mut worker = client.subscribe(req).await.unwrap();
    worker.confirmed().await;
    let poison = client.publish("orders.new", "order-7").await.system_id;
    assert_eq!(worker.message().await.system_id, poison);
    worker.nack(poison).await;
    let dead = dlq.message().await;
    dlq.ack(dead.system_id).await;
    assert_eq!(
        dead.headers["tinybroker-dead-letter-subscription"],
        "orders"
    );
    // The handler is fixed: the dead letter goes back to its topic, headers and all.
    let again = pb::PublishRequest {
        topic: dead.headers["tinybroker-dead-letter-topic"].clone(),
        payload: dead.payload.clone(),
        headers: dead.headers.clone(),
        fence: None,
    };
    let again = within(client.1.clone().publish(again))
        .await
        .unwrap()
        .into_inner()
        .system_id;
    let after = client.publish("orders.new", "order-8").await.system_id;
    let first = worker.message().await;
    assert_eq!(
        (first.system_id, &first.payload[..]),
        (again, &b"order-7"[..]),
        "the message published again must reach its subscription, before the one published after it"
    );
    worker.ack(again).await;
    assert_eq!(worker.message().await.system_id, after);
}

// docs/semantics.md#dead-letters: a poison message is moved to the dead-letter topic whatever its size: one the
// broker took (near max_message_bytes, 1 MiB by default, as NATS's default max_payload) is
// dead-lettered too, though its dead letter carries five headers more. (Through gateways the
// largest message taken is max_payload less 2 KiB kept for those headers:
// tests/cluster/limits.rs.)
#[tokio::test]
async fn a_poison_message_at_the_size_limit_is_dead_lettered() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut dlq = client
        .subscribe(open("dlq", DeliveryMode::Queue, "ops", &["dead.>"]))
        .await
        .unwrap();
    dlq.confirmed().await;
    let mut req = open("big", DeliveryMode::Queue, "workers", &["orders.>"]);
    req.max_delivery_attempts = 1;
    req.dead_letter_topic = "dead.big".into();
    let mut worker = client.subscribe(req).await.unwrap();
    worker.confirmed().await;
    let payload = vec![b'x'; (1 << 20) - 4096];
    let poison = client
        .try_publish("orders.big", payload.clone())
        .await
        .unwrap()
        .system_id;
    assert_eq!(worker.message().await.system_id, poison);
    worker.nack(poison).await;
    let dead = dlq.message().await;
    assert_eq!(
        dead.headers["tinybroker-dead-letter-system-id"],
        poison.to_string()
    );
    assert_eq!(dead.payload.len(), payload.len());
}

// docs/semantics.md#redelivery-order: a message whose last attempt ends with its member's stream (a singleton's active
// member closes while holding it) is dead-lettered once, and not delivered again to the
// member promoted after it (through gateways: on the other gateway).
#[tokio::test]
async fn a_message_whose_last_attempt_ends_with_its_member_is_dead_lettered_once() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut dlq = client
        .subscribe(open("dlq", DeliveryMode::Queue, "ops", &["dead.>"]))
        .await
        .unwrap();
    dlq.confirmed().await;
    let mut req = singleton("leader");
    req.max_delivery_attempts = 1;
    req.dead_letter_topic = "dead.jobs".into();
    let mut active = client.subscribe(req.clone()).await.unwrap();
    active.confirmed().await;
    let mut standby = client.at_publishers().subscribe(req).await.unwrap();
    let poison = client.publish("jobs.a", "poison").await.system_id;
    assert_eq!(active.message().await.system_id, poison);
    drop(active);
    standby.confirmed().await;
    let next = client.publish("jobs.b", "next").await.system_id;
    let got = standby.message().await;
    assert_eq!(
        got.system_id, next,
        "the promoted member gets the message after the dead-lettered one, not it again"
    );
    standby.nack(next).await;
    // Dead letters until the one of `next`, which comes after any of `poison`.
    let mut of_poison = 0;
    loop {
        let dead = dlq.message().await;
        dlq.ack(dead.system_id).await;
        let of = dead.headers["tinybroker-dead-letter-system-id"].clone();
        if of == next.to_string() {
            break;
        }
        assert_eq!(of, poison.to_string());
        of_poison += 1;
    }
    assert_eq!(of_poison, 1, "one dead letter of the poison message");
}

// docs/semantics.md#batches: PublishBatch publishes in order; an invalid message rejects the whole batch.
#[tokio::test]
async fn publish_batch_is_ordered_and_validated_up_front() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut a = client.subscribe(singleton("batch")).await.unwrap();
    a.confirmed().await;
    let msg = |topic: &str| pb::PublishRequest {
        topic: topic.into(),
        payload: b"x".to_vec().into(),
        headers: [("k".to_string(), "v".to_string())].into(),
        fence: None,
    };
    let bad = pb::PublishBatchRequest {
        messages: vec![msg("jobs.a"), msg("jobs..b")],
    };
    assert_code(
        within(client.1.clone().publish_batch(bad)).await,
        Code::InvalidArgument,
        "message 2 of the batch",
    );
    assert_eq!(
        client
            .describe("batch")
            .await
            .unwrap()
            .counters
            .unwrap()
            .enqueued,
        0
    );
    let ok = pb::PublishBatchRequest {
        messages: vec![msg("jobs.a"), msg("jobs.b"), msg("other.c")],
    };
    let results = within(client.1.clone().publish_batch(ok))
        .await
        .unwrap()
        .into_inner()
        .results;
    assert_eq!(
        results.iter().map(|r| r.queued_for).collect::<Vec<_>>(),
        vec![1, 1, 0]
    );
    assert!(results.windows(2).all(|w| w[0].system_id < w[1].system_id));
    let m = a.message().await;
    assert_eq!(m.system_id, results[0].system_id);
    assert_eq!(m.headers["k"], "v");
}
