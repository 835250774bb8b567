//! The routing index (docs/semantics.md#topics-and-patterns): property tests against naive matching, and its memory measured
//! with a counting allocator, against the figure (a subscription of 64 patterns of 254
//! bytes costs at most 64 KiB in the index) and against what the memory budget charges for it.

use std::{
    alloc::{GlobalAlloc, Layout, System},
    cell::Cell,
    collections::BTreeSet,
    sync::Arc,
};

use proptest::prelude::*;
use tinybroker::{
    broker::Broker,
    clock::VirtualClock,
    core::{
        Limits, MemberOptions, Mode, OpenRequest, Pattern, PatternIndex, SubscriptionSpec, Topic,
        index::Matches,
        subscription::{MEMBER_OVERHEAD, SUBSCRIPTION_OVERHEAD, pattern_cost, subscription_cost},
    },
};

/// Counts the current thread's live heap: tests run on threads of their own, so each sees only
/// its own allocations.
struct Counting;

thread_local! {
    /// Live bytes as glibc's malloc holds them: each allocation's chunk, its request plus an
    /// 8-byte header rounded up to 16, at least 32.
    static LIVE: Cell<i64> = const { Cell::new(0) };
}

fn chunk(size: usize) -> i64 {
    ((size + 8).div_ceil(16) * 16).max(32) as i64
}

fn count(delta: i64) {
    // Unavailable only while the thread is torn down, when nothing is measured.
    let _ = LIVE.try_with(|live| live.set(live.get() + delta));
}

// SAFETY: every call is passed on to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(chunk(layout.size()));
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(chunk(layout.size()));
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-chunk(layout.size()));
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(chunk(new_size) - chunk(layout.size()));
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn live() -> i64 {
    LIVE.with(Cell::get)
}

/// What `f` leaves allocated on this thread, in bytes.
fn held_by<R>(f: impl FnOnce() -> R) -> (R, i64) {
    let before = live();
    let out = f();
    (out, live() - before)
}

fn p(s: &str) -> Pattern {
    Pattern::parse(s).unwrap()
}

const KIB: i64 = 1024;

/// The shapes of a heavy subscription's 64 patterns, each exactly 254 bytes and 32 tokens.
#[derive(Debug, Clone, Copy)]
enum Shape {
    /// All literal, nothing shared (the hostile test's subscriptions).
    Distinct,
    /// Every other token `*`.
    Wildcards,
    /// The 64 share their first 24 tokens and then diverge: each splits a label.
    SharedPrefix,
    /// Distinct, ending in `>`.
    Trailing,
}

fn heavy(n: usize, shape: Shape) -> Vec<String> {
    (0..64)
        .map(|p| {
            let mut tokens: Vec<String> = (1..32).map(|t| format!("t{t:02}{n:03}")).collect();
            match shape {
                Shape::Distinct => {}
                Shape::Wildcards => {
                    for token in tokens.iter_mut().skip(1).step_by(2) {
                        *token = "*".into();
                    }
                }
                Shape::SharedPrefix => tokens[23] = format!("d{p:02}{n:03}"),
                Shape::Trailing => *tokens.last_mut().unwrap() = ">".into(),
            }
            let head = match shape {
                Shape::SharedPrefix => format!("shared{n}"),
                _ => format!("h{n}x{p}"),
            };
            let used: usize = tokens.iter().map(|t| t.len() + 1).sum();
            let mut first = head;
            while first.len() + used < 254 {
                first.push('y');
            }
            let text = std::iter::once(first)
                .chain(tokens)
                .collect::<Vec<_>>()
                .join(".");
            assert_eq!((text.len(), text.split('.').count()), (254, 32));
            text
        })
        .collect()
}

fn parsed(texts: &[String]) -> Vec<Pattern> {
    texts.iter().map(|t| p(t)).collect()
}

