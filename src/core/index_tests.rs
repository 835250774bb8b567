use super::*;

fn p(s: &str) -> Pattern {
    Pattern::parse(s).unwrap()
}
fn t(s: &str) -> Topic {
    Topic::parse(s).unwrap()
}

fn naive(patterns: &[&str], topic: &str) -> BTreeSet<usize> {
    patterns
        .iter()
        .enumerate()
        .filter(|(_, pat)| p(pat).matches(&t(topic)))
        .map(|(k, _)| k)
        .collect()
}

/// How many nodes below the root.
fn nodes<K>(node: &Node<K>) -> usize {
    node.literal
        .nodes()
        .map(|child| 1 + nodes(child))
        .chain(node.star.iter().map(|s| 1 + nodes(s)))
        .sum()
}

/// A node's literal children, kept in a vector.
fn edges<K>(node: &Node<K>) -> &Vec<Edge<K>> {
    match &node.literal {
        Literal::Narrow(edges) => edges,
        Literal::Wide(_) => panic!("children of {:?} in a table", node.label),
    }
}

fn edges_mut<K>(node: &mut Node<K>) -> &mut Vec<Edge<K>> {
    match &mut node.literal {
        Literal::Narrow(edges) => edges,
        Literal::Wide(_) => panic!("children of {:?} in a table", node.label),
    }
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
    index.check().unwrap();
    for topic in topics {
        assert_eq!(
            index.matches(&t(topic)),
            naive(&patterns, topic),
            "topic {topic}"
        );
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
    index.check().unwrap();
    assert_eq!(
        index.matches(&t("a.b.c")).into_iter().collect::<Vec<_>>(),
        vec![2]
    );
    index.remove(&p("a.>"), &2);
    assert!(index.is_empty());
    assert_eq!(nodes(&index.root), 0, "empty branches must be pruned");
    assert_eq!(
        edges(&index.root).capacity(),
        0,
        "the root's children freed"
    );
    // Removing what is not there changes nothing.
    index.remove(&p("a.>"), &2);
    assert_eq!(index.len(), 0);
}

// A pattern sharing no prefix is one node, whatever its length or wildcards; a second pattern
// that diverges inside its label splits it once; removing it merges the halves back.
#[test]
fn a_run_of_tokens_is_one_node_split_and_merged_as_patterns_come_and_go() {
    let mut index = PatternIndex::new();
    let long = "a.b.*.d.e.*.g.h";
    index.insert(&p(long), 1);
    assert_eq!(nodes(&index.root), 1);
    assert_eq!(&*edges(&index.root)[0].node.label, long);

    index.insert(&p("a.b.*.x.>"), 2);
    index.check().unwrap();
    assert_eq!(nodes(&index.root), 3, "a.b.* above d.e.*.g.h and x");
    assert_eq!(&*edges(&index.root)[0].node.label, "a.b.*");
    assert_eq!(index.matches(&t("a.b.c.d.e.f.g.h")), BTreeSet::from([1]));
    assert_eq!(index.matches(&t("a.b.c.x.y.z")), BTreeSet::from([2]));
    assert!(index.matches(&t("a.b.c.x")).is_empty());
    assert!(index.matches(&t("a.b.c.d.e.f.g")).is_empty());

    index.remove(&p("a.b.*.x.>"), &2);
    index.check().unwrap();
    assert_eq!(nodes(&index.root), 1, "merged back into one node");
    assert_eq!(&*edges(&index.root)[0].node.label, long);
    assert_eq!(index.matches(&t("a.b.c.d.e.f.g.h")), BTreeSet::from([1]));
}

// A pattern that ends inside another's label splits it and keeps its key at the split.
#[test]
fn a_prefix_pattern_ends_at_the_split() {
    let mut index = PatternIndex::new();
    index.insert(&p("a.b.c"), 1);
    index.insert(&p("a.b"), 2);
    index.insert(&p("a.b.>"), 3);
    index.insert(&p("*.b.c"), 4);
    index.check().unwrap();
    assert_eq!(index.matches(&t("a.b")), BTreeSet::from([2]));
    assert_eq!(index.matches(&t("a.b.c")), BTreeSet::from([1, 3, 4]));
    for (pat, key) in [("a.b", 2), ("a.b.>", 3)] {
        index.remove(&p(pat), &key);
        index.check().unwrap();
    }
    assert_eq!(nodes(&index.root), 2, "a.b.c and *.b.c");
}

// Tokens whose hashes collide still each find their own child.
#[test]
fn children_with_equal_hashes_are_told_apart_by_their_token() {
    let mut index = PatternIndex::new();
    let tokens = ["x1", "x2", "x3"];
    for (key, token) in tokens.iter().enumerate() {
        index.insert(&p(&format!("{token}.end")), key);
    }
    let children = edges_mut(&mut index.root);
    for edge in children.iter_mut() {
        edge.hash = 7;
    }
    children.sort_by(|a, b| first_token(&a.node.label).cmp(first_token(&b.node.label)));
    for token in tokens {
        let found = find(children, 7, token).expect("found");
        assert_eq!(first_token(&children[found].node.label), token);
    }
    assert_eq!(find(children, 7, "x0"), Err(0));
    assert_eq!(find(children, 7, "x4"), Err(3));
}

#[test]
fn token_runs_are_compared_whole() {
    assert_eq!(common_tokens("ab.c", "ab.cd"), 2);
    assert_eq!(common_tokens("ab.cd", "ab.c"), 2);
    assert_eq!(common_tokens("ab.c.x", "ab.c.y"), 4);
    assert_eq!(common_tokens("ab.c", "ab.c"), 4);
    assert_eq!(common_tokens("ab.*.c", "ab.*"), 4);
    assert_eq!(common_tokens("ab", "ab.c"), 2);
    // `é` and `è` share their first byte.
    assert_eq!(common_tokens("a.é", "a.è"), 1);
    assert_eq!(follow(".b.*", Some("b.x")), Some(None));
    assert_eq!(follow(".b.*", Some("b.x.y")), Some(Some("y")));
    assert_eq!(follow(".b.*", Some("b")), None);
    assert_eq!(follow(".bc", Some("b.c")), None);
    assert_eq!(follow(".b", Some("bc")), None);
    assert_eq!(follow("", Some("q")), Some(Some("q")));
}

// docs/semantics.md#routing-cost: the hash that orders a node's children is keyed per process,
// so tokens crafted to collide under a fixed hash (here the fixed multiply-mix this index used
// before: its last word can cancel the rest) do not collide, and a lookup among them stays a
// binary search by hash rather than a token compare at every step.
#[test]
fn tokens_crafted_to_collide_under_a_fixed_hash_do_not_collide() {
    fn fixed(token: &[u8]) -> u64 {
        const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;
        let mix = |h: u64, word: u64| {
            let product = u128::from(h ^ word) * u128::from(SEED);
            (product as u64) ^ ((product >> 64) as u64)
        };
        let mut hash = token.len() as u64;
        for chunk in token.chunks_exact(8) {
            hash = mix(hash, u64::from_le_bytes(chunk.try_into().unwrap()));
        }
        hash
    }
    // Two 16-byte tokens: different first words, last words chosen so the state before the
    // last mix is the same (h1 ^ w1 == h2 ^ w2), both printable ASCII.
    // ASCII bytes are valid UTF-8 whatever they are; about one in 256 candidates gives an ASCII
    // second word.
    let ascii = |w: u64| w.to_le_bytes().iter().all(|b| b.is_ascii());
    let state = |first: &[u8; 8]| {
        let word = u64::from_le_bytes(*first);
        let product = u128::from(16u64 ^ word) * u128::from(0x51_7c_c1_b7_27_22_0a_95u64);
        (product as u64) ^ ((product >> 64) as u64)
    };
    // Spread n's bits over eight 7-bit bytes: always ASCII.
    let ascii_word = |n: u64| (0..8).fold(0u64, |w, i| w | (((n >> (7 * i)) & 0x7f) << (8 * i)));
    let h1 = state(b"aaaaaaaa");
    // A second first word whose state differs from the first's only in low bits of each byte:
    // then any ASCII last word w1 gives an ASCII w2 = h1 ^ h2 ^ w1.
    let f2 = (1u64..1_000_000)
        .map(ascii_word)
        .find(|&f| ascii(h1 ^ state(&f.to_le_bytes())))
        .expect("a second first word");
    let h2 = state(&f2.to_le_bytes());
    let w1 = ascii_word(12_345);
    let w2 = h1 ^ w1 ^ h2;
    let t1 = [&b"aaaaaaaa"[..], &w1.to_le_bytes()].concat();
    let t2 = [&f2.to_le_bytes()[..], &w2.to_le_bytes()].concat();
    assert_ne!(t1, t2);
    assert_eq!(
        fixed(&t1),
        fixed(&t2),
        "the pair collides under the fixed hash"
    );
    let (t1, t2) = (
        std::str::from_utf8(&t1).unwrap(),
        std::str::from_utf8(&t2).unwrap(),
    );
    assert_ne!(token_hash(t1), token_hash(t2), "{t1} and {t2} collide");
}

// Colliding hashes cost a binary search, so distinct tokens should rarely share one: 10,000
// tokens like a topic's, a word and a tail or a short one, get 10,000 distinct hashes (the
// FxHash mix before gave `tenant-*` 9,600).
#[test]
fn token_hash_spreads_distinct_tokens() {
    for shape in [
        |i| format!("tenant-{i}"),
        |i| format!("o{i}"),
        |i| format!("{i:08}"),
    ] {
        let hashes: BTreeSet<u64> = (0..10_000).map(|i| token_hash(&shape(i))).collect();
        assert_eq!(hashes.len(), 10_000, "{}", shape(0));
    }
}

#[test]
fn debug_shows_the_entry_count() {
    let mut index = PatternIndex::default();
    index.insert(&p("a.b"), 1u64);
    index.insert(&p("a.*"), 2u64);
    assert_eq!(format!("{index:?}"), "PatternIndex { len: 2, .. }");
}

// A node's vectors grow exactly while small (most nodes hold one key or one child) and double
// past four, so a node with many children is not reallocated on every insert.
#[test]
fn vectors_grow_exactly_while_small_then_double() {
    let mut small = vec![1, 2, 3];
    small.shrink_to_fit();
    reserve_one(&mut small);
    assert_eq!(small.capacity(), 4);
    let mut four = vec![1, 2, 3, 4];
    four.shrink_to_fit();
    reserve_one(&mut four);
    assert!(four.capacity() >= 8, "capacity {}", four.capacity());
    let mut roomy = Vec::with_capacity(10);
    roomy.push(1);
    reserve_one(&mut roomy);
    assert_eq!(roomy.capacity(), 10);
}

/// The top-level node whose label is `label`.
fn top<'a>(index: &'a mut PatternIndex<usize>, label: &str) -> &'a mut Node<usize> {
    edges_mut(&mut index.root)
        .iter_mut()
        .map(|edge| &mut *edge.node)
        .find(|node| &*node.label == label)
        .unwrap_or_else(|| panic!("no top-level node {label:?}"))
}

