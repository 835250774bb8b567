//! The in-memory model of JetStream's publishing side (`tinybroker::cluster::jetstream`): one
//! stream behind one lock, so each publish is stored, or refused, at one instant and in the
//! order sent. It keeps what the gateway relies on: sequences, message ids deduplicated,
//! expected last subject sequences, atomic batches, and the stream's message limit (discard
//! new). Faults, set by the driver: the stream answers "no responders" (no leader); the next
//! answers are lost after the message was stored (the outcome unknown to the sender).
//! Its pull consumers are in `jetstream_consumers.rs`; [`ModelConsumer`] is one's handle.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use tinybroker::cluster::jetstream::{
    AckError, AckReply, Answer, ApiError, BoxFuture, Confirmation, Consumer, ConsumerConfig,
    ConsumerError, ConsumerInfo, CreateError, Deliveries, Found, JetStream, Outgoing, PubAck,
    PublishError, PullError, StoredMessage, Stream, StreamError,
};
use tokio::sync::Notify;

use crate::true_time::TrueTime;

use crate::jetstream_consumers::{ConsumerModel, parse_reply};

/// The store times the model reports start here (nanoseconds since the Unix epoch), and move
/// with tokio's clock.
const EPOCH_NANOS: i128 = 1_800_000_000_000_000_000;

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
    /// When it was stored, in nanoseconds since the Unix epoch.
    pub published_nanos: i128,
}

struct State {
    /// Subjects (wildcards allowed) the stream takes besides `<prefix>.>`.
    also: Vec<String>,
    /// Where consumer advisories go (created, deleted), when set.
    advisories: Option<crate::bus::BusClient>,
    /// The clock the model keeps time by.
    clock: TrueTime,
    consumers: BTreeMap<String, ConsumerModel>,
    /// Consumers made so far (each one's creation instant is unique).
    made: i128,
    max_consumers: Option<usize>,
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
    /// The consumers' leaders stopped, none elected yet, and nobody told: answers and pulls
    /// sent to them vanish (no reply, nothing applied, nothing delivered).
    unanswering: bool,
    /// Answers to lose (the message is stored, the sender hears nothing).
    lose_answers: u32,
    /// Confirmations of acks (and terms, naks) to lose: the answer is applied, the sender's
    /// wait for its confirmation times out.
    lose_confirmations: u32,
    /// Connections cut off ([`StreamModel::cut_off`]).
    cut: BTreeSet<u64>,
}

struct Shared {
    /// The stream's name: its prefix.
    name: String,
    state: Mutex<State>,
    /// Woken when a message is stored or given back: open pulls look again.
    wake: Notify,
}

