//! A subscription over the `Consume` stream: deliveries settle themselves on the member's own
//! stream (fenced by construction), refusals come back on it as events, and
//! [`Subscription::close`] leaves only once the broker has applied every queued settlement.

use std::{
    collections::HashMap,
    future::poll_fn,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::{Duration, SystemTime},
};

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::Stream;

use super::{
    AckMode, Error, RawClient, Result, SubscriptionOptions,
    outgoing::{Outgoing, SettleSender, Settlement},
};
use crate::pb::{self, subscription_frame::Frame};

/// One delivered message. Settle it with [`Delivery::ack`] or [`Delivery::nack`]; dropping it
/// unsettled leaves it in flight until the subscription ends, when it is redelivered.
#[derive(Debug)]
pub struct Delivery {
    /// Broker-wide id, increasing in publish order.
    pub system_id: u64,
    /// The topic it was published on.
    pub topic: String,
    /// Opaque payload.
    pub payload: Bytes,
    /// Application headers (plus `tinybroker-dead-letter-*` on a dead letter).
    pub headers: HashMap<String, String>,
    /// 1 on first delivery, +1 on every redelivery.
    pub attempt: u32,
    /// The member's epoch: the fencing token for side effects.
    pub epoch: u64,
    /// When the broker accepted the publish.
    pub published_at: Option<SystemTime>,
    /// The subscription it came from.
    pub subscription_id: Arc<str>,
    /// The member it was delivered to.
    pub member_id: u64,
    /// `None` when ack-free: nothing to settle.
    settle: Option<SettleSender>,
}

impl Delivery {
    fn settle(&self, settlement: Settlement) -> Result<()> {
        match &self.settle {
            None => Ok(()),
            Some(channel) => channel.send(settlement).map_err(|_| {
                Error::Unavailable(
                    "the subscription stream ended; the message will be redelivered".into(),
                )
            }),
        }
    }

    /// Releases the message for good. Queued for the subscription's stream without waiting: a
    /// background task sends it, so it reaches the broker only while the runtime runs (call
    /// [`Subscription::close`] before exiting). A refusal comes back as [`Event::Refused`] and
    /// is counted in [`Subscription::refused_settlements`]. Does nothing on an ack-free
    /// subscription.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when the subscription stream has ended (the broker then
    /// redelivers the message to another member).
    pub fn ack(self) -> Result<()> {
        self.settle(Settlement::Ack(self.system_id))
    }

    /// Gives the message back for redelivery at the head of the queue, with `attempt` + 1.
    ///
    /// # Errors
    /// As [`Delivery::ack`].
    pub fn nack(self) -> Result<()> {
        self.settle(Settlement::Nack(self.system_id))
    }

    /// Gives back a message this member never worked on: like [`Delivery::nack`], except that
    /// its next delivery carries the same `attempt` (the first release at each attempt; a
    /// second one counts, so a poison message still reaches its dead letter). It also tells the
    /// broker this member is leaving: it is sent nothing more, so close it next
    /// (docs/semantics.md#releases). [`Subscription::close`] releases what arrived but was
    /// never handed out.
    ///
    /// # Errors
    /// As [`Delivery::ack`].
    pub fn release(self) -> Result<()> {
        self.settle(Settlement::Release(self.system_id))
    }
}

/// What a subscription stream carries.
#[derive(Debug)]
pub enum Event {
    /// This member is now active (the confirmation frame).
    Active {
        /// This member's id.
        member_id: u64,
        /// Its epoch, strictly higher than any earlier activation on the subscription.
        epoch: u64,
    },
    /// Singleton with `notify_standby`: this member waits in line.
    Standby {
        /// This member's id.
        member_id: u64,
        /// 1 = next to be promoted.
        position: u32,
    },
    /// Singleton: this member was active and stepped down (a hand-over, or a member of higher
    /// priority took over; docs/semantics.md#hand-over): `epoch` has ended, and the member waits
    /// in line on standby at `position` (1 = next), confirmed again with a new epoch if promoted.
    SteppedDown {
        /// This member's id.
        member_id: u64,
        /// The epoch that ended.
        epoch: u64,
        /// 1 = next to be promoted.
        position: u32,
    },
    /// A message.
    Delivery(Delivery),
    /// Acks or nacks sent on this stream were refused and changed nothing. The broker
    /// coalesces the refusals of one settle: one event per kind and reason.
    Refused {
        /// The messages named, in the order sent; empty when the whole settle was refused
        /// (it named more ids than the window, which this client never sends).
        system_ids: Vec<u64>,
        /// True for a nack (and for a release, which is a nack that keeps its attempt).
        nack: bool,
        /// True for a release ([`Delivery::release`]).
        release: bool,
        /// Why.
        error: Error,
    },
}

