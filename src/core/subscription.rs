//! One subscription's state machine: members in join order, the shared queue, per-member windows,
//! in-flight records, epochs and counters (docs/semantics.md#subscriptions, docs/semantics.md#delivery and docs/semantics.md#singleton).
//!
//! Inputs are the `join`, `leave`, `enqueue`, `ack`, `nack` and `release` methods; each returns the ordered
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
    index::{self, PatternIndex},
    message::{Message, SystemId},
    planted::{PlantedBug, active as planted},
    queue::Queue,
    spec::{AckMode, MemberOptions, Mode, Overflow, SubscriptionSpec},
    topic::Pattern,
};

/// Identifies a member of a subscription; increases in join order, never reused.
pub type MemberId = u64;
/// Fencing token handed to each newly active member; strictly increasing per subscription id.
pub type Epoch = u64;

/// What the shell must do after an input, in this order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Tell `member` it is active, with its epoch (always its first frame).
    Confirm {
        /// The member now active.
        member: MemberId,
        /// Its fencing token.
        epoch: Epoch,
    },
    /// Tell a singleton standby that asked for it where it stands in line (1 = next).
    Standby {
        /// The standby member.
        member: MemberId,
        /// Its place in line.
        position: u32,
    },
    /// Send `message` to `member`.
    Deliver {
        /// The receiving member.
        member: MemberId,
        /// The message.
        message: Message,
        /// 1 on first delivery, +1 on each redelivery.
        attempt: u32,
        /// The receiving member's epoch.
        epoch: Epoch,
    },
    /// Publish a poisoned message to the dead-letter topic.
    DeadLetter {
        /// The poisoned message.
        message: Message,
        /// How many times it was delivered.
        attempts: u32,
    },
    /// Take the frame of `system_id` out of `member`'s outlet: its stream has not written it
    /// and it is being dropped (a [`Dropped`](Effect::Dropped) for it follows). Only an
    /// ack-free subscription's drop-oldest policy withdraws a frame, to keep the newest
    /// (docs/semantics.md#overflow-policies).
    Withdraw {
        /// The member whose stream has not written it.
        member: MemberId,
        /// The message.
        system_id: SystemId,
    },
    /// A message left the subscription without being acked (counted in [`Counters`]).
    Dropped {
        /// The dropped message.
        system_id: SystemId,
        /// Why.
        reason: DropReason,
    },
}

/// What a client's settlement of a delivered message asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settlement {
    /// Done with it for good ([`Subscription::ack`]).
    Ack,
    /// Give it back for redelivery, counting an attempt ([`Subscription::nack`]).
    Nack,
    /// Give it back unworked, keeping the attempt within the bound ([`Subscription::release`],
    /// docs/semantics.md#releases).
    Release,
}

/// Why a message was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// It reached `max_delivery_attempts` and no dead-letter topic is set.
    MaxDeliveryAttempts,
    /// A dead letter or other broker-internal publish found the queue full.
    QueueFull,
    /// The queue (or the broker's drop-oldest memory pool) was full and its overflow policy is
    /// drop-oldest: this message made room (or, when nothing older could make room, was itself
    /// not queued).
    Overflow,
}

/// Monotonic counters of one subscription.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Messages queued.
    pub enqueued: u64,
    /// Deliveries, first or repeated.
    pub delivered: u64,
    /// Deliveries with attempt > 1.
    pub redelivered: u64,
    /// Messages released by an ack.
    pub acked: u64,
    /// Nacks accepted.
    pub nacked: u64,
    /// Releases accepted (docs/semantics.md#releases): those within the bound, which keep the
    /// attempt, and those past it, which count one as a nack would.
    pub released: u64,
    /// Poisoned messages sent to the dead-letter topic.
    pub dead_lettered: u64,
    /// Poisoned messages dropped (no dead-letter topic).
    pub dropped_max_attempts: u64,
    /// Publishes refused because this subscription was full.
    pub rejected_full: u64,
    /// Broker-internal publishes (dead letters) dropped because this subscription was full.
    pub dropped_full: u64,
    /// Standbys promoted to active.
    pub promotions: u64,
    /// Fenced acks or nacks refused because the member no longer held the message.
    pub stale_acks: u64,
    /// Messages dropped by the drop-oldest overflow policy.
    pub dropped_overflow: u64,
}