/// The shared stream.
#[derive(Clone)]
pub struct StreamModel {
    shared: Arc<Shared>,
    /// Whose connection this handle is (a gateway's number; 0: nobody's, never cut off).
    client: u64,
}

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
    /// A stream of the subjects `<prefix>.>`, on one tokio runtime's clock.
    pub fn new(prefix: &str) -> Self {
        Self::on(prefix, TrueTime::tokio())
    }

    /// A stream of the subjects `<prefix>.>`, keeping time by `clock`.
    pub fn on(prefix: &str, clock: TrueTime) -> Self {
        Self {
            shared: Arc::new(Shared {
                name: prefix.to_string(),
                state: Mutex::new(State {
                    also: Vec::new(),
                    advisories: None,
                    clock,
                    consumers: BTreeMap::new(),
                    made: 0,
                    max_consumers: None,
                    prefix: prefix.to_string(),
                    last: 0,
                    messages: BTreeMap::new(),
                    last_of_subject: HashMap::new(),
                    ids: HashMap::new(),
                    staged: HashMap::new(),
                    max_messages: None,
                    leaderless: false,
                    unanswering: false,
                    lose_answers: 0,
                    lose_confirmations: 0,
                    cut: BTreeSet::new(),
                }),
                wake: Notify::new(),
            }),
            client: 0,
        }
    }

    /// The same stream through gateway `client`'s connection, which [`StreamModel::cut_off`]
    /// can cut.
    pub fn client(&self, client: u64) -> Self {
        Self {
            shared: self.shared.clone(),
            client,
        }
    }

    /// Cuts `client`'s connection off (true), or restores it (false). Meanwhile, through it, the
    /// stream and its consumers answer as if they had no leader (publishes find no responders,
    /// pulls fail and open ones end, answers are not applied, nothing is made, read, listed or
    /// deleted), while every other connection goes on.
    pub fn cut_off(&self, client: u64, cut: bool) {
        let mut state = self.lock();
        if cut {
            state.cut.insert(client);
        } else {
            state.cut.remove(&client);
        }
        drop(state);
        self.shared.wake.notify_waiters();
    }

    /// Whether nothing reaches the stream through this handle: no leader, or its connection cut.
    fn down(&self, state: &State) -> bool {
        state.leaderless || state.cut.contains(&self.client)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// At most `limit` messages (discard new).
    pub fn limit_messages(&self, limit: usize) {
        self.lock().max_messages = Some(limit);
    }

    /// The stream and its consumers have no leader (true), as while JetStream elects one,
    /// or have one again (false). Meanwhile publishes find no responders, pulls fail and
    /// open ones end, answers are not applied (a confirmed one finds no responders), and
    /// nothing is made, read, listed or deleted.
    pub fn leaderless(&self, leaderless: bool) {
        self.lock().leaderless = leaderless;
        if leaderless {
            self.shared.wake.notify_waiters();
        }
    }

    /// The consumers' leaders stop (true), as when the NATS node leading them is lost, until
    /// new ones are elected (false). Meanwhile answers are not applied and get no reply (a
    /// confirmed one times out), and pulls bring nothing until they expire; messages already
    /// delivered come again after their ack wait, once there is a leader.
    pub fn consumers_unanswering(&self, unanswering: bool) {
        self.lock().unanswering = unanswering;
        self.shared.wake.notify_waiters();
    }

    /// The next `n` answers are lost after their message was stored.
    pub fn lose_answers(&self, n: u32) {
        self.lock().lose_answers = n;
    }

    /// The next `n` confirmed answers (acks, terms, naks) are applied and their confirmations
    /// lost: the sender's wait times out, its outcome unknown to it.
    pub fn lose_confirmations(&self, n: u32) {
        self.lock().lose_confirmations = n;
    }

    /// How many confirmations are still to be lost.
    pub fn confirmations_to_lose(&self) -> u32 {
        self.lock().lose_confirmations
    }

    /// Every stored message, in stream order.
    pub fn stored(&self) -> Vec<Stored> {
        self.lock().messages.values().cloned().collect()
    }

    /// The stream takes `subjects` (wildcards allowed) too.
    pub fn take_subjects(&self, subjects: &str) {
        self.lock().also.push(subjects.to_string());
    }

    /// Consumer advisories (`$JS.EVENT.ADVISORY.CONSUMER.{CREATED,DELETED}.<stream>.<name>`)
    /// go out on `bus`, as JetStream sends them.
    pub fn advise_on(&self, bus: crate::bus::BusClient) {
        self.lock().advisories = Some(bus);
    }

    /// Sends the advisory of `what` (`CREATED`, `DELETED`) happening to consumer `name`.
    fn advise(&self, what: &str, name: &str) {
        let bus = self.lock().advisories.clone();
        if let Some(bus) = bus {
            let subject = format!(
                "$JS.EVENT.ADVISORY.CONSUMER.{what}.{}.{name}",
                self.shared.name
            );
            tokio::spawn(async move {
                use tinybroker::cluster::bus::Bus;
                let _ = bus.publish(&subject, bytes::Bytes::new()).await;
            });
        }
    }

    /// Whether the stream takes `subject`.
    fn takes(state: &State, subject: &str) -> bool {
        subject.starts_with(&format!("{}.", state.prefix))
            || state.also.iter().any(|p| crate::bus::matches(p, subject))
    }

    /// At most `limit` consumers.
    pub fn limit_consumers(&self, limit: usize) {
        self.lock().max_consumers = Some(limit);
    }

    fn handle(
        &self,
        name: &str,
        consumer: &ConsumerModel,
        messages: &BTreeMap<u64, Stored>,
    ) -> Found {
        let handle = ModelConsumer {
            stream: self.clone(),
            name: name.to_string(),
            created: consumer.created,
        };
        (Box::new(handle), consumer.info(messages))
    }

    /// Makes the consumer `config` describes: the one of its name if its configuration is the
    /// same, refused if it is another.
    fn create(&self, config: ConsumerConfig) -> Result<Found, CreateError> {
        let name = config.name.clone();
        let made = self.make(config);
        if matches!(made, Ok((_, true))) {
            self.advise("CREATED", &name);
        }
        made.map(|(found, _)| found)
    }

    /// The consumer `config` describes, and whether it was made now.
    fn make(&self, config: ConsumerConfig) -> Result<(Found, bool), CreateError> {
        let mut state = self.lock();
        let state = &mut *state;
        if self.down(state) {
            return Err(CreateError::ForNow("timed out".to_string()));
        }
        if let Some(existing) = state.consumers.get(&config.name) {
            return if existing.config == config {
                Ok((self.handle(&config.name, existing, &state.messages), false))
            } else {
                Err(CreateError::Refused(
                    "consumer already exists (code 400, error code 10148)".to_string(),
                ))
            };
        }
        if state
            .max_consumers
            .is_some_and(|limit| state.consumers.len() >= limit)
        {
            return Err(CreateError::Limit);
        }
        state.made += 1;
        let created = EPOCH_NANOS + state.made;
        let name = config.name.clone();
        let mut consumer = ConsumerModel::new(config, created);
        // It delivers what is stored from now on.
        consumer.skip_to(state.last + 1);
        let found = self.handle(&name, &consumer, &state.messages);
        state.consumers.insert(name, consumer);
        Ok((found, true))
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
                published_nanos: EPOCH_NANOS + state.clock.now().as_nanos() as i128,
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
    fn decide(&self, message: Outgoing) -> Result<PubAck, PublishError> {
        let mut state = self.lock();
        let state = &mut *state;
        if self.down(state) || !Self::takes(state, &message.subject) {
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
        self.shared.wake.notify_waiters();
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
        let answer = self.decide(message);
        Box::pin(async move {
            let confirmation: Confirmation = Box::pin(async move { answer });
            Ok(confirmation)
        })
    }

    fn send(&self, message: Outgoing) -> BoxFuture<'_, Result<(), PublishError>> {
        Box::pin(async move {
            if self.down(&self.lock()) {
                // Nobody answers a message sent without a reply: lost.
                return Ok(());
            }
            match header(&message, BATCH_ID) {
                Some(batch) => {
                    let batch = batch.to_string();
                    self.lock().staged.entry(batch).or_default().push(message);
                }
                // A plain message on the stream's subjects is stored as any publish, unanswered.
                None => {
                    let _ = self.decide(message);
                }
            }
            Ok(())
        })
    }

    fn answer(&self, reply: &AckReply, answer: Answer) -> BoxFuture<'_, Result<(), AckError>> {
        let _ = self.apply(reply, answer);
        Box::pin(async { Ok(()) })
    }

    fn confirm(
        &self,
        reply: &AckReply,
        answer: Answer,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<(), AckError>> {
        if self.lock().unanswering {
            return Box::pin(async move {
                tokio::time::sleep(timeout).await;
                Err(AckError::TimedOut)
            });
        }
        let applied = self.apply(reply, answer);
        let lost = applied.is_ok() && {
            let mut state = self.lock();
            let lose = state.lose_confirmations > 0;
            state.lose_confirmations -= u32::from(lose);
            lose
        };
        Box::pin(async move {
            if lost {
                tokio::time::sleep(timeout).await;
                return Err(AckError::TimedOut);
            }
            applied
        })
    }

    fn flush(&self) -> BoxFuture<'_, Result<(), AckError>> {
        Box::pin(async { Ok(()) })
    }
}

