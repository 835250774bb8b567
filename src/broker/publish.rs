//! Publishing: routing a message to the subscriptions whose patterns match its topic, all or
//! nothing, and dead letters.
//!
//! A publish takes the catalog's read lock, routes its topic, locks every matched subscription
//! (in key order, so concurrent publishes cannot deadlock), takes its id while holding them (so
//! ids increase along every queue) and queues it in each. [`Broker::publish_each`] does the
//! same for a run of messages to one topic with one routing and one round of locking: each
//! message is still checked, refused or queued on its own, with its own id, in order.

use smallvec::SmallVec;

use super::{
    BatchError, Broker, Catalog, DeadLetters, Input, Pool, Published, SharedEncoding,
    member::Locked,
};
use crate::{
    core::{Draft, Error, PublishFence, Topic, index::Matches, subscription::MESSAGE_OVERHEAD},
    sync::{Ordering, read},
};

/// Most messages [`Broker::publish_each`] queues under one round of locks: while it holds them,
/// the matched subscriptions' streams wait to take their frames.
pub const RUN_LIMIT: usize = 64;

/// Most queue insertions (messages times matched subscriptions) under one round of locks, so a
/// round's hold stays short however widely a topic fans out: 64 messages to one subscription,
/// 32 to eight, one at a time to 256 or more.
pub const ROUND_INSERTIONS: usize = 256;

/// How many messages of a run one round queues when they match `matched` subscriptions.
pub fn round_len(matched: usize) -> usize {
    (ROUND_INSERTIONS / matched.max(1)).clamp(1, RUN_LIMIT)
}

impl Broker {
    /// Publishes one message to every subscription whose patterns match its topic.
    ///
    /// # Errors
    /// [`Error::QueueFull`] if any matching subscription is full (then no subscription queues
    /// it), or [`Error::ShuttingDown`].
    pub fn publish(&self, draft: Draft) -> Result<Published, Error> {
        self.check_running()?;
        let mut dead = DeadLetters::new();
        let published = {
            let catalog = read(&self.inner.catalog);
            let (mut states, fenced) = lock_matching(&catalog, draft.topic(), draft.fence())?;
            // Checked while the fence's lock is held, through the store: no promotion falls
            // between (docs/semantics.md#fenced-publish).
            fenced.check(self, &states, draft.fence()).and_then(|()| {
                let now_ms = self.inner.clock.unix_millis();
                self.publish_locked(&catalog, &mut states, draft, now_ms, &mut dead)
            })
        };
        self.publish_dead_letters(dead);
        published
    }

    /// Publishes `drafts` in order, each exactly as [`publish`](Self::publish) would (its own
    /// check, id, refusal and result, pushed to `results` in order), but a run of consecutive
    /// drafts to one topic is routed once and queued under one round of locks (at most
    /// [`round_len`] drafts a round), and its messages share one publish time (the clock is
    /// read once a round). A refusal does not stop the rest; once the broker is shutting down,
    /// every draft left is refused with [`Error::ShuttingDown`].
    pub fn publish_each(
        &self,
        drafts: impl IntoIterator<Item = Draft>,
        results: &mut Vec<Result<Published, Error>>,
    ) {
        let mut drafts = drafts.into_iter().peekable();
        while let Some(first) = drafts.next() {
            if let Err(error) = self.check_running() {
                results.push(Err(error));
                continue;
            }
            let mut dead = DeadLetters::new();
            {
                let catalog = read(&self.inner.catalog);
                let (mut states, fenced) =
                    match lock_matching(&catalog, first.topic(), first.fence()) {
                        Ok(locked) => locked,
                        Err(error) => {
                            results.push(Err(error));
                            continue;
                        }
                    };
                let topic = first.topic().clone();
                let fence = first.fence().cloned();
                // One publish time for the round (its hold is bounded by `round_len`).
                let now_ms = self.inner.clock.unix_millis();
                let round = round_len(states.len());
                let mut next = Some(first);
                let mut taken = 0;
                while let Some(draft) = next.take() {
                    // Checked per message: shutdown may start while this round holds the locks
                    // (it then waits for them to end the subscriptions' outlets).
                    let published = self
                        .check_running()
                        .and_then(|()| fenced.check(self, &states, draft.fence()))
                        .and_then(|()| {
                            self.publish_locked(&catalog, &mut states, draft, now_ms, &mut dead)
                        });
                    results.push(published);
                    taken += 1;
                    if taken < round {
                        next = drafts.next_if(|draft| {
                            *draft.topic() == topic && draft.fence() == fence.as_ref()
                        });
                    }
                }
            }
            self.publish_dead_letters(dead);
        }
    }

