//! Priority and hand-over over the wire (docs/semantics.md#priority, docs/semantics.md#hand-over):
//! an active SINGLETON member steps down only at a message boundary, when a member of higher
//! priority joins or a `HandOver` asks it to: it is sent nothing more, and once it acked what
//! it holds it is told it stepped down (a StandbyNotice with `stepped_down_epoch`) and the first
//! standby in line is confirmed with a higher epoch. Nothing is delivered twice. The same
//! through gateways (docs/semantics.md#cluster-priority-and-hand-over), where these members
//! share one gateway; tests/cluster/handover.rs has them on two.

use tinybroker::pb::{self, subscription_frame::Frame};
use tonic::{Code, Status};

use crate::harness::*;

fn ranked(id: &str, priority: u32) -> pb::OpenSubscription {
    pb::OpenSubscription {
        priority,
        ..singleton(id)
    }
}

async fn hand_over(client: &Client, id: &str) -> Result<pb::HandOverResponse, Status> {
    within(client.0.clone().hand_over(pb::HandOverRequest {
        subscription_id: id.into(),
    }))
    .await
    .map(|r| r.into_inner())
}

/// Awaits the subscription's `stepping_down_member_id` becoming `member`.
async fn stepping_down(client: &Client, id: &str, member: u64) {
    within(async {
        while client.describe(id).await.unwrap().stepping_down_member_id != member {
            tokio::task::yield_now().await;
        }
    })
    .await;
}

/// The next frame must tell `member` it stepped down from `epoch`.
async fn told_stepped_down(member: &mut Member, epoch: u64) -> pb::StandbyNotice {
    match member.frame().await {
        Frame::Standby(notice) => {
            assert_eq!(notice.stepped_down_epoch, epoch, "{notice:?}");
            assert_eq!(notice.member_id, member.member_id);
            notice
        }
        other => panic!("expected the step-down notice, got {other:?}"),
    }
}

/// A leader of `id` holding one message, `m1`, and a standby behind it.
struct Holding {
    leader: Member,
    confirmed: pb::Confirmation,
    standby: Member,
    message: pb::DeliveredMessage,
}

async fn holding(client: &Client, id: &str) -> Holding {
    let mut leader = client.subscribe(singleton(id)).await.unwrap();
    let confirmed = leader.confirmed().await;
    let standby = client.subscribe(singleton(id)).await.unwrap();
    client.publish("jobs.a", "m1").await;
    let message = leader.message().await;
    Holding {
        leader,
        confirmed,
        standby,
        message,
    }
}

/// A `HandOver` of `id` running on its own task.
fn ask(client: &Client, id: &str) -> tokio::task::JoinHandle<Result<pb::HandOverResponse, Status>> {
    let (client, id) = (client.clone(), id.to_string());
    tokio::spawn(async move { hand_over(&client, &id).await })
}

// docs/semantics.md#hand-over: the hand-over waits for the message in flight; meanwhile the
// active member gets nothing new; its ack completes it: it is told, the standby is confirmed
// with the next epoch and gets the next message as a first delivery, and the request answers
// with both members and epochs.
#[tokio::test]
async fn a_hand_over_waits_for_the_message_in_flight_and_redelivers_nothing() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let Holding {
        leader: mut first,
        confirmed: c1,
        standby: mut second,
        message: m1,
    } = holding(&client, "ho").await;
    let request = ask(&client, "ho");
    stepping_down(&client, "ho", c1.member_id).await;
    client.publish("jobs.a", "m2").await;
    assert!(
        !request.is_finished(),
        "answered before the message was acked"
    );
    first.ack(m1.system_id).await;
    let done = within(request).await.unwrap().unwrap();
    told_stepped_down(&mut first, c1.epoch).await;
    let c2 = second.confirmed().await;
    assert_next_epoch(c1.epoch, c2.epoch);
    assert_eq!(
        (
            done.previous_member_id,
            done.previous_epoch,
            done.member_id,
            done.epoch
        ),
        (c1.member_id, c1.epoch, c2.member_id, c2.epoch)
    );
    let m2 = second.message().await;
    assert_eq!((m2.payload.as_ref(), m2.delivery_attempt), (&b"m2"[..], 1));
    let info = client.describe("ho").await.unwrap();
    let counters = info.counters.unwrap();
    assert_eq!(
        (
            counters.redelivered,
            counters.handovers,
            counters.promotions
        ),
        (0, 1, 1)
    );
    assert_eq!(info.stepping_down_member_id, 0);
    // The member that stepped down waits in line, behind no one: it follows the new leader.
    drop(second);
    let again = first.confirmed().await;
    assert_next_epoch(c2.epoch, again.epoch);
}

