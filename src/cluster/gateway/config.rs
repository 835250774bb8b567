//! How a gateway is configured: where NATS is and how it connects, the stream's name and limits, and its timings
//! (`serve --nats …`'s flags), and the local broker's settings a gateway needs.

use std::time::Duration;

/// How a gateway reaches JetStream, and its timings.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// NATS server URLs, comma-separated (`nats://h1:4222,nats://h2:4222`).
    pub urls: String,
    /// The JetStream stream's name, also its subjects' prefix (`<stream>.<topic>`).
    pub stream: String,
    /// Stream replicas when the gateway creates the stream; 0 picks min(3, cluster size).
    pub replicas: usize,
    /// How long a QUEUE subscription outlives its last member on every gateway (its
    /// consumer's inactivity threshold).
    pub idle_timeout: Duration,
    /// How long JetStream waits for an ack before redelivering; held messages get progress
    /// acks every third of it, so this bounds how late a dead gateway's messages come back.
    pub ack_wait: Duration,
    /// How long an ack forwarded to the gateway holding its member may take to be answered.
    pub forward_timeout: Duration,
    /// The gateway lease (`--gateway-lease`): a gateway that cannot renew it within this long
    /// ends its singleton members' streams; others promote the next member after about this
    /// long plus a tenth. Singleton consumers wait half of it for an ack, so what a dead
    /// gateway held is redelivered before its successor is promoted.
    pub lease: Duration,
    /// How long a gateway whose lease lapsed keeps its singleton members, silent, while it
    /// tries to renew (`--gateway-lapse-patience`; docs/semantics.md#cluster-lease-lapse). 0
    /// (the default): it ends them at the lapse, so a member's stream ends before any other
    /// gateway can promote past it.
    pub lapse_patience: Duration,
    /// Most messages the stream keeps, across every subscription's backlog, when the gateway
    /// creates it (`--nats-max-messages`); a publish past it is refused.
    pub max_messages: i64,
    /// Most bytes the stream keeps when the gateway creates it (`--nats-max-bytes`); a publish
    /// past it is refused.
    pub max_bytes: i64,
    /// Most consumers the stream holds, when the gateway creates it (`--nats-max-consumers`):
    /// each subscription is one (each BROADCAST member one more), and the fence records one.
    /// nats-server 2.15 otherwise gives a stream 1,000.
    pub max_consumers: i32,
    /// How long a publish is sent again while JetStream does not confirm it (a stream leader
    /// being elected after a NATS node stopped), within the stream's duplicate window
    /// (`--nats-publish-timeout`).
    pub publish_timeout: Duration,
    /// How often the gateway pings a NATS server that sent nothing: one that does not answer
    /// three pings is left for another (`--nats-ping-interval`).
    pub ping_interval: Duration,
    /// The credential the gateway presents to NATS and the TLS it connects with
    /// (`--nats-creds`, `--nats-nkey`, `--nats-user`, `--nats-token`, `--nats-tls-*`).
    pub security: crate::cluster::security::NatsSecurity,
}

/// How long a connection to a NATS server may take to be greeted: the ping interval, at least
/// a second (a paused server accepts connections but never greets).
pub(super) fn connection_timeout(ping_interval: Duration) -> Duration {
    ping_interval.max(Duration::from_secs(1))
}

/// What a client's message may not use of NATS's `max_payload`: a dead letter adds six headers
/// (reason, subscription and topic of at most 256 bytes each, system id, attempts, the
/// gateway's origin marker) and their wire framing, about 1.1 KiB at most.
pub const DEAD_LETTER_HEADROOM: usize = 2048;

/// `--nats-max-messages`' default: ten subscriptions' worth of the embedded default queue.
pub const DEFAULT_MAX_MESSAGES: i64 = 1_000_000;
/// `--nats-max-consumers`' default: room for 100,000 subscriptions, a hundred times what
/// nats-server 2.15 gives a stream that sets no limit (one that sets none, or -1, gets 1,000).
pub const DEFAULT_MAX_CONSUMERS: i32 = 100_000;
/// `--nats-max-bytes`' default: the embedded broker's default memory budget.
pub const DEFAULT_MAX_BYTES: i64 = 1 << 30;

impl GatewayConfig {
    /// Defaults for everything but the URLs.
    pub fn new(urls: impl Into<String>) -> Self {
        Self {
            urls: urls.into(),
            stream: "tinybroker".into(),
            replicas: 0,
            idle_timeout: Duration::from_secs(300),
            ack_wait: Duration::from_secs(30),
            forward_timeout: Duration::from_secs(2),
            lease: Duration::from_secs(3),
            lapse_patience: Duration::ZERO,
            max_messages: DEFAULT_MAX_MESSAGES,
            max_bytes: DEFAULT_MAX_BYTES,
            max_consumers: DEFAULT_MAX_CONSUMERS,
            publish_timeout: Duration::from_secs(30),
            ping_interval: Duration::from_secs(1),
            security: Default::default(),
        }
    }
}

/// NATS server URLs, comma-separated, as `--nats` takes them.
///
/// # Errors
/// A sentence naming the URL that does not parse, or saying none was given.
pub fn parse_urls(urls: &str) -> Result<Vec<async_nats::ServerAddr>, String> {
    let urls = urls
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(|u| {
            u.parse::<async_nats::ServerAddr>()
                .map_err(|e| format!("--nats {u:?}: {e}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if urls.is_empty() {
        return Err("--nats needs at least one URL".into());
    }
    Ok(urls)
}

/// The broker settings a gateway needs: the local subscription expires as soon as its last
/// member leaves, so what it held goes back to JetStream for other gateways at once.
pub(super) fn local_limits(mut limits: crate::core::Limits) -> crate::core::Limits {
    limits.idle_timeout = Duration::ZERO;
    limits
}
