//! The console over HTTP (docs/operations.md#console), in both deployments: its JSON and live
//! stream say who leads with which epoch, follow a failover and a hand-over, keep hostile
//! strings as data, refuse actions without their header or in read-only mode, and need the
//! token when one is set. The page itself is driven in a browser by
//! clients/python/tests/test_console.py.

use std::{net::SocketAddr, time::Duration};

use http_body_util::{BodyExt, Empty};
use hyper::{Request, body::Bytes};
use tinybroker::{console::ConsoleConfig, pb};

use crate::harness::*;

/// An answer: status, headers, body.
struct Answer {
    status: u16,
    headers: hyper::HeaderMap,
    body: String,
}

impl Answer {
    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

async fn connect(addr: SocketAddr) -> hyper::client::conn::http1::SendRequest<Empty<Bytes>> {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);
    sender
}

async fn call(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)]) -> Answer {
    within(async {
        let mut sender = connect(addr).await;
        let mut request = Request::builder().method(method).uri(path);
        if !headers
            .iter()
            .any(|(name, _)| name.eq_ignore_ascii_case("host"))
        {
            request = request.header("host", "127.0.0.1");
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = sender
            .send_request(request.body(Empty::new()).unwrap())
            .await
            .unwrap();
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        Answer {
            status,
            headers,
            body: String::from_utf8(body.to_vec()).unwrap(),
        }
    })
    .await
}

async fn get(addr: SocketAddr, path: &str) -> Answer {
    call(addr, "GET", path, &[]).await
}

/// A live stream's events, as (name, JSON).
struct Live {
    body: hyper::body::Incoming,
    pending: String,
}

impl Live {
    async fn open(addr: SocketAddr, path: &str) -> Live {
        let mut sender = connect(addr).await;
        let request = Request::builder()
            .uri(path)
            .header("host", "127.0.0.1")
            .body(Empty::new())
            .unwrap();
        let response = within(sender.send_request(request)).await.unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(
            response.headers()["content-type"],
            "text/event-stream",
            "{:?}",
            response.headers()
        );
        Live {
            body: response.into_body(),
            pending: String::new(),
        }
    }

    /// The next event (keep-alive comments skipped).
    async fn next(&mut self) -> (String, serde_json::Value) {
        loop {
            if let Some(end) = self.pending.find("\n\n") {
                let block: String = self.pending.drain(..end + 2).collect();
                let mut name = String::new();
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(n) = line.strip_prefix("event: ") {
                        name = n.to_string();
                    } else if let Some(d) = line.strip_prefix("data: ") {
                        data.push_str(d);
                    }
                }
                if !data.is_empty() {
                    return (name, serde_json::from_str(&data).unwrap());
                }
                continue;
            }
            let frame = self
                .body
                .frame()
                .await
                .expect("the stream goes on")
                .unwrap();
            if let Ok(bytes) = frame.into_data() {
                self.pending.push_str(std::str::from_utf8(&bytes).unwrap());
            }
        }
    }

    /// Events until one satisfies `done`, within `patience`.
    async fn until(
        &mut self,
        patience: Duration,
        mut done: impl FnMut(&str, &serde_json::Value) -> bool,
    ) -> serde_json::Value {
        tokio::time::timeout(patience, async {
            loop {
                let (name, value) = self.next().await;
                if done(&name, &value) {
                    return value;
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no such event within {patience:?}"))
    }
}

fn with_metadata(id: &str, metadata: &str) -> pb::OpenSubscription {
    pb::OpenSubscription {
        metadata: metadata.into(),
        ..singleton(id)
    }
}

fn active_of(detail: &serde_json::Value) -> Option<(String, u64)> {
    let active = &detail["subscription"]["active"];
    let member = active["member"].as_str()?.to_string();
    let epoch = active["epoch"].as_str()?.parse().ok()?;
    Some((member, epoch))
}

const HOSTILE: &str = "<img src=x onerror=alert(1)>";

/// The timeline entry of `epoch` in a subscription's page.
fn reign(page: &serde_json::Value, epoch: u64) -> serde_json::Value {
    let epoch = epoch.to_string();
    page["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["epoch"] == epoch.as_str())
        .cloned()
        .unwrap_or_else(|| panic!("epoch {epoch} in {page}"))
}

// docs/operations.md#console: a subscription's page says who leads with which epoch, the line
// in order, and follows a failover live: the next member with a higher epoch, the ended epoch
// in the timeline with its cause.
#[tokio::test]
async fn the_console_shows_the_leader_and_follows_a_failover_live() {
    let server = TestServer::start().await;
    let console = server.console(ConsoleConfig::default()).await;
    let client = server.client().await;
    let id = "console-failover";
    let mut a = client.subscribe(with_metadata(id, HOSTILE)).await.unwrap();
    let first = a.confirmed().await;
    let _b = client.subscribe(with_metadata(id, "host=b")).await.unwrap();
    let mut live = Live::open(console, &format!("/api/stream?view=subscription&id={id}")).await;
    let shown = live
        .until(Duration::from_secs(10), |name, v| {
            name == "subscription" && v["line"].as_array().is_some_and(|l| l.len() == 2)
        })
        .await;
    assert_eq!(
        active_of(&shown),
        Some((first.member_id.to_string(), first.epoch))
    );
    // Hostile metadata is data: JSON carries it as the text it is, for the page's textContent.
    assert_eq!(shown["subscription"]["active"]["metadata"], HOSTILE);
    let line = shown["line"].as_array().unwrap();
    assert_eq!(line[0]["state"], "active");
    assert_eq!(line[1]["state"], "standby");
    assert_eq!(line[1]["metadata"], "host=b");
    assert!(line[1]["joined_ms"].as_u64().is_some());
    if crate::deployment::GATEWAYS {
        assert!(
            line.iter()
                .all(|m| m["gateway"].is_string() && m["here"] == true)
        );
    }
    drop(a);
    let after = live
        .until(Duration::from_secs(10), |_, v| {
            active_of(v).is_some_and(|(_, epoch)| epoch > first.epoch)
        })
        .await;
    let timeline = after["timeline"].as_array().unwrap();
    let ended = reign(&after, first.epoch);
    assert_eq!(ended["cause"], "closed stream");
    assert!(ended["end_ms"].as_u64().is_some());
    assert_eq!(timeline[0]["cause"], serde_json::Value::Null);
    assert_eq!(after["subscription"]["active"]["metadata"], "host=b");
}

// docs/operations.md#console: a hand-over asked from the console is the HandOver RPC: the
// standby leads with a higher epoch, and the timeline names the cause.
#[tokio::test]
async fn a_hand_over_from_the_console_is_named_in_the_timeline() {
    let server = TestServer::start().await;
    let console = server.console(ConsoleConfig::default()).await;
    let client = server.client().await;
    let id = "console-hand-over";
    let mut a = client.subscribe(singleton(id)).await.unwrap();
    let first = a.confirmed().await;
    let mut b = client.subscribe(singleton(id)).await.unwrap();
    let mut live = Live::open(console, &format!("/api/stream?view=subscription&id={id}")).await;
    live.until(Duration::from_secs(10), |_, v| {
        v["line"].as_array().is_some_and(|l| l.len() == 2)
    })
    .await;
    // Without the console's header an action is refused, and nothing changes.
    let refused = call(
        console,
        "POST",
        &format!("/api/subscriptions/{id}/hand-over"),
        &[],
    )
    .await;
    assert_eq!(refused.status, 403, "{}", refused.body);
    assert_eq!(refused.json()["code"], "PERMISSION_DENIED");
    let path = format!("/api/subscriptions/{id}/hand-over");
    let asked = call(console, "POST", &path, &[("x-tinybroker-console", "1")]);
    let (answer, confirmed) = tokio::join!(asked, b.confirmed());
    assert_eq!(answer.status, 200, "{}", answer.body);
    let answer = answer.json();
    assert_eq!(answer["member"], confirmed.member_id.to_string());
    assert_eq!(answer["epoch"], confirmed.epoch.to_string());
    assert_eq!(answer["previous_epoch"], first.epoch.to_string());
    let after = live
        .until(Duration::from_secs(10), |_, v| {
            active_of(v).is_some_and(|(_, epoch)| epoch == confirmed.epoch)
        })
        .await;
    let ended = reign(&after, first.epoch);
    assert_eq!(ended["cause"], "hand-over", "{after}");
}

// docs/operations.md#console: a delete from the console is DeleteSubscription: refused while
// members are joined (the gRPC code, as JSON), done once none is; a page open on it is told
// it is gone.
#[tokio::test]
async fn a_delete_from_the_console_answers_as_the_rpc_and_the_page_is_told() {
    let server = TestServer::start().await;
    let console = server.console(ConsoleConfig::default()).await;
    let client = server.client().await;
    let id = "console-delete";
    let mut a = client.subscribe(singleton(id)).await.unwrap();
    a.confirmed().await;
    let mut live = Live::open(console, &format!("/api/stream?view=subscription&id={id}")).await;
    live.until(Duration::from_secs(10), |name, _| name == "subscription")
        .await;
    let path = format!("/api/subscriptions/{id}/delete");
    let action = [("x-tinybroker-console", "1")];
    let refused = call(console, "POST", &path, &action).await;
    assert_eq!(refused.status, 409, "{}", refused.body);
    assert_eq!(refused.json()["code"], "FAILED_PRECONDITION");
    drop(a);
    within(async {
        loop {
            let answer = call(console, "POST", &path, &action).await;
            if answer.status == 200 {
                assert!(answer.json()["deleted_messages"].is_u64());
                return;
            }
            assert_eq!(answer.status, 409, "{}", answer.body);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    live.until(Duration::from_secs(10), |name, v| {
        name == "gone" && v["code"] == "NOT_FOUND"
    })
    .await;
    let gone = get(console, &format!("/api/subscriptions/{id}")).await;
    assert_eq!(gone.status, 404);
}

// docs/operations.md#console: the overview finds subscriptions by id, group, pattern or the
// leader's metadata, and pages them; every answer carries the security headers.
#[tokio::test]
async fn the_overview_searches_and_pages_and_every_answer_has_the_security_headers() {
    let server = TestServer::start().await;
    let console = server.console(ConsoleConfig::default()).await;
    let client = server.client().await;
    let mut members = Vec::new();
    for i in 0..3 {
        let mut m = client
            .subscribe(with_metadata(
                &format!("console-search-{i}"),
                &format!("rack={i}"),
            ))
            .await
            .unwrap();
        m.confirmed().await;
        members.push(m);
    }
    let found = within(async {
        loop {
            let answer = get(console, "/api/overview?q=RACK%3D1&page=1").await;
            assert_eq!(answer.status, 200);
            let json = answer.json();
            if json["total"] == 1 {
                return json;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert_eq!(found["subscriptions"][0]["id"], "console-search-1");
    assert_eq!(
        found["deployment"],
        if crate::deployment::GATEWAYS {
            "gateway"
        } else {
            "embedded"
        }
    );
    for path in [
        "/",
        "/assets/console.js",
        "/api/overview",
        "/nothing",
        "/api/stream?view=bad",
    ] {
        let answer = get(console, path).await;
        let csp = answer.headers["content-security-policy"].to_str().unwrap();
        assert!(
            csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"),
            "{path}: {csp}"
        );
        assert_eq!(answer.headers["x-content-type-options"], "nosniff");
    }
    assert_eq!(get(console, "/nothing").await.status, 404);
    assert_eq!(get(console, "/api/stream?view=bad").await.status, 400);
    let long = "x".repeat(10_000);
    let answer = get(console, &format!("/api/subscriptions/{long}")).await;
    assert_eq!(answer.status, 400, "{}", answer.body);
    assert_eq!(answer.json()["code"], "INVALID_ARGUMENT");
    let page = get(console, "/").await;
    assert!(page.body.contains("/assets/console.js") && !page.body.contains("<script>"));
}

// docs/operations.md#console: with a token every page and action needs it (Bearer, or Basic
// with it as password); read-only refuses actions and says so to the page.
#[tokio::test]
async fn the_token_guards_every_page_and_read_only_refuses_actions() {
    let server = TestServer::start().await;
    let console = server
        .console(ConsoleConfig {
            token: Some("s3cret".into()),
            read_only: true,
            ..ConsoleConfig::default()
        })
        .await;
    let client = server.client().await;
    let id = "console-guarded";
    let mut a = client.subscribe(singleton(id)).await.unwrap();
    a.confirmed().await;
    for path in ["/", "/assets/console.js", "/api/overview", "/api/stream"] {
        let answer = get(console, path).await;
        assert_eq!(answer.status, 401, "{path}");
        assert!(
            answer.headers["www-authenticate"]
                .to_str()
                .unwrap()
                .starts_with("Basic"),
        );
        let wrong = call(console, "GET", path, &[("authorization", "Bearer nope")]).await;
        assert_eq!(wrong.status, 401, "{path}");
    }
    let bearer = [("authorization", "Bearer s3cret")];
    let overview = call(console, "GET", "/api/overview", &bearer).await;
    assert_eq!(overview.status, 200);
    assert_eq!(overview.json()["read_only"], true);
    // "user:s3cret"
    let basic = call(
        console,
        "GET",
        "/",
        &[("authorization", "Basic dXNlcjpzM2NyZXQ=")],
    )
    .await;
    assert_eq!(basic.status, 200);
    let unauthenticated = call(
        console,
        "POST",
        &format!("/api/subscriptions/{id}/hand-over"),
        &[("x-tinybroker-console", "1")],
    )
    .await;
    assert_eq!(unauthenticated.status, 401);
    for action in ["hand-over", "delete"] {
        let refused = call(
            console,
            "POST",
            &format!("/api/subscriptions/{id}/{action}"),
            &[
                ("x-tinybroker-console", "1"),
                ("authorization", "Bearer s3cret"),
            ],
        )
        .await;
        assert_eq!(refused.status, 403, "{action}: {}", refused.body);
        assert!(
            refused.json()["error"]
                .as_str()
                .unwrap()
                .contains("read-only")
        );
    }
    // Nothing changed: the member still leads.
    assert!(
        client
            .describe(id)
            .await
            .unwrap()
            .members
            .iter()
            .any(|m| m.active)
    );
}

// docs/operations.md#console: an epoch that ends because a member of higher priority joined
// is named "priority" (embedded: the broker counts a priority step-down in `handovers` too,
// so the hub reads it as a hand-over).
#[tokio::test]
async fn a_higher_priority_join_is_named_priority_in_the_timeline() {
    let server = TestServer::start().await;
    let console = server.console(ConsoleConfig::default()).await;
    let client = server.client().await;
    let id = "console-priority";
    let mut low = client.subscribe(singleton(id)).await.unwrap();
    let first = low.confirmed().await;
    let mut live = Live::open(console, &format!("/api/stream?view=subscription&id={id}")).await;
    live.until(Duration::from_secs(10), |name, _| name == "subscription")
        .await;
    let mut high = client
        .subscribe(pb::OpenSubscription {
            priority: 5,
            ..singleton(id)
        })
        .await
        .unwrap();
    let second = high.confirmed().await;
    let after = live
        .until(Duration::from_secs(10), |_, v| {
            active_of(v).is_some_and(|(_, epoch)| epoch == second.epoch)
        })
        .await;
    let ended = reign(&after, first.epoch);
    assert_eq!(ended["cause"], "priority", "{after}");
}

embedded_only! {
// At a gateway the depth of a subscription with no member here is JetStream's, read at most
// every two seconds (docs/operations.md#console).
// docs/operations.md#console ("the API behind the page, for scripts"): a GET answers what is
// true now, not what the last look saw before the request (publishes do not wake the hub,
// and with no page open it does not look every second).
#[tokio::test]
async fn a_get_answers_the_depth_of_now_not_of_the_last_look() {
    let server = TestServer::start().await;
    let console = server.console(ConsoleConfig::default()).await;
    let client = server.client().await;
    let id = "console-stale";
    let mut a = client.subscribe(singleton(id)).await.unwrap();
    a.confirmed().await;
    drop(a);
    // The hub has seen the member leave (a change), and no page is open.
    within(async {
        loop {
            let answer = get(console, &format!("/api/subscriptions/{id}")).await;
            if answer.status == 200 && answer.json()["subscription"]["members"] == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for i in 0..3 {
        client.publish("jobs.a", &format!("m{i}")).await;
    }
    assert_eq!(
        client.describe(id).await.unwrap().queued_messages,
        queued_here(3)
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let answer = get(console, &format!("/api/subscriptions/{id}")).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.json()["subscription"]["depth"], 3, "{}", answer.body);
}
}

// docs/operations.md#console ("another site's page cannot"): a page of another name that
// resolves to the console (DNS rebinding) is same-origin with it and may set any header; the
// console must not act (nor answer data) for a Host that is not its own.
#[tokio::test]
async fn a_request_for_another_host_name_is_refused_without_a_token() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = TestServer::start().await;
    let console = server.console(ConsoleConfig::default()).await;
    let client = server.client().await;
    let id = "console-rebinding";
    let mut a = client.subscribe(singleton(id)).await.unwrap();
    let first = a.confirmed().await;
    let _b = client.subscribe(singleton(id)).await.unwrap();
    let port = console.port();
    let mut socket = tokio::net::TcpStream::connect(console).await.unwrap();
    socket
        .write_all(
            format!(
                "POST /api/subscriptions/{id}/hand-over HTTP/1.1\r\nHost: attacker.example:{port}\r\n\
                 Origin: http://attacker.example:{port}\r\nx-tinybroker-console: 1\r\n\
                 Content-Length: 0\r\nConnection: close\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let mut answer = String::new();
    within(socket.read_to_string(&mut answer)).await.unwrap();
    assert!(!answer.starts_with("HTTP/1.1 200"), "{answer}");
    let info = client.describe(id).await.unwrap();
    assert!(
        info.members
            .iter()
            .any(|m| m.active && m.member_id == first.member_id),
        "the leader was handed over by a foreign Host: {answer}"
    );
}

// docs/operations.md#console: "Refusals are {"error": ..., "code": ...}" (also those of
// axum's extractors: a repeated query key, a path that is not UTF-8).
#[tokio::test]
async fn every_refusal_is_json() {
    let server = TestServer::start().await;
    let console = server.console(ConsoleConfig::default()).await;
    for path in [
        "/api/overview?page=1&page=2",
        "/api/stream?view=overview&view=overview",
        "/api/subscriptions/%FF",
    ] {
        let answer = get(console, path).await;
        assert_eq!(answer.status, 400, "{path}");
        assert_eq!(
            answer.json()["code"],
            "INVALID_ARGUMENT",
            "{path}: {}",
            answer.body
        );
    }
    let put = call(console, "PUT", "/api/overview", &[]).await;
    assert_eq!(put.status, 405);
    assert_eq!(put.json()["code"], "UNIMPLEMENTED", "{}", put.body);
    // With a token, any name may address it (a page of another name has no token).
    let guarded = server
        .console(ConsoleConfig {
            token: Some("t".into()),
            ..ConsoleConfig::default()
        })
        .await;
    let by_name = call(
        guarded,
        "GET",
        "/api/overview",
        &[
            ("host", "broker.internal:50080"),
            ("authorization", "Bearer t"),
        ],
    )
    .await;
    assert_eq!(by_name.status, 200, "{}", by_name.body);
}

embedded_only! {
// docs/operations.md#console: when the gRPC listener serves TLS, the console serves HTTPS with
// the same certificate; a client that trusts its CA gets the page, plain HTTP gets nothing.
#[tokio::test]
async fn the_console_serves_https_with_the_listeners_certificate() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_rustls::rustls::{
        self, RootCertStore,
        crypto::ring,
        pki_types::{CertificateDer, ServerName, pem::PemObject},
    };
    let ca = crate::certs::Ca::new("console test CA");
    let leaf = ca.server();
    let server = TestServer::start().await;
    let acceptor =
        tinybroker::server::console_acceptor(&leaf.server_identity(), None).expect("acceptor");
    let console = server
        .console(ConsoleConfig {
            tls: Some(acceptor),
            ..ConsoleConfig::default()
        })
        .await;
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca.cert_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(console).await.unwrap();
    let mut tls = within(connector.connect(ServerName::try_from("localhost").unwrap(), tcp))
        .await
        .expect("the TLS handshake");
    tls.write_all(b"GET /api/overview HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    within(tls.read_to_string(&mut answer)).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"deployment\":\"embedded\""), "{answer}");
    // Plain HTTP to it is no HTTP answer.
    let mut plain = tokio::net::TcpStream::connect(console).await.unwrap();
    plain
        .write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut bytes = Vec::new();
    let _ = within(plain.read_to_end(&mut bytes)).await;
    assert!(!bytes.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&bytes));
}
}

// docs/operations.md#console: a proclamation (the active member's new metadata) reaches the
// page, the timeline and the overview, as a change of leadership does.
#[tokio::test]
async fn a_proclamation_reaches_the_page_the_overview_and_the_timeline() {
    let server = TestServer::start().await;
    let console = server.console(ConsoleConfig::default()).await;
    let client = server.client().await;
    let id = "console-proclaim";
    let mut a = client.subscribe(with_metadata(id, "before")).await.unwrap();
    let confirmed = a.confirmed().await;
    let mut live = Live::open(console, &format!("/api/stream?view=subscription&id={id}")).await;
    live.until(Duration::from_secs(10), |name, v| {
        name == "subscription" && active_of(v).is_some()
    })
    .await;
    within(client.0.clone().proclaim(pb::ProclaimRequest {
        subscription_id: id.into(),
        member_id: confirmed.member_id,
        epoch: confirmed.epoch,
        metadata: "after".into(),
    }))
    .await
    .unwrap();
    let shown = live
        .until(Duration::from_secs(5), |_, v| {
            v["subscription"]["active"]["metadata"] == "after"
        })
        .await;
    assert_eq!(reign(&shown, confirmed.epoch)["metadata"], "after");
    let overview = get(console, &format!("/api/overview?q={id}")).await.json();
    assert_eq!(
        overview["subscriptions"][0]["active"]["metadata"], "after",
        "{overview}"
    );
}

// docs/operations.md#console: nothing is sent to a page when nothing it shows moved, also with
// no subscription at all (a look that lists nothing new is no news).
#[tokio::test]
async fn nothing_changed_sends_no_event_even_with_no_subscriptions() {
    let server = TestServer::start().await;
    let console = server.console(ConsoleConfig::default()).await;
    let mut live = Live::open(console, "/api/stream?view=overview").await;
    live.next().await;
    // Two and a half ticks (and, at a gateway, a listing) with nothing happening.
    let next = tokio::time::timeout(Duration::from_millis(2500), live.next()).await;
    assert!(next.is_err(), "an event although nothing changed: {next:?}");
}
