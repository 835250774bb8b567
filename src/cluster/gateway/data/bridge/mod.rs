//! One subscription's bridge between its JetStream consumer and this gateway's local broker:
//! it pulls only as many messages as the local members have window for, injects each into the
//! local subscription (named by its stream sequence, carrying JetStream's delivery count as
//! its attempt), and turns what the local core decides into JetStream acks: an ack releases the
//! message, a drop (max attempts, overflow) terminates it, and what the gateway still holds
//! when its last local member leaves (the local subscription expires at once in cluster mode)
//! is given back with a nak, so another gateway's members get it.
//!
//! The local core learns nothing new: it sees members, windows, a queue and acks as always.
//! What it decides reaches the bridge through the broker's observer seam
//! ([`Router`](crate::cluster::gateway::data::router::Router)), as [`Event`]s.

mod decode;
mod inject;
mod lease;
mod vacate;

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, atomic::AtomicBool},
    time::Duration,
};

use tokio::sync::{Notify, mpsc};
use tokio_stream::StreamExt;

use decode::decode;

use crate::cluster::gateway::{
    Shared,
    data::acks::{CONFIRM_ON_STOP, Confirming, MAX_CONFIRMING},
    data::ahead::{Ahead, READ_AHEAD},
};
use crate::cluster::jetstream::{AckReply, Answer, Consumer, Delivery};
use crate::core::planted::{PlantedBug, active as planted};
use crate::core::{AckMode, Draft, Envelope, ErrorKind, MemberId, Mode, SubscriptionSpec};

/// How long one pull request waits for messages. A request asks for the room the members had
/// when it was sent; room that frees up meanwhile is asked for by the next request, at the
/// latest this long after (only while no message arrives: one that does ends a full request).
const PULL_EXPIRES: Duration = Duration::from_secs(1);
/// A singleton's pulls: when its active member leaves, the gateway waits for the open pull
/// to end before giving back what it holds, so this bounds that part of a clean close's
/// promotion, at the cost of about 1/this pull requests per second while the active member
/// idles.
const SINGLETON_PULL_EXPIRES: Duration = Duration::from_millis(15);
/// How many times a singleton's pull wait doubles while its pulls bring nothing: up to
/// 15 ms × 2^4 = 240 ms, about 4 pull requests a second for a leader with nothing to read
/// instead of 66, so a gateway leading a thousand idle elections asks JetStream 4,000 times a
/// second, not 66,000. The cost: when an idle leader closes its stream or steps down, its
/// gateway waits for the open pull, up to 240 ms, before the next member is promoted (docs/cluster.md#subscriptions-and-consumers).
/// Any message brought sets it back to 15 ms.
pub(in crate::cluster::gateway) const SINGLETON_IDLE_DOUBLINGS: u32 = 4;
/// How long one pull request of a bridge that reads ahead waits for messages: when told to
/// stop, such a bridge lets its open pull run out (what it brings is given back), rather than
/// leave what JetStream sends it in transit until the ack wait. About 1/this pull requests per
/// second while the subscription idles.
const AHEAD_PULL_EXPIRES: Duration = Duration::from_millis(200);
/// A singleton's pull wait after `idle` pulls in a row that brought nothing.
fn idle_pull_expires(base: Duration, idle: u32) -> Duration {
    base * 2u32.pow(idle.min(SINGLETON_IDLE_DOUBLINGS))
}

/// Pause after a failed pull (NATS unreachable, consumer gone) before the next.
const RETRY: Duration = Duration::from_millis(500);
/// How long JetStream waits before redelivering a message whose dead letter it did not store.
const DEAD_LETTER_RETRY: Duration = Duration::from_secs(1);
/// How long a nak that hands a singleton's messages on may wait for JetStream's confirmation.
const NAK_CONFIRM: Duration = Duration::from_secs(2);

