//! What a newcomer reads off the client without a tracing subscriber: the member's activation,
//! refused settlements, and inspection in client types.

use tinybroker::client::{AckMode, Client, Message, Mode, Overflow, SubscriptionOptions};

use crate::harness::{TestServer, within};

async fn connect(server: &TestServer) -> Client {
    within(Client::connect(format!("http://{}", server.addr)))
        .await
        .unwrap()
}

// Issue 17 item 9: `subscribe` returns before the confirmation (member id 0); `active()` awaits
// it: at once in queue mode, on promotion in singleton mode.
#[tokio::test]
async fn active_waits_for_the_confirmation_and_returns_the_member_id() {
    let server = TestServer::start().await;
    let client = connect(&server).await;
    let mut work = client
        .subscribe(SubscriptionOptions::queue("work", "g", ["work.*"]))
        .await
        .unwrap();
    let active = within(work.active()).await.unwrap();
    assert!(active.member_id > 0);
    assert_eq!(
        (work.member_id(), work.epoch()),
        (active.member_id, active.epoch)
    );
    let info = client.describe("work").await.unwrap();
    assert_eq!(info.members[0].member_id, active.member_id);
    assert_eq!(
        within(work.active()).await.unwrap(),
        active,
        "already active"
    );

    let options =
        SubscriptionOptions::singleton("report", "replicas", ["report.*"]).notify_standby(true);
    let mut first = client.subscribe(options.clone()).await.unwrap();
    let first_active = within(first.active()).await.unwrap();
    let mut second = client.subscribe(options).await.unwrap();
    // The task hands the subscription back: dropping it would leave.
    let promoted = tokio::spawn(async move {
        let active = second.active().await;
        (second, active)
    });
    within(async {
        while client.describe("report").await.unwrap().members.len() < 2 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(!promoted.is_finished(), "a standby is not active");
    within(first.close()).await.unwrap();
    let (_second, promoted) = within(promoted).await.unwrap();
    let promoted = promoted.unwrap();
    assert!(promoted.epoch > first_active.epoch);
    assert_eq!(
        client.describe("report").await.unwrap().active_member_id,
        Some(promoted.member_id)
    );
}

// Issue 17 item 9: a settlement the broker refuses is counted even when the reader only asks
// for deliveries (next_delivery skips the refusal frame). Here the message was released by a
// unary ack first, so the stream's ack finds nothing in flight.
#[tokio::test]
async fn refused_settlements_are_counted_when_reading_only_deliveries() {
    let server = TestServer::start().await;
    let client = connect(&server).await;
    let mut jobs = client
        .subscribe(SubscriptionOptions::queue("jobs", "g", ["jobs.*"]))
        .await
        .unwrap();
    let member = within(jobs.active()).await.unwrap();
    client.publish(Message::new("jobs.a", "0")).await.unwrap();
    let first = within(jobs.next_delivery()).await.unwrap().unwrap();
    client
        .ack("jobs", first.system_id, Some(member.member_id))
        .await
        .unwrap();
    first.ack().unwrap();
    assert_eq!(jobs.refused_settlements(), 0);

    // The refusal comes back on the stream, before or after the next deliveries.
    let mut acked = 1;
    within(async {
        while jobs.refused_settlements() == 0 {
            client.publish(Message::new("jobs.a", "n")).await.unwrap();
            jobs.next_delivery().await.unwrap().unwrap().ack().unwrap();
            acked += 1;
        }
    })
    .await;
    assert_eq!(jobs.refused_settlements(), 1);
    within(jobs.close()).await.unwrap();
    let counters = client.describe("jobs").await.unwrap().counters;
    assert_eq!(counters.acked, acked, "the refused ack changed nothing");
}

// Issue 17 item 9: describe and list answer with client types: the mode and policies are
// enums, the active member an option.
#[tokio::test]
async fn describe_answers_with_the_mode_and_policies_as_enums() {
    let server = TestServer::start().await;
    let client = connect(&server).await;
    let feed =
        SubscriptionOptions::singleton("feed", "readers", ["feed.>"]).ack_mode(AckMode::None);
    let leader = within(client.elect_with(feed, |_| {})).await.unwrap();
    let info = client.describe("feed").await.unwrap();
    assert_eq!(
        (info.mode, info.ack_mode, info.overflow),
        (Mode::Singleton, AckMode::None, Overflow::DropOldest)
    );
    assert_eq!(info.active_member_id, Some(leader.member_id()));
    assert_eq!(info.epoch, leader.epoch());
    assert_eq!(info.members.len(), 1);
    assert!(info.members[0].active);

    let _work = client
        .subscribe(SubscriptionOptions::queue("work", "g", ["work.*"]))
        .await
        .unwrap();
    let listing = client.list().await.unwrap();
    let work = listing
        .subscriptions
        .iter()
        .find(|s| s.subscription_id == "work")
        .unwrap();
    assert_eq!(
        (
            work.mode,
            work.ack_mode,
            work.overflow,
            work.active_member_id
        ),
        (
            Mode::Queue,
            AckMode::Explicit,
            Overflow::RejectPublish,
            None
        )
    );
    assert_eq!(listing.broker.subscriptions, 2);
}
