//! Timings the broker can report as they happen: how long a failover took and how long a
//! message waited between publish and ack. Counters and depths are read at scrape time from the
//! inspection views instead, so only these two cost anything per event, and nothing at all
//! when no [`Timings`] sink is installed.

use std::{sync::Arc, time::Duration};

use super::{Broker, SubState};
use crate::core::SystemId;

/// Receives timings from the broker, while a subscription's lock is held: keep it quick (a
/// histogram observation) and never call back into the broker.
pub trait Timings: Send + Sync + 'static {
    /// A standby was promoted: `took` runs from the active member's stream end being noticed to
    /// the promoted member's confirmation being queued on its stream.
    fn failover(&self, took: Duration);
    /// An ack released a message `took` after it was published (broker wall clock).
    fn publish_to_ack(&self, took: Duration);
}

impl Broker {
    /// Installs the sink for [`Timings`]; only the first call has an effect (returns `false`
    /// otherwise), so a running broker never switches sinks half way through.
    pub fn set_timings(&self, timings: Arc<dyn Timings>) -> bool {
        self.inner.timings.set(timings).is_ok()
    }

    /// Reports a promotion whose leave input arrived at `since` (broker monotonic time).
    pub(super) fn time_failover(&self, since: Duration) {
        if let Some(timings) = self.inner.timings.get() {
            timings.failover(self.inner.clock.now().saturating_sub(since));
        }
    }

    /// Before an ack is applied: the publish time of the message it would release, looked up
    /// only when someone listens.
    pub(super) fn ack_published_at(&self, state: &SubState, system_id: SystemId) -> Option<u64> {
        self.inner.timings.get()?;
        state.core.in_flight_published_at(system_id)
    }

    /// After an accepted ack of a message published at `published_at_ms`.
    pub(super) fn time_ack(&self, published_at_ms: Option<u64>) {
        if let (Some(timings), Some(at)) = (self.inner.timings.get(), published_at_ms) {
            let waited = self.inner.clock.unix_millis().saturating_sub(at);
            timings.publish_to_ack(Duration::from_millis(waited));
        }
    }
}
