//! A member's side of the shell: the frames it receives, the outlet that holds them until its
//! stream writes them, and the guard that turns "its stream was dropped" into the core's `leave`.
//!
//! The outlet lives under the subscription's lock, beside the core. That is what keeps the two
//! in agreement by construction: every message frame in an outlet is in flight to that member in
//! the core, and an ack or nack for a message whose frame is still in the outlet is refused (the
//! client cannot have seen it). So an outlet never holds more message frames than the member's
//! window, plus at most one confirmation, one standby notice and one end frame, and nothing a
//! client does can make it grow or make the core's record and the stream disagree.

use std::{
    collections::{BTreeMap, VecDeque},
    ops::{Deref, DerefMut},
    pin::Pin,
    sync::{Arc, OnceLock},
    task::{Context, Poll, Waker},
};

use super::{Broker, DeadLetters, SubCell};
use crate::{
    core::{
        AckMode, Draft, DropReason, Effect, Epoch, Error, MemberId, Message, Settlement,
        Subscription, SystemId,
    },
    sync::{MutexGuard, lock, try_lock},
};

/// Identifies one client connection (one HTTP/2 connection) for the life of the server.
pub type ConnectionId = u64;

/// One frame on a member's stream, in domain terms (the service turns it into protobuf).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outbound {
    /// This member is now active.
    Confirm {
        /// The subscription joined.
        subscription_id: Arc<str>,
        /// This member.
        member_id: MemberId,
        /// Its fencing token.
        epoch: Epoch,
    },
    /// This singleton member is on standby at `position` (1 = next).
    Standby {
        /// The subscription joined.
        subscription_id: Arc<str>,
        /// This member.
        member_id: MemberId,
        /// Place in line.
        position: u32,
        /// The epoch it held when it was active until now and stepped down
        /// (docs/semantics.md#hand-over); 0 otherwise.
        stepped_down_epoch: Epoch,
    },
    /// A delivered message.
    Message {
        /// The message.
        message: Message,
        /// 1 on first delivery.
        attempt: u32,
        /// The member's epoch.
        epoch: Epoch,
        /// Shared with the other frames that deliver this message at its publish, when there
        /// are others: what they have in common is encoded once.
        shared: Option<SharedEncoding>,
    },
    /// The broker ends the stream with this error (e.g. shutting down).
    End(Error),
}

/// Where the frames that deliver one message to several subscriptions at its publish keep its
/// encoding: the first stream to write the message fills it, the others copy it. The service
/// decides what goes in: what every delivery has in common, but not the payload (and nothing
/// for a large envelope), so a frame waiting in a slow member's outlet holds no second copy of
/// either outside the memory budget.
#[derive(Clone, Default)]
pub struct SharedEncoding(Arc<OnceLock<Box<[u8]>>>);

impl SharedEncoding {
    /// The encoding, made by `encode` if no frame made it yet.
    pub fn get_or_init(&self, encode: impl FnOnce() -> Box<[u8]>) -> &[u8] {
        self.0.get_or_init(encode)
    }

    /// The encoding, once a frame made it.
    pub fn get(&self) -> Option<&[u8]> {
        self.0.get().map(|bytes| &bytes[..])
    }
}

impl std::fmt::Debug for SharedEncoding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("SharedEncoding")
            .field(&self.get().map(<[u8]>::len))
            .finish()
    }
}

/// A cache, not content: two frames delivering the same message are equal whether or not
/// they share its encoding.
impl PartialEq for SharedEncoding {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for SharedEncoding {}

/// The ids of the message frames a member's stream has not written, as one `Settle` sees them:
/// a sorted run and a short unsorted tail of frames its own acks and nacks delivered.
#[derive(Debug, Default)]
struct UnsentIds {
    ids: Vec<SystemId>,
    /// `ids[..sorted]` is sorted.
    sorted: usize,
    /// Outlet frames already looked at.
    seen: usize,
}

impl UnsentIds {
    /// Longest unsorted tail before it is sorted in.
    const TAIL: usize = 16;
    /// Largest buffer a subscription keeps between settles: 1 KiB, inside the fixed
    /// `SUBSCRIPTION_OVERHEAD` the memory budget counts for it.
    const KEPT: usize = 128;

