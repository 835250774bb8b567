//! A typed async client for the broker: the one the `tinybroker` CLI, `bench` and the examples
//! use.
//!
//! - [`Client`]: connection (HTTP/2 keepalive on by default, optional TLS and bearer token),
//!   unary publish, acks, inspection;
//! - [`Publisher`] (in `publish`): pipelined publishes over one `PublishStream`;
//! - [`Subscription`] and [`Delivery`] (in `subscription`): a `Consume` stream whose deliveries
//!   settle themselves on that stream, and whose [`Subscription::close`] waits until the broker
//!   applied them;
//! - [`Leadership`] (in `election`): leader election on a singleton subscription;
//! - [`SubscriptionInfo`] and [`Listing`] (in `info`): what inspection answers;
//! - [`Error`]: every refusal as a variant callers can match.
//!
//! ```no_run
//! # async fn run() -> Result<(), tinybroker::client::Error> {
//! use tinybroker::client::{Client, Message, SubscriptionOptions};
//!
//! let client = Client::connect("http://127.0.0.1:50051").await?;
//! client.publish(Message::new("jobs.email", "hello")).await?;
//! let mut jobs = client
//!     .subscribe(SubscriptionOptions::queue("mailer", "mailers", ["jobs.>"]))
//!     .await?;
//! let member = jobs.active().await?; // the confirmation: member id and epoch
//! println!("member {} of mailer", member.member_id);
//! while let Some(delivery) = jobs.next_delivery().await {
//!     let delivery = delivery?;
//!     println!("{:?}", delivery.payload);
//!     delivery.ack()?; // queued; `close` waits until the broker applied it
//! #   break;
//! }
//! jobs.close().await?;
//! # Ok(()) }
//! ```

mod election;
mod error;
mod info;
mod options;
mod outgoing;
mod publish;
mod subscription;
mod watch;

use std::{collections::HashMap, sync::Arc, time::Duration};

use bytes::Bytes;
use tonic::{
    Request, Status,
    metadata::AsciiMetadataValue,
    service::{Interceptor, interceptor::InterceptedService},
    transport::{Certificate, Channel, ClientTlsConfig, Endpoint},
};

pub use crate::core::{AckMode, Mode, Overflow};
pub use election::{HandedOver, Leadership, Lost, LostCause, MAX_BUFFERED_MESSAGES};
pub use error::{Error, Result};
pub use info::{
    BrokerCounters, Counters, Listing, MemberInfo, Storage, SubscriptionInfo, UpstreamBacklog,
};
pub use options::SubscriptionOptions;
pub use publish::{MAX_PENDING_PUBLISHES, PendingPublish, Publisher};
pub use subscription::{Activation, Delivery, Event, Subscription};
pub use watch::{LeaderState, LeadershipWatch};

use crate::pb::{self, broker_client::BrokerClient};

/// How to reach the broker. `Default` has keepalive on (10 s ping, 10 s timeout) so a client
/// behind a partition notices within ~20 s, like the server does.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// Sent as `authorization: Bearer <token>` on every call.
    pub token: Option<String>,
    /// TLS settings for `https://` URLs; `None` with an `https` URL uses the system's roots.
    pub tls: Option<ClientTlsConfig>,
    /// HTTP/2 keepalive ping interval; `None` turns keepalive off (a vanished broker then goes
    /// unnoticed until TCP gives up, which can take many minutes).
    pub keepalive_interval: Option<Duration>,
    /// How long a keepalive ping may go unanswered before the connection, and every stream on
    /// it, fails.
    pub keepalive_timeout: Duration,
    /// Bound on establishing the TCP (and TLS) connection.
    pub connect_timeout: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            token: None,
            tls: None,
            keepalive_interval: Some(Duration::from_secs(10)),
            keepalive_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
        }
    }
}

impl ClientOptions {
    /// Sets the bearer token.
    #[must_use]
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Trusts the CA certificate in `pem` (for a broker with a private certificate).
    #[must_use]
    pub fn ca_pem(mut self, pem: impl AsRef<[u8]>) -> Self {
        let tls = self.tls.take().unwrap_or_default();
        self.tls = Some(tls.ca_certificate(Certificate::from_pem(pem)));
        self
    }
}

