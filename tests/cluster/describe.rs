//! `DescribeSubscription` through gateways: any gateway describes a QUEUE or SINGLETON
//! subscription, also one where it has no member, and every answer carries what JetStream holds
//! for it (`upstream`).

use tinybroker::pb::DeliveryMode;
use tonic::Code;

use crate::{
    assert_code,
    harness::{open, singleton},
    two_gateways,
};

// A singleton's member on gateway A holds one message (window 1) and two more wait in
// JetStream. Gateway B, where the subscription has no member, describes it from JetStream: its
// settings, the cluster's active member and epoch, and the backlog; gateway A describes its
// member and the same backlog. An id nobody uses is NOT_FOUND at both.
#[tokio::test]
async fn any_gateway_describes_a_singleton_with_its_jetstream_backlog() {
    let (_cluster, a, b) = two_gateways().await;
    let (on_a, on_b) = (a.client().await, b.client().await);
    let mut member = on_a.subscribe(singleton("report")).await.unwrap();
    let confirmed = member.confirmed().await;
    let first = on_b.publish("jobs.run", "1").await.system_id;
    on_b.publish("jobs.run", "2").await;
    on_b.publish("jobs.run", "3").await;
    assert_eq!(member.message().await.system_id, first);

    // The consumer's counts are its leader's, which may see a publish a moment after the
    // stream's leader confirmed it: await them.
    let elsewhere = crate::harness::within(async {
        loop {
            let info = on_b.describe("report").await.unwrap();
            if info
                .upstream
                .as_ref()
                .is_some_and(|u| u.pending + u.unacked == 3)
            {
                return info;
            }
        }
    })
    .await;
    assert_eq!(elsewhere.mode, i32::from(DeliveryMode::Singleton));
    assert_eq!(elsewhere.topic_patterns, ["jobs.*"]);
    assert!(elsewhere.members.is_empty(), "{elsewhere:?}");
    assert_eq!(
        (elsewhere.active_member_id, elsewhere.epoch),
        (confirmed.member_id, confirmed.epoch),
        "the cluster's line"
    );
    let upstream = elsewhere.upstream.expect("JetStream's backlog");
    assert!(upstream.consumer.starts_with("tb-q-"), "{upstream:?}");
    assert_eq!((upstream.pending, upstream.unacked), (2, 1), "{upstream:?}");

    let here = on_a.describe("report").await.unwrap();
    assert_eq!(here.members.len(), 1);
    assert_eq!(here.active_member_id, confirmed.member_id);
    assert_eq!(here.in_flight, 1);
    assert_eq!(here.upstream, Some(upstream));

    for client in [&on_a, &on_b] {
        assert_code(
            client.describe("nobody").await,
            Code::NotFound,
            "no member here and no JetStream consumer",
        );
    }
}

// A QUEUE subscription with its members on gateway A: B describes it too, with its group and
// its backlog, which falls to zero once the member acked everything.
#[tokio::test]
async fn any_gateway_describes_a_queue_and_its_backlog_drains() {
    let (_cluster, a, b) = two_gateways().await;
    let (on_a, on_b) = (a.client().await, b.client().await);
    let mut member = on_a
        .subscribe(open("work", DeliveryMode::Queue, "pool", &["work.>"]))
        .await
        .unwrap();
    member.confirmed().await;
    on_b.publish("work.a", "1").await;
    let m = member.message().await;
    let info = on_b.describe("work").await.unwrap();
    assert_eq!(
        (info.mode, info.consumer_group.as_str()),
        (i32::from(DeliveryMode::Queue), "pool")
    );
    assert_eq!(info.active_member_id, 0);
    let upstream = info.upstream.expect("JetStream's backlog");
    assert_eq!((upstream.pending, upstream.unacked), (0, 1), "{upstream:?}");
    member.ack(m.system_id).await;
    let drained = crate::harness::within(async {
        loop {
            let u = on_b.describe("work").await.unwrap().upstream.unwrap();
            if u.unacked == 0 {
                return u;
            }
        }
    })
    .await;
    assert_eq!(drained.pending, 0);
}

