//! Black-box tests of the gRPC API against a real server on loopback (SPEC §1–§7).

#[macro_use]
mod harness;

mod delivery;
mod lifecycle;
mod singleton;
mod streams;
mod validation;
