//! The JetStream contracts against `NatsJetStream` and `NatsConsumer` over a real three-node
//! nats-server cluster: publishing (`jetstream_contract.rs`, every check), each check on a fresh
//! stream (file storage, three replicas, atomic batches allowed, as a gateway makes it), and
//! consuming and a stream's consumers (`consumer_contract.rs`, every check), each on a fresh
//! stream of three replicas.

use std::time::Duration;

use async_nats::jetstream::{self, stream::DiscardPolicy};
use tinybroker::cluster::jetstream::{NatsJetStream, NatsStream};

use crate::{
    consumer_contract, jetstream_contract, nats_harness::runtime, nats_server::NatsCluster,
};

/// Bound on one contract check (each is a handful of round trips on loopback).
const CHECK: Duration = Duration::from_secs(30);
/// Bound on one consumer contract check (some wait out an ack wait or a nak's delay).
const CONSUMER_CHECK: Duration = Duration::from_secs(60);

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

/// The real stream as a consumer contract fixture: its consumers made, found and deleted
/// through `NatsStream`, as a gateway does.
struct Real {
    js: NatsJetStream,
    stream: NatsStream,
    prefix: String,
}

impl consumer_contract::Consumers for Real {
    type Js = NatsJetStream;
    type Stream = NatsStream;

    fn js(&self) -> &NatsJetStream {
        &self.js
    }

    fn stream(&self) -> &NatsStream {
        &self.stream
    }

    fn prefix(&self) -> &str {
        &self.prefix
    }
}

#[test]
fn cluster_consumer_nats_keeps_every_contract_check() {
    runtime().block_on(async {
        let cluster = NatsCluster::start(3).await;
        let client = async_nats::connect(cluster.client_urls()).await.unwrap();
        let context = jetstream::new(client);
        macro_rules! check {
            ($name:ident) => {
                let name = stringify!($name).replace('_', "-");
                let prefix = stringify!($name).to_string();
                let stream = context
                    .create_stream(jetstream::stream::Config {
                        name: name.clone(),
                        subjects: vec![format!("{prefix}.>")],
                        num_replicas: 3,
                        max_consumers: consumer_contract::MAX_CONSUMERS as i32,
                        ..Default::default()
                    })
                    .await
                    .unwrap_or_else(|e| panic!("stream {name}: {e}"));
                let real = Real {
                    js: NatsJetStream::new(context.clone()),
                    stream: NatsStream::new(stream),
                    prefix,
                };
                tokio::time::timeout(CONSUMER_CHECK, consumer_contract::$name(&real))
                    .await
                    .unwrap_or_else(|_| {
                        panic!("{} took over {CONSUMER_CHECK:?}", stringify!($name))
                    });
            };
        }
        crate::every_consumer_contract_check!(check);
    });
}
