//! Review of fenced publishes through gateways (docs/semantics.md#cluster-fenced-publish,
//! docs/cluster.md#fenced-publishes): a member's activation now waits for its epoch's fence
//! record to be stored in the stream, so a full stream (discard new) must not keep a SINGLETON
//! subscription without a leader. Before the fence records (040faa3), both cases below promoted
//! in about 20 ms on a full stream.

use std::sync::Arc;

use tinybroker::{clock::TokioClock, cluster::gateway::GatewayConfig};
use tonic::Code;

use crate::{NatsCluster, assert_code, gateway, gateway_with, harness::singleton, queue, within};

/// A cluster whose stream the first gateway created holding at most `max_messages` messages;
/// the second gateway binds it.
async fn bounded(max_messages: i64) -> (NatsCluster, crate::TestServer, crate::TestServer) {
    let cluster = NatsCluster::start(3).await;
    let urls = cluster.client_urls();
    let a = gateway_with(
        GatewayConfig {
            max_messages,
            ..GatewayConfig::new(&urls[0])
        },
        Arc::new(TokioClock::new()),
    )
    .await;
    let b = gateway(&urls[1]).await;
    (cluster, a, b)
}

/// Publishes through `client` until the stream refuses one as full.
async fn fill(client: &crate::harness::Client) {
    within(async {
        loop {
            match client.try_publish("orders.new", b"fill".to_vec()).await {
                Ok(_) => {}
                Err(status) => {
                    assert_code(
                        Err::<(), _>(status),
                        Code::ResourceExhausted,
                        "max_msgs (--nats-max-messages",
                    );
                    return;
                }
            }
        }
    })
    .await;
}

// A new SINGLETON subscription's first member joins while the stream is full: its activation
// waits for the first fence record, which a full stream does not take (there is no older record
// to delete for room, `try_record` only makes room when `expected != 0`), so the member is never
// confirmed while the stream stays full. Observed: no confirmation in 15 s (tinybroker 9815a88);
// 040faa3 confirmed it in 80 ms. The subscription's describe says no member, epoch 0.
#[tokio::test]
async fn a_new_singletons_first_member_is_confirmed_on_a_full_stream() {
    let (_cluster, a, b) = bounded(3).await;
    let (on_a, on_b) = (a.client().await, b.client().await);
    // A QUEUE subscription that takes one message and holds the rest: the stream fills.
    let mut holder = on_a.subscribe(queue("orders", 1)).await.unwrap();
    holder.confirmed().await;
    fill(&on_b).await;

    let mut first = on_a.subscribe(singleton("fresh")).await.unwrap();
    let confirmation = within(first.confirmed()).await;
    assert!(confirmation.epoch > 0);
}

// An existing SINGLETON subscription (its record stored) on a full stream while plain
// publishers keep retrying their refused publishes: the leader leaves, the gateway writing the
// successor's record deletes the old record to make room, a racing plain publish takes the
// freed slot, and the record write, now with no record to delete (`expected == 0`), fails as
// full and is retried every 200 ms while the lease is valid. The standby is never confirmed
// while the publishers keep the stream full, and the old record is gone. Observed with
// scripts (/tmp/review/a3b_race.py, 10 subscriptions, 16 publishers): 10 of 10 promotions
// stuck (no confirmation in 10 s); 040faa3: 10 of 10 in 10-30 ms.
#[tokio::test]
async fn a_standby_is_confirmed_on_a_full_stream_while_publishers_race_for_the_room() {
    let (_cluster, a, b) = bounded(4).await;
    let (on_a, on_b) = (a.client().await, b.client().await);
    let mut leader = on_a.subscribe(singleton("sched")).await.unwrap();
    leader.confirmed().await;
    let mut standby = on_b.subscribe(singleton("sched")).await.unwrap();
    let mut holder = on_a.subscribe(queue("orders", 1)).await.unwrap();
    holder.confirmed().await;
    fill(&on_b).await;

    // Publishers retrying whatever is refused, as a producer facing a full stream does.
    let racers: Vec<_> = (0..8)
        .map(|_| {
            let mut client = on_b.1.clone();
            tokio::spawn(async move {
                loop {
                    let _ = client
                        .publish(tinybroker::pb::PublishRequest {
                            topic: "orders.new".into(),
                            payload: b"race".to_vec().into(),
                            headers: Default::default(),
                            fence: None,
                        })
                        .await;
                }
            })
        })
        .collect();
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    drop(leader);
    // Fails here ("timed out waiting for an event", from `confirmed`'s own 10 s bound).
    let confirmation = standby.confirmed().await;
    for racer in &racers {
        racer.abort();
    }
    assert!(confirmation.epoch > 0);
}

// A SINGLETON subscription that expires (no member within the idle timeout; JetStream removes
// its consumer) keeps its fence record in the stream for good: only `DeleteSubscription`
// purges it (`Fences::deleted`), and `tb-fences` keeps it under interest retention. Each
// expired SINGLETON id then holds one message of the stream's `--nats-max-messages` forever.
// Observed (/tmp/review/a9_expire.py): 30 SINGLETON ids joined once and expired; `List` shows
// none, the stream holds 30 messages, all on `$TBFENCE.<stream>.>`.
#[tokio::test]
async fn an_expired_singletons_fence_record_does_not_stay_in_the_stream() {
    let cluster = NatsCluster::start(3).await;
    let urls = cluster.client_urls();
    let a = gateway_with(
        GatewayConfig {
            idle_timeout: std::time::Duration::from_secs(1),
            ..GatewayConfig::new(&urls[0])
        },
        Arc::new(TokioClock::new()),
    )
    .await;
    let on_a = a.client().await;
    for n in 0..5 {
        let mut member = on_a
            .subscribe(singleton(&format!("job-{n}")))
            .await
            .unwrap();
        member.confirmed().await;
    }
    // Every member gone; the consumers expire after the idle timeout.
    let client = async_nats::connect(&urls[2]).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let mut stream = js.get_stream("tinybroker").await.unwrap();
    within(async {
        loop {
            if on_a.list().await.subscriptions.is_empty() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let messages = stream.info().await.unwrap().state.messages;
    assert_eq!(
        messages, 0,
        "no subscription is left, yet the stream holds {messages} message(s) (fence records)"
    );
}
