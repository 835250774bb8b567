//! One subscription's state machine: members in line (join order, or priority then join
//! order), the shared queue, per-member windows,
//! in-flight records, epochs and counters (docs/semantics.md#subscriptions, docs/semantics.md#delivery and docs/semantics.md#singleton).
//!
//! This file is the state machine's inputs and the internals they share (over 600 lines for
//! that reason: they are one machine); its effect and counter types are in `core::effect`, the
//! memory-cost model in `core::cost`, and cluster mode's inputs, drop-oldest, step-downs
//! (priority and hand-over) and the invariant checks in `subscription_arbitrated.rs`,
//! `subscription_drop_oldest.rs`, `subscription_step_down.rs` and `subscription_check.rs`.
//!
//! Inputs are the `join`, `leave`, `enqueue`, `ack`, `nack`, `release`, `hand_over` and
//! `step_down_overdue` methods; each returns the ordered
//! [`Effect`]s the shell must carry out, in order, before the next input. Time only enters as a
//! `now` argument (time since the broker started).

use std::{
    collections::{BTreeMap, VecDeque},
    ops::Bound,
    sync::Arc,
    time::Duration,
};

use super::{
    error::Error,
    message::{Message, SystemId},
    planted::{PlantedBug, active as planted},
    queue::Queue,
    spec::{AckMode, MemberOptions, Mode, Overflow, SubscriptionSpec},
};

/// Identifies a member of a subscription; increases in join order, never reused.
pub type MemberId = u64;
/// Fencing token handed to each newly active member; strictly increasing per subscription id.
pub type Epoch = u64;

pub use super::cost::{
    MEMBER_OVERHEAD, MESSAGE_OVERHEAD, PATTERN_OVERHEAD, SUBSCRIPTION_OVERHEAD, pattern_cost,
    subscription_cost,
};
pub use super::effect::{Counters, DropReason, Effect, Settlement, StepDownCause};

/// Where a new subscription starts numbering: above the broker run's [`IdFloor`](super::IdFloor)
/// and, for one recreated under an id used before, above its predecessor, so that epochs and
/// member ids keep increasing, also across expiry and broker restarts (docs/semantics.md#singleton-invariant-5).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Floors {
    /// Highest epoch already handed out.
    pub epoch: Epoch,
    /// Highest member id already handed out.
    pub member_id: MemberId,
}

/// Per-subscription limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLimits {
    /// Most messages held (queued + in flight).
    pub max_messages: u64,
    /// Most bytes held (queued + in flight).
    pub max_bytes: u64,
    /// Most members.
    pub max_members: usize,
    /// How long the queue outlives its last member.
    pub idle_timeout: Duration,
}

#[derive(Debug, Clone)]
struct Member {
    options: MemberOptions,
    /// `Some` once active.
    epoch: Option<Epoch>,
    /// How many messages this member holds. Which ones, when members ack, is in the
    /// subscription's in-flight map alone (each record names its holder): one record per
    /// message, so an ack is one O(log n) removal there and a counter here, and a leaving
    /// member's messages are read off that map in id order, which is publish order (docs/semantics.md#redelivery-order).
    in_flight: u32,
    /// Ack-free subscriptions: the messages this member holds, in delivery order. Its stream
    /// settles them in the order it writes them, which is this order, so settling one is a
    /// `pop_front` (no ordered map insert and removal per delivery); a leaving member's
    /// unwritten messages are read from here, sorted by id, and go back to the queue.
    unwritten: VecDeque<InFlight>,
    /// Set by its first accepted release: the member is leaving, so it is sent nothing more
    /// (docs/semantics.md#releases). It keeps what it holds and may settle it.
    draining: bool,
    /// Its place in the line among members of its priority: lower is earlier. Given on
    /// joining, in join order, and anew when it hands over (to the back of its priority).
    ticket: u64,
    /// Set while this active member steps down (docs/semantics.md#hand-over): it is sent
    /// nothing more, and settles what it holds.
    yielding: bool,
}

impl Member {
    fn has_space(&self) -> bool {
        self.takes_more() && self.in_flight < self.options.max_in_flight
    }

    /// Active and not leaving: it may be sent messages.
    fn takes_more(&self) -> bool {
        self.epoch.is_some() && !self.draining && !self.yielding
    }

    /// Its key in [`Subscription::line`].
    fn place(&self) -> LinePlace {
        (std::cmp::Reverse(self.options.priority), self.ticket)
    }
}

/// A member's key in the line: higher priority first, then ticket (join) order.
type LinePlace = (std::cmp::Reverse<u32>, u64);

/// An active member stepping down (docs/semantics.md#hand-over).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepDown {
    /// The active member stepping down.
    pub member: MemberId,
    /// Names this step-down, for its deadline.
    pub seq: u64,
    /// Why.
    pub cause: StepDownCause,
}

