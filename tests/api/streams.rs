//! The seed's two-field Ack fenced by the connection, the `Consume` and `PublishStream`
//! carriages, ack-free delivery and the drop-oldest overflow policy (docs/semantics.md#ack-free, docs/semantics.md#overflow-policies and docs/semantics.md#carriages).

use tinybroker::{
    core::Limits,
    pb::{self, subscription_frame::Frame},
    server::ServerConfig,
};
use tokio_stream::StreamExt;
use tonic::Code;

use crate::harness::*;

fn consume_open(request: pb::OpenSubscription) -> pb::ConsumeRequest {
    pb::ConsumeRequest {
        request: Some(pb::consume_request::Request::Open(request)),
    }
}

fn settle(ack: Vec<u64>, nack: Vec<u64>) -> pb::ConsumeRequest {
    pb::ConsumeRequest {
        request: Some(pb::consume_request::Request::Settle(pb::Settle {
            ack,
            nack,
            release: Vec::new(),
        })),
    }
}

// docs/semantics.md#connection-fence: `Ack { subscription_id, system_id }` with no member_id works over the connection the
// member's stream runs on, and lets the next message flow; so does the two-field Nack.
#[tokio::test]
async fn two_field_ack_and_nack_over_the_streams_connection_let_the_next_flow() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut a = client.subscribe(singleton("seed")).await.unwrap();
    a.confirmed().await;
    let first = client.publish("jobs.a", "1").await.system_id;
    let second = client.publish("jobs.a", "2").await.system_id;
    assert_eq!(a.message().await.system_id, first);
    client.nack("seed", 0, first).await.unwrap();
    let again = a.message().await;
    assert_eq!((again.system_id, again.delivery_attempt), (first, 2));
    client.ack("seed", 0, first).await.unwrap();
    assert_eq!(a.message().await.system_id, second);
    client.ack("seed", 0, second).await.unwrap();
    let info = client.describe("seed").await.unwrap();
    let counters = info.counters.unwrap();
    assert_eq!((counters.acked, counters.nacked, info.in_flight), (2, 1, 0));
}

// docs/semantics.md#connection-fence: a late two-field ack from a process whose stream ended arrives on another connection
// than the new holder's: refused with FAILED_PRECONDITION, counted, and it changes nothing; the
// new holder's two-field ack works.
#[tokio::test]
async fn two_field_ack_from_another_connection_after_redelivery_is_refused() {
    let server = TestServer::start().await;
    let old_process = server.client().await;
    let new_process = server.client().await;
    let mut a = old_process.subscribe(singleton("moved")).await.unwrap();
    a.confirmed().await;
    let mut b = new_process.subscribe(singleton("moved")).await.unwrap();
    let id = old_process.publish("jobs.a", "x").await.system_id;
    assert_eq!(a.message().await.system_id, id);
    drop(a);
    b.confirmed().await;
    assert_eq!(b.message().await.delivery_attempt, 2);
    for result in [
        old_process.ack("moved", 0, id).await,
        old_process.nack("moved", 0, id).await,
    ] {
        assert_code(result, Code::FailedPrecondition, "another connection");
    }
    let info = new_process.describe("moved").await.unwrap();
    assert_eq!(info.in_flight, 1, "B still holds its copy");
    assert_eq!(info.counters.unwrap().stale_acks, 2);
    new_process.ack("moved", 0, id).await.unwrap();
    assert_eq!(new_process.describe("moved").await.unwrap().in_flight, 0);
}

