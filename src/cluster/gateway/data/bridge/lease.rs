//! A bridge under the gateway's lease (docs/semantics.md#cluster-lease-checks): a singleton's
//! messages and acks leave only under the incarnation they were pulled under; any other
//! mode's consumer is checked again after an incarnation ended.

use super::{Bridge, Kind};
use crate::core::Error;

impl Bridge {
    /// Whether this bridge may hand a message to a member or send JetStream an ack, nak or
    /// term now: always, but for a singleton only while this gateway's lease is valid for the
    /// incarnation its held messages were pulled under, by the clock read at this moment
    /// (docs/semantics.md#cluster-lease-checks). Past it, nothing is sent (an ack or term of
    /// the same incarnation waits for the renewal in its confirmation task): JetStream
    /// redelivers after its ack wait, if the lease ends for good and the coordinator ends the
    /// members.
    pub(super) fn leased(&self) -> bool {
        let Kind::Singleton { incarnation, .. } = self.kind else {
            return true;
        };
        let lease = self.shared.singletons.lease();
        match incarnation {
            Some(incarnation) => lease.valid_for(incarnation),
            None => lease.valid().is_some(),
        }
    }

    /// A singleton's: whether its held messages' incarnation is still the one named, so that
    /// a lapsed lease may yet be renewed for them.
    pub(super) fn lapsed_in_incarnation(&self) -> bool {
        match self.kind {
            Kind::Singleton {
                incarnation: Some(incarnation),
                ..
            } => self.shared.singletons.lease().incarnation() == incarnation,
            _ => false,
        }
    }

    /// Any mode but singleton: whether the lease incarnation is not the one under which the
    /// consumer was last checked ([`Bridge::verify_consumer`]). A lapse within one incarnation
    /// needs no check: no other gateway took this one for dead (it would have deleted its
    /// lease, which ends the incarnation), so none deleted the subscription past its members.
    pub(super) fn lapsed_since_verified(&self) -> bool {
        match self.kind {
            Kind::Shared {
                verified,
                consumer_gone: false,
                ..
            } => verified != Some(self.shared.singletons.lease().incarnation()),
            _ => false,
        }
    }

    /// After this gateway's lease ended and a new incarnation began (see [`Bridge::inject`]):
    /// waits (bounded) for a lease, then asks JetStream whether the consumer is still the one this bridge started
    /// with (same creation time). If it is, deliveries go on under the new lease. If it was
    /// deleted, or deleted and made again, every member here is ended with `NOT_FOUND` (they
    /// rejoin and find the subscription as it is now) and the bridge hands nothing more over
    /// (`consumer_gone`) until the local subscription expires with them and it is stopped.
    pub(super) async fn verify_consumer(&mut self) {
        let Kind::Shared {
            consumer_gone: false,
            ..
        } = self.kind
        else {
            return;
        };
        // Bounded: a join or a leave meanwhile waits at most this long to be handled.
        let lease = self.shared.singletons.lease().clone();
        let Some(incarnation) = lease.wait_valid(self.pull_expires).await else {
            return;
        };
        let created = self.consumer.created();
        let same = match self.consumer.info().await {
            Ok(state) => state.created == created,
            Err(crate::cluster::jetstream::ConsumerError::NotFound) => false,
            Err(error) => {
                tracing::warn!(subscription = %self.subscription, %error, "cannot tell whether the consumer outlived this gateway's lease lapse; asking again");
                return;
            }
        };
        let Kind::Shared {
            verified,
            consumer_gone,
            ..
        } = &mut self.kind
        else {
            return;
        };
        if same {
            *verified = Some(incarnation);
            return;
        }
        *consumer_gone = true;
        tracing::warn!(subscription = %self.subscription, "the subscription was deleted while this gateway's lease had lapsed: ending its members here");
        self.shared.broker.end_members(
            &self.subscription,
            &Error::SubscriptionNotFound(format!(
                "{} (deleted while this gateway was out of the cluster: join again)",
                self.subscription
            )),
        );
    }

    /// What [`Bridge::leased`] reads, for an ack's confirmation task, which checks it before
    /// every try: `None` when not a singleton (always leased).
    pub(super) fn lease_gate(&self) -> Option<crate::cluster::gateway::data::acks::Gate> {
        let Kind::Singleton { incarnation, .. } = self.kind else {
            return None;
        };
        Some((self.shared.singletons.lease().clone(), incarnation))
    }
}