/// What the local core decided about a message the bridge holds, or that the subscription is
/// gone from this gateway.
#[derive(Debug)]
pub(in crate::cluster::gateway) enum Event {
    /// Acked by its holder (or, ack-free, written to its stream).
    Acked(u64),
    /// Dropped by the core (max attempts, overflow): JetStream must not redeliver it.
    Dropped(u64),
    /// It reached `max_delivery_attempts` and the subscription has a dead-letter topic:
    /// publish this draft to JetStream, then terminate the message.
    DeadLettered(u64, Draft),
    /// A member of an arbitrated singleton left this gateway (its stream closed, or the
    /// cluster ended it): when no active member remains here, what the gateway holds goes back
    /// to JetStream before the coordinator hears of it, so the next active member, on any
    /// gateway, gets it first.
    Left(MemberId),
    /// The active member of an arbitrated singleton, stepping down, holds nothing
    /// (docs/semantics.md#cluster-priority-and-hand-over): what the gateway holds goes back
    /// to JetStream, as when it leaves, before the coordinator moves the line past it.
    Yielded(MemberId),
    /// The local subscription expired (its last member left) or the gateway stops: give back
    /// everything held and stop.
    Stop,
}

/// An arbitrated singleton's hand-backs, collected by the router as the broker makes them
/// (under the subscription's lock, also when the subscription expires with its last member) and
/// taken by the bridge when it gives back what it holds: by stream sequence, the attempt each
/// one's next delivery carries (the higher one if it was handed back twice).
pub(in crate::cluster::gateway) type HandedBack = Arc<Mutex<BTreeMap<u64, u32>>>;

/// The bridge's end of its link with the router ([`Router::attach`](crate::cluster::gateway::data::router::Router::attach)).
pub(in crate::cluster::gateway) struct Wiring {
    /// What the local core decided, as the router saw it.
    pub(in crate::cluster::gateway) events: mpsc::UnboundedReceiver<Event>,
    /// A member joined, or its window opened.
    pub(in crate::cluster::gateway) wake: Arc<Notify>,
    /// Whether the local subscription this bridge was started for still exists (see `Link`).
    pub(in crate::cluster::gateway) live: Arc<AtomicBool>,
    /// What the local subscription handed back, collected by the router.
    pub(in crate::cluster::gateway) handed_back: HandedBack,
}

/// What a bridge does by its subscription's mode, with the state only that mode has.
enum Kind {
    /// SINGLETON, arbitrated here: its pulls run to their end (their wait doubling while they
    /// bring nothing), a vacating member's messages go back before the coordinator hears of it,
    /// and what it holds is answered only under the lease incarnation it was pulled under.
    Singleton {
        /// The coordinator incarnation whose lease its held messages were pulled under
        /// ([`Bridge::leased`]).
        incarnation: Option<u64>,
        /// Pulls in a row that brought nothing: each doubles the next one's wait, up to
        /// [`SINGLETON_IDLE_DOUBLINGS`] times.
        idle_pulls: u32,
        /// Members that left while a pull was open, for [`Bridge::vacate`].
        leaving: Vec<MemberId>,
        /// Members whose step-down settled while a pull was open, for [`Bridge::vacate`].
        yielding: Vec<MemberId>,
    },
    /// QUEUE or BROADCAST: a message pulled under no lease or another incarnation is given
    /// back, and the consumer checked before the next pull ([`Bridge::verify_consumer`]).
    Shared {
        /// The lease incarnation under which this bridge last made sure its consumer is the
        /// one its members joined.
        verified: Option<u64>,
        /// Set when a pulled message was given back for that: the next pull first checks.
        await_lease: bool,
        /// The check found the consumer deleted (or made again): nothing is handed over any
        /// more.
        consumer_gone: bool,
        /// Messages the open pull brought before that check, given back once it ends: naked at
        /// once, each would come straight back to the same pull, JetStream counting one more
        /// delivery each time, so a message no member saw could reach its last attempt.
        /// Bounded by the pull's size.
        unchecked: Vec<AckReply>,
    },
}

