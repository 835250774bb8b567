//! Subcommands of the `tinybroker` binary.

pub mod bench;
pub mod client;
pub mod logging;
pub mod nats_security;
pub mod serve;
pub mod status;
