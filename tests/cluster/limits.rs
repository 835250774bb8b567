//! Cluster mode's bounds: the JetStream stream a gateway creates holds at most
//! `--nats-max-messages` messages and `--nats-max-bytes` bytes (every subscription's backlog
//! together) and refuses a publish past either with `RESOURCE_EXHAUSTED`, counted, as the
//! embedded broker's default overflow policy refuses one; and a message larger than NATS
//! carries is `INVALID_ARGUMENT`, not a failure of the cluster.

use std::sync::Arc;

use tinybroker::{clock::TokioClock, cluster::gateway::GatewayConfig, pb};
use tonic::Code;

use crate::{
    NatsCluster, assert_code, gateway, gateway_with, harness::Member, node_faults::stream_led_by,
    publish_stream, queue, within,
};

/// A cluster whose stream the first gateway created with these limits; the second binds it.
async fn bounded(
    max_messages: i64,
    max_bytes: i64,
) -> (NatsCluster, crate::TestServer, crate::TestServer) {
    let cluster = NatsCluster::start(3).await;
    let urls = cluster.client_urls();
    let a = gateway_with(
        GatewayConfig {
            max_messages,
            max_bytes,
            ..GatewayConfig::new(&urls[0])
        },
        Arc::new(TokioClock::new()),
    )
    .await;
    let b = gateway(&urls[1]).await;
    (cluster, a, b)
}

fn request(topic: &str, payload: Vec<u8>) -> pb::PublishRequest {
    pb::PublishRequest {
        topic: topic.into(),
        payload: payload.into(),
        headers: Default::default(),
        fence: None,
    }
}

/// Acks the next message; once JetStream removed it (interest retention: every consumer
/// acked), a publish is taken again. Returns that publish's answer.
async fn ack_and_publish_again(member: &mut Member, on_b: &crate::harness::Client) {
    let got = member.message().await;
    member.ack(got.system_id).await;
    // The ack reaches JetStream asynchronously: the stream has room once it is applied.
    within(async {
        loop {
            match on_b.try_publish("orders.new", b"again".to_vec()).await {
                Ok(answer) => return answer,
                Err(status) if status.code() == Code::ResourceExhausted => {
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                }
                Err(status) => panic!("unexpected refusal: {status:?}"),
            }
        }
    })
    .await;
}

// docs/semantics.md#limits-table (memory is bounded) in cluster mode: the stream refuses the publish past its
// max_msgs, on the unary and the streaming carriage, counts it, and takes publishes again once
// an ack makes room. Nothing confirmed is discarded to make room.
#[tokio::test]
async fn a_full_stream_refuses_publishes_and_counts_them() {
    let (_cluster, a, b) = bounded(3, 1 << 30).await;
    let (on_a, on_b) = (a.client().await, b.client().await);
    let mut member = on_a.subscribe(queue("orders", 1)).await.unwrap();
    member.confirmed().await;
    let mut stored = Vec::new();
    for n in 0..3 {
        stored.push(on_b.publish("orders.new", &n.to_string()).await.system_id);
    }
    assert_code(
        on_b.try_publish("orders.new", b"4".to_vec()).await,
        Code::ResourceExhausted,
        "max_msgs (--nats-max-messages",
    );
    let answers = publish_stream(&on_b, vec![request("orders.new", b"5".to_vec())]).await;
    assert_eq!(
        answers.iter().map(|a| a.code).collect::<Vec<_>>(),
        vec![Code::ResourceExhausted as i32],
        "{answers:?}"
    );
    let broker = on_b.publishers_list().await.broker.unwrap();
    assert_eq!((broker.published, broker.rejected_publishes), (3, 2));
    // The three stored ones are all delivered, in order: none was discarded for the refused.
    ack_and_publish_again(&mut member, &on_b).await;
    let mut delivered = Vec::new();
    for _ in 0..2 {
        let got = member.message().await;
        delivered.push(got.system_id);
        member.ack(got.system_id).await;
    }
    assert_eq!(delivered, stored[1..]);
    assert_eq!(
        member.message().await.payload,
        b"again".as_slice(),
        "the publish taken after the ack"
    );
}