// A singleton's active member on gateway A and a standby on gateway B. Gateway C, where it has
// no member, names A's member as the cluster's active one (the first test); B, which holds a
// member of the same line, must not know less: its answer names the same active member and
// epoch, and lists its standby as not active.
#[tokio::test]
async fn a_standbys_gateway_names_the_clusters_active_member() {
    let (cluster, a, b) = two_gateways().await;
    let (on_a, on_b) = (a.client().await, b.client().await);
    let mut active = on_a.subscribe(singleton("lead")).await.unwrap();
    let confirmed = active.confirmed().await;
    let _standby = on_b.subscribe(singleton("lead")).await.unwrap();
    let url = &cluster.client_urls()[2];
    crate::harness::within(async {
        while crate::singleton::line(url, "lead").await.len() < 2 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let at_b = on_b.describe("lead").await.unwrap();
    assert_eq!(at_b.members.len(), 1, "{at_b:?}");
    assert!(!at_b.members[0].active, "{at_b:?}");
    assert_eq!(
        (at_b.active_member_id, at_b.epoch),
        (confirmed.member_id, confirmed.epoch),
        "the cluster's line, as a gateway with no member reports it: {at_b:?}"
    );
}

// Every NATS server down: the gateway with the member answers with its own view and no
// `upstream`, the one without says UNAVAILABLE, each within 5 s (the bound of the gateways'
// other requests to the servers). Before the fix each took the NATS client's default request
// timeout, 10 s: JetStream's API requests do not use the context's 5 s.
#[tokio::test]
async fn describe_with_every_nats_server_down_answers_within_a_bound() {
    let (mut cluster, a, b) = two_gateways().await;
    let (on_a, on_b) = (a.client().await, b.client().await);
    let mut member = on_a
        .subscribe(open("down", DeliveryMode::Queue, "pool", &["down.>"]))
        .await
        .unwrap();
    member.confirmed().await;
    for node in 0..cluster.len() {
        cluster.kill(node);
    }
    let bound = std::time::Duration::from_secs(5);
    let started = std::time::Instant::now();
    let here = tokio::time::timeout(bound, on_a.describe("down"))
        .await
        .expect("a gateway with a member answers within the bound")
        .unwrap();
    assert_eq!(here.members.len(), 1, "{here:?}");
    assert_eq!(here.upstream, None, "{here:?}");
    let elsewhere = tokio::time::timeout(bound, on_b.describe("down"))
        .await
        .expect("a gateway without a member answers within the bound");
    assert_code(elsewhere, Code::Unavailable, "JetStream did not answer");
    eprintln!("both answered in {:?}", started.elapsed());
}

// A consumer of the subscription's name that tinybroker did not make (no metadata): a join is
// refused naming it, so Describe must not claim that there is no JetStream consumer.
#[tokio::test]
async fn describe_of_a_consumer_without_metadata_names_it() {
    let (cluster, a, _b) = two_gateways().await;
    let js = async_nats::jetstream::new(
        async_nats::connect(&cluster.client_urls()[0])
            .await
            .unwrap(),
    );
    let stream = js.get_stream("tinybroker").await.unwrap();
    stream
        .create_consumer(async_nats::jetstream::consumer::pull::Config {
            durable_name: Some("tb-q-foreign".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let on_a = a.client().await;
    let joined = on_a
        .subscribe(open("foreign", DeliveryMode::Queue, "pool", &["f.>"]))
        .await;
    assert!(joined.is_err(), "a join is refused");
    let described = on_a.describe("foreign").await;
    assert_code(described, Code::FailedPrecondition, "tb-q-foreign");
}

// ListSubscriptions at a gateway lists what DescribeSubscription there describes: at gateway
// B, where none has a member, the QUEUE, SINGLETON and BROADCAST subscriptions whose members
// are on A (from their JetStream consumers, with the singleton's active member from the
// cluster's line); at A all three, each as A describes it. Pages follow the id order across
// both sources.
#[tokio::test]
async fn a_gateway_lists_what_it_can_describe_cluster_wide() {
    let (_cluster, a, b) = two_gateways().await;
    let (on_a, on_b) = (a.client().await, b.client().await);
    let mut queue = on_a
        .subscribe(open("b-work", DeliveryMode::Queue, "pool", &["work.>"]))
        .await
        .unwrap();
    queue.confirmed().await;
    let mut leader = on_a.subscribe(singleton("c-report")).await.unwrap();
    let confirmed = leader.confirmed().await;
    let mut fan = on_a
        .subscribe(open("a-fan", DeliveryMode::Broadcast, "", &["news.>"]))
        .await
        .unwrap();
    fan.confirmed().await;

    let ids = |list: &tinybroker::pb::ListSubscriptionsResponse| -> Vec<String> {
        list.subscriptions
            .iter()
            .map(|s| s.subscription_id.clone())
            .collect()
    };
    let at_b = on_b.list().await;
    assert_eq!(ids(&at_b), ["a-fan", "b-work", "c-report"], "{at_b:?}");
    for listed in &at_b.subscriptions {
        assert!(listed.members.is_empty(), "no member at B: {listed:?}");
        assert!(listed.upstream.is_some(), "with its consumer: {listed:?}");
        let described = on_b.describe(&listed.subscription_id).await.unwrap();
        assert_eq!(
            (described.mode, &described.topic_patterns),
            (listed.mode, &listed.topic_patterns)
        );
    }
    assert_eq!(
        (
            at_b.subscriptions[2].active_member_id,
            at_b.subscriptions[2].epoch
        ),
        (confirmed.member_id, confirmed.epoch),
        "the cluster's line"
    );

    let at_a = on_a.list().await;
    assert_eq!(ids(&at_a), ["a-fan", "b-work", "c-report"], "{at_a:?}");
    assert!(at_a.subscriptions.iter().all(|s| s.members.len() == 1));
    assert!(
        at_a.subscriptions.iter().all(|s| s.upstream.is_some()),
        "each with its consumer: {at_a:?}"
    );

    let first = on_b.list_page(2, "").await.unwrap();
    assert_eq!(
        (ids(&first), first.next_page_token.as_str()),
        (vec!["a-fan".to_string(), "b-work".to_string()], "b-work")
    );
    let second = on_b.list_page(2, &first.next_page_token).await.unwrap();
    assert_eq!(
        (ids(&second), second.next_page_token.as_str()),
        (vec!["c-report".to_string()], "")
    );
}

// docs/semantics.md#cluster-inspection: a member's position is its place in the cluster's line,
// as its standby notice counts it. Two standbys at gateway B behind the leader at gateway A are
// described at 1 and 2, the numbers their notices carried (before: 0 and 1, counted in B's own
// part of the line).
#[tokio::test]
async fn a_standbys_position_is_its_place_in_the_clusters_line() {
    use tinybroker::pb::subscription_frame::Frame;
    let (_cluster, a, b) = two_gateways().await;
    let (on_a, on_b) = (a.client().await, b.client().await);
    let mut leader = on_a.subscribe(singleton("placed")).await.unwrap();
    let confirmed = leader.confirmed().await;
    let waiting = || tinybroker::pb::OpenSubscription {
        notify_standby: true,
        ..singleton("placed")
    };
    let mut notices = Vec::new();
    let mut standbys = Vec::new();
    for _ in 0..2 {
        let mut standby = on_b.subscribe(waiting()).await.unwrap();
        match standby.frame().await {
            Frame::Standby(notice) => notices.push(notice.position),
            other => panic!("expected a standby notice, got {other:?}"),
        }
        standbys.push(standby);
    }
    assert_eq!(notices, vec![1, 2]);
    let described = on_b.describe("placed").await.unwrap();
    let mut positions: Vec<u32> = described.members.iter().map(|m| m.position).collect();
    positions.sort_unstable();
    assert_eq!(positions, notices, "{described:?}");
    assert_eq!(described.active_member_id, confirmed.member_id);
    let at_a = on_a.describe("placed").await.unwrap();
    assert_eq!(
        at_a.members
            .iter()
            .map(|m| (m.member_id, m.position, m.active))
            .collect::<Vec<_>>(),
        vec![(confirmed.member_id, 0, true)]
    );
}
