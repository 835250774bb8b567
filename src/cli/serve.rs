//! `tinybroker serve`: flags and environment to a [`ServerConfig`], bind, run until SIGINT/SIGTERM.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::Args;
use tinybroker::{
    backend::Backend,
    cluster::gateway::{self, Gateway, GatewayConfig},
    core::Limits,
    metrics::Metrics,
    server::{Server, ServerConfig},
};

use super::{logging::LogFormat, nats_security::NatsSecurityArgs};

#[derive(Args)]
pub struct Serve {
    /// Address to listen on; port 0 picks a free port.
    #[arg(long, env = "TINYBROKER_LISTEN", default_value = "127.0.0.1:50051")]
    listen: SocketAddr,
    /// Largest message (payload + topic + headers), in bytes.
    #[arg(long, env = "TINYBROKER_MAX_MESSAGE_BYTES", default_value_t = Limits::default().max_message_bytes)]
    max_message_bytes: usize,
    /// Most messages in one PublishBatch.
    #[arg(long, env = "TINYBROKER_MAX_BATCH_MESSAGES", default_value_t = Limits::default().max_batch_messages)]
    max_batch_messages: usize,
    /// Most messages one subscription holds (queued + in flight).
    #[arg(long, env = "TINYBROKER_MAX_QUEUE_MESSAGES", default_value_t = Limits::default().max_queue_messages)]
    max_queue_messages: u64,
    /// Most bytes one subscription holds (queued + in flight).
    #[arg(long, env = "TINYBROKER_MAX_QUEUE_BYTES", default_value_t = Limits::default().max_queue_bytes)]
    max_queue_bytes: u64,
    /// Most live subscriptions.
    #[arg(long, env = "TINYBROKER_MAX_SUBSCRIPTIONS", default_value_t = Limits::default().max_subscriptions)]
    max_subscriptions: usize,
    /// Most members of one subscription.
    #[arg(long, env = "TINYBROKER_MAX_MEMBERS", default_value_t = Limits::default().max_members_per_subscription)]
    max_members: usize,
    /// Largest max_in_flight window a member may ask for.
    #[arg(long, env = "TINYBROKER_MAX_IN_FLIGHT", default_value_t = Limits::default().max_in_flight)]
    max_in_flight: u32,
    /// Broker-wide memory budget in bytes: every held message's size plus a fixed overhead per
    /// message, member and subscription (patterns included). Publishes and joins past it get
    /// RESOURCE_EXHAUSTED naming max_memory_bytes.
    #[arg(long, env = "TINYBROKER_MAX_MEMORY_BYTES", default_value_t = Limits::default().max_memory_bytes)]
    max_memory_bytes: u64,
    /// Percent of --max-memory-bytes (1 to 99) set aside for the messages of drop-oldest
    /// subscriptions (every ack-free one): past it they drop their oldest, and they never take
    /// the rest of the budget from reject-publish subscriptions.
    #[arg(long, env = "TINYBROKER_DROP_OLDEST_MEMORY_PERCENT", default_value_t = Limits::default().drop_oldest_memory_percent, value_parser = clap::value_parser!(u8).range(1..=99))]
    drop_oldest_memory_percent: u8,
    /// Most distinct wildcard shapes (a pattern prefix's token count and the positions of its
    /// `*`s) among all subscriptions' patterns, which bounds the work of routing a publish;
    /// a subscription past it gets RESOURCE_EXHAUSTED naming max_wildcard_shapes. Their table
    /// takes at most 24 bytes a shape, outside the memory budget.
    #[arg(long, env = "TINYBROKER_MAX_WILDCARD_SHAPES", default_value_t = Limits::default().max_wildcard_shapes)]
    max_wildcard_shapes: usize,
    /// How long a subscription without members keeps its queue (e.g. 300s, 10m).
    #[arg(long, env = "TINYBROKER_IDLE_TIMEOUT", default_value = "5m", value_parser = humantime::parse_duration)]
    idle_timeout: Duration,
    /// How long a SINGLETON's active member that hands over (HandOver, or a member of higher
    /// priority joined) has to settle what it holds before its successor gets it as on a
    /// failover (e.g. 10s, 1m).
    #[arg(long, env = "TINYBROKER_HANDOVER_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    handover_timeout: Duration,
    /// HTTP/2 keepalive ping interval; 0s disables keepalive.
    #[arg(long, env = "TINYBROKER_KEEPALIVE_INTERVAL", default_value = "10s", value_parser = humantime::parse_duration)]
    keepalive_interval: Duration,
    /// How long a keepalive ping may go unanswered before the connection's streams are closed.
    #[arg(long, env = "TINYBROKER_KEEPALIVE_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    keepalive_timeout: Duration,
    /// Require `authorization: Bearer <token>` on every Broker RPC [default: no token].
    #[arg(long, env = "TINYBROKER_AUTH_TOKEN", hide_env_values = true)]
    auth_token: Option<String>,
    /// Read the bearer token from this file (trailing newline trimmed), so it stays out of the
    /// process list [default: none].
    #[arg(
        long,
        env = "TINYBROKER_AUTH_TOKEN_FILE",
        conflicts_with = "auth_token"
    )]
    auth_token_file: Option<PathBuf>,
    /// Most open connections; more are closed at once and counted. Keep below `ulimit -n`.
    #[arg(long, env = "TINYBROKER_MAX_CONNECTIONS", default_value_t = ServerConfig::default().max_connections)]
    max_connections: usize,
    /// How long a new connection may take to send the HTTP/2 preface.
    #[arg(long, env = "TINYBROKER_HANDSHAKE_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    handshake_timeout: Duration,
    /// Most concurrent HTTP/2 streams per connection (each subscription member is one).
    #[arg(long, env = "TINYBROKER_MAX_CONCURRENT_STREAMS", default_value_t = ServerConfig::default().max_concurrent_streams)]
    max_concurrent_streams: u32,
    /// How long a request body may take to arrive in full.
    #[arg(long, env = "TINYBROKER_REQUEST_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    request_timeout: Duration,
    /// Most bytes held for request bodies still arriving, over all connections.
    #[arg(long, env = "TINYBROKER_MAX_PENDING_REQUEST_BYTES", default_value_t = ServerConfig::default().max_pending_request_bytes)]
    max_pending_request_bytes: usize,
    /// On shutdown, how long to wait for connections to drain before closing them.
    #[arg(long, env = "TINYBROKER_DRAIN_TIMEOUT", default_value = "5s", value_parser = humantime::parse_duration)]
    drain_timeout: Duration,
    /// PEM certificate chain; serve TLS (needs --tls-key) [default: plaintext].
    #[arg(long, env = "TINYBROKER_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key for --tls-cert [default: none].
    #[arg(long, env = "TINYBROKER_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// PEM CA certificate(s): require clients to present a certificate signed by one (mutual
    /// TLS; needs --tls-cert) [default: no client certificates asked for].
    #[arg(long, env = "TINYBROKER_TLS_CLIENT_CA", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics [default: off].
    #[arg(long, env = "TINYBROKER_METRICS_LISTEN")]
    metrics_listen: Option<SocketAddr>,
    /// Serve the live web console at http://ADDR/ (docs/operations.md#console), or `off`
    /// [default: 127.0.0.1:50080, skipped with a warning when that port is taken].
    #[arg(long, env = "TINYBROKER_CONSOLE", value_parser = parse_console)]
    console: Option<ConsoleListen>,
    /// The console shows, but offers no HandOver or DeleteSubscription.
    #[arg(long, env = "TINYBROKER_CONSOLE_READ_ONLY")]
    console_read_only: bool,
    /// Run as a cluster-mode gateway over these NATS servers (comma-separated URLs, e.g.
    /// nats://h1:4222,nats://h2:4222) [default: the embedded in-memory broker].
    #[arg(long, env = "TINYBROKER_NATS")]
    nats: Option<String>,
    /// Cluster mode: the JetStream stream holding every topic (subjects `<stream>.<topic>`).
    #[arg(long, env = "TINYBROKER_NATS_STREAM", default_value = "tinybroker")]
    nats_stream: String,
    /// Cluster mode: replicas of the stream when this gateway creates it; 0 is 3, or 1 on a
    /// cluster too small for 3.
    #[arg(long, env = "TINYBROKER_NATS_REPLICAS", default_value_t = 0)]
    nats_replicas: usize,
    /// Cluster mode: how long JetStream waits for an ack before redelivering (held messages are
    /// kept alive every third of it; this bounds how late a dead gateway's messages come back).
    #[arg(long, env = "TINYBROKER_NATS_ACK_WAIT", default_value = "30s", value_parser = humantime::parse_duration)]
    nats_ack_wait: Duration,
    /// Cluster mode: most messages the JetStream stream keeps (every subscription's backlog
    /// together) when this gateway creates it; publishes past it get RESOURCE_EXHAUSTED. A
    /// stream that exists keeps its own limits.
    #[arg(long, env = "TINYBROKER_NATS_MAX_MESSAGES", default_value_t = gateway::DEFAULT_MAX_MESSAGES, value_parser = clap::value_parser!(i64).range(1..))]
    nats_max_messages: i64,
    /// Cluster mode: most bytes the JetStream stream keeps when this gateway creates it;
    /// publishes past it get RESOURCE_EXHAUSTED. A stream that exists keeps its own limits.
    #[arg(long, env = "TINYBROKER_NATS_MAX_BYTES", default_value_t = gateway::DEFAULT_MAX_BYTES, value_parser = clap::value_parser!(i64).range(1..))]
    nats_max_bytes: i64,
    /// Cluster mode: most consumers the JetStream stream holds when this gateway creates it,
    /// or when it exists with no limit of its own: each subscription is one (each BROADCAST
    /// member one more). Past it, joins that need a new consumer get RESOURCE_EXHAUSTED.
    #[arg(long, env = "TINYBROKER_NATS_MAX_CONSUMERS", default_value_t = gateway::DEFAULT_MAX_CONSUMERS, value_parser = clap::value_parser!(i32).range(2..))]
    nats_max_consumers: i32,
    /// Cluster mode: how long a publish JetStream does not confirm is sent again (with its
    /// message id, so it is stored once) while the stream's leader moves, e.g. after a NATS
    /// node stopped; at most the stream's duplicate window. A request's gRPC deadline, when
    /// shorter, ends it first.
    #[arg(long, env = "TINYBROKER_NATS_PUBLISH_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    nats_publish_timeout: Duration,
    /// Cluster mode: how often the gateway pings its NATS server when it hears nothing from it;
    /// a server that leaves three pings unanswered (paused, cut off) is left for another.
    #[arg(long, env = "TINYBROKER_NATS_PING_INTERVAL", default_value = "1s", value_parser = humantime::parse_duration)]
    nats_ping_interval: Duration,
    /// Cluster mode: how long this gateway's lease lasts without renewal (renewed every third
    /// of it). A gateway that cannot renew ends its singleton members' streams with
    /// UNAVAILABLE; other gateways promote the next member once it has surely lapsed (about
    /// the lease plus a tenth). Between 300ms and 1h.
    #[arg(long, env = "TINYBROKER_GATEWAY_LEASE", default_value = "3s", value_parser = parse_lease)]
    gateway_lease: Duration,
    /// Cluster mode: how long a gateway whose lease lapsed keeps its singleton members, silent
    /// (nothing delivered, acks held), while it tries to renew; a renewal in time lets them go
    /// on. 0 (the default) ends them at the lapse, before any other gateway can promote.
    /// Longer survives the coordination bucket's leader election (4-9 s; 10s does), but a
    /// member's open stream then no longer means it leads: another may be promoted meanwhile
    /// if this gateway was cut off alone. At most 1h.
    #[arg(long, env = "TINYBROKER_GATEWAY_LAPSE_PATIENCE", default_value = "0s", value_parser = parse_lapse_patience)]
    gateway_lapse_patience: Duration,
    #[command(flatten)]
    nats_security: NatsSecurityArgs,
    /// Log line format on stderr.
    #[arg(long, env = "TINYBROKER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

