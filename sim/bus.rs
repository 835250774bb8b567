//! The in-memory model of the bus (`tinybroker::cluster::bus`): core NATS subjects with `*` and
//! `>`, one lock, so a publish reaches every matching subscription at once and in order; a
//! request that matches no subscription is answered "no responders" at once, one nobody answers
//! times out. Each gateway talks through its own [`BusClient`]; a partitioned client's
//! operations fail with `Unavailable` and nothing reaches its subscriptions until it heals
//! (what was published meanwhile is lost: the bus stores nothing).

use std::{
    collections::{BTreeSet, VecDeque},
    pin::Pin,
    sync::{Arc, Mutex, MutexGuard},
    task::{Context, Poll, Waker},
    time::Duration,
};

use bytes::Bytes;
use futures_core::Stream;
use tinybroker::cluster::bus::{Bus, BusError, BusMessage, Inbox};

#[derive(Default)]
struct State {
    subscriptions: Vec<Subscription>,
    next_id: u64,
    partitioned: BTreeSet<u64>,
    /// Messages that reached no subscription of a client not cut off.
    lost: u64,
}

struct Subscription {
    id: u64,
    client: u64,
    subject: String,
    queue: VecDeque<BusMessage>,
    waker: Option<Waker>,
}

/// The shared bus.
#[derive(Clone, Default)]
pub struct BusModel(Arc<Mutex<State>>);

impl BusModel {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Client `id`'s connection to the bus.
    pub fn client(&self, id: u64) -> BusClient {
        BusClient {
            model: self.clone(),
            id,
        }
    }

    /// Cuts client `id` off: its operations fail, nothing reaches it.
    pub fn partition(&self, id: u64) {
        self.lock().partitioned.insert(id);
    }

    /// Connects client `id` again.
    pub fn heal(&self, id: u64) {
        self.lock().partitioned.remove(&id);
    }

    /// Messages published that reached no subscription.
    pub fn lost(&self) -> u64 {
        self.lock().lost
    }

    /// Delivers `message` to every matching subscription of a connected client; how many got it.
    fn deliver(&self, message: &BusMessage) -> usize {
        let mut state = self.lock();
        let state = &mut *state;
        let mut reached = 0;
        for subscription in &mut state.subscriptions {
            if state.partitioned.contains(&subscription.client)
                || !matches(&subscription.subject, &message.subject)
            {
                continue;
            }
            subscription.queue.push_back(message.clone());
            if let Some(waker) = subscription.waker.take() {
                waker.wake();
            }
            reached += 1;
        }
        if reached == 0 {
            state.lost += 1;
        }
        reached
    }
}

/// Whether subscription subject `pattern` matches `subject` (NATS's `*` and `>`).
pub fn matches(pattern: &str, subject: &str) -> bool {
    let mut subject_tokens = subject.split('.');
    for token in pattern.split('.') {
        match (token, subject_tokens.next()) {
            (">", Some(_)) => return true,
            ("*", Some(_)) => {}
            (token, Some(got)) if token == got => {}
            _ => return false,
        }
    }
    subject_tokens.next().is_none()
}

/// One client's connection to the [`BusModel`].
#[derive(Clone)]
pub struct BusClient {
    model: BusModel,
    id: u64,
}

impl std::fmt::Debug for BusClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BusClient").field("id", &self.id).finish()
    }
}

impl BusClient {
    fn connected(&self) -> Result<(), BusError> {
        if self.model.lock().partitioned.contains(&self.id) {
            return Err(BusError::Unavailable(format!(
                "client {} is cut off from the bus",
                self.id
            )));
        }
        Ok(())
    }

    fn subscribe_now(&self, subject: &str) -> Inbox {
        let mut state = self.model.lock();
        state.next_id += 1;
        let id = state.next_id;
        state.subscriptions.push(Subscription {
            id,
            client: self.id,
            subject: subject.to_string(),
            queue: VecDeque::new(),
            waker: None,
        });
        Box::pin(Receiver {
            model: self.model.clone(),
            id,
        })
    }

    fn send(&self, subject: &str, reply: Option<&str>, payload: Bytes) -> Result<usize, BusError> {
        self.connected()?;
        Ok(self.model.deliver(&BusMessage {
            subject: subject.to_string(),
            reply: reply.map(str::to_string),
            payload,
        }))
    }
}

/// A subscription's messages; dropping it removes the subscription.
struct Receiver {
    model: BusModel,
    id: u64,
}

impl Stream for Receiver {
    type Item = BusMessage;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<BusMessage>> {
        let mut state = self.model.lock();
        let Some(subscription) = state.subscriptions.iter_mut().find(|s| s.id == self.id) else {
            return Poll::Ready(None);
        };
        match subscription.queue.pop_front() {
            Some(message) => Poll::Ready(Some(message)),
            None => {
                subscription.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.model.lock().subscriptions.retain(|s| s.id != self.id);
    }
}

impl Bus for BusClient {
    fn new_inbox(&self) -> String {
        let mut state = self.model.lock();
        state.next_id += 1;
        format!("_INBOX.{}.{}", self.id, state.next_id)
    }

    fn subscribe(
        &self,
        subject: &str,
    ) -> tinybroker::cluster::bus::BoxFuture<'_, Result<Inbox, BusError>> {
        let subject = subject.to_string();
        Box::pin(async move {
            self.connected()?;
            Ok(self.subscribe_now(&subject))
        })
    }

    fn publish(
        &self,
        subject: &str,
        payload: Bytes,
    ) -> tinybroker::cluster::bus::BoxFuture<'_, Result<(), BusError>> {
        let subject = subject.to_string();
        Box::pin(async move { self.send(&subject, None, payload).map(|_| ()) })
    }

    fn publish_with_reply(
        &self,
        subject: &str,
        reply: &str,
        payload: Bytes,
    ) -> tinybroker::cluster::bus::BoxFuture<'_, Result<(), BusError>> {
        let (subject, reply) = (subject.to_string(), reply.to_string());
        Box::pin(async move { self.send(&subject, Some(&reply), payload).map(|_| ()) })
    }

    fn request(
        &self,
        subject: &str,
        payload: Bytes,
        timeout: Duration,
    ) -> tinybroker::cluster::bus::BoxFuture<'_, Result<BusMessage, BusError>> {
        let subject = subject.to_string();
        Box::pin(async move {
            self.connected()?;
            let inbox = self.new_inbox();
            let mut answers = self.subscribe_now(&inbox);
            if self.send(&subject, Some(&inbox), payload)? == 0 {
                return Err(BusError::NoResponders);
            }
            let first = std::future::poll_fn(|cx| answers.as_mut().poll_next(cx));
            match tokio::time::timeout(timeout, first).await {
                Ok(Some(answer)) => Ok(answer),
                Ok(None) | Err(_) => Err(BusError::TimedOut),
            }
        })
    }

    fn flush(&self) -> tinybroker::cluster::bus::BoxFuture<'_, Result<(), BusError>> {
        Box::pin(async move { self.connected() })
    }
}
