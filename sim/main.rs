//! Deterministic simulations: the real server on a turmoil host, replicas on hosts that crash,
//! restart and get partitioned, and a checker that holds the broker to docs/semantics.md#singleton-invariants on every input.
//!
//! Replay a failing campaign seed with `TINYBROKER_SIM_SEED=<seed> cargo test --test sim campaign`;
//! run more seeds with `TINYBROKER_SIM_SEEDS=<n>`.
//!
//! Also here, not simulated: the backplane contract against real nats-server processes
//! (`tests/support/nats.rs` starts them).

mod backplane;
mod backplane_contract;
mod backplane_nats;
mod bus;
mod bus_contract;
mod bus_nats;
mod campaign;
mod campaign_tests;
mod checker;
mod clock;
mod cluster;
mod cluster_campaign;
mod cluster_checker;
mod cluster_tests;
mod consumer_contract;
mod gateway_campaign;
mod gateway_clients;
mod gateway_join_judge;
mod gateway_judge;
mod gateway_models;
mod gateway_process;
mod gateway_world;
mod jetstream;
mod jetstream_consumers;
mod jetstream_contract;
mod jetstream_nats;
mod nats_harness;
#[path = "../tests/support/nats.rs"]
mod nats_server;
mod net;
mod rng;
mod scenarios;
mod trace;
mod true_time;
mod world;
