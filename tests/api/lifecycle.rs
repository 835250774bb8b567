//! Server lifecycle: graceful shutdown, health, reflection, auth, idle expiry, the binary (docs/semantics.md#shutdown).

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    time::Duration,
};

use tinybroker::{core::Limits, pb, server::ServerConfig};
use tonic::{Code, Request, transport::Channel};

use crate::harness::*;

// docs/semantics.md#shutdown: on shutdown, streams end with a clear status and the server returns.
#[tokio::test]
async fn graceful_shutdown_ends_streams_with_unavailable() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut a = client.subscribe(singleton("bye")).await.unwrap();
    a.confirmed().await;
    let mut b = client.subscribe(singleton("bye")).await.unwrap();
    let stop = tokio::spawn(server.stop());
    let status = a.ended().await.expect_err("stream must end with a status");
    assert_eq!(status.code(), Code::Unavailable);
    assert!(status.message().contains("shutting down"), "{status:?}");
    assert_eq!(b.ended().await.unwrap_err().code(), Code::Unavailable);
    within(stop).await.unwrap().unwrap();
}

// docs/semantics.md#shutdown (issue 17, item 7): shutdown ends an open `PublishStream` with UNAVAILABLE at once,
// as it ends member streams, instead of waiting out the drain for the publisher to hang up.
#[tokio::test]
async fn shutdown_ends_publish_streams_with_unavailable_without_waiting_for_the_drain() {
    let drain = Duration::from_secs(30);
    let server = TestServer::with_config(ServerConfig {
        drain_timeout: drain,
        ..ServerConfig::default()
    })
    .await;
    let client = server.client().await;
    // The client keeps its side open (the sender lives to the end): only the server can end it.
    let (requests, rx) = tokio::sync::mpsc::channel(4);
    let mut answers = within(
        client
            .1
            .clone()
            .publish_stream(tokio_stream::wrappers::ReceiverStream::new(rx)),
    )
    .await
    .unwrap()
    .into_inner();
    requests
        .send(pb::PublishRequest {
            topic: "jobs.streamed".into(),
            payload: b"x".to_vec().into(),
            headers: Default::default(),
            fence: None,
        })
        .await
        .unwrap();
    let answer = within(answers.message()).await.unwrap().expect("an answer");
    assert_eq!(answer.code, 0, "{answer:?}");

    let started = std::time::Instant::now();
    let stopping = tokio::spawn(server.stop());
    let ended = within(answers.message())
        .await
        .expect_err("the stream must end with a status");
    assert_eq!(ended.code(), Code::Unavailable, "{ended:?}");
    assert!(ended.message().contains("shutting down"), "{ended:?}");
    tokio::time::timeout(Duration::from_secs(5), stopping)
        .await
        .unwrap_or_else(|_| panic!("shutdown waited out the {drain:?} drain for a publish stream"))
        .unwrap()
        .unwrap();
    eprintln!(
        "shutdown with a publish stream open took {:?}",
        started.elapsed()
    );
    drop(requests);
}

// docs/semantics.md#api-surface: the standard health service answers SERVING.
#[tokio::test]
async fn health_service_reports_serving() {
    let server = TestServer::start().await;
    let channel = Channel::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let reply = within(health.check(tonic_health::pb::HealthCheckRequest {
        service: "tinybroker.v1.Broker".into(),
    }))
    .await
    .unwrap()
    .into_inner();
    assert_eq!(
        reply.status(),
        tonic_health::pb::health_check_response::ServingStatus::Serving
    );
}

// docs/semantics.md#access: with a bearer token configured, Broker RPCs without it are UNAUTHENTICATED.
#[tokio::test]
async fn bearer_token_is_required_when_configured() {
    let server = TestServer::with_config(ServerConfig {
        auth_token: Some("s3cret".into()),
        ..ServerConfig::default()
    })
    .await;
    let client = server.client().await;
    assert_code(
        client.try_publish("a.b", vec![]).await,
        Code::Unauthenticated,
        "authorization",
    );
    let mut wrong = Request::new(pb::PublishRequest {
        topic: "a.b".into(),
        ..Default::default()
    });
    wrong
        .metadata_mut()
        .insert("authorization", "Bearer nope".parse().unwrap());
    assert_code(
        within(client.1.clone().publish(wrong)).await,
        Code::Unauthenticated,
        "does not match",
    );
    let mut right = Request::new(pb::PublishRequest {
        topic: "a.b".into(),
        ..Default::default()
    });
    right
        .metadata_mut()
        .insert("authorization", "Bearer s3cret".parse().unwrap());
    within(client.1.clone().publish(right)).await.unwrap();
}

