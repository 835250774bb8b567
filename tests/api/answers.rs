//! Answers that once differed through gateways and must be the embedded broker's on both
//! deployments: overlapping patterns, `queued_for`, the codes of acks for what is not in
//! flight, headers carried exactly, and listing every subscription.

use std::collections::HashMap;

use tinybroker::pb::{self, DeliveryMode};
use tonic::Code;

use crate::harness::*;

fn windowed(request: pb::OpenSubscription, window: u32) -> pb::OpenSubscription {
    pb::OpenSubscription {
        max_in_flight: window,
        ..request
    }
}

// docs/semantics.md#topics-and-patterns, docs/semantics.md#cluster-patterns: a subscription's
// patterns may overlap (one covering another, two meeting, one given twice); each message any
// of them matches is delivered once, and one none matches is not delivered (through gateways
// the consumer's covering filter brings it, and the bridge acks it unseen: nothing stays
// pending for the subscription).
#[tokio::test]
async fn overlapping_patterns_deliver_each_matching_message_once() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let queue =
        |id: &str, patterns: &[&str]| windowed(open(id, DeliveryMode::Queue, "g", patterns), 10);
    let mut covering = client
        .subscribe(queue("covering", &["x.*.c", "x.>"]))
        .await
        .unwrap();
    let mut meeting = client
        .subscribe(queue("meeting", &["a.*.c", "a.b.*"]))
        .await
        .unwrap();
    let mut twice = client
        .subscribe(windowed(
            open("twice", DeliveryMode::Singleton, "g", &["t.u", "t.u"]),
            10,
        ))
        .await
        .unwrap();
    for member in [&mut covering, &mut meeting, &mut twice] {
        member.confirmed().await;
    }
    let mut ids = HashMap::new();
    for topic in ["x.b.c", "x.q", "a.b.c", "a.z.c", "a.b.z", "a.z.z", "t.u"] {
        let published = client.publish(topic, topic).await;
        let wanted = u32::from(topic != "a.z.z");
        assert_eq!(published.queued_for, wanted, "{topic}");
        ids.insert(topic, published.system_id);
    }
    // A marker after them: the next message each gets after its own proves none came twice
    // and that a.z.z (inside meeting's covering a.*.*) never came.
    let markers = [
        ("x.end", &mut covering),
        ("a.b.end", &mut meeting),
        ("t.u", &mut twice),
    ];
    let expected: [&[&str]; 3] = [&["x.b.c", "x.q"], &["a.b.c", "a.z.c", "a.b.z"], &["t.u"]];
    for ((marker, member), expected) in markers.into_iter().zip(expected) {
        let marker = client.publish(marker, marker).await.system_id;
        let mut got = Vec::new();
        for _ in 0..=expected.len() {
            let message = member.message().await;
            member.ack(message.system_id).await;
            got.push(message.system_id);
        }
        let mut want: Vec<u64> = expected.iter().map(|t| ids[t]).collect();
        want.push(marker);
        assert_eq!(got, want, "{}", member.id);
    }
    if GATEWAYS {
        // What no pattern matched was acked unseen: nothing left for JetStream to keep.
        let settled = |info: &pb::SubscriptionInfo| {
            info.upstream
                .as_ref()
                .is_some_and(|u| u.pending + u.unacked == 0)
        };
        within(async {
            while !settled(&client.describe("meeting").await.unwrap()) {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        })
        .await;
    }
}

// docs/semantics.md#cluster-durability: `queued_for` counts the subscriptions the message is
// kept for, whichever gateway their members joined at, each once: one confirmed on another
// gateway just before the publish included.
#[tokio::test]
async fn queued_for_counts_every_matching_subscription_wherever_it_was_joined() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let elsewhere = client.at_publishers();
    assert_eq!(client.publish("q.a", "none").await.queued_for, 0);
    let mut queue = client
        .subscribe(open("count-q", DeliveryMode::Queue, "g", &["q.*"]))
        .await
        .unwrap();
    queue.confirmed().await;
    assert_eq!(client.publish("q.a", "one").await.queued_for, 1);
    let mut broadcast = elsewhere
        .subscribe(open("count-b", DeliveryMode::Broadcast, "", &["q.>"]))
        .await
        .unwrap();
    broadcast.confirmed().await;
    assert_eq!(client.publish("q.a", "two").await.queued_for, 2);
    assert_eq!(client.publish("q.a.b", "deep").await.queued_for, 1);
    let mut singleton = client
        .subscribe(open(
            "count-s",
            DeliveryMode::Singleton,
            "g",
            &["q.a", "q.*"],
        ))
        .await
        .unwrap();
    singleton.confirmed().await;
    assert_eq!(client.publish("q.a", "three").await.queued_for, 3);
    let batch = pb::PublishBatchRequest {
        messages: ["q.a", "q.b.c", "z"]
            .iter()
            .map(|topic| pb::PublishRequest {
                topic: topic.to_string(),
                payload: Default::default(),
                headers: Default::default(),
                fence: None,
            })
            .collect(),
    };
    let results = within(client.1.clone().publish_batch(batch))
        .await
        .unwrap()
        .into_inner()
        .results;
    let counts: Vec<u32> = results.iter().map(|r| r.queued_for).collect();
    assert_eq!(counts, vec![3, 1, 0]);
}

