//! Bad input gets a clear status and changes nothing; limits are enforced and counted (docs/semantics.md#subscriptions and docs/semantics.md#bad-input).

use tinybroker::{
    core::Limits,
    pb::{self, DeliveryMode},
    server::ServerConfig,
};
use tonic::Code;

use crate::harness::*;

// docs/semantics.md#joining-rules "Validation": each malformed OpenSubscription gets INVALID_ARGUMENT naming the problem.
#[tokio::test]
async fn malformed_subscriptions_are_invalid_argument() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let base = || singleton("v");
    let cases: Vec<(pb::OpenSubscription, &str)> = vec![
        (
            pb::OpenSubscription {
                subscription_id: String::new(),
                ..base()
            },
            "subscription_id is required",
        ),
        (
            pb::OpenSubscription {
                topic_patterns: vec![],
                ..base()
            },
            "at least one pattern",
        ),
        (
            pb::OpenSubscription {
                topic_patterns: vec!["a.>.b".into()],
                ..base()
            },
            "last token",
        ),
        (
            pb::OpenSubscription {
                topic_patterns: vec!["a..b".into()],
                ..base()
            },
            "empty",
        ),
        (
            pb::OpenSubscription {
                mode: DeliveryMode::Unspecified.into(),
                ..base()
            },
            "mode is required",
        ),
        (
            pb::OpenSubscription { mode: 42, ..base() },
            "not a known DeliveryMode",
        ),
        (
            pb::OpenSubscription {
                consumer_group: String::new(),
                ..base()
            },
            "consumer_group is required",
        ),
        (
            pb::OpenSubscription {
                mode: DeliveryMode::Queue.into(),
                consumer_group: String::new(),
                ..base()
            },
            "consumer_group is required in QUEUE",
        ),
        (
            pb::OpenSubscription {
                dead_letter_topic: "a b".into(),
                ..base()
            },
            "dead_letter_topic",
        ),
        (
            pb::OpenSubscription {
                max_in_flight: 1_000_000,
                ..base()
            },
            "max_in_flight",
        ),
        (
            pb::OpenSubscription {
                mode: DeliveryMode::Queue.into(),
                notify_standby: true,
                ..base()
            },
            "notify_standby",
        ),
    ];
    for (request, needle) in cases {
        assert_code(
            client.subscribe(request).await.map(|_| ()),
            Code::InvalidArgument,
            needle,
        );
    }
    let list = client.list().await;
    assert!(
        list.subscriptions.is_empty(),
        "a rejected request creates nothing"
    );
}

// docs/semantics.md#joining-rules: joining a live subscription with different patterns, mode or group says what differs.
#[tokio::test]
async fn joining_with_different_settings_is_failed_precondition() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut a = client.subscribe(singleton("same")).await.unwrap();
    a.confirmed().await;
    let other_mode = pb::OpenSubscription {
        mode: DeliveryMode::Queue.into(),
        ..singleton("same")
    };
    assert_code(
        client.subscribe(other_mode).await.map(|_| ()),
        Code::FailedPrecondition,
        "mode is SINGLETON, request asks QUEUE",
    );
    let other_group = pb::OpenSubscription {
        consumer_group: "x".into(),
        ..singleton("same")
    };
    assert_code(
        client.subscribe(other_group).await.map(|_| ()),
        Code::FailedPrecondition,
        "consumer_group",
    );
    let other_patterns = pb::OpenSubscription {
        topic_patterns: vec!["x.*".into()],
        ..singleton("same")
    };
    assert_code(
        client.subscribe(other_patterns).await.map(|_| ()),
        Code::FailedPrecondition,
        "topic_patterns",
    );
    assert_eq!(client.describe("same").await.unwrap().members.len(), 1);
}

// docs/semantics.md#topics-and-patterns: invalid topics on publish are INVALID_ARGUMENT and publish nothing.
#[tokio::test]
async fn invalid_topics_are_invalid_argument() {
    let server = TestServer::start().await;
    let client = server.client().await;
    for (topic, needle) in [
        ("", "empty"),
        ("a..b", "empty"),
        ("a b", "whitespace"),
        ("a.*", "wildcard"),
    ] {
        assert_code(
            client.try_publish(topic, vec![]).await,
            Code::InvalidArgument,
            needle,
        );
    }
    let long = "a".repeat(300);
    assert_code(
        client.try_publish(&long, vec![]).await,
        Code::InvalidArgument,
        "limit",
    );
    assert_code(
        client.ack("", 0, 1).await,
        Code::InvalidArgument,
        "subscription_id",
    );
    assert_code(
        client.ack("s", 0, 0).await,
        Code::InvalidArgument,
        "system_id",
    );
    assert_code(
        client.describe("").await,
        Code::InvalidArgument,
        "subscription_id",
    );
    assert_code(client.describe("missing").await, Code::NotFound, "missing");
}

