//! The JetStream seam: how a gateway stores a message in the stream and learns that it was (its
//! `PubAck`), and how it pulls a consumer's messages and answers them (acks, naks, terms,
//! progress, each confirmed when asked), and how it makes, finds, lists and deletes the stream's
//! consumers. Two implementations: NATS in production ([`NatsJetStream`], [`NatsStream`] and
//! [`NatsConsumer`], over `async-nats`) and the in-memory model in
//! `sim/jetstream.rs`; one contract suite (`sim/jetstream_contract.rs`) holds both to the
//! semantics below, the NATS one against a real nats-server.
//!
//! # Semantics every implementation must keep
//! ## Publishing
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
//! ## Consuming
//! - [`Consumer::pull`] asks for up to a number of messages and waits at most its `expires` for
//!   them: the [`Deliveries`] end once that many came or the wait expired. A pull brings the
//!   messages of the consumer's filter in stream order, messages given back (naked, or past
//!   their ack wait) ahead of new ones, each with its stream sequence, delivery count (1 the
//!   first time, one more each time it comes again) and store time, its subject, headers and
//!   body as stored, and a reply subject ([`AckReply`]) for its answer.
//! - An [`Answer`] on that reply subject ([`JetStream::answer`], or [`JetStream::confirm`],
//!   which waits for the consumer to say it applied it): an ack or a term and the message never
//!   comes again; a nak and it comes again at once (or after its delay); progress and its ack
//!   wait starts again. A message not answered within the consumer's ack wait comes again.
//! - A consumer that takes no acks (`AckNone`) counts a message done once delivered: it never
//!   comes again.
//! - [`Consumer::info`] reports what is pending, delivered and unacked, and when the consumer
//!   was created; [`ConsumerError::NotFound`] once it was deleted.
//!
//! ## A stream's consumers
//! - [`Stream::create_consumer`] makes a durable pull consumer delivering what is stored from
//!   then on; made again with the same configuration it is the same consumer, with another it
//!   is refused ([`CreateError::Refused`]); [`CreateError::Limit`] when the stream holds its
//!   most consumers.
//! - [`Stream::consumer`] finds one by name (none once deleted), [`Stream::consumers`] lists
//!   them all in name order with what each records (its metadata), [`Stream::delete_consumer`]
//!   deletes one ([`ConsumerError::NotFound`] when it is gone already).
//! - [`Stream::last_message`] reads a subject's last message from the stream's leader (none
//!   when it has none); [`Stream::purge`] removes a subject's messages below a sequence, and
//!   the subject's last message is then the last one left (none when none is).
//!
//! No NATS type appears in the seam's API: the gateway's data path speaks only this.

mod admin;
mod consume;
mod nats;

pub use admin::{
    ConsumerConfig, ConsumerInfo, CreateError, Found, StoredMessage, Stream, StreamError,
};
pub use consume::{
    AckError, AckReply, Answer, Consumer, ConsumerError, Deliveries, Delivery, DeliveryInfo,
    PullError,
};
pub use nats::{NatsConsumer, NatsJetStream, NatsStream};

use std::{fmt, time::Duration};

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

/// The stream: its publishing side, and the answers to its consumers' deliveries. Object-safe, so the gateway holds an `Arc<dyn JetStream>`.
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

    /// Sends `answer` to a delivery's `reply` subject, unconfirmed: it may be lost, and then the
    /// message comes again after its ack wait.
    ///
    /// # Errors
    /// [`AckError::Unavailable`] when the connection did not take it.
    fn answer(&self, reply: &AckReply, answer: Answer) -> BoxFuture<'_, Result<(), AckError>>;

    /// Sends `answer` to `reply` and waits, at most `timeout`, for the consumer to confirm that
    /// it applied it.
    ///
    /// # Errors
    /// [`AckError::NoResponders`] (not applied), [`AckError::TimedOut`] (not known),
    /// [`AckError::Unavailable`].
    fn confirm(
        &self,
        reply: &AckReply,
        answer: Answer,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<(), AckError>>;

    /// Returns once the servers have every answer sent before it.
    ///
    /// # Errors
    /// [`AckError::Unavailable`] when the connection cannot take it.
    fn flush(&self) -> BoxFuture<'_, Result<(), AckError>>;
}
