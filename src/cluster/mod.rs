//! Cluster mode (docs/semantics.md#cluster-mode): `tinybroker serve --nats URLS` runs the same gRPC API as a gateway
//! that keeps no state of its own over a NATS JetStream cluster; any number of gateways serve
//! the same subscriptions. The service reaches a gateway only through the backend seam
//! (`crate::backend`); everything here returns [`crate::core::Error`]s, never gRPC statuses.
//!
//! - [`gateway`]: the NATS adapter behind `serve --nats`: publishes to JetStream, subscriptions
//!   of every mode bridged from JetStream consumers into each gateway's local broker, acks
//!   forwarded to the gateway holding the member, and SINGLETON's line kept by the
//!   [`coordinator`] over [`nats`] ([`gateway::control::singleton`]). What it chose and why is in its doc.
//! - [`backplane`]: the seam to the coordination store, with JetStream KV semantics (revisions,
//!   compare-and-set, ordered watch). Implemented by [`nats`] and by the in-memory model in
//!   `sim/backplane.rs`; one contract suite holds both (the NATS one on a real three-node
//!   nats-server cluster, started by `tests/support/nats.rs`).
//! - [`bus`]: the seam to core NATS: what gateways say to each other (request/reply, asks of
//!   every gateway) and hear from JetStream (advisories). Implemented by [`bus::NatsBus`] and by
//!   the in-memory model in `sim/bus.rs`; one contract suite holds both.
//! - [`jetstream`]: the seam to JetStream: a publish and its `PubAck`, message ids,
//!   expectations, atomic batches; a consumer's pulls, the answers to its messages (acks, naks,
//!   terms, progress) and its state. Implemented by [`jetstream::NatsJetStream`] and
//!   [`jetstream::NatsConsumer`] and by the in-memory model in `sim/jetstream.rs`; two contract
//!   suites hold both.
//! - [`nats`]: the backplane over a JetStream KV bucket (`async-nats`).
//! - [`identity`]: what a starting gateway claims in the backplane: the epoch floor and its
//!   member-id route.
//! - [`ids`]: the ids cluster mode names things by (gateway incarnations, members, routes).
//! - [`values`]: what gateways keep in the backplane: keys, a subscription's line.
//! - [`coordinator`]: one gateway's sans-IO state machine for singleton subscriptions: the line
//!   across gateways, promotion, epochs and leases, with the safety argument and the clock
//!   assumption in its doc.
//!
//! Tested: the coordinator in the simulation (`sim/cluster.rs`) over the model backplane, and in
//! every gateway over [`nats`]; [`nats`] on its own against real servers; the gateways against
//! real nats-server processes in `tests/cluster` (the API suite, faults, limits, the bench).

pub mod backplane;
pub mod bus;
pub mod coordinator;
pub mod gateway;
pub mod identity;
pub mod ids;
pub mod jetstream;
pub mod nats;
pub mod security;
pub mod values;
