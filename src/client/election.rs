//! Leader election on a singleton subscription (docs/semantics.md#singleton): [`Client::elect`] resolves when this
//! replica becomes the active member and hands back a [`Leadership`] whose epoch fences side
//! effects and whose [`Leadership::lost`] resolves the moment the broker could have promoted
//! someone else.

use std::{
    future::Future,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::{
    sync::{mpsc, oneshot, watch},
    task::JoinHandle,
};

use super::{
    Client, Delivery, Error, Event, Message, Mode, Published, RawClient, Result, Subscription,
    SubscriptionOptions,
};
use crate::pb;

/// First wait before rejoining after a failed attempt; doubles up to [`MAX_BACKOFF`].
const INITIAL_BACKOFF: Duration = Duration::from_millis(50);
/// Longest wait between rejoin attempts: a standby that lost its connection is back in line
/// within about this long once the broker is reachable again.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Messages a [`Leadership`] holds that the job has not taken with
/// [`Leadership::next_message`]. Past it the leader stops reading its stream, so HTTP/2 flow
/// control pushes back to the broker: an acked subscription waits on its window, an ack-free
/// one fills its outlet and queue and then drops the oldest, counted as `dropped_overflow`.
pub const MAX_BUFFERED_MESSAGES: usize = 64;

/// A hand-over that happened ([`Client::hand_over`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HandedOver {
    /// The member that stepped down.
    pub previous_member_id: u64,
    /// The epoch it held.
    pub previous_epoch: u64,
    /// The member now active.
    pub member_id: u64,
    /// Its epoch.
    pub epoch: u64,
    /// The member asked to step down left before it settled what it held: its successor took
    /// over as on any failover (what it held is redelivered).
    pub failed_over: bool,
}

/// Why a [`Leadership`] ended.
#[derive(Clone, Debug, thiserror::Error)]
#[error("leadership of epoch {epoch} lost: {cause}")]
pub struct Lost {
    /// The epoch that ended.
    pub epoch: u64,
    /// Whether this replica stepped down or its stream ended.
    pub cause: LostCause,
}

/// What ended a leadership: this replica's own decision, or the member's stream.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LostCause {
    /// This replica stepped down: [`Leadership::resign`], [`Leadership::close`], or the
    /// [`Leadership`] was dropped.
    #[error("resigned")]
    Resigned,
    /// The member's stream ended: the broker went away or shut down, the connection's
    /// keepalive failed, or the stream was reset. A clean end from the broker is
    /// [`Error::Unavailable`].
    #[error("{0}")]
    Ended(Error),
    /// The broker asked this leader to step down and it did, at a message boundary: a
    /// hand-over was requested, or a member of higher priority joined
    /// (docs/semantics.md#hand-over). The member's stream is closed, so it leaves the line;
    /// join again to stand in line.
    #[error("stepped down: the leadership was handed over")]
    HandedOver,
}

/// This replica is the active member of a singleton subscription. Leave with
/// [`Leadership::close`] (every settlement queued is applied first) or [`Leadership::resign`]
/// (at once); either way the earliest standby is promoted.
///
/// Dropping it resigns, like [`Leadership::resign`]: the member's stream ends without waiting,
/// so settlements still queued may be lost if the process exits right after, and every
/// message not seen acked is redelivered to the next leader.
#[derive(Debug)]
pub struct Leadership {
    subscription_id: String,
    epoch: u64,
    member_id: u64,
    /// For [`Leadership::proclaim`] and [`Leadership::publish`].
    raw: RawClient,
    messages: mpsc::Receiver<Delivery>,
    lost: watch::Receiver<Option<Lost>>,
    refused: Arc<AtomicU64>,
    /// Asks the reader to close the member's stream and to answer when it has.
    close: Option<oneshot::Sender<CloseReply>>,
    reader: JoinHandle<()>,
}

impl Drop for Leadership {
    fn drop(&mut self) {
        // The reader owns the member's stream: stopping it leaves the subscription.
        self.reader.abort();
    }
}

impl Leadership {
    fn start(raw: RawClient, subscription: Subscription, member_id: u64, epoch: u64) -> Self {
        let subscription_id = subscription.id().to_string();
        let (messages_tx, messages) = mpsc::channel(MAX_BUFFERED_MESSAGES);
        let (lost_tx, lost) = watch::channel(None);
        let (close, close_rx) = oneshot::channel();
        let refused = Arc::new(AtomicU64::new(0));
        let reader = tokio::spawn(
            Reader {
                subscription,
                epoch,
                messages: messages_tx,
                lost: lost_tx,
                close: Some(close_rx),
                refused: refused.clone(),
            }
            .run(),
        );
        Self {
            subscription_id,
            epoch,
            member_id,
            raw,
            messages,
            lost,
            refused,
            close: Some(close),
            reader,
        }
    }