// A refused settle on a Consume stream comes back as a frame naming it; the stream goes on.
#[tokio::test]
async fn consume_answers_a_refused_settle_with_a_frame_and_goes_on() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut request = singleton("refuse");
    request.max_in_flight = 2;
    let mut a = client
        .subscribe_via(Carriage::Stream, request)
        .await
        .unwrap();
    a.confirmed().await;
    let tx = a.settles.clone().unwrap();
    tx.send(settle(vec![999], vec![998])).await.unwrap();
    for (id, nack) in [(999, false), (998, true)] {
        match a.frame().await {
            Frame::Refused(r) => {
                assert_eq!((r.system_id, r.nack), (id, nack));
                assert_eq!(Code::from(r.code), Code::NotFound);
                assert!(r.message.contains("not in flight"), "{}", r.message);
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
    let id = client.publish("jobs.a", "x").await.system_id;
    assert_eq!(a.message().await.system_id, id);
    a.ack(id).await;
}

// Issue 17 part 1: the refusals of one settle are coalesced, one frame per kind and code naming
// every refused id, and the settle's valid acks still apply; a settle naming more ids than the
// member's window is refused whole in one INVALID_ARGUMENT frame and changes nothing.
#[tokio::test]
async fn consume_coalesces_refusals_and_refuses_a_settle_larger_than_the_window() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut request = singleton("coalesce");
    request.max_in_flight = 8;
    let mut a = client
        .subscribe_via(Carriage::Stream, request)
        .await
        .unwrap();
    a.confirmed().await;
    let tx = a.settles.clone().unwrap();
    let held = client.publish("jobs.a", "x").await.system_id;
    assert_eq!(a.message().await.system_id, held);
    // One good ack, five unknown acks, two unknown nacks: eight ids, the window.
    let unknown: Vec<u64> = (1000..1005).collect();
    let mut acks = vec![held];
    acks.extend(&unknown);
    tx.send(settle(acks, vec![2000, 2001])).await.unwrap();
    match a.frame().await {
        Frame::Refused(r) => {
            assert_eq!((r.system_id, r.nack), (1000, false));
            assert_eq!(r.more_system_ids, vec![1001, 1002, 1003, 1004]);
            assert_eq!(Code::from(r.code), Code::NotFound);
            assert!(r.message.contains("and 4 more ids"), "{}", r.message);
        }
        other => panic!("expected the coalesced ack refusal, got {other:?}"),
    }
    match a.frame().await {
        Frame::Refused(r) => {
            assert_eq!((r.system_id, r.nack), (2000, true));
            assert_eq!(r.more_system_ids, vec![2001]);
        }
        other => panic!("expected the coalesced nack refusal, got {other:?}"),
    }
    let info = client.describe("coalesce").await.unwrap();
    assert_eq!(info.counters.unwrap().acked, 1, "the good ack applied");

    let next = client.publish("jobs.a", "y").await.system_id;
    assert_eq!(a.message().await.system_id, next);
    tx.send(settle((0..8).map(|i| next + i).collect(), vec![next]))
        .await
        .unwrap();
    match a.frame().await {
        Frame::Refused(r) => {
            assert_eq!(Code::from(r.code), Code::InvalidArgument);
            assert_eq!(r.system_id, 0);
            assert!(r.message.contains("9 ids"), "{}", r.message);
            assert!(r.message.contains("window"), "{}", r.message);
        }
        other => panic!("expected the whole settle refused, got {other:?}"),
    }
    let info = client.describe("coalesce").await.unwrap();
    assert_eq!(
        (info.in_flight, info.counters.unwrap().acked),
        (1, 1),
        "the oversized settle changed nothing"
    );
    a.ack(next).await;
}

// The first Consume message must open; anything else is INVALID_ARGUMENT and joins nothing.
#[tokio::test]
async fn consume_must_open_first() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let requests = tokio_stream::iter(vec![settle(vec![1], vec![])]);
    let status = within(client.0.clone().consume(requests))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("open"), "{status:?}");
    assert!(client.list().await.subscriptions.is_empty());
}

// A client that half-closes its side of an acked Consume stream can settle nothing more: the
// member leaves with a clean end of stream, and its unacked message goes back to the queue.
#[tokio::test]
async fn consume_half_close_ends_the_member_and_loses_nothing() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let id = {
        let requests = tokio_stream::iter(vec![consume_open(singleton("half"))]);
        let mut frames = within(client.0.clone().consume(requests))
            .await
            .unwrap()
            .into_inner();
        let id = client.publish("jobs.a", "x").await.system_id;
        // Whatever frames came first, the stream ends cleanly (status OK), not with an error.
        while let Some(frame) = within(frames.next()).await {
            frame.unwrap();
        }
        id
    };
    // (A gateway forgets a subscription with its last member: nothing to describe there.)
    if !GATEWAYS {
        let info = client.describe("half").await.unwrap();
        assert_eq!((info.members.len(), info.in_flight), (0, 0));
    }
    let mut b = client.subscribe(singleton("half")).await.unwrap();
    b.confirmed().await;
    assert_eq!(b.message().await.system_id, id);
}

// A protocol violation on the stream (a second `open`) ends it with INVALID_ARGUMENT; the member
// leaves and what it held is redelivered.
#[tokio::test]
async fn consume_protocol_violation_gets_a_status_and_loses_nothing() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut a = client
        .subscribe_via(Carriage::Stream, singleton("violate"))
        .await
        .unwrap();
    a.confirmed().await;
    let id = client.publish("jobs.a", "x").await.system_id;
    assert_eq!(a.message().await.system_id, id);
    let tx = a.settles.clone().unwrap();
    tx.send(consume_open(singleton("violate"))).await.unwrap();
    let status = a.ended().await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    let mut b = client.subscribe(singleton("violate")).await.unwrap();
    b.confirmed().await;
    let m = b.message().await;
    assert_eq!((m.system_id, m.delivery_attempt), (id, 2));
}

