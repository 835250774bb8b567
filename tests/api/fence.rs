//! Fenced publishes over the wire (docs/semantics.md#fenced-publish): a publish naming
//! `(subscription_id, epoch)` is stored only while that epoch is the SINGLETON subscription's
//! active epoch, on every carriage (unary, batch, stream); a deposed leader's is refused with
//! FAILED_PRECONDITION naming the epoch now, and nothing of it is stored. Through gateways too
//! (docs/semantics.md#cluster-fenced-publish), with one difference in time: a publish fenced by
//! the epoch of a member that left with nobody after it is refused once the gateway that emptied
//! the line recorded that the epoch ended, a JetStream round trip after the line emptied.

use tinybroker::pb::{self, broker_client::BrokerClient};
use tonic::{Code, Status, transport::Channel};

use crate::harness::*;

fn fenced(topic: &str, payload: &str, subscription_id: &str, epoch: u64) -> pb::PublishRequest {
    pb::PublishRequest {
        topic: topic.into(),
        payload: payload.as_bytes().to_vec().into(),
        headers: Default::default(),
        fence: Some(pb::PublishFence {
            subscription_id: subscription_id.into(),
            epoch,
        }),
    }
}

#[derive(Debug, Clone, Copy)]
enum Carriage {
    Unary,
    Batch,
    Stream,
}

const CARRIAGES: [Carriage; 3] = [Carriage::Unary, Carriage::Batch, Carriage::Stream];

/// Publishes `request` by `carriage` (a batch of one, a stream of one).
async fn send(
    at: &BrokerClient<Channel>,
    carriage: Carriage,
    request: pb::PublishRequest,
) -> Result<pb::PublishResponse, Status> {
    match carriage {
        Carriage::Unary => within(at.clone().publish(request))
            .await
            .map(|r| r.into_inner()),
        Carriage::Batch => within(at.clone().publish_batch(pb::PublishBatchRequest {
            messages: vec![request],
        }))
        .await
        .map(|r| r.into_inner().results.remove(0)),
        Carriage::Stream => {
            let mut answers = within(at.clone().publish_stream(tokio_stream::iter(vec![request])))
                .await?
                .into_inner();
            let answer = within(answers.message())
                .await?
                .expect("the stream answers its request");
            match answer.code {
                0 => Ok(pb::PublishResponse {
                    system_id: answer.system_id,
                    queued_for: answer.queued_for,
                }),
                code => Err(Status::new(Code::from(code), answer.message)),
            }
        }
    }
}

/// A BROADCAST subscriber of `pattern`: what was stored, in order.
async fn observer(client: &Client, id: &str, pattern: &str) -> Member {
    let mut member = client
        .subscribe(open(id, pb::DeliveryMode::Broadcast, "", &[pattern]))
        .await
        .unwrap();
    member.confirmed().await;
    member
}

// docs/semantics.md#fenced-publish: the leader's fenced publish is stored; once it is deposed
// (its stream closed, the standby promoted), the same publish is refused FAILED_PRECONDITION
// naming the new epoch, on every carriage, and nothing of it reaches anyone; the new leader's
// is stored. The observer sees exactly the stored ones, in order.
#[tokio::test]
async fn a_deposed_leaders_fenced_publish_is_refused_and_the_new_leaders_is_stored() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut seen = observer(&client, "fence-seen", "out.>").await;
    let mut first = client.subscribe(singleton("sched")).await.unwrap();
    let c1 = first.confirmed().await;
    let mut second = client.subscribe(singleton("sched")).await.unwrap();

    for carriage in CARRIAGES {
        let stored = send(
            &client.1,
            carriage,
            fenced("out.run", "by-first", "sched", c1.epoch),
        )
        .await;
        let stored = stored.unwrap_or_else(|e| panic!("{carriage:?}: {e}"));
        assert_eq!(stored.queued_for, 1, "{carriage:?}");
        let message = seen.message().await;
        assert_eq!(message.payload.as_ref(), b"by-first");
        seen.ack(message.system_id).await;
    }

    drop(first);
    let c2 = second.confirmed().await;
    assert_next_epoch(c1.epoch, c2.epoch);
    for carriage in CARRIAGES {
        let late = send(
            &client.1,
            carriage,
            fenced("out.run", "late", "sched", c1.epoch),
        )
        .await;
        assert_code(
            late,
            Code::FailedPrecondition,
            &format!("the active epoch is {}", c2.epoch),
        );
        let new = send(
            &client.1,
            carriage,
            fenced("out.run", "by-second", "sched", c2.epoch),
        )
        .await;
        new.unwrap_or_else(|e| panic!("{carriage:?}: {e}"));
    }
    // A plain publish marks the end: everything stored before it has arrived before it.
    client.publish("out.end", "end").await;
    let mut payloads = Vec::new();
    loop {
        let message = seen.message().await;
        if message.payload.as_ref() == b"end" {
            break;
        }
        seen.ack(message.system_id).await;
        payloads.push(String::from_utf8(message.payload.to_vec()).unwrap());
    }
    assert_eq!(
        payloads,
        ["by-second", "by-second", "by-second"],
        "nothing refused was stored"
    );
}

