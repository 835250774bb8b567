//! tinybroker: a single-node, in-memory message broker with a gRPC API.
//!
//! # Layout
//! - [`core`]: the pure, deterministic group state machine, topic parsing and routing index. No
//!   I/O, no clock reads, no unseeded randomness, no locks, no tokio, no tonic.
//! - [`broker`]: the shell. Shares the core between connections with short per-subscription
//!   locks, turns effects into frames on member streams, notices ended streams, expires idle
//!   subscriptions. Time comes from a [`clock::Clock`].
//! - [`cluster`]: cluster mode in progress: the backplane seam and the sans-IO coordinator of
//!   singleton subscriptions across gateways (simulated; not wired to the binary yet).
//! - [`clock`]: the clock seam (tokio's clock in production, turmoil's in simulation).
//! - [`service`]: the tonic service; translates `pb` types to domain types and errors to `Status`.
//! - [`metrics`]: Prometheus metrics, read from the broker at scrape time, and their `/metrics`
//!   endpoint.
//! - [`server`]: `Server::new(config).run(incoming, shutdown)`: the whole server on any listener.
//! - [`client`]: the typed async client (publish, streaming publish, subscriptions that settle on
//!   their own stream, leader election); the CLI and the examples use it.
//! - [`pb`]: generated protobuf types.
//! - [`sync`]: the lock types the shell uses, swappable for loom's.

pub mod backend;
pub mod broker;
pub mod client;
pub mod clock;
pub mod cluster;
pub mod core;
pub mod metrics;
pub mod pb;
pub mod server;
pub mod service;
pub mod sync;
pub mod transport;
