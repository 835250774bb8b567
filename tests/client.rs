//! Black-box tests of `tinybroker::client` against a real server on a port-0 loopback listener,
//! plus two scheduler example processes failing over under SIGKILL, the worker example
//! stopped by Ctrl-C, and `tinybroker status`.

#[path = "client/close.rs"]
mod close;
#[path = "api/embedded.rs"]
#[allow(dead_code)]
mod deployment;
#[path = "api/harness.rs"]
#[allow(dead_code)]
mod harness;
#[path = "client/leadership.rs"]
mod leadership;
#[path = "client/scheduler.rs"]
mod scheduler;
#[path = "client/status.rs"]
mod status;
#[path = "client/surface.rs"]
mod surface;
#[path = "client/watch.rs"]
mod watch;
#[path = "client/worker.rs"]
mod worker;

use harness::{TestServer, within};
use tinybroker::{
    client::{AckMode, Client, Error, Event, Message, SubscriptionOptions},
    server::ServerConfig,
};

async fn connect(server: &TestServer) -> Client {
    within(Client::connect(format!("http://{}", server.addr)))
        .await
        .expect("connect")
}

async fn next_event(subscription: &mut tinybroker::client::Subscription) -> Event {
    within(subscription.next_event())
        .await
        .expect("stream ended")
        .expect("stream failed")
}

async fn next_delivery(
    subscription: &mut tinybroker::client::Subscription,
) -> tinybroker::client::Delivery {
    within(subscription.next_delivery())
        .await
        .expect("stream ended")
        .expect("stream failed")
}

