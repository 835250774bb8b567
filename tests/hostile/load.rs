//! Attacks on the broker's memory and locks: concurrent listings, huge ids, Settle floods, and
//! fan-out and subscription floods stopped by the memory budget.

use super::*;

/// Issue part 4: with many subscriptions, `ListSubscriptions` pages (default 100, at most
/// 1000, a token to continue) and twelve concurrent listers neither stall an ordinary client
/// nor blow up memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_listing_is_paged_and_stalls_no_one() {
    let _serial = SERIAL.lock().await;
    const SUBSCRIPTIONS: usize = 1500;
    let server = TestServer::start().await;
    let client = server.client().await;
    // Members leave at once; their subscriptions stay (idle expiry is minutes away).
    let mut joins = tokio::task::JoinSet::new();
    for worker in 0..8 {
        let client = client.clone();
        joins.spawn(async move {
            for i in (worker..SUBSCRIPTIONS).step_by(8) {
                let id = format!("sub-{i:05}");
                let patterns = ["a.*", "b.>", "c.d.e"];
                client
                    .subscribe(open(&id, DeliveryMode::Queue, "workers", &patterns))
                    .await
                    .unwrap();
            }
        });
    }
    while let Some(joined) = within(joins.join_next()).await {
        joined.unwrap();
    }

    let first = client.list_page(0, "").await.unwrap();
    assert_eq!(first.subscriptions.len(), 100, "default page size");
    assert_eq!(first.next_page_token, "sub-00099");
    assert_eq!(
        first.broker.unwrap().subscriptions,
        SUBSCRIPTIONS as u64,
        "counters cover every subscription, not just the page"
    );
    let capped = client.list_page(5000, "").await.unwrap();
    assert_eq!(capped.subscriptions.len(), 1000, "page size is capped");
    assert_code(
        client.list_page(10, "bad\ntoken").await,
        Code::InvalidArgument,
        "page_token",
    );

    let baseline = rss();
    let peak = RssPeak::start();
    let mut listers = tokio::task::JoinSet::new();
    for _ in 0..12 {
        let client = client.clone();
        listers.spawn(async move {
            let mut ids = Vec::new();
            let mut token = String::new();
            for _ in 0..SUBSCRIPTIONS {
                let page = client.list_page(100, &token).await.unwrap();
                ids.extend(page.subscriptions.into_iter().map(|s| s.subscription_id));
                token = page.next_page_token;
                if token.is_empty() {
                    break;
                }
            }
            ids
        });
    }
    ordinary_round_trip(&client, "during-listing").await;
    let expected: Vec<String> = (0..SUBSCRIPTIONS).map(|i| format!("sub-{i:05}")).collect();
    while let Some(listed) = within(listers.join_next()).await {
        let listed: Vec<String> = listed
            .unwrap()
            .into_iter()
            .filter(|id| id.starts_with("sub-"))
            .collect();
        assert_eq!(listed, expected, "pages cover every id once, in order");
    }
    assert_rss_within(baseline, &peak, 64 * MIB);
}

/// Issue part 5: a 1 MB `subscription_id` on Ack, Nack and DescribeSubscription is refused with
/// `INVALID_ARGUMENT`, and no status message echoes more than about a kilobyte of input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_ids_are_refused_with_short_status_messages() {
    let _serial = SERIAL.lock().await;
    let server = TestServer::start().await;
    let client = server.client().await;
    let baseline = rss();
    let peak = RssPeak::start();
    let long = "x".repeat(1_000_000);
    let short_enough = |status: &tonic::Status| {
        assert!(
            status.message().len() <= 1024,
            "status message of {} bytes",
            status.message().len()
        );
    };
    for _ in 0..20 {
        let refusals = [
            client.ack(&long, 1, 1).await.unwrap_err(),
            client.nack(&long, 1, 1).await.unwrap_err(),
            client.describe(&long).await.unwrap_err(),
        ];
        for status in &refusals {
            assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
            assert!(status.message().contains("subscription_id"), "{status:?}");
            short_enough(status);
        }
    }
    // Messages that quote other input are capped too: a long topic on publish.
    let topic = format!("{}.with space", "t".repeat(200_000));
    let refused = client.try_publish(&topic, Vec::new()).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    short_enough(&refused);
    ordinary_round_trip(&client, "during-long-ids").await;
    assert_rss_within(baseline, &peak, 0);
}

