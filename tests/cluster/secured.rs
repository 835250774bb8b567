//! Gateways on a secured nats-server (docs/cluster.md#securing-the-connection-to-nats): for each
//! kind of credential, and for mutual TLS, the right one starts a gateway that serves, and a
//! wrong one fails the start with a message naming it. The least permissions the page lists
//! (read from the page itself) are enough for gateways to serve every mode, and each one taken
//! away fails the start, naming the subject NATS refused.

mod jwt;

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use tinybroker::{
    backend::Backend,
    clock::TokioClock,
    cluster::{
        gateway::{Gateway, GatewayConfig},
        security::{NatsCredential, NatsSecurity, NatsTls, Secret},
    },
    core::Limits,
    pb::DeliveryMode,
    server::{Server, ServerConfig},
};

use crate::{
    binary, certs::Ca, harness::TestServer, harness::open, harness::within,
    nats_server::NatsCluster, queue,
};

/// How long a start that must fail may take: an authorization violation ends it at once, a
/// permission refused as soon as NATS reports it (well within one JetStream request's 5 s).
const REFUSAL_PATIENCE: Duration = Duration::from_secs(10);

/// Files made for one test (credentials, seeds, certificates), removed when dropped.
struct Files {
    dir: PathBuf,
}

impl Files {
    fn new() -> Self {
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "secured-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Self { dir }
    }

