//! The backplane over NATS: one JetStream KV bucket, through `async-nats`.
//!
//! # How the seam maps onto JetStream
//! - **Revision** = the stream sequence of the bucket's stream (`KV_<bucket>`): one counter for
//!   every key, as the seam wants.
//! - **create / update / delete** are publishes with `Nats-Expected-Last-Subject-Sequence`, which
//!   the stream leader checks and orders (linearizable). A delete publishes a `KV-Operation: DEL`
//!   marker: a revision of its own that watches deliver as an entry without a value, and that
//!   replaces the key's value (history 1) without erasing the key's revision. A purge marker
//!   (`KV-Operation: PURGE` with a subject roll-up) would do the same at history 1; DEL is the
//!   one that never removes other messages, so it is what a plain delete means in KV.
//! - **Delete markers of keys under a prefix expire.** A delete marker of a key that starts with
//!   [`NatsConfig::expiring_prefix`] (`sub.`: a subscription's line) carries a per-message TTL
//!   (`Nats-TTL`, [`NatsConfig::marker_ttl`], 10 minutes): once it runs out, JetStream removes
//!   it and the key has no message at all, as if never written, so the bucket does not keep a
//!   marker for every subscription id ever used. Other deletions (a dead gateway's lease) stay:
//!   a gateway learns that another is dead only from its lease's deletion, one marker per
//!   gateway incarnation. The stream's sequence is not reset by an expiry, so revisions still
//!   only rise. Opening the bucket turns on the stream's `allow_msg_ttl` when it is off
//!   (nats-server 2.11.2 or later; 2.11.0 and 2.11.1 refuse to change it on an existing
//!   stream); where that fails, markers are kept, as before, and the gateway says so. No server
//!   marker replaces an expired one (`subject_delete_marker_ttl` stays unset).
//! - JetStream's compare-and-set looks at the key's last message whatever it is, a delete marker
//!   included; the seam's does not let a deleted key be updated or deleted (its current revision
//!   is 0). So `update` and `delete` first read the message at the `expected` revision (one
//!   round trip to the stream leader: revisions are immutable, so this read cannot race) and
//!   refuse a revision that is a deletion; `create` on a deleted key is a compare-and-set on the
//!   delete marker's revision.
//! - **get** reads the key's last message from the stream leader (`STREAM.MSG.GET`), not with
//!   direct get, which any replica may answer from behind.
//! - **watch** is async-nats's KV watch: an ordered push consumer with "last per subject" then
//!   every new message, in stream order. When the connection drops, or heartbeats stop, it
//!   recreates its consumer from the last stream sequence it delivered, so a watch resumes after
//!   its last revision, as the seam promises. If it was cut off before delivering anything, it
//!   restarts with "deliver all", which at history 1 is the same set (the bucket holds only each
//!   key's latest message). A missed heartbeat is yielded as one `Err(Unavailable)` item; the
//!   stream goes on after it.
//!
//! # Errors
//! - A refused compare-and-set answers "wrong last sequence: N", N the key's last revision:
//!   [`KvError::Exists`] / [`KvError::WrongRevision`] carry it (0 if that message is a deletion).
//!   When the answer carries no number, the adapter reads the key's latest revision afterwards:
//!   that may already be newer than the one the refusal saw, which is still a revision the key
//!   held after the refusal, so a caller that waits for it on the watch makes progress.
//! - Timeouts, a lost connection, no responders and JetStream errors (no leader, stream gone)
//!   are [`KvError::Unavailable`]: the write **may or may not have taken effect** (a publish
//!   whose acknowledgement is lost was still stored), and the caller learns which from the watch.
//!
//! # Keys
//! The seam's keys are any strings; a KV key allows only `[-/_=.a-zA-Z0-9]`, not starting or
//! ending with `.`, without empty tokens. Keys are encoded byte by byte: those characters stay
//! (the token structure stays visible to subject filters), every other byte, `=` itself, and a
//! `.` that would start, end or empty a token become `=XX` (hex). The encoding is injective, and
//! watches filter by the decoded key, so a watch prefix means a string prefix as the seam says.

use std::time::Duration;

