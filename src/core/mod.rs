//! The pure core: deterministic state machines with no I/O, no clock reads, no randomness and no
//! locks. The shell (`crate::broker`) owns the concurrency and hands every input a `now`. One
//! exception, which no output depends on: the routing index keys the hash that orders and finds a
//! node's literal children per process, so no client can choose colliding tokens (its matches
//! are sorted, and nothing reads that order where it could leak).
//!
//! - [`topic`]: topic and pattern parsing and naive matching;
//! - [`index`]: the token trie that routes a topic to subscriptions;
//! - [`subscription`]: one subscription's group state machine (members, queue, windows, epochs);
//! - [`ids`]: where a broker run starts numbering, so ids never repeat across restarts;
//! - [`spec`]: what a member asks for, and the broker's limits;
//! - [`message`]: published messages, shared between queues;
//! - `queue`: a subscription's waiting messages, attempt numbers kept only for the given-back;
//! - [`error`]: every refusal, as data;
//! - [`planted`]: test-only broken behaviours the simulation checker must catch.

pub mod cost;
pub mod effect;
pub mod error;
pub mod ids;
pub mod index;
pub mod message;
pub mod planted;
mod queue;
pub mod spec;
pub mod subscription;
pub mod topic;

use std::sync::Arc;

use bytes::Bytes;

pub use error::{Error, ErrorKind};
pub use ids::IdFloor;
pub use index::PatternIndex;
pub use message::{Envelope, Headers, Message, SystemId};
pub use spec::{
    AckMode, Limits, MAX_METADATA_BYTES, MemberOptions, Mode, OpenRequest, Overflow, Proclamation,
    SubscriptionSpec,
};
pub use subscription::{
    Counters, DropReason, Effect, Epoch, Floors, MemberId, MemberInfo, QueueLimits, Settlement,
    StepDown, StepDownCause, Subscription,
};
pub use topic::{Pattern, Topic};

/// A validated message about to be published; the shell assigns its id and timestamp.
///
/// It already is the message's one allocation, payload copied in, so that publishing only
/// stamps the id and time (under the matched queues' locks) and copies nothing there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Draft(Message, Option<PublishFence>);

/// A publish's fence (docs/semantics.md#fenced-publish): it is stored only while `epoch` is
/// the active epoch of the SINGLETON subscription `subscription_id`, checked as it is stored.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PublishFence {
    /// The SINGLETON subscription whose leadership fences the publish.
    pub subscription_id: Arc<str>,
    /// The epoch the publisher holds (never 0: no member is active with it).
    pub epoch: Epoch,
}

impl Draft {
    /// Validates a message against the size limit.
    ///
    /// # Errors
    /// [`Error::MessageTooLarge`] naming the limit, or [`Error::InvalidArgument`] for more than
    /// [`message::MAX_HEADERS`] headers.
    pub fn new(
        topic: Topic,
        payload: Bytes,
        headers: Headers,
        limits: &Limits,
    ) -> Result<Self, Error> {
        if headers.len() > message::MAX_HEADERS {
            return Err(Error::InvalidArgument(format!(
                "message has {} headers, more than the limit of {}",
                headers.len(),
                message::MAX_HEADERS
            )));
        }
        Self::in_envelope(Envelope::new(topic, headers), &payload, limits)
    }

    /// As [`new`](Self::new), in an envelope already built (and checked) for an earlier draft:
    /// a stream or batch publishing to one topic without headers shares one envelope.
    ///
    /// # Errors
    /// [`Error::MessageTooLarge`] naming the limit.
    pub fn in_envelope(envelope: Envelope, payload: &[u8], limits: &Limits) -> Result<Self, Error> {
        let size = envelope.size() + payload.len();
        if size > limits.max_message_bytes {
            return Err(Error::MessageTooLarge {
                size,
                max: limits.max_message_bytes,
            });
        }
        // Its own allocation: a payload decoded from a request is a view into the whole
        // request buffer (a batch, or a chunk of a stream), which one queued message would
        // otherwise keep alive long after its neighbours were acked.
        Ok(Self(Message::new(0, 0, envelope, payload), None))
    }

    /// The draft, fenced by `fence` (docs/semantics.md#fenced-publish).
    #[must_use]
    pub fn fenced(mut self, fence: Option<PublishFence>) -> Self {
        self.1 = fence;
        self
    }

    /// Its fence, when it has one.
    pub fn fence(&self) -> Option<&PublishFence> {
        self.1.as_ref()
    }

    /// Topic and headers.
    pub fn envelope(&self) -> &Envelope {
        self.0.envelope()
    }

    /// Where to publish.
    pub fn topic(&self) -> &Topic {
        self.0.topic()
    }

    /// Opaque payload.
    pub fn payload(&self) -> &[u8] {
        self.0.payload()
    }

    /// The payload as [`Bytes`] sharing this draft's allocation (no copy).
    pub fn payload_bytes(&self) -> Bytes {
        self.0.payload_bytes()
    }

    /// Size counted against limits.
    pub fn size(&self) -> usize {
        self.0.size()
    }

    /// The message a poisoned `original` becomes on `topic`: same payload, original headers plus
    /// `tinybroker-dead-letter-*` headers saying where it came from and why.
    pub fn dead_letter(
        original: &Message,
        subscription: &str,
        topic: Topic,
        attempts: u32,
    ) -> Self {
        let mut headers = original.headers().clone();
        for (key, value) in [
            (
                "tinybroker-dead-letter-reason",
                "max_delivery_attempts".to_string(),
            ),
            (
                "tinybroker-dead-letter-subscription",
                subscription.to_string(),
            ),
            ("tinybroker-dead-letter-topic", original.topic().to_string()),
            (
                "tinybroker-dead-letter-system-id",
                original.system_id().to_string(),
            ),
            ("tinybroker-dead-letter-attempts", attempts.to_string()),
        ] {
            headers.insert(key.to_string(), value);
        }
        let envelope = Envelope::new(topic, headers);
        Self(Message::new(0, 0, envelope, original.payload()), None)
    }

    /// Turns the draft into a message with its id and publish time.
    pub fn into_message(self, system_id: SystemId, published_at_ms: u64) -> Message {
        self.0.stamped(system_id, published_at_ms)
    }
}