/// Adds `authorization: Bearer <token>` to every call.
#[derive(Clone, Debug)]
pub struct Bearer(Option<AsciiMetadataValue>);

impl Interceptor for Bearer {
    fn call(&mut self, mut request: Request<()>) -> std::result::Result<Request<()>, Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// The generated client with the bearer interceptor, for calls this module does not wrap.
pub type RawClient = BrokerClient<InterceptedService<Channel, Bearer>>;

/// A message to publish.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Message {
    /// Dot-separated tokens, e.g. `schedule.daily.report`.
    pub topic: String,
    /// Opaque payload.
    pub payload: Bytes,
    /// Application headers.
    pub headers: HashMap<String, String>,
    /// Stored only while this epoch leads that SINGLETON subscription: `(subscription_id,
    /// epoch)` (docs/semantics.md#fenced-publish). [`Leadership::fence`] sets a leader's own.
    pub fence: Option<(String, u64)>,
}

impl Message {
    /// A message with no headers.
    pub fn new(topic: impl Into<String>, payload: impl Into<Bytes>) -> Self {
        Self {
            topic: topic.into(),
            payload: payload.into(),
            headers: HashMap::new(),
            fence: None,
        }
    }

    /// Fences the message by `epoch` of the SINGLETON subscription `subscription_id`: the
    /// broker stores it only while that epoch is the subscription's active epoch, and refuses it
    /// with [`Error::FailedPrecondition`] naming the epoch now otherwise (nothing is stored).
    #[must_use]
    pub fn fenced(mut self, subscription_id: impl Into<String>, epoch: u64) -> Self {
        self.fence = Some((subscription_id.into(), epoch));
        self
    }

    /// Adds a header.
    #[must_use]
    pub fn header(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(key.into(), value.into());
        self
    }

    pub(crate) fn into_pb(self) -> pb::PublishRequest {
        pb::PublishRequest {
            topic: self.topic,
            payload: self.payload,
            headers: self.headers,
            fence: self.fence.map(|(subscription_id, epoch)| pb::PublishFence {
                subscription_id,
                epoch,
            }),
        }
    }
}

/// What the broker answered to a publish.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Published {
    /// Broker-wide id, increasing in publish order.
    pub system_id: u64,
    /// How many subscriptions queued the message. 0: it matched none and is not kept; a
    /// subscription that joins later never sees it.
    pub queued_for: u32,
}

impl From<pb::PublishResponse> for Published {
    fn from(r: pb::PublishResponse) -> Self {
        Self {
            system_id: r.system_id,
            queued_for: r.queued_for,
        }
    }
}

/// A connection to one broker. Cheap to clone: clones share the HTTP/2 connection, which
/// reconnects on its own after a failure.
#[derive(Clone, Debug)]
pub struct Client {
    raw: RawClient,
    url: Arc<str>,
}

impl Client {
    /// Connects with [`ClientOptions::default`].
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad URL, [`Error::Transport`] when the broker cannot be
    /// reached.
    pub async fn connect(url: impl Into<String>) -> Result<Self> {
        Self::connect_with(url, ClientOptions::default()).await
    }

    /// Connects with `options`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad URL, token or TLS setting, [`Error::Transport`] when
    /// the broker cannot be reached.
    pub async fn connect_with(url: impl Into<String>, options: ClientOptions) -> Result<Self> {
        let url = url.into();
        let mut endpoint = Endpoint::from_shared(url.clone())
            .map_err(|e| Error::InvalidArgument(format!("bad broker URL {url:?}: {e}")))?
            .connect_timeout(options.connect_timeout)
            .keep_alive_timeout(options.keepalive_timeout)
            .keep_alive_while_idle(options.keepalive_interval.is_some());
        if let Some(interval) = options.keepalive_interval {
            endpoint = endpoint.http2_keep_alive_interval(interval);
        }
        if let Some(tls) = options.tls.clone() {
            endpoint = endpoint
                .tls_config(tls)
                .map_err(|e| Error::InvalidArgument(format!("TLS settings: {e}")))?;
        } else if url.starts_with("https://") {
            endpoint = endpoint
                .tls_config(ClientTlsConfig::new().with_enabled_roots())
                .map_err(|e| Error::InvalidArgument(format!("TLS settings: {e}")))?;
        }
        let channel = endpoint.connect().await.map_err(Error::transport)?;
        Self::from_channel(channel, options.token.as_deref(), url)
    }

