//! The JetStream seam, its publishing side: how a gateway stores a message in the stream and
//! learns that it was (its `PubAck`). Two implementations: NATS in production
//! ([`NatsJetStream`], over `async-nats`) and the in-memory model in `sim/jetstream.rs`; one
//! contract suite (`sim/jetstream_contract.rs`) holds both to the semantics below, the NATS one
//! against a real nats-server.
//!
//! # Semantics every implementation must keep
//! - [`JetStream::publish`] sends a message and returns its confirmation to await: a
//!   [`PubAck`] with the stream sequence it was stored at. Messages one gateway sends one after
//!   another are stored in that order.
//! - **Message ids** (`Nats-Msg-Id`): within the stream's duplicate window a second message
//!   with an id already stored is not stored; it is confirmed with the first one's sequence and
//!   `duplicate` set.
//! - **Expectations** (`Nats-Expected-Last-Subject-Sequence`, with
//!   `Nats-Expected-Last-Subject-Sequence-Subject` naming another subject): stored only if the
//!   subject's last message is at that sequence (0: it has none); otherwise refused with error
//!   code 10071 and nothing stored.
//! - **Atomic batches** (`Nats-Batch-Id`, `Nats-Batch-Sequence` from 1, `Nats-Batch-Commit` on
//!   the last): the messages before the commit are sent with [`JetStream::send`] and answered by
//!   nothing; the commit's confirmation names the last message's sequence, every message of
//!   the batch stored together at consecutive sequences, or none of them. A commit whose
//!   message id was stored before is refused with code 10201, nothing stored.
//! - **A full stream** (its message or byte limit, discard new) refuses with code 10077
//!   (messages) or 10047 (bytes), status 503, and a description naming the limit.
//! - **What is not known**: [`PublishError::Unanswered`] (no answer in time, or the connection
//!   broke) may or may not have been stored; [`PublishError::NoResponders`] and every
//!   [`PublishError::Refused`] were not.
//!
//! No NATS type appears here: the gateway's data path speaks only this.

use std::{fmt, future::IntoFuture};

use bytes::Bytes;

pub use super::backplane::BoxFuture;

/// A message to store: its subject, its header lines in order, its body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// The subject (the stream's prefix and the topic).
    pub subject: String,
    /// Header lines, each name once.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub payload: Bytes,
}

impl Outgoing {
    /// Sets header `name` to `value`, replacing an earlier line of that name.
    pub fn header(&mut self, name: &str, value: impl Into<String>) {
        let value = value.into();
        match self.headers.iter_mut().find(|(n, _)| n == name) {
            Some(line) => line.1 = value,
            None => self.headers.push((name.to_string(), value)),
        }
    }
}

/// JetStream's confirmation of a stored message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PubAck {
    /// The stream sequence it was stored at (the first one's, for a duplicate).
    pub sequence: u64,
    /// It repeated a message id stored before: nothing new was stored.
    pub duplicate: bool,
}

/// A JetStream API error: what the stream's leader answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// Its status (503: unavailable for now, or a full stream).
    pub status: u16,
    /// JetStream's error code (10071: wrong last sequence, ...).
    pub code: u64,
    /// What it said.
    pub description: String,
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (code {}, error code {})",
            self.description, self.status, self.code
        )
    }
}

/// Why a publish was not confirmed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PublishError {
    /// No JetStream server took it ("no responders": no stream for the subject, or none with a
    /// leader that answers): nothing stored.
    #[error("no stream found for given subject")]
    NoResponders,
    /// No answer in time, or the connection broke before it came: it may have been stored.
    #[error("{0}")]
    Unanswered(&'static str),
    /// Larger than the servers take: nothing sent.
    #[error("max payload size exceeded: {0}")]
    TooLarge(String),
    /// JetStream refused it: nothing stored.
    #[error("publish failed: {0}")]
    Refused(ApiError),
    /// The connection did not take it (closed, or its buffer full): nothing sent.
    #[error("failed to send message: {0}")]
    NotSent(String),
    /// Anything else (a subject NATS refuses, an answer that did not parse).
    #[error("publish failed: {0}")]
    Other(String),
}

impl PublishError {
    /// JetStream's error code, when it refused.
    pub fn code(&self) -> Option<u64> {
        match self {
            Self::Refused(api) => Some(api.code),
            _ => None,
        }
    }

    /// JetStream's answer, when it refused.
    pub fn api(&self) -> Option<&ApiError> {
        match self {
            Self::Refused(api) => Some(api),
            _ => None,
        }
    }
}

/// A publish's confirmation, to await.
pub type Confirmation = BoxFuture<'static, Result<PubAck, PublishError>>;

