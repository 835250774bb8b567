//! The one seam between the gRPC service and the deployment: a [`Backend`] is the embedded
//! broker or a cluster-mode gateway, chosen once by the binary (`serve`, with or without
//! `--nats`). The service validates requests into domain types, calls the backend, and turns
//! what comes back (domain values, [`Error`]s) into protobuf and statuses; it never asks which
//! deployment it serves. Every operation below is one `match` with one arm per deployment, in
//! this file only.
//!
//! Both deployments keep a local [`Broker`] for member streams, windows, fences, frames and
//! `Consume`'s settles ([`Backend::broker`]): what differs is where publishes go, how unary
//! settles find their member, and what a subscription's description adds.

mod embedded;

use std::{
    task::{Context, Poll},
    time::Duration,
};

pub use embedded::Run;

use crate::{
    broker::{
        BatchError, Broker, BrokerStats, ConnectionId, Deleted, Description, Fence, HandedOver,
        LeadershipWatch, MemberStream, Published,
    },
    cluster::gateway::{Gateway, Pipeline, control::singleton::ClusterLines},
    core::{Draft, Error, Limits, OpenRequest, Proclamation},
};

/// Where a deployment keeps what it confirms, and so what a confirmed publish survives
/// (docs/cluster.md#durability).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Storage {
    /// The embedded broker's process memory: nothing outlives the process.
    Memory,
    /// A JetStream stream on the NATS servers a gateway runs over.
    JetStream {
        stream: String,
        /// `file` or `memory`.
        storage: &'static str,
        replicas: usize,
        /// The stream's consumer limit; 0 or less: the servers' default.
        max_consumers: i32,
    },
}

/// Where the service's requests go.
#[derive(Debug, Clone)]
pub enum Backend {
    /// The embedded, in-memory broker: everything happens here.
    Embedded(Broker),
    /// A cluster-mode gateway over NATS JetStream (`serve --nats`).
    Gateway(Gateway),
}

impl Backend {
    /// The broker holding the member streams served here (a gateway's local broker).
    pub fn broker(&self) -> &Broker {
        match self {
            Backend::Embedded(broker) => broker,
            Backend::Gateway(gateway) => gateway.broker(),
        }
    }

    /// The limits requests are validated against.
    pub fn limits(&self) -> &Limits {
        self.broker().limits()
    }

    /// Joins a member; its stream carries its frames.
    ///
    /// # Errors
    /// The broker's refusals ([`Broker::open`]); at a gateway also a consumer that does not
    /// fit the request, or JetStream out of reach.
    pub async fn open(
        &self,
        request: &OpenRequest,
        connection: Option<ConnectionId>,
    ) -> Result<MemberStream, Error> {
        match self {
            Backend::Embedded(broker) => broker.open(request, connection).inspect_err(|e| {
                crate::broker::refused_join(&request.subscription_id, e);
            }),
            Backend::Gateway(gateway) => gateway.open(request, connection).await,
        }
    }

    /// A unary Ack (or Nack, when `nack`) whose fields were validated.
    ///
    /// # Errors
    /// The broker's refusals ([`Broker::ack`]); at a gateway also a member no gateway holds,
    /// or a two-field settle at a gateway not holding the member's stream.
    pub async fn settle(
        &self,
        subscription_id: &str,
        fence: Fence,
        system_id: u64,
        nack: bool,
    ) -> Result<(), Error> {
        match self {
            Backend::Embedded(broker) if nack => broker.nack(subscription_id, fence, system_id),
            Backend::Embedded(broker) => broker.ack(subscription_id, fence, system_id),
            Backend::Gateway(gateway) => {
                gateway
                    .settle(subscription_id, fence, system_id, nack)
                    .await
            }
        }
    }

    /// Refuses, before anything of its batch is published, a message this deployment cannot
    /// take although it is valid (at a gateway: too large for NATS with its dead letter's
    /// headers).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the limit.
    pub fn admit(&self, draft: &Draft) -> Result<(), Error> {
        match self {
            Backend::Embedded(_) => Ok(()),
            Backend::Gateway(gateway) => gateway.check_size(draft),
        }
    }