fn read_file(path: &PathBuf) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))
}

/// The token in `path`: surrounding whitespace (an editor's trailing newline) is not part of it.
fn read_token(path: &PathBuf) -> Result<String, String> {
    let bytes = read_file(path)?;
    let text = String::from_utf8(bytes)
        .map_err(|_| format!("{}: the token must be UTF-8 text", path.display()))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(format!("{}: the token file is empty", path.display()));
    }
    Ok(token.to_string())
}

impl Serve {
    fn config(&self) -> Result<ServerConfig, String> {
        let limits = Limits {
            max_message_bytes: self.max_message_bytes,
            max_batch_messages: self.max_batch_messages,
            max_queue_messages: self.max_queue_messages,
            max_queue_bytes: self.max_queue_bytes,
            max_subscriptions: self.max_subscriptions,
            max_members_per_subscription: self.max_members,
            max_in_flight: self.max_in_flight.max(1),
            idle_timeout: self.idle_timeout,
            max_memory_bytes: self.max_memory_bytes,
            drop_oldest_memory_percent: self.drop_oldest_memory_percent,
            max_wildcard_shapes: self.max_wildcard_shapes,
            handover_timeout: self.handover_timeout,
            ..Limits::default()
        };
        let one =
            limits.max_message_bytes as u64 + tinybroker::core::subscription::MESSAGE_OVERHEAD;
        if limits.drop_oldest_memory_bytes() < one {
            return Err(format!(
                "--max-memory-bytes {} leaves drop-oldest subscriptions {} bytes (at most half the \
                 budget), less than one message of --max-message-bytes {}: raise the budget or \
                 lower the message size",
                limits.max_memory_bytes,
                limits.drop_oldest_memory_bytes(),
                limits.max_message_bytes
            ));
        }
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(tinybroker::server::TlsIdentity::from_pem(
                read_file(cert)?,
                read_file(key)?,
            )),
            _ => None,
        };
        let tls_client_ca = match &self.tls_client_ca {
            Some(path) => Some(tonic::transport::Certificate::from_pem(read_file(path)?)),
            None => None,
        };
        let auth_token = match &self.auth_token_file {
            Some(path) => Some(read_token(path)?),
            None => self.auth_token.clone().filter(|t| !t.is_empty()),
        };
        Ok(ServerConfig {
            max_request_bytes: ServerConfig::request_bytes_for(&limits),
            limits,
            keepalive_interval: (!self.keepalive_interval.is_zero())
                .then_some(self.keepalive_interval),
            keepalive_timeout: self.keepalive_timeout,
            auth_token,
            tls,
            tls_client_ca,
            max_connections: self.max_connections.max(1),
            handshake_timeout: self.handshake_timeout,
            max_concurrent_streams: self.max_concurrent_streams.max(1),
            request_timeout: self.request_timeout,
            max_pending_request_bytes: self.max_pending_request_bytes,
            drain_timeout: self.drain_timeout,
            ..ServerConfig::default()
        })
    }
}