impl StreamModel {
    /// Applies an answer to the delivery `reply` names: "no responders" when its consumer is
    /// gone (or was never this model's).
    fn apply(&self, reply: &AckReply, answer: Answer) -> Result<(), AckError> {
        let Some((_, name, sequence)) = parse_reply(reply) else {
            return Err(AckError::NoResponders);
        };
        let mut state = self.lock();
        if self.down(&state) {
            return Err(AckError::NoResponders);
        }
        if state.unanswering {
            return Err(AckError::TimedOut);
        }
        let now = state.clock.now();
        let consumer = state
            .consumers
            .get_mut(name)
            .ok_or(AckError::NoResponders)?;
        consumer.answer(sequence, answer, now);
        if matches!(answer, Answer::Nak(_)) {
            self.shared.wake.notify_waiters();
        }
        Ok(())
    }
}

/// A handle on one of the model's consumers, as a bridge holds it.
#[derive(Clone)]
pub struct ModelConsumer {
    stream: StreamModel,
    name: String,
    created: i128,
}

impl std::fmt::Debug for ModelConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelConsumer")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Consumer for ModelConsumer {
    fn name(&self) -> &str {
        &self.name
    }

    fn created(&self) -> i128 {
        self.created
    }

    fn pull(
        &self,
        max_messages: usize,
        expires: Duration,
    ) -> BoxFuture<'_, Result<Deliveries, PullError>> {
        let this = self.clone();
        Box::pin(async move {
            let clock = {
                let state = this.stream.lock();
                if this.stream.down(&state) {
                    return Err(PullError("no responders".to_string()));
                }
                // By name, as NATS pulls: a handle of a consumer deleted and made again under
                // its name pulls the new one.
                if !state.consumers.contains_key(&this.name) {
                    return Err(PullError("consumer not found".to_string()));
                }
                state.clock.clone()
            };
            let deadline = clock.now() + expires;
            let deliveries: Deliveries = Box::pin(async_stream::stream! {
                let mut brought = 0;
                while brought < max_messages {
                    let shared = this.stream.shared.clone();
                    let woken = shared.wake.notified();
                    tokio::pin!(woken);
                    woken.as_mut().enable();
                    let now = clock.now();
                    let taken = {
                        let mut state = this.stream.lock();
                        let state = &mut *state;
                        if this.stream.down(state) {
                            break;
                        }
                        let Some(consumer) = state.consumers.get_mut(&this.name) else {
                            break;
                        };
                        // Sent to a leader that is gone: nothing comes until it expires.
                        (!state.unanswering).then(|| {
                            let batch = consumer.take(
                                (&state.prefix, &this.name),
                                &state.messages,
                                max_messages - brought,
                                now,
                            );
                            (batch, consumer.next_due())
                        })
                    };
                    let Some((batch, next_due)) = taken else {
                        clock.sleep_until(deadline).await;
                        break;
                    };
                    for delivery in batch {
                        brought += 1;
                        yield Ok(delivery);
                    }
                    if brought >= max_messages || clock.now() >= deadline {
                        break;
                    }
                    let until = next_due.map_or(deadline, |due| due.clamp(clock.now(), deadline));
                    tokio::select! {
                        () = &mut woken => {}
                        () = clock.sleep_until(until) => {}
                    }
                }
            });
            Ok(deliveries)
        })
    }

    fn info(&self) -> BoxFuture<'_, Result<ConsumerInfo, ConsumerError>> {
        self.stream.consumer_info(&self.name)
    }
}

