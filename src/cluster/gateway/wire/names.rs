//! How tinybroker's names map onto JetStream's: subjects for topics and patterns, consumer names
//! for subscription ids, and the subscription's settings kept in its consumer's metadata so
//! that every gateway checks a join against the same record.

use std::collections::{BTreeSet, HashMap};

use crate::core::{AckMode, Mode, Overflow, Pattern, SubscriptionSpec, Topic};

/// A topic's or pattern's subject: `<prefix>.<topic>`. Topics are already NATS-shaped (docs/semantics.md#topics-and-patterns:
/// dot-separated non-empty tokens without whitespace, `*` or `>`), and patterns use NATS
/// wildcards, so the mapping is the identity behind the prefix.
pub fn subject(prefix: &str, topic: &str) -> String {
    format!("{prefix}.{topic}")
}

/// The topic a stream subject carries, if it is under `prefix`.
pub fn topic_of<'a>(prefix: &str, subject: &'a str) -> Option<&'a str> {
    subject.strip_prefix(prefix)?.strip_prefix('.')
}

/// The filter subjects of a subscription's consumer for its `patterns` (as patterns, before
/// the stream's prefix), and whether they match exactly what the patterns match. JetStream
/// refuses a consumer whose filter subjects overlap (some subject matches two of them: `x.*.c`
/// and `x.>`, `a.*.c` and `a.b.*`, a pattern twice), while a subscription may have such
/// patterns (docs/semantics.md#cluster-patterns). So a pattern another covers is left out
/// (exact still), and two that overlap otherwise are replaced by the narrowest pattern covering
/// both (`a.*.c` and `a.b.*` by `a.*.*`; not exact: the consumer then brings messages the
/// subscription does not want, which its bridge acks without delivering). Computed from the
/// patterns as a set, in one order, so every gateway computes the same filters for the same
/// subscription.
pub fn filters(patterns: &[Pattern]) -> (Vec<String>, bool) {
    let mut set: BTreeSet<Vec<String>> = patterns
        .iter()
        .map(|p| p.as_str().split('.').map(str::to_string).collect())
        .collect();
    let mut exact = true;
    loop {
        let covered: Vec<Vec<String>> = set
            .iter()
            .filter(|p| set.iter().any(|q| q != *p && covers(q, p)))
            .cloned()
            .collect();
        for p in &covered {
            set.remove(p);
        }
        let pair = set.iter().enumerate().find_map(|(i, p)| {
            set.iter()
                .skip(i + 1)
                .find(|q| collide(p, q))
                .map(|q| (p.clone(), q.clone()))
        });
        let Some((p, q)) = pair else { break };
        exact = false;
        set.remove(&p);
        set.remove(&q);
        set.insert(generalise(&p, &q));
    }
    (set.into_iter().map(|p| p.join(".")).collect(), exact)
}

