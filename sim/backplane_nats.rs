//! The backplane contract (`backplane_contract.rs`, every check) against `NatsBackplane` over a
//! real three-node JetStream cluster, each check on a fresh bucket; and the one fault the seam
//! promises something about: a watch whose server dies resumes after its last revision.

use std::time::Duration;

use bytes::Bytes;
use tinybroker::cluster::{
    backplane::{Backplane, Entry, KvError, Watch},
    nats::{NatsBackplane, NatsConfig},
};

use crate::{backplane_contract, nats_harness::runtime, nats_server::NatsCluster};

/// Bound on one contract check (each is a handful of round trips on loopback).
const CHECK: Duration = Duration::from_secs(30);
/// Bound on an event that waits for a reconnect or a leader election after a node's crash.
const FAILOVER: Duration = Duration::from_secs(30);

async fn bucket(urls: Vec<String>, bucket: &str) -> NatsBackplane {
    let config = NatsConfig {
        bucket: bucket.to_string(),
        ..NatsConfig::new(urls)
    };
    NatsBackplane::connect(&config)
        .await
        .unwrap_or_else(|e| panic!("bucket {bucket}: {e}"))
}

/// The watch's next entry. The seam lets a watch report losing contact (an `Unavailable` item,
/// e.g. a missed heartbeat while a node dies) and go on; entries must still come in order.
async fn next(w: &mut Watch, within: Duration) -> Entry {
    let entry = async {
        loop {
            match std::future::poll_fn(|cx| w.as_mut().poll_next(cx)).await {
                Some(Ok(entry)) => return entry,
                Some(Err(KvError::Unavailable(_))) => {}
                Some(Err(e)) => panic!("watch failed: {e}"),
                None => panic!("watch ended"),
            }
        }
    };
    tokio::time::timeout(within, entry)
        .await
        .unwrap_or_else(|_| panic!("watch delivered nothing within {within:?}"))
}

#[test]
fn cluster_backplane_nats_keeps_every_contract_check_on_a_three_node_cluster() {
    runtime().block_on(async {
        let cluster = NatsCluster::start(3).await;
        macro_rules! check {
            ($name:ident) => {
                let kv = bucket(cluster.client_urls(), stringify!($name)).await;
                assert_eq!(
                    kv.replicas(),
                    3,
                    "the default is min(3, cluster size) replicas"
                );
                tokio::time::timeout(CHECK, backplane_contract::$name(&kv))
                    .await
                    .unwrap_or_else(|_| panic!("{} took over {CHECK:?}", stringify!($name)));
            };
        }
        crate::every_contract_check!(check);
    });
}

/// Waits until `writer` can write again after a node's crash: writes need the stream's leader,
/// and if it was on the dead node another is elected first.
async fn await_writable(writer: &NatsBackplane) {
    let ready = async {
        loop {
            match writer.create("probe", Bytes::new()).await {
                Ok(_) | Err(KvError::Exists { .. }) => break,
                Err(_) => {}
            }
        }
    };
    tokio::time::timeout(FAILOVER, ready)
        .await
        .expect("no write accepted within 30 s of a node's crash");
}

