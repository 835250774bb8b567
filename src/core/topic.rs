//! Topics and NATS-style patterns (docs/semantics.md#topics-and-patterns).
//!
//! A topic is dot-separated tokens; a pattern may use `*` for exactly one token and `>` (last only)
//! for one or more trailing tokens. Parsing validates once, at the edge; everything past it holds a
//! [`Topic`] or [`Pattern`] and never re-checks.

use std::{fmt, sync::Arc};

use super::error::Error;

/// Longest topic or pattern accepted, in bytes.
pub const MAX_TOPIC_BYTES: usize = 256;
/// Most tokens a topic or pattern may have.
pub const MAX_TOKENS: usize = 32;

/// A validated topic: cheap to clone, shared by every queued copy of a message.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Topic(Arc<str>);

/// One token of a [`Pattern`], borrowed from its text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatternToken<'a> {
    /// Matches this exact token.
    Literal(&'a str),
    /// `*`: matches any one token.
    One,
    /// `>`: matches one or more trailing tokens (only ever last).
    Rest,
}

/// A validated subscription pattern.
///
/// Only its text is kept (tokens are read off it on demand): a subscription holds up to 64
/// patterns of up to 256 bytes, and a parsed token list beside the text cost several times the
/// text itself.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Pattern {
    text: Arc<str>,
}

fn check_shape(kind: &str, text: &str) -> Result<(), String> {
    if text.is_empty() {
        return Err(format!("{kind} is empty"));
    }
    if text.len() > MAX_TOPIC_BYTES {
        return Err(format!(
            "{kind} is {} bytes, longer than the limit of {MAX_TOPIC_BYTES}",
            text.len()
        ));
    }
    let tokens = text.split('.').count();
    if tokens > MAX_TOKENS {
        return Err(format!(
            "{kind} has {tokens} tokens, more than the limit of {MAX_TOKENS}"
        ));
    }
    for (i, token) in text.split('.').enumerate() {
        if token.is_empty() {
            return Err(format!(
                "token {} is empty (leading, trailing or double dot)",
                i + 1
            ));
        }
        if let Some(c) = token.chars().find(|c| c.is_whitespace() || c.is_control()) {
            return Err(format!(
                "token {:?} contains whitespace or control character {c:?}",
                token
            ));
        }
    }
    Ok(())
}

/// One pass over the bytes: whether `text` is a valid topic made of printable ASCII only
/// (what nearly every topic is). `false` says nothing: [`Topic::parse`] then checks it the
/// long way, which also accepts other characters and names what is wrong.
fn plain_topic(text: &str) -> bool {
    let bytes = text.as_bytes();
    if bytes.is_empty() || bytes.len() > MAX_TOPIC_BYTES {
        return false;
    }
    let mut tokens = 1;
    let mut token_empty = true;
    for &byte in bytes {
        match byte {
            b'.' if token_empty => return false,
            b'.' => {
                tokens += 1;
                token_empty = true;
            }
            // Wildcards, and ASCII whitespace and control characters (space and below, DEL).
            b'*' | b'>' => return false,
            0x21..=0x7e => token_empty = false,
            _ => return false,
        }
    }
    !token_empty && tokens <= MAX_TOKENS
}

impl Topic {
    /// Parses a concrete topic (no wildcards).
    ///
    /// # Errors
    /// [`Error::InvalidTopic`] naming the problem.
    pub fn parse(text: &str) -> Result<Self, Error> {
        if plain_topic(text) {
            return Ok(Self(Arc::from(text)));
        }
        let invalid = |reason: String| Error::InvalidTopic {
            topic: text.chars().take(80).collect(),
            reason,
        };
        check_shape("topic", text).map_err(invalid)?;
        if let Some(token) = text.split('.').find(|t| t.contains(['*', '>'])) {
            return Err(invalid(format!(
                "token {token:?} contains a wildcard; `*` and `>` are only allowed in patterns"
            )));
        }
        Ok(Self(Arc::from(text)))
    }

    /// The topic text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The topic's tokens, in order.
    pub fn tokens(&self) -> impl Iterator<Item = &str> {
        self.0.split('.')
    }
}

impl fmt::Debug for Topic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for Topic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Pattern {
    /// Parses a pattern.
    ///
    /// # Errors
    /// [`Error::InvalidPattern`] naming the problem.
    pub fn parse(text: &str) -> Result<Self, Error> {
        let invalid = |reason: String| Error::InvalidPattern {
            pattern: text.chars().take(80).collect(),
            reason,
        };
        check_shape("pattern", text).map_err(invalid)?;
        let count = text.split('.').count();
        for (i, token) in text.split('.').enumerate() {
            match token {
                "*" => {}
                ">" if i + 1 == count => {}
                ">" => return Err(invalid("`>` may only be the last token".into())),
                t if t.contains(['*', '>']) => {
                    return Err(invalid(format!(
                        "token {t:?} mixes a wildcard with other characters; `*` and `>` must be whole tokens"
                    )));
                }
                _ => {}
            }
        }
        Ok(Self {
            text: Arc::from(text),
        })
    }

    /// The pattern text as given.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The pattern's tokens, in order.
    pub fn tokens(&self) -> impl Iterator<Item = PatternToken<'_>> {
        // Parsing guarantees `*` and `>` are whole tokens and `>` is last.
        self.text.split('.').map(|token| match token {
            "*" => PatternToken::One,
            ">" => PatternToken::Rest,
            literal => PatternToken::Literal(literal),
        })
    }

    /// Naive matching, token by token. The broker routes through
    /// [`PatternIndex`](super::index::PatternIndex); this is its reference.
    pub fn matches(&self, topic: &Topic) -> bool {
        let mut topic_tokens = topic.tokens();
        for token in self.tokens() {
            match token {
                PatternToken::Rest => return topic_tokens.next().is_some(),
                PatternToken::One => {
                    if topic_tokens.next().is_none() {
                        return false;
                    }
                }
                PatternToken::Literal(lit) => {
                    if topic_tokens.next() != Some(lit) {
                        return false;
                    }
                }
            }
        }
        topic_tokens.next().is_none()
    }
}

