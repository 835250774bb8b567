//! A singleton member's acks across the loss of the NATS node leading its JetStream consumer
//! (docs/semantics.md#cluster-ack-final): a message the member acked is not delivered again,
//! to it or, after a hand-over, to its successor at another gateway. A singleton consumer's
//! ack wait is half the gateway lease (1.5 s here), shorter than the consumer's next leader
//! takes to be elected (its Raft election timeout is 4 to 9 s): the gateway keeps sending an
//! ack until JetStream confirms it, for up to `--nats-ack-wait`, and hands over only once its
//! acks were confirmed.

use std::{sync::Arc, time::Duration};

use tinybroker::{
    clock::TokioClock,
    cluster::gateway::{GatewayConfig, wire::names},
    core::Mode,
    pb,
    server::ServerConfig,
};

use crate::{
    harness::{Member, TestServer, singleton},
    nats_server::NatsCluster,
    node_faults::lead_on,
};

const ID: &str = "acked";
/// Longest any one event of these tests may take (an election, an ack wait).
const PATIENCE: Duration = Duration::from_secs(60);

async fn gateway(url: &str) -> TestServer {
    let clock: Arc<dyn tinybroker::clock::Clock> = Arc::new(TokioClock::new());
    crate::serve_gateway(ServerConfig::default(), GatewayConfig::new(url), clock).await
}

/// The stream's and the singleton consumer's leaders on `node`, the coordination bucket's on
/// `bucket` (its loss would end every singleton member: docs/semantics.md#cluster-leases).
async fn leaders(cluster: &NatsCluster, node: usize, bucket: usize) {
    let admin = async_nats::connect(cluster.client_url(bucket))
        .await
        .unwrap();
    let js = async_nats::jetstream::new(admin.clone());
    for (stream, target) in [("tinybroker", node), ("KV_tinybroker-coordination", bucket)] {
        let js = js.clone();
        lead_on(
            &admin,
            &format!("$JS.API.STREAM.LEADER.STEPDOWN.{stream}"),
            target,
            || {
                let js = js.clone();
                async move {
                    let mut s = js.get_stream(stream).await.ok()?;
                    s.info().await.ok()?.cluster.as_ref()?.leader.clone()
                }
            },
        )
        .await;
    }
    let consumer = names::consumer_name(Mode::Singleton, ID, "");
    lead_on(
        &admin,
        &format!("$JS.API.CONSUMER.LEADER.STEPDOWN.tinybroker.{consumer}"),
        node,
        || {
            let (js, consumer) = (js.clone(), consumer.clone());
            async move {
                let stream = js.get_stream("tinybroker").await.ok()?;
                let mut consumer: async_nats::jetstream::consumer::PullConsumer =
                    stream.get_consumer(&consumer).await.ok()?;
                consumer.info().await.ok()?.cluster.as_ref()?.leader.clone()
            }
        },
    )
    .await;
}

/// The singleton consumer's messages delivered and not acked, as JetStream counts them.
async fn ack_pending(url: &str) -> Option<u64> {
    let client = async_nats::connect(url).await.ok()?;
    let js = async_nats::jetstream::new(client);
    let stream = js.get_stream("tinybroker").await.ok()?;
    let name = names::consumer_name(Mode::Singleton, ID, "");
    let info = stream.consumer_info(&name).await.ok()?;
    Some(info.num_ack_pending as u64)
}

/// Reads `member`'s messages, acking each, until `last` came and JetStream counts nothing
/// pending; returns (payload, attempt) of each.
async fn read_until_settled(
    member: &mut Member,
    at: &crate::harness::Client,
    last: &[u8],
    url: &str,
) -> Vec<(String, u32)> {
    let mut seen = Vec::new();
    tokio::time::timeout(PATIENCE, async {
        let mut last_came = false;
        loop {
            if last_came && ack_pending(url).await == Some(0) {
                return;
            }
            let next = tokio::time::timeout(Duration::from_millis(200), member.message()).await;
            if let Ok(m) = next {
                last_came |= m.payload.as_ref() == last;
                seen.push((
                    String::from_utf8_lossy(&m.payload).into_owned(),
                    m.delivery_attempt,
                ));
                at.ack(ID, member.member_id, m.system_id).await.unwrap();
            }
        }
    })
    .await
    .expect("the member's messages did not settle in JetStream");
    seen
}