/// What one held message costs beyond its own bytes, charged in full by every subscription
/// holding it. Queued: its slot, one pointer (8 bytes, up to 16 just after the ring buffer
/// doubles), and its allocation beyond the payload: count, length, id, publish time and envelope
/// pointer (40 bytes), the allocator's 8-byte header and rounding to 16 (0 to 15): 56 to 79 in
/// all, 56 to 64 with a 128-byte payload. Not charged: an envelope of its own (a unary publish,
/// or a stream whose topic or headers change from one message to the next: about 50 bytes plus
/// the topic's own allocation; a stream to one topic shares one), and the in-flight record's
/// extra over a slot (an ordered-map entry, about 50 bytes, or in an ack-free subscription a
/// 24-byte slot of its member's list; the windows bound how many).
pub const MESSAGE_OVERHEAD: u64 = 80;
/// What one member costs: its record, its outlet and the stream's state.
pub const MEMBER_OVERHEAD: u64 = 1024;
/// What one subscription costs before any message or member.
pub const SUBSCRIPTION_OVERHEAD: u64 = 2048;
/// What each pattern costs beyond its text in the subscription's settings: its slot in the
/// pattern list and the text's shared allocation (its counts and the allocator's overhead).
pub const PATTERN_OVERHEAD: u64 =
    std::mem::size_of::<Pattern>() as u64 + 16 + index::ALLOCATION_OVERHEAD;

/// The budget cost of one pattern of a subscription: its text in the settings
/// ([`PATTERN_OVERHEAD`] beside it) and its entry in the broker's routing index, at most
/// [`PatternIndex::entry_cost`] however it shares nodes with other subscriptions' patterns.
pub fn pattern_cost(pattern: &Pattern) -> u64 {
    pattern.as_str().len() as u64 + PATTERN_OVERHEAD + PatternIndex::<u64>::entry_cost(pattern)
}

/// The budget cost of a subscription with `spec`'s patterns and nothing else.
pub fn subscription_cost(spec: &SubscriptionSpec) -> u64 {
    SUBSCRIPTION_OVERHEAD + spec.patterns.iter().map(pattern_cost).sum::<u64>()
}

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
}

impl Member {
    fn has_space(&self) -> bool {
        self.takes_more() && self.in_flight < self.options.max_in_flight
    }

    /// Active and not leaving: it may be sent messages.
    fn takes_more(&self) -> bool {
        self.epoch.is_some() && !self.draining
    }
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
    /// Place in join order, 0 = earliest.
    pub position: u32,
}

/// One subscription: its members and its queue.
#[derive(Debug, Clone)]
pub struct Subscription {
    id: Arc<str>,
    spec: SubscriptionSpec,
    limits: QueueLimits,
    /// Keyed by member id, which increases in join order: the first entry joined earliest.
    members: BTreeMap<MemberId, Member>,
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

    /// Cluster mode: hands the choice of this singleton's active member to the caller (the
    /// cluster's coordinator, which keeps the line across gateways). From now on a member
    /// joins on standby, the active member's leaving promotes nobody, and only
    /// [`Subscription::activate`] makes a member active, with the epoch the cluster gave it.
    /// Other modes ignore it.
    pub fn arbitrate(&mut self) {
        self.arbitrated = self.spec.mode == Mode::Singleton;
    }

    /// Whether the active member is chosen outside this core (see [`Subscription::arbitrate`]).
    pub fn is_arbitrated(&self) -> bool {
        self.arbitrated
    }

    /// Cluster mode: `member`, a standby of this arbitrated singleton, stands at `position` in
    /// the cluster's line (1 = next). A standby notice for it when it asked for one
    /// (`notify_standby`) and is still on standby; nothing otherwise.
    pub fn place_in_line(&self, member_id: MemberId, position: u32) -> Vec<Effect> {
        match self.members.get(&member_id) {
            Some(member)
                if self.arbitrated && member.epoch.is_none() && member.options.notify_standby =>
            {
                vec![Effect::Standby {
                    member: member_id,
                    position: position.max(1),
                }]
            }
            _ => Vec::new(),
        }
    }

