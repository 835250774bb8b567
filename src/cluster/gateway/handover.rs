//! `HandOver` through a gateway (docs/semantics.md#cluster-priority-and-hand-over): asked at
//! any gateway, marked in the cluster's line by this gateway's coordinator, carried out by the
//! gateway holding the active member (`singleton`, the bridge), and answered from this
//! gateway's copy of the line.

use std::sync::Arc;

use tokio::sync::oneshot;

use super::Gateway;
use crate::{
    broker::HandedOver,
    cluster::{
        backplane::Backplane,
        coordinator::Coordinator,
        values::{self, MemberUid, StepDownCause},
    },
    core::{Error, Mode},
};

impl Gateway {
    /// `HandOver` through a gateway (docs/semantics.md#cluster-priority-and-hand-over): the
    /// line, at whichever gateway holds the active member, asks it to step down at a message
    /// boundary; answered once this gateway's copy of the line shows the outcome.
    ///
    /// # Errors
    /// A refusal of kind not found when no gateway has the subscription,
    /// [`Error::NotSingleton`], [`Error::HandOverRefused`], and [`Error::Unavailable`] when
    /// this gateway holds no lease, or the outcome did not show within the hand-over timeout
    /// and a margin.
    pub async fn hand_over(
        &self,
        subscription_id: &str,
    ) -> Result<crate::broker::HandedOver, Error> {
        let mode = self.describe(subscription_id).await?.view.spec.mode;
        if mode != Mode::Singleton {
            return Err(Error::NotSingleton {
                subscription: subscription_id.to_string(),
                mode,
            });
        }
        // Without a lease its copy of the lines may be behind (as for a watch).
        let singletons = self
            .leased_singletons("ask another gateway, or retry")
            .await?;
        let patience = super::join::JOIN_LEASE_PATIENCE;
        // The active member's gateway completes it within its hand-over timeout; the line's
        // writes and the watch take a little more.
        let bound = self
            .inner
            .shared
            .broker
            .limits()
            .handover_timeout
            .saturating_add(patience);
        let broker = &self.inner.shared.broker;
        // The line as the bucket's leader holds it now: the request is for the member active
        // then, not for one this gateway's copy may still show (a hand-over answered a moment
        // ago at another gateway would otherwise be answered again here, as if this one's).
        let at_least = match tokio::time::timeout(
            patience,
            self.inner.backplane.get(&values::sub_key(subscription_id)),
        )
        .await
        {
            Ok(Ok(Some(entry))) => entry.revision,
            Ok(Ok(None)) => 0,
            Ok(Err(error)) => {
                return Err(Error::Unavailable(format!(
                    "the coordination bucket did not answer for subscription {subscription_id:?}'s line: {error}; nothing changed"
                )));
            }
            Err(_) => {
                return Err(Error::Unavailable(format!(
                    "the coordination bucket did not answer for subscription {subscription_id:?}'s line within {patience:?}; nothing changed"
                )));
            }
        };
        let asked = singletons.hand_over(Arc::from(subscription_id), at_least);
        match tokio::time::timeout(bound, asked).await {
            // A shutdown ends the members' streams, which the line then shows: that is no
            // outcome of the request (as embedded, UNAVAILABLE).
            Ok(_) if broker.is_shutting_down() => Err(Error::ShuttingDown),
            Ok(outcome) => outcome,
            Err(_) => Err(Error::Unavailable(format!(
                "the hand-over of subscription {subscription_id:?} did not show in the cluster's line within {bound:?}; it may yet happen: watch its leadership"
            ))),
        }
    }
}

/// A `HandOver` waiting for its outcome in the line: the member asked to step down and the
/// epoch it held.
pub(super) struct HandOverWaiter {
    subscription: Arc<str>,
    previous: MemberUid,
    epoch: u64,
    reply: oneshot::Sender<Result<HandedOver, Error>>,
    /// This gateway's copy of the line has shown the hand-over mark for `epoch`.
    marked: bool,
}

impl HandOverWaiter {
    pub(super) fn new(
        subscription: Arc<str>,
        previous: MemberUid,
        epoch: u64,
        reply: oneshot::Sender<Result<HandedOver, Error>>,
    ) -> Self {
        Self {
            subscription,
            previous,
            epoch,
            reply,
            marked: false,
        }
    }

    /// Answers it if this gateway's copy of the line shows the outcome
    /// (docs/semantics.md#hand-over): its member stepped down (or left) and another is
    /// active, or no standby that could take over is left. Returns whether it was answered.
    pub(super) fn answered(&mut self, coordinator: &mut Coordinator) -> bool {
        if self.reply.is_closed() {
            return true;
        }
        let previous = self.previous.member;
        let refused = |reason: String| {
            Err(Error::HandOverRefused {
                subscription: self.subscription.to_string(),
                reason,
            })
        };
        let outcome = match coordinator.line(&self.subscription) {
            None => refused(format!(
                "active member {previous} left with no standby to take over"
            )),
            Some(v) if v.active == Some(self.previous) && v.epoch == self.epoch => {
                // Once marked, a mark gone is the step-down called off (its standbys left,
                // even if another joined since).
                self.marked |= v.hand_over == self.epoch;
                let called_off = self.marked && v.hand_over != self.epoch;
                if v.successor(StepDownCause::HandOver).is_some() && !called_off {
                    return false;
                }
                refused(format!(
                    "the standbys that could take over left before active member {previous} had settled what it held, so it stays active"
                ))
            }
            Some(v) => match v.active {
                Some(member) => Ok(HandedOver {
                    previous_member: previous,
                    previous_epoch: self.epoch,
                    member: member.member,
                    epoch: v.epoch,
                    failed_over: !v.line.contains(&self.previous),
                }),
                // Promoted in the write that follows.
                None if !v.line.is_empty() => return false,
                None => refused(format!(
                    "active member {previous} left with no standby to take over"
                )),
            },
        };
        if outcome.is_err() {
            // Refused: not marked later, when another standby joins.
            coordinator.withdraw_hand_over(&self.subscription, self.epoch);
        }
        let (answer, _) = oneshot::channel();
        let reply = std::mem::replace(&mut self.reply, answer);
        let _ = reply.send(outcome);
        true
    }
}
