//! The API suite of `tests/api`, unchanged, against cluster mode: each test's server is two
//! gateways over its own three-node NATS cluster (`crate::deployment`), so every subscription
//! is consumed on one gateway from messages published on the other, and unary acks are
//! forwarded. Tests of what only the embedded broker offers are inside `embedded_only!` there
//! (see the README's cluster-mode section for the list and why). Not included: `bench.rs`,
//! `logs.rs` and `metrics.rs`, whose tests run their own embedded server or binary.

#[path = "../api/answers.rs"]
mod answers;
#[path = "../api/console.rs"]
mod console;
#[path = "../api/delete.rs"]
pub(crate) mod delete;
#[allow(
    dead_code,
    unused_imports,
    reason = "helpers of its embedded-only tests"
)]
#[path = "../api/delivery.rs"]
mod delivery;
#[path = "../api/fence.rs"]
mod fence;
#[path = "../api/handover.rs"]
mod handover;
#[path = "../api/leadership.rs"]
mod leadership;
#[allow(
    dead_code,
    unused_imports,
    reason = "helpers of its embedded-only tests"
)]
#[path = "../api/lifecycle.rs"]
mod lifecycle;
#[path = "../api/metadata.rs"]
mod metadata;
#[path = "../api/publish_runs.rs"]
mod publish_runs;
#[allow(
    dead_code,
    unused_imports,
    reason = "helpers of its embedded-only tests"
)]
#[path = "../api/singleton.rs"]
mod singleton;
#[allow(
    dead_code,
    unused_imports,
    reason = "helpers of its embedded-only tests"
)]
#[path = "../api/streams.rs"]
mod streams;
#[allow(
    dead_code,
    unused_imports,
    reason = "helpers of its embedded-only tests"
)]
#[path = "../api/tls.rs"]
mod tls;
#[allow(
    dead_code,
    unused_imports,
    reason = "helpers of its embedded-only tests"
)]
#[path = "../api/validation.rs"]
mod validation;