    fn contains(&self, id: SystemId) -> bool {
        self.ids[..self.sorted].binary_search(&id).is_ok() || self.ids[self.sorted..].contains(&id)
    }
}

/// Most frames an ack-free member's stream takes from its outlet at once: what it has taken
/// counts as written, so it is what a stalled reader may still get beyond what the transport
/// holds, ahead of the newest messages (docs/semantics.md#ack-free).
pub const ACK_FREE_TAKE: usize = 16;

/// Most payload bytes an ack-free member's stream takes at once (a larger frame goes alone).
pub const ACK_FREE_TAKE_BYTES: usize = 64 * 1024;

/// Frames waiting for one member's stream to take them.
#[derive(Debug, Default)]
struct Outlet {
    frames: VecDeque<Outbound>,
    /// The stream's task, parked until a frame arrives.
    waker: Option<Waker>,
    /// The connection the member's stream runs on: the fence for acks that name no member.
    connection: Option<ConnectionId>,
    /// The broker ended the stream: an `End` frame is (or was) the last frame.
    ended: bool,
    /// SINGLETON: the member's metadata (docs/semantics.md#member-metadata), empty if none.
    metadata: Arc<str>,
    /// When it joined, in milliseconds since the Unix epoch by the broker's clock.
    joined_ms: u64,
}

/// A subscription's core state plus its members' outlets, under one lock, so effects reach the
/// streams in the order the core produced them.
#[derive(Debug)]
pub(crate) struct SubState {
    pub(crate) key: u64,
    pub(crate) core: Subscription,
    outlets: BTreeMap<MemberId, Outlet>,
    /// Streams to wake once the lock is released (waking under it would lengthen every
    /// critical section by a scheduler call).
    wake: Vec<Waker>,
    /// The footprint last added to the broker's general memory pool.
    pub(crate) accounted: u64,
    /// The footprint last added to its drop-oldest pool (a drop-oldest subscription's messages).
    pub(crate) accounted_drop_oldest: u64,
    /// A multi-id settle's buffer of unwritten frame ids, kept between settles while it holds
    /// at most [`UnsentIds::KEPT`] ids.
    unsent_scratch: Vec<SystemId>,
    /// A publish's effects buffer, kept between publishes while it is small.
    effects: Vec<Effect>,
    /// Cluster mode: the attempt the next injection of these messages carries (set when
    /// the cluster activates a member here; at most `MAX_CARRY` entries, replaced each time).
    pub(crate) attempt_floors: BTreeMap<SystemId, u32>,
    /// Cluster mode: messages injected ahead of a carried one that has not come back yet
    /// (JetStream does not always redeliver given-back messages in the order they were given
    /// back), with their attempts; queued in id order once the carried ones before them came.
    /// Each with whether it was carried itself (it then waits beyond the window).
    pub(crate) held_back: BTreeMap<SystemId, (crate::core::Message, u32, bool)>,
    /// When `attempt_floors` (or `owed`) was last set (broker time): past
    /// [`HOLD_BACK_PATIENCE`] the carried messages still missing are not waited for.
    pub(crate) floors_since: std::time::Duration,
    /// Cluster mode, after taking over from a member whose gateway died: the redeliveries
    /// JetStream owes this subscription, which no carry names. Everything injected waits
    /// (in `held_back`) until they came.
    pub(crate) owed: Option<Owed>,
    /// A SINGLETON subscription's leadership, once someone watches it
    /// ([`Broker::watch_leadership`](super::Broker::watch_leadership)).
    pub(crate) leadership: Option<tokio::sync::watch::Sender<super::Leadership>>,
    /// A SINGLETON subscription's active member as its confirmations and leaves tell it, and
    /// since when (ms since the Unix epoch, by the broker's clock; 0 before any).
    pub(crate) leader: Option<crate::core::MemberId>,
    pub(crate) leader_since_ms: u64,
    /// The step-down in progress, as the shell follows it (docs/semantics.md#hand-over): its
    /// `seq`, and who waits for its outcome.
    pub(crate) step_down: Option<super::handover::Following>,
}

/// The redeliveries a gateway that took over from a dead one waits for ([`SubState::owed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owed {
    /// Not counted yet: nothing is pulled until the consumer's backlog is read.
    Uncounted,
    /// `remaining` more messages with ids up to `through` (the consumer's last delivered
    /// sequence when counted): every id above is a new message.
    Counted { remaining: u64, through: SystemId },
}

