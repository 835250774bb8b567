//! Atomic batches (docs/cluster-internals.md#atomic-batches): where the stream allows
//! them (nats-server 2.12 or later, `allow_atomic`), the publishes that wait together in a
//! `PublishStream` are sent as one JetStream batch, stored all or nothing and answered by one
//! confirmation. One message id, on the batch's commit, stores a batch sent again once, as a
//! message id per publish does for single publishes; JetStream keeps a dozen bytes of
//! deduplication state per batch instead of per message, and answers once.
//!
//! A batch's messages get consecutive stream sequences, ending at the commit's (the stream's
//! leader numbers them together), so each publish is answered with its own `system_id`.

use std::{sync::Arc, time::Duration};

use crate::cluster::jetstream::{Outgoing, PubAck, PublishError};

use crate::cluster::gateway::{
    Shared,
    control::registry::Count,
    data::publish,
    nats_headers,
    wire::codes::{
        self, BATCH_COMMIT, BATCH_ID, BATCH_SEQUENCE, CONTAINS_DUPLICATE, MSG_ID,
        TOO_MANY_IN_FLIGHT,
    },
    wire::names,
};
use crate::{
    broker::Published,
    core::{Draft, Error},
};

/// At most this many publishes go in one batch (JetStream takes up to 1,000 by default).
pub(in crate::cluster::gateway) const MAX_BATCH: usize = 256;

/// Publishes sent, or to send, as one batch.
pub(in crate::cluster::gateway) struct Batch {
    drafts: Vec<Draft>,
    /// How each one's `queued_for` is counted (taken when read, as for a single publish).
    counts: Vec<Count>,
    /// The message id its commit carries, the same on every try.
    id: String,
    tries: u32,
    /// Whether a try may have been stored: its confirmation did not come in time.
    uncertain: bool,
}

/// What one try came to.
enum Tried {
    /// Stored; the commit's stream sequence.
    Stored(u64),
    /// An earlier try was stored.
    StoredBefore,
    /// Not confirmed (no server answered, or not in time, or the connection broke): it may
    /// be sent again. `true` when it may have been stored.
    Again(bool),
    /// Refused: nothing of it stored.
    Refused(PublishError),
    /// A message the NATS client does not send as it is (larger than the servers'
    /// `max_payload` with its headers as NATS carries them): nothing committed; each publish
    /// is answered alone.
    Unsendable,
    /// Not sent: what each publish is answered.
    Failed(Error),
}

/// Publishes `message` through JetStream and awaits its `PubAck`.
async fn confirmed(shared: &Shared, message: Outgoing) -> Result<PubAck, PublishError> {
    shared.jetstream.publish(message).await?.await
}

impl Batch {
    /// Drafts to publish together, in order (two or more, at most [`MAX_BATCH`]).
    pub(in crate::cluster::gateway) fn new(shared: &Shared, drafts: Vec<Draft>) -> Self {
        let counts = drafts.iter().map(|_| shared.registry.admit()).collect();
        Self {
            drafts,
            counts,
            id: shared.ids.next(),
            tries: 0,
            uncertain: false,
        }
    }