// docs/semantics.md#priority: a member of higher priority takes over only once the active
// member acked what it holds, and the member it displaced stays in line; an equal priority
// keeps join order.
#[tokio::test]
async fn a_higher_priority_member_takes_over_at_a_message_boundary() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut low = client.subscribe(ranked("prio", 0)).await.unwrap();
    let c1 = low.confirmed().await;
    client.publish("jobs.a", "m1").await;
    let m1 = low.message().await;
    let mut high = client.subscribe(ranked("prio", 5)).await.unwrap();
    stepping_down(&client, "prio", c1.member_id).await;
    client.publish("jobs.a", "m2").await;
    // A second member of the same priority as the leader-to-be waits behind it.
    let mut peer = client.subscribe(ranked("prio", 5)).await.unwrap();
    low.ack(m1.system_id).await;
    let notice = told_stepped_down(&mut low, c1.epoch).await;
    assert_eq!(notice.position, 2, "behind the peer of higher priority");
    let c2 = high.confirmed().await;
    assert_next_epoch(c1.epoch, c2.epoch);
    let m2 = high.message().await;
    assert_eq!((m2.payload.as_ref(), m2.delivery_attempt), (&b"m2"[..], 1));
    // In line order: the new leader, its peer, then the displaced leader.
    let info = client.describe("prio").await.unwrap();
    let line: Vec<(u32, u32)> = info
        .members
        .iter()
        .map(|m| (m.priority, m.position))
        .collect();
    assert_eq!(line, [(5, 0), (5, 1), (0, 2)]);
    assert_eq!(info.members[0].member_id, c2.member_id);
    assert_eq!(info.members[2].member_id, c1.member_id);
    drop(high);
    peer.confirmed().await;
}

// docs/semantics.md#hand-over: past the hand-over timeout, what the member still holds
// goes to its successor as on a failover (attempt 2); the old member's late ack is refused,
// and nothing is in flight to both.
#[tokio::test]
async fn an_overdue_hand_over_gives_what_is_in_flight_to_the_successor() {
    let config = tinybroker::server::ServerConfig {
        limits: tinybroker::core::Limits {
            handover_timeout: std::time::Duration::from_millis(200),
            ..Default::default()
        },
        ..Default::default()
    };
    let server = TestServer::with_config(config).await;
    let client = server.client().await;
    let Holding {
        leader: mut first,
        confirmed: c1,
        standby: mut second,
        message: m1,
    } = holding(&client, "late").await;
    let done = hand_over(&client, "late").await.unwrap();
    told_stepped_down(&mut first, c1.epoch).await;
    let c2 = second.confirmed().await;
    assert_eq!((done.member_id, done.epoch), (c2.member_id, c2.epoch));
    let again = second.message().await;
    assert_eq!((again.system_id, again.delivery_attempt), (m1.system_id, 2));
    assert_code(
        client.ack("late", c1.member_id, m1.system_id).await,
        Code::FailedPrecondition,
        "stale",
    );
    let counters = client.describe("late").await.unwrap().counters.unwrap();
    assert_eq!((counters.handovers, counters.handovers_overdue), (1, 1));
    second.ack(again.system_id).await;
}

// docs/semantics.md#watching-leadership: a watcher sees the hand-over as a change of
// leader with a higher epoch.
#[tokio::test]
async fn a_watcher_sees_the_hand_over() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut first = client.subscribe(singleton("seen")).await.unwrap();
    let c1 = first.confirmed().await;
    let mut second = client.subscribe(singleton("seen")).await.unwrap();
    let mut frames = within(
        client
            .0
            .clone()
            .watch_leadership(pb::WatchLeadershipRequest {
                subscription_id: "seen".into(),
            }),
    )
    .await
    .unwrap()
    .into_inner();
    let now = within(frames.message()).await.unwrap().unwrap();
    assert_eq!((now.active_member_id, now.epoch), (c1.member_id, c1.epoch));
    hand_over(&client, "seen").await.unwrap();
    let c2 = second.confirmed().await;
    let next = within(frames.message()).await.unwrap().unwrap();
    assert_eq!(
        (next.active_member_id, next.epoch),
        (c2.member_id, c2.epoch)
    );
}