/// An index with a keyless node of three literal children and a star child ("a.b"), a
/// keyless node of one literal and one star child ("c"), and five keys on one node ("q").
fn varied() -> PatternIndex<usize> {
    let mut index = PatternIndex::new();
    for (key, pat) in ["a.b.x", "a.b.y", "a.b.z", "a.b.*", "c.d.x", "c.*.x"]
        .iter()
        .enumerate()
    {
        index.insert(&p(pat), key);
    }
    for key in 10..15 {
        index.insert(&p("q"), key);
    }
    index
}

// `check` is the oracle of the property tests and the fuzz target: it accepts every shape the
// index builds (many children, a star beside one literal, several keys on a node, spare
// capacity up to twice the length) and names each broken one.
#[test]
fn check_accepts_the_shapes_the_index_builds() {
    let mut index = varied();
    index.check().unwrap();
    assert_eq!(top(&mut index, "a.b").children(), 4);
    assert_eq!(top(&mut index, "c").children(), 2);
    let keys = &mut top(&mut index, "q").exact;
    assert_eq!(keys.len(), 5);
    keys.shrink_to_fit();
    keys.reserve_exact(3);
    assert!((8..=10).contains(&keys.capacity()));
    index.check().unwrap();
}

#[test]
fn check_names_each_broken_shape() {
    type Breaking = fn(&mut PatternIndex<usize>);
    let broken: [(&str, Breaking); 8] = [
        ("capacity", |index| top(index, "q").exact.reserve_exact(20)),
        ("not sorted", |index| top(index, "q").exact.swap(0, 1)),
        ("out of order", |index| {
            edges_mut(top(index, "a.b")).swap(0, 1)
        }),
        ("edge to", |index| edges_mut(top(index, "a.b"))[0].hash ^= 1),
        ("no key", |index| {
            let node = top(index, "c");
            node.literal = Literal::Narrow(Vec::new());
            node.star.as_mut().unwrap().exact = Vec::new();
            index.len -= 2;
        }),
        ("entries held", |index| index.len += 1),
        ("shapes counted", |index| index.shapes[0].count += 1),
        ("shapes counted", |index| {
            index.shapes.remove(0);
        }),
    ];
    for (what, breaking) in broken {
        let mut index = varied();
        breaking(&mut index);
        let error = index.check().expect_err(what);
        assert!(error.contains(what), "{what}: {error}");
    }
}

