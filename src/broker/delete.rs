//! `DeleteSubscription` on the broker (docs/semantics.md#deleting): a subscription with no
//! member joined is removed with its settings and what it holds, so its id can be joined again
//! with other settings.
//!
//! It takes the catalog's write lock and then the subscription's lock, as expiry does, so a
//! join either finds the subscription whole (and, joined, makes the delete refuse) or finds
//! none and creates a new one: nothing in between is ever seen. Publishes and acks read the
//! catalog under its read lock, so none holds the subscription meanwhile.

use super::{Broker, Input};
use crate::{
    core::Error,
    sync::{Ordering, lock, write},
};

/// What a delete discarded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Deleted {
    /// Messages the subscription held (queued, or given back by a member that left), discarded
    /// with it; counted in `messages_deleted`.
    pub discarded_messages: u64,
}

impl Broker {
    /// Removes a subscription that has no member joined: its settings, its queue, its counters
    /// and its patterns in the routing index. Its memory goes back to both pools at once.
    ///
    /// # Errors
    /// [`Error::SubscriptionNotFound`]; [`Error::MembersJoined`] while any member is joined
    /// (nothing changes then).
    pub fn delete(&self, subscription_id: &str) -> Result<Deleted, Error> {
        self.check_running()?;
        let mut catalog = write(&self.inner.catalog);
        let Some(&key) = catalog.by_name.get(subscription_id) else {
            return Err(Error::SubscriptionNotFound(subscription_id.to_string()));
        };
        let Some(cell) = catalog.by_key.get(&key).cloned() else {
            return Err(Error::SubscriptionNotFound(subscription_id.to_string()));
        };
        let mut state = lock(&cell);
        let members = state.core.member_count();
        if members > 0 {
            return Err(Error::MembersJoined {
                subscription: subscription_id.to_string(),
                members: members as u64,
                where_: "",
            });
        }
        // Its expiry timer goes with it (a leaf lock, taken under the subscription's as a
        // leave does).
        lock(&self.inner.idle).remove(key);
        let held = self.remove_locked(&mut catalog, key, &mut state, |held| Input::Delete { held });
        let c = &self.inner.counters;
        c.subscriptions_deleted.fetch_add(1, Ordering::Relaxed);
        c.messages_deleted.fetch_add(held as u64, Ordering::Relaxed);
        tracing::info!(subscription = %state.core.id(), messages = held, "subscription deleted");
        Ok(Deleted {
            discarded_messages: held as u64,
        })
    }

    /// Takes the subscription `key` (locked as `state`) out of `catalog`, as a delete and an
    /// expiry both do: its patterns leave the routing index, its floors stay behind for a later
    /// subscription of its id, what a gateway's arbitrated one queued is handed back upstream,
    /// the rest is drained (the observer hears `input` with how many), and its footprint leaves
    /// both pools. Returns how many messages it held.
    pub(super) fn remove_locked(
        &self,
        catalog: &mut super::Catalog,
        key: u64,
        state: &mut super::SubState,
        input: impl FnOnce(usize) -> Input,
    ) -> usize {
        catalog.by_key.remove(&key);
        catalog.drop_oldest.remove(&key);
        for pattern in &state.core.spec().patterns {
            catalog.index.remove(pattern, &key);
        }
        catalog.by_name.remove(state.core.id());
        // A later subscription of this id still numbers its epochs and members above these
        // (docs/semantics.md#restart-identity holds within a run too).
        catalog.retired = catalog.retired.max(state.core.floors());
        if state.core.is_arbitrated() {
            // Cluster mode: a gateway's local singleton; what it queued goes back upstream, so
            // it is handed back (the gateway's bridge carries it to the next active member's
            // gateway), not lost with it.
            self.hand_back_locked(state, &mut Vec::new());
        }
        let held = state.core.drain() + std::mem::take(&mut state.held_back).len();
        self.apply(state, input(held), Vec::new(), &mut Vec::new());
        let c = &self.inner.counters;
        // The subscription is gone: so is what its footprint still held, in both pools.
        c.memory
            .fetch_sub(std::mem::take(&mut state.accounted), Ordering::Relaxed);
        c.drop_oldest.fetch_sub(
            std::mem::take(&mut state.accounted_drop_oldest),
            Ordering::Relaxed,
        );
        held
    }

    /// Counts a subscription deleted elsewhere (a gateway's delete of its JetStream
    /// consumer) with the messages it discarded, in this broker's counters.
    pub fn count_deleted(&self, messages: u64) {
        let c = &self.inner.counters;
        c.subscriptions_deleted.fetch_add(1, Ordering::Relaxed);
        c.messages_deleted.fetch_add(messages, Ordering::Relaxed);
    }

    /// Members joined to `subscription_id` here (0 when there is no such subscription).
    pub fn member_count(&self, subscription_id: &str) -> usize {
        let catalog = crate::sync::read(&self.inner.catalog);
        catalog
            .get(subscription_id)
            .map_or(0, |cell| lock(cell).core.member_count())
    }
}