async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut stream) => {
                stream.recv().await;
            }
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
        () = terminate => tracing::info!("SIGTERM received"),
    }
}

/// Where the console listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ConsoleListen {
    At(SocketAddr),
    Off,
}

/// The console's address when `--console` is not given.
const DEFAULT_CONSOLE: &str = "127.0.0.1:50080";

fn parse_console(text: &str) -> Result<ConsoleListen, String> {
    if text.eq_ignore_ascii_case("off") {
        return Ok(ConsoleListen::Off);
    }
    text.parse().map(ConsoleListen::At).map_err(|e| {
        format!("{text}: the console address must be HOST:PORT (e.g. 127.0.0.1:50080) or off: {e}")
    })
}

/// The console's listener: the one asked for (an address that cannot be bound fails the
/// start), or the default one when free (when taken, a warning and no console).
async fn console_listener(
    asked: Option<ConsoleListen>,
) -> Result<Option<tokio::net::TcpListener>, String> {
    match asked {
        Some(ConsoleListen::Off) => Ok(None),
        Some(ConsoleListen::At(addr)) => tokio::net::TcpListener::bind(addr)
            .await
            .map(Some)
            .map_err(|e| format!("cannot listen for the console on {addr}: {e}")),
        None => match tokio::net::TcpListener::bind(DEFAULT_CONSOLE).await {
            Ok(listener) => Ok(Some(listener)),
            Err(error) => {
                tracing::warn!(
                    addr = DEFAULT_CONSOLE,
                    %error,
                    "no console: its default address {DEFAULT_CONSOLE} is taken ({error}); choose one with --console HOST:PORT, or --console off"
                );
                Ok(None)
            }
        },
    }
}

