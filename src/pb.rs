//! Generated protobuf and gRPC types for `tinybroker.v1` (fenced off: hand-written code converts
//! at the edge in `service`).
#![allow(missing_docs, clippy::all, clippy::pedantic)]

tonic::include_proto!("tinybroker.v1");

// The server side, generated apart so it can write frames its own way (see `build.rs`).
include!(concat!(env!("OUT_DIR"), "/server/tinybroker.v1.rs"));

/// Encoded file descriptor set, for the reflection service.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/tinybroker_descriptor.bin"));
