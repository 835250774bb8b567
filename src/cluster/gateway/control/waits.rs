//! What the singleton shell (`singleton`) holds while a member's activation and a step-down
//! wait on each other: a member is told it stepped down only once its ended epoch's fence
//! record is stored, and the local broker makes the next member active only once it was told
//! (docs/semantics.md#cluster-fenced-publish); a member asked to step down before its own
//! activation was applied steps down once it is (docs/semantics.md#cluster-priority-and-hand-over);
//! a `HandOver` waits for its outcome in the line.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use tokio::sync::oneshot;

use crate::cluster::gateway::control::fence::Recording;
use crate::{
    broker::{HandedOver, Upstream},
    cluster::{
        coordinator::Coordinator,
        values::{MemberUid, StepDownCause},
    },
    core::{Error, MemberId},
};

/// Activations whose fence record was stored while the lease was lapsed.
pub(in crate::cluster::gateway) type Deferred =
    Vec<(Arc<str>, MemberId, crate::broker::Activation)>;

/// An activation handed back by [`Recording`]: the subscription, the member, the activation.
pub(in crate::cluster::gateway) type Held = (Arc<str>, MemberId, crate::broker::Activation);

/// Per subscription, its members whose step-down notice waits for their ended epoch's
/// record, and the activations that came meanwhile (a successor here, or the member promoted
/// again at once): the local broker makes a member active only once the one before stepped
/// down, so they are applied once every waiting member was told.
#[derive(Default)]
pub(in crate::cluster::gateway) struct Telling {
    pending: BTreeMap<Arc<str>, (std::collections::BTreeSet<MemberId>, Vec<Held>)>,
    /// Activations released where they cannot be applied (the effects' pass): applied next.
    pub(in crate::cluster::gateway) released: Vec<Held>,
}

impl Telling {
    pub(in crate::cluster::gateway) fn insert(&mut self, subscription: Arc<str>, member: MemberId) {
        self.pending
            .entry(subscription)
            .or_default()
            .0
            .insert(member);
    }

    /// Holds an activation while a member of its subscription waits to be told it stepped
    /// down; gives it back otherwise.
    pub(in crate::cluster::gateway) fn hold(&mut self, activation: Held) -> Option<Held> {
        match self.pending.get_mut(&activation.0) {
            Some((waiting, held)) if !waiting.is_empty() => {
                held.push(activation);
                None
            }
            _ => Some(activation),
        }
    }

    /// `member` was told (or is gone): the activations held for its subscription once no
    /// member of it waits any more.
    pub(in crate::cluster::gateway) fn told(
        &mut self,
        subscription: &Arc<str>,
        member: MemberId,
    ) -> Vec<Held> {
        let Some((waiting, _)) = self.pending.get_mut(subscription) else {
            return Vec::new();
        };
        waiting.remove(&member);
        if !waiting.is_empty() {
            return Vec::new();
        }
        self.pending
            .remove(subscription)
            .map(|(_, held)| held)
            .unwrap_or_default()
    }
}

/// Step-downs asked of members whose activation is on its way (their fence record being
/// written): each steps down once it is activated, so a member the line made active is
/// confirmed with its epoch before it hands over (docs/semantics.md#cluster-priority-and-hand-over).
pub(in crate::cluster::gateway) type AfterActivation =
    BTreeMap<(Arc<str>, MemberId), StepDownCause>;

/// The record of `member`'s activation is stored: activated if the line still makes it active
/// with that epoch under this incarnation's lease (an ended or deposed member is not), held
/// while the lease is lapsed; a step-down asked meanwhile follows.
#[allow(clippy::too_many_arguments)]
pub(in crate::cluster::gateway) fn recorded(
    now: Duration,
    coordinator: &mut Coordinator,
    broker: &Upstream,
    recording: &Recording,
    (deferred, after_activation): (&mut Deferred, &mut AfterActivation),
    sub: Arc<str>,
    member: MemberId,
    activation: crate::broker::Activation,
) {
    let current = coordinator.still_active(&sub, member, activation.epoch);
    if current && !coordinator.may_act(now) && !coordinator.is_fenced() {
        // Lapsed: confirmed once the lease is renewed, if still current; it steps down after.
        deferred.push((sub, member, activation));
        return;
    }
    // No longer on its way: a step-down asked from now on is applied (or yielded) at once.
    recording.settled(&sub, member);
    if current && coordinator.may_act(now) {
        if let Err(error) = broker.activate(&sub, member, activation) {
            // It left meanwhile: its leaving is on its way to the coordinator.
            tracing::debug!(subscription = %sub, member, %error, "could not activate a member");
        }
    } else {
        tracing::debug!(subscription = %sub, member, "a member's fence record came after it lost its place");
    }
    step_down_activated(now, coordinator, broker, after_activation, &sub, member);
}

/// A member whose step-down waited for its activation (the activation was applied, or found
/// stale): it steps down now; one that is not active here holds nothing and yields at once.
pub(in crate::cluster::gateway) fn step_down_activated(
    now: Duration,
    coordinator: &mut Coordinator,
    broker: &Upstream,
    after_activation: &mut AfterActivation,
    subscription: &Arc<str>,
    member: MemberId,
) {
    if let Some(cause) = after_activation.remove(&(subscription.clone(), member))
        && !broker.step_down(subscription, member, cause)
    {
        coordinator.member_yielded(now, subscription, member, Vec::new());
    }
}

/// A `HandOver` waiting for its outcome in the line: the member asked to step down and the
/// epoch it held.
pub(in crate::cluster::gateway) struct HandOverWaiter {
    subscription: Arc<str>,
    previous: MemberUid,
    epoch: u64,
    reply: oneshot::Sender<Result<HandedOver, Error>>,
    /// This gateway's copy of the line has shown the hand-over mark for `epoch`.
    marked: bool,
}

impl HandOverWaiter {
    pub(in crate::cluster::gateway) fn new(
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
    pub(in crate::cluster::gateway) fn answered(&mut self, coordinator: &mut Coordinator) -> bool {
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
