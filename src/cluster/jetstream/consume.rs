//! The JetStream seam, its consuming side: a pull consumer's messages and how a gateway answers
//! them (the semantics are in the module doc of [`super`]).

use std::{fmt, pin::Pin, time::Duration};

use bytes::Bytes;
use futures_core::Stream;

use super::{BoxFuture, ConsumerInfo};

/// Where a delivered message's answers go (its reply subject). Cheap to clone.
#[derive(Clone, PartialEq, Eq)]
pub struct AckReply(async_nats::Subject);

impl AckReply {
    /// The reply subject `subject`.
    pub fn new(subject: &str) -> Self {
        Self(async_nats::Subject::from(subject))
    }

    /// The subject, as text.
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }

    pub(super) fn subject(&self) -> &async_nats::Subject {
        &self.0
    }

    pub(super) fn from_subject(subject: async_nats::Subject) -> Self {
        Self(subject)
    }
}

impl fmt::Debug for AckReply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a gateway answers a delivered message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Done with: never delivered again.
    Ack,
    /// Given back: delivered again (to any puller), after the delay if one is given, with its
    /// delivery count one higher.
    Nak(Option<Duration>),
    /// Still being worked on: its ack wait starts again.
    Progress,
    /// Never to be delivered again, though not done with (dropped).
    Term,
}

/// What JetStream says of a delivery in its reply subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeliveryInfo {
    /// The message's stream sequence.
    pub stream_sequence: u64,
    /// How many times the consumer delivered it, this time included (1: the first).
    pub delivered: i64,
    /// When the stream stored it, in nanoseconds since the Unix epoch.
    pub published_nanos: i128,
}

/// A message a pull brought.
pub struct Delivery {
    body: Body,
    reply: Option<AckReply>,
    info: Result<DeliveryInfo, String>,
}

enum Body {
    Nats(async_nats::Message),
    Parts {
        subject: String,
        headers: Vec<(String, String)>,
        payload: Bytes,
    },
}

impl Delivery {
    /// A delivery of `payload` stored on `subject` with `headers` (each name once), answered on
    /// `reply`.
    pub fn new(
        subject: String,
        headers: Vec<(String, String)>,
        payload: Bytes,
        reply: Option<AckReply>,
        info: Result<DeliveryInfo, String>,
    ) -> Self {
        Self {
            body: Body::Parts {
                subject,
                headers,
                payload,
            },
            reply,
            info,
        }
    }

    pub(super) fn from_nats(
        message: async_nats::Message,
        info: Result<DeliveryInfo, String>,
    ) -> Self {
        Self {
            reply: message.reply.clone().map(AckReply::from_subject),
            body: Body::Nats(message),
            info,
        }
    }

    /// The subject it was stored on.
    pub fn subject(&self) -> &str {
        match &self.body {
            Body::Nats(message) => message.subject.as_str(),
            Body::Parts { subject, .. } => subject,
        }
    }

    /// Its body.
    pub fn payload(&self) -> &Bytes {
        match &self.body {
            Body::Nats(message) => &message.payload,
            Body::Parts { payload, .. } => payload,
        }
    }

    /// Calls `each` with every header's name and (last) value, in the order stored.
    pub fn for_each_header(&self, mut each: impl FnMut(&str, &str)) {
        match &self.body {
            Body::Nats(message) => {
                for (name, values) in message.headers.iter().flat_map(|map| map.iter()) {
                    if let Some(value) = values.last() {
                        each(name.as_ref(), value.as_str());
                    }
                }
            }
            Body::Parts { headers, .. } => {
                for (name, value) in headers {
                    each(name, value);
                }
            }
        }
    }

    /// Where its answers go (none: nothing to answer).
    pub fn reply(&self) -> Option<&AckReply> {
        self.reply.as_ref()
    }

    /// Where its answers go, taken.
    pub fn into_reply(self) -> Option<AckReply> {
        self.reply
    }

    /// Its stream sequence, delivery count and store time; an error when its reply subject
    /// does not say them (not a JetStream delivery).
    pub fn info(&self) -> Result<DeliveryInfo, &str> {
        self.info.as_ref().copied().map_err(String::as_str)
    }
}

impl fmt::Debug for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Delivery")
            .field("subject", &self.subject())
            .field("reply", &self.reply)
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

/// The messages of one pull, in the order delivered; it ends once it brought what it asked
/// for or its wait expired.
pub type Deliveries = Pin<Box<dyn Stream<Item = Result<Delivery, PullError>> + Send>>;

/// Why a pull failed, or ended early.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PullError(pub String);

/// Why an answer was not confirmed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AckError {
    /// Nobody took it at once (the consumer's leader moving): it was not applied.
    #[error("no responders")]
    NoResponders,
    /// Not confirmed within its timeout: it may or may not have been applied.
    #[error("timed out")]
    TimedOut,
    /// The connection could not take it (closed, or its buffer full).
    #[error("{0}")]
    Unavailable(String),
}

/// Why a consumer's state could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConsumerError {
    /// No consumer of that name (deleted).
    #[error("consumer not found")]
    NotFound,
    /// Anything else (no answer in time, no leader).
    #[error("{0}")]
    Other(String),
}

/// A pull consumer of the stream. Object-safe, so a bridge holds a `Box<dyn Consumer>`.
pub trait Consumer: Send + Sync + fmt::Debug {
    /// Its name.
    fn name(&self) -> &str;

    /// When it was created, as it was when this handle was made ([`ConsumerInfo::created`]).
    fn created(&self) -> i128;

    /// Asks for up to `max_messages` messages, waiting at most `expires` for them.
    ///
    /// # Errors
    /// [`PullError`] when the request could not be made.
    fn pull(
        &self,
        max_messages: usize,
        expires: Duration,
    ) -> BoxFuture<'_, Result<Deliveries, PullError>>;

    /// Its state now (of the consumer of its name: one made again under it is told apart by
    /// its [`ConsumerInfo::created`]).
    ///
    /// # Errors
    /// [`ConsumerError::NotFound`] once it was deleted; [`ConsumerError::Other`].
    fn info(&self) -> BoxFuture<'_, Result<ConsumerInfo, ConsumerError>>;
}