/// A message delivered to a member and not yet settled.
#[derive(Debug, Clone)]
struct InFlight {
    message: Message,
    attempt: u32,
    member: MemberId,
    /// Whether this attempt's one release that does not count is used
    /// (docs/semantics.md#releases).
    released: bool,
}

/// Inspection view of one member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberInfo {
    /// The member.
    pub member_id: MemberId,
    /// Whether it is active.
    pub active: bool,
    /// Its epoch, 0 while on standby.
    pub epoch: Epoch,
    /// Messages it holds.
    pub in_flight: u32,
    /// Its window.
    pub max_in_flight: u32,
    /// Place in line, 0 = first: priority order, highest first, then join order (with no
    /// priorities, join order; a member that handed over goes to the back of its priority).
    pub position: u32,
    /// Its priority (docs/semantics.md#priority).
    pub priority: u32,
}

/// One subscription: its members and its queue.
#[derive(Debug, Clone)]
pub struct Subscription {
    id: Arc<str>,
    spec: SubscriptionSpec,
    limits: QueueLimits,
    /// Keyed by member id, which increases in join order: the first entry joined earliest.
    members: BTreeMap<MemberId, Member>,
    /// Every member by its place in line (singleton: whom a promotion picks), first first.
    line: BTreeMap<LinePlace, MemberId>,
    /// The last ticket given ([`Member::ticket`]).
    last_ticket: u64,
    /// A singleton's active member, when this core chooses it (not arbitrated).
    active: Option<MemberId>,
    /// The active member's step-down in progress, if any (docs/semantics.md#hand-over).
    stepping_down: Option<StepDown>,
    /// The last step-down's `seq`.
    step_downs: u64,
    queue: Queue,
    /// What members hold when they ack; empty in an ack-free subscription, whose members
    /// keep theirs ([`Member::unwritten`]).
    in_flight: BTreeMap<SystemId, InFlight>,
    /// How many messages the members of an ack-free subscription hold, all together.
    unwritten: usize,
    held_bytes: u64,
    /// The part of `held_bytes` in flight, kept as a running total so inspection and metrics
    /// never walk the queue.
    in_flight_bytes: u64,
    epoch: Epoch,
    /// Arbitrated singletons: the highest epoch the cluster activated a member with (the
    /// cluster's epochs have nothing to do with this run's floor, which `epoch` keeps).
    cluster_epoch: Epoch,
    last_member_id: MemberId,
    /// Queue mode: the member served last, for round robin.
    served_last: MemberId,
    idle_since: Option<Duration>,
    counters: Counters,
    /// Cluster mode: a singleton whose active member is chosen outside this core
    /// ([`Subscription::arbitrate`]).
    arbitrated: bool,
}

impl Subscription {
    /// A new subscription with no members, idle from `now`.
    pub fn new(
        id: Arc<str>,
        spec: SubscriptionSpec,
        limits: QueueLimits,
        floors: Floors,
        now: Duration,
    ) -> Self {
        Self {
            id,
            spec,
            limits,
            members: BTreeMap::new(),
            line: BTreeMap::new(),
            last_ticket: 0,
            active: None,
            stepping_down: None,
            step_downs: 0,
            queue: Queue::default(),
            in_flight: BTreeMap::new(),
            unwritten: 0,
            held_bytes: 0,
            in_flight_bytes: 0,
            epoch: floors.epoch,
            cluster_epoch: 0,
            last_member_id: floors.member_id,
            served_last: 0,
            idle_since: Some(now),
            counters: Counters::default(),
            arbitrated: false,
        }
    }

    // ---- getters ----

    /// The subscription id.
    pub fn id(&self) -> &Arc<str> {
        &self.id
    }

    /// The settings its members share.
    pub fn spec(&self) -> &SubscriptionSpec {
        &self.spec
    }

    /// Highest epoch handed out so far: for an arbitrated singleton, the highest the cluster
    /// activated a member with (0 before the first).
    pub fn epoch(&self) -> Epoch {
        if self.arbitrated {
            self.cluster_epoch
        } else {
            self.epoch
        }
    }

    /// What a subscription recreated under this id must start above.
    pub fn floors(&self) -> Floors {
        Floors {
            epoch: self.epoch,
            member_id: self.last_member_id,
        }
    }