// docs/semantics.md#fenced-publish: a fenced publish the leader makes to its own
// subscription's topics is checked and delivered like any other (the fence is among the
// subscriptions the topic matches); with no member active, every epoch is refused, naming the
// last one.
#[tokio::test]
async fn a_leader_may_fence_publishes_to_its_own_topics_and_none_passes_with_nobody_active() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut leader = client
        .subscribe(open(
            "self-fenced",
            pb::DeliveryMode::Singleton,
            "g",
            &["self.>"],
        ))
        .await
        .unwrap();
    let c = leader.confirmed().await;
    let published = send(
        &client.1,
        Carriage::Unary,
        fenced("self.tick", "t", "self-fenced", c.epoch),
    )
    .await;
    assert_eq!(published.unwrap().queued_for, 1);
    assert_eq!(leader.message().await.payload.as_ref(), b"t");
    // A wrong epoch, higher than any handed out, is refused too.
    assert_code(
        send(
            &client.1,
            Carriage::Unary,
            fenced("self.tick", "t", "self-fenced", c.epoch + 1),
        )
        .await,
        Code::FailedPrecondition,
        &format!("the active epoch is {}", c.epoch),
    );
    drop(leader);
    within(async {
        loop {
            let info = client.describe("self-fenced").await.unwrap();
            if info.active_member_id == 0 {
                return;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    let late = || {
        send(
            &client.1,
            Carriage::Unary,
            fenced("other.topic", "t", "self-fenced", c.epoch),
        )
    };
    if GATEWAYS {
        // Refused once the emptied line's end is recorded (a publish before that, to a topic
        // nobody subscribes to, keeps nothing).
        within(async {
            while late().await.is_ok() {
                tokio::task::yield_now().await;
            }
        })
        .await;
    }
    assert_code(
        late().await,
        Code::FailedPrecondition,
        &format!("no active member (its last epoch is {})", c.epoch),
    );
}

// docs/semantics.md#fenced-publish: a fence naming no subscription or epoch 0 is
// INVALID_ARGUMENT; one naming an unknown subscription NOT_FOUND, a QUEUE one
// FAILED_PRECONDITION; nothing is stored by any of them.
#[tokio::test]
async fn bad_fences_are_refused_with_clear_codes_and_store_nothing() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut seen = observer(&client, "bad-fence-seen", "bad.>").await;
    let mut worker = client
        .subscribe(open("work", pb::DeliveryMode::Queue, "g", &["work.x"]))
        .await
        .unwrap();
    worker.confirmed().await;
    for carriage in CARRIAGES {
        assert_code(
            send(&client.1, carriage, fenced("bad.a", "x", "", 1)).await,
            Code::InvalidArgument,
            "fence.subscription_id is required",
        );
        assert_code(
            send(&client.1, carriage, fenced("bad.a", "x", "sched", 0)).await,
            Code::InvalidArgument,
            "fence.epoch must be",
        );
        let unknown = send(&client.1, carriage, fenced("bad.a", "x", "nobody", 3)).await;
        let queue = send(&client.1, carriage, fenced("bad.a", "x", "work", 3)).await;
        assert_code(unknown, Code::NotFound, "\"nobody\" not found");
        assert_code(queue, Code::FailedPrecondition, "is QUEUE");
    }
    client.publish("bad.end", "end").await;
    assert_eq!(
        seen.message().await.payload.as_ref(),
        b"end",
        "nothing else was stored"
    );
}

// docs/semantics.md#fenced-publish "Every carriage": each message of a batch or stream is
// checked on its own. A batch stops at its stale-fenced message (what came before is stored);
// a stream answers it in its place and goes on, with an unfenced message to the same topic
// right after it stored.
#[tokio::test]
async fn each_message_of_a_batch_or_stream_is_checked_on_its_own() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut seen = observer(&client, "mixed-seen", "mixed.>").await;
    let mut first = client.subscribe(singleton("mixed")).await.unwrap();
    let c1 = first.confirmed().await;
    let mut second = client.subscribe(singleton("mixed")).await.unwrap();
    drop(first);
    let c2 = second.confirmed().await;
    let plain = |payload: &str| pb::PublishRequest {
        fence: None,
        ..fenced("mixed.a", payload, "", 0)
    };

    let batch = within(client.1.clone().publish_batch(pb::PublishBatchRequest {
        messages: vec![
            fenced("mixed.a", "b-ok", "mixed", c2.epoch),
            fenced("mixed.a", "b-stale", "mixed", c1.epoch),
            plain("b-after"),
        ],
    }))
    .await;
    let stream = async {
        let answers: Vec<pb::PublishStreamResponse> =
            within(client.1.clone().publish_stream(tokio_stream::iter(vec![
                fenced("mixed.a", "s-ok", "mixed", c2.epoch),
                fenced("mixed.a", "s-stale", "mixed", c1.epoch),
                plain("s-after"),
                fenced("mixed.a", "s-ok-again", "mixed", c2.epoch),
            ])))
            .await
            .unwrap()
            .into_inner()
            .map(|answer| answer.unwrap())
            .collect()
            .await;
        answers.iter().map(|a| a.code).collect::<Vec<_>>()
    };
    use tokio_stream::StreamExt;
    let codes = within(stream).await;
    assert_code(batch, Code::FailedPrecondition, "the active epoch is");
    let refused = Code::FailedPrecondition as i32;
    assert_eq!(codes, [0, refused, 0, 0]);
    client.publish("mixed.end", "end").await;
    let mut payloads = Vec::new();
    loop {
        let message = seen.message().await;
        seen.ack(message.system_id).await;
        if message.payload.as_ref() == b"end" {
            break;
        }
        payloads.push(String::from_utf8(message.payload.to_vec()).unwrap());
    }
    assert_eq!(payloads, ["b-ok", "s-ok", "s-after", "s-ok-again"]);
}
