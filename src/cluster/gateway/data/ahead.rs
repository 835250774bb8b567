//! A bridge's read-ahead (docs/cluster-internals.md#read-ahead): an acked QUEUE or BROADCAST
//! subscription's bridge keeps a pull open for up to [`READ_AHEAD`] messages beyond what its
//! members have window for, so that a member's ack finds the next message already at the
//! gateway instead of paying a pull round trip to JetStream (at window 1, one per message).
//!
//! What is read ahead waits here, in stream order, not yet handed to the local subscription:
//! a member gets it when its window has room, exactly as if it had been pulled then. It gets
//! progress acks with what the members hold, and goes back to JetStream (a nak) when the
//! bridge stops. Not for singletons (their order across gateways rests on the gateway holding
//! only what its active member has room for), nor for ack-free subscriptions (JetStream
//! counts a message of an `AckNone` consumer done once pulled: it could not be given back),
//! nor where `max_delivery_attempts` is set: a message read ahead and given back unseen has
//! counted one JetStream delivery no member saw, which would make it come with one attempt
//! more (docs/semantics.md#cluster-attempts).

use std::collections::VecDeque;

use crate::cluster::jetstream::Delivery;

/// At most this many messages beyond the members' windows per bridge: what a gateway takes
/// away from the members of the same QUEUE subscription at other gateways, for as long as its
/// own members are busy.
pub(in crate::cluster::gateway) const READ_AHEAD: u64 = 32;

/// Messages pulled beyond the members' room, oldest first.
pub(in crate::cluster::gateway) struct Ahead<M = Delivery> {
    /// How many may wait here: [`READ_AHEAD`], or 0 where reading ahead is off.
    limit: u64,
    waiting: VecDeque<(u64, M)>,
}

impl<M> Ahead<M> {
    /// A read-ahead of `limit` messages (0: none).
    pub(in crate::cluster::gateway) fn new(limit: u64) -> Self {
        Self {
            limit,
            waiting: VecDeque::new(),
        }
    }

    /// Whether this bridge reads ahead at all.
    pub(in crate::cluster::gateway) fn on(&self) -> bool {
        self.limit > 0
    }

    /// How many messages the next pull asks for, given the members' `room`: the room and the
    /// read-ahead's free space, but only once at most half the read-ahead waits (so a pull
    /// brings many messages, not one each time a member takes one). 0: no pull now.
    pub(in crate::cluster::gateway) fn want(&self, room: u64) -> u64 {
        let waiting = self.waiting.len() as u64;
        if !self.on() {
            return room;
        }
        if waiting > self.limit / 2 {
            return 0;
        }
        room + self.limit - waiting
    }

    /// Whether a message that arrives now must wait: something already waits (order), or
    /// the members have no room.
    pub(in crate::cluster::gateway) fn must_wait(&self, room: impl FnOnce() -> u64) -> bool {
        self.on() && (!self.waiting.is_empty() || room() == 0)
    }

    /// Keeps `message` (stream sequence `sequence`) for later. JetStream redelivering one
    /// that already waits here replaces it (its newer reply subject answers it).
    pub(in crate::cluster::gateway) fn push(&mut self, sequence: u64, message: M) {
        match self.waiting.iter_mut().find(|(s, _)| *s == sequence) {
            Some(waiting) => waiting.1 = message,
            None => self.waiting.push_back((sequence, message)),
        }
    }

    /// The oldest waiting message.
    pub(in crate::cluster::gateway) fn pop(&mut self) -> Option<M> {
        self.waiting.pop_front().map(|(_, message)| message)
    }

    /// Whether nothing waits.
    pub(in crate::cluster::gateway) fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// What waits, oldest first (for progress acks).
    pub(in crate::cluster::gateway) fn waiting(&self) -> impl Iterator<Item = &M> {
        self.waiting.iter().map(|(_, m)| m)
    }

    /// Takes everything that waits (to give it back), oldest first.
    pub(in crate::cluster::gateway) fn take(&mut self) -> Vec<M> {
        self.waiting.drain(..).map(|(_, message)| message).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_asks_for_the_room_only() {
        let ahead = Ahead::<u64>::new(0);
        assert_eq!(ahead.want(0), 0);
        assert_eq!(ahead.want(7), 7);
        assert!(!ahead.must_wait(|| 0));
    }

    #[test]
    fn a_pull_brings_at_least_half_the_read_ahead() {
        let mut ahead = Ahead::new(READ_AHEAD);
        // Nothing waits: the room and the whole read-ahead, even with no room.
        assert_eq!(ahead.want(0), READ_AHEAD);
        assert_eq!(ahead.want(3), 3 + READ_AHEAD);
        for sequence in 0..=READ_AHEAD / 2 {
            ahead.push(sequence, sequence);
        }
        // More than half waits: no pull for one message at a time.
        assert_eq!(ahead.want(0), 0);
        assert_eq!(ahead.pop(), Some(0));
        assert_eq!(ahead.want(0), READ_AHEAD / 2);
    }

    #[test]
    fn arrivals_wait_behind_what_waits() {
        let mut ahead = Ahead::new(READ_AHEAD);
        assert!(!ahead.must_wait(|| 1));
        assert!(ahead.must_wait(|| 0));
        ahead.push(5, 5);
        assert!(ahead.must_wait(|| 10), "order: behind the waiting one");
    }

    #[test]
    fn a_redelivery_replaces_its_waiting_copy_in_place() {
        let mut ahead = Ahead::new(READ_AHEAD);
        ahead.push(1, "first");
        ahead.push(2, "second");
        ahead.push(1, "again");
        assert_eq!(
            ahead.waiting().copied().collect::<Vec<_>>(),
            ["again", "second"]
        );
        assert_eq!(ahead.take(), ["again", "second"]);
        assert!(ahead.is_empty());
    }
}