// After a removal a vector keeps its capacity up to twice its length; past that it shrinks to
// half as much again as its length (so a remove and an insert do not reallocate in turn), and
// an empty one gives back everything.
#[test]
fn shrink_keeps_up_to_twice_the_length_then_leaves_half_again() {
    let with = |len: usize, capacity: usize| {
        let mut v: Vec<u64> = Vec::with_capacity(capacity);
        v.extend(0..len as u64);
        assert_eq!(v.capacity(), capacity);
        shrink(&mut v);
        v.capacity()
    };
    assert_eq!(with(4, 8), 8, "exactly twice: kept");
    assert_eq!(with(4, 10), 6);
    assert_eq!(with(3, 8), 4);
    assert_eq!(with(0, 4), 0);
}

/// What `f` moved of the children's vectors and tables (see `MOVED`).
fn moving<R>(f: impl FnOnce() -> R) -> (R, u64) {
    let before = MOVED.with(std::cell::Cell::get);
    let out = f();
    (out, MOVED.with(std::cell::Cell::get) - before)
}

/// The node whose label is `label`, below the root.
fn child<'a>(index: &'a PatternIndex<usize>, label: &str) -> &'a Node<usize> {
    index
        .root
        .literal
        .nodes()
        .find(|node| &*node.label == label)
        .unwrap_or_else(|| panic!("no top-level node {label:?}"))
}

