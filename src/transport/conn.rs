//! Which connection a request arrived on: every admitted connection gets a number (see
//! `incoming::Guarded`), which the service reads back from the request, so the fence for acks
//! that name no member (docs/semantics.md#connection-fence: "the holder's stream runs on this ack's connection") holds for
//! any transport the server runs on (TCP, TLS, simulation).

use crate::broker::ConnectionId;

/// What a request knows of its connection (found in the request's extensions; TLS is
/// terminated by the server's own connection wrapper, so it is there over TLS too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionInfo {
    /// Unique for the server's lifetime.
    pub id: ConnectionId,
}

/// The connection a request arrived on, if the server numbered it.
pub fn connection_of<T>(request: &tonic::Request<T>) -> Option<ConnectionId> {
    request
        .extensions()
        .get::<ConnectionInfo>()
        .map(|info| info.id)
}
