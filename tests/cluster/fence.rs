//! Fence records through gateways (docs/semantics.md#cluster-fenced-publish,
//! docs/cluster-internals.md#fenced-publishes) where the stream is full or subscriptions go: a
//! member's activation waits for its epoch's fence record, so a full stream (discard new), which
//! takes no record, must not keep a SINGLETON subscription without a leader, nor tell the leader it
//! was deposed; and records do not outlive their subscriptions.

use std::sync::Arc;

use tinybroker::{clock::TokioClock, cluster::gateway::GatewayConfig};
use tonic::Code;

use crate::{NatsCluster, assert_code, gateway, gateway_with, harness::singleton, queue, within};

/// A cluster whose stream the first gateway created holding at most `max_messages` messages;
/// the second gateway binds it.
async fn bounded(max_messages: i64) -> (NatsCluster, crate::TestServer, crate::TestServer) {
    let cluster = NatsCluster::start(3).await;
    let urls = cluster.client_urls();
    let a = gateway_with(
        GatewayConfig {
            max_messages,
            ..GatewayConfig::new(&urls[0])
        },
        Arc::new(TokioClock::new()),
    )
    .await;
    let b = gateway(&urls[1]).await;
    (cluster, a, b)
}

/// A SINGLETON leader ("sched") at the first gateway, its standby at the second, and a QUEUE
/// member ("orders", window 1) holding what the stream then fills with, to `max_messages`.
struct FullStream {
    _cluster: NatsCluster,
    _gateways: (crate::TestServer, crate::TestServer),
    on_a: crate::harness::Client,
    on_b: crate::harness::Client,
    leader: crate::harness::Member,
    standby: crate::harness::Member,
    _holder: crate::harness::Member,
}

async fn leader_and_standby_on_a_full_stream(max_messages: i64) -> FullStream {
    let (cluster, a, b) = bounded(max_messages).await;
    let (on_a, on_b) = (a.client().await, b.client().await);
    let mut leader = on_a.subscribe(singleton("sched")).await.unwrap();
    leader.confirmed().await;
    let standby = on_b.subscribe(singleton("sched")).await.unwrap();
    let mut holder = on_a.subscribe(queue("orders", 1)).await.unwrap();
    holder.confirmed().await;
    fill(&on_b).await;
    FullStream {
        _cluster: cluster,
        _gateways: (a, b),
        on_a,
        on_b,
        leader,
        standby,
        _holder: holder,
    }
}

/// Publishes through `client` until the stream refuses one as full.
async fn fill(client: &crate::harness::Client) {
    within(async {
        loop {
            match client.try_publish("orders.new", b"fill".to_vec()).await {
                Ok(_) => {}
                Err(status) => {
                    assert_code(
                        Err::<(), _>(status),
                        Code::ResourceExhausted,
                        "max_msgs (--nats-max-messages",
                    );
                    return;
                }
            }
        }
    })
    .await;
}

// A new SINGLETON subscription's first member joins while the stream is full: no record can be
// stored, and none is there to pass a fenced publish, so the member is confirmed all the same
// (a review found it never confirmed while the stream stayed full).
#[tokio::test]
async fn a_new_singletons_first_member_is_confirmed_on_a_full_stream() {
    let (_cluster, a, b) = bounded(3).await;
    let (on_a, on_b) = (a.client().await, b.client().await);
    // A QUEUE subscription that takes one message and holds the rest: the stream fills.
    let mut holder = on_a.subscribe(queue("orders", 1)).await.unwrap();
    holder.confirmed().await;
    fill(&on_b).await;

    let mut first = on_a.subscribe(singleton("fresh")).await.unwrap();
    let confirmation = within(first.confirmed()).await;
    assert!(confirmation.epoch > 0);
}

