//! `PublishStream` under a burst: a publisher that sends many requests before reading any
//! answer (the broker reads what has arrived and publishes it together, a run to one topic
//! routed once). Each request still gets its own answer, in order, and the messages reach
//! their subscribers in publish order, whatever the sizes and however the topics alternate.

use tinybroker::pb::{self, DeliveryMode};
use tokio_stream::StreamExt;
use tonic::Code;

use crate::harness::*;

fn request(topic: &str, payload: Vec<u8>) -> pb::PublishRequest {
    pb::PublishRequest {
        topic: topic.into(),
        payload: payload.into(),
        headers: Default::default(),
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
