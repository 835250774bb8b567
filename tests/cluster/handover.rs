//! Priority and hand-over across gateways (docs/semantics.md#cluster-priority-and-hand-over):
//! the active member at one gateway steps down at a message boundary to a member at another,
//! whichever gateway the `HandOver` reached; past the hand-over timeout what it held goes to
//! its successor there as on a failover.

use std::{sync::Arc, time::Duration};

use tinybroker::{
    clock::TokioClock,
    cluster::gateway::GatewayConfig,
    pb::{self, subscription_frame::Frame},
    server::ServerConfig,
};
use tonic::Code;

use crate::{
    NatsCluster,
    harness::{Client, Member, TestServer, assert_code, assert_next_epoch, singleton, within},
};

/// Two gateways with this hand-over timeout, over a fresh three-node cluster.
async fn two(handover_timeout: Duration) -> (NatsCluster, TestServer, TestServer) {
    let cluster = NatsCluster::start(3).await;
    let urls = cluster.client_urls();
    let server = || ServerConfig {
        limits: tinybroker::core::Limits {
            handover_timeout,
            ..Default::default()
        },
        ..Default::default()
    };
    let clock = || -> Arc<dyn tinybroker::clock::Clock> { Arc::new(TokioClock::new()) };
    let a = crate::serve_gateway(server(), GatewayConfig::new(&urls[0]), clock()).await;
    let b = crate::serve_gateway(server(), GatewayConfig::new(&urls[1]), clock()).await;
    (cluster, a, b)
}

fn ranked(id: &str, priority: u32) -> pb::OpenSubscription {
    pb::OpenSubscription {
        priority,
        ..singleton(id)
    }
}

fn ask(
    at: &Client,
    id: &str,
) -> tokio::task::JoinHandle<Result<pb::HandOverResponse, tonic::Status>> {
    let (mut client, id) = (at.0.clone(), id.to_string());
    tokio::spawn(async move {
        client
            .hand_over(pb::HandOverRequest {
                subscription_id: id,
            })
            .await
            .map(tonic::Response::into_inner)
    })
}