/// How long a promoted gateway holds back messages that arrive ahead of a carried one that has
/// not come back: above a singleton consumer's ack wait (half the gateway lease, 1.5 s by
/// default), after which JetStream redelivers a message whose give-back it did not apply.
pub(crate) const HOLD_BACK_PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);

/// A locked subscription. Dropping it releases the lock, then wakes the streams that got frames.
pub(crate) struct Locked<'a> {
    guard: Option<MutexGuard<'a, SubState>>,
}

impl<'a> Locked<'a> {
    pub(crate) fn new(cell: &'a SubCell) -> Self {
        Self {
            guard: Some(lock(cell)),
        }
    }

    /// The lock, if no one (this thread included) holds it: never waits, so it can be taken
    /// out of key order without risking a deadlock.
    pub(crate) fn try_new(cell: &'a SubCell) -> Option<Self> {
        Some(Self {
            guard: Some(try_lock(cell)?),
        })
    }
}

impl Deref for Locked<'_> {
    type Target = SubState;

    fn deref(&self) -> &SubState {
        self.guard.as_ref().expect("present until drop")
    }
}

impl DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut SubState {
        self.guard.as_mut().expect("present until drop")
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        let Some(mut guard) = self.guard.take() else {
            return;
        };
        // One stream to wake is the common case (a publish to a subscription with one member):
        // its waker is taken out and the buffer keeps its capacity for the next.
        if guard.wake.len() <= 1 {
            let waker = guard.wake.pop();
            drop(guard);
            if let Some(waker) = waker {
                waker.wake();
            }
            return;
        }
        let wake = std::mem::take(&mut guard.wake);
        drop(guard);
        for waker in wake {
            waker.wake();
        }
    }
}

impl SubState {
    pub(crate) fn new(key: u64, core: Subscription) -> Self {
        Self {
            key,
            core,
            outlets: BTreeMap::new(),
            wake: Vec::new(),
            accounted: 0,
            accounted_drop_oldest: 0,
            unsent_scratch: Vec::new(),
            effects: Vec::new(),
            attempt_floors: BTreeMap::new(),
            held_back: BTreeMap::new(),
            floors_since: std::time::Duration::ZERO,
            owed: None,
            leadership: None,
            leader: None,
            leader_since_ms: 0,
            step_down: None,
        }
    }

    /// Bytes of `held_back` (with the per-message overhead), part of `accounted`: they are in
    /// no core queue, so the core's footprint does not count them. (Empty outside cluster
    /// mode's hand-overs.)
    pub(crate) fn held_back_bytes(&self) -> u64 {
        self.held_back
            .values()
            .map(|(m, _, _)| m.size() as u64 + crate::core::subscription::MESSAGE_OVERHEAD)
            .sum()
    }

    /// Records a reservation from `pool` as part of this subscription's footprint.
    pub(crate) fn credit(&mut self, pool: super::Pool, bytes: u64) {
        match pool {
            super::Pool::General => self.accounted += bytes,
            super::Pool::DropOldest => self.accounted_drop_oldest += bytes,
        }
    }

    /// How many of `held_back` are not carried (or owed) themselves: those take window room.
    pub(crate) fn held_back_uncarried(&self) -> usize {
        self.held_back
            .values()
            .filter(|(_, _, carried)| !carried)
            .count()
    }

    /// The effects buffer kept from an earlier publish, empty.
    pub(crate) fn take_effects_buffer(&mut self) -> Vec<Effect> {
        std::mem::take(&mut self.effects)
    }

    /// Keeps an (emptied) effects buffer for the next publish, unless it grew past a few
    /// effects (a drop-oldest publish that dropped many): nothing large stays pinned.
    pub(crate) fn keep_effects_buffer(&mut self, buffer: Vec<Effect>) {
        const KEPT: usize = 8;
        debug_assert!(buffer.is_empty());
        if buffer.capacity() <= KEPT {
            self.effects = buffer;
        }
    }

    /// Opens the outlet of a member about to join, remembering its connection and metadata.
    pub(crate) fn attach(
        &mut self,
        member: MemberId,
        connection: Option<ConnectionId>,
        metadata: Arc<str>,
        joined_ms: u64,
    ) {
        self.outlets.insert(
            member,
            Outlet {
                connection,
                metadata,
                joined_ms,
                ..Outlet::default()
            },
        );
    }

