//! The routing index: maps a topic to the subscriptions whose patterns match it (SPEC §2).
//!
//! A token trie with path compression. A chain of nodes that hold no key and branch nowhere is
//! one node whose label is the whole run of pattern tokens (`orders.*.created`), so a pattern
//! shares the nodes of every pattern with the same leading tokens and costs one node (holding the
//! rest of its text) past them, plus at most one where it splits a label in two. Matching walks
//! only the branches the topic's tokens select (the literal child and the `*` child at each
//! node, and the keys of `>`), so its cost follows the topic's length and the number of
//! matches, not the number of subscriptions.
//!
//! Why the memory per entry is bounded ([`PatternIndex::ENTRY_OVERHEAD`]): every node but the
//! root holds a key or has two children, so there are fewer than two nodes per entry; the labels
//! on one pattern's path are disjoint pieces of its text, so all labels together are at most
//! all patterns' text; every vector keeps its capacity within twice its length.

use std::{collections::BTreeSet, mem::size_of};

use smallvec::SmallVec;

use super::topic::{Pattern, Topic};

/// The keys a topic matches, in key order, each once; up to 16 without a heap allocation (a
/// publish routes through this once, so its common case allocates nothing).
pub type Matches<K> = SmallVec<[K; 16]>;

/// What the allocator keeps per allocation beyond the bytes asked for (glibc: an 8-byte header,
/// chunks rounded up to 16 bytes and at least 32: 8 to 31 bytes).
pub const ALLOCATION_OVERHEAD: u64 = 32;

/// Maps patterns to keys (subscription handles) and answers "who matches this topic".
pub struct PatternIndex<K> {
    root: Node<K>,
    len: usize,
}

struct Node<K> {
    /// The pattern tokens on the way into this node, `.`-joined; empty only at the root.
    label: Box<str>,
    /// Children whose label starts with a literal token, ordered by that token's hash, then by
    /// the token (a fixed hash: the order is the same in every run).
    literal: Vec<Edge<K>>,
    /// The child whose label starts with `*`.
    star: Option<Box<Node<K>>>,
    /// Keys whose pattern ends at this node, sorted.
    exact: Vec<K>,
    /// Keys whose pattern is this node's path followed by `>`, sorted.
    rest: Vec<K>,
}

struct Edge<K> {
    /// [`token_hash`] of the first token of `node.label`.
    hash: u64,
    node: Box<Node<K>>,
}

impl<K> std::fmt::Debug for PatternIndex<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PatternIndex")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

/// A hash of the token's bytes, eight at a time, each word mixed in by a folded multiply (the
/// 128-bit product's halves xored): fast for short tokens, and the same in every run, so the
/// order of a node's children never depends on the process. Colliding tokens still cost a
/// binary search, not a scan: children are ordered by the token after the hash. (A plain
/// FxHash mix, rotate-xor-multiply, kept a word's high-byte differences out of the low bits
/// and gave 400 collisions among 10,000 tokens `tenant-0`..`tenant-9999`.)
fn token_hash(token: &str) -> u64 {
    const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;
    let mix = |h: u64, word: u64| {
        let product = u128::from(h ^ word) * u128::from(SEED);
        (product as u64) ^ ((product >> 64) as u64)
    };
    let mut hash = token.len() as u64;
    let mut chunks = token.as_bytes().chunks_exact(8);
    for chunk in &mut chunks {
        hash = mix(hash, u64::from_le_bytes(chunk.try_into().expect("8 bytes")));
    }
    let tail = chunks.remainder();
    if !tail.is_empty() {
        let mut word = [0u8; 8];
        word[..tail.len()].copy_from_slice(tail);
        hash = mix(hash, u64::from_le_bytes(word));
    }
    hash
}

/// The first token of a non-empty, `.`-joined run of tokens.
fn first_token(tokens: &str) -> &str {
    tokens.split_once('.').map_or(tokens, |(first, _)| first)
}

/// The first token of a topic's remaining tokens, and what follows it (`None`: nothing).
fn split_token(topic: &str) -> (&str, Option<&str>) {
    match topic.split_once('.') {
        Some((first, rest)) => (first, Some(rest)),
        None => (topic, None),
    }
}

