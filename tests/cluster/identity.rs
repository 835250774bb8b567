//! Ids never fall (docs/semantics.md#restart-identity): a cluster's epochs and `system_id`s are
//! above every one handed out before it, by an earlier cluster or by an embedded broker, also
//! once its stream and coordination bucket are made again; and an embedded broker started
//! after a cluster hands out ids above the cluster's. A store fenced by epoch would otherwise
//! refuse every write of every later leader.

use std::{sync::Arc, time::Duration};

use tinybroker::{
    cluster::gateway::GatewayConfig,
    server::{Server, ServerConfig},
};

use crate::{
    gateway,
    harness::{Client, TestServer, singleton, within},
    nats_server::NatsCluster,
};

/// How far ahead of the time member ids may run here: a route's 2^24 µs (16.8 s) for each of
/// the two gateways started over one bucket within that time, and more.
const MEMBER_ID_LEAD: Duration = Duration::from_secs(40);

/// What a deployment handed out: a leader's confirmation, its successor's, and a publish.
#[derive(Debug, Clone, Copy)]
struct Handed {
    epoch: u64,
    next_epoch: u64,
    system_id: u64,
    /// The two members' ids, the later joiner's last.
    members: (u64, u64),
}

/// A singleton leader, a failover to its standby, and a publish the successor receives.
async fn hand_out(client: &Client, id: &str) -> Handed {
    let mut leader = client.subscribe(singleton(id)).await.unwrap();
    let first = leader.confirmed().await;
    let mut standby = client.subscribe(singleton(id)).await.unwrap();
    // The standby is in the line (a place every gateway sees) before the leader leaves.
    within(async {
        while client.describe(id).await.unwrap().members.len() < 2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    drop(leader);
    let next = standby.confirmed().await;
    assert!(next.epoch > first.epoch, "{next:?} after {first:?}");
    let published = client.publish("jobs.run", "once").await;
    let got = standby.message().await;
    assert_eq!(got.system_id, published.system_id);
    assert_eq!(got.epoch, next.epoch);
    Handed {
        epoch: first.epoch,
        next_epoch: next.epoch,
        system_id: published.system_id,
        members: (first.member_id, next.member_id),
    }
}

fn assert_above(later: Handed, earlier: Handed, what: &str) {
    assert_epochs_and_ids_above(later, earlier, what);
    assert!(
        later.members.0 > earlier.members.1 && later.members.1 > later.members.0,
        "{what}: member ids {:?} are not above the earlier {:?}",
        later.members,
        earlier.members
    );
}

/// Epochs and system ids above the earlier ones (member ids not checked).
fn assert_epochs_and_ids_above(later: Handed, earlier: Handed, what: &str) {
    assert!(
        later.epoch > earlier.next_epoch,
        "{what}: epoch {} is not above the earlier {} ({later:?} after {earlier:?})",
        later.epoch,
        earlier.next_epoch
    );
    assert!(
        later.system_id > earlier.system_id,
        "{what}: system_id {} is not above the earlier {} ({later:?} after {earlier:?})",
        later.system_id,
        earlier.system_id
    );
}

async fn embedded() -> TestServer {
    TestServer::run(Server::new(ServerConfig::default())).await
}

/// An embedded broker started `later` than now, by its wall clock.
async fn embedded_later(later: Duration) -> TestServer {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let config = ServerConfig {
        clock: Arc::new(tinybroker::clock::VirtualClock::new(
            (now + later).as_millis() as u64,
        )),
        ..ServerConfig::default()
    };
    TestServer::run(Server::new(config)).await
}

async fn delete_stream_and_bucket(url: &str) {
    let js = async_nats::jetstream::new(async_nats::connect(url).await.unwrap());
    js.delete_stream("tinybroker").await.unwrap();
    js.delete_stream("KV_tinybroker-coordination")
        .await
        .unwrap();
}

// Embedded, then a new cluster, then the same cluster with its stream and bucket made again,
// then a whole new cluster, then embedded again: every step's epochs and system ids are above
// the step before's.
#[tokio::test]
async fn ids_stay_above_every_earlier_one_across_deployments_and_new_clusters() {
    let server = embedded().await;
    let on_embedded = hand_out(&server.client().await, "identity1").await;
    server.stop().await.unwrap();

    let cluster = NatsCluster::start(1).await;
    let url = cluster.client_urls()[0].clone();
    let first = gateway(&url).await;
    let on_cluster = hand_out(&first.client().await, "identity2").await;
    assert_above(
        on_cluster,
        on_embedded,
        "a new cluster after an embedded broker",
    );
    first.stop().await.unwrap();

    delete_stream_and_bucket(&url).await;
    let again = gateway(&url).await;
    let on_new_stream = hand_out(&again.client().await, "identity3").await;
    // Member ids not checked: a gateway started within 2^24 µs of one of the bucket it
    // replaced may share its route (docs/semantics.md#cluster-restart-identity).
    assert_epochs_and_ids_above(
        on_new_stream,
        on_cluster,
        "the stream and bucket made again",
    );
    again.stop().await.unwrap();
    drop(cluster);

    let rebuilt = NatsCluster::start(3).await;
    let gateway_b = gateway(&rebuilt.client_urls()[1]).await;
    let on_rebuilt = hand_out(&gateway_b.client().await, "identity4").await;
    assert_epochs_and_ids_above(on_rebuilt, on_new_stream, "a whole new cluster");
    gateway_b.stop().await.unwrap();

    let server = embedded().await;
    let back = hand_out(&server.client().await, "identity5").await;
    // Member ids of a gateway's route run up to 2^24 µs (16.8 s) ahead of its start, so they
    // are checked below with an embedded broker started that much later.
    assert_epochs_and_ids_above(back, on_rebuilt, "an embedded broker after a cluster");
    server.stop().await.unwrap();

    // Back to the same cluster, its stream and bucket as they were: a gateway raises the
    // epoch floor at start, so its epochs are above the embedded broker's that ran meanwhile,
    // and claims the next member-id route. (Its system ids go on from the stream's sequence:
    // docs/semantics.md says so.)
    let gateway_c = gateway(&rebuilt.client_urls()[2]).await;
    let again = hand_out(&gateway_c.client().await, "identity6").await;
    assert!(
        again.members.0 > on_rebuilt.members.1,
        "member ids rise across gateway starts: {again:?} after {on_rebuilt:?}"
    );
    assert!(
        again.epoch > back.next_epoch,
        "back to a cluster after an embedded broker: epoch {} is not above {} ({again:?} after {back:?})",
        again.epoch,
        back.next_epoch
    );
    gateway_c.stop().await.unwrap();

    let server = embedded_later(MEMBER_ID_LEAD).await;
    let last = hand_out(&server.client().await, "identity7").await;
    assert_above(
        last,
        again,
        "an embedded broker started 40 s after two gateways",
    );
}

// The floor is logged at start, where an operator compares runs: the stream's and the
// bucket's first ids, and that they come from the wall clock at their creation.
#[tokio::test]
async fn a_gateway_logs_where_its_ids_start() {
    let before = wall_micros();
    let cluster = NatsCluster::start(1).await;
    let url = cluster.client_urls()[0].clone();
    let (mut gateway, _) = crate::binary::serve(&["--nats", &url]).await;
    let line = gateway.line_with("system ids start above").await;
    // Each number stands in the message and again as a field.
    let floors: std::collections::BTreeSet<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter(|n| n.len() >= 15)
        .map(|n| n.parse().unwrap())
        .collect();
    assert_eq!(floors.len(), 2, "the stream's and the bucket's: {line}");
    for floor in floors {
        assert!(
            floor >= before && floor <= wall_micros(),
            "{floor} is not the creation time ({before} or later): {line}"
        );
    }
}

fn wall_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

// Gateways started together on a fresh JetStream all start, on one node and on three, with
// the replicas chosen or given: each asks to create the stream and the bucket with its own
// first id, and every create but the first binds what the first made. Eight start at once in
// this process, so their first looks all find no stream and their creates meet. Before, one
// create that came after the first gateway turned on atomic batches was refused, "stream
// name already in use with a different configuration (10058)", and its gateway exited (one
// pair of gateway processes in ten).
#[tokio::test]
async fn gateways_started_together_on_a_fresh_jetstream_all_start() {
    use tinybroker::{clock::TokioClock, cluster::gateway::Gateway, core::Limits};
    for (nodes, replicas) in [(1, 0), (1, 1), (3, 0), (3, 3)] {
        let cluster = NatsCluster::start(nodes).await;
        let urls = cluster.client_urls().join(",");
        let stream = format!("together{replicas}");
        let starts = (0..8).map(|_| {
            let config = GatewayConfig {
                stream: stream.clone(),
                replicas,
                max_bytes: 16 << 20,
                ..GatewayConfig::new(urls.clone())
            };
            Gateway::connect(config, Limits::default(), Arc::new(TokioClock::new()))
        });
        let started = within_start(futures_join_all(starts)).await;
        let mut failed = Vec::new();
        for (i, gateway) in started.into_iter().enumerate() {
            match gateway {
                Ok(gateway) => gateway.close(Duration::from_secs(2)).await,
                Err(error) => failed.push(format!("gateway {i}: {error}")),
            }
        }
        assert!(
            failed.is_empty(),
            "{nodes} nodes, replicas {replicas}: {failed:#?}"
        );
    }
}

/// Every future, polled together in this task, their outputs in order.
async fn futures_join_all<F: std::future::Future>(
    futures: impl Iterator<Item = F>,
) -> Vec<F::Output> {
    let mut pending: Vec<_> = futures.map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut done = true;
        for (future, output) in pending.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    std::task::Poll::Ready(out) => *output = Some(out),
                    std::task::Poll::Pending => done = false,
                }
            }
        }
        if done {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    outputs.into_iter().map(Option::unwrap).collect()
}