    /// Publishes one message.
    ///
    /// # Errors
    /// The broker's refusals ([`Broker::publish`]); at a gateway, JetStream's.
    pub async fn publish(&self, draft: Draft) -> Result<Published, Error> {
        match self {
            Backend::Embedded(broker) => broker.publish(draft),
            Backend::Gateway(gateway) => gateway.publish(draft).await,
        }
    }

    /// Publishes a batch in order, each message [`admit`](Self::admit)ted first.
    ///
    /// # Errors
    /// What was published before the first refusal, and that refusal.
    pub async fn publish_batch(&self, drafts: Vec<Draft>) -> Result<Vec<Published>, BatchError> {
        match self {
            Backend::Embedded(broker) => broker.publish_batch(drafts),
            Backend::Gateway(gateway) => gateway.publish_batch(drafts).await,
        }
    }

    /// What carries the publishes of one `PublishStream`.
    pub fn publisher(&self) -> Publisher {
        match self {
            Backend::Embedded(broker) => Publisher::Embedded(Run::new(broker.clone())),
            Backend::Gateway(gateway) => Publisher::Gateway(Pipeline::new(gateway.clone())),
        }
    }

    /// One subscription, described.
    ///
    /// # Errors
    /// [`Error::SubscriptionNotFound`] (at a gateway, of kind not found when JetStream has no
    /// consumer for it either).
    pub async fn describe(&self, subscription_id: &str) -> Result<Description, Error> {
        match self {
            Backend::Embedded(broker) => broker.describe(subscription_id).map(Description::from),
            Backend::Gateway(gateway) => gateway.describe(subscription_id).await,
        }
    }

    /// Watches a SINGLETON subscription's leadership (docs/semantics.md#watching-leadership):
    /// at a gateway, the cluster's, as the coordination bucket records it.
    ///
    /// # Errors
    /// [`Error::SubscriptionNotFound`] (at a gateway, of kind not found when JetStream has no
    /// consumer for it either), [`Error::NotSingleton`]; at a gateway also
    /// [`Error::Unavailable`] when JetStream did not answer.
    pub async fn watch_leadership(&self, subscription_id: &str) -> Result<LeadershipWatch, Error> {
        match self {
            Backend::Embedded(broker) => broker.watch_leadership(subscription_id),
            Backend::Gateway(gateway) => gateway.watch_leadership(subscription_id).await,
        }
    }

    /// The active member of a SINGLETON subscription replaces its metadata
    /// (docs/semantics.md#member-metadata): at a gateway, in the cluster's line too, answered
    /// once the line holds it.
    ///
    /// # Errors
    /// [`Broker::proclaim`]'s refusals; at a gateway also a member another gateway holds,
    /// and [`Error::Unavailable`] when the line did not take it in time.
    pub async fn proclaim(&self, proclamation: Proclamation) -> Result<(), Error> {
        match self {
            Backend::Embedded(broker) => broker
                .proclaim(
                    &proclamation.subscription_id,
                    proclamation.member,
                    proclamation.epoch,
                    proclamation.metadata,
                )
                .map(|_| ()),
            Backend::Gateway(gateway) => gateway.proclaim(proclamation).await,
        }
    }

    /// Asks the active member of a SINGLETON subscription to hand over
    /// (docs/semantics.md#hand-over), and waits until it did, or its refusal.
    ///
    /// # Errors
    /// [`Broker::hand_over`]'s refusals, and theirs once it ran; [`Error::ShuttingDown`] when
    /// the broker stopped meanwhile; at a gateway, [`Error::Unavailable`] when the outcome
    /// could not be seen (docs/semantics.md#cluster-priority-and-hand-over).
    pub async fn hand_over(&self, subscription_id: &str) -> Result<HandedOver, Error> {
        match self {
            Backend::Embedded(broker) => {
                let wait = broker.hand_over(subscription_id)?;
                wait.await.map_err(|_| Error::ShuttingDown)?
            }
            Backend::Gateway(gateway) => gateway.hand_over(subscription_id).await,
        }
    }

    /// Removes a subscription with no member joined, with its settings and what it holds
    /// (docs/semantics.md#deleting).
    ///
    /// # Errors
    /// [`Error::SubscriptionNotFound`] (at a gateway, of kind not found), or
    /// [`Error::MembersJoined`] while a member is joined (at a gateway: at any gateway); at a
    /// gateway also [`Error::Unavailable`] when the cluster could not be asked.
    pub async fn delete(&self, subscription_id: &str) -> Result<Deleted, Error> {
        match self {
            Backend::Embedded(broker) => broker.delete(subscription_id),
            Backend::Gateway(gateway) => gateway.delete(subscription_id).await,
        }
    }