// With and without a hand-over, the NATS node leading the stream and the consumer (neither
// gateway's) is killed while the leader holds four messages; the leader acks them during the
// election. None of them is delivered again: to the leader, or to its successor at the other
// gateway (an adversarial review saw all four again, attempt 2).
#[tokio::test]
async fn acks_made_while_the_consumers_leader_node_is_down_are_final() {
    for hand_over in [false, true] {
        let mut cluster = NatsCluster::start(3).await;
        let urls = cluster.client_urls();
        let (a, b) = (gateway(&urls[0]).await, gateway(&urls[1]).await);
        let (on_a, on_b) = (a.client().await, b.client().await);
        let window = |id: &str| pb::OpenSubscription {
            max_in_flight: 4,
            ..singleton(id)
        };
        let mut leader = on_a.subscribe(window(ID)).await.unwrap();
        leader.confirmed().await;
        let mut standby = on_b.subscribe(window(ID)).await.unwrap();
        leaders(&cluster, 2, 0).await;
        for i in 0..4 {
            on_b.publish("jobs.a", &format!("m{i}")).await;
        }
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(leader.message().await);
        }
        let request = hand_over.then(|| {
            let mut client = on_b.0.clone();
            tokio::spawn(async move {
                client
                    .hand_over(pb::HandOverRequest {
                        subscription_id: ID.into(),
                    })
                    .await
            })
        });
        cluster.kill(2);
        for m in &held {
            on_a.ack(ID, leader.member_id, m.system_id).await.unwrap();
        }
        let (member, at) = if let Some(request) = request {
            tokio::time::timeout(PATIENCE, request)
                .await
                .expect("the hand-over was not answered")
                .unwrap()
                .unwrap();
            standby.confirmed().await;
            (&mut standby, &on_b)
        } else {
            (&mut leader, &on_a)
        };
        on_b.publish("jobs.a", "m4").await;
        let seen = read_until_settled(member, at, b"m4", &urls[0]).await;
        assert_eq!(
            seen,
            [("m4".to_string(), 1)],
            "acked messages delivered again (hand-over: {hand_over})"
        );
    }
}