/// A subscription of 64 patterns of 254 bytes costs at most 64 KiB in the index, whatever its
/// patterns' shape, beside 100 other such subscriptions. The index before this one took 1.17 MB.
#[test]
fn a_subscription_of_64_patterns_of_254_bytes_costs_at_most_64_kib_in_the_index() {
    for shape in [
        Shape::Distinct,
        Shape::Wildcards,
        Shape::SharedPrefix,
        Shape::Trailing,
    ] {
        let mut index = PatternIndex::new();
        for n in 0..100 {
            for pattern in parsed(&heavy(n, shape)) {
                index.insert(&pattern, n as u64);
            }
        }
        let patterns = parsed(&heavy(100, shape));
        let ((), cost) = held_by(|| {
            for pattern in &patterns {
                index.insert(pattern, 100);
            }
        });
        // The figure for the README (`--nocapture`).
        println!("{shape:?}: one subscription costs the index {cost} bytes");
        assert!(
            cost <= 64 * KIB,
            "{shape:?}: one subscription costs the index {cost} bytes"
        );
        // Its removal gives all of it back.
        let ((), freed) = held_by(|| {
            for pattern in &patterns {
                index.remove(pattern, &100);
            }
        });
        assert_eq!(freed, -cost, "{shape:?}");
        index.check().unwrap();
    }
}

/// What the budget charges a subscription for its patterns covers what the index really holds
/// for it, and is not far above it for patterns that share nothing (so the budget does not
/// refuse subscriptions it has room for).
#[test]
fn the_charge_for_patterns_covers_the_index_and_the_settings() {
    for shape in [
        Shape::Distinct,
        Shape::Wildcards,
        Shape::SharedPrefix,
        Shape::Trailing,
    ] {
        let mut index = PatternIndex::new();
        let mut charged = 0;
        let mut held = 0;
        let mut in_index_total = 0;
        let mut specs = Vec::new();
        for n in 0..50 {
            let texts = heavy(n, shape);
            // The settings a subscription keeps: its patterns, parsed once, in a list.
            let (patterns, settings) = held_by(|| texts.iter().map(|t| p(t)).collect::<Vec<_>>());
            let ((), in_index) = held_by(|| {
                for pattern in &patterns {
                    index.insert(pattern, n as u64);
                }
            });
            held += settings + in_index;
            in_index_total += in_index;
            charged += patterns.iter().map(pattern_cost).sum::<u64>() as i64;
            assert!(held <= charged, "{shape:?}: {held} held, {charged} charged");
            specs.push(patterns);
        }
        if matches!(shape, Shape::Distinct | Shape::Trailing) {
            assert!(
                charged <= 2 * held,
                "{shape:?}: {charged} charged for {held} held"
            );
        }
        let ((), freed) = held_by(|| {
            for (n, patterns) in specs.iter().enumerate() {
                for pattern in patterns {
                    index.remove(pattern, &(n as u64));
                }
            }
        });
        assert_eq!(index.len(), 0);
        assert_eq!(
            freed, -in_index_total,
            "{shape:?}: the emptied index holds nothing"
        );
    }
}

/// End to end: what opening heavy subscriptions allocates in the broker (their settings,
/// the index entries, the subscription and a member each) is within what the memory budget
/// accounts for them.
#[test]
fn the_broker_accounts_at_least_what_heavy_subscriptions_hold() {
    let broker = Broker::new(
        Limits::default(),
        Arc::new(VirtualClock::new(1_700_000_000_000)),
    );
    let request = |n: usize| OpenRequest {
        subscription_id: format!("heavy-{n}"),
        spec: SubscriptionSpec {
            mode: Mode::Broadcast,
            consumer_group: String::new(),
            patterns: parsed(&heavy(n, Shape::Distinct)),
            max_delivery_attempts: 0,
            dead_letter_topic: None,
            ack_mode: Default::default(),
            overflow: Default::default(),
        },
        member: MemberOptions::default(),
        metadata: std::sync::Arc::from(""),
    };
    let accounted = || broker.list().1.memory_accounted_bytes as i64;
    let before = accounted();
    // The requests are parsed and dropped inside: what stays is what the broker keeps (and the
    // member handles).
    let (members, held) = held_by(|| {
        (0..200)
            .map(|n| broker.open(&request(n), None).unwrap())
            .collect::<Vec<_>>()
    });
    let charged = accounted() - before;
    let per_subscription = subscription_cost(&request(0).spec) + MEMBER_OVERHEAD;
    assert_eq!(charged, 200 * per_subscription as i64);
    println!("200 heavy subscriptions: {held} bytes held, {charged} accounted");
    assert!(held <= charged, "{held} held, {charged} accounted");
    // Nor far above it (the budget would refuse subscriptions it has room for): beyond the
    // fixed overheads, at most twice what is held.
    assert!(
        charged - 200 * (SUBSCRIPTION_OVERHEAD + MEMBER_OVERHEAD) as i64 <= 2 * held,
        "{charged} accounted for {held} held"
    );
    drop(members);
}