/// The stream's publishing side. Object-safe, so the gateway holds an `Arc<dyn JetStream>`.
pub trait JetStream: Send + Sync + fmt::Debug {
    /// Sends `message`; the confirmation is awaited apart, so publishes can be pipelined.
    ///
    /// # Errors
    /// What is known before the confirmation: [`PublishError::TooLarge`],
    /// [`PublishError::NotSent`], [`PublishError::Unanswered`] (not sent in time).
    fn publish(&self, message: Outgoing) -> BoxFuture<'_, Result<Confirmation, PublishError>>;

    /// Sends `message` with no confirmation (an atomic batch's messages before its commit).
    ///
    /// # Errors
    /// [`PublishError::NotSent`] when the connection did not take it; anything else when it
    /// never will ([`PublishError::TooLarge`], [`PublishError::Other`]).
    fn send(&self, message: Outgoing) -> BoxFuture<'_, Result<(), PublishError>>;
}

/// The stream's publishing side over an `async-nats` JetStream context.
#[derive(Debug, Clone)]
pub struct NatsJetStream {
    js: async_nats::jetstream::Context,
}

impl NatsJetStream {
    /// Publishes through `js` (its timeout bounds each try's wait for a `PubAck`).
    pub fn new(js: async_nats::jetstream::Context) -> Self {
        Self { js }
    }
}

/// `message`'s header lines as NATS headers.
fn header_map(message: &Outgoing) -> Result<async_nats::HeaderMap, PublishError> {
    let mut map = async_nats::HeaderMap::new();
    for (name, value) in &message.headers {
        let name: async_nats::HeaderName = name
            .parse()
            .map_err(|_| PublishError::Other(format!("not a NATS header name: {name:?}")))?;
        let value: async_nats::HeaderValue = value
            .parse()
            .map_err(|_| PublishError::Other(format!("not a NATS header value: {value:?}")))?;
        map.insert(name, value);
    }
    Ok(map)
}

/// What async-nats' publish error says, in the seam's terms.
fn from_nats(error: async_nats::jetstream::context::PublishError) -> PublishError {
    use async_nats::jetstream::context::PublishErrorKind as Kind;
    let api = std::error::Error::source(&error)
        .and_then(|source| source.downcast_ref::<async_nats::jetstream::Error>())
        .map(|api| ApiError {
            status: u16::try_from(api.code()).unwrap_or(u16::MAX),
            code: api.error_code().0,
            description: api.to_string().rsplit_once(" (code ").map_or_else(
                || api.to_string(),
                |(description, _)| description.to_string(),
            ),
        });
    match (error.kind(), api) {
        (Kind::StreamNotFound, _) => PublishError::NoResponders,
        (Kind::TimedOut, _) => PublishError::Unanswered("timed out: didn't receive ack in time"),
        (Kind::BrokenPipe, _) => PublishError::Unanswered("broken pipe"),
        (Kind::MaxPayloadExceeded, _) => PublishError::TooLarge(
            std::error::Error::source(&error).map_or_else(String::new, ToString::to_string),
        ),
        (_, Some(api)) => PublishError::Refused(api),
        (_, None) => PublishError::Other(
            std::error::Error::source(&error)
                .map_or_else(|| error.kind().to_string(), ToString::to_string),
        ),
    }
}

impl JetStream for NatsJetStream {
    fn publish(&self, message: Outgoing) -> BoxFuture<'_, Result<Confirmation, PublishError>> {
        Box::pin(async move {
            let headers = header_map(&message)?;
            let sent = self
                .js
                .publish_with_headers(message.subject, headers, message.payload)
                .await
                .map_err(from_nats)?;
            let confirmation: Confirmation = Box::pin(async move {
                sent.into_future()
                    .await
                    .map(|ack| PubAck {
                        sequence: ack.sequence,
                        duplicate: ack.duplicate,
                    })
                    .map_err(from_nats)
            });
            Ok(confirmation)
        })
    }

    fn send(&self, message: Outgoing) -> BoxFuture<'_, Result<(), PublishError>> {
        Box::pin(async move {
            let headers = header_map(&message)?;
            self.js
                .client()
                .publish_with_headers(message.subject, headers, message.payload)
                .await
                .map_err(|error| match error.kind() {
                    async_nats::client::PublishErrorKind::Send => {
                        PublishError::NotSent(error.to_string())
                    }
                    async_nats::client::PublishErrorKind::MaxPayloadExceeded => {
                        PublishError::TooLarge(error.to_string())
                    }
                    _ => PublishError::Other(error.to_string()),
                })
        })
    }
}
