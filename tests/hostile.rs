//! Hostile and careless clients against a real server on loopback (issue "hardening"): each
//! attack is bounded in count and time; during it an ordinary publish → deliver → ack must
//! still complete within a second, and the process's memory must stay within the configured
//! budget plus a fixed slack.

#[path = "api/certs.rs"]
#[allow(dead_code)]
mod certs;
#[path = "api/harness.rs"]
#[allow(dead_code)]
mod harness;

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use bytes::{BufMut, Bytes, BytesMut};
use certs::Ca;
use harness::{Client, TestServer, assert_code, open, within};
use tinybroker::{
    pb::{self, DeliveryMode},
    server::ServerConfig,
};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};
use tokio_rustls::{
    TlsConnector,
    rustls::{
        ClientConfig, ClientConnection, RootCertStore,
        crypto::ring,
        pki_types::{CertificateDer, ServerName, pem::PemObject},
    },
};
use tonic::{
    Code,
    transport::{Channel, ClientTlsConfig},
};

/// The tests measure the whole process's memory, so they run one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const MIB: u64 = 1024 * 1024;

/// Memory the process holds beyond what an attack may cost: allocator slack, runtime, clients.
const RSS_SLACK: u64 = 64 * MIB;

/// The process's resident set size, in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status");
    kib * 1024
}

/// Samples RSS every few milliseconds until dropped; `peak()` is the highest seen.
struct RssPeak {
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl RssPeak {
    fn start() -> Self {
        let peak = Arc::new(AtomicU64::new(rss()));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (peak.clone(), stop.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                p.fetch_max(rss(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        Self { peak, stop }
    }

    fn peak(&self) -> u64 {
        self.peak.fetch_max(rss(), Ordering::Relaxed).max(rss())
    }
}

impl Drop for RssPeak {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn assert_rss_within(baseline: u64, peak: &RssPeak, budget: u64) {
    let grown = peak.peak().saturating_sub(baseline);
    assert!(
        grown <= budget + RSS_SLACK,
        "RSS grew by {} MiB during the attack; the bound is {} MiB budget + {} MiB slack",
        grown / MIB,
        budget / MIB,
        RSS_SLACK / MIB
    );
    eprintln!("RSS grew by {} MiB during the attack", grown / MIB);
}

/// An ordinary client's publish → deliver → ack on a fresh broadcast subscription, which must
/// complete within a second even while the broker is under attack.
async fn ordinary_round_trip(client: &Client, name: &str) {
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(1), async {
        let topic = format!("ordinary.{name}");
        let mut member = client
            .subscribe(open(name, DeliveryMode::Broadcast, "", &[&topic]))
            .await
            .unwrap();
        member.confirmed().await;
        let published = client.publish(&topic, "hello").await;
        let message = member.message().await;
        assert_eq!(message.system_id, published.system_id);
        member.ack(message.system_id).await;
    })
    .await
    .unwrap_or_else(|_| panic!("the ordinary round trip {name} took over 1 s"));
    eprintln!("ordinary round trip {name}: {:?}", started.elapsed());
}

async fn counters(client: &Client) -> pb::BrokerCounters {
    client.list().await.broker.expect("broker counters")
}

/// Issue part 1: sockets that never finish the HTTP/2 handshake (nothing, `P`, half a preface)
/// are closed after the handshake timeout; those over `max_connections` are closed at once and
/// counted; an ordinary client keeps working, and new clients are served once they are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshakeless_sockets_are_closed_and_counted_while_clients_are_served() {
    let _serial = SERIAL.lock().await;
    const SOCKETS: u64 = 100;
    let server = TestServer::with_config(ServerConfig {
        max_connections: 40,
        handshake_timeout: Duration::from_millis(1500),
        ..ServerConfig::default()
    })
    .await;
    let client = server.client().await;
    let baseline = rss();
    let peak = RssPeak::start();

    let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let mut sockets = Vec::new();
    for i in 0..SOCKETS {
        let mut socket = within(TcpStream::connect(server.addr)).await.unwrap();
        // A socket refused over the limit may already be closed: a failed write is fine.
        let _ = match i % 3 {
            0 => Ok(()),
            1 => socket.write_all(b"P").await,
            _ => socket.write_all(&preface[..12]).await,
        };
        sockets.push(socket);
    }
    ordinary_round_trip(&client, "during-handshake-attack").await;

    // Every hostile socket is closed by the server: refused at once or timed out.
    for socket in &mut sockets {
        let mut sink = Vec::new();
        let _ = within(socket.read_to_end(&mut sink)).await;
    }
    let c = counters(&client).await;
    assert!(c.connections_refused >= 1, "{c:?}");
    assert!(c.handshake_timeouts >= 1, "{c:?}");
    assert_eq!(
        c.connections_refused + c.handshake_timeouts,
        SOCKETS,
        "{c:?}"
    );

    // The slots are free again: a new client connects and is served.
    let late = server.client().await;
    ordinary_round_trip(&late, "after-handshake-attack").await;
    assert_rss_within(baseline, &peak, 0);
}

/// A TLS client's configuration trusting only `ca`, offering HTTP/2 as gRPC clients do.
fn tls_client_config(ca: &Ca) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.cert_pem.as_bytes()).unwrap())
        .unwrap();
    let mut config = ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(config)
}

