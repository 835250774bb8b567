//! Published messages. One [`Message`] is shared by every subscription it is queued on, so
//! fan-out costs a pointer per queue, not a copy of the payload.
//!
//! A message is one allocation: a reference count, its id, publish time and [`Envelope`]
//! pointer, the payload's length, then the payload itself, behind a one-word pointer. With a
//! 128-byte payload that is 168 bytes requested (a 176-byte chunk under glibc), against three
//! allocations and a two-word queue slot before (256 bytes in all). The envelope (topic and
//! headers) is shared by the messages a stream or batch publishes to one topic without headers.

use std::{collections::BTreeMap, fmt};

use bytes::Bytes;
use triomphe::ThinArc;

use super::topic::Topic;

/// Broker-wide message id, increasing in publish order.
pub type SystemId = u64;

/// Message headers, in key order so their rendering is deterministic.
pub type Headers = BTreeMap<String, String>;

/// Where a message was published and its headers, with their size as counted against the
/// limits: immutable, one word wide, and shared (one count, no weak count) by every message a
/// publishing path gives it to (a stream or batch publishing to one topic without headers).
#[derive(Clone, PartialEq, Eq)]
pub struct Envelope(triomphe::Arc<Parts>);

#[derive(PartialEq, Eq)]
struct Parts {
    topic: Topic,
    /// `None` for none: most messages carry no headers, and an empty map is three words.
    headers: Option<Box<Headers>>,
    /// Topic and headers as [`encoded_size`] counts them, computed once.
    size: usize,
}

/// The headers of a message that has none.
static NO_HEADERS: Headers = Headers::new();

impl Envelope {
    /// An envelope for `topic` and `headers` (their number is checked by
    /// [`Draft::new`](super::Draft::new), not here).
    pub fn new(topic: Topic, headers: Headers) -> Self {
        let size = encoded_size(&topic, &[], &headers);
        let headers = (!headers.is_empty()).then(|| Box::new(headers));
        Self(triomphe::Arc::new(Parts {
            topic,
            headers,
            size,
        }))
    }

    /// Where it was published.
    pub fn topic(&self) -> &Topic {
        &self.0.topic
    }

    /// Application headers.
    pub fn headers(&self) -> &Headers {
        self.0.headers.as_deref().unwrap_or(&NO_HEADERS)
    }

    /// Topic and headers as counted against the limits.
    pub fn size(&self) -> usize {
        self.0.size
    }

    /// Whether `other` is this same envelope (one allocation), not merely an equal one.
    pub fn is_shared_with(&self, other: &Envelope) -> bool {
        triomphe::Arc::ptr_eq(&self.0, &other.0)
    }
}

impl fmt::Debug for Envelope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Envelope")
            .field("topic", self.topic())
            .field("headers", self.headers())
            .finish()
    }
}

/// What sits in front of the payload in a message's allocation.
struct Stamp {
    system_id: SystemId,
    published_at_ms: u64,
    envelope: Envelope,
}

/// A published message, immutable once published. Cloning it is one atomic increment; it is
/// one pointer wide.
#[derive(Clone)]
pub struct Message(ThinArc<Stamp, u8>);

impl Message {
    /// A message with its id and publish time; the payload is copied into the message's own
    /// allocation, so it never keeps a larger buffer (a request, a stream chunk) alive.
    pub fn new(
        system_id: SystemId,
        published_at_ms: u64,
        envelope: Envelope,
        payload: &[u8],
    ) -> Self {
        let stamp = Stamp {
            system_id,
            published_at_ms,
            envelope,
        };
        Self(ThinArc::from_header_and_slice(stamp, payload))
    }

    /// This message with `system_id` and `published_at_ms`, in place when nothing else holds
    /// it (a [`Draft`](super::Draft) being published), else as a copy.
    pub(super) fn stamped(mut self, system_id: SystemId, published_at_ms: u64) -> Self {
        let stamp = |stamp: &mut Stamp| {
            stamp.system_id = system_id;
            stamp.published_at_ms = published_at_ms;
        };
        let in_place = self.0.with_arc_mut(|arc| {
            triomphe::Arc::get_mut(arc)
                .map(|inner| stamp(inner.header_mut()))
                .is_some()
        });
        if in_place {
            self
        } else {
            Self::new(
                system_id,
                published_at_ms,
                self.envelope().clone(),
                self.payload(),
            )
        }
    }

    /// Broker-wide id.
    pub fn system_id(&self) -> SystemId {
        self.0.header.header.system_id
    }

    /// Publish time, milliseconds since the Unix epoch (from the broker's clock seam).
    pub fn published_at_ms(&self) -> u64 {
        self.0.header.header.published_at_ms
    }

    /// Its topic and headers.
    pub fn envelope(&self) -> &Envelope {
        &self.0.header.header.envelope
    }

    /// Where it was published.
    pub fn topic(&self) -> &Topic {
        self.envelope().topic()
    }

    /// Application headers.
    pub fn headers(&self) -> &Headers {
        self.envelope().headers()
    }

    /// Opaque payload.
    pub fn payload(&self) -> &[u8] {
        &self.0.slice
    }

    /// The payload as [`Bytes`] that keep this message alive instead of copying it (for a
    /// frame on the wire, or a dead letter's draft).
    pub fn payload_bytes(&self) -> Bytes {
        Bytes::from_owner(PayloadOf(self.clone()))
    }

    /// The bytes this message counts against size and queue limits: payload, topic and headers.
    pub fn size(&self) -> usize {
        self.envelope().size() + self.payload().len()
    }
}

/// A message seen as its payload, so [`Bytes`] can own it.
struct PayloadOf(Message);

impl AsRef<[u8]> for PayloadOf {
    fn as_ref(&self) -> &[u8] {
        self.0.payload()
    }
}