    /// Makes `member_id` the active member of an arbitrated singleton, with `epoch` (the
    /// cluster's fencing token). It gets the confirmation, then what waits in the queue.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the subscription is not arbitrated, the member is not
    /// here, or another member is active; nothing changes then.
    pub fn activate(
        &mut self,
        member_id: MemberId,
        epoch: Epoch,
        promotion: bool,
    ) -> Result<Vec<Effect>, Error> {
        if !self.arbitrated {
            return Err(Error::InvalidArgument(format!(
                "subscription {:?} chooses its own active member",
                self.id
            )));
        }
        if let Some(active) = self.active_members().find(|&m| m != member_id) {
            return Err(Error::InvalidArgument(format!(
                "subscription {:?} already has active member {active}",
                self.id
            )));
        }
        let Some(member) = self.members.get_mut(&member_id) else {
            return Err(Error::InvalidArgument(format!(
                "subscription {:?} has no member {member_id}",
                self.id
            )));
        };
        if member.epoch.is_some() {
            return Ok(Vec::new());
        }
        member.epoch = Some(epoch);
        self.epoch = self.epoch.max(epoch);
        self.cluster_epoch = self.cluster_epoch.max(epoch);
        self.counters.promotions += u64::from(promotion);
        let mut out = vec![Effect::Confirm {
            member: member_id,
            epoch,
        }];
        self.dispatch(&mut out);
        Ok(out)
    }

    /// Takes every queued (not in-flight) message out, head first, with the attempt its next
    /// delivery would carry: an arbitrated singleton with no active member gives them back
    /// upstream, so that the next active member, on whichever gateway, gets them first.
    pub fn take_queued(&mut self) -> Vec<(Message, u32)> {
        let mut taken = Vec::with_capacity(self.queue.len());
        while let Some((message, attempt, _)) = self.queue.pop_front() {
            self.held_bytes -= message.size() as u64;
            taken.push((message, attempt));
        }
        taken
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
            .map(|since| since + self.limits.idle_timeout)
    }

    /// Whether it has had no members for its idle timeout as of `now`.
    pub fn is_expired(&self, now: Duration) -> bool {
        self.expires_at().is_some_and(|at| now >= at)
    }

    /// Inspection view of its members, in join order.
    pub fn member_infos(&self) -> Vec<MemberInfo> {
        self.members
            .iter()
            .enumerate()
            .map(|(position, (id, m))| MemberInfo {
                member_id: *id,
                active: m.epoch.is_some(),
                epoch: m.epoch.unwrap_or(0),
                in_flight: m.in_flight,
                max_in_flight: m.options.max_in_flight,
                position: position as u32,
            })
            .collect()
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

    /// Adds a member at the back of the line. It becomes active at once unless this is a
    /// singleton subscription that already has an active member.
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
        let mut member = Member {
            options: MemberOptions {
                max_in_flight: options.max_in_flight.max(1),
                ..options
            },
            epoch: None,
            in_flight: 0,
            unwritten: VecDeque::new(),
            draining: false,
        };
        let mut out = Vec::new();
        let second_active = planted(PlantedBug::TwoActiveMembers) && ahead == 1;
        if self.spec.mode == Mode::Singleton && (ahead > 0 || self.arbitrated) && !second_active {
            // An arbitrated member's place is in the cluster's line, not known here.
            if options.notify_standby && !self.arbitrated {
                out.push(Effect::Standby {
                    member: id,
                    position: ahead as u32,
                });
            }
        } else {
            self.epoch += 1;
            member.epoch = Some(self.epoch);
            out.push(Effect::Confirm {
                member: id,
                epoch: self.epoch,
            });
        }
        self.members.insert(id, member);
        self.idle_since = None;
        self.dispatch(&mut out);
        Ok((id, out))
    }