/// A gRPC client over TLS trusting `ca`; connected (TLS, HTTP/2 preface and SETTINGS sent)
/// when this returns.
async fn tls_client(server: &TestServer, ca: &Ca) -> Client {
    let tls = ClientTlsConfig::new()
        .ca_certificate(ca.certificate())
        .domain_name("localhost");
    let channel = within(
        Channel::from_shared(format!("https://{}", server.addr))
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .connect(),
    )
    .await
    .expect("a TLS client connects");
    Client(pb::broker_client::BrokerClient::new(channel))
}

/// Reads until the server closes the connection (cleanly or not); fails the test if it stays
/// open past [`harness::EVENT_TIMEOUT`].
async fn closed_by_server(mut socket: impl AsyncRead + Unpin) {
    let mut sink = Vec::new();
    let _ = tokio::time::timeout(harness::EVENT_TIMEOUT, socket.read_to_end(&mut sink))
        .await
        .expect("the server kept a connection open past the handshake deadline");
}

/// How a hostile TLS client stops part way.
#[derive(Debug, Clone, Copy)]
enum TlsStall {
    /// After the first 33 bytes of its ClientHello: as many bytes as a plaintext client's
    /// HTTP/2 preface and first frame header.
    InClientHello,
    /// After the TLS handshake, before the HTTP/2 preface.
    BeforePreface,
}

/// Issue 17, item 2: with TLS and `max_connections` 5, one ordinary client connects, then four
/// sockets stall (`stall`) and fill every other slot. Each is closed within the handshake
/// deadline and counted; the ordinary client's connection, idle past the deadline after a
/// valid preface, is not; and the freed slots take new clients.
async fn stalled_tls_sockets_are_closed_at_the_deadline(stall: TlsStall) {
    let _serial = SERIAL.lock().await;
    const STALLED: u64 = 4;
    const HANDSHAKE: Duration = Duration::from_secs(1);
    let ca = Ca::new("broker CA");
    let server = TestServer::with_config(ServerConfig {
        tls: Some(ca.server().server_identity()),
        max_connections: STALLED as usize + 1,
        handshake_timeout: HANDSHAKE,
        ..ServerConfig::default()
    })
    .await;
    let ordinary = tls_client(&server, &ca).await;
    let config = tls_client_config(&ca);
    let localhost = ServerName::try_from("localhost").unwrap();

    let started = Instant::now();
    let mut closing = tokio::task::JoinSet::new();
    for _ in 0..STALLED {
        let mut tcp = within(TcpStream::connect(server.addr)).await.unwrap();
        match stall {
            TlsStall::InClientHello => {
                let mut hello = Vec::new();
                ClientConnection::new(config.clone(), localhost.clone())
                    .unwrap()
                    .write_tls(&mut hello)
                    .unwrap();
                assert!(hello.len() > 33, "a ClientHello of {} bytes", hello.len());
                tcp.write_all(&hello[..33]).await.unwrap();
                closing.spawn(closed_by_server(tcp));
            }
            TlsStall::BeforePreface => {
                let tls =
                    within(TlsConnector::from(config.clone()).connect(localhost.clone(), tcp))
                        .await
                        .expect("the TLS handshake completes");
                assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
                closing.spawn(closed_by_server(tls));
            }
        }
    }
    while let Some(closed) = closing.join_next().await {
        closed.unwrap();
    }
    eprintln!("{stall:?}: all closed after {:?}", started.elapsed());

    let c = counters(&ordinary).await;
    assert_eq!(c.handshake_timeouts, STALLED, "{c:?}");
    assert_eq!(c.connections_refused, 0, "{c:?}");
    // The slots are free again: new clients connect over TLS and are served.
    let late = tls_client(&server, &ca).await;
    ordinary_round_trip(&late, &format!("after-tls-stall-{stall:?}")).await;
    ordinary_round_trip(&ordinary, &format!("idle-through-tls-stall-{stall:?}")).await;
    let c = counters(&late).await;
    assert_eq!(
        c.handshake_timeouts, STALLED,
        "the ordinary client's idle connection must outlive the deadline: {c:?}"
    );
}

