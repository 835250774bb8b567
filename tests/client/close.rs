//! Leaving on purpose: `Subscription::close` and `Leadership::close` return once the broker has
//! applied every settlement queued before them, so a process may exit right after.

use tinybroker::client::{AckMode, Client, LostCause, Message, SubscriptionOptions};

use crate::harness::{TestServer, within};

/// The options of the worker and of its successor.
fn jobs() -> SubscriptionOptions {
    SubscriptionOptions::queue("jobs", "workers", ["jobs.>"]).max_in_flight(6)
}

/// A worker process: its own runtime, which it drops on return, as a process exits. Takes six
/// jobs, nacks the first, acks the other five, closes, returns the ids (nacked first).
fn worker_process(url: String, ready: tokio::sync::oneshot::Sender<()>) -> Vec<u64> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let client = Client::connect(url).await.unwrap();
        let mut subscription = client.subscribe(jobs()).await.unwrap();
        subscription.active().await.unwrap();
        ready.send(()).unwrap();
        let mut deliveries = Vec::new();
        while deliveries.len() < 6 {
            deliveries.push(subscription.next_delivery().await.unwrap().unwrap());
        }
        let ids = deliveries.iter().map(|d| d.system_id).collect();
        let mut deliveries = deliveries.into_iter();
        deliveries.next().unwrap().nack().unwrap();
        for delivery in deliveries {
            delivery.ack().unwrap();
        }
        // Queued, not sent: only the close makes them count before the runtime goes.
        subscription.close().await.unwrap();
        ids
    })
}

// Issue 17 item 8: a worker that nacks one job, acks five and exits right after closing has
// all six settlements applied; the next worker gets only the nacked job again, not all six.
#[tokio::test]
async fn a_worker_that_exits_right_after_closing_loses_none_of_its_acks() {
    let server = TestServer::start().await;
    let client = within(Client::connect(format!("http://{}", server.addr)))
        .await
        .unwrap();
    let (ready_tx, ready) = tokio::sync::oneshot::channel();
    let url = format!("http://{}", server.addr);
    let worker = tokio::task::spawn_blocking(move || worker_process(url, ready_tx));
    within(ready).await.unwrap();
    for n in 0..6 {
        let published = client
            .publish(Message::new("jobs.email", format!("{n}")))
            .await
            .unwrap();
        assert_eq!(published.queued_for, 1);
    }
    let ids = within(worker).await.unwrap();

    // No waiting: the close returned only once the broker had applied them.
    let info = client.describe("jobs").await.unwrap();
    assert_eq!(
        (info.counters.acked, info.counters.nacked),
        (5, 1),
        "{info:?}"
    );
    assert!(info.members.is_empty(), "{info:?}");

    let mut next = client.subscribe(jobs()).await.unwrap();
    let again = within(next.next_delivery()).await.unwrap().unwrap();
    assert_eq!(again.system_id, ids[0], "only the nacked job comes back");
    assert!(again.attempt > 1);
    let info = client.describe("jobs").await.unwrap();
    assert_eq!((info.queued_messages, info.in_flight), (0, 1), "{info:?}");
    again.ack().unwrap();
    within(next.close()).await.unwrap();
    let info = client.describe("jobs").await.unwrap();
    assert_eq!((info.counters.acked, info.in_flight), (6, 0), "{info:?}");
}

// Closing an ack-free member has nothing to flush: it leaves at once and the close succeeds.
#[tokio::test]
async fn closing_an_ack_free_subscription_leaves_it() {
    let server = TestServer::start().await;
    let client = within(Client::connect(format!("http://{}", server.addr)))
        .await
        .unwrap();
    let mut feed = client
        .subscribe(SubscriptionOptions::broadcast("ticks", ["ticks.*"]).ack_mode(AckMode::None))
        .await
        .unwrap();
    within(feed.active()).await.unwrap();
    client.publish(Message::new("ticks.a", "1")).await.unwrap();
    within(feed.next_delivery()).await.unwrap().unwrap();
    within(feed.close()).await.unwrap();
    within(async {
        while !client.describe("ticks").await.unwrap().members.is_empty() {
            tokio::task::yield_now().await;
        }
    })
    .await;
}

