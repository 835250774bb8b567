//! The shell around the pure core: shares it between connections, carries out its effects on
//! member streams, and feeds it the inputs the network produces.
//!
//! Locking: one `RwLock` over the catalog (routing index and subscription table), read-locked by
//! publishes and acks, write-locked only to create or expire a subscription; one `Mutex` per
//! subscription. A publish locks the subscriptions it matches in key order (so two publishes can
//! never deadlock) and checks every one has room before queuing on any. Nothing awaits while a
//! lock is held.

mod changes;
mod delete;
mod expiry;
mod handover;
mod leadership;
mod logs;
mod member;
mod observe;
mod publish;
pub use publish::RUN_LIMIT;
mod timing;
mod upstream;
mod view;

use std::{collections::BTreeMap, sync::Arc, time::Duration};

pub use changes::{Activity, Changed};
pub use delete::Deleted;
pub use handover::{HandOverWait, HandedOver};
pub use leadership::{Leadership, LeadershipWatch};
pub(crate) use logs::refused_join;
pub use member::{
    ACK_FREE_TAKE, ACK_FREE_TAKE_BYTES, ConnectionId, MemberStream, Outbound, Settler,
    SharedEncoding,
};
use member::{Locked, SubState};

/// A gateway's lease check for arbitrated singletons: the term of its lease valid now, or
/// `None` ([`crate::cluster`]'s lease gate).
pub(crate) type SingletonGate = Arc<dyn Fn() -> Option<u64> + Send + Sync>;

/// A gateway's check before a member of an arbitrated singleton settles a message it holds:
/// `true` when the settle may be applied now ([`crate::cluster`]'s lease gate).
pub(crate) type SettleGate = Arc<dyn Fn() -> bool + Send + Sync>;
pub use observe::{Input, Observation, Observer};
pub use timing::Timings;
pub(crate) use upstream::Upstream;
pub use upstream::{Activation, GATEWAY_ROUTE_SHIFT};
pub use view::{Description, UpstreamBacklog};

use crate::{
    clock::Clock,
    core::{
        AckMode, Counters, Draft, Effect, Epoch, Error, Floors, IdFloor, Limits, MemberId,
        MemberInfo, OpenRequest, PatternIndex, QueueLimits, Settlement, Subscription,
        SubscriptionSpec, SystemId,
        planted::{PlantedBug, active as planted},
    },
    sync::{AtomicBool, AtomicU64, Mutex, Ordering, RwLock, lock, read, write},
};

/// What says an ack or nack comes from the member holding the message (docs/semantics.md#fencing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fence {
    /// It names the member (`member_id` from the confirmation, or a stream that is the member).
    Member(MemberId),
    /// It names no member: it counts only if it arrived on the connection the holder's stream
    /// runs on.
    Connection(ConnectionId),
}

type SubCell = Mutex<SubState>;
/// Whether a member's stream has not yet written the frame of a message.
type Unsent<'a> = dyn Fn(&SubState, MemberId, SystemId) -> bool + 'a;
/// Dead letters to publish once locks are released: (origin subscription key, message).
type DeadLetters = Vec<(u64, Draft)>;

/// The broker: cheap to clone, every clone is the same broker.
#[derive(Clone)]
pub struct Broker {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker").finish_non_exhaustive()
    }
}

struct Inner {
    limits: Limits,
    clock: Arc<dyn Clock>,
    id_floor: IdFloor,
    catalog: RwLock<Catalog>,
    last_system_id: AtomicU64,
    shutting_down: AtomicBool,
    counters: AtomicCounters,
    expiry_wake: tokio::sync::Notify,
    /// Member-less subscriptions by deadline. Updated under the subscription's lock (so a join
    /// and a leave cannot reorder their updates); a leaf lock, never held while taking another.
    idle: Mutex<expiry::Deadlines>,
    /// Step-downs in progress by deadline (docs/semantics.md#hand-over); a leaf lock too.
    handover_deadlines: Mutex<expiry::Deadlines>,
    observer: Option<Arc<dyn Observer>>,
    timings: std::sync::OnceLock<Arc<dyn Timings>>,
    /// A gateway's lease check for arbitrated singletons: while it says no, member streams
    /// write none of their messages (`Upstream::gate_singleton_deliveries`).
    singleton_gate: std::sync::OnceLock<SingletonGate>,
    /// A gateway's lease check for arbitrated singletons' settles: while it says no, an ack,
    /// nack or release of a held message is refused (`Upstream::gate_singleton_settles`).
    settle_gate: std::sync::OnceLock<SettleGate>,
    /// Where the last eviction from the drop-oldest pool stopped (a subscription key).
    evict_cursor: AtomicU64,
    /// Cluster mode: singleton subscriptions' active members are chosen by the cluster
    /// (`Broker::gateway`).
    arbitrated: bool,
    /// Cluster mode: dead letters go to JetStream through the observer (the gateway's
    /// router), not to this broker's own subscriptions, which only JetStream feeds.
    upstream_dead_letters: bool,
    /// Changes of membership and leadership (joins, leaves, promotions, step-downs, deletes,
    /// expiries; at a gateway also the cluster's lines): what a console waits on before it
    /// looks again (docs/operations.md#console). Never touched by publishes or acks.
    changes: changes::Changes,
}