/// What [`Subscription::active`] waits for: the confirmation frame's fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Activation {
    /// This member's id: the fence for unary acks ([`super::Client::ack`]).
    pub member_id: u64,
    /// Its epoch, strictly higher than any earlier activation on the subscription.
    pub epoch: u64,
}

/// A member of a subscription. Read it with [`Subscription::next_event`] or
/// [`Subscription::next_delivery`] (it is also a `Stream` of deliveries); wait for the member
/// to be active with [`Subscription::active`].
///
/// Leave with [`Subscription::close`]: it returns once the broker has applied every
/// settlement queued before it. Dropping the subscription also leaves, without waiting: the
/// settlements still queued are sent by a background task, which dies with the runtime, so a
/// process that exits right after dropping it may lose them. Whatever the broker has not seen
/// acked (unsettled deliveries, and settlements lost that way) goes back to the head of the
/// queue and is redelivered with `attempt` + 1.
#[derive(Debug)]
pub struct Subscription {
    id: Arc<str>,
    frames: tonic::Streaming<pb::SubscriptionFrame>,
    settles: SettleSender,
    /// Sent (or dropped, with the subscription) to end the request side of the stream once
    /// the queued settlements are out: the half-close.
    close: Option<oneshot::Sender<()>>,
    /// Resolves when the request side of the stream is gone (see [`Outgoing::_alive`]).
    request_side: oneshot::Receiver<()>,
    request_side_gone: bool,
    ack_free: bool,
    member_id: u64,
    epoch: u64,
    active: bool,
    /// Set once the stream has ended: `Some(error)` when it failed.
    ended: Option<Option<Error>>,
    refused: u64,
}

impl Subscription {
    pub(super) async fn open(mut raw: RawClient, options: SubscriptionOptions) -> Result<Self> {
        let (settles, settles_rx) = mpsc::unbounded_channel();
        let (close, close_rx) = oneshot::channel();
        let (alive, request_side) = oneshot::channel();
        let outgoing = Outgoing {
            open: Some(options.to_pb()),
            settles: settles_rx,
            close: close_rx,
            _alive: alive,
        };
        let frames = raw.consume(outgoing).await?.into_inner();
        Ok(Self {
            id: options.subscription_id.into(),
            frames,
            settles,
            close: Some(close),
            request_side,
            request_side_gone: false,
            ack_free: options.ack_mode == AckMode::None,
            member_id: 0,
            epoch: 0,
            active: false,
            ended: None,
            refused: 0,
        })
    }

    /// The subscription's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// This member's id, known once it is active or told it is on standby (0 before: see
    /// [`Subscription::active`]).
    pub fn member_id(&self) -> u64 {
        self.member_id
    }

    /// This member's epoch, 0 until it is active.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Whether the confirmation has arrived.
    pub fn is_active(&self) -> bool {
        self.active
    }

    /// How many of this stream's acks and nacks the broker refused so far (each changed
    /// nothing). Counted whether the refusal was read as [`Event::Refused`] or skipped by
    /// [`Subscription::next_delivery`], which has no other way to report it.
    pub fn refused_settlements(&self) -> u64 {
        self.refused
    }