/// Whether every subject `q` matches, `p` matches too (patterns as tokens).
fn covers(p: &[String], q: &[String]) -> bool {
    for i in 0.. {
        match (p.get(i).map(String::as_str), q.get(i).map(String::as_str)) {
            (Some(">"), Some(_)) | (None, None) => return true,
            (Some("*"), Some(">")) | (None, Some(_)) | (Some(_), None) => return false,
            (Some("*"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (Some(_), Some(_)) => return false,
        }
    }
    unreachable!("a pattern has at most 32 tokens")
}

/// Whether some subject matches both `p` and `q` (JetStream's "overlapping" filters).
fn collide(p: &[String], q: &[String]) -> bool {
    for i in 0.. {
        match (p.get(i).map(String::as_str), q.get(i).map(String::as_str)) {
            (None, None) | (Some(">"), Some(_)) | (Some(_), Some(">")) => return true,
            (None, Some(_)) | (Some(_), None) => return false,
            (Some("*"), Some(_)) | (Some(_), Some("*")) => {}
            (Some(a), Some(b)) if a == b => {}
            (Some(_), Some(_)) => return false,
        }
    }
    unreachable!("a pattern has at most 32 tokens")
}

/// The narrowest pattern covering both `p` and `q`, which collide: their common tokens, `*`
/// where they differ, and `>` from where either has it.
fn generalise(p: &[String], q: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for (a, b) in p.iter().zip(q) {
        if a == ">" || b == ">" {
            out.push(">".to_string());
            return out;
        }
        out.push(if a == b { a.clone() } else { "*".to_string() });
    }
    if p.len() != q.len() {
        // Colliding patterns of different lengths meet a `>` above; kept covering all the same.
        out.push(">".to_string());
    }
    out
}

/// The longest name this builds; JetStream's API subjects carry it, so keep well under 255.
const MAX_NAME: usize = 160;

/// The durable consumer of a subscription. A QUEUE subscription has one, shared by every
/// gateway, so JetStream spreads its messages over them; a BROADCAST subscription (one stream,
/// one member) gets its own per gateway. Characters a consumer name may not hold (`.`, `*`,
/// `>`, whitespace, slashes, anything outside `[A-Za-z0-9-]`) are escaped as `_xx`; an id too
/// long for that is named by a 128-bit hash, and the id itself is kept in the consumer's
/// metadata and compared on every join, so a collision is refused, never shared.
pub fn consumer_name(mode: Mode, subscription_id: &str, gateway: &str) -> String {
    let mut escaped = String::with_capacity(subscription_id.len());
    for byte in subscription_id.bytes() {
        if byte.is_ascii_alphanumeric() || byte == b'-' {
            escaped.push(byte as char);
        } else {
            escaped.push_str(&format!("_{byte:02x}"));
        }
    }
    if escaped.len() > MAX_NAME - 40 {
        escaped = format!(
            "h_{:016x}{:016x}",
            fnv1a(subscription_id.as_bytes(), 0xcbf2_9ce4_8422_2325),
            fnv1a(subscription_id.as_bytes(), 0x6c62_272e_07bb_0142)
        );
    }
    match mode {
        Mode::Broadcast => format!("tb-b-{gateway}-{escaped}"),
        Mode::Queue | Mode::Singleton => format!("tb-q-{escaped}"),
    }
}

fn fnv1a(bytes: &[u8], basis: u64) -> u64 {
    bytes.iter().fold(basis, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

const ID: &str = "tinybroker-subscription";
const MODE: &str = "tinybroker-mode";
const GROUP: &str = "tinybroker-group";
const PATTERNS: &str = "tinybroker-patterns";
const ACK_MODE: &str = "tinybroker-ack-mode";
const OVERFLOW: &str = "tinybroker-overflow";
const MAX_ATTEMPTS: &str = "tinybroker-max-delivery-attempts";
/// Absent on consumers made before dead-letter topics worked in cluster mode: none.
const DEAD_LETTER: &str = "tinybroker-dead-letter-topic";

/// The subscription's id and shared settings, as consumer metadata.
pub fn metadata(subscription_id: &str, spec: &SubscriptionSpec) -> HashMap<String, String> {
    let patterns: Vec<&str> = spec.patterns.iter().map(Pattern::as_str).collect();
    let mut metadata = HashMap::from([
        (ID.to_string(), subscription_id.to_string()),
        (MODE.to_string(), spec.mode.to_string()),
        (GROUP.to_string(), spec.consumer_group.clone()),
        // Patterns hold no whitespace, so a space separates them unambiguously.
        (PATTERNS.to_string(), patterns.join(" ")),
        (ACK_MODE.to_string(), spec.ack_mode.to_string()),
        (OVERFLOW.to_string(), spec.overflow.to_string()),
        (
            MAX_ATTEMPTS.to_string(),
            spec.max_delivery_attempts.to_string(),
        ),
    ]);
    if let Some(topic) = &spec.dead_letter_topic {
        metadata.insert(DEAD_LETTER.to_string(), topic.as_str().to_string());
    }
    metadata
}

/// The subscription id and settings a consumer's metadata records, or why they cannot be read
/// (a consumer tinybroker did not make, or one of another subscription whose name collides).
///
/// # Errors
/// A sentence naming what is missing or unreadable.
pub fn recorded(metadata: &HashMap<String, String>) -> Result<(String, SubscriptionSpec), String> {
    let get = |key: &str| {
        metadata
            .get(key)
            .ok_or_else(|| format!("its consumer has no {key} metadata"))
    };
    let parse = |key: &str, value: &str| format!("its consumer's {key} is {value:?}");
    let mode = match get(MODE)?.as_str() {
        m if m == Mode::Queue.to_string() => Mode::Queue,
        m if m == Mode::Broadcast.to_string() => Mode::Broadcast,
        m if m == Mode::Singleton.to_string() => Mode::Singleton,
        other => return Err(parse(MODE, other)),
    };
    let ack_mode = match get(ACK_MODE)?.as_str() {
        m if m == AckMode::Explicit.to_string() => AckMode::Explicit,
        m if m == AckMode::None.to_string() => AckMode::None,
        other => return Err(parse(ACK_MODE, other)),
    };
    let overflow = match get(OVERFLOW)?.as_str() {
        m if m == Overflow::RejectPublish.to_string() => Overflow::RejectPublish,
        m if m == Overflow::DropOldest.to_string() => Overflow::DropOldest,
        other => return Err(parse(OVERFLOW, other)),
    };
    let patterns = get(PATTERNS)?
        .split(' ')
        .map(Pattern::parse)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("its consumer's {PATTERNS}: {e}"))?;
    let max_attempts = get(MAX_ATTEMPTS)?;
    let max_delivery_attempts = max_attempts
        .parse()
        .map_err(|_| parse(MAX_ATTEMPTS, max_attempts))?;
    let dead_letter_topic = metadata
        .get(DEAD_LETTER)
        .map(|topic| Topic::parse(topic).map_err(|e| format!("its consumer's {DEAD_LETTER}: {e}")))
        .transpose()?;
    Ok((
        get(ID)?.clone(),
        SubscriptionSpec {
            mode,
            consumer_group: get(GROUP)?.clone(),
            patterns,
            max_delivery_attempts,
            dead_letter_topic,
            ack_mode,
            overflow,
        },
    ))
}

/// The consumer that keeps the fence records (never read; tinybroker's consumers are named
/// `tb-q-…` and `tb-b-…`, so no subscription's name is this).
pub(in crate::cluster::gateway) const FENCE_CONSUMER: &str = "tb-fences";

/// The fence subjects of stream `stream`.
pub(in crate::cluster::gateway) fn fence_subjects(stream: &str) -> String {
    format!("$TBFENCE.{stream}.>")
}

/// The fence subject of SINGLETON subscription `subscription` in stream `stream`.
pub(in crate::cluster::gateway) fn fence_subject(stream: &str, subscription: &str) -> String {
    fence_subject_of(stream, &consumer_name(Mode::Singleton, subscription, ""))
}

/// The fence subject of the subscription whose consumer is `consumer`.
pub(in crate::cluster::gateway) fn fence_subject_of(stream: &str, consumer: &str) -> String {
    format!("$TBFENCE.{stream}.{consumer}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> SubscriptionSpec {
        SubscriptionSpec {
            mode: Mode::Queue,
            consumer_group: "workers".into(),
            patterns: vec![
                Pattern::parse("jobs.*").unwrap(),
                Pattern::parse("mail.>").unwrap(),
            ],
            max_delivery_attempts: 5,
            dead_letter_topic: Some(Topic::parse("jobs.dead").unwrap()),
            ack_mode: AckMode::Explicit,
            overflow: Overflow::RejectPublish,
        }
    }

    #[test]
    fn settings_survive_the_metadata_round_trip() {
        let (id, back) = recorded(&metadata("orders", &spec())).unwrap();
        assert_eq!(id, "orders");
        assert_eq!(back, spec());
        let mut without = metadata("orders", &spec());
        without.remove(DEAD_LETTER);
        assert_eq!(recorded(&without).unwrap().1.dead_letter_topic, None);
        let mut broken = metadata("orders", &spec());
        broken.insert(MODE.into(), "sideways".into());
        assert!(recorded(&broken).unwrap_err().contains("sideways"));
        broken.remove(MODE);
        assert!(recorded(&broken).unwrap_err().contains(MODE));
    }

    fn filters_of(patterns: &[&str]) -> (Vec<String>, bool) {
        let patterns: Vec<Pattern> = patterns
            .iter()
            .map(|p| Pattern::parse(p).unwrap())
            .collect();
        filters(&patterns)
    }

    // docs/semantics.md#cluster-patterns: overlapping patterns become filters JetStream takes
    // (none overlapping another) that cover them, the same whatever their order.
    #[test]
    fn overlapping_patterns_become_filters_that_cover_them_without_overlap() {
        let owned = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(filters_of(&["x.*.c", "x.>"]), (owned(&["x.>"]), true));
        assert_eq!(filters_of(&["a.b", "a.b"]), (owned(&["a.b"]), true));
        assert_eq!(filters_of(&["a.*.c", "a.b.*"]), (owned(&["a.*.*"]), false));
        assert_eq!(filters_of(&["a.b.>", "a.*.c"]), (owned(&["a.*.>"]), false));
        assert_eq!(
            filters_of(&["a.*", "b.*", "a.b"]),
            (owned(&["a.*", "b.*"]), true)
        );
        assert_eq!(filters_of(&["a", "a.>"]), (owned(&["a", "a.>"]), true));
        assert_eq!(filters_of(&[">", "a.b"]), (owned(&[">"]), true));
        // Chains: a generalisation that then covers or meets others.
        assert_eq!(
            filters_of(&["a.*.c", "a.b.*", "a.x.y", "q.r"]),
            (owned(&["a.*.*", "q.r"]), false)
        );
        assert_eq!(
            filters_of(&["a.b.*", "a.*.c", "*.b.c"]),
            filters_of(&["*.b.c", "a.*.c", "a.b.*"])
        );
        // Every result covers every pattern and no two overlap, over many pattern sets.
        let tokens = ["a", "b", "*"];
        let mut sets = Vec::new();
        for x in tokens {
            for y in tokens {
                for z in ["c", "*", ">"] {
                    sets.push(format!("{x}.{y}.{z}"));
                    sets.push(format!("{x}.{z}"));
                }
            }
        }
        for (i, p) in sets.iter().enumerate() {
            for q in &sets[i..] {
                for r in [&sets[0], &sets[sets.len() / 2], q] {
                    let split = |s: &str| s.split('.').map(str::to_string).collect::<Vec<_>>();
                    let (got, _) = filters_of(&[p, q, r]);
                    let got: Vec<Vec<String>> = got.iter().map(|f| split(f)).collect();
                    for pattern in [p, q, r] {
                        assert!(
                            got.iter().any(|f| covers(f, &split(pattern))),
                            "{pattern} in {got:?}"
                        );
                    }
                    for (j, f) in got.iter().enumerate() {
                        for g in &got[j + 1..] {
                            assert!(!collide(f, g), "{f:?} and {g:?} from {p} {q} {r}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn consumer_names_hold_only_safe_characters_and_stay_short() {
        for id in ["orders", "a.b c/d*>", "é", &"x".repeat(256)] {
            for mode in [Mode::Queue, Mode::Broadcast] {
                let name = consumer_name(mode, id, "g1");
                assert!(name.len() <= MAX_NAME, "{name}");
                assert!(
                    name.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
                    "{name}"
                );
            }
        }
        assert_ne!(
            consumer_name(Mode::Queue, "a.b", "g"),
            consumer_name(Mode::Queue, "a_2eb", "g"),
            "an escape cannot be forged by an id that spells it"
        );
        assert_ne!(
            consumer_name(Mode::Broadcast, "a", "g1"),
            consumer_name(Mode::Broadcast, "a", "g2")
        );
        assert_eq!(topic_of("tb", &subject("tb", "a.b")), Some("a.b"));
        assert_eq!(topic_of("tb", "tbx.a"), None);
    }
}
