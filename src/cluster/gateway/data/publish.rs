//! Publishes through a gateway: sent to JetStream and answered once JetStream stored them
//! (its `PubAck`). `PublishStream` pipelines them: it sends each as it reads it, in order, and
//! answers each confirmation in order ([`Sent`]), so one stream is not held to one round trip
//! per message.
//!
//! Each publish carries a message id (`Nats-Msg-Id`), the same on every try: one that no
//! server answered in time (a stream leader that stopped, a NATS node this gateway is leaving)
//! may have been stored, and JetStream stores an id once within the stream's duplicate window,
//! answering a repeat with the first one's sequence. So a publish is sent again until
//! JetStream confirms it, for up to the gateway's patience (`--nats-publish-timeout`, within
//! the duplicate window), and is never stored twice.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use crate::cluster::jetstream::{Confirmation, Outgoing, PubAck, PublishError};

use crate::cluster::gateway::{
    DEAD_LETTER_OF, Shared,
    control::registry::Count,
    nats_headers, unavailable,
    wire::{
        codes::{self, ID_IN_PROCESS, MSG_ID, jetstream_code, unavailable_for_now},
        names,
    },
};
use crate::{
    broker::{BatchError, Published},
    core::{Draft, Error, ErrorKind},
};

/// How long one try of a publish waits for JetStream's `PubAck` before it is sent again (the
/// JetStream context's timeout for publishes).
pub(in crate::cluster::gateway) const PUBLISH_TRY: Duration = Duration::from_secs(2);

/// How long a dead letter is tried: the bridge waits for it, and one not stored in time is
/// given back to come again (its id is the same on every try, from any gateway).
const DEAD_LETTER_PATIENCE: Duration = Duration::from_secs(2);

/// The message ids of one gateway's publishes: a random prefix for this process, then a
/// counter, so no two publishes through any gateways share one. Short: JetStream keeps every
/// id of its duplicate window in memory on each of the stream's servers.
pub(in crate::cluster::gateway) struct MessageIds {
    prefix: String,
    next: AtomicU64,
}

impl MessageIds {
    pub(in crate::cluster::gateway) fn new() -> Self {
        use std::hash::{BuildHasher, Hasher};
        let random = |salt: u64| {
            let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
            hasher.write_u64(salt);
            hasher.finish()
        };
        // 64 random bits (the process id mixed in): two gateway processes share a prefix with
        // odds of about 2^-64 per pair.
        let mixed = random(0x6d73_6769_6431) ^ u64::from(std::process::id()).rotate_left(40);
        Self {
            prefix: format!("{mixed:016x}"),
            next: AtomicU64::new(0),
        }
    }

    pub(in crate::cluster::gateway) fn next(&self) -> String {
        format!(
            "{}.{:x}",
            self.prefix,
            self.next.fetch_add(1, Ordering::Relaxed)
        )
    }
}

/// The id of subscription `of`'s dead letter of stream message `sequence`: the same from every
/// gateway and on every try, so a dead letter given back and dead-lettered again (its first
/// try's answer lost) is stored once within the duplicate window.
fn dead_letter_id(of: &str, sequence: u64) -> String {
    format!("tb-dead-letter-{sequence}-{of}")
}

/// What a publish needs to be sent again: its draft, its id, its dead-letter mark.
#[derive(Debug)]
pub struct Resend {
    draft: Draft,
    id: String,
    dead_letter_of: Option<String>,
    /// JetStream may have stored it (its answer did not come in time), as opposed to "no
    /// responders" (no server took it).
    maybe_stored: bool,
    /// The fence record it must find (a fenced publish).
    expect: Option<Expect>,
}

/// What a fenced publish expects (docs/semantics.md#cluster-fenced-publish): JetStream stores
/// it only while the last message of the fence subject `subject` is at `sequence`.
#[derive(Debug, Clone)]
pub(in crate::cluster::gateway) struct Expect {
    pub(in crate::cluster::gateway) subject: String,
    pub(in crate::cluster::gateway) sequence: u64,
}