// Graceful shutdown ends Consume streams with UNAVAILABLE, as it does Subscribe streams.
#[tokio::test]
async fn shutdown_ends_consume_streams_with_unavailable() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut a = client
        .subscribe_via(Carriage::Stream, singleton("bye"))
        .await
        .unwrap();
    a.confirmed().await;
    let stopping = tokio::spawn(server.stop());
    assert_eq!(a.ended().await.unwrap_err().code(), Code::Unavailable);
    drop(a);
    within(stopping).await.unwrap().unwrap();
}

// docs/semantics.md#carriages: one stream, one answer per publish, in order; a refusal is an answer, not the end.
#[tokio::test]
async fn publish_stream_answers_each_publish_in_order() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let publish = |topic: &str| pb::PublishRequest {
        topic: topic.into(),
        payload: b"x".to_vec().into(),
        headers: Default::default(),
        fence: None,
    };
    let requests = tokio_stream::iter(vec![
        publish("jobs.a"),
        publish("jobs..bad"),
        publish("jobs.b"),
    ]);
    let answers: Vec<pb::PublishStreamResponse> = within(async {
        let mut stream = client
            .1
            .clone()
            .publish_stream(requests)
            .await
            .unwrap()
            .into_inner();
        let mut answers = Vec::new();
        while let Some(answer) = stream.next().await {
            answers.push(answer.unwrap());
        }
        answers
    })
    .await;
    assert_eq!(answers.len(), 3);
    assert_eq!(answers[0].code, 0);
    assert_eq!(Code::from(answers[1].code), Code::InvalidArgument);
    assert!(answers[1].message.contains("invalid topic"), "{answers:?}");
    assert_eq!(answers[2].code, 0);
    assert!(answers[2].system_id > answers[0].system_id);
    assert_eq!(client.publishers_list().await.broker.unwrap().published, 2);
}

fn ack_free(id: &str) -> pb::OpenSubscription {
    pb::OpenSubscription {
        ack_mode: pb::AckMode::None.into(),
        ..open(id, pb::DeliveryMode::Broadcast, "", &["fan.>"])
    }
}

// docs/semantics.md#ack-free: ack-free fan-out: every subscriber gets every message and nothing waits for an ack;
// an ack on such a subscription is refused, saying why.
#[tokio::test]
async fn ack_free_fan_out_needs_no_acks() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut subs = Vec::new();
    for n in 0..3 {
        let mut s = client
            .subscribe(ack_free(&format!("fan-{n}")))
            .await
            .unwrap();
        s.confirmed().await;
        subs.push(s);
    }
    let mut ids = Vec::new();
    for n in 0..20 {
        ids.push(client.publish("fan.out", &format!("{n}")).await.system_id);
    }
    for s in &mut subs {
        for id in &ids {
            assert_eq!(s.message().await.system_id, *id);
        }
    }
    let info = client.describe("fan-0").await.unwrap();
    assert_eq!(info.ack_mode, i32::from(pb::AckMode::None));
    assert_eq!(info.overflow, i32::from(pb::OverflowPolicy::DropOldest));
    assert_eq!((info.queued_messages, info.in_flight), (0, 0));
    assert_eq!(info.counters.unwrap().acked, 20, "written counts as done");
    assert_code(
        client.ack("fan-0", subs[0].member_id, ids[0]).await,
        Code::FailedPrecondition,
        "ack-free",
    );
}

// An ack-free subscription must not be able to block publishers: it cannot ask to.
#[tokio::test]
async fn ack_free_with_reject_publish_is_refused() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let request = pb::OpenSubscription {
        overflow: pb::OverflowPolicy::RejectPublish.into(),
        ..ack_free("strict")
    };
    let status = client.subscribe(request).await.err().unwrap();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("DROP_OLDEST"), "{status:?}");
}

fn small_queues(max_queue_messages: u64) -> ServerConfig {
    ServerConfig {
        limits: Limits {
            max_queue_messages,
            ..Limits::default()
        },
        ..ServerConfig::default()
    }
}