// Leadership::close applies the leader's acks before it steps down: the promoted standby gets
// nothing again, and the old leader's lost() says it resigned.
#[tokio::test]
async fn closing_a_leadership_applies_its_acks_then_promotes_the_standby() {
    let server = TestServer::start().await;
    let client = within(Client::connect(format!("http://{}", server.addr)))
        .await
        .unwrap();
    let options =
        SubscriptionOptions::singleton("firehose", "readers", ["events.>"]).max_in_flight(4);
    let mut leader = within(client.elect_with(options.clone(), |_| {}))
        .await
        .unwrap();
    let other = client.clone();
    let standby = tokio::spawn(async move { other.elect_with(options, |_| {}).await });
    within(async {
        while client.describe("firehose").await.unwrap().members.len() < 2 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    for n in 0..3 {
        client
            .publish(Message::new("events.click", format!("{n}")))
            .await
            .unwrap();
    }
    for _ in 0..3 {
        within(leader.next_message()).await.unwrap().ack().unwrap();
    }
    let lost = leader.lost();
    let epoch = leader.epoch();
    within(leader.close()).await.unwrap();
    assert!(matches!(within(lost).await.cause, LostCause::Resigned));

    let info = client.describe("firehose").await.unwrap();
    assert_eq!(info.counters.acked, 3, "{info:?}");
    let mut next = within(standby).await.unwrap().unwrap();
    assert!(next.epoch() > epoch);
    client
        .publish(Message::new("events.click", "after"))
        .await
        .unwrap();
    let first = within(next.next_message()).await.unwrap();
    assert_eq!(
        (first.payload.as_ref(), first.attempt),
        (&b"after"[..], 1),
        "nothing acked comes back"
    );
}

// docs/semantics.md#releases, docs/clients.md: a close gives back what arrived within the
// window but was never handed out with the same attempt; what was handed out and left unsettled
// comes back with attempt + 1.
#[tokio::test]
async fn closing_releases_what_was_prefetched_with_the_same_attempt() {
    let server = TestServer::start().await;
    let client = within(Client::connect(format!("http://{}", server.addr)))
        .await
        .unwrap();
    let options = SubscriptionOptions::queue("prefetch", "workers", ["jobs.>"]).max_in_flight(4);
    let mut worker = client.subscribe(options.clone()).await.unwrap();
    worker.active().await.unwrap();
    let mut ids = Vec::new();
    for n in 0..4 {
        let published = client
            .publish(Message::new("jobs.email", format!("{n}")))
            .await
            .unwrap();
        ids.push(published.system_id);
    }
    let taken = within(worker.next_delivery()).await.unwrap().unwrap();
    assert_eq!(taken.system_id, ids[0]);
    // The other three are in the window: wait until the broker has sent them all.
    within(async {
        while client.describe("prefetch").await.unwrap().in_flight < 4 {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    drop(taken); // handed out, never settled
    within(worker.close()).await.unwrap();
    let info = client.describe("prefetch").await.unwrap();
    assert_eq!(
        (info.counters.released, info.counters.nacked),
        (3, 0),
        "{info:?}"
    );

    let mut next = client.subscribe(options).await.unwrap();
    let mut again = Vec::new();
    for _ in 0..4 {
        let d = within(next.next_delivery()).await.unwrap().unwrap();
        again.push((d.system_id, d.attempt));
        d.ack().unwrap();
    }
    again.sort_unstable();
    assert_eq!(
        again,
        vec![(ids[0], 2), (ids[1], 1), (ids[2], 1), (ids[3], 1)],
        "prefetched ones keep their attempt; the one handed out counts one"
    );
    within(next.close()).await.unwrap();
}
