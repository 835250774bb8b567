//! A token trie that maps a topic to the subscriptions whose patterns match it (SPEC §2).
//!
//! Matching walks only the branches the topic's tokens select (its literal token, `*`, and `>`
//! at each level), so its cost follows the topic's length and the number of matches, not the
//! number of subscriptions.

use std::collections::{BTreeSet, HashMap};

use super::topic::{Pattern, PatternToken, Topic};

/// Maps patterns to keys (subscription handles) and answers "who matches this topic".
#[derive(Debug)]
pub struct PatternIndex<K> {
    root: Node<K>,
    len: usize,
}

#[derive(Debug)]
struct Node<K> {
    // Only ever looked up, never iterated, so a HashMap's order cannot leak into behaviour.
    literal: HashMap<Box<str>, Node<K>>,
    one: Option<Box<Node<K>>>,
    /// Keys whose pattern ends at this node.
    exact: BTreeSet<K>,
    /// Keys whose pattern is this node's path followed by `>`.
    rest: BTreeSet<K>,
}

impl<K> Default for Node<K> {
    fn default() -> Self {
        Self {
            literal: HashMap::new(),
            one: None,
            exact: BTreeSet::new(),
            rest: BTreeSet::new(),
        }
    }
}

impl<K> Node<K> {
    fn is_empty(&self) -> bool {
        self.literal.is_empty()
            && self.one.is_none()
            && self.exact.is_empty()
            && self.rest.is_empty()
    }
}

impl<K: Ord + Clone> Default for PatternIndex<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Ord + Clone> PatternIndex<K> {
    /// An empty index.
    pub fn new() -> Self {
        Self {
            root: Node::default(),
            len: 0,
        }
    }

    /// How many (pattern, key) entries the index holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the index holds no entries.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Adds `key` under `pattern`. Adding the same pair twice is a no-op.
    pub fn insert(&mut self, pattern: &Pattern, key: K) {
        let mut node = &mut self.root;
        for token in pattern.tokens() {
            match token {
                PatternToken::Literal(lit) => {
                    node = node.literal.entry(lit.clone()).or_default();
                }
                PatternToken::One => node = node.one.get_or_insert_with(Default::default),
                PatternToken::Rest => {
                    if node.rest.insert(key) {
                        self.len += 1;
                    }
                    return;
                }
            }
        }
        if node.exact.insert(key) {
            self.len += 1;
        }
    }

    /// Removes `key` from under `pattern`, pruning branches left empty.
    pub fn remove(&mut self, pattern: &Pattern, key: &K) {
        if Self::remove_at(&mut self.root, pattern.tokens(), key) {
            self.len -= 1;
        }
    }

    fn remove_at(node: &mut Node<K>, tokens: &[PatternToken], key: &K) -> bool {
        let Some((first, rest)) = tokens.split_first() else {
            return node.exact.remove(key);
        };
        match first {
            PatternToken::Rest => node.rest.remove(key),
            PatternToken::One => {
                let Some(child) = node.one.as_deref_mut() else {
                    return false;
                };
                let removed = Self::remove_at(child, rest, key);
                if child.is_empty() {
                    node.one = None;
                }
                removed
            }
            PatternToken::Literal(lit) => {
                let Some(child) = node.literal.get_mut(lit) else {
                    return false;
                };
                let removed = Self::remove_at(child, rest, key);
                if child.is_empty() {
                    node.literal.remove(lit);
                }
                removed
            }
        }
    }

    /// Every key with at least one pattern matching `topic`, each once, in key order.
    pub fn matches(&self, topic: &Topic) -> BTreeSet<K> {
        let tokens: Vec<&str> = topic.tokens().collect();
        let mut out = BTreeSet::new();
        Self::walk(&self.root, &tokens, &mut out);
        out
    }

    fn walk(node: &Node<K>, tokens: &[&str], out: &mut BTreeSet<K>) {
        let Some((first, rest)) = tokens.split_first() else {
            out.extend(node.exact.iter().cloned());
            return;
        };
        // At least one token remains, so `>` here matches.
        out.extend(node.rest.iter().cloned());
        if let Some(child) = node.literal.get(*first) {
            Self::walk(child, rest, out);
        }
        if let Some(child) = node.one.as_deref() {
            Self::walk(child, rest, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Pattern {
        Pattern::parse(s).unwrap()
    }
    fn t(s: &str) -> Topic {
        Topic::parse(s).unwrap()
    }

    #[test]
    fn index_agrees_with_naive_matching() {
        let patterns = [
            "a", "a.b", "a.*", "a.>", "*.b", "*", ">", "a.b.c", "a.*.c", "*.*.>", "x.y",
        ];
        let topics = [
            "a", "a.b", "a.c", "a.b.c", "x.b", "x.y", "a.x.c", "q", "a.b.c.d",
        ];
        let mut index = PatternIndex::new();
        for (key, pat) in patterns.iter().enumerate() {
            index.insert(&p(pat), key);
        }
        for topic in topics {
            let expected: BTreeSet<usize> = patterns
                .iter()
                .enumerate()
                .filter(|(_, pat)| p(pat).matches(&t(topic)))
                .map(|(k, _)| k)
                .collect();
            assert_eq!(index.matches(&t(topic)), expected, "topic {topic}");
        }
    }

    #[test]
    fn a_key_with_two_matching_patterns_is_returned_once() {
        let mut index = PatternIndex::new();
        index.insert(&p("a.*"), 7);
        index.insert(&p("a.>"), 7);
        assert!(!index.is_empty());
        assert_eq!(
            index.matches(&t("a.b")).into_iter().collect::<Vec<_>>(),
            vec![7]
        );
        assert_eq!(index.len(), 2);
    }

    #[test]
    fn remove_prunes_and_stops_matching() {
        let mut index = PatternIndex::new();
        index.insert(&p("a.*.c"), 1);
        index.insert(&p("a.>"), 2);
        index.insert(&p("a.b.c"), 3);
        index.remove(&p("a.*.c"), &1);
        index.remove(&p("a.b.c"), &3);
        assert_eq!(
            index.matches(&t("a.b.c")).into_iter().collect::<Vec<_>>(),
            vec![2]
        );
        index.remove(&p("a.>"), &2);
        assert!(index.is_empty());
        assert!(index.root.is_empty(), "empty branches must be pruned");
        // Removing what is not there changes nothing.
        index.remove(&p("a.>"), &2);
        assert_eq!(index.len(), 0);
    }
}