// An existing SINGLETON subscription (its record stored) on a full stream while plain
// publishers keep retrying their refused publishes, taking any room that appears: the leader
// leaves, and the standby is confirmed once the old record is deleted (no fenced publish
// passes then), not once its own record is stored (a review found every such promotion stuck
// while publishers kept the stream full).
#[tokio::test]
async fn a_standby_is_confirmed_on_a_full_stream_while_publishers_race_for_the_room() {
    // Every field bound: what a `..` left out would be dropped here (the cluster with it).
    let FullStream {
        _cluster,
        _gateways,
        on_a: _,
        on_b,
        leader,
        mut standby,
        _holder,
    } = leader_and_standby_on_a_full_stream(4).await;

    // Publishers retrying whatever is refused, as a producer facing a full stream does.
    let racers: Vec<_> = (0..8)
        .map(|_| {
            let mut client = on_b.1.clone();
            tokio::spawn(async move {
                loop {
                    let _ = client
                        .publish(tinybroker::pb::PublishRequest {
                            topic: "orders.new".into(),
                            payload: b"race".to_vec().into(),
                            headers: Default::default(),
                            fence: None,
                        })
                        .await;
                }
            })
        })
        .collect();
    drop(leader);
    // Fails here ("timed out waiting for an event", from `confirmed`'s own 10 s bound).
    let confirmation = standby.confirmed().await;
    for racer in &racers {
        racer.abort();
    }
    assert!(confirmation.epoch > 0);
}

