//! The bus seam: what gateways say to each other, and hear from JetStream, over core NATS
//! (docs/cluster-internals.md#coordination-internals): publish and subscribe on subjects, with a reply
//! subject for answers, and request/reply. Two implementations: NATS in production
//! ([`NatsBus`], over `async-nats`) and the in-memory model in `sim/bus.rs`; one contract suite
//! (`sim/bus_contract.rs`) holds both to the semantics below, the NATS one against a real
//! nats-server.
//!
//! # Semantics every implementation must keep
//! - **Subjects** are dot-separated tokens; a subscription's subject may hold the wildcards `*`
//!   (one token) and `>` (one or more tokens, last). A message reaches every subscription whose
//!   subject matches it when it is published, none other, at most once each.
//! - **Order**: messages one client publishes reach one subscription in the order published.
//! - **Interest**: a subscription is in place for this client's own publishes once
//!   [`Bus::subscribe`] returned; for other clients' once [`Bus::flush`] returned after it (the
//!   server has it; a cluster's other servers learn of it later, which is why a request that
//!   finds no responders may be tried again).
//! - **Delivery is at most once**: a message may be lost (no subscriber, a connection cut);
//!   nothing is stored. Callers that need an answer bound their wait.
//! - [`Bus::request`] sends to `subject` with a fresh reply subject and waits for the first
//!   answer: [`BusError::NoResponders`] when no subscription matched it (NATS answers so at
//!   once), [`BusError::TimedOut`] when none answered within the timeout.
//! - An [`Inbox`] ends only when its subscription is dropped or its client closed; dropping it
//!   removes the interest.
//!
//! No NATS type appears here: the gateway speaks only this.

use std::{fmt, pin::Pin, time::Duration};

use bytes::Bytes;
use futures_core::Stream;

pub use super::backplane::BoxFuture;

/// A message on the bus.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BusMessage {
    /// The subject it was published to.
    pub subject: String,
    /// Where its answer goes, if it wants one.
    pub reply: Option<String>,
    /// Its body.
    pub payload: Bytes,
}

/// The messages of one subscription, in order.
pub type Inbox = Pin<Box<dyn Stream<Item = BusMessage> + Send>>;

/// Why a bus operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BusError {
    /// A request matched no subscription.
    #[error("no responders")]
    NoResponders,
    /// A request was not answered within its timeout.
    #[error("timed out")]
    TimedOut,
    /// The connection could not take the operation (closed, or its buffer full).
    #[error("{0}")]
    Unavailable(String),
}

/// The bus. Object-safe, so the gateway holds an `Arc<dyn Bus>`.
pub trait Bus: Send + Sync + fmt::Debug {
    /// A subject of this client's own for answers ([`Bus::publish_with_reply`]).
    fn new_inbox(&self) -> String;

    /// Subscribes to `subject` (wildcards allowed).
    ///
    /// # Errors
    /// [`BusError::Unavailable`] when the connection cannot take it.
    fn subscribe(&self, subject: &str) -> BoxFuture<'_, Result<Inbox, BusError>>;

    /// Publishes `payload` to `subject`.
    ///
    /// # Errors
    /// [`BusError::Unavailable`] when the connection cannot take it.
    fn publish(&self, subject: &str, payload: Bytes) -> BoxFuture<'_, Result<(), BusError>>;

    /// Publishes `payload` to `subject`, answers to go to `reply`.
    ///
    /// # Errors
    /// [`BusError::Unavailable`] when the connection cannot take it.
    fn publish_with_reply(
        &self,
        subject: &str,
        reply: &str,
        payload: Bytes,
    ) -> BoxFuture<'_, Result<(), BusError>>;

    /// Sends `payload` to `subject` and waits, at most `timeout`, for the first answer.
    ///
    /// # Errors
    /// [`BusError::NoResponders`], [`BusError::TimedOut`], [`BusError::Unavailable`].
    fn request(
        &self,
        subject: &str,
        payload: Bytes,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<BusMessage, BusError>>;

    /// Returns once the server has every subscription and publish made before it.
    ///
    /// # Errors
    /// [`BusError::Unavailable`] when the connection cannot take it.
    fn flush(&self) -> BoxFuture<'_, Result<(), BusError>>;
}

/// The bus over one `async-nats` client.
#[derive(Debug, Clone)]
pub struct NatsBus {
    client: async_nats::Client,
}

impl NatsBus {
    /// The bus over `client`.
    pub fn new(client: async_nats::Client) -> Self {
        Self { client }
    }
}

fn unavailable(error: impl fmt::Display) -> BusError {
    BusError::Unavailable(error.to_string())
}

fn message(message: async_nats::Message) -> BusMessage {
    BusMessage {
        subject: message.subject.to_string(),
        reply: message.reply.map(|reply| reply.to_string()),
        payload: message.payload,
    }
}

impl Bus for NatsBus {
    fn new_inbox(&self) -> String {
        self.client.new_inbox()
    }

    fn subscribe(&self, subject: &str) -> BoxFuture<'_, Result<Inbox, BusError>> {
        let subject = subject.to_string();
        Box::pin(async move {
            let subscriber = self.client.subscribe(subject).await.map_err(unavailable)?;
            let inbox: Inbox = Box::pin(tokio_stream::StreamExt::map(subscriber, message));
            Ok(inbox)
        })
    }

    fn publish(&self, subject: &str, payload: Bytes) -> BoxFuture<'_, Result<(), BusError>> {
        let subject = subject.to_string();
        Box::pin(async move {
            self.client
                .publish(subject, payload)
                .await
                .map_err(unavailable)
        })
    }

    fn publish_with_reply(
        &self,
        subject: &str,
        reply: &str,
        payload: Bytes,
    ) -> BoxFuture<'_, Result<(), BusError>> {
        let (subject, reply) = (subject.to_string(), reply.to_string());
        Box::pin(async move {
            self.client
                .publish_with_reply(subject, reply, payload)
                .await
                .map_err(unavailable)
        })
    }

    fn request(
        &self,
        subject: &str,
        payload: Bytes,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<BusMessage, BusError>> {
        let subject = subject.to_string();
        Box::pin(async move {
            let request = self.client.request(subject, payload);
            match tokio::time::timeout(timeout, request).await {
                Ok(Ok(answer)) => Ok(message(answer)),
                Ok(Err(error)) => Err(match error.kind() {
                    async_nats::RequestErrorKind::NoResponders => BusError::NoResponders,
                    async_nats::RequestErrorKind::TimedOut => BusError::TimedOut,
                    _ => unavailable(error),
                }),
                Err(_) => Err(BusError::TimedOut),
            }
        })
    }

    fn flush(&self) -> BoxFuture<'_, Result<(), BusError>> {
        Box::pin(async move { self.client.flush().await.map_err(unavailable) })
    }
}