/// Issue 17 part 1, the Settle flood: a `Consume` member sends Settles of 1.9 million ids each
/// (about 2 MB, inside the request limit) for messages it does not hold. Each used to become its
/// own formatted refusal frame, built under the subscription's lock in one poll: hundreds of
/// megabytes, seconds of stall. A Settle naming more ids than the member's window is now refused
/// whole, in one frame, at once: memory stays within a small budget, an unrelated publish stays
/// fast, and the member goes on receiving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settle_floods_are_refused_whole_in_bounded_time_and_memory() {
    let _serial = SERIAL.lock().await;
    const BUDGET: u64 = 64 * MIB;
    let server = TestServer::with_config(with_memory_budget(BUDGET)).await;
    let client = server.client().await;
    let mut request = open("flood", DeliveryMode::Queue, "g", &["flood.>"]);
    request.max_in_flight = 64;
    let mut member = client
        .subscribe_via(harness::Carriage::Stream, request)
        .await
        .unwrap();
    member.confirmed().await;
    let settles = member.settles.clone().expect("a Consume member");
    let baseline = rss();
    let peak = RssPeak::start();
    for round in 0..3 {
        let settle = pb::Settle {
            ack: (0..1_900_000u64).map(|i| i % 100 + 1).collect(),
            nack: Vec::new(),
            release: Vec::new(),
        };
        let sent = Instant::now();
        settles
            .send(pb::ConsumeRequest {
                request: Some(pb::consume_request::Request::Settle(settle)),
            })
            .await
            .unwrap();
        let publish = Instant::now();
        client.publish(&format!("unrelated.{round}"), "x").await;
        let publish = publish.elapsed();
        assert!(
            publish < Duration::from_millis(500),
            "an unrelated publish took {publish:?} during the flood"
        );
        match member.frame().await {
            pb::subscription_frame::Frame::Refused(refused) => {
                assert_eq!(refused.code, Code::InvalidArgument as i32, "{refused:?}");
                assert!(refused.message.contains("window"), "{refused:?}");
                assert!(refused.more_system_ids.is_empty(), "{refused:?}");
            }
            other => panic!("expected one refusal of the whole settle, got {other:?}"),
        }
        eprintln!("settle flood {round}: refused after {:?}", sent.elapsed());
    }
    let published = client.publish("flood.after", "still served").await;
    let message = member.message().await;
    assert_eq!(message.system_id, published.system_id);
    let info = client.describe("flood").await.unwrap();
    let c = info.counters.unwrap_or_default();
    assert_eq!(
        (c.acked, c.stale_acks),
        (0, 0),
        "the floods changed nothing"
    );
    assert_rss_within(baseline, &peak, BUDGET);
}

fn with_memory_budget(max_memory_bytes: u64) -> ServerConfig {
    ServerConfig {
        limits: tinybroker::core::Limits {
            max_memory_bytes,
            ..Default::default()
        },
        ..ServerConfig::default()
    }
}

/// Issue part 3, fan-out flood: 1,000 idle subscriptions on `fan.>`, then batches of one-byte
/// messages. Each queue entry is counted with its overhead, so the broker-wide budget refuses
/// the flood (naming max_memory_bytes) long before gigabytes, and memory stays within it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fan_out_flood_is_stopped_by_the_memory_budget() {
    let _serial = SERIAL.lock().await;
    const BUDGET: u64 = 64 * MIB;
    let server = TestServer::with_config(with_memory_budget(BUDGET)).await;
    let client = server.client().await;
    let baseline = rss();
    let peak = RssPeak::start();
    let mut idle = Vec::new();
    for n in 0..1_000 {
        // A connection carries at most max_concurrent_streams members: 100 per connection.
        if n % 100 == 0 {
            idle.push((server.client().await, Vec::new()));
        }
        let (subscriber, members) = idle.last_mut().expect("pushed above");
        let sub = open(&format!("fan-{n}"), DeliveryMode::Broadcast, "", &["fan.>"]);
        members.push(subscriber.subscribe(sub).await.unwrap());
    }
    let mut refused = None;
    for _ in 0..100 {
        let batch = pb::PublishBatchRequest {
            messages: (0..1_000)
                .map(|_| pb::PublishRequest {
                    topic: "fan.out".into(),
                    payload: Bytes::from_static(b"x"),
                    headers: Default::default(),
                    fence: None,
                })
                .collect(),
        };
        if let Err(status) = within(client.0.clone().publish_batch(batch)).await {
            refused = Some(status);
            break;
        }
    }
    let status = refused.expect("100,000 messages x 1,000 subscriptions were all accepted");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("max_memory_bytes"), "{status:?}");
    let c = counters(&client).await;
    assert!(c.memory_accounted_bytes <= BUDGET, "{c:?}");
    ordinary_round_trip(&client, "during-fan-out-flood").await;
    assert_rss_within(baseline, &peak, BUDGET);
}

/// Issue part 3, heavy subscriptions: each subscription with 64 long patterns costs its
/// routing-index nodes; the budget counts them, so a flood of such subscriptions is refused
/// instead of taking gigabytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heavy_subscription_flood_is_stopped_by_the_memory_budget() {
    let _serial = SERIAL.lock().await;
    const BUDGET: u64 = 64 * MIB;
    let server = TestServer::with_config(with_memory_budget(BUDGET)).await;
    let client = server.client().await;
    let baseline = rss();
    let peak = RssPeak::start();
    let mut refused = None;
    let mut held = Vec::new();
    for n in 0..2_000 {
        // 64 distinct patterns of about 230 bytes, 32 tokens each.
        let patterns: Vec<String> = (0..64)
            .map(|p| {
                std::iter::once(format!("h{n}x{p}"))
                    .chain((1..32).map(|t| format!("t{t:02}xyz")))
                    .collect::<Vec<_>>()
                    .join(".")
            })
            .collect();
        let patterns: Vec<&str> = patterns.iter().map(String::as_str).collect();
        let sub = open(
            &format!("heavy-{n}"),
            DeliveryMode::Broadcast,
            "",
            &patterns,
        );
        // A connection carries at most max_concurrent_streams members: 100 per connection.
        if n % 100 == 0 {
            held.push((server.client().await, Vec::new()));
        }
        let (subscriber, members) = held.last_mut().expect("pushed above");
        match subscriber.subscribe(sub).await {
            Ok(member) => members.push(member),
            Err(status) => {
                refused = Some(status);
                break;
            }
        }
    }
    let status = refused.expect("2,000 heavy subscriptions were all accepted");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("max_memory_bytes"), "{status:?}");
    ordinary_round_trip(&client, "during-heavy-subscription-flood").await;
    assert_rss_within(baseline, &peak, BUDGET);
}