use async_nats::{
    HeaderMap,
    jetstream::{
        self,
        context::PublishErrorKind,
        kv,
        stream::{DiscardPolicy, LastRawMessageErrorKind, RawMessageErrorKind, StorageType},
    },
};
use bytes::Bytes;
use tokio_stream::StreamExt;

mod keys;
mod live;

pub(crate) use keys::is_deletion;
pub use keys::{decode_key, encode_key};
use keys::{is_stale, last_sequence_in, watch_filters};

use super::backplane::{Backplane, BoxFuture, Entry, KvError, Revision, Watch};

/// How to reach NATS and which bucket to use.
#[derive(Debug, Clone)]
pub struct NatsConfig {
    /// Server URLs (`nats://host:port`); the client learns the rest of the cluster from them.
    pub urls: Vec<String>,
    /// The KV bucket (a JetStream stream `KV_<bucket>`).
    pub bucket: String,
    /// Replicas of the bucket when this call creates it; `None`: `min(3, cluster size)`.
    pub replicas: Option<usize>,
    /// Bound on connecting to a server.
    pub connect_timeout: Duration,
    /// Bound on every request (publish acknowledgement, reads, creating the bucket): past it an
    /// operation is [`KvError::Unavailable`].
    pub request_timeout: Duration,
    /// How long a delete marker of a key under `expiring_prefix` stays before JetStream removes
    /// it (whole seconds, at least 1; `None`: forever).
    pub marker_ttl: Option<Duration>,
    /// The keys whose delete markers expire (`""`: all).
    pub expiring_prefix: String,
    /// The credential and TLS to connect with ([`super::security`]).
    pub security: super::security::NatsSecurity,
}

impl NatsConfig {
    /// `urls`, bucket `tinybroker`, replicas by cluster size, 5 s connect and request timeouts,
    /// delete markers of `sub.` keys kept [`MARKER_TTL`], others for good.
    pub fn new(urls: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self {
            urls: urls.into_iter().map(Into::into).collect(),
            bucket: "tinybroker".to_string(),
            replicas: None,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            marker_ttl: Some(MARKER_TTL),
            expiring_prefix: "sub.".to_string(),
            security: Default::default(),
        }
    }
}

/// Why [`NatsBackplane::connect`] failed.
#[derive(Debug, thiserror::Error)]
pub enum NatsError {
    /// No server in the list could be reached.
    #[error("cannot connect to NATS at {urls}: {reason}")]
    Connect {
        /// The URLs tried.
        urls: String,
        /// async-nats's reason.
        reason: String,
    },
    /// The bucket could not be bound or created.
    #[error("cannot open KV bucket {bucket:?}: {reason}")]
    Bucket {
        /// The bucket.
        bucket: String,
        /// JetStream's reason.
        reason: String,
    },
}

/// The [`Backplane`] over a JetStream KV bucket (see the module doc).
#[derive(Clone)]
pub struct NatsBackplane {
    js: jetstream::Context,
    store: kv::Store,
    /// `$KV.<bucket>.`: a key's subject is this plus the encoded key.
    prefix: String,
    /// The `Nats-TTL` a delete marker of a key under `expiring` carries (whole seconds);
    /// `None`: markers stay.
    marker_ttl: Option<String>,
    expiring: String,
}

const KV_OPERATION: &str = "KV-Operation";

/// How long a gateway's delete markers stay: far longer than any watch that is still being
/// served lags behind (a gateway cut off for a lease starts again with a new watch), and short
/// enough that churn of subscription ids keeps few (a thousand ids an hour keep about 170).
pub const MARKER_TTL: Duration = Duration::from_secs(600);

/// How long opening the coordination bucket keeps trying while the cluster settles (a loaded
/// three-node cluster that has just started can leave requests unanswered for seconds).
const BUCKET_PATIENCE: Duration = Duration::from_secs(30);

/// How long a write answered "no responders" is sent again (nothing was stored).
const NO_RESPONDERS_PATIENCE: Duration = Duration::from_secs(2);

