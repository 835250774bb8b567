//! Watching a SINGLETON subscription's leadership without joining it
//! (docs/semantics.md#watching-leadership): who is active, with which epoch, since when.
//!
//! A subscription keeps a [`tokio::sync::watch`] channel only once someone watches it: the
//! latest state, overwritten on every change, so a watcher that does not read costs one value,
//! whatever happens meanwhile, and reads the latest when it reads again (changes coalesce; the
//! epochs it sees still rise). The channel closes with the subscription (expired or deleted).

use tokio::sync::watch;

use super::{Broker, member::SubState};
use crate::core::{Epoch, Error, MemberId, Mode, planted::PlantedBug};

/// A singleton subscription's leadership at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Leadership {
    /// The active member, if any.
    pub active: Option<MemberId>,
    /// The active member's epoch; with none active, the last one handed out (0 before any).
    pub epoch: Epoch,
    /// Since when, in milliseconds since the Unix epoch by the server's clock: embedded, when
    /// this state began; at a gateway, when it saw the state in the coordination bucket.
    pub since_unix_ms: u64,
    /// Cluster mode: the gateway lost its lease, so its view of the line is not current; the
    /// watch ends `UNAVAILABLE` (its client watches again, at any gateway).
    pub cut_off: bool,
}

/// A watch of one subscription's leadership: its current state, then each change.
pub type LeadershipWatch = watch::Receiver<Leadership>;

impl SubState {
    /// Records that `leader` (or no one) leads from `now_ms` on.
    pub(crate) fn lead(&mut self, leader: Option<MemberId>, now_ms: u64) {
        self.leader = leader;
        self.leader_since_ms = now_ms;
    }

    /// The leadership its core holds now, since its last change (`now_ms` if none was seen).
    fn leadership(&self, now_ms: u64) -> Leadership {
        Leadership {
            active: self.core.active_members().next(),
            epoch: self.core.epoch(),
            since_unix_ms: if self.leader_since_ms == 0 {
                now_ms
            } else {
                self.leader_since_ms
            },
            cut_off: false,
        }
    }

    /// After an input that may change who is active: tells the watchers, if any, when it did.
    pub(crate) fn refresh_leadership(&mut self) {
        let now_ms = self.leader_since_ms;
        let Some(sender) = &self.leadership else {
            return;
        };
        let active = self.core.active_members().next();
        let epoch = self.core.epoch();
        sender.send_if_modified(|current| {
            if current.active == active && current.epoch == epoch {
                return false;
            }
            if crate::core::planted::active(PlantedBug::WatchReportsStaleEpoch)
                && current.active.is_some()
                && active.is_some()
            {
                // The planted bug: the new active member with the old epoch.
                *current = Leadership {
                    active,
                    epoch: current.epoch,
                    since_unix_ms: now_ms,
                    cut_off: false,
                };
                return true;
            }
            *current = Leadership {
                active,
                epoch,
                since_unix_ms: now_ms,
                cut_off: false,
            };
            true
        });
    }
}

impl Broker {
    /// Watches the leadership of SINGLETON subscription `subscription_id`: the receiver holds
    /// its current state and is told of each change; it closes when the subscription expires
    /// or is deleted.
    ///
    /// # Errors
    /// [`Error::SubscriptionNotFound`] for an unknown id, [`Error::NotSingleton`] for a
    /// BROADCAST or QUEUE subscription.
    pub fn watch_leadership(&self, subscription_id: &str) -> Result<LeadershipWatch, Error> {
        let now_ms = self.inner.clock.unix_millis();
        self.with_subscription(subscription_id, |state, _| {
            let mode = state.core.spec().mode;
            if mode != Mode::Singleton {
                return Err(Error::NotSingleton {
                    subscription: subscription_id.to_string(),
                    mode,
                });
            }
            if let Some(sender) = &state.leadership {
                return Ok(sender.subscribe());
            }
            let (sender, receiver) = watch::channel(state.leadership(now_ms));
            state.leadership = Some(sender);
            Ok(receiver)
        })
    }
}
