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