impl NatsBackplane {
    /// Connects to `config.urls`, then binds the bucket, creating it if it does not exist.
    ///
    /// # Errors
    /// [`NatsError::Connect`] if no server answers within the connect timeout;
    /// [`NatsError::Bucket`] if the bucket can neither be bound nor created.
    pub async fn connect(config: &NatsConfig) -> Result<Self, NatsError> {
        let urls = config.urls.join(",");
        let addrs: Vec<async_nats::ServerAddr> = config
            .urls
            .iter()
            .map(|u| u.parse())
            .collect::<Result<_, _>>()
            .map_err(|e: std::io::Error| NatsError::Connect {
                urls: urls.clone(),
                reason: e.to_string(),
            })?;
        let client = super::security::connect_options(&config.security)
            .map_err(|reason| NatsError::Connect {
                urls: urls.clone(),
                reason,
            })?
            .connection_timeout(config.connect_timeout)
            .request_timeout(Some(config.request_timeout))
            .connect(addrs)
            .await
            .map_err(|e| NatsError::Connect {
                reason: config.security.connect_error(&e),
                urls,
            })?;
        Self::open(client, config).await
    }

    /// Binds (or creates) `config.bucket` over an existing connection; `config.urls` and
    /// `config.connect_timeout` are not used.
    ///
    /// # Errors
    /// [`NatsError::Bucket`].
    pub async fn open(client: async_nats::Client, config: &NatsConfig) -> Result<Self, NatsError> {
        let bucket_error = |reason: String| NatsError::Bucket {
            bucket: config.bucket.clone(),
            reason,
        };
        let replicas = config
            .replicas
            .unwrap_or_else(|| cluster_size(&client).min(3));
        let mut js = jetstream::new(client);
        js.set_timeout(config.request_timeout);
        // Creating a bucket that exists with the same config succeeds, so gateways racing to
        // create it all end up bound to it; one created with another config (say, other
        // replicas) is bound as it is. Another client may be creating it right now (the stream
        // exists before it answers), and a cluster just started may still count a peer offline
        // ("no suitable peers for placement"): both settle, so creating and binding are retried
        // for a bounded time.
        // The bucket's stream as async-nats's KV would make it (history 1), with per-message TTL
        // on from its creation when delete markers expire (a server may refuse to turn it on
        // later: nats-server 2.11.0 and 2.11.1), and its first revision the wall clock at its
        // creation in µs: a singleton's epoch is a revision of the bucket, so epochs of a bucket
        // made again start above every one handed out before (docs/semantics.md#restart-identity).
        // Each creator asks for its own first revision, so a second create is refused as another
        // configuration and binds the bucket the first made. One that exists is bound as it is.
        let stream = jetstream::stream::Config {
            name: format!("KV_{}", config.bucket),
            description: Some("tinybroker cluster coordination".to_string()),
            subjects: vec![format!("$KV.{}.>", config.bucket)],
            max_messages_per_subject: 1,
            storage: StorageType::File,
            allow_rollup: true,
            deny_delete: true,
            allow_direct: true,
            num_replicas: replicas,
            discard: DiscardPolicy::New,
            allow_message_ttl: config.marker_ttl.is_some(),
            first_sequence: Some(crate::clock::system_unix_micros()),
            ..Default::default()
        };
        let deadline = tokio::time::Instant::now() + BUCKET_PATIENCE;
        let store = loop {
            // Create first: the stream's leader answers a create of a stream that exists with
            // this config at once, where a first read of one still being created can go
            // unanswered until its group has a leader.
            let bound = match js.create_stream(stream.clone()).await {
                Ok(_) => js
                    .get_key_value(&config.bucket)
                    .await
                    .map_err(|e| format!("bind: {e}")),
                Err(create) => js
                    .get_key_value(&config.bucket)
                    .await
                    .map_err(|get| format!("create: {create}; bind: {get}")),
            };
            match bound {
                Ok(store) => break store,
                Err(why) if tokio::time::Instant::now() >= deadline => {
                    return Err(bucket_error(why));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        };
        let prefix = format!("$KV.{}.", config.bucket);
        await_routes(&js, &prefix, deadline)
            .await
            .map_err(bucket_error)?;
        let marker_ttl = match config.marker_ttl {
            Some(ttl) => allow_marker_ttl(&js, &store, ttl).await,
            None => None,
        };
        Ok(Self {
            js,
            store,
            prefix,
            marker_ttl,
            expiring: config.expiring_prefix.clone(),
        })
    }

    /// Whether delete markers expire (see [`NatsConfig::marker_ttl`]).
    pub fn markers_expire(&self) -> bool {
        self.marker_ttl.is_some()
    }

    /// The bucket's name.
    pub fn bucket(&self) -> &str {
        &self.store.name
    }

    /// How many replicas the bucket's stream has (as it was when bound).
    pub fn replicas(&self) -> usize {
        self.store.stream.cached_info().config.num_replicas
    }

    fn subject(&self, key: &str) -> String {
        format!("{}{}", self.prefix, encode_key(key))
    }

    /// Publishes `payload` on `key` if its last revision is `expected` (0: none).
    async fn publish(
        &self,
        key: &str,
        payload: Bytes,
        expected: Revision,
        delete: bool,
    ) -> Result<Revision, Publish> {
        let mut headers = HeaderMap::new();
        headers.insert(
            "Nats-Expected-Last-Subject-Sequence",
            expected.to_string().as_str(),
        );
        if delete {
            headers.insert(KV_OPERATION, "DEL");
            if let Some(ttl) = &self.marker_ttl
                && key.starts_with(&self.expiring)
            {
                headers.insert(async_nats::header::NATS_MESSAGE_TTL, ttl.as_str());
            }
        }
        // "No responders": the connected server does not route the bucket's subjects to its
        // stream yet (a bucket just created, its interest still spreading over the cluster's
        // routes). Nobody took the publish, so sending it again cannot store it twice.
        let deadline = tokio::time::Instant::now() + NO_RESPONDERS_PATIENCE;
        let mut delay = Duration::from_millis(5);
        let answer = loop {
            let ack = self
                .js
                .publish_with_headers(self.subject(key), headers.clone(), payload.clone())
                .await
                .map_err(|e| Publish::Failed(unavailable("publish", e)))?;
            match ack.await {
                Err(e)
                    if e.kind() == PublishErrorKind::StreamNotFound
                        && tokio::time::Instant::now() + delay < deadline =>
                {
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_millis(200));
                }
                answer => break answer,
            }
        };
        match answer {
            Ok(ack) => Ok(ack.sequence),
            Err(e)
                if e.kind() == PublishErrorKind::WrongLastSequence || is_stale(&e.to_string()) =>
            {
                Err(Publish::Conflict(last_sequence_in(&e.to_string())))
            }
            Err(e) => Err(Publish::Failed(unavailable("publish", e))),
        }
    }

    /// The message at `revision` if it is a revision of `key`: `Some(true)` if it is a value,
    /// `Some(false)` a deletion; `None` if there is no such message (never written, or replaced
    /// since: the bucket keeps only each key's latest).
    async fn kind_at(&self, key: &str, revision: Revision) -> Result<Option<bool>, KvError> {
        match self.store.stream.get_raw_message(revision).await {
            Ok(m) if m.subject.as_str() == self.subject(key) => Ok(Some(!is_deletion(&m.headers))),
            Ok(_) => Ok(None),
            Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(unavailable("read", e)),
        }
    }

    /// The key's current revision in the seam's sense (0: missing or deleted), given the last
    /// sequence a refused compare-and-set reported, if it reported one.
    async fn current(&self, key: &str, reported: Option<Revision>) -> Result<Revision, KvError> {
        match reported {
            // The key had no message at all.
            Some(0) => return Ok(0),
            Some(revision) => match self.kind_at(key, revision).await? {
                Some(true) => return Ok(revision),
                Some(false) => return Ok(0),
                // Replaced since the refusal: read the latest below.
                None => {}
            },
            None => {}
        }
        Ok(match self.get_entry(key).await? {
            Some(Entry {
                value: Some(_),
                revision,
                ..
            }) => revision,
            _ => 0,
        })
    }

    async fn get_entry(&self, key: &str) -> Result<Option<Entry>, KvError> {
        match self
            .store
            .stream
            .get_last_raw_message_by_subject(&self.subject(key))
            .await
        {
            Ok(m) => Ok(Some(Entry {
                key: key.to_string(),
                value: (!is_deletion(&m.headers)).then_some(m.payload),
                revision: m.sequence,
            })),
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(unavailable("read", e)),
        }
    }

    async fn create_entry(&self, key: &str, value: Bytes) -> Result<Revision, KvError> {
        // Each retry follows a write by someone else to the key (a deletion we then write over,
        // or one that replaced the message we read): bounded so a storm cannot hold us forever.
        let mut expected = 0;
        for _ in 0..8 {
            match self.publish(key, value.clone(), expected, false).await {
                Ok(revision) => return Ok(revision),
                Err(Publish::Failed(e)) => return Err(e),
                Err(Publish::Conflict(reported)) => {
                    let last = match reported {
                        Some(r) => r,
                        None => match self.get_entry(key).await? {
                            Some(e) => e.revision,
                            None => 0,
                        },
                    };
                    let kind = match last {
                        0 => None,
                        _ => self.kind_at(key, last).await?,
                    };
                    match kind {
                        Some(true) => return Err(KvError::Exists { current: last }),
                        // A deleted key: create it over its delete marker.
                        Some(false) => expected = last,
                        // Replaced since, or never there: read again.
                        None => {
                            expected = match self.get_entry(key).await? {
                                Some(Entry {
                                    value: Some(_),
                                    revision,
                                    ..
                                }) => return Err(KvError::Exists { current: revision }),
                                Some(e) => e.revision,
                                None => 0,
                            }
                        }
                    }
                }
            }
        }
        Err(KvError::Unavailable(format!(
            "create {key:?}: the key kept changing under concurrent writes"
        )))
    }

    async fn write_at(
        &self,
        key: &str,
        value: Option<Bytes>,
        expected: Revision,
    ) -> Result<Revision, KvError> {
        let refused = async |reported: Option<Revision>| -> KvError {
            match self.current(key, reported).await {
                Ok(current) => KvError::WrongRevision { expected, current },
                Err(e) => e,
            }
        };
        // JetStream would accept a compare-and-set on a delete marker's revision; the seam
        // treats a deleted key as having no revision.
        if expected == 0 || self.kind_at(key, expected).await? == Some(false) {
            return Err(refused(None).await);
        }
        let delete = value.is_none();
        match self
            .publish(key, value.unwrap_or_default(), expected, delete)
            .await
        {
            Ok(revision) => Ok(revision),
            Err(Publish::Failed(e)) => Err(e),
            Err(Publish::Conflict(reported)) => Err(refused(reported).await),
        }
    }
}

/// Waits until a write to the bucket finds its stream from this connection. Right after the
/// bucket is created (by this gateway or another starting with it), the server this
/// connection uses may not yet route the bucket's subjects to its stream, and answers "no
/// responders": a gateway's first lease create failed so in 24 of 26 starts of two gateways
/// together, which cost it a new incarnation after a pause. The probe stores nothing: it
/// expects a subject sequence the stream can never have, so the stream refuses it, which is
/// the answer waited for.
async fn await_routes(
    js: &jetstream::Context,
    prefix: &str,
    deadline: tokio::time::Instant,
) -> Result<(), String> {
    await_probe(js, format!("{prefix}_tinybroker_probe"), deadline)
        .await
        .map_err(|error| format!("no JetStream server answered writes to the bucket: {error}"))
}

/// Sends a probe to `subject` until some JetStream server answers it or `deadline` passes
/// (then the last "no responders"), paced 5 ms doubling to 200 ms. The probe expects a subject
/// sequence no stream can have, so a stream that gets it refuses it and stores nothing: any
/// answer but "no responders" says a server routes `subject` to its stream.
pub(crate) async fn await_probe(
    js: &jetstream::Context,
    subject: String,
    deadline: tokio::time::Instant,
) -> Result<(), jetstream::context::PublishError> {
    let mut delay = Duration::from_millis(5);
    loop {
        let probe =
            jetstream::message::PublishMessage::build().expected_last_subject_sequence(u64::MAX);
        let answer = match js.send_publish(subject.clone(), probe).await {
            Ok(ack) => ack.await.map(|_| ()),
            Err(error) => Err(error),
        };
        match answer {
            Err(error) if error.kind() == PublishErrorKind::StreamNotFound => {
                if tokio::time::Instant::now() >= deadline {
                    return Err(error);
                }
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_millis(200));
            }
            _ => return Ok(()),
        }
    }
}

