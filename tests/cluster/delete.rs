//! `DeleteSubscription` against gateway processes in trouble (docs/semantics.md#deleting,
//! #cluster-delete): a delete is refused while a member is joined at any gateway.

use std::time::Duration;

use tinybroker::pb::DeliveryMode;
use tonic::Code;

use crate::{
    api::delete::delete,
    binary::Running,
    harness::{Client, open, within},
    nats_server::NatsCluster,
};

async fn gateway_process(urls: &str) -> (Running, Client) {
    crate::faults::gateway_process(urls, &["--gateway-lease", "1s"]).await
}

fn signal(process: &Running, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([signal, &process.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

// docs/semantics.md#cluster-delete: a QUEUE member stays joined at a gateway that was stopped
// (SIGSTOP) long enough for its lease to lapse and then resumed (its stream never ended). A
// delete at the other gateway meanwhile must not remove the subscription under it: either the
// delete is refused, or the member's stream ends. Otherwise the member stays joined to a
// subscription whose JetStream consumer is gone, and never receives anything again.
#[tokio::test]
async fn a_delete_while_the_members_gateway_is_stopped_leaves_no_member_on_a_deleted_consumer() {
    let cluster = NatsCluster::start(3).await;
    let urls = cluster.client_urls().join(",");
    let (stalled, at_stalled) = gateway_process(&urls).await;
    let (_deleting, at_deleting) = gateway_process(&urls).await;
    let id = "delete-stalled";
    let mut member = at_stalled
        .subscribe(open(id, DeliveryMode::Queue, "workers", &["stalled.*"]))
        .await
        .unwrap();
    member.confirmed().await;
    signal(&stalled, "-STOP");
    // The stalled gateway's lease lapses after about 3.4 s (lease 1 s here: sooner); until
    // then the delete is UNAVAILABLE (the gateway does not answer).
    let outcome = within(async {
        loop {
            match delete(&at_deleting, id).await {
                Err(status) if status.code() == Code::Unavailable => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                other => return other,
            }
        }
    })
    .await;
    signal(&stalled, "-CONT");
    if let Err(status) = &outcome {
        assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
        return;
    }
    // The delete went through: the member must not be left joined to nothing.
    let sent = at_deleting.publish("stalled.x", "after the delete").await;
    let got = tokio::time::timeout(Duration::from_secs(10), member.stream.message()).await;
    match got {
        Ok(Ok(None) | Err(_)) => {} // its stream ended: it knows to join again
        Ok(Ok(Some(frame))) => panic!(
            "the delete went through ({outcome:?}) while a member was joined; it then got {frame:?} (published {})",
            sent.system_id
        ),
        Err(_) => panic!(
            "the delete went through ({outcome:?}) while a member was joined at the stopped gateway; resumed, that member is still joined (its stream open) to a subscription whose consumer is gone, and got nothing in 10 s"
        ),
    }
}

// docs/semantics.md#cluster-delete: every incarnation of a gateway that ever ran leaves its
// lease's delete marker in the coordination bucket for good. A delete reads the leases still
// held, and must answer with thousands of markers piled up (here 5,000 past incarnations;
// read one after another from the bucket's leader, 10,000 took longer than a delete's patience).
#[tokio::test]
async fn a_delete_answers_after_five_thousand_past_gateway_incarnations() {
    let cluster = NatsCluster::start(3).await;
    let urls = cluster.client_urls();
    let at = crate::gateway(&urls[0]).await;
    let client = at.client().await;
    let nats = async_nats::connect(&urls[1]).await.unwrap();
    const PAST: u64 = 5_000;
    for i in 0..PAST {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("KV-Operation", "DEL");
        nats.publish_with_headers(
            format!(
                "$KV.tinybroker-coordination.lease.{}",
                1_000_000_000_000_000 + i
            ),
            headers,
            Default::default(),
        )
        .await
        .unwrap();
    }
    nats.flush().await.unwrap();
    // Stored: the bucket's stream holds every marker (and the live keys).
    let js = async_nats::jetstream::new(nats);
    within(async {
        loop {
            let mut stream = js.get_stream("KV_tinybroker-coordination").await.unwrap();
            if stream.info().await.unwrap().state.messages >= PAST {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let started = std::time::Instant::now();
    let answer = delete(&client, "never-made").await;
    assert!(
        matches!(&answer, Err(status) if status.code() == Code::NotFound),
        "{answer:?} after {:?}",
        started.elapsed()
    );
    // And a subscription is still deleted: the live lease of this gateway was found.
    let mut member = client
        .subscribe(open("made", DeliveryMode::Queue, "g", &["made.*"]))
        .await
        .unwrap();
    member.confirmed().await;
    drop(member);
    crate::api::delete::delete_once_left(&client, "made").await;
}
