//! Cluster mode (docs/semantics.md#cluster-mode, step 2 of issue 14) against real nats-server processes: two gateways
//! over a three-node JetStream cluster, subscribers on one gateway and publishers on the other.
//! Every wait is for an event, bounded by the API harness's `within`.

/// The API suite's tests of what only the embedded broker offers: left out here.
macro_rules! embedded_only {
    ($($item:item)*) => {};
}

#[allow(dead_code, unused_macros)]
#[macro_use]
#[path = "../api/harness.rs"]
mod harness;

#[allow(dead_code)]
#[path = "../api/binary.rs"]
mod binary;

#[allow(dead_code)]
#[path = "../api/certs.rs"]
mod certs;

#[path = "../support/nats.rs"]
mod nats_server;

mod ack_free;
mod ahead;
mod api;
mod batch_faults;
mod batches;
mod bench;
mod delete;
mod describe;
mod faults;
mod fence;
mod handover;
mod identity;
mod leadership;
mod lease;
mod limits;
mod node_faults;
mod registry;
mod secured;
mod singleton;
mod singleton_acks;
mod thaw_settles;

/// The API suite's deployment here: two gateways over a fresh three-node NATS cluster,
/// subscribers on the first, publishers (and unary acks, forwarded) on the second.
mod deployment {
    use tinybroker::{cluster::gateway::GatewayConfig, server::ServerConfig};

    use crate::{harness::TestServer, nats_server::NatsCluster};

    /// Whether the suite runs against cluster-mode gateways.
    pub const GATEWAYS: bool = true;

    pub async fn start(config: ServerConfig) -> TestServer {
        let cluster = NatsCluster::start(3).await;
        let urls = cluster.client_urls();
        let clock = config.clock.clone();
        let subscribers =
            crate::serve_gateway(config.clone(), GatewayConfig::new(&urls[0]), clock.clone()).await;
        let publishers = crate::serve_gateway(config, GatewayConfig::new(&urls[1]), clock).await;
        subscribers.paired(publishers, Box::new(cluster))
    }
}

use std::{
    collections::BTreeSet,
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    sync::Arc,
    time::Duration,
};

use harness::{Carriage, Member, TestServer, assert_code, open, within};
use nats_server::NatsCluster;
use tinybroker::{
    backend::Backend,
    clock::{Clock, TokioClock},
    cluster::gateway::{self, Gateway, GatewayConfig},
    pb::DeliveryMode,
    server::{Server, ServerConfig},
};
use tonic::Code;

/// A gateway on `url`, serving on a port-0 loopback listener, as `serve --nats` builds it.
pub(crate) async fn gateway(url: &str) -> TestServer {
    gateway_with(GatewayConfig::new(url), Arc::new(TokioClock::new())).await
}

/// A gateway with these settings, its broker reading time from `clock`.
pub(crate) async fn gateway_with(config: GatewayConfig, clock: Arc<dyn Clock>) -> TestServer {
    serve_gateway(ServerConfig::default(), config, clock).await
}

/// A gateway serving the API with `server`'s settings, as `serve --nats` builds it.
pub(crate) async fn serve_gateway(
    server: ServerConfig,
    config: GatewayConfig,
    clock: Arc<dyn Clock>,
) -> TestServer {
    let gateway = Gateway::connect(config, server.limits.clone(), clock)
        .await
        .expect("gateway connects");
    // Stopped as `tinybroker serve` stops it: the bridges give back what they hold.
    let closing = gateway.clone();
    TestServer::run_then(
        Server::with_backend(server, Backend::Gateway(gateway)),
        async move { closing.close(Duration::from_secs(2)).await },
    )
    .await
}

/// A three-node cluster and two gateways on different nodes.
pub(crate) async fn two_gateways() -> (NatsCluster, TestServer, TestServer) {
    let cluster = NatsCluster::start(3).await;
    let urls = cluster.client_urls();
    let a = gateway(&urls[0]).await;
    let b = gateway(&urls[1]).await;
    (cluster, a, b)
}