    fn write(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.dir.join(name);
        std::fs::write(&path, contents).unwrap();
        path
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A gateway on `url` connecting with `security`, as `serve --nats` builds it.
async fn connect(url: &str, security: NatsSecurity) -> Result<Gateway, String> {
    let config = GatewayConfig {
        security,
        ..GatewayConfig::new(url)
    };
    Gateway::connect(config, Limits::default(), Arc::new(TokioClock::new())).await
}

/// The start's refusal: it must fail within [`REFUSAL_PATIENCE`].
async fn refused(url: &str, security: NatsSecurity) -> String {
    match tokio::time::timeout(REFUSAL_PATIENCE, connect(url, security.clone())).await {
        Ok(Ok(_)) => panic!("a gateway started with {security:?}"),
        Ok(Err(error)) => error,
        Err(_) => panic!("the start with {security:?} did not end within {REFUSAL_PATIENCE:?}"),
    }
}

/// The gateway serving the API, stopped as `serve` stops it.
async fn serve(gateway: Gateway) -> TestServer {
    let closing = gateway.clone();
    TestServer::run_then(
        Server::with_backend(ServerConfig::default(), Backend::Gateway(gateway)),
        async move { closing.close(Duration::from_secs(2)).await },
    )
    .await
}

/// A gateway with `security` serves: a QUEUE member gets what is published, and its ack is
/// taken.
async fn serves(url: &str, security: NatsSecurity) {
    let gateway = connect(url, security.clone())
        .await
        .unwrap_or_else(|e| panic!("a gateway with {security:?} did not start: {e}"));
    let server = serve(gateway).await;
    let client = server.client().await;
    let mut member = client.subscribe(queue("secured", 1)).await.unwrap();
    member.confirmed().await;
    let published = client.publish("orders.secured", "hello").await;
    let got = member.message().await;
    assert_eq!(
        (got.system_id, &got.payload[..]),
        (published.system_id, &b"hello"[..])
    );
    member.ack(got.system_id).await;
}

fn with(credential: NatsCredential) -> NatsSecurity {
    NatsSecurity {
        credential: Some(credential),
        tls: None,
    }
}

fn assert_names(error: &str, needles: &[&str]) {
    for needle in needles {
        assert!(error.contains(needle), "{needle:?} not in: {error}");
    }
}

// A user and password: from a file (in the process) and from the environment (the binary's
// TINYBROKER_NATS_PASSWORD); a wrong password, or none, fails the start naming the user and
// where its password came from.
#[tokio::test]
async fn a_user_and_password_connect_and_a_wrong_one_is_named() {
    let cluster = NatsCluster::start_configured(
        "authorization {\n  users: [ { user: gw, password: \"right-password\" } ]\n}\n",
    )
    .await;
    let url = cluster.client_url(0);
    let files = Files::new();
    let password = |path: PathBuf| NatsCredential::UserPassword {
        user: "gw".into(),
        password: Secret::File {
            flag: "--nats-password-file",
            path,
        },
    };
    let right = files.write("right", "right-password\n");
    serves(&url, with(password(right))).await;
    let (mut gateway, _) = binary::serve_with_env(
        &["--nats", &url, "--nats-user", "gw"],
        &[("TINYBROKER_NATS_PASSWORD", "right-password")],
    )
    .await;
    gateway.line_with("cluster mode").await;
    drop(gateway);
    let wrong = files.write("wrong", "wrong-password\n");
    let error = refused(&url, with(password(wrong.clone()))).await;
    assert_names(
        &error,
        &[
            "NATS refused the gateway's credentials",
            &format!(
                "--nats-user gw with the password of --nats-password-file {}",
                wrong.display()
            ),
            "authorization violation",
        ],
    );
    assert!(!error.contains("wrong-password"), "{error}");
    let error = refused(&url, NatsSecurity::default()).await;
    assert_names(
        &error,
        &["authorization violation", "no --nats-creds, --nats-nkey"],
    );
}

// A token: the right one starts a gateway; a wrong one, from a file, fails naming the file.
#[tokio::test]
async fn a_token_connects_and_a_wrong_one_is_named() {
    let cluster =
        NatsCluster::start_configured("authorization {\n  token: \"right-token\"\n}\n").await;
    let url = cluster.client_url(0);
    let files = Files::new();
    serves(
        &url,
        with(NatsCredential::Token(Secret::Value {
            from: "--nats-token (TINYBROKER_NATS_TOKEN)",
            value: "right-token".into(),
        })),
    )
    .await;
    let wrong = files.write("token", "wrong-token");
    let error = refused(
        &url,
        with(NatsCredential::Token(Secret::File {
            flag: "--nats-token-file",
            path: wrong.clone(),
        })),
    )
    .await;
    assert_names(
        &error,
        &[
            &format!("the token of --nats-token-file {}", wrong.display()),
            "authorization violation",
        ],
    );
}

// An nkey: the user's seed starts a gateway; another user's seed fails naming its file.
#[tokio::test]
async fn an_nkey_seed_connects_and_another_is_named() {
    let user = nkeys::KeyPair::new_user();
    let cluster = NatsCluster::start_configured(&format!(
        "authorization {{\n  users: [ {{ nkey: {} }} ]\n}}\n",
        user.public_key()
    ))
    .await;
    let url = cluster.client_url(0);
    let files = Files::new();
    let seed = files.write("user.nk", &user.seed().unwrap());
    serves(&url, with(NatsCredential::NkeySeedFile(seed))).await;
    let other = files.write("other.nk", &nkeys::KeyPair::new_user().seed().unwrap());
    let error = refused(&url, with(NatsCredential::NkeySeedFile(other.clone()))).await;
    assert_names(
        &error,
        &[
            &format!("--nats-nkey {}", other.display()),
            "authorization violation",
        ],
    );
}

// A credentials file, on a server in operator mode: a user of the account the server knows
// starts a gateway (through the binary's --nats-creds too); a user of an account it does not
// know fails naming the file.
#[tokio::test]
async fn a_credentials_file_connects_and_a_foreign_one_is_named() {
    let operator = jwt::Operator::new("test-operator");
    let account = operator.account("TINYBROKER");
    let system = operator.system_account();
    let cluster = NatsCluster::start_configured(&format!(
        "operator: \"{}\"\nsystem_account: {}\nresolver: MEMORY\nresolver_preload: {{\n  {}: \"{}\"\n  {}: \"{}\"\n}}\n",
        operator.jwt,
        system.public_key(),
        system.public_key(),
        system.jwt,
        account.public_key(),
        account.jwt
    ))
    .await;
    let url = cluster.client_url(0);
    let files = Files::new();
    let creds = files.write("gateway.creds", &account.user_creds("gateway"));
    serves(&url, with(NatsCredential::CredsFile(creds.clone()))).await;
    let creds_path = creds.display().to_string();
    let (mut gateway, _) = binary::serve(&["--nats", &url, "--nats-creds", &creds_path]).await;
    gateway.line_with("cluster mode").await;
    drop(gateway);
    let foreign = jwt::Operator::new("other-operator").account("OTHER");
    let other = files.write("other.creds", &foreign.user_creds("stranger"));
    let error = refused(&url, with(NatsCredential::CredsFile(other.clone()))).await;
    assert_names(
        &error,
        &[
            &format!("--nats-creds {}", other.display()),
            "authorization violation",
        ],
    );
}

// Mutual TLS (`verify: true`): the operator's CA and a client certificate it signed start a
// gateway; a client certificate of another CA, none, or a CA that did not sign the server's
// certificate fail the start, naming the certificate or the CA.
#[tokio::test]
async fn mutual_tls_connects_and_wrong_certificates_are_named() {
    let files = Files::new();
    let ca = Ca::new("nats-ca");
    let server = ca.server();
    let ca_file = files.write("ca.pem", &ca.cert_pem);
    let cluster = NatsCluster::start_configured(&format!(
        "tls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n  ca_file: \"{}\"\n  verify: true\n}}\n",
        files.write("server.pem", &server.cert_pem).display(),
        files.write("server-key.pem", &server.key_pem).display(),
        ca_file.display(),
    ))
    .await;
    let url = cluster.client_url(0);
    let client = ca.client("gateway");
    let client_files = (
        files.write("client.pem", &client.cert_pem),
        files.write("client-key.pem", &client.key_pem),
    );
    let tls = |ca: &Path, client: Option<(PathBuf, PathBuf)>| NatsSecurity {
        credential: None,
        tls: Some(NatsTls {
            ca: Some(ca.to_path_buf()),
            client,
        }),
    };
    serves(&url, tls(&ca_file, Some(client_files.clone()))).await;
    // The binary's flags and environment.
    let (ca_path, cert_path) = (
        ca_file.display().to_string(),
        client_files.0.display().to_string(),
    );
    let key_path = client_files.1.display().to_string();
    let (mut gateway, _) = binary::serve_with_env(
        &[
            "--nats",
            &url,
            "--nats-tls-ca",
            &ca_path,
            "--nats-tls-cert",
            &cert_path,
        ],
        &[("TINYBROKER_NATS_TLS_KEY", &key_path)],
    )
    .await;
    gateway.line_with("cluster mode").await;
    drop(gateway);

    let stranger = Ca::new("other-ca").client("gateway");
    let stranger_cert = files.write("stranger.pem", &stranger.cert_pem);
    let stranger_key = files.write("stranger-key.pem", &stranger.key_pem);
    let error = refused(
        &url,
        tls(&ca_file, Some((stranger_cert.clone(), stranger_key))),
    )
    .await;
    assert_names(
        &error,
        &[&format!(
            "the client certificate --nats-tls-cert {}",
            stranger_cert.display()
        )],
    );
    let error = refused(&url, tls(&ca_file, None)).await;
    assert_names(&error, &["no client certificate (--nats-tls-cert)"]);
    let other_ca = files.write("other-ca.pem", &Ca::new("not-the-servers").cert_pem);
    let error = refused(&url, tls(&other_ca, Some(client_files))).await;
    assert_names(
        &error,
        &[&format!(
            "checked against --nats-tls-ca {}",
            other_ca.display()
        )],
    );
}

/// The least-permission account and user docs/cluster.md lists, with `password`.
fn documented_permissions(password: &str) -> String {
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/cluster.md"))
        .expect("docs/cluster.md");
    let marker = "<!-- least-permissions: tests/cluster/secured.rs reads the conf block below -->";
    let after = page
        .split_once(marker)
        .unwrap_or_else(|| panic!("docs/cluster.md has no {marker:?}"))
        .1;
    let block = after
        .split_once("```conf\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("a ```conf block after the marker")
        .0;
    assert!(block.contains("\"CHANGE-ME\""), "{block}");
    block.replace("\"CHANGE-ME\"", &format!("\"{password}\""))
}

fn documented_user(files: &Files) -> NatsSecurity {
    with(NatsCredential::UserPassword {
        user: "tinybroker-gateway".into(),
        password: Secret::File {
            flag: "--nats-password-file",
            path: files.write("password", "gateway-password"),
        },
    })
}

// The documented least permissions are enough: two gateways through the user serve QUEUE
// (an ack forwarded between them) and SINGLETON, a subscription is deleted, and NATS refused
// nothing (its log has no violation).
#[tokio::test]
async fn the_documented_least_permissions_are_enough() {
    let cluster = NatsCluster::start_configured(&documented_permissions("gateway-password")).await;
    let url = cluster.client_url(0);
    let files = Files::new();
    let security = documented_user(&files);
    let a = serve(connect(&url, security.clone()).await.unwrap()).await;
    let b = serve(connect(&url, security).await.unwrap()).await;
    let (on_a, on_b) = (a.client().await, b.client().await);
    let mut member = on_a.subscribe(queue("orders", 1)).await.unwrap();
    member.confirmed().await;
    let first = on_b.publish("orders.new", "one").await;
    let got = member.message().await;
    assert_eq!(got.system_id, first.system_id);
    // Acked through the gateway that does not hold the member: forwarded.
    on_b.ack("orders", member.member_id, got.system_id)
        .await
        .unwrap();
    let mut leader = on_a
        .subscribe(open("jobs", DeliveryMode::Singleton, "g", &["jobs.*"]))
        .await
        .unwrap();
    leader.confirmed().await;
    let job = on_b.publish("jobs.one", "run").await;
    let got = leader.message().await;
    assert_eq!(got.system_id, job.system_id);
    leader.ack(got.system_id).await;
    // The leader's fenced publish: its fence record is read from the stream.
    let fenced = tinybroker::pb::PublishRequest {
        topic: "jobs.done".into(),
        payload: b"done".to_vec().into(),
        headers: Default::default(),
        fence: Some(tinybroker::pb::PublishFence {
            subscription_id: "jobs".into(),
            epoch: got.epoch,
        }),
    };
    within(on_b.1.clone().publish(fenced)).await.unwrap();
    let done = leader.message().await;
    assert_eq!(&done.payload[..], b"done");
    leader.ack(done.system_id).await;
    // What `status` and ListSubscriptions read: the consumers' info and list.
    on_b.describe("orders").await.unwrap();
    assert!(!on_b.list().await.subscriptions.is_empty());
    drop(member);
    within(async {
        loop {
            match crate::api::delete::delete(&on_b, "orders").await {
                // Until the member's leave has been applied at every gateway.
                Err(status) if status.code() == tonic::Code::FailedPrecondition => continue,
                other => break other.unwrap(),
            }
        }
    })
    .await;
    drop(leader);
    let logs = cluster.logs();
    assert!(!logs.contains("Violation"), "{logs}");
}

/// A permission of the documented set: in the publish list (the first occurrence) or the
/// subscribe list (the last).
enum Allowed {
    Publish(&'static str),
    Subscribe(&'static str),
}

/// The documented set without `removed`.
fn without(full: &str, removed: &Allowed) -> String {
    let (entry, at) = match removed {
        Allowed::Publish(entry) => (format!("\"{entry}\""), full.find(&format!("\"{entry}\""))),
        Allowed::Subscribe(entry) => (format!("\"{entry}\""), full.rfind(&format!("\"{entry}\""))),
    };
    let at = at.unwrap_or_else(|| panic!("{entry} is not in the documented set"));
    format!("{}{}", &full[..at], &full[at + entry.len()..])
}

// Each permission of the documented set taken away fails the start, naming the subject NATS
// refused: a JetStream call, a write to the coordination bucket, the gateways' requests to
// each other, and the subscriptions to the inbox replies come to and to the gateways' subjects.
#[tokio::test]
async fn a_missing_permission_fails_the_start_naming_the_subject() {
    let files = Files::new();
    let full = documented_permissions("gateway-password");
    for (removed, refusal) in [
        (
            Allowed::Publish("$JS.API.STREAM.CREATE.tinybroker"),
            "Permissions Violation for Publish to \"$JS.API.STREAM.CREATE.tinybroker\"",
        ),
        (
            Allowed::Publish("$KV.tinybroker-coordination.>"),
            "Permissions Violation for Publish to \"$KV.tinybroker-coordination.",
        ),
        (
            Allowed::Publish("_tinybroker.tinybroker.>"),
            "Permissions Violation for Publish to \"_tinybroker.tinybroker.",
        ),
        (
            Allowed::Subscribe("_INBOX.>"),
            "Permissions Violation for Subscription to \"_INBOX.",
        ),
        (
            Allowed::Subscribe("_tinybroker.tinybroker.>"),
            "Permissions Violation for Subscription to \"_tinybroker.tinybroker.",
        ),
        (
            Allowed::Subscribe("$JS.EVENT.ADVISORY.CONSUMER.*.tinybroker.*"),
            "Permissions Violation for Subscription to \"$JS.EVENT.ADVISORY.CONSUMER.",
        ),
    ] {
        let cluster = NatsCluster::start_configured(&without(&full, &removed)).await;
        let error = refused(&cluster.client_url(0), documented_user(&files)).await;
        assert_names(
            &error,
            &[
                "NATS refused the gateway a permission it needs",
                refusal,
                "--nats-user tinybroker-gateway",
            ],
        );
    }
}

// Flags that cannot work are refused before anything connects, naming them: two credentials
// at once, a user without a password, a file that cannot be read.
#[tokio::test]
async fn conflicting_or_unreadable_security_flags_are_named() {
    let run = |args: &[&str]| {
        let mut all = vec!["serve".to_string(), "--listen".into(), "127.0.0.1:0".into()];
        all.extend(["--nats", "nats://127.0.0.1:1"].map(String::from));
        all.extend(args.iter().map(|a| a.to_string()));
        binary::run_client(all)
    };
    let output = run(&["--nats-creds", "a.creds", "--nats-token-file", "t"]).await;
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert!(!output.status.success());
    assert_names(
        &stderr,
        &["--nats-creds", "--nats-token-file", "cannot be used with"],
    );
    let output = run(&["--nats-user", "gw"]).await;
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert!(!output.status.success());
    assert_names(&stderr, &["--nats-user gw needs a password"]);
    let output = run(&["--nats-nkey", "/nonexistent/gateway.nk"]).await;
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert!(!output.status.success());
    assert_names(
        &stderr,
        &["--nats-nkey /nonexistent/gateway.nk: cannot read it"],
    );
}