    /// Removes a member (its stream ended, for any reason). Its in-flight messages return to the
    /// head of the queue in their original order; if it was the singleton's active member, the
    /// earliest-joined standby is promoted. Unknown members are ignored.
    pub fn leave(&mut self, member_id: MemberId, now: Duration) -> Vec<Effect> {
        let mut out = Vec::new();
        let Some(member) = self.members.remove(&member_id) else {
            return out;
        };
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
                self.members.iter_mut().next_back()
            } else {
                self.members.iter_mut().next()
            };
            if let Some((&next_id, next)) = next {
                self.epoch += 1;
                next.epoch = Some(self.epoch);
                self.counters.promotions += 1;
                out.push(Effect::Confirm {
                    member: next_id,
                    epoch: self.epoch,
                });
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

    /// Drops the oldest messages it may drop until one of `size` bytes fits the queue's limits
    /// and, with its [`MESSAGE_OVERHEAD`], `room` plus what the drops freed; false if nothing
    /// is left to drop and it still does not fit.
    fn make_room(&mut self, size: usize, room: u64, out: &mut Vec<Effect>) -> bool {
        let needed = size as u64 + MESSAGE_OVERHEAD;
        if !self.could_make_room(size, room) {
            // Dropping everything would not make room: nothing is dropped for nothing.
            return false;
        }
        let mut freed = 0u64;
        while self.check_capacity(size).is_err() || room.saturating_add(freed) < needed {
            let Some(bytes) = self.drop_oldest(out) else {
                return false;
            };
            freed += bytes;
        }
        true
    }

    /// Drop-oldest: drops the oldest message this subscription may drop, to make room in the
    /// broker's drop-oldest pool for another subscription's publish; returns the memory freed,
    /// or `None` when it holds nothing it may drop (docs/semantics.md#memory-budget).
    pub fn evict_oldest(&mut self, out: &mut Vec<Effect>) -> Option<u64> {
        if self.spec.overflow != Overflow::DropOldest {
            return None;
        }
        self.drop_oldest(out)
    }

    /// The memory dropping every message the drop-oldest policy may drop would free.
    pub fn droppable_footprint(&self) -> u64 {
        let (mut count, mut bytes) = (self.queue.len() as u64, self.queued_bytes());
        if self.spec.ack_mode == AckMode::None {
            count += self.unwritten as u64;
            bytes += self.in_flight_bytes;
        }
        bytes + count * MESSAGE_OVERHEAD
    }

    /// Whether dropping every message the drop-oldest policy may drop would let one of `size`
    /// bytes in, within the queue's limits and `room` plus what the drops free.
    fn could_make_room(&self, size: usize, room: u64) -> bool {
        let (mut count, mut bytes) = (self.queue.len() as u64, self.queued_bytes());
        if self.spec.ack_mode == AckMode::None {
            count += self.unwritten as u64;
            bytes += self.in_flight_bytes;
        }
        let held = (self.queue.len() + self.in_flight()) as u64;
        held - count < self.limits.max_messages
            && self.held_bytes - bytes + size as u64 <= self.limits.max_bytes
            && room.saturating_add(bytes + count * MESSAGE_OVERHEAD)
                >= size as u64 + MESSAGE_OVERHEAD
    }

    /// Drops the oldest message the drop-oldest policy may drop and returns the memory it
    /// freed (its size and [`MESSAGE_OVERHEAD`]), or `None` when there is none. That is the
    /// queue's head or, in an ack-free subscription, the frame that has waited longest in a
    /// member's outlet (its stream has not written it), whichever has the lower id: a stalled
    /// ack-free reader that resumes gets the newest messages, not the first ones. (A member's
    /// frames wait in delivery order, which is id order except for a message a leaving member
    /// gave back, delivered behind newer ones.) An acked subscription's in-flight messages
    /// are its members' to settle and are never dropped.
    fn drop_oldest(&mut self, out: &mut Vec<Effect>) -> Option<u64> {
        let queued = self.queue.front_id();
        let unwritten = (self.spec.ack_mode == AckMode::None)
            .then(|| {
                self.members
                    .iter()
                    .filter_map(|(id, m)| m.unwritten.front().map(|r| (r.message.system_id(), *id)))
                    .min()
            })
            .flatten();
        let message = match (queued, unwritten) {
            (Some(q), Some((u, _))) if q < u => self.queue.pop_front()?.0,
            (_, Some((system_id, member_id))) => {
                let member = self.members.get_mut(&member_id)?;
                let record = member.unwritten.pop_front()?;
                member.in_flight -= 1;
                self.unwritten -= 1;
                self.in_flight_bytes -= record.message.size() as u64;
                out.push(Effect::Withdraw {
                    member: member_id,
                    system_id,
                });
                record.message
            }
            (Some(_), None) => self.queue.pop_front()?.0,
            (None, None) => return None,
        };
        let size = message.size() as u64;
        self.held_bytes -= size;
        self.counters.dropped_overflow += 1;
        out.push(Effect::Dropped {
            system_id: message.system_id(),
            reason: DropReason::Overflow,
        });
        Some(size + MESSAGE_OVERHEAD)
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
        if let Some(holder) = self.members.get_mut(&record.member) {
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
            // The first member is the only one that can be active.
            Mode::Singleton | Mode::Broadcast => self.members.iter().next().and_then(with_space),
            // Round robin over members with space, starting after the one served last.
            Mode::Queue => self
                .members
                .range((Bound::Excluded(self.served_last), Bound::Unbounded))
                .chain(self.members.range(..=self.served_last))
                .find_map(with_space),
        }
    }

    /// Checks docs/semantics.md#singleton-invariants (1 and 4) and the internal bookkeeping; for tests, simulations
    /// and fuzzing.
    ///
    /// # Errors
    /// A description of the first broken invariant.
    pub fn check_invariants(&self) -> Result<(), String> {
        let active: Vec<_> = self.active_members().collect();
        if self.spec.mode == Mode::Singleton {
            if active.len() > 1 {
                return Err(format!("{} active members: {active:?}", active.len()));
            }
            // Arbitrated: the cluster's line decides who is active and when, so neither "one
            // whenever there are members" nor "the earliest-joined here" holds locally.
            if !self.arbitrated && !self.members.is_empty() && active.len() != 1 {
                return Err("members but no active member".into());
            }
            if let (Some(first), Some(active)) = (self.members.keys().next(), active.first())
                && !self.arbitrated
                && first != active
            {
                return Err(format!(
                    "active member {active} is not the earliest-joined {first}"
                ));
            }
        } else if active.len() != self.members.len() {
            return Err("a non-singleton member is not active".into());
        }
        // docs/semantics.md#redelivery-order singleton order, as a state property: the queue is in id (publish) order
        // and everything in flight comes before it, so each delivery is the lowest id waiting.
        // A member that released (docs/semantics.md#releases) is sent nothing more: what it
        // still holds may come after what it gave back, and goes back in order when it leaves.
        if self.spec.mode == Mode::Singleton {
            let ids: Vec<SystemId> = self
                .in_flight_ids()
                .filter(|(_, holder)| self.members.get(holder).is_some_and(|m| !m.draining))
                .map(|(id, _)| id)
                .chain(self.queued_ids())
                .collect();
            if let Some(pair) = ids.windows(2).find(|pair| pair[0] >= pair[1]) {
                return Err(format!(
                    "singleton order: #{} waits in the queue behind #{}",
                    pair[1], pair[0]
                ));
            }
        }
        let ack_free = self.spec.ack_mode == AckMode::None;
        if ack_free && !self.in_flight.is_empty() {
            return Err("an ack-free subscription keeps records in the in-flight map".into());
        }
        if let Some((id, _)) = self
            .members
            .iter()
            .find(|(_, m)| !ack_free && !m.unwritten.is_empty())
        {
            return Err(format!(
                "member {id} of an acked subscription holds unwritten messages"
            ));
        }
        let unwritten = self.unwritten_records().count();
        if unwritten != self.unwritten {
            return Err(format!(
                "{} unwritten messages counted, members hold {unwritten}",
                self.unwritten
            ));
        }
        let mut held: BTreeMap<MemberId, u32> = BTreeMap::new();
        for (system_id, holder) in self.in_flight_ids() {
            if !self.members.contains_key(&holder) {
                return Err(format!(
                    "#{system_id} is in flight to member {holder}, which is gone"
                ));
            }
            *held.entry(holder).or_default() += 1;
        }
        if let Some((id, _)) = self
            .members
            .iter()
            .find(|(id, m)| m.unwritten.iter().any(|r| r.member != **id))
        {
            return Err(format!("member {id} holds a record naming another member"));
        }
        for (id, member) in &self.members {
            let holds = held.get(id).copied().unwrap_or(0);
            if member.in_flight != holds {
                return Err(format!(
                    "member {id} counts {} in flight but holds {holds}",
                    member.in_flight
                ));
            }
            if member.in_flight > member.options.max_in_flight {
                return Err(format!("member {id} is over its window"));
            }
        }
        if self
            .queue
            .iter()
            .any(|(m, _)| self.record(m.system_id()).is_some())
        {
            return Err("a message is both queued and in flight".into());
        }
        let bytes: u64 = self
            .queue
            .iter()
            .map(|(m, _)| m)
            .chain(self.in_flight_records().map(|f| &f.message))
            .map(|m| m.size() as u64)
            .sum();
        if bytes != self.held_bytes {
            return Err(format!(
                "held_bytes {} but messages add up to {bytes}",
                self.held_bytes
            ));
        }
        let in_flight_bytes: u64 = self
            .in_flight_records()
            .map(|f| f.message.size() as u64)
            .sum();
        if in_flight_bytes != self.in_flight_bytes {
            return Err(format!(
                "in_flight_bytes {} but in-flight messages add up to {in_flight_bytes}",
                self.in_flight_bytes
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "subscription_tests.rs"]
mod tests;
