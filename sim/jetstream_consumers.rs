//! The consuming side of the JetStream model (`jetstream.rs`): durable pull consumers of the
//! one stream, with what the gateway relies on (`tinybroker::cluster::jetstream`'s module doc):
//! deliveries in stream order with redeliveries first, delivery counts, acks, naks (with a
//! delay), terms, progress, the ack wait, ack-free consumers, and a consumer deleted or made
//! again under its name. Time is the stream model's true time (`true_time.rs`), passed in.

use std::{collections::BTreeMap, time::Duration};

use tinybroker::cluster::jetstream::{
    AckReply, Answer, ConsumerConfig, ConsumerInfo, Delivery, DeliveryInfo,
};

use crate::jetstream::Stored;

/// A delivered message not yet acked or terminated.
#[derive(Debug, Clone, Copy)]
struct Pending {
    delivered: i64,
    /// When it comes again (its ack wait, or a nak's delay, from its last answer).
    due: Duration,
}

/// One consumer's state.
#[derive(Debug)]
pub struct ConsumerModel {
    pub config: ConsumerConfig,
    /// Its creation instant, as JetStream reports it (unique per consumer made).
    pub created: i128,
    /// The next stream sequence not yet delivered once.
    next: u64,
    /// Deliveries made (the consumer sequence).
    consumer_sequence: u64,
    /// The highest stream sequence delivered.
    delivered_stream_sequence: u64,
    pending: BTreeMap<u64, Pending>,
}

fn wanted(config: &ConsumerConfig, subject: &str) -> bool {
    config.filters.is_empty()
        || config
            .filters
            .iter()
            .any(|filter| crate::bus::matches(filter, subject))
}

/// `(stream, consumer, stream sequence)` of a reply subject this model made.
pub fn parse_reply(reply: &AckReply) -> Option<(&str, &str, u64)> {
    let mut tokens = reply.as_str().split('.');
    let ("$JS", "ACK") = (tokens.next()?, tokens.next()?) else {
        return None;
    };
    let (stream, consumer, _delivered) = (tokens.next()?, tokens.next()?, tokens.next()?);
    Some((stream, consumer, tokens.next()?.parse().ok()?))
}

impl ConsumerModel {
    pub fn new(config: ConsumerConfig, created: i128) -> Self {
        Self {
            config,
            created,
            next: 1,
            consumer_sequence: 0,
            delivered_stream_sequence: 0,
            pending: BTreeMap::new(),
        }
    }

    /// Up to `max` deliveries due at `now` (given back and past their wait first, in stream
    /// order, then new ones), for the consumer `name` of stream `stream`.
    pub fn take(
        &mut self,
        (stream, name): (&str, &str),
        messages: &BTreeMap<u64, Stored>,
        max: usize,
        now: Duration,
    ) -> Vec<Delivery> {
        let mut due: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, pending)| pending.due <= now)
            .map(|(&sequence, _)| sequence)
            .take(max)
            .collect();
        // At most `max_ack_pending` delivered and unanswered: no new one past it.
        let unanswered_room = match self.config.max_ack_pending {
            limit if self.config.explicit && limit > 0 => {
                (limit as usize).saturating_sub(self.pending.len())
            }
            _ => usize::MAX,
        };
        let room = (max - due.len()).min(unanswered_room);
        let fresh: Vec<u64> = messages
            .range(self.next..)
            .filter(|(_, stored)| wanted(&self.config, &stored.subject))
            .map(|(&sequence, _)| sequence)
            .take(room)
            .collect();
        if let Some(&last) = fresh.last() {
            self.next = last + 1;
        } else if room > 0 {
            // Nothing of its filter after `next`: every message stored was looked at.
            self.next = messages
                .keys()
                .next_back()
                .map_or(self.next, |last| last + 1);
        }
        due.extend(&fresh);
        let mut deliveries = Vec::with_capacity(due.len());
        for sequence in due {
            let Some(stored) = messages.get(&sequence) else {
                self.pending.remove(&sequence);
                continue;
            };
            let delivered = match self.pending.get(&sequence) {
                Some(pending) => pending.delivered + 1,
                None => 1,
            };
            if self.config.explicit {
                self.pending.insert(
                    sequence,
                    Pending {
                        delivered,
                        due: now + self.config.ack_wait,
                    },
                );
            }
            self.consumer_sequence += 1;
            self.delivered_stream_sequence = self.delivered_stream_sequence.max(sequence);
            let reply = format!(
                "$JS.ACK.{stream}.{name}.{delivered}.{sequence}.{}.{}.0",
                self.consumer_sequence, stored.published_nanos
            );
            deliveries.push(Delivery::new(
                stored.subject.clone(),
                stored.headers.clone(),
                stored.payload.clone(),
                Some(AckReply::new(&reply)),
                Ok(DeliveryInfo {
                    stream_sequence: sequence,
                    delivered,
                    published_nanos: stored.published_nanos,
                }),
            ));
        }
        deliveries
    }

    /// Delivers nothing stored before stream sequence `next` (a consumer delivering what is
    /// stored from its making on).
    pub fn skip_to(&mut self, next: u64) {
        self.next = next;
    }

    /// When the next message given back comes due, if one waits.
    pub fn next_due(&self) -> Option<Duration> {
        self.pending.values().map(|pending| pending.due).min()
    }

    /// Applies `answer` to stream message `sequence` at `now`.
    pub fn answer(&mut self, sequence: u64, answer: Answer, now: Duration) {
        match answer {
            Answer::Ack | Answer::Term => {
                self.pending.remove(&sequence);
            }
            Answer::Nak(delay) => {
                if let Some(pending) = self.pending.get_mut(&sequence) {
                    pending.due = now + delay.unwrap_or_default();
                }
            }
            Answer::Progress => {
                if let Some(pending) = self.pending.get_mut(&sequence) {
                    pending.due = now + self.config.ack_wait;
                }
            }
        }
    }

    /// Its state, over the stream's `messages`.
    pub fn info(&self, messages: &BTreeMap<u64, Stored>) -> ConsumerInfo {
        ConsumerInfo {
            name: self.config.name.clone(),
            metadata: self.config.metadata.clone(),
            created: self.created,
            redelivered: self
                .pending
                .values()
                .filter(|pending| pending.delivered > 1)
                .count() as u64,
            everywhere: true,
            behind: Vec::new(),
            pending: messages
                .range(self.next..)
                .filter(|(_, stored)| wanted(&self.config, &stored.subject))
                .count() as u64,
            ack_pending: self.pending.len() as u64,
            delivered_stream_sequence: self.delivered_stream_sequence,
        }
    }
}
