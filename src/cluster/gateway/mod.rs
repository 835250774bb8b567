//! Cluster mode's gateway (docs/semantics.md#cluster-mode): `tinybroker serve --nats URLS` serves the gRPC API over a
//! NATS JetStream cluster, for publishes and subscriptions of every mode. Any number of
//! gateways serve the same subscriptions.
//!
//! # What we chose and why
//! - **One stream** (file storage, replicas = min(3, cluster size) unless `--nats-replicas`
//!   says otherwise) holds every topic under the subjects `<stream>.<topic>`. Topics are
//!   already NATS-shaped (dot-separated tokens without whitespace, `*` or `>`), so the mapping
//!   is the identity behind the prefix, and patterns become filter subjects as they are (or,
//!   where they overlap, filters that cover them: [`names::filters`]). The
//!   stream's retention is **interest**: a message no subscription's consumer wants is not
//!   kept (as the embedded broker keeps no message published before a matching subscription),
//!   and one every consumer has acked is removed.
//! - **A publish is confirmed once JetStream stored it** (its `PubAck`); its `system_id` is the
//!   stream sequence, the name every gateway uses for that message. `queued_for` counts the
//!   cluster's subscriptions whose patterns match, from the stream's consumers ([`registry`]),
//!   whose every change is announced to every gateway before it is answered ([`announce`]).
//! - **The per-gateway broker is reused, not forked.** Each gateway keeps its local
//!   [`Broker`] for member streams, windows, fences, ack carriages and frames. A subscription
//!   with local members has a durable JetStream pull consumer and a bridge task
//!   ([`bridge`]) that pulls as many messages as the local members have window for (and a
//!   bounded read-ahead, [`ahead`]) and
//!   injects each into the local subscription (`Upstream::inject`), with JetStream's delivery
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
//! - **BROADCAST**: a broadcast id names one stream (docs/semantics.md#modes), so its consumer is this
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

pub mod api;
mod config;
pub mod control;
pub mod data;
mod start;
pub mod wire;

use std::{sync::Arc, time::Duration};

use api::{delete, forwarded, leadership};
pub use config::{
    DEAD_LETTER_HEADROOM, DEFAULT_MAX_BYTES, DEFAULT_MAX_CONSUMERS, DEFAULT_MAX_MESSAGES,
    GatewayConfig, parse_urls,
};
use control::{announce, fence, registry, singleton};
pub use data::pipeline::Pipeline;
use data::{atomic, fenced, forward, publish, router::Router};
use wire::{
    connection,
    headers::{DEAD_LETTER_OF, nats_headers},
};

use crate::{
    broker::{BatchError, Broker, Fence, Published, Upstream},
    clock::Clock,
    core::{Draft, Error, ErrorKind, Limits},
};

/// The stream as JetStream described it when the gateway started.
#[derive(Debug, Clone)]
pub struct StreamSettings {
    /// Its name.
    pub name: String,
    /// Its replicas.
    pub replicas: usize,
    /// "file" or "memory".
    pub storage: &'static str,
    /// Its most consumers (0 or less: the servers' default).
    pub max_consumers: i32,
    /// Its first sequence, when it was made with one.
    pub first_sequence: Option<u64>,
    /// How long it remembers a message id (zero: the servers' default).
    pub duplicate_window: Duration,
}

