//! The NATS wire: names (stream, consumers, subjects), headers, the stream's set-up, the
//! connection, and request/reply to every gateway.

pub(super) mod ask;
pub(super) mod codes;
pub(super) mod connection;
pub(super) mod headers;
pub mod names;
pub(super) mod stream;