/// A write by a test's only writer while the cluster settles after a crash (a stream leader may
/// be moving: JetStream then answers "no stream found" or times out). An `Unavailable` attempt
/// may have taken effect, so when a retry finds the key already moved on, the key's latest
/// revision is this write's (nobody else writes it).
async fn settled<F, Fut>(writer: &NatsBackplane, key: &str, mut write: F) -> u64
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<u64, KvError>>,
{
    let attempts = async {
        let mut retried = false;
        loop {
            match write().await {
                Ok(revision) => return revision,
                Err(e) if e.is_conflict() && retried => {
                    let latest = writer.get(key).await;
                    if let Ok(Some(entry)) = latest {
                        return entry.revision;
                    }
                }
                Err(KvError::Unavailable(_)) => retried = true,
                Err(e) => panic!("write of {key} refused: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(FAILOVER, attempts)
        .await
        .unwrap_or_else(|_| panic!("no write of {key} accepted within 30 s of a node's crash"))
}

/// The writes both watch tests make while node 0 is down: k.1 updated over `r1`, k.2 created,
/// k.1 deleted; their revisions.
async fn write_while_node_0_is_down(writer: &NatsBackplane, r1: u64) -> (u64, u64, u64) {
    await_writable(writer).await;
    let r2 = settled(writer, "k.1", || writer.update("k.1", b("2"), r1)).await;
    let r3 = settled(writer, "k.2", || writer.create("k.2", b("1"))).await;
    let r4 = settled(writer, "k.1", || writer.delete("k.1", r2)).await;
    (r2, r3, r4)
}

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

// Backplane module doc: "a client cut off from the store sees its watch stop; when it reconnects
// the watch resumes after the last revision it delivered". The watcher may use node 0 only
// (discovered servers ignored); node 0 is killed while a writer on node 1 changes keys, then
// restarted.
#[test]
fn cluster_backplane_nats_watch_resumes_after_its_server_restarts() {
    runtime().block_on(async {
        let mut cluster = NatsCluster::start(3).await;
        let writer = bucket(vec![cluster.client_url(1)], "resume").await;
        let only_node_0 = async_nats::ConnectOptions::new()
            .ignore_discovered_servers()
            .connect(cluster.client_url(0))
            .await
            .unwrap();
        let config = NatsConfig {
            bucket: "resume".to_string(),
            ..NatsConfig::new(Vec::<String>::new())
        };
        let watcher = NatsBackplane::open(only_node_0, &config).await.unwrap();

        let mut w = watcher.watch("k.").await.unwrap();
        let r1 = writer.create("k.1", b("1")).await.unwrap();
        assert_eq!(next(&mut w, CHECK).await.revision, r1);

        cluster.kill(0);
        let (r2, r3, r4) = write_while_node_0_is_down(&writer, r1).await;
        let cut_off = watcher.get("k.2").await;
        assert!(
            matches!(cut_off, Err(KvError::Unavailable(_))),
            "the watcher has no server: {cut_off:?}"
        );

        cluster.restart(0).await;
        // The watch resumes after r1, in revision order, with every key's latest change. r2
        // (overwritten by r4 while the watcher was away) may come too: the restarted node can
        // serve it while it catches up, before the overwrite reaches it (seen in CI), as in the
        // fail-over test below.
        let mut seen = vec![];
        while seen.last() != Some(&r4) {
            let e = next(&mut w, FAILOVER).await;
            let expected = match e.revision {
                r if r == r2 => Some(("k.1", Some(b("2")))),
                r if r == r3 => Some(("k.2", Some(b("1")))),
                r if r == r4 => Some(("k.1", None)),
                _ => None,
            };
            assert!(
                expected == Some((e.key.as_str(), e.value.clone()))
                    && seen.last().is_none_or(|l| *l < e.revision),
                "after {seen:?} the watch delivered {e}"
            );
            seen.push(e.revision);
        }
        assert!(seen.contains(&r3), "k.2's creation was skipped: {seen:?}");

        // The watcher's own operations work again.
        assert_eq!(watcher.get("k.2").await.unwrap().unwrap().revision, r3);
        let r5 = watcher.update("k.2", b("2"), r3).await.unwrap();
        assert_eq!(next(&mut w, CHECK).await.revision, r5);
    });
}

// The same promise when the client fails over to another node at once (it learned the others
// from the cluster): whatever it replays after r1 is in revision order, without gaps other than
// revisions overwritten meanwhile, and ends with every key's latest.
#[test]
fn cluster_backplane_nats_watch_fails_over_when_its_server_is_killed() {
    runtime().block_on(async {
        let mut cluster = NatsCluster::start(3).await;
        let writer = bucket(vec![cluster.client_url(1)], "failover").await;
        let watcher = bucket(vec![cluster.client_url(0)], "failover").await;

        let mut w = watcher.watch("k.").await.unwrap();
        let r1 = writer.create("k.1", b("1")).await.unwrap();
        assert_eq!(next(&mut w, CHECK).await.revision, r1);

        cluster.kill(0);
        let (r2, r3, r4) = write_while_node_0_is_down(&writer, r1).await;

        let mut seen = vec![];
        while seen.last() != Some(&r4) {
            let e = next(&mut w, FAILOVER).await;
            assert!(
                [r2, r3, r4].contains(&e.revision) && seen.last().is_none_or(|l| *l < e.revision),
                "after {seen:?} the watch delivered {e}"
            );
            seen.push(e.revision);
        }
        assert!(seen.contains(&r3), "k.2's creation was skipped: {seen:?}");
    });
}

// Backplane module doc: "a deletion may expire". Delete markers carry a TTL; once it runs out
// the key is as if never written, compare-and-sets on it report revision 0, and the revisions
// that follow are still above every earlier one. A bucket created without per-message TTL (an
// earlier gateway's) gets it turned on when opened with a marker TTL.
#[test]
fn cluster_backplane_nats_delete_markers_expire_and_revisions_still_rise() {
    runtime().block_on(async {
        let cluster = NatsCluster::start(3).await;
        let config = |ttl| NatsConfig {
            bucket: "markers".to_string(),
            marker_ttl: ttl,
            ..NatsConfig::new(cluster.client_urls())
        };
        let old = NatsBackplane::connect(&config(None)).await.unwrap();
        assert!(!old.markers_expire());
        let kept = old.create("sub.kept", b("1")).await.unwrap();
        let kept = old.delete("sub.kept", kept).await.unwrap();

        let kv = NatsBackplane::connect(&config(Some(Duration::from_secs(1))))
            .await
            .unwrap();
        assert!(kv.markers_expire(), "per-message TTL turned on");
        // A lease's deletion is how gateways learn another is dead: it never expires.
        let lease = kv.create("lease.7", b("{}")).await.unwrap();
        let lease = kv.delete("lease.7", lease).await.unwrap();
        let r1 = kv.create("sub.x", b("1")).await.unwrap();
        let r2 = kv.delete("sub.x", r1).await.unwrap();
        assert_eq!(
            kv.get("sub.x")
                .await
                .unwrap()
                .map(|e| (e.value, e.revision)),
            Some((None, r2)),
            "the deletion is there until it expires"
        );
        await_expired(&kv, "sub.x").await;
        assert_eq!(
            kv.update("sub.x", b("2"), r1).await,
            Err(KvError::WrongRevision {
                expected: r1,
                current: 0
            })
        );
        assert_eq!(
            kv.delete("sub.x", r2).await,
            Err(KvError::WrongRevision {
                expected: r2,
                current: 0
            })
        );
        let r3 = kv.create("sub.x", b("3")).await.unwrap();
        assert!(r3 > r2, "revisions rise after an expiry: {r3} after {r2}");
        // A marker written before TTLs were on carries none: it stays; so does the lease's.
        assert_eq!(
            kv.get("sub.kept").await.unwrap().map(|e| e.revision),
            Some(kept)
        );
        assert_eq!(
            kv.get("lease.7")
                .await
                .unwrap()
                .map(|e| (e.value, e.revision)),
            Some((None, lease))
        );
    });
}

// Backplane module doc: "A deletion may expire ... The revision counter is not affected", and
// README: "the stream's sequence outlives its messages". Here every message of the bucket is
// gone (its only key deleted, the marker expired) and every server is killed and started
// again: a key created after must still get a revision above every earlier one, or epochs
// would repeat.
#[test]
fn cluster_backplane_nats_revisions_rise_after_every_marker_expired_and_every_server_restarted() {
    // A single server keeps the sequence in its file store alone; a cluster also in its log.
    for nodes in [1, 3] {
        revisions_rise_after_the_emptied_bucket_restarts(nodes);
    }
}

fn revisions_rise_after_the_emptied_bucket_restarts(nodes: usize) {
    runtime().block_on(async {
        let mut cluster = NatsCluster::start(nodes).await;
        let config = NatsConfig {
            bucket: "emptied".to_string(),
            marker_ttl: Some(Duration::from_secs(1)),
            ..NatsConfig::new(cluster.client_urls())
        };
        let kv = NatsBackplane::connect(&config).await.unwrap();
        assert!(kv.markers_expire());
        // A bucket just created may not take writes at once ("no stream found"): retried.
        let r1 = settled(&kv, "sub.x", || kv.create("sub.x", b("1"))).await;
        let r2 = settled(&kv, "sub.x", || kv.delete("sub.x", r1)).await;
        await_expired(&kv, "sub.x").await;
        drop(kv);
        let state = stream_state(&cluster, "KV_emptied").await;
        assert_eq!(
            (state.messages, state.last_sequence),
            (0, r2),
            "the bucket is empty, its sequence at the marker's"
        );

        for node in 0..cluster.len() {
            cluster.kill(node);
        }
        cluster.restart_all().await;

        let kv = NatsBackplane::connect(&config).await.unwrap();
        let state = stream_state(&cluster, "KV_emptied").await;
        assert_eq!(
            (state.messages, state.last_sequence),
            (0, r2),
            "after the restart"
        );
        let r3 = settled(&kv, "sub.y", || kv.create("sub.y", b("1"))).await;
        assert!(
            r3 > r2,
            "a revision went back after a restart of the emptied bucket: {r3} after {r2}"
        );
        let r4 = settled(&kv, "sub.x", || kv.create("sub.x", b("2"))).await;
        assert!(r4 > r3, "{r4} after {r3}");
    });
}

/// The stream's state, as its leader reports it.
async fn stream_state(cluster: &NatsCluster, stream: &str) -> async_nats::jetstream::stream::State {
    let urls: Vec<async_nats::ServerAddr> = cluster
        .client_urls()
        .iter()
        .map(|u| u.parse().unwrap())
        .collect();
    let client = async_nats::connect(urls).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let info = async {
        loop {
            if let Ok(mut s) = js.get_stream(stream).await
                && let Ok(info) = s.info().await
            {
                return info.state.clone();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(FAILOVER, info)
        .await
        .unwrap_or_else(|_| panic!("no info on stream {stream} within {FAILOVER:?}"))
}

/// Awaits the expiry of `key`'s delete marker (a 1 s TTL): JetStream removes it with no event a
/// watch or a client could await, so the key is read until it is gone, within 15 s.
async fn await_expired(kv: &NatsBackplane, key: &str) {
    let expired = async {
        while kv.get(key).await.unwrap().is_some() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(15), expired)
        .await
        .expect("the delete marker did not expire within 15 s of a 1 s TTL");
}
