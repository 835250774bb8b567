//! How the server writes `SubscriptionFrame`s. A delivered message is encoded straight from the
//! broker's message, with no protobuf struct built for it (no topic string, header map or
//! timestamp allocated per member), and what its deliveries have in common (`system_id`,
//! `topic`, `headers`, `published_at`) is encoded once per publish when several subscriptions
//! get it ([`SharedEncoding`]). Each member writes only its own fields beside it: the payload
//! (copied from the message, never held twice), `delivery_attempt` and `epoch`.
//!
//! The bytes are a valid encoding of the same `SubscriptionFrame` a client decodes with the
//! generated types: fields come in the order shared then own (1, 2, 4, 6, then 3, 5, 7), which
//! protobuf decoders accept, and a field at its default value is left out, as prost does.

use bytes::{Buf, BufMut};
use prost::{
    DecodeError,
    encoding::{DecodeContext, WireType, encode_key, encode_varint, encoded_len_varint, key_len},
};
use tonic::Status;

use crate::{
    broker::{Outbound, SharedEncoding},
    core::Message,
    pb,
};

// Field numbers of `SubscriptionFrame`, `DeliveredMessage`, its headers' map entries and
// `google.protobuf.Timestamp`.
const FRAME_MESSAGE: u32 = 2;
const SYSTEM_ID: u32 = 1;
const TOPIC: u32 = 2;
const PAYLOAD: u32 = 3;
const HEADERS: u32 = 4;
const DELIVERY_ATTEMPT: u32 = 5;
const PUBLISHED_AT: u32 = 6;
const EPOCH: u32 = 7;
const ENTRY_KEY: u32 = 1;
const ENTRY_VALUE: u32 = 2;
const SECONDS: u32 = 1;
const NANOS: u32 = 2;

/// Largest envelope (topic and headers, as the limits count them) whose encoding is shared.
/// A shared encoding lives as long as the slowest member's frame of its message waits, beside
/// the message the budget counts; bounding it keeps that extra small next to the message.
/// Larger envelopes are encoded by each member, as unshared deliveries are.
pub const MAX_SHARED_ENVELOPE: usize = 512;

/// A `SubscriptionFrame` as the server's `Subscribe` and `Consume` streams write it.
#[derive(Debug, Clone, PartialEq)]
pub enum WireFrame {
    /// A delivered message, written from the broker's message.
    Delivery(Delivery),
    /// Any other frame, in its protobuf form. Boxed: frames move by value through several
    /// stream layers on their way to the encoder, and a delivery is a few words where a
    /// `SubscriptionFrame` is about 150 bytes, so an unboxed one made every delivery's move a
    /// `memcpy` of that size.
    Frame(Box<pb::SubscriptionFrame>),
}

impl Default for WireFrame {
    fn default() -> Self {
        Self::Frame(Box::default())
    }
}

impl WireFrame {
    /// The wire form of a domain frame; an `End` becomes the stream's final status.
    pub fn of(outbound: Outbound) -> Result<Self, Status> {
        match outbound {
            Outbound::Message {
                message,
                attempt,
                epoch,
                shared,
            } => Ok(Self::Delivery(Delivery::new(
                message, attempt, epoch, shared,
            ))),
            other => super::frame(other).map(|frame| Self::Frame(Box::new(frame))),
        }
    }
}

/// One member's frame delivering a message.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    message: Message,
    attempt: u32,
    epoch: u64,
    /// Filled (by this frame, if it is the first) when the message went to several
    /// subscriptions at its publish; else the shared fields are encoded in place.
    shared: Option<SharedEncoding>,
    /// Length of the `DeliveredMessage` inside the frame.
    body_len: usize,
}

impl Delivery {
    fn new(message: Message, attempt: u32, epoch: u64, shared: Option<SharedEncoding>) -> Self {
        let shared = shared.filter(|_| message.envelope().size() <= MAX_SHARED_ENVELOPE);
        let common_len = match &shared {
            Some(shared) => shared.get_or_init(|| encode_common(&message)).len(),
            None => common_len(&message),
        };
        let body_len = common_len + own_len(&message, attempt, epoch);
        Self {
            message,
            attempt,
            epoch,
            shared,
            body_len,
        }
    }

    /// The protobuf form of this frame, as the generated types build it.
    pub fn to_frame(&self) -> pb::SubscriptionFrame {
        let outbound = Outbound::Message {
            message: self.message.clone(),
            attempt: self.attempt,
            epoch: self.epoch,
            shared: None,
        };
        super::frame(outbound).expect("a message frame is never an end")
    }