// docs/semantics.md#acks, docs/semantics.md#cluster-acks: an ack for a subscription no
// deployment has, or for a message already acked, is NOT_FOUND, with the member's id and
// without (the two-field ack, over the member's own connection); one for another
// subscription's message too.
#[tokio::test]
async fn acks_for_nothing_in_flight_are_not_found_by_either_fence() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut a = client.subscribe(singleton("done")).await.unwrap();
    a.confirmed().await;
    let id = client.publish("jobs.a", "x").await.system_id;
    assert_eq!(a.message().await.system_id, id);
    for member in [a.member_id, 0] {
        assert_code(
            client.ack("nowhere", member, id).await,
            Code::NotFound,
            "nowhere",
        );
        assert_code(
            client.nack("nowhere", member, id).await,
            Code::NotFound,
            "nowhere",
        );
    }
    a.ack(id).await;
    for member in [a.member_id, 0] {
        assert_code(
            client.ack("done", member, id).await,
            Code::NotFound,
            "not in flight",
        );
        assert_code(
            client.nack("done", member, id).await,
            Code::NotFound,
            "not in flight",
        );
    }
    // Nothing changed: the next message flows to the member as before.
    let next = client.publish("jobs.a", "y").await.system_id;
    assert_eq!(a.message().await.system_id, next);
}

// docs/semantics.md#api-surface, docs/semantics.md#cluster-headers: headers arrive exactly as
// published: whitespace at either end, tabs, empty values, unicode, line breaks, names of any
// case or characters, names NATS reserves, and values and names that look like the escape a
// gateway uses.
#[tokio::test]
async fn headers_arrive_exactly_as_published() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut member = client
        .subscribe(windowed(
            open("headers", DeliveryMode::Queue, "g", &["h.*"]),
            10,
        ))
        .await
        .unwrap();
    member.confirmed().await;
    let headers: HashMap<String, String> = [
        ("k", " v "),
        ("t", "\tx\t"),
        ("empty", ""),
        ("unicode", "ünïcødé ✓"),
        ("Mixed-Case", "Kept"),
        ("mixed-case", "apart"),
        ("lines", "one\r\ntwo\n"),
        ("looks", "tb-escaped:%20"),
        ("tb-escaped-name", "x"),
        ("name with spaces", "ok"),
        ("colon:name", "ok"),
        ("naïve", "ok"),
        ("Nats-Msg-Id", "same"),
        ("tinybroker-gateway-dead-letter-of", "headers"),
        ("percent", "100%"),
        ("nbsp", "\u{a0}x\u{2003}"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let publish = |payload: &'static str| pb::PublishRequest {
        topic: "h.x".into(),
        payload: payload.into(),
        headers: headers.clone(),
        fence: None,
    };
    // Twice, with the same Nats-Msg-Id: JetStream would take the second for a duplicate if
    // the header reached it as NATS's own.
    let mut ids = Vec::new();
    for payload in ["first", "second"] {
        let published = within(client.1.clone().publish(publish(payload)))
            .await
            .unwrap()
            .into_inner();
        ids.push(published.system_id);
    }
    for id in ids {
        let message = member.message().await;
        assert_eq!(message.system_id, id);
        assert_eq!(message.headers, headers);
        member.ack(id).await;
    }
}