fn small_limits() -> ServerConfig {
    let limits = Limits {
        max_message_bytes: 1024,
        max_queue_messages: 3,
        max_subscriptions: 2,
        max_members_per_subscription: 2,
        max_batch_messages: 4,
        ..Limits::default()
    };
    ServerConfig {
        max_request_bytes: 4096,
        limits,
        ..ServerConfig::default()
    }
}

// docs/semantics.md#limits-table: a message over the maximum size is RESOURCE_EXHAUSTED naming the limit, also when it
// is over the transport's decode limit (tonic's own OUT_OF_RANGE is rewritten).
#[tokio::test]
async fn oversized_messages_are_resource_exhausted() {
    let server = TestServer::with_config(small_limits()).await;
    let client = server.client().await;
    assert_code(
        client.try_publish("big.one", vec![0; 2000]).await,
        Code::ResourceExhausted,
        "max_message_bytes limit of 1024",
    );
    assert_code(
        client.try_publish("big.one", vec![0; 10_000]).await,
        Code::ResourceExhausted,
        "max_request_bytes limit of 4096",
    );
    let batch = pb::PublishBatchRequest {
        messages: vec![
            pb::PublishRequest {
                topic: "a.b".into(),
                ..Default::default()
            };
            5
        ],
    };
    assert_code(
        within(client.1.clone().publish_batch(batch)).await,
        Code::ResourceExhausted,
        "max_batch_messages",
    );
    // The server is still fine.
    client.publish("big.one", "small").await;
}

// docs/semantics.md#overflow-policies: a full queue refuses publishes with RESOURCE_EXHAUSTED naming the subscription and
// limit; the publish is all-or-nothing (a matching subscription with room does not queue it
// either), and the refusal is counted.
// Through gateways the queue is in JetStream, bounded by the stream's limits for every
// subscription together, not per subscription (tests/cluster/limits.rs; README, cluster mode).
embedded_only! {
#[tokio::test]
async fn full_queue_rejects_publish_on_every_subscription_and_counts_it() {
    let server = TestServer::with_config(small_limits()).await;
    let client = server.client().await;
    // "roomy" is created first, so it is checked first and has room.
    let mut roomy = client.subscribe(singleton("roomy")).await.unwrap();
    roomy.confirmed().await;
    let mut wide = client
        .subscribe(open("wide", DeliveryMode::Broadcast, "", &["jobs.>"]))
        .await
        .unwrap();
    wide.confirmed().await;
    for n in 0..3 {
        // Matches only "wide" (jobs.* needs exactly two tokens).
        client.publish("jobs.deep.q", &n.to_string()).await;
    }
    assert_code(
        client.try_publish("jobs.q", b"4".to_vec()).await,
        Code::ResourceExhausted,
        "\"wide\" is full: max_queue_messages limit of 3",
    );
    let roomy_info = client.describe("roomy").await.unwrap();
    let counters = roomy_info.counters.unwrap();
    assert_eq!(
        (counters.enqueued, counters.rejected_full),
        (0, 0),
        "all or nothing"
    );
    let wide_info = client.describe("wide").await.unwrap();
    assert_eq!(wide_info.counters.unwrap().rejected_full, 1);
    assert_eq!(wide_info.queued_messages + wide_info.in_flight, 3);
    let list = client.list().await;
    assert_eq!(list.broker.unwrap().rejected_publishes, 1);
    // Acking makes room again; the same publish then reaches both.
    let w = wide.message().await;
    wide.ack(w.system_id).await;
    assert_eq!(client.publish("jobs.q", "5").await.queued_for, 2);
}
}

// docs/semantics.md#limits-table: headers count against the size limit and their number is bounded.
#[tokio::test]
async fn too_many_headers_are_refused() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let headers = (0..65).map(|i| (format!("h{i}"), String::new())).collect();
    let request = pb::PublishRequest {
        topic: "a.b".into(),
        payload: Default::default(),
        headers,
        fence: None,
    };
    assert_code(
        within(client.1.clone().publish(request)).await,
        Code::InvalidArgument,
        "headers",
    );
}

// docs/semantics.md#limits-table: bounded subscriptions and members per subscription.
#[tokio::test]
async fn subscription_and_member_limits_are_resource_exhausted() {
    let server = TestServer::with_config(small_limits()).await;
    let client = server.client().await;
    let _a1 = client.subscribe(singleton("one")).await.unwrap();
    let _a2 = client.subscribe(singleton("one")).await.unwrap();
    assert_code(
        client.subscribe(singleton("one")).await.map(|_| ()),
        Code::ResourceExhausted,
        "max_members",
    );
    let _b = client.subscribe(singleton("two")).await.unwrap();
    assert_code(
        client.subscribe(singleton("three")).await.map(|_| ()),
        Code::ResourceExhausted,
        "max_subscriptions",
    );
}