/// What a gateway runs over: its seams to NATS, and what its start learned. Over NATS,
/// [`Gateway::connect`] makes them; a simulation passes its models.
pub struct Parts {
    /// Core NATS: what gateways say to each other, and JetStream's advisories.
    pub bus: Arc<dyn crate::cluster::bus::Bus>,
    /// The stream's publishing side for clients' publishes (each try waiting for its
    /// `PubAck` as long as a publish try does), and the answers to deliveries.
    pub jetstream: Arc<dyn crate::cluster::jetstream::JetStream>,
    /// The stream's publishing side for the fence records.
    pub records: Arc<dyn crate::cluster::jetstream::JetStream>,
    /// The stream's consumers, and its subjects' last messages.
    pub stream: Arc<dyn crate::cluster::jetstream::Stream>,
    /// The coordination bucket.
    pub backplane: Arc<dyn crate::cluster::backplane::Backplane>,
    /// The stream as JetStream described it.
    pub settings: StreamSettings,
    /// Whether the stream takes atomic batches.
    pub batches: bool,
    /// The largest message a client may publish here, as the broker counts size.
    pub largest_message: usize,
    /// The cluster's epoch floor this start raised (docs/semantics.md#cluster-restart-identity).
    pub epoch_floor: u64,
    /// The member-id route this start claimed.
    pub route: u64,
    /// Names this gateway's own consumers (BROADCAST).
    pub id: String,
    /// How many times the connection to NATS was made (a reconnection makes the registry's
    /// copy not current).
    pub connects: Arc<std::sync::atomic::AtomicU64>,
    /// The server the gateway is connected to now, named.
    pub server: Arc<dyn Fn() -> String + Send + Sync>,
}

/// What every part of the gateway shares.
struct Shared {
    /// Core NATS between gateways, and JetStream's advisories ([`crate::cluster::bus`]).
    bus: Arc<dyn crate::cluster::bus::Bus>,
    /// The stream's publishing side, and the answers to its consumers' deliveries
    /// ([`crate::cluster::jetstream`]).
    jetstream: Arc<dyn crate::cluster::jetstream::JetStream>,
    /// The stream's consumers: made, found, listed, deleted ([`crate::cluster::jetstream`]).
    stream: Arc<dyn crate::cluster::jetstream::Stream>,
    /// The local broker, with the operations only a gateway has.
    broker: Upstream,
    prefix: String,
    /// The largest message a client may publish here, as the broker counts size: below the
    /// NATS servers' `max_payload` by [`DEAD_LETTER_HEADROOM`], so its dead letter fits too.
    largest_message: usize,
    /// The line to the singleton coordinator.
    singletons: singleton::Handle,
    /// The ids of this gateway's publishes (`Nats-Msg-Id`).
    ids: publish::MessageIds,
    /// How long a publish is sent again while JetStream does not confirm it: the gateway's
    /// `publish_timeout`, within the stream's duplicate window.
    patience: Duration,
    /// Every subscription in the cluster: what `queued_for` counts.
    registry: Arc<registry::Registry>,
    /// The fence records: written at activations, read by fenced publishes.
    fences: Arc<fence::Fences>,
    /// Whether the stream takes atomic batches ([`atomic`]).
    batches: bool,
}

/// A running gateway: cheap to clone.
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

struct Inner {
    /// The local broker as the service sees it (the same one as `shared.broker`).
    local: Broker,
    shared: Arc<Shared>,
    /// The stream as JetStream described it at start.
    settings: StreamSettings,
    router: Arc<Router>,
    /// Names this gateway's own consumers (BROADCAST).
    id: String,
    config: GatewayConfig,
    bridges: tokio::sync::Mutex<tokio::task::JoinSet<()>>,
    responder: tokio::task::JoinHandle<()>,
    /// Routes found gone: their settles get one try (`forward`).
    gone_routes: forward::GoneRoutes,
    coordination: tokio::task::JoinHandle<()>,
    /// Keeps the registry up to date.
    registry_task: tokio::task::JoinHandle<()>,
    /// Removes the ended fence records of deleted consumers (`fence`).
    fence_task: tokio::task::JoinHandle<()>,
    /// The server the gateway is connected to now, named.
    server: Arc<dyn Fn() -> String + Send + Sync>,
    /// The coordination bucket, read by `describe` for a singleton's line.
    backplane: Arc<dyn crate::cluster::backplane::Backplane>,
    /// Every epoch this gateway's coordinator makes is above this: the epoch floor it raised
    /// at start (docs/semantics.md#cluster-restart-identity).
    epoch_floor: u64,
    /// Ids held for a delete here, and joins under way (`delete`).
    holds: Arc<delete::Holds>,
    /// Answers other gateways' deletes.
    deletes: tokio::task::JoinHandle<()>,
    /// Answers other gateways' announcements of consumers made or deleted.
    announcements: tokio::task::JoinHandle<()>,
    /// Numbers this gateway's deletes (their holds' tokens).
    delete_tokens: std::sync::atomic::AtomicU64,
    /// This gateway's incarnation now (its lease's id).
    incarnation: Arc<std::sync::atomic::AtomicU64>,
    /// The subscriptions whose leadership is watched here (`leadership`).
    watched: leadership::Watched,
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
        self.deletes.abort();
        self.announcements.abort();
        self.registry_task.abort();
        self.fence_task.abort();
    }
}