// A PublishBatch into a stream with room for three of its five: the first three are
// confirmed, the fourth is refused and the answer says so, as on the embedded broker (the
// gateway sends the whole batch before awaiting confirmations).
#[tokio::test]
async fn a_batch_into_a_full_stream_reports_the_confirmed_prefix() {
    let (_cluster, a, b) = bounded(3, 1 << 30).await;
    let (on_a, on_b) = (a.client().await, b.client().await);
    let mut member = on_a.subscribe(queue("orders", 1)).await.unwrap();
    member.confirmed().await;
    let batch = pb::PublishBatchRequest {
        messages: (0..5)
            .map(|n| request("orders.new", vec![b'0' + n]))
            .collect(),
    };
    let refused = within(on_b.1.clone().publish_batch(batch))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused
            .message()
            .starts_with("published 3 of 5 messages; message 4 was refused"),
        "{refused:?}"
    );
    assert_eq!(
        refused
            .metadata()
            .get("tinybroker-published-count")
            .unwrap(),
        "3"
    );
    for n in 0..3 {
        let got = member.message().await;
        assert_eq!(got.payload, vec![b'0' + n]);
        member.ack(got.system_id).await;
    }
}

// The same for max_bytes: a stream of 2 KiB takes a few 500-byte messages, then refuses.
#[tokio::test]
async fn a_stream_full_by_bytes_refuses_publishes() {
    let (_cluster, a, b) = bounded(1_000_000, 2048).await;
    let (on_a, on_b) = (a.client().await, b.client().await);
    let mut member = on_a.subscribe(queue("orders", 1)).await.unwrap();
    member.confirmed().await;
    let mut taken = 0;
    let refused = within(async {
        loop {
            match on_b.try_publish("orders.new", vec![b'x'; 500]).await {
                Ok(_) => taken += 1,
                Err(status) => return status,
            }
        }
    })
    .await;
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("max_bytes (--nats-max-bytes"),
        "{refused:?}"
    );
    assert!(
        (1..=4).contains(&taken),
        "{taken} messages of 500 B in 2 KiB"
    );
    ack_and_publish_again(&mut member, &on_b).await;
}

// docs/semantics.md#bad-input: bad input never breaks the broker. A gateway whose --max-message-bytes is above the
// NATS servers' max_payload (1 MiB by default) takes a message NATS cannot carry: it is
// INVALID_ARGUMENT saying so, counted, and the gateway goes on publishing.
#[tokio::test]
async fn a_message_larger_than_nats_carries_is_invalid_argument() {
    let cluster = NatsCluster::start(3).await;
    let mut server = tinybroker::server::ServerConfig::default();
    server.limits.max_message_bytes = 2 << 20;
    server.max_request_bytes = tinybroker::server::ServerConfig::request_bytes_for(&server.limits);
    server.max_pending_request_bytes = server
        .max_pending_request_bytes
        .max(4 * server.max_request_bytes);
    let b = crate::serve_gateway(
        server,
        GatewayConfig::new(&cluster.client_urls()[0]),
        Arc::new(TokioClock::new()),
    )
    .await;
    let on_b = b.client().await;
    let huge = vec![b'x'; (1 << 20) + 1024];
    assert_code(
        on_b.try_publish("orders.big", huge.clone()).await,
        Code::InvalidArgument,
        "max_payload",
    );
    let answers = publish_stream(&on_b, vec![request("orders.big", huge)]).await;
    assert_eq!(
        answers.iter().map(|a| a.code).collect::<Vec<_>>(),
        vec![Code::InvalidArgument as i32],
        "{answers:?}"
    );
    assert_eq!(
        on_b.publishers_list()
            .await
            .broker
            .unwrap()
            .rejected_publishes,
        2
    );
    on_b.publish("orders.small", "fine").await;
}

/// `n` messages of one byte to `orders.new`.
fn batch_of(n: usize) -> pb::PublishBatchRequest {
    pb::PublishBatchRequest {
        messages: (0..n).map(|_| request("orders.new", vec![b'x'])).collect(),
    }
}