/// One subscription's bridge task.
pub(in crate::cluster::gateway) struct Bridge {
    shared: Arc<Shared>,
    subscription: Arc<str>,
    consumer: Box<dyn Consumer>,
    kind: Kind,
    /// Whether JetStream expects acks (false for an ack-free QUEUE or BROADCAST subscription:
    /// its consumer is `AckNone`, and a message is done once delivered to the gateway; an
    /// ack-free singleton's is acked once written to its member's stream).
    explicit: bool,
    /// How often held messages get progress acks: a third of the consumer's ack wait.
    progress_every: Duration,
    /// How long an ack (or term) is sent again until JetStream confirms it: `--nats-ack-wait`,
    /// also for a singleton, whose consumer's ack wait is shorter (half the lease) but whose
    /// consumer's next leader may take longer to elect (docs/semantics.md#cluster-ack-final).
    ack_patience: Duration,
    events: mpsc::UnboundedReceiver<Event>,
    wake: Arc<Notify>,
    /// Whether the local subscription this bridge was started for still exists (see `Link`).
    live: Arc<AtomicBool>,
    /// Messages injected and not yet settled, by stream sequence: their ack subjects.
    held: BTreeMap<u64, AckReply>,
    /// Acks and terms sent and not yet confirmed by JetStream.
    confirming: Confirming,
    /// Held messages the local subscription refused (they came in an open pull after the
    /// active member here left), with the attempt they came with: no member got them, so
    /// that is the attempt their next delivery carries ([`Bridge::vacate`]).
    refused: BTreeMap<u64, u32>,
    /// How long one pull request waits for messages (short for singletons: a leaving active
    /// member's gateway waits for its open pull to end before giving back, see `vacate`).
    pull_expires: Duration,
    /// What the local subscription handed back, collected by the router: taken when no active
    /// member remains here, to name it in the promotion that follows ([`Bridge::vacate`]).
    /// Collected as the broker hands back rather than read from it then, because a singleton
    /// whose last member here left expires at once, and with it what it queued, often before
    /// its open pull ended.
    handed_back: HandedBack,
    /// The subscription's patterns when its consumer's filters cover more than they match
    /// (`names::filters`: overlapping patterns): a message matching none is acked unseen.
    only: Option<Vec<crate::core::Pattern>>,
    /// Messages pulled beyond the members' room ([`Ahead`]; off for singletons, ack-free
    /// subscriptions and those with max delivery attempts).
    ahead: Ahead,
    /// The envelope of the last message decoded that had no headers: the next one to the same
    /// topic shares it (its topic neither checked nor copied again).
    last_envelope: Option<Envelope>,
}

/// Whether a subscription's bridge reads ahead of its members' windows
/// (docs/cluster-internals.md#read-ahead): acked QUEUE and BROADCAST subscriptions without
/// `max_delivery_attempts`.
fn reads_ahead(spec: &SubscriptionSpec) -> bool {
    spec.mode != Mode::Singleton
        && spec.ack_mode == AckMode::Explicit
        && spec.max_delivery_attempts == 0
}

impl Bridge {
    /// The bridge of `subscription` (of settings `spec`) over `consumer`, whose ack wait is
    /// `ack_wait`; an ack or term is sent again for up to `ack_patience`. `only` is set when
    /// the consumer's filters cover more than the subscription's patterns match.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::cluster::gateway) fn new(
        shared: Arc<Shared>,
        subscription: Arc<str>,
        consumer: Box<dyn Consumer>,
        spec: &SubscriptionSpec,
        wiring: Wiring,
        ack_wait: Duration,
        ack_patience: Duration,
        only: Option<Vec<crate::core::Pattern>>,
    ) -> Self {
        let kind = if spec.mode == Mode::Singleton {
            Kind::Singleton {
                incarnation: None,
                idle_pulls: 0,
                leaving: Vec::new(),
                yielding: Vec::new(),
            }
        } else {
            Kind::Shared {
                // Its join just found (or made) this consumer, under the lease held now.
                verified: shared.singletons.lease().valid(),
                await_lease: false,
                consumer_gone: false,
                unchecked: Vec::new(),
            }
        };
        let pull_expires = if spec.mode == Mode::Singleton {
            SINGLETON_PULL_EXPIRES
        } else if reads_ahead(spec) {
            AHEAD_PULL_EXPIRES
        } else {
            PULL_EXPIRES
        };
        let Wiring {
            events,
            wake,
            live,
            handed_back,
        } = wiring;
        Self {
            shared,
            subscription,
            consumer,
            kind,
            explicit: crate::cluster::gateway::data::acks::acked_upstream(spec),
            progress_every: ack_wait / 3,
            ack_patience,
            events,
            wake,
            live,
            held: BTreeMap::new(),
            confirming: Confirming::default(),
            refused: BTreeMap::new(),
            pull_expires,
            handed_back,
            only,
            ahead: Ahead::new(if reads_ahead(spec) { READ_AHEAD } else { 0 }),
            last_envelope: None,
        }
    }

    /// Whether the subscription is a singleton (arbitrated here).
    fn singleton(&self) -> bool {
        matches!(self.kind, Kind::Singleton { .. })
    }
}

/// Sleeps for `pause`, or forever.
async fn pause(pause: Option<Duration>) {
    match pause {
        Some(pause) => tokio::time::sleep(pause).await,
        None => std::future::pending().await,
    }
}