/// A pattern as a path of tokens (maybe empty) and whether it ends in `>`.
fn path_of(pattern: &Pattern) -> (&str, bool) {
    let text = pattern.as_str();
    if text == ">" {
        ("", true)
    } else if let Some(path) = text.strip_suffix(".>") {
        (path, true)
    } else {
        (text, false)
    }
}

/// The length of the longest run of whole tokens both start with (at least their first token,
/// which the caller has matched).
fn common_tokens(label: &str, path: &str) -> usize {
    let (a, b) = (label.as_bytes(), path.as_bytes());
    let same = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let boundary = |s: &[u8]| s.len() == same || s[same] == b'.';
    if boundary(a) && boundary(b) {
        same
    } else {
        // Bytes, not chars: two tokens may part in the middle of a character.
        a[..same]
            .iter()
            .rposition(|&c| c == b'.')
            .expect("the first tokens are equal")
    }
}

/// `path` past `label`'s tokens, when it starts with them: empty, or the tokens after them.
fn strip_label<'p>(path: &'p str, label: &str) -> Option<&'p str> {
    let after = path.strip_prefix(label)?;
    if after.is_empty() {
        Some(after)
    } else {
        after.strip_prefix('.')
    }
}

/// Matches a label's tokens after its first (`tail`: empty, or `.` and the tokens) against the
/// topic's next tokens. `Some(what follows them)`, or `None` if they do not match.
fn follow<'t>(tail: &str, topic: Option<&'t str>) -> Option<Option<&'t str>> {
    let Some(tail) = tail.strip_prefix('.') else {
        return Some(topic);
    };
    let topic = topic?;
    // A run of literal tokens matches byte for byte (a topic never holds `*`).
    if let Some(after) = topic.strip_prefix(tail) {
        if after.is_empty() {
            return Some(None);
        }
        if let Some(after) = after.strip_prefix('.') {
            return Some(Some(after));
        }
    }
    if !tail.contains('*') {
        return None;
    }
    let mut topic = Some(topic);
    for token in tail.split('.') {
        let (head, after) = split_token(topic?);
        if token != "*" && token != head {
            return None;
        }
        topic = after;
    }
    Some(topic)
}

/// Makes room for one more element, keeping the capacity within twice the length: exact while
/// small (most nodes hold one key or one child), doubling past that.
fn reserve_one<T>(v: &mut Vec<T>) {
    if v.len() == v.capacity() {
        if v.len() < 4 {
            v.reserve_exact(1);
        } else {
            v.reserve(1);
        }
    }
}

/// After a removal: gives back memory once the capacity is over twice the length (all of it
/// when empty), leaving room for half as many again so a remove and an insert do not reallocate
/// in turn.
fn shrink<T>(v: &mut Vec<T>) {
    if v.capacity() > 2 * v.len() {
        v.shrink_to(v.len() + v.len() / 2);
    }
}

fn insert_key<K: Ord>(keys: &mut Vec<K>, key: K) -> bool {
    match keys.binary_search(&key) {
        Ok(_) => false,
        Err(at) => {
            reserve_one(keys);
            keys.insert(at, key);
            true
        }
    }
}

fn remove_key<K: Ord>(keys: &mut Vec<K>, key: &K) -> bool {
    match keys.binary_search(key) {
        Ok(at) => {
            keys.remove(at);
            shrink(keys);
            true
        }
        Err(_) => false,
    }
}

impl<K> Node<K> {
    fn new(label: &str) -> Self {
        Self {
            label: label.into(),
            literal: Vec::new(),
            star: None,
            exact: Vec::new(),
            rest: Vec::new(),
        }
    }

    fn has_keys(&self) -> bool {
        !self.exact.is_empty() || !self.rest.is_empty()
    }

    fn children(&self) -> usize {
        self.literal.len() + usize::from(self.star.is_some())
    }

    /// The literal child whose label starts with `token`, or where it would go.
    fn find(&self, hash: u64, token: &str) -> Result<usize, usize> {
        self.literal.binary_search_by(|edge| {
            edge.hash
                .cmp(&hash)
                .then_with(|| first_token(&edge.node.label).cmp(token))
        })
    }

    /// Cuts the label after `at` bytes (a token boundary): this node keeps the first part and
    /// gets the rest, with everything this node held, as its only child.
    fn split(&mut self, at: usize) {
        let tail = Box::new(Node {
            label: self.label[at + 1..].into(),
            literal: std::mem::take(&mut self.literal),
            star: self.star.take(),
            exact: std::mem::take(&mut self.exact),
            rest: std::mem::take(&mut self.rest),
        });
        self.label = self.label[..at].into();
        let first = first_token(&tail.label);
        if first == "*" {
            self.star = Some(tail);
        } else {
            self.literal = vec![Edge {
                hash: token_hash(first),
                node: tail,
            }];
        }
    }

