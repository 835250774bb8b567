//! Micro-benchmarks of the pure core's per-message decisions (README, "Performance"):
//! `cargo bench --bench core`.

use std::{hint::black_box, time::Duration};

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use tinybroker::core::{
    Envelope, Floors, Headers, MemberOptions, Message, Mode, Pattern, PatternIndex, QueueLimits,
    Subscription, SubscriptionSpec, Topic, index::Matches,
};

fn spec(mode: Mode) -> SubscriptionSpec {
    SubscriptionSpec {
        mode,
        consumer_group: "g".into(),
        patterns: vec![Pattern::parse("bench.>").unwrap()],
        max_delivery_attempts: 0,
        dead_letter_topic: None,
        ack_mode: Default::default(),
        overflow: Default::default(),
    }
}

fn subscription(mode: Mode) -> Subscription {
    let limits = QueueLimits {
        max_messages: u64::MAX,
        max_bytes: u64::MAX,
        max_members: 10_000,
        idle_timeout: Duration::from_secs(60),
    };
    Subscription::new(
        "bench".into(),
        spec(mode),
        limits,
        Floors::default(),
        Duration::ZERO,
    )
}

fn message(id: u64) -> Message {
    let envelope = Envelope::new(Topic::parse("bench.work").unwrap(), Headers::new());
    Message::new(id, 0, envelope, &[0; 128])
}

fn window(n: u32) -> MemberOptions {
    MemberOptions {
        max_in_flight: n,
        notify_standby: false,
        priority: 0,
    }
}

