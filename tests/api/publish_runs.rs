//! `PublishStream` under a burst: a publisher that sends many requests before reading any
//! answer (the broker reads what has arrived and publishes it together, a run to one topic
//! routed once). Each request still gets its own answer, in order, and the messages reach
//! their subscribers in publish order, whatever the sizes and however the topics alternate.

use tinybroker::pb::{self, DeliveryMode};
use tokio_stream::StreamExt;
use tonic::{Code, transport::Channel};

use crate::harness::*;

fn request(topic: &str, payload: Vec<u8>) -> pb::PublishRequest {
    pb::PublishRequest {
        topic: topic.into(),
        payload: payload.into(),
        headers: Default::default(),
        fence: None,
    }
}

/// Sends every request at once (the client writes them as fast as flow control lets it) and
/// collects every answer.
async fn burst(
    client: &Client,
    requests: Vec<pb::PublishRequest>,
) -> Vec<pb::PublishStreamResponse> {
    within(async {
        let mut stream = client
            .1
            .clone()
            .publish_stream(tokio_stream::iter(requests))
            .await
            .unwrap()
            .into_inner();
        let mut answers = Vec::new();
        while let Some(answer) = stream.next().await {
            answers.push(answer.unwrap());
        }
        answers
    })
    .await
}

/// A member that takes up to `window` messages without acking.
async fn reader(client: &Client, id: &str, pattern: &str, window: u32) -> Member {
    let mut member = client
        .subscribe(pb::OpenSubscription {
            max_in_flight: window,
            ..open(id, DeliveryMode::Queue, "g", &[pattern])
        })
        .await
        .unwrap();
    member.confirmed().await;
    member
}

// Runs of two topics alternating, with invalid requests among them: one answer per request,
// in order, the invalid ones refused in their place; each subscriber gets its topic's messages
// in the order they were answered.
#[tokio::test]
async fn a_burst_of_alternating_runs_is_answered_in_order_and_delivered_in_order() {
    const COUNT: usize = 400;
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut a = reader(&client, "runs-a", "burst.a", COUNT as u32).await;
    let mut b = reader(&client, "runs-b", "burst.b", COUNT as u32).await;
    let bad = |i: usize| i % 50 == 17;
    let topic = |i: usize| {
        if (i / 7).is_multiple_of(2) {
            "burst.a"
        } else {
            "burst.b"
        }
    };
    let requests = (0..COUNT)
        .map(|i| match bad(i) {
            true => request("burst..bad", vec![1]),
            false => request(topic(i), (i as u32).to_le_bytes().to_vec()),
        })
        .collect();
    let answers = burst(&client, requests).await;
    assert_eq!(answers.len(), COUNT);
    let mut expected_a = Vec::new();
    let mut expected_b = Vec::new();
    let mut last = 0;
    for (i, answer) in answers.iter().enumerate() {
        if bad(i) {
            assert_eq!(
                Code::from(answer.code),
                Code::InvalidArgument,
                "{i}: {answer:?}"
            );
            continue;
        }
        assert_eq!(answer.code, 0, "{i}: {answer:?}");
        assert!(
            answer.system_id > last,
            "{i}: id {} after {last}",
            answer.system_id
        );
        last = answer.system_id;
        match topic(i) {
            "burst.a" => expected_a.push((answer.system_id, i as u32)),
            _ => expected_b.push((answer.system_id, i as u32)),
        }
    }
    for (member, expected) in [(&mut a, expected_a), (&mut b, expected_b)] {
        let mut got = Vec::new();
        while got.len() < expected.len() {
            let message = member.message().await;
            let index = u32::from_le_bytes(message.payload[..4].try_into().unwrap());
            got.push((message.system_id, index));
        }
        assert_eq!(got, expected);
    }
}

// One large message (512 KiB) between small ones, sent in one burst: the large one is read and
// published on its own, none is lost or reordered.
#[tokio::test]
async fn a_large_message_inside_a_burst_of_small_ones_keeps_its_place() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut member = reader(&client, "runs-large", "large.>", 200).await;
    let large = 100;
    let requests = (0..200u32)
        .map(|i| {
            let mut payload = i.to_le_bytes().to_vec();
            if i == large {
                payload.resize(512 * 1024, 0xAB);
            }
            request("large.x", payload)
        })
        .collect();
    let answers = burst(&client, requests).await;
    assert_eq!(answers.len(), 200);
    assert!(answers.iter().all(|a| a.code == 0), "{answers:?}");
    for (i, answer) in answers.iter().enumerate() {
        let message = member.message().await;
        assert_eq!(message.system_id, answer.system_id, "message {i}");
        let index = u32::from_le_bytes(message.payload[..4].try_into().unwrap());
        assert_eq!(index as usize, i);
        let size = if i == large as usize { 512 * 1024 } else { 4 };
        assert_eq!(message.payload.len(), size, "message {i}");
    }
}

