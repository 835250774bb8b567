//! The nats-server test harness (`tests/support/nats.rs`) itself: the cluster it starts is a real
//! replicated JetStream that keeps serving through a node's crash and takes the node back.

use std::time::Duration;

use async_nats::jetstream::{self, kv};

use crate::nats_server::NatsCluster;

/// Bound on an event the cluster must produce (a leader election after a kill takes seconds).
const EVENT: Duration = Duration::from_secs(30);

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

#[test]
fn nats_harness_three_node_cluster_replicates_and_survives_a_node_restart() {
    runtime().block_on(async {
        let mut cluster = NatsCluster::start(3).await;
        assert_eq!(cluster.client_urls().len(), 3);
        let client = async_nats::connect(cluster.client_urls()).await.unwrap();
        let js = jetstream::new(client);
        let store = js
            .create_key_value(kv::Config {
                bucket: "harness".into(),
                num_replicas: 3,
                ..Default::default()
            })
            .await
            .unwrap();
        let info = store.status().await.unwrap();
        assert_eq!(
            info.info.config.num_replicas, 3,
            "a three-node cluster holds R3"
        );
        store.put("k", "1".into()).await.unwrap();

        // With one node of three down, a quorum remains: a write is accepted again once the
        // client and the stream have moved past the dead node.
        cluster.kill(0);
        let write = async {
            loop {
                if store.put("k", "2".into()).await.is_ok() {
                    break;
                }
            }
        };
        tokio::time::timeout(EVENT, write)
            .await
            .expect("no write accepted within 30 s of a node's crash");

        cluster.restart(0).await;
        // The restarted node is healthy only once its replicas caught up: a client that can
        // reach nothing but node 0 reads the write it missed.
        let alone = async_nats::connect(cluster.client_url(0)).await.unwrap();
        let store0 = jetstream::new(alone)
            .get_key_value("harness")
            .await
            .unwrap();
        let entry = store0.entry("k").await.unwrap().expect("key k");
        assert_eq!(entry.value, bytes::Bytes::from_static(b"2"));
    });
}

#[test]
fn nats_harness_single_node_serves_jetstream() {
    runtime().block_on(async {
        let cluster = NatsCluster::start(1).await;
        let client = async_nats::connect(cluster.client_url(0)).await.unwrap();
        let store = jetstream::new(client)
            .create_key_value(kv::Config {
                bucket: "single".into(),
                ..Default::default()
            })
            .await
            .unwrap();
        let revision = store.put("k", "v".into()).await.unwrap();
        assert_eq!(store.entry("k").await.unwrap().unwrap().revision, revision);
    });
}
