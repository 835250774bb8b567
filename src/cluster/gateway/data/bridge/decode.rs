//! A JetStream message decoded into the local broker's message: its topic from the subject,
//! the client's headers carried exactly, JetStream's own dropped, and the dead-letter mark read.

use crate::cluster::gateway::DEAD_LETTER_OF;
use crate::core::{Envelope, Headers, Message, Topic};

/// The broker message a JetStream message carries, and the subscription whose dead letter it
/// is, if a gateway stored it as one. A message without headers to `last`'s topic shares
/// `last`; one without headers to another topic becomes the new `last`.
pub(super) fn decode(
    prefix: &str,
    message: &crate::cluster::jetstream::Delivery,
    sequence: u64,
    published_nanos: i128,
    last: &mut Option<Envelope>,
) -> Result<(Message, Option<String>), String> {
    let topic = crate::cluster::gateway::wire::names::topic_of(prefix, message.subject())
        .ok_or_else(|| format!("subject {} is outside {prefix}.>", message.subject()))?;
    let mut headers = Headers::new();
    let mut dead_letter_of = None;
    message.for_each_header(|name, value| {
        // The gateway's own headers: its dead-letter mark, and JetStream's (`Nats-`: each
        // publish's message id, an atomic batch's id, place and commit). A client's header
        // named so travels escaped.
        if name == DEAD_LETTER_OF {
            dead_letter_of = Some(value.to_string());
        } else if !is_jetstream_header(name) {
            let (name, value) = crate::cluster::gateway::wire::headers::client_header(name, value);
            headers.insert(name, value);
        }
    });
    let envelope = match last {
        Some(envelope) if headers.is_empty() && envelope.topic().as_str() == topic => {
            envelope.clone()
        }
        _ => {
            let topic = Topic::parse(topic).map_err(|e| e.to_string())?;
            let envelope = Envelope::new(topic, headers);
            if envelope.headers().is_empty() {
                *last = Some(envelope.clone());
            }
            envelope
        }
    };
    let decoded = Message::new(
        sequence,
        u64::try_from(published_nanos / 1_000_000).unwrap_or(0),
        envelope,
        message.payload(),
    );
    Ok((decoded, dead_letter_of))
}

/// Whether `name` is a header JetStream reads or writes (`Nats-…`, any case): never a
/// client's, which travels escaped (`headers`).
fn is_jetstream_header(name: &str) -> bool {
    name.as_bytes()
        .get(..5)
        .is_some_and(|prefix| prefix.eq_ignore_ascii_case(b"nats-"))
}

#[cfg(test)]
mod tests {
    use super::*;

    // docs/cluster.md#subscriptions-and-consumers: an idle leader's pulls wait 15, 30, 60, 120,
    // then 240 ms at most; the first pull after a message waits 15 ms again.

    fn delivery(subject: &str, headers: &[(&str, &str)]) -> crate::cluster::jetstream::Delivery {
        crate::cluster::jetstream::Delivery::new(
            subject.to_string(),
            headers
                .iter()
                .map(|(name, value)| (name.to_string(), value.to_string()))
                .collect(),
            bytes::Bytes::from_static(b"payload"),
            None,
            Err("not needed here".to_string()),
        )
    }

    fn decoded(
        last: &mut Option<Envelope>,
        subject: &str,
        headers: &[(&str, &str)],
    ) -> Result<(Message, Option<String>), String> {
        decode("p", &delivery(subject, headers), 1, 0, last)
    }

    // Messages to one topic without headers share one envelope; a message with headers, to
    // another topic, or to an invalid one gets its own (and is checked).
    #[test]
    fn messages_to_one_topic_share_an_envelope() {
        let mut last = None;
        let (first, _) = decoded(&mut last, "p.a.b", &[]).unwrap();
        let (second, _) = decoded(&mut last, "p.a.b", &[("Nats-Batch-Id", "x")]).unwrap();
        assert!(second.envelope().is_shared_with(first.envelope()));
        assert!(
            second.envelope().headers().is_empty(),
            "JetStream's headers dropped"
        );
        let (with_header, _) = decoded(&mut last, "p.a.b", &[("k", " v ")]).unwrap();
        assert!(!with_header.envelope().is_shared_with(first.envelope()));
        assert_eq!(
            with_header
                .envelope()
                .headers()
                .get("k")
                .map(String::as_str),
            Some(" v ")
        );
        let (third, _) = decoded(&mut last, "p.a.b", &[]).unwrap();
        assert!(
            third.envelope().is_shared_with(first.envelope()),
            "a message with headers does not replace the shared one"
        );
        let (other, _) = decoded(&mut last, "p.a.c", &[]).unwrap();
        assert_eq!(other.topic().as_str(), "a.c");
        assert!(!other.envelope().is_shared_with(first.envelope()));
        assert!(decoded(&mut last, "p.a..c", &[]).is_err());
        assert!(decoded(&mut last, "q.a.c", &[]).is_err());
    }

    // The dead-letter mark names the subscription and never reaches members.
    #[test]
    fn the_dead_letter_mark_is_read_and_dropped() {
        let mut last = None;
        let (message, of) = decoded(&mut last, "p.dead", &[(DEAD_LETTER_OF, "orders")]).unwrap();
        assert_eq!(of.as_deref(), Some("orders"));
        assert!(message.envelope().headers().is_empty());
        let (_, of) = decoded(&mut last, "p.dead", &[]).unwrap();
        assert_eq!(of, None);
    }
}