    fn encode_raw(&self, buf: &mut impl BufMut) {
        encode_key(FRAME_MESSAGE, WireType::LengthDelimited, buf);
        encode_varint(self.body_len as u64, buf);
        match self.shared.as_ref().and_then(SharedEncoding::get) {
            Some(common) => buf.put_slice(common),
            None => put_common(&self.message, buf),
        }
        let payload = self.message.payload();
        if !payload.is_empty() {
            put_bytes(PAYLOAD, payload, buf);
        }
        put_varint(DELIVERY_ATTEMPT, u64::from(self.attempt), buf);
        put_varint(EPOCH, self.epoch, buf);
    }

    fn encoded_len(&self) -> usize {
        key_len(FRAME_MESSAGE) + encoded_len_varint(self.body_len as u64) + self.body_len
    }
}

fn encode_common(message: &Message) -> Box<[u8]> {
    let mut bytes = Vec::with_capacity(common_len(message));
    put_common(message, &mut bytes);
    bytes.into_boxed_slice()
}

/// `published_at` as `service::timestamp` gives it: (seconds, nanos).
fn timestamp(message: &Message) -> (u64, u64) {
    let millis = message.published_at_ms();
    (millis / 1000, (millis % 1000) * 1_000_000)
}

fn timestamp_len(seconds: u64, nanos: u64) -> usize {
    varint_field_len(SECONDS, seconds) + varint_field_len(NANOS, nanos)
}

fn entry_len(key: &str, value: &str) -> usize {
    bytes_field_len(ENTRY_KEY, key.as_bytes()) + bytes_field_len(ENTRY_VALUE, value.as_bytes())
}

/// The fields every delivery of `message` has: `system_id`, `topic`, `headers`, `published_at`.
fn put_common(message: &Message, buf: &mut impl BufMut) {
    put_varint(SYSTEM_ID, message.system_id(), buf);
    put_bytes(TOPIC, message.topic().as_str().as_bytes(), buf);
    for (key, value) in message.headers() {
        encode_key(HEADERS, WireType::LengthDelimited, buf);
        encode_varint(entry_len(key, value) as u64, buf);
        put_bytes(ENTRY_KEY, key.as_bytes(), buf);
        put_bytes(ENTRY_VALUE, value.as_bytes(), buf);
    }
    let (seconds, nanos) = timestamp(message);
    // A message field is written even when empty: `published_at` is always set.
    encode_key(PUBLISHED_AT, WireType::LengthDelimited, buf);
    encode_varint(timestamp_len(seconds, nanos) as u64, buf);
    put_varint(SECONDS, seconds, buf);
    put_varint(NANOS, nanos, buf);
}

fn common_len(message: &Message) -> usize {
    let (seconds, nanos) = timestamp(message);
    let timestamp_len = timestamp_len(seconds, nanos);
    varint_field_len(SYSTEM_ID, message.system_id())
        + bytes_field_len(TOPIC, message.topic().as_str().as_bytes())
        + message
            .headers()
            .iter()
            .map(|(key, value)| {
                let len = entry_len(key, value);
                key_len(HEADERS) + encoded_len_varint(len as u64) + len
            })
            .sum::<usize>()
        + key_len(PUBLISHED_AT)
        + encoded_len_varint(timestamp_len as u64)
        + timestamp_len
}

/// The fields of one member's delivery: `payload`, `delivery_attempt`, `epoch`.
fn own_len(message: &Message, attempt: u32, epoch: u64) -> usize {
    bytes_field_len(PAYLOAD, message.payload())
        + varint_field_len(DELIVERY_ATTEMPT, u64::from(attempt))
        + varint_field_len(EPOCH, epoch)
}

/// A varint field, left out at its default (0).
fn put_varint(tag: u32, value: u64, buf: &mut impl BufMut) {
    if value != 0 {
        encode_key(tag, WireType::Varint, buf);
        encode_varint(value, buf);
    }
}

fn varint_field_len(tag: u32, value: u64) -> usize {
    if value == 0 {
        0
    } else {
        key_len(tag) + encoded_len_varint(value)
    }
}

/// A string or bytes field, left out at its default (empty).
fn put_bytes(tag: u32, bytes: &[u8], buf: &mut impl BufMut) {
    if !bytes.is_empty() {
        encode_key(tag, WireType::LengthDelimited, buf);
        encode_varint(bytes.len() as u64, buf);
        buf.put_slice(bytes);
    }
}

fn bytes_field_len(tag: u32, bytes: &[u8]) -> usize {
    if bytes.is_empty() {
        0
    } else {
        key_len(tag) + encoded_len_varint(bytes.len() as u64) + bytes.len()
    }
}

