//! Cluster mode (SPEC §9, in progress): `tinybroker serve --nats URLS` runs the same gRPC API
//! as a gateway that keeps no state of its own over a NATS JetStream cluster; any number of
//! gateways serve the same subscriptions.
//!
//! - [`gateway`] (step 2): the NATS adapter behind `serve --nats`: publishes to JetStream,
//!   QUEUE and BROADCAST subscriptions bridged from JetStream consumers into each gateway's
//!   local broker, acks forwarded to the gateway holding the member. What it chose and why is
//!   in its doc; SINGLETON is refused there until step 3.
//! - [`backplane`]: the seam to the coordination store, with JetStream KV semantics (revisions,
//!   compare-and-set, ordered watch). Implemented by [`nats`] and by the in-memory model in
//!   `sim/backplane.rs`; one contract suite holds both (the NATS one on a real three-node
//!   nats-server cluster, started by `tests/support/nats.rs`).
//! - [`nats`]: the backplane over a JetStream KV bucket (`async-nats`).
//! - [`values`]: what gateways keep in the backplane: ids, keys, a subscription's line.
//! - [`coordinator`]: one gateway's sans-IO state machine for singleton subscriptions: the line
//!   across gateways, promotion, epochs and leases, with the safety argument and the clock
//!   assumption in its doc.
//!
//! Status: the coordinator runs in the simulation (`sim/cluster.rs`) over the model backplane,
//! and [`nats`] is tested on its own against real servers; neither is wired to the gateway yet
//! (step 3: SINGLETON across gateways).

pub mod backplane;
pub mod coordinator;
pub mod gateway;
pub mod nats;
pub mod values;
