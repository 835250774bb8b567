//! The in-memory model of JetStream's publishing side (`tinybroker::cluster::jetstream`): one
//! stream behind one lock, so each publish is stored, or refused, at one instant and in the
//! order sent. It keeps what the gateway relies on: sequences, message ids deduplicated,
//! expected last subject sequences, atomic batches, and the stream's message limit (discard
//! new). Faults, set by the driver: the stream answers "no responders" (no leader); the next
//! answers are lost after the message was stored (the outcome unknown to the sender).

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex, MutexGuard},
};

use tinybroker::cluster::jetstream::{
    ApiError, BoxFuture, Confirmation, JetStream, Outgoing, PubAck, PublishError,
};

const MSG_ID: &str = "Nats-Msg-Id";
const EXPECTED_SEQUENCE: &str = "Nats-Expected-Last-Subject-Sequence";
const EXPECTED_SUBJECT: &str = "Nats-Expected-Last-Subject-Sequence-Subject";
const BATCH_ID: &str = "Nats-Batch-Id";
const BATCH_COMMIT: &str = "Nats-Batch-Commit";

/// A stored message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    pub sequence: u64,
    pub subject: String,
    pub headers: Vec<(String, String)>,
    pub payload: bytes::Bytes,
}

#[derive(Default)]
struct State {
    /// Only subjects under `<prefix>.` are this stream's.
    prefix: String,
    last: u64,
    messages: BTreeMap<u64, Stored>,
    last_of_subject: HashMap<String, u64>,
    ids: HashMap<String, u64>,
    /// Messages of open batches, by batch id, in the order sent.
    staged: HashMap<String, Vec<Outgoing>>,
    max_messages: Option<usize>,
    /// No leader: every publish is answered "no responders".
    leaderless: bool,
    /// Answers to lose (the message is stored, the sender hears nothing).
    lose_answers: u32,
}

/// The shared stream.
#[derive(Clone, Default)]
pub struct StreamModel(Arc<Mutex<State>>);

fn header<'a>(message: &'a Outgoing, name: &str) -> Option<&'a str> {
    message
        .headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

fn refused(status: u16, code: u64, description: &str) -> PublishError {
    PublishError::Refused(ApiError {
        status,
        code,
        description: description.to_string(),
    })
}

impl StreamModel {
    /// A stream of the subjects `<prefix>.>`.
    pub fn new(prefix: &str) -> Self {
        let model = Self::default();
        model.lock().prefix = prefix.to_string();
        model
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// At most `limit` messages (discard new).
    pub fn limit_messages(&self, limit: usize) {
        self.lock().max_messages = Some(limit);
    }

    /// The stream has no leader (true) or has one again (false).
    pub fn leaderless(&self, leaderless: bool) {
        self.lock().leaderless = leaderless;
    }

    /// The next `n` answers are lost after their message was stored.
    pub fn lose_answers(&self, n: u32) {
        self.lock().lose_answers = n;
    }

    /// Every stored message, in stream order.
    pub fn stored(&self) -> Vec<Stored> {
        self.lock().messages.values().cloned().collect()
    }

    fn store(state: &mut State, message: Outgoing) -> u64 {
        state.last += 1;
        let sequence = state.last;
        state
            .last_of_subject
            .insert(message.subject.clone(), sequence);
        if let Some(id) = header(&message, MSG_ID) {
            state.ids.insert(id.to_string(), sequence);
        }
        state.messages.insert(
            sequence,
            Stored {
                sequence,
                subject: message.subject,
                headers: message.headers,
                payload: message.payload,
            },
        );
        sequence
    }

    fn full(state: &State, adding: usize) -> Option<PublishError> {
        let limit = state.max_messages?;
        (state.messages.len() + adding > limit)
            .then(|| refused(503, 10077, "maximum messages exceeded"))
    }

    /// What JetStream answers `message` (a publish, or a batch's commit).
    fn answer(&self, message: Outgoing) -> Result<PubAck, PublishError> {
        let mut state = self.lock();
        let state = &mut *state;
        if state.leaderless || !message.subject.starts_with(&format!("{}.", state.prefix)) {
            return Err(PublishError::NoResponders);
        }
        let batch = header(&message, BATCH_ID).map(str::to_string);
        let result = match batch {
            Some(batch) => {
                let mut messages = state.staged.remove(&batch).unwrap_or_default();
                if header(&message, BATCH_COMMIT) != Some("1") {
                    return Err(refused(400, 10_000, "atomic publish batch is incomplete"));
                }
                if let Some(id) = header(&message, MSG_ID)
                    && state.ids.contains_key(id)
                {
                    return Err(refused(
                        400,
                        10201,
                        "atomic publish batch contains duplicate message id",
                    ));
                }
                messages.push(message);
                if let Some(full) = Self::full(state, messages.len()) {
                    return Err(full);
                }
                let mut last = 0;
                for message in messages {
                    last = Self::store(state, message);
                }
                PubAck {
                    sequence: last,
                    duplicate: false,
                }
            }
            None => {
                if let Some(id) = header(&message, MSG_ID)
                    && let Some(&sequence) = state.ids.get(id)
                {
                    return Ok(PubAck {
                        sequence,
                        duplicate: true,
                    });
                }
                if let Some(expected) = header(&message, EXPECTED_SEQUENCE) {
                    let subject = header(&message, EXPECTED_SUBJECT).unwrap_or(&message.subject);
                    let last = state.last_of_subject.get(subject).copied().unwrap_or(0);
                    if expected.parse::<u64>().ok() != Some(last) {
                        return Err(refused(400, 10071, &format!("wrong last sequence: {last}")));
                    }
                }
                if let Some(full) = Self::full(state, 1) {
                    return Err(full);
                }
                PubAck {
                    sequence: Self::store(state, message),
                    duplicate: false,
                }
            }
        };
        if state.lose_answers > 0 {
            state.lose_answers -= 1;
            return Err(PublishError::Unanswered(
                "timed out: didn't receive ack in time",
            ));
        }
        Ok(result)
    }
}

impl std::fmt::Debug for StreamModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamModel").finish_non_exhaustive()
    }
}

impl JetStream for StreamModel {
    fn publish(&self, message: Outgoing) -> BoxFuture<'_, Result<Confirmation, PublishError>> {
        // Stored (or refused) as it is sent: the answer is what the confirmation awaits.
        let answer = self.answer(message);
        Box::pin(async move {
            let confirmation: Confirmation = Box::pin(async move { answer });
            Ok(confirmation)
        })
    }

    fn send(&self, message: Outgoing) -> BoxFuture<'_, Result<(), PublishError>> {
        Box::pin(async move {
            match header(&message, BATCH_ID) {
                Some(batch) => {
                    let batch = batch.to_string();
                    self.lock().staged.entry(batch).or_default().push(message);
                }
                // A plain message on the stream's subjects is stored as any publish, unanswered.
                None => {
                    let _ = self.answer(message);
                }
            }
            Ok(())
        })
    }
}
