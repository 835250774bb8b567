//! Idle expiry: a subscription whose last member left keeps its queue for `idle_timeout`, then
//! is removed and its remaining messages are counted as expired (SPEC §6).

use std::time::Duration;

use super::Broker;
use crate::sync::{Ordering, lock, read, write};

impl Broker {
    /// The earliest moment some member-less subscription expires.
    fn next_expiry(&self) -> Option<Duration> {
        let catalog = read(&self.inner.catalog);
        catalog
            .by_key
            .values()
            .filter_map(|cell| lock(cell).core.expires_at())
            .min()
    }

    /// Removes every subscription that has been without members for its idle time as of now.
    /// Returns how many it removed.
    pub fn expire_idle(&self) -> usize {
        let now = self.inner.clock.now();
        let mut catalog = write(&self.inner.catalog);
        let expired: Vec<u64> = catalog
            .by_key
            .iter()
            .filter(|(_, cell)| lock(cell).core.is_expired(now))
            .map(|(key, _)| *key)
            .collect();
        for key in &expired {
            let Some(cell) = catalog.by_key.remove(key) else {
                continue;
            };
            let mut state = lock(&cell);
            for pattern in &state.core.spec().patterns {
                catalog.index.remove(pattern, key);
            }
            catalog.by_name.remove(state.core.id());
            let floors = state.core.floors();
            catalog.retired.epoch = catalog.retired.epoch.max(floors.epoch);
            catalog.retired.member_id = catalog.retired.member_id.max(floors.member_id);
            let held = state.core.drain();
            self.apply(
                &mut state,
                super::Input::Expire { held },
                Vec::new(),
                &mut Vec::new(),
            );
            let c = &self.inner.counters;
            // The subscription is gone: so is what its footprint still held.
            c.memory
                .fetch_sub(std::mem::take(&mut state.accounted), Ordering::Relaxed);
            c.subscriptions_expired.fetch_add(1, Ordering::Relaxed);
            c.messages_expired.fetch_add(held as u64, Ordering::Relaxed);
            tracing::info!(subscription = %state.core.id(), messages = held, "idle subscription expired");
        }
        expired.len()
    }

    /// Runs idle expiry until the broker shuts down: sleeps until the next deadline or until a
    /// subscription loses its last member, whichever comes first.
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
        }
    }
}