// docs/semantics.md#stream-fence: an ack sent on the member's own stream releases the message and lets the next one
// flow through a window of 1.
#[tokio::test]
async fn acks_on_the_subscription_stream_release_messages_in_order() {
    let server = TestServer::start().await;
    let client = connect(&server).await;
    let mut jobs = client
        .subscribe(SubscriptionOptions::queue("mail", "mailers", ["jobs.>"]))
        .await
        .unwrap();
    let Event::Active { member_id, epoch } = next_event(&mut jobs).await else {
        panic!("the confirmation comes first");
    };
    assert_eq!((jobs.member_id(), jobs.epoch()), (member_id, epoch));
    let first = client
        .publish(Message::new("jobs.email", "one").header("k", "v"))
        .await
        .unwrap();
    assert_eq!(first.queued_for, 1);
    let batch = client
        .publish_batch([
            Message::new("jobs.email", "two"),
            Message::new("jobs.sms", "three"),
        ])
        .await
        .unwrap();
    assert_eq!(batch.len(), 2);

    let mut seen = Vec::new();
    for _ in 0..3 {
        let delivery = next_delivery(&mut jobs).await;
        assert_eq!(delivery.attempt, 1);
        assert_eq!(delivery.member_id, member_id);
        assert!(delivery.published_at.is_some());
        seen.push((delivery.system_id, delivery.payload.clone()));
        if delivery.system_id == first.system_id {
            assert_eq!(delivery.headers.get("k").map(String::as_str), Some("v"));
        }
        delivery.ack().unwrap();
    }
    assert_eq!(
        seen.iter().map(|s| s.0).collect::<Vec<_>>(),
        vec![first.system_id, batch[0].system_id, batch[1].system_id]
    );
    // The acks travelled on the stream; wait for the broker to count them.
    within(async {
        loop {
            let info = client.describe("mail").await.unwrap();
            if info.counters.acked == 3 && info.in_flight == 0 {
                break;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
}

// docs/semantics.md#nacks: a nack returns the message to the head of the queue with attempt + 1.
#[tokio::test]
async fn nack_on_the_stream_redelivers_with_the_next_attempt() {
    let server = TestServer::start().await;
    let client = connect(&server).await;
    let mut jobs = client
        .subscribe(SubscriptionOptions::queue("retry", "workers", ["jobs.*"]))
        .await
        .unwrap();
    let id = client
        .publish(Message::new("jobs.a", "x"))
        .await
        .unwrap()
        .system_id;
    let first = next_delivery(&mut jobs).await;
    assert_eq!((first.system_id, first.attempt), (id, 1));
    first.nack().unwrap();
    let again = next_delivery(&mut jobs).await;
    assert_eq!((again.system_id, again.attempt), (id, 2));
    again.ack().unwrap();
}

// docs/semantics.md#fencing fencing: a late unary ack from a member whose message was redelivered to another is
// refused as stale (FAILED_PRECONDITION), and an ack for nothing in flight is NOT_FOUND.
#[tokio::test]
async fn stale_and_unknown_acks_are_distinct_error_variants() {
    let server = TestServer::start().await;
    let client = connect(&server).await;
    let options = SubscriptionOptions::singleton("report", "replicas", ["jobs.*"]);
    let mut a = client.subscribe(options.clone()).await.unwrap();
    let Event::Active {
        member_id: a_id, ..
    } = next_event(&mut a).await
    else {
        panic!("a leads");
    };
    let mut b = client.subscribe(options).await.unwrap();
    let id = client
        .publish(Message::new("jobs.daily", "m"))
        .await
        .unwrap()
        .system_id;
    assert_eq!(next_delivery(&mut a).await.system_id, id);
    drop(a);
    let Event::Active { epoch, .. } = next_event(&mut b).await else {
        panic!("b is promoted");
    };
    let redelivered = next_delivery(&mut b).await;
    assert_eq!((redelivered.attempt, redelivered.epoch), (2, epoch));

    let stale = client.ack("report", id, Some(a_id)).await;
    assert!(
        matches!(stale, Err(Error::FailedPrecondition(_))),
        "{stale:?}"
    );
    let unknown = client.nack("report", id + 100, None).await;
    assert!(matches!(unknown, Err(Error::NotFound(_))), "{unknown:?}");
    redelivered.ack().unwrap();
}

// docs/semantics.md#topics-and-patterns, docs/semantics.md#subscriptions and docs/semantics.md#limits: refusals arrive as matchable variants, not strings.
#[tokio::test]
async fn refusals_map_to_error_variants() {
    let mut config = ServerConfig::default();
    config.limits.max_queue_messages = 1;
    let server = TestServer::with_config(config).await;
    let client = connect(&server).await;

    let bad_topic = client.publish(Message::new("no spaces", "x")).await;
    assert!(
        matches!(bad_topic, Err(Error::InvalidArgument(_))),
        "{bad_topic:?}"
    );
    let missing = client.describe("nobody").await;
    assert!(matches!(missing, Err(Error::NotFound(_))), "{missing:?}");

    let _queue = client
        .subscribe(SubscriptionOptions::queue("full", "g", ["full.*"]))
        .await
        .unwrap();
    client.publish(Message::new("full.a", "1")).await.unwrap();
    let over = client.publish(Message::new("full.a", "2")).await;
    assert!(
        matches!(&over, Err(Error::ResourceExhausted(m)) if m.contains("1")),
        "{over:?}"
    );

    let mismatch = client
        .subscribe(SubscriptionOptions::queue(
            "full",
            "other-group",
            ["full.*"],
        ))
        .await;
    assert!(
        matches!(mismatch, Err(Error::FailedPrecondition(_))),
        "{mismatch:?}"
    );
    let _b = client
        .subscribe(SubscriptionOptions::broadcast("fan", ["full.*"]))
        .await
        .unwrap();
    let taken = client
        .subscribe(SubscriptionOptions::broadcast("fan", ["full.*"]))
        .await;
    assert!(matches!(taken, Err(Error::AlreadyExists(_))), "{taken:?}");
}

// A broker that is not there is a transport error, not a hang.
#[tokio::test]
async fn connecting_to_nothing_is_a_transport_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let result = within(Client::connect(format!("http://{addr}"))).await;
    assert!(matches!(result, Err(Error::Transport(_))), "{result:?}");
    let bad = Client::connect("not a url").await;
    assert!(matches!(bad, Err(Error::InvalidArgument(_))), "{bad:?}");
}

// docs/semantics.md#carriages: the streaming publish answers every message in order; a refusal does not end it.
#[tokio::test]
async fn streaming_publisher_pipelines_and_answers_in_order() {
    let server = TestServer::start().await;
    let client = connect(&server).await;
    let _sink = client
        .subscribe(SubscriptionOptions::queue("sink", "g", ["load.>"]))
        .await
        .unwrap();
    let publisher = within(client.publisher()).await.unwrap();
    let mut pending = Vec::new();
    for n in 0..300 {
        let topic = if n == 150 { "bad topic" } else { "load.x" };
        pending.push(
            publisher
                .send(Message::new(topic, format!("{n}")))
                .await
                .unwrap(),
        );
    }
    let mut last = 0;
    for (n, answer) in pending.into_iter().enumerate() {
        let answer = within(answer).await;
        if n == 150 {
            assert!(
                matches!(answer, Err(Error::InvalidArgument(_))),
                "{answer:?}"
            );
        } else {
            let published = answer.unwrap();
            assert!(published.system_id > last, "answers come in publish order");
            assert_eq!(published.queued_for, 1);
            last = published.system_id;
        }
    }
    let one = within(publisher.publish(Message::new("load.y", "after"))).await;
    assert!(one.unwrap().system_id > last);
    // 299 accepted plus one more: one is in flight to the sink's window, the rest queued.
    let info = client.describe("sink").await.unwrap();
    assert_eq!(info.queued_messages + info.in_flight, 300);
}

// A publish stream the broker ends over one message too large to read: the messages before
// it are published and answered, it gets the size refusal, and those sent after it, which the
// broker never read, are told they were not published (UNAVAILABLE), not given its refusal.
#[tokio::test]
async fn a_stream_ended_by_an_oversized_message_tells_each_later_send_it_was_not_published() {
    let server = TestServer::start().await;
    let client = connect(&server).await;
    let _sink = client
        .subscribe(SubscriptionOptions::queue("oversink", "g", ["big.>"]))
        .await
        .unwrap();
    let publisher = within(client.publisher()).await.unwrap();
    // All six sent before any answer is read (a send after the stream ended fails at once, as
    // not published).
    let mut sent = Vec::new();
    for n in 0..6u8 {
        let payload = if n == 3 { vec![0; 3 << 20] } else { vec![n] };
        sent.push(publisher.send(Message::new("big.x", payload)).await);
    }
    let mut answers = Vec::new();
    for send in sent {
        answers.push(match send {
            Ok(pending) => within(pending).await,
            Err(error) => Err(error),
        });
    }
    for (n, answer) in answers.iter().enumerate() {
        match n {
            0..3 => assert!(answer.is_ok(), "{n}: {answer:?}"),
            3 => assert!(
                matches!(answer, Err(Error::ResourceExhausted(_))),
                "{answer:?}"
            ),
            _ => assert!(
                matches!(answer, Err(Error::Unavailable(_))),
                "{n}: {answer:?}"
            ),
        }
    }
    let info = client.describe("oversink").await.unwrap();
    assert_eq!(info.queued_messages + info.in_flight, 3);
}

// docs/semantics.md#ack-free: an ack-free subscription's deliveries need no ack; ack() is a no-op there.
#[tokio::test]
async fn ack_free_deliveries_need_no_ack() {
    let server = TestServer::start().await;
    let client = connect(&server).await;
    let mut feed = client
        .subscribe(SubscriptionOptions::broadcast("ticker", ["ticks.*"]).ack_mode(AckMode::None))
        .await
        .unwrap();
    let Event::Active { .. } = next_event(&mut feed).await else {
        panic!("confirmation first");
    };
    for n in 0..5 {
        client
            .publish(Message::new("ticks.a", format!("{n}")))
            .await
            .unwrap();
    }
    for n in 0..5 {
        let delivery = next_delivery(&mut feed).await;
        assert_eq!(delivery.payload, format!("{n}").into_bytes());
        delivery.ack().unwrap();
    }
    let info = client.describe("ticker").await.unwrap();
    assert_eq!(info.in_flight, 0);
}

// docs/semantics.md#singleton: two electors; the first leads, the second waits; when the leader resigns the
// second is promoted with a higher epoch.
#[tokio::test]
async fn standby_elector_takes_over_with_a_higher_epoch_when_the_leader_resigns() {
    let server = TestServer::start().await;
    let client = connect(&server).await;
    let first = within(client.elect("cron", "replicas")).await.unwrap();
    let other = client.clone();
    let second = tokio::spawn(async move { other.elect("cron", "replicas").await });
    within(async {
        while client.describe("cron").await.unwrap().members.len() < 2 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(!second.is_finished(), "a standby must not lead");
    assert!(!first.is_lost());
    let first_epoch = first.epoch();
    let first_lost = first.lost();
    first.resign();
    // The job racing `lost()` stops as soon as it steps down.
    assert_eq!(within(first_lost).await.epoch, first_epoch);
    let second = within(second).await.unwrap().unwrap();
    assert!(second.epoch() > first_epoch);
    assert_eq!(
        client.describe("cron").await.unwrap().active_member_id,
        Some(second.member_id())
    );
}

// docs/semantics.md#singleton: the leader learns it lost leadership the moment its stream ends (here: the broker
// shuts down), so its job can stop.
#[tokio::test]
async fn leadership_lost_resolves_when_the_broker_goes_away() {
    let server = TestServer::start().await;
    let client = connect(&server).await;
    let leader = within(client.elect("cron", "replicas")).await.unwrap();
    let lost = leader.lost();
    server.stop().await.unwrap();
    let lost = within(lost).await;
    assert_eq!(lost.epoch, leader.epoch());
    assert!(leader.is_lost());
}

// docs/semantics.md#api-surface use case "ordered consumption of a firehose": the leader receives the subscription's
// messages in publish order and acks them on its stream.
#[tokio::test]
async fn leader_consumes_the_firehose_in_order() {
    let server = TestServer::start().await;
    let client = connect(&server).await;
    let options =
        SubscriptionOptions::singleton("firehose", "readers", ["events.>"]).max_in_flight(8);
    let mut positions = Vec::new();
    let mut leader = within(client.elect_with(options.clone(), |_| {}))
        .await
        .unwrap();
    let other = client.clone();
    let (position_tx, mut position_rx) = tokio::sync::mpsc::unbounded_channel();
    let standby = tokio::spawn(async move {
        other
            .elect_with(options, move |p| {
                let _ = position_tx.send(p);
            })
            .await
    });
    positions.push(within(position_rx.recv()).await.unwrap());
    assert_eq!(positions, vec![1], "the standby is told it is next in line");
    let mut ids = Vec::new();
    for n in 0..20 {
        ids.push(
            client
                .publish(Message::new("events.click", format!("{n}")))
                .await
                .unwrap()
                .system_id,
        );
    }
    for id in ids {
        let delivery = within(leader.next_message()).await.unwrap();
        assert_eq!((delivery.system_id, delivery.epoch), (id, leader.epoch()));
        delivery.ack().unwrap();
    }
    drop(leader);
    let next = within(standby).await.unwrap().unwrap();
    assert!(next.epoch() > 1);
}

// docs/semantics.md#access: with a bearer token configured, a client without it is Unauthenticated and one with
// it gets through.
#[tokio::test]
async fn bearer_token_is_sent_on_every_call() {
    let config = ServerConfig {
        auth_token: Some("s3cret".into()),
        ..ServerConfig::default()
    };
    let server = TestServer::with_config(config).await;
    let url = format!("http://{}", server.addr);
    let anonymous = within(Client::connect(url.clone())).await.unwrap();
    let refused = anonymous.publish(Message::new("a.b", "x")).await;
    assert!(
        matches!(refused, Err(Error::Unauthenticated(_))),
        "{refused:?}"
    );
    let options = tinybroker::client::ClientOptions::default().token("s3cret");
    let client = within(Client::connect_with(url, options)).await.unwrap();
    client.publish(Message::new("a.b", "x")).await.unwrap();
    let mut sub = client
        .subscribe(SubscriptionOptions::broadcast("t", ["a.*"]))
        .await
        .unwrap();
    assert!(matches!(next_event(&mut sub).await, Event::Active { .. }));
}

// docs/semantics.md#shutdown (issue 17, item 7): an open `Publisher` does not hold shutdown for the drain timeout:
// the broker ends its stream with UNAVAILABLE at once, and the publisher reports it.
#[tokio::test]
async fn open_publisher_does_not_hold_shutdown_for_the_drain() {
    let drain = std::time::Duration::from_secs(30);
    let server = TestServer::with_config(ServerConfig {
        drain_timeout: drain,
        ..ServerConfig::default()
    })
    .await;
    let client = connect(&server).await;
    let publisher = within(client.publisher()).await.unwrap();
    within(publisher.publish(Message::new("jobs.streamed", "one")))
        .await
        .unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(5), server.stop())
        .await
        .unwrap_or_else(|_| panic!("shutdown waited out the {drain:?} drain for a Publisher"))
        .unwrap();
    let after = within(publisher.publish(Message::new("jobs.streamed", "two"))).await;
    assert!(matches!(after, Err(Error::Unavailable(_))), "{after:?}");
}

/// A broker on `listener` (a fresh one each time: nothing carries over from an earlier one on the
/// same address), with the sender that stops it and its task.
fn serve_on(
    listener: tokio::net::TcpListener,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), tinybroker::server::ServeError>>,
) {
    use tinybroker::server::{Server, tcp_incoming};
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(Server::new(ServerConfig::default()).run(
        tcp_incoming(listener),
        async {
            let _ = stopped.await;
        },
    ));
    (stop, task)
}

// Issue: "a standby that loses its connection rejoins the line with backoff". The broker goes
// away while a replica waits on standby; when a broker is back on the same address the replica
// rejoins on its own and, alone in line, leads.
#[tokio::test]
async fn standby_that_loses_the_broker_rejoins_and_leads_when_it_returns() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, task) = serve_on(listener);
    let url = format!("http://{addr}");
    let leader_client = within(Client::connect(url.clone())).await.unwrap();
    let leader = within(leader_client.elect("cron", "replicas"))
        .await
        .unwrap();
    let standby_client = within(Client::connect(url)).await.unwrap();
    let (position_tx, mut positions) = tokio::sync::mpsc::unbounded_channel();
    let standby = tokio::spawn(async move {
        let options = SubscriptionOptions::singleton("cron", "replicas", ["election.cron"]);
        standby_client
            .elect_with(options, move |p| {
                let _ = position_tx.send(p);
            })
            .await
    });
    assert_eq!(within(positions.recv()).await, Some(1));

    let _ = stop.send(());
    within(task).await.unwrap().unwrap();
    within(leader.lost()).await;
    assert!(!standby.is_finished(), "no broker, no leader");

    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let (_stop, _task) = serve_on(listener);
    let leadership = within(standby).await.unwrap().unwrap();
    // A new broker, yet never an epoch the old one handed out (docs/semantics.md#restart-identity).
    assert!(leadership.epoch() > leader.epoch());
}

// docs/semantics.md#restart-identity: epochs and system ids never repeat, also across broker restarts. A leader loses its
// leadership when the broker restarts; electing again on the new broker (same address, nothing
// carried over) gets an epoch strictly higher than any before, and messages get higher ids.
#[tokio::test]
async fn elect_after_a_broker_restart_gets_a_higher_epoch_and_higher_ids() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, task) = serve_on(listener);
    let client = within(Client::connect(format!("http://{addr}")))
        .await
        .unwrap();
    let first = within(client.elect("cron", "replicas")).await.unwrap();
    let published_before = client
        .publish(Message::new("election.cron", "before"))
        .await
        .unwrap();

    let _ = stop.send(());
    within(task).await.unwrap().unwrap();
    let lost = within(first.lost()).await;
    assert_eq!(lost.epoch, first.epoch());

    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let (_stop, _task) = serve_on(listener);
    let second = within(client.elect("cron", "replicas")).await.unwrap();
    assert!(
        second.epoch() > first.epoch(),
        "epoch {} after the restart, {} before",
        second.epoch(),
        first.epoch()
    );
    assert!(second.member_id() > first.member_id());
    let published_after = client
        .publish(Message::new("election.cron", "after"))
        .await
        .unwrap();
    assert!(
        published_after.system_id > published_before.system_id,
        "system id {} after the restart, {} before",
        published_after.system_id,
        published_before.system_id
    );
}
