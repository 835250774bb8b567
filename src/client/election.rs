//! Leader election on a singleton subscription (SPEC §5): [`Client::elect`] resolves when this
//! replica becomes the active member and hands back a [`Leadership`] whose epoch fences side
//! effects and whose [`Leadership::lost`] resolves the moment the broker could have promoted
//! someone else.

use std::{future::Future, time::Duration};

use tokio::{
    sync::{mpsc, watch},
    task::JoinHandle,
};

use super::{Client, Delivery, Error, Event, Mode, Result, Subscription, SubscriptionOptions};

/// First wait before rejoining after a failed attempt; doubles up to [`MAX_BACKOFF`].
const INITIAL_BACKOFF: Duration = Duration::from_millis(50);
/// Longest wait between rejoin attempts: a standby that lost its connection is back in line
/// within about this long once the broker is reachable again.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Why a [`Leadership`] ended.
#[derive(Clone, Debug, thiserror::Error)]
#[error("leadership of epoch {epoch} lost: {cause}")]
pub struct Lost {
    /// The epoch that ended.
    pub epoch: u64,
    /// What ended the member's stream (a clean end is [`Error::Unavailable`]).
    pub cause: Error,
}

/// This replica is the active member of a singleton subscription. Dropping it resigns: the
/// member leaves and the earliest standby is promoted.
#[derive(Debug)]
pub struct Leadership {
    subscription_id: String,
    epoch: u64,
    member_id: u64,
    messages: mpsc::UnboundedReceiver<Delivery>,
    lost: watch::Receiver<Option<Lost>>,
    reader: JoinHandle<()>,
}

impl Drop for Leadership {
    fn drop(&mut self) {
        // The reader owns the member's stream: stopping it leaves the subscription.
        self.reader.abort();
    }
}

impl Leadership {
    fn start(subscription: Subscription, member_id: u64, epoch: u64) -> Self {
        let subscription_id = subscription.id().to_string();
        let (messages_tx, messages) = mpsc::unbounded_channel();
        let (lost_tx, lost) = watch::channel(None);
        let reader = tokio::spawn(read(subscription, epoch, messages_tx, lost_tx));
        Self {
            subscription_id,
            epoch,
            member_id,
            messages,
            lost,
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

    /// Whether leadership has already been lost.
    pub fn is_lost(&self) -> bool {
        self.lost.borrow().is_some()
    }

    /// Resolves the moment leadership is lost: the stream ended, the broker went away, or the
    /// connection's keepalive failed. Stop the job when it does. Independent of `self`, so it
    /// can be raced against the job in `select!`.
    pub fn lost(&self) -> impl Future<Output = Lost> + Send + 'static {
        let mut lost = self.lost.clone();
        let epoch = self.epoch;
        async move {
            let result = lost.wait_for(Option::is_some).await.map(|l| l.clone());
            match result {
                Ok(Some(lost)) => lost,
                _ => Lost {
                    epoch,
                    cause: Error::Unavailable("the leadership was dropped".into()),
                },
            }
        }
    }

    /// The next message delivered to this leader, in the subscription's order; `None` once
    /// leadership is lost and every received message was taken.
    pub async fn next_message(&mut self) -> Option<Delivery> {
        self.messages.recv().await
    }

    /// Steps down: the member leaves and the earliest standby is promoted.
    pub fn resign(self) {}
}

/// Reads the leader's stream so loss is noticed even when the job never reads messages.
async fn read(
    mut subscription: Subscription,
    epoch: u64,
    messages: mpsc::UnboundedSender<Delivery>,
    lost: watch::Sender<Option<Lost>>,
) {
    let cause = loop {
        match subscription.next_event().await {
            // The window bounds how many unsettled deliveries can pile up here.
            Some(Ok(Event::Delivery(delivery))) => {
                let _ = messages.send(delivery);
            }
            Some(Ok(Event::Refused {
                system_id, error, ..
            })) => {
                tracing::warn!(system_id, %error, "settlement refused");
            }
            Some(Ok(Event::Active { .. } | Event::Standby { .. })) => {}
            Some(Err(error)) => break error,
            None => break Error::Unavailable("the broker ended the member's stream".into()),
        }
    };
    let _ = lost.send(Some(Lost { epoch, cause }));
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
                    return Ok(Leadership::start(subscription, member_id, epoch));
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