/// Why a fenced publish was not stored.
#[derive(Debug)]
pub(in crate::cluster::gateway) enum Expected {
    /// The fence subject's last record is no longer the one expected.
    Moved,
    /// Anything else, as a client would be told.
    Failed(Error),
}

impl Resend {
    /// Sends it again, with the same id.
    async fn send(self, shared: &Arc<Shared>) -> Result<Sent, Error> {
        send_with(
            shared,
            self.draft,
            self.id,
            self.dead_letter_of,
            false,
            self.expect,
        )
        .await
    }

    /// Sends it again until JetStream confirms it, for up to `patience` from now.
    pub(in crate::cluster::gateway) async fn publish(
        self,
        shared: &Arc<Shared>,
        patience: Duration,
    ) -> Result<Published, Error> {
        let deadline = tokio::time::Instant::now() + patience;
        let mut delay = Duration::from_millis(5);
        let mut resend = self;
        loop {
            // A try that was not answered in time has already waited; "no responders" (the
            // stream's interest still spreading over the routes, or its leader moving) and a
            // broken connection come at once: each is paced, 5 ms doubling to 200 ms.
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_millis(200));
            match resend.send(shared).await?.confirm(true).await {
                Ok(published) => return Ok(published),
                Err(Unconfirmed::Again(again)) if tokio::time::Instant::now() < deadline => {
                    resend = again;
                }
                Err(unconfirmed) => return Err(unconfirmed.error()),
            }
        }
    }
}

/// A publish sent to JetStream, its confirmation still to come.
pub struct Sent {
    shared: Arc<Shared>,
    draft: Draft,
    id: String,
    dead_letter_of: Option<String>,
    /// The confirmation to come.
    ack: Ack,
    /// How its `queued_for` is counted (none for a dead letter, whose count nobody reads).
    count: Option<Count>,
    /// The fence record it must find (a fenced publish).
    expect: Option<Expect>,
}

/// Where a sent publish's confirmation comes from. A `PublishAckFuture` holds one of the
/// JetStream context's in-flight permits ([`IN_FLIGHT`]) until it is awaited or dropped.
enum Ack {
    /// Awaited by a task of its own, which gives its permit back as soon as the confirmation
    /// is in: for a batch, which sends all its messages before it awaits any, and would
    /// otherwise hold permits for confirmations already in (several large batches together
    /// could hold them all, and every send would wait forever).
    Task(tokio::task::JoinHandle<Result<PubAck, PublishError>>),
    /// Awaited in place: for a `PublishStream`'s pipeline, which awaits its oldest
    /// confirmation whatever else it does and holds at most 256 (a task per publish cost a
    /// tenth to a third of the stream's publishes per second, in `bench --nats`).
    Here(Confirmation),
}

/// The JetStream context's in-flight permits (async-nats' default is 5,000): each
/// `PublishStream` holds up to 256 of them while its confirmations come.
pub(in crate::cluster::gateway) const IN_FLIGHT: usize = 1 << 20;