    /// When each member joined (docs/operations.md#console).
    pub(crate) fn joined(&self) -> BTreeMap<MemberId, u64> {
        self.outlets
            .iter()
            .map(|(member, outlet)| (*member, outlet.joined_ms))
            .collect()
    }

    /// `member`'s metadata (empty for an unknown member).
    pub(crate) fn metadata_of(&self, member: MemberId) -> Arc<str> {
        self.outlets
            .get(&member)
            .map_or_else(|| Arc::from(""), |o| o.metadata.clone())
    }

    /// Replaces `member`'s metadata; false for an unknown member.
    pub(crate) fn set_metadata(&mut self, member: MemberId, metadata: Arc<str>) -> bool {
        match self.outlets.get_mut(&member) {
            Some(outlet) => {
                outlet.metadata = metadata;
                true
            }
            None => false,
        }
    }

    /// The members with metadata, and theirs.
    pub(crate) fn metadata(&self) -> std::collections::BTreeMap<MemberId, Arc<str>> {
        self.outlets
            .iter()
            .filter(|(_, o)| !o.metadata.is_empty())
            .map(|(m, o)| (*m, o.metadata.clone()))
            .collect()
    }

    pub(crate) fn detach(&mut self, member: MemberId) {
        self.outlets.remove(&member);
    }

    /// The connection `member`'s stream runs on.
    pub(crate) fn connection_of(&self, member: MemberId) -> Option<ConnectionId> {
        self.outlets.get(&member).and_then(|o| o.connection)
    }

    /// Whether `member`'s outlet still holds the frame of `system_id`, i.e. its stream has not
    /// written it yet. A scan of the outlet (at most the window plus three frames): for one id.
    pub(crate) fn unsent(&self, member: MemberId, system_id: SystemId) -> bool {
        self.outlets.get(&member).is_some_and(|o| {
            o.frames.iter().any(
                |f| matches!(f, Outbound::Message { message, .. } if message.system_id() == system_id),
            )
        })
    }

    /// Brings `unsent` up to date with the message frames put in `member`'s outlet since it
    /// last looked. Under the lock frames are only appended (the stream takes them under the
    /// same lock), so each frame is looked at once per settle.
    fn note_unsent(&self, member: MemberId, unsent: &mut UnsentIds) {
        let Some(outlet) = self.outlets.get(&member) else {
            return;
        };
        for frame in outlet.frames.iter().skip(unsent.seen) {
            if let Outbound::Message { message, .. } = frame {
                unsent.ids.push(message.system_id());
            }
        }
        unsent.seen = outlet.frames.len();
        // A short unsorted tail is scanned; a longer one is sorted in, so a settle of a whole
        // window stays O(log window) per id (amortised) without a set to allocate and rebalance.
        if unsent.ids.len() - unsent.sorted > UnsentIds::TAIL {
            unsent.ids.sort_unstable();
            unsent.sorted = unsent.ids.len();
        }
    }

    /// Ends every member's stream with `error`: frames not yet written are discarded (their
    /// messages stay in flight until the member leaves, then go back to the queue) and `error`
    /// becomes the last frame.
    pub(crate) fn end_all(&mut self, error: &Error) {
        for outlet in self.outlets.values_mut() {
            if outlet.ended {
                continue;
            }
            outlet.ended = true;
            outlet.frames.clear();
            outlet.frames.push_back(Outbound::End(error.clone()));
            if let Some(waker) = outlet.waker.take() {
                self.wake.push(waker);
            }
        }
    }

    /// Ends one member's stream with `error`: its waiting frames are dropped (the core takes
    /// back what they carried) and the end frame is its last.
    pub(crate) fn end_one(&mut self, member: MemberId, error: &Error) {
        let Some(outlet) = self.outlets.get_mut(&member) else {
            return;
        };
        if outlet.ended {
            return;
        }
        outlet.ended = true;
        outlet.frames.clear();
        outlet.frames.push_back(Outbound::End(error.clone()));
        if let Some(waker) = outlet.waker.take() {
            self.wake.push(waker);
        }
    }