/// A `PublishRequest` on the wire, with the topic as raw bytes (so it can be made undecodable:
/// a `string` field that is not UTF-8).
#[derive(Clone, PartialEq, prost::Message)]
struct RawRequest {
    #[prost(bytes = "vec", tag = "1")]
    topic: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    payload: Vec<u8>,
}

/// Sends `requests` on one `PublishStream` at once; the answers before the stream ended and
/// how it ended.
async fn raw_burst(
    server: &TestServer,
    requests: Vec<RawRequest>,
) -> (Vec<pb::PublishStreamResponse>, Option<tonic::Status>) {
    let channel = Channel::from_shared(format!("http://{}", server.publish_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let codec = tonic_prost::ProstCodec::<RawRequest, pb::PublishStreamResponse>::default();
    let path =
        tonic::codegen::http::uri::PathAndQuery::from_static("/tinybroker.v1.Broker/PublishStream");
    within(async move {
        let mut stream = grpc
            .streaming(
                tonic::Request::new(tokio_stream::iter(requests)),
                path,
                codec,
            )
            .await
            .unwrap()
            .into_inner();
        let mut answers = Vec::new();
        loop {
            match stream.next().await {
                Some(Ok(answer)) => answers.push(answer),
                Some(Err(status)) => return (answers, Some(status)),
                None => return (answers, None),
            }
        }
    })
    .await
}

// Ten valid publishes then one undecodable request (a topic that is not UTF-8), sent in one
// burst: the stream ends with the decoder's error, but only after answering the ten it
// published (the subscriber receives all ten, so the publisher must hear of all ten).
#[tokio::test]
async fn undecodable_input_after_a_burst_still_answers_what_was_published() {
    const VALID: usize = 10;
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut sub = reader(&client, "undecodable", "raw.>", 100).await;
    let mut requests: Vec<_> = (0..VALID)
        .map(|i| RawRequest {
            topic: b"raw.x".to_vec(),
            payload: vec![i as u8],
        })
        .collect();
    requests.push(RawRequest {
        topic: vec![0xff, 0xfe, b'x'],
        payload: vec![0],
    });
    let (answers, end) = raw_burst(&server, requests).await;
    let end = end.expect("the undecodable request ends the stream with an error");
    assert_ne!(end.code(), Code::Ok);
    // The ten were published: the subscriber gets them.
    let mut delivered = Vec::new();
    for _ in 0..VALID {
        delivered.push(sub.message().await.system_id);
    }
    assert_eq!(
        client.publishers_list().await.broker.unwrap().published,
        VALID as u64
    );
    let answered: Vec<_> = answers.iter().map(|a| a.system_id).collect();
    assert_eq!(
        answered,
        delivered,
        "published and delivered {VALID}, answered {} before the stream ended with {end:?}",
        answers.len()
    );
}

// Ten valid publishes then one request over max_request_bytes (the decoder's limit, answered
// RESOURCE_EXHAUSTED): the ten are published and must be answered before the stream ends.
#[tokio::test]
async fn an_oversized_request_after_a_burst_still_answers_what_was_published() {
    const VALID: usize = 10;
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut sub = reader(&client, "oversized", "big.>", 100).await;
    let mut requests: Vec<_> = (0..VALID)
        .map(|i| RawRequest {
            topic: b"big.x".to_vec(),
            payload: vec![i as u8],
        })
        .collect();
    requests.push(RawRequest {
        topic: b"big.x".to_vec(),
        payload: vec![0; 3 * 1024 * 1024],
    });
    let (answers, end) = raw_burst(&server, requests).await;
    let end = end.expect("the oversized request ends the stream");
    assert_eq!(end.code(), Code::ResourceExhausted, "{end:?}");
    let mut delivered = Vec::new();
    for _ in 0..VALID {
        delivered.push(sub.message().await.system_id);
    }
    let answered: Vec<_> = answers.iter().map(|a| a.system_id).collect();
    assert_eq!(
        answered,
        delivered,
        "published and delivered {VALID}, answered {} before the stream ended with {end:?}",
        answers.len()
    );
}

// docs/semantics.md#limits-table: a request over the size limit is RESOURCE_EXHAUSTED on a stream too (tonic's decoder
// says OUT_OF_RANGE, and a stream's status travels in its trailers, which the unary calls'
// rewrite does not see).
#[tokio::test]
async fn an_oversized_publish_stream_request_alone_is_resource_exhausted() {
    let server = TestServer::start().await;
    let requests = vec![RawRequest {
        topic: b"big.x".to_vec(),
        payload: vec![0; 3 * 1024 * 1024],
    }];
    let (answers, end) = raw_burst(&server, requests).await;
    assert!(answers.is_empty());
    let end = end.expect("the oversized request ends the stream");
    assert_eq!(end.code(), Code::ResourceExhausted, "{end:?}");
}
