//! Cluster mode's gateway (SPEC §9): `tinybroker serve --nats URLS` serves the gRPC API over a
//! NATS JetStream cluster, for publishes and subscriptions of every mode. Any number of
//! gateways serve the same subscriptions.
//!
//! # What we chose and why
//! - **One stream** (file storage, replicas = min(3, cluster size) unless `--nats-replicas`
//!   says otherwise) holds every topic under the subjects `<stream>.<topic>`. Topics are
//!   already NATS-shaped (dot-separated tokens without whitespace, `*` or `>`), so the mapping
//!   is the identity behind the prefix, and patterns become filter subjects as they are. The
//!   stream's retention is **interest**: a message no subscription's consumer wants is not
//!   kept (as the embedded broker keeps no message published before a matching subscription),
//!   and one every consumer has acked is removed.
//! - **A publish is confirmed once JetStream stored it** (its `PubAck`); its `system_id` is the
//!   stream sequence, the name every gateway uses for that message. `queued_for` is not known
//!   to a gateway (consumers live on other gateways too) and is 0.
//! - **The per-gateway broker is reused, not forked.** Each gateway keeps its local
//!   [`Broker`] for member streams, windows, fences, ack carriages and frames. A subscription
//!   with local members has a durable JetStream pull consumer and a bridge task
//!   ([`bridge`]) that pulls only as many messages as the local members have window for and
//!   injects each into the local subscription ([`Broker::inject`]), with JetStream's delivery
//!   count as its attempt. What the local core decides comes back through the broker's
//!   observer seam: an ack becomes a JetStream ack, a drop a `TERM`, and what the gateway
//!   holds when its last local member leaves is given back with a `NAK` (the local
//!   subscription expires at once in cluster mode; the cluster-wide idle time is the
//!   consumer's inactivity threshold, `--idle-timeout`). While held, messages get progress
//!   acks every `ack_wait / 3`, so JetStream redelivers only what a dead gateway held.
//! - **QUEUE**: one consumer per subscription id, shared by every gateway, so JetStream gives
//!   each message to one gateway and that gateway's core to one member. Its settings are kept
//!   in the consumer's metadata, so a join on any gateway with other patterns, mode or group is
//!   `FAILED_PRECONDITION` saying what differs.
//! - **BROADCAST**: a broadcast id names one stream (SPEC §3), so its consumer is this
//!   gateway's own (named with the gateway's id) and gets every matching message. The
//!   `ALREADY_EXISTS` check for a second live stream on one id is per gateway.
//! - **A join waits for every replica of its consumer** (`await_replicas`): a server that
//!   has not applied the consumer's creation keeps nothing for it, yet confirms publishes when
//!   it leads the stream.
//! - **Redelivery**: a nack or a member leaving requeues at the head of the gateway's local
//!   queue while it has other members there (attempt + 1, as in the embedded broker); a
//!   message given back to JetStream comes again with JetStream's delivery count.
//! - **Acks with `member_id` work at any gateway**: one that did not admit the member forwards
//!   the ack over NATS request/reply to the one that did, found by the member id's high
//!   bits ([`forward`]), which answers as the member's own connection would be answered. The
//!   two-field ack is fenced by the connection, so it works
//!   only on the gateway holding the member's stream; elsewhere it is refused, saying so.
//! - **SINGLETON**: one consumer per subscription id, shared like QUEUE's, and a line across
//!   gateways kept in a KV bucket by each gateway's coordinator ([`singleton`]). The local
//!   subscription is arbitrated: its members join on standby and only the coordinator makes
//!   one active, with the cluster's epoch. A gateway whose active member leaves gives back
//!   what it holds before the coordinator promotes the next member ([`bridge`]), and singleton
//!   consumers wait half the gateway lease for acks, so the in-flight messages come first.
//! - **Dead letters** are stored in JetStream by the bridge before their message is
//!   terminated; a standby's notice (`notify_standby`) names its place in the cluster's line.