/// Why a sent publish was not confirmed.
#[derive(Debug)]
pub enum Unconfirmed {
    /// No JetStream server answered ("no responders"), or not in time, or the connection
    /// broke: it may be sent again with its id (stored at most once), carried here for that.
    Again(Resend),
    /// A refusal, or a failure after which it must not be sent again.
    Failed(Error),
    /// A fenced publish's expectation was not met (JetStream's error code), nothing stored;
    /// carried here to be sent again when the code says a later try can pass.
    Expectation(u64, Resend),
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
        let outcome = match self.ack {
            Ack::Here(ack) => ack.await,
            Ack::Task(task) => match task.await {
                Ok(outcome) => outcome,
                Err(error) => {
                    return Err(Unconfirmed::Failed(unavailable(
                        "JetStream's confirmation was lost",
                        error,
                    )));
                }
            },
        };
        // Macros, not closures: the success arm still reads the draft's topic.
        macro_rules! resend {
            ($maybe_stored:expr) => {
                Resend {
                    draft: self.draft,
                    id: self.id,
                    dead_letter_of: self.dead_letter_of,
                    maybe_stored: $maybe_stored,
                    expect: self.expect,
                }
            };
        }
        macro_rules! again {
            ($maybe_stored:expr) => {
                Err(Unconfirmed::Again(resend!($maybe_stored)))
            };
        }
        // A fenced publish's expectation not met (nothing stored): its code says what next.
        let expectation = match &outcome {
            Err(error) if self.expect.is_some() => jetstream_code(error).filter(|code| {
                [codes::WRONG_LAST_SEQUENCE, codes::EXPECTATION_BUSY].contains(code)
            }),
            _ => None,
        };
        if let Some(code) = expectation {
            return Err(Unconfirmed::Expectation(code, resend!(false)));
        }
        match outcome {
            Ok(ack) => {
                // A repeat JetStream recognised (`ack.duplicate`) names the first one's
                // sequence: counted once, here, where the client is answered.
                self.shared.broker.count_upstream_publish();
                // The subscriptions in the cluster when the publish arrived, or later
                // (docs/semantics.md#cluster-durability); the sync ran beside the publish.
                let queued_for = match self.count {
                    Some(count) => {
                        self.shared
                            .registry
                            .queued_for(count, self.draft.topic())
                            .await
                    }
                    None => 0,
                };
                Ok(Published {
                    system_id: ack.sequence,
                    queued_for,
                })
            }
            Err(PublishError::NoResponders) => again!(false),
            Err(PublishError::Unanswered(_)) => again!(true),
            // A refusal first: JetStream answers a full stream with a 503 too.
            Err(error) => match refused(&self.shared, &error, count_refusal) {
                Some(refusal) => Err(Unconfirmed::Failed(refusal)),
                None if unavailable_for_now(&error)
                    || jetstream_code(&error) == Some(ID_IN_PROCESS) =>
                {
                    again!(true)
                }
                None => Err(Unconfirmed::Failed(unavailable(
                    "JetStream did not confirm the publish",
                    error,
                ))),
            },
        }
    }
}

/// The refusal of a publish JetStream refused for a reason the client can act on: the stream
/// is full (its `max_msgs` or `max_bytes`, with discard new), or the message is larger than
/// the NATS servers take. Counted as a rejected publish when `count`. `None` for other
/// failures.
pub(in crate::cluster::gateway) fn refused(
    shared: &Shared,
    error: &PublishError,
    count: bool,
) -> Option<Error> {
    let broker = &shared.broker;
    if matches!(error, PublishError::TooLarge(_)) {
        if count {
            broker.count_rejected_publish();
        }
        return Some(Error::InvalidArgument(
            "the message, with its headers as NATS carries them, is larger than the NATS servers' max_payload; send a smaller one, or raise max_payload on the servers".into(),
        ));
    }
    let text = match error {
        PublishError::Refused(api) => api.to_string(),
        PublishError::Other(text) => text.clone(),
        _ => String::new(),
    };
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
            Unconfirmed::Again(Resend {
                maybe_stored: false,
                ..
            }) => Error::Unavailable(
                "JetStream did not confirm the publish: no JetStream server answered (the stream's leader may be moving); nothing was stored".into(),
            ),
            Unconfirmed::Again(Resend { id, .. }) => Error::Unavailable(format!(
                "JetStream did not confirm the publish in time (the stream's leader may be moving, or a NATS server stopped answering); it may have been stored, once (message id {id})"
            )),
            Unconfirmed::Failed(error) => error,
            Unconfirmed::Expectation(code, _) => Error::Unavailable(format!(
                "JetStream refused the fenced publish's expectation (error {code}); nothing was stored"
            )),
        }
    }
}

pub(in crate::cluster::gateway) async fn send(
    shared: &Arc<Shared>,
    draft: Draft,
) -> Result<Sent, Error> {
    send_with(shared, draft, shared.ids.next(), None, false, None).await
}