/// The review's crafted patterns (issue 26): the `n`th of 64,000 distinct layouts of
/// `{a,*}^20.b` (`n` times an odd number, modulo 2^20, is distinct for distinct `n`).
fn crafted(n: u64) -> Pattern {
    let mask = (n * 0x9_e3b5) & 0xf_ffff;
    let tokens: Vec<&str> = (0..20)
        .map(|i| if mask >> i & 1 == 1 { "*" } else { "a" })
        .chain(["b"])
        .collect();
    p(&tokens.join("."))
}

/// Issue 26 part 3: with the review's 64,000 crafted patterns a publish to `a.a….a.c`, which
/// matches none, walks 64,000 nodes (following their labels too). The broker admits a subscription only
/// while the index's wildcard shapes stay within `max_wildcard_shapes` (the first crafted
/// subscription of 64 patterns has 1,065, and is refused, changing nothing), and whatever it
/// admits, every walk stays within the bound: the shapes, the topic's tokens, and the root.
#[test]
fn crafted_layouts_are_refused_past_the_shape_limit_and_walks_stay_within_the_bound() {
    let limit = Limits::default().max_wildcard_shapes;
    let zero_match = Topic::parse(&format!("{}.c", ["a"; 20].join("."))).unwrap();
    let all_match = Topic::parse(&format!("{}.b", ["a"; 20].join("."))).unwrap();
    let mut out = Matches::new();

    // What the index does unbounded (the broker before the limit).
    let mut unbounded = PatternIndex::new();
    for n in 0..64_000 {
        unbounded.insert(&crafted(n), n / 64);
    }
    let visited = unbounded.matches_visiting(&zero_match, &mut out);
    println!(
        "64,000 crafted patterns: {} shapes, {visited} nodes walked for none",
        unbounded.shapes()
    );
    assert!(out.is_empty());
    assert!(visited > 60_000, "{visited} nodes walked");
    assert!(visited <= unbounded.walk_bound(&zero_match));
    drop(unbounded);

    // The broker refuses the first crafted subscription, and nothing changes.
    let broker = Broker::new(
        Limits::default(),
        Arc::new(VirtualClock::new(1_700_000_000_000)),
    );
    let request = OpenRequest {
        subscription_id: "crafted-0".into(),
        spec: SubscriptionSpec {
            mode: Mode::Broadcast,
            consumer_group: String::new(),
            patterns: (0..64).map(crafted).collect(),
            max_delivery_attempts: 0,
            dead_letter_topic: None,
            ack_mode: Default::default(),
            overflow: Default::default(),
        },
        member: MemberOptions::default(),
        metadata: std::sync::Arc::from(""),
    };
    let before = broker.list().1;
    assert_eq!(
        broker.open(&request, None).unwrap_err(),
        tinybroker::core::Error::TooManyWildcardShapes {
            shapes: 1065,
            max: limit
        }
    );
    assert_eq!(
        broker.list().1,
        before,
        "a refused subscription changes nothing"
    );

    // As the broker admits them, one pattern per subscription: every walk within the bound.
    let mut index = PatternIndex::new();
    let mut admitted = 0;
    for n in 0..64_000 {
        let pattern = crafted(n);
        if index.shapes_with(std::slice::from_ref(&pattern)) <= limit {
            index.insert(&pattern, n);
            admitted += 1;
        }
    }
    assert_eq!(index.shapes(), limit);
    assert_eq!(admitted, 30);
    let mut topics = vec![zero_match, all_match];
    // Topics of `a`s and `x`s, ending in `b` or `c`.
    topics.extend((0..200u32).map(|n| {
        let tokens: Vec<&str> = (0..20)
            .map(|i| {
                if n.wrapping_mul(0x2f1) >> (i % 11) & 1 == 1 {
                    "x"
                } else {
                    "a"
                }
            })
            .chain([if n % 2 == 0 { "b" } else { "c" }])
            .collect();
        Topic::parse(&tokens.join(".")).unwrap()
    }));
    let mut most = 0;
    for topic in &topics {
        let visited = index.matches_visiting(topic, &mut out);
        let bound = index.walk_bound(topic);
        assert!(
            visited <= bound,
            "{topic}: {visited} visited, bound {bound}"
        );
        assert!(bound <= limit + 22);
        most = most.max(visited);
    }
    println!("{admitted} crafted patterns admitted: at most {most} nodes walked");

    // The worst case within the limit: every layout of `{a,*}^d` for each d up to 8 (502
    // shapes), so every node holds a key and a topic of 20 `a`s walks them all, matching none.
    let mut index = PatternIndex::new();
    let mut n = 0;
    for d in 1..=8 {
        for mask in 0..1u32 << d {
            let tokens: Vec<&str> = (0..d)
                .map(|i| if mask >> i & 1 == 1 { "*" } else { "a" })
                .collect();
            index.insert(&p(&tokens.join(".")), n);
            n += 1;
        }
    }
    assert_eq!(index.shapes(), 502);
    let topic = &topics[0];
    let visited = index.matches_visiting(topic, &mut out);
    assert!(out.is_empty());
    assert_eq!(visited, (1 << 9) - 1, "every node");
    assert!(visited <= index.walk_bound(topic));
    assert!(index.walk_bound(topic) <= limit + 22);
}