    /// The subscription led.
    pub fn subscription_id(&self) -> &str {
        &self.subscription_id
    }

    /// The fencing token: strictly higher than any earlier leader's on this subscription. Pass
    /// it with side effects so a store can refuse a deposed leader's late writes.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// This member's id.
    pub fn member_id(&self) -> u64 {
        self.member_id
    }

    /// Replaces the metadata watchers and `DescribeSubscription` show for this leader (an
    /// address, a host name; at most 1024 bytes): the first thing to do after promotion when
    /// the address is only known then. Answered once the metadata is in place (through
    /// gateways: once the cluster's line holds it, which every gateway's watch then follows).
    ///
    /// # Errors
    /// [`Error::NotFound`] once this leadership is over (leadership ends only with the member,
    /// so a deposed leader is gone), [`Error::InvalidArgument`] for
    /// metadata over 1024 bytes, [`Error::ResourceExhausted`] when a cluster line's metadata is
    /// full (docs/semantics.md#member-metadata).
    pub async fn proclaim(&self, metadata: impl Into<String>) -> Result<()> {
        let request = pb::ProclaimRequest {
            subscription_id: self.subscription_id.clone(),
            member_id: self.member_id,
            epoch: self.epoch,
            metadata: metadata.into(),
        };
        self.raw.clone().proclaim(request).await?;
        Ok(())
    }

    /// `message`, fenced by this leadership: the broker stores it only while this epoch leads
    /// (docs/semantics.md#fenced-publish). For [`Client::publish_batch`] and
    /// [`Publisher`](crate::client::Publisher) streams; [`Leadership::publish`] publishes one.
    #[must_use]
    pub fn fence(&self, message: Message) -> Message {
        message.fenced(self.subscription_id.clone(), self.epoch)
    }

    /// Publishes `message` fenced by this leadership: stored only while this epoch is the
    /// subscription's active epoch, checked by the broker as it stores it, so a deposed
    /// leader's late publish is refused instead of reaching the subscribers
    /// (docs/semantics.md#fenced-publish).
    ///
    /// # Errors
    /// [`Error::FailedPrecondition`] once another epoch leads (or none does), naming it;
    /// otherwise as [`Client::publish`].
    pub async fn publish(&self, message: Message) -> Result<Published> {
        let reply = self
            .raw
            .clone()
            .publish(self.fence(message).into_pb())
            .await?;
        Ok(reply.into_inner().into())
    }

    /// Whether leadership has already been lost.
    pub fn is_lost(&self) -> bool {
        self.lost.borrow().is_some()
    }

    /// Resolves the moment leadership is lost: the stream ended, the broker went away, or the
    /// connection's keepalive failed ([`LostCause::Ended`]), or this replica stepped down
    /// ([`LostCause::Resigned`]). Stop the job when it does. Independent of `self`, so it can
    /// be raced against the job in `select!`.
    ///
    /// Noticed even while the job takes no messages and the leader has stopped reading its
    /// stream (see [`MAX_BUFFERED_MESSAGES`]): a reset stream or a failed connection is seen
    /// without reading the messages queued ahead of it.
    pub fn lost(&self) -> impl Future<Output = Lost> + Send + 'static {
        let mut lost = self.lost.clone();
        let epoch = self.epoch;
        async move {
            let result = lost.wait_for(Option::is_some).await.map(|l| l.clone());
            match result {
                Ok(Some(lost)) => lost,
                // The reader ends without saying why only when the leadership was dropped.
                _ => Lost {
                    epoch,
                    cause: LostCause::Resigned,
                },
            }
        }
    }

    /// The next message delivered to this leader, in the subscription's order; `None` once
    /// leadership is lost and every received message was taken.
    pub async fn next_message(&mut self) -> Option<Delivery> {
        self.messages.recv().await
    }

    /// Messages received and not yet taken with [`Leadership::next_message`]; at most
    /// [`MAX_BUFFERED_MESSAGES`].
    pub fn buffered_messages(&self) -> usize {
        self.messages.len()
    }

    /// How many of this leader's acks and nacks the broker refused (each changed nothing).
    pub fn refused_settlements(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Steps down at once: the member's stream ends and the earliest standby is promoted. The
    /// same as dropping the leadership; use [`Leadership::close`] to have queued settlements
    /// applied first.
    pub fn resign(self) {}

    /// Steps down once the broker has applied every settlement queued so far, like
    /// [`Subscription::close`]; then the earliest standby is promoted. [`Leadership::lost`]
    /// resolves with [`LostCause::Resigned`] as it starts. Messages not taken are redelivered
    /// to the next leader.
    ///
    /// After a hand-over ([`LostCause::HandedOver`]) it answers `Ok` at once: the leader
    /// settled what it held before it stepped down, and its stream is closed.
    ///
    /// # Errors
    /// As [`Subscription::close`]; [`LostCause::Ended`]'s error when leadership was lost
    /// before (queued settlements may not have been applied).
    pub async fn close(mut self) -> Result<()> {
        let (reply, answer) = oneshot::channel();
        let asked = self
            .close
            .take()
            .is_some_and(|close| close.send(reply).is_ok());
        let ended = || match self.lost.borrow().as_ref().map(|l| l.cause.clone()) {
            Some(LostCause::Ended(error)) => error,
            _ => Error::Unavailable("the leader's stream had already ended".into()),
        };
        // A leader that handed over settled everything it held before it stepped down, and
        // its stream is closed already: nothing is left to close.
        if matches!(
            self.lost.borrow().as_ref().map(|l| &l.cause),
            Some(LostCause::HandedOver)
        ) {
            return Ok(());
        }
        if !asked {
            return Err(ended());
        }
        match answer.await {
            Ok(result) => result,
            Err(_) => Err(ended()),
        }
    }
}