// docs/semantics.md#idle-expiry: a subscription whose last member left keeps its queue for the idle time; a member
// rejoining in time finds its messages. (Expiry itself runs on the paused clock in the broker's
// own tests.)
#[tokio::test]
async fn subscription_without_members_keeps_its_queue() {
    let server = TestServer::with_config(ServerConfig {
        limits: Limits {
            idle_timeout: Duration::from_secs(600),
            ..Limits::default()
        },
        ..ServerConfig::default()
    })
    .await;
    let client = server.client().await;
    let mut a = client.subscribe(singleton("idle")).await.unwrap();
    a.confirmed().await;
    drop(a);
    let id = client.publish("jobs.kept", "x").await.system_id;
    let info = client.describe("idle").await.unwrap();
    assert!(info.members.is_empty());
    if GATEWAYS {
        // Through gateways the member-less subscription is JetStream's consumer: described
        // from it, with the kept message in its backlog (pending, or unacked when a pull of
        // the member that left took it; counted by the consumer's leader, which may see the
        // publish a moment later) and the consumer's own idle timer (no expires_in).
        let kept = |info: &pb::SubscriptionInfo| {
            info.upstream.as_ref().map(|u| u.pending + u.unacked) == Some(1)
        };
        within(async { while !kept(&client.describe("idle").await.unwrap()) {} }).await;
    } else {
        assert!(
            info.expires_in_ms.is_some_and(|ms| ms > 0 && ms <= 600_000),
            "{info:?}"
        );
        assert_eq!(info.upstream, None, "an embedded broker has no upstream");
    }
    let mut b = client.subscribe(singleton("idle")).await.unwrap();
    b.confirmed().await;
    assert_eq!(b.message().await.system_id, id);
    assert_eq!(client.describe("idle").await.unwrap().expires_in_ms, None);
}

/// Kills the broker process if the test fails before it exits.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

// docs/semantics.md#shutdown: `tinybroker serve` on port 0 logs the bound address, serves, and exits 0 on SIGTERM.
// Runs its own embedded `tinybroker serve` (cluster mode's binary is tested in tests/cluster/main.rs).
embedded_only! {
#[tokio::test]
async fn binary_logs_bound_address_and_exits_zero_on_sigterm() {
    let mut child = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_tinybroker"))
            .args(["serve", "--listen", "127.0.0.1:0"])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stderr = child.0.stderr.take().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let addr = line
                .split("listening on ")
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next());
            if let (Some(addr), Some(tx)) = (addr, tx.take()) {
                let _ = tx.send(addr.to_string());
            }
        }
    });
    let addr = within(rx).await.unwrap();
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let client = Client::of(pb::broker_client::BrokerClient::new(channel));
    let mut a = client.subscribe(singleton("bin")).await.unwrap();
    a.confirmed().await;
    let status = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(a.ended().await.unwrap_err().code(), Code::Unavailable);
    let exit = within(tokio::task::spawn_blocking(move || child.0.wait()))
        .await
        .unwrap()
        .unwrap();
    assert!(exit.success(), "exit status {exit:?}");
}
}

/// `tinybroker subscribe ARGS` against `server` as a child process, and its stdout lines.
fn cli_subscriber(
    server: &TestServer,
    args: &[&str],
) -> (KillOnDrop, tokio::sync::mpsc::UnboundedReceiver<String>) {
    let mut child = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_tinybroker"))
            .args(["subscribe", "--server", &format!("http://{}", server.addr)])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let stdout = child.0.stdout.take().unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    (child, rx)
}

