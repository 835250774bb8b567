//! A `PublishStream`'s publishes through a gateway go to JetStream as atomic batches
//! (docs/cluster-internals.md#atomic-batches): each publish answered with its own stream sequence,
//! in order, stored once; members see only the client's headers; a batch the stream refuses for its
//! limits is published one by one, so the refusal comes exactly past the limit.

use std::collections::HashMap;

use tinybroker::pb;
use tonic::Code;

use crate::{NatsCluster, gateway, publish_stream, queue, within};

fn request(n: usize, headers: &HashMap<String, String>) -> pb::PublishRequest {
    pb::PublishRequest {
        topic: "orders.new".into(),
        payload: n.to_string().into_bytes().into(),
        headers: headers.clone(),
        fence: None,
    }
}

#[tokio::test]
async fn a_publish_stream_is_stored_in_atomic_batches_each_publish_answered_with_its_sequence() {
    let cluster = NatsCluster::start(3).await;
    let urls = cluster.client_urls();
    let (a, b) = (gateway(&urls[0]).await, gateway(&urls[1]).await);
    let (on_a, on_b) = (a.client().await, b.client().await);
    let mut member = on_a.subscribe(queue("orders", 1000)).await.unwrap();
    member.confirmed().await;
    // A client header named like JetStream's batch headers travels as the client's.
    let headers: HashMap<String, String> = [
        ("k".to_string(), " v ".to_string()),
        ("Nats-Batch-Id".to_string(), "mine".to_string()),
    ]
    .into();
    let count = 600;
    let answers = publish_stream(&on_b, (0..count).map(|n| request(n, &headers)).collect()).await;
    assert_eq!(answers.len(), count);
    assert!(
        answers.iter().all(|a| a.code == Code::Ok as i32),
        "{:?}",
        answers.iter().find(|a| a.code != Code::Ok as i32)
    );
    let ids: Vec<u64> = answers.iter().map(|a| a.system_id).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");

    // JetStream stored them in batches: each message carries its batch's id, and more than
    // one message shares one.
    let js = async_nats::jetstream::new(async_nats::connect(&urls[2]).await.unwrap());
    let stream = js.get_stream("tinybroker").await.unwrap();
    let mut batch_ids = HashMap::<String, usize>::new();
    for (n, id) in ids.iter().enumerate() {
        let stored = stream.get_raw_message(*id).await.unwrap();
        assert_eq!(stored.payload, n.to_string().as_bytes(), "sequence {id}");
        let batch = stored
            .headers
            .get("Nats-Batch-Id")
            .map(|v| v.as_str().to_string());
        *batch_ids.entry(batch.unwrap_or_default()).or_default() += 1;
    }
    assert!(
        batch_ids.iter().any(|(id, n)| !id.is_empty() && *n > 1),
        "no batch of more than one: {batch_ids:?}"
    );

    // Each delivered once, in order, with the answered sequence and the client's headers only.
    for (n, id) in ids.iter().enumerate() {
        let got = member.message().await;
        assert_eq!(got.system_id, *id, "message {n}");
        assert_eq!(got.payload, n.to_string().as_bytes(), "message {n}");
        assert_eq!(got.headers, headers, "message {n}");
        member.ack(got.system_id).await;
    }
}

// docs/semantics.md#limits-table (memory is bounded) in cluster mode: a stream with room for
// three takes three of a `PublishStream`'s five and refuses the last two, as single publishes
// are refused, though all five went as one batch first.
#[tokio::test]
async fn a_batch_past_the_streams_limit_is_refused_exactly_past_it() {
    let cluster = NatsCluster::start(3).await;
    let urls = cluster.client_urls();
    let a = crate::gateway_with(
        tinybroker::cluster::gateway::GatewayConfig {
            max_messages: 3,
            ..tinybroker::cluster::gateway::GatewayConfig::new(&urls[0])
        },
        std::sync::Arc::new(tinybroker::clock::TokioClock::new()),
    )
    .await;
    let on_a = a.client().await;
    let mut member = on_a.subscribe(queue("orders", 10)).await.unwrap();
    member.confirmed().await;
    let answers =
        publish_stream(&on_a, (0..5).map(|n| request(n, &HashMap::new())).collect()).await;
    let codes: Vec<i32> = answers.iter().map(|a| a.code).collect();
    let (ok, full) = (Code::Ok as i32, Code::ResourceExhausted as i32);
    assert_eq!(codes, [ok, ok, ok, full, full], "{answers:?}");
    for (n, answer) in answers.iter().take(3).enumerate() {
        let got = within(member.message()).await;
        assert_eq!(got.payload, n.to_string().as_bytes());
        assert_eq!(got.system_id, answer.system_id);
    }
}