// docs/semantics.md#cluster-lease-lapse: gateways with `--gateway-lapse-patience 10s`. The NATS
// node leading the coordination bucket (neither gateway's) is killed under the default 3 s
// lease, shorter than JetStream takes to elect the bucket's next leader (4 to 9 s), so the
// gateways' leases lapse: the leader's
// gateway ends its leadership watch (UNAVAILABLE), which is how the test knows. The leader
// (window 2) acks one message it holds *during* the lapse and keeps the other across it, and
// messages are published all along (the stream's leader is not lost). Once the gateways renew
// (the same leases: no new incarnation), the leader is still the leader with its epoch: it gets
// every message published meanwhile, in order, once each; the two it held never come again,
// and JetStream counts nothing pending once it acked everything. Before, every gateway ended
// its singleton members with UNAVAILABLE at the lapse (as it still does with the default
// patience, 0).
#[tokio::test]
async fn a_killed_node_leading_the_coordination_bucket_ends_no_singleton_member_with_a_lapse_patience()
 {
    let mut cluster = NatsCluster::start(3).await;
    let urls = cluster.client_urls();
    let patient = |url: &str| {
        let clock: Arc<dyn tinybroker::clock::Clock> = Arc::new(TokioClock::new());
        let config = GatewayConfig {
            lapse_patience: Duration::from_secs(10),
            ..GatewayConfig::new(url)
        };
        crate::serve_gateway(ServerConfig::default(), config, clock)
    };
    let (a, b) = (patient(&urls[0]).await, patient(&urls[1]).await);
    let (on_a, on_b) = (a.client().await, b.client().await);
    let mut request = singleton(ID);
    request.max_in_flight = 2;
    let mut leader = on_a.subscribe(request).await.unwrap();
    let c = leader.confirmed().await;
    let mut standby = on_b.subscribe(singleton(ID)).await.unwrap();
    leaders(&cluster, 0, 2).await;
    on_b.publish("jobs.a", "m0").await;
    on_b.publish("jobs.a", "m1").await;
    let (m0, m1) = (leader.message().await, leader.message().await);
    assert_eq!(
        (m0.payload.as_ref(), m1.payload.as_ref()),
        (&b"m0"[..], &b"m1"[..])
    );
    let mut watch = on_a
        .0
        .clone()
        .watch_leadership(pb::WatchLeadershipRequest {
            subscription_id: ID.into(),
        })
        .await
        .unwrap()
        .into_inner();
    let watcher = async_nats::connect(cluster.client_url(0)).await.unwrap();
    let kv = async_nats::jetstream::new(watcher)
        .get_key_value("tinybroker-coordination")
        .await
        .unwrap();
    use tokio_stream::StreamExt;
    let mut keys = kv.keys().await.unwrap();
    let mut held_leases = std::collections::BTreeSet::new();
    while let Some(Ok(key)) = keys.next().await {
        if key.starts_with("lease.") {
            held_leases.insert(key);
        }
    }
    assert_eq!(held_leases.len(), 2, "{held_leases:?}");
    let mut leases = kv.watch("lease.*").await.unwrap();
    let killed = tokio::time::Instant::now();
    cluster.kill(2);
    let mut renewed = std::collections::BTreeSet::new();
    let mut published = Vec::new();
    let mut lapsed = None;
    let mut tick = tokio::time::interval(Duration::from_millis(300));
    tokio::time::timeout(PATIENCE, async {
        while renewed.len() < 2 {
            tokio::select! {
                entry = leases.next() => {
                    if let Some(Ok(entry)) = entry
                        && entry.operation == async_nats::jetstream::kv::Operation::Put
                    {
                        assert!(lapsed.is_some(), "a lease renewed {:?} after the kill, before the lapse", killed.elapsed());
                        assert!(held_leases.contains(&entry.key), "a new incarnation's lease {}", entry.key);
                        renewed.insert(entry.key);
                    }
                }
                // The lapse ends the gateway's watches: the leader acks m0 then.
                frame = watch.message(), if lapsed.is_none() => {
                    match frame {
                        Ok(Some(f)) => assert_eq!((f.active_member_id, f.epoch), (c.member_id, c.epoch)),
                        Err(status) => {
                            assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
                            lapsed = Some(killed.elapsed());
                            on_a.ack(ID, leader.member_id, m0.system_id).await.unwrap();
                        }
                        Ok(None) => panic!("the watch ended without a status"),
                    }
                }
                // Published through the other gateway, all through the election.
                _ = tick.tick() => {
                    let payload = format!("p{}", published.len() + 1);
                    on_b.publish("jobs.a", &payload).await;
                    published.push(payload);
                }
            }
        }
    })
    .await
    .expect("no lease renewed after the kill");
    eprintln!(
        "lapsed {lapsed:?} and both leases renewed {:?} after the kill; {} published meanwhile",
        killed.elapsed(),
        published.len()
    );
    on_a.ack(ID, leader.member_id, m1.system_id).await.unwrap();
    // Every message published meanwhile reaches the leader, in order, once each.
    let mut got = Vec::new();
    tokio::time::timeout(PATIENCE, async {
        while got.len() < published.len() {
            let m = leader.message().await;
            assert_eq!(m.epoch, c.epoch, "the leader's epoch");
            got.push(String::from_utf8_lossy(&m.payload).into_owned());
            on_a.ack(ID, leader.member_id, m.system_id).await.unwrap();
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the leader got {got:?} of {published:?}"));
    assert_eq!(got, published, "in order, once each, m0 and m1 not again");
    let info = on_b.describe(ID).await.unwrap();
    assert_eq!((info.active_member_id, info.epoch), (c.member_id, c.epoch));
    // Every ack applied by JetStream, the one made during the lapse included.
    tokio::time::timeout(PATIENCE, async {
        while ack_pending(&urls[0]).await != Some(0) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("JetStream still counts acks pending");
    // Nothing more: to the leader (m0, m1 again) or to the standby (silent: it asked for no
    // standby notice).
    if let Ok(frame) = tokio::time::timeout(Duration::from_millis(500), leader.frame()).await {
        panic!("the leader got {frame:?}");
    }
    if let Ok(frame) = tokio::time::timeout(Duration::from_millis(300), standby.frame()).await {
        panic!("the standby got {frame:?}");
    }
}