mod bridge;
mod describe;
mod forward;
pub mod names;
pub mod publish;
pub mod singleton;

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use async_nats::{
    HeaderMap, HeaderName, HeaderValue,
    jetstream::{
        self,
        consumer::{self, AckPolicy, DeliverPolicy, PullConsumer},
        stream::{DiscardPolicy, RetentionPolicy, StorageType},
    },
};
pub use bridge::Router;
use tonic::Status;

use crate::{
    broker::{Broker, ConnectionId, Fence, MemberStream, Published},
    core::{AckMode, Draft, Error, Mode, OpenRequest},
    service,
};

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
    /// Most messages the stream keeps, across every subscription's backlog, when the gateway
    /// creates it (`--nats-max-messages`); a publish past it is refused.
    pub max_messages: i64,
    /// Most bytes the stream keeps when the gateway creates it (`--nats-max-bytes`); a publish
    /// past it is refused.
    pub max_bytes: i64,
}

/// What a client's message may not use of NATS's `max_payload`: a dead letter adds six headers
/// (reason, subscription and topic of at most 256 bytes each, system id, attempts, the
/// gateway's origin marker) and their wire framing, about 1.1 KiB at most.
pub const DEAD_LETTER_HEADROOM: usize = 2048;

/// `--nats-max-messages`' default: ten subscriptions' worth of the embedded default queue.
pub const DEFAULT_MAX_MESSAGES: i64 = 1_000_000;
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
            max_messages: DEFAULT_MAX_MESSAGES,
            max_bytes: DEFAULT_MAX_BYTES,
        }
    }
}

/// What every part of the gateway shares.
struct Shared {
    client: async_nats::Client,
    js: jetstream::Context,
    broker: Broker,
    prefix: String,
    /// The largest message a client may publish here, as the broker counts size: below the
    /// NATS servers' `max_payload` by [`DEAD_LETTER_HEADROOM`], so its dead letter fits too.
    largest_message: usize,
    /// The line to the singleton coordinator.
    singletons: Option<singleton::Handle>,
}

/// A running gateway: cheap to clone.
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

