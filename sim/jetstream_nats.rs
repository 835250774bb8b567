//! The JetStream publishing contract (`jetstream_contract.rs`, every check) against
//! `NatsJetStream` over a real three-node nats-server cluster, each check on a fresh stream
//! (file storage, three replicas, atomic batches allowed, as a gateway makes it).

use std::time::Duration;

use async_nats::jetstream::{self, stream::DiscardPolicy};
use tinybroker::cluster::jetstream::NatsJetStream;

use crate::{jetstream_contract, nats_harness::runtime, nats_server::NatsCluster};

/// Bound on one contract check (each is a handful of round trips on loopback).
const CHECK: Duration = Duration::from_secs(30);

#[test]
fn cluster_jetstream_nats_keeps_every_contract_check() {
    runtime().block_on(async {
        let cluster = NatsCluster::start(3).await;
        let client = async_nats::connect(cluster.client_urls()).await.unwrap();
        let context = jetstream::new(client);
        macro_rules! check {
            ($name:ident, $limited:expr) => {
                let name = stringify!($name).replace('_', "-");
                let prefix = stringify!($name).to_string();
                context
                    .create_stream(jetstream::stream::Config {
                        name: name.clone(),
                        subjects: vec![format!("{prefix}.>")],
                        num_replicas: 3,
                        allow_atomic_publish: true,
                        max_messages: if $limited { 2 } else { -1 },
                        discard: DiscardPolicy::New,
                        ..Default::default()
                    })
                    .await
                    .unwrap_or_else(|e| panic!("stream {name}: {e}"));
                let js = NatsJetStream::new(context.clone());
                tokio::time::timeout(CHECK, jetstream_contract::$name(&js, &prefix))
                    .await
                    .unwrap_or_else(|_| panic!("{} took over {CHECK:?}", stringify!($name)));
            };
        }
        crate::every_jetstream_contract_check!(check);
    });
}