    /// After a removal below or at this (non-root) node: whether it is now empty and should go.
    /// A node left with no key and one child takes that child's place, its label in front.
    fn tidy(&mut self) -> bool {
        if self.has_keys() {
            return false;
        }
        let only = match self.children() {
            0 => return true,
            1 => match self.star.take() {
                Some(child) => child,
                None => self.literal.pop().expect("one child").node,
            },
            _ => return false,
        };
        let mut only = *only;
        let mut label = String::with_capacity(self.label.len() + 1 + only.label.len());
        label.push_str(&self.label);
        label.push('.');
        label.push_str(&only.label);
        // The first token is unchanged, so the parent's edge (hash and order) stays right.
        only.label = label.into_boxed_str();
        *self = only;
        false
    }
}

impl<K: Ord + Clone> Default for PatternIndex<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K> PatternIndex<K> {
    /// An upper bound of what one entry adds to the index's heap memory beyond its pattern's
    /// text, allocator overhead included (see the module's note; [`ALLOCATION_OVERHEAD`] per
    /// allocation): two nodes and their labels, two children's slots with room for two more and
    /// their vectors, and a key with room for another in its set.
    pub const ENTRY_OVERHEAD: u64 = 2 * (size_of::<Node<K>>() as u64 + ALLOCATION_OVERHEAD)
        + 2 * ALLOCATION_OVERHEAD
        + 2 * (2 * size_of::<Edge<K>>() as u64 + ALLOCATION_OVERHEAD)
        + 2 * size_of::<K>() as u64
        + ALLOCATION_OVERHEAD;

    /// What an entry under `pattern` can cost the index at most: the sum over the entries held
    /// bounds the index's heap memory, however the patterns share nodes.
    pub fn entry_cost(pattern: &Pattern) -> u64 {
        pattern.as_str().len() as u64 + Self::ENTRY_OVERHEAD
    }
}