struct Inner {
    shared: Arc<Shared>,
    stream: jetstream::stream::Stream,
    router: Arc<Router>,
    /// Names this gateway's own consumers (BROADCAST).
    id: String,
    config: GatewayConfig,
    bridges: tokio::sync::Mutex<tokio::task::JoinSet<()>>,
    responder: tokio::task::JoinHandle<()>,
    /// Routes found gone: their settles get one try (`forward`).
    gone_routes: forward::GoneRoutes,
    coordination: tokio::task::JoinHandle<()>,
    /// The coordination bucket, read by `describe` for a singleton's line.
    backplane: crate::cluster::nats::NatsBackplane,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("id", &self.inner.id)
            .field("stream", &self.inner.config.stream)
            .finish_non_exhaustive()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.responder.abort();
        self.coordination.abort();
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
pub fn local_limits(mut limits: crate::core::Limits) -> crate::core::Limits {
    limits.idle_timeout = Duration::ZERO;
    limits
}

fn unavailable(what: &str, error: impl std::fmt::Display) -> Status {
    Status::unavailable(service::cap_message(format!("{what}: {error}")))
}

impl Gateway {
    /// Connects to NATS, makes sure the stream exists, and starts answering forwarded acks.
    /// `broker` must have been built with `router` as its observer and [`local_limits`].
    ///
    /// # Errors
    /// A sentence saying what failed: bad URLs or stream name, NATS unreachable, JetStream
    /// disabled or refusing the stream.
    pub async fn connect(
        config: GatewayConfig,
        broker: Broker,
        router: Arc<Router>,
    ) -> Result<Self, String> {
        if config.stream.is_empty()
            || !config
                .stream
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(format!(
                "--nats-stream {:?}: use letters, digits, '-' and '_' only",
                config.stream
            ));
        }
        let urls = parse_urls(&config.urls)?;
        // Each start-up step logs at debug with the time since start: a gateway slow to
        // listen says which NATS request it waited on.
        let started = std::time::Instant::now();
        let client = async_nats::ConnectOptions::new()
            .name("tinybroker-gateway")
            .connect(urls)
            .await
            .map_err(|e| format!("cannot connect to NATS at {}: {e}", config.urls))?;
        let max_payload = client.server_info().max_payload;
        let max_message = broker.limits().max_message_bytes;
        let largest_message = max_message.min(max_payload.saturating_sub(DEAD_LETTER_HEADROOM));
        if largest_message < max_message {
            tracing::info!(
                max_message_bytes = max_message,
                max_payload,
                largest_message,
                "messages above {largest_message} bytes are refused with INVALID_ARGUMENT: the NATS servers' max_payload {max_payload} less {DEAD_LETTER_HEADROOM} bytes kept for a dead letter's headers (--max-message-bytes is {max_message})"
            );
        }
        tracing::debug!(elapsed = ?started.elapsed(), "gateway start: connected to NATS");
        let js = jetstream::new(client.clone());
        let stream = ensure_stream(&js, &config).await?;
        tracing::debug!(elapsed = ?started.elapsed(), "gateway start: stream {} found or created", config.stream);
        await_stream(&js, &config.stream).await?;
        tracing::debug!(elapsed = ?started.elapsed(), "gateway start: stream {} answers publishes", config.stream);
        let id = format!(
            "{:x}{:x}",
            broker.id_floor().unix_micros(),
            std::process::id()
        );
        let backplane = crate::cluster::nats::NatsBackplane::open(
            client.clone(),
            &crate::cluster::nats::NatsConfig {
                bucket: format!("{}-coordination", config.stream),
                // The stream's own, which every gateway reads alike (a count from the servers
                // a client learned can differ between gateways started together, and a bucket
                // created twice with different settings is refused).
                replicas: Some(stream.cached_info().config.num_replicas),
                ..crate::cluster::nats::NatsConfig::new(Vec::<String>::new())
            },
        )
        .await
        .map_err(|e| e.to_string())?;
        tracing::debug!(elapsed = ?started.elapsed(), "gateway start: coordination bucket bound");
        let (singletons, coordination) = singleton::spawn(
            backplane.clone(),
            broker.clone(),
            singleton::config(config.lease),
        );
        let shared = Arc::new(Shared {
            client: client.clone(),
            js: js.clone(),
            broker: broker.clone(),
            prefix: config.stream.clone(),
            largest_message,
            singletons: Some(singletons),
        });
        let responder = forward::serve(&client, &config.stream, broker).await?;
        tracing::debug!(elapsed = ?started.elapsed(), "gateway start: serving forwarded acks");
        Ok(Self {
            inner: Arc::new(Inner {
                shared,
                stream,
                router,
                id,
                config,
                bridges: tokio::sync::Mutex::new(tokio::task::JoinSet::new()),
                responder,
                gone_routes: forward::GoneRoutes::default(),
                coordination,
                backplane,
            }),
        })
    }

    /// The server this gateway is connected to now (for the start-up log line).
    pub fn connected_to(&self) -> String {
        let info = self.inner.shared.client.server_info();
        format!("{}:{} ({})", info.host, info.port, info.server_name)
    }

    /// The stream's name and replicas.
    pub fn stream(&self) -> (String, usize) {
        let config = &self.inner.stream.cached_info().config;
        (config.name.clone(), config.num_replicas)
    }

    /// Publishes one message to JetStream; confirmed once JetStream stored it. A publish no
    /// server answered is sent again for a bounded time ([`publish::NO_RESPONDERS_PATIENCE`]).
    ///
    /// # Errors
    /// `INVALID_ARGUMENT` for a header NATS cannot carry, `UNAVAILABLE` when JetStream does
    /// not confirm.
    pub async fn publish(&self, draft: Draft) -> Result<Published, Status> {
        self.check_size(&draft)?;
        publish::publish(&self.inner.shared, draft).await
    }