fn core(c: &mut Criterion) {
    // Publish decision: queue one message on a subscription whose only member has window space,
    // so it is delivered at once (enqueue + dispatch), then ack it (release + dispatch).
    c.bench_function("publish_and_ack_one_message", |b| {
        let mut sub = subscription(Mode::Queue);
        let spec = sub.spec().clone();
        let (member, _) = sub.join(&spec, window(1)).unwrap();
        let mut id = 0;
        b.iter(|| {
            id += 1;
            black_box(sub.enqueue(message(id)));
            black_box(sub.ack(Some(member), id).unwrap());
        });
    });
    // Publish decision alone: queue behind a full window (no delivery).
    c.bench_function("publish_queued_behind_full_window", |b| {
        b.iter_batched_ref(
            || {
                let mut sub = subscription(Mode::Singleton);
                let spec = sub.spec().clone();
                sub.join(&spec, window(1)).unwrap();
                let _ = sub.enqueue(message(1));
                (sub, (2..1002).map(message).collect::<Vec<_>>())
            },
            |(sub, messages)| {
                for m in messages.drain(..) {
                    black_box(sub.enqueue(m));
                }
            },
            BatchSize::SmallInput,
        );
    });
    // Promotion with 1,000 standbys: the active member leaves holding a message; the earliest
    // standby is confirmed and gets it.
    c.bench_function("promotion_with_1000_standbys", |b| {
        b.iter_batched_ref(
            || {
                let mut sub = subscription(Mode::Singleton);
                let spec = sub.spec().clone();
                let (active, _) = sub.join(&spec, window(1)).unwrap();
                for _ in 0..1000 {
                    sub.join(&spec, window(1)).unwrap();
                }
                let _ = sub.enqueue(message(1));
                (sub, active)
            },
            |(sub, active)| black_box(sub.leave(*active, Duration::ZERO)),
            BatchSize::SmallInput,
        );
    });
    // Acking a full window of 10,000 messages (the largest window a member may ask for), as one
    // Settle on a Consume stream does: each ack must cost O(log window), not a scan of the
    // member's in-flight list.
    c.bench_function("ack_a_full_window_of_10000", |b| {
        b.iter_batched_ref(
            || {
                let mut sub = subscription(Mode::Queue);
                let spec = sub.spec().clone();
                let (member, _) = sub.join(&spec, window(10_000)).unwrap();
                for id in 1..=10_000 {
                    let _ = sub.enqueue(message(id));
                }
                (sub, member)
            },
            |(sub, member)| {
                for id in 1..=10_000 {
                    black_box(sub.ack(Some(*member), id).unwrap());
                }
            },
            BatchSize::LargeInput,
        );
    });
    // Routing one topic against 10,000 subscriptions' patterns.
    c.bench_function("route_one_topic_among_10000_patterns", |b| {
        let mut index = PatternIndex::new();
        for n in 0..10_000u64 {
            index.insert(&Pattern::parse(&bench_pattern(n)).unwrap(), n);
        }
        let topic = Topic::parse("orders.region42.shop4242").unwrap();
        // As a publish routes: into a stack buffer (`matches` builds a set from it for tests).
        let mut keys = Matches::new();
        b.iter(|| {
            index.matches_into(black_box(&topic), &mut keys);
            black_box(&keys);
        });
    });
    c.bench_function(
        "route_one_topic_to_100_subscriptions_among_10000_patterns",
        |b| {
            let mut index = PatternIndex::new();
            for n in 0..10_000u64 {
                index.insert(&Pattern::parse(&bench_pattern(n)).unwrap(), n);
            }
            // `orders.region40.*`, held by 100 subscriptions.
            let topic = Topic::parse("orders.region40.shop4240").unwrap();
            assert_eq!(index.matches(&topic).len(), 100);
            let mut keys = Matches::new();
            b.iter(|| {
                index.matches_into(black_box(&topic), &mut keys);
                black_box(&keys);
            });
        },
    );
    // Heavy subscriptions (the limit: 64 patterns of up to 256 bytes): 1,000 of them in the
    // index, then one more inserted and removed, or one topic routed to one of them.
    let heavy_index = || {
        let mut index = PatternIndex::new();
        for n in 0..1_000u64 {
            for pattern in heavy_subscription(n) {
                index.insert(&pattern, n);
            }
        }
        index
    };
    c.bench_function(
        "insert_and_remove_a_subscription_of_64_patterns_of_254_bytes",
        |b| {
            let mut index = heavy_index();
            let patterns = heavy_subscription(1_000);
            b.iter(|| {
                for pattern in &patterns {
                    index.insert(pattern, 1_000);
                }
                for pattern in &patterns {
                    index.remove(pattern, &1_000);
                }
            });
        },
    );
    c.bench_function(
        "route_one_topic_among_1000_subscriptions_of_64_patterns_of_254_bytes",
        |b| {
            let index = heavy_index();
            let topic = Topic::parse(heavy_subscription(500)[31].as_str()).unwrap();
            assert_eq!(index.matches(&topic).len(), 1);
            let mut keys = Matches::new();
            b.iter(|| {
                index.matches_into(black_box(&topic), &mut keys);
                black_box(&keys);
            });
        },
    );
    // Adversarial shapes (issue 26): 1,000 subscriptions of 64 patterns drawn from
    // `{a,*}^20.b`, and a topic of 20 `a`s and a `c` that matches none of them but that every
    // pattern's prefix matches.
    let zero_match = Topic::parse(&format!("{}.c", ["a"; 20].join("."))).unwrap();
    let route_zero_match = |b: &mut criterion::Bencher, index: &PatternIndex<u64>| {
        assert!(index.matches(&zero_match).is_empty());
        let mut keys = Matches::new();
        b.iter(|| {
            index.matches_into(black_box(&zero_match), &mut keys);
            black_box(&keys);
        });
    };
    let mut index = PatternIndex::new();
    for n in 0..64_000 {
        index.insert(&crafted(n), n / 64);
    }
    c.bench_function("route_zero_match_among_64000_crafted_patterns", |b| {
        route_zero_match(b, &index);
    });
    drop(index);
    // As many of the crafted patterns as the broker admits under its shape limit, one
    // subscription each (the most a client gets in), and the worst case the limit allows:
    // every layout of `{a,*}^d` for every d up to the largest that fits, so that every node
    // holds a key and the walk visits them all.
    let limit = shape_limit();
    let mut index = PatternIndex::new();
    let mut shapes = std::collections::BTreeSet::new();
    let mut admitted = 0;
    for n in 0..64_000 {
        let pattern = crafted(n);
        let mut new = naive_shapes(&pattern);
        new.retain(|shape| !shapes.contains(shape));
        if shapes.len() + new.len() > limit {
            continue;
        }
        shapes.extend(new);
        index.insert(&pattern, n);
        admitted += 1;
    }
    eprintln!(
        "{admitted} crafted patterns admitted, {} shapes",
        shapes.len()
    );
    c.bench_function(
        "route_zero_match_among_the_crafted_patterns_the_shape_limit_admits",
        |b| route_zero_match(b, &index),
    );
    let every_layout = |k: usize| -> Vec<Pattern> {
        (1..=k)
            .flat_map(|d| (0..1u64 << d).map(move |m| layout(d, m)))
            .collect()
    };
    let fits = |patterns: &[Pattern]| {
        let shapes: std::collections::BTreeSet<_> =
            patterns.iter().flat_map(naive_shapes).collect();
        shapes.len() <= limit
    };
    let k = (1..20)
        .take_while(|&k| fits(&every_layout(k)))
        .last()
        .unwrap_or(1);
    let patterns = every_layout(k);
    let mut index = PatternIndex::new();
    for (n, pattern) in patterns.iter().enumerate() {
        index.insert(pattern, n as u64);
    }
    eprintln!(
        "every layout of {{a,*}}^d, d <= {k}: {} patterns",
        patterns.len()
    );
    c.bench_function("route_zero_match_worst_case_at_the_shape_limit", |b| {
        route_zero_match(b, &index);
    });
    // 10,000 patterns sharing their first token: one more inserted and removed (a node's many
    // children must not make each insertion O(n)).
    c.bench_function(
        "insert_and_remove_a_pattern_among_10000_sharing_a_prefix",
        |b| {
            let mut index = PatternIndex::new();
            for n in 0..10_000u64 {
                index.insert(&Pattern::parse(&format!("shared.t{n}.x")).unwrap(), n);
            }
            let patterns: Vec<Pattern> = (0..64)
                .map(|n| Pattern::parse(&format!("shared.new{n}.x")).unwrap())
                .collect();
            let mut at = 0;
            b.iter(|| {
                let pattern = &patterns[at % 64];
                at += 1;
                index.insert(pattern, 10_000);
                index.remove(pattern, &10_000);
            });
        },
    );
}

