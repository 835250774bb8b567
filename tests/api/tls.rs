//! TLS, mutual TLS and the bearer token, for real: certificates are made fresh by each test,
//! and the server, the library client and the CLI talk TLS to each other (docs/semantics.md#access "Security").

use std::path::{Path, PathBuf};

use tinybroker::{
    pb::{self, broker_client::BrokerClient},
    server::ServerConfig,
};
use tonic::transport::{Channel, ClientTlsConfig, Identity};

use crate::{
    binary,
    certs::Ca,
    harness::{Client, TestServer, singleton, within},
};

async fn tls_server(ca: &Ca, client_ca: Option<&Ca>) -> TestServer {
    TestServer::with_config(ServerConfig {
        tls: Some(ca.server().server_identity()),
        tls_client_ca: client_ca.map(Ca::certificate),
        ..ServerConfig::default()
    })
    .await
}

/// Connects over TLS trusting `ca`, presenting `identity` if given; the error if the
/// connection (including the handshake) fails.
async fn tls_client(
    server: &TestServer,
    ca: &Ca,
    identity: Option<Identity>,
) -> Result<Client, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(ca.certificate())
        .domain_name("localhost");
    if let Some(identity) = identity {
        tls = tls.identity(identity);
    }
    let channel = within(
        Channel::from_shared(format!("https://{}", server.addr))
            .unwrap()
            .tls_config(tls)?
            .connect(),
    )
    .await?;
    Ok(Client::of(BrokerClient::new(channel)))
}

/// One publish, failing if the connection or the call fails.
async fn publish_ok(client: Result<Client, tonic::transport::Error>) -> Result<(), String> {
    let client = client.map_err(|e| format!("connect: {e:?}"))?;
    client
        .try_publish("jobs.tls", b"x".to_vec())
        .await
        .map(|_| ())
        .map_err(|status| format!("publish: {status:?}"))
}

// A TLS server and a client trusting its CA: the whole publish → deliver → ack cycle works.
#[tokio::test]
async fn tls_client_with_the_ca_publishes_subscribes_and_acks() {
    let ca = Ca::new("broker CA");
    let server = tls_server(&ca, None).await;
    let client = tls_client(&server, &ca, None).await.unwrap();
    let mut member = client.subscribe(singleton("tls")).await.unwrap();
    member.confirmed().await;
    let id = client.publish("jobs.tls", "over tls").await.system_id;
    let message = member.message().await;
    assert_eq!(
        (message.system_id, &message.payload[..]),
        (id, &b"over tls"[..])
    );
    member.ack(id).await;
    let info = client.describe("tls").await.unwrap();
    assert_eq!(info.counters.unwrap().acked, 1);
}

// A plaintext client gets nowhere with a TLS server: the connection or the call fails.
#[tokio::test]
async fn plaintext_client_is_refused_by_a_tls_server() {
    let ca = Ca::new("broker CA");
    let server = tls_server(&ca, None).await;
    let outcome = async {
        let channel = Channel::from_shared(format!("http://{}", server.addr))
            .unwrap()
            .connect()
            .await
            .map_err(|e| format!("{e:?}"))?;
        Client::of(BrokerClient::new(channel))
            .try_publish("jobs.plain", b"x".to_vec())
            .await
            .map_err(|e| format!("{e:?}"))
    };
    let result = within(outcome).await;
    assert!(result.is_err(), "plaintext publish succeeded: {result:?}");
}

// A client that does not trust the server's CA refuses the server (and sends nothing).
#[tokio::test]
async fn client_refuses_a_server_certificate_from_another_ca() {
    let ca = Ca::new("broker CA");
    let stranger = Ca::new("some other CA");
    let server = tls_server(&ca, None).await;
    let result = publish_ok(tls_client(&server, &stranger, None).await).await;
    assert!(result.is_err(), "publish over untrusted TLS succeeded");
}

// Mutual TLS: with --tls-client-ca only clients presenting a certificate from that CA get in;
// no certificate, or one from another CA, is refused at the handshake.
#[tokio::test]
async fn mutual_tls_accepts_only_clients_with_a_certificate_from_the_ca() {
    let ca = Ca::new("broker CA");
    let clients = Ca::new("client CA");
    let stranger = Ca::new("some other CA");
    let server = tls_server(&ca, Some(&clients)).await;

    let trusted = clients.client("replica-1").identity();
    publish_ok(tls_client(&server, &ca, Some(trusted)).await)
        .await
        .expect("a client with a certificate from the client CA is accepted");

    let anonymous = publish_ok(tls_client(&server, &ca, None).await).await;
    assert!(anonymous.is_err(), "a client without a certificate got in");

    let forged = stranger.client("replica-1").identity();
    let forged = publish_ok(tls_client(&server, &ca, Some(forged)).await).await;
    assert!(
        forged.is_err(),
        "a client with a foreign certificate got in"
    );

    // The server's own certificate is from the server CA, not the client CA: refused too.
    let wrong_ca = ca.client("replica-1").identity();
    let wrong_ca = publish_ok(tls_client(&server, &ca, Some(wrong_ca)).await).await;
    assert!(
        wrong_ca.is_err(),
        "a client certified by the server CA got in"
    );
}

fn write(dir: &Path, name: &str, contents: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    path.to_str().unwrap().to_string()
}

