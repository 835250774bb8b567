//! WatchLeadership through gateways beyond the API suite (docs/semantics.md#watching-leadership):
//! a watched subscription that expires, and a watcher at one gateway following a SIGKILLed
//! gateway's member being replaced by one at another.

use std::time::Duration;

use tinybroker::{
    clock::TokioClock,
    cluster::gateway::GatewayConfig,
    pb::{self, broker_client::BrokerClient},
};
use tonic::{Code, Streaming, transport::Channel};

use crate::{
    NatsCluster,
    harness::{assert_code, singleton, within},
};

async fn watch(at: &BrokerClient<Channel>, id: &str) -> Streaming<pb::LeadershipFrame> {
    within(at.clone().watch_leadership(pb::WatchLeadershipRequest {
        subscription_id: id.into(),
    }))
    .await
    .unwrap()
    .into_inner()
}

/// The next frame that names `active` (0: none), the epochs on the way never falling.
async fn until_active(
    frames: &mut Streaming<pb::LeadershipFrame>,
    active: u64,
) -> pb::LeadershipFrame {
    let mut floor = 0;
    loop {
        let frame = within(frames.message())
            .await
            .unwrap()
            .expect("watch ended");
        assert!(frame.epoch >= floor, "{frame:?} after epoch {floor}");
        floor = frame.epoch;
        if frame.active_member_id == active {
            return frame;
        }
    }
}

