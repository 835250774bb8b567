//! The API suite of `tests/api`, unchanged, against cluster mode: each test's server is two
//! gateways over its own three-node NATS cluster (`crate::deployment`), so every subscription
//! is consumed on one gateway from messages published on the other, and unary acks are
//! forwarded. Tests of what only the embedded broker offers are inside `embedded_only!` there
//! (see the README's cluster-mode section for the list and why).

#[path = "../api/bench.rs"]
mod bench;
#[path = "../api/delivery.rs"]
mod delivery;
#[path = "../api/lifecycle.rs"]
mod lifecycle;
#[path = "../api/logs.rs"]
mod logs;
#[path = "../api/metrics.rs"]
mod metrics;
#[path = "../api/singleton.rs"]
mod singleton;
#[path = "../api/streams.rs"]
mod streams;
#[path = "../api/tls.rs"]
mod tls;
#[path = "../api/validation.rs"]
mod validation;