// A PublishBatch larger than the JetStream context's 5,000 publishes awaiting confirmation
// (--max-batch-messages raised to 6,000): sent whole before any confirmation is awaited, the
// batch must still complete, and the gateway go on publishing for others.
#[tokio::test]
async fn a_batch_past_five_thousand_messages_is_published() {
    let cluster = NatsCluster::start(3).await;
    let mut server = tinybroker::server::ServerConfig::default();
    server.limits.max_batch_messages = 6000;
    let b = crate::serve_gateway(
        server,
        GatewayConfig::new(&cluster.client_urls()[0]),
        Arc::new(TokioClock::new()),
    )
    .await;
    let on_b = b.client().await;
    let results = within(on_b.1.clone().publish_batch(batch_of(5001)))
        .await
        .unwrap()
        .into_inner()
        .results;
    assert_eq!(results.len(), 5001);
    on_b.publish("orders.new", "after").await;
}

// Six PublishBatch calls of 1,000 (the default --max-batch-messages) at once through one
// gateway: together past the 5,000 publishes the JetStream context lets await confirmation.
// Each must complete, and the gateway go on publishing for others.
#[tokio::test]
async fn concurrent_batches_past_five_thousand_messages_are_published() {
    let cluster = NatsCluster::start(3).await;
    let b = gateway(&cluster.client_urls()[0]).await;
    let on_b = b.client().await;
    let batches: Vec<_> = (0..6)
        .map(|_| {
            let mut client = on_b.1.clone();
            tokio::spawn(async move { client.publish_batch(batch_of(1000)).await })
        })
        .collect();
    for batch in batches {
        let results = within(batch).await.unwrap().unwrap().into_inner().results;
        assert_eq!(results.len(), 1000);
    }
    on_b.publish("orders.new", "after").await;
}

// A PublishBatch of five into a stream with room for three, as on the embedded broker: one
// refused publish counted (the batch's), and the answer claims no later message may have been
// stored when JetStream refused every one of them (a full stream stores nothing).
#[tokio::test]
async fn a_refused_batch_is_counted_once_and_names_nothing_stored_after() {
    let (_cluster, a, b) = bounded(3, 1 << 30).await;
    let (on_a, on_b) = (a.client().await, b.client().await);
    let mut member = on_a.subscribe(queue("orders", 1)).await.unwrap();
    member.confirmed().await;
    let refused = within(on_b.1.clone().publish_batch(batch_of(5)))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    let broker = on_b.publishers_list().await.broker.unwrap();
    assert_eq!((broker.published, broker.rejected_publishes), (3, 1));
    assert!(
        !refused.message().contains("later message"),
        "nothing after the refused message was stored: {refused:?}"
    );
}

// A message that would fit NATS's max_payload but leave no room for its dead letter's headers
// is refused up front through a gateway (INVALID_ARGUMENT naming both limits, counted; in a
// batch, the whole batch), so every message a gateway took can be dead-lettered.
#[tokio::test]
async fn a_message_without_room_for_its_dead_letter_is_refused_up_front() {
    let (_cluster, _a, b) = bounded(1_000_000, 1 << 30).await;
    let on_b = b.client().await;
    let too_big = vec![b'x'; (1 << 20) - 200];
    assert_code(
        on_b.try_publish("orders.big", too_big.clone()).await,
        Code::InvalidArgument,
        "over cluster mode's limit of 1046528: the NATS servers' max_payload less 2048 bytes",
    );
    let batch = pb::PublishBatchRequest {
        messages: vec![
            request("orders.small", b"fine".to_vec()),
            request("orders.big", too_big.clone()),
        ],
    };
    assert_code(
        within(on_b.1.clone().publish_batch(batch)).await,
        Code::InvalidArgument,
        "message 2 of the batch: message is",
    );
    let answers = publish_stream(&on_b, vec![request("orders.big", too_big)]).await;
    assert_eq!(
        answers.iter().map(|a| a.code).collect::<Vec<_>>(),
        vec![Code::InvalidArgument as i32],
        "{answers:?}"
    );
    let broker = on_b.publishers_list().await.broker.unwrap();
    assert_eq!((broker.published, broker.rejected_publishes), (0, 3));
    let fits = vec![b'x'; 1046528 - "orders.big".len()];
    on_b.try_publish("orders.big", fits).await.unwrap();
}