    /// Refuses a message larger than this gateway takes from clients (counted as a rejected
    /// publish): one that fits NATS's `max_payload` with room for the headers a dead letter
    /// adds, so a message the gateway took can always be dead-lettered.
    ///
    /// # Errors
    /// `INVALID_ARGUMENT` naming both limits.
    pub fn check_size(&self, draft: &Draft) -> Result<(), Status> {
        let shared = &self.inner.shared;
        let size = draft.envelope().size() + draft.payload().len();
        if size <= shared.largest_message {
            return Ok(());
        }
        shared.broker.count_rejected_publish();
        Err(Status::invalid_argument(format!(
            "message is {size} bytes, over cluster mode's limit of {}: the NATS servers' max_payload less {DEAD_LETTER_HEADROOM} bytes kept for the headers of its dead letter",
            shared.largest_message
        )))
    }

    /// Publishes a batch: sent in order, then confirmed in order (see
    /// [`publish::publish_batch`]).
    ///
    /// # Errors
    /// The messages confirmed before the first refusal, and that refusal.
    pub async fn publish_batch(
        &self,
        drafts: Vec<Draft>,
    ) -> Result<Vec<Published>, (Vec<Published>, Status)> {
        publish::publish_batch(&self.inner.shared, drafts).await
    }

    /// Sends one message to JetStream without waiting for its confirmation: messages sent one
    /// after another through this gateway are stored in that order. Await the returned
    /// [`publish::Sent`] for the confirmation.
    ///
    /// # Errors
    /// `INVALID_ARGUMENT` for a header NATS cannot carry, `UNAVAILABLE` when it cannot be sent.
    pub async fn send(&self, draft: Draft) -> Result<publish::Sent, Status> {
        self.check_size(&draft)?;
        publish::send(&self.inner.shared, draft).await
    }

    /// Joins a subscription at this gateway: checks (or creates) its JetStream consumer, joins
    /// the local subscription, and makes sure its bridge runs.
    ///
    /// # Errors
    /// `FAILED_PRECONDITION` for what cluster mode does not offer yet or a join that differs
    /// from the subscription's settings; the local broker's refusals; `UNAVAILABLE` when
    /// JetStream cannot be reached.
    pub async fn open(
        &self,
        request: &OpenRequest,
        connection: Option<ConnectionId>,
    ) -> Result<MemberStream, Status> {
        let singleton = request.spec.mode == Mode::Singleton;
        let (mut consumer, recorded) = self.consumer(request).await?;
        await_replicas(&mut consumer).await;
        // Joined with the subscription's own settings: a join that leaves
        // max_delivery_attempts or dead_letter_topic unset takes them from the subscription,
        // wherever it was created.
        let request = &OpenRequest {
            spec: recorded,
            ..request.clone()
        };
        let spec = &request.spec;
        let broker = &self.inner.shared.broker;
        let member = broker.open(request, connection).map_err(|e| {
            crate::broker::refused_join(&request.subscription_id, &e);
            service::status(&e)
        })?;
        let subscription: Arc<str> = Arc::from(request.subscription_id.as_str());
        if let bridge::Attach::New {
            events,
            wake,
            live,
            handed_back,
        } = self.inner.router.attach(&subscription)
        {
            let bridge = bridge::Bridge {
                shared: self.inner.shared.clone(),
                subscription: subscription.clone(),
                consumer,
                explicit: acked_upstream(spec),
                progress_every: self.ack_wait(spec.mode) / 3,
                events,
                wake,
                live,
                held: BTreeMap::new(),
                refused: BTreeMap::new(),
                pull_expires: if singleton {
                    bridge::SINGLETON_PULL_EXPIRES
                } else {
                    bridge::PULL_EXPIRES
                },
                leaving: Vec::new(),
                singleton,
                handed_back,
            };
            let mut bridges = self.inner.bridges.lock().await;
            // Reap the finished ones, so the set stays as large as the live bridges.
            while bridges.try_join_next().is_some() {}
            bridges.spawn(bridge.run());
        }
        if singleton && let Some(singletons) = &self.inner.shared.singletons {
            // After the bridge is there: it tells the coordinator when this member leaves.
            singletons.joined(subscription, member.member_id());
        }
        Ok(member)
    }