// A SINGLETON subscription that expires (no member within the idle timeout; JetStream removes
// its consumer) leaves no fence record behind: its ended record is deleted on JetStream's
// advisory, so it does not hold a message of the stream's limits for good.
#[tokio::test]
async fn an_expired_singletons_fence_record_does_not_stay_in_the_stream() {
    let cluster = NatsCluster::start(3).await;
    let urls = cluster.client_urls();
    let a = gateway_with(
        GatewayConfig {
            idle_timeout: std::time::Duration::from_secs(1),
            ..GatewayConfig::new(&urls[0])
        },
        Arc::new(TokioClock::new()),
    )
    .await;
    let on_a = a.client().await;
    for n in 0..5 {
        let mut member = on_a
            .subscribe(singleton(&format!("job-{n}")))
            .await
            .unwrap();
        member.confirmed().await;
    }
    // Every member gone; the consumers expire after the idle timeout.
    let client = async_nats::connect(&urls[2]).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let mut stream = js.get_stream("tinybroker").await.unwrap();
    within(async {
        loop {
            if on_a.list().await.subscriptions.is_empty() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    })
    .await;
    empties(&mut stream).await;
}

/// Waits until the stream holds no message (every subscription gone, so no fence record).
async fn empties(stream: &mut async_nats::jetstream::stream::Stream) {
    let mut messages = u64::MAX;
    let emptied = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        loop {
            messages = stream.info().await.unwrap().state.messages;
            if messages == 0 {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(
        emptied.is_ok(),
        "no subscription is left, yet the stream holds {messages} message(s) (fence records)"
    );
}

// On a full stream, a SINGLETON subscription's member joins and leaves, and the subscription is
// deleted: an ended epoch's record that a full stream refused is not written later (with no
// record nothing passes either), so once there is room no record of a deleted subscription
// appears (a review found one written for each, for good, and each line emptied on a full
// stream retried every second for as long as the gateway's lease lasted).
#[tokio::test]
async fn a_deleted_singletons_ended_record_is_not_written_after_the_delete() {
    let (cluster, a, _b) = bounded(3).await;
    let on_a = a.client().await;
    let mut holder = on_a.subscribe(queue("orders", 1)).await.unwrap();
    holder.confirmed().await;
    fill(&on_a).await;
    for n in 0..3 {
        let id = format!("gone-{n}");
        let mut member = on_a.subscribe(singleton(&id)).await.unwrap();
        member.confirmed().await;
        drop(member);
        within(async {
            loop {
                match crate::api::delete::delete(&on_a, &id).await {
                    Err(status) if status.code() == Code::FailedPrecondition => {
                        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    }
                    other => return other.unwrap(),
                }
            }
        })
        .await;
    }
    // Room: the holder leaves and its subscription (and backlog) is deleted.
    drop(holder);
    within(async {
        loop {
            match crate::api::delete::delete(&on_a, "orders").await {
                Err(status) if status.code() == Code::FailedPrecondition => {
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
                other => return other.unwrap(),
            }
        }
    })
    .await;
    assert!(on_a.list().await.subscriptions.is_empty());
    let client = async_nats::connect(&cluster.client_urls()[2])
        .await
        .unwrap();
    let js = async_nats::jetstream::new(client);
    let mut stream = js.get_stream("tinybroker").await.unwrap();
    empties(&mut stream).await;
}

// A standby promoted on a full stream is confirmed before its fence record is stored (the
// record below is deleted, the write waits for room). Meanwhile its own fenced publishes are
// refused UNAVAILABLE ("try again") through every gateway, never FAILED_PRECONDITION, which is
// what a deposed leader is told (docs/semantics.md#fenced-publish; a review found it told so
// through every gateway but the one writing the record).
#[tokio::test]
async fn the_current_leaders_fenced_publish_is_not_refused_as_deposed_while_its_record_waits_for_room()
 {
    let FullStream {
        _cluster,
        _gateways,
        on_a,
        on_b,
        leader,
        mut standby,
        _holder,
    } = leader_and_standby_on_a_full_stream(3).await;
    drop(leader);
    let promoted = standby.confirmed().await;
    for (gateway, client) in [("the leader's", &on_b), ("the other", &on_a)] {
        let answer = within(client.1.clone().publish(tinybroker::pb::PublishRequest {
            topic: "jobs.run".into(),
            payload: b"by-the-leader".to_vec().into(),
            headers: Default::default(),
            fence: Some(tinybroker::pb::PublishFence {
                subscription_id: "sched".into(),
                epoch: promoted.epoch,
            }),
        }))
        .await;
        let status = answer.expect_err("no room for it in a full stream");
        assert_eq!(
            status.code(),
            Code::Unavailable,
            "through {gateway} gateway, the confirmed leader (epoch {}): {status:?}",
            promoted.epoch
        );
    }
}

/// A publish of `payload` to `topic` through `client`, fenced by `subscription`'s `epoch`.
async fn fenced(
    client: &crate::harness::Client,
    topic: &str,
    payload: &str,
    subscription: &str,
    epoch: u64,
) -> Result<tinybroker::pb::PublishResponse, tonic::Status> {
    within(client.1.clone().publish(tinybroker::pb::PublishRequest {
        topic: topic.into(),
        payload: payload.as_bytes().to_vec().into(),
        headers: Default::default(),
        fence: Some(tinybroker::pb::PublishFence {
            subscription_id: subscription.into(),
            epoch,
        }),
    }))
    .await
    .map(tonic::Response::into_inner)
}

// docs/semantics.md#cluster-fenced-publish, with processes: the leader's gateway is stopped
// (SIGSTOP) past its 1 s lease and the standby at the other gateway is promoted. From the
// standby's confirmation on, a publish fenced by the deposed epoch is refused naming the new
// one, through the other gateway and, once resumed, through the paused one; the new epoch's
// are stored through both. An observer sees exactly what was stored, in order. Three rounds.
#[tokio::test]
async fn a_paused_gateways_deposed_leader_is_fenced_out_through_every_gateway() {
    use crate::{faults::gateway_process, harness::open, lease::signal};
    let cluster = NatsCluster::start(3).await;
    let urls = cluster.client_urls().join(",");
    let lease = ["--gateway-lease", "1s"];
    let (paused, on_paused) = gateway_process(&urls, &lease).await;
    let (_other, on_other) = gateway_process(&urls, &lease).await;
    let pid = paused.child.id();
    let mut seen = on_other
        .subscribe(open(
            "fence-seen",
            tinybroker::pb::DeliveryMode::Broadcast,
            "",
            &["side.>"],
        ))
        .await
        .unwrap();
    seen.confirmed().await;
    for round in 0..3 {
        let id = format!("paused-fence{round}");
        let mut old = on_paused.subscribe(singleton(&id)).await.unwrap();
        let deposed = old.confirmed().await.epoch;
        let mut new = on_other.subscribe(singleton(&id)).await.unwrap();
        fenced(&on_other, "side.run", &format!("old{round}"), &id, deposed)
            .await
            .expect("the leader's fenced publish, before the pause");

        signal(pid, "-STOP");
        let promoted = within(new.confirmed()).await.epoch;
        assert!(promoted > deposed, "{promoted} after {deposed}");
        let late = fenced(&on_other, "side.run", "late", &id, deposed).await;
        crate::assert_code(
            late,
            Code::FailedPrecondition,
            &format!("the active epoch is {promoted}"),
        );
        fenced(&on_other, "side.run", &format!("new{round}"), &id, promoted)
            .await
            .expect("the new leader's fenced publish");
        signal(pid, "-CONT");
        // The resumed gateway reads the record as it is now: the old epoch refused there too.
        let late = fenced(&on_paused, "side.run", "late", &id, deposed).await;
        crate::assert_code(
            late,
            Code::FailedPrecondition,
            &format!("the active epoch is {promoted}"),
        );
        fenced(
            &on_paused,
            "side.run",
            &format!("again{round}"),
            &id,
            promoted,
        )
        .await
        .expect("the new leader's fenced publish through the resumed gateway");
        drop(old);
        drop(new);
    }
    on_other.publish("side.end", "end").await;
    let mut payloads = Vec::new();
    loop {
        let message = seen.message().await;
        seen.ack(message.system_id).await;
        if message.payload.as_ref() == b"end" {
            break;
        }
        payloads.push(String::from_utf8(message.payload.to_vec()).unwrap());
    }
    let expected: Vec<String> = (0..3)
        .flat_map(|r| [format!("old{r}"), format!("new{r}"), format!("again{r}")])
        .collect();
    assert_eq!(payloads, expected, "nothing refused was stored");
}

// docs/semantics.md#cluster-fenced-publish: once a member is told it stepped down (its standby
// notice names the ended epoch), a publish fenced by that epoch is refused through every
// gateway: the epoch's record says it ended before the member is told. Twenty hand-overs
// back and forth between the two gateways' members. Before, such a publish was still stored
// for 10-15 ms after the notice, until the successor's record landed (in 5 rounds of 10).
#[tokio::test]
async fn a_publish_fenced_by_an_epoch_its_member_was_told_ended_is_refused() {
    use tinybroker::pb::{self, subscription_frame::Frame};
    let (_cluster, a, b) = crate::two_gateways().await;
    let clients = [a.client().await, b.client().await];
    let mut members = Vec::new();
    let mut confirmed = None;
    for client in &clients {
        let mut member = client
            .subscribe(pb::OpenSubscription {
                notify_standby: true,
                ..singleton("told")
            })
            .await
            .unwrap();
        match member.frame().await {
            Frame::Confirmation(c) => confirmed = Some(c),
            Frame::Standby(_) => {}
            other => panic!("{other:?}"),
        }
        members.push(member);
    }
    let mut epoch = confirmed.unwrap().epoch;
    let mut leader = 0;
    for round in 0..20 {
        let answer = within(
            clients[1 - leader]
                .0
                .clone()
                .hand_over(pb::HandOverRequest {
                    subscription_id: "told".into(),
                }),
        )
        .await
        .unwrap()
        .into_inner();
        match members[leader].frame().await {
            Frame::Standby(notice) => assert_eq!(notice.stepped_down_epoch, epoch, "round {round}"),
            other => panic!("round {round}: expected the step-down notice, got {other:?}"),
        }
        for client in &clients {
            assert_code(
                fenced(client, "jobs.late", "late", "told", epoch).await,
                Code::FailedPrecondition,
                "refused",
            );
        }
        leader = 1 - leader;
        let next = members[leader].confirmed().await;
        assert_eq!(next.epoch, answer.epoch, "round {round}");
        epoch = next.epoch;
    }
}