#[derive(Default)]
struct AtomicCounters {
    published: AtomicU64,
    unrouted: AtomicU64,
    rejected_publishes: AtomicU64,
    subscriptions_expired: AtomicU64,
    messages_expired: AtomicU64,
    /// Subscriptions removed by [`Broker::delete`], and the messages they held.
    subscriptions_deleted: AtomicU64,
    messages_deleted: AtomicU64,
    unconfirmed_acks: AtomicU64,
    lease_lapses: AtomicU64,
    lease_lapses_renewed: AtomicU64,
    /// Live members across all subscriptions (so listing need not lock every subscription).
    members: AtomicU64,
    /// The general pool: every subscription's footprint but the messages of drop-oldest ones
    /// (at most [`Limits::general_memory_bytes`]).
    memory: AtomicU64,
    /// The drop-oldest pool: the messages drop-oldest subscriptions hold (at most
    /// [`Limits::drop_oldest_memory_bytes`]). Apart, so what they hold never refuses a publish
    /// anywhere (docs/semantics.md#memory-budget).
    drop_oldest: AtomicU64,
}

/// Which part of the memory budget a charge comes out of (docs/semantics.md#memory-budget).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pool {
    /// Subscriptions, members, and the messages of reject-publish subscriptions.
    General,
    /// The messages of drop-oldest subscriptions (all ack-free ones among them).
    DropOldest,
}

impl Pool {
    /// The pool `state`'s messages come from.
    pub(crate) fn of_messages(state: &SubState) -> Self {
        match state.core.spec().overflow {
            crate::core::Overflow::DropOldest => Pool::DropOldest,
            crate::core::Overflow::RejectPublish => Pool::General,
        }
    }
}

struct Catalog {
    index: PatternIndex<u64>,
    by_key: BTreeMap<u64, Arc<SubCell>>,
    /// The keys of drop-oldest subscriptions: where room in the drop-oldest pool can be made.
    drop_oldest: std::collections::BTreeSet<u64>,
    by_name: BTreeMap<Arc<str>, u64>,
    last_key: u64,
    /// Where new subscriptions start numbering: the run's [`IdFloor`], raised to the highest
    /// epoch and member id of any expired subscription.
    retired: Floors,
}

impl Catalog {
    fn get(&self, name: &str) -> Option<&Arc<SubCell>> {
        self.by_name.get(name).and_then(|key| self.by_key.get(key))
    }
}

/// The result of one publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    /// The message's broker-wide id.
    pub system_id: SystemId,
    /// How many subscriptions queued it.
    pub queued_for: u32,
}

/// A batch publish that stopped part way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchError {
    /// What was published before the failure, in order.
    pub published: Vec<Published>,
    /// Why the next message was refused.
    pub error: Error,
}

/// Inspection view of one subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriptionView {
    /// Its id.
    pub subscription_id: Arc<str>,
    /// Shared settings.
    pub spec: SubscriptionSpec,
    /// Members in join order.
    pub members: Vec<MemberInfo>,
    /// Highest epoch handed out.
    pub epoch: Epoch,
    /// Messages waiting.
    pub queued_messages: u64,
    /// Bytes waiting.
    pub queued_bytes: u64,
    /// Messages delivered, not yet acked.
    pub in_flight: u64,
    /// Counters.
    pub counters: Counters,
    /// Time left before it expires, when it has no members.
    pub expires_in: Option<Duration>,
    /// SINGLETON: the metadata of its members that have any
    /// (docs/semantics.md#member-metadata).
    pub metadata: std::collections::BTreeMap<MemberId, Arc<str>>,
    /// SINGLETON: the active member while it steps down (docs/semantics.md#hand-over).
    pub stepping_down: Option<MemberId>,
    /// When each member joined, in milliseconds since the Unix epoch by the broker's clock.
    pub joined_unix_ms: std::collections::BTreeMap<MemberId, u64>,
}

