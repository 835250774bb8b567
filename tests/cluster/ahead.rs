//! A bridge's read-ahead (docs/cluster-internals.md#read-ahead): an acked QUEUE subscription's
//! gateway keeps a pull open beyond its members' windows, so a window of one does not cost a pull
//! round trip per message, and what it read ahead goes back to JetStream at once when its last
//! member there leaves, for members at other gateways.

use std::{sync::Arc, time::Duration};

use tinybroker::pb::DeliveryMode;
use tokio_stream::StreamExt;

use crate::{
    faults::gateway_process,
    gateway,
    harness::{open, within},
    nats_server::NatsCluster,
};

fn queue(id: &str) -> tinybroker::pb::OpenSubscription {
    let mut request = open(id, DeliveryMode::Queue, "workers", &["jobs.*"]);
    request.max_in_flight = 1;
    request
}

/// Counts the pull requests sent to `subscription`'s JetStream consumer, as NATS carries them.
async fn count_pulls(url: &str, subscription: &str) -> Arc<std::sync::atomic::AtomicUsize> {
    let client = async_nats::connect(url).await.unwrap();
    let name = tinybroker::cluster::gateway::wire::names::consumer_name(
        tinybroker::core::Mode::Queue,
        subscription,
        "",
    );
    let mut pulls = client
        .subscribe(format!("$JS.API.CONSUMER.MSG.NEXT.tinybroker.{name}"))
        .await
        .unwrap();
    client.flush().await.unwrap();
    let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = count.clone();
    tokio::spawn(async move {
        let _client = client;
        while pulls.next().await.is_some() {
            counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    });
    count
}

// A member with a window of one takes 160 messages published before it acks the first: with the
// read-ahead, a pull brings at least 16 of them, so there are far fewer pulls than messages
// (without it: one pull per message, each after the ack of the one before).
#[tokio::test]
async fn a_window_of_one_costs_no_pull_request_per_message() {
    const PUBLISHED: usize = 160;
    let cluster = NatsCluster::start(1).await;
    let url = cluster.client_url(0);
    let gateway = gateway(&url).await;
    let client = gateway.client().await;
    let mut member = client.subscribe(queue("work")).await.unwrap();
    member.confirmed().await;
    let pulls = count_pulls(&url, "work").await;
    let mut published = Vec::new();
    for n in 0..PUBLISHED {
        published.push(client.publish("jobs.run", &n.to_string()).await.system_id);
    }
    let mut got = Vec::new();
    for _ in 0..PUBLISHED {
        let message = member.message().await;
        assert_eq!(message.delivery_attempt, 1);
        got.push(message.system_id);
        member.ack(message.system_id).await;
    }
    assert_eq!(got, published, "every message once, in order");
    let pulls = pulls.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        pulls < PUBLISHED / 4,
        "{pulls} pull requests for {PUBLISHED} messages at window 1"
    );
}

/// Messages a read-ahead test publishes: the one A's member holds, 32 read ahead at A, 8 left
/// in JetStream.
const MESSAGES: usize = 41;

/// A member of QUEUE subscription `id` (window 1) joined through `on_a`, holding the first of
/// [`MESSAGES`] published through `on_b` while its gateway has read 32 more ahead, and a member
/// joined through `on_b`. Returns both and the published ids.
async fn read_ahead_at_a(
    on_a: &crate::harness::Client,
    on_b: &crate::harness::Client,
    id: &str,
    url: &str,
) -> (crate::harness::Member, crate::harness::Member, Vec<u64>) {
    let mut first = on_a.subscribe(queue(id)).await.unwrap();
    first.confirmed().await;
    let mut published = Vec::new();
    for n in 0..MESSAGES {
        published.push(on_b.publish("jobs.run", &n.to_string()).await.system_id);
    }
    let held = first.message().await;
    assert_eq!(held.system_id, published[0]);
    // A's bridge has read ahead once JetStream counts the held one and 32 more delivered.
    within(async {
        while crate::ack_pending(url, id).await < 33 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let mut second = on_b.subscribe(queue(id)).await.unwrap();
    second.confirmed().await;
    (first, second, published)
}

/// What `member` gets (acking each) until [`MESSAGES`] came, sorted.
async fn take_all(member: &mut crate::harness::Member) -> Vec<u64> {
    let mut got = Vec::new();
    while got.len() < MESSAGES {
        let message = member.message().await;
        got.push(message.system_id);
        member.ack(message.system_id).await;
    }
    got.sort_unstable();
    got
}

// Gateway A's member (window 1) holds the first message, unacked, while 40 more are published:
// A reads 32 of them ahead (the other 8 stay in JetStream). When the member leaves, A gives
// everything it holds back at once, so a member at gateway B gets all 41 well within the
// consumer's ack wait (30 s; nothing was left in transit to a pull A dropped), none twice.
#[tokio::test]
async fn what_was_read_ahead_goes_to_another_gateway_when_the_last_member_leaves() {
    let cluster = NatsCluster::start(3).await;
    let urls = cluster.client_urls();
    let a = gateway(&urls[0]).await;
    let b = gateway(&urls[1]).await;
    let (on_a, on_b) = (a.client().await, b.client().await);
    let (first, mut second, published) = read_ahead_at_a(&on_a, &on_b, "handoff", &urls[2]).await;
    drop(first);
    let got = take_all(&mut second).await;
    assert_eq!(got, published, "each message once, none left behind at A");
}

// SIGTERM of a gateway process whose bridge has read ahead: everything it held and read
// ahead goes back at once (NAK), so a member at another gateway gets all of it well within the
// ack wait (30 s), none lost, none twice.
#[tokio::test]
async fn a_gateway_stopped_with_sigterm_gives_back_what_it_read_ahead() {
    let cluster = NatsCluster::start(3).await;
    let urls = cluster.client_urls();
    let (stopped, on_a) = gateway_process(&urls[0], &[]).await;
    let b = gateway(&urls[1]).await;
    let on_b = b.client().await;
    let (first, mut second, published) = read_ahead_at_a(&on_a, &on_b, "term", &urls[2]).await;
    crate::lease::signal(stopped.child.id(), "-TERM");
    let got = within(take_all(&mut second)).await;
    assert_eq!(got, published, "each message once");
    drop(first);
}