    /// Whether `member`'s stream was ended (or it left).
    pub(crate) fn ended(&self, member: MemberId) -> bool {
        self.outlets.get(&member).is_none_or(|outlet| outlet.ended)
    }

    /// Moves every frame waiting for `member` into `buf` (which the caller has emptied), or, when
    /// there is none, parks `waker` to be woken by the next one. Returns false once the stream
    /// is over: the member was detached, or its end frame was already taken.
    fn take(
        &mut self,
        member: MemberId,
        buf: &mut VecDeque<Outbound>,
        waker: Option<&Waker>,
    ) -> bool {
        let Some(outlet) = self.outlets.get_mut(&member) else {
            return false;
        };
        if outlet.frames.is_empty() {
            if outlet.ended {
                return false;
            }
            if let Some(waker) = waker
                && !outlet.waker.as_ref().is_some_and(|w| w.will_wake(waker))
            {
                outlet.waker = Some(waker.clone());
            }
            return true;
        }
        if self.core.spec().ack_mode != AckMode::None {
            std::mem::swap(buf, &mut outlet.frames);
            return true;
        }
        // Ack-free: a frame taken counts as written and is out of drop-oldest's reach, so a
        // stream takes a few at a time (and at most about 64 KiB of them, or one larger one),
        // not its whole window: a reader that stalls keeps no more than these beyond what the
        // transport holds (docs/semantics.md#ack-free).
        let mut bytes = 0;
        while buf.len() < ACK_FREE_TAKE && bytes < ACK_FREE_TAKE_BYTES {
            let Some(frame) = outlet.frames.pop_front() else {
                break;
            };
            if let Outbound::Message { message, .. } = &frame {
                bytes += message.size();
            }
            buf.push_back(frame);
        }
        true
    }

    /// Carries out the core's effects in order. Dead letters are collected for publishing once
    /// this subscription's lock is released. A delivery of the message `shared` names gets its
    /// shared encoding.
    pub(crate) fn apply(
        &mut self,
        effects: &mut Vec<Effect>,
        dead: &mut DeadLetters,
        shared: Option<(SystemId, &SharedEncoding)>,
    ) {
        for effect in effects.drain(..) {
            match effect {
                Effect::Confirm { member, epoch } => {
                    let subscription_id = self.core.id().clone();
                    self.send(
                        member,
                        Outbound::Confirm {
                            subscription_id,
                            member_id: member,
                            epoch,
                        },
                    );
                }
                Effect::Standby { member, position } => self.send_standby(member, position, 0),
                Effect::SteppedDown {
                    member,
                    epoch,
                    position,
                } => {
                    tracing::info!(subscription = %self.core.id(), member, epoch, "active member stepped down");
                    self.send_standby(member, position, epoch);
                }
                Effect::SteppingDown { member, cause, .. } => {
                    tracing::info!(subscription = %self.core.id(), member, ?cause, "active member stepping down");
                }
                Effect::Deliver {
                    member,
                    message,
                    attempt,
                    epoch,
                } => {
                    let shared = shared
                        .filter(|(id, _)| *id == message.system_id())
                        .map(|(_, encoding)| encoding.clone());
                    self.send(
                        member,
                        Outbound::Message {
                            message,
                            attempt,
                            epoch,
                            shared,
                        },
                    );
                }
                Effect::DeadLetter { message, attempts } => {
                    if let Some(topic) = self.core.spec().dead_letter_topic.clone() {
                        tracing::warn!(
                            subscription = %self.core.id(),
                            system_id = message.system_id(),
                            attempts,
                            dead_letter_topic = %topic,
                            "message reached max_delivery_attempts; dead-lettering it"
                        );
                        dead.push((
                            self.key,
                            Draft::dead_letter(&message, self.core.id(), topic, attempts),
                        ));
                    }
                }
                Effect::Withdraw { member, system_id } => self.withdraw(member, system_id),
                Effect::Dropped { system_id, reason } => match reason {
                    DropReason::MaxDeliveryAttempts => tracing::warn!(
                        subscription = %self.core.id(),
                        system_id,
                        "message dropped: max_delivery_attempts reached, no dead_letter_topic"
                    ),
                    DropReason::QueueFull => tracing::warn!(
                        subscription = %self.core.id(),
                        system_id,
                        "dead letter dropped: its queue or the memory budget is full"
                    ),
                    // A slow consumer drops on every publish: warn on the 1st, 2nd, 4th, 8th… drop
                    // of this subscription; `dropped_overflow` counts every one.
                    DropReason::Overflow => {
                        let dropped = self.core.counters().dropped_overflow;
                        if dropped.is_power_of_two() {
                            tracing::warn!(
                                subscription = %self.core.id(),
                                system_id,
                                dropped,
                                "queue full: dropping the oldest messages (overflow policy drop_oldest; a slow or absent consumer)"
                            );
                        }
                    }
                },
            }
        }
    }