// Issue 26: 10,000 patterns sharing a prefix made each insertion a shift of a sorted vector of
// up to 10,000 children (about n²/4 = 25 million moved in all). Past `WIDE` children a node
// keeps them in a table, so inserting them all moves a few per child (the vector's shifts up
// to `WIDE`, the table's doublings), and removing them goes back to a vector.
#[test]
fn ten_thousand_children_of_one_node_are_inserted_in_constant_time_each() {
    const N: usize = 10_000;
    let pattern = |n: usize| p(&format!("shared.t{n}.x"));
    let patterns: Vec<Pattern> = (0..N).map(pattern).collect();
    let mut index = PatternIndex::new();
    index.insert(&p("shared"), N);
    let ((), moved) = moving(|| {
        for (n, pattern) in patterns.iter().enumerate() {
            index.insert(pattern, n);
        }
    });
    index.check().unwrap();
    assert!(
        matches!(child(&index, "shared").literal, Literal::Wide(_)),
        "10,000 children in a table"
    );
    assert!(
        moved <= 10 * N as u64,
        "{N} insertions moved {moved} children"
    );
    for n in [0, 4_999, 9_999] {
        assert_eq!(
            index.matches(&t(&format!("shared.t{n}.x"))),
            BTreeSet::from([n])
        );
    }
    assert!(index.matches(&t("shared.t10000.x")).is_empty());
    // Removal: the table shrinks as it empties, and below `NARROW` a vector again.
    for (n, pattern) in patterns.iter().enumerate().skip(NARROW - 1) {
        index.remove(pattern, &n);
        if n % 1_000 == 0 {
            index.check().unwrap();
        }
    }
    index.check().unwrap();
    assert_eq!(edges(child(&index, "shared")).len(), NARROW - 1);
    assert_eq!(index.matches(&t("shared.t7.x")), BTreeSet::from([7]));
}