/// Broker-wide counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BrokerStats {
    /// Messages published.
    pub published: u64,
    /// Published messages that matched no subscription.
    pub unrouted: u64,
    /// Publishes refused (a queue was full).
    pub rejected_publishes: u64,
    /// Subscriptions expired after their idle time.
    pub subscriptions_expired: u64,
    /// Messages they still held.
    pub messages_expired: u64,
    /// Subscriptions removed by `DeleteSubscription` (docs/semantics.md#deleting).
    pub subscriptions_deleted: u64,
    /// Messages they held, discarded with them.
    pub messages_deleted: u64,
    /// Cluster mode: acks (and terms) JetStream did not confirm within the consumer's ack wait,
    /// or sent unconfirmed; 0 on the embedded broker.
    pub unconfirmed_acks: u64,
    /// Cluster mode: times this gateway's lease lapsed unrenewed (its singleton members got
    /// nothing meanwhile), and those a renewal ended with the members kept
    /// (docs/semantics.md#cluster-lease-lapse); 0 on the embedded broker.
    pub lease_lapses: u64,
    pub lease_lapses_renewed: u64,
    /// Live subscriptions.
    pub subscriptions: u64,
    /// Members across them.
    pub members: u64,
    /// Bytes accounted against the memory budget (both pools).
    pub memory_accounted_bytes: u64,
    /// The part of them drop-oldest subscriptions' messages hold.
    pub memory_drop_oldest_bytes: u64,
    /// The most those may hold (`max_memory_bytes` times the drop-oldest share).
    pub max_drop_oldest_memory_bytes: u64,
    /// The memory budget.
    pub max_memory_bytes: u64,
}

impl Broker {
    /// A broker with these limits, reading time from `clock`.
    pub fn new(limits: Limits, clock: Arc<dyn Clock>) -> Self {
        Self::with_observer(limits, clock, None)
    }

    /// A broker that reports every input to `observer` (for simulations and tests).
    ///
    /// Reads the wall clock once: every epoch, member id and system id this broker hands out is
    /// above that time in microseconds, so a restarted broker never repeats one its predecessor
    /// handed out (docs/semantics.md#restart-identity; the assumption about the clock is in [`IdFloor`]).
    pub fn with_observer(
        limits: Limits,
        clock: Arc<dyn Clock>,
        observer: Option<Arc<dyn Observer>>,
    ) -> Self {
        let floor = IdFloor::at_start(clock.unix_micros());
        Self {
            inner: Arc::new(Inner {
                limits,
                clock,
                id_floor: floor,
                catalog: RwLock::new(Catalog {
                    index: PatternIndex::new(),
                    by_key: BTreeMap::new(),
                    drop_oldest: std::collections::BTreeSet::new(),
                    by_name: BTreeMap::new(),
                    last_key: 0,
                    retired: floor.floors(),
                }),
                last_system_id: AtomicU64::new(floor.last_system_id()),
                shutting_down: AtomicBool::new(false),
                evict_cursor: AtomicU64::new(0),
                counters: AtomicCounters::default(),
                expiry_wake: tokio::sync::Notify::new(),
                idle: Mutex::new(expiry::Deadlines::default()),
                handover_deadlines: Mutex::new(expiry::Deadlines::default()),
                observer,
                timings: std::sync::OnceLock::new(),
                singleton_gate: std::sync::OnceLock::new(),
                settle_gate: std::sync::OnceLock::new(),
                arbitrated: false,
                upstream_dead_letters: false,
                changes: changes::Changes::default(),
            }),
        }
    }

    /// Reports a fenced publish's check to the observer (it changes nothing, so it has no
    /// effects).
    fn observe_fence(&self, subscription: &crate::core::Subscription, epoch: Epoch, passed: bool) {
        if let Some(observer) = &self.inner.observer {
            observer.observe(&Observation {
                subscription,
                input: &Input::Fence { epoch, passed },
                effects: &[],
            });
        }
    }