// Deep, long and shared-prefix patterns: a common spine of tokens that patterns leave at
// random depths, short tokens that collide, a long one, `*` and `>`.
const SPINE: [&str; 24] = [
    "s0", "s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8", "s9", "sa", "sb", "sc", "sd", "se", "sf",
    "sg", "sh", "si", "sj", "sk", "sl", "sm", "sn",
];
const LONG: &str = "a-rather-long-token-of-forty-bytes-or-so";

fn literal() -> impl Strategy<Value = String> {
    prop_oneof![
        // `é` and `è` part in the middle of a character.
        3 => prop_oneof![Just("a"), Just("b"), Just("c"), Just("é"), Just("è")].prop_map(String::from),
        1 => Just(LONG.to_string()),
        1 => (0..SPINE.len()).prop_map(|i| SPINE[i].to_string()),
    ]
}

fn topic_text() -> impl Strategy<Value = String> {
    (0..=SPINE.len(), prop::collection::vec(literal(), 0..6))
        .prop_map(|(depth, tail)| {
            let mut tokens: Vec<String> = SPINE[..depth].iter().map(|s| s.to_string()).collect();
            tokens.extend(tail);
            if tokens.is_empty() {
                tokens.push("a".into());
            }
            tokens.join(".")
        })
        // A long spine and several long tokens can pass the topic limit (256 bytes): such a
        // topic is refused at the door, so the index never sees it.
        .prop_filter("within the topic limits", |t| Topic::parse(t).is_ok())
}

fn pattern_text() -> impl Strategy<Value = String> {
    (
        0..=SPINE.len(),
        prop::collection::vec(prop_oneof![1 => Just(0), 1 => Just(1)], 0..SPINE.len()),
        prop::collection::vec(
            prop_oneof![3 => literal(), 1 => Just("*".to_string())],
            0..6,
        ),
        prop_oneof![
            Just(None),
            Just(Some(">".to_string())),
            literal().prop_map(Some)
        ],
    )
        .prop_map(|(depth, stars, tail, last)| {
            // Spine tokens, some replaced by `*`.
            let mut tokens: Vec<String> = SPINE[..depth]
                .iter()
                .zip(stars.iter().chain(std::iter::repeat(&0)))
                .map(|(s, star)| {
                    if *star == 1 {
                        "*".into()
                    } else {
                        s.to_string()
                    }
                })
                .collect();
            tokens.extend(tail);
            tokens.extend(last);
            if tokens.is_empty() {
                tokens.push("a".into());
            }
            tokens.join(".")
        })
        .prop_filter("within the pattern limits", |t| Pattern::parse(t).is_ok())
}

// The review's adversarial shapes (issue 26): layouts of `{a,*}^k.b`, and topics of `a`s that
// every such pattern's prefixes match, ending in `b` (all match) or `c` (none do); and many
// siblings under one prefix (`wide.N`), past the point where a node keeps its children in a
// table.
fn crafted_pattern() -> impl Strategy<Value = String> {
    (
        1..12usize,
        any::<u16>(),
        prop_oneof![Just("b"), Just(">"), Just("*")],
    )
        .prop_map(|(k, mask, last)| {
            let mut tokens: Vec<&str> = (0..k)
                .map(|i| if mask >> i & 1 == 1 { "*" } else { "a" })
                .collect();
            tokens.push(last);
            tokens.join(".")
        })
}