// docs/semantics.md#inspection, docs/semantics.md#cluster-inspection: ListSubscriptions lists
// every subscription, wherever its members joined, at every server, and Describe describes it.
#[tokio::test]
async fn list_shows_subscriptions_joined_anywhere() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let elsewhere = client.at_publishers();
    let mut here = client
        .subscribe(open("listed-here", DeliveryMode::Queue, "g", &["l.*"]))
        .await
        .unwrap();
    here.confirmed().await;
    let mut there = elsewhere
        .subscribe(singleton("listed-there"))
        .await
        .unwrap();
    there.confirmed().await;
    let mut fan = elsewhere
        .subscribe(open("listed-fan", DeliveryMode::Broadcast, "", &["l.>"]))
        .await
        .unwrap();
    fan.confirmed().await;
    let ids = |list: pb::ListSubscriptionsResponse| -> Vec<String> {
        list.subscriptions
            .into_iter()
            .map(|s| s.subscription_id)
            .collect()
    };
    let want = vec![
        "listed-fan".to_string(),
        "listed-here".to_string(),
        "listed-there".to_string(),
    ];
    assert_eq!(ids(client.list().await), want);
    assert_eq!(ids(client.publishers_list().await), want);
    let described = client.describe("listed-there").await.unwrap();
    assert_eq!(described.mode, i32::from(DeliveryMode::Singleton));
    assert_eq!(described.active_member_id, there.member_id);
    let described = client.describe("listed-fan").await.unwrap();
    assert_eq!(described.mode, i32::from(DeliveryMode::Broadcast));
    assert_eq!(described.topic_patterns, ["l.>"]);
}

/// Reads from `a` and `b` (two members of one QUEUE subscription) until every id of `want`
/// came, acking each; panics on one not wanted or one that came twice.
async fn drain_pair(a: &mut Member, b: &mut Member, want: &std::collections::BTreeSet<u64>) {
    let mut got = std::collections::BTreeSet::new();
    while got.len() < want.len() {
        let (message, at_a) = tokio::select! {
            m = a.message() => (m, true),
            m = b.message() => (m, false),
        };
        let id = message.system_id;
        assert!(
            want.contains(&id),
            "{}: {id} ({}) not wanted",
            a.id,
            message.topic
        );
        assert!(
            got.insert(id),
            "{}: {id} ({}) came twice",
            a.id,
            message.topic
        );
        if at_a {
            a.ack(id).await
        } else {
            b.ack(id).await
        }
    }
}

// docs/semantics.md#cluster-patterns: overlapping patterns of a QUEUE subscription whose
// members joined at two servers (through gateways, a covering filter shared by two bridges):
// each matching message once in the group, none that no pattern matches, nothing left
// pending upstream.
#[tokio::test]
async fn overlapping_patterns_of_a_queue_joined_at_two_servers_deliver_once() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let elsewhere = client.at_publishers();
    let queue =
        |id: &str, patterns: &[&str]| windowed(open(id, DeliveryMode::Queue, "g", patterns), 8);
    let every = ["a.>", "a.*", "*.b", ">"];
    let meeting = ["a.*", "*.b"];
    let mut all = Vec::new();
    let mut meet = Vec::new();
    for at in [&client, &elsewhere] {
        let mut member = at.subscribe(queue("every", &every)).await.unwrap();
        member.confirmed().await;
        all.push(member);
        let mut member = at.subscribe(queue("meet", &meeting)).await.unwrap();
        member.confirmed().await;
        meet.push(member);
    }
    let mut want_all = std::collections::BTreeSet::new();
    let mut want_meet = std::collections::BTreeSet::new();
    for round in 0..5 {
        for topic in ["a.b", "a.c", "c.b", "c.c", "a.b.c", "z"] {
            let published = client.publish(topic, &format!("{topic} {round}")).await;
            let meets = matches!(topic, "a.b" | "a.c" | "c.b");
            assert_eq!(published.queued_for, 1 + u32::from(meets), "{topic}");
            want_all.insert(published.system_id);
            if meets {
                want_meet.insert(published.system_id);
            }
        }
    }
    let (a, b) = all.split_at_mut(1);
    drain_pair(&mut a[0], &mut b[0], &want_all).await;
    let (a, b) = meet.split_at_mut(1);
    drain_pair(&mut a[0], &mut b[0], &want_meet).await;
    // Markers after them: anything delivered twice, or unwanted, comes before the last.
    let mut markers = std::collections::BTreeSet::new();
    for _ in 0..4 {
        markers.insert(client.publish("a.b", "marker").await.system_id);
    }
    let (a, b) = meet.split_at_mut(1);
    drain_pair(&mut a[0], &mut b[0], &markers).await;
    let (a, b) = all.split_at_mut(1);
    drain_pair(&mut a[0], &mut b[0], &markers).await;
    if GATEWAYS {
        let settled = |info: &pb::SubscriptionInfo| {
            info.upstream
                .as_ref()
                .is_some_and(|u| u.pending + u.unacked == 0)
        };
        within(async {
            for id in ["every", "meet"] {
                while !settled(&client.describe(id).await.unwrap()) {
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                }
            }
        })
        .await;
    }
}