fn queue(id: &str, window: u32) -> tinybroker::pb::OpenSubscription {
    let mut request = open(id, DeliveryMode::Queue, "workers", &["orders.*"]);
    request.max_in_flight = window;
    request
}

/// How many messages JetStream still waits on an ack for, on a subscription's consumer.
async fn ack_pending(url: &str, subscription: &str) -> u64 {
    let client = async_nats::connect(url).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let stream = js.get_stream("tinybroker").await.unwrap();
    let name = gateway::wire::names::consumer_name(tinybroker::core::Mode::Queue, subscription, "");
    let info = stream.consumer_info(&name).await.unwrap();
    info.num_ack_pending as u64
}

// A publish on gateway B is confirmed by JetStream and consumed by a QUEUE member on gateway A;
// a nack redelivers it with attempt + 1; acks are applied in JetStream (nothing is left pending
// and nothing comes again), also an ack sent to the other gateway with the member's id.
#[tokio::test]
async fn queue_across_gateways_publish_consume_nack_ack() {
    let (cluster, a, b) = two_gateways().await;
    let (on_a, on_b) = (a.client().await, b.client().await);
    let mut member = on_a.subscribe(queue("orders", 1)).await.unwrap();
    member.confirmed().await;

    let first = on_b.publish("orders.new", "one").await;
    assert!(first.system_id > 0, "confirmed with the stream sequence");
    let got = member.message().await;
    assert_eq!(
        (
            got.system_id,
            got.topic.as_str(),
            &got.payload[..],
            got.delivery_attempt
        ),
        (first.system_id, "orders.new", &b"one"[..], 1)
    );
    member.nack(got.system_id).await;
    let again = member.message().await;
    assert_eq!(
        (again.system_id, again.delivery_attempt),
        (first.system_id, 2)
    );
    member.ack(again.system_id).await;

    let second = on_b.publish("orders.new", "two").await;
    let got = member.message().await;
    assert_eq!(
        got.system_id, second.system_id,
        "the acked one did not come again"
    );
    // Acked through the gateway that does not hold the member: forwarded to the one that does.
    on_b.ack("orders", member.member_id, got.system_id)
        .await
        .unwrap();
    let third = on_b.publish("orders.new", "three").await;
    let got = member.message().await;
    assert_eq!(got.system_id, third.system_id);
    member.ack(got.system_id).await;
    let url = &cluster.client_urls()[2];
    within(async {
        while ack_pending(url, "orders").await != 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    // A repeated forwarded ack is refused by the holder, as at home; so is one naming a member
    // id the holder never handed out. One whose gateway is gone (no gateway listens on its
    // id's route) is stale, answered once no gateway answered on the route within the forward
    // timeout.
    assert_code(
        on_b.ack("orders", member.member_id, got.system_id).await,
        Code::NotFound,
        "not in flight",
    );
    assert_code(
        on_b.ack("orders", member.member_id + 1000, got.system_id)
            .await,
        Code::NotFound,
        "not in flight",
    );
    assert_code(
        on_b.ack("orders", member.member_id ^ (1 << 62), got.system_id)
            .await,
        Code::FailedPrecondition,
        "the gateway that admitted it is gone",
    );
}

// A forwarded ack that finds no responders is sent again until the forward timeout, not
// answered "gone" at once: "no responders" is only what the forwarding gateway's NATS server
// knows, and a subscription made on another server reaches it over the cluster's routes, later
// (a route lost in the race of two servers dialling each other came back a second later, and
// meanwhile an ack for a live member was answered stale). A test cannot hold back a route, so
// the holder here answers its first request as such a server does (status 503, no responders)
// and the second as the member's gateway; the ack must get the second answer.
#[tokio::test]
async fn a_forwarded_ack_that_found_no_responders_is_sent_again() {
    let cluster = NatsCluster::start(1).await;
    let url = &cluster.client_urls()[0];
    let b = gateway(url).await;
    let on_b = b.client().await;
    // A member id on a route no gateway has (gateways' routes are below 2^25).
    let member = (1u64 << 62) | 7;
    let (holder, mut requests) = stand_in_holder(url, member).await;
    let mut ack = tokio::spawn(async move { on_b.ack("orders", member, 42).await });
    let first = tokio::select! {
        answered = &mut ack => panic!("answered before the holder was asked: {answered:?}"),
        first = within(tokio_stream::StreamExt::next(&mut requests)) => first.unwrap(),
    };
    answer_no_responders(url, first.reply.unwrap().as_str()).await;
    let second = tokio::select! {
        answered = &mut ack => panic!("answered without asking again: {answered:?}"),
        second = within(tokio_stream::StreamExt::next(&mut requests)) => second.unwrap(),
    };
    assert_eq!(second.payload, first.payload, "the same settle");
    answer_not_in_flight(&holder, second.reply.unwrap(), 42).await;
    assert_code(
        within(ack).await.unwrap(),
        Code::NotFound,
        "the holder's answer",
    );
}

// A route found gone (no gateway answered on it for the whole forward timeout) gets one try
// per settle after that, and stale at once if that try finds no responders too: the acks for
// a dead gateway's members (a client retrying them, or acking a batch) no longer each hold a
// stream of their connection for the timeout. A route that answers again is forgotten.
#[tokio::test]
async fn a_route_found_gone_gets_one_try_until_it_answers_again() {
    let cluster = NatsCluster::start(1).await;
    let url = &cluster.client_urls()[0];
    let timeout = Duration::from_secs(4);
    let b = gateway_with(
        GatewayConfig {
            forward_timeout: timeout,
            ..GatewayConfig::new(url)
        },
        Arc::new(TokioClock::new()),
    )
    .await;
    let on_b = b.client().await;
    // The subscription exists (an ack for one no gateway has is NOT_FOUND before any route
    // matters); its member here is not the one the acks name.
    let mut orders = on_b.subscribe(queue("orders", 1)).await.unwrap();
    orders.confirmed().await;
    let member = (1u64 << 62) | 7;
    let gone = "the gateway that admitted it is gone";
    let started = std::time::Instant::now();
    assert_code(
        on_b.ack("orders", member, 42).await,
        Code::FailedPrecondition,
        gone,
    );
    let first = started.elapsed();
    assert!(first >= timeout / 2, "retried for the timeout: {first:?}");
    // Another member of the same route (the same gateway incarnation), a nack this time.
    let started = std::time::Instant::now();
    assert_code(
        on_b.nack("orders", member + 1, 43).await,
        Code::FailedPrecondition,
        gone,
    );
    let again = started.elapsed();
    assert!(
        again < timeout / 2,
        "a known-gone route is tried once, not for {timeout:?}: took {again:?}"
    );
    // The route answers again (a NATS route down for longer than the timeout came back): the
    // settle reaches it, and its answer is the ack's.
    let (holder, mut requests) = stand_in_holder(url, member).await;
    let ack = tokio::spawn(async move {
        let answered = on_b.ack("orders", member, 44).await;
        (on_b, answered)
    });
    let request = within(tokio_stream::StreamExt::next(&mut requests))
        .await
        .unwrap();
    answer_not_in_flight(&holder, request.reply.unwrap(), 44).await;
    let (on_b, answered) = within(ack).await.unwrap();
    assert_code(answered, Code::NotFound, "the holder's answer");
    // Forgotten: once the holder is gone again, a settle is retried for the timeout again.
    requests.unsubscribe().await.unwrap();
    // The server dropped the subscription once a message sent after the unsubscription comes
    // back through another (the connection's operations are applied in order; `flush` only
    // writes to the socket).
    let mut echo = holder.subscribe("echo.unsubscribed").await.unwrap();
    holder
        .publish("echo.unsubscribed", "after".into())
        .await
        .unwrap();
    within(tokio_stream::StreamExt::next(&mut echo))
        .await
        .unwrap();
    let started = std::time::Instant::now();
    assert_code(
        on_b.ack("orders", member, 45).await,
        Code::FailedPrecondition,
        gone,
    );
    assert!(
        started.elapsed() >= timeout / 2,
        "retried for the timeout once answered: {:?}",
        started.elapsed()
    );
}

/// A NATS client standing in for the gateway that admitted `member`: subscribed to its
/// route's settles, and returned once the server has the subscription (a message sent after
/// it came back through it; `flush` only writes to the socket).
async fn stand_in_holder(url: &str, member: u64) -> (async_nats::Client, async_nats::Subscriber) {
    let holder = async_nats::connect(url).await.unwrap();
    let route = member >> tinybroker::broker::GATEWAY_ROUTE_SHIFT;
    let subject = format!("_tinybroker.tinybroker.settle.{route}");
    let mut requests = holder.subscribe(subject.clone()).await.unwrap();
    holder.publish(subject, "subscribed".into()).await.unwrap();
    let echo = within(tokio_stream::StreamExt::next(&mut requests)).await;
    assert_eq!(echo.unwrap().payload, "subscribed");
    (holder, requests)
}

/// Answers a forwarded settle as its holder would for a message not in flight.
async fn answer_not_in_flight(holder: &async_nats::Client, reply: async_nats::Subject, id: u64) {
    let answer =
        format!(r#"{{"code":5,"message":"message {id} is not in flight (the holder's answer)"}}"#);
    holder.publish(reply, answer.into()).await.unwrap();
    holder.flush().await.unwrap();
}

/// Answers `reply` as a NATS server answers a request nobody is subscribed to: a message with
/// status 503 and no payload (a client cannot set a status through async-nats, so this speaks
/// the protocol itself).
async fn answer_no_responders(url: &str, reply: &str) {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let address = url.trim_start_matches("nats://");
    let mut connection =
        tokio::io::BufStream::new(tokio::net::TcpStream::connect(address).await.unwrap());
    let mut line = String::new();
    connection.read_line(&mut line).await.unwrap();
    assert!(line.starts_with("INFO "), "{line}");
    let status = "NATS/1.0 503\r\n\r\n";
    let frame = format!(
        "CONNECT {{\"verbose\":false,\"headers\":true,\"no_responders\":true,\"protocol\":1}}\r\nHPUB {reply} {len} {len}\r\n{status}\r\nPING\r\n",
        len = status.len()
    );
    connection.write_all(frame.as_bytes()).await.unwrap();
    connection.flush().await.unwrap();
    // PONG once the server has taken the publish (anything else would be an -ERR).
    line.clear();
    within(connection.read_line(&mut line)).await.unwrap();
    assert_eq!(line.trim_end(), "PONG");
}

/// The next message on either member, with the index of the member that got it.
async fn next_of(members: &mut [Member; 2]) -> (usize, tinybroker::pb::DeliveredMessage) {
    let [x, y] = members;
    tokio::select! {
        m = x.message() => (0, m),
        m = y.message() => (1, m),
    }
}

// QUEUE with a member on each gateway: every message reaches exactly one member, all arrive,
// and both gateways take part; a join elsewhere with other settings is refused, saying what
// differs.
#[tokio::test]
async fn queue_members_on_both_gateways_share_the_messages() {
    let (_cluster, a, b) = two_gateways().await;
    let (on_a, on_b) = (a.client().await, b.client().await);
    let mut members = [
        on_a.subscribe(queue("shared", 1)).await.unwrap(),
        on_b.subscribe_via(Carriage::Stream, queue("shared", 1))
            .await
            .unwrap(),
    ];
    for member in &mut members {
        member.confirmed().await;
    }
    let mut other = queue("shared", 1);
    other.topic_patterns = vec!["other.*".into()];
    assert_code(
        on_b.subscribe(other).await.map(|_| ()),
        Code::FailedPrecondition,
        "topic_patterns",
    );

    let mut published = BTreeSet::new();
    for i in 0..12 {
        published.insert(on_b.publish("orders.x", &format!("m{i}")).await.system_id);
    }
    // Windows of 1: until one acks, each holds one, so both gateways must have pulled.
    let (first, m1) = next_of(&mut members).await;
    let (second, m2) = next_of(&mut members).await;
    assert_ne!(first, second, "each gateway's member holds one");
    let mut got = vec![(first, m1.system_id), (second, m2.system_id)];
    members[first].ack(m1.system_id).await;
    members[second].ack(m2.system_id).await;
    while got.len() < published.len() {
        let (who, message) = next_of(&mut members).await;
        got.push((who, message.system_id));
        members[who].ack(message.system_id).await;
    }
    let ids: BTreeSet<u64> = got.iter().map(|(_, id)| *id).collect();
    assert_eq!(
        ids.len(),
        got.len(),
        "no message reached two members: {got:?}"
    );
    assert_eq!(ids, published);
}

// BROADCAST: every member on both gateways gets every message, in publish order, over both
// carriages and ack-free.
#[tokio::test]
async fn broadcast_members_on_both_gateways_get_every_message() {
    let (_cluster, a, b) = two_gateways().await;
    let (on_a, on_b) = (a.client().await, b.client().await);
    let broadcast = |id: &str| {
        let mut request = open(id, DeliveryMode::Broadcast, "", &["news.>"]);
        request.max_in_flight = 16;
        request
    };
    let mut ack_free = broadcast("feed-b2");
    ack_free.ack_mode = tinybroker::pb::AckMode::None.into();
    let mut members = vec![
        on_a.subscribe(broadcast("feed-a1")).await.unwrap(),
        on_a.subscribe_via(Carriage::Stream, broadcast("feed-a2"))
            .await
            .unwrap(),
        on_b.subscribe(broadcast("feed-b1")).await.unwrap(),
        on_b.subscribe(ack_free).await.unwrap(),
    ];
    for member in &mut members {
        member.confirmed().await;
    }
    let mut published = Vec::new();
    for i in 0..5 {
        published.push(on_a.publish("news.today", &format!("n{i}")).await.system_id);
    }
    for member in &mut members {
        let mut seen = Vec::new();
        for _ in 0..published.len() {
            let message = member.message().await;
            seen.push(message.system_id);
            if member.id != "feed-b2" {
                member.ack(message.system_id).await;
            }
        }
        assert_eq!(seen, published, "{}", member.id);
    }
}

// A member whose stream closes with an unacked message: the message goes to a member on the
// other gateway, with attempt 2.
#[tokio::test]
async fn unacked_message_of_a_closed_member_goes_to_another_gateway() {
    let (_cluster, a, b) = two_gateways().await;
    let (on_a, on_b) = (a.client().await, b.client().await);
    let mut leaving = on_a.subscribe(queue("handover", 1)).await.unwrap();
    leaving.confirmed().await;
    let published = on_b.publish("orders.held", "x").await.system_id;
    assert_eq!(leaving.message().await.system_id, published);
    let mut staying = on_b.subscribe(queue("handover", 1)).await.unwrap();
    staying.confirmed().await;
    drop(leaving);
    let got = staying.message().await;
    assert_eq!((got.system_id, got.delivery_attempt), (published, 2));
    staying.ack(got.system_id).await;
}

// A PublishBatch through a gateway is stored in order, every message confirmed with its own
// stream sequence, and delivered in that order (the gateway sends the whole batch, then
// awaits the confirmations in order).
#[tokio::test]
async fn a_batch_through_a_gateway_is_stored_and_delivered_in_order() {
    let (_cluster, a, b) = two_gateways().await;
    let (on_a, on_b) = (a.client().await, b.client().await);
    let mut member = on_a.subscribe(queue("orders", 64)).await.unwrap();
    member.confirmed().await;
    let batch = tinybroker::pb::PublishBatchRequest {
        messages: (0..500)
            .map(|n| tinybroker::pb::PublishRequest {
                topic: "orders.new".into(),
                payload: format!("{n}").into_bytes().into(),
                headers: Default::default(),
                fence: None,
            })
            .collect(),
    };
    let results = within(on_b.1.clone().publish_batch(batch))
        .await
        .unwrap()
        .into_inner()
        .results;
    let ids: Vec<u64> = results.iter().map(|r| r.system_id).collect();
    assert_eq!(ids.len(), 500);
    assert!(ids.windows(2).all(|w| w[1] == w[0] + 1), "{ids:?}");
    for (n, id) in ids.iter().enumerate() {
        let got = member.message().await;
        assert_eq!(
            (got.system_id, got.payload),
            (*id, format!("{n}").into_bytes().into())
        );
        member.ack(got.system_id).await;
    }
}

// A subscription's settings are the same at every gateway: a join at another gateway naming
// another dead-letter topic or max_delivery_attempts is refused, saying what differs (the
// consumer's metadata records them).
#[tokio::test]
async fn a_join_elsewhere_with_other_dead_letter_settings_is_refused() {
    let cluster = NatsCluster::start(1).await;
    let url = &cluster.client_urls()[0];
    let (a, b) = (gateway(url).await, gateway(url).await);
    let (on_a, on_b) = (a.client().await, b.client().await);
    let mut first = queue("poison", 1);
    first.dead_letter_topic = "dead.orders".into();
    first.max_delivery_attempts = 3;
    let mut member = on_a.subscribe(first.clone()).await.unwrap();
    member.confirmed().await;
    for carriage in [Carriage::Unary, Carriage::Stream] {
        let mut other = first.clone();
        other.dead_letter_topic = "dead.other".into();
        assert_code(
            on_b.subscribe_via(carriage, other).await.map(|_| ()),
            Code::FailedPrecondition,
            "dead_letter_topic is \"dead.orders\", request asks \"dead.other\"",
        );
    }
    let mut other = first.clone();
    other.max_delivery_attempts = 4;
    assert_code(
        on_b.subscribe(other).await.map(|_| ()),
        Code::FailedPrecondition,
        "max_delivery_attempts is 3, request asks 4",
    );
    let mut same = on_b.subscribe(first).await.unwrap();
    same.confirmed().await;
}

// The binary: `serve --nats URL` logs what it connected to, and the CLI's subscribe and
// publish work through it.
#[tokio::test]
async fn serve_with_nats_runs_the_cli_through_jetstream() {
    let cluster = NatsCluster::start(3).await;
    let url = cluster.client_urls()[0].clone();
    let (mut gateway, addr) = binary::serve(&["--nats", &url]).await;
    let line = gateway.line_with("cluster mode").await;
    assert!(line.contains("connected to"), "{line}");
    let server = format!("http://{addr}");
    let mut subscriber = Command::new(env!("CARGO_BIN_EXE_tinybroker"))
        .args(["subscribe", "--server", &server])
        .args(["--id", "cli", "--mode", "queue", "--group", "g", "jobs.*"])
        .env_remove("TINYBROKER_AUTH_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = subscriber.stdout.take().unwrap();
    let (tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut next_line = async || within(lines.recv()).await.expect("subscriber output ended");
    while !next_line().await.starts_with("confirmed") {}
    let output = binary::run_client(vec![
        "publish".into(),
        "--server".into(),
        server.clone(),
        "jobs.cli".into(),
        "hello".into(),
    ])
    .await;
    assert!(output.status.success(), "{output:?}");
    let printed = String::from_utf8_lossy(&output.stdout).to_string();
    let system_id = printed
        .split("system_id=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .expect("publish prints the system_id")
        .to_string();
    let delivered = loop {
        let line = next_line().await;
        if line.starts_with("message") {
            break line;
        }
    };
    assert!(
        delivered.contains(&format!("system_id={system_id} "))
            && delivered.contains("payload=\"hello\""),
        "{delivered}"
    );
    assert_eq!(next_line().await, format!("acked system_id={system_id}"));
    // `status` shows the subscription's JetStream consumer beside the gateway's own view.
    let status = |json: bool| {
        let mut args: Vec<String> = ["status", "--server", &server, "cli"]
            .map(String::from)
            .to_vec();
        if json {
            args.push("--json".into());
        }
        binary::run_client(args)
    };
    let output = status(true).await;
    assert!(output.status.success(), "{output:?}");
    let view: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let upstream = &view["subscriptions"][0]["upstream"];
    assert_eq!(upstream["consumer"], "tb-q-cli", "{view}");
    assert_eq!(upstream["pending"], 0, "{view}");
    let output = status(false).await;
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.contains("JetStream consumer tb-q-cli: 0 pending"),
        "{text}"
    );
    let _ = subscriber.kill();
    let _ = subscriber.wait();
    drop(gateway);
}

// A `PublishStream` through a gateway sends each publish as it reads it, up to 256 awaiting
// JetStream's confirmation: the answers still come in request order (a refusal in the middle
// included), their system ids rise with it, and the member on the other gateway gets the
// messages in that order.
#[tokio::test]
async fn a_pipelined_publish_stream_through_a_gateway_keeps_its_order() {
    let (_cluster, a, b) = two_gateways().await;
    let (on_a, on_b) = (a.client().await, b.client().await);
    let mut member = on_a.subscribe(queue("ordered", 64)).await.unwrap();
    member.confirmed().await;
    const N: usize = 1000;
    let requests: Vec<tinybroker::pb::PublishRequest> = (0..N)
        .map(|n| tinybroker::pb::PublishRequest {
            topic: if n == N / 2 {
                "orders..bad".into()
            } else {
                "orders.new".into()
            },
            payload: n.to_string().into_bytes().into(),
            headers: Default::default(),
            fence: None,
        })
        .collect();
    let answers = publish_stream(&on_b, requests).await;
    assert_eq!(answers.len(), N);
    assert_eq!(Code::from(answers[N / 2].code), Code::InvalidArgument);
    let confirmed: Vec<(usize, u64)> = answers
        .iter()
        .enumerate()
        .filter(|(n, _)| *n != N / 2)
        .map(|(n, answer)| {
            assert_eq!(answer.code, 0, "answer {n}: {answer:?}");
            (n, answer.system_id)
        })
        .collect();
    assert!(
        confirmed.windows(2).all(|w| w[0].1 < w[1].1),
        "system ids rise with the request order"
    );
    for (n, system_id) in confirmed {
        let got = member.message().await;
        assert_eq!(
            (
                got.system_id,
                String::from_utf8_lossy(&got.payload).to_string()
            ),
            (system_id, n.to_string())
        );
        member.ack(got.system_id).await;
    }
}

// Large messages through a pipelined `PublishStream` (at most 4 MiB of them await JetStream's
// confirmation per stream): each of a dozen 1 MB publishes is confirmed, in order, and
// delivered whole.
#[tokio::test]
async fn large_publishes_through_a_gateway_stream_are_confirmed_in_order() {
    let (_cluster, a, b) = two_gateways().await;
    let (on_a, on_b) = (a.client().await, b.client().await);
    let mut member = on_a.subscribe(queue("large", 4)).await.unwrap();
    member.confirmed().await;
    let requests: Vec<tinybroker::pb::PublishRequest> = (0..12u8)
        .map(|n| tinybroker::pb::PublishRequest {
            topic: "orders.big".into(),
            payload: vec![n; 1_000_000].into(),
            headers: Default::default(),
            fence: None,
        })
        .collect();
    let answers = publish_stream(&on_b, requests).await;
    assert_eq!(answers.len(), 12);
    assert!(answers.iter().all(|a| a.code == 0), "{answers:?}");
    assert!(answers.windows(2).all(|w| w[0].system_id < w[1].system_id));
    for (n, answer) in answers.iter().enumerate() {
        let got = member.message().await;
        assert_eq!(got.system_id, answer.system_id);
        assert_eq!(got.payload.len(), 1_000_000);
        assert!(got.payload.iter().all(|&b| b == n as u8));
        member.ack(got.system_id).await;
    }
}

/// Publishes `requests` on one `PublishStream` and returns every answer.
async fn publish_stream(
    client: &harness::Client,
    requests: Vec<tinybroker::pb::PublishRequest>,
) -> Vec<tinybroker::pb::PublishStreamResponse> {
    within(async {
        let mut answers = client
            .1
            .clone()
            .publish_stream(tokio_stream::iter(requests))
            .await
            .unwrap()
            .into_inner();
        let mut all = Vec::new();
        while let Some(answer) = tokio_stream::StreamExt::next(&mut answers).await {
            all.push(answer.unwrap());
        }
        all
    })
    .await
}