/// The shape limit the adversarial benches assume: `TINYBROKER_BENCH_SHAPE_LIMIT`, or the
/// broker's default.
fn shape_limit() -> usize {
    std::env::var("TINYBROKER_BENCH_SHAPE_LIMIT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(512)
}

/// `{a,*}^k` with `*` where `mask` has a bit.
fn layout(k: usize, mask: u64) -> Pattern {
    let tokens: Vec<&str> = (0..k)
        .map(|i| if mask >> i & 1 == 1 { "*" } else { "a" })
        .collect();
    Pattern::parse(&tokens.join(".")).unwrap()
}

/// The review's crafted patterns: the `n`th of 64,000 distinct layouts of `{a,*}^20.b`
/// (`n` times an odd number, modulo 2^20, is distinct for distinct `n`).
fn crafted(n: u64) -> Pattern {
    let layout = layout(20, (n * 0x9_e3b5) & 0xf_ffff);
    Pattern::parse(&format!("{layout}.b")).unwrap()
}

/// Every prefix of the pattern's path that holds a `*`, as (tokens, positions of `*`).
fn naive_shapes(pattern: &Pattern) -> Vec<(usize, u32)> {
    let text = pattern.as_str();
    let path = text.strip_suffix(">").unwrap_or(text);
    let mut mask = 0u32;
    let mut out = Vec::new();
    for (i, token) in path.split('.').filter(|t| !t.is_empty()).enumerate() {
        if token == "*" {
            mask |= 1 << i;
        }
        if mask != 0 {
            out.push((i + 1, mask));
        }
    }
    out
}

fn bench_pattern(n: u64) -> String {
    match n % 4 {
        0 => format!("orders.region{}.*", n % 100),
        1 => format!("orders.region{}.shop{n}", n % 100),
        2 => format!("metrics.host{n}.>"),
        _ => format!("events.{n}.*.created"),
    }
}

/// 64 distinct literal patterns of 254 bytes and 32 tokens each.
fn heavy_subscription(n: u64) -> Vec<Pattern> {
    (0..64)
        .map(|p| {
            let tokens: Vec<String> = (1..32).map(|t| format!("t{t:02}{}", n % 1000)).collect();
            let used: usize = tokens.iter().map(|t| t.len() + 1).sum();
            let mut first = format!("h{n}x{p}");
            while first.len() + used < 254 {
                first.push('y');
            }
            let text = std::iter::once(first)
                .chain(tokens)
                .collect::<Vec<_>>()
                .join(".");
            Pattern::parse(&text).unwrap()
        })
        .collect()
}

criterion_group!(benches, core);
criterion_main!(benches);