enum Flow {
    Go,
    Stop,
    /// A singleton member left, or settled its step-down: once no pull is open,
    /// [`Bridge::vacate`].
    Vacated(Vacating),
}

/// Why a singleton member vacates its place here.
#[derive(Debug, Clone, Copy)]
enum Vacating {
    Left(MemberId),
    Yielded(MemberId),
}

impl Bridge {
    /// Runs until told to stop (the local subscription expired, or the gateway stops), then
    /// gives back (naks) what it still holds.
    pub(in crate::cluster::gateway) async fn run(mut self) {
        tracing::debug!(subscription = %self.subscription, consumer = %self.consumer.name(), "bridge started");
        // Ack-pending messages are kept alive while the gateway holds them: JetStream would
        // otherwise redeliver them elsewhere after `ack_wait`, while a member still works on them.
        let mut progress = tokio::time::interval(self.progress_every);
        progress.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        'pulling: loop {
            // No local subscription (yet, or any more): wait for a join to wake this bridge.
            // A bridge stops only when told (its link is removed in the same step), so a
            // join always finds a live bridge or starts one.
            // Also when no message comes (a deleted consumer's pulls fail): any lease lapse
            // since the last check is checked for before the next pull.
            let awaited = match &mut self.kind {
                Kind::Shared { await_lease, .. } => std::mem::take(await_lease),
                Kind::Singleton { .. } => false,
            };
            if awaited || self.lapsed_since_verified() {
                self.verify_consumer().await;
            }
            // Still unchecked (no lease yet, or JetStream did not say): no pull, which would
            // bring messages only to give them back, JetStream counting each delivery; the
            // check is made again after a pause.
            let unchecked =
                self.lapsed_since_verified() && !planted(PlantedBug::GiveBackIntoOpenPull);
            let (recount, want) = if unchecked {
                (Some(RETRY), 0)
            } else {
                let recount = self.count_owed().await;
                self.drain_ahead().await;
                let room = self.shared.broker.room(&self.subscription).unwrap_or(0);
                (recount, self.ahead.want(room))
            };
            if want == 0 {
                tokio::select! {
                    () = pause(recount) => {}
                    event = self.events.recv() => match self.handle(event).await {
                        Flow::Stop => break,
                        Flow::Vacated(why) => {
                            self.note(why);
                            self.vacate().await;
                        }
                        Flow::Go => {}
                    },
                    () = self.wake.notified() => {}
                    _ = progress.tick() => self.progress().await,
                }
                continue;
            }
            let batch = self
                .consumer
                .pull(
                    want.min(u64::from(u32::MAX)) as usize,
                    self.next_pull_expires(),
                )
                .await;
            let mut batch = match batch {
                Ok(batch) => batch,
                Err(error) => {
                    tracing::warn!(subscription = %self.subscription, %error, "pull from JetStream failed; retrying");
                    let retry = tokio::time::sleep(RETRY);
                    tokio::pin!(retry);
                    loop {
                        tokio::select! {
                            event = self.events.recv() => match self.handle(event).await {
                                Flow::Stop => break 'pulling,
                                Flow::Vacated(why) => {
                                    self.note(why);
                                    self.vacate().await;
                                }
                                Flow::Go => {}
                            },
                            _ = progress.tick() => self.progress().await,
                            () = &mut retry => continue 'pulling,
                        }
                    }
                }
            };
            // The open pull cannot be cancelled: what JetStream already sent it would be lost in
            // transit until its ack wait, and arrive after newer messages. So a singleton's pull
            // runs to its end (at most 15 ms). What it brings once the subscription has no
            // active member here, or is gone, is held, and given back in order after it. So
            // does a bridge that reads ahead (at most 200 ms).
            let mut stopping = false;
            let mut brought = false;
            loop {
                tokio::select! {
                    message = batch.next() => match message {
                        Some(Ok(message)) => {
                            brought = true;
                            self.arrive(message, stopping).await;
                        }
                        Some(Err(error)) => {
                            tracing::warn!(subscription = %self.subscription, %error, "JetStream ended a pull");
                            break;
                        }
                        None => break,
                    },
                    event = self.events.recv(), if !stopping => match self.handle(event).await {
                        // A singleton's pull runs out within 15 ms, and its order matters. A QUEUE
                        // or BROADCAST pull could run a second more and bring up to its whole
                        // room, which would then go back with an attempt no member saw: it is
                        // dropped, and only what was in transit comes back late (ack wait).
                        Flow::Stop if self.singleton() || self.ahead.on() => stopping = true,
                        Flow::Stop => break 'pulling,
                        Flow::Vacated(why) => self.note(why),
                        // An ack may have made room for what was read ahead.
                        Flow::Go => self.drain_ahead().await,
                    },
                    // A member joined (or its window opened): room for what waits.
                    () = self.wake.notified(), if self.ahead.on() && !stopping => {
                        self.drain_ahead().await;
                    }
                    _ = progress.tick() => self.progress().await,
                }
            }
            let vacating = match &mut self.kind {
                Kind::Singleton {
                    idle_pulls,
                    leaving,
                    yielding,
                    ..
                } => {
                    *idle_pulls = if brought {
                        0
                    } else {
                        idle_pulls.saturating_add(1)
                    };
                    !leaving.is_empty() || !yielding.is_empty()
                }
                Kind::Shared { .. } => false,
            };
            if vacating {
                self.vacate().await;
            }
            self.give_back_unchecked().await;
            if stopping {
                break;
            }
        }
        self.give_back().await;
    }

    /// Gives back what the pull that just ended brought while the consumer was unchecked.
    async fn give_back_unchecked(&mut self) {
        let Kind::Shared { unchecked, .. } = &mut self.kind else {
            return;
        };
        for reply in std::mem::take(unchecked) {
            self.reply(reply, Answer::Nak(None)).await;
        }
    }

    /// How long the next pull waits for messages: a singleton's doubles with each pull in a
    /// row that brought nothing, up to [`SINGLETON_IDLE_DOUBLINGS`] times.
    fn next_pull_expires(&self) -> Duration {
        match self.kind {
            Kind::Singleton { idle_pulls, .. } => idle_pull_expires(self.pull_expires, idle_pulls),
            Kind::Shared { .. } => self.pull_expires,
        }
    }

    async fn handle(&mut self, event: Option<Event>) -> Flow {
        let (sequence, kind) = match event {
            Some(Event::Acked(sequence)) => (sequence, Answer::Ack),
            Some(Event::Dropped(sequence)) => (sequence, Answer::Term),
            Some(Event::Left(member)) => return Flow::Vacated(Vacating::Left(member)),
            Some(Event::Yielded(member)) => return Flow::Vacated(Vacating::Yielded(member)),
            Some(Event::DeadLettered(sequence, draft)) => {
                self.dead_letter(sequence, draft).await;
                return Flow::Go;
            }
            Some(Event::Stop) | None => return Flow::Stop,
        };
        if let Some(reply) = self.held.remove(&sequence) {
            self.settle(sequence, reply, kind).await;
        }
        Flow::Go
    }

    /// Sends an ack or a term to JetStream and has it confirmed ([`Confirming`]).
    fn confirm(&mut self, sequence: u64, reply: AckReply, kind: Answer) {
        self.confirming.reap();
        let entry = self
            .confirming
            .sequences
            .entry(sequence)
            .or_insert((kind, 0));
        entry.0 = kind;
        entry.1 += 1;
        let confirmation = crate::cluster::gateway::data::acks::confirm(
            self.shared.clone(),
            self.subscription.clone(),
            reply,
            kind,
            sequence,
            self.ack_patience,
            self.lease_gate(),
        );
        self.confirming.tasks.spawn(confirmation);
    }

    /// Tells JetStream how a held message was settled: an ack or a term confirmed, anything
    /// else sent as it is.
    async fn settle(&mut self, sequence: u64, reply: AckReply, kind: Answer) {
        self.confirming.reap();
        // An ack or a term while the lease is lapsed waits for its renewal in its confirmation
        // task (docs/semantics.md#cluster-lease-lapse); anything else is not sent.
        let waits = matches!(kind, Answer::Ack | Answer::Term) && self.lapsed_in_incarnation();
        if !self.leased() && !waits {
            tracing::debug!(subscription = %self.subscription, sequence, ?kind, "past this gateway's lease: nothing sent to JetStream, which redelivers");
            return;
        }
        match kind {
            Answer::Ack | Answer::Term if self.confirming.sequences.len() < MAX_CONFIRMING => {
                self.confirm(sequence, reply, kind);
            }
            Answer::Ack | Answer::Term => {
                self.shared.broker.count_unconfirmed_ack();
                tracing::warn!(subscription = %self.subscription, sequence, "{MAX_CONFIRMING} acks wait for JetStream's confirmation: sent this one unconfirmed");
                self.reply(reply, kind).await;
            }
            _ => self.reply(reply, kind).await,
        }
    }

    /// Publishes a dead letter to JetStream, then terminates its message: a dead letter is
    /// stored before the message it replaces is let go. One refused because the stream is full
    /// is dropped (counted in `rejected_publishes`), as the embedded broker drops a dead letter
    /// that finds no room. One JetStream did not answer is given back after a pause instead,
    /// so the message comes again and, past its attempts, is dead-lettered again when given
    /// back: late, never lost.
    async fn dead_letter(&mut self, sequence: u64, draft: Draft) {
        let topic = draft.topic().clone();
        let kind = match crate::cluster::gateway::data::publish::publish_dead_letter(
            &self.shared,
            draft,
            &self.subscription,
            sequence,
        )
        .await
        {
            Ok(published) => {
                tracing::warn!(subscription = %self.subscription, sequence, dead_letter_topic = %topic, dead_letter = published.system_id, "message reached max_delivery_attempts; dead-lettered it to JetStream");
                Answer::Term
            }
            Err(error) if error.kind() != ErrorKind::Unavailable => {
                tracing::warn!(subscription = %self.subscription, sequence, dead_letter_topic = %topic, %error, "JetStream refused a dead letter; dropping it");
                Answer::Term
            }
            Err(error) => {
                tracing::warn!(subscription = %self.subscription, sequence, dead_letter_topic = %topic, %error, "JetStream did not store a dead letter; giving its message back to come again");
                Answer::Nak(Some(DEAD_LETTER_RETRY))
            }
        };
        if let Some(reply) = self.held.remove(&sequence) {
            self.settle(sequence, reply, kind).await;
        }
    }

    async fn reply(&self, reply: AckReply, kind: Answer) {
        if !self.leased() {
            tracing::debug!(subscription = %self.subscription, ?kind, "past this gateway's lease: nothing sent to JetStream, which redelivers");
            return;
        }
        if let Err(error) = self.shared.jetstream.answer(&reply, kind).await {
            // JetStream redelivers after `ack_wait`: late, never lost.
            tracing::warn!(subscription = %self.subscription, %error, "could not send an ack to JetStream");
        }
    }

    async fn progress(&self) {
        let waiting = self.ahead.waiting().filter_map(Delivery::reply);
        let unchecked = match &self.kind {
            Kind::Shared { unchecked, .. } => unchecked.as_slice(),
            Kind::Singleton { .. } => &[],
        };
        for reply in self.held.values().chain(waiting).chain(unchecked) {
            self.reply(reply.clone(), Answer::Progress).await;
        }
    }

    /// Gives back every message still held, so JetStream redelivers it (to any gateway) at once.
    async fn give_back(&mut self) {
        let held = std::mem::take(&mut self.held);
        self.refused.clear();
        let ahead = self.ahead.take();
        let count = held.len() + ahead.len();
        // In stream order: what members held, then what was read ahead.
        let replies = held
            .into_values()
            .chain(ahead.into_iter().filter_map(Delivery::into_reply));
        for reply in replies {
            self.reply(reply, Answer::Nak(None)).await;
        }
        // Then what came while the consumer was unchecked.
        self.give_back_unchecked().await;
        if let Err(error) = self.shared.jetstream.flush().await {
            tracing::warn!(subscription = %self.subscription, %error, "could not flush the naks");
        }
        // Acks still being confirmed go on by themselves past this bridge (a gateway stopping
        // waits for them a moment here).
        let mut confirming = std::mem::take(&mut self.confirming.tasks);
        let _ = tokio::time::timeout(CONFIRM_ON_STOP, async {
            while confirming.join_next().await.is_some() {}
        })
        .await;
        confirming.detach_all();
        tracing::debug!(subscription = %self.subscription, given_back = count, "bridge stopped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_singletons_pull_wait_doubles_up_to_its_bound() {
        let waits: Vec<u128> = (0..8)
            .map(|idle| idle_pull_expires(SINGLETON_PULL_EXPIRES, idle).as_millis())
            .collect();
        assert_eq!(waits, [15, 30, 60, 120, 240, 240, 240, 240]);
        assert_eq!(
            idle_pull_expires(SINGLETON_PULL_EXPIRES, u32::MAX).as_millis(),
            240
        );
    }
}