/// A fresh directory for one test's files, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("tinybroker-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn text(output: &std::process::Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

// The binary end to end: `serve` with TLS, mutual TLS and a token file; `publish` with the CA,
// a client certificate and the token file gets through; without the token it is
// UNAUTHENTICATED; without a client certificate or over plaintext it is refused.
// Runs its own embedded `tinybroker serve` (cluster mode's binary is tested in tests/cluster/main.rs).
embedded_only! {
#[tokio::test]
async fn cli_talks_mutual_tls_with_a_token_file() {
    let dir = TempDir::new("cli-tls");
    let ca = Ca::new("broker CA");
    let clients = Ca::new("client CA");
    let server = ca.server();
    let client = clients.client("cli");
    let files = |name: &str, contents: &str| write(&dir.0, name, contents);
    let (ca_cert, server_cert, server_key) = (
        files("ca.pem", &ca.cert_pem),
        files("server.pem", &server.cert_pem),
        files("server.key", &server.key_pem),
    );
    let (client_ca, client_cert, client_key) = (
        files("client-ca.pem", &clients.cert_pem),
        files("client.pem", &client.cert_pem),
        files("client.key", &client.key_pem),
    );
    // A trailing newline, as an editor or `echo` leaves it, is not part of the token.
    let token_file = files("token", "s3cret\n");
    let (_broker, addr) = binary::serve(&[
        "--tls-cert",
        &server_cert,
        "--tls-key",
        &server_key,
        "--tls-client-ca",
        &client_ca,
        "--auth-token-file",
        &token_file,
    ])
    .await;
    let port = addr.rsplit(':').next().unwrap();
    let url = format!("https://localhost:{port}");
    let publish = |extra: &[&str]| {
        let mut args: Vec<String> = ["publish", "--server", &url, "--ca-cert", &ca_cert]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        args.extend(["jobs.cli".to_string(), "hello".to_string()]);
        args
    };
    let with_cert = ["--client-cert", &client_cert, "--client-key", &client_key];

    let mut args = with_cert.to_vec();
    args.extend(["--token-file", &token_file]);
    let ok = binary::run_client(publish(&args)).await;
    assert!(ok.status.success(), "{}", text(&ok));
    assert!(
        String::from_utf8_lossy(&ok.stdout).starts_with("published system_id="),
        "{}",
        text(&ok)
    );

    let no_token = binary::run_client(publish(&with_cert)).await;
    assert!(!no_token.status.success(), "{}", text(&no_token));
    assert!(
        String::from_utf8_lossy(&no_token.stderr)
            .to_lowercase()
            .contains("unauthenticated"),
        "{}",
        text(&no_token)
    );

    let mut args = with_cert.to_vec();
    args.extend(["--token", "wrong"]);
    let wrong_token = binary::run_client(publish(&args)).await;
    assert!(
        String::from_utf8_lossy(&wrong_token.stderr)
            .to_lowercase()
            .contains("unauthenticated"),
        "{}",
        text(&wrong_token)
    );

    let no_cert = binary::run_client(publish(&["--token-file", &token_file])).await;
    assert!(!no_cert.status.success(), "{}", text(&no_cert));

    let plaintext = binary::run_client(vec![
        "publish".into(),
        "--server".into(),
        format!("http://localhost:{port}"),
        "--token-file".into(),
        token_file.clone(),
        "jobs.cli".into(),
    ])
    .await;
    assert!(!plaintext.status.success(), "{}", text(&plaintext));
}
}

// The token given as a file: no `authorization` metadata or a wrong token is UNAUTHENTICATED,
// the file's token (without its trailing newline) is accepted.
// Runs its own embedded `tinybroker serve` (cluster mode's binary is tested in tests/cluster/main.rs).
embedded_only! {
#[tokio::test]
async fn token_file_is_enforced_by_the_binary() {
    let dir = TempDir::new("token-file");
    let token_file = write(&dir.0, "token", "t0ken-from-file\n");
    let (_broker, addr) = binary::serve(&["--auth-token-file", &token_file]).await;
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = BrokerClient::new(channel);
    let request = |token: Option<&str>| {
        let mut request = tonic::Request::new(pb::PublishRequest {
            topic: "jobs.token".into(),
            ..Default::default()
        });
        if let Some(token) = token {
            request
                .metadata_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
        }
        request
    };
    let missing = within(client.publish(request(None))).await.unwrap_err();
    assert_eq!(missing.code(), tonic::Code::Unauthenticated, "{missing:?}");
    let wrong = within(client.publish(request(Some("t0ken-from-fil"))))
        .await
        .unwrap_err();
    assert_eq!(wrong.code(), tonic::Code::Unauthenticated, "{wrong:?}");
    within(client.publish(request(Some("t0ken-from-file"))))
        .await
        .unwrap();
}
}

// Binding a non-loopback address with neither TLS nor a token is worth a warning at start.
// Runs its own embedded `tinybroker serve` (cluster mode's binary is tested in tests/cluster/main.rs).
embedded_only! {
#[tokio::test]
async fn exposed_plaintext_listener_without_token_warns_at_start() {
    let (mut broker, _addr) = binary::serve(&["--listen", "0.0.0.0:0"]).await;
    let warning = broker.line_with("neither TLS nor an auth token").await;
    assert!(warning.contains("WARN"), "{warning}");
}
}
