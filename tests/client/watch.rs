//! `Client::watch_leadership`, member metadata and `Leadership::proclaim` through the Rust
//! client, and `tinybroker status ID --watch` (docs/semantics.md#member-metadata).

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
};

use tinybroker::client::{
    Client, Error, LeaderState, LeadershipWatch, Message, SubscriptionOptions,
};

use crate::harness::{TestServer, within};

async fn next_until(
    watch: &mut LeadershipWatch,
    done: impl Fn(&LeaderState) -> bool,
) -> LeaderState {
    within(async {
        loop {
            let state = watch.next().await.expect("the watch failed");
            if done(&state) {
                return state;
            }
        }
    })
    .await
}

// docs/semantics.md#member-metadata: a replica joins with its metadata; the watcher sees the
// leader's, then what it proclaims, with the same epoch; a standby's proclaim is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_sees_the_leaders_metadata_and_what_it_proclaims() {
    let server = TestServer::start().await;
    let client = within(Client::connect(format!("http://{}", server.addr)))
        .await
        .unwrap();
    let options = |metadata: &str| {
        SubscriptionOptions::singleton("svc", "replicas", ["election.svc"]).metadata(metadata)
    };
    let leader = within(client.elect_with(options("a:1"), |_| {}))
        .await
        .unwrap();
    let mut watch = within(client.watch_leadership("svc")).await.unwrap();
    let first = next_until(&mut watch, |s| s.active_member_id.is_some()).await;
    assert_eq!(
        (first.active_member_id, first.epoch, first.metadata.as_str()),
        (Some(leader.member_id()), leader.epoch(), "a:1")
    );

    within(leader.proclaim("a:2")).await.unwrap();
    let said = next_until(&mut watch, |s| s.metadata == "a:2").await;
    assert_eq!(
        (said.active_member_id, said.epoch, said.since),
        (first.active_member_id, first.epoch, first.since)
    );
    let info = within(client.describe("svc")).await.unwrap();
    assert_eq!(
        (
            info.active_metadata.as_str(),
            info.members[0].metadata.as_str()
        ),
        ("a:2", "a:2")
    );

    // A standby (its ids from the describe) is refused, and nothing changes.
    let other = client.clone();
    let standby = tokio::spawn(async move { other.elect_with(options("b:1"), |_| {}).await });
    let info = within(async {
        loop {
            let info = client.describe("svc").await.unwrap();
            if info.members.len() == 2 {
                return info;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    let b = &info.members[1];
    assert_eq!(b.metadata, "b:1");
    let refused = within(client.proclaim("svc", b.member_id, leader.epoch(), "b:2")).await;
    assert!(
        matches!(&refused, Err(Error::FailedPrecondition(m)) if m.contains("on standby")),
        "{refused:?}"
    );
    assert_eq!(
        within(client.describe("svc"))
            .await
            .unwrap()
            .active_metadata,
        "a:2"
    );

    // Promoted, the standby's own metadata is shown; the deposed leader's proclaim is refused.
    let (old_member, old_epoch) = (leader.member_id(), leader.epoch());
    within(leader.close()).await.unwrap();
    let next = within(standby).await.unwrap().unwrap();
    let promoted = next_until(&mut watch, |s| s.active_member_id == Some(next.member_id())).await;
    assert_eq!(
        (promoted.epoch, promoted.metadata.as_str()),
        (next.epoch(), "b:1")
    );
    let refused = within(client.proclaim("svc", old_member, old_epoch, "a:3")).await;
    assert!(matches!(refused, Err(Error::NotFound(_))), "{refused:?}");
    drop(next);
}

// docs/operations.md#tinybroker-status: `status ID --watch --json` prints one object per
// state, the active member's metadata in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_watch_prints_the_leaders_metadata() {
    let server = TestServer::start().await;
    let url = format!("http://{}", server.addr);
    let client = within(Client::connect(url.clone())).await.unwrap();
    let options = SubscriptionOptions::singleton("cron", "replicas", ["election.cron"])
        .metadata("host a, port 1");
    let leader = within(client.elect_with(options, |_| {})).await.unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tinybroker"))
        .args(["status", "--server", &url, "cron", "--watch", "--json"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let line = within(tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        line
    }))
    .await
    .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let json: serde_json::Value = serde_json::from_str(&line).expect(&line);
    assert_eq!(json["active_member_id"], leader.member_id());
    assert_eq!(json["epoch"], leader.epoch());
    assert_eq!(json["metadata"], "host a, port 1");
}

// docs/semantics.md#fenced-publish: `Leadership::publish` is stored while the leadership
// lasts; once the leader closed and the standby leads, the old epoch's publish (by
// `Message::fenced`, as a deposed leader that woke up late would send it) is refused
// FAILED_PRECONDITION, and the new leader's `fence`d batch is stored. A worker sees exactly
// the stored runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaders_fenced_publishes_stop_with_its_leadership() {
    let server = TestServer::start().await;
    let client = within(Client::connect(format!("http://{}", server.addr)))
        .await
        .unwrap();
    let mut worker =
        within(client.subscribe(SubscriptionOptions::broadcast("workers", ["runs.>"])))
            .await
            .unwrap();
    let options = SubscriptionOptions::singleton("cron", "replicas", ["election.cron"]);
    let first = within(client.elect("cron", "replicas")).await.unwrap();
    let second = tokio::spawn({
        let client = client.clone();
        async move { client.elect_with(options, |_| {}).await }
    });
    within(first.publish(Message::new("runs.job", "first-1")))
        .await
        .unwrap();
    let deposed = first.epoch();
    within(first.close()).await.unwrap();
    let second = within(second).await.unwrap().unwrap();
    assert!(second.epoch() > deposed);

    let late =
        within(client.publish(Message::new("runs.job", "late").fenced("cron", deposed))).await;
    match late {
        Err(Error::FailedPrecondition(message)) => assert!(
            message.contains(&format!("the active epoch is {}", second.epoch())),
            "{message}"
        ),
        other => panic!("a deposed epoch's publish was not refused: {other:?}"),
    }
    let batch = [
        second.fence(Message::new("runs.job", "second-1")),
        second.fence(Message::new("runs.job", "second-2")),
    ];
    within(client.publish_batch(batch)).await.unwrap();

    let mut seen = Vec::new();
    while seen.len() < 3 {
        let delivery = within(worker.next_delivery())
            .await
            .expect("the worker's stream ended")
            .unwrap();
        seen.push(String::from_utf8(delivery.payload.to_vec()).unwrap());
        delivery.ack().unwrap();
    }
    assert_eq!(seen, ["first-1", "second-1", "second-2"]);
    drop(second);
}