// A singleton whose consumer JetStream expires (no member within the gateway's idle timeout)
// ends its watch with NOT_FOUND, at the gateway where it had no member.
#[tokio::test]
async fn a_watch_ends_not_found_when_its_consumer_expires() {
    let cluster = NatsCluster::start(3).await;
    let urls = cluster.client_urls();
    let config = |url: &str| GatewayConfig {
        idle_timeout: Duration::from_secs(1),
        ..GatewayConfig::new(url)
    };
    let clock = || std::sync::Arc::new(TokioClock::new());
    let a = crate::gateway_with(config(&urls[0]), clock()).await;
    let b = crate::gateway_with(config(&urls[1]), clock()).await;
    let (on_a, on_b) = (a.client().await, b.client().await);
    let mut member = on_a.subscribe(singleton("brief")).await.unwrap();
    let confirmed = member.confirmed().await;
    let mut frames = watch(&on_b.0, "brief").await;
    until_active(&mut frames, confirmed.member_id).await;
    drop(member);
    let none = until_active(&mut frames, 0).await;
    assert_eq!(none.epoch, confirmed.epoch);
    // Whatever comes before the end names no member.
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

// The gateway process holding the active member is killed with SIGKILL; a watcher at the
// surviving gateway sees the standby there made active with a higher epoch, within about the
// lease, and no frame names the dead member after it.
#[tokio::test]
async fn a_watcher_follows_a_sigkilled_gateways_member_being_replaced() {
    let cluster = NatsCluster::start(3).await;
    let urls = cluster.client_urls().join(",");
    let lease = Duration::from_secs(1);
    let (mut doomed, on_doomed) =
        crate::faults::gateway_process(&urls, &["--gateway-lease", "1s"]).await;
    let (_survivor, on_survivor) =
        crate::faults::gateway_process(&urls, &["--gateway-lease", "1s"]).await;
    let mut active = on_doomed.subscribe(singleton("watched")).await.unwrap();
    let first = active.confirmed().await;
    let mut standby = on_survivor.subscribe(singleton("watched")).await.unwrap();
    crate::singleton::await_line(&cluster.client_urls()[2], "watched", 2).await;
    let mut frames = watch(&on_survivor.0, "watched").await;
    until_active(&mut frames, first.member_id).await;

    let killed = std::time::Instant::now();
    doomed.child.kill().unwrap();
    doomed.child.wait().unwrap();
    let frame = within(async {
        loop {
            let frame = frames.message().await.unwrap().expect("watch ended");
            if frame.active_member_id != first.member_id {
                return frame;
            }
        }
    })
    .await;
    let took = killed.elapsed();
    eprintln!(
        "watcher's frame after SIGKILL of the active member's gateway (lease {lease:?}): {took:?}"
    );
    let promoted = standby.confirmed().await;
    assert_eq!(
        (frame.active_member_id, frame.epoch),
        (promoted.member_id, promoted.epoch),
        "the first change the watcher sees is the promotion"
    );
    assert!(frame.epoch > first.epoch);
    assert!(took < 2 * lease + Duration::from_secs(1), "took {took:?}");
    drop(active);
}

// docs/semantics.md#watching-leadership: the NATS node both gateways use is paused (SIGSTOP):
// the active member's gateway cannot renew its 1 s lease, and its lease lapses. Its view of
// the line may fall behind from then on (another gateway may take it for dead and promote), so
// its watchers are not left naming that member active: a gateway whose lease lapsed ends its
// watches with UNAVAILABLE, within moments of its lease's end.
#[tokio::test]
async fn a_gateway_whose_lease_lapsed_tells_its_watchers() {
    let mut cluster = NatsCluster::start(3).await;
    let urls = cluster.client_urls();
    let lease = Duration::from_secs(1);
    let config = |url: &str| GatewayConfig {
        lease,
        ..GatewayConfig::new(url)
    };
    let clock = || std::sync::Arc::new(TokioClock::new());
    let a = crate::gateway_with(config(&urls[0]), clock()).await;
    let b = crate::gateway_with(config(&urls[0]), clock()).await;
    let (on_a, on_b) = (a.client().await, b.client().await);
    let mut member = on_a.subscribe(singleton("stranded")).await.unwrap();
    let confirmed = member.confirmed().await;
    let mut near = watch(&on_a.0, "stranded").await;
    until_active(&mut near, confirmed.member_id).await;
    let mut far = watch(&on_b.0, "stranded").await;
    until_active(&mut far, confirmed.member_id).await;

    let paused = std::time::Instant::now();
    cluster.pause(0);
    let told = tokio::time::timeout(lease + Duration::from_secs(3), async {
        loop {
            match near.message().await {
                Ok(Some(frame)) if frame.active_member_id == confirmed.member_id => {}
                other => return other,
            }
        }
    })
    .await;
    cluster.resume(0);
    let told = told.unwrap_or_else(|_| {
        panic!(
            "{:?} after the pause, past gateway a's lease, its watcher still names member {} active",
            paused.elapsed(),
            confirmed.member_id
        )
    });
    eprintln!("told {:?} after the pause: {told:?}", paused.elapsed());
    match told {
        Ok(Some(frame)) => assert_ne!(frame.active_member_id, confirmed.member_id),
        Ok(None) => panic!("the watch ended without a status"),
        Err(status) => assert_eq!(status.code(), Code::Unavailable, "{status:?}"),
    }
}

// docs/semantics.md#cluster-metadata: a line holds at most 64 KiB of its members' metadata. A
// join past it (at the gateway whose copy of the line is current: the members' own) is
// RESOURCE_EXHAUSTED and joins nothing; a proclamation past it, sent to either gateway, is
// RESOURCE_EXHAUSTED and changes nothing (the holding gateway's describe still
// shows the old metadata, and so does the line).
#[tokio::test]
async fn a_lines_metadata_is_bounded_and_a_refused_proclamation_changes_nothing() {
    let (_cluster, a, b) = crate::two_gateways().await;
    let (on_a, on_b) = (a.client().await, b.client().await);
    let join = |metadata: String| pb::OpenSubscription {
        metadata,
        ..singleton("crowded")
    };
    let mut leader = on_a.subscribe(join("l".repeat(1000))).await.unwrap();
    let confirmed = leader.confirmed().await;
    let mut standbys = Vec::new();
    for _ in 0..63 {
        standbys.push(on_a.subscribe(join("s".repeat(1024))).await.unwrap());
    }
    // 65,512 bytes: 24 left.
    standbys.push(on_a.subscribe(join("t".repeat(20))).await.unwrap());
    let refused = on_a.subscribe(join("u".repeat(5))).await.map(|_| ());
    assert_code(refused, Code::ResourceExhausted, "at most 65536 bytes");

    for at in [&on_a.0, &on_b.0] {
        let proclaimed = within(at.clone().proclaim(pb::ProclaimRequest {
            subscription_id: "crowded".into(),
            member_id: confirmed.member_id,
            epoch: confirmed.epoch,
            metadata: "L".repeat(1024),
        }))
        .await;
        assert_code(proclaimed, Code::ResourceExhausted, "at most 65536 bytes");
    }
    let info = on_a.describe("crowded").await.unwrap();
    assert_eq!(info.members.len(), 65, "the refused joins joined nothing");
    assert_eq!(info.members[0].metadata, "l".repeat(1000));
    assert_eq!(info.active_metadata, "l".repeat(1000));
    // Shrinking always fits.
    within(on_b.0.clone().proclaim(pb::ProclaimRequest {
        subscription_id: "crowded".into(),
        member_id: confirmed.member_id,
        epoch: confirmed.epoch,
        metadata: "small".into(),
    }))
    .await
    .unwrap();
    let mut frames = watch(&on_b.0, "crowded").await;
    within(async { while frames.message().await.unwrap().unwrap().metadata != "small" {} }).await;
    drop(standbys);
}

// docs/semantics.md#cluster-metadata: joins racing at two gateways each pass the gateway's own
// check of the 64 KiB bound, so together they may carry more; metadata of control characters
// (six bytes each in the line's JSON) makes the line's value larger still. The line stays
// writable: a join its gateway cannot fit is refused RESOURCE_EXHAUSTED, never answered and then
// left out, and when the leader leaves one of the joined members is promoted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joins_racing_at_two_gateways_never_make_the_line_unwritable() {
    let (cluster, a, b) = crate::two_gateways().await;
    let (on_a, on_b) = (a.client().await, b.client().await);
    let join = || pb::OpenSubscription {
        metadata: "\u{1}".repeat(1024),
        ..singleton("racing")
    };
    let mut leader = on_a.subscribe(singleton("racing")).await.unwrap();
    let first = leader.confirmed().await;
    let joins: Vec<_> = (0..150)
        .map(|i| {
            let at = if i % 2 == 0 {
                on_a.clone()
            } else {
                on_b.clone()
            };
            let request = join();
            tokio::spawn(async move { at.subscribe(request).await })
        })
        .collect();
    let mut joined = Vec::new();
    let mut refused = 0;
    for join in joins {
        match join.await.unwrap() {
            Ok(member) => joined.push(member),
            Err(status) => {
                assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                refused += 1;
            }
        }
    }
    assert!(refused > 0, "150 KiB of metadata cannot all fit");
    assert!(!joined.is_empty());
    let mut frames = watch(&on_b.0, "racing").await;
    until_active(&mut frames, first.member_id).await;
    drop(leader);
    let promoted = within(async {
        loop {
            let frame = frames.message().await.unwrap().expect("watch ended");
            if frame.active_member_id != 0 && frame.active_member_id != first.member_id {
                return frame;
            }
        }
    })
    .await;
    assert!(promoted.epoch > first.epoch);
    assert_eq!(promoted.metadata, "\u{1}".repeat(1024));
    // The line as the bucket holds it: within the bound on its encoded size.
    let nats = async_nats::connect(cluster.client_url(0)).await.unwrap();
    let kv = async_nats::jetstream::new(nats)
        .get_key_value("tinybroker-coordination")
        .await
        .unwrap();
    let line = kv.get("sub.racing").await.unwrap().expect("the line");
    assert!(
        line.len() <= tinybroker::cluster::coordinator::MAX_LINE_BYTES,
        "the line's value is {} bytes",
        line.len()
    );
    drop(joined);
}

