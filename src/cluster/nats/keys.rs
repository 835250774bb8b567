//! The bucket's keys and answers as NATS spells them: the seam's keys encoded into KV keys and
//! back (see "Keys" in the module doc of [`super`]), watch filters for a prefix, delete markers,
//! and the numbers in a refused compare-and-set.

use std::fmt::Write as _;

use async_nats::HeaderMap;

use super::KV_OPERATION;
use crate::cluster::backplane::Revision;

pub(crate) fn is_deletion(headers: &HeaderMap) -> bool {
    matches!(
        headers.get(KV_OPERATION).map(|v| v.as_str()),
        Some("DEL" | "PURGE")
    )
}

/// The N of JetStream's "wrong last sequence: N" (error 10071) in async-nats's rendering of the
/// error, "wrong last sequence: wrong last sequence: N (code 400, error code 10071)": the kind,
/// then the server's description.
/// Whether a refused publish was refused because the key moved on. A clustered stream may
/// refuse a compare-and-set with error code 10164, "wrong last sequence" without the number,
/// which async-nats does not classify as [`PublishErrorKind::WrongLastSequence`] (that is
/// code 10071, with the number): taken for "unavailable", it held every such conflict up for a
/// retry delay instead of retrying once the watch moved on.
pub(super) fn is_stale(text: &str) -> bool {
    text.contains("wrong last sequence") || text.contains("error code 10164")
}

pub(super) fn last_sequence_in(text: &str) -> Option<Revision> {
    const MARK: &str = "wrong last sequence: ";
    let rest = &text[text.rfind(MARK)? + MARK.len()..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

pub(super) fn plain(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'/')
}

/// A seam key as a valid KV key (see "Keys" in the module doc).
pub fn encode_key(key: &str) -> String {
    let bytes = key.as_bytes();
    let mut out = String::with_capacity(key.len());
    for (i, &byte) in bytes.iter().enumerate() {
        let token_dot = byte == b'.' && i > 0 && i + 1 < bytes.len() && bytes[i - 1] != b'.';
        if plain(byte) || token_dot {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "={byte:02X}");
        }
    }
    out
}

/// The inverse of [`encode_key`]; text that is not an encoding is kept as it is.
pub fn decode_key(encoded: &str) -> String {
    let bytes = encoded.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'=', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Subject filters (relative to the bucket) that match every key starting with `prefix`, as
/// narrow as the prefix's complete tokens allow; the watch filters exactly by decoded key.
pub(super) fn watch_filters(prefix: &str) -> Vec<String> {
    let Some(cut) = prefix.rfind('.') else {
        return vec![">".to_string()];
    };
    // "a.b." or "a.b.c": keys under it all start with the complete tokens "a.b".
    let head = &prefix[..cut];
    if head.is_empty()
        || head
            .split('.')
            .any(|t| t.is_empty() || !t.bytes().all(plain))
    {
        return vec![">".to_string()];
    }
    // A key "a.b.<more>" encodes to "a.b.<...>", except "a.b." itself, whose trailing dot is
    // escaped.
    vec![format!("{head}.>"), format!("{head}=2E")]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_encode_to_valid_kv_keys_and_back() {
        for key in [
            "sub.orders",
            "lease.17",
            "sub.a b*>",
            "sub..x",
            ".lead",
            "trail.",
            "sub.=2E",
            "sub.ünï",
            "",
        ] {
            let encoded = encode_key(key);
            assert_eq!(decode_key(&encoded), key, "{key:?} -> {encoded:?}");
            if !key.is_empty() {
                assert!(
                    !encoded.starts_with('.') && !encoded.ends_with('.'),
                    "{encoded:?}"
                );
                assert!(!encoded.contains(".."), "{encoded:?}");
                assert!(encoded.bytes().all(|b| plain(b) || b == b'.' || b == b'='));
            }
        }
        assert_eq!(encode_key("sub.orders"), "sub.orders");
    }

    #[test]
    fn both_forms_of_a_refused_compare_and_set_are_conflicts() {
        let clustered = "publish failed: wrong last sequence (code 400, error code 10164)";
        assert!(is_stale(clustered));
        assert_eq!(last_sequence_in(clustered), None, "no number: read it");
        let single = "wrong last sequence: 17";
        assert!(is_stale(single));
        assert_eq!(last_sequence_in(single), Some(17));
        assert!(!is_stale("publish failed: timed out"));
    }

    #[test]
    fn watch_filters_cover_every_key_under_the_prefix() {
        assert_eq!(watch_filters(""), [">"]);
        assert_eq!(watch_filters("sub"), [">"]);
        assert_eq!(watch_filters("sub."), ["sub.>", "sub=2E"]);
        assert_eq!(watch_filters("sub.ab"), ["sub.>", "sub=2E"]);
        assert_eq!(watch_filters("a b.c"), [">"]);
        assert_eq!(encode_key("sub."), "sub=2E");
    }

    #[test]
    fn the_current_sequence_is_read_from_the_refusal() {
        assert_eq!(
            last_sequence_in(
                "wrong last sequence: wrong last sequence: 42 (code 400, error code 10071)"
            ),
            Some(42)
        );
        assert_eq!(last_sequence_in("wrong last sequence"), None);
        assert_eq!(last_sequence_in("timed out"), None);
    }
}
