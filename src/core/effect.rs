//! What one subscription's inputs produce: the effects the shell carries out, in order, and the
//! counters they move.

use super::{
    message::{Message, SystemId},
    subscription::{Epoch, MemberId},
};

/// What the shell must do after an input, in this order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Tell `member` it is active, with its epoch (always its first frame).
    Confirm {
        /// The member now active.
        member: MemberId,
        /// Its fencing token.
        epoch: Epoch,
    },
    /// Tell a singleton standby that asked for it where it stands in line (1 = next).
    Standby {
        /// The standby member.
        member: MemberId,
        /// Its place in line.
        position: u32,
    },
    /// A SINGLETON's active member steps down at a message boundary (docs/semantics.md#hand-over):
    /// it is sent nothing more, and once what it holds is settled it goes on standby and the
    /// next in line is promoted. The shell gives it until its hand-over deadline, then calls
    /// [`Subscription::step_down_overdue`](super::Subscription::step_down_overdue) with `seq`.
    SteppingDown {
        /// The active member stepping down.
        member: MemberId,
        /// Names this step-down (a later one has a higher `seq`).
        seq: u64,
        /// Why.
        cause: StepDownCause,
    },
    /// The active member stepped down: it is on standby now, at `position` (1 = next), and
    /// `epoch`, the one it held, has ended. A [`Confirm`](Effect::Confirm) of its successor
    /// follows.
    SteppedDown {
        /// The member now on standby.
        member: MemberId,
        /// The epoch it held.
        epoch: Epoch,
        /// Its place in line.
        position: u32,
    },
    /// Send `message` to `member`.
    Deliver {
        /// The receiving member.
        member: MemberId,
        /// The message.
        message: Message,
        /// 1 on first delivery, +1 on each redelivery.
        attempt: u32,
        /// The receiving member's epoch.
        epoch: Epoch,
    },
    /// Publish a poisoned message to the dead-letter topic.
    DeadLetter {
        /// The poisoned message.
        message: Message,
        /// How many times it was delivered.
        attempts: u32,
    },
    /// Take the frame of `system_id` out of `member`'s outlet: its stream has not written it
    /// and it is being dropped (a [`Dropped`](Effect::Dropped) for it follows). Only an
    /// ack-free subscription's drop-oldest policy withdraws a frame, to keep the newest
    /// (docs/semantics.md#overflow-policies).
    Withdraw {
        /// The member whose stream has not written it.
        member: MemberId,
        /// The message.
        system_id: SystemId,
    },
    /// A message left the subscription without being acked (counted in [`Counters`]).
    Dropped {
        /// The dropped message.
        system_id: SystemId,
        /// Why.
        reason: DropReason,
    },
}

/// Why a SINGLETON's active member steps down (docs/semantics.md#hand-over).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepDownCause {
    /// A member of higher priority joined (docs/semantics.md#priority).
    Priority,
    /// A `HandOver` request.
    HandOver,
}

/// What a client's settlement of a delivered message asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settlement {
    /// Done with it for good ([`Subscription::ack`]).
    Ack,
    /// Give it back for redelivery, counting an attempt ([`Subscription::nack`]).
    Nack,
    /// Give it back unworked, keeping the attempt within the bound ([`Subscription::release`],
    /// docs/semantics.md#releases).
    Release,
}

/// Why a message was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// It reached `max_delivery_attempts` and no dead-letter topic is set.
    MaxDeliveryAttempts,
    /// A dead letter or other broker-internal publish found the queue full.
    QueueFull,
    /// The queue (or the broker's drop-oldest memory pool) was full and its overflow policy is
    /// drop-oldest: this message made room (or, when nothing older could make room, was itself
    /// not queued).
    Overflow,
}

/// Monotonic counters of one subscription.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Messages queued.
    pub enqueued: u64,
    /// Deliveries, first or repeated.
    pub delivered: u64,
    /// Deliveries with attempt > 1.
    pub redelivered: u64,
    /// Messages released by an ack.
    pub acked: u64,
    /// Nacks accepted.
    pub nacked: u64,
    /// Releases accepted (docs/semantics.md#releases): those within the bound, which keep the
    /// attempt, and those past it, which count one as a nack would.
    pub released: u64,
    /// Poisoned messages sent to the dead-letter topic.
    pub dead_lettered: u64,
    /// Poisoned messages dropped (no dead-letter topic).
    pub dropped_max_attempts: u64,
    /// Publishes refused because this subscription was full.
    pub rejected_full: u64,
    /// Broker-internal publishes (dead letters) dropped because this subscription was full.
    pub dropped_full: u64,
    /// Standbys promoted to active.
    pub promotions: u64,
    /// Fenced acks or nacks refused because the member no longer held the message.
    pub stale_acks: u64,
    /// Messages dropped by the drop-oldest overflow policy.
    pub dropped_overflow: u64,
    /// Active members that stepped down to a successor (a hand-over or a higher-priority
    /// takeover, docs/semantics.md#hand-over); each also counts in `promotions`.
    pub handovers: u64,
    /// Of those, the ones whose deadline passed with messages still in flight, which went back
    /// to the queue for the successor.
    pub handovers_overdue: u64,
}
