//! Black-box tests of the gRPC API against a real server on loopback (docs/semantics.md).
//!
//! The same suite runs against cluster mode in `tests/cluster` (two gateways over a NATS
//! cluster); what only the embedded broker offers is written inside `embedded_only!`.

/// Items that test what only the embedded broker offers (docs/semantics.md#cluster-mode lists what cluster mode
/// refuses or does differently): compiled here, left out of the suite's run on gateways.
macro_rules! embedded_only {
    ($($item:item)*) => { $($item)* };
}

mod answers;
mod binary;
mod certs;
#[macro_use]
mod harness;

#[path = "embedded.rs"]
mod deployment;

mod bench;
mod console;
mod delete;
mod delivery;
mod fence;
mod handover;
mod leadership;
mod lifecycle;
mod logs;
mod metadata;
mod metrics;
mod publish_runs;
mod singleton;
mod streams;
mod tls;
mod validation;
