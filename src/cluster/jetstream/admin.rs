//! The JetStream seam, a stream's consumers: made, found, listed and deleted (the semantics
//! are in the module doc of [`super`]).

use std::{collections::HashMap, fmt, time::Duration};

use super::{BoxFuture, Consumer, ConsumerError};

/// A consumer to make. Every consumer a gateway makes is a durable pull consumer that
/// delivers the messages stored from its creation on, as many times as it takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerConfig {
    /// Its name.
    pub name: String,
    /// The subjects it delivers (wildcards allowed; none: the whole stream).
    pub filters: Vec<String>,
    /// Whether it takes acks (`AckExplicit`); without, a message is done once delivered.
    pub explicit: bool,
    /// How long a delivered message may go unanswered before it comes again.
    pub ack_wait: Duration,
    /// Most messages delivered and unanswered at once (-1: no limit).
    pub max_ack_pending: i64,
    /// Deleted after this long with nobody pulling (zero: never).
    pub inactive_threshold: Duration,
    /// What it records (a subscription's id and settings).
    pub metadata: HashMap<String, String>,
}

/// A consumer as the stream's servers report it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerInfo {
    /// Its name.
    pub name: String,
    /// What it records.
    pub metadata: HashMap<String, String>,
    /// When it was created, in nanoseconds since the Unix epoch: a consumer deleted and made
    /// again under the same name has another.
    pub created: i128,
    /// Messages of its filter not yet delivered.
    pub pending: u64,
    /// Messages delivered and not yet acked (or terminated).
    pub ack_pending: u64,
    /// Messages delivered more than once and not yet answered.
    pub redelivered: u64,
    /// The highest stream sequence it delivered.
    pub delivered_stream_sequence: u64,
    /// Every server that is to hold it does (or is known to be offline); true outside a
    /// cluster.
    pub everywhere: bool,
    /// The servers that are to hold it and do not yet (for logs).
    pub behind: Vec<String>,
}

/// Why a consumer was not made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CreateError {
    /// The stream (or its account) holds its most consumers.
    #[error("maximum consumers limit reached")]
    Limit,
    /// Not now: no leader, or no answer in time. Trying again may make it.
    #[error("{0}")]
    ForNow(String),
    /// Refused (one of that name exists with another configuration, a bad filter, ...).
    #[error("{0}")]
    Refused(String),
}

/// A stored message, as the stream's leader reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredMessage {
    /// Its stream sequence.
    pub sequence: u64,
    /// Its header lines (each name once).
    pub headers: Vec<(String, String)>,
    /// Its body.
    pub payload: bytes::Bytes,
}

/// Why the stream did not answer a read or a purge.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct StreamError(pub String);

/// A consumer found or made, and its state then.
pub type Found = (Box<dyn Consumer>, ConsumerInfo);

/// One stream's consumers. Object-safe, so the gateway holds an `Arc<dyn Stream>`.
pub trait Stream: Send + Sync + fmt::Debug {
    /// The stream's name.
    fn name(&self) -> &str;

    /// The consumer `name`, if there is one.
    ///
    /// # Errors
    /// [`ConsumerError::Other`] when the servers did not answer.
    fn consumer(&self, name: &str) -> BoxFuture<'_, Result<Option<Found>, ConsumerError>>;

    /// Makes the consumer `config` describes; one of that name and another configuration
    /// is refused.
    ///
    /// # Errors
    /// [`CreateError`].
    fn create_consumer(&self, config: ConsumerConfig) -> BoxFuture<'_, Result<Found, CreateError>>;

    /// The state of the consumer `name`.
    ///
    /// # Errors
    /// [`ConsumerError::NotFound`] when there is none; [`ConsumerError::Other`].
    fn consumer_info(&self, name: &str) -> BoxFuture<'_, Result<ConsumerInfo, ConsumerError>>;

    /// Every consumer of the stream, in name order.
    ///
    /// # Errors
    /// [`ConsumerError::Other`] when the servers did not answer.
    fn consumers(&self) -> BoxFuture<'_, Result<Vec<ConsumerInfo>, ConsumerError>>;

    /// How many consumers the stream has (its own count, which may include consumers
    /// [`Stream::consumers`] does not list: one whose leader is offline).
    ///
    /// # Errors
    /// [`ConsumerError::Other`] when the servers did not answer.
    fn consumer_count(&self) -> BoxFuture<'_, Result<usize, ConsumerError>>;

    /// The last message stored on `subject`, read from the stream's leader (not a replica
    /// that may be behind); `None` when it has none.
    ///
    /// # Errors
    /// [`StreamError`] when the servers did not answer.
    fn last_message(
        &self,
        subject: &str,
    ) -> BoxFuture<'_, Result<Option<StoredMessage>, StreamError>>;

    /// Removes the messages of `subject` below stream sequence `below` (none at or above it).
    ///
    /// # Errors
    /// [`StreamError`] when the servers did not answer, or refused.
    fn purge(&self, subject: &str, below: u64) -> BoxFuture<'_, Result<(), StreamError>>;

    /// Deletes the consumer `name`.
    ///
    /// # Errors
    /// [`ConsumerError::NotFound`] when there is none (deleted meanwhile);
    /// [`ConsumerError::Other`].
    fn delete_consumer(&self, name: &str) -> BoxFuture<'_, Result<(), ConsumerError>>;
}