/// Issue 17, item 2: a TLS socket that sends the start of a ClientHello (as many bytes as a
/// plaintext preface) and stops does not hold its slot past the handshake deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_sockets_stalled_in_the_client_hello_are_closed_at_the_deadline() {
    stalled_tls_sockets_are_closed_at_the_deadline(TlsStall::InClientHello).await;
}

/// Issue 17, item 2: a TLS socket that completes the TLS handshake and never sends the HTTP/2
/// preface does not hold its slot past the handshake deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_sockets_silent_after_the_tls_handshake_are_closed_at_the_deadline() {
    stalled_tls_sockets_are_closed_at_the_deadline(TlsStall::BeforePreface).await;
}

/// The gRPC framing of a Publish request of `declared` bytes, cut after `sent` bytes in all.
fn unfinished_publish_body(declared: u32, sent: usize) -> Bytes {
    let mut body = BytesMut::with_capacity(sent);
    body.put_u8(0);
    body.put_u32(declared);
    body.resize(sent, b'x');
    body.freeze()
}

/// Issue part 2: one connection opens 100 Publish streams, each sending 2,000,000 bytes of a
/// 2,100,000-byte message and never finishing. Memory stays within the pending-request budget
/// (plus slack), every stream is refused (over the budget) or timed out, an ordinary client
/// keeps working, and a subscription opened before the attack outlives the request timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfinished_request_bodies_are_bounded_in_memory_and_time() {
    let _serial = SERIAL.lock().await;
    const STREAMS: u64 = 100;
    const BUDGET: u64 = 16 * MIB;
    let server = TestServer::with_config(ServerConfig {
        max_pending_request_bytes: BUDGET as usize,
        request_timeout: Duration::from_secs(2),
        ..ServerConfig::default()
    })
    .await;
    let client = server.client().await;
    let mut survivor = client
        .subscribe(open(
            "survivor",
            DeliveryMode::Broadcast,
            "",
            &["survivor.news"],
        ))
        .await
        .unwrap();
    survivor.confirmed().await;
    let baseline = rss();
    let peak = RssPeak::start();

    let tcp = within(TcpStream::connect(server.addr)).await.unwrap();
    let (h2, connection) = within(h2::client::handshake(tcp)).await.unwrap();
    let connection = tokio::spawn(connection);
    let chunk = unfinished_publish_body(2_100_000, 2_000_000);
    let mut streams = Vec::new();
    let mut h2 = h2;
    for _ in 0..STREAMS {
        h2 = within(h2.ready()).await.unwrap();
        let request = http::Request::builder()
            .method("POST")
            .uri(format!(
                "http://{}/tinybroker.v1.Broker/Publish",
                server.addr
            ))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .unwrap();
        let (response, mut send) = h2.send_request(request, false).unwrap();
        // The server may already have refused an earlier stream's bytes; that is fine.
        let _ = send.send_data(chunk.clone(), false);
        streams.push((response, send));
    }
    ordinary_round_trip(&client, "during-body-attack").await;

    // Every attacking stream ends: refused over the budget, or timed out.
    for (response, _send) in &mut streams {
        let _ = within(response).await;
    }
    assert_rss_within(baseline, &peak, BUDGET + BUDGET / 4);
    let c = counters(&client).await;
    assert!(c.requests_over_budget >= 1, "{c:?}");
    assert!(c.request_timeouts >= 1, "{c:?}");
    assert_eq!(
        c.requests_over_budget + c.request_timeouts,
        STREAMS,
        "{c:?}"
    );
    drop(streams);
    connection.abort();

    // Server-streaming responses are not subject to the request timeout.
    let published = client.publish("survivor.news", "still here").await;
    assert_eq!(survivor.message().await.system_id, published.system_id);
    ordinary_round_trip(&client, "after-body-attack").await;
}