    /// A standby notice to `member`: at `position`, after stepping down from
    /// `stepped_down_epoch` (0 when it was not active).
    fn send_standby(&mut self, member: MemberId, position: u32, stepped_down_epoch: Epoch) {
        let subscription_id = self.core.id().clone();
        self.send(
            member,
            Outbound::Standby {
                subscription_id,
                member_id: member,
                position,
                stepped_down_epoch,
            },
        );
    }

    /// Takes the frame of `system_id` out of `member`'s outlet (the core dropped it before the
    /// stream wrote it). It is the outlet's oldest message frame, so the scan is short.
    fn withdraw(&mut self, member: MemberId, system_id: SystemId) {
        let Some(outlet) = self.outlets.get_mut(&member) else {
            return;
        };
        let at = outlet.frames.iter().position(
            |f| matches!(f, Outbound::Message { message, .. } if message.system_id() == system_id),
        );
        if let Some(at) = at {
            outlet.frames.remove(at);
        }
    }

    fn send(&mut self, member: MemberId, frame: Outbound) {
        // A member without an outlet has left; its `leave` requeues what it held.
        let Some(outlet) = self.outlets.get_mut(&member) else {
            return;
        };
        if outlet.ended {
            return;
        }
        outlet.frames.push_back(frame);
        if let Some(waker) = outlet.waker.take() {
            self.wake.push(waker);
        }
    }
}

/// The stream of frames one member receives. Dropping it (the client cancelled, the connection
/// reset, keepalive failed, or the server shut down) makes the member leave its subscription.
#[derive(Debug)]
pub struct MemberStream {
    /// Frames taken from the outlet in one go (several per lock, so the transport can write
    /// them together), handed out one by one.
    taken: VecDeque<Outbound>,
    finished: bool,
    /// A message frame waits for the gateway's lease ([`MemberStream::lease_term`]): the timer
    /// of the next look.
    recheck: Option<Pin<Box<tokio::time::Sleep>>>,
    /// The lease term the frames in `taken` were taken under (a gateway's arbitrated
    /// singleton only): a message is written under another term only once the member is
    /// known not to have been ended meanwhile.
    taken_under: Option<u64>,
    guard: MemberGuard,
}

/// While a gateway's lease is lapsed, how often a member stream holding a message looks again.
const LAPSE_RECHECK: std::time::Duration = std::time::Duration::from_millis(10);

impl MemberStream {
    pub(crate) fn new(broker: Broker, cell: Arc<SubCell>, member: MemberId) -> Self {
        Self {
            taken: VecDeque::new(),
            finished: false,
            recheck: None,
            taken_under: None,
            guard: MemberGuard {
                broker,
                cell,
                member,
            },
        }
    }

    /// This member's id.
    pub fn member_id(&self) -> MemberId {
        self.guard.member
    }

    /// Acks and nacks for this member (fenced by construction: they can only name this member).
    pub fn settler(&self) -> Settler {
        Settler {
            broker: self.guard.broker.clone(),
            cell: self.guard.cell.clone(),
            member: self.guard.member,
        }
    }

    /// The next frame, or `None` once the broker ended the stream.
    pub async fn next(&mut self) -> Option<Outbound> {
        std::future::poll_fn(|cx| self.poll_frame(Some(cx.waker()))).await
    }

    /// The next frame if one is waiting, without blocking (for synchronous tests and models).
    pub fn try_next(&mut self) -> Option<Outbound> {
        match self.poll_frame(None) {
            Poll::Ready(frame) => frame,
            Poll::Pending => None,
        }
    }

