//! Subcommands of the `tinybroker` binary.

pub mod bench;
pub mod client;
pub mod logging;
pub mod serve;
pub mod status;
