//! Which connection a request arrived on: every admitted connection gets a number (see
//! `incoming::Guarded`), which the service reads back from the request, so the fence for acks
//! that name no member (SPEC §4: "the holder's stream runs on this ack's connection") holds for
//! any transport the server runs on (TCP, TLS, simulation).

use crate::broker::ConnectionId;

/// What a request knows of its connection (found in the request's extensions, or inside
/// `TlsConnectInfo` when serving TLS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionInfo {
    /// Unique for the server's lifetime.
    pub id: ConnectionId,
}

/// The connection a request arrived on, if the server numbered it.
pub fn connection_of<T>(request: &tonic::Request<T>) -> Option<ConnectionId> {
    let extensions = request.extensions();
    extensions
        .get::<ConnectionInfo>()
        .or_else(|| {
            extensions
                .get::<tonic::transport::server::TlsConnectInfo<ConnectionInfo>>()
                .map(|tls| tls.get_ref())
        })
        .map(|info| info.id)
}