fn crafted_topic() -> impl Strategy<Value = String> {
    (1..13usize, prop_oneof![Just("b"), Just("c")])
        .prop_map(|(k, last)| format!("{}.{last}", vec!["a"; k].join(".")))
}

/// `wide.sN` and a tail for each N in order (one child of `wide` each).
fn sibling_patterns() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(prop_oneof![Just(""), Just(".x"), Just(".*")], 300..400).prop_map(
        |tails| {
            tails
                .iter()
                .enumerate()
                .map(|(n, tail)| format!("wide.s{n}{tail}"))
                .collect()
        },
    )
}

fn sibling_topic() -> impl Strategy<Value = String> {
    (0..400u32, prop_oneof![Just(""), Just(".x"), Just(".y")])
        .prop_map(|(n, tail)| format!("wide.s{n}{tail}"))
}

/// The wildcard shapes of a pattern's prefixes, recomputed from its text: (tokens, positions
/// of `*`) for each prefix before a final `>` that holds a `*`.
fn naive_shapes(pattern: &Pattern) -> Vec<(usize, u32)> {
    let tokens: Vec<&str> = pattern.as_str().split('.').collect();
    let path = match tokens.last() {
        Some(&">") => &tokens[..tokens.len() - 1],
        _ => &tokens[..],
    };
    let mut stars = 0u32;
    let mut shapes = Vec::new();
    for (at, token) in path.iter().enumerate() {
        if *token == "*" {
            stars |= 1 << at;
        }
        if stars != 0 {
            shapes.push((at + 1, stars));
        }
    }
    shapes
}

#[derive(Debug, Clone)]
enum Op {
    Insert(usize, u64),
    Remove(usize, u64),
}

fn op(patterns: usize) -> impl Strategy<Value = Op> {
    weighted_op(patterns, 3, 2)
}

fn weighted_op(patterns: usize, inserts: u32, removals: u32) -> impl Strategy<Value = Op> {
    prop_oneof![
        inserts => (0..patterns, 0..4u64).prop_map(|(p, k)| Op::Insert(p, k)),
        removals => (0..patterns, 0..4u64).prop_map(|(p, k)| Op::Remove(p, k)),
    ]
}

fn scenario() -> impl Strategy<Value = (Vec<String>, Vec<Op>, Vec<String>)> {
    prop::collection::vec(pattern_text(), 1..16).prop_flat_map(|patterns| {
        let n = patterns.len();
        (
            Just(patterns),
            prop::collection::vec(op(n), 1..60),
            prop::collection::vec(topic_text(), 1..10),
        )
    })
}

/// Crafted layouts, inserted and removed in any order.
fn crafted_scenario() -> impl Strategy<Value = (Vec<String>, Vec<Op>, Vec<String>)> {
    prop::collection::vec(crafted_pattern(), 1..48).prop_flat_map(|patterns| {
        let n = patterns.len();
        (
            Just(patterns),
            prop::collection::vec(op(n), 20..100),
            prop::collection::vec(crafted_topic(), 1..8),
        )
    })
}