/// Turns on the bucket stream's `allow_msg_ttl` if it is off, so delete markers can carry
/// `ttl`; returns the header value, or `None` (markers stay) when the servers refuse.
async fn allow_marker_ttl(
    js: &jetstream::Context,
    store: &kv::Store,
    ttl: Duration,
) -> Option<String> {
    let value = ttl.as_secs().max(1).to_string();
    let mut config = store.stream.cached_info().config.clone();
    if config.allow_message_ttl {
        return Some(value);
    }
    config.allow_message_ttl = true;
    match js.update_stream(&config).await {
        Ok(_) => Some(value),
        Err(error) => {
            tracing::warn!(
                stream = %config.name,
                %error,
                "cannot turn on per-message TTL for the coordination bucket (nats-server 2.11.2 or later can; 2.11.0 and 2.11.1 cannot change it on an existing stream, and earlier ones have none): its delete markers stay, about a hundred bytes per subscription id ever used"
            );
            None
        }
    }
}

enum Publish {
    /// The compare-and-set was refused; the key's last sequence, when the answer said it.
    Conflict(Option<Revision>),
    Failed(KvError),
}

impl Backplane for NatsBackplane {
    fn create(&self, key: &str, value: Bytes) -> BoxFuture<'_, Result<Revision, KvError>> {
        let key = key.to_string();
        Box::pin(async move { self.create_entry(&key, value).await })
    }

    fn update(
        &self,
        key: &str,
        value: Bytes,
        expected: Revision,
    ) -> BoxFuture<'_, Result<Revision, KvError>> {
        let key = key.to_string();
        Box::pin(async move { self.write_at(&key, Some(value), expected).await })
    }

    fn delete(&self, key: &str, expected: Revision) -> BoxFuture<'_, Result<Revision, KvError>> {
        let key = key.to_string();
        Box::pin(async move { self.write_at(&key, None, expected).await })
    }

    fn get(&self, key: &str) -> BoxFuture<'_, Result<Option<Entry>, KvError>> {
        let key = key.to_string();
        Box::pin(async move { self.get_entry(&key).await })
    }

    fn watch(&self, prefix: &str) -> BoxFuture<'_, Result<Watch, KvError>> {
        let prefix = prefix.to_string();
        Box::pin(async move {
            let watch = self
                .store
                .watch_many_with_history(watch_filters(&prefix))
                .await
                .map_err(|e| unavailable("watch", e))?;
            let entries = watch.filter_map(move |item| match item {
                Ok(e) => {
                    let key = decode_key(&e.key);
                    key.starts_with(&prefix).then(|| {
                        Ok(Entry {
                            key,
                            value: (e.operation == kv::Operation::Put).then_some(e.value),
                            revision: e.revision,
                        })
                    })
                }
                Err(e) => Some(Err(unavailable("watch", e))),
            });
            Ok(Box::pin(entries) as Watch)
        })
    }

    fn live_keys(&self, prefix: &str) -> BoxFuture<'_, Result<Vec<String>, KvError>> {
        let prefix = prefix.to_string();
        Box::pin(async move { self.live_keys_under(&prefix).await })
    }

    fn last_revision(&self) -> BoxFuture<'_, Result<Revision, KvError>> {
        Box::pin(async move {
            let info = self
                .store
                .stream
                .get_info()
                .await
                .map_err(|e| unavailable("the bucket's stream info", e))?;
            Ok(info.state.last_sequence)
        })
    }
}

fn unavailable(what: &str, e: impl std::fmt::Display) -> KvError {
    KvError::Unavailable(format!("{what}: {e}"))
}

/// How many servers the connected cluster has, as the server's INFO tells (1 outside a cluster).
fn cluster_size(client: &async_nats::Client) -> usize {
    let info = client.server_info();
    if info.cluster.is_none() {
        return 1;
    }
    info.connect_urls.len().max(1)
}
