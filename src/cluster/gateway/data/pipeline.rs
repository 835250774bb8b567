//! A gateway's `PublishStream`: each publish is sent to JetStream as it is read, in order, and
//! answered once JetStream confirmed it, in order, with up to [`PIPELINE`] of them (and
//! [`PIPELINE_BYTES`]) waiting for their confirmations at once; so one stream is not held to
//! one round trip per message. The service reads the requests and writes the answers
//! (`service::publish_stream`); this is what stands between them.
//!
//! Where the stream takes atomic batches ([`crate::cluster::gateway::data::atomic`]), the publishes are grouped
//! instead: one send is in flight at a time (a batch of what waited, or a fenced publish
//! alone), and what is read meanwhile waits for the next. So a batch JetStream did not take
//! is published one by one with nothing sent after it, which keeps the order.

use std::{
    collections::VecDeque,
    pin::Pin,
    task::{Context, Poll},
};

use crate::cluster::gateway::{
    Gateway,
    data::atomic::MAX_BATCH,
    data::publish::{Sent, Unconfirmed},
};
use crate::{
    broker::Published,
    core::{Draft, Error},
};

/// At most this many publishes of one `PublishStream` wait at a gateway for JetStream's
/// confirmation; the stream reads no more requests meanwhile (HTTP/2 flow control then paces
/// the publisher).
const PIPELINE: usize = 256;

/// And at most this many bytes of them (message sizes as the limits count them), beyond the
/// first: a publish waiting for its confirmation is held for a resend, outside the memory
/// budget, so each stream's share stays small.
const PIPELINE_BYTES: usize = 4 << 20;

type Pending<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// One answer to come, in request order.
enum Slot {
    /// Answered already (refused before it was sent, or confirmed).
    Ready(Result<Published, Error>),
    /// Being sent to JetStream: only the newest slot, so sends keep the request order.
    Sending(Pending<Result<Sent, Error>>),
    /// Sent; JetStream's confirmation to come.
    Confirming(Pending<Result<Published, Unconfirmed>>),
    /// JetStream did not confirm it (no server answered, or not in time) while nothing after
    /// it had been sent: sent again with its id, alone, for a bounded time (nothing is read
    /// meanwhile, so the order holds).
    Again(Pending<Result<Published, Error>>),
    /// Grouped: read, not sent yet.
    Waiting(Draft),
    /// Grouped: in the send in flight, answered by it.
    Flying,
}

/// The one send in flight of a grouped pipeline: an answer per publish it carries, in order.
type Flight = Pending<Vec<Result<Published, Error>>>;

/// The publishes of one `PublishStream` through this gateway, from sent to answered.
pub struct Pipeline {
    gateway: Gateway,
    /// The answers to come, oldest first, with each one's message size.
    slots: VecDeque<(Slot, usize)>,
    /// The sizes in `slots` summed.
    slot_bytes: usize,
    /// Whether publishes are grouped into atomic batches (the stream takes them).
    grouped: bool,
    /// Grouped: the send in flight, whose answers go to the `Flying` slots in order.
    flight: Option<Flight>,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("waiting", &self.slots.len())
            .finish_non_exhaustive()
    }
}

impl Pipeline {
    /// An empty pipeline.
    pub fn new(gateway: Gateway) -> Self {
        Self {
            grouped: gateway.batches(),
            gateway,
            slots: VecDeque::new(),
            slot_bytes: 0,
            flight: None,
        }
    }

    /// Grouped: starts the next send when none is in flight: the publishes waiting, from the
    /// oldest, as one batch (a single one alone), up to a fenced one, which goes alone when
    /// it is the oldest (stored only once everything before it was answered).
    fn launch(&mut self) {
        if self.flight.is_some() {
            return;
        }
        let mut drafts = Vec::new();
        for (slot, _) in &mut self.slots {
            match slot {
                Slot::Waiting(draft) if draft.fence().is_some() && !drafts.is_empty() => break,
                Slot::Waiting(draft) if draft.fence().is_some() => {
                    let Slot::Waiting(draft) = std::mem::replace(slot, Slot::Flying) else {
                        unreachable!()
                    };
                    drafts.push(draft);
                    break;
                }
                Slot::Waiting(_) => {
                    let Slot::Waiting(draft) = std::mem::replace(slot, Slot::Flying) else {
                        unreachable!()
                    };
                    drafts.push(draft);
                    if drafts.len() == MAX_BATCH {
                        break;
                    }
                }
                _ => {}
            }
        }
        let gateway = self.gateway.clone();
        self.flight = match drafts.len() {
            0 => None,
            1 => {
                let draft = drafts.pop().expect("one draft");
                Some(Box::pin(async move { vec![gateway.publish(draft).await] }))
            }
            _ => Some(Box::pin(
                async move { gateway.publish_grouped(drafts).await },
            )),
        };
    }