/// Hundreds of siblings: each inserted (past `WIDE` children of one node), any inserts and
/// removals, then most of them removed in any order (back below `NARROW`), and a few more.
fn siblings_scenario() -> impl Strategy<Value = (Vec<String>, Vec<Op>, Vec<String>)> {
    sibling_patterns().prop_flat_map(|patterns| {
        let n = patterns.len();
        (
            Just(patterns),
            (
                prop::collection::vec(0..4u64, n),
                prop::collection::vec(op(n), 0..50),
                Just((0..n).collect::<Vec<_>>()).prop_shuffle(),
                n - 60..n,
                prop::collection::vec(op(n), 0..20),
            )
                .prop_map(|(keys, middle, order, removed, last)| {
                    let mut ops: Vec<Op> = keys
                        .iter()
                        .enumerate()
                        .map(|(p, k)| Op::Insert(p, *k))
                        .collect();
                    ops.extend(middle);
                    // The entries held now: the first key of each, and whatever `middle` did.
                    ops.extend(
                        (0..4)
                            .flat_map(|k| order[..removed].iter().map(move |p| Op::Remove(*p, k))),
                    );
                    ops.extend(last);
                    ops
                }),
            prop::collection::vec(sibling_topic(), 1..8),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 512,
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::Direct("proptest-regressions/index.txt"),
        )),
        ..ProptestConfig::default()
    })]

    // docs/semantics.md#topics-and-patterns: after every insert and removal, in any interleaving, the index agrees with
    // naive matching over what it holds, keeps its shape, counts the wildcard shapes its
    // entries have, walks no more nodes than that count bounds, holds no more memory than the
    // budget charges for its entries, and returns to empty, holding nothing, when every entry
    // is removed.
    #[test]
    fn index_agrees_with_naive_matching_through_inserts_and_removals(
        (texts, ops, topics) in scenario()
    ) {
        agrees_with_naive_matching(&texts, &ops, &topics)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::Direct("proptest-regressions/index.txt"),
        )),
        ..ProptestConfig::default()
    })]

    // The same, over the adversarial shapes (issue 26): crafted layouts of `{a,*}^k` ...
    #[test]
    fn index_agrees_with_naive_matching_over_crafted_layouts(
        (texts, ops, topics) in crafted_scenario()
    ) {
        agrees_with_naive_matching(&texts, &ops, &topics)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 12,
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::Direct("proptest-regressions/index.txt"),
        )),
        ..ProptestConfig::default()
    })]

    // ... and hundreds of siblings, whose node's children go to a table and back.
    #[test]
    fn index_agrees_with_naive_matching_over_hundreds_of_siblings(
        (texts, ops, topics) in siblings_scenario()
    ) {
        agrees_with_naive_matching(&texts, &ops, &topics)?;
    }
}

fn agrees_with_naive_matching(
    texts: &[String],
    ops: &[Op],
    topics: &[String],
) -> Result<(), TestCaseError> {
    {
        let patterns: Vec<Pattern> = texts.iter().map(|t| p(t)).collect();
        let topics: Vec<Topic> = topics.iter().map(|t| Topic::parse(t).unwrap()).collect();
        let mut held_entries = BTreeSet::new();
        let mut index = PatternIndex::new();
        let mut bytes = 0;
        for op in ops {
            let ((), delta) = held_by(|| match *op {
                Op::Insert(p, k) => index.insert(&patterns[p], k),
                Op::Remove(p, k) => index.remove(&patterns[p], &k),
            });
            bytes += delta;
            // The index keys entries by pattern text: two equal texts are one pattern, so
            // the model names each by the first position of its text.
            let same = |p: usize| texts.iter().position(|t| *t == texts[p]).unwrap_or(p);
            match *op {
                Op::Insert(p, k) => held_entries.insert((same(p), k)),
                Op::Remove(p, k) => held_entries.remove(&(same(p), k)),
            };
            prop_assert_eq!(index.len(), held_entries.len());
            index.check().map_err(TestCaseError::fail)?;
            let shapes: BTreeSet<(usize, u32)> = held_entries
                .iter()
                .flat_map(|(p, _)| naive_shapes(&patterns[*p]))
                .collect();
            prop_assert_eq!(index.shapes(), shapes.len());
            // The entries' charges, and the table of shapes (which the broker's limit bounds).
            let charged: u64 = held_entries
                .iter()
                .map(|(p, _)| PatternIndex::<u64>::entry_cost(&patterns[*p]))
                .sum::<u64>()
                + PatternIndex::<u64>::shape_table_cost(shapes.len());
            prop_assert!(
                bytes <= charged as i64,
                "{} held, {} charged",
                bytes,
                charged
            );
            for topic in &topics {
                let naive: BTreeSet<u64> = held_entries
                    .iter()
                    .filter(|(p, _)| patterns[*p].matches(topic))
                    .map(|(_, k)| *k)
                    .collect();
                prop_assert_eq!(index.matches(topic), naive, "topic {}", topic);
                let mut out = Matches::new();
                let visited = index.matches_visiting(topic, &mut out);
                let bound = shapes.len() + topic.tokens().count() + 1;
                prop_assert_eq!(index.walk_bound(topic), bound);
                prop_assert!(visited <= bound, "{} visited, bound {}", visited, bound);
            }
        }
        let ((), delta) = held_by(|| {
            for (p, k) in &held_entries {
                index.remove(&patterns[*p], k);
            }
        });
        bytes += delta;
        prop_assert!(index.is_empty());
        prop_assert_eq!(index.shapes(), 0);
        index.check().map_err(TestCaseError::fail)?;
        prop_assert_eq!(bytes, 0, "an emptied index holds nothing");
    }
    Ok(())
}
