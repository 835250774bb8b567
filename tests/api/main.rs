//! Black-box tests of the gRPC API against a real server on loopback (SPEC §1–§7).

mod harness;

mod delivery;
mod lifecycle;
mod singleton;
mod validation;