/// Awaits `at`'s describe naming `member` as stepping down.
async fn stepping_down(at: &Client, id: &str, member: u64) {
    within(async {
        while at.describe(id).await.unwrap().stepping_down_member_id != member {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

async fn told_stepped_down(member: &mut Member, epoch: u64) -> pb::StandbyNotice {
    match member.frame().await {
        Frame::Standby(notice) => {
            assert_eq!(notice.stepped_down_epoch, epoch, "{notice:?}");
            notice
        }
        other => panic!("expected the step-down notice, got {other:?}"),
    }
}

// A hand-over asked at the gateway holding the standby waits for the leader's message in
// flight at the other; meanwhile nothing new reaches the leader; then the standby is confirmed
// with a higher epoch and gets what was published meanwhile as first deliveries.
#[tokio::test]
async fn a_hand_over_asked_at_another_gateway_waits_for_the_leaders_ack() {
    let (_cluster, a, b) = two(Duration::from_secs(10)).await;
    let (on_a, on_b) = (a.client().await, b.client().await);
    let mut leader = on_a.subscribe(singleton("ho")).await.unwrap();
    let c1 = leader.confirmed().await;
    let mut standby = on_b.subscribe(singleton("ho")).await.unwrap();
    on_b.publish("jobs.a", "m1").await;
    let m1 = leader.message().await;
    let request = ask(&on_b, "ho");
    stepping_down(&on_a, "ho", c1.member_id).await;
    on_b.publish("jobs.a", "m2").await;
    assert!(!request.is_finished(), "answered before the leader acked");
    leader.ack(m1.system_id).await;
    let done = within(request).await.unwrap().unwrap();
    told_stepped_down(&mut leader, c1.epoch).await;
    let c2 = standby.confirmed().await;
    assert_next_epoch(c1.epoch, c2.epoch);
    assert_eq!(
        (
            done.previous_member_id,
            done.previous_epoch,
            done.member_id,
            done.epoch,
            done.failed_over
        ),
        (c1.member_id, c1.epoch, c2.member_id, c2.epoch, false)
    );
    let m2 = standby.message().await;
    assert_eq!((m2.payload.as_ref(), m2.delivery_attempt), (&b"m2"[..], 1));
    let counters = on_a.describe("ho").await.unwrap().counters.unwrap();
    assert_eq!(counters.handovers, 1);
    // The member that stepped down is next: it follows when the new leader leaves.
    drop(standby);
    let again = leader.confirmed().await;
    assert_next_epoch(c2.epoch, again.epoch);
}

// A member of higher priority joining at another gateway takes over only once the leader
// acked what it holds; the leader stays in line, first among its priority.
#[tokio::test]
async fn a_higher_priority_join_at_another_gateway_takes_over_at_a_message_boundary() {
    let (_cluster, a, b) = two(Duration::from_secs(10)).await;
    let (on_a, on_b) = (a.client().await, b.client().await);
    let mut low = on_a.subscribe(singleton("prio")).await.unwrap();
    let c1 = low.confirmed().await;
    let mut peer = on_a.subscribe(singleton("prio")).await.unwrap();
    on_b.publish("jobs.a", "m1").await;
    let m1 = low.message().await;
    let mut high = on_b.subscribe(ranked("prio", 5)).await.unwrap();
    stepping_down(&on_a, "prio", c1.member_id).await;
    on_b.publish("jobs.a", "m2").await;
    low.ack(m1.system_id).await;
    let notice = told_stepped_down(&mut low, c1.epoch).await;
    assert_eq!(
        notice.position, 1,
        "first among its priority, ahead of its peer"
    );
    let c2 = high.confirmed().await;
    assert_next_epoch(c1.epoch, c2.epoch);
    let m2 = high.message().await;
    assert_eq!((m2.payload.as_ref(), m2.delivery_attempt), (&b"m2"[..], 1));
    drop(high);
    let c3 = low.confirmed().await;
    assert_next_epoch(c2.epoch, c3.epoch);
    // The peer never led.
    drop(low);
    peer.confirmed().await;
}

// Past the hand-over timeout, what the leader still holds goes to its successor at the other
// gateway as on a failover (attempt 2), and the leader's late ack is refused.
#[tokio::test]
async fn an_overdue_hand_over_gives_the_message_in_flight_to_the_successor_elsewhere() {
    let (_cluster, a, b) = two(Duration::from_millis(300)).await;
    let (on_a, on_b) = (a.client().await, b.client().await);
    let mut leader = on_a.subscribe(singleton("late")).await.unwrap();
    let c1 = leader.confirmed().await;
    let mut standby = on_b.subscribe(singleton("late")).await.unwrap();
    on_b.publish("jobs.a", "m1").await;
    let m1 = leader.message().await;
    let done = within(ask(&on_b, "late")).await.unwrap().unwrap();
    told_stepped_down(&mut leader, c1.epoch).await;
    let c2 = standby.confirmed().await;
    assert_eq!((done.member_id, done.epoch), (c2.member_id, c2.epoch));
    let again = standby.message().await;
    assert_eq!((again.system_id, again.delivery_attempt), (m1.system_id, 2));
    assert_code(
        on_a.ack("late", c1.member_id, m1.system_id).await,
        Code::NotFound,
        "not in flight",
    );
    let counters = on_a.describe("late").await.unwrap().counters.unwrap();
    assert_eq!((counters.handovers, counters.handovers_overdue), (1, 1));
    standby.ack(again.system_id).await;
}

// A hand-over whose only standby leaves before the leader settled is refused, and the leader
// goes on being served.
#[tokio::test]
async fn a_hand_over_whose_standby_leaves_is_refused_and_the_leader_goes_on() {
    let (_cluster, a, b) = two(Duration::from_secs(10)).await;
    let (on_a, on_b) = (a.client().await, b.client().await);
    let mut leader = on_a.subscribe(singleton("off")).await.unwrap();
    let c1 = leader.confirmed().await;
    let standby = on_b.subscribe(singleton("off")).await.unwrap();
    on_b.publish("jobs.a", "m1").await;
    let m1 = leader.message().await;
    let request = ask(&on_b, "off");
    stepping_down(&on_a, "off", c1.member_id).await;
    on_b.publish("jobs.a", "m2").await;
    drop(standby);
    assert_code(
        within(request).await.unwrap(),
        Code::FailedPrecondition,
        "stays active",
    );
    stepping_down(&on_a, "off", 0).await;
    leader.ack(m1.system_id).await;
    let m2 = leader.message().await;
    assert_eq!((m2.payload.as_ref(), m2.delivery_attempt), (&b"m2"[..], 1));
    let info = on_b.describe("off").await.unwrap();
    assert_eq!(
        (info.active_member_id, info.epoch),
        (c1.member_id, c1.epoch)
    );
}

/// Two gateways with a 30 s lease: their bridges' keep-alive tick (a third of the ack wait,
/// bounded by the lease) is 5 s, far above what a prompt answer takes.
async fn two_with_long_lease() -> (NatsCluster, TestServer, TestServer) {
    let cluster = NatsCluster::start(3).await;
    let urls = cluster.client_urls();
    let clock = || -> Arc<dyn tinybroker::clock::Clock> { Arc::new(TokioClock::new()) };
    let config = |url: &str| GatewayConfig {
        lease: Duration::from_secs(30),
        ..GatewayConfig::new(url)
    };
    let a = crate::serve_gateway(ServerConfig::default(), config(&urls[0]), clock()).await;
    let b = crate::serve_gateway(ServerConfig::default(), config(&urls[1]), clock()).await;
    (cluster, a, b)
}

/// Asserts `member` is sent nothing for `quiet` (nothing is due to it).
async fn sent_nothing(member: &mut Member, quiet: Duration) {
    if let Ok(frame) = tokio::time::timeout(quiet, member.frame()).await {
        panic!("sent {frame:?} when nothing was due to it");
    }
}

fn windowed(id: &str, priority: u32) -> pb::OpenSubscription {
    pb::OpenSubscription {
        max_in_flight: 4,
        ..ranked(id, priority)
    }
}

// A step-down called off (the standby that could take over left) serves the leader again at
// once, also what was published while it stepped down and stayed in JetStream: its gateway
// pulls again when the call-off comes, not at its next keep-alive tick (an adversarial review's
// finding: 4.6 s late with a 30 s lease).
#[tokio::test]
async fn a_called_off_step_down_serves_the_leader_again_at_once() {
    let (_cluster, a, b) = two_with_long_lease().await;
    let (on_a, on_b) = (a.client().await, b.client().await);
    for (round, by_priority) in [(0, false), (1, true)] {
        let id = format!("resume{round}");
        let mut leader = on_a.subscribe(windowed(&id, 0)).await.unwrap();
        let c = leader.confirmed().await;
        on_b.publish("jobs.a", "m1").await;
        let m1 = leader.message().await;
        let (successor, request) = if by_priority {
            (on_b.subscribe(windowed(&id, 5)).await.unwrap(), None)
        } else {
            let standby = on_b.subscribe(windowed(&id, 0)).await.unwrap();
            (standby, Some(ask(&on_b, &id)))
        };
        stepping_down(&on_a, &id, c.member_id).await;
        on_b.publish("jobs.a", "m2").await;
        sent_nothing(&mut leader, Duration::from_millis(300)).await;
        // Published well after the pull open when the step-down began ended (15 ms).
        on_b.publish("jobs.a", "m3").await;
        sent_nothing(&mut leader, Duration::from_millis(100)).await;
        drop(successor);
        let resumed = tokio::time::Instant::now();
        let got: Vec<Vec<u8>> = within(async {
            vec![
                leader.message().await.payload.to_vec(),
                leader.message().await.payload.to_vec(),
            ]
        })
        .await;
        let took = resumed.elapsed();
        assert_eq!(got, [b"m2".to_vec(), b"m3".to_vec()]);
        assert!(
            took < Duration::from_secs(2),
            "served again {took:?} after the call-off (by priority: {by_priority})"
        );
        if let Some(request) = request {
            assert_code(
                within(request).await.unwrap(),
                Code::FailedPrecondition,
                "stays active",
            );
        }
        leader.ack(m1.system_id).await;
    }
}

// A HandOver refused because its standby left as it was asked stays refused: a standby that
// joins afterwards does not make the leader step down (an adversarial review's finding: the
// refused request was marked in the line later).
#[tokio::test]
async fn a_refused_hand_over_stays_refused_when_a_standby_joins_later() {
    let (_cluster, a, b) = two(Duration::from_secs(10)).await;
    let (on_a, on_b) = (a.client().await, b.client().await);
    let mut refused = 0;
    for round in 0..12 {
        let id = format!("refused{round}");
        let mut leader = on_a.subscribe(singleton(&id)).await.unwrap();
        let c = leader.confirmed().await;
        // Its standby at the gateway asked, in the line before the request.
        let mut standby = on_b
            .subscribe(pb::OpenSubscription {
                notify_standby: true,
                ..singleton(&id)
            })
            .await
            .unwrap();
        assert!(matches!(standby.frame().await, Frame::Standby(_)));
        let request = ask(&on_b, &id);
        drop(standby);
        if within(request).await.unwrap().is_ok() {
            // The step-down came first (the leader held nothing): a fair outcome.
            continue;
        }
        refused += 1;
        let _later = on_b.subscribe(singleton(&id)).await.unwrap();
        sent_nothing(&mut leader, Duration::from_millis(500)).await;
        let info = on_a.describe(&id).await.unwrap();
        assert_eq!(
            (
                info.active_member_id,
                info.epoch,
                info.stepping_down_member_id
            ),
            (c.member_id, c.epoch, 0)
        );
    }
    assert!(refused > 0, "no request was refused in 12 rounds");
}

// A proclamation by a member that stepped down is refused naming the epoch its successor leads
// with, at the member's gateway and at the successor's (forwarded), as on the embedded broker.
// Before, both named the epoch the member itself had led with.
#[tokio::test]
async fn a_proclamation_after_a_hand_over_names_the_successors_epoch() {
    let (_cluster, a, b) = two(Duration::from_secs(10)).await;
    let (on_a, on_b) = (a.client().await, b.client().await);
    let mut leader = on_a.subscribe(singleton("proclaimed")).await.unwrap();
    let c1 = leader.confirmed().await;
    let mut standby = on_b
        .subscribe(pb::OpenSubscription {
            notify_standby: true,
            ..singleton("proclaimed")
        })
        .await
        .unwrap();
    // In the cluster's line.
    assert!(matches!(standby.frame().await, Frame::Standby(_)));
    let done = within(ask(&on_b, "proclaimed")).await.unwrap().unwrap();
    told_stepped_down(&mut leader, c1.epoch).await;
    let c2 = standby.confirmed().await;
    assert_eq!((done.member_id, done.epoch), (c2.member_id, c2.epoch));
    for at in [&on_a, &on_b] {
        let refused = within(at.0.clone().proclaim(pb::ProclaimRequest {
            subscription_id: "proclaimed".into(),
            member_id: c1.member_id,
            epoch: c1.epoch,
            metadata: "late".into(),
        }))
        .await;
        assert_code(
            refused,
            Code::FailedPrecondition,
            &format!("the subscription's epoch is {}", c2.epoch),
        );
    }
}

// docs/semantics.md#cluster-priority-and-hand-over: sequential `HandOver`s asked round-robin
// at three gateways, one member at each. Every answer is OK and is this request's own: it
// names as previous the member and epoch the answer before named as successor (never the
// previous request's outcome again), and its successor is confirmed on its stream with
// exactly the epoch the answer names. Before, 4-14 of 300 answers repeated the previous one
// and 145-206 named an epoch their member was never confirmed with.
#[tokio::test]
async fn sequential_hand_overs_at_three_gateways_each_name_a_confirmed_successor() {
    const ROUNDS: usize = 300;
    let cluster = NatsCluster::start(3).await;
    let urls = cluster.client_urls();
    // Gateway processes, as deployed: each has its own scheduler, so one's copy of the lines
    // can trail another's.
    let mut gateways = Vec::new();
    let mut at = Vec::new();
    for url in &urls {
        let (process, client) =
            crate::faults::gateway_process(url, &["--handover-timeout", "10s"]).await;
        gateways.push(process);
        at.push(client);
    }
    // Every confirmation each member's stream receives, as (member, epoch).
    let (confirmed_tx, mut confirmed_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut readers = Vec::new();
    let mut first = None;
    for client in &at {
        let mut member = client
            .subscribe(pb::OpenSubscription {
                notify_standby: true,
                ..singleton("relay")
            })
            .await
            .unwrap();
        // In the cluster's line before the next joins: the first leads, the others wait.
        match member.frame().await {
            Frame::Confirmation(c) => first = Some((c.member_id, c.epoch)),
            Frame::Standby(_) => {}
            other => panic!("a member got {other:?}"),
        }
        let tx = confirmed_tx.clone();
        readers.push(tokio::spawn(async move {
            loop {
                match member.frame().await {
                    Frame::Confirmation(c) => {
                        if tx.send((c.member_id, c.epoch)).is_err() {
                            return;
                        }
                    }
                    Frame::Standby(_) => {}
                    other => panic!("a member got {other:?}"),
                }
            }
        }));
    }
    let (mut member, mut epoch) = first.expect("the first member leads");
    let mut seen = std::collections::BTreeSet::new();
    // Each request is sent as soon as the last was answered, as a client looping on HandOver
    // does: the next may reach a gateway before the last successor is confirmed.
    let mut named = Vec::new();
    for round in 0..ROUNDS {
        let answer = within(ask(&at[round % 3], "relay"))
            .await
            .unwrap()
            .unwrap_or_else(|status| panic!("round {round}: {status:?}"));
        assert_eq!(
            (answer.previous_member_id, answer.previous_epoch),
            (member, epoch),
            "round {round}: {answer:?} is not this request's hand-over"
        );
        assert!(
            answer.epoch > epoch && !answer.failed_over,
            "round {round}: {answer:?}"
        );
        (member, epoch) = (answer.member_id, answer.epoch);
        named.push((round, member, epoch));
    }
    for (round, member, epoch) in named {
        let confirmed = tokio::time::timeout(crate::harness::EVENT_TIMEOUT, async {
            while !seen.contains(&(member, epoch)) {
                seen.insert(confirmed_rx.recv().await.unwrap());
            }
        })
        .await;
        assert!(
            confirmed.is_ok(),
            "round {round}: the answer named member {member} with epoch {epoch}, which it was never confirmed with"
        );
    }
    for reader in readers {
        reader.abort();
    }
}