// docs/semantics.md#singleton: a replica process killed with SIGKILL while holding a message (its TCP connection
// reset by the kernel, not a polite cancel) is replaced at once by the earliest standby, which
// gets the message with attempt 2.
#[tokio::test]
async fn killed_replica_process_is_replaced_by_the_standby() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let (mut replica, mut rx) = cli_subscriber(
        &server,
        &[
            "--id", "killed", "--group", "replicas", "--no-ack", "jobs.*",
        ],
    );
    let mut next_line = async || within(rx.recv()).await.expect("replica output ended");
    while !next_line().await.starts_with("confirmed") {}
    let mut standby = client.subscribe(singleton("killed")).await.unwrap();
    let id = client.publish("jobs.kill", "x").await.system_id;
    while !next_line()
        .await
        .starts_with(&format!("message system_id={id}"))
    {}
    let first_epoch = client.describe("killed").await.unwrap().epoch;
    replica.0.kill().unwrap();
    let confirmation = standby.confirmed().await;
    assert_next_epoch(first_epoch, confirmation.epoch);
    let m = standby.message().await;
    assert_eq!((m.system_id, m.delivery_attempt), (id, 2));
}

// Issue "hardening", part 9: the CLI subscriber reports a broker shutdown in words and with its
// own exit code (3), not with a raw transport error.
#[tokio::test]
async fn cli_subscriber_reports_broker_shutdown_with_exit_code_3() {
    let server = TestServer::start().await;
    let (mut subscriber, mut rx) =
        cli_subscriber(&server, &["--id", "cli", "--group", "replicas", "jobs.*"]);
    let mut next_line = async || within(rx.recv()).await;
    while !next_line()
        .await
        .expect("subscriber output ended")
        .starts_with("confirmed")
    {}
    server.stop().await.unwrap();
    let mut lines = Vec::new();
    while let Some(line) = next_line().await {
        lines.push(line);
    }
    assert!(
        lines.iter().any(|l| l == "broker shutting down"),
        "subscriber printed {lines:?}"
    );
    let status = within(tokio::task::spawn_blocking(move || subscriber.0.wait()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(3), "{status:?}");
}

// Issue 17 part 8, for the CLI: `tinybroker subscribe` stopped by Ctrl-C (SIGINT) closes its
// member (flushing the acks it queued) and exits 0, instead of dying with acks in flight; the
// broker has every ack and redelivers nothing.
#[tokio::test]
async fn cli_subscriber_closes_on_ctrl_c_with_every_ack_applied() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let (mut subscriber, mut rx) = cli_subscriber(
        &server,
        &[
            "--id", "ctrl-c", "--mode", "queue", "--group", "workers", "jobs.*",
        ],
    );
    let mut next_line = async || within(rx.recv()).await;
    while !next_line()
        .await
        .expect("subscriber output ended")
        .starts_with("confirmed")
    {}
    let mut last = 0;
    for n in 0..5 {
        last = client
            .publish("jobs.x", &format!("job {n}"))
            .await
            .system_id;
    }
    while next_line().await.expect("subscriber output ended") != format!("acked system_id={last}") {
    }
    let sent = Command::new("kill")
        .args(["-INT", &subscriber.0.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let mut lines = Vec::new();
    while let Some(line) = next_line().await {
        lines.push(line);
    }
    assert!(
        lines.iter().any(|l| l == "closed: every ack applied"),
        "subscriber printed {lines:?}"
    );
    let status = within(tokio::task::spawn_blocking(move || subscriber.0.wait()))
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status:?}");
    // Every ack applied: the next member gets a new message first, none of the five again.
    if !GATEWAYS {
        // (A gateway forgets its counters with its last member.)
        let counters = client.describe("ctrl-c").await.unwrap().counters.unwrap();
        assert_eq!((counters.acked, counters.redelivered), (5, 0));
    }
    let mut next = client
        .subscribe(open(
            "ctrl-c",
            pb::DeliveryMode::Queue,
            "workers",
            &["jobs.*"],
        ))
        .await
        .unwrap();
    next.confirmed().await;
    let marker = client.publish("jobs.x", "after").await.system_id;
    assert_eq!(next.message().await.system_id, marker);
}
