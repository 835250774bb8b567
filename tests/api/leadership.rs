//! WatchLeadership over the wire (docs/semantics.md#watching-leadership): any client follows a
//! SINGLETON subscription's active member and epoch without joining. In cluster mode the
//! watcher sits at the other gateway than the members, so it sees what the coordination bucket
//! records, not what its own gateway holds.

use tinybroker::pb::{self, broker_client::BrokerClient};
use tonic::{Code, Status, Streaming, transport::Channel};

use crate::harness::*;

async fn watch(
    at: &BrokerClient<Channel>,
    id: &str,
) -> Result<Streaming<pb::LeadershipFrame>, Status> {
    within(at.clone().watch_leadership(pb::WatchLeadershipRequest {
        subscription_id: id.into(),
    }))
    .await
    .map(|r| r.into_inner())
}

/// Reads frames until one names `active` (0: none) with epoch `epoch`, checking that epochs
/// never fall and that no frame names a member other than `allowed` (or none). Returns the
/// frames read.
async fn until(
    frames: &mut Streaming<pb::LeadershipFrame>,
    active: u64,
    epoch: u64,
    allowed: &[u64],
    floor: &mut u64,
) -> Vec<pb::LeadershipFrame> {
    let mut read = Vec::new();
    loop {
        let frame = within(frames.message())
            .await
            .expect("the watch ended")
            .expect("the watch ended");
        assert!(frame.epoch >= *floor, "epoch fell: {frame:?} after {floor}");
        *floor = frame.epoch;
        assert!(
            frame.active_member_id == 0 || allowed.contains(&frame.active_member_id),
            "{frame:?} names a member not in {allowed:?}"
        );
        assert!(frame.since.is_some(), "{frame:?}");
        let reached = frame.active_member_id == active && frame.epoch == epoch;
        read.push(frame);
        if reached {
            return read;
        }
    }
}

/// A singleton `id` with one member, active, and a watch at `at` that has seen it lead.
async fn led(
    client: &Client,
    at: &BrokerClient<Channel>,
    id: &str,
) -> (Member, pb::Confirmation, Streaming<pb::LeadershipFrame>) {
    let mut member = client.subscribe(singleton(id)).await.unwrap();
    let confirmed = member.confirmed().await;
    let frames = watch_led(at, id, &confirmed).await;
    (member, confirmed, frames)
}

/// A watch of `id` at `at` that has seen `confirmed`'s member lead.
async fn watch_led(
    at: &BrokerClient<Channel>,
    id: &str,
    confirmed: &pb::Confirmation,
) -> Streaming<pb::LeadershipFrame> {
    let mut frames = watch(at, id).await.unwrap();
    let (member, epoch) = (confirmed.member_id, confirmed.epoch);
    until(&mut frames, member, epoch, &[member], &mut 0).await;
    frames
}

// docs/semantics.md#watching-leadership: the first frame is the state, then one per promotion,
// in join order with rising epochs, then "no active member" when the last one leaves.
#[tokio::test]
async fn a_watcher_sees_every_promotion_with_rising_epochs() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut a = client.subscribe(singleton("lead")).await.unwrap();
    let ca = a.confirmed().await;
    let mut frames = watch(&client.1, "lead").await.unwrap();
    let mut floor = 0;
    let mut members = vec![ca.member_id];
    until(&mut frames, ca.member_id, ca.epoch, &members, &mut floor).await;

    let mut b = client.subscribe(singleton("lead")).await.unwrap();
    let mut c = client.subscribe(singleton("lead")).await.unwrap();
    drop(a);
    let cb = b.confirmed().await;
    assert!(cb.epoch > ca.epoch);
    members.push(cb.member_id);
    until(&mut frames, cb.member_id, cb.epoch, &members, &mut floor).await;
    drop(b);
    let cc = c.confirmed().await;
    members.push(cc.member_id);
    until(&mut frames, cc.member_id, cc.epoch, &members, &mut floor).await;
    drop(c);
    // Nobody is active: the last epoch stays.
    let none = until(&mut frames, 0, cc.epoch, &members, &mut floor).await;
    let none = none.last().unwrap().clone();

    // A watch opened now starts with that state, since the same moment.
    let mut late = watch(&client.1, "lead").await.unwrap();
    let first = within(late.message()).await.unwrap().unwrap();
    assert_eq!(first, none);
}

// docs/semantics.md#watching-leadership: standbys joining and leaving change no leadership, so
// a watcher gets no frame for them; the next frame is the next promotion.
#[tokio::test]
async fn standbys_coming_and_going_send_no_frame() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let (a, _, mut frames) = led(&client, &client.1, "quiet").await;
    for _ in 0..3 {
        let standby = client.subscribe(singleton("quiet")).await.unwrap();
        drop(standby);
    }
    let mut b = client.subscribe(singleton("quiet")).await.unwrap();
    drop(a);
    let cb = b.confirmed().await;
    let next = within(frames.message()).await.unwrap().unwrap();
    assert_eq!(
        (next.active_member_id, next.epoch),
        (cb.member_id, cb.epoch)
    );
}

