//! Publishes through a gateway: sent to JetStream and answered once JetStream stored them
//! (its `PubAck`). `PublishStream` pipelines them: it sends each as it reads it, in order, and
//! answers each confirmation in order ([`Sent`]), so one stream is not held to one round trip
//! per message.

use std::{future::IntoFuture, sync::Arc, time::Duration};

use async_nats::jetstream::{
    context::{PublishError, PublishErrorKind},
    publish::PublishAck,
};

use super::{DEAD_LETTER_OF, Shared, names, nats_headers, unavailable};
use crate::{
    broker::{BatchError, Published},
    core::{Draft, Error, ErrorKind},
};

/// How long a publish that no JetStream server answered is retried before `UNAVAILABLE`.
pub const NO_RESPONDERS_PATIENCE: Duration = Duration::from_secs(2);

/// A publish sent to JetStream, its confirmation still to come.
pub struct Sent {
    shared: Arc<Shared>,
    draft: Draft,
    /// The confirmation, awaited by a task of its own: a `PublishAckFuture` holds one of the
    /// JetStream context's 5,000 in-flight permits until it is awaited or dropped, so a batch
    /// or stream that sends ahead and awaits in order would hold permits for confirmations
    /// already in, and past 5,000 sent at once (one large batch, or several batches and
    /// streams together) every send through the gateway would wait forever.
    ack: tokio::task::JoinHandle<Result<PublishAck, PublishError>>,
    /// The registry's ticket taken when it was sent, for `queued_for` (none for a dead
    /// letter, whose count nobody reads).
    ticket: Option<u64>,
}

/// Why a sent publish was not confirmed.
#[derive(Debug)]
pub enum Unconfirmed {
    /// No JetStream server answered ("no responders"): nobody stored it, so it may be sent
    /// again, carried here for that.
    NoResponders(Draft),
    /// Any other failure: it may or may not have been stored.
    Failed(Error),
}

impl Sent {
    /// Waits for JetStream's confirmation.
    ///
    /// # Errors
    /// [`Unconfirmed`].
    pub async fn confirmed(self) -> Result<Published, Unconfirmed> {
        self.confirm(true).await
    }

    /// [`confirmed`](Self::confirmed); a refusal is counted in `rejected_publishes` only when
    /// `count_refusal` (a batch counts its first refusal, not those of messages after it).
    async fn confirm(self, count_refusal: bool) -> Result<Published, Unconfirmed> {
        let outcome = match self.ack.await {
            Ok(outcome) => outcome,
            Err(error) => {
                return Err(Unconfirmed::Failed(unavailable(
                    "JetStream's confirmation was lost",
                    error,
                )));
            }
        };
        match outcome {
            Ok(ack) => {
                self.shared.broker.count_upstream_publish();
                // The subscriptions in the cluster when the publish arrived, or later
                // (docs/semantics.md#cluster-durability); the sync ran beside the publish.
                let queued_for = match self.ticket {
                    Some(ticket) => {
                        self.shared.registry.synced(ticket).await;
                        self.shared.registry.matching(self.draft.topic())
                    }
                    None => 0,
                };
                Ok(Published {
                    system_id: ack.sequence,
                    queued_for,
                })
            }
            Err(error) if error.kind() == PublishErrorKind::StreamNotFound => {
                Err(Unconfirmed::NoResponders(self.draft))
            }
            Err(error) => {
                let status = refused(&self.shared, &error, count_refusal)
                    .unwrap_or_else(|| unavailable("JetStream did not confirm the publish", error));
                Err(Unconfirmed::Failed(status))
            }
        }
    }
}

/// The refusal of a publish JetStream refused for a reason the client can act on: the stream
/// is full (its `max_msgs` or `max_bytes`, with discard new), or the message is larger than
/// the NATS servers take. Counted as a rejected publish when `count`. `None` for other
/// failures.
fn refused(shared: &Shared, error: &PublishError, count: bool) -> Option<Error> {
    let broker = &shared.broker;
    if error.kind() == PublishErrorKind::MaxPayloadExceeded {
        if count {
            broker.count_rejected_publish();
        }
        return Some(Error::InvalidArgument(
            "the message, with its headers as NATS carries them, is larger than the NATS servers' max_payload; send a smaller one, or raise max_payload on the servers".into(),
        ));
    }
    let text = std::error::Error::source(error)
        .map(ToString::to_string)
        .unwrap_or_default();
    let limit = if text.contains("maximum messages") {
        "max_msgs (--nats-max-messages when the gateway created it)"
    } else if text.contains("maximum bytes") {
        "max_bytes (--nats-max-bytes when the gateway created it)"
    } else {
        return None;
    };
    if count {
        broker.count_rejected_publish();
    }
    Some(Error::StreamFull {
        stream: shared.prefix.clone(),
        limit,
        detail: text,
    })
}

impl Unconfirmed {
    /// The refusal a client gets when the publish is not sent again.
    pub fn error(self) -> Error {
        match self {
            Unconfirmed::NoResponders(_) => Error::Unavailable(
                "JetStream did not confirm the publish: no JetStream server answered (the stream's leader may be moving); nothing was stored".into(),
            ),
            Unconfirmed::Failed(error) => error,
        }
    }
}

pub(super) async fn send(shared: &Arc<Shared>, draft: Draft) -> Result<Sent, Error> {
    send_marked(shared, draft, None).await
}