    /// Publishes the batch: sent, and sent again with the same message id while JetStream
    /// does not confirm it (or has too many batches open on the stream), for up to the
    /// gateway's patience. A batch JetStream refuses (a full stream, a setting of the servers)
    /// is published one by one instead, each as a single publish would be: refused exactly past a stream's limit, as
    /// on every carriage. One answer per draft, in order.
    pub(in crate::cluster::gateway) async fn publish(
        mut self,
        shared: Arc<Shared>,
    ) -> Vec<Result<Published, Error>> {
        let deadline = tokio::time::Instant::now() + shared.patience;
        let mut delay = Duration::from_millis(5);
        loop {
            match self.try_once(&shared).await {
                Tried::Stored(last) => return self.stored(&shared, last).await,
                Tried::StoredBefore => {
                    return match self.sequence_of_earlier(&shared).await {
                        Ok(last) => self.stored(&shared, last).await,
                        Err(error) => self.each(&error),
                    };
                }
                Tried::Again(maybe_stored) => {
                    self.uncertain |= maybe_stored;
                    if tokio::time::Instant::now() + delay >= deadline {
                        return self.each(&self.not_confirmed());
                    }
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_millis(200));
                }
                Tried::Refused(error) if !self.uncertain => {
                    tracing::debug!(batch = %self.id, %error, "JetStream refused an atomic batch; publishing its messages one by one");
                    return self.one_by_one(&shared).await;
                }
                // Refused now, but an earlier try may have been stored: not sent again, as
                // a single publish in the same case.
                Tried::Refused(_) => return self.each(&self.not_confirmed()),
                Tried::Failed(error) => return self.each(&error),
                // Deterministic: an earlier try stopped at the same message, committing nothing.
                Tried::Unsendable => return self.one_by_one(&shared).await,
            }
        }
    }

    /// Sends the batch under a new batch id (a try's messages that JetStream staged and never
    /// committed are not reused) and waits for the confirmation of its commit.
    async fn try_once(&mut self, shared: &Shared) -> Tried {
        self.tries += 1;
        let batch_id = format!("{}-{}", self.id, self.tries);
        let last = self.drafts.len() - 1;
        for (n, draft) in self.drafts.iter().enumerate() {
            let mut message = Outgoing {
                subject: names::subject(&shared.prefix, draft.topic().as_str()),
                headers: match nats_headers(draft.envelope().headers()) {
                    Ok(headers) => headers,
                    Err(error) => return Tried::Failed(error),
                },
                payload: draft.payload_bytes(),
            };
            message.header(BATCH_ID, batch_id.as_str());
            message.header(BATCH_SEQUENCE, (n + 1).to_string());
            if n < last {
                // Answered by the commit only: a plain publish, in order on the connection.
                if let Err(error) = shared.jetstream.send(message).await {
                    tracing::debug!(batch = %self.id, %error, "NATS did not take a batch's message");
                    if !matches!(error, PublishError::NotSent(_)) {
                        return Tried::Unsendable;
                    }
                    return Tried::Again(false);
                }
                continue;
            }
            message.header(BATCH_COMMIT, "1");
            message.header(MSG_ID, self.id.as_str());
            return match confirmed(shared, message).await {
                Ok(ack) => Tried::Stored(ack.sequence),
                Err(error) if codes::jetstream_code(&error) == Some(CONTAINS_DUPLICATE) => {
                    Tried::StoredBefore
                }
                // A refusal first: JetStream answers a full stream with a 503 too.
                Err(error) if publish::refused(shared, &error, false).is_some() => {
                    Tried::Refused(error)
                }
                Err(error)
                    if matches!(error, PublishError::NoResponders)
                        || codes::jetstream_code(&error) == Some(TOO_MANY_IN_FLIGHT) =>
                {
                    Tried::Again(false)
                }
                Err(error)
                    if matches!(error, PublishError::Unanswered(_))
                        || codes::unavailable_for_now(&error)
                        || codes::jetstream_code(&error) == Some(codes::ID_IN_PROCESS) =>
                {
                    Tried::Again(true)
                }
                Err(error) => Tried::Refused(error),
            };
        }
        unreachable!("a batch has at least one message")
    }

    /// The commit's stream sequence of the try stored earlier: its last message published
    /// alone with the batch's message id, which JetStream answers as a duplicate naming the
    /// sequence it stored it at, storing nothing.
    async fn sequence_of_earlier(&self, shared: &Shared) -> Result<u64, Error> {
        let draft = self
            .drafts
            .last()
            .expect("a batch has at least one message");
        let mut message = Outgoing {
            subject: names::subject(&shared.prefix, draft.topic().as_str()),
            headers: nats_headers(draft.envelope().headers())?,
            payload: draft.payload_bytes(),
        };
        message.header(MSG_ID, self.id.as_str());
        let unknown = |why: String| {
            Error::Unavailable(format!(
                "JetStream stored this publish's batch on an earlier try (message id {}) but did not name its sequences: {why}",
                self.id
            ))
        };
        let ack = confirmed(shared, message)
            .await
            .map_err(|error| unknown(error.to_string()))?;
        if ack.duplicate {
            Ok(ack.sequence)
        } else {
            Err(unknown(format!(
                "its id had left the stream's duplicate window, and its last message was stored again at {}",
                ack.sequence
            )))
        }
    }

    /// Each publish's answer, the batch stored with its commit at stream sequence `last`.
    async fn stored(self, shared: &Shared, last: u64) -> Vec<Result<Published, Error>> {
        let first = (last + 1).saturating_sub(self.drafts.len() as u64);
        let mut answers = Vec::with_capacity(self.drafts.len());
        for (n, (draft, count)) in self.drafts.iter().zip(self.counts).enumerate() {
            shared.broker.count_upstream_publish();
            let queued_for = shared.registry.queued_for(count, draft.topic()).await;
            answers.push(Ok(Published {
                system_id: first + n as u64,
                queued_for,
            }));
        }
        answers
    }

    /// Each publish sent alone, in order, as a single publish is (its own message id,
    /// confirmed before the next is sent).
    async fn one_by_one(self, shared: &Arc<Shared>) -> Vec<Result<Published, Error>> {
        let mut answers = Vec::with_capacity(self.drafts.len());
        for draft in self.drafts {
            answers.push(publish::publish(shared, draft).await);
        }
        answers
    }

    /// The same answer for every publish.
    fn each(&self, error: &Error) -> Vec<Result<Published, Error>> {
        self.drafts.iter().map(|_| Err(error.clone())).collect()
    }

    /// Why it was not confirmed.
    fn not_confirmed(&self) -> Error {
        if self.uncertain {
            Error::Unavailable(format!(
                "JetStream did not confirm the publish in time (the stream's leader may be moving, or a NATS server stopped answering); it may have been stored, once, with the {} publishes sent with it (message id {})",
                self.drafts.len() - 1,
                self.id
            ))
        } else {
            Error::Unavailable(
                "JetStream did not confirm the publish: no JetStream server answered (the stream's leader may be moving); nothing was stored".into(),
            )
        }
    }
}