/// Issue part 4: with many subscriptions, `ListSubscriptions` pages (default 100, at most
/// 1000, a token to continue) and twelve concurrent listers neither stall an ordinary client
/// nor blow up memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_listing_is_paged_and_stalls_no_one() {
    let _serial = SERIAL.lock().await;
    const SUBSCRIPTIONS: usize = 1500;
    let server = TestServer::start().await;
    let client = server.client().await;
    // Members leave at once; their subscriptions stay (idle expiry is minutes away).
    let mut joins = tokio::task::JoinSet::new();
    for worker in 0..8 {
        let client = client.clone();
        joins.spawn(async move {
            for i in (worker..SUBSCRIPTIONS).step_by(8) {
                let id = format!("sub-{i:05}");
                let patterns = ["a.*", "b.>", "c.d.e"];
                client
                    .subscribe(open(&id, DeliveryMode::Queue, "workers", &patterns))
                    .await
                    .unwrap();
            }
        });
    }
    while let Some(joined) = within(joins.join_next()).await {
        joined.unwrap();
    }

    let first = client.list_page(0, "").await.unwrap();
    assert_eq!(first.subscriptions.len(), 100, "default page size");
    assert_eq!(first.next_page_token, "sub-00099");
    assert_eq!(
        first.broker.unwrap().subscriptions,
        SUBSCRIPTIONS as u64,
        "counters cover every subscription, not just the page"
    );
    let capped = client.list_page(5000, "").await.unwrap();
    assert_eq!(capped.subscriptions.len(), 1000, "page size is capped");
    assert_code(
        client.list_page(10, "bad\ntoken").await,
        Code::InvalidArgument,
        "page_token",
    );

    let baseline = rss();
    let peak = RssPeak::start();
    let mut listers = tokio::task::JoinSet::new();
    for _ in 0..12 {
        let client = client.clone();
        listers.spawn(async move {
            let mut ids = Vec::new();
            let mut token = String::new();
            for _ in 0..SUBSCRIPTIONS {
                let page = client.list_page(100, &token).await.unwrap();
                ids.extend(page.subscriptions.into_iter().map(|s| s.subscription_id));
                token = page.next_page_token;
                if token.is_empty() {
                    break;
                }
            }
            ids
        });
    }
    ordinary_round_trip(&client, "during-listing").await;
    let expected: Vec<String> = (0..SUBSCRIPTIONS).map(|i| format!("sub-{i:05}")).collect();
    while let Some(listed) = within(listers.join_next()).await {
        let listed: Vec<String> = listed
            .unwrap()
            .into_iter()
            .filter(|id| id.starts_with("sub-"))
            .collect();
        assert_eq!(listed, expected, "pages cover every id once, in order");
    }
    assert_rss_within(baseline, &peak, 64 * MIB);
}