/// [`send`], for a dead letter with the subscription it came from (`dead_letter_of`).
async fn send_marked(
    shared: &Arc<Shared>,
    draft: Draft,
    dead_letter_of: Option<&str>,
) -> Result<Sent, Error> {
    let ticket = dead_letter_of.is_none().then(|| shared.registry.ticket());
    let subject = names::subject(&shared.prefix, draft.topic().as_str());
    let mut headers = nats_headers(draft.envelope().headers())?;
    if let Some(subscription) = dead_letter_of {
        headers.insert(DEAD_LETTER_OF, subscription);
    }
    let ack = shared
        .js
        .publish_with_headers(subject, headers, draft.payload_bytes())
        .await
        .map_err(|e| {
            refused(shared, &e, true)
                .unwrap_or_else(|| unavailable("JetStream did not take the publish", e))
        })?;
    Ok(Sent {
        shared: shared.clone(),
        draft,
        ack: tokio::spawn(ack.into_future()),
        ticket,
    })
}

pub(super) async fn publish(shared: &Arc<Shared>, draft: Draft) -> Result<Published, Error> {
    publish_marked(shared, draft, None).await
}

/// [`publish`], for a dead letter that came from subscription `dead_letter_of`: it is marked
/// so that subscription skips it.
pub(super) async fn publish_dead_letter(
    shared: &Arc<Shared>,
    draft: Draft,
    dead_letter_of: &str,
) -> Result<Published, Error> {
    publish_marked(shared, draft, Some(dead_letter_of)).await
}

async fn publish_marked(
    shared: &Arc<Shared>,
    draft: Draft,
    dead_letter_of: Option<&str>,
) -> Result<Published, Error> {
    // "No responders" means no server took the message, so sending it again cannot store it
    // twice. It happens while the stream's interest is still spreading over the routes (a
    // stream just created) or while its leader moves: retried for a bounded time.
    let mut delay = Duration::from_millis(5);
    let mut waited = Duration::ZERO;
    let mut draft = draft;
    loop {
        match send_marked(shared, draft, dead_letter_of)
            .await?
            .confirmed()
            .await
        {
            Ok(published) => return Ok(published),
            Err(Unconfirmed::NoResponders(again)) if waited < NO_RESPONDERS_PATIENCE => {
                tokio::time::sleep(delay).await;
                waited += delay;
                delay = (delay * 2).min(Duration::from_millis(200));
                draft = again;
            }
            Err(unconfirmed) => return Err(unconfirmed.error()),
        }
    }
}

/// A `PublishBatch` through the gateway: every message sent in order without waiting, then
/// each confirmation awaited in order, so a batch costs about one round trip to JetStream, not
/// one per message. On a refusal the answer is the confirmed prefix and the first refusal, as
/// the embedded broker's; messages JetStream stored after a refused one (a concurrent ack can
/// make room in a full stream) are named in the refusal's message, never hidden. A batch that
/// no JetStream server answered from some message on (nothing stored after it) is sent again
/// from there, one at a time, with [`publish`]'s patience.
///
/// # Errors
/// The messages confirmed before the first refusal, and that refusal.
pub(super) async fn publish_batch(
    shared: &Arc<Shared>,
    drafts: Vec<Draft>,
) -> Result<Vec<Published>, BatchError> {
    let mut sent = Vec::with_capacity(drafts.len());
    let mut refused_to_send = None;
    for draft in drafts {
        match send(shared, draft).await {
            Ok(one) => sent.push(one),
            // Nothing after it is sent, so it is the batch's last word.
            Err(error) => {
                refused_to_send = Some(error);
                break;
            }
        }
    }
    let mut published = Vec::with_capacity(sent.len());
    // From the first message not confirmed on: its drafts when no server answered them.
    let mut again: Vec<Draft> = Vec::new();
    let mut refused: Option<Error> = None;
    // Stored, or possibly stored, after the first message not confirmed.
    let mut stored_after = Vec::new();
    let mut uncertain_after = false;
    for one in sent {
        let first = refused.is_none() && again.is_empty();
        let outcome = one.confirm(first).await;
        if first {
            match outcome {
                Ok(p) => published.push(p),
                Err(Unconfirmed::NoResponders(draft)) => again.push(draft),
                Err(Unconfirmed::Failed(error)) => refused = Some(error),
            }
            continue;
        }
        match outcome {
            Ok(p) => stored_after.push(p.system_id),
            Err(Unconfirmed::NoResponders(draft)) => again.push(draft),
            // A refusal (stream full, too large) stored nothing; any other failure may have.
            Err(Unconfirmed::Failed(error)) => {
                uncertain_after |= error.kind() == ErrorKind::Unavailable;
            }
        }
    }
    let later = |error: Error| -> Error {
        if stored_after.is_empty() && !uncertain_after {
            return error;
        }
        let ids: Vec<String> = stored_after.iter().map(u64::to_string).collect();
        Error::cluster(
            error.kind(),
            format!(
                "{error}; JetStream stored {} later message(s) of the batch all the same (system ids [{}]){}",
                ids.len(),
                ids.join(", "),
                if uncertain_after {
                    ", and may have stored others"
                } else {
                    ""
                }
            ),
        )
    };
    let refusal = |published, error| Err(BatchError { published, error });
    if let Some(error) = refused {
        return refusal(published, later(error));
    }
    if !again.is_empty() {
        if !stored_after.is_empty() || uncertain_after {
            let error = Unconfirmed::NoResponders(again.swap_remove(0)).error();
            return refusal(published, later(error));
        }
        for draft in again {
            match publish(shared, draft).await {
                Ok(p) => published.push(p),
                Err(error) => return refusal(published, error),
            }
        }
    }
    match refused_to_send {
        Some(error) => refusal(published, error),
        None => Ok(published),
    }
}