// An existing stream keeps its own limits. One with discard old would drop confirmed messages
// to make room, so a gateway binding it says so at warn level, naming the fix.
#[tokio::test]
async fn a_gateway_warns_when_the_existing_stream_discards_old_messages() {
    use async_nats::jetstream::stream::{Config, DiscardPolicy};
    let cluster = NatsCluster::start(3).await;
    let url = cluster.client_urls()[0].clone();
    let js = async_nats::jetstream::new(async_nats::connect(&url).await.unwrap());
    js.create_stream(Config {
        name: "tinybroker".to_string(),
        subjects: vec!["tinybroker.>".to_string()],
        max_messages: 1_000,
        discard: DiscardPolicy::Old,
        num_replicas: 3,
        ..Default::default()
    })
    .await
    .unwrap();
    let (gateway, _) = crate::binary::serve(&["--nats", &url]).await;
    let line = gateway
        .at_start("discard old")
        .unwrap_or_else(|| panic!("no warning at start: {:#?}", gateway.start));
    assert!(
        line.contains("WARN") && line.contains("--discard new"),
        "{line}"
    );
}

/// Moves the leadership of the raft group `leader` reads to `node`, asking `stepdown` (a
/// JetStream API subject) to hand it there.
async fn lead_on<F, Fut>(client: &async_nats::Client, stepdown: &str, node: usize, leader: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Option<String>>,
{
    within(async {
        loop {
            if leader().await.as_deref().and_then(NatsCluster::node_named) == Some(node) {
                return;
            }
            let preferred = format!(r#"{{"placement":{{"preferred":"n{node}"}}}}"#);
            let _ = client.request(stepdown.to_string(), preferred.into()).await;
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    })
    .await;
}

// A join is answered only once every server of the stream keeps the subscription's messages.
// JetStream answers a consumer's creation from the consumer's leader, elected by a quorum of
// its peers; a server that has not yet applied the creation stores nothing for the consumer
// (interest retention), and when it leads the stream it confirms such a publish all the same.
// Here the stream's leader lags (paused) while the subscription joins: the join waits for it.
// Then every confirmed message is delivered, also once the consumer's leader has moved to that
// server, and the stream counts them for its limit (a fourth is refused). Before, the join was
// answered at once: the lagging leader confirmed four publishes into a stream of three, stored
// none, and with the consumer led from there none was delivered.
#[tokio::test]
async fn a_join_is_answered_once_every_server_keeps_its_messages() {
    let mut cluster = NatsCluster::start(3).await;
    let meta = within(async {
        loop {
            if let Some(leader) = cluster.meta_leader(0).await {
                return leader;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    // The lagging server leads the stream, not the cluster's meta group (the consumer's
    // creation goes on without it), and no gateway is connected to it.
    let lagging = (0..3).find(|&n| n != meta).unwrap();
    let others: Vec<usize> = (0..3).filter(|&n| n != lagging).collect();
    let a = gateway_with(
        GatewayConfig {
            max_messages: 3,
            ..GatewayConfig::new(cluster.client_url(others[0]))
        },
        Arc::new(TokioClock::new()),
    )
    .await;
    let b = gateway(&cluster.client_url(others[1])).await;
    let (on_a, on_b) = (a.client().await, b.client().await);
    let nats = async_nats::connect(cluster.client_url(others[0]))
        .await
        .unwrap();
    let js = async_nats::jetstream::new(nats.clone());
    stream_led_by(&nats, &js, lagging).await;

    cluster.pause(lagging);
    let mut join = tokio::spawn(async move {
        let mut member = on_a.subscribe(queue("orders", 1)).await.unwrap();
        member.confirmed().await;
        member
    });
    let early = tokio::time::timeout(std::time::Duration::from_secs(1), &mut join).await;
    cluster.resume(lagging);
    let answered_early = early.is_ok();
    let mut member = match early {
        Ok(member) => member.unwrap(),
        Err(_) => within(join).await.unwrap(),
    };

    let mut stored = Vec::new();
    for n in 0..3 {
        stored.push(on_b.publish("orders.new", &n.to_string()).await.system_id);
    }
    let fourth = on_b.try_publish("orders.new", b"4".to_vec()).await;
    let consumer = tinybroker::cluster::gateway::wire::names::consumer_name(
        tinybroker::core::Mode::Queue,
        "orders",
        "",
    );
    let consumer_leader = || async {
        let stream = js.get_stream("tinybroker").await.ok()?;
        let mut consumer: async_nats::jetstream::consumer::PullConsumer =
            stream.get_consumer(&consumer).await.ok()?;
        consumer.info().await.ok()?.cluster.as_ref()?.leader.clone()
    };
    lead_on(
        &nats,
        &format!("$JS.API.CONSUMER.LEADER.STEPDOWN.tinybroker.{consumer}"),
        lagging,
        consumer_leader,
    )
    .await;
    let mut delivered = Vec::new();
    for &system_id in &stored {
        let got = tokio::time::timeout(std::time::Duration::from_secs(5), member.message())
            .await
            .unwrap_or_else(|_| {
                panic!("confirmed message {system_id} was never delivered (got {delivered:?})")
            });
        delivered.push(got.system_id);
        member.ack(got.system_id).await;
    }
    assert_eq!(delivered, stored);
    assert_code(
        fourth,
        Code::ResourceExhausted,
        "max_msgs (--nats-max-messages",
    );
    assert!(
        !answered_early,
        "the join was answered while the stream's leader did not know its consumer"
    );
}

// docs/cluster.md#subscriptions-and-consumers: each subscription is one JetStream consumer, and
// the stream holds at most --nats-max-consumers (the fence records take one). A join past it
// is RESOURCE_EXHAUSTED naming the stream's setting and how to raise it, and changes nothing:
// the subscriptions that were there stay, and once one is deleted the refused join is taken.
#[tokio::test]
async fn a_join_past_the_streams_consumer_limit_is_refused_naming_the_setting() {
    let cluster = NatsCluster::start(1).await;
    let urls = cluster.client_urls();
    let gateway = gateway_with(
        GatewayConfig {
            max_consumers: 3,
            ..GatewayConfig::new(&urls[0])
        },
        Arc::new(TokioClock::new()),
    )
    .await;
    let client = gateway.client().await;
    let mut first = client.subscribe(queue("one", 1)).await.unwrap();
    first.confirmed().await;
    let mut second = client.subscribe(queue("two", 1)).await.unwrap();
    second.confirmed().await;
    let refused = client.subscribe(queue("three", 1)).await.map(drop);
    assert_code(refused, Code::ResourceExhausted, "max_consumers");
    let again = client.subscribe(queue("three", 1)).await.map(drop);
    assert_code(again, Code::ResourceExhausted, "--max-consumers");
    let listed: Vec<String> = client
        .list()
        .await
        .subscriptions
        .into_iter()
        .map(|s| s.subscription_id)
        .collect();
    assert_eq!(listed, ["one", "two"], "the refused join changed nothing");
    drop(first);
    crate::api::delete::delete_once_left(&client, "one").await;
    let mut third = client.subscribe(queue("three", 1)).await.unwrap();
    third.confirmed().await;
}

// docs/cluster.md#subscriptions-and-consumers: a stream that exists with no consumer limit of
// its own (made by hand, or by an earlier gateway) is given --nats-max-consumers at start,
// since nats-server 2.15 would hold it to 1,000 consumers; one that sets its own keeps it.
#[tokio::test]
async fn a_stream_without_a_consumer_limit_is_given_the_gateways_and_one_with_its_own_keeps_it() {
    let cluster = NatsCluster::start(1).await;
    let urls = cluster.client_urls();
    let js = async_nats::jetstream::new(async_nats::connect(&urls[0]).await.unwrap());
    for (stream, own) in [("unlimited", 0), ("limited", 40)] {
        js.create_stream(async_nats::jetstream::stream::Config {
            name: stream.into(),
            subjects: vec![format!("{stream}.>")],
            retention: async_nats::jetstream::stream::RetentionPolicy::Interest,
            max_messages: 1_000,
            max_consumers: own,
            ..Default::default()
        })
        .await
        .unwrap();
        let gateway = gateway_with(
            GatewayConfig {
                stream: stream.into(),
                max_consumers: 5_000,
                ..GatewayConfig::new(&urls[0])
            },
            Arc::new(TokioClock::new()),
        )
        .await;
        let storage = gateway.client().await.list().await.storage.unwrap();
        let expected = if own > 0 { own } else { 5_000 };
        assert_eq!(storage.max_consumers, expected, "{stream}: {storage:?}");
        let info = js.get_stream(stream).await.unwrap().cached_info().clone();
        assert_eq!(info.config.max_consumers, expected, "{stream}");
    }
}