/// Issue part 5: a 1 MB `subscription_id` on Ack, Nack and DescribeSubscription is refused with
/// `INVALID_ARGUMENT`, and no status message echoes more than about a kilobyte of input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_ids_are_refused_with_short_status_messages() {
    let _serial = SERIAL.lock().await;
    let server = TestServer::start().await;
    let client = server.client().await;
    let baseline = rss();
    let peak = RssPeak::start();
    let long = "x".repeat(1_000_000);
    let short_enough = |status: &tonic::Status| {
        assert!(
            status.message().len() <= 1024,
            "status message of {} bytes",
            status.message().len()
        );
    };
    for _ in 0..20 {
        let refusals = [
            client.ack(&long, 1, 1).await.unwrap_err(),
            client.nack(&long, 1, 1).await.unwrap_err(),
            client.describe(&long).await.unwrap_err(),
        ];
        for status in &refusals {
            assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
            assert!(status.message().contains("subscription_id"), "{status:?}");
            short_enough(status);
        }
    }
    // Messages that quote other input are capped too: a long topic on publish.
    let topic = format!("{}.with space", "t".repeat(200_000));
    let refused = client.try_publish(&topic, Vec::new()).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    short_enough(&refused);
    ordinary_round_trip(&client, "during-long-ids").await;
    assert_rss_within(baseline, &peak, 0);
}

/// Issue 17 part 1, the Settle flood: a `Consume` member sends Settles of 1.9 million ids each
/// (about 2 MB, inside the request limit) for messages it does not hold. Each used to become its
/// own formatted refusal frame, built under the subscription's lock in one poll: hundreds of
/// megabytes, seconds of stall. A Settle naming more ids than the member's window is now refused
/// whole, in one frame, at once: memory stays within a small budget, an unrelated publish stays
/// fast, and the member goes on receiving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settle_floods_are_refused_whole_in_bounded_time_and_memory() {
    let _serial = SERIAL.lock().await;
    const BUDGET: u64 = 64 * MIB;
    let server = TestServer::with_config(with_memory_budget(BUDGET)).await;
    let client = server.client().await;
    let mut request = open("flood", DeliveryMode::Queue, "g", &["flood.>"]);
    request.max_in_flight = 64;
    let mut member = client
        .subscribe_via(harness::Carriage::Stream, request)
        .await
        .unwrap();
    member.confirmed().await;
    let settles = member.settles.clone().expect("a Consume member");
    let baseline = rss();
    let peak = RssPeak::start();
    for round in 0..3 {
        let settle = pb::Settle {
            ack: (0..1_900_000u64).map(|i| i % 100 + 1).collect(),
            nack: Vec::new(),
        };
        let sent = Instant::now();
        settles
            .send(pb::ConsumeRequest {
                request: Some(pb::consume_request::Request::Settle(settle)),
            })
            .await
            .unwrap();
        let publish = Instant::now();
        client.publish(&format!("unrelated.{round}"), "x").await;
        let publish = publish.elapsed();
        assert!(
            publish < Duration::from_millis(500),
            "an unrelated publish took {publish:?} during the flood"
        );
        match member.frame().await {
            pb::subscription_frame::Frame::Refused(refused) => {
                assert_eq!(refused.code, Code::InvalidArgument as i32, "{refused:?}");
                assert!(refused.message.contains("window"), "{refused:?}");
                assert!(refused.more_system_ids.is_empty(), "{refused:?}");
            }
            other => panic!("expected one refusal of the whole settle, got {other:?}"),
        }
        eprintln!("settle flood {round}: refused after {:?}", sent.elapsed());
    }
    let published = client.publish("flood.after", "still served").await;
    let message = member.message().await;
    assert_eq!(message.system_id, published.system_id);
    let info = client.describe("flood").await.unwrap();
    let c = info.counters.unwrap_or_default();
    assert_eq!(
        (c.acked, c.stale_acks),
        (0, 0),
        "the floods changed nothing"
    );
    assert_rss_within(baseline, &peak, BUDGET);
}

