//! Cluster mode (SPEC §9, in progress): `tinybroker serve --nats URLS` runs the same gRPC API
//! as a gateway that keeps no state of its own over a NATS JetStream cluster; any number of
//! gateways serve the same subscriptions.
//!
//! - [`gateway`] (step 2): the NATS adapter behind `serve --nats`: publishes to JetStream,
//!   QUEUE and BROADCAST subscriptions bridged from JetStream consumers into each gateway's
//!   local broker, acks forwarded to the gateway holding the member. What it chose and why is
//!   in its doc; SINGLETON is refused there until step 3.
//! - [`backplane`]: the seam to the coordination store, with JetStream KV semantics (revisions,
//!   compare-and-set, ordered watch). Implemented by the in-memory model in `sim/backplane.rs`.
//! - [`values`]: what gateways keep in the backplane: ids, keys, a subscription's line.
//! - [`coordinator`] (step 1): one gateway's sans-IO state machine for singleton subscriptions:
//!   the line across gateways, promotion, epochs and leases, with the safety argument and the
//!   clock assumption in its doc. It runs in the simulation (`sim/cluster.rs`) over the model
//!   backplane and is not wired to the gateway yet.

pub mod backplane;
pub mod coordinator;
pub mod gateway;
pub mod values;
