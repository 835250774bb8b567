//! Attacks on routing: patterns crafted so that a publish's walk of the routing index visits
//! every node (issue 26, part 3).

use super::*;

/// The `n`th of 64,000 distinct layouts of `{a,*}^20.b` (`n` times an odd number, modulo
/// 2^20, is distinct for distinct `n`): the review's crafted patterns.
fn crafted(n: u64) -> String {
    let mask = (n * 0x9_e3b5) & 0xf_ffff;
    (0..20)
        .map(|i| if mask >> i & 1 == 1 { "*" } else { "a" })
        .chain(["b"])
        .collect::<Vec<_>>()
        .join(".")
}

/// Issue 26 part 3: 1,000 subscriptions of 64 patterns from `{a,*}^20.b` made a publish to
/// `a.a….a.c`, matching none, take 21–23 ms of walking while it held the catalog's read lock.
/// The broker bounds the distinct wildcard shapes (a prefix's length and its `*` positions),
/// which bound every walk: the first crafted subscription alone has 1,065 and is refused,
/// changing nothing; one-pattern subscriptions get in only while the count stays within the
/// limit (29 of the first 2,000); and routing goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crafted_wildcard_layouts_are_refused_before_they_can_slow_routing() {
    let _serial = SERIAL.lock().await;
    let server = TestServer::start().await;
    let client = server.client().await;
    let before = counters(&client).await;
    let mut refused = None;
    let mut held = Vec::new();
    for n in 0..1_000u64 {
        let patterns: Vec<String> = (0..64).map(|p| crafted(n * 64 + p)).collect();
        let patterns: Vec<&str> = patterns.iter().map(String::as_str).collect();
        let sub = open(
            &format!("crafted-{n}"),
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
                refused = Some((n, status));
                break;
            }
        }
    }
    let (n, status) = refused.expect("1,000 crafted subscriptions were all accepted");
    assert_eq!(
        n, 0,
        "the first subscription's 64 layouts have 1,065 shapes"
    );
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    for needle in [
        "max_wildcard_shapes",
        "--max-wildcard-shapes",
        "1065",
        "512",
    ] {
        assert!(status.message().contains(needle), "{needle}: {status:?}");
    }
    let after = counters(&client).await;
    assert_eq!(
        (after.subscriptions, after.memory_accounted_bytes),
        (before.subscriptions, before.memory_accounted_bytes),
        "a refused subscription changes nothing"
    );

    // One pattern per subscription: each is admitted while the shapes stay within the limit.
    let mut admitted = 0u64;
    for n in 0..2_000u64 {
        let pattern = crafted(n);
        let sub = open(
            &format!("crafted-one-{n}"),
            DeliveryMode::Broadcast,
            "",
            &[&pattern],
        );
        if held.last().is_none_or(|(_, members)| members.len() >= 100) {
            held.push((server.client().await, Vec::new()));
        }
        let (subscriber, members) = held.last_mut().expect("pushed above");
        match subscriber.subscribe(sub).await {
            Ok(member) => {
                members.push(member);
                admitted += 1;
            }
            Err(status) => {
                assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                assert!(
                    status.message().contains("max_wildcard_shapes"),
                    "{status:?}"
                );
            }
        }
    }
    assert_eq!(admitted, 29, "admitted among the first 2,000 layouts");
    assert_eq!(counters(&client).await.subscriptions, admitted);

    // A publish matching none of them is routed (to nothing), and one matching goes to its
    // subscriptions; an ordinary client's round trip completes meanwhile.
    let zero_match = format!("{}.c", ["a"; 20].join("."));
    let published = counters(&client).await.unrouted;
    client.publish(&zero_match, "none").await;
    assert_eq!(counters(&client).await.unrouted, published + 1);
    let all_match = format!("{}.b", ["a"; 20].join("."));
    assert_eq!(
        client.publish(&all_match, "all").await.queued_for,
        admitted as u32
    );
    ordinary_round_trip(&client, "beside-crafted-layouts").await;
}