// More `PublishStream`s sending at once than JetStream keeps batches open on a stream (50 by
// default): a batch refused for that is sent again, never refused to the client or stored
// twice.
#[tokio::test]
async fn more_streams_than_open_batches_allowed_are_all_stored_once() {
    let cluster = NatsCluster::start(3).await;
    let urls = cluster.client_urls();
    let (a, b) = (gateway(&urls[0]).await, gateway(&urls[1]).await);
    let (on_a, on_b) = (a.client().await, b.client().await);
    let mut member = on_a.subscribe(queue("orders", 1000)).await.unwrap();
    member.confirmed().await;
    let (streams, each) = (64, 20);
    let mut sending = tokio::task::JoinSet::new();
    for s in 0..streams {
        let on_b = on_b.clone();
        sending.spawn(async move {
            let requests = (0..each)
                .map(|n| pb::PublishRequest {
                    topic: "orders.new".into(),
                    payload: format!("{s}-{n}").into_bytes().into(),
                    headers: HashMap::new(),
                    fence: None,
                })
                .collect();
            publish_stream(&on_b, requests).await
        });
    }
    let answers: Vec<pb::PublishStreamResponse> =
        sending.join_all().await.into_iter().flatten().collect();
    assert_eq!(answers.len(), streams * each);
    let refused: Vec<_> = answers
        .iter()
        .filter(|a| a.code != Code::Ok as i32)
        .collect();
    assert!(refused.is_empty(), "{refused:?}");
    let mut ids: Vec<u64> = answers.iter().map(|a| a.system_id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(
        ids.len(),
        streams * each,
        "two publishes answered with one sequence"
    );
    // Stored once each: every payload delivered once, under the sequence it was answered.
    let mut delivered = HashMap::new();
    for _ in 0..streams * each {
        let got = member.message().await;
        member.ack(got.system_id).await;
        let payload = String::from_utf8(got.payload.to_vec()).unwrap();
        assert!(delivered.insert(payload, got.system_id).is_none());
    }
    assert!(ids.iter().all(|id| delivered.values().any(|d| d == id)));
}

// A message that passes the gateway's size check but that NATS does not carry once its
// header is escaped (three bytes per byte) is refused alone with INVALID_ARGUMENT; inside a
// batch it is refused the same, and the publishes around it are stored (the batch is published
// one by one). Before, the batch was sent again until the patience ran out and every publish
// in it, valid ones included, was UNAVAILABLE.
#[tokio::test]
async fn a_message_nats_does_not_carry_inside_a_batch_is_refused_alone() {
    let cluster = NatsCluster::start(3).await;
    let urls = cluster.client_urls();
    let a = crate::gateway_with(
        tinybroker::cluster::gateway::GatewayConfig {
            publish_timeout: std::time::Duration::from_secs(5),
            ..tinybroker::cluster::gateway::GatewayConfig::new(&urls[0])
        },
        std::sync::Arc::new(tinybroker::clock::TokioClock::new()),
    )
    .await;
    let on_a = a.client().await;
    let mut member = on_a.subscribe(queue("orders", 100)).await.unwrap();
    member.confirmed().await;
    // A leading space: escaped as %20 and each "é" as %C3%A9, over 15,000 bytes on the wire.
    let headers: HashMap<String, String> =
        [("h".to_string(), format!(" {}", "é".repeat(2500)))].into();
    let big = pb::PublishRequest {
        topic: "orders.new".into(),
        payload: vec![b'x'; 1_040_000].into(),
        headers,
        fence: None,
    };
    let alone = within(on_a.1.clone().publish(big.clone())).await;
    assert_eq!(
        alone.map(|_| ()).map_err(|s| s.code()),
        Err(Code::InvalidArgument)
    );
    let none = HashMap::new();
    let requests = vec![
        request(0, &none),
        request(1, &none),
        big,
        request(3, &none),
        request(4, &none),
    ];
    let answers = publish_stream(&on_a, requests).await;
    let codes: Vec<i32> = answers.iter().map(|a| a.code).collect();
    let (ok, invalid) = (Code::Ok as i32, Code::InvalidArgument as i32);
    assert_eq!(codes, [ok, ok, invalid, ok, ok], "{answers:?}");
    for n in [0, 1, 3, 4] {
        let got = member.message().await;
        assert_eq!(got.payload, n.to_string().as_bytes());
        member.ack(got.system_id).await;
    }
}