    /// Whether a publish fenced by `epoch` may be stored now: `epoch` is the epoch of this
    /// SINGLETON subscription's active member (docs/semantics.md#fenced-publish). The caller
    /// stores it under the same lock, so no promotion falls between the check and the store.
    ///
    /// # Errors
    /// [`Error::NotSingleton`], or [`Error::Fenced`] naming the epoch now.
    pub fn check_fence(&self, epoch: Epoch) -> Result<(), Error> {
        self.require_singleton()?;
        let active = self.active_epoch();
        let stale =
            planted(PlantedBug::FenceAcceptsDeposedEpoch) && active.is_some_and(|a| epoch + 1 == a);
        if active == Some(epoch) || stale {
            return Ok(());
        }
        Err(Error::Fenced {
            subscription: self.id.to_string(),
            epoch,
            current: active.unwrap_or_else(|| self.epoch()),
            active: active.is_some(),
        })
    }

    /// Checks that this is a SINGLETON subscription, the only mode with an active member to
    /// watch, proclaim, fence a publish with or hand over.
    ///
    /// # Errors
    /// [`Error::NotSingleton`] naming its mode.
    pub fn require_singleton(&self) -> Result<(), Error> {
        if self.spec.mode == Mode::Singleton {
            return Ok(());
        }
        Err(Error::NotSingleton {
            subscription: self.id.to_string(),
            mode: self.spec.mode,
        })
    }

    /// Whether `member` is a member (active or standby).
    pub fn is_member(&self, member: MemberId) -> bool {
        self.members.contains_key(&member)
    }

    /// Number of members, active or standby.
    pub fn member_count(&self) -> usize {
        self.members.len()
    }