/// How long a starting gateway waits for its first cluster lease before it serves anyway.
const START_LEASE_PATIENCE: Duration = Duration::from_secs(10);

fn unavailable(what: &str, error: impl std::fmt::Display) -> Error {
    Error::Unavailable(format!("{what}: {error}"))
}

impl Gateway {
    /// Connects to NATS, makes sure the stream exists, and starts answering forwarded acks.
    /// Builds its own local broker (with `limits` as a gateway needs them, time from `clock`)
    /// and the router that observes it, so nothing else holds the broker's gateway-only
    /// operations or can wire them in another order.
    ///
    /// # Errors
    /// A sentence saying what failed: bad URLs or stream name, NATS unreachable, JetStream
    /// disabled or refusing the stream.
    pub async fn connect(
        config: GatewayConfig,
        limits: Limits,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, String> {
        let limits = config::local_limits(limits);
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
        let started = std::time::Instant::now();
        let connection::Connected {
            client,
            connects,
            refusals,
            credential,
            largest_message,
        } = connection::connect(&config, &limits).await?;
        // Each start-up step logs at debug with the time since start: a gateway slow to
        // listen says which NATS request it waited on.
        tracing::debug!(elapsed = ?started.elapsed(), "gateway start: connected to NATS");
        let urls_named = config.urls.clone();
        let start = async move {
            let parts =
                start::over_nats(&config, client, connects, largest_message, started).await?;
            Self::assemble(config, limits, clock, parts).await
        };
        tokio::select! {
            biased;
            refused = refusals.first() => Err(format!(
                "NATS refused the gateway a permission it needs: {refused} (connected to {urls_named} with {credential}); grant its NATS user the permissions docs/cluster.md#securing-the-connection-to-nats lists"
            )),
            gateway = start => gateway,
        }
    }

    /// The gateway over `parts` (its seams, and what its start learned): its local broker
    /// (with `limits` as a gateway needs them, time from `clock`) and the router observing it,
    /// the registry, the fence records, the singleton shell, and what answers other gateways.
    /// Returns once its first cluster lease is held (or [`START_LEASE_PATIENCE`] passed).
    ///
    /// # Errors
    /// A sentence saying what failed: a subscription the bus refused.
    pub async fn assemble(
        config: GatewayConfig,
        limits: Limits,
        clock: Arc<dyn Clock>,
        parts: Parts,
    ) -> Result<Self, String> {
        let started = std::time::Instant::now();
        let router = Router::new();
        let limits = config::local_limits(limits);
        let Parts {
            bus,
            jetstream,
            records,
            stream: consumers,
            backplane,
            settings,
            batches,
            largest_message,
            epoch_floor,
            route,
            id,
            connects,
            server,
        } = parts;
        let (local, broker) = Broker::gateway(limits, clock, router.clone(), route);
        let (registry, registry_task) =
            registry::Registry::start(bus.as_ref(), consumers.clone(), connects).await?;
        let fences = Arc::new(fence::Fences::new(records, consumers.clone()));
        let fence_task = fences.clone().follow_deletions(bus.as_ref()).await?;
        let (singletons, coordination) = singleton::spawn(
            backplane.clone(),
            broker.clone(),
            singleton::config(config.lease, config.lapse_patience),
            fences.clone(),
        );
        let incarnation = singletons.incarnation();
        let announcements = announce::serve(
            bus.clone(),
            &config.stream,
            registry.clone(),
            incarnation.clone(),
        )
        .await?;
        // Only now that announcements reach it may a sync make its copy current.
        registry.watch_lease(singletons.lease().clone());
        let window = settings.duplicate_window;
        let patience = if window.is_zero() {
            config.publish_timeout
        } else {
            config.publish_timeout.min(window)
        };
        if patience < config.publish_timeout {
            tracing::warn!(
                stream = %config.stream,
                duplicate_window = ?window,
                "JetStream stream {} deduplicates publishes for {window:?} only: a publish JetStream does not confirm is sent again for that long, not --nats-publish-timeout {:?} (a later try could be stored twice); raise it with `nats stream edit --dupe-window`",
                config.stream,
                config.publish_timeout
            );
        }
        let shared = Arc::new(Shared {
            bus: bus.clone(),
            jetstream,
            stream: consumers,
            broker: broker.clone(),
            prefix: config.stream.clone(),
            largest_message,
            singletons,
            ids: publish::MessageIds::new(),
            patience,
            registry,
            fences,
            batches,
        });
        let responder = forwarded::serve(
            bus.clone(),
            &config.stream,
            local.clone(),
            shared.singletons.clone(),
        )
        .await?;
        tracing::debug!(elapsed = ?started.elapsed(), "gateway start: serving forwarded acks");
        let holds = Arc::new(delete::Holds::default());
        let deletes = delete::serve(
            bus.clone(),
            &config.stream,
            local.clone(),
            holds.clone(),
            incarnation.clone(),
        )
        .await?;
        // Serve singletons from the start: the first lease, confirmed (a join waits for it, and
        // is refused past its bound, while the gateway holds none).
        let leased = shared
            .singletons
            .lease()
            .wait_valid(START_LEASE_PATIENCE)
            .await;
        match leased {
            Some(_) => {
                tracing::debug!(elapsed = ?started.elapsed(), "gateway start: cluster lease held");
            }
            None => tracing::warn!(
                "NATS did not confirm this gateway's cluster lease within {START_LEASE_PATIENCE:?}: serving all the same; singleton joins wait for the lease, up to {:?}, and are refused with UNAVAILABLE past it",
                control::lease::JOIN_LEASE_PATIENCE
            ),
        }
        Ok(Self {
            inner: Arc::new(Inner {
                local,
                shared,
                settings,
                server,
                router,
                id,
                config,
                bridges: tokio::sync::Mutex::new(tokio::task::JoinSet::new()),
                responder,
                gone_routes: forward::GoneRoutes::default(),
                coordination,
                registry_task,
                fence_task,
                backplane,
                epoch_floor,
                holds,
                deletes,
                announcements,
                // Unique across gateways with overwhelming probability (two would have to
                // start in the same microsecond), so one delete never releases another's hold.
                delete_tokens: std::sync::atomic::AtomicU64::new(
                    broker.id_floor().unix_micros() << 8,
                ),
                incarnation,
                watched: Default::default(),
            }),
        })
    }

    /// The server this gateway is connected to now (for the start-up log line).
    pub fn connected_to(&self) -> String {
        (self.inner.server)()
    }

    /// The local broker: where this gateway's members, windows and frames live (for
    /// inspection, expiry and shutdown; what only a gateway does to it stays inside).
    pub fn broker(&self) -> &Broker {
        &self.inner.local
    }

    /// The stream's name and replicas.
    pub fn stream(&self) -> (String, usize) {
        let settings = &self.inner.settings;
        (settings.name.clone(), settings.replicas)
    }

    /// The stream every confirmed publish is kept in, as JetStream described it at start.
    pub fn storage(&self) -> crate::backend::Storage {
        let settings = &self.inner.settings;
        crate::backend::Storage::JetStream {
            stream: settings.name.clone(),
            storage: settings.storage,
            replicas: settings.replicas,
            max_consumers: settings.max_consumers,
        }
    }

    /// Where the cluster's ids start (docs/semantics.md#cluster-restart-identity): the stream's
    /// first sequence, the wall clock in µs when it was made (every `system_id` is above it;
    /// `None` for a stream made before ids had a floor, counted from 1), and the epoch floor
    /// this gateway raised at start (every epoch its coordinator makes is above it: its start
    /// time in µs, or more).
    pub fn id_floors(&self) -> (Option<u64>, u64) {
        let stream = self.inner.settings.first_sequence;
        (stream, self.inner.epoch_floor)
    }

    /// Publishes one message to JetStream; confirmed once JetStream stored it. A publish
    /// JetStream did not confirm is sent again with its message id (stored at most once) for up
    /// to `publish_timeout`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a header NATS cannot carry or a message too large,
    /// [`Error::StreamFull`], [`Error::Unavailable`] when JetStream does not confirm.
    pub async fn publish(&self, draft: Draft) -> Result<Published, Error> {
        self.check_size(&draft)?;
        let shared = &self.inner.shared;
        match draft.fence().cloned() {
            // Stored only while the fence's epoch is the active one
            // (docs/semantics.md#cluster-fenced-publish).
            Some(fence) => fenced::publish(shared, draft, &fence).await,
            None => publish::publish(shared, draft).await,
        }
    }

    /// Refuses a message larger than this gateway takes from clients (counted as a rejected
    /// publish): one that fits NATS's `max_payload` with room for the headers a dead letter
    /// adds, so a message the gateway took can always be dead-lettered.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming both limits.
    pub fn check_size(&self, draft: &Draft) -> Result<(), Error> {
        let shared = &self.inner.shared;
        let size = draft.envelope().size() + draft.payload().len();
        if size <= shared.largest_message {
            return Ok(());
        }
        shared.broker.count_rejected_publish();
        Err(Error::InvalidArgument(format!(
            "message is {size} bytes, over cluster mode's limit of {}: the NATS servers' max_payload less {DEAD_LETTER_HEADROOM} bytes kept for the headers of its dead letter",
            shared.largest_message
        )))
    }

    /// Publishes a batch: sent in order, then confirmed in order (see
    /// [`publish::publish_batch`]); one with a fenced message one by one
    /// ([`fenced::publish_one_by_one`]).
    ///
    /// # Errors
    /// The messages confirmed before the first refusal, and that refusal.
    pub async fn publish_batch(&self, drafts: Vec<Draft>) -> Result<Vec<Published>, BatchError> {
        if drafts.iter().any(|draft| draft.fence().is_some()) {
            return fenced::publish_one_by_one(&self.inner.shared, drafts).await;
        }
        publish::publish_batch(&self.inner.shared, drafts).await
    }

    /// Sends one message to JetStream without waiting for its confirmation: messages sent one
    /// after another through this gateway are stored in that order. Await the returned
    /// [`publish::Sent`] for the confirmation.
    ///
    /// # Errors
    /// As [`Gateway::publish`], for what is known before the confirmation.
    pub(super) async fn send(&self, draft: Draft) -> Result<publish::Sent, Error> {
        self.check_size(&draft)?;
        publish::send_streamed(&self.inner.shared, draft).await
    }

    /// Whether a `PublishStream` here groups its publishes into atomic batches.
    pub(super) fn batches(&self) -> bool {
        self.inner.shared.batches
    }

    /// Publishes drafts a `PublishStream` read together, none of them fenced: as one atomic
    /// batch ([`atomic`]), a single one alone. One answer each, in order.
    pub(super) async fn publish_grouped(
        &self,
        drafts: Vec<Draft>,
    ) -> Vec<Result<Published, Error>> {
        let shared = &self.inner.shared;
        // Too large for NATS: refused here, the others published.
        let mut refused: Vec<Option<Error>> = Vec::with_capacity(drafts.len());
        let mut fit = Vec::with_capacity(drafts.len());
        for draft in drafts {
            match self.check_size(&draft) {
                Ok(()) => {
                    refused.push(None);
                    fit.push(draft);
                }
                Err(error) => refused.push(Some(error)),
            }
        }
        let mut answers = match fit.len() {
            0 => Vec::new(),
            1 => vec![publish::publish(shared, fit.remove(0)).await],
            _ => {
                atomic::Batch::new(shared, fit)
                    .publish(shared.clone())
                    .await
            }
        }
        .into_iter();
        refused
            .into_iter()
            .map(|refused| match refused {
                Some(error) => Err(error),
                None => answers.next().unwrap_or_else(|| {
                    Err(Error::cluster(
                        ErrorKind::Internal,
                        "a batch came back with fewer answers than publishes",
                    ))
                }),
            })
            .collect()
    }

    /// Sends again, with its message id, a publish JetStream did not confirm, until it does
    /// (for up to `publish_timeout`).
    ///
    /// # Errors
    /// As [`Gateway::publish`].
    pub(super) async fn resend(&self, resend: publish::Resend) -> Result<Published, Error> {
        resend
            .publish(&self.inner.shared, self.inner.shared.patience)
            .await
    }

    /// A unary Ack or Nack. One naming its member is applied here when the member is here,
    /// else forwarded to the gateway that holds it; a two-field one is fenced by this
    /// connection, so it is applied here or refused. A subscription no gateway has is
    /// [`Error::SubscriptionNotFound`], as on the embedded broker.
    ///
    /// # Errors
    /// The broker's refusals; [`Error::MemberGone`] when no gateway holds the member (stale),
    /// [`Error::NotHeldHere`] for a two-field ack whose message is not held here.
    pub async fn settle(
        &self,
        subscription_id: &str,
        fence: Fence,
        system_id: u64,
        nack: bool,
    ) -> Result<(), Error> {
        let result = self
            .settle_somewhere(subscription_id, fence, system_id, nack)
            .await;
        // Answers that a subscription unknown here (or at the member's gateway) can give.
        let unknown_here = |e: &Error| match e {
            Error::NotHeldHere { .. } | Error::MemberGone { .. } => true,
            Error::Cluster { kind, .. } => *kind == ErrorKind::FailedPrecondition,
            _ => false,
        };
        if result.as_ref().is_err_and(unknown_here) {
            // Taken after the settle arrived: the registry then knows every subscription
            // confirmed before it (a sync for every settle would cost a request each).
            let registry = &self.inner.shared.registry;
            registry.synced(registry.ticket()).await;
            if !registry.exists(subscription_id) {
                return Err(Error::SubscriptionNotFound(subscription_id.to_string()));
            }
        }
        result
    }

    async fn settle_somewhere(
        &self,
        subscription_id: &str,
        fence: Fence,
        system_id: u64,
        nack: bool,
    ) -> Result<(), Error> {
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
                    || crate::cluster::ids::Route::of(member)
                        == crate::cluster::ids::Route::of(broker.id_floor().unix_micros()) =>
            {
                forward::settle_here(broker, subscription_id, member, system_id, nack)
            }
            Fence::Member(member) => {
                forward::request(
                    self.inner.shared.bus.as_ref(),
                    &self.inner.config.stream,
                    &self.inner.gone_routes,
                    forward::SettleRequest {
                        subscription: subscription_id.to_string(),
                        member,
                        system_id,
                        nack,
                        proclaim: None,
                    },
                    self.inner.config.forward_timeout,
                )
                .await
            }
            Fence::Connection(_) => local(fence).map_err(|e| match e {
                Error::SubscriptionNotFound(_) | Error::NotInFlight { .. } => Error::NotHeldHere {
                    subscription: subscription_id.to_string(),
                    system_id,
                },
                e => e,
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
        let _ = self.inner.shared.bus.flush().await;
    }
}
