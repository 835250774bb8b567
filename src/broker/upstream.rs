//! Entry points for a broker fed from upstream instead of by its own publishes: cluster mode's
//! gateway (`crate::cluster::gateway`) keeps this broker for its local members' streams, windows
//! and fences, and injects the messages JetStream delivers into one subscription at a time,
//! named by JetStream's stream sequence so that every gateway names a message the same way.
//!
//! These operations live on [`Upstream`], a handle that only [`Broker::gateway`] makes, and
//! only the gateway that builds its broker holds: nothing else can inject messages, activate
//! members or take a subscription's queue.

use std::{
    ops::Deref,
    sync::{Arc, atomic::AtomicBool},
};

use super::{Broker, Input, Observer, member::Owed};
use crate::{
    clock::Clock,
    core::{Epoch, Error, IdFloor, Limits, MemberId, Message, SystemId},
};

/// How many low bits of a gateway's member ids count its joins; the bits above are its route
/// (`Broker::gateway`).
pub const GATEWAY_ROUTE_SHIFT: u32 = 24;

/// How the cluster makes a member active ([`Upstream::activate`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Activation {
    /// The cluster's epoch: the member's fencing token.
    pub epoch: Epoch,
    /// (stream sequence, attempt): raises the attempt of those messages when they are injected
    /// next; the previous active member's gateway delivered them more often than the upstream
    /// count says, and gave them back.
    pub carry: Vec<(SystemId, u32)>,
    /// It took over from an earlier active member (counted as a promotion).
    pub promoted: bool,
    /// The earlier active member's gateway died: what it held comes back from JetStream
    /// unnamed. Nothing is pulled until [`Upstream::count_owed`] says how many; the same for a
    /// line's first activation (not `promoted`), which may follow a line deleted with its only
    /// member's dead gateway. (A clean close's promotion names what was given back: `carry`.)
    pub took_over: bool,
}

/// A gateway's hold on its local broker: the broker, plus what only the gateway does to it
/// (inject what JetStream delivers, activate the member the cluster chose, take back a queue).
/// Made only by [`Broker::gateway`]; derefs to the [`Broker`] for everything else.
#[derive(Clone)]
pub(crate) struct Upstream(Broker);

impl Deref for Upstream {
    type Target = Broker;

    fn deref(&self) -> &Broker {
        &self.0
    }
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Upstream").finish_non_exhaustive()
    }
}

impl Broker {
    /// A gateway's local broker (cluster mode), and the one [`Upstream`] handle to it: like
    /// [`Broker::with_observer`], but every singleton subscription is arbitrated: its members
    /// join on standby, and only [`Upstream::activate`] (the cluster's coordinator) makes one
    /// active.
    ///
    /// Its member ids start at `route << GATEWAY_ROUTE_SHIFT` (the route it claimed in the
    /// cluster at start, above every route claimed before and above its start time), rather
    /// than at the start time: an ack naming a member id may arrive at any gateway and is
    /// forwarded by the id's high bits (its route) to the gateway that admitted it, so member
    /// ids must not repeat across gateways, which may start in the same microsecond. A
    /// gateway's ids stay on its route for a subscription's first 2^24 joins there (the floor
    /// is the broker's, raised past every expired subscription's ids). Ids stay below 2^53,
    /// exact in JSON readers that use doubles. (A singleton's epochs and system ids come from
    /// the cluster, not from this floor.)
    pub(crate) fn gateway(
        limits: Limits,
        clock: Arc<dyn Clock>,
        observer: Arc<dyn Observer>,
        route: u64,
    ) -> (Self, Upstream) {
        let mut broker = Self::with_observer(limits, clock, Some(observer));
        if let Some(inner) = Arc::get_mut(&mut broker.inner) {
            inner.arbitrated = true;
            inner.upstream_dead_letters = true;
            let floor = IdFloor::at_start(route << GATEWAY_ROUTE_SHIFT);
            inner.id_floor = floor;
            inner.last_system_id = crate::sync::AtomicU64::new(floor.last_system_id());
            crate::sync::write(&inner.catalog).retired = floor.floors();
        }
        (broker.clone(), Upstream(broker))
    }

    /// The gateway-only operations on any broker, for the shell's own tests.
    #[cfg(test)]
    pub(crate) fn upstream(&self) -> Upstream {
        Upstream(self.clone())
    }
}

impl Upstream {
    /// [`Broker::note_change`]: the cluster's lines moved.
    pub fn note_change(&self) {
        self.0.note_change();
    }