// A table's children whose keyed hashes collide (here every token of one length) are kept
// apart by their token, found, removed, and go back to a vector with the rest.
#[test]
fn a_table_tells_colliding_children_apart() {
    WEAK_KEYED_HASH.with(|weak| weak.set(true));
    let tokens: Vec<String> = (0..WIDE + 100).map(|n| format!("k{n}")).collect();
    let mut index = PatternIndex::new();
    for (n, token) in tokens.iter().enumerate() {
        index.insert(&p(&format!("{token}.end")), n);
        index.insert(&p(&format!("{token}.*")), n);
    }
    index.check().unwrap();
    let Literal::Wide(wide) = &index.root.literal else {
        panic!("{} children in a vector", tokens.len());
    };
    // Three lengths of token: three in the table, the rest collided.
    assert_eq!(wide.map.len(), 3);
    assert_eq!(wide.collided.len(), tokens.len() - 3);
    for (n, token) in tokens.iter().enumerate() {
        assert_eq!(
            index.matches(&t(&format!("{token}.end"))),
            BTreeSet::from([n])
        );
    }
    assert!(index.matches(&t("k9999.end")).is_empty());
    for (n, token) in tokens.iter().enumerate().rev() {
        index.remove(&p(&format!("{token}.end")), &n);
        index.remove(&p(&format!("{token}.*")), &n);
        index.check().unwrap();
    }
    assert!(index.is_empty());
    assert_eq!(nodes(&index.root), 0);
    WEAK_KEYED_HASH.with(|weak| weak.set(false));
}

// A wildcard shape is a prefix's depth and the positions of its `*`s; each is counted while
// an entry's pattern has it, whatever its literal tokens, and `>` adds none.
#[test]
fn wildcard_shapes_are_counted_while_an_entry_has_them() {
    let mut index = PatternIndex::new();
    index.insert(&p("a.b.c"), 1);
    assert_eq!(index.shapes(), 0, "no `*`, no shape");
    index.insert(&p("a.*.c"), 1);
    assert_eq!(index.shapes(), 2, "a.* and a.*.c");
    index.insert(&p("x.*.y.>"), 2);
    assert_eq!(index.shapes(), 2, "x.*.y has the shapes of a.*.c");
    index.insert(&p("x.*.y.*"), 2);
    assert_eq!(index.shapes(), 3, "x.*.y.* adds one");
    index.insert(&p("*"), 3);
    assert_eq!(index.shapes(), 4);
    assert_eq!(
        index.shapes_with(&[p("q.*.r"), p("*.b"), p("*.c"), p(">")]),
        5,
        "only the shape of *.b and *.c is new"
    );
    assert_eq!(index.shapes(), 4, "shapes_with changes nothing");
    index.remove(&p("a.*.c"), &1);
    assert_eq!(index.shapes(), 4, "x.*.y.> and x.*.y.* still hold theirs");
    index.remove(&p("a.*.c"), &1);
    assert_eq!(
        index.shapes(),
        4,
        "removing what is not there changes nothing"
    );
    for (pat, key) in [("x.*.y.>", 2), ("x.*.y.*", 2), ("*", 3)] {
        index.remove(&p(pat), &key);
    }
    assert_eq!(index.shapes(), 0);
    assert_eq!(index.shapes.capacity(), 0);
    index.check().unwrap();
}

// The bound on a walk: with every layout of `{a,*}^k.b` (the worst case for a topic of `a`s,
// whose prefixes every pattern's prefixes match), a topic that matches none visits every node
// but the leaves, one that matches all visits every node, and neither more than one node per
// shape, per wildcard-free prefix and the root.
#[test]
fn a_walk_visits_at_most_one_node_per_shape_per_token_and_the_root() {
    for k in 1..=8 {
        let mut index = PatternIndex::new();
        for mask in 0..1u32 << k {
            let tokens: Vec<&str> = (0..k)
                .map(|i| if mask >> i & 1 == 1 { "*" } else { "a" })
                .chain(["b"])
                .collect();
            index.insert(&p(&tokens.join(".")), mask as usize);
        }
        index.check().unwrap();
        let shapes = (1..=k).map(|d| (1 << d) - 1).sum::<usize>() + (1 << k) - 1;
        assert_eq!(index.shapes(), shapes, "k {k}");
        let mut out = Matches::new();
        let none = t(&format!("{}.c", vec!["a"; k].join(".")));
        let visited = index.matches_visiting(&none, &mut out);
        assert!(out.is_empty());
        assert_eq!(visited, (1 << k) - 1, "k {k}: every node but the leaves");
        assert!(visited <= index.walk_bound(&none), "k {k}");
        let all = t(&format!("{}.b", vec!["a"; k].join(".")));
        let visited = index.matches_visiting(&all, &mut out);
        assert_eq!(out.len(), 1 << k);
        assert_eq!(visited, (1 << (k + 1)) - 1, "k {k}: every node");
        assert_eq!(nodes(&index.root) + 1, visited);
        assert!(visited <= index.walk_bound(&all), "k {k}");
    }
}
