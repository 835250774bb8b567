//! Hand-over and priority takeover, the shell's part (docs/semantics.md#hand-over): a
//! step-down's deadline, and the `HandOver` requests waiting for its outcome. The core decides
//! who steps down, when it completes and who follows; this keeps the time and the waiters.

use tokio::sync::oneshot;

use super::{Broker, DeadLetters, Input, member::SubState};
use crate::{
    core::{Effect, Epoch, Error, MemberId},
    sync::{Ordering, lock, read},
};

/// A hand-over that happened: who stepped down, who followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandedOver {
    /// The member that stepped down.
    pub previous_member: MemberId,
    /// The epoch it held.
    pub previous_epoch: Epoch,
    /// The member now active.
    pub member: MemberId,
    /// Its epoch.
    pub epoch: Epoch,
    /// The member asked to step down left before it settled what it held: its successor took
    /// over as on any failover (what it held is redelivered).
    pub failed_over: bool,
}

/// The outcome of a [`Broker::hand_over`], once it is known.
pub type HandOverWait = oneshot::Receiver<Result<HandedOver, Error>>;

/// The step-down in progress on one subscription, as the shell follows it.
#[derive(Debug)]
pub(crate) struct Following {
    /// The core's name for it.
    seq: u64,
    /// Requests waiting for its outcome: the member stepping down, its epoch, the answer.
    waiters: Vec<Waiter>,
}

/// A request waiting for a hand-over's outcome: the member stepping down, its epoch, and where
/// the answer goes.
type Waiter = (MemberId, Epoch, oneshot::Sender<Result<HandedOver, Error>>);

impl Broker {
    /// Asks the active member of SINGLETON subscription `subscription_id` to hand over
    /// (docs/semantics.md#hand-over); the receiver gets the outcome once it is known: at
    /// once when the member holds nothing, else when it settled what it holds or the
    /// hand-over timeout passed.
    ///
    /// # Errors
    /// [`Error::ShuttingDown`], [`Error::SubscriptionNotFound`], [`Error::NotSingleton`], or
    /// [`Error::HandOverRefused`] (no active member, no standby of its priority or higher);
    /// nothing changes then. The receiver may get [`Error::HandOverRefused`] (the standbys
    /// left) or [`Error::ShuttingDown`] later.
    pub fn hand_over(&self, subscription_id: &str) -> Result<HandOverWait, Error> {
        self.check_running()?;
        self.with_subscription(subscription_id, |state, dead| {
            let epoch = state.core.epoch();
            let (step, effects) = state.core.hand_over()?;
            let (answer, wait) = oneshot::channel();
            // Registered before the effects are carried out, so a hand-over that completes
            // at once (nothing in flight) is answered by them.
            let following = state.step_down.get_or_insert_with(|| Following {
                seq: step.seq,
                waiters: Vec::new(),
            });
            following.waiters.push((step.member, epoch, answer));
            tracing::info!(subscription = %state.core.id(), member = step.member, epoch, "hand-over requested");
            self.apply(
                state,
                Input::HandOver {
                    member: step.member,
                    seq: step.seq,
                },
                effects,
                dead,
            );
            Ok(wait)
        })
    }

    /// Before a membership input's effects are carried out: a step-down that begins gets its
    /// deadline.
    pub(super) fn follow_step_down(&self, state: &mut SubState, effects: &[Effect]) {
        for effect in effects {
            if let Effect::SteppingDown { seq, .. } = effect {
                // Saturating: a timeout of centuries is a deadline that never comes.
                let deadline = self
                    .inner
                    .clock
                    .now()
                    .saturating_add(self.inner.limits.handover_timeout);
                lock(&self.inner.handover_deadlines).set(state.key, deadline);
                match &mut state.step_down {
                    Some(following) if following.seq == *seq => {}
                    other => {
                        *other = Some(Following {
                            seq: *seq,
                            waiters: Vec::new(),
                        });
                    }
                }
                self.inner.expiry_wake.notify_one();
            }
        }
    }

    /// After an input, while a step-down is followed: once the core has ended it (completed,
    /// called off, or its member left), its waiters get the outcome.
    pub(super) fn end_step_down(&self, state: &mut SubState) {
        let seq = state.core.stepping_down().map(|step| step.seq);
        let Some(following) = state.step_down.take_if(|f| Some(f.seq) != seq) else {
            return;
        };
        lock(&self.inner.handover_deadlines).remove(state.key);
        let active = state.core.active_members().next();
        let epoch = state.core.epoch();
        let subscription = state.core.id().to_string();
        // Members leave en masse as the broker stops: a promotion then is no hand-over.
        let stopping = self.inner.shutting_down.load(Ordering::Acquire);
        for (previous_member, previous_epoch, answer) in following.waiters {
            let left = !state.core.is_member(previous_member);
            let outcome = match active {
                _ if stopping => Err(Error::ShuttingDown),
                Some(member) if member != previous_member => Ok(HandedOver {
                    previous_member,
                    previous_epoch,
                    member,
                    epoch,
                    failed_over: left,
                }),
                Some(_) => Err(Error::HandOverRefused {
                    subscription: subscription.clone(),
                    reason: format!(
                        "the standbys that could take over left before active member {previous_member} had settled what it held, so it stays active"
                    ),
                }),
                None => Err(Error::HandOverRefused {
                    subscription: subscription.clone(),
                    reason: format!(
                        "active member {previous_member} left with no standby to take over"
                    ),
                }),
            };
            // A requester that gave up has dropped its receiver: nothing to tell.
            let _ = answer.send(outcome);
        }
    }

    /// The earliest hand-over deadline, if any.
    pub(super) fn next_handover_deadline(&self) -> Option<std::time::Duration> {
        lock(&self.inner.handover_deadlines).earliest()
    }

    /// Every step-down whose deadline passed: what its member still holds goes to its
    /// successor (docs/semantics.md#hand-over). Returns how many it found due.
    pub fn overdue_handovers(&self) -> usize {
        let now = self.inner.clock.now();
        let due = lock(&self.inner.handover_deadlines).take_due(now);
        for key in &due {
            let mut dead = DeadLetters::new();
            {
                let catalog = read(&self.inner.catalog);
                let Some(cell) = catalog.by_key.get(key) else {
                    continue;
                };
                let mut state = super::Locked::new(cell);
                let Some(seq) = state.step_down.as_ref().map(|f| f.seq) else {
                    continue;
                };
                let overdue = state.core.counters().handovers_overdue;
                let effects = state.core.step_down_overdue(seq);
                if state.core.counters().handovers_overdue > overdue {
                    tracing::warn!(subscription = %state.core.id(), timeout = ?self.inner.limits.handover_timeout, "hand-over timeout passed: what the active member still holds goes to its successor, as on a failover");
                }
                self.apply(
                    &mut state,
                    Input::StepDownOverdue { seq },
                    effects,
                    &mut dead,
                );
            }
            self.publish_dead_letters(dead);
        }
        due.len()
    }
}
