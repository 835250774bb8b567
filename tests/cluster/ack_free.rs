//! Ack-free subscriptions through gateways (docs/cluster-internals.md#singleton-across-gateways):
//! an ack-free QUEUE or BROADCAST consumer takes no acks (a written message only makes room for the
//! next pull), while an ack-free singleton's consumer still does, so the gateway acks each message
//! once its member's stream wrote it: nothing stays pending in JetStream, nothing written is
//! delivered again after a hand-over, and the subscription never stalls at the consumer's
//! `max_ack_pending`.

use std::{sync::Arc, time::Duration};

use tinybroker::{
    clock::TokioClock,
    cluster::gateway::{self, GatewayConfig},
    core::Mode,
    pb::{self, DeliveryMode},
    server::ServerConfig,
};

use crate::{
    harness::{open, singleton},
    nats_server::NatsCluster,
    serve_gateway,
    singleton::await_line,
    two_gateways,
};

async fn consumer_info(url: &str, mode: Mode, subscription: &str) -> (u64, u64) {
    let client = async_nats::connect(url).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let stream = js.get_stream("tinybroker").await.unwrap();
    let name = gateway::wire::names::consumer_name(mode, subscription, "");
    let info = stream.consumer_info(&name).await.unwrap();
    (info.num_ack_pending as u64, info.num_pending)
}

fn ack_free_singleton(id: &str, window: u32) -> pb::OpenSubscription {
    let mut r = singleton(id);
    r.ack_mode = pb::AckMode::None.into();
    r.max_in_flight = window;
    r
}

