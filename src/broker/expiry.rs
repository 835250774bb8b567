//! Idle expiry: a subscription whose last member left keeps its queue for `idle_timeout`, then
//! is removed and its remaining messages are counted as expired (docs/semantics.md#idle-expiry).
//!
//! Deadlines are data: a subscription that loses its last member enters the [`Deadlines`]
//! under its own lock, and one that gains a member leaves it the same way. The expiry task
//! sleeps until the earliest deadline and takes the catalog's write lock only when one is due,
//! so member churn costs a schedule update, never a scan of every subscription.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use super::Broker;
use crate::sync::{Ordering, lock, write};

/// Deadlines by catalog key: when each member-less subscription expires, or (a second
/// schedule) when each step-down's hand-over timeout passes.
#[derive(Debug, Default)]
pub(super) struct Deadlines {
    by_deadline: BTreeSet<(Duration, u64)>,
    deadline_of: BTreeMap<u64, Duration>,
}

impl Deadlines {
    /// `key` expires at `deadline` (replacing any earlier entry).
    pub(super) fn set(&mut self, key: u64, deadline: Duration) {
        if let Some(old) = self.deadline_of.insert(key, deadline) {
            self.by_deadline.remove(&(old, key));
        }
        self.by_deadline.insert((deadline, key));
    }

    /// `key` has members again (or is gone).
    pub(super) fn remove(&mut self, key: u64) {
        if let Some(old) = self.deadline_of.remove(&key) {
            self.by_deadline.remove(&(old, key));
        }
    }

    pub(super) fn earliest(&self) -> Option<Duration> {
        self.by_deadline.first().map(|(deadline, _)| *deadline)
    }

    /// Takes out every entry due at `now`.
    pub(super) fn take_due(&mut self, now: Duration) -> Vec<u64> {
        let mut due = Vec::new();
        while let Some(&(deadline, key)) = self.by_deadline.first() {
            if deadline > now {
                break;
            }
            self.by_deadline.pop_first();
            self.deadline_of.remove(&key);
            due.push(key);
        }
        due
    }

    /// Entries waiting (for tests).
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.deadline_of.len()
    }
}

impl Broker {
    /// The earliest moment some member-less subscription expires, or some step-down's
    /// deadline passes (docs/semantics.md#hand-over).
    fn next_expiry(&self) -> Option<Duration> {
        let idle = lock(&self.inner.idle).earliest();
        match (idle, self.next_handover_deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Removes every subscription that has been without members for its idle time as of now.
    /// Returns how many it removed.
    pub fn expire_idle(&self) -> usize {
        let now = self.inner.clock.now();
        let due = lock(&self.inner.idle).take_due(now);
        if due.is_empty() {
            return 0;
        }
        let mut catalog = write(&self.inner.catalog);
        let mut removed = 0;
        for key in due {
            let Some(cell) = catalog.by_key.get(&key).cloned() else {
                continue;
            };
            let mut state = lock(&cell);
            // A member joined since the entry was taken out (a later leave would have put a
            // new entry in): nothing to expire.
            if !state.core.is_expired(now) {
                continue;
            }
            let held = self.remove_locked(&mut catalog, key, &mut state, |held| {
                super::Input::Expire { held }
            });
            let c = &self.inner.counters;
            c.subscriptions_expired.fetch_add(1, Ordering::Relaxed);
            c.messages_expired.fetch_add(held as u64, Ordering::Relaxed);
            tracing::info!(subscription = %state.core.id(), messages = held, "idle subscription expired");
            removed += 1;
        }
        removed
    }

    /// Runs idle expiry and hand-over deadlines until the broker shuts down: sleeps until the
    /// next deadline or until a subscription loses its last member (or a step-down begins),
    /// whichever comes first.
    pub async fn run_expiry(self) {
        loop {
            if self.inner.shutting_down.load(Ordering::Acquire) {
                return;
            }
            match self.next_expiry() {
                Some(deadline) => {
                    tokio::select! {
                        biased;
                        () = self.inner.clock.sleep_until(deadline) => {}
                        () = self.inner.expiry_wake.notified() => {}
                    }
                }
                None => self.inner.expiry_wake.notified().await,
            }
            self.expire_idle();
            self.overdue_handovers();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The schedule hands out due keys in deadline order, once, and a rejoin (remove) or a later
    // leave (set again) replaces the entry.
    #[test]
    fn schedule_takes_due_keys_in_deadline_order() {
        let s = |secs| Duration::from_secs(secs);
        let mut schedule = Deadlines::default();
        schedule.set(1, s(30));
        schedule.set(2, s(10));
        schedule.set(3, s(20));
        schedule.set(3, s(40));
        schedule.remove(1);
        assert_eq!(schedule.earliest(), Some(s(10)));
        assert_eq!(schedule.take_due(s(35)), vec![2]);
        assert_eq!(schedule.take_due(s(35)), Vec::<u64>::new());
        assert_eq!(schedule.take_due(s(40)), vec![3]);
        assert_eq!((schedule.len(), schedule.earliest()), (0, None));
    }
}