    /// Waits until this member is active and returns its id and epoch. In queue and broadcast
    /// mode the confirmation is the first frame, so this returns at once; in singleton mode it
    /// waits on standby until promoted (standby notices are consumed: read them with
    /// [`Subscription::next_event`] instead to hear the place in line). Returns at once if
    /// already active. Nothing but standby notices comes before the confirmation, so no
    /// delivery is skipped.
    ///
    /// # Errors
    /// As [`Subscription::next_event`]; [`Error::Unavailable`] when the stream ends before the
    /// confirmation.
    pub async fn active(&mut self) -> Result<Activation> {
        while !self.active {
            match self.next_event().await {
                Some(Ok(_)) => {}
                Some(Err(error)) => return Err(error),
                None => {
                    return Err(Error::Unavailable(
                        "the stream ended before the member was active".into(),
                    ));
                }
            }
        }
        Ok(Activation {
            member_id: self.member_id,
            epoch: self.epoch,
        })
    }

    /// Polls for the next event; `None` once the stream has ended.
    pub fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Event>>> {
        if self.ended.is_some() {
            return Poll::Ready(None);
        }
        loop {
            let frame = match Pin::new(&mut self.frames).poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    self.ended = Some(None);
                    return Poll::Ready(None);
                }
                Poll::Ready(Some(Err(status))) => {
                    let error = Error::from(status);
                    self.ended = Some(Some(error.clone()));
                    return Poll::Ready(Some(Err(error)));
                }
                Poll::Ready(Some(Ok(frame))) => frame,
            };
            let event = match frame.frame {
                Some(Frame::Confirmation(c)) => {
                    self.member_id = c.member_id;
                    self.epoch = c.epoch;
                    self.active = true;
                    Event::Active {
                        member_id: c.member_id,
                        epoch: c.epoch,
                    }
                }
                Some(Frame::Standby(s)) if s.stepped_down_epoch != 0 => {
                    self.active = false;
                    Event::SteppedDown {
                        member_id: s.member_id,
                        epoch: s.stepped_down_epoch,
                        position: s.position,
                    }
                }
                Some(Frame::Standby(s)) => {
                    self.member_id = s.member_id;
                    Event::Standby {
                        member_id: s.member_id,
                        position: s.position,
                    }
                }
                Some(Frame::Message(m)) => Event::Delivery(Delivery {
                    system_id: m.system_id,
                    topic: m.topic,
                    payload: m.payload,
                    headers: m.headers,
                    attempt: m.delivery_attempt,
                    epoch: m.epoch,
                    published_at: m.published_at.and_then(to_system_time),
                    subscription_id: self.id.clone(),
                    member_id: self.member_id,
                    settle: (!self.ack_free).then(|| self.settles.clone()),
                }),
                Some(Frame::Refused(r)) => {
                    let mut system_ids = r.more_system_ids;
                    if r.system_id != 0 {
                        system_ids.insert(0, r.system_id);
                    }
                    self.refused += system_ids.len().max(1) as u64;
                    Event::Refused {
                        system_ids,
                        nack: r.nack,
                        release: r.release,
                        error: Error::from_code(r.code, r.message),
                    }
                }
                // A frame kind newer than this client: skip it.
                None => continue,
            };
            return Poll::Ready(Some(Ok(event)));
        }
    }

    /// The next event: activation, standby notice, delivery or refused settlement.
    /// `None` once the stream has ended cleanly.
    ///
    /// # Errors
    /// The status that ended the stream ([`Error::Unavailable`] when the broker shuts down or
    /// the connection fails); nothing follows it.
    pub async fn next_event(&mut self) -> Option<Result<Event>> {
        poll_fn(|cx| self.poll_event(cx)).await
    }

    /// The next delivery, skipping other events. A refused settlement is counted in
    /// [`Subscription::refused_settlements`] (and logged at warn).
    ///
    /// # Errors
    /// As [`Subscription::next_event`].
    pub async fn next_delivery(&mut self) -> Option<Result<Delivery>> {
        poll_fn(|cx| self.poll_delivery(cx)).await
    }

    fn poll_delivery(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Delivery>>> {
        loop {
            match self.poll_event(cx) {
                Poll::Ready(Some(Ok(Event::Delivery(delivery)))) => {
                    return Poll::Ready(Some(Ok(delivery)));
                }
                Poll::Ready(Some(Ok(Event::Refused {
                    system_ids, error, ..
                }))) => {
                    tracing::warn!(subscription = %self.id, ?system_ids, %error, "settlement refused");
                }
                Poll::Ready(Some(Ok(_))) => {}
                Poll::Ready(Some(Err(error))) => return Poll::Ready(Some(Err(error))),
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// Leaves the subscription once the broker has applied every settlement queued so far:
    /// sends them, half-closes the stream, and waits for the broker to end it. Settle the
    /// deliveries you took before calling it. Deliveries that had arrived but were never
    /// handed out (prefetched within the window) are released with them: they go back to the
    /// queue with the same `attempt` (docs/semantics.md#releases). Deliveries still in transit
    /// when it starts, and deliveries handed out but left unsettled, go back with `attempt` + 1.
    /// An ack-free member has nothing to flush: its stream is simply ended.
    ///
    /// Waits as long as the broker takes to answer, which is until the connection's keepalive
    /// fails if the broker vanished: wrap it in a timeout to bound a shutdown.
    ///
    /// # Errors
    /// The status that ended the stream, if not a clean end (then queued settlements may not
    /// have been applied); or, after a clean end, the first settlement the broker refused
    /// while closing (every other one was applied).
    pub async fn close(mut self) -> Result<()> {
        if let Some(end) = self.ended.take() {
            return end.map_or(Ok(()), Err);
        }
        if self.ack_free {
            // The broker ignores an ack-free member's half-close (it keeps receiving), and there
            // is nothing to flush: dropping the stream is how it leaves.
            return Ok(());
        }
        let mut refused = None;
        // What has arrived and was never handed out: released, so that it comes back with the
        // same attempt (docs/semantics.md#releases). Read without waiting: what is still in
        // transit goes back with the member's leave.
        let mut prefetched = Vec::new();
        loop {
            // A fresh context each time: none is held across the awaits below (it is not Send).
            let mut cx = Context::from_waker(std::task::Waker::noop());
            match self.poll_event(&mut cx) {
                Poll::Ready(Some(Ok(Event::Delivery(delivery)))) => {
                    prefetched.push(delivery.system_id);
                }
                Poll::Ready(Some(Ok(Event::Refused { error, .. }))) => {
                    refused.get_or_insert(error);
                }
                Poll::Ready(Some(Ok(_))) => {}
                Poll::Ready(Some(Err(error))) => return Err(error),
                Poll::Ready(None) => return refused.map_or(Ok(()), Err),
                Poll::Pending => break,
            }
        }
        for system_id in prefetched {
            // A failure means the stream ended: the end is read below.
            let _ = self.settles.send(Settlement::Release(system_id));
        }
        self.close.take();
        loop {
            match self.next_event().await {
                None => return refused.map_or(Ok(()), Err),
                Some(Err(error)) => return Err(error),
                Some(Ok(Event::Refused { error, .. })) => {
                    refused.get_or_insert(error);
                }
                // In flight until the stream ends, then back to the queue.
                Some(Ok(_)) => {}
            }
        }
    }

    /// Resolves once the request side of the stream is gone: the stream was reset, or its
    /// connection failed, even when frames wait unread ahead of the end. For a reader that
    /// stops reading to push back on the broker.
    pub(super) async fn request_side_closed(&mut self) {
        if !self.request_side_gone {
            let _ = (&mut self.request_side).await;
            self.request_side_gone = true;
        }
    }
}

impl Stream for Subscription {
    type Item = Result<Delivery>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_delivery(cx)
    }
}

fn to_system_time(t: prost_types::Timestamp) -> Option<SystemTime> {
    let seconds = u64::try_from(t.seconds).ok()?;
    let nanos = u32::try_from(t.nanos).ok()?;
    SystemTime::UNIX_EPOCH.checked_add(Duration::new(seconds, nanos))
}
