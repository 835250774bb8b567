//! Message headers across NATS: what a client's headers may be in cluster mode, and the
//! gateway's own marker on the dead letters it stores.

use async_nats::{HeaderMap, HeaderName, HeaderValue};

use crate::core::Error;

/// The NATS header that marks a dead letter a gateway stored with the subscription it came
/// from, so that subscription skips it (no loop). Never shown to clients, and refused on their
/// publishes: a client's message, even one carrying a dead letter's
/// `tinybroker-dead-letter-*` headers, is delivered like any other.
pub(super) const DEAD_LETTER_OF: &str = "tinybroker-gateway-dead-letter-of";

/// Message headers as NATS headers. NATS header names are ASCII without ':' or whitespace,
/// values have no line breaks, and names starting `Nats-` instruct JetStream: those are
/// refused, never sent.
pub(super) fn nats_headers(headers: &crate::core::Headers) -> Result<HeaderMap, Error> {
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        // Bytes, not a `str` slice: a name may have a multi-byte character across byte 5.
        if name
            .as_bytes()
            .get(..5)
            .is_some_and(|prefix| prefix.eq_ignore_ascii_case(b"nats-"))
        {
            return Err(Error::InvalidArgument(format!(
                "header {name:?}: names starting with Nats- are reserved by NATS in cluster mode"
            )));
        }
        if name.eq_ignore_ascii_case(DEAD_LETTER_OF) {
            return Err(Error::InvalidArgument(format!(
                "header {name:?} is reserved in cluster mode: gateways mark their dead letters with it"
            )));
        }
        let header: HeaderName = name.parse().map_err(|_| {
            Error::InvalidArgument(format!(
                "header {name:?} cannot be carried in cluster mode: NATS header names are ASCII without ':', spaces or control characters"
            ))
        })?;
        let value: HeaderValue = value.parse().map_err(|_| {
            Error::InvalidArgument(format!(
                "the value of header {name:?} cannot be carried in cluster mode: no line breaks"
            ))
        })?;
        map.insert(header, value);
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    // docs/semantics.md#bad-input: nothing a client sends panics the broker. A header name with a multi-byte
    // character across its fifth byte used to be sliced there (a panic in cluster mode).
    #[test]
    fn header_names_are_checked_without_slicing_inside_a_character() {
        let headers = |name: &str| crate::core::Headers::from([(name.to_string(), "v".into())]);
        let refused = nats_headers(&headers("abcdé")).unwrap_err();
        assert!(matches!(refused, Error::InvalidArgument(_)), "{refused:?}");
        let reserved = nats_headers(&headers("NATS-Msg-Id")).unwrap_err();
        assert!(reserved.to_string().contains("reserved"), "{reserved:?}");
        let marker = nats_headers(&headers("Tinybroker-Gateway-Dead-Letter-Of")).unwrap_err();
        assert!(marker.to_string().contains("reserved"), "{marker:?}");
        assert!(nats_headers(&headers("tinybroker-dead-letter-subscription")).is_ok());
        assert!(nats_headers(&headers("trace-id")).is_ok());
        assert!(nats_headers(&headers("nats")).is_ok());
    }
}
