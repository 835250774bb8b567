//! A subscription's waiting messages, head first, each with the attempt number its next
//! delivery will carry.
//!
//! Almost every queued message waits for its first delivery, so those are kept as bare
//! one-word [`Message`]s; only messages given back (nacked, or held by a member that left),
//! which always go to the head, keep their attempt number beside them. A million queued
//! messages then cost 8 MB of slots instead of 16.

use std::collections::{BTreeMap, VecDeque};

use super::message::{Message, SystemId};

/// Waiting messages in delivery order: every given-back message, then every fresh one.
#[derive(Debug, Clone, Default)]
pub(super) struct Queue {
    /// Given back, head first, with the attempt of their next delivery (at least 2, or 1 for a
    /// first delivery released without counting) and whether that attempt's one release that
    /// does not count is used (docs/semantics.md#releases).
    returned: VecDeque<(Message, u32, bool)>,
    /// Never delivered by this broker (their next delivery is attempt 1 unless `later` says
    /// otherwise), in publish order.
    fresh: VecDeque<Message>,
    /// Attempts above 1 of messages in `fresh`: only cluster mode queues a message at the back
    /// that an upstream store delivered before (`push_back_attempt`), so this is almost always
    /// empty and costs nothing per message.
    /// Each with whether its attempt's release that does not count is used.
    later: BTreeMap<SystemId, (u32, bool)>,
}

impl Queue {
    /// Messages waiting.
    pub(super) fn len(&self) -> usize {
        self.returned.len() + self.fresh.len()
    }

    /// Whether nothing waits.
    pub(super) fn is_empty(&self) -> bool {
        self.returned.is_empty() && self.fresh.is_empty()
    }

    /// Queues a newly published message at the back.
    pub(super) fn push_back(&mut self, message: Message) {
        self.fresh.push_back(message);
    }

    /// Queues at the back a message whose next delivery carries `attempt` (cluster mode: an
    /// upstream store delivered it before); `released` when that attempt's release that does
    /// not count is used (docs/semantics.md#releases).
    pub(super) fn push_back_attempt(&mut self, message: Message, attempt: u32, released: bool) {
        if attempt > 1 || released {
            self.later.insert(message.system_id(), (attempt, released));
        }
        self.push_back(message);
    }

    /// Puts a message back at the head, to be delivered next as `attempt`; `released` when that
    /// attempt's release that does not count is used (docs/semantics.md#releases).
    pub(super) fn push_front(&mut self, message: Message, attempt: u32, released: bool) {
        if attempt <= 1 && !released && self.returned.is_empty() {
            self.fresh.push_front(message);
        } else {
            self.returned.push_front((message, attempt, released));
        }
    }

    /// Puts a given-back message before the first given-back one with a higher id (so given-back
    /// messages kept in id order stay so), to be delivered as `attempt`; `released` as for
    /// [`push_front`](Self::push_front). A singleton's queue is in id order and everything
    /// given back is below every fresh message, so this keeps the whole queue in id order.
    pub(super) fn insert_in_order(&mut self, message: Message, attempt: u32, released: bool) {
        let id = message.system_id();
        let at = self
            .returned
            .iter()
            .position(|(m, _, _)| m.system_id() > id)
            .unwrap_or(self.returned.len());
        if at == self.returned.len() && attempt <= 1 && !released {
            // Just before the fresh ones: the same place.
            self.fresh.push_front(message);
        } else {
            self.returned.insert(at, (message, attempt, released));
        }
    }

    /// Takes the head with the attempt its delivery carries and whether that attempt's release
    /// that does not count is used.
    pub(super) fn pop_front(&mut self) -> Option<(Message, u32, bool)> {
        self.returned.pop_front().or_else(|| {
            let message = self.fresh.pop_front()?;
            let (attempt, released) = self
                .later
                .remove(&message.system_id())
                .unwrap_or((1, false));
            Some((message, attempt, released))
        })
    }

    /// The head's id, if any.
    pub(super) fn front_id(&self) -> Option<SystemId> {
        self.returned
            .front()
            .map(|(m, _, _)| m)
            .or_else(|| self.fresh.front())
            .map(Message::system_id)
    }

