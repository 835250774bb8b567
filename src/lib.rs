//! tinybroker: a message broker with a gRPC API (consumer groups, acks, redelivery, singleton
//! delivery fenced by epochs), embedded in one process in memory, or run as any number of
//! stateless gateways over a NATS JetStream cluster (`serve --nats`).
//!
//! # Layout
//! From the bottom up: each module uses only those listed before it (and the generated [`pb`]).
//! - [`core`]: the pure, deterministic group state machine, topic parsing and routing index,
//!   and every refusal as data ([`core::Error`], with its [`core::ErrorKind`]). No I/O, no clock
//!   reads, no unseeded randomness (but the routing index's per-process hash key for a node's
//!   children, which no output depends on), no locks, no tokio, no tonic.
//! - [`clock`]: the clock seam (tokio's clock in production, turmoil's in simulation).
//! - [`sync`]: the lock types the shell uses, swappable for loom's.
//! - [`broker`]: the shell. Shares the core between connections with short per-subscription
//!   locks, turns effects into frames on member streams, notices ended streams, expires idle
//!   subscriptions, and describes subscriptions as domain views. Time comes from a
//!   [`clock::Clock`]. A gateway's local broker has a few more operations (inject, activate,
//!   hand back), on a handle only the gateway holds.
//! - [`cluster`]: cluster mode: the backplane seam to the coordination store (NATS KV, or the
//!   model in `sim/`), the sans-IO coordinator of singleton subscriptions across gateways, and
//!   the [`cluster::gateway`] that bridges JetStream into its local broker. Returns domain
//!   errors; knows nothing of gRPC.
//! - [`backend`]: the one seam the service talks to: the embedded broker or a gateway, one
//!   `match` per operation, chosen once by the binary.
//! - [`transport`]: transport facts both the server and the service read (connection ids,
//!   transport counters, the shutdown signal). A leaf.
//! - [`service`]: the tonic service: validates `pb` into domain types, calls the backend,
//!   converts answers to `pb` and errors to `Status` (in `service::status` only).
//! - [`server`]: `Server::new(config).run(incoming, shutdown)` (or `Server::with_backend` for a
//!   gateway): the whole server on any listener.
//! - [`metrics`]: Prometheus metrics, read from the broker at scrape time, and their `/metrics`
//!   endpoint.
//! - [`client`]: the typed async client (publish, streaming publish, subscriptions that settle on
//!   their own stream, leader election); the CLI and the examples use it.
//! - [`pb`]: generated protobuf types.
//!
//! `tests/architecture.rs` holds the service and the server to the backend seam, and cluster
//! mode to domain errors; `docs/architecture.md` draws the layers.

pub mod backend;
pub mod broker;
pub mod client;
pub mod clock;
pub mod cluster;
pub mod console;
pub mod core;
pub mod metrics;
pub mod pb;
pub mod server;
pub mod service;
pub mod sync;
pub mod transport;
