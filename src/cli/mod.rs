//! Subcommands of the `tinybroker` binary.

pub mod bench;
pub mod client;
pub mod serve;
pub mod status;