/// Issue part 6: a member that never reads its stream cannot hold shutdown past the drain
/// timeout, and the listener closes as soon as shutdown starts, so a new client is refused at
/// once instead of hanging.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_accepting_at_once_and_bounds_the_drain() {
    let _serial = SERIAL.lock().await;
    let drain = Duration::from_millis(500);
    let server = TestServer::with_config(ServerConfig {
        drain_timeout: drain,
        ..ServerConfig::default()
    })
    .await;
    let addr: SocketAddr = server.addr;
    let client = server.client().await;
    // A member with a wide window that never reads: its unread frames fill the HTTP/2 windows,
    // so its stream's final status can never be sent.
    let stuck_client = server.client().await;
    let mut stuck = open("stuck", DeliveryMode::Broadcast, "", &["flood.*"]);
    stuck.max_in_flight = 1000;
    let mut stuck = stuck_client.subscribe(stuck).await.unwrap();
    let mut reader = client
        .subscribe(open("reader", DeliveryMode::Broadcast, "", &["other.*"]))
        .await
        .unwrap();
    reader.confirmed().await;
    let payload = vec![b'p'; 256 * 1024];
    for _ in 0..40 {
        client
            .try_publish("flood.big", payload.clone())
            .await
            .unwrap();
    }
    ordinary_round_trip(&client, "before-shutdown").await;

    let started = Instant::now();
    let stopping = tokio::spawn(server.stop());
    // The reading member is ended once shutdown began, which is after the listener closed.
    let ended = reader.ended().await;
    assert_eq!(ended.unwrap_err().code(), Code::Unavailable);
    let refused = tokio::time::timeout(Duration::from_secs(1), TcpStream::connect(addr)).await;
    assert!(
        matches!(&refused, Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused),
        "a client connecting during shutdown must be refused at once, got {refused:?}"
    );
    within(stopping).await.unwrap().unwrap();
    let took = started.elapsed();
    assert!(
        took < drain + Duration::from_secs(2),
        "shutdown took {took:?} with a drain timeout of {drain:?}"
    );
    // Its connection was closed at the end of the drain: reading now finds the stream cut off
    // part way (had the connection been left open, it would deliver every message and then
    // end with UNAVAILABLE).
    let mut delivered = 0;
    let cut = loop {
        match within(stuck.stream.message()).await {
            Ok(Some(_)) => delivered += 1,
            Ok(None) => break None,
            Err(status) => break Some(status),
        }
    };
    assert!(delivered < 41, "{delivered} frames");
    let cut = cut.expect("the stream must fail, not end cleanly");
    assert_ne!(
        cut.code(),
        Code::Unavailable,
        "{cut:?} after {delivered} frames"
    );
}

