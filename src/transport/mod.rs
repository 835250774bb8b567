//! Transport facts the server produces and the service reads: which connection a request came
//! on ([`conn`]), the counters of the transport's defences ([`TransportStats`]) and the
//! one-shot [`Signal`] that starts shutdown. A leaf: it imports nothing of the server, the
//! service or cluster mode, so both the server and the service can depend on it.

pub mod conn;
mod signal;
mod stats;

pub use signal::Signal;
pub use stats::{TransportSnapshot, TransportStats};