// docs/semantics.md#hand-over: refusals name the reason and change nothing.
#[tokio::test]
async fn hand_overs_that_cannot_happen_are_refused() {
    let server = TestServer::start().await;
    let client = server.client().await;
    assert_code(
        hand_over(&client, "nobody").await,
        Code::NotFound,
        "not found",
    );
    assert_code(
        hand_over(&client, "").await,
        Code::InvalidArgument,
        "subscription_id is required",
    );
    let mut alone = client.subscribe(singleton("alone")).await.unwrap();
    let c = alone.confirmed().await;
    let mut queue = client
        .subscribe(open("q", pb::DeliveryMode::Queue, "g", &["q.>"]))
        .await
        .unwrap();
    queue.confirmed().await;
    assert_code(
        hand_over(&client, "alone").await,
        Code::FailedPrecondition,
        "no standby",
    );
    assert_code(
        hand_over(&client, "q").await,
        Code::FailedPrecondition,
        "only a SINGLETON",
    );
    assert_code(
        client
            .subscribe(pb::OpenSubscription {
                priority: 1,
                ..open("q2", pb::DeliveryMode::Queue, "g", &["q.>"])
            })
            .await
            .map(|_| ()),
        Code::InvalidArgument,
        "priority only applies to DELIVERY_MODE_SINGLETON",
    );
    // Still the leader, with its epoch.
    let info = client.describe("alone").await.unwrap();
    assert_eq!((info.active_member_id, info.epoch), (c.member_id, c.epoch));
}

// docs/semantics.md#hand-over: two requests for one hand-over both get its outcome; one
// whose active member leaves meanwhile answers with the promotion that followed.
#[tokio::test]
async fn concurrent_requests_share_one_hand_over_and_a_leave_completes_it() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let Holding {
        leader: mut first,
        confirmed: c1,
        standby: mut second,
        message: m1,
    } = holding(&client, "twice").await;
    let (a, b) = (ask(&client, "twice"), ask(&client, "twice"));
    stepping_down(&client, "twice", c1.member_id).await;
    first.ack(m1.system_id).await;
    told_stepped_down(&mut first, c1.epoch).await;
    let c2 = second.confirmed().await;
    for answer in [a, b] {
        let done = within(answer).await.unwrap().unwrap();
        assert_eq!(
            (done.previous_member_id, done.member_id, done.failed_over),
            (c1.member_id, c2.member_id, false)
        );
    }
    assert_eq!(
        client
            .describe("twice")
            .await
            .unwrap()
            .counters
            .unwrap()
            .handovers,
        1
    );

    // Now `second` leads with a message in flight and `first` waits behind it.
    client.publish("jobs.a", "m2").await;
    let m2 = second.message().await;
    let request = ask(&client, "twice");
    stepping_down(&client, "twice", c2.member_id).await;
    drop(second);
    let done = within(request).await.unwrap().unwrap();
    let c3 = first.confirmed().await;
    assert_eq!(
        (done.member_id, done.epoch, done.failed_over),
        (c3.member_id, c3.epoch, true)
    );
    let counters = client.describe("twice").await.unwrap().counters.unwrap();
    assert_eq!(counters.handovers, 1, "a failover is not a hand-over");
    // What the leaver held comes first, as on any failover.
    let again = first.message().await;
    assert_eq!((again.system_id, again.delivery_attempt), (m2.system_id, 2));
}

// docs/semantics.md#hand-over: an ack-free singleton's member settles by having its frames
// written, so its hand-over completes as soon as its stream wrote what it held.
#[tokio::test]
async fn an_ack_free_leader_hands_over_once_its_frames_are_written() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let ack_free = |id: &str| pb::OpenSubscription {
        ack_mode: pb::AckMode::None.into(),
        ..singleton(id)
    };
    let mut first = client.subscribe(ack_free("feed")).await.unwrap();
    let c1 = first.confirmed().await;
    let mut second = client.subscribe(ack_free("feed")).await.unwrap();
    client.publish("jobs.a", "m1").await;
    assert_eq!(first.message().await.payload.as_ref(), b"m1");
    let done = hand_over(&client, "feed").await.unwrap();
    told_stepped_down(&mut first, c1.epoch).await;
    let c2 = second.confirmed().await;
    assert_eq!((done.member_id, done.epoch), (c2.member_id, c2.epoch));
    client.publish("jobs.a", "m2").await;
    let m2 = second.message().await;
    assert_eq!((m2.payload.as_ref(), m2.delivery_attempt), (&b"m2"[..], 1));
}

