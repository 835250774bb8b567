//! Message headers across NATS: every client header name and value carried exactly, and the
//! gateway's own marker on the dead letters it stores.
//!
//! NATS headers cannot carry everything a client may send (docs/semantics.md#cluster-headers):
//! a value loses its leading and trailing whitespace when a NATS client parses it and may not
//! hold a line break; a name must be printable ASCII without ':', and names starting `Nats-`
//! instruct JetStream. So a name or value that NATS would not carry unchanged is sent escaped,
//! marked by a prefix, with every byte outside printable ASCII (and `%`, and in names `:`) as
//! `%XX`; one that starts with the marker itself is escaped too, so decoding is exact. Names
//! keep their case: neither NATS nor JetStream folds it.

use async_nats::{HeaderName, HeaderValue};

use crate::core::{Error, Headers};

/// The NATS header that marks a dead letter a gateway stored with the subscription it came
/// from, so that subscription skips it (no loop). Never shown to clients; a client's header of
/// that name is carried escaped, so it never passes for the marker.
pub(in crate::cluster::gateway) const DEAD_LETTER_OF: &str = "tinybroker-gateway-dead-letter-of";

/// What starts an escaped header name.
const NAME_MARKER: &str = "tb-escaped-";
/// What starts an escaped header value.
const VALUE_MARKER: &str = "tb-escaped:";

/// Whether NATS carries `name` unchanged and as a plain header (not one that instructs it).
fn plain_name(name: &str) -> bool {
    !name.is_empty()
        && name.bytes().all(|b| b.is_ascii_graphic() && b != b':')
        // Bytes, not a `str` slice: a name may have a multi-byte character across byte 5.
        && !name
            .as_bytes()
            .get(..5)
            .is_some_and(|prefix| prefix.eq_ignore_ascii_case(b"nats-"))
        && !name.eq_ignore_ascii_case(DEAD_LETTER_OF)
        && !name.starts_with(NAME_MARKER)
}

/// Whether NATS carries `value` unchanged: a parsing client trims whitespace at both ends
/// (Unicode whitespace, `char::is_whitespace`), and line breaks end a header.
fn plain_value(value: &str) -> bool {
    !value.starts_with(char::is_whitespace)
        && !value.ends_with(char::is_whitespace)
        && !value.contains(['\r', '\n'])
        && !value.starts_with(VALUE_MARKER)
}

/// `marker` and `text` with every byte outside printable ASCII, `%` and the bytes of `also`
/// as `%XX`.
fn escape(marker: &str, text: &str, also: &[u8]) -> String {
    let mut out = String::with_capacity(marker.len() + text.len());
    out.push_str(marker);
    for byte in text.bytes() {
        if byte.is_ascii_graphic() && byte != b'%' && !also.contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// The text `escape` made after `marker`, or `None` when `text` is not such an escape (then
/// it is taken as it is).
fn unescape(marker: &str, text: &str) -> Option<String> {
    let rest = text.strip_prefix(marker)?;
    let mut bytes = Vec::with_capacity(rest.len());
    let mut input = rest.bytes();
    while let Some(byte) = input.next() {
        if byte == b'%' {
            let hex = [input.next()?, input.next()?];
            let hex = std::str::from_utf8(&hex).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
        } else {
            bytes.push(byte);
        }
    }
    String::from_utf8(bytes).ok()
}

/// Message headers as NATS headers, each name and value escaped when NATS would not carry it
/// unchanged.
///
/// # Errors
/// [`Error::Cluster`] (internal) if an escaped name or value were no NATS header's: escaping
/// leaves only printable ASCII, so it never is.
pub(in crate::cluster::gateway) fn nats_headers(
    headers: &Headers,
) -> Result<Vec<(String, String)>, Error> {
    let mut lines = Vec::with_capacity(headers.len());
    for (name, value) in headers {
        let name = if plain_name(name) {
            name.clone()
        } else {
            escape(NAME_MARKER, name, b":")
        };
        let value = if plain_value(value) {
            value.clone()
        } else {
            escape(VALUE_MARKER, value, &[])
        };
        let invalid = |what: &str| {
            Error::cluster(
                crate::core::ErrorKind::Internal,
                format!("an escaped header {what} is not a NATS header {what}: {name:?}"),
            )
        };
        name.parse::<HeaderName>().map_err(|_| invalid("name"))?;
        value.parse::<HeaderValue>().map_err(|_| invalid("value"))?;
        lines.push((name, value));
    }
    Ok(lines)
}

/// A client header as NATS carried it (`name`, `value` as a NATS client parsed them): what the
/// client sent.
pub(in crate::cluster::gateway) fn client_header(name: &str, value: &str) -> (String, String) {
    (
        unescape(NAME_MARKER, name).unwrap_or_else(|| name.to_string()),
        unescape(VALUE_MARKER, value).unwrap_or_else(|| value.to_string()),
    )
}

#[cfg(test)]
mod tests {
    use async_nats::HeaderMap;

    use super::*;

    /// The header block the lines go out as (`NatsJetStream` builds it so).
    fn as_map(lines: &[(String, String)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in lines {
            map.insert(
                name.parse::<HeaderName>().unwrap(),
                value.parse::<HeaderValue>().unwrap(),
            );
        }
        map
    }

    /// What a NATS client reads back from the header block `map` is written as.
    fn through_nats(map: &HeaderMap) -> Headers {
        let mut back = Headers::new();
        for (name, values) in map.iter() {
            // As async-nats parses a header line: the value trimmed at both ends.
            let value = values.last().unwrap().as_str().trim();
            let (name, value) = client_header(name.as_ref(), value);
            back.insert(name, value);
        }
        back
    }

    // docs/semantics.md#cluster-headers: every name and value comes back exactly, also those
    // NATS trims or cannot carry, and those that look like the escape.
    #[test]
    fn every_header_survives_nats_exactly() {
        let headers: Headers = [
            ("k", " v "),
            ("t", "\tx\t"),
            ("empty", ""),
            ("unicode", "ünï 😀"),
            ("spaces inside", "a b"),
            ("Case-Kept", "Mixed"),
            ("looks", "tb-escaped:%20"),
            ("tb-escaped-looks", "x"),
            ("nats-msg-id", "1"),
            ("Nats-Expected-Stream", "other"),
            ("abcdé", "é"),
            ("colon:name", "line\r\nbreak"),
            ("", "nameless"),
            (DEAD_LETTER_OF, "forged"),
            ("percent", "100%"),
            ("nbsp", "\u{a0}x\u{2003}"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let map = as_map(&nats_headers(&headers).unwrap());
        assert_eq!(through_nats(&map), headers);
        // Nothing escaped instructs JetStream or passes for the gateway's marker.
        for (name, _) in map.iter() {
            let name: &str = name.as_ref();
            assert!(!name.to_ascii_lowercase().starts_with("nats-"), "{name}");
            assert_ne!(name, DEAD_LETTER_OF);
        }
        // Plain ones go as they are.
        let plain = nats_headers(&Headers::from([("trace-id".into(), "abc".into())])).unwrap();
        assert_eq!(plain, [("trace-id".to_string(), "abc".to_string())]);
    }

    // A NATS header that is no escape of this gateway's (sent by another NATS client) is taken
    // as it is.
    #[test]
    fn a_broken_escape_is_taken_as_it_is() {
        for value in ["tb-escaped:%", "tb-escaped:%G1", "tb-escaped:%FF"] {
            assert_eq!(client_header("k", value).1, value);
        }
    }
}
