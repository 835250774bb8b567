//! A singleton's place handed on from this gateway: what it holds goes back to JetStream,
//! confirmed and in order, before the coordinator hears that its member left or stepped down.

use std::{sync::PoisonError, time::Duration};

use super::{Bridge, Kind, NAK_CONFIRM, RETRY, Vacating};
use crate::cluster::jetstream::Answer;
use crate::core::MemberId;

impl Bridge {
    /// After a take-over from a dead gateway (or a line's first activation), tells the broker
    /// how many redeliveries JetStream owes (its consumer's unacked messages, none of them this
    /// gateway's: it held none while it had no active member) and up to which sequence; it
    /// pulls nothing before. Returns when to try again if the servers did not answer.
    pub(super) async fn count_owed(&self) -> Option<Duration> {
        if !self.singleton() || !self.shared.broker.owes_count(&self.subscription) {
            return None;
        }
        match self.consumer.info().await {
            Ok(state) => {
                let unacked = state.ack_pending.saturating_sub(self.held.len() as u64);
                self.shared.broker.count_owed(
                    &self.subscription,
                    unacked,
                    state.delivered_stream_sequence,
                );
                None
            }
            Err(error) => {
                tracing::warn!(subscription = %self.subscription, %error, "cannot read the consumer's backlog after an activation; retrying");
                Some(RETRY)
            }
        }
    }

    /// Members of an arbitrated singleton left (no pull is open now). When no active member
    /// remains here, every message this gateway holds goes back to JetStream, each nak
    /// confirmed, in stream order (JetStream redelivers naked messages ahead of new ones), and
    /// only then is the coordinator told, whose write promotes the next member: so that
    /// member, on any gateway, gets the in-flight messages first, with attempt + 1. The write
    /// carries every message given back (and every carried one that had not come back here),
    /// in stream order: JetStream does not always redeliver naked messages in the order they
    /// were naked, and the promoted gateway holds what comes ahead of a carried one still
    /// missing.
    ///
    /// A member whose step-down settled vacates the same way, while it is still the one
    /// stepping down: its successor, on any gateway, gets what waited here first.
    pub(super) async fn vacate(&mut self) {
        let (leaving, yielding) = match &mut self.kind {
            Kind::Singleton {
                leaving, yielding, ..
            } => (std::mem::take(leaving), std::mem::take(yielding)),
            Kind::Shared { .. } => (Vec::new(), Vec::new()),
        };
        let broker = &self.shared.broker;
        let yielding: Vec<MemberId> = yielding
            .into_iter()
            .filter(|&member| broker.settled_step_down(&self.subscription) == Some(member))
            .collect();
        let mut carry = Vec::new();
        if !yielding.is_empty() || !broker.has_active(&self.subscription) {
            // The acks this gateway's member sent first: until JetStream applied them, it would
            // hand the acked messages to the next active member, on any gateway, again. They
            // wait only while the consumer has no leader, when nobody can pull anyway
            // (docs/semantics.md#cluster-ack-final).
            self.confirming.settle_all().await;
            // What is queued here goes back: handed back now, or already when the subscription
            // expired with its last member. Either way the router collected it, under the
            // subscription's lock, before this call returns.
            let _ = self.shared.broker.hand_back(&self.subscription);
            let mut carried = std::mem::take(
                &mut *self
                    .handed_back
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner),
            );
            let queued_here = carried.len();
            let held = std::mem::take(&mut self.held);
            let refused = std::mem::take(&mut self.refused);
            let count = held.len();
            for (sequence, reply) in held {
                // One that never reached the local queue (it came in the open pull after the
                // member left) goes with the attempt it came with: no member got it.
                let came_with = refused.get(&sequence).copied().unwrap_or(1);
                if !self.leased() {
                    // Past the lease: JetStream redelivers it after its ack wait.
                    carried.entry(sequence).or_insert(came_with);
                    continue;
                }
                let confirmed = self
                    .shared
                    .jetstream
                    .confirm(&reply, Answer::Nak(None), NAK_CONFIRM)
                    .await;
                if confirmed.is_err() {
                    // JetStream still redelivers it after its ack wait (the lease for singleton
                    // consumers), so it is late, never lost.
                    tracing::warn!(subscription = %self.subscription, sequence, "JetStream did not confirm a nak in time");
                }
                carried.entry(sequence).or_insert(came_with);
            }
            tracing::debug!(subscription = %self.subscription, ?leaving, queued_here, given_back = count, carried = carried.len(), "no active member here: gave back what this gateway held");
            carry = carried.into_iter().collect();
        }
        // The carry rides with the step-down, else with the first leave: the one whose
        // promotion follows.
        let singletons = &self.shared.singletons;
        for member in yielding {
            singletons.yielded(
                self.subscription.clone(),
                member,
                std::mem::take(&mut carry),
            );
        }
        for member in leaving {
            singletons.left(
                self.subscription.clone(),
                member,
                std::mem::take(&mut carry),
            );
        }
    }

    /// Notes a member vacating, for [`Bridge::vacate`].
    pub(super) fn note(&mut self, why: Vacating) {
        // Only an arbitrated singleton's members vacate (the router tells no other bridge).
        if let Kind::Singleton {
            leaving, yielding, ..
        } = &mut self.kind
        {
            match why {
                Vacating::Left(member) => leaving.push(member),
                Vacating::Yielded(member) => yielding.push(member),
            }
        }
    }
}
