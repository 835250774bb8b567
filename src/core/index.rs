//! The routing index: maps a topic to the subscriptions whose patterns match it (docs/semantics.md#topics-and-patterns).
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
//! all patterns' text; every vector keeps its capacity within twice its length, and a node's
//! table of many children (below) within 60 bytes a child, under what a vector's two slots and
//! its allocation cost. The table of wildcard shapes (below) is not charged to entries: it
//! costs [`PatternIndex::shape_table_cost`], which the broker's limit on shapes bounds.
//!
//! Why a walk's cost is bounded by what clients may send, not only by the topic: the walk
//! follows both the literal and the `*` child, so in general it can visit every node (matching
//! a topic against arbitrary patterns with `*` is a partial-match query, which no index answers
//! in time independent of the patterns). But two distinct nodes that one walk reaches at the
//! same depth differ in the positions where their paths hold `*`: elsewhere both hold the
//! topic's own tokens, so the same positions would make them the same path. Call the depth of a
//! pattern's prefix and the positions of its `*`s, when it has any, a *wildcard shape*; the
//! index counts the distinct shapes of all its entries' prefixes ([`PatternIndex::shapes`]).
//! Every node lies on some entry's path, so a walk visits at most one node per shape, one
//! wildcard-free node per topic token, and the root: [`PatternIndex::walk_bound`]. The broker
//! refuses a subscription that would take the count past `max_wildcard_shapes`.
//!
//! Insertion under a node with very many literal children (10,000 subscriptions under one
//! prefix) is O(1) expected, not a shift of a sorted vector: past [`WIDE`] children a node keeps
//! them in a hash table keyed by a per-process keyed hash of the token (so no client can choose
//! tokens that collide), and back in a vector below [`NARROW`].

use std::{
    collections::{BTreeSet, HashMap},
    hash::{BuildHasher, BuildHasherDefault, Hasher, RandomState},
    mem::size_of,
    sync::OnceLock,
};

use smallvec::SmallVec;

use super::topic::{Pattern, Topic};

/// The keys a topic matches, in key order, each once; up to 16 without a heap allocation (a
/// publish routes through this once, so its common case allocates nothing).
pub type Matches<K> = SmallVec<[K; 16]>;

/// What the allocator keeps per allocation beyond the bytes asked for (glibc: an 8-byte header,
/// chunks rounded up to 16 bytes and at least 32: 8 to 31 bytes).
pub const ALLOCATION_OVERHEAD: u64 = 32;

/// More literal children than this and a node keeps them in a hash table ([`Wide`]).
pub const WIDE: usize = 256;
/// Fewer literal children than this and a node's table goes back to a vector. Well below
/// [`WIDE`], so an insert and a removal in turn do not convert each time.
pub const NARROW: usize = 64;

/// Maps patterns to keys (subscription handles) and answers "who matches this topic".
pub struct PatternIndex<K> {
    root: Node<K>,
    len: usize,
    /// The wildcard shapes of the entries' prefixes (see the module's note), each with the
    /// number of entries that have it, ordered by (depth, positions).
    shapes: Vec<Shape>,
}

/// One wildcard shape: a prefix of `depth` tokens with `*` at the positions set in `stars`
/// (never 0), held by `count` entries.
#[derive(Debug, Clone, Copy)]
struct Shape {
    depth: u32,
    stars: u32,
    count: u32,
}

struct Node<K> {
    /// The pattern tokens on the way into this node, `.`-joined; empty only at the root.
    label: Box<str>,
    /// Children whose label starts with a literal token.
    literal: Literal<K>,
    /// The child whose label starts with `*`.
    star: Option<Box<Node<K>>>,
    /// Keys whose pattern ends at this node, sorted.
    exact: Vec<K>,
    /// Keys whose pattern is this node's path followed by `>`, sorted.
    rest: Vec<K>,
}

struct Edge<K> {
    /// [`token_hash`] of the first token of `node.label` (in [`Wide::collided`]: its
    /// [`keyed_hash`]).
    hash: u64,
    node: Box<Node<K>>,
}