    /// How long JetStream waits for an ack on a consumer of this mode. A singleton's is half
    /// the gateway lease: a dead gateway's last progress ack was sent at most a sixth of the
    /// lease before it died, so what it held is redelivered at most two thirds of a lease
    /// after, while its successor is promoted no sooner than `dead_after` (above the lease)
    /// after the last renewal others saw, sent at most a third of a lease before the death:
    /// later than two thirds of a lease after it. So the held messages come first.
    fn ack_wait(&self, mode: Mode) -> Duration {
        match mode {
            Mode::Singleton => self.inner.config.ack_wait.min(self.inner.config.lease / 2),
            Mode::Queue | Mode::Broadcast => self.inner.config.ack_wait,
        }
    }

    /// The subscription's consumer and its settings: checked against those its metadata
    /// records when it exists, created otherwise.
    async fn consumer(
        &self,
        request: &OpenRequest,
    ) -> Result<(PullConsumer, crate::core::SubscriptionSpec), Status> {
        let spec = &request.spec;
        let name = names::consumer_name(spec.mode, &request.subscription_id, &self.inner.id);
        let stream = &self.inner.stream;
        let check = |info: &consumer::Info| -> Result<crate::core::SubscriptionSpec, Status> {
            let (id, recorded) = names::recorded(&info.config.metadata).map_err(|why| {
                Status::failed_precondition(service::cap_message(format!(
                    "subscription {:?} cannot use JetStream consumer {name}: {why}",
                    request.subscription_id
                )))
            })?;
            if id != request.subscription_id {
                return Err(Status::failed_precondition(service::cap_message(format!(
                    "subscription {:?}: its JetStream consumer name {name} is taken by subscription {id:?}",
                    request.subscription_id
                ))));
            }
            match recorded.differences(spec) {
                None => Ok(recorded),
                Some(diff) => Err(Status::failed_precondition(service::cap_message(format!(
                    "subscription {:?} exists with other settings (on some gateway): {diff}",
                    request.subscription_id
                )))),
            }
        };
        if let Ok(consumer) = stream.get_consumer::<consumer::pull::Config>(&name).await {
            let recorded = check(consumer.cached_info())?;
            return Ok((consumer, recorded));
        }
        let config = consumer::pull::Config {
            durable_name: Some(name.clone()),
            filter_subjects: spec
                .patterns
                .iter()
                .map(|p| names::subject(&self.inner.shared.prefix, p.as_str()))
                .collect(),
            deliver_policy: DeliverPolicy::New,
            ack_policy: if acked_upstream(spec) {
                AckPolicy::Explicit
            } else {
                AckPolicy::None
            },
            ack_wait: self.ack_wait(spec.mode),
            max_deliver: -1,
            // Every gateway pulls at most its members' windows; this bounds them all together.
            max_ack_pending: i64::try_from(self.inner.shared.broker.limits().max_queue_messages)
                .unwrap_or(i64::MAX),
            inactive_threshold: self.inner.config.idle_timeout,
            metadata: names::metadata(&request.subscription_id, spec),
            ..Default::default()
        };
        match stream.create_consumer_strict(config).await {
            Ok(consumer) => Ok((consumer, spec.clone())),
            Err(error) => {
                // Another gateway may have created it first, with other settings.
                if let Ok(consumer) = stream.get_consumer::<consumer::pull::Config>(&name).await {
                    let recorded = check(consumer.cached_info())?;
                    return Ok((consumer, recorded));
                }
                Err(Status::failed_precondition(service::cap_message(format!(
                    "JetStream refused the consumer of subscription {:?}: {error}",
                    request.subscription_id
                ))))
            }
        }
    }

