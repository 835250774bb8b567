//! Attacks on the transport: sockets that never finish the HTTP/2 or TLS handshake, request
//! bodies that never finish, members that never read during shutdown, and running out of file
//! descriptors.

use super::*;

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
    Client::of(pb::broker_client::BrokerClient::new(channel))
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
    let client = Client::of(pb::broker_client::BrokerClient::new(channel));
    ordinary_round_trip(&client, "after-fd-exhaustion").await;
}
