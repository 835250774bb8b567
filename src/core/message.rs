//! Published messages. One [`Message`] is shared (`Arc`) by every subscription it is queued on, so
//! fan-out costs a pointer per queue, not a copy of the payload.

use std::{collections::BTreeMap, sync::Arc};

use bytes::Bytes;

use super::topic::Topic;

/// Broker-wide message id, increasing in publish order.
pub type SystemId = u64;

/// Message headers, in key order so their rendering is deterministic.
pub type Headers = BTreeMap<String, String>;

/// A published message, immutable once published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Broker-wide id.
    pub system_id: SystemId,
    /// Where it was published.
    pub topic: Topic,
    /// Opaque payload.
    pub payload: Bytes,
    /// Application headers.
    pub headers: Arc<Headers>,
    /// Publish time, milliseconds since the Unix epoch (from the broker's clock seam).
    pub published_at_ms: u64,
}

impl Message {
    /// The bytes this message counts against size and queue limits: payload, topic and headers.
    pub fn size(&self) -> usize {
        encoded_size(&self.topic, &self.payload, &self.headers)
    }
}

/// The headers of every message that has none: one shared allocation instead of one each (a
/// million queued messages would otherwise cost 48 MB of empty maps).
pub fn no_headers() -> Arc<Headers> {
    static EMPTY: std::sync::LazyLock<Arc<Headers>> = std::sync::LazyLock::new(Arc::default);
    EMPTY.clone()
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

    // SPEC §6: limits count topic, payload, and each header's key, value and overhead.
    #[test]
    fn size_counts_every_part() {
        let headers: Headers = [("k".into(), "vv".into()), ("key".into(), "".into())].into();
        let message = Message {
            system_id: 1,
            topic: Topic::parse("a.b").unwrap(),
            payload: Bytes::from_static(b"xxxx"),
            headers: Arc::new(headers),
            published_at_ms: 0,
        };
        assert_eq!(message.size(), 3 + 4 + (1 + 2 + 64) + (3 + 64));
    }
}
