//! A leader's buffer and its end: a leader whose job takes no messages pushes back on the
//! broker (whose slow-consumer policy then engages) instead of buffering without bound, still
//! learns when it loses the lead, and can tell stepping down from losing the broker.

use std::time::Duration;

use tinybroker::{
    client::{
        AckMode, Client, LostCause, MAX_BUFFERED_MESSAGES, Message, Overflow, SubscriptionOptions,
    },
    core::Limits,
    server::ServerConfig,
};

use crate::harness::{TestServer, within};

/// Queues of 256 messages, and a short drain so a stopped server closes its connections soon.
fn small_queues() -> ServerConfig {
    ServerConfig {
        limits: Limits {
            max_queue_messages: 256,
            ..Limits::default()
        },
        drain_timeout: Duration::from_millis(100),
        ..ServerConfig::default()
    }
}

/// An ack-free singleton: the firehose a leader reads in order, at most once.
fn feed() -> SubscriptionOptions {
    SubscriptionOptions::singleton("feed", "readers", ["feed.>"])
        .ack_mode(AckMode::None)
        .overflow(Overflow::DropOldest)
}

async fn connect(server: &TestServer) -> Client {
    within(Client::connect(format!("http://{}", server.addr)))
        .await
        .unwrap()
}

/// Publishes 4000 messages of 4 KiB (16 MB), 100 per batch: far more than the HTTP/2 windows
/// (a few MB), the member's outlet (256 frames) and its queue (256) hold together.
async fn flood(client: &Client) {
    let payload = vec![b'x'; 4096];
    for _ in 0..40 {
        let batch = (0..100).map(|_| Message::new("feed.tick", payload.clone()));
        let published = within(client.publish_batch(batch)).await.unwrap();
        assert!(published.iter().all(|p| p.queued_for == 1));
    }
}

/// Waits until the broker's drop-oldest policy has dropped something from `feed`.
async fn broker_dropped(client: &Client) -> u64 {
    within(async {
        loop {
            let dropped = client
                .describe("feed")
                .await
                .unwrap()
                .counters
                .dropped_overflow;
            if dropped > 0 {
                return dropped;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
}

// Issue 17 item 4 (docs/semantics.md#ack-free ack-free slow consumers, docs/semantics.md#limits bounded memory): a leader whose job
// never takes its messages holds at most MAX_BUFFERED_MESSAGES of them; the rest stay with the
// broker, whose slow-consumer policy drops the oldest and counts them. Then the job can still
// take messages, in order.
#[tokio::test]
async fn a_leader_that_takes_no_messages_pushes_back_on_the_broker_instead_of_buffering() {
    let server = TestServer::with_config(small_queues()).await;
    let client = connect(&server).await;
    let mut leader = within(client.elect_with(feed(), |_| {})).await.unwrap();
    flood(&client).await;
    broker_dropped(&client).await;
    assert!(
        leader.buffered_messages() <= MAX_BUFFERED_MESSAGES,
        "the leader buffers {} messages",
        leader.buffered_messages()
    );
    let info = client.describe("feed").await.unwrap();
    assert!(info.queued_messages <= 256, "{info:?}");
    assert!(!leader.is_lost());

    let mut last = 0;
    for _ in 0..(2 * MAX_BUFFERED_MESSAGES) {
        let message = within(leader.next_message()).await.unwrap();
        assert!(message.system_id > last, "in publish order");
        last = message.system_id;
    }
}

// docs/semantics.md#singleton: a leader that has stopped reading its stream (its buffer is full) must still learn
// at once that it lost the lead when the broker goes away, although the end of its stream waits
// behind unread messages.
#[tokio::test]
async fn a_leader_with_a_full_buffer_still_learns_that_the_broker_went_away() {
    let server = TestServer::with_config(small_queues()).await;
    let client = connect(&server).await;
    let leader = within(client.elect_with(feed(), |_| {})).await.unwrap();
    flood(&client).await;
    broker_dropped(&client).await;
    let lost = leader.lost();
    server.stop().await.unwrap();
    let lost = within(lost).await;
    assert!(matches!(lost.cause, LostCause::Ended(_)), "{lost}");
    assert_eq!(lost.epoch, leader.epoch());
}

// Issue 17 item 9: stepping down and losing the broker are different causes, told apart
// without reading the message.
#[tokio::test]
async fn resigning_is_told_apart_from_losing_the_broker() {
    let server = TestServer::start().await;
    let client = connect(&server).await;
    let first = within(client.elect("cron", "replicas")).await.unwrap();
    let lost = first.lost();
    first.resign();
    let lost = within(lost).await;
    assert!(matches!(lost.cause, LostCause::Resigned), "{lost}");

    let second = within(client.elect("cron", "replicas")).await.unwrap();
    let lost = second.lost();
    server.stop().await.unwrap();
    let lost = within(lost).await;
    assert!(
        matches!(&lost.cause, LostCause::Ended(error) if error.is_transient()),
        "{lost}"
    );
}

// docs/semantics.md#hand-over: `Client::hand_over` ends a leadership at a message boundary: the
// leader settles its message, then its Leadership is lost as handed over (it leaves the line),
// and the standby leads with a higher epoch; the request answers with both.
#[tokio::test]
async fn a_hand_over_ends_the_leadership_once_its_message_is_settled() {
    let server = TestServer::start().await;
    let client = connect(&server).await;
    let options = SubscriptionOptions::singleton("job", "replicas", ["job.>"]);
    let mut first = within(client.elect_with(options.clone(), |_| {}))
        .await
        .unwrap();
    let standby = {
        let client = client.clone();
        let options = options.clone();
        tokio::spawn(async move { client.elect_with(options, |_| {}).await })
    };
    within(async {
        while client.describe("job").await.unwrap().members.len() < 2 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    within(client.publish(Message::new("job.run", "1")))
        .await
        .unwrap();
    let message = within(first.next_message()).await.unwrap();
    let lost = first.lost();
    let request = {
        let client = client.clone();
        tokio::spawn(async move { client.hand_over("job").await })
    };
    within(async {
        while client
            .describe("job")
            .await
            .unwrap()
            .stepping_down_member_id
            != Some(first.member_id())
        {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(!first.is_lost(), "lost before its message was settled");
    message.ack().unwrap();
    let lost = within(lost).await;
    assert!(matches!(lost.cause, LostCause::HandedOver), "{lost}");
    let second = within(standby).await.unwrap().unwrap();
    assert!(second.epoch() > first.epoch());
    let done = within(request).await.unwrap().unwrap();
    assert_eq!(
        (
            done.previous_epoch,
            done.member_id,
            done.epoch,
            done.failed_over
        ),
        (first.epoch(), second.member_id(), second.epoch(), false)
    );
    // Nothing is left to close: it settled what it held before it stepped down.
    within(first.close()).await.unwrap();
    within(async {
        while client.describe("job").await.unwrap().members.len() != 1 {
            tokio::task::yield_now().await;
        }
    })
    .await;
}