// A shutdown answers a hand-over still waiting with UNAVAILABLE.
#[tokio::test]
async fn a_shutdown_answers_a_waiting_hand_over() {
    let server = TestServer::start().await;
    let client = server.client().await;
    // Both streams stay open (bound) until the shutdown ends them.
    let Holding {
        leader: _first,
        confirmed: c1,
        standby: _second,
        ..
    } = holding(&client, "stop").await;
    let request = ask(&client, "stop");
    stepping_down(&client, "stop", c1.member_id).await;
    within(server.stop()).await.unwrap();
    let answer = within(request).await.unwrap();
    assert_eq!(answer.unwrap_err().code(), Code::Unavailable);
}

fn windowed(id: &str, window: u32) -> pb::OpenSubscription {
    pb::OpenSubscription {
        max_in_flight: window,
        ..singleton(id)
    }
}

// docs/semantics.md#hand-over: a leader that gives back what it prefetched while stepping
// down is a standby like any other afterwards: promoted again, it is served.
#[tokio::test]
async fn a_leader_that_released_while_stepping_down_is_served_when_promoted_again() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut first = client
        .subscribe_via(Carriage::Stream, windowed("rel", 2))
        .await
        .unwrap();
    let c1 = first.confirmed().await;
    let mut second = client
        .subscribe_via(Carriage::Stream, windowed("rel", 2))
        .await
        .unwrap();
    let m1 = client.publish("jobs.a", "m1").await.system_id;
    assert_eq!(first.message().await.system_id, m1);
    let request = ask(&client, "rel");
    stepping_down(&client, "rel", c1.member_id).await;
    first.release(&[m1]).await;
    within(request).await.unwrap().unwrap();
    told_stepped_down(&mut first, c1.epoch).await;
    second.confirmed().await;
    let got = second.message().await;
    assert_eq!(
        (got.system_id, got.delivery_attempt),
        (m1, 1),
        "released: same attempt"
    );
    second.ack(m1).await;
    drop(second);
    first.confirmed().await;
    let m2 = client.publish("jobs.a", "m2").await.system_id;
    assert_eq!(first.message().await.system_id, m2);
}

// docs/semantics.md#priority: a takeover called off after the leader released a message
// leaves it serving, the released message first.
#[tokio::test]
async fn a_leader_that_released_during_a_called_off_takeover_is_served_again() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut leader = client
        .subscribe_via(Carriage::Stream, windowed("call", 2))
        .await
        .unwrap();
    let c = leader.confirmed().await;
    let m1 = client.publish("jobs.a", "m1").await.system_id;
    let m2 = client.publish("jobs.a", "m2").await.system_id;
    leader.message().await;
    leader.message().await;
    let newcomer = client.subscribe(ranked("call", 5)).await.unwrap();
    stepping_down(&client, "call", c.member_id).await;
    leader.release(&[m2]).await;
    drop(newcomer);
    stepping_down(&client, "call", 0).await;
    let again = leader.message().await;
    assert_eq!((again.system_id, again.delivery_attempt), (m2, 1));
    leader.ack(m1).await;
    leader.ack(m2).await;
}

// A hand-over timeout of centuries is a deadline that never comes: the hand-over completes
// on the leader's ack, and the broker's other deadlines go on (it does not panic).
#[tokio::test]
async fn a_hand_over_timeout_of_centuries_never_comes() {
    let config = tinybroker::server::ServerConfig {
        limits: tinybroker::core::Limits {
            handover_timeout: std::time::Duration::MAX,
            idle_timeout: std::time::Duration::from_millis(50),
            ..Default::default()
        },
        ..Default::default()
    };
    let server = TestServer::with_config(config).await;
    let client = server.client().await;
    let Holding {
        leader: first,
        confirmed: c1,
        standby: mut second,
        message: m1,
    } = holding(&client, "long").await;
    let request = ask(&client, "long");
    stepping_down(&client, "long", c1.member_id).await;
    first.ack(m1.system_id).await;
    within(request).await.unwrap().unwrap();
    second.confirmed().await;
    drop((first, second));
    if GATEWAYS {
        // A gateway forgets a subscription with its last member there; its JetStream
        // consumer outlives it (docs/semantics.md#cluster-inspection).
        return;
    }
    // Idle expiry, driven by the same task, still runs.
    within(async {
        while client.describe("long").await.is_ok() {
            tokio::task::yield_now().await;
        }
    })
    .await;
}