impl prost::Message for WireFrame {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        match self {
            Self::Delivery(delivery) => delivery.encode_raw(buf),
            Self::Frame(frame) => frame.encode_raw(buf),
        }
    }

    /// The server never reads frames; decoding one yields its protobuf form.
    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        if let Self::Delivery(delivery) = self {
            *self = Self::Frame(Box::new(delivery.to_frame()));
        }
        match self {
            Self::Frame(frame) => frame.merge_field(tag, wire_type, buf, ctx),
            Self::Delivery(_) => unreachable!("replaced above"),
        }
    }

    fn encoded_len(&self) -> usize {
        match self {
            Self::Delivery(delivery) => delivery.encoded_len(),
            Self::Frame(frame) => frame.encoded_len(),
        }
    }

    fn clear(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use prost::Message as _;

    use super::*;
    use crate::core::{Envelope, Headers, Topic};

    fn message(
        system_id: u64,
        published_at_ms: u64,
        topic: &str,
        headers: Headers,
        payload: &[u8],
    ) -> Message {
        let envelope = Envelope::new(Topic::parse(topic).unwrap(), headers);
        Message::new(system_id, published_at_ms, envelope, payload)
    }

    fn delivery(
        message: &Message,
        attempt: u32,
        epoch: u64,
        shared: Option<&SharedEncoding>,
    ) -> Outbound {
        Outbound::Message {
            message: message.clone(),
            attempt,
            epoch,
            shared: shared.cloned(),
        }
    }

    /// What the frame the server writes for `outbound` decodes to, beside the protobuf frame
    /// built as before: they must be equal, and the encoding as long as prost's (no field at
    /// its default written, none left out).
    fn check(outbound: Outbound) {
        let expected = crate::service::frame(outbound.clone()).unwrap();
        let wire = WireFrame::of(outbound).unwrap();
        let bytes = wire.encode_to_vec();
        assert_eq!(bytes.len(), wire.encoded_len());
        assert_eq!(bytes.len(), expected.encoded_len());
        let decoded = pb::SubscriptionFrame::decode(&bytes[..]).unwrap();
        assert_eq!(decoded, expected);
    }

    fn payload() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            Just(Vec::new()),
            prop::collection::vec(any::<u8>(), 1..300),
            // Lengths whose varint takes three bytes, and the default message size limit.
            (16_384usize..70_000).prop_map(|n| vec![0xa5; n]),
            Just(vec![7; 1 << 20]),
        ]
    }

    fn headers() -> impl Strategy<Value = Headers> {
        prop::collection::btree_map("[a-z]{0,3}|é[a-z]{0,200}", "[ -~]{0,3}|[a-z]{130}", 0..4)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        // Issue 16: a delivered message is written without its protobuf struct, and what its
        // deliveries share is encoded once; every field still decodes to what the protobuf
        // frame held, for any message, attempt and epoch, shared or not.
        #[test]
        fn delivered_frames_decode_to_the_protobuf_frame(
            system_id in prop_oneof![Just(0u64), any::<u64>()],
            published_at_ms in prop_oneof![Just(0u64), Just(999), Just(1000), any::<u64>()],
            topic in "[a-z]{1,8}(\\.[a-z0-9]{1,8}){0,3}",
            headers in headers(),
            payload in payload(),
            attempts in prop::collection::vec(
                (prop_oneof![Just(0u32), Just(1), any::<u32>()], prop_oneof![Just(0u64), any::<u64>()]),
                1..4,
            ),
        ) {
            let message = message(system_id, published_at_ms, &topic, headers, &payload);
            let shared = SharedEncoding::default();
            for (attempt, epoch) in attempts {
                check(delivery(&message, attempt, epoch, None));
                // The first fills the shared encoding, the later ones reuse it.
                check(delivery(&message, attempt, epoch, Some(&shared)));
            }
            let small = message.envelope().size() <= MAX_SHARED_ENVELOPE;
            prop_assert_eq!(shared.get().is_some(), small);
        }
    }

    // Every other frame is the protobuf frame itself.
    #[test]
    fn other_frames_are_written_as_before() {
        let outbound = Outbound::Confirm {
            subscription_id: "s".into(),
            member_id: 3,
            epoch: 9,
        };
        check(outbound);
    }

    // The shared encoding holds what deliveries have in common, never the payload: a frame
    // waiting in a slow member's outlet must not keep a second copy of it.
    #[test]
    fn the_shared_encoding_leaves_the_payload_out() {
        let message = message(5, 1_700_000_000_123, "a.b", Headers::new(), &[1; 4096]);
        let shared = SharedEncoding::default();
        check(delivery(&message, 1, 2, Some(&shared)));
        assert!(shared.get().unwrap().len() < 64);
    }

    // A large envelope is encoded by each member instead: its shared copy could wait as long
    // as the slowest member's frame, outside the memory budget.
    #[test]
    fn a_large_envelope_is_not_shared() {
        let headers: Headers = [("k".to_string(), "v".repeat(MAX_SHARED_ENVELOPE))].into();
        let message = message(5, 1_700_000_000_123, "a.b", headers, b"payload");
        let shared = SharedEncoding::default();
        check(delivery(&message, 1, 2, Some(&shared)));
        assert!(shared.get().is_none());
    }
}
