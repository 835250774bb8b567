//! Watching a SINGLETON subscription's leadership without joining it
//! (docs/semantics.md#watching-leadership): who is active, with which epoch, since when.
//!
//! A subscription keeps a [`tokio::sync::watch`] channel only once someone watches it: the
//! latest state, overwritten on every change, so a watcher that does not read costs one value,
//! whatever happens meanwhile, and reads the latest when it reads again (changes coalesce; the
//! epochs it sees still rise). The channel closes with the subscription (expired or deleted).

use std::sync::Arc;

use tokio::sync::watch;

use super::{Broker, member::SubState};
use crate::core::{Epoch, Error, MemberId, planted::PlantedBug};

/// A singleton subscription's leadership at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leadership {
    /// The active member, if any.
    pub active: Option<MemberId>,
    /// The active member's epoch; with none active, the last one handed out (0 before any).
    pub epoch: Epoch,
    /// The active member's metadata (docs/semantics.md#member-metadata); empty if none.
    pub metadata: Arc<str>,
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
        let active = self.core.active_members().next();
        Leadership {
            active,
            epoch: self.core.epoch(),
            metadata: active.map_or_else(|| Arc::from(""), |m| self.metadata_of(m)),
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
        let metadata = active.map_or_else(|| Arc::from(""), |m| self.metadata_of(m));
        sender.send_if_modified(|current| {
            if current.active == active && current.epoch == epoch && current.metadata == metadata {
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
                    metadata,
                    since_unix_ms: now_ms,
                    cut_off: false,
                };
                return true;
            }
            // A proclamation changes the metadata only: the state began when its member did.
            let since_unix_ms = if current.active == active && current.epoch == epoch {
                current.since_unix_ms
            } else {
                now_ms
            };
            *current = Leadership {
                active,
                epoch,
                metadata,
                since_unix_ms,
                cut_off: false,
            };
            true
        });
    }
}

impl Broker {
    /// Active member `member` of SINGLETON subscription `subscription_id`, with epoch
    /// `epoch`, replaces its metadata (docs/semantics.md#member-metadata); its watchers are
    /// told. Returns the metadata it replaced.
    ///
    /// # Errors
    /// [`Error::SubscriptionNotFound`] for an unknown id, [`Error::NotSingleton`] for a
    /// BROADCAST or QUEUE subscription, [`Error::MemberNotFound`] for a member it does not
    /// have, [`Error::NotActive`] for a member on standby or an epoch other than its own.
    pub fn proclaim(
        &self,
        subscription_id: &str,
        member: MemberId,
        epoch: Epoch,
        metadata: Arc<str>,
    ) -> Result<Arc<str>, Error> {
        self.with_subscription(subscription_id, |state, _| {
            state.core.require_singleton()?;
            let Some(info) = state
                .core
                .member_infos()
                .into_iter()
                .find(|m| m.member_id == member)
            else {
                return Err(Error::MemberNotFound {
                    subscription: subscription_id.to_string(),
                    member,
                });
            };
            if !info.active || info.epoch != epoch {
                return Err(Error::NotActive {
                    subscription: subscription_id.to_string(),
                    member,
                    epoch,
                    current: state.core.epoch(),
                    active: info.active,
                });
            }
            let previous = state.metadata_of(member);
            state.set_metadata(member, metadata);
            state.refresh_leadership();
            self.note_change_of(state.core.id());
            Ok(previous)
        })
    }

    /// Undoes a [`Broker::proclaim`] the cluster refused: `member`'s metadata goes back from
    /// `proclaimed` to `previous`, unless it changed again meanwhile or the member is gone.
    pub fn unproclaim(
        &self,
        subscription_id: &str,
        member: MemberId,
        proclaimed: &Arc<str>,
        previous: Arc<str>,
    ) {
        let _ = self.with_subscription(subscription_id, |state, _| {
            if state.metadata_of(member) == *proclaimed {
                state.set_metadata(member, previous);
                state.refresh_leadership();
                self.note_change_of(state.core.id());
            }
            Ok(())
        });
    }

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
            state.core.require_singleton()?;
            if let Some(sender) = &state.leadership {
                return Ok(sender.subscribe());
            }
            let (sender, receiver) = watch::channel(state.leadership(now_ms));
            state.leadership = Some(sender);
            Ok(receiver)
        })
    }
}
