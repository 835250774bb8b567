//! Member metadata and Proclaim over the wire (docs/semantics.md#member-metadata): a SINGLETON
//! member declares what watchers should know of it (an address) when it joins, the active
//! member may replace it with `Proclaim`, and watchers and DescribeSubscription show the active
//! member's. In cluster mode the members join one gateway and the watcher, the describe and
//! some proclamations go to the other, so the answers come from the coordination bucket.

use tinybroker::pb::{self, broker_client::BrokerClient, subscription_frame::Frame};
use tonic::{Code, Status, Streaming, transport::Channel};

use crate::harness::*;

fn with_metadata(id: &str, metadata: &str) -> pb::OpenSubscription {
    pb::OpenSubscription {
        metadata: metadata.into(),
        ..singleton(id)
    }
}

async fn watch(at: &BrokerClient<Channel>, id: &str) -> Streaming<pb::LeadershipFrame> {
    within(at.clone().watch_leadership(pb::WatchLeadershipRequest {
        subscription_id: id.into(),
    }))
    .await
    .expect("watch")
    .into_inner()
}

/// Reads frames until one names `active` with `epoch` and `metadata`; every frame before names
/// a member of `allowed` (or none). Returns that frame.
async fn until(
    frames: &mut Streaming<pb::LeadershipFrame>,
    active: u64,
    epoch: u64,
    metadata: &str,
    allowed: &[u64],
) -> pb::LeadershipFrame {
    loop {
        let frame = within(frames.message())
            .await
            .expect("the watch failed")
            .expect("the watch ended");
        assert!(
            frame.active_member_id == 0 || allowed.contains(&frame.active_member_id),
            "{frame:?} names a member not in {allowed:?}"
        );
        if (frame.active_member_id, frame.epoch, frame.metadata.as_str())
            == (active, epoch, metadata)
        {
            return frame;
        }
    }
}

async fn proclaim(
    at: &BrokerClient<Channel>,
    id: &str,
    member_id: u64,
    epoch: u64,
    metadata: &str,
) -> Result<(), Status> {
    within(at.clone().proclaim(pb::ProclaimRequest {
        subscription_id: id.into(),
        member_id,
        epoch,
        metadata: metadata.into(),
    }))
    .await
    .map(|_| ())
}