/// A node's literal children.
enum Literal<K> {
    /// Up to [`WIDE`] of them, ordered by their first token's [`token_hash`], then by the token.
    /// A lookup is a binary search, an insertion a shift of at most [`WIDE`] edges.
    Narrow(Vec<Edge<K>>),
    /// [`NARROW`] or more.
    Wide(Box<Wide<K>>),
}

/// Many literal children, by the [`keyed_hash`] of their first token.
struct Wide<K> {
    /// Its capacity is kept within three times its length ([`fit`]).
    map: HashMap<u64, Box<Node<K>>, BuildHasherDefault<Prehashed>>,
    /// Children whose keyed hash a child in `map` had when they came, ordered by (keyed hash,
    /// token): with a 64-bit keyed hash, in practice none.
    collided: Vec<Edge<K>>,
}

/// The hasher of [`Wide::map`], whose keys are hashes already.
#[derive(Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only `u64` keys are hashed here; fold anything else in anyway.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// A hash of the token under keys drawn once per process (SipHash, as `HashMap`'s): which
/// tokens collide cannot be known outside the process, so no client can make a wide node's
/// lookups or insertions slow.
fn keyed_hash(token: &str) -> u64 {
    #[cfg(test)]
    if WEAK_KEYED_HASH.with(std::cell::Cell::get) {
        return token.len() as u64;
    }
    static KEYS: OnceLock<RandomState> = OnceLock::new();
    KEYS.get_or_init(RandomState::new).hash_one(token)
}