    /// A unary Ack or Nack. One naming its member is applied here when the member is here,
    /// else forwarded to the gateway that holds it; a two-field one is fenced by this
    /// connection, so it is applied here or refused.
    ///
    /// # Errors
    /// The broker's refusals; `FAILED_PRECONDITION` when no gateway holds the member (stale)
    /// or for a two-field ack whose message is not held here.
    pub async fn settle(
        &self,
        subscription_id: &str,
        fence: Fence,
        system_id: u64,
        nack: bool,
    ) -> Result<(), Status> {
        let broker = &self.inner.shared.broker;
        let local = |fence| {
            if nack {
                broker.nack(subscription_id, fence, system_id)
            } else {
                broker.ack(subscription_id, fence, system_id)
            }
        };
        match fence {
            // Its own members (also any past its route's ids) and its route's are answered here.
            Fence::Member(member)
                if broker.has_member(subscription_id, member)
                    || forward::route_of(member)
                        == forward::route_of(broker.id_floor().unix_micros()) =>
            {
                forward::settle_here(broker, subscription_id, member, system_id, nack)
            }
            Fence::Member(member) => {
                forward::request(
                    &self.inner.shared.client,
                    &self.inner.config.stream,
                    &self.inner.gone_routes,
                    forward::SettleRequest {
                        subscription: subscription_id.to_string(),
                        member,
                        system_id,
                        nack,
                    },
                    self.inner.config.forward_timeout,
                )
                .await
            }
            Fence::Connection(_) => local(fence).map_err(|e| match e {
                Error::SubscriptionNotFound(_) | Error::NotInFlight { .. } => {
                    Status::failed_precondition(service::cap_message(format!(
                        "message {system_id} is not in flight on subscription {subscription_id:?} at this gateway; in cluster mode an ack or nack without member_id is fenced by the connection and works only at the gateway holding the member's stream: pass the member_id from the confirmation frame"
                    )))
                }
                e => service::status(&e),
            }),
        }
    }

    /// Stops every bridge, giving back what each holds, and waits (at most `timeout`) for them.
    pub async fn close(&self, timeout: Duration) {
        self.inner.router.stop_all();
        let mut bridges = self.inner.bridges.lock().await;
        let _ = tokio::time::timeout(timeout, async {
            while bridges.join_next().await.is_some() {}
        })
        .await;
        let _ = self.inner.shared.client.flush().await;
    }
}

/// Whether the subscription's JetStream consumer expects acks: for acked subscriptions, and
/// for ack-free singletons too, whose gateway acks a message once it is written to the active
/// member's stream (the local core's ack-free "done"). So what a gateway pulled but had not
/// yet written when its active member left goes back to JetStream with the rest, in order,
/// for the next active member, rather than being lost with JetStream counting it delivered.
/// An ack-free QUEUE or BROADCAST consumer acks nothing: the message is done once pulled.
fn acked_upstream(spec: &crate::core::SubscriptionSpec) -> bool {
    spec.ack_mode == AckMode::Explicit || spec.mode == Mode::Singleton
}

/// The NATS header that marks a dead letter a gateway stored with the subscription it came
/// from, so that subscription skips it (no loop). Never shown to clients, and refused on their
/// publishes: a client's message, even one carrying a dead letter's
/// `tinybroker-dead-letter-*` headers, is delivered like any other.
const DEAD_LETTER_OF: &str = "tinybroker-gateway-dead-letter-of";

/// Message headers as NATS headers. NATS header names are ASCII without ':' or whitespace,
/// values have no line breaks, and names starting `Nats-` instruct JetStream: those are
/// refused, never sent.
fn nats_headers(headers: &crate::core::Headers) -> Result<HeaderMap, Status> {
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        // Bytes, not a `str` slice: a name may have a multi-byte character across byte 5.
        if name
            .as_bytes()
            .get(..5)
            .is_some_and(|prefix| prefix.eq_ignore_ascii_case(b"nats-"))
        {
            return Err(Status::invalid_argument(service::cap_message(format!(
                "header {name:?}: names starting with Nats- are reserved by NATS in cluster mode"
            ))));
        }
        if name.eq_ignore_ascii_case(DEAD_LETTER_OF) {
            return Err(Status::invalid_argument(service::cap_message(format!(
                "header {name:?} is reserved in cluster mode: gateways mark their dead letters with it"
            ))));
        }
        let header: HeaderName = name.parse().map_err(|_| {
            Status::invalid_argument(service::cap_message(format!(
                "header {name:?} cannot be carried in cluster mode: NATS header names are ASCII without ':', spaces or control characters"
            )))
        })?;
        let value: HeaderValue = value.parse().map_err(|_| {
            Status::invalid_argument(service::cap_message(format!(
                "the value of header {name:?} cannot be carried in cluster mode: no line breaks"
            )))
        })?;
        map.insert(header, value);
    }
    Ok(map)
}

