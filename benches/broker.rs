//! Micro-benchmarks of the shell's bookkeeping under many subscriptions (README, "Performance"):
//! `cargo bench --bench broker`. Each measures work that a cheap client event triggers while
//! locks are held, so it must not grow with the number of subscriptions or queued messages.

use std::{hint::black_box, sync::Arc, time::Duration};

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use tinybroker::{
    broker::Broker,
    clock::TokioClock,
    core::{Draft, Limits, MemberOptions, Mode, OpenRequest, Pattern, SubscriptionSpec, Topic},
};

fn request(id: &str, pattern: &str) -> OpenRequest {
    OpenRequest {
        subscription_id: id.into(),
        spec: SubscriptionSpec {
            mode: Mode::Queue,
            consumer_group: "g".into(),
            patterns: vec![Pattern::parse(pattern).unwrap()],
            max_delivery_attempts: 0,
            dead_letter_topic: None,
            ack_mode: Default::default(),
            overflow: Default::default(),
        },
        member: MemberOptions::default(),
        metadata: std::sync::Arc::from(""),
    }
}

fn broker() -> Broker {
    let limits = Limits {
        max_queue_messages: 1_000_000,
        max_queue_bytes: 1 << 32,
        idle_timeout: Duration::from_secs(3600),
        max_subscriptions: 20_000,
        ..Limits::default()
    };
    // The clock reads tokio's time: the benches run inside a runtime context.
    Broker::new(limits, Arc::new(TokioClock::new()))
}

fn shell(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _entered = runtime.enter();

    // A subscription's only member joins and leaves while 10,000 others sit idle (member-less,
    // far from expiry); then the expiry pass that the last member's leaving wakes runs. That
    // pass must not visit every subscription.
    c.bench_function("last_member_churn_beside_10000_idle_subscriptions", |b| {
        let broker = broker();
        for n in 0..10_000 {
            drop(broker.open(&request(&format!("idle-{n}"), &format!("idle.{n}")), None));
        }
        let churn = request("churn", "churn.*");
        b.iter(|| {
            drop(black_box(broker.open(&churn, None).unwrap()));
            black_box(broker.expire_idle());
        });
    });

    // Inspecting a subscription that holds 100,000 queued messages (a Describe, a List page or
    // a metrics scrape each do this per subscription).
    c.bench_function("describe_with_100000_queued", |b| {
        let broker = broker();
        let member = broker.open(&request("deep", "deep.*"), None).unwrap();
        drop(member);
        for _ in 0..100_000 {
            let draft = Draft::new(
                Topic::parse("deep.x").unwrap(),
                Bytes::from_static(&[0; 128]),
                Default::default(),
                broker.limits(),
            )
            .unwrap();
            broker.publish(draft).unwrap();
        }
        b.iter(|| black_box(broker.describe("deep").unwrap()));
    });
}

criterion_group!(benches, shell);
criterion_main!(benches);