// docs/semantics.md#ack-free and docs/semantics.md#overflow-policies: an ack-free subscriber that never reads cannot block publishers, neither to itself
// nor to anyone else on its topics, and cannot grow memory: once its window and its queue are
// full, the oldest messages are dropped and counted, while an acked subscriber on the same topic
// gets everything.
#[tokio::test]
async fn slow_ack_free_subscriber_drops_oldest_and_never_blocks_publishers() {
    let server = TestServer::with_config(small_queues(1_000)).await;
    let client = server.client().await;
    let mut slow = client.subscribe(ack_free("slow")).await.unwrap();
    slow.confirmed().await;
    let other = server.client().await;
    let mut steady = other
        .subscribe(pb::OpenSubscription {
            max_in_flight: 100,
            ..open("steady", pb::DeliveryMode::Queue, "g", &["fan.>"])
        })
        .await
        .unwrap();
    steady.confirmed().await;
    // 4 MB through a reader that never reads: more than its HTTP/2 windows and outlet hold.
    let payload = vec![b'x'; 1024];
    let mut published = 0;
    for _ in 0..4 {
        let batch = pb::PublishBatchRequest {
            messages: (0..1000)
                .map(|_| pb::PublishRequest {
                    topic: "fan.big".into(),
                    payload: payload.clone().into(),
                    headers: Default::default(),
                    fence: None,
                })
                .collect(),
        };
        within(client.1.clone().publish_batch(batch)).await.unwrap();
        published += 1000;
        // The steady subscriber keeps up.
        for _ in 0..1000 {
            let m = steady.message().await;
            other
                .ack("steady", steady.member_id, m.system_id)
                .await
                .unwrap();
        }
    }
    let info = client.describe("slow").await.unwrap();
    if GATEWAYS {
        // The gateway pulls only what the member's window takes; the rest waits in JetStream.
        assert_eq!(info.queued_messages, 0, "{info:?}");
        assert!(
            info.in_flight <= u64::from(info.members[0].max_in_flight),
            "{info:?}"
        );
    } else {
        let dropped = info.counters.unwrap().dropped_overflow;
        assert!(dropped > 0, "the slow subscriber dropped nothing: {info:?}");
        assert!(info.queued_messages <= 1_000, "{info:?}");
    }
    let broker = client.publishers_list().await.broker.unwrap();
    assert_eq!(
        (broker.published, broker.rejected_publishes),
        (published, 0)
    );
    drop(slow);
}

// docs/semantics.md#overflow-policies: with drop-oldest, a subscription abandoned by its members cannot block publishers to
// its topics; with the default reject-publish it does, until it expires.
// Through gateways a subscription without members has its queue in JetStream, not at a gateway:
// no gateway drops or refuses for it; the stream's limits bound every backlog together
// (tests/cluster/limits.rs; README, cluster mode).
embedded_only! {
#[tokio::test]
async fn abandoned_drop_oldest_subscription_does_not_block_publishers() {
    let server = TestServer::with_config(small_queues(5)).await;
    let client = server.client().await;
    let dropping = pb::OpenSubscription {
        overflow: pb::OverflowPolicy::DropOldest.into(),
        ..open("lenient", pb::DeliveryMode::Queue, "g", &["jobs.*"])
    };
    drop(client.subscribe(dropping).await.unwrap());
    for n in 0..20 {
        client.publish("jobs.x", &format!("{n}")).await;
    }
    let info = client.describe("lenient").await.unwrap();
    assert_eq!(info.queued_messages, 5);
    assert_eq!(info.counters.unwrap().dropped_overflow, 15);

    drop(
        client
            .subscribe(open("strict", pb::DeliveryMode::Queue, "g", &["jobs.*"]))
            .await
            .unwrap(),
    );
    for n in 0..5 {
        client.publish("jobs.y", &format!("{n}")).await;
    }
    assert_code(
        client.try_publish("jobs.y", b"6".to_vec()).await,
        Code::ResourceExhausted,
        "strict",
    );
}
}

// The streaming carriages are long-lived request bodies: the request timeout (which bounds how
// long a unary body may take to arrive) must not cut them, only each message's own arrival.
#[tokio::test]
async fn streams_outlive_the_request_timeout() {
    let server = TestServer::with_config(ServerConfig {
        request_timeout: std::time::Duration::from_millis(100),
        ..ServerConfig::default()
    })
    .await;
    let client = server.client().await;
    let mut a = client
        .subscribe_via(Carriage::Stream, singleton("long"))
        .await
        .unwrap();
    a.confirmed().await;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut answers = within(
        client
            .1
            .clone()
            .publish_stream(tokio_stream::wrappers::ReceiverStream::new(rx)),
    )
    .await
    .unwrap()
    .into_inner();
    // Idle on both streams for several request timeouts: nothing may end them.
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    tx.send(pb::PublishRequest {
        topic: "jobs.late".into(),
        payload: b"x".to_vec().into(),
        headers: Default::default(),
        fence: None,
    })
    .await
    .unwrap();
    let answer = within(answers.next()).await.unwrap().unwrap();
    assert_eq!(answer.code, 0, "{answer:?}");
    let m = a.message().await;
    a.ack(m.system_id).await;
}