/// Where the reader answers [`Leadership::close`].
type CloseReply = oneshot::Sender<Result<()>>;

/// Reads the leader's stream so loss is noticed even when the job never reads messages, and
/// closes it when asked.
struct Reader {
    subscription: Subscription,
    epoch: u64,
    messages: mpsc::Sender<Delivery>,
    lost: watch::Sender<Option<Lost>>,
    /// `None` once the [`Leadership`] is gone without asking.
    close: Option<oneshot::Receiver<CloseReply>>,
    refused: Arc<AtomicU64>,
}

/// Resolves when [`Leadership::close`] asks; never if the leadership went away without asking
/// (a finished receiver must not be polled again).
async fn asked_to_close(close: &mut Option<oneshot::Receiver<CloseReply>>) -> CloseReply {
    if let Some(receiver) = close.as_mut() {
        if let Ok(reply) = receiver.await {
            return reply;
        }
        *close = None;
    }
    std::future::pending().await
}

impl Reader {
    async fn run(self) {
        // Taken apart so the close can move the subscription while a slot is borrowed.
        let Reader {
            mut subscription,
            epoch,
            messages,
            lost,
            mut close,
            refused,
        } = self;
        let cause = loop {
            // A free slot first, then a frame: while the job takes no messages, no frame is
            // read, so the broker sees the pushback. Only a dead stream is watched meanwhile.
            // Biased: with a free slot the frames are read, and with them the exact cause of an
            // end; the request side is only a fallback for a stalled reader.
            let permit = tokio::select! {
                biased;
                reply = asked_to_close(&mut close) => {
                    return step_down(subscription, &lost, epoch, reply).await;
                }
                permit = messages.reserve() => match permit {
                    Ok(permit) => permit,
                    // The Leadership is gone (its drop aborts this task anyway).
                    Err(_) => return,
                },
                () = subscription.request_side_closed() => break Error::Unavailable(
                    "the leader's stream was reset or its connection failed".into(),
                ),
            };
            let event = tokio::select! {
                biased;
                reply = asked_to_close(&mut close) => {
                    return step_down(subscription, &lost, epoch, reply).await;
                }
                event = subscription.next_event() => event,
            };
            match event {
                Some(Ok(Event::Delivery(delivery))) => permit.send(delivery),
                Some(Ok(Event::Refused {
                    system_ids, error, ..
                })) => {
                    refused.fetch_add(system_ids.len().max(1) as u64, Ordering::Relaxed);
                    tracing::warn!(?system_ids, %error, "settlement refused");
                }
                Some(Ok(Event::SteppedDown { .. })) => {
                    let _ = lost.send(Some(Lost {
                        epoch,
                        cause: LostCause::HandedOver,
                    }));
                    // Dropping the stream leaves the line: a Leadership that ended is not
                    // confirmed again.
                    return;
                }
                Some(Ok(Event::Active { .. } | Event::Standby { .. })) => {}
                Some(Err(error)) => break error,
                None => break Error::Unavailable("the broker ended the member's stream".into()),
            }
        };
        let _ = lost.send(Some(Lost {
            epoch,
            cause: LostCause::Ended(cause),
        }));
    }
}

/// [`Leadership::close`], on the reader's task.
async fn step_down(
    subscription: Subscription,
    lost: &watch::Sender<Option<Lost>>,
    epoch: u64,
    reply: CloseReply,
) {
    // The broker may promote someone else from the half-close on.
    let _ = lost.send(Some(Lost {
        epoch,
        cause: LostCause::Resigned,
    }));
    let _ = reply.send(subscription.close().await);
}