    /// Reports an input to the observer, then carries out its effects.
    fn apply(
        &self,
        state: &mut SubState,
        input: Input,
        effects: Vec<Effect>,
        dead: &mut DeadLetters,
    ) {
        let mut effects = effects;
        self.apply_sharing(state, input, &mut effects, dead, None);
    }

    /// As [`apply`](Self::apply), draining `effects` (so its buffer can be reused) and giving
    /// the deliveries of one message its shared encoding.
    fn apply_sharing(
        &self,
        state: &mut SubState,
        input: Input,
        effects: &mut Vec<Effect>,
        dead: &mut DeadLetters,
        shared: Option<(SystemId, &SharedEncoding)>,
    ) {
        if let Some(observer) = &self.inner.observer {
            observer.observe(&Observation {
                subscription: &state.core,
                input: &input,
                effects,
            });
        }
        // Only a member joining, leaving or being made active changes who leads: publishes,
        // acks and nacks (the hot path) skip all of this, unless a step-down is in progress,
        // which any of them may complete (docs/semantics.md#hand-over).
        let membership = !matches!(
            input,
            Input::Enqueue { .. } | Input::Ack { .. } | Input::Nack { .. }
        ) || state.step_down.is_some();
        let evict = matches!(input, Input::Evict);
        if membership {
            self.follow_step_down(state, effects);
        }
        // A singleton's leader changes with a confirmation, or when it leaves with no one to
        // follow it: when, by the clock read then, is what a watch says since
        // (docs/semantics.md#watching-leadership).
        if membership
            && state.core.spec().mode == crate::core::Mode::Singleton
            && !state.core.is_arbitrated()
        {
            let confirmed = effects.iter().find_map(|e| match e {
                Effect::Confirm { member, .. } => Some(*member),
                _ => None,
            });
            match (confirmed, &input) {
                (Some(member), _) => state.lead(Some(member), self.inner.clock.unix_millis()),
                (None, Input::Leave { member }) if state.leader == Some(*member) => {
                    state.lead(None, self.inner.clock.unix_millis());
                }
                _ => {}
            }
        }
        let leads_anew = membership && state.leadership.is_some();
        state.apply(effects, dead, shared);
        if leads_anew {
            state.refresh_leadership();
        }
        if membership {
            self.end_step_down(state);
            // An eviction (drop-oldest, once per publish under pressure) changes no membership.
            if !evict {
                self.note_change_of(state.core.id());
            }
        }
        self.account(state);
    }

    /// Brings the broker-wide memory account up to date with this subscription's footprint.
    /// Every input passes through [`apply`](Self::apply), so the account follows every change.
    ///
    /// Growth was reserved beforehand ([`reserve_memory`](Self::reserve_memory), credited to
    /// `state.accounted` or `state.accounted_drop_oldest` by the caller), so this only ever
    /// gives back what a change did not use: neither pool goes over its limit.
    fn account(&self, state: &mut SubState) {
        // Cluster mode: messages held back for order are the subscription's too.
        let messages = state.core.message_footprint() + state.held_back_bytes();
        let (general, drop_oldest) = match Pool::of_messages(state) {
            Pool::General => (state.core.fixed_footprint() + messages, 0),
            Pool::DropOldest => (state.core.fixed_footprint(), messages),
        };
        let c = &self.inner.counters;
        for (now, accounted, memory) in [
            (general, &mut state.accounted, &c.memory),
            (
                drop_oldest,
                &mut state.accounted_drop_oldest,
                &c.drop_oldest,
            ),
        ] {
            let before = std::mem::replace(accounted, now);
            // The common case (a reservation that was exactly used) touches no shared cache line.
            if now > before {
                memory.fetch_add(now - before, Ordering::Relaxed);
            } else if now < before {
                memory.fetch_sub(before - now, Ordering::Relaxed);
            }
        }
    }

    /// The counter and the limit of `pool`.
    fn pool(&self, pool: Pool) -> (&AtomicU64, u64) {
        let (c, limits) = (&self.inner.counters, &self.inner.limits);
        match pool {
            Pool::General => (&c.memory, limits.general_memory_bytes()),
            Pool::DropOldest => (&c.drop_oldest, limits.drop_oldest_memory_bytes()),
        }
    }

    /// Takes `needed` bytes out of the general pool, or refuses and takes nothing. One atomic
    /// step, so concurrent publishes to different subscriptions cannot each see room for
    /// themselves and together go over: the account stays at or under its limit.
    fn reserve_memory(&self, needed: u64) -> Result<(), Error> {
        self.reserve_from(Pool::General, needed)
    }

