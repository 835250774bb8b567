//! Counters of the transport's defences, shown with the broker counters in `ListSubscriptions`.

use std::sync::atomic::{AtomicU64, Ordering};

/// What the connection and request guards did. Shared by the server and the service.
#[derive(Debug, Default)]
pub struct TransportStats {
    open: AtomicU64,
    refused: AtomicU64,
    handshake_timeouts: AtomicU64,
    over_budget: AtomicU64,
    request_timeouts: AtomicU64,
}

/// A reading of [`TransportStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TransportSnapshot {
    /// Connections open now.
    pub connections_open: u64,
    /// Connections closed at once because `max_connections` were open.
    pub connections_refused: u64,
    /// Connections closed because the client did not send the HTTP/2 preface in time.
    pub handshake_timeouts: u64,
    /// Requests refused because unfinished request bodies held `max_pending_request_bytes`.
    pub requests_over_budget: u64,
    /// Requests whose body did not arrive within `request_timeout`.
    pub request_timeouts: u64,
}

impl TransportStats {
    /// Reads every counter.
    pub fn snapshot(&self) -> TransportSnapshot {
        TransportSnapshot {
            connections_open: self.open.load(Ordering::Relaxed),
            connections_refused: self.refused.load(Ordering::Relaxed),
            handshake_timeouts: self.handshake_timeouts.load(Ordering::Relaxed),
            requests_over_budget: self.over_budget.load(Ordering::Relaxed),
            request_timeouts: self.request_timeouts.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn connection_opened(&self) {
        self.open.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn connection_closed(&self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }

    pub(crate) fn connection_refused(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn handshake_timed_out(&self) {
        self.handshake_timeouts.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn request_over_budget(&self) {
        self.over_budget.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn request_timed_out(&self) {
        self.request_timeouts.fetch_add(1, Ordering::Relaxed);
    }
}