// docs/semantics.md#watching-leadership: a watcher that reads nothing while leadership changes
// many times is sent the latest state when it reads, with epochs that still rise.
#[tokio::test]
async fn a_watcher_that_does_not_read_gets_the_latest_state() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut line = std::collections::VecDeque::new();
    for _ in 0..6 {
        line.push_back(client.subscribe(singleton("slow")).await.unwrap());
    }
    let mut active = line.pop_front().unwrap();
    let first = active.confirmed().await;
    let mut frames = watch(&client.1, "slow").await.unwrap();
    let mut members = vec![first.member_id];
    let mut last = first;
    while let Some(mut next) = line.pop_front() {
        drop(active);
        let confirmed = next.confirmed().await;
        members.push(confirmed.member_id);
        last = confirmed;
        active = next;
    }
    drop(active);
    let mut floor = 0;
    let read = until(&mut frames, 0, last.epoch, &members, &mut floor).await;
    // At most one frame per state the watch was in, the initial one included.
    assert!(read.len() <= members.len() + 1, "{read:?}");
}

// docs/semantics.md#watching-leadership: unknown ids, other modes and malformed ids are refused
// and nothing is watched.
#[tokio::test]
async fn watching_refuses_unknown_ids_other_modes_and_bad_ids() {
    let server = TestServer::start().await;
    let client = server.client().await;
    assert_code(
        watch(&client.1, "nobody-here").await,
        Code::NotFound,
        "not found",
    );
    let _queue = client
        .subscribe(open("work", pb::DeliveryMode::Queue, "g", &["jobs.*"]))
        .await
        .unwrap();
    assert_code(
        watch(&client.1, "work").await,
        Code::FailedPrecondition,
        "only a SINGLETON subscription has an active member to watch",
    );
    assert_code(watch(&client.1, "").await, Code::InvalidArgument, "");
}

// docs/semantics.md#watching-leadership: a watched subscription deleted ends the watch with
// NOT_FOUND.
#[tokio::test]
async fn a_watch_ends_not_found_when_its_subscription_is_deleted() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut a = client.subscribe(singleton("gone")).await.unwrap();
    let ca = a.confirmed().await;
    drop(a);
    let mut frames = watch(&client.1, "gone").await.unwrap();
    // No member is active (through gateways, a watch opened once the line emptied says epoch 0:
    // the bucket keeps no line, docs/semantics.md#watching-leadership).
    let first = within(frames.message()).await.unwrap().unwrap();
    if first.active_member_id != 0 {
        assert_eq!(first.active_member_id, ca.member_id, "{first:?}");
        let mut floor = 0;
        until(&mut frames, 0, ca.epoch, &[ca.member_id], &mut floor).await;
    } else {
        let last = if GATEWAYS {
            [0, ca.epoch]
        } else {
            [ca.epoch; 2]
        };
        assert!(last.contains(&first.epoch), "{first:?}");
    }
    within(
        client
            .0
            .clone()
            .delete_subscription(pb::DeleteSubscriptionRequest {
                subscription_id: "gone".into(),
            }),
    )
    .await
    .unwrap();
    // Through gateways the watching gateway's copy of the bucket may still catch up (a frame
    // with the last epoch): whatever comes before the end names no member.
    let end = within(async {
        loop {
            match frames.message().await {
                Ok(Some(frame)) => assert_eq!(frame.active_member_id, 0, "{frame:?}"),
                other => return other,
            }
        }
    })
    .await;
    assert_code(end, Code::NotFound, "expired or was deleted");
}

// docs/semantics.md#watching-leadership: a graceful shutdown ends every watch with UNAVAILABLE
// (and waits for none: a watch never holds a server up).
#[tokio::test]
async fn shutdown_ends_watches_with_unavailable() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let (a, ca, mut near) = led(&client, &client.0, "bye").await;
    let mut far = watch_led(&client.1, "bye", &ca).await;
    let stopping = tokio::spawn(server.stop());
    for frames in [&mut near, &mut far] {
        // What comes before the end names no other member.
        loop {
            match within(frames.message()).await {
                Ok(Some(frame)) => assert!(
                    frame.active_member_id == 0 || frame.active_member_id == ca.member_id,
                    "{frame:?}"
                ),
                Ok(None) => panic!("the watch ended without a status"),
                Err(status) => {
                    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
                    break;
                }
            }
        }
    }
    drop(a);
    within(stopping).await.unwrap().unwrap();
}