    /// As [`reserve_memory`](Self::reserve_memory), from `pool`.
    fn reserve_from(&self, pool: Pool, needed: u64) -> Result<(), Error> {
        let (memory, max) = self.pool(pool);
        memory
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(needed).filter(|total| *total <= max)
            })
            .map(|_| ())
            .map_err(|used| Error::MemoryBudget { used, needed, max })
    }

    /// Takes up to `wanted` bytes out of `pool`, as many as it has left, in one atomic step;
    /// returns how many it took. Drop-oldest subscriptions never wait for room: what is not
    /// granted their oldest messages make (or the new one is dropped).
    fn reserve_up_to(&self, pool: Pool, wanted: u64) -> u64 {
        let (memory, max) = self.pool(pool);
        let mut granted = 0;
        let _ = memory.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
            granted = wanted.min(max.saturating_sub(used));
            (granted > 0).then(|| used + granted)
        });
        granted
    }

    /// Gives back a reservation from the general pool that was not used.
    fn release_memory(&self, amount: u64) {
        self.release_to(Pool::General, amount);
    }

    /// Gives back a reservation from `pool` that was not used.
    fn release_to(&self, pool: Pool, amount: u64) {
        self.pool(pool).0.fetch_sub(amount, Ordering::Relaxed);
    }

    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.inner.limits
    }

    /// The floor of this run: every epoch, member id and system id it hands out is above it
    /// (the wall-clock time it started at, in microseconds since the Unix epoch).
    pub fn id_floor(&self) -> IdFloor {
        self.inner.id_floor
    }

    /// Whether the broker is shutting down (its member streams end).
    pub fn is_shutting_down(&self) -> bool {
        self.inner.shutting_down.load(Ordering::Acquire)
    }

    fn check_running(&self) -> Result<(), Error> {
        if self.inner.shutting_down.load(Ordering::Acquire) {
            return Err(Error::ShuttingDown);
        }
        Ok(())
    }

    /// Joins (creating if needed) a subscription; the returned stream carries this member's
    /// frames. `connection` is the connection the stream runs on (the fence for acks that name
    /// no member), when the transport tells it.
    ///
    /// # Errors
    /// [`Error::SettingsMismatch`], [`Error::BroadcastTaken`], [`Error::TooManyMembers`],
    /// [`Error::TooManySubscriptions`], [`Error::TooManyWildcardShapes`] or
    /// [`Error::ShuttingDown`]; nothing changes then.
    pub fn open(
        &self,
        request: &OpenRequest,
        connection: Option<ConnectionId>,
    ) -> Result<MemberStream, Error> {
        self.check_running()?;
        {
            let catalog = read(&self.inner.catalog);
            if let Some(cell) = catalog.get(&request.subscription_id) {
                // Holding the catalog lock keeps the expiry task from removing it meanwhile.
                return self.join(cell, request, connection);
            }
        }
        let mut catalog = write(&self.inner.catalog);
        if let Some(cell) = catalog.get(&request.subscription_id) {
            let cell = cell.clone();
            return self.join(&cell, request, connection);
        }
        let limits = &self.inner.limits;
        if catalog.by_key.len() >= limits.max_subscriptions {
            return Err(Error::TooManySubscriptions {
                max: limits.max_subscriptions,
            });
        }
        // What bounds every publish's walk (`PatternIndex::walk_bound`).
        let shapes = catalog.index.shapes_with(&request.spec.patterns);
        if shapes > limits.max_wildcard_shapes {
            return Err(Error::TooManyWildcardShapes {
                shapes,
                max: limits.max_wildcard_shapes,
            });
        }
        let cost = crate::core::subscription::subscription_cost(&request.spec);
        self.reserve_memory(cost)?;
        let name: Arc<str> = Arc::from(request.subscription_id.as_str());
        let mut core = Subscription::new(
            name.clone(),
            request.spec.clone(),
            QueueLimits {
                max_messages: limits.max_queue_messages,
                max_bytes: limits.max_queue_bytes,
                max_members: limits.max_members_per_subscription,
                idle_timeout: limits.idle_timeout,
            },
            catalog.retired,
            self.inner.clock.now(),
        );
        if self.inner.arbitrated {
            core.arbitrate();
        }
        catalog.last_key += 1;
        let key = catalog.last_key;
        let mut state = SubState::new(key, core);
        // The reservation is the new subscription's footprint so far.
        state.accounted = cost;
        let cell = Arc::new(Mutex::new(state));
        // Join before publishing the subscription in the catalog, so a refused join leaves no trace.
        let stream = match self.join(&cell, request, connection) {
            Ok(stream) => stream,
            Err(error) => {
                self.release_memory(cost);
                return Err(error);
            }
        };
        for pattern in &request.spec.patterns {
            catalog.index.insert(pattern, key);
        }
        catalog.by_key.insert(key, cell);
        if request.spec.overflow == crate::core::Overflow::DropOldest {
            catalog.drop_oldest.insert(key);
        }
        catalog.by_name.insert(name.clone(), key);
        tracing::info!(subscription = %name, mode = %request.spec.mode, "subscription created");
        Ok(stream)
    }

    fn join(
        &self,
        cell: &Arc<SubCell>,
        request: &OpenRequest,
        connection: Option<ConnectionId>,
    ) -> Result<MemberStream, Error> {
        let mut dead = DeadLetters::new();
        let stream = {
            let mut state = Locked::new(cell);
            // Checked again under the lock: `shutdown` ends the outlets it finds under this same
            // lock, so a member attached after that would never be told.
            self.check_running()?;
            let cost = crate::core::subscription::MEMBER_OVERHEAD;
            self.reserve_memory(cost)?;
            let (member, effects) = match state.core.join(&request.spec, request.member) {
                Ok(joined) => joined,
                Err(error) => {
                    self.release_memory(cost);
                    return Err(error);
                }
            };
            state.accounted += cost;
            if state.core.member_count() == 1 {
                lock(&self.inner.idle).remove(state.key);
            }
            let _span = logs::member_span(&state, member).entered();
            state.attach(
                member,
                connection,
                request.metadata.clone(),
                self.inner.clock.unix_millis(),
            );
            self.apply(
                &mut state,
                Input::Join {
                    member,
                    connection,
                    priority: request.member.priority,
                },
                effects,
                &mut dead,
            );
            tracing::debug!(subscription = %state.core.id(), member, "member joined");
            self.inner.counters.members.fetch_add(1, Ordering::Relaxed);
            MemberStream::new(self.clone(), cell.clone(), member)
        };
        self.publish_dead_letters(dead);
        Ok(stream)
    }

    /// A member's stream ended: requeue what it held, promote if it was active.
    fn leave(&self, cell: &Arc<SubCell>, member: MemberId) {
        let mut dead = DeadLetters::new();
        let now = self.inner.clock.now();
        let emptied = {
            let mut state = Locked::new(cell);
            state.detach(member);
            self.inner.counters.members.fetch_sub(1, Ordering::Relaxed);
            let _span = logs::member_span(&state, member).entered();
            let effects = state.core.leave(member, now);
            let promoted = effects.iter().any(|e| matches!(e, Effect::Confirm { .. }));
            // Members leave en masse during shutdown; those promotions are not news.
            if !self.inner.shutting_down.load(Ordering::Acquire) {
                for effect in &effects {
                    if let Effect::Confirm {
                        member: promoted,
                        epoch,
                    } = effect
                    {
                        tracing::info!(subscription = %state.core.id(), left = member, promoted, epoch, "standby promoted to active");
                    }
                }
            }
            self.apply(&mut state, Input::Leave { member }, effects, &mut dead);
            if promoted {
                self.time_failover(now);
            }
            tracing::debug!(subscription = %state.core.id(), member, "member left");
            let expires_at = state.core.expires_at();
            if let Some(deadline) = expires_at {
                lock(&self.inner.idle).set(state.key, deadline);
            }
            expires_at.is_some()
        };
        self.publish_dead_letters(dead);
        if emptied {
            self.inner.expiry_wake.notify_one();
        }
    }

    fn with_subscription<T>(
        &self,
        subscription_id: &str,
        f: impl FnOnce(&mut SubState, &mut DeadLetters) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let mut dead = DeadLetters::new();
        let result = {
            let catalog = read(&self.inner.catalog);
            let cell = catalog
                .get(subscription_id)
                .ok_or_else(|| Error::SubscriptionNotFound(subscription_id.to_string()))?;
            let mut state = Locked::new(cell);
            f(&mut state, &mut dead)
        };
        self.publish_dead_letters(dead);
        result
    }

    /// Acknowledges a delivered message; `fence` says it comes from the holder.
    ///
    /// # Errors
    /// [`Error::SubscriptionNotFound`], [`Error::NotInFlight`], [`Error::NotHolder`],
    /// [`Error::StaleConnection`], [`Error::NotYetSent`] or [`Error::AckFree`].
    pub fn ack(
        &self,
        subscription_id: &str,
        fence: Fence,
        system_id: SystemId,
    ) -> Result<(), Error> {
        self.with_subscription(subscription_id, |state, dead| {
            self.settle_locked(
                state,
                fence,
                system_id,
                Settlement::Ack,
                &SubState::unsent,
                dead,
            )
        })
    }

    /// Returns a delivered message for redelivery; fenced like [`ack`](Self::ack).
    ///
    /// # Errors
    /// As [`ack`](Self::ack).
    pub fn nack(
        &self,
        subscription_id: &str,
        fence: Fence,
        system_id: SystemId,
    ) -> Result<(), Error> {
        self.with_subscription(subscription_id, |state, dead| {
            self.settle_locked(
                state,
                fence,
                system_id,
                Settlement::Nack,
                &SubState::unsent,
                dead,
            )
        })
    }

    /// Ack, nack or release from a client, under the subscription's lock. A refused one is
    /// reported to the observer too, with no effects, and changes nothing. `unsent` says whether
    /// a member's stream has not written a message's frame yet.
    fn settle_locked(
        &self,
        state: &mut SubState,
        fence: Fence,
        system_id: SystemId,
        kind: Settlement,
        unsent: &Unsent<'_>,
        dead: &mut DeadLetters,
    ) -> Result<(), Error> {
        let connection = match fence {
            Fence::Member(_) => None,
            Fence::Connection(c) => Some(c),
        };
        let published_at = match kind {
            Settlement::Ack => self.ack_published_at(state, system_id),
            Settlement::Nack | Settlement::Release => None,
        };
        let result = self
            .resolve_fence(state, fence, system_id, unsent)
            .and_then(|member| {
                self.settle_gated(state, member, system_id, kind)?;
                match kind {
                    Settlement::Ack => state.core.ack(member, system_id),
                    Settlement::Nack => state.core.nack(member, system_id),
                    // docs/semantics.md#releases
                    Settlement::Release => state.core.release(member, system_id),
                }
                .map(|effects| (member, effects))
            });
        let (member, effects, outcome) = match result {
            Ok((member, effects)) => (member, effects, Ok(())),
            Err(error) => (
                match fence {
                    Fence::Member(m) => Some(m),
                    Fence::Connection(_) => None,
                },
                Vec::new(),
                Err(error),
            ),
        };
        let accepted = outcome.is_ok();
        let input = match kind {
            Settlement::Ack => Input::Ack {
                member,
                connection,
                system_id,
                accepted,
            },
            Settlement::Nack | Settlement::Release => Input::Nack {
                member,
                connection,
                system_id,
                accepted,
                release: kind == Settlement::Release,
            },
        };
        self.apply(state, input, effects, dead);
        if accepted {
            self.time_ack(published_at);
        }
        outcome
    }

    /// A gateway's arbitrated singleton whose lease ended refuses to settle a held message
    /// (docs/semantics.md#cluster-lease-checks): the gateway would never tell JetStream, so an
    /// ack answered now would be a promise broken when the member promoted next gets the
    /// message again. Refused, nothing changes, and the member's stream is about to end.
    fn settle_gated(
        &self,
        state: &SubState,
        member: Option<MemberId>,
        system_id: SystemId,
        kind: Settlement,
    ) -> Result<(), Error> {
        let Some(gate) = self.inner.settle_gate.get() else {
            return Ok(());
        };
        // Only the holder's settle would be applied: any other gets its usual answer.
        if !state.core.is_arbitrated()
            || member.is_none()
            || state.core.holder(system_id) != member
            || gate()
        {
            return Ok(());
        }
        let what = match kind {
            Settlement::Ack => "ack",
            Settlement::Nack => "nack",
            Settlement::Release => "release",
        };
        Err(Error::Unavailable(format!(
            "this gateway's cluster lease ended (the gateway was paused, or lost the coordination bucket): the {what} of message {system_id} of subscription {} was not applied; this member's stream ends, and the member promoted next gets the message",
            state.core.id()
        )))
    }

    /// Turns a fence into the member the core should check against, refusing what can never be
    /// accepted: acks on an ack-free subscription, acks over another connection than the
    /// holder's, and acks for a message whose frame its holder's stream has not written yet
    /// (a client cannot have seen it, so such an ack is a guess).
    fn resolve_fence(
        &self,
        state: &mut SubState,
        fence: Fence,
        system_id: SystemId,
        unsent: &Unsent<'_>,
    ) -> Result<Option<MemberId>, Error> {
        let subscription = |state: &SubState| state.core.id().to_string();
        if state.core.spec().ack_mode == AckMode::None {
            return Err(Error::AckFree(subscription(state)));
        }
        let member = match fence {
            Fence::Member(member) => member,
            Fence::Connection(connection) => match state.core.holder(system_id) {
                // Not in flight: the core says so.
                None => return Ok(None),
                Some(holder)
                    if state.connection_of(holder) == Some(connection)
                        || planted(PlantedBug::ConnectionFenceIgnored) =>
                {
                    holder
                }
                Some(_) => {
                    state.core.note_stale();
                    return Err(Error::StaleConnection {
                        subscription: subscription(state),
                        system_id,
                    });
                }
            },
        };
        if unsent(state, member, system_id) {
            return Err(Error::NotYetSent {
                subscription: subscription(state),
                system_id,
                member,
            });
        }
        Ok(Some(member))
    }

    /// Inspects one subscription.
    ///
    /// # Errors
    /// [`Error::SubscriptionNotFound`].
    pub fn describe(&self, subscription_id: &str) -> Result<SubscriptionView, Error> {
        let now = self.inner.clock.now();
        self.with_subscription(subscription_id, |state, _| Ok(view(state, now)))
    }

    /// Inspects every subscription, in id order, plus broker-wide counters.
    pub fn list(&self) -> (Vec<SubscriptionView>, BrokerStats) {
        self.list_page(None, usize::MAX)
    }

    /// Inspects up to `limit` subscriptions whose ids come after `after` (all, from the first,
    /// when `None`), in id order, plus broker-wide counters.
    ///
    /// The catalog is read-locked only to pick the page's subscriptions; each is then locked
    /// briefly on its own to build its view, so a large listing never holds up publishes.
    pub fn list_page(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> (Vec<SubscriptionView>, BrokerStats) {
        use std::ops::Bound;
        let (page, subscriptions) = {
            let catalog = read(&self.inner.catalog);
            let start = after.map_or(Bound::Unbounded, Bound::Excluded);
            let page: Vec<Arc<SubCell>> = catalog
                .by_name
                .range::<str, _>((start, Bound::Unbounded))
                .filter_map(|(_, key)| catalog.by_key.get(key))
                .take(limit)
                .cloned()
                .collect();
            (page, catalog.by_key.len() as u64)
        };
        let now = self.inner.clock.now();
        let views: Vec<_> = page
            .iter()
            .map(|cell| view(&Locked::new(cell), now))
            .collect();
        let stats = self.stats(subscriptions);
        (views, stats)
    }

    /// Stops taking new work and ends every member stream with [`Error::ShuttingDown`].
    pub fn shutdown(&self) {
        self.inner.shutting_down.store(true, Ordering::Release);
        let catalog = read(&self.inner.catalog);
        for cell in catalog.by_key.values() {
            Locked::new(cell).end_all(&Error::ShuttingDown);
        }
        self.inner.expiry_wake.notify_one();
    }
}

fn view(state: &SubState, now: Duration) -> SubscriptionView {
    let core = &state.core;
    // Cluster mode: a message held back for order was pulled and waits here, as queued ones do.
    let held_back = state.held_back.len() as u64;
    let held_back_bytes =
        state.held_back_bytes() - held_back * crate::core::subscription::MESSAGE_OVERHEAD;
    SubscriptionView {
        subscription_id: core.id().clone(),
        spec: core.spec().clone(),
        members: core.member_infos(),
        epoch: core.epoch(),
        queued_messages: core.queued() as u64 + held_back,
        queued_bytes: core.queued_bytes() + held_back_bytes,
        in_flight: core.in_flight() as u64,
        counters: *core.counters(),
        expires_in: core.expires_at().map(|at| at.saturating_sub(now)),
        metadata: state.metadata(),
        stepping_down: core.stepping_down().map(|step| step.member),
        joined_unix_ms: state.joined(),
    }
}

#[cfg(test)]
mod publish_tests;
#[cfg(test)]
mod tests;