/// A gateway's start is bounded by its own patience (30 s for the bucket); twice that here.
async fn within_start<F: std::future::Future>(future: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(60), future)
        .await
        .expect("the gateways started within 60 s")
}

/// Creates stream `name` taking `subjects` on `url`, then runs `serve --nats url`, which must
/// refuse to start: its log, and how long it took.
async fn refused_next_to(url: &str, name: &str, subjects: &str) -> (String, Duration) {
    let js = async_nats::jetstream::new(async_nats::connect(url).await.unwrap());
    js.create_stream(async_nats::jetstream::stream::Config {
        name: name.to_string(),
        subjects: vec![subjects.to_string()],
        ..Default::default()
    })
    .await
    .unwrap();
    let started = std::time::Instant::now();
    let out = crate::binary::run_client_within(
        ["serve", "--listen", "127.0.0.1:0", "--nats", url]
            .map(String::from)
            .to_vec(),
        Duration::from_secs(30),
    )
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "{stderr}");
    (stderr, started.elapsed())
}

// A stream that exists with subjects a gateway cannot use is still refused at start, naming
// what it has and what a gateway needs.
#[tokio::test]
async fn a_gateway_refuses_an_existing_stream_that_does_not_take_its_subjects() {
    let cluster = NatsCluster::start(1).await;
    let (stderr, _) = refused_next_to(&cluster.client_urls()[0], "tinybroker", "elsewhere.>").await;
    assert!(
        stderr.contains("does not take tinybroker.>")
            && stderr.contains("its subjects: elsewhere.>"),
        "{stderr}"
    );
}

// A stream that takes the gateway's subjects under another name is refused at once (a create
// that overlaps would be refused for ever), naming that stream.
#[tokio::test]
async fn a_gateway_refuses_at_once_a_stream_whose_subjects_another_stream_takes() {
    let cluster = NatsCluster::start(1).await;
    let (stderr, took) = refused_next_to(&cluster.client_urls()[0], "other", "tinybroker.>").await;
    assert!(
        stderr.contains("overlap stream other") && stderr.contains("--nats-stream"),
        "{stderr}"
    );
    // Not tried again for the start's patience (30 s) as a refusal that may pass.
    assert!(took < Duration::from_secs(15), "refused after {took:?}");
}