embedded_only! {
// docs/semantics.md#watching-leadership: a watched subscription that expires (no member within
// its idle timeout) ends the watch with NOT_FOUND. Embedded only as written: the suite's
// gateways expire consumers by their own idle timeout, not the server's limits;
// tests/cluster/leadership.rs holds the same through gateways.
#[tokio::test]
async fn a_watch_ends_not_found_when_its_subscription_expires() {
    let server = TestServer::with_config(tinybroker::server::ServerConfig {
        limits: tinybroker::core::Limits {
            idle_timeout: std::time::Duration::from_millis(200),
            ..Default::default()
        },
        ..Default::default()
    })
    .await;
    let client = server.client().await;
    let (a, ca, mut frames) = led(&client, &client.1, "brief").await;
    let mut floor = ca.epoch;
    drop(a);
    until(&mut frames, 0, ca.epoch, &[ca.member_id], &mut floor).await;
    let end = within(frames.message()).await;
    assert_code(end, Code::NotFound, "expired or was deleted");
}
}

fn unix_ms(t: std::time::SystemTime) -> i64 {
    i64::try_from(t.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis()).unwrap()
}

// docs/semantics.md#watching-leadership: `since` is when the state began (through a gateway,
// when that gateway saw it). A member active for 1.5 s before the first watch opens: the first
// frame does not say the state began when the watch opened. (The time passing is the point
// here, not an event to wait for.)
#[tokio::test]
async fn the_first_frames_since_is_when_the_state_began_not_when_the_watch_opened() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut a = client.subscribe(singleton("since")).await.unwrap();
    let ca = a.confirmed().await;
    let confirmed_at = unix_ms(std::time::SystemTime::now());
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let mut frames = watch(&client.1, "since").await.unwrap();
    let first = within(frames.message()).await.unwrap().unwrap();
    assert_eq!(
        (first.active_member_id, first.epoch),
        (ca.member_id, ca.epoch)
    );
    let since = first.since.expect("since");
    let since_ms = since.seconds * 1000 + i64::from(since.nanos) / 1_000_000;
    assert!(
        since_ms <= confirmed_at + 500,
        "the first frame says the state began {} ms after the member's confirmation: {first:?}",
        since_ms - confirmed_at
    );
    drop(a);
}

// docs/semantics.md#watching-leadership: with none active, the frame's epoch is the last one
// handed out. A first watch opened after the only member left (no earlier watch anywhere)
// starts at (0, that member's epoch) on an embedded broker; through gateways at (0, 0), as the
// docs say (the bucket keeps no line for it), as DescribeSubscription there.
#[tokio::test]
async fn a_first_watch_after_the_last_member_left_starts_with_the_last_epoch() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut a = client.subscribe(singleton("left")).await.unwrap();
    let ca = a.confirmed().await;
    drop(a);
    let last = if GATEWAYS { 0 } else { ca.epoch };
    for at in [&client.0, &client.1] {
        let described = Client::of(at.clone());
        within(async {
            while described.describe("left").await.unwrap().epoch != last {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        })
        .await;
        let mut frames = watch(at, "left").await.unwrap();
        let first = within(frames.message()).await.unwrap().unwrap();
        assert_eq!(
            (first.active_member_id, first.epoch),
            (0, last),
            "first frame {first:?}"
        );
    }
}

// docs/semantics.md#watching-leadership: NOT_FOUND is "the last word of a watch whose
// subscription expired or was deleted". Deleted and created again at once: the watch of the
// deleted one must end NOT_FOUND, not go on to name the new subscription's member. Through
// gateways it goes on (the consumer check every 2 s finds the new consumer).
#[tokio::test]
async fn a_watch_ends_not_found_when_its_subscription_is_deleted_and_created_again() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut a = client.subscribe(singleton("again")).await.unwrap();
    a.confirmed().await;
    drop(a);
    let mut frames = watch(&client.1, "again").await.unwrap();
    // No member active (through gateways possibly at epoch 0: the line emptied).
    within(async { while frames.message().await.unwrap().unwrap().active_member_id != 0 {} }).await;
    within(
        client
            .0
            .clone()
            .delete_subscription(pb::DeleteSubscriptionRequest {
                subscription_id: "again".into(),
            }),
    )
    .await
    .unwrap();
    let mut b = client.subscribe(singleton("again")).await.unwrap();
    let cb = b.confirmed().await;
    let end = tokio::time::timeout(std::time::Duration::from_secs(6), async {
        loop {
            match frames.message().await {
                Ok(Some(frame)) => assert_ne!(
                    frame.active_member_id, cb.member_id,
                    "the deleted subscription's watch names the new one's member: {frame:?}"
                ),
                other => return other,
            }
        }
    })
    .await
    .expect("the deleted subscription's watch did not end");
    assert_code(end, Code::NotFound, "expired or was deleted");
    drop(b);
}