    /// Active members' ids, in join order (at most one in singleton mode).
    pub fn active_members(&self) -> impl Iterator<Item = MemberId> + '_ {
        self.members
            .iter()
            .filter(|(_, m)| m.epoch.is_some())
            .map(|(id, _)| *id)
    }

    /// Messages waiting in the queue.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Messages delivered and not yet acked.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len() + self.unwritten
    }

    /// Bytes of every message held (queued + in flight).
    pub fn held_bytes(&self) -> u64 {
        self.held_bytes
    }

    /// What this subscription counts against the broker-wide memory budget: every held
    /// message's size plus [`MESSAGE_OVERHEAD`], [`MEMBER_OVERHEAD`] per member, and the
    /// subscription itself with its patterns ([`subscription_cost`]).
    pub fn footprint(&self) -> u64 {
        self.fixed_footprint() + self.message_footprint()
    }

    /// The part of [`footprint`](Self::footprint) its messages take: every held message's size
    /// plus [`MESSAGE_OVERHEAD`]. A drop-oldest subscription's comes from the broker's
    /// drop-oldest pool, the rest from the general one (docs/semantics.md#memory-budget).
    pub fn message_footprint(&self) -> u64 {
        let held = (self.queue.len() + self.in_flight()) as u64;
        self.held_bytes + held * MESSAGE_OVERHEAD
    }

    /// The part of [`footprint`](Self::footprint) that is not messages: the subscription with
    /// its patterns, and its members.
    pub fn fixed_footprint(&self) -> u64 {
        subscription_cost(&self.spec) + self.members.len() as u64 * MEMBER_OVERHEAD
    }

    /// Queued bytes only (a running total: O(1)).
    pub fn queued_bytes(&self) -> u64 {
        self.held_bytes - self.in_flight_bytes
    }

    /// `member`'s window (`max_in_flight`), if it is a member.
    pub fn window(&self, member: MemberId) -> Option<u32> {
        self.members.get(&member).map(|m| m.options.max_in_flight)
    }

    /// How many more messages the active members could take now: their free window space,
    /// less what already waits in the queue. A gateway pulls no more than this from upstream
    /// (cluster mode), so what it holds never exceeds its members' windows.
    pub fn room(&self) -> u64 {
        let free: u64 = self
            .members
            .values()
            .filter(|m| m.takes_more())
            .map(|m| u64::from(m.options.max_in_flight.saturating_sub(m.in_flight)))
            .sum();
        free.saturating_sub(self.queue.len() as u64)
    }

    /// Ids of the queued messages, head first.
    pub fn queued_ids(&self) -> impl Iterator<Item = SystemId> + '_ {
        self.queue.iter().map(|(m, _)| m.system_id())
    }

    /// The member holding `system_id`, if it is in flight.
    pub fn holder(&self, system_id: SystemId) -> Option<MemberId> {
        self.record(system_id).map(|f| f.member)
    }

    /// Ids of the in-flight messages with their holders, in id order.
    pub fn in_flight_ids(&self) -> impl Iterator<Item = (SystemId, MemberId)> + '_ {
        let mut unwritten: Vec<(SystemId, MemberId)> = self
            .unwritten_records()
            .map(|f| (f.message.system_id(), f.member))
            .collect();
        unwritten.sort_unstable();
        self.in_flight
            .iter()
            .map(|(id, f)| (*id, f.member))
            .chain(unwritten)
    }

    /// When an in-flight message was published (ms since the Unix epoch), for the shell's
    /// publish-to-ack latency.
    pub fn in_flight_published_at(&self, system_id: SystemId) -> Option<u64> {
        self.record(system_id).map(|f| f.message.published_at_ms())
    }

    /// The in-flight record of `system_id`, wherever it is kept.
    fn record(&self, system_id: SystemId) -> Option<&InFlight> {
        self.in_flight.get(&system_id).or_else(|| {
            self.unwritten_records()
                .find(|f| f.message.system_id() == system_id)
        })
    }

    /// Every in-flight record: the map's, then the members' own.
    fn in_flight_records(&self) -> impl Iterator<Item = &InFlight> + '_ {
        self.in_flight.values().chain(self.unwritten_records())
    }

    /// What the members of an ack-free subscription hold (nothing in another), member by
    /// member, each in delivery order.
    fn unwritten_records(&self) -> impl Iterator<Item = &InFlight> + '_ {
        self.members.values().flat_map(|m| m.unwritten.iter())
    }

    /// The counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// When this subscription expires, if it has no members.
    pub fn expires_at(&self) -> Option<Duration> {
        self.idle_since
            .map(|since| since.saturating_add(self.limits.idle_timeout))
    }

    /// Whether it has had no members for its idle timeout as of `now`.
    pub fn is_expired(&self, now: Duration) -> bool {
        self.expires_at().is_some_and(|at| now >= at)
    }

    /// Inspection view of its members, in line order (priority, then join order; at a gateway, the local join order: the cluster line places them).
    pub fn member_infos(&self) -> Vec<MemberInfo> {
        self.line
            .values()
            .enumerate()
            .filter_map(|(position, id)| Some((position, *id, self.members.get(id)?)))
            .map(|(position, id, m)| MemberInfo {
                member_id: id,
                active: m.epoch.is_some(),
                epoch: m.epoch.unwrap_or(0),
                in_flight: m.in_flight,
                max_in_flight: m.options.max_in_flight,
                position: position as u32,
                priority: m.options.priority,
            })
            .collect()
    }

    /// The active member's epoch, if a member is active.
    fn active_epoch(&self) -> Option<Epoch> {
        match self.active {
            Some(id) => self.members.get(&id).and_then(|m| m.epoch),
            None => self.members.values().find_map(|m| m.epoch),
        }
    }

    // ---- inputs ----

    /// Checks, without changing anything, that a member asking for `spec` may join.
    ///
    /// # Errors
    /// [`Error::SettingsMismatch`], [`Error::BroadcastTaken`] or [`Error::TooManyMembers`].
    pub fn check_join(&self, spec: &SubscriptionSpec) -> Result<(), Error> {
        if let Some(differences) = self.spec.differences(spec) {
            return Err(Error::SettingsMismatch {
                subscription: self.id.to_string(),
                differences,
            });
        }
        if self.spec.mode == Mode::Broadcast && !self.members.is_empty() {
            return Err(Error::BroadcastTaken(self.id.to_string()));
        }
        if self.members.len() >= self.limits.max_members {
            return Err(Error::TooManyMembers {
                subscription: self.id.to_string(),
                max: self.limits.max_members,
            });
        }
        Ok(())
    }

    /// Adds a member at the back of the line (of its priority). It becomes active at once
    /// unless this is a singleton subscription that already has an active member; one that
    /// outranks the active member makes it step down (docs/semantics.md#priority).
    ///
    /// # Errors
    /// As [`check_join`](Self::check_join); nothing changes then.
    pub fn join(
        &mut self,
        spec: &SubscriptionSpec,
        options: MemberOptions,
    ) -> Result<(MemberId, Vec<Effect>), Error> {
        self.check_join(spec)?;
        self.last_member_id += 1;
        let id = self.last_member_id;
        let ahead = self.members.len();
        self.last_ticket += 1;
        let mut member = Member {
            options: MemberOptions {
                max_in_flight: options.max_in_flight.max(1),
                ..options
            },
            epoch: None,
            in_flight: 0,
            unwritten: VecDeque::new(),
            draining: false,
            ticket: self.last_ticket,
            yielding: false,
        };
        let place = member.place();
        let mut out = Vec::new();
        let second_active = planted(PlantedBug::TwoActiveMembers) && ahead == 1;
        let standby =
            self.spec.mode == Mode::Singleton && (ahead > 0 || self.arbitrated) && !second_active;
        if !standby {
            self.epoch += 1;
            member.epoch = Some(self.epoch);
            if self.spec.mode == Mode::Singleton {
                self.active = Some(id);
            }
            out.push(Effect::Confirm {
                member: id,
                epoch: self.epoch,
            });
        }
        self.members.insert(id, member);
        self.line.insert(place, id);
        if standby && !self.arbitrated {
            // An arbitrated member's place is in the cluster's line, not known here.
            if options.notify_standby {
                let position = self.standby_position(id);
                out.push(Effect::Standby {
                    member: id,
                    position,
                });
            }
            self.outranks_active(id, &mut out);
        }
        self.idle_since = None;
        self.dispatch(&mut out);
        Ok((id, out))
    }

    /// Removes a member (its stream ended, for any reason). Its in-flight messages return to the
    /// head of the queue in their original order; if it was the singleton's active member, the
    /// first standby in line is promoted (and a step-down of it is over). Unknown members are
    /// ignored.
    pub fn leave(&mut self, member_id: MemberId, now: Duration) -> Vec<Effect> {
        let mut out = Vec::new();
        let Some(member) = self.members.remove(&member_id) else {
            return out;
        };
        self.line.remove(&member.place());
        if self
            .stepping_down
            .is_some_and(|step| step.member == member_id)
        {
            self.stepping_down = None;
        }
        if self.active == Some(member_id) {
            self.active = None;
        }
        // They go back in publish order (ascending id), not delivery order: after a nack and
        // its redelivery the member may hold 2 then 1, and the next active member must still
        // get 1 first (docs/semantics.md#redelivery-order). Pushing to the front in reverse puts the lowest id at the head.
        // Its messages, read off the in-flight map, paid on a leave rather than on every
        // delivery and ack: nothing for a member holding nothing, and the walk stops at its
        // last message.
        // An ack-free member's own list is in delivery order, which a given-back message can
        // put out of id order: sorted here.
        let mut returning: Vec<InFlight> = if member.unwritten.is_empty() {
            let ids: Vec<SystemId> = self
                .in_flight
                .iter()
                .filter(|(_, record)| record.member == member_id)
                .map(|(id, _)| *id)
                .take(member.in_flight as usize)
                .collect();
            ids.iter()
                .filter_map(|id| self.in_flight.remove(id))
                .collect()
        } else {
            self.unwritten -= member.unwritten.len();
            let mut records = Vec::from(member.unwritten);
            records.sort_unstable_by_key(|r| r.message.system_id());
            records
        };
        returning.reverse();
        if planted(PlantedBug::RequeueNewestFirst) {
            returning.reverse();
        }
        for record in returning {
            let size = record.message.size() as u64;
            self.in_flight_bytes -= size;
            if planted(PlantedBug::ForgetRedelivery) {
                self.held_bytes -= size;
                continue;
            }
            self.give_back(record.message, record.attempt, &mut out);
        }
        if self.spec.mode == Mode::Singleton && member.epoch.is_some() && !self.arbitrated {
            // Promotion looks at the first entry only: its cost does not grow with the standbys.
            let next = if planted(PlantedBug::PromoteNewestStandby) {
                self.line.values().next_back()
            } else {
                self.line.values().next()
            };
            if let Some(&next_id) = next {
                self.promote(next_id, &mut out);
            }
        }
        if self.members.is_empty() {
            self.idle_since = Some(now);
        }
        self.dispatch(&mut out);
        out
    }

    /// Checks that one more message of `size` bytes fits.
    ///
    /// # Errors
    /// [`Error::QueueFull`] naming the limit.
    pub fn check_capacity(&self, size: usize) -> Result<(), Error> {
        let held = (self.queue.len() + self.in_flight()) as u64;
        let full = |limit, max| Error::QueueFull {
            subscription: self.id.to_string(),
            limit,
            max,
        };
        if held >= self.limits.max_messages {
            return Err(full("max_queue_messages", self.limits.max_messages));
        }
        if self.held_bytes + size as u64 > self.limits.max_bytes {
            return Err(full("max_queue_bytes", self.limits.max_bytes));
        }
        Ok(())
    }

    /// Checks that a client's publish of `size` bytes may go ahead: under the reject-publish
    /// policy it must fit; under drop-oldest this subscription never refuses.
    ///
    /// # Errors
    /// [`Error::QueueFull`] naming the limit.
    pub fn check_publish(&self, size: usize) -> Result<(), Error> {
        match self.spec.overflow {
            Overflow::RejectPublish => self.check_capacity(size),
            Overflow::DropOldest => Ok(()),
        }
    }

    /// Counts a publish refused because this subscription was full.
    pub fn note_rejected(&mut self) {
        self.counters.rejected_full += 1;
    }

    /// Counts an ack or nack refused by the shell's connection fence (the holder's stream runs
    /// on another connection).
    pub fn note_stale(&mut self) {
        self.counters.stale_acks += 1;
    }

    /// Queues a message and delivers what the windows allow. Callers check
    /// [`check_publish`](Self::check_publish) first; publishes do so for every matching
    /// subscription before queuing on any, so a refused publish changes nothing. Under the
    /// drop-oldest policy the oldest queued messages make room, each dropped and counted; if the
    /// in-flight messages alone leave no room, the new message itself is dropped and counted.
    pub fn enqueue(&mut self, message: Message) -> Vec<Effect> {
        self.enqueue_attempt(message, 1)
    }

    /// As [`enqueue`](Self::enqueue), appending the effects to `out`: a caller queuing on
    /// many subscriptions per publish reuses one buffer instead of allocating one each time.
    pub fn enqueue_into(&mut self, message: Message, out: &mut Vec<Effect>) {
        self.enqueue_attempt_into(message, 1, false, u64::MAX, out);
    }

    /// As [`enqueue_into`](Self::enqueue_into) for a drop-oldest subscription whose share of the
    /// broker's memory may grow by only `room` bytes for this message (what the drop-oldest
    /// pool could grant): the oldest messages it may drop make room until the message, with
    /// [`MESSAGE_OVERHEAD`], fits in `room` and what they freed; failing that, the message itself
    /// is dropped. Either way it is never refused (docs/semantics.md#overflow-policies).
    pub fn enqueue_within(&mut self, message: Message, room: u64, out: &mut Vec<Effect>) {
        self.enqueue_attempt_into(message, 1, false, room, out);
    }

    /// As [`enqueue`](Self::enqueue), for a message an upstream store has delivered before:
    /// its next delivery carries `attempt` (at least 1). In cluster mode that is JetStream's
    /// delivery count, so a message redelivered through another gateway shows it. One that has
    /// already used `max_delivery_attempts` is retired at once, as a nack of its last attempt
    /// would have retired it.
    pub fn enqueue_attempt(&mut self, message: Message, attempt: u32) -> Vec<Effect> {
        let mut out = Vec::new();
        self.enqueue_attempt_into(message, attempt, false, u64::MAX, &mut out);
        out
    }

    /// As [`enqueue_attempt`](Self::enqueue_attempt), for a message another gateway handed on
    /// (cluster mode's carry), whose release that does not count at `attempt` may already be
    /// used there: it counts as used here, so a message handed from gateway to gateway still
    /// reaches its dead letter (docs/semantics.md#releases).
    pub fn enqueue_handed_over(&mut self, message: Message, attempt: u32) -> Vec<Effect> {
        let mut out = Vec::new();
        self.enqueue_attempt_into(message, attempt, true, u64::MAX, &mut out);
        out
    }

    fn enqueue_attempt_into(
        &mut self,
        message: Message,
        attempt: u32,
        released: bool,
        room: u64,
        out: &mut Vec<Effect>,
    ) {
        let attempt = attempt.max(1);
        let max = self.spec.max_delivery_attempts;
        if max != 0 && attempt > max {
            self.held_bytes += message.size() as u64;
            self.give_back(message, attempt - 1, out);
            return;
        }
        if self.spec.overflow == Overflow::DropOldest && !self.make_room(message.size(), room, out)
        {
            self.counters.dropped_overflow += 1;
            out.push(Effect::Dropped {
                system_id: message.system_id(),
                reason: DropReason::Overflow,
            });
            return;
        }
        self.held_bytes += message.size() as u64;
        self.counters.enqueued += 1;
        self.queue.push_back_attempt(message, attempt, released);
        self.dispatch(out);
    }

    /// Queues a broker-internal message (a dead letter), dropping and counting it if full (or
    /// making room, under the drop-oldest policy).
    pub fn enqueue_or_drop(&mut self, message: Message) -> Vec<Effect> {
        if self.spec.overflow == Overflow::RejectPublish
            && self.check_capacity(message.size()).is_err()
        {
            return self.drop_full(message.system_id());
        }
        self.enqueue(message)
    }

    /// Drops a broker-internal message that cannot be held (its queue, or the broker's memory
    /// budget, is full), counting it as `dropped_full`.
    pub fn drop_full(&mut self, system_id: SystemId) -> Vec<Effect> {
        self.counters.dropped_full += 1;
        vec![Effect::Dropped {
            system_id,
            reason: DropReason::QueueFull,
        }]
    }

    /// Releases a delivered message for good.
    ///
    /// `member` is the fence: when `Some`, only that member's ack counts.
    ///
    /// # Errors
    /// [`Error::NotInFlight`] or [`Error::NotHolder`]; nothing changes then.
    pub fn ack(
        &mut self,
        member: Option<MemberId>,
        system_id: SystemId,
    ) -> Result<Vec<Effect>, Error> {
        let record = self.take_in_flight(member, system_id)?;
        self.held_bytes -= record.message.size() as u64;
        self.counters.acked += 1;
        let mut out = Vec::new();
        self.dispatch(&mut out);
        Ok(out)
    }

    /// Returns a delivered message to the head of the queue for redelivery (or dead-letters it
    /// when it has used its attempts). Fenced like [`ack`](Self::ack).
    ///
    /// # Errors
    /// [`Error::NotInFlight`] or [`Error::NotHolder`]; nothing changes then.
    pub fn nack(
        &mut self,
        member: Option<MemberId>,
        system_id: SystemId,
    ) -> Result<Vec<Effect>, Error> {
        let record = self.take_in_flight(member, system_id)?;
        self.counters.nacked += 1;
        let mut out = Vec::new();
        self.give_back(record.message, record.attempt, &mut out);
        self.dispatch(&mut out);
        Ok(out)
    }

    /// Gives back a delivered message its member never worked on: as a
    /// [`nack`](Self::nack) (same fence, same refusals, back at the head), except that the first
    /// release at each attempt does not count one: the next delivery carries the same attempt.
    /// A second release at the same attempt counts, exactly as a nack (and retires a message
    /// that used its attempts), so a message released over and over is delivered at most twice
    /// per attempt and still reaches its dead letter (docs/semantics.md#releases). Its holder is
    /// leaving: from now on it is sent nothing more, so what it gave back goes to another member
    /// (or, in singleton mode, waits for the next active one) instead of straight back to it.
    ///
    /// # Errors
    /// [`Error::NotInFlight`] or [`Error::NotHolder`]; nothing changes then.
    pub fn release(
        &mut self,
        member: Option<MemberId>,
        system_id: SystemId,
    ) -> Result<Vec<Effect>, Error> {
        let record = self.take_in_flight(member, system_id)?;
        self.counters.released += 1;
        // A member stepping down is sent nothing more already, and may give back what it
        // prefetched to hand over sooner: that is no sign it leaves (docs/semantics.md#hand-over).
        if let Some(holder) = self.members.get_mut(&record.member)
            && !holder.yielding
        {
            holder.draining = true;
        }
        let mut out = Vec::new();
        if record.released {
            self.give_back(record.message, record.attempt, &mut out);
        } else {
            // In id order among what was given back: a closing client releases what it
            // prefetched in one settle, and the next member gets it in publish order.
            self.queue
                .insert_in_order(record.message, record.attempt, true);
        }
        self.dispatch(&mut out);
        Ok(out)
    }

    /// Empties the subscription as it expires; returns how many messages it still held.
    pub fn drain(&mut self) -> usize {
        let held = self.queue.len() + self.in_flight();
        self.queue.clear();
        self.in_flight.clear();
        self.unwritten = 0;
        for member in self.members.values_mut() {
            member.in_flight = 0;
            member.unwritten.clear();
        }
        self.held_bytes = 0;
        self.in_flight_bytes = 0;
        held
    }

    // ---- internals ----

    fn take_in_flight(
        &mut self,
        member: Option<MemberId>,
        system_id: SystemId,
    ) -> Result<InFlight, Error> {
        if self.spec.ack_mode == AckMode::None {
            return self.take_unwritten(member, system_id);
        }
        let Some(record) = self.in_flight.get(&system_id) else {
            return Err(Error::NotInFlight {
                subscription: self.id.to_string(),
                system_id,
            });
        };
        let holder = record.member;
        self.check_holder(member, holder, system_id)?;
        let Some(record) = self.in_flight.remove(&system_id) else {
            unreachable!("looked up above");
        };
        if let Some(holder) = self.members.get_mut(&record.member) {
            holder.in_flight -= 1;
        }
        self.in_flight_bytes -= record.message.size() as u64;
        Ok(record)
    }

    /// An ack or nack naming `member` for a message `holder` holds: refused (and counted as
    /// stale) when they differ. One naming no member is fenced elsewhere.
    fn check_holder(
        &mut self,
        member: Option<MemberId>,
        holder: MemberId,
        system_id: SystemId,
    ) -> Result<(), Error> {
        if let Some(member) = member
            && member != holder
            && !planted(PlantedBug::AckIgnoresFence)
        {
            self.counters.stale_acks += 1;
            return Err(Error::NotHolder {
                subscription: self.id.to_string(),
                system_id,
                member,
                holder,
            });
        }
        Ok(())
    }

    /// [`take_in_flight`](Self::take_in_flight) in an ack-free subscription. The message a
    /// stream settles is the first its member holds (it writes them in delivery order), so
    /// this looks there first; anything else is a search, with the same errors as the map.
    fn take_unwritten(
        &mut self,
        member: Option<MemberId>,
        system_id: SystemId,
    ) -> Result<InFlight, Error> {
        let is = |r: &InFlight| r.message.system_id() == system_id;
        let first = member.filter(|m| {
            self.members
                .get(m)
                .is_some_and(|m| m.unwritten.front().is_some_and(is))
        });
        let place = match first {
            Some(member) => Some((member, 0)),
            None => self
                .members
                .iter()
                .find_map(|(id, m)| m.unwritten.iter().position(is).map(|at| (*id, at))),
        };
        let Some((holder, at)) = place else {
            return Err(Error::NotInFlight {
                subscription: self.id.to_string(),
                system_id,
            });
        };
        self.check_holder(member, holder, system_id)?;
        let Some(record) = self.members.get_mut(&holder).and_then(|m| {
            m.in_flight -= 1;
            m.unwritten.remove(at)
        }) else {
            unreachable!("found above");
        };
        self.unwritten -= 1;
        self.in_flight_bytes -= record.message.size() as u64;
        Ok(record)
    }

    /// A message came back unacked after delivery number `attempt`: requeue it at the head, or
    /// retire it if it has used its attempts.
    fn give_back(&mut self, message: Message, attempt: u32, out: &mut Vec<Effect>) {
        let max = self.spec.max_delivery_attempts;
        if max == 0 || attempt < max {
            if self.spec.mode == Mode::Singleton && !planted(PlantedBug::RequeueNewestFirst) {
                // The same place as at the head while the queue is in id order (everything in
                // flight comes before it), which a member that released what it prefetched
                // (docs/semantics.md#releases) and then nacks or leaves holding later ids does
                // not keep: the next active member still gets one order.
                self.queue.insert_in_order(message, attempt + 1, false);
            } else {
                self.queue.push_front(message, attempt + 1, false);
            }
            return;
        }
        self.held_bytes -= message.size() as u64;
        if self.spec.dead_letter_topic.is_some() {
            self.counters.dead_lettered += 1;
            out.push(Effect::DeadLetter {
                message,
                attempts: attempt,
            });
        } else {
            self.counters.dropped_max_attempts += 1;
            out.push(Effect::Dropped {
                system_id: message.system_id(),
                reason: DropReason::MaxDeliveryAttempts,
            });
        }
    }

    /// Delivers from the head of the queue while some active member has window space.
    fn dispatch(&mut self, out: &mut Vec<Effect>) {
        if self.stepping_down.is_some() {
            self.settle_step_down(out);
        }
        while !self.queue.is_empty() {
            let Some(member_id) = self.next_target() else {
                return;
            };
            let (Some((message, attempt, released)), Some(member)) =
                (self.queue.pop_front(), self.members.get_mut(&member_id))
            else {
                return;
            };
            let Some(epoch) = member.epoch else {
                unreachable!("next_target only picks active members");
            };
            let system_id = message.system_id();
            member.in_flight += 1;
            self.in_flight_bytes += message.size() as u64;
            self.served_last = member_id;
            self.counters.delivered += 1;
            if attempt > 1 {
                self.counters.redelivered += 1;
            }
            let record = InFlight {
                message: message.clone(),
                attempt,
                member: member_id,
                released,
            };
            if self.spec.ack_mode == AckMode::None {
                member.unwritten.push_back(record);
                self.unwritten += 1;
            } else {
                self.in_flight.insert(system_id, record);
            }
            out.push(Effect::Deliver {
                member: member_id,
                message,
                attempt,
                epoch,
            });
        }
    }

    fn next_target(&self) -> Option<MemberId> {
        let with_space = |(id, m): (&MemberId, &Member)| m.has_space().then_some(*id);
        match self.spec.mode {
            // Arbitrated: the cluster's line chose the active member, which need not be the
            // earliest-joined here (joins reach the line in the order their gateways record them).
            Mode::Singleton if self.arbitrated => self
                .members
                .iter()
                .find(|(_, m)| m.epoch.is_some())
                .and_then(with_space),
            // The one member this core made active.
            Mode::Singleton => self
                .active
                .and_then(|id| self.members.get_key_value(&id))
                .and_then(with_space),
            // A broadcast subscription has one member.
            Mode::Broadcast => self.members.iter().next().and_then(with_space),
            // Round robin over members with space, starting after the one served last.
            Mode::Queue => self
                .members
                .range((Bound::Excluded(self.served_last), Bound::Unbounded))
                .chain(self.members.range(..=self.served_last))
                .find_map(with_space),
        }
    }
}

// The cluster-arbitrated inputs, drop-oldest, and the invariant checks: more of this state
// machine, in files of their own (child modules, so they see its private state).
#[path = "subscription_arbitrated.rs"]
mod arbitrated;
#[path = "subscription_check.rs"]
mod check;
#[path = "subscription_drop_oldest.rs"]
mod drop_oldest;
#[path = "subscription_step_down.rs"]
mod step_down;

#[cfg(test)]
#[path = "subscription_tests.rs"]
mod tests;