// docs/semantics.md#releases: a release gives the message back with the same attempt, to
// another member (the one that released is sent nothing more); the second release at an
// attempt counts one, so a message released over and over still reaches its dead letter.
// Every member here is on the same gateway in cluster mode, where the local core decides.
#[tokio::test]
async fn released_messages_keep_their_attempt_once_and_still_reach_the_dead_letter() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut dlq = client
        .subscribe(open("rel-dlq", pb::DeliveryMode::Queue, "ops", &["dead.>"]))
        .await
        .unwrap();
    dlq.confirmed().await;
    let mut req = open("rel", pb::DeliveryMode::Queue, "workers", &["jobs.>"]);
    req.max_delivery_attempts = 2;
    req.dead_letter_topic = "dead.rel".into();
    let mut holder = client
        .subscribe_via(Carriage::Stream, req.clone())
        .await
        .unwrap();
    holder.confirmed().await;
    let id = client
        .publish("jobs.rel", "never worked on")
        .await
        .system_id;
    let first = holder.message().await;
    assert_eq!((first.system_id, first.delivery_attempt), (id, 1));
    let mut attempts = vec![first.delivery_attempt];
    let mut gone = Vec::new();
    for _ in 0..3 {
        let mut next = client
            .subscribe_via(Carriage::Stream, req.clone())
            .await
            .unwrap();
        next.confirmed().await;
        holder.release(&[id]).await;
        let m = next.message().await;
        assert_eq!(m.system_id, id);
        attempts.push(m.delivery_attempt);
        gone.push(std::mem::replace(&mut holder, next));
    }
    assert_eq!(attempts, vec![1, 1, 2, 2], "once per attempt");
    holder.release(&[id]).await;
    let dead = dlq.message().await;
    assert_eq!(dead.headers["tinybroker-dead-letter-attempts"], "2");
    assert_eq!(
        dead.headers["tinybroker-dead-letter-system-id"],
        id.to_string()
    );
    let counters = client.describe("rel").await.unwrap().counters.unwrap();
    assert_eq!(
        (counters.released, counters.nacked, counters.dead_lettered),
        (4, 0, 1)
    );
}

// docs/semantics.md#releases: a closing singleton leader releases what it prefetched and
// half-closes; the standby (at the other gateway in cluster mode: the carry names the attempts)
// gets them in order with the same attempt. An unknown release is refused as a nack would be.
#[tokio::test]
async fn a_closing_singleton_member_releases_what_it_prefetched_to_the_next() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut req = singleton("rel-leader");
    req.max_in_flight = 4;
    let mut a = client
        .subscribe_via(Carriage::Stream, req.clone())
        .await
        .unwrap();
    a.confirmed().await;
    let other = client.at_publishers();
    let mut b = other.subscribe_via(Carriage::Stream, req).await.unwrap();
    let tx = a.settles.clone().unwrap();
    tx.send(pb::ConsumeRequest {
        request: Some(pb::consume_request::Request::Settle(pb::Settle {
            release: vec![999],
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    match a.frame().await {
        Frame::Refused(r) => {
            assert_eq!((r.system_id, r.nack, r.release), (999, true, true));
            assert_eq!(Code::from(r.code), Code::NotFound);
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let ids: Vec<u64> = [
        client.publish("jobs.a", "1").await.system_id,
        client.publish("jobs.a", "2").await.system_id,
        client.publish("jobs.a", "3").await.system_id,
    ]
    .to_vec();
    for &id in &ids {
        let m = a.message().await;
        assert_eq!((m.system_id, m.delivery_attempt), (id, 1));
    }
    a.ack(ids[0]).await;
    a.release(&[ids[2], ids[1]]).await;
    drop(tx);
    a.settles = None;
    assert!(a.ended().await.is_ok());
    b.confirmed().await;
    for &id in &ids[1..] {
        let m = b.message().await;
        assert_eq!(
            (m.system_id, m.delivery_attempt),
            (id, 1),
            "released: the same attempt, in publish order"
        );
    }
    b.ack(ids[1]).await;
    b.ack(ids[2]).await;
}