impl PartialEq for Message {
    fn eq(&self, other: &Self) -> bool {
        self.system_id() == other.system_id()
            && self.published_at_ms() == other.published_at_ms()
            && self.envelope() == other.envelope()
            && self.payload() == other.payload()
    }
}

impl Eq for Message {}

impl fmt::Debug for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Message")
            .field("system_id", &self.system_id())
            .field("topic", self.topic())
            .field("payload", &Bytes::copy_from_slice(self.payload()))
            .field("headers", self.headers())
            .field("published_at_ms", &self.published_at_ms())
            .finish()
    }
}

/// Most headers one message may carry.
pub const MAX_HEADERS: usize = 64;
/// What each header costs in memory beyond its bytes (two strings and a map slot), counted
/// against the limits so that many tiny headers cannot hide a large footprint.
pub const HEADER_OVERHEAD: usize = 64;

/// Size of a message's parts as counted against the limits.
pub fn encoded_size(topic: &Topic, payload: &[u8], headers: &Headers) -> usize {
    topic.as_str().len()
        + payload.len()
        + headers
            .iter()
            .map(|(k, v)| k.len() + v.len() + HEADER_OVERHEAD)
            .sum::<usize>()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(headers: Headers, payload: &[u8]) -> Message {
        let envelope = Envelope::new(Topic::parse("a.b").unwrap(), headers);
        Message::new(1, 7, envelope, payload)
    }

    // docs/semantics.md#limits-table: limits count topic, payload, and each header's key, value and overhead.
    #[test]
    fn size_counts_every_part() {
        let headers: Headers = [("k".into(), "vv".into()), ("key".into(), "".into())].into();
        assert_eq!(
            message(headers, b"xxxx").size(),
            3 + 4 + (1 + 2 + 64) + (3 + 64)
        );
    }

    // The public count adds the payload to the envelope's parts (a message stores only the
    // envelope's and adds its payload's length).
    #[test]
    fn encoded_size_adds_topic_payload_and_headers() {
        let headers: Headers = [("k".into(), "v".into())].into();
        let topic = Topic::parse("a.b").unwrap();
        assert_eq!(
            encoded_size(&topic, &[0; 100], &headers),
            3 + 100 + (1 + 1 + 64)
        );
    }

    // What a log line or a failed assertion shows of a message: its id, topic, payload,
    // headers and time; of an envelope, its topic and headers.
    #[test]
    fn debug_shows_every_part() {
        let headers: Headers = [("trace".into(), "t-1".into())].into();
        let m = message(headers, b"payload");
        let shown = format!("{m:?}");
        for part in [
            "system_id: 1",
            "a.b",
            "payload",
            "trace",
            "t-1",
            "published_at_ms: 7",
        ] {
            assert!(shown.contains(part), "{part:?} missing from {shown}");
        }
        let envelope = format!("{:?}", m.envelope());
        for part in ["Envelope", "a.b", "trace", "t-1"] {
            assert!(envelope.contains(part), "{part:?} missing from {envelope}");
        }
    }

    // The queue slot is one pointer (a million queued messages cost 8 MB of slots, not 16).
    #[test]
    fn a_message_is_one_word() {
        assert_eq!(size_of::<Message>(), size_of::<usize>());
    }

    // Publishing stamps the draft's own allocation in place; one still shared elsewhere is
    // copied instead, so the other holder keeps what it had.
    #[test]
    fn stamping_is_in_place_only_when_unshared() {
        let draft = message(Headers::new(), b"p");
        let at = draft.0.ptr();
        let stamped = draft.stamped(9, 10);
        assert_eq!((stamped.system_id(), stamped.published_at_ms()), (9, 10));
        assert_eq!(stamped.0.ptr(), at);
        let held = stamped.clone();
        let copy = stamped.stamped(11, 12);
        assert_eq!((copy.system_id(), copy.published_at_ms()), (11, 12));
        assert_eq!((held.system_id(), held.published_at_ms()), (9, 10));
        assert_eq!(copy.payload(), b"p");
        assert!(copy.envelope().is_shared_with(held.envelope()));
    }

    #[test]
    fn parts_read_back_as_given() {
        let headers: Headers = [("k".into(), "v".into())].into();
        let m = message(headers.clone(), b"payload");
        assert_eq!(m.system_id(), 1);
        assert_eq!(m.published_at_ms(), 7);
        assert_eq!(m.topic().as_str(), "a.b");
        assert_eq!(m.headers(), &headers);
        assert_eq!(m.payload(), b"payload");
        assert_eq!(m.payload_bytes(), Bytes::from_static(b"payload"));
        assert_eq!(m, m.clone());
        assert_ne!(m, message(headers, b"other"));
    }

    // docs/semantics.md#limits-table: the size limit counts the envelope and the payload together, and a message of
    // exactly the limit is accepted (one byte more is refused, naming its size and the limit).
    #[test]
    fn a_draft_may_reach_the_size_limit_but_not_pass_it() {
        use crate::core::{Draft, Error, Limits};
        let headers: Headers = [("k".into(), "v".into())].into();
        let envelope = Envelope::new(Topic::parse("a.b").unwrap(), headers);
        let max = envelope.size() + 10;
        let limits = Limits {
            max_message_bytes: max,
            ..Limits::default()
        };
        let draft = Draft::in_envelope(envelope.clone(), &[5; 10], &limits).unwrap();
        assert_eq!(draft.payload(), &[5; 10]);
        assert_eq!(draft.payload_bytes(), Bytes::from_static(&[5; 10]));
        assert_eq!(draft.size(), max);
        assert_eq!(
            Draft::in_envelope(envelope, &[5; 11], &limits).unwrap_err(),
            Error::MessageTooLarge { size: max + 1, max }
        );
    }
}