impl fmt::Debug for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.text, f)
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Topic {
        Topic::parse(s).unwrap()
    }
    fn p(s: &str) -> Pattern {
        Pattern::parse(s).unwrap()
    }

    // docs/semantics.md#topics-and-patterns: tokens non-empty, no whitespace, no wildcards, bounded length.
    #[test]
    fn invalid_topics_are_rejected_with_a_reason() {
        for (bad, why) in [
            ("", "empty"),
            ("a..b", "empty"),
            (".a", "empty"),
            ("a.", "empty"),
            ("a b", "whitespace"),
            ("a.\tb", "whitespace"),
            ("a.*", "wildcard"),
            ("a.>", "wildcard"),
            ("a.b*", "wildcard"),
        ] {
            let err = Topic::parse(bad).unwrap_err().to_string();
            assert!(err.contains(why), "{bad:?}: {err}");
        }
        let long = "a".repeat(MAX_TOPIC_BYTES + 1);
        assert!(
            Topic::parse(&long)
                .unwrap_err()
                .to_string()
                .contains("limit")
        );
        let many = vec!["a"; MAX_TOKENS + 1].join(".");
        assert!(
            Topic::parse(&many)
                .unwrap_err()
                .to_string()
                .contains("tokens")
        );
        assert_eq!(t("schedule.daily.report").as_str(), "schedule.daily.report");
    }

    // The one-pass check of printable ASCII topics never accepts what the full check refuses,
    // and accepts every printable ASCII topic it accepts.
    proptest::proptest! {
        #[test]
        fn the_ascii_pass_agrees_with_the_full_check(
            text in "[a-c.*> \t\x7f\x00\u{e9}]{0,40}|[a.]{250,260}|(a\\.){30,33}a"
        ) {
            let plain = plain_topic(&text);
            let full = Topic::parse(&text).is_ok();
            if plain {
                proptest::prop_assert!(full, "{text:?}: the one pass accepted what the full check refuses");
            }
            if full && text.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
                proptest::prop_assert!(plain, "{text:?}: printable ASCII accepted only the long way");
            }
        }
    }

    // The limits are inclusive: exactly MAX_TOPIC_BYTES bytes and MAX_TOKENS tokens are fine.
    #[test]
    fn limits_are_inclusive() {
        let longest = "a".repeat(MAX_TOPIC_BYTES);
        assert!(Topic::parse(&longest).is_ok() && Pattern::parse(&longest).is_ok());
        let most = vec!["a"; MAX_TOKENS].join(".");
        assert!(Topic::parse(&most).is_ok() && Pattern::parse(&most).is_ok());
    }

    // Errors, traces and the inspection API print topics and patterns as given; `Debug` quotes
    // them like a string, so a derived `Debug` of anything holding one reads as plain text.
    #[test]
    fn topics_and_patterns_print_as_given() {
        let topic = t("jobs.daily");
        let pattern = p("jobs.*.>");
        assert_eq!(
            (topic.to_string(), format!("{topic:?}")),
            ("jobs.daily".into(), "\"jobs.daily\"".into())
        );
        assert_eq!(pattern.as_str(), "jobs.*.>");
        assert_eq!(
            (pattern.to_string(), format!("{pattern:?}")),
            ("jobs.*.>".into(), "\"jobs.*.>\"".into())
        );
    }

    #[test]
    fn invalid_patterns_are_rejected_with_a_reason() {
        for (bad, why) in [
            ("a.>.b", "last"),
            ("a.b*", "whole tokens"),
            ("a.>x", "whole tokens"),
            ("a..b", "empty"),
            ("", "empty"),
            ("a b", "whitespace"),
        ] {
            let err = Pattern::parse(bad).unwrap_err().to_string();
            assert!(err.contains(why), "{bad:?}: {err}");
        }
    }

    // docs/semantics.md#topics-and-patterns: `*` matches exactly one token, `>` one or more trailing tokens.
    #[test]
    fn star_matches_exactly_one_token() {
        let pat = p("schedule.*");
        assert!(pat.matches(&t("schedule.daily")));
        assert!(!pat.matches(&t("schedule")));
        assert!(!pat.matches(&t("schedule.a.b")));
        assert!(!pat.matches(&t("other.daily")));
        assert!(p("*.b.*").matches(&t("a.b.c")));
        assert!(!p("*.b.*").matches(&t("a.x.c")));
    }

    #[test]
    fn gt_matches_one_or_more_trailing_tokens() {
        let pat = p("schedule.>");
        assert!(pat.matches(&t("schedule.daily")));
        assert!(pat.matches(&t("schedule.a.b.c")));
        assert!(!pat.matches(&t("schedule")));
        assert!(p(">").matches(&t("anything.at.all")));
        assert!(p("a.*.>").matches(&t("a.b.c")));
        assert!(!p("a.*.>").matches(&t("a.b")));
    }

    #[test]
    fn literal_patterns_match_only_themselves() {
        assert!(p("a.b").matches(&t("a.b")));
        assert!(!p("a.b").matches(&t("a.b.c")));
        assert!(!p("a.b").matches(&t("a")));
    }
}