    /// Only a gateway's broker has the gate: the term of its lease valid at this instant
    /// (`Some(None)`: not valid; docs/semantics.md#cluster-lease-checks), or `None` without a
    /// gate.
    fn lease_term(&self) -> Option<Option<u64>> {
        self.guard
            .broker
            .inner
            .singleton_gate
            .get()
            .map(|gate| gate())
    }

    fn arbitrated(&self) -> bool {
        Locked::new(&self.guard.cell).core.is_arbitrated()
    }

    /// Whether the broker ended this member (its end frame waits in the outlet, or it was
    /// taken already).
    fn member_ended(&self) -> bool {
        self.finished
            || self.taken.iter().any(|f| matches!(f, Outbound::End(_)))
            || Locked::new(&self.guard.cell).ended(self.guard.member)
    }

    /// Drops the message frames taken: past the lease, for a member that was ended.
    fn drop_messages(&mut self) {
        self.taken
            .retain(|f| !matches!(f, Outbound::Message { .. }));
        self.recheck = None;
    }

    fn poll_frame(&mut self, waker: Option<&Waker>) -> Poll<Option<Outbound>> {
        loop {
            // The frame about to be written is a message past the lease (a pause of the
            // process is seen here): it is not written now. It waits, with those behind it,
            // until the lease is renewed; if the member is ended meanwhile (its gateway's
            // lease ended for good), they are dropped: they stay in flight in the core until
            // then, and go back with the member (docs/semantics.md#cluster-lease-lapse).
            let message_next = matches!(self.taken.front(), Some(Outbound::Message { .. }));
            let term = if message_next {
                self.lease_term()
            } else {
                None
            };
            if term == Some(None) && self.arbitrated() {
                if self.member_ended() {
                    self.drop_messages();
                    continue;
                }
                let Some(waker) = waker else {
                    return Poll::Pending;
                };
                let timer = self
                    .recheck
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(LAPSE_RECHECK)));
                if timer
                    .as_mut()
                    .poll(&mut Context::from_waker(waker))
                    .is_pending()
                {
                    return Poll::Pending;
                }
                self.recheck = None;
                continue;
            }
            if let Some(Some(now)) = term
                && self.taken_under != Some(now)
                && self.arbitrated()
            {
                // Taken under another term (before a lapse, or while one lasted): written only
                // if the member was not ended meanwhile (its gateway's lease ended for good and
                // a new incarnation's is valid now), even by a stream nobody polled meanwhile.
                if self.member_ended() {
                    self.drop_messages();
                    continue;
                }
                self.taken_under = Some(now);
            }
            if let Some(frame) = self.taken.pop_front() {
                return Poll::Ready(Some(frame));
            }
            if self.finished {
                return Poll::Ready(None);
            }
            let MemberGuard {
                broker,
                cell,
                member,
            } = &self.guard;
            if !broker.take_frames(cell, *member, &mut self.taken, waker) {
                self.finished = true;
            }
            if let Some(gate) = broker.inner.singleton_gate.get() {
                self.taken_under = gate();
            }
            if self.taken.is_empty() {
                // Nothing taken: the waker is parked (or the stream is over).
                return if self.finished {
                    Poll::Ready(None)
                } else {
                    Poll::Pending
                };
            }
        }
    }
}

impl futures_core::Stream for MemberStream {
    type Item = Outbound;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Outbound>> {
        self.poll_frame(Some(cx.waker()))
    }
}

/// Settles one member's messages: the acks and nacks of a stream that is itself the member.
#[derive(Debug, Clone)]
pub struct Settler {
    broker: Broker,
    cell: Arc<SubCell>,
    member: MemberId,
}

impl Settler {
    /// The member this settles for.
    pub fn member_id(&self) -> MemberId {
        self.member
    }

    /// Acks, then nacks, then releases (docs/semantics.md#releases), in order, under one lock;
    /// returns the refused ones (id, what it asked, why). Each refusal changes nothing.
    ///
    /// # Errors
    /// [`Error::SettleTooLarge`] when `acks`, `nacks` and `releases` together name more ids
    /// than the member's window: no valid settle can (every id must be in flight to it at
    /// once), so the whole settle is refused before any id is looked at, and nothing changes.
    pub fn settle(
        &self,
        acks: &[SystemId],
        nacks: &[SystemId],
        releases: &[SystemId],
    ) -> Result<Vec<(SystemId, Settlement, Error)>, Error> {
        self.broker
            .settle_member(&self.cell, self.member, [acks, nacks, releases])
    }
}