    /// Messages with their next attempt, head first.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&Message, u32)> + '_ {
        self.returned
            .iter()
            .map(|(m, attempt, _)| (m, *attempt))
            .chain(self.fresh.iter().map(|m| {
                let attempt = self.later.get(&m.system_id()).map_or(1, |(a, _)| *a);
                (m, attempt)
            }))
    }

    /// Empties it.
    pub(super) fn clear(&mut self) {
        self.returned.clear();
        self.fresh.clear();
        self.later.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{Envelope, Headers, Topic};

    fn message(id: u64) -> Message {
        let envelope = Envelope::new(Topic::parse("a").unwrap(), Headers::new());
        Message::new(id, 0, envelope, b"")
    }

    fn contents(q: &Queue) -> Vec<(u64, u32)> {
        q.iter().map(|(m, a)| (m.system_id(), a)).collect()
    }

    // The order is a plain deque's: given-back messages at the head in the order they were put
    // there (last put, first out), then the fresh ones in publish order.
    #[test]
    fn behaves_as_one_deque() {
        let mut q = Queue::default();
        q.push_back(message(3));
        q.push_back(message(4));
        q.push_front(message(2), 2, false);
        q.push_front(message(1), 3, false);
        q.push_back(message(5));
        assert_eq!(contents(&q), vec![(1, 3), (2, 2), (3, 1), (4, 1), (5, 1)]);
        assert_eq!(q.len(), 5);
        let popped: Vec<_> = std::iter::from_fn(|| q.pop_front())
            .map(|(m, a, _)| (m.system_id(), a))
            .collect();
        assert_eq!(popped, vec![(1, 3), (2, 2), (3, 1), (4, 1), (5, 1)]);
        assert!(q.is_empty());
    }

    // Cluster mode queues at the back a message upstream delivered before: it keeps its attempt
    // through pops, iteration and clearing, and the others keep attempt 1.
    #[test]
    fn a_message_queued_at_the_back_keeps_the_attempt_it_came_with() {
        let mut q = Queue::default();
        q.push_back(message(1));
        q.push_back_attempt(message(2), 4, false);
        q.push_back_attempt(message(3), 1, false);
        q.push_front(message(0), 2, false);
        assert_eq!(contents(&q), vec![(0, 2), (1, 1), (2, 4), (3, 1)]);
        let popped: Vec<_> = std::iter::from_fn(|| q.pop_front())
            .map(|(m, a, _)| (m.system_id(), a))
            .collect();
        assert_eq!(popped, vec![(0, 2), (1, 1), (2, 4), (3, 1)]);
        q.push_back_attempt(message(5), 3, false);
        q.clear();
        q.push_back(message(5));
        assert_eq!(contents(&q), vec![(5, 1)], "clear forgets the attempt too");
    }

    // An attempt-1 message put back behind a returned one must not jump ahead of it.
    #[test]
    fn a_first_attempt_put_back_keeps_its_place() {
        let mut q = Queue::default();
        q.push_back(message(3));
        q.push_front(message(2), 2, false);
        q.push_front(message(1), 1, false);
        assert_eq!(contents(&q), vec![(1, 1), (2, 2), (3, 1)]);
        q.clear();
        assert!(q.is_empty());
        q.push_front(message(1), 1, false);
        assert_eq!(contents(&q), vec![(1, 1)]);
    }

    // A first delivery released without counting goes back to the head with its release
    // marked used, and keeps the mark through a pop (docs/semantics.md#releases).
    #[test]
    fn a_released_first_attempt_keeps_its_mark() {
        let mut q = Queue::default();
        q.push_back(message(2));
        q.push_front(message(1), 1, true);
        q.push_back_attempt(message(3), 1, true);
        let popped: Vec<_> = std::iter::from_fn(|| q.pop_front())
            .map(|(m, a, r)| (m.system_id(), a, r))
            .collect();
        assert_eq!(popped, vec![(1, 1, true), (2, 1, false), (3, 1, true)]);
    }
}