fn parse_lease(text: &str) -> Result<Duration, String> {
    let lease = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if !(Duration::from_millis(300)..=Duration::from_secs(3600)).contains(&lease) {
        return Err(format!(
            "{text}: the gateway lease must be between 300ms and 1h"
        ));
    }
    Ok(lease)
}

fn parse_lapse_patience(text: &str) -> Result<Duration, String> {
    let patience = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if patience > Duration::from_secs(3600) {
        return Err(format!(
            "{text}: the gateway lapse patience must be at most 1h"
        ));
    }
    Ok(patience)
}

/// The listen backlog (the kernel caps it at `net.core.somaxconn`).
const LISTEN_BACKLOG: u32 = 1024;

/// A socket bound to `addr` (as `TcpListener::bind` binds: address reuse on), not listening.
fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpSocket> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    Ok(socket)
}

pub async fn run(args: Serve) -> Result<(), String> {
    let config = args.config()?;
    // Bound at once (a taken address fails the start before anything else), listening only
    // once the backend can serve: until then a client's connection is refused, not left
    // waiting in the backlog while a gateway connects to NATS and takes its lease.
    let socket = bind(args.listen).map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let addr = socket.local_addr().map_err(|e| e.to_string())?;
    let tls = (config.tls.is_some(), config.tls_client_ca.is_some());
    let auth = config.auth_token.is_some();
    // The one choice of deployment. Beside the backend: the run's id floor, as a number and
    // as the time it stands for (an operator comparing ids across restarts, or suspecting the
    // clock went back, compares these lines), and what a gateway says of its cluster. A
    // gateway's floor is random instead (member ids unique across gateways; epochs and system
    // ids come from the cluster).
    let (backend, ids, cluster) = match &args.nats {
        Some(urls) => {
            let gateway = Gateway::connect(
                GatewayConfig {
                    stream: args.nats_stream.clone(),
                    replicas: args.nats_replicas,
                    idle_timeout: args.idle_timeout,
                    ack_wait: args.nats_ack_wait.max(Duration::from_secs(1)),
                    lease: args.gateway_lease,
                    lapse_patience: args.gateway_lapse_patience,
                    max_messages: args.nats_max_messages,
                    max_bytes: args.nats_max_bytes,
                    max_consumers: args.nats_max_consumers,
                    publish_timeout: args.nats_publish_timeout,
                    ping_interval: args.nats_ping_interval.max(Duration::from_millis(100)),
                    security: args.nats_security.security()?,
                    ..GatewayConfig::new(urls.clone())
                },
                config.limits.clone(),
                config.clock.clone(),
            )
            .await?;
            let floor = gateway.broker().id_floor().unix_micros();
            let ids = format!("member ids start above {floor}, random for this gateway");
            let (stream, replicas) = gateway.stream();
            let storage = gateway.storage();
            let connected_to = gateway.connected_to();
            let floors = gateway.id_floors();
            let cluster = move || {
                tracing::info!(
                    nats = %urls,
                    %connected_to,
                    %stream,
                    replicas,
                    "cluster mode: a gateway over NATS JetStream, connected to {connected_to} (stream {stream}, {replicas} replicas)",
                );
                log_cluster_floors(&stream, floors);
                if let tinybroker::backend::Storage::JetStream {
                    storage,
                    max_consumers,
                    ..
                } = &storage
                {
                    tracing::info!(
                        %stream,
                        storage,
                        replicas,
                        max_consumers,
                        "what a confirmed publish survives: the stream {stream} keeps it in {storage} storage on {replicas} replica(s); whether it outlives a power loss is the servers' fsync policy (sync_interval; default every two minutes), which they do not tell clients: see docs/cluster.md#durability",
                    );
                }
            };
            (Backend::Gateway(gateway), ids, Some(cluster))
        }
        None => {
            let server = Server::new(config.clone());
            let floor = server.broker().id_floor().unix_micros();
            let started = std::time::UNIX_EPOCH + std::time::Duration::from_micros(floor);
            let ids = format!(
                "ids start above {floor}: the start time, {}, in µs since the Unix epoch",
                humantime::format_rfc3339_micros(started)
            );
            (server.backend().clone(), ids, None)
        }
    };
    let listener = socket
        .listen(LISTEN_BACKLOG)
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let floor = backend.broker().id_floor().unix_micros();
    let console_material = (
        config.tls.clone(),
        config.tls_client_ca.clone(),
        config.auth_token.clone(),
        config.clock.clone(),
    );
    let server = Server::with_backend(config, backend.clone());
    tracing::info!(
        %addr,
        tls = tls.0,
        mutual_tls = tls.1,
        auth,
        id_floor = floor,
        "tinybroker listening on {addr} ({ids})",
    );
    if let Some(cluster) = cluster {
        cluster();
    }
    if !addr.ip().is_loopback() && !tls.0 && !auth {
        tracing::warn!(
            %addr,
            "listening on a non-loopback address with neither TLS nor an auth token: anyone who \
             can reach it can publish, consume and ack; set --tls-cert/--tls-key and \
             --auth-token-file"
        );
    }
    let console = console_listener(args.console).await?;
    let (console_identity, console_client_ca, console_token, console_clock) = console_material;
    let console_task = match console {
        Some(console_listener) => {
            let console_tls = match &console_identity {
                Some(identity) => Some(
                    tinybroker::server::console_acceptor(identity, console_client_ca.as_ref())
                        .map_err(|e| format!("console: {e}"))?,
                ),
                None => None,
            };
            let scheme = if console_tls.is_some() {
                "https"
            } else {
                "http"
            };
            let bound = console_listener.local_addr().map_err(|e| e.to_string())?;
            let console_config = tinybroker::console::ConsoleConfig {
                token: console_token.as_deref().map(std::sync::Arc::from),
                read_only: args.console_read_only,
                tls: console_tls,
                ..tinybroker::console::ConsoleConfig::default()
            };
            tracing::info!(
                addr = %bound,
                read_only = args.console_read_only,
                "console at {scheme}://{bound}/"
            );
            if !bound.ip().is_loopback() && console_token.is_none() {
                tracing::warn!(
                    addr = %bound,
                    "the console listens on a non-loopback address with no auth token: anyone who can reach it sees every subscription and can hand over or delete; set --auth-token-file or --console-read-only"
                );
            }
            Some(tokio::spawn(tinybroker::console::serve(
                backend.clone(),
                console_clock,
                server.transport_stats(),
                console_config,
                console_listener,
                std::future::pending(),
            )))
        }
        None => None,
    };
    let incoming = tinybroker::server::tcp_incoming(listener);
    let result = match args.metrics_listen {
        Some(metrics_addr) => {
            let metrics = Metrics::new(server.broker(), server.transport_stats());
            let metrics_listener = tokio::net::TcpListener::bind(metrics_addr)
                .await
                .map_err(|e| format!("cannot listen for metrics on {metrics_addr}: {e}"))?;
            let bound = metrics_listener.local_addr().map_err(|e| e.to_string())?;
            tracing::info!(addr = %bound, "metrics at http://{bound}/metrics");
            let exporter = tokio::spawn(
                metrics
                    .clone()
                    .serve(metrics_listener, std::future::pending()),
            );
            let result = server.run(incoming, shutdown_signal()).await;
            exporter.abort();
            result
        }
        None => server.run(incoming, shutdown_signal()).await,
    };
    if let Some(console) = console_task {
        console.abort();
    }
    // A gateway gives back what it still holds, so other gateways get it at once.
    backend.close(Duration::from_secs(2)).await;
    result.map_err(|e| e.to_string())?;
    tracing::info!("tinybroker stopped");
    Ok(())
}

/// Logs where the cluster's ids start (docs/semantics.md#cluster-restart-identity): system ids
/// above the stream's creation time, epochs above this gateway's start. A stream made before
/// ids had a floor counts from 1, and is named at warn level with the way out.
fn log_cluster_floors(stream: &str, (messages, epochs): (Option<u64>, u64)) {
    let at = |micros: u64| {
        humantime::format_rfc3339_micros(
            std::time::UNIX_EPOCH + std::time::Duration::from_micros(micros),
        )
    };
    match messages {
        Some(messages) => tracing::info!(
            system_id_floor = messages,
            epoch_floor = epochs,
            "system ids start above {messages} and epochs above {epochs}: the stream's creation, {}, and this gateway's start, {}, in µs since the Unix epoch",
            at(messages),
            at(epochs),
        ),
        None => tracing::warn!(
            %stream,
            epoch_floor = epochs,
            "the stream {stream} was made before ids had a floor: its system ids count from 1, below those of an embedded broker or of an earlier cluster, so a consumer that deduplicates by system id may skip new messages; delete it (`nats stream rm {stream}`) while no gateway runs, and the next gateway makes it again above the time it is made (epochs are above {epochs}, this gateway's start, either way)",
        ),
    }
}