    /// Up to `limit` subscriptions whose ids come after `after`, in id order: every one
    /// [`describe`](Self::describe) here can describe. With the broker-wide counters.
    ///
    /// # Errors
    /// At a gateway, [`Error::Unavailable`] when JetStream does not list its consumers.
    pub async fn list_page(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<Description>, BrokerStats), Error> {
        match self {
            Backend::Embedded(broker) => {
                let (views, stats) = broker.list_page(after, limit);
                Ok((views.into_iter().map(Description::from).collect(), stats))
            }
            Backend::Gateway(gateway) => gateway.list_page(after, limit).await,
        }
    }

    /// Every subscription, for a console (docs/operations.md#console): as
    /// [`list_page`](Self::list_page) lists them, but at a gateway without each singleton's
    /// line, which [`cluster_lines`](Self::cluster_lines) gives for all at once.
    ///
    /// # Errors
    /// At a gateway, [`Error::Unavailable`] when JetStream does not list its consumers.
    pub async fn list_all(&self) -> Result<(Vec<Description>, BrokerStats), Error> {
        match self {
            Backend::Embedded(broker) => {
                let (views, stats) = broker.list();
                Ok((views.into_iter().map(Description::from).collect(), stats))
            }
            Backend::Gateway(gateway) => gateway.list_brief().await,
        }
    }

    /// At a gateway, its copy of the cluster's lines; `None` on the embedded broker.
    pub async fn cluster_lines(&self) -> Option<ClusterLines> {
        match self {
            Backend::Embedded(_) => None,
            Backend::Gateway(gateway) => gateway.cluster_lines().await,
        }
    }

    /// Where what this deployment confirms is kept (docs/cluster.md#durability).
    pub fn storage(&self) -> Storage {
        match self {
            Backend::Embedded(_) => Storage::Memory,
            Backend::Gateway(gateway) => gateway.storage(),
        }
    }

    /// After the server stopped: a gateway gives back what it still holds, so other gateways
    /// get it at once (waiting at most `timeout`); the embedded broker has nothing to do.
    pub async fn close(&self, timeout: Duration) {
        match self {
            Backend::Embedded(_) => {}
            Backend::Gateway(gateway) => gateway.close(timeout).await,
        }
    }
}

/// The publishes of one `PublishStream`, between the requests read and the answers written
/// (`service::publish_stream` drives it): it takes drafts (or the refusals of invalid
/// requests, answered in their place) and gives back one result per request, in request order.
#[derive(Debug)]
pub enum Publisher {
    /// The embedded broker: what has arrived is published together, then answered.
    Embedded(Run),
    /// A gateway: each publish is sent as it is read, answered once JetStream confirmed it.
    Gateway(Pipeline),
}

impl Publisher {
    /// `Ready` while it takes another request. `Pending` until its answers are taken: the
    /// caller then polls [`poll_answer`](Self::poll_answer), which answers or wakes it later.
    pub fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        match self {
            Publisher::Embedded(run) => run.poll_ready(),
            Publisher::Gateway(pipeline) => pipeline.poll_ready(cx),
        }
    }

    /// Takes the next request: a draft to publish, or the refusal that answers it.
    pub fn push(&mut self, request: Result<Draft, Error>) {
        match self {
            Publisher::Embedded(run) => run.push(request),
            Publisher::Gateway(pipeline) => pipeline.push(request),
        }
    }

    /// The oldest unanswered request's result once it has one; `Ready(None)` when every
    /// request taken is answered.
    pub fn poll_answer(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Published, Error>>> {
        match self {
            Publisher::Embedded(run) => Poll::Ready(run.next_answer()),
            Publisher::Gateway(pipeline) => pipeline.poll_answer(cx),
        }
    }

    /// Whether its publishes meet the broker's own refusal once shutdown starts (so the stream
    /// need not look for shutdown before each request it reads); a gateway's do not.
    pub fn refused_at_shutdown(&self) -> bool {
        match self {
            Publisher::Embedded(_) => true,
            Publisher::Gateway(_) => false,
        }
    }
}