/// Kills the child process when the test ends, however it ends.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Issue part 1: out of file descriptors (the binary runs under `ulimit -n 48`), the accept
/// loop backs off and logs the failure once for the whole burst instead of spinning silently;
/// once descriptors free up it accepts again and serves an ordinary client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accept_errors_back_off_log_once_and_recover() {
    use std::{
        io::{BufRead, BufReader},
        process::{Command, Stdio},
    };
    let _serial = SERIAL.lock().await;
    let mut server = KillOnDrop(
        Command::new("sh")
            .arg("-c")
            .arg(r#"ulimit -n 48 && exec "$0" serve --listen 127.0.0.1:0 --handshake-timeout 60s --max-connections 1000"#)
            .arg(env!("CARGO_BIN_EXE_tinybroker"))
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stderr = server.0.stderr.take().unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut next_line = async || within(rx.recv()).await.expect("server output ended");
    let addr: SocketAddr = loop {
        let line = next_line().await;
        let addr = line
            .split("listening on ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next());
        if let Some(addr) = addr {
            break addr.parse().unwrap();
        }
    };

    // More idle connections than descriptors: the kernel queues the rest in the backlog, and
    // accepting them fails with EMFILE.
    let mut sockets = Vec::new();
    for _ in 0..80 {
        sockets.push(within(TcpStream::connect(addr)).await.unwrap());
    }
    while !next_line().await.contains("accept failed") {}
    drop(sockets);
    loop {
        let line = next_line().await;
        assert!(
            !line.contains("accept failed"),
            "logged more than once in one burst: {line}"
        );
        if line.contains("accepting connections again") {
            break;
        }
    }
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let client = Client(pb::broker_client::BrokerClient::new(channel));
    ordinary_round_trip(&client, "after-fd-exhaustion").await;
}

fn with_memory_budget(max_memory_bytes: u64) -> ServerConfig {
    ServerConfig {
        limits: tinybroker::core::Limits {
            max_memory_bytes,
            ..Default::default()
        },
        ..ServerConfig::default()
    }
}

/// Issue part 3, fan-out flood: 1,000 idle subscriptions on `fan.>`, then batches of one-byte
/// messages. Each queue entry is counted with its overhead, so the broker-wide budget refuses
/// the flood (naming max_memory_bytes) long before gigabytes, and memory stays within it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fan_out_flood_is_stopped_by_the_memory_budget() {
    let _serial = SERIAL.lock().await;
    const BUDGET: u64 = 64 * MIB;
    let server = TestServer::with_config(with_memory_budget(BUDGET)).await;
    let client = server.client().await;
    let baseline = rss();
    let peak = RssPeak::start();
    let mut idle = Vec::new();
    for n in 0..1_000 {
        // A connection carries at most max_concurrent_streams members: 100 per connection.
        if n % 100 == 0 {
            idle.push((server.client().await, Vec::new()));
        }
        let (subscriber, members) = idle.last_mut().expect("pushed above");
        let sub = open(&format!("fan-{n}"), DeliveryMode::Broadcast, "", &["fan.>"]);
        members.push(subscriber.subscribe(sub).await.unwrap());
    }
    let mut refused = None;
    for _ in 0..100 {
        let batch = pb::PublishBatchRequest {
            messages: (0..1_000)
                .map(|_| pb::PublishRequest {
                    topic: "fan.out".into(),
                    payload: Bytes::from_static(b"x"),
                    headers: Default::default(),
                })
                .collect(),
        };
        if let Err(status) = within(client.0.clone().publish_batch(batch)).await {
            refused = Some(status);
            break;
        }
    }
    let status = refused.expect("100,000 messages x 1,000 subscriptions were all accepted");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("max_memory_bytes"), "{status:?}");
    let c = counters(&client).await;
    assert!(c.memory_accounted_bytes <= BUDGET, "{c:?}");
    ordinary_round_trip(&client, "during-fan-out-flood").await;
    assert_rss_within(baseline, &peak, BUDGET);
}

/// Issue part 3, heavy subscriptions: each subscription with 64 long patterns costs its
/// routing-index nodes; the budget counts them, so a flood of such subscriptions is refused
/// instead of taking gigabytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heavy_subscription_flood_is_stopped_by_the_memory_budget() {
    let _serial = SERIAL.lock().await;
    const BUDGET: u64 = 64 * MIB;
    let server = TestServer::with_config(with_memory_budget(BUDGET)).await;
    let client = server.client().await;
    let baseline = rss();
    let peak = RssPeak::start();
    let mut refused = None;
    let mut held = Vec::new();
    for n in 0..2_000 {
        // 64 distinct patterns of about 230 bytes, 32 tokens each.
        let patterns: Vec<String> = (0..64)
            .map(|p| {
                std::iter::once(format!("h{n}x{p}"))
                    .chain((1..32).map(|t| format!("t{t:02}xyz")))
                    .collect::<Vec<_>>()
                    .join(".")
            })
            .collect();
        let patterns: Vec<&str> = patterns.iter().map(String::as_str).collect();
        let sub = open(
            &format!("heavy-{n}"),
            DeliveryMode::Broadcast,
            "",
            &patterns,
        );
        // A connection carries at most max_concurrent_streams members: 100 per connection.
        if n % 100 == 0 {
            held.push((server.client().await, Vec::new()));
        }
        let (subscriber, members) = held.last_mut().expect("pushed above");
        match subscriber.subscribe(sub).await {
            Ok(member) => members.push(member),
            Err(status) => {
                refused = Some(status);
                break;
            }
        }
    }
    let status = refused.expect("2,000 heavy subscriptions were all accepted");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("max_memory_bytes"), "{status:?}");
    ordinary_round_trip(&client, "during-heavy-subscription-flood").await;
    assert_rss_within(baseline, &peak, BUDGET);
}