/// [`send`] for a `PublishStream`'s pipeline, which awaits its confirmations in order.
pub(in crate::cluster::gateway) async fn send_streamed(
    shared: &Arc<Shared>,
    draft: Draft,
) -> Result<Sent, Error> {
    send_with(shared, draft, shared.ids.next(), None, true, None).await
}

/// [`send`] with message id `id`, for a dead letter with the subscription it came from
/// (`dead_letter_of`).
async fn send_with(
    shared: &Arc<Shared>,
    draft: Draft,
    id: String,
    dead_letter_of: Option<String>,
    awaited_in_order: bool,
    expect: Option<Expect>,
) -> Result<Sent, Error> {
    let count = dead_letter_of.is_none().then(|| shared.registry.admit());
    let mut message = Outgoing {
        subject: names::subject(&shared.prefix, draft.topic().as_str()),
        headers: nats_headers(draft.envelope().headers())?,
        payload: draft.payload_bytes(),
    };
    if let Some(subscription) = &dead_letter_of {
        message.header(DEAD_LETTER_OF, subscription.as_str());
    }
    if !crate::core::planted::active(crate::core::planted::PlantedBug::PublishWithoutMessageId) {
        message.header(MSG_ID, id.as_str());
    }
    if let Some(expect) = &expect {
        message.header(codes::EXPECTED_SEQUENCE, expect.sequence.to_string());
        message.header(codes::EXPECTED_SUBJECT, expect.subject.as_str());
    }
    let ack = shared.jetstream.publish(message).await.map_err(|e| {
        refused(shared, &e, true)
            .unwrap_or_else(|| unavailable("JetStream did not take the publish", e))
    })?;
    Ok(Sent {
        shared: shared.clone(),
        draft,
        id,
        dead_letter_of,
        expect,
        ack: if awaited_in_order {
            Ack::Here(ack)
        } else {
            Ack::Task(tokio::spawn(ack))
        },
        count,
    })
}

/// Publishes one message, sent again with its id until JetStream confirms it, for up to the
/// gateway's patience (a request's gRPC deadline, when shorter, ends it first).
pub(in crate::cluster::gateway) async fn publish(
    shared: &Arc<Shared>,
    draft: Draft,
) -> Result<Published, Error> {
    let deadline = tokio::time::Instant::now() + shared.patience;
    let sent = send(shared, draft).await?;
    confirmed_by(shared, sent, deadline).await
}

/// Publishes a fenced message that JetStream stores only as `expect` says, sent again with its
/// id until JetStream confirms or refuses it, for up to the gateway's patience. A refusal
/// because another expectation of the subject was being stored (nothing stored) is tried
/// again too.
///
/// # Errors
/// [`Expected::Moved`] when the record moved; otherwise what [`publish`] gets.
pub(in crate::cluster::gateway) async fn publish_expecting(
    shared: &Arc<Shared>,
    draft: Draft,
    expect: Expect,
) -> Result<Published, Expected> {
    let deadline = tokio::time::Instant::now() + shared.patience;
    let mut sent = send_with(shared, draft, shared.ids.next(), None, false, Some(expect))
        .await
        .map_err(Expected::Failed)?;
    let mut delay = Duration::from_millis(1);
    // Whether an earlier try may have been stored (its answer did not come in time).
    let mut uncertain = false;
    loop {
        let resend = match sent.confirm(true).await {
            Ok(published) => return Ok(published),
            // A stream with one replica checks the expectation before the message id: a try
            // stored earlier is not recognised once the record moved.
            Err(Unconfirmed::Expectation(codes::WRONG_LAST_SEQUENCE, resend)) if uncertain => {
                return Err(Expected::Failed(Error::Unavailable(format!(
                    "JetStream did not confirm the fenced publish in time, and the fence's epoch has ended since: it may have been stored, once, while the epoch was active (message id {})",
                    resend.id
                ))));
            }
            Err(Unconfirmed::Expectation(codes::WRONG_LAST_SEQUENCE, _)) => {
                return Err(Expected::Moved);
            }
            Err(Unconfirmed::Again(resend)) if tokio::time::Instant::now() < deadline => {
                uncertain |= resend.maybe_stored;
                resend
            }
            Err(Unconfirmed::Expectation(_, resend)) if tokio::time::Instant::now() < deadline => {
                resend
            }
            Err(unconfirmed) => return Err(Expected::Failed(unconfirmed.error())),
        };
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(200));
        sent = resend.send(shared).await.map_err(Expected::Failed)?;
    }
}

