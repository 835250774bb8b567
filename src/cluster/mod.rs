//! Cluster mode (SPEC §9, in progress): `tinybroker serve --nats URLS` will run the same gRPC API
//! as a gateway that keeps no state of its own over a NATS JetStream cluster; any number of
//! gateways serve the same subscriptions, and members on different gateways stand in one
//! singleton line.
//!
//! - [`backplane`]: the seam to the coordination store, with JetStream KV semantics (revisions,
//!   compare-and-set, ordered watch). Implemented by the in-memory model in `sim/backplane.rs`;
//!   the NATS implementation is a later step.
//! - [`values`]: what gateways keep in the backplane: ids, keys, a subscription's line.
//! - [`coordinator`]: one gateway's sans-IO state machine for singleton subscriptions: the line
//!   across gateways, promotion, epochs and leases, with the safety argument and the clock
//!   assumption in its doc.
//!
//! Status: step 1 of 4. The coordinator runs in the simulation (`sim/cluster.rs`) over the model
//! backplane; it is **not wired to the binary yet** (no `--nats` flag), and messages (JetStream
//! stream, acks, redelivery) are not part of it: see "Not in this step" in [`coordinator`].

pub mod backplane;
pub mod coordinator;
pub mod nats;
pub mod values;
