//! Black-box tests of the gRPC API against a real server on loopback (SPEC §1–§7).

mod binary;
mod certs;
#[macro_use]
mod harness;

mod bench;
mod delivery;
mod lifecycle;
mod logs;
mod metrics;
mod singleton;
mod streams;
mod tls;
mod validation;