impl Client {
    /// Joins the line for leadership of `subscription_id` among the replicas of `group`, and
    /// resolves when this replica becomes the leader. The subscription listens on the topic
    /// `election.<subscription_id>`; use [`Client::elect_with`] to lead a subscription that
    /// consumes real topics (a firehose in order).
    ///
    /// # Errors
    /// As [`Client::elect_with`].
    pub async fn elect(&self, subscription_id: &str, group: &str) -> Result<Leadership> {
        let options = SubscriptionOptions::singleton(
            subscription_id,
            group,
            [format!("election.{subscription_id}")],
        );
        self.elect_with(options, |_| {}).await
    }

    /// Joins the singleton subscription `options` (its mode is forced to singleton, with
    /// standby notices) and resolves when promoted; `on_standby` hears this replica's place in
    /// line (1 = next). If the stream fails before promotion the replica rejoins the end of the
    /// line, backing off from 50 ms to 2 s.
    ///
    /// # Errors
    /// Refusals that a retry would repeat: [`Error::InvalidArgument`],
    /// [`Error::FailedPrecondition`] (settings differ from the other replicas'),
    /// [`Error::Unauthenticated`], [`Error::ResourceExhausted`].
    pub async fn elect_with(
        &self,
        mut options: SubscriptionOptions,
        mut on_standby: impl FnMut(u32) + Send,
    ) -> Result<Leadership> {
        options.mode = Mode::Singleton;
        options.notify_standby = true;
        let mut backoff = INITIAL_BACKOFF;
        loop {
            match self.wait_for_promotion(&options, &mut on_standby).await {
                Ok((subscription, member_id, epoch)) => {
                    let raw = self.raw.clone();
                    return Ok(Leadership::start(raw, subscription, member_id, epoch));
                }
                Err((error, joined)) if error.is_transient() => {
                    if joined {
                        // It was in line, so the broker was reachable: start over gently.
                        backoff = INITIAL_BACKOFF;
                    }
                    tracing::warn!(subscription = %options.subscription_id, %error, ?backoff, "election: rejoining");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
                Err((error, _)) => return Err(error),
            }
        }
    }

    /// Replaces the metadata of member `member_id`, active at `epoch` on SINGLETON subscription
    /// `subscription_id` (the confirmation's ids): what [`Leadership::proclaim`] does for a
    /// [`Subscription`] joined by hand.
    ///
    /// # Errors
    /// As [`Leadership::proclaim`].
    pub async fn proclaim(
        &self,
        subscription_id: &str,
        member_id: u64,
        epoch: u64,
        metadata: impl Into<String>,
    ) -> Result<()> {
        self.raw
            .clone()
            .proclaim(pb::ProclaimRequest {
                subscription_id: subscription_id.into(),
                member_id,
                epoch,
                metadata: metadata.into(),
            })
            .await?;
        Ok(())
    }

    /// Asks the active member of SINGLETON subscription `subscription_id` to hand over at a
    /// message boundary, and answers once it did (docs/semantics.md#hand-over): the active
    /// member settles what it holds (within the broker's hand-over timeout), steps down, and
    /// the first standby in line is promoted.
    ///
    /// # Errors
    /// [`Error::FailedPrecondition`] with no active member or no standby to take over,
    /// [`Error::NotFound`] for an unknown subscription; at a gateway, [`Error::Unavailable`]
    /// when it could not see the outcome (docs/semantics.md#cluster-priority-and-hand-over).
    pub async fn hand_over(&self, subscription_id: &str) -> Result<HandedOver> {
        let reply = self
            .raw
            .clone()
            .hand_over(pb::HandOverRequest {
                subscription_id: subscription_id.into(),
            })
            .await?
            .into_inner();
        Ok(HandedOver {
            previous_member_id: reply.previous_member_id,
            previous_epoch: reply.previous_epoch,
            member_id: reply.member_id,
            epoch: reply.epoch,
            failed_over: reply.failed_over,
        })
    }

    /// One attempt: join and wait for the confirmation. The error says whether it had joined.
    async fn wait_for_promotion(
        &self,
        options: &SubscriptionOptions,
        on_standby: &mut (impl FnMut(u32) + Send),
    ) -> std::result::Result<(Subscription, u64, u64), (Error, bool)> {
        let mut subscription = self
            .subscribe(options.clone())
            .await
            .map_err(|e| (e, false))?;
        loop {
            match subscription.next_event().await {
                Some(Ok(Event::Active { member_id, epoch })) => {
                    return Ok((subscription, member_id, epoch));
                }
                Some(Ok(Event::Standby { position, .. })) => on_standby(position),
                // Nothing else comes before the confirmation.
                Some(Ok(_)) => {}
                Some(Err(error)) => return Err((error, true)),
                None => {
                    return Err((
                        Error::Unavailable("the stream ended before promotion".into()),
                        true,
                    ));
                }
            }
        }
    }
}
