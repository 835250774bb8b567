//! The bus contract (`bus_contract.rs`, every check) against `NatsBus` over a real nats-server:
//! three clients of one node of a three-node cluster (the contract speaks of one server; across
//! servers interest spreads later, which the gateway allows for where it matters).

use std::time::Duration;

use tinybroker::cluster::bus::NatsBus;

use crate::{bus_contract, nats_harness::runtime, nats_server::NatsCluster};

/// Bound on one contract check (each is a handful of round trips on loopback).
const CHECK: Duration = Duration::from_secs(30);

#[test]
fn cluster_bus_nats_keeps_every_contract_check() {
    runtime().block_on(async {
        let cluster = NatsCluster::start(3).await;
        let url = cluster.client_url(0);
        let client = async || {
            NatsBus::new(
                async_nats::connect(url.clone())
                    .await
                    .unwrap_or_else(|e| panic!("{url}: {e}")),
            )
        };
        macro_rules! check {
            ($name:ident) => {
                let (a, b, c) = (client().await, client().await, client().await);
                tokio::time::timeout(CHECK, bus_contract::$name(&a, &b, &c))
                    .await
                    .unwrap_or_else(|_| panic!("{} took over {CHECK:?}", stringify!($name)));
            };
        }
        crate::every_bus_contract_check!(check);
    });
}
