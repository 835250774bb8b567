//! The drop-oldest policy of one subscription: which message goes to make room, within the
//! queue's limits and the broker's drop-oldest pool (docs/semantics.md#overflow-policies,
//! docs/semantics.md#memory-budget).

use super::*;

impl Subscription {
    /// Drops the oldest messages it may drop until one of `size` bytes fits the queue's limits
    /// and, with its [`MESSAGE_OVERHEAD`], `room` plus what the drops freed; false if nothing
    /// is left to drop and it still does not fit.
    pub(super) fn make_room(&mut self, size: usize, room: u64, out: &mut Vec<Effect>) -> bool {
        let needed = size as u64 + MESSAGE_OVERHEAD;
        if !self.could_make_room(size, room) {
            // Dropping everything would not make room: nothing is dropped for nothing.
            return false;
        }
        let mut freed = 0u64;
        while self.check_capacity(size).is_err() || room.saturating_add(freed) < needed {
            let Some(bytes) = self.drop_oldest(out) else {
                return false;
            };
            freed += bytes;
        }
        true
    }

    /// Whether a message of `size` bytes could be held here at all, once everything the
    /// drop-oldest policy may drop were dropped (within the queue's limits; memory aside).
    pub fn could_hold(&self, size: usize) -> bool {
        self.spec.overflow == Overflow::RejectPublish || self.could_make_room(size, u64::MAX)
    }

    /// Drop-oldest: drops the oldest message this subscription may drop, to make room in the
    /// broker's drop-oldest pool for another subscription's publish; returns the memory freed,
    /// or `None` when it holds nothing it may drop (docs/semantics.md#memory-budget).
    pub fn evict_oldest(&mut self, out: &mut Vec<Effect>) -> Option<u64> {
        if self.spec.overflow != Overflow::DropOldest {
            return None;
        }
        self.drop_oldest(out)
    }

    /// The memory dropping every message the drop-oldest policy may drop would free.
    pub fn droppable_footprint(&self) -> u64 {
        let (mut count, mut bytes) = (self.queue.len() as u64, self.queued_bytes());
        if self.spec.ack_mode == AckMode::None {
            count += self.unwritten as u64;
            bytes += self.in_flight_bytes;
        }
        bytes + count * MESSAGE_OVERHEAD
    }

    /// Whether dropping every message the drop-oldest policy may drop would let one of `size`
    /// bytes in, within the queue's limits and `room` plus what the drops free.
    pub(super) fn could_make_room(&self, size: usize, room: u64) -> bool {
        let (mut count, mut bytes) = (self.queue.len() as u64, self.queued_bytes());
        if self.spec.ack_mode == AckMode::None {
            count += self.unwritten as u64;
            bytes += self.in_flight_bytes;
        }
        let held = (self.queue.len() + self.in_flight()) as u64;
        held - count < self.limits.max_messages
            && self.held_bytes - bytes + size as u64 <= self.limits.max_bytes
            && room.saturating_add(bytes + count * MESSAGE_OVERHEAD)
                >= size as u64 + MESSAGE_OVERHEAD
    }

    /// Drops the oldest message the drop-oldest policy may drop and returns the memory it
    /// freed (its size and [`MESSAGE_OVERHEAD`]), or `None` when there is none. That is the
    /// queue's head or, in an ack-free subscription, the frame that has waited longest in a
    /// member's outlet (its stream has not written it), whichever has the lower id: a stalled
    /// ack-free reader that resumes gets the newest messages, not the first ones. (A member's
    /// frames wait in delivery order, which is id order except for a message a leaving member
    /// gave back, delivered behind newer ones.) An acked subscription's in-flight messages
    /// are its members' to settle and are never dropped.
    pub(super) fn drop_oldest(&mut self, out: &mut Vec<Effect>) -> Option<u64> {
        let queued = self.queue.front_id();
        let unwritten = (self.spec.ack_mode == AckMode::None)
            .then(|| {
                self.members
                    .iter()
                    .filter_map(|(id, m)| m.unwritten.front().map(|r| (r.message.system_id(), *id)))
                    .min()
            })
            .flatten();
        let message = match (queued, unwritten) {
            (Some(q), Some((u, _))) if q < u => self.queue.pop_front()?.0,
            (_, Some((system_id, member_id))) => {
                let member = self.members.get_mut(&member_id)?;
                let record = member.unwritten.pop_front()?;
                member.in_flight -= 1;
                self.unwritten -= 1;
                self.in_flight_bytes -= record.message.size() as u64;
                out.push(Effect::Withdraw {
                    member: member_id,
                    system_id,
                });
                record.message
            }
            (Some(_), None) => self.queue.pop_front()?.0,
            (None, None) => return None,
        };
        let size = message.size() as u64;
        self.held_bytes -= size;
        self.counters.dropped_overflow += 1;
        out.push(Effect::Dropped {
            system_id: message.system_id(),
            reason: DropReason::Overflow,
        });
        Some(size + MESSAGE_OVERHEAD)
    }
}