// docs/semantics.md#member-metadata: proclamations of one member that overlap are each
// answered once the line holds the latest; the line ends with one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_proclamations_of_one_member_are_all_answered() {
    let (_cluster, a, b) = crate::two_gateways().await;
    let (on_a, on_b) = (a.client().await, b.client().await);
    let mut leader = on_a.subscribe(singleton("chatty")).await.unwrap();
    let confirmed = leader.confirmed().await;
    for round in 0..5 {
        let values: Vec<String> = (0..4).map(|i| format!("r{round}-{i}")).collect();
        let calls: Vec<_> = values
            .iter()
            .enumerate()
            .map(|(i, metadata)| {
                let mut at = if i % 2 == 0 {
                    on_a.0.clone()
                } else {
                    on_b.0.clone()
                };
                let request = pb::ProclaimRequest {
                    subscription_id: "chatty".into(),
                    member_id: confirmed.member_id,
                    epoch: confirmed.epoch,
                    metadata: metadata.clone(),
                };
                tokio::spawn(async move { at.proclaim(request).await })
            })
            .collect();
        for call in calls {
            within(call).await.unwrap().unwrap_or_else(|status| {
                panic!("round {round}: a valid proclamation was refused: {status:?}")
            });
        }
        // Gateway B's copy of the bucket catches up to one of them.
        within(async {
            while !values.contains(&on_b.describe("chatty").await.unwrap().active_metadata) {
                tokio::task::yield_now().await;
            }
        })
        .await;
    }
    drop(leader);
}

/// Rounds of [`a_gateway_resumed_after_its_lease_answers_leadership_from_the_current_line`].
const RESUME_ROUNDS: usize = 4;

