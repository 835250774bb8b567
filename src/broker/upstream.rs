//! Entry points for a broker fed from upstream instead of by its own publishes: cluster mode's
//! gateway (`crate::cluster::stream`) keeps this broker for its local members' streams, windows
//! and fences, and injects the messages JetStream delivers into one subscription at a time,
//! named by JetStream's stream sequence so that every gateway names a message the same way.

use std::sync::{Arc, atomic::AtomicBool};

use super::{Broker, Input, Observer};
use crate::{
    clock::Clock,
    core::{Epoch, Error, IdFloor, Limits, MemberId, Message, SystemId},
};

/// A random number from the OS-seeded keys of std's hasher (the shell's, never the core's).
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(0x7462_6761_7465_7761);
    hasher.finish()
}

/// How many low bits of a gateway's member ids count its joins; the bits above are its route
/// (`Broker::gateway`).
pub const GATEWAY_ROUTE_SHIFT: u32 = 28;

impl Broker {
    /// A gateway's local broker (cluster mode): like [`Broker::with_observer`], but every
    /// singleton subscription is arbitrated: its members join on standby, and only
    /// [`Broker::activate`] (the cluster's coordinator) makes one active.
    ///
    /// Its member ids start at a random floor in `[2^52, 2^53)` whose low
    /// [`GATEWAY_ROUTE_SHIFT`] bits are zero, rather than at the start time: an ack naming a
    /// member id may arrive at any gateway and is forwarded by the id's high bits (its route)
    /// to the gateway that admitted it, so member ids must not repeat across gateways, which
    /// may start in the same microsecond. Two live gateways share a route with a chance of
    /// about 1 in 1.7 × 10^7 per pair; a gateway's ids stay on its route for its first 2^28
    /// joins (the floor is the broker's, raised past every expired subscription's ids). Ids
    /// stay below 2^53, exact in JSON readers that use doubles. (A singleton's epochs and
    /// system ids come from the cluster, not from this floor.)
    pub fn gateway(limits: Limits, clock: Arc<dyn Clock>, observer: Arc<dyn Observer>) -> Self {
        let mut broker = Self::with_observer(limits, clock, Some(observer));
        if let Some(inner) = Arc::get_mut(&mut broker.inner) {
            inner.arbitrated = true;
            inner.upstream_dead_letters = true;
            let routes = 1 << (52 - GATEWAY_ROUTE_SHIFT);
            let floor = IdFloor::at_start((routes + random_u64() % routes) << GATEWAY_ROUTE_SHIFT);
            inner.id_floor = floor;
            inner.last_system_id = crate::sync::AtomicU64::new(floor.last_system_id());
            crate::sync::write(&inner.catalog).retired = floor.floors();
        }
        broker
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

    /// Makes `member` the active member of the arbitrated singleton `subscription_id`, with the
    /// cluster's `epoch`: it gets the confirmation frame, then what waits here.
    ///
    /// # Errors
    /// [`Error::SubscriptionNotFound`]; [`Error::InvalidArgument`] when the member left
    /// meanwhile or another member is active here.
    ///
    /// `carry` (stream sequence, attempt) raises the attempt of those messages when they are
    /// injected next: the previous active member's gateway delivered them more often than the
    /// upstream count says.
    pub fn activate(
        &self,
        subscription_id: &str,
        member: MemberId,
        epoch: Epoch,
        carry: Vec<(SystemId, u32)>,
        promotion: bool,
    ) -> Result<(), Error> {
        self.with_subscription(subscription_id, |state, dead| {
            let again = state.core.active_members().any(|m| m == member);
            let effects = state.core.activate(member, epoch, promotion)?;
            // Activating the active member again changes nothing: what waits keeps waiting for
            // the same carried ones.
            if !again {
                state.attempt_floors = carry.into_iter().collect();
                state.floors_since = self.inner.clock.now();
            }
            tracing::info!(subscription = %state.core.id(), member, epoch, "member active (chosen by the cluster)");
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
    /// such subscription).
    pub fn hand_back(&self, subscription_id: &str) -> Vec<(SystemId, u32)> {
        self.with_subscription(subscription_id, |state, dead| {
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
            state.held_back_bytes = 0;
            state.held_back_carried = 0;
            if !taken.is_empty() {
                let ids = taken.iter().map(|(id, _)| *id).collect();
                self.apply(state, Input::HandBack { ids }, Vec::new(), dead);
            }
            // Carried messages that have not come back here are still JetStream's to
            // redeliver, now to the next active member's gateway: their carry goes on.
            taken.extend(std::mem::take(&mut state.attempt_floors));
            Ok(taken)
        })
        .unwrap_or_default()
    }

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
            self.reserve_memory(share)?;
            if let Err(error) = state.core.check_publish(size) {
                self.release_memory(share);
                return Err(error);
            }
            state.accounted += share;
            let floor = state.attempt_floors.remove(&system_id);
            let carried = floor.is_some();
            let attempt = floor.map_or(attempt, |floor| floor.max(attempt));
            if state.attempt_floors.range(..system_id).next().is_some() {
                // A carried message before it has not come back yet: it waits, so the active
                // member gets the given-back messages in order, then the rest.
                state.held_back_bytes += share;
                state.held_back_carried += usize::from(carried);
                state
                    .held_back
                    .insert(system_id, (message, attempt, carried));
                return Ok(());
            }
            let effects = state.core.enqueue_attempt(message, attempt);
            self.apply(state, Input::Enqueue { system_id }, effects, dead);
            self.release_held_back(state, dead);
            Ok(())
        })
    }

    /// Queues, in id order, the held-back messages no missing carried message precedes (all of
    /// them once the carried messages are waited for no longer).
    fn release_held_back(
        &self,
        state: &mut super::member::SubState,
        dead: &mut super::DeadLetters,
    ) {
        if !state.attempt_floors.is_empty()
            && self.inner.clock.now().saturating_sub(state.floors_since)
                > super::member::HOLD_BACK_PATIENCE
        {
            tracing::warn!(
                subscription = %state.core.id(),
                missing = ?state.attempt_floors.keys().collect::<Vec<_>>(),
                "given-back messages did not come back in time; delivering what came after them"
            );
            state.attempt_floors.clear();
        }
        while let Some(entry) = state.held_back.first_entry() {
            if state.attempt_floors.range(..*entry.key()).next().is_some() {
                break;
            }
            let (system_id, (message, attempt, carried)) = entry.remove_entry();
            // From here the core's footprint counts it.
            state.held_back_bytes -=
                message.size() as u64 + crate::core::subscription::MESSAGE_OVERHEAD;
            state.held_back_carried -= usize::from(carried);
            let effects = state.core.enqueue_attempt(message, attempt);
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
            // waits is bounded by the window plus the carried ones.
            let allowed = state.core.room() + state.attempt_floors.len() as u64;
            let uncarried = state.held_back.len() - state.held_back_carried;
            Ok(allowed.saturating_sub(uncarried as u64))
        })
        .ok()
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
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{
        broker::{MemberStream, Observation, Outbound},
        clock::VirtualClock,
        core::{MemberOptions, Mode, OpenRequest, Pattern, SubscriptionSpec},
    };

    struct Unobserved;
    impl Observer for Unobserved {
        fn observe(&self, _: &Observation<'_>) {}
    }

    /// A gateway's broker, as `serve --nats` builds it: a subscription expires with its last
    /// member.
    fn gateway() -> Broker {
        let limits = Limits {
            idle_timeout: Duration::ZERO,
            ..Limits::default()
        };
        Broker::gateway(
            limits,
            Arc::new(VirtualClock::new(1_700_000_000_000)),
            Arc::new(Unobserved),
        )
    }

    fn request(id: &str, mode: Mode) -> OpenRequest {
        OpenRequest {
            subscription_id: id.into(),
            spec: SubscriptionSpec {
                mode,
                consumer_group: "g".into(),
                patterns: vec![Pattern::parse("a.*").unwrap()],
                max_delivery_attempts: 0,
                dead_letter_topic: None,
                ack_mode: Default::default(),
                overflow: Default::default(),
            },
            member: MemberOptions::default(),
        }
    }

    async fn confirmed_epoch(member: &mut MemberStream) -> Epoch {
        match tokio::time::timeout(Duration::from_secs(5), member.next()).await {
            Ok(Some(Outbound::Confirm { epoch, .. })) => epoch,
            other => panic!("expected a confirmation, got {other:?}"),
        }
    }

    // SPEC §5 / README "Restart identity": a restarted broker never hands out an epoch an
    // earlier run handed out. A queue member's epoch is the gateway's own (the cluster chooses
    // only a singleton's), so a restarted gateway, or a second one, must not start it again
    // where the first started.
    #[tokio::test(start_paused = true)]
    async fn a_restarted_gateway_does_not_hand_out_the_same_queue_epoch_again() {
        let first = gateway();
        let mut a = first.open(&request("q", Mode::Queue), None).unwrap();
        let before = confirmed_epoch(&mut a).await;
        drop((a, first));
        let restarted = gateway();
        let mut b = restarted.open(&request("q", Mode::Queue), None).unwrap();
        let after = confirmed_epoch(&mut b).await;
        assert_ne!(
            before, after,
            "the restarted gateway handed out queue epoch {after} again"
        );
    }

    // README "Restart identity": ids below 2^53 read exactly as doubles (jq, JavaScript), also
    // a gateway's; its member ids start at a route boundary, so forwarded acks find it.
    #[tokio::test(start_paused = true)]
    async fn a_gateways_ids_start_below_2_53_at_a_route_boundary() {
        for _ in 0..64 {
            let floor = gateway().id_floor().unix_micros();
            assert!((1 << 52..1 << 53).contains(&floor), "floor {floor}");
            assert_eq!(floor % (1 << GATEWAY_ROUTE_SHIFT), 0, "floor {floor}");
        }
    }

    // README cluster mode: "A subscription's epoch is the cluster's." A singleton's local
    // subscription must not show an epoch of another subscription that expired on this gateway
    // (the broker-wide retired floor), above the cluster's.
    #[tokio::test(start_paused = true)]
    async fn a_gateways_singleton_shows_the_clusters_epoch_after_another_subscription_expired() {
        let broker = gateway();
        for _ in 0..3 {
            let mut m = broker.open(&request("q", Mode::Queue), None).unwrap();
            confirmed_epoch(&mut m).await;
            drop(m);
            broker.expire_idle();
        }
        let mut s = broker.open(&request("s", Mode::Singleton), None).unwrap();
        broker
            .activate("s", s.member_id(), 2, Vec::new(), false)
            .unwrap();
        assert_eq!(confirmed_epoch(&mut s).await, 2);
        assert_eq!(
            broker.describe("s").unwrap().epoch,
            2,
            "the singleton's epoch is the cluster's"
        );
    }

    /// A gateway's singleton "s" whose member (window `window`) the cluster made active with
    /// `carry`: the given-back messages it waits for. Returns the feeder's `live` claim too.
    async fn promoted(
        window: u32,
        carry: Vec<(SystemId, u32)>,
    ) -> (Broker, MemberStream, AtomicBool) {
        let broker = gateway();
        let mut req = request("s", Mode::Singleton);
        req.member.max_in_flight = window;
        let mut s = broker.open(&req, None).unwrap();
        broker.activate("s", s.member_id(), 2, carry, true).unwrap();
        confirmed_epoch(&mut s).await;
        (broker, s, AtomicBool::new(true))
    }

    fn message(id: SystemId) -> Message {
        let envelope = crate::core::Envelope::new(
            crate::core::Topic::parse("a.b").unwrap(),
            crate::core::Headers::new(),
        );
        Message::new(id, 0, envelope, b"x")
    }

    async fn delivered(member: &mut MemberStream) -> Option<(SystemId, u32)> {
        match tokio::time::timeout(Duration::from_millis(10), member.next()).await {
            Ok(Some(Outbound::Message {
                message, attempt, ..
            })) => Some((message.system_id(), attempt)),
            Ok(other) => panic!("expected a message, got {other:?}"),
            Err(_) => None,
        }
    }

    // README cluster mode: JetStream may redeliver given-back messages out of the order they
    // were given back in; the promoted gateway delivers them in stream order (the promotion
    // names them: carry), then what came after them.
    #[tokio::test(start_paused = true)]
    async fn given_back_messages_reach_the_promoted_member_in_order_whatever_order_they_return_in()
    {
        let (broker, mut s, live) = promoted(10, vec![(5, 2), (6, 3), (7, 2)]).await;
        for id in [7, 8] {
            broker.inject("s", message(id), 1, &live).unwrap();
        }
        assert_eq!(delivered(&mut s).await, None, "7 and 8 wait for 5 and 6");
        assert_eq!(
            broker.room("s"),
            Some(10 + 2 - 1),
            "the missing two can be pulled (8 takes window room, 7 was carried)"
        );
        broker.inject("s", message(5), 1, &live).unwrap();
        assert_eq!(delivered(&mut s).await, Some((5, 2)));
        assert_eq!(delivered(&mut s).await, None, "7 and 8 wait for 6");
        broker.inject("s", message(6), 1, &live).unwrap();
        let mut rest = Vec::new();
        while let Some(d) = delivered(&mut s).await {
            rest.push(d);
        }
        assert_eq!(rest, [(6, 3), (7, 2), (8, 1)]);
    }

    // A given-back message that never comes back is waited for at most HOLD_BACK_PATIENCE:
    // then what came after it is delivered.
    #[tokio::test(start_paused = true)]
    async fn a_given_back_message_that_never_returns_is_waited_for_a_bounded_time() {
        let (broker, mut s, live) = promoted(10, vec![(5, 2)]).await;
        broker.inject("s", message(6), 1, &live).unwrap();
        assert_eq!(delivered(&mut s).await, None);
        let patience = super::super::member::HOLD_BACK_PATIENCE;
        tokio::time::advance(patience - Duration::from_millis(100)).await;
        assert_eq!(
            broker.room("s"),
            Some(10 + 1 - 1),
            "not yet past the patience"
        );
        assert_eq!(delivered(&mut s).await, None);
        tokio::time::advance(Duration::from_millis(200)).await;
        broker.room("s");
        assert_eq!(delivered(&mut s).await, Some((6, 1)));
        // Nothing is waited for any more.
        broker.inject("s", message(9), 1, &live).unwrap();
        assert_eq!(delivered(&mut s).await, Some((9, 1)));
    }

    // README cluster mode: what waits is bounded by "the member's window plus the carried
    // ones", and the carried ones still missing can always be pulled. Carried messages that
    // came back early and wait for an earlier one must not use up the room that earlier one
    // needs: with a window of 1, 6 and 7 back before 5 left no room to pull 5, which then came
    // only after the patience, behind 6 and 7.
    #[tokio::test(start_paused = true)]
    async fn a_missing_carried_message_can_be_pulled_while_later_carried_ones_wait() {
        let (broker, mut s, live) = promoted(1, vec![(5, 2), (6, 2), (7, 2)]).await;
        for id in [7, 6] {
            broker.inject("s", message(id), 1, &live).unwrap();
        }
        assert_eq!(delivered(&mut s).await, None, "6 and 7 wait for 5");
        assert!(
            broker.room("s").unwrap() >= 1,
            "5 is missing and must be pullable, room {:?}",
            broker.room("s")
        );
        broker.inject("s", message(5), 1, &live).unwrap();
        assert_eq!(delivered(&mut s).await, Some((5, 2)));
    }

    // README cluster mode: a held-back message is "counted in the budget" for as long as it
    // waits, whatever else the subscription does meanwhile (here an ack).
    #[tokio::test(start_paused = true)]
    async fn a_held_back_message_stays_counted_in_the_memory_budget() {
        let (broker, mut s, live) = promoted(10, vec![(5, 1), (7, 1)]).await;
        let accounted = |b: &Broker| b.list().1.memory_accounted_bytes;
        broker.inject("s", message(5), 1, &live).unwrap();
        assert_eq!(delivered(&mut s).await, Some((5, 1)));
        let with_one = accounted(&broker);
        broker.inject("s", message(8), 1, &live).unwrap();
        assert_eq!(delivered(&mut s).await, None, "8 waits for 7");
        let share = accounted(&broker) - with_one;
        assert!(share > 0);
        broker
            .ack("s", crate::broker::Fence::Member(s.member_id()), 5)
            .unwrap();
        assert_eq!(
            accounted(&broker),
            with_one,
            "5 left (the same size as 8), 8 still waits here"
        );
        // A redelivery of the waiting 8 keeps one copy, counted once.
        broker.inject("s", message(8), 1, &live).unwrap();
        assert_eq!(accounted(&broker), with_one, "8 counted once");
        assert_eq!(
            broker.hand_back("s"),
            [(8, 1), (7, 1)],
            "8 given back, 7's carry goes on"
        );
        assert_eq!(accounted(&broker), with_one - share);
    }

    // README cluster mode: `queued_messages` counts what the gateway pulled; a message held
    // back for order was pulled and waits here, as a queued one does.
    #[tokio::test(start_paused = true)]
    async fn a_held_back_message_shows_as_queued() {
        let (broker, mut s, live) = promoted(10, vec![(5, 1)]).await;
        broker.inject("s", message(6), 1, &live).unwrap();
        assert_eq!(delivered(&mut s).await, None, "6 waits for 5");
        let size = message(6).size() as u64;
        let view = broker.describe("s").unwrap();
        assert_eq!((view.queued_messages, view.queued_bytes), (1, size));
        let listed = &broker.list().0[0];
        assert_eq!((listed.queued_messages, listed.queued_bytes), (1, size));
    }

    // README cluster mode: "the promotion carries their ids (`carry`) to the next active
    // member's gateway", which puts them in order and delivers each with at least its carried
    // attempt. When the promoted member leaves too before a carried message came back here,
    // that message is still JetStream's to redeliver, to the gateway after: its carry must go
    // on with what this gateway gives back, or it comes there with a lower attempt and
    // unordered.
    #[tokio::test(start_paused = true)]
    async fn a_carried_message_still_missing_is_carried_on_when_the_promoted_member_leaves() {
        let (broker, mut s, live) = promoted(10, vec![(5, 3), (6, 3)]).await;
        broker.inject("s", message(6), 1, &live).unwrap();
        assert_eq!(delivered(&mut s).await, None, "6 waits for 5");
        broker.end_member("s", s.member_id(), &Error::Unavailable("left".into()));
        let mut given_back = broker.hand_back("s");
        given_back.sort_unstable();
        assert_eq!(given_back, [(5, 3), (6, 3)]);
    }

    // An activation of the member already active here changes nothing (the core's answer):
    // neither does it forget the carried messages still missing, which would let what waits
    // for them go first.
    #[tokio::test(start_paused = true)]
    async fn activating_the_active_member_again_keeps_waiting_for_the_carried_ones() {
        let (broker, mut s, live) = promoted(10, vec![(5, 3)]).await;
        broker.inject("s", message(6), 1, &live).unwrap();
        broker
            .activate("s", s.member_id(), 2, Vec::new(), true)
            .unwrap();
        broker.room("s");
        assert_eq!(delivered(&mut s).await, None, "6 still waits for 5");
        broker.inject("s", message(5), 1, &live).unwrap();
        assert_eq!(delivered(&mut s).await, Some((5, 3)));
        assert_eq!(delivered(&mut s).await, Some((6, 1)));
    }
}