/// DescribeSubscription at `at`, read until `done` holds of it (a gateway's copy of the bucket
/// catches up).
async fn described(
    at: &BrokerClient<Channel>,
    id: &str,
    done: impl Fn(&pb::SubscriptionInfo) -> bool,
) -> pb::SubscriptionInfo {
    let client = Client::of(at.clone());
    within(async {
        loop {
            let info = client.describe(id).await.expect("describe");
            if done(&info) {
                return info;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await
}

// docs/semantics.md#member-metadata: the metadata a member joins with is shown for it by
// DescribeSubscription, and watchers see the active member's; on promotion, the next one's.
#[tokio::test]
async fn watchers_and_describe_show_the_active_members_metadata() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut a = client
        .subscribe(with_metadata("meta", "10.0.0.1:7000"))
        .await
        .unwrap();
    let ca = a.confirmed().await;
    // Two bytes a character: the bound is in bytes, and text survives as it was sent.
    let b_metadata = "höst-b ✓";
    let mut b = client
        .subscribe(with_metadata("meta", b_metadata))
        .await
        .unwrap();
    let mut frames = watch(&client.1, "meta").await;
    until(
        &mut frames,
        ca.member_id,
        ca.epoch,
        "10.0.0.1:7000",
        &[ca.member_id],
    )
    .await;

    // The members' own server lists each member's metadata; every server the active one's.
    let info = described(&client.0, "meta", |i| i.members.len() == 2).await;
    let metadata: Vec<&str> = info.members.iter().map(|m| m.metadata.as_str()).collect();
    assert_eq!(metadata, ["10.0.0.1:7000", b_metadata], "{info:?}");
    assert_eq!(info.active_metadata, "10.0.0.1:7000");
    described(&client.1, "meta", |i| i.active_metadata == "10.0.0.1:7000").await;

    drop(a);
    let cb = b.confirmed().await;
    let members = [ca.member_id, cb.member_id];
    until(&mut frames, cb.member_id, cb.epoch, b_metadata, &members).await;
    described(&client.1, "meta", |i| {
        i.active_member_id == cb.member_id && i.active_metadata == b_metadata
    })
    .await;
    drop(b);
    // Nobody active: no metadata (through gateways the emptied line may say epoch 0).
    within(async {
        loop {
            let frame = frames.message().await.unwrap().expect("the watch ended");
            if frame.active_member_id == 0 {
                assert_eq!(frame.metadata, "", "{frame:?}");
                return;
            }
        }
    })
    .await;
}

// docs/semantics.md#member-metadata: the active member proclaims new metadata; the watch gets
// a frame with it, the same epoch and the same `since` (leadership did not change), and
// DescribeSubscription shows it. A proclamation sent to the other server (another gateway) is
// answered the same.
#[tokio::test]
async fn the_active_member_proclaims_and_watchers_see_it() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut a = client.subscribe(singleton("loud")).await.unwrap();
    let ca = a.confirmed().await;
    let mut frames = watch(&client.1, "loud").await;
    let first = until(&mut frames, ca.member_id, ca.epoch, "", &[ca.member_id]).await;

    proclaim(&client.0, "loud", ca.member_id, ca.epoch, "first")
        .await
        .unwrap();
    let said = until(
        &mut frames,
        ca.member_id,
        ca.epoch,
        "first",
        &[ca.member_id],
    )
    .await;
    if !GATEWAYS {
        // Through gateways `since` is when the watching gateway saw the state.
        assert_eq!(
            said.since, first.since,
            "a proclamation is not a new leadership"
        );
    }
    let info = described(&client.0, "loud", |i| i.active_metadata == "first").await;
    assert_eq!(info.members[0].metadata, "first", "{info:?}");

    proclaim(&client.1, "loud", ca.member_id, ca.epoch, "second")
        .await
        .unwrap();
    until(
        &mut frames,
        ca.member_id,
        ca.epoch,
        "second",
        &[ca.member_id],
    )
    .await;
    described(&client.1, "loud", |i| i.active_metadata == "second").await;

    // Back to nothing: empty metadata is metadata too.
    proclaim(&client.0, "loud", ca.member_id, ca.epoch, "")
        .await
        .unwrap();
    until(&mut frames, ca.member_id, ca.epoch, "", &[ca.member_id]).await;
    drop(a);
}

// docs/semantics.md#member-metadata: a proclamation the broker cannot honour is refused with a
// status that says why, and changes nothing: from a standby, with another epoch, from a member
// that left or never was, on an unknown subscription or one not SINGLETON, and metadata over
// 1024 bytes. Exactly 1024 bytes is accepted.
#[tokio::test]
async fn proclamations_that_cannot_be_honoured_are_refused_and_change_nothing() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut a = client
        .subscribe(with_metadata("strict", "a"))
        .await
        .unwrap();
    let ca = a.confirmed().await;
    let mut b = client
        .subscribe(pb::OpenSubscription {
            notify_standby: true,
            ..with_metadata("strict", "b")
        })
        .await
        .unwrap();
    let Frame::Standby(standby) = b.frame().await else {
        panic!("expected a standby notice first");
    };
    let b_id = standby.member_id;

    for at in [&client.0, &client.1] {
        assert_code(
            proclaim(at, "strict", b_id, ca.epoch, "usurper").await,
            Code::FailedPrecondition,
            "on standby",
        );
        assert_code(
            proclaim(at, "strict", ca.member_id, ca.epoch + 1, "x").await,
            Code::FailedPrecondition,
            "not the active member",
        );
        assert_code(
            proclaim(at, "strict", u64::MAX - 1, ca.epoch, "x").await,
            Code::NotFound,
            "not a member",
        );
        assert_code(
            proclaim(at, "nobody-here", ca.member_id, ca.epoch, "x").await,
            Code::NotFound,
            "not found",
        );
        assert_code(
            proclaim(at, "strict", ca.member_id, ca.epoch, &"x".repeat(1025)).await,
            Code::InvalidArgument,
            "over the limit of 1024",
        );
        assert_code(
            proclaim(at, "strict", 0, ca.epoch, "x").await,
            Code::InvalidArgument,
            "member_id is required",
        );
        assert_code(
            proclaim(at, "strict", ca.member_id, 0, "x").await,
            Code::InvalidArgument,
            "epoch is required",
        );
    }
    let info = client.describe("strict").await.unwrap();
    let metadata: Vec<&str> = info.members.iter().map(|m| m.metadata.as_str()).collect();
    assert_eq!(metadata, ["a", "b"], "{info:?}");
    assert_eq!(info.active_metadata, "a");

    let most = "m".repeat(1024);
    proclaim(&client.1, "strict", ca.member_id, ca.epoch, &most)
        .await
        .unwrap();
    described(&client.0, "strict", |i| i.active_metadata == most).await;

    // The leader left: its ids proclaim nothing; the new leader's do.
    drop(a);
    let cb = b.confirmed().await;
    for at in [&client.0, &client.1] {
        let refused = proclaim(at, "strict", ca.member_id, ca.epoch, "ghost").await;
        let status = refused.expect_err("a member that left proclaimed");
        assert!(
            matches!(status.code(), Code::NotFound | Code::FailedPrecondition),
            "{status:?}"
        );
    }
    proclaim(&client.1, "strict", cb.member_id, cb.epoch, "b leads")
        .await
        .unwrap();
    described(&client.1, "strict", |i| i.active_metadata == "b leads").await;

    let _queue = client
        .subscribe(open("work", pb::DeliveryMode::Queue, "g", &["jobs.*"]))
        .await
        .unwrap();
    for at in [&client.0, &client.1] {
        assert_code(
            proclaim(at, "work", 1, 1, "x").await,
            Code::FailedPrecondition,
            "only a SINGLETON subscription",
        );
    }
    drop(b);
}

// docs/semantics.md#member-metadata: metadata over 1024 bytes, or on a subscription that is not
// SINGLETON, is refused at the join, which joins nothing.
#[tokio::test]
async fn joins_with_metadata_out_of_bounds_are_refused() {
    let server = TestServer::start().await;
    let client = server.client().await;
    assert_code(
        client
            .subscribe(with_metadata("big", &"x".repeat(1025)))
            .await
            .map(|_| ()),
        Code::InvalidArgument,
        "metadata is 1025 bytes, over the limit of 1024",
    );
    assert_code(
        client
            .subscribe(pb::OpenSubscription {
                metadata: "q".into(),
                ..open("work", pb::DeliveryMode::Queue, "g", &["jobs.*"])
            })
            .await
            .map(|_| ()),
        Code::InvalidArgument,
        "metadata only applies to DELIVERY_MODE_SINGLETON",
    );
    assert_code(client.describe("big").await, Code::NotFound, "");
    assert_code(client.describe("work").await, Code::NotFound, "");
    // Exactly at the bound: joined.
    let mut ok = client
        .subscribe(with_metadata("big", &"x".repeat(1024)))
        .await
        .unwrap();
    ok.confirmed().await;
}