// docs/semantics.md#cluster-leadership-current: leader L at gateway A, S then T on standby at B;
// A is stopped (SIGSTOP) past its 1 s lease, B promotes S; a HandOver, a watch and a Describe
// reach A while it is stopped, then it resumes. A answers each from the line as it now is:
// the hand-over is S's (to T), the watch's first frame and the description name S or T with
// their epochs, never nobody, epoch 0 or the deposed L; or it says UNAVAILABLE. Before, A
// answered from the copy it had before the stop: the hand-over was refused "it has no active
// member" (7 rounds in 10), the watch's first frame said no active member, epoch 0, and the
// description named L with its old epoch.
#[tokio::test]
async fn a_gateway_resumed_after_its_lease_answers_leadership_from_the_current_line() {
    use tinybroker::pb::subscription_frame::Frame;
    let cluster = NatsCluster::start(3).await;
    let urls = cluster.client_urls().join(",");
    let lease = ["--gateway-lease", "1s"];
    let (paused, on_paused) = crate::faults::gateway_process(&urls, &lease).await;
    let (_other, on_other) = crate::faults::gateway_process(&urls, &lease).await;
    let pid = paused.child.id();
    for round in 0..RESUME_ROUNDS {
        let id = format!("resumed{round}");
        let mut leader = on_paused.subscribe(singleton(&id)).await.unwrap();
        let l = leader.confirmed().await;
        let waiting = || pb::OpenSubscription {
            notify_standby: true,
            ..singleton(&id)
        };
        let mut s = on_other.subscribe(waiting()).await.unwrap();
        assert!(matches!(s.frame().await, Frame::Standby(_)));
        let mut t = on_other.subscribe(waiting()).await.unwrap();
        assert!(matches!(t.frame().await, Frame::Standby(_)));

        crate::lease::signal(pid, "-STOP");
        let promoted = s.confirmed().await;
        assert!(promoted.epoch > l.epoch);
        // Asked of the stopped gateway: each waits in its connection until it resumes.
        let handover = {
            let (mut client, id) = (on_paused.0.clone(), id.clone());
            tokio::spawn(async move {
                client
                    .hand_over(pb::HandOverRequest {
                        subscription_id: id,
                    })
                    .await
            })
        };
        let watching = {
            let (mut client, id) = (on_paused.0.clone(), id.clone());
            tokio::spawn(async move {
                let mut frames = client
                    .watch_leadership(pb::WatchLeadershipRequest {
                        subscription_id: id,
                    })
                    .await?
                    .into_inner();
                frames
                    .message()
                    .await?
                    .ok_or_else(|| tonic::Status::aborted("the watch ended at once"))
            })
        };
        let describing = {
            let (client, id) = (on_paused.clone(), id.clone());
            tokio::spawn(async move { client.describe(&id).await })
        };
        // The requests are written before the resume (they wait in the stopped process's
        // socket): a round trip through the other gateway takes longer than writing them.
        on_other.describe(&id).await.unwrap();
        crate::lease::signal(pid, "-CONT");

        let current = [(promoted.member_id, promoted.epoch)];
        let leads = |member: u64, epoch: u64, what: &str| {
            assert!(
                member != l.member_id && member != 0 && epoch >= promoted.epoch,
                "round {round}: {what} names member {member} epoch {epoch}; L was {} (epoch {}), S leads with {current:?}",
                l.member_id,
                l.epoch
            );
        };
        match within(handover).await.unwrap() {
            Ok(done) => {
                let done = done.into_inner();
                assert_eq!(
                    (done.previous_member_id, done.previous_epoch),
                    current[0],
                    "round {round}: {done:?}"
                );
                let confirmed = t.confirmed().await;
                assert_eq!(
                    (done.member_id, done.epoch),
                    (confirmed.member_id, confirmed.epoch)
                );
            }
            Err(status) => assert_eq!(
                status.code(),
                Code::Unavailable,
                "round {round}: {status:?}"
            ),
        }
        match within(watching).await.unwrap() {
            Ok(frame) => leads(
                frame.active_member_id,
                frame.epoch,
                "the watch's first frame",
            ),
            Err(status) => assert_eq!(
                status.code(),
                Code::Unavailable,
                "round {round}: {status:?}"
            ),
        }
        match within(describing).await.unwrap() {
            Ok(info) => leads(info.active_member_id, info.epoch, "the description"),
            Err(status) => assert_eq!(
                status.code(),
                Code::Unavailable,
                "round {round}: {status:?}"
            ),
        }
        assert!(leader.ended().await.is_err(), "L's stream ends");
    }
}