/// Waits (5 s at most) until JetStream counts no message of singleton `subscription`'s
/// consumer as pending its ack.
async fn acked_upstream(url: &str, subscription: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (pending, _) = consumer_info(url, Mode::Singleton, subscription).await;
        if pending == 0 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{pending} written messages still ack-pending in JetStream after 5 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// docs/cluster-internals.md#singleton-across-gateways: "the gateway acks each message when the
// stream takes it". A member that read every message leaves JetStream with nothing pending.
#[tokio::test]
async fn an_ack_free_singletons_written_messages_are_acked_upstream() {
    let (cluster, a, b) = two_gateways().await;
    let (on_a, on_b) = (a.client().await, b.client().await);
    let mut active = on_a.subscribe(ack_free_singleton("af1", 10)).await.unwrap();
    active.confirmed().await;
    for n in 0..5 {
        on_b.publish("jobs.x", &format!("m{n}")).await;
    }
    for _ in 0..5 {
        active.message().await;
    }
    acked_upstream(&cluster.client_urls()[2], "af1").await;
}

// At-most-once: what the active member got is not delivered again to the standby that is
// promoted when it leaves cleanly.
#[tokio::test]
async fn an_ack_free_singletons_promoted_member_gets_nothing_written_before() {
    let (cluster, a, b) = two_gateways().await;
    let (on_a, on_b) = (a.client().await, b.client().await);
    let mut active = on_a.subscribe(ack_free_singleton("af2", 10)).await.unwrap();
    active.confirmed().await;
    let mut standby = on_b.subscribe(ack_free_singleton("af2", 10)).await.unwrap();
    await_line(&cluster.client_urls()[2], "af2", 2).await;
    let mut got = Vec::new();
    for n in 0..5 {
        got.push(on_b.publish("jobs.x", &format!("m{n}")).await.system_id);
    }
    for &id in &got {
        assert_eq!(active.message().await.system_id, id);
    }
    // Written, so acked to JetStream: the hand-over finds nothing of them to give back.
    acked_upstream(&cluster.client_urls()[2], "af2").await;
    drop(active);
    standby.confirmed().await;
    let end = on_b.publish("jobs.x", "end").await.system_id;
    let mut again = Vec::new();
    loop {
        let m = standby.message().await;
        if m.system_id == end {
            break;
        }
        again.push((m.system_id, m.delivery_attempt));
    }
    assert!(
        again.is_empty(),
        "delivered a second time to the promoted member (at-most-once broken): {again:?} (first delivered {got:?})"
    );
}

// An ack-free singleton carries more than max_queue_messages (its consumer's max_ack_pending)
// messages to a member that reads them all.
#[tokio::test]
async fn an_ack_free_singleton_carries_more_than_its_consumers_max_ack_pending() {
    let cluster = NatsCluster::start(3).await;
    let urls = cluster.client_urls();
    let mut config = ServerConfig::default();
    config.limits.max_queue_messages = 20;
    let a = serve_gateway(
        config.clone(),
        GatewayConfig::new(&urls[0]),
        Arc::new(TokioClock::new()),
    )
    .await;
    let b = serve_gateway(
        config,
        GatewayConfig::new(&urls[1]),
        Arc::new(TokioClock::new()),
    )
    .await;
    let (on_a, on_b) = (a.client().await, b.client().await);
    let mut active = on_a.subscribe(ack_free_singleton("af3", 5)).await.unwrap();
    active.confirmed().await;
    let mut published = Vec::new();
    for n in 0..60 {
        published.push(on_b.publish("jobs.x", &format!("m{n}")).await.system_id);
    }
    let mut got = Vec::new();
    for _ in 0..60 {
        match tokio::time::timeout(Duration::from_secs(5), active.stream.message()).await {
            Ok(Ok(Some(f))) => {
                if let pb::subscription_frame::Frame::Message(m) = f.frame.unwrap() {
                    got.push(m.system_id);
                }
            }
            Ok(other) => panic!("stream ended: {other:?}"),
            Err(_) => {
                let (pending, waiting) = consumer_info(&urls[2], Mode::Singleton, "af3").await;
                panic!(
                    "stalled after {} of 60 (JetStream: ack_pending {pending}, not pulled {waiting})",
                    got.len()
                );
            }
        }
    }
    assert_eq!(got, published);
}

/// Reads `n` messages with a pause after each, returning their ids.
async fn read_slowly(member: &mut crate::harness::Member, n: usize, pause: Duration) -> Vec<u64> {
    let mut got = Vec::new();
    for _ in 0..n {
        got.push(member.message().await.system_id);
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
    }
    got
}

fn ack_free(id: &str, mode: DeliveryMode, window: u32) -> pb::OpenSubscription {
    let mut r = open(id, mode, "g", &["feed.*"]);
    r.ack_mode = pb::AckMode::None.into();
    r.max_in_flight = window;
    r
}

async fn publish_burst(client: &crate::harness::Client, n: usize) -> Vec<u64> {
    let mut ids = Vec::new();
    for i in 0..n {
        ids.push(client.publish("feed.x", &format!("{i}")).await.system_id);
    }
    ids
}

// Ack-free BROADCAST (one stream per id), windows 1 and 3, three on A and one on B, slow readers, a burst
// published while they are full: everyone gets everything, in order (no stall).
#[tokio::test]
async fn ack_free_broadcast_members_reading_slowly_get_everything_in_order() {
    let (_cluster, a, b) = two_gateways().await;
    let (on_a, on_b) = (a.client().await, b.client().await);
    let mut m1 = on_a
        .subscribe(ack_free("bc1", DeliveryMode::Broadcast, 1))
        .await
        .unwrap();
    let mut m2 = on_a
        .subscribe(ack_free("bc2", DeliveryMode::Broadcast, 1))
        .await
        .unwrap();
    let mut m3 = on_b
        .subscribe(ack_free("bc3", DeliveryMode::Broadcast, 1))
        .await
        .unwrap();
    m1.confirmed().await;
    m2.confirmed().await;
    m3.confirmed().await;
    let mut w1 = on_a
        .subscribe(ack_free("bcw3", DeliveryMode::Broadcast, 3))
        .await
        .unwrap();
    w1.confirmed().await;
    let n = 150;
    let ids = publish_burst(&on_b, n).await;
    let (g1, g2, g3, g4) = tokio::join!(
        read_slowly(&mut m1, n, Duration::from_millis(2)),
        read_slowly(&mut m2, n, Duration::ZERO),
        read_slowly(&mut m3, n, Duration::from_millis(1)),
        read_slowly(&mut w1, n, Duration::from_millis(3)),
    );
    assert_eq!(g1, ids);
    assert_eq!(g2, ids);
    assert_eq!(g3, ids);
    assert_eq!(g4, ids);
    // Second wave, after idling with full room past a pull's expiry (1 s): the scenario, not
    // a wait for an event.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let ids = publish_burst(&on_a, 20).await;
    let (g1, g2, g3, g4) = tokio::join!(
        read_slowly(&mut m1, 20, Duration::ZERO),
        read_slowly(&mut m2, 20, Duration::ZERO),
        read_slowly(&mut m3, 20, Duration::ZERO),
        read_slowly(&mut w1, 20, Duration::ZERO),
    );
    assert_eq!(
        (g1, g2, g3, &g4),
        (ids.clone(), ids.clone(), ids.clone(), &ids)
    );
}