    /// One publish to the subscriptions in `states`, locked by the caller in key order, at
    /// `now_ms` (Unix milliseconds).
    fn publish_locked(
        &self,
        catalog: &Catalog,
        states: &mut [Locked],
        draft: Draft,
        now_ms: u64,
        dead: &mut DeadLetters,
    ) -> Result<Published, Error> {
        let size = draft.size();
        let share = size as u64 + MESSAGE_OVERHEAD;
        // Only reject-publish subscriptions can refuse: their queue limits and their room in the
        // general pool, checked for all of them before anything changes. Drop-oldest ones take
        // what their own pool can grant and make the rest by dropping their oldest, below
        // (docs/semantics.md#memory-budget).
        let strict = states
            .iter()
            .filter(|state| Pool::of_messages(state) == Pool::General)
            .count();
        let cost = share * strict as u64;
        let mut refusal = (cost > 0)
            .then(|| self.reserve_memory(cost).err())
            .flatten();
        let reserved = refusal.is_none();
        for state in states.iter_mut() {
            if let Err(error) = state.core.check_publish(size) {
                // Every full subscription counts the refusal; the first one names it.
                state.core.note_rejected();
                super::logs::queue_full(state, &error);
                refusal.get_or_insert(error);
            }
        }
        if let Some(error) = refusal {
            if reserved && cost > 0 {
                self.release_memory(cost);
            }
            self.inner
                .counters
                .rejected_publishes
                .fetch_add(1, Ordering::Relaxed);
            return Err(error);
        }
        // Taken while holding every matched lock, so ids increase along every queue.
        let system_id = self.inner.last_system_id.fetch_add(1, Ordering::Relaxed) + 1;
        let message = draft.into_message(system_id, now_ms);
        // Fan-out: the frames delivering this message share its encoding (one allocation per
        // publish, so only when there is more than one subscription to share it).
        let encoding = (states.len() > 1).then(SharedEncoding::default);
        let shared = encoding.as_ref().map(|encoding| (system_id, encoding));
        // The drop-oldest subscriptions' room, reserved for all of them at once: where the pool is
        // short, abandoned backlogs (no member) make room first, those this publish reaches
        // (their locks are held here) and then others, before any live subscription's
        // messages go (docs/semantics.md#memory-budget).
        // (One the message cannot fit even emptied drops only the message, and takes no room.)
        let takes_room = |state: &Locked| {
            Pool::of_messages(state) == Pool::DropOldest && state.core.could_hold(size)
        };
        let dropping = states.iter().filter(|state| takes_room(state)).count() as u64;
        let mut pooled = 0;
        if dropping > 0 {
            let demand = share * dropping;
            pooled = self.reserve_up_to(Pool::DropOldest, demand);
            if pooled < demand {
                let mut freed = 0;
                for state in states.iter_mut() {
                    if freed < demand - pooled
                        && takes_room(state)
                        && state.core.member_count() == 0
                    {
                        freed += self.evict_from(state, demand - pooled - freed);
                    }
                }
                if freed < demand - pooled {
                    freed += self.evict(catalog, demand - pooled - freed, true);
                }
                if freed > 0 {
                    pooled += self.reserve_up_to(Pool::DropOldest, demand - pooled);
                }
            }
        }
        // One buffer for every subscription's effects, kept by the first between publishes.
        let mut effects = states
            .first_mut()
            .map(|state| state.take_effects_buffer())
            .unwrap_or_default();
        for state in states.iter_mut() {
            match Pool::of_messages(state) {
                Pool::General => {
                    state.accounted += share;
                    state.core.enqueue_into(message.clone(), &mut effects);
                }
                Pool::DropOldest => {
                    let granted = if takes_room(state) {
                        let pre = pooled.min(share);
                        pooled -= pre;
                        state.accounted_drop_oldest += pre;
                        pre + self.grant_drop_oldest(catalog, state, share - pre)
                    } else {
                        0
                    };
                    state
                        .core
                        .enqueue_within(message.clone(), granted, &mut effects);
                }
            }
            let input = Input::Enqueue { system_id };
            self.apply_sharing(state, input, &mut effects, dead, shared);
        }
        if pooled > 0 {
            self.release_to(Pool::DropOldest, pooled);
        }
        if let Some(state) = states.first_mut() {
            state.keep_effects_buffer(effects);
        }
        self.inner
            .counters
            .published
            .fetch_add(1, Ordering::Relaxed);
        if states.is_empty() {
            self.inner.counters.unrouted.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Published {
            system_id,
            queued_for: states.len() as u32,
        })
    }
    /// Publishes validated messages in order, stopping at the first refusal.
    ///
    /// # Errors
    /// A [`BatchError`] with what was published before the refused message.
    pub fn publish_batch(&self, drafts: Vec<Draft>) -> Result<Vec<Published>, BatchError> {
        let mut published = Vec::with_capacity(drafts.len());
        for draft in drafts {
            match self.publish(draft) {
                Ok(p) => published.push(p),
                Err(error) => return Err(BatchError { published, error }),
            }
        }
        Ok(published)
    }