/// How long a join waits for every replica of its consumer to hold it ([`await_replicas`]).
const REPLICA_PATIENCE: Duration = Duration::from_secs(3);

/// Waits until every replica of the subscription's consumer has it, so every server of the
/// stream keeps the messages published from now on for it.
///
/// JetStream answers a consumer's creation from the consumer's leader, once a quorum of its
/// peers elected it; a server that applies the cluster's log later (loaded, or slow) does not
/// know the consumer yet. Under interest retention such a server does not store a message no
/// consumer it knows wants, yet when it leads the stream the publish is confirmed: the message
/// is then held only by the other servers (and the stream counts it nowhere for its limits),
/// and lost for the subscription once its consumer's leader moves to that server. So a join is
/// answered only once the consumer's leader reports every other replica current in the
/// consumer's group: a server takes part in that group once it has applied the consumer's
/// creation, which registers the consumer with its stream a moment after (the consumer's store
/// is made in between). Replicas the cluster knows to be offline are not waited for; past
/// [`REPLICA_PATIENCE`] the join is answered all the same, and the gateway says so. A consumer
/// created longer ago than that is not waited for either: a replica that is not current then
/// is down or far behind (a killed node stays "not current, not offline" for minutes), and
/// every later join would otherwise wait the whole patience for it.
async fn await_replicas(consumer: &mut PullConsumer) {
    let held_everywhere = |info: &consumer::Info| {
        let Some(cluster) = &info.cluster else {
            return true;
        };
        let replicas = match info.config.num_replicas {
            0 => cluster.replicas.len() + 1,
            n => n,
        };
        cluster.replicas.len() + 1 >= replicas
            && cluster.replicas.iter().all(|r| r.current || r.offline)
    };
    let created = consumer.cached_info().created.unix_timestamp_nanos();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128);
    let old = now - created > REPLICA_PATIENCE.as_nanos() as i128;
    if old || held_everywhere(consumer.cached_info()) {
        return;
    }
    let deadline = tokio::time::Instant::now() + REPLICA_PATIENCE;
    let mut delay = Duration::from_millis(5);
    loop {
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(100));
        // Bounded by the deadline: a JetStream request waits up to its context's 5 s when the
        // consumer has no leader.
        let seen = tokio::time::timeout_at(deadline, consumer.info()).await;
        if matches!(seen, Ok(Ok(info)) if held_everywhere(info)) {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            let info = consumer.cached_info();
            tracing::warn!(
                consumer = %info.name,
                replicas = ?info.cluster.as_ref().map(|c| &c.replicas),
                "a replica of the consumer was not current within {REPLICA_PATIENCE:?}: the join is answered, but messages published before that server applies the consumer's creation may be kept only by the other servers"
            );
            return;
        }
    }
}

/// How long a starting gateway waits for its NATS server to route publishes to the stream.
const STREAM_PATIENCE: Duration = Duration::from_secs(10);

/// Waits until a publish to the stream finds a JetStream server from this connection. Right
/// after the stream is created, a server that has not yet learned its subjects over the
/// cluster's routes answers publishes with "no responders"; a pipelined `PublishStream` or
/// batch could not send those again in order. The probe stores nothing: it expects a subject
/// sequence the stream can never have, so the stream refuses it, which is the answer waited for.
async fn await_stream(js: &jetstream::Context, stream: &str) -> Result<(), String> {
    let subject = format!("{stream}._tinybroker.probe");
    let deadline = tokio::time::Instant::now() + STREAM_PATIENCE;
    let mut delay = Duration::from_millis(5);
    loop {
        let probe =
            jetstream::message::PublishMessage::build().expected_last_subject_sequence(u64::MAX);
        let answer = match js.send_publish(subject.clone(), probe).await {
            Ok(ack) => ack.await.map(|_| ()),
            Err(error) => Err(error),
        };
        match answer {
            Err(error) if error.kind() == jetstream::context::PublishErrorKind::StreamNotFound => {
                if tokio::time::Instant::now() >= deadline {
                    return Err(format!(
                        "no JetStream server answered publishes to stream {stream} within {STREAM_PATIENCE:?}"
                    ));
                }
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_millis(200));
            }
            // Refused by the stream (the expected sequence), or answered otherwise: a server
            // that routes to the stream answered.
            _ => return Ok(()),
        }
    }
}

