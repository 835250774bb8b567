//! The way in: each message a pull brings goes to the local subscription (or waits in the
//! read-ahead while members have no room), unless the bridge already has it, it was acked here,
//! or the consumer is not yet checked again after a lease lapse.

use super::{Bridge, Kind, decode};
use crate::cluster::jetstream::{Answer, Delivery};
use crate::core::Error;
use crate::core::planted::{PlantedBug, active as planted};

impl Bridge {
    /// A message the open pull brought: handed to the local subscription, or, when the bridge
    /// reads ahead and the members have no room (or others wait already, or the bridge is
    /// stopping), kept in the read-ahead.
    pub(super) async fn arrive(&mut self, message: Delivery, stopping: bool) {
        let wait = self.ahead.on()
            && (stopping
                || self
                    .ahead
                    .must_wait(|| self.shared.broker.room(&self.subscription).unwrap_or(0)));
        if !wait {
            return self.inject(message).await;
        }
        match message.info().map(|info| info.stream_sequence) {
            Ok(sequence) => self.ahead.push(sequence, message),
            // Terminated there, as an undeliverable message.
            Err(_) => self.inject(message).await,
        }
    }

    /// Hands what was read ahead to the local subscription while its members have room.
    pub(super) async fn drain_ahead(&mut self) {
        while !self.ahead.is_empty() && self.shared.broker.room(&self.subscription).unwrap_or(0) > 0
        {
            if let Some(message) = self.ahead.pop() {
                self.inject(message).await;
            }
        }
    }

    /// Hands one JetStream message to the local subscription.
    pub(super) async fn inject(&mut self, message: Delivery) {
        let reply = message.reply().cloned();
        let info = match message.info() {
            Ok(info) => (info.stream_sequence, info.delivered, info.published_nanos),
            Err(error) => {
                tracing::warn!(subscription = %self.subscription, %error, "a JetStream message without its metadata; terminating it");
                if let Some(reply) = reply {
                    self.reply(reply, Answer::Term).await;
                }
                return;
            }
        };
        let (sequence, delivered, published_nanos) = info;
        if let Kind::Singleton { incarnation, .. } = &mut self.kind {
            // A new incarnation: what the bridge held under an earlier one is never answered
            // now (its lease ended); JetStream redelivers it. Within one incarnation, lapsed or
            // not, the message goes to the local subscription: a member's stream writes nothing
            // while the lease is not valid (docs/semantics.md#cluster-lease-checks), and what
            // waits there is written if the lease is renewed, or dropped when the gateway ends
            // the member (docs/semantics.md#cluster-lease-lapse).
            let now = self.shared.singletons.lease().incarnation();
            if *incarnation != Some(now) {
                self.held.clear();
                self.refused.clear();
                *incarnation = Some(now);
            }
        }
        // First what this gateway already has of the message, whatever else holds it back: a
        // redelivery of one it holds or acked is never given back (a nak would undo the ack).
        if self.explicit
            && let Some(reply) = &reply
            && let Some(held) = self.held.get_mut(&sequence)
        {
            // JetStream redelivered a message this gateway still holds (an ack or progress
            // went missing): keep the one copy, answer through the newest subject.
            *held = reply.clone();
            return;
        }
        if self.explicit
            && let Some(reply) = &reply
            && let Some(&(kind, _)) = self.confirming.sequences.get(&sequence)
        {
            // JetStream redelivered a message whose ack (or term) it has not confirmed yet
            // (its consumer's leader stopped before applying it): settled already, so not
            // delivered again; the ack goes again through the new subject.
            tracing::debug!(subscription = %self.subscription, sequence, "JetStream redelivered a message acked here; acking it again");
            self.confirm(sequence, reply.clone(), kind);
            return;
        }
        let unverified = match self.kind {
            Kind::Shared {
                verified,
                consumer_gone,
                ..
            } => consumer_gone || verified != Some(self.shared.singletons.lease().incarnation()),
            Kind::Singleton { .. } => false,
        };
        if unverified {
            // Any other mode: a gateway whose lease ended (a new incarnation) was taken for
            // dead by the others, which count none of its members, so the subscription may
            // have been deleted (and made again, with other settings, under the same name)
            // meanwhile (docs/semantics.md#cluster-delete). Nothing is handed over until the
            // bridge has made sure its consumer is the one its members joined: the message
            // goes back, once the open pull ended.
            let at_once = planted(PlantedBug::GiveBackIntoOpenPull);
            if let Kind::Shared {
                await_lease,
                unchecked,
                ..
            } = &mut self.kind
            {
                *await_lease = true;
                if !at_once {
                    unchecked.extend(reply);
                    return;
                }
            }
            if let Some(reply) = reply {
                self.reply(reply, Answer::Nak(None)).await;
            }
            return;
        }
        let decoded = decode(
            &self.shared.prefix,
            &message,
            sequence,
            published_nanos,
            &mut self.last_envelope,
        );
        let (message, dead_letter_of) = match decoded {
            Ok(decoded) => decoded,
            Err(why) => {
                tracing::warn!(subscription = %self.subscription, sequence, why, "an undeliverable JetStream message; terminating it");
                if let Some(reply) = reply {
                    self.reply(reply, Answer::Term).await;
                }
                return;
            }
        };
        if let Some(patterns) = &self.only
            && !patterns.iter().any(|p| p.matches(message.topic()))
        {
            // Brought by a filter that covers the subscription's overlapping patterns, wanted
            // by none of them (docs/semantics.md#cluster-patterns): done at once, so the stream
            // keeps it no longer for this subscription.
            tracing::trace!(subscription = %self.subscription, sequence, topic = %message.topic(), "a message no pattern of the subscription matches; acked unseen");
            if self.explicit
                && let Some(reply) = reply
            {
                self.reply(reply, Answer::Ack).await;
            }
            return;
        }
        if dead_letter_of.as_deref() == Some(&*self.subscription) {
            // This subscription's own dead letter, matching its own patterns: as in the
            // embedded broker, a dead letter skips the subscription it came from (no loop).
            // Marked by the gateway that stored it, not by `tinybroker-dead-letter-*`, which
            // a client's message may carry (a dead letter sent back to be tried again).
            if let Some(reply) = reply {
                self.reply(reply, Answer::Ack).await;
            }
            return;
        }
        let attempt = u32::try_from(delivered.max(1)).unwrap_or(u32::MAX);
        if self.explicit
            && let Some(reply) = &reply
        {
            // Held before the injection: an ack the injection triggers is handled after it.
            self.held.insert(sequence, reply.clone());
        }
        match self
            .shared
            .broker
            .inject(&self.subscription, message, attempt, &self.live)
        {
            Ok(()) => {}
            // No active member here, or the subscription is gone here: its Left or Stop is on
            // the way. Naked now, it could come straight back to the pull still open; held, it
            // is given back in order with the rest once that pull ends.
            Err(Error::Unavailable(_) | Error::SubscriptionNotFound(_) | Error::ShuttingDown)
                if self.held.contains_key(&sequence) =>
            {
                self.refused.insert(sequence, attempt);
            }
            Err(error) => {
                if let Some(reply) = self.held.remove(&sequence) {
                    self.reply(reply, Answer::Nak(None)).await;
                }
                if !matches!(
                    error,
                    Error::Unavailable(_) | Error::SubscriptionNotFound(_) | Error::ShuttingDown
                ) {
                    tracing::warn!(subscription = %self.subscription, sequence, %error, "could not queue a JetStream message here; gave it back");
                }
            }
        }
    }
}