    /// Wraps a channel made elsewhere (a custom connector, a simulation's network).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the token is not printable ASCII.
    pub fn from_channel(
        channel: Channel,
        token: Option<&str>,
        url: impl Into<String>,
    ) -> Result<Self> {
        let token = token
            .map(|t| {
                format!("Bearer {t}")
                    .parse::<AsciiMetadataValue>()
                    .map_err(|_| Error::InvalidArgument("the token must be printable ASCII".into()))
            })
            .transpose()?;
        Ok(Self {
            raw: BrokerClient::with_interceptor(channel, Bearer(token)),
            url: url.into().into(),
        })
    }

    /// The URL this client connected to.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The generated client, for calls this type does not wrap.
    pub fn raw(&self) -> RawClient {
        self.raw.clone()
    }

    /// Publishes one message.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad topic, [`Error::ResourceExhausted`] when a queue is
    /// full or the message is over the size limit, [`Error::Unavailable`] when the broker is
    /// gone or shutting down.
    pub async fn publish(&self, message: Message) -> Result<Published> {
        let reply = self.raw.clone().publish(message.into_pb()).await?;
        Ok(reply.into_inner().into())
    }

    /// Publishes many messages in one call, in order; one invalid message refuses them all.
    ///
    /// # Errors
    /// As [`Client::publish`], for the first message refused.
    pub async fn publish_batch(
        &self,
        messages: impl IntoIterator<Item = Message>,
    ) -> Result<Vec<Published>> {
        let request = pb::PublishBatchRequest {
            messages: messages.into_iter().map(Message::into_pb).collect(),
        };
        let reply = self.raw.clone().publish_batch(request).await?;
        Ok(reply
            .into_inner()
            .results
            .into_iter()
            .map(Into::into)
            .collect())
    }

    /// Opens a streaming publisher (`PublishStream`) for pipelined publishes.
    ///
    /// # Errors
    /// [`Error::Unavailable`] or [`Error::Transport`] when the stream cannot be opened,
    /// [`Error::Unauthenticated`] without the right token.
    pub async fn publisher(&self) -> Result<Publisher> {
        Publisher::open(self.raw.clone()).await
    }

    /// Joins a subscription over a `Consume` stream. Returns once the broker has accepted the
    /// member, before its confirmation is read: [`Subscription::member_id`] is 0 until then.
    /// Await [`Subscription::active`] for the member id and epoch (at once in queue and
    /// broadcast mode, on promotion in singleton mode), or read [`Event::Active`].
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for bad options, [`Error::FailedPrecondition`] when they differ
    /// from the live subscription's, [`Error::AlreadyExists`] for a live broadcast id,
    /// [`Error::ResourceExhausted`] at the subscription or member limit.
    pub async fn subscribe(&self, options: SubscriptionOptions) -> Result<Subscription> {
        Subscription::open(self.raw.clone(), options).await
    }

    /// Acknowledges a message with the unary `Ack` (for acks that travel apart from the stream;
    /// a [`Delivery`] acks itself on its stream). `member_id` is the fence from the
    /// confirmation; `None` lets the connection fence it.
    ///
    /// # Errors
    /// [`Error::NotFound`] when the message is not in flight, [`Error::FailedPrecondition`]
    /// when the ack is stale (another member holds the message now).
    pub async fn ack(
        &self,
        subscription_id: &str,
        system_id: u64,
        member_id: Option<u64>,
    ) -> Result<()> {
        self.raw
            .clone()
            .ack(pb::Ack {
                subscription_id: subscription_id.into(),
                system_id,
                member_id: member_id.unwrap_or(0),
            })
            .await?;
        Ok(())
    }

    /// Gives a message back for redelivery with the unary `Nack`; fenced like [`Client::ack`].
    ///
    /// # Errors
    /// As [`Client::ack`].
    pub async fn nack(
        &self,
        subscription_id: &str,
        system_id: u64,
        member_id: Option<u64>,
    ) -> Result<()> {
        self.raw
            .clone()
            .nack(pb::Nack {
                subscription_id: subscription_id.into(),
                system_id,
                member_id: member_id.unwrap_or(0),
            })
            .await?;
        Ok(())
    }
}