    /// Grouped: the send in flight's answers, once in, into its slots.
    fn land(&mut self, cx: &mut Context<'_>) {
        let Some(flight) = &mut self.flight else {
            return;
        };
        let Poll::Ready(answers) = flight.as_mut().poll(cx) else {
            return;
        };
        self.flight = None;
        let mut answers = answers.into_iter();
        for (slot, _) in &mut self.slots {
            if matches!(slot, Slot::Flying) {
                *slot = Slot::Ready(answers.next().unwrap_or_else(|| {
                    Err(Error::cluster(
                        crate::core::ErrorKind::Internal,
                        "a batch came back with fewer answers than publishes",
                    ))
                }));
            }
        }
    }

    /// Moves the newest slot on once it was sent.
    fn advance_newest(&mut self, cx: &mut Context<'_>) {
        if let Some((newest, _)) = self.slots.back_mut()
            && let Slot::Sending(send) = newest
        {
            match send.as_mut().poll(cx) {
                Poll::Ready(Ok(sent)) => *newest = Slot::Confirming(Box::pin(sent.confirmed())),
                Poll::Ready(Err(refused)) => *newest = Slot::Ready(Err(refused)),
                Poll::Pending => {}
            }
        }
    }

    /// `Ready` while it takes another publish: the newest is sent (sends keep the request
    /// order) and fewer than [`PIPELINE`] (and [`PIPELINE_BYTES`]) wait.
    pub fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.grouped {
            // Room only: what is read waits for the next send. Full, the flight wakes it.
            self.land(cx);
            self.launch();
            self.land(cx);
            if self.slots.len() >= PIPELINE || self.slot_bytes >= PIPELINE_BYTES {
                return Poll::Pending;
            }
            return Poll::Ready(());
        }
        self.advance_newest(cx);
        let busy = matches!(
            self.slots.back(),
            Some((Slot::Sending(_) | Slot::Again(_), _))
        );
        if busy || self.slots.len() >= PIPELINE || self.slot_bytes >= PIPELINE_BYTES {
            return Poll::Pending;
        }
        Poll::Ready(())
    }

    /// Takes the next request: a draft to send, or the refusal that answers it.
    pub fn push(&mut self, request: Result<Draft, Error>) {
        match request {
            Ok(draft) if self.grouped => {
                let size = draft.size();
                self.slot_bytes += size;
                self.slots.push_back((Slot::Waiting(draft), size));
            }
            Ok(draft) => {
                let size = draft.size();
                let gateway = self.gateway.clone();
                self.slot_bytes += size;
                let slot = if draft.fence().is_some() {
                    // Checked as JetStream stores it (docs/semantics.md#cluster-fenced-publish):
                    // published alone, once every publish before it was answered, and nothing
                    // after it is read until it is answered.
                    Slot::Again(Box::pin(async move { gateway.publish(draft).await }))
                } else {
                    Slot::Sending(Box::pin(async move { gateway.send(draft).await }))
                };
                self.slots.push_back((slot, size));
            }
            Err(error) => self.slots.push_back((Slot::Ready(Err(error)), 0)),
        }
    }

    /// The oldest request's answer once it has one; `Ready(None)` when none waits.
    pub fn poll_answer(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Published, Error>>> {
        if self.grouped {
            self.land(cx);
            self.launch();
            self.land(cx);
            return match self.slots.front() {
                None => Poll::Ready(None),
                Some((Slot::Ready(_), _)) => {
                    let Some((Slot::Ready(result), size)) = self.slots.pop_front() else {
                        unreachable!()
                    };
                    self.slot_bytes -= size;
                    Poll::Ready(Some(result))
                }
                Some(_) => Poll::Pending,
            };
        }
        loop {
            self.advance_newest(cx);
            let alone = self.slots.len() == 1;
            let Some((head, _)) = self.slots.front_mut() else {
                return Poll::Ready(None);
            };
            let answered = match head {
                Slot::Ready(_) => true,
                Slot::Sending(_) => false,
                Slot::Confirming(confirming) => match confirming.as_mut().poll(cx) {
                    Poll::Ready(Ok(published)) => {
                        *head = Slot::Ready(Ok(published));
                        true
                    }
                    Poll::Ready(Err(Unconfirmed::Again(resend))) if alone => {
                        let gateway = self.gateway.clone();
                        *head = Slot::Again(Box::pin(async move { gateway.resend(resend).await }));
                        continue;
                    }
                    Poll::Ready(Err(unconfirmed)) => {
                        *head = Slot::Ready(Err(unconfirmed.error()));
                        true
                    }
                    Poll::Pending => false,
                },
                Slot::Again(again) => match again.as_mut().poll(cx) {
                    Poll::Ready(result) => {
                        *head = Slot::Ready(result);
                        true
                    }
                    Poll::Pending => false,
                },
                // Only in a grouped pipeline, which answers above.
                Slot::Waiting(_) | Slot::Flying => false,
            };
            if answered && let Some((Slot::Ready(result), size)) = self.slots.pop_front() {
                self.slot_bytes -= size;
                return Poll::Ready(Some(result));
            }
            return Poll::Pending;
        }
    }
}