/// Waits for `sent`'s confirmation, sending it again with its id until JetStream confirms it
/// or `deadline` passes.
async fn confirmed_by(
    shared: &Arc<Shared>,
    sent: Sent,
    deadline: tokio::time::Instant,
) -> Result<Published, Error> {
    match sent.confirmed().await {
        Ok(published) => Ok(published),
        Err(Unconfirmed::Again(resend)) => {
            resend
                .publish(
                    shared,
                    deadline.saturating_duration_since(tokio::time::Instant::now()),
                )
                .await
        }
        Err(unconfirmed) => Err(unconfirmed.error()),
    }
}

/// [`publish`], for subscription `dead_letter_of`'s dead letter of stream message `sequence`:
/// marked so that subscription skips it, with an id of its own (the same from any gateway), and
/// tried for [`DEAD_LETTER_PATIENCE`] only (the bridge waits for it).
pub(in crate::cluster::gateway) async fn publish_dead_letter(
    shared: &Arc<Shared>,
    draft: Draft,
    dead_letter_of: &str,
    sequence: u64,
) -> Result<Published, Error> {
    let deadline = tokio::time::Instant::now() + DEAD_LETTER_PATIENCE;
    let id = dead_letter_id(dead_letter_of, sequence);
    let sent = send_with(
        shared,
        draft,
        id,
        Some(dead_letter_of.to_string()),
        false,
        None,
    )
    .await?;
    confirmed_by(shared, sent, deadline).await
}

/// A `PublishBatch` through the gateway: every message sent in order without waiting, then
/// each confirmation awaited in order, so a batch costs about one round trip to JetStream, not
/// one per message. On a refusal the answer is the confirmed prefix and the first refusal, as
/// the embedded broker's; messages JetStream stored after a refused one (a concurrent ack can
/// make room in a full stream) are named in the refusal's message, never hidden. A batch that
/// JetStream did not confirm from some message on (no server answered, or not in time, and
/// none after it was confirmed) is sent again from there, one at a time with the same ids,
/// with [`publish`]'s patience: what was stored already is answered with its first sequence.
///
/// # Errors
/// The messages confirmed before the first refusal, and that refusal.
pub(in crate::cluster::gateway) async fn publish_batch(
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
    let deadline = tokio::time::Instant::now() + shared.patience;
    let mut published = Vec::with_capacity(sent.len());
    // From the first message not confirmed on: those to send again.
    let mut again: Vec<Resend> = Vec::new();
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
                Err(Unconfirmed::Again(resend)) => again.push(resend),
                Err(unconfirmed @ (Unconfirmed::Failed(_) | Unconfirmed::Expectation(..))) => {
                    refused = Some(unconfirmed.error());
                }
            }
            continue;
        }
        match outcome {
            Ok(p) => stored_after.push(p.system_id),
            // Sent again after the first one not confirmed, unless that one was refused.
            Err(Unconfirmed::Again(resend)) if refused.is_none() => again.push(resend),
            Err(Unconfirmed::Again(resend)) => uncertain_after |= resend.maybe_stored,
            // A refusal (stream full, too large) stored nothing; any other failure may have.
            Err(Unconfirmed::Failed(error)) => {
                uncertain_after |= error.kind() == ErrorKind::Unavailable;
            }
            // Fenced publishes are not sent in batches (`publish_batch` sends them one by one).
            Err(Unconfirmed::Expectation(..)) => {}
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
            let error = Unconfirmed::Again(again.swap_remove(0)).error();
            return refusal(published, later(error));
        }
        for resend in again {
            let patience = deadline.saturating_duration_since(tokio::time::Instant::now());
            match resend.publish(shared, patience).await {
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
