//! What changed, for a watcher that keeps its own copy of every subscription (the console,
//! docs/operations.md#console): a count that wakes it, and the ids of the subscriptions whose
//! membership or leadership changed since it last asked (joins, leaves, promotions,
//! step-downs, deletes, expiries). Publishes and acks never touch it; their effect is read
//! with [`Broker::activity`], which takes no allocation per subscription.
//!
//! One taker: [`Broker::take_changes`] empties the set. It holds at most [`MAX_CHANGED`] ids;
//! past that it only says "everything" (the taker then looks at every subscription).

use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex, PoisonError, atomic::Ordering},
};

use super::{Broker, BrokerStats, Locked};
use crate::{core::Counters, sync::read};

/// Ids remembered between two takes; past it, "everything changed".
pub const MAX_CHANGED: usize = 10_000;

/// The changes noted since the last take.
#[derive(Debug, Default)]
pub(super) struct Changes {
    /// Wakes the taker (a count; changes coalesce).
    pub(super) wake: tokio::sync::watch::Sender<u64>,
    pub(super) changed: Mutex<Changed>,
}

/// What changed since the last [`Broker::take_changes`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changed {
    /// The subscriptions whose membership or leadership changed (or that went), in id order.
    pub ids: BTreeSet<Arc<str>>,
    /// More changed than [`MAX_CHANGED`]: look at every subscription.
    pub everything: bool,
}

/// What publishes and acks move in a subscription, read without building its view.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Activity {
    /// Messages waiting (at a gateway: also those held back for order).
    pub queued_messages: u64,
    /// Messages delivered, not acked yet.
    pub in_flight: u64,
    /// Its counters.
    pub counters: Counters,
}

impl Broker {
    /// Notes that subscription `id`'s membership or leadership changed, and wakes the taker.
    pub(super) fn note_change_of(&self, id: &Arc<str>) {
        {
            let mut changed = self
                .inner
                .changes
                .changed
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if !changed.everything {
                changed.ids.insert(id.clone());
                if changed.ids.len() > MAX_CHANGED {
                    changed.ids.clear();
                    changed.everything = true;
                }
            }
        }
        self.note_change();
    }

    /// Wakes whoever waits on [`changes`](Self::changes) without naming a subscription (at a
    /// gateway: the cluster's lines moved).
    pub fn note_change(&self) {
        self.inner
            .changes
            .wake
            .send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A receiver that wakes after each change (changes coalesce).
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.changes.wake.subscribe()
    }

    /// The changes noted since the last call, emptied.
    pub fn take_changes(&self) -> Changed {
        std::mem::take(
            &mut *self
                .inner
                .changes
                .changed
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }

    /// Every subscription's [`Activity`], in id order, and the broker-wide counters: each
    /// subscription locked briefly on its own, as a listing does.
    pub fn activity(&self) -> (Vec<(Arc<str>, Activity)>, BrokerStats) {
        let (cells, subscriptions) = {
            let catalog = read(&self.inner.catalog);
            let cells: Vec<_> = catalog
                .by_name
                .iter()
                .filter_map(|(name, key)| Some((name.clone(), catalog.by_key.get(key)?.clone())))
                .collect();
            (cells, catalog.by_key.len() as u64)
        };
        let activity = cells
            .into_iter()
            .map(|(name, cell)| {
                let state = Locked::new(&cell);
                let core = &state.core;
                let activity = Activity {
                    queued_messages: core.queued() as u64 + state.held_back.len() as u64,
                    in_flight: core.in_flight() as u64,
                    counters: *core.counters(),
                };
                (name, activity)
            })
            .collect();
        (activity, self.stats(subscriptions))
    }

    /// The broker-wide counters now.
    pub fn stats_now(&self) -> BrokerStats {
        let subscriptions = read(&self.inner.catalog).by_key.len() as u64;
        self.stats(subscriptions)
    }

    /// The broker-wide counters, with `subscriptions` live.
    pub(super) fn stats(&self, subscriptions: u64) -> BrokerStats {
        let c = &self.inner.counters;
        // Each pool read once, so the general part (the total less the drop-oldest part) is one
        // reading of the general pool, never a mix of two instants.
        let (general, drop_oldest) = (
            c.memory.load(Ordering::Relaxed),
            c.drop_oldest.load(Ordering::Relaxed),
        );
        BrokerStats {
            published: c.published.load(Ordering::Relaxed),
            unrouted: c.unrouted.load(Ordering::Relaxed),
            rejected_publishes: c.rejected_publishes.load(Ordering::Relaxed),
            subscriptions_expired: c.subscriptions_expired.load(Ordering::Relaxed),
            messages_expired: c.messages_expired.load(Ordering::Relaxed),
            subscriptions_deleted: c.subscriptions_deleted.load(Ordering::Relaxed),
            messages_deleted: c.messages_deleted.load(Ordering::Relaxed),
            unconfirmed_acks: c.unconfirmed_acks.load(Ordering::Relaxed),
            lease_lapses: c.lease_lapses.load(Ordering::Relaxed),
            lease_lapses_renewed: c.lease_lapses_renewed.load(Ordering::Relaxed),
            subscriptions,
            members: c.members.load(Ordering::Relaxed),
            memory_accounted_bytes: general + drop_oldest,
            memory_drop_oldest_bytes: drop_oldest,
            max_drop_oldest_memory_bytes: self.inner.limits.drop_oldest_memory_bytes(),
            max_memory_bytes: self.inner.limits.max_memory_bytes,
        }
    }
}
