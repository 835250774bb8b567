//! Fenced publishes racing a promotion (docs/semantics.md#fenced-publish, "One step"): OS
//! threads publish, fenced by the old and the new epoch (unary `publish`, `publish_each` runs,
//! `publish_batch`), while the active member's stream is dropped and its standby promoted.
//! Every publish stored under the old epoch comes before every one under the new epoch and
//! before a marker published right after the promotion: the cut-over is one point.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use tinybroker::{
    broker::{Broker, Outbound},
    clock::TokioClock,
    core::{
        Draft, Error, Limits, MemberOptions, Mode, OpenRequest, Pattern, PublishFence,
        SubscriptionSpec, Topic,
    },
};

fn request(id: &str, mode: Mode, pattern: &str, window: u32) -> OpenRequest {
    OpenRequest {
        subscription_id: id.into(),
        spec: SubscriptionSpec {
            mode,
            consumer_group: "g".into(),
            patterns: vec![Pattern::parse(pattern).unwrap()],
            max_delivery_attempts: 0,
            dead_letter_topic: None,
            ack_mode: Default::default(),
            overflow: Default::default(),
        },
        member: MemberOptions {
            max_in_flight: window,
            ..MemberOptions::default()
        },
        metadata: Arc::from(""),
    }
}

fn draft(topic: &str, fence: Option<(&str, u64)>) -> Draft {
    Draft::new(
        Topic::parse(topic).unwrap(),
        bytes::Bytes::from_static(b"x"),
        Default::default(),
        &Limits::default(),
    )
    .unwrap()
    .fenced(fence.map(|(s, epoch)| PublishFence {
        subscription_id: Arc::from(s),
        epoch,
    }))
}

async fn confirmed(member: &mut tinybroker::broker::MemberStream) -> u64 {
    loop {
        match tokio::time::timeout(Duration::from_secs(10), member.next())
            .await
            .expect("no frame in 10 s")
            .expect("stream ended")
        {
            Outbound::Confirm { epoch, .. } => return epoch,
            _ => continue,
        }
    }
}

#[derive(Default)]
struct Seen {
    /// (system_id, epoch) of every fenced publish answered stored.
    stored: Vec<(u64, u64)>,
    refused_other: Vec<String>,
}

async fn one_round(pattern: &str, sub_first: bool) -> (usize, usize) {
    let broker = Broker::new(Limits::default(), Arc::new(TokioClock::new()));
    // An unrelated subscription on the topic so the fence is matched or held apart on either
    // side of it in key order.
    let other = |b: &Broker| {
        b.open(&request("other", Mode::Queue, "t.*", 1), None)
            .unwrap()
    };
    let _o1 = if sub_first {
        None
    } else {
        Some(other(&broker))
    };
    let mut first = broker
        .open(&request("s", Mode::Singleton, pattern, 8), None)
        .unwrap();
    let _o2 = if sub_first {
        Some(other(&broker))
    } else {
        None
    };
    let e1 = confirmed(&mut first).await;
    let mut second = broker
        .open(&request("s", Mode::Singleton, pattern, 8), None)
        .unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();
    for t in 0..3 {
        let (broker, seen, stop, count) =
            (broker.clone(), seen.clone(), stop.clone(), count.clone());
        threads.push(std::thread::spawn(move || {
            let mut n = 0u64;
            let mut results = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let epoch = if n.is_multiple_of(2) { e1 } else { e1 + 1 };
                let outcome: Vec<(u64, Result<u64, Error>)> = match t {
                    0 => vec![(
                        epoch,
                        broker
                            .publish(draft("t.a", Some(("s", epoch))))
                            .map(|p| p.system_id),
                    )],
                    1 => {
                        // A run of 8 to one topic, the fences alternating in pairs.
                        let fences: Vec<u64> = (0..8)
                            .map(|i| if (i / 2) % 2 == 0 { e1 } else { e1 + 1 })
                            .collect();
                        results.clear();
                        broker.publish_each(
                            fences.iter().map(|e| draft("t.a", Some(("s", *e)))),
                            &mut results,
                        );
                        fences
                            .iter()
                            .zip(results.drain(..))
                            .map(|(e, r)| (*e, r.map(|p| p.system_id)))
                            .collect()
                    }
                    _ => {
                        let drafts = vec![
                            draft("t.a", Some(("s", epoch))),
                            draft("t.a", Some(("s", epoch))),
                        ];
                        match broker.publish_batch(drafts) {
                            Ok(p) => p.into_iter().map(|p| (epoch, Ok(p.system_id))).collect(),
                            Err(e) => {
                                let mut v: Vec<_> = e
                                    .published
                                    .into_iter()
                                    .map(|p| (epoch, Ok(p.system_id)))
                                    .collect();
                                v.push((epoch, Err(e.error)));
                                v
                            }
                        }
                    }
                };
                let mut seen = seen.lock().unwrap();
                for (epoch, r) in outcome {
                    match r {
                        Ok(id) => {
                            seen.stored.push((id, epoch));
                            count.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(Error::Fenced { .. }) | Err(Error::QueueFull { .. }) => {}
                        Err(other) => seen.refused_other.push(format!("{other:?}")),
                    }
                }
            }
        }));
    }
    while count.load(Ordering::Relaxed) < 200 {
        tokio::task::yield_now().await;
    }
    drop(first); // leaves: the standby is promoted, synchronously
    let after_drop = broker.publish(draft("t.a", None)).unwrap().system_id;
    let stale = broker.publish(draft("t.a", Some(("s", e1))));
    assert!(
        matches!(stale, Err(Error::Fenced { current, active: true, .. }) if current == e1 + 1),
        "{stale:?}"
    );
    let e2 = confirmed(&mut second).await;
    assert_eq!(e2, e1 + 1);
    let base = count.load(Ordering::Relaxed);
    while count.load(Ordering::Relaxed) < base + 200 {
        tokio::task::yield_now().await;
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let seen = seen.lock().unwrap();
    assert!(seen.refused_other.is_empty(), "{:?}", seen.refused_other);
    let last_old = seen
        .stored
        .iter()
        .filter(|(_, e)| *e == e1)
        .map(|(i, _)| *i)
        .max();
    let first_new = seen
        .stored
        .iter()
        .filter(|(_, e)| *e == e1 + 1)
        .map(|(i, _)| *i)
        .min();
    let (last_old, first_new) = (last_old.unwrap_or(0), first_new.unwrap_or(u64::MAX));
    assert!(last_old < first_new, "old {last_old} after new {first_new}");
    assert!(
        last_old < after_drop,
        "old {last_old} after the promotion's marker {after_drop}"
    );
    let olds = seen.stored.iter().filter(|(_, e)| *e == e1).count();
    (olds, seen.stored.len() - olds)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn threads_race_a_promotion() {
    let mut totals = (0, 0);
    for round in 0..30 {
        let (pattern, sub_first) = match round % 3 {
            0 => ("t.*", false),
            1 => ("elsewhere", false),
            _ => ("elsewhere", true),
        };
        let (o, n) = one_round(pattern, sub_first).await;
        totals.0 += o;
        totals.1 += n;
    }
    assert!(
        totals.0 > 0 && totals.1 > 0,
        "both epochs stored: {totals:?}"
    );
    println!(
        "stored old-epoch {} new-epoch {} over 30 rounds",
        totals.0, totals.1
    );
}