impl Stream for StreamModel {
    fn name(&self) -> &str {
        &self.shared.name
    }

    fn consumer(&self, name: &str) -> BoxFuture<'_, Result<Option<Found>, ConsumerError>> {
        let found = {
            let state = self.lock();
            match self.down(&state) {
                true => Err(ConsumerError::Other("timed out".to_string())),
                false => Ok(state
                    .consumers
                    .get(name)
                    .map(|consumer| self.handle(name, consumer, &state.messages))),
            }
        };
        Box::pin(async move { found })
    }

    fn create_consumer(&self, config: ConsumerConfig) -> BoxFuture<'_, Result<Found, CreateError>> {
        let made = self.create(config);
        Box::pin(async move { made })
    }

    fn consumer_info(&self, name: &str) -> BoxFuture<'_, Result<ConsumerInfo, ConsumerError>> {
        let info = {
            let state = self.lock();
            match state.consumers.get(name) {
                _ if self.down(&state) => Err(ConsumerError::Other("timed out".to_string())),
                Some(consumer) => Ok(consumer.info(&state.messages)),
                None => Err(ConsumerError::NotFound),
            }
        };
        Box::pin(async move { info })
    }

    fn consumers(&self) -> BoxFuture<'_, Result<Vec<ConsumerInfo>, ConsumerError>> {
        let listed = {
            let state = self.lock();
            match self.down(&state) {
                true => Err(ConsumerError::Other("timed out".to_string())),
                false => Ok(state
                    .consumers
                    .values()
                    .map(|consumer| consumer.info(&state.messages))
                    .collect()),
            }
        };
        Box::pin(async move { listed })
    }

    fn consumer_count(&self) -> BoxFuture<'_, Result<usize, ConsumerError>> {
        let count = {
            let state = self.lock();
            match self.down(&state) {
                true => Err(ConsumerError::Other("timed out".to_string())),
                false => Ok(state.consumers.len()),
            }
        };
        Box::pin(async move { count })
    }

    fn last_message(
        &self,
        subject: &str,
    ) -> BoxFuture<'_, Result<Option<StoredMessage>, StreamError>> {
        let last = {
            let state = self.lock();
            match self.down(&state) {
                true => Err(StreamError("timed out".to_string())),
                false => Ok(state
                    .last_of_subject
                    .get(subject)
                    .and_then(|sequence| state.messages.get(sequence))
                    .map(|stored| StoredMessage {
                        sequence: stored.sequence,
                        headers: stored.headers.clone(),
                        payload: stored.payload.clone(),
                    })),
            }
        };
        Box::pin(async move { last })
    }

    fn purge(&self, subject: &str, below: u64) -> BoxFuture<'_, Result<(), StreamError>> {
        let purged = {
            let mut state = self.lock();
            let state = &mut *state;
            if self.down(state) {
                Err(StreamError("timed out".to_string()))
            } else {
                state
                    .messages
                    .retain(|&sequence, stored| sequence >= below || stored.subject != subject);
                // The subject's last message is now the last one left, if any is.
                match state
                    .messages
                    .values()
                    .rev()
                    .find(|stored| stored.subject == subject)
                {
                    Some(last) => {
                        let sequence = last.sequence;
                        state.last_of_subject.insert(subject.to_string(), sequence);
                    }
                    None => {
                        state.last_of_subject.remove(subject);
                    }
                }
                Ok(())
            }
        };
        Box::pin(async move { purged })
    }

    fn delete_consumer(&self, name: &str) -> BoxFuture<'_, Result<(), ConsumerError>> {
        let deleted = {
            let mut state = self.lock();
            match self.down(&state) {
                true => Err(ConsumerError::Other("timed out".to_string())),
                false => state
                    .consumers
                    .remove(name)
                    .map(|_| ())
                    .ok_or(ConsumerError::NotFound),
            }
        };
        if deleted.is_ok() {
            self.advise("DELETED", name);
        }
        Box::pin(async move { deleted })
    }
}