#[derive(Debug)]
struct MemberGuard {
    broker: Broker,
    cell: Arc<SubCell>,
    member: MemberId,
}

impl Drop for MemberGuard {
    fn drop(&mut self) {
        self.broker.leave(&self.cell, self.member);
    }
}

impl Broker {
    /// A member's stream takes its waiting frames. In an ack-free subscription taking a message
    /// frame settles it: the message is done once written (at-most-once), which frees the window
    /// for the next. Returns false once the stream is over.
    fn take_frames(
        &self,
        cell: &Arc<SubCell>,
        member: MemberId,
        buf: &mut VecDeque<Outbound>,
        waker: Option<&Waker>,
    ) -> bool {
        let mut dead = DeadLetters::new();
        let open = {
            let mut state = Locked::new(cell);
            let open = state.take(member, buf, waker);
            if state.core.spec().ack_mode == AckMode::None {
                for frame in buf.iter() {
                    if let Outbound::Message { message, .. } = frame {
                        let system_id = message.system_id();
                        // Cannot fail: a frame in the outlet is in flight to its member, and
                        // nothing else settles messages of an ack-free subscription.
                        let effects = state.core.ack(Some(member), system_id);
                        debug_assert!(effects.is_ok(), "{effects:?}");
                        let input = super::Input::Ack {
                            member: Some(member),
                            connection: None,
                            system_id,
                            accepted: effects.is_ok(),
                        };
                        self.apply(&mut state, input, effects.unwrap_or_default(), &mut dead);
                    }
                }
            }
            open
        };
        self.publish_dead_letters(dead);
        open
    }

    /// Acks, nacks then releases for one member under one lock. The work is bounded by the
    /// member's window: a larger settle is refused whole, and each id costs O(log window).
    fn settle_member(
        &self,
        cell: &Arc<SubCell>,
        member: MemberId,
        lists: [&[SystemId]; 3],
    ) -> Result<Vec<(SystemId, Settlement, Error)>, Error> {
        const KINDS: [Settlement; 3] = [Settlement::Ack, Settlement::Nack, Settlement::Release];
        let mut dead = DeadLetters::new();
        let mut refused = Vec::new();
        {
            let mut state = Locked::new(cell);
            // A stream's member is a member until the stream is dropped; the fallback only keeps
            // this total.
            let window = state.core.window(member).unwrap_or(1);
            let ids: usize = lists.iter().map(|l| l.len()).sum();
            if ids > window as usize {
                return Err(Error::SettleTooLarge { ids, window });
            }
            let fence = super::Fence::Member(member);
            let first = KINDS
                .iter()
                .zip(lists)
                .find_map(|(&kind, list)| list.first().map(|&id| (id, kind)));
            if let (1, Some((id, kind))) = (ids, first) {
                // The common settle: one id, one scan of the outlet, nothing to keep.
                if let Err(error) =
                    self.settle_locked(&mut state, fence, id, kind, &SubState::unsent, &mut dead)
                {
                    refused.push((id, kind, error));
                }
            } else {
                // Frames the stream has not written, kept current as this settle's own acks
                // and nacks deliver new ones: a later id of the same settle may not name one
                // of those. Its buffer is the subscription's, reused from settle to settle.
                let mut unsent = UnsentIds {
                    ids: std::mem::take(&mut state.unsent_scratch),
                    ..UnsentIds::default()
                };
                for (ids, kind) in lists.into_iter().zip(KINDS) {
                    for &id in ids {
                        state.note_unsent(member, &mut unsent);
                        let unsent = |_: &SubState, _: MemberId, id: SystemId| unsent.contains(id);
                        if let Err(error) =
                            self.settle_locked(&mut state, fence, id, kind, &unsent, &mut dead)
                        {
                            refused.push((id, kind, error));
                        }
                    }
                }
                // Kept only while small (within the subscription's fixed overhead in the memory
                // budget): a settle over a huge window does not pin its buffer.
                if unsent.ids.capacity() <= UnsentIds::KEPT {
                    unsent.ids.clear();
                    state.unsent_scratch = unsent.ids;
                }
            }
        }
        self.publish_dead_letters(dead);
        Ok(refused)
    }
}