impl<K: Ord + Clone> PatternIndex<K> {
    /// An empty index (it holds no heap memory until the first insert).
    pub fn new() -> Self {
        Self {
            root: Node::new(""),
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
        let (mut path, rest) = path_of(pattern);
        let mut node = &mut self.root;
        while !path.is_empty() {
            let first = first_token(path);
            let child = if first == "*" {
                node.star.get_or_insert_with(|| Box::new(Node::new(path)))
            } else {
                let hash = token_hash(first);
                let at = match node.find(hash, first) {
                    Ok(at) => at,
                    Err(at) => {
                        reserve_one(&mut node.literal);
                        let node_here = Box::new(Node::new(path));
                        node.literal.insert(
                            at,
                            Edge {
                                hash,
                                node: node_here,
                            },
                        );
                        at
                    }
                };
                &mut node.literal[at].node
            };
            let common = common_tokens(&child.label, path);
            if common < child.label.len() {
                child.split(common);
            }
            path = path.get(common + 1..).unwrap_or("");
            node = child;
        }
        let keys = if rest {
            &mut node.rest
        } else {
            &mut node.exact
        };
        if insert_key(keys, key) {
            self.len += 1;
        }
    }

    /// Removes `key` from under `pattern`, freeing the nodes it alone needed.
    pub fn remove(&mut self, pattern: &Pattern, key: &K) {
        let (path, rest) = path_of(pattern);
        if Self::remove_at(&mut self.root, path, rest, key) {
            self.len -= 1;
        }
    }

    fn remove_at(node: &mut Node<K>, path: &str, rest: bool, key: &K) -> bool {
        if path.is_empty() {
            return remove_key(
                if rest {
                    &mut node.rest
                } else {
                    &mut node.exact
                },
                key,
            );
        }
        let first = first_token(path);
        if first == "*" {
            let Some(child) = node.star.as_deref_mut() else {
                return false;
            };
            let Some(after) = strip_label(path, &child.label) else {
                return false;
            };
            let removed = Self::remove_at(child, after, rest, key);
            if removed && child.tidy() {
                node.star = None;
            }
            removed
        } else {
            let Ok(at) = node.find(token_hash(first), first) else {
                return false;
            };
            let child = &mut node.literal[at].node;
            let Some(after) = strip_label(path, &child.label) else {
                return false;
            };
            let removed = Self::remove_at(child, after, rest, key);
            if removed && child.tidy() {
                node.literal.remove(at);
                shrink(&mut node.literal);
            }
            removed
        }
    }

    /// Every key with at least one pattern matching `topic`, each once, in key order.
    pub fn matches(&self, topic: &Topic) -> BTreeSet<K> {
        let mut out = Matches::new();
        self.matches_into(topic, &mut out);
        out.into_iter().collect()
    }

    /// What [`matches`](Self::matches) returns, into `out` (cleared first): every key with at
    /// least one pattern matching `topic`, each once, in key order.
    pub fn matches_into(&self, topic: &Topic, out: &mut Matches<K>) {
        out.clear();
        Self::walk(&self.root, Some(topic.as_str()), out);
        // A key whose several patterns match is found once per pattern.
        out.sort_unstable();
        out.dedup();
    }

    /// `topic`: the topic's tokens after this node's path (`None`: it ends here).
    fn walk(node: &Node<K>, topic: Option<&str>, out: &mut Matches<K>) {
        let Some(topic) = topic else {
            out.extend(node.exact.iter().cloned());
            return;
        };
        // At least one token remains, so `>` here matches.
        out.extend(node.rest.iter().cloned());
        let (token, after) = split_token(topic);
        if !node.literal.is_empty()
            && let Ok(at) = node.find(token_hash(token), token)
        {
            let child = &node.literal[at].node;
            if let Some(next) = follow(&child.label[token.len()..], after) {
                Self::walk(child, next, out);
            }
        }
        if let Some(child) = node.star.as_deref()
            && let Some(next) = follow(&child.label[1..], after)
        {
            Self::walk(child, next, out);
        }
    }

    /// Checks the index's shape: labels, child order and hashes, no node that could merge with
    /// its only child or that holds nothing, sorted key sets, every capacity within twice its
    /// length, and the entry count. For tests and fuzzing; `Err` says what is wrong where.
    pub fn check(&self) -> Result<(), String> {
        let mut entries = 0;
        Self::check_node(&self.root, true, &mut entries)?;
        if entries != self.len {
            return Err(format!("{entries} entries held, len says {}", self.len));
        }
        Ok(())
    }

    fn check_node(node: &Node<K>, root: bool, entries: &mut usize) -> Result<(), String> {
        let at = &node.label;
        let roomy = |what: &str, len: usize, capacity: usize| {
            if capacity > 2 * len {
                Err(format!("{what} at {at:?}: capacity {capacity} for {len}"))
            } else {
                Ok(())
            }
        };
        roomy("children", node.literal.len(), node.literal.capacity())?;
        roomy("exact keys", node.exact.len(), node.exact.capacity())?;
        roomy("rest keys", node.rest.len(), node.rest.capacity())?;
        for keys in [&node.exact, &node.rest] {
            if keys.windows(2).any(|w| w[0] >= w[1]) {
                return Err(format!("keys at {at:?} not sorted or repeated"));
            }
            *entries += keys.len();
        }
        let label_ok = if root {
            node.label.is_empty()
        } else {
            !node.label.split('.').any(str::is_empty)
        };
        if !label_ok {
            return Err(format!("label {at:?} (root: {root})"));
        }
        if !root && !node.has_keys() && node.children() < 2 {
            return Err(format!(
                "node {at:?} holds no key and has one child or none"
            ));
        }
        for pair in node.literal.windows(2) {
            let key = |e: &Edge<K>| (e.hash, first_token(&e.node.label).to_owned());
            if key(&pair[0]) >= key(&pair[1]) {
                return Err(format!("children of {at:?} out of order"));
            }
        }
        for edge in &node.literal {
            let first = first_token(&edge.node.label);
            if first == "*" || edge.hash != token_hash(first) {
                return Err(format!("edge to {:?} under {at:?}", edge.node.label));
            }
            Self::check_node(&edge.node, false, entries)?;
        }
        if let Some(star) = &node.star {
            if first_token(&star.label) != "*" {
                return Err(format!("star child {:?} under {at:?}", star.label));
            }
            Self::check_node(star, false, entries)?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "index_tests.rs"]
mod tests;