// docs/semantics.md#cluster-headers: control characters, a byte-order mark, NEL and line
// separators, a lone marker, 64 headers, long names and values: each arrives exactly.
#[tokio::test]
async fn hostile_headers_arrive_exactly_as_published() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut member = client
        .subscribe(windowed(
            open("hostile", DeliveryMode::Queue, "g", &["h.*"]),
            10,
        ))
        .await
        .unwrap();
    member.confirmed().await;
    let mut headers: HashMap<String, String> = [
        ("nul", "\0"),
        ("inner-nul", "a\0b"),
        ("ctl", "\u{1}x\u{1f}"),
        ("del", "\u{7f}"),
        ("bom", "\u{feff}x\u{feff}"),
        ("nel", "\u{85}x"),
        ("ls", "x\u{2028}"),
        ("marker-only", "tb-escaped:"),
        ("tb-escaped-", "name is the marker"),
        ("TB-ESCAPED-41", "upper marker"),
        ("tb-escaped-%41", "escape lookalike"),
        (" ", " "),
        ("\t", "\t"),
        ("ünï:cødé\r\n", "😀"),
        ("spaces-only", "   "),
        ("colon-value", ": x :"),
        ("folded", "a\r\n b"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    headers.insert("long-name-".repeat(100), "v".into());
    headers.insert("long-value".into(), " é".repeat(500));
    while headers.len() < 64 {
        headers.insert(
            format!("n{}", headers.len()),
            format!(" {} ", headers.len()),
        );
    }
    let published = within(client.1.clone().publish(pb::PublishRequest {
        topic: "h.x".into(),
        payload: "p".into(),
        headers: headers.clone(),
        fence: None,
    }))
    .await
    .unwrap()
    .into_inner();
    let message = member.message().await;
    assert_eq!(message.system_id, published.system_id);
    let mut differ: Vec<_> = headers
        .iter()
        .filter(|(k, v)| message.headers.get(*k) != Some(*v))
        .map(|(k, v)| (k.clone(), v.clone(), message.headers.get(k).cloned()))
        .collect();
    differ.sort();
    assert!(differ.is_empty(), "changed: {differ:?}");
    assert_eq!(message.headers.len(), headers.len());
}

// docs/semantics.md#cluster-patterns, docs/semantics.md#singleton: a SINGLETON with window 8
// whose patterns meet (through gateways a covering filter whose extra messages the bridge acks
// unseen) gets the wanted messages in publish order, none unwanted, and each it nacks again
// with attempt 2, in order too.
#[tokio::test]
async fn a_windowed_singleton_with_meeting_patterns_keeps_order_under_nacks() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut member = client
        .subscribe(windowed(
            open("ordered", DeliveryMode::Singleton, "g", &["s.*.c", "s.b.*"]),
            8,
        ))
        .await
        .unwrap();
    member.confirmed().await;
    let mut wanted = Vec::new();
    for n in 0..24 {
        let topic = ["s.x.c", "s.x.y", "s.b.y"][n % 3];
        let published = client.at_publishers().publish(topic, &format!("{n}")).await;
        if topic != "s.x.y" {
            wanted.push(published.system_id);
        }
    }
    let mut first = Vec::new();
    let mut again = Vec::new();
    while again.len() < wanted.len() {
        let message = member.message().await;
        match message.delivery_attempt {
            1 => {
                first.push(message.system_id);
                member.nack(message.system_id).await;
            }
            2 => {
                again.push(message.system_id);
                member.ack(message.system_id).await;
            }
            attempt => panic!("{} came with attempt {attempt}", message.system_id),
        }
    }
    assert_eq!(first, wanted, "first deliveries");
    assert_eq!(again, wanted, "second deliveries");
}

// docs/cluster.md#durability: a listing says where what the broker confirms is kept. The
// embedded broker: this process's memory. Through gateways: the JetStream stream, file storage,
// its replicas and its consumer limit (the one `--nats-max-consumers` gave it).
#[tokio::test]
async fn a_listing_says_where_confirmed_messages_are_kept() {
    let server = TestServer::start().await;
    let storage = server
        .client()
        .await
        .list()
        .await
        .storage
        .expect("every listing carries its storage");
    if crate::deployment::GATEWAYS {
        assert_eq!(storage.kind, "jetstream", "{storage:?}");
        assert_eq!(storage.stream, "tinybroker", "{storage:?}");
        assert_eq!(storage.stream_storage, "file", "{storage:?}");
        assert!(storage.replicas >= 1, "{storage:?}");
        assert_eq!(
            storage.max_consumers,
            tinybroker::cluster::gateway::DEFAULT_MAX_CONSUMERS,
            "{storage:?}"
        );
    } else {
        assert_eq!(storage.kind, "memory", "{storage:?}");
        assert_eq!((storage.stream.as_str(), storage.replicas), ("", 0));
    }
}
