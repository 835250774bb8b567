//! Micro-benchmarks of the pure core's per-message decisions (README, "Performance"):
//! `cargo bench --bench core`.

use std::{hint::black_box, time::Duration};

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use tinybroker::core::{
    Envelope, Floors, Headers, MemberOptions, Message, Mode, Pattern, PatternIndex, QueueLimits,
    Subscription, SubscriptionSpec, Topic,
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
            let pattern = match n % 4 {
                0 => format!("orders.region{}.*", n % 100),
                1 => format!("orders.region{}.shop{n}", n % 100),
                2 => format!("metrics.host{n}.>"),
                _ => format!("events.{n}.*.created"),
            };
            index.insert(&Pattern::parse(&pattern).unwrap(), n);
        }
        let topic = Topic::parse("orders.region42.shop4242").unwrap();
        b.iter(|| black_box(index.matches(black_box(&topic))));
    });
}

criterion_group!(benches, core);
criterion_main!(benches);