#[cfg(test)]
thread_local! {
    /// Children moved by insertions (a vector's shift and growth, a table's growth): the work
    /// an insertion does beyond its lookup, which the tests bound.
    static MOVED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

#[cfg(test)]
thread_local! {
    /// Makes [`keyed_hash`] the token's length, so tokens of one length collide.
    static WEAK_KEYED_HASH: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn moved(_children: usize) {
    #[cfg(test)]
    MOVED.with(|m| m.set(m.get() + _children as u64));
}

impl<K> std::fmt::Debug for PatternIndex<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PatternIndex")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

/// The hash that orders a narrow node's children: the per-process keyed hash, as a wide node's
/// table uses. A fixed hash's full collisions are cheap to craft (a token's last word can cancel
/// the rest), and children whose hashes collide cost a token compare at every step of a lookup,
/// so no hash a client can predict orders them. The order differs between processes; nothing
/// depends on it (matches are sorted).
fn token_hash(token: &str) -> u64 {
    keyed_hash(token)
}

/// The first token of a non-empty, `.`-joined run of tokens.
fn first_token(tokens: &str) -> &str {
    tokens.split_once('.').map_or(tokens, |(first, _)| first)
}

/// Whether a non-empty, `.`-joined run of tokens starts with the token `token`.
fn starts_with_token(tokens: &str, token: &str) -> bool {
    tokens
        .strip_prefix(token)
        .is_some_and(|after| after.is_empty() || after.starts_with('.'))
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

/// The edge of `edges` whose node's label starts with `token`, or where it would go.
fn find<K>(edges: &[Edge<K>], hash: u64, token: &str) -> Result<usize, usize> {
    edges.binary_search_by(|edge| {
        edge.hash
            .cmp(&hash)
            .then_with(|| first_token(&edge.node.label).cmp(token))
    })
}

/// Keeps a table's capacity within three times its length: a table grows by doubling (and,
/// after removals, may double again over its tombstones), and shrinks to fit once its length
/// has fallen to a third of its capacity, which takes a third of its entries' removals, so
/// growing and shrinking do not alternate.
fn fit<V, S: BuildHasher>(map: &mut HashMap<u64, V, S>) {
    if map.capacity() > 3 * map.len() {
        map.shrink_to(map.len());
    }
}

impl<K> Literal<K> {
    fn len(&self) -> usize {
        match self {
            Literal::Narrow(edges) => edges.len(),
            Literal::Wide(wide) => wide.map.len() + wide.collided.len(),
        }
    }

    /// The child whose label starts with `token`.
    fn get(&self, token: &str) -> Option<&Node<K>> {
        match self {
            // A few children are compared token by token (most nodes have one or two).
            Literal::Narrow(edges) if edges.len() <= 4 => edges
                .iter()
                .map(|edge| &*edge.node)
                .find(|node| starts_with_token(&node.label, token)),
            Literal::Narrow(edges) => {
                let at = find(edges, token_hash(token), token).ok()?;
                Some(&edges[at].node)
            }
            Literal::Wide(wide) => {
                let hash = keyed_hash(token);
                match wide.map.get(&hash) {
                    Some(node) if first_token(&node.label) == token => Some(node),
                    _ if wide.collided.is_empty() => None,
                    _ => {
                        let at = find(&wide.collided, hash, token).ok()?;
                        Some(&wide.collided[at].node)
                    }
                }
            }
        }
    }

    fn get_mut(&mut self, token: &str) -> Option<&mut Node<K>> {
        match self {
            Literal::Narrow(edges) => {
                let at = find(edges, token_hash(token), token).ok()?;
                Some(&mut edges[at].node)
            }
            Literal::Wide(wide) => {
                let hash = keyed_hash(token);
                let Wide { map, collided } = &mut **wide;
                match map.get_mut(&hash) {
                    Some(node) if first_token(&node.label) == token => Some(node),
                    _ => {
                        let at = find(collided, hash, token).ok()?;
                        Some(&mut collided[at].node)
                    }
                }
            }
        }
    }

    /// The child whose label starts with `token` (the first token of `path`), made with the
    /// label `path` if there is none.
    fn get_or_insert(&mut self, token: &str, path: &str) -> &mut Node<K> {
        if let Literal::Narrow(edges) = self
            && edges.len() >= WIDE
            && find(edges, token_hash(token), token).is_err()
        {
            self.widen();
        }
        match self {
            Literal::Narrow(edges) => {
                let hash = token_hash(token);
                let at = match find(edges, hash, token) {
                    Ok(at) => at,
                    Err(at) => {
                        if edges.len() == edges.capacity() {
                            moved(edges.len());
                        }
                        reserve_one(edges);
                        moved(edges.len() - at);
                        let node = Box::new(Node::new(path));
                        edges.insert(at, Edge { hash, node });
                        at
                    }
                };
                &mut edges[at].node
            }
            Literal::Wide(wide) => {
                let hash = keyed_hash(token);
                let Wide { map, collided } = &mut **wide;
                let free = match map.get(&hash) {
                    None => true,
                    Some(node) => first_token(&node.label) == token,
                };
                if free {
                    if !map.contains_key(&hash) {
                        let capacity = map.capacity();
                        map.insert(hash, Box::new(Node::new(path)));
                        if map.capacity() != capacity {
                            moved(map.len());
                        }
                        fit(map);
                    }
                    return map.get_mut(&hash).expect("inserted");
                }
                let at = match find(collided, hash, token) {
                    Ok(at) => at,
                    Err(at) => {
                        reserve_one(collided);
                        moved(collided.len() - at);
                        let node = Box::new(Node::new(path));
                        collided.insert(at, Edge { hash, node });
                        at
                    }
                };
                &mut collided[at].node
            }
        }
    }

    /// Removes the child whose label starts with `token` (there is one).
    fn remove(&mut self, token: &str) {
        match self {
            Literal::Narrow(edges) => {
                if let Ok(at) = find(edges, token_hash(token), token) {
                    edges.remove(at);
                    shrink(edges);
                }
            }
            Literal::Wide(wide) => {
                let hash = keyed_hash(token);
                let Wide { map, collided } = &mut **wide;
                if map
                    .get(&hash)
                    .is_some_and(|node| first_token(&node.label) == token)
                {
                    map.remove(&hash);
                    fit(map);
                } else if let Ok(at) = find(collided, hash, token) {
                    collided.remove(at);
                    shrink(collided);
                }
                if self.len() < NARROW {
                    self.narrow();
                }
            }
        }
    }

    /// Takes the only child out.
    fn take_only(&mut self) -> Box<Node<K>> {
        let only = match self {
            Literal::Narrow(edges) => edges.pop().map(|edge| edge.node),
            Literal::Wide(wide) => {
                let hash = wide.map.keys().next().copied();
                hash.and_then(|hash| wide.map.remove(&hash))
                    .or_else(|| wide.collided.pop().map(|edge| edge.node))
            }
        };
        *self = Literal::Narrow(Vec::new());
        only.expect("one child")
    }

    /// Every child, in no particular order.
    fn nodes(&self) -> Box<dyn Iterator<Item = &Node<K>> + '_> {
        match self {
            Literal::Narrow(edges) => Box::new(edges.iter().map(|edge| &*edge.node)),
            Literal::Wide(wide) => Box::new(
                wide.map
                    .values()
                    .map(|node| &**node)
                    .chain(wide.collided.iter().map(|edge| &*edge.node)),
            ),
        }
    }

    /// From a vector to a table, before the vector's [`WIDE`] + 1st child.
    fn widen(&mut self) {
        let Literal::Narrow(edges) = std::mem::replace(self, Literal::Narrow(Vec::new())) else {
            unreachable!("widened twice");
        };
        moved(edges.len());
        let mut wide = Wide {
            map: HashMap::with_capacity_and_hasher(edges.len() + 1, Default::default()),
            collided: Vec::new(),
        };
        for edge in edges {
            let hash = keyed_hash(first_token(&edge.node.label));
            match wide.map.entry(hash) {
                std::collections::hash_map::Entry::Vacant(free) => {
                    free.insert(edge.node);
                }
                std::collections::hash_map::Entry::Occupied(_) => {
                    let token = first_token(&edge.node.label);
                    let at = find(&wide.collided, hash, token).expect_err("tokens are distinct");
                    reserve_one(&mut wide.collided);
                    let node = edge.node;
                    wide.collided.insert(at, Edge { hash, node });
                }
            }
        }
        fit(&mut wide.map);
        *self = Literal::Wide(Box::new(wide));
    }

    /// From a table back to a vector, once fewer than [`NARROW`] children are left.
    fn narrow(&mut self) {
        let Literal::Wide(wide) = std::mem::replace(self, Literal::Narrow(Vec::new())) else {
            unreachable!("narrowed twice");
        };
        let Wide { map, collided } = *wide;
        let mut edges: Vec<Edge<K>> = Vec::with_capacity(map.len() + collided.len());
        edges.extend(
            map.into_values()
                .chain(collided.into_iter().map(|edge| edge.node))
                .map(|node| Edge {
                    hash: token_hash(first_token(&node.label)),
                    node,
                }),
        );
        edges.sort_unstable_by(|a, b| {
            a.hash
                .cmp(&b.hash)
                .then_with(|| first_token(&a.node.label).cmp(first_token(&b.node.label)))
        });
        *self = Literal::Narrow(edges);
    }
}

impl<K> Node<K> {
    fn new(label: &str) -> Self {
        Self {
            label: label.into(),
            literal: Literal::Narrow(Vec::new()),
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

    /// Cuts the label after `at` bytes (a token boundary): this node keeps the first part and
    /// gets the rest, with everything this node held, as its only child.
    fn split(&mut self, at: usize) {
        let tail = Box::new(Node {
            label: self.label[at + 1..].into(),
            literal: std::mem::replace(&mut self.literal, Literal::Narrow(Vec::new())),
            star: self.star.take(),
            exact: std::mem::take(&mut self.exact),
            rest: std::mem::take(&mut self.rest),
        });
        self.label = self.label[..at].into();
        let first = first_token(&tail.label);
        if first == "*" {
            self.star = Some(tail);
        } else {
            self.literal = Literal::Narrow(vec![Edge {
                hash: token_hash(first),
                node: tail,
            }]);
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
                None => self.literal.take_only(),
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
    /// their vectors, and a key with room for another in its set. A child in a node's table
    /// ([`Wide`]) costs less than its two slots and vector: 17 bytes a bucket, at most 8/7 × 3
    /// buckets a child ([`fit`]), so 58.3 bytes, and the table's allocation and header (112
    /// bytes) shared by at least [`NARROW`] children, under 2 × 16 + 32 = 64.
    pub const ENTRY_OVERHEAD: u64 = 2 * (size_of::<Node<K>>() as u64 + ALLOCATION_OVERHEAD)
        + 2 * ALLOCATION_OVERHEAD
        + 2 * (2 * size_of::<Edge<K>>() as u64 + ALLOCATION_OVERHEAD)
        + 2 * size_of::<K>() as u64
        + ALLOCATION_OVERHEAD;

    /// What an entry under `pattern` can cost the index at most: the sum over the entries held,
    /// plus [`shape_table_cost`](Self::shape_table_cost) of its [`shapes`](Self::shapes),
    /// bounds the index's heap memory, however the patterns share nodes.
    pub fn entry_cost(pattern: &Pattern) -> u64 {
        pattern.as_str().len() as u64 + Self::ENTRY_OVERHEAD
    }

    /// What the table of wildcard shapes costs at most when it holds `shapes` (two slots each,
    /// and its allocation). It is not charged to entries: the broker bounds it with
    /// `max_wildcard_shapes` (12 KiB at the default 512), whatever its subscriptions.
    pub fn shape_table_cost(shapes: usize) -> u64 {
        if shapes == 0 {
            0
        } else {
            shapes as u64 * 2 * size_of::<Shape>() as u64 + ALLOCATION_OVERHEAD
        }
    }
}

/// The wildcard shapes of a pattern's prefixes: (depth, positions of `*`) for each prefix of its
/// path (its tokens before a final `>`) that holds a `*`. Positions are below
/// [`MAX_TOKENS`](super::topic::MAX_TOKENS) (32), so a `u32` holds them.
fn prefix_shapes(pattern: &Pattern) -> impl Iterator<Item = (u32, u32)> + '_ {
    path_shapes(path_of(pattern).0)
}

/// [`prefix_shapes`] of a path of tokens (maybe empty).
fn path_shapes(path: &str) -> impl Iterator<Item = (u32, u32)> + '_ {
    path.split('.')
        .filter(|token| !token.is_empty())
        .enumerate()
        .scan(0u32, |stars, (at, token)| {
            if token == "*" {
                *stars |= 1 << at;
            }
            Some((at as u32 + 1, *stars))
        })
        .filter(|&(_, stars)| stars != 0)
}

fn find_shape(shapes: &[Shape], (depth, stars): (u32, u32)) -> Result<usize, usize> {
    shapes.binary_search_by(|shape| (shape.depth, shape.stars).cmp(&(depth, stars)))
}

impl<K: Ord + Clone> PatternIndex<K> {
    /// An empty index (it holds no heap memory until the first insert).
    pub fn new() -> Self {
        Self {
            root: Node::new(""),
            len: 0,
            shapes: Vec::new(),
        }
    }

    /// How many distinct wildcard shapes the entries' prefixes have (see the module's note):
    /// with [`walk_bound`](Self::walk_bound), what bounds a walk.
    pub fn shapes(&self) -> usize {
        self.shapes.len()
    }

    /// What [`shapes`](Self::shapes) would be with entries under `patterns` added too.
    pub fn shapes_with(&self, patterns: &[Pattern]) -> usize {
        let mut new: Vec<(u32, u32)> = patterns
            .iter()
            .flat_map(prefix_shapes)
            .filter(|&shape| find_shape(&self.shapes, shape).is_err())
            .collect();
        new.sort_unstable();
        new.dedup();
        self.shapes.len() + new.len()
    }

    /// The most nodes a walk for `topic` visits (what [`matches_visiting`] counts): one per
    /// wildcard shape, one wildcard-free node per token of the topic, and the root.
    ///
    /// [`matches_visiting`]: Self::matches_visiting
    pub fn walk_bound(&self, topic: &Topic) -> usize {
        self.shapes.len() + topic.tokens().count() + 1
    }

    fn add_shapes(&mut self, pattern: &Pattern) {
        for shape in prefix_shapes(pattern) {
            match find_shape(&self.shapes, shape) {
                Ok(at) => self.shapes[at].count += 1,
                Err(at) => {
                    reserve_one(&mut self.shapes);
                    let (depth, stars) = shape;
                    self.shapes.insert(
                        at,
                        Shape {
                            depth,
                            stars,
                            count: 1,
                        },
                    );
                }
            }
        }
    }

    fn drop_shapes(&mut self, pattern: &Pattern) {
        for shape in prefix_shapes(pattern) {
            let at = find_shape(&self.shapes, shape).expect("an entry's shape is counted");
            self.shapes[at].count -= 1;
            if self.shapes[at].count == 0 {
                self.shapes.remove(at);
            }
        }
        shrink(&mut self.shapes);
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
            let child: &mut Node<K> = if first == "*" {
                node.star.get_or_insert_with(|| Box::new(Node::new(path)))
            } else {
                node.literal.get_or_insert(first, path)
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
            self.add_shapes(pattern);
        }
    }

    /// Removes `key` from under `pattern`, freeing the nodes it alone needed.
    pub fn remove(&mut self, pattern: &Pattern, key: &K) {
        let (path, rest) = path_of(pattern);
        if Self::remove_at(&mut self.root, path, rest, key) {
            self.len -= 1;
            self.drop_shapes(pattern);
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
            let Some(child) = node.literal.get_mut(first) else {
                return false;
            };
            let Some(after) = strip_label(path, &child.label) else {
                return false;
            };
            let removed = Self::remove_at(child, after, rest, key);
            if removed && child.tidy() {
                node.literal.remove(first);
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
        Self::walk::<false>(&self.root, Some(topic.as_str()), out, &mut 0);
        // A key whose several patterns match is found once per pattern.
        out.sort_unstable();
        out.dedup();
    }

    /// What [`matches_into`](Self::matches_into) does, returning how many nodes the walk
    /// visited (the root included): at most [`walk_bound`](Self::walk_bound).
    pub fn matches_visiting(&self, topic: &Topic, out: &mut Matches<K>) -> usize {
        out.clear();
        let mut visited = 0;
        Self::walk::<true>(&self.root, Some(topic.as_str()), out, &mut visited);
        // A key whose several patterns match is found once per pattern.
        out.sort_unstable();
        out.dedup();
        visited
    }

    /// `topic`: the topic's tokens after this node's path (`None`: it ends here). `COUNT`:
    /// whether to count the nodes visited into `visited`.
    fn walk<const COUNT: bool>(
        node: &Node<K>,
        topic: Option<&str>,
        out: &mut Matches<K>,
        visited: &mut usize,
    ) {
        if COUNT {
            *visited += 1;
        }
        let Some(topic) = topic else {
            out.extend(node.exact.iter().cloned());
            return;
        };
        // At least one token remains, so `>` here matches.
        out.extend(node.rest.iter().cloned());
        let (token, after) = split_token(topic);
        if let Some(child) = node.literal.get(token)
            && let Some(next) = follow(&child.label[token.len()..], after)
        {
            Self::walk::<COUNT>(child, next, out, visited);
        }
        if let Some(child) = node.star.as_deref()
            && let Some(next) = follow(&child.label[1..], after)
        {
            Self::walk::<COUNT>(child, next, out, visited);
        }
    }

    /// Checks the index's shape: labels, child order and hashes, no node that could merge with
    /// its only child or that holds nothing, sorted key sets, every capacity within twice its
    /// length (a table of children: within three times, and only with [`NARROW`] or more), the
    /// entry count, and the wildcard shapes counted, which must be those of the entries held.
    /// For tests and fuzzing; `Err` says what is wrong where.
    pub fn check(&self) -> Result<(), String> {
        let mut entries = 0;
        let mut shapes = std::collections::BTreeMap::new();
        Self::check_node(&self.root, "", &mut entries, &mut shapes)?;
        if entries != self.len {
            return Err(format!("{entries} entries held, len says {}", self.len));
        }
        if self.shapes.capacity() > 2 * self.shapes.len() {
            return Err(format!(
                "shapes: capacity {} for {}",
                self.shapes.capacity(),
                self.shapes.len()
            ));
        }
        let counted: Vec<((u32, u32), u32)> = self
            .shapes
            .iter()
            .map(|shape| ((shape.depth, shape.stars), shape.count))
            .collect();
        let held: Vec<((u32, u32), u32)> = shapes.into_iter().collect();
        if counted != held {
            return Err(format!(
                "shapes counted {counted:?}, the entries held have {held:?}"
            ));
        }
        Ok(())
    }

    /// `path`: this node's path, its labels `.`-joined.
    fn check_node(
        node: &Node<K>,
        path: &str,
        entries: &mut usize,
        shapes: &mut std::collections::BTreeMap<(u32, u32), u32>,
    ) -> Result<(), String> {
        let root = path.is_empty();
        let at = &node.label;
        let roomy = |what: &str, len: usize, capacity: usize| {
            if capacity > 2 * len {
                Err(format!("{what} at {at:?}: capacity {capacity} for {len}"))
            } else {
                Ok(())
            }
        };
        roomy("exact keys", node.exact.len(), node.exact.capacity())?;
        roomy("rest keys", node.rest.len(), node.rest.capacity())?;
        for keys in [&node.exact, &node.rest] {
            if keys.windows(2).any(|w| w[0] >= w[1]) {
                return Err(format!("keys at {at:?} not sorted or repeated"));
            }
            *entries += keys.len();
            for shape in path_shapes(path) {
                *shapes.entry(shape).or_default() += keys.len() as u32;
            }
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
        let ordered = |edges: &[Edge<K>]| {
            edges.windows(2).all(|pair| {
                let key = |e: &Edge<K>| (e.hash, first_token(&e.node.label).to_owned());
                key(&pair[0]) < key(&pair[1])
            })
        };
        let edge_ok = |edge: &Edge<K>, hash: fn(&str) -> u64| {
            let first = first_token(&edge.node.label);
            first != "*" && edge.hash == hash(first)
        };
        match &node.literal {
            Literal::Narrow(edges) => {
                roomy("children", edges.len(), edges.capacity())?;
                if edges.len() > WIDE {
                    return Err(format!("{} children in a vector at {at:?}", edges.len()));
                }
                if !ordered(edges) {
                    return Err(format!("children of {at:?} out of order"));
                }
                if let Some(edge) = edges.iter().find(|edge| !edge_ok(edge, token_hash)) {
                    return Err(format!("edge to {:?} under {at:?}", edge.node.label));
                }
            }
            Literal::Wide(wide) => {
                let (len, capacity) = (wide.map.len(), wide.map.capacity());
                if node.literal.len() < NARROW || capacity > 3 * len {
                    return Err(format!(
                        "table of children at {at:?}: capacity {capacity} for {len}, {} in all",
                        node.literal.len()
                    ));
                }
                roomy(
                    "collided children",
                    wide.collided.len(),
                    wide.collided.capacity(),
                )?;
                if !ordered(&wide.collided) {
                    return Err(format!("collided children of {at:?} out of order"));
                }
                let misplaced = wide.map.iter().find(|(hash, child)| {
                    let first = first_token(&child.label);
                    first == "*" || **hash != keyed_hash(first)
                });
                if let Some((_, child)) = misplaced {
                    return Err(format!("edge to {:?} under {at:?}", child.label));
                }
                if let Some(edge) = wide.collided.iter().find(|e| !edge_ok(e, keyed_hash)) {
                    return Err(format!("edge to {:?} under {at:?}", edge.node.label));
                }
                let tokens: BTreeSet<&str> = node
                    .literal
                    .nodes()
                    .map(|child| first_token(&child.label))
                    .collect();
                if tokens.len() != node.literal.len() {
                    return Err(format!("two children of {at:?} share a first token"));
                }
            }
        }
        let below = |child: &Node<K>| {
            if root {
                child.label.to_string()
            } else {
                format!("{path}.{}", child.label)
            }
        };
        for child in node.literal.nodes() {
            Self::check_node(child, &below(child), entries, shapes)?;
        }
        if let Some(star) = &node.star {
            if first_token(&star.label) != "*" {
                return Err(format!("star child {:?} under {at:?}", star.label));
            }
            Self::check_node(star, &below(star), entries, shapes)?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "index_tests.rs"]
mod tests;