/// The stream, created when missing. Auto replicas try 3 first and take fewer when the
/// cluster is smaller. A stream the gateway creates is bounded (`max_messages`, `max_bytes`)
/// and refuses new messages when full (discard new), as the embedded broker's default
/// overflow policy refuses publishes: a confirmed message is never discarded to make room.
/// One that exists is taken as it is, its limits logged.
async fn ensure_stream(
    js: &jetstream::Context,
    config: &GatewayConfig,
) -> Result<jetstream::stream::Stream, String> {
    let subjects = format!("{}.>", config.stream);
    if let Ok(stream) = js.get_stream(&config.stream).await {
        let existing = &stream.cached_info().config;
        if !existing.subjects.contains(&subjects) {
            return Err(format!(
                "JetStream stream {} exists but does not take {subjects}",
                config.stream
            ));
        }
        if existing.max_messages < 0 && existing.max_bytes < 0 {
            tracing::warn!(
                stream = %config.stream,
                "JetStream stream {} exists without max_msgs or max_bytes: its backlog is bounded only by the servers' disks (set them with `nats stream edit`)",
                config.stream
            );
        } else if existing.discard == DiscardPolicy::Old {
            // Discard old makes room by dropping the oldest messages, confirmed ones included:
            // a backlog that reaches a limit loses messages silently, nothing is refused.
            tracing::warn!(
                stream = %config.stream,
                max_msgs = existing.max_messages,
                max_bytes = existing.max_bytes,
                "JetStream stream {} exists with discard old: when it reaches a limit, JetStream drops its oldest messages, confirmed ones a subscription has not yet taken included, instead of refusing publishes (set discard new with `nats stream edit --discard new`)",
                config.stream
            );
        } else {
            tracing::info!(
                stream = %config.stream,
                max_msgs = existing.max_messages,
                max_bytes = existing.max_bytes,
                discard = ?existing.discard,
                "JetStream stream {} exists: its own limits apply, not --nats-max-messages/--nats-max-bytes",
                config.stream
            );
        }
        return Ok(stream);
    }
    let tries: &[usize] = match config.replicas {
        0 => &[3, 1],
        n => &[n][..],
    };
    let mut last = String::new();
    for &replicas in tries {
        let stream_config = jetstream::stream::Config {
            name: config.stream.clone(),
            subjects: vec![subjects.clone()],
            retention: RetentionPolicy::Interest,
            storage: StorageType::File,
            num_replicas: replicas,
            max_messages: config.max_messages,
            max_bytes: config.max_bytes,
            discard: DiscardPolicy::New,
            ..Default::default()
        };
        match js.get_or_create_stream(stream_config).await {
            Ok(stream) => return Ok(stream),
            Err(error) => last = error.to_string(),
        }
    }
    Err(format!(
        "JetStream refused the stream {}: {last}",
        config.stream
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    // SPEC §6: nothing a client sends panics the broker. A header name with a multi-byte
    // character across its fifth byte used to be sliced there (a panic in cluster mode).
    #[test]
    fn header_names_are_checked_without_slicing_inside_a_character() {
        let headers = |name: &str| crate::core::Headers::from([(name.to_string(), "v".into())]);
        let refused = nats_headers(&headers("abcdé")).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
        let reserved = nats_headers(&headers("NATS-Msg-Id")).unwrap_err();
        assert!(reserved.message().contains("reserved"), "{reserved:?}");
        let marker = nats_headers(&headers("Tinybroker-Gateway-Dead-Letter-Of")).unwrap_err();
        assert!(marker.message().contains("reserved"), "{marker:?}");
        assert!(nats_headers(&headers("tinybroker-dead-letter-subscription")).is_ok());
        assert!(nats_headers(&headers("trace-id")).is_ok());
        assert!(nats_headers(&headers("nats")).is_ok());
    }
}