    /// Publishes dead letters; each skips the subscription it came from (so a subscription whose
    /// dead-letter topic matches its own patterns cannot loop) and is dropped and counted where a
    /// queue is full. Queuing never produces new dead letters, so this does not recurse.
    pub(super) fn publish_dead_letters(&self, dead: DeadLetters) {
        if self.inner.upstream_dead_letters {
            return;
        }
        for (origin, draft) in dead {
            let catalog = read(&self.inner.catalog);
            let mut keys = Matches::new();
            catalog.index.matches_into(draft.topic(), &mut keys);
            // As in `publish`: every matched lock first (key order), then the id, so a
            // concurrent publish cannot queue id N+1 ahead of this dead letter's N and ids keep
            // increasing along every queue (a consumer deduplicating by high-water mark relies
            // on it).
            let mut states: Vec<_> = keys
                .iter()
                .filter(|key| **key != origin)
                .filter_map(|key| catalog.by_key.get(key))
                .map(|cell| Locked::new(cell))
                .collect();
            let system_id = self.inner.last_system_id.fetch_add(1, Ordering::Relaxed) + 1;
            let message = draft.into_message(system_id, self.inner.clock.unix_millis());
            let mut ignored = DeadLetters::new();
            if states.is_empty() {
                self.inner.counters.unrouted.fetch_add(1, Ordering::Relaxed);
            }
            let share = message.size() as u64 + MESSAGE_OVERHEAD;
            for state in &mut states {
                // A dead letter is not refused back to anyone: where the budget has no room
                // for it, it is dropped and counted like one that meets a full queue.
                let effects = match Pool::of_messages(state) {
                    Pool::General if self.reserve_memory(share).is_ok() => {
                        state.accounted += share;
                        state.core.enqueue_or_drop(message.clone())
                    }
                    Pool::General => state.core.drop_full(system_id),
                    Pool::DropOldest => {
                        let granted = if state.core.could_hold(message.size()) {
                            self.grant_drop_oldest(&catalog, state, share)
                        } else {
                            0
                        };
                        let mut effects = Vec::new();
                        state
                            .core
                            .enqueue_within(message.clone(), granted, &mut effects);
                        effects
                    }
                };
                self.apply(state, Input::Enqueue { system_id }, effects, &mut ignored);
            }
            self.inner
                .counters
                .published
                .fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Most drop-oldest subscriptions one publish looks at to make room in the drop-oldest pool
/// (per pass): the look is a `try_lock`, and the scan resumes where the last one took room.
pub const EVICT_SCAN: usize = 64;

impl Broker {
    /// Reserves room for a message of `share` bytes (with its overhead) to a drop-oldest
    /// subscription, credited to it: what the pool has, and, where that and the subscription's
    /// own oldest messages together fall short, what other drop-oldest subscriptions' oldest
    /// make (docs/semantics.md#memory-budget). Returns what it reserved: the subscription's
    /// own drops make the rest, or the message is dropped.
    fn grant_drop_oldest(&self, catalog: &Catalog, state: &mut Locked, share: u64) -> u64 {
        let mut granted = self.reserve_up_to(Pool::DropOldest, share);
        if granted < share && self.evict(catalog, share - granted, true) > 0 {
            granted += self.reserve_up_to(Pool::DropOldest, share - granted);
        }
        let own = state.core.droppable_footprint();
        if granted + own < share && self.evict(catalog, share - granted - own, false) > 0 {
            granted += self.reserve_up_to(Pool::DropOldest, share - granted);
        }
        state.accounted_drop_oldest += granted;
        granted
    }

    /// Drops `victim`'s oldest messages until `needed` bytes are freed or it has none left to
    /// drop (an [`Input::Evict`]); returns the bytes freed, given back to the pool.
    fn evict_from(&self, victim: &mut Locked, needed: u64) -> u64 {
        let mut effects = Vec::new();
        let mut freed = 0;
        while freed < needed {
            match victim.core.evict_oldest(&mut effects) {
                Some(bytes) => freed += bytes,
                None => break,
            }
        }
        if !effects.is_empty() {
            self.apply(victim, Input::Evict, effects, &mut DeadLetters::new());
        }
        freed
    }

    /// Makes at least `needed` bytes of room in the drop-oldest pool by dropping the oldest
    /// messages of other drop-oldest subscriptions (only those with no member, abandoned and
    /// kept until they expire, when `abandoned_only`), round robin from where the last
    /// eviction stopped.
    /// Each is only `try_lock`ed (the caller holds other subscriptions' locks, out of key order
    /// here), so a subscription in use is skipped. Returns the bytes freed (given back to the
    /// pool, where the caller reserves them).
    fn evict(&self, catalog: &Catalog, needed: u64, abandoned_only: bool) -> u64 {
        let start = self.inner.evict_cursor.load(Ordering::Relaxed);
        let mut freed = 0;
        let keys = (catalog.drop_oldest.range(start + 1..))
            .chain(catalog.drop_oldest.range(..=start))
            .take(EVICT_SCAN);
        for key in keys {
            let Some(cell) = catalog.by_key.get(key) else {
                continue;
            };
            let Some(mut victim) = Locked::try_new(cell) else {
                continue;
            };
            if abandoned_only && victim.core.member_count() > 0 {
                continue;
            }
            let dropped = self.evict_from(&mut victim, needed - freed);
            if dropped == 0 {
                continue;
            }
            self.inner.evict_cursor.store(*key, Ordering::Relaxed);
            freed += dropped;
            if freed >= needed {
                break;
            }
        }
        freed
    }
}

/// Locks every subscription whose patterns match `topic`, in key order: every multi-lock
/// acquisition follows it, so publishes cannot deadlock. A fenced publish's subscription is
/// locked in the same order: [`Fenced::Matched`] when it is among the matched (its position),
/// else held apart ([`Fenced::Apart`]) until the publish is done.
fn lock_matching<'a>(
    catalog: &'a Catalog,
    topic: &Topic,
    fence: Option<&PublishFence>,
) -> Result<(SmallVec<[Locked<'a>; 16]>, Fenced<'a>), Error> {
    let mut keys = Matches::new();
    catalog.index.matches_into(topic, &mut keys);
    let Some(fence) = fence else {
        let states = keys
            .iter()
            .filter_map(|key| catalog.by_key.get(key))
            .map(|cell| Locked::new(cell))
            .collect();
        return Ok((states, Fenced::No));
    };
    let Some(&fence_key) = catalog.by_name.get(&*fence.subscription_id) else {
        return Err(Error::SubscriptionNotFound(
            fence.subscription_id.to_string(),
        ));
    };
    let mut states = SmallVec::new();
    let mut fenced = Fenced::No;
    let mut apart_locked = false;
    for &key in keys.iter() {
        if !apart_locked && fence_key < key {
            fenced = Fenced::Apart(Locked::new(&catalog.by_key[&fence_key]));
            apart_locked = true;
        }
        let Some(cell) = catalog.by_key.get(&key) else {
            continue;
        };
        if key == fence_key {
            fenced = Fenced::Matched(states.len());
            apart_locked = true;
        }
        states.push(Locked::new(cell));
    }
    if !apart_locked {
        fenced = Fenced::Apart(Locked::new(&catalog.by_key[&fence_key]));
    }
    Ok((states, fenced))
}

/// Where a fenced publish's subscription is locked ([`lock_matching`]).
enum Fenced<'a> {
    /// The publish is not fenced.
    No,
    /// Among the matched subscriptions, at this position.
    Matched(usize),
    /// Not matched: locked only for the check.
    Apart(Locked<'a>),
}

impl Fenced<'_> {
    /// Whether `fence` lets a publish be stored now (docs/semantics.md#fenced-publish),
    /// reported to `broker`'s observer as an [`Input::Fence`].
    fn check(
        &self,
        broker: &Broker,
        states: &[Locked],
        fence: Option<&PublishFence>,
    ) -> Result<(), Error> {
        let state = match self {
            Fenced::No => return Ok(()),
            Fenced::Matched(at) => &states[*at],
            Fenced::Apart(state) => state,
        };
        let Some(fence) = fence else {
            return Ok(());
        };
        let checked = state.core.check_fence(fence.epoch);
        broker.observe_fence(&state.core, fence.epoch, checked.is_ok());
        checked
    }
}