    /// Counts a publish JetStream confirmed through this gateway (the broker's `published`,
    /// as for its own publishes; none of them is routed here, so `unrouted` stays).
    pub fn count_upstream_publish(&self) {
        self.inner
            .counters
            .published
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Counts a publish JetStream refused through this gateway (its stream full, the message
    /// too large for NATS): the broker's `rejected_publishes`, as for its own refusals.
    pub fn count_rejected_publish(&self) {
        self.inner
            .counters
            .rejected_publishes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Counts `lapses` more lapses of this gateway's cluster lease, `renewed` of them ended by
    /// a renewal (the members kept).
    pub fn count_lease_lapses(&self, lapses: u64, renewed: u64) {
        let counters = &self.inner.counters;
        counters
            .lease_lapses
            .fetch_add(lapses, std::sync::atomic::Ordering::Relaxed);
        counters
            .lease_lapses_renewed
            .fetch_add(renewed, std::sync::atomic::Ordering::Relaxed);
    }

    /// Counts an ack (or term) JetStream did not confirm: the message may come again.
    pub fn count_unconfirmed_ack(&self) {
        self.inner
            .counters
            .unconfirmed_acks
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Installs the gateway's lease check (once): while `gate` says no, no member stream of an
    /// arbitrated singleton writes a message, whatever queued it (an injection, a nack's
    /// redelivery, the next queued message after an ack): it waits, in order, and is written
    /// once the gate says yes again (the lease renewed, docs/semantics.md#cluster-lease-lapse),
    /// or dropped when the member is ended (the core counts it in flight; it goes back then).
    pub fn gate_singleton_deliveries(&self, gate: super::SingletonGate) {
        let _ = self.inner.singleton_gate.set(gate);
    }

    /// Installs the gateway's settle check (once): while `gate` says no, an ack, nack or
    /// release of a message held by a member of an arbitrated singleton is refused with
    /// `UNAVAILABLE` and changes nothing (docs/semantics.md#cluster-lease-checks).
    pub fn gate_singleton_settles(&self, gate: super::SettleGate) {
        let _ = self.inner.settle_gate.set(gate);
    }

    /// Makes `member` the active member of the arbitrated singleton `subscription_id`, as the
    /// cluster decided (`activation`): it gets the confirmation frame, then what waits here.
    ///
    /// # Errors
    /// [`Error::SubscriptionNotFound`]; [`Error::InvalidArgument`] when the member left
    /// meanwhile or another member is active here.
    pub fn activate(
        &self,
        subscription_id: &str,
        member: MemberId,
        activation: Activation,
    ) -> Result<(), Error> {
        let Activation {
            epoch,
            carry,
            promoted,
            took_over,
        } = activation;
        self.with_subscription(subscription_id, |state, dead| {
            let again = state.core.active_members().any(|m| m == member);
            let effects = state.core.activate(member, epoch, promoted)?;
            // Activating the active member again changes nothing: what waits keeps waiting for
            // the same carried ones.
            if !again {
                state.attempt_floors = carry.into_iter().collect();
                // A take-over from a dead gateway, or a line's first activation (the line may
                // have been deleted with its only member's dead gateway): JetStream may owe
                // redeliveries that no carry names, so count them before pulling. A clean
                // close's promotion is named by its carry and pulls at once.
                state.owed = (took_over || !promoted).then_some(Owed::Uncounted);
                state.floors_since = self.inner.clock.now();
            }
            tracing::info!(subscription = %state.core.id(), member, epoch, took_over, "member active (chosen by the cluster)");
            self.apply(state, Input::Activate { member, epoch }, effects, dead);
            Ok(())
        })
    }

    /// Tells `member`, a standby of the arbitrated singleton `subscription_id`, its place in
    /// the cluster's line when it asked for standby notices. Nothing happens when it left
    /// meanwhile, is active, or did not ask.
    pub fn place_in_line(&self, subscription_id: &str, member: MemberId, position: u32) {
        let result = self.with_subscription(subscription_id, |state, dead| {
            let effects = state.core.place_in_line(member, position);
            if !effects.is_empty() {
                self.apply(
                    state,
                    Input::PlaceInLine { member, position },
                    effects,
                    dead,
                );
            }
            Ok(())
        });
        // Gone meanwhile: nobody to tell.
        let _ = result;
    }

    /// The cluster's coordinator asks `member`, this gateway's active member of arbitrated
    /// singleton `subscription_id`, to step down at a message boundary
    /// (docs/semantics.md#cluster-priority-and-hand-over): it is sent nothing more and settles
    /// what it holds, within the hand-over timeout. Returns whether it is stepping down (false:
    /// it left, or is no longer active here).
    pub fn step_down(
        &self,
        subscription_id: &str,
        member: MemberId,
        cause: crate::core::StepDownCause,
    ) -> bool {
        self.with_subscription(subscription_id, |state, dead| {
            let (_, effects) = state.core.step_down(member, cause)?;
            tracing::info!(subscription = %state.core.id(), member, ?cause, "the cluster asks the active member to step down");
            self.apply(state, Input::StepDown { member, cause }, effects, dead);
            Ok(())
        })
        .is_ok()
    }

    /// The coordinator calls off `member`'s step-down (no successor is left): it is sent
    /// messages again.
    pub fn call_off_step_down(&self, subscription_id: &str, member: MemberId) {
        let result = self.with_subscription(subscription_id, |state, dead| {
            let effects = state.core.call_off_step_down(member);
            tracing::info!(subscription = %state.core.id(), member, "step-down called off: no successor left");
            self.apply(state, Input::CallOffStepDown { member }, effects, dead);
            Ok(())
        });
        // Gone meanwhile: nothing to call off.
        let _ = result;
    }

    /// The cluster's line moved past `member`, which stepped down: it goes on standby here,
    /// told so with the epoch it held and its place in the line.
    pub fn stepped_down(&self, subscription_id: &str, member: MemberId, position: u32) {
        let result = self.with_subscription(subscription_id, |state, dead| {
            let effects = state.core.stepped_down(member, position);
            if !effects.is_empty() {
                self.apply(state, Input::SteppedDown { member }, effects, dead);
            }
            Ok(())
        });
        // Gone meanwhile: nobody to tell.
        let _ = result;
    }

    /// Ends `member`'s stream with `error` and removes it at once, as if its stream had closed:
    /// what it held goes back to the queue and it acts no more. Nothing happens when it is not
    /// a member here (it left meanwhile).
    pub fn end_member(&self, subscription_id: &str, member: MemberId, error: &Error) {
        let now = self.inner.clock.now();
        let result = self.with_subscription(subscription_id, |state, dead| {
            if state.core.window(member).is_none() {
                return Ok(());
            }
            state.end_one(member, error);
            let effects = state.core.leave(member, now);
            tracing::info!(subscription = %state.core.id(), member, %error, "member's stream ended by the cluster");
            self.apply(state, Input::Leave { member }, effects, dead);
            Ok(())
        });
        // Gone meanwhile: nothing to end.
        let _ = result;
    }

    /// Ends the stream of every member of `subscription_id` with `error`, as when their
    /// streams close: what they held goes back. For a subscription whose JetStream consumer was
    /// deleted (or deleted and made again) while this gateway was taken for dead
    /// (docs/semantics.md#cluster-delete).
    pub fn end_members(&self, subscription_id: &str, error: &Error) {
        let result = self.with_subscription(subscription_id, |state, _| {
            state.end_all(error);
            Ok(())
        });
        // Gone meanwhile: nothing to end.
        let _ = result;
    }

    /// The member of `subscription_id` whose step-down, asked by the cluster, has settled
    /// (it holds nothing), if any.
    pub fn settled_step_down(&self, subscription_id: &str) -> Option<MemberId> {
        self.with_subscription(subscription_id, |state, _| {
            Ok(state.core.settled_step_down().map(|step| step.member))
        })
        .ok()
        .flatten()
    }

    /// Whether `subscription_id` has an active member here.
    pub fn has_active(&self, subscription_id: &str) -> bool {
        self.with_subscription(subscription_id, |state, _| {
            Ok(state.core.active_members().next().is_some())
        })
        .unwrap_or(false)
    }

    /// Takes every queued (not in-flight) message out of `subscription_id`, to give back
    /// upstream; returns their ids with the attempt each one's next delivery would carry, head
    /// first, then the carried messages that have not come back here (empty when there is no
    /// such subscription). The observer sees the same list ([`Input::HandBack`]).
    pub fn hand_back(&self, subscription_id: &str) -> Vec<(SystemId, u32)> {
        self.with_subscription(subscription_id, |state, dead| {
            Ok(self.hand_back_locked(state, dead))
        })
        .unwrap_or_default()
    }
}

impl Broker {
    /// [`Upstream::hand_back`] under the subscription's lock; also what an arbitrated singleton
    /// that expires hands back first, so what it queued is carried, not lost with it.
    pub(super) fn hand_back_locked(
        &self,
        state: &mut super::member::SubState,
        dead: &mut super::DeadLetters,
    ) -> Vec<(SystemId, u32)> {
        let mut taken: Vec<(SystemId, u32)> = state
            .core
            .take_queued()
            .into_iter()
            .map(|(message, attempt)| (message.system_id(), attempt))
            .collect();
        // What was held back goes upstream too (its memory with it, when `apply` accounts).
        for (id, (_, attempt, _)) in std::mem::take(&mut state.held_back) {
            taken.push((id, attempt));
        }
        // What a dead gateway held and has not come back here is JetStream's to redeliver to
        // the next active member's gateway, which counts it again.
        state.owed = None;
        let ids: Vec<SystemId> = taken.iter().map(|(id, _)| *id).collect();
        // Carried messages that have not come back here are still JetStream's to redeliver,
        // now to the next active member's gateway: their carry goes on.
        taken.extend(std::mem::take(&mut state.attempt_floors));
        if !taken.is_empty() {
            self.apply(
                state,
                Input::HandBack {
                    ids,
                    carry: taken.clone(),
                },
                Vec::new(),
                dead,
            );
        }
        taken
    }
}

impl Upstream {
    /// Queues `message` (its `system_id` chosen upstream) on the subscription `subscription_id`
    /// alone, its next delivery carrying `attempt`. Nothing is routed by topic and no id is
    /// taken from this broker's counter. `live` is the feeder's claim on the subscription: when
    /// the subscription it fed expired (and `live` was cleared under its lock), the message is
    /// refused as `SubscriptionNotFound`, even if a new subscription of the same name exists.
    ///
    /// # Errors
    /// [`Error::SubscriptionNotFound`], [`Error::QueueFull`] or [`Error::MemoryBudget`] (then
    /// nothing changes), or [`Error::ShuttingDown`].
    pub fn inject(
        &self,
        subscription_id: &str,
        message: Message,
        attempt: u32,
        live: &AtomicBool,
    ) -> Result<(), Error> {
        self.check_running()?;
        self.with_subscription(subscription_id, |state, dead| {
            // Read under the subscription's lock, where expiry clears it: a feeder whose
            // subscription expired finds it cleared even if a new one of the same name exists.
            if !live.load(std::sync::atomic::Ordering::Acquire) {
                return Err(Error::SubscriptionNotFound(subscription_id.to_string()));
            }
            // An arbitrated singleton with no active member here queues nothing: what arrives
            // goes back upstream, for the active member wherever it is.
            if state.core.is_arbitrated() && state.core.active_members().next().is_none() {
                return Err(Error::Unavailable(format!(
                    "subscription {subscription_id:?} has no active member at this gateway"
                )));
            }
            let system_id = message.system_id();
            if state.held_back.contains_key(&system_id) {
                // Redelivered while it waits here: the one copy stays.
                return Ok(());
            }
            let size = message.size();
            let share = size as u64 + crate::core::subscription::MESSAGE_OVERHEAD;
            let pool = super::Pool::of_messages(state);
            self.reserve_from(pool, share)?;
            if let Err(error) = state.core.check_publish(size) {
                self.release_to(pool, share);
                return Err(error);
            }
            state.credit(pool, share);
            // A carried message's attempt is the one its last gateway named: JetStream's count
            // misses a gateway's own redeliveries after a nack, and counts a delivery to a
            // gateway that no member got (a pull that came after the member left, or a queue
            // that was never written).
            let floor = state.attempt_floors.remove(&system_id);
            let attempt = floor.unwrap_or(attempt);
            // One of the redeliveries owed after taking over from a dead gateway: ids up to the
            // consumer's last delivered one are redeliveries, every id above a new message.
            let owed = match &mut state.owed {
                Some(Owed::Counted { remaining, through }) if system_id <= *through => {
                    *remaining = remaining.saturating_sub(1);
                    true
                }
                _ => false,
            };
            if matches!(state.owed, Some(Owed::Counted { remaining: 0, .. })) {
                state.owed = None;
            }
            let carried = floor.is_some() || owed;
            // A carried message before it has not come back yet, or owed ones: it waits, so the
            // active member gets the given-back messages in order, then the rest. An owed one
            // waits too, to be queued in id order with those that came before it.
            let blocked =
                state.owed.is_some() || state.attempt_floors.range(..system_id).next().is_some();
            if blocked || owed {
                state
                    .held_back
                    .insert(system_id, (message, attempt, carried));
                if !blocked {
                    self.release_held_back(state, dead);
                }
                return Ok(());
            }
            // A carried message may have used its attempt's release that does not count at the
            // gateway that handed it on: it counts as used here (docs/semantics.md#releases).
            let effects = if floor.is_some() {
                state.core.enqueue_handed_over(message, attempt)
            } else {
                state.core.enqueue_attempt(message, attempt)
            };
            self.apply(state, Input::Enqueue { system_id }, effects, dead);
            self.release_held_back(state, dead);
            Ok(())
        })
    }

    /// Queues, in id order, the held-back messages no missing carried message precedes (all of
    /// them once the carried messages are waited for no longer), none while redeliveries are
    /// owed.
    fn release_held_back(
        &self,
        state: &mut super::member::SubState,
        dead: &mut super::DeadLetters,
    ) {
        if (!state.attempt_floors.is_empty() || state.owed.is_some())
            && self.inner.clock.now().saturating_sub(state.floors_since)
                > super::member::HOLD_BACK_PATIENCE
        {
            tracing::warn!(
                subscription = %state.core.id(),
                missing = ?state.attempt_floors.keys().collect::<Vec<_>>(),
                owed = ?state.owed,
                "given-back messages did not come back in time; delivering what came after them"
            );
            state.attempt_floors.clear();
            state.owed = None;
        }
        while let Some(entry) = state.held_back.first_entry() {
            if state.owed.is_some() || state.attempt_floors.range(..*entry.key()).next().is_some() {
                break;
            }
            let (system_id, (message, attempt, carried)) = entry.remove_entry();
            // From here the core's footprint counts it. A carried (or owed) one's release that
            // does not count may be used already (docs/semantics.md#releases).
            let effects = if carried {
                state.core.enqueue_handed_over(message, attempt)
            } else {
                state.core.enqueue_attempt(message, attempt)
            };
            self.apply(state, Input::Enqueue { system_id }, effects, dead);
        }
    }

    /// How many more messages `subscription_id`'s active members could take now (free window
    /// space less what is queued), or `None` when this broker has no such subscription.
    pub fn room(&self, subscription_id: &str) -> Option<u64> {
        self.with_subscription(subscription_id, |state, dead| {
            self.release_held_back(state, dead);
            // The carried messages still missing can be pulled whatever waits for them: what
            // waits beyond them takes window room, carried ones that came back early do not
            // (else a window of 1 with 6 and 7 back before 5 leaves no room to pull 5). What
            // waits is bounded by the window plus the carried (or owed) ones. Nothing is
            // pulled while the owed ones are not counted.
            let owed = match state.owed {
                Some(Owed::Uncounted) => return Ok(0),
                Some(Owed::Counted { remaining, .. }) => remaining,
                None => 0,
            };
            let allowed = state.core.room() + state.attempt_floors.len() as u64 + owed;
            let uncarried = state.held_back_uncarried();
            Ok(allowed.saturating_sub(uncarried as u64))
        })
        .ok()
    }

    /// Whether `subscription_id`'s active member here was just activated and waits for
    /// [`Upstream::count_owed`].
    pub fn owes_count(&self, subscription_id: &str) -> bool {
        self.with_subscription(subscription_id, |state, _| {
            Ok(state.owed == Some(Owed::Uncounted))
        })
        .unwrap_or(false)
    }

    /// After an activation: JetStream owes `subscription_id` `remaining` redeliveries (its
    /// consumer's unacked messages: given back by an earlier active member's gateway, or held
    /// by one that died), with ids up to `through` (its last delivered sequence). What arrives
    /// waits until they came or [`HOLD_BACK_PATIENCE`](super::member::HOLD_BACK_PATIENCE)
    /// passed since the activation, then is queued in id order (an owed message may be late:
    /// given back with a delay, or not yet past its ack wait; a count may also include an ack
    /// JetStream had not applied yet, which never comes, and then the wait runs its course). Nothing happens unless it waits for the count.
    pub fn count_owed(&self, subscription_id: &str, remaining: u64, through: SystemId) {
        let result = self.with_subscription(subscription_id, |state, dead| {
            if state.owed == Some(Owed::Uncounted) {
                state.owed = (remaining > 0).then_some(Owed::Counted { remaining, through });
                if remaining > 0 {
                    tracing::info!(subscription = %state.core.id(), remaining, through, "activated: JetStream's redeliveries first, in stream order");
                }
                self.release_held_back(state, dead);
            }
            Ok(())
        });
        // Gone meanwhile: nothing to count.
        let _ = result;
    }

    /// Whether `member` is a live member of `subscription_id` here.
    pub fn has_member(&self, subscription_id: &str, member: MemberId) -> bool {
        self.with_subscription(subscription_id, |state, _| {
            Ok(state.core.window(member).is_some())
        })
        .unwrap_or(false)
    }
}

#[cfg(test)]
#[path = "upstream_tests.rs"]
mod tests;
