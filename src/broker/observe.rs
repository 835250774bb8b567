//! A window onto every input the broker applies to a subscription: what it was, the effects it
//! produced and the subscription's state right after. Simulations and tests check docs/semantics.md#singleton-invariants
//! through it. The embedded broker runs without one in production; a cluster-mode
//! gateway's local broker always has one, the gateway's router, which turns what the local
//! core decides (acks, drops, dead letters, hand-backs) into JetStream acks: there the observer
//! is on the data path, so it must stay quick.

use super::ConnectionId;
use crate::core::{Effect, Epoch, MemberId, Subscription, SystemId};

/// An input applied to one subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// A member joined (at the back of the line).
    Join {
        /// The new member.
        member: MemberId,
        /// The connection its stream runs on, when the transport tells it.
        connection: Option<ConnectionId>,
        /// Its priority (docs/semantics.md#priority): where in the line it stands.
        priority: u32,
    },
    /// A member's stream ended.
    Leave {
        /// The member that left.
        member: MemberId,
    },
    /// A published message was queued (or, for a dead letter on a full queue, dropped).
    Enqueue {
        /// The message.
        system_id: SystemId,
    },
    /// An ack, accepted or refused.
    Ack {
        /// The member it was checked against (for a connection-fenced one, the holder found on
        /// that connection; `None` when refused before one was found).
        member: Option<MemberId>,
        /// Set when it named no member and was fenced by the connection it arrived on.
        connection: Option<ConnectionId>,
        /// The message.
        system_id: SystemId,
        /// Whether it released the message.
        accepted: bool,
    },
    /// A nack, accepted or refused.
    Nack {
        /// The member it was checked against (for a connection-fenced one, the holder found on
        /// that connection; `None` when refused before one was found).
        member: Option<MemberId>,
        /// Set when it named no member and was fenced by the connection it arrived on.
        connection: Option<ConnectionId>,
        /// The message.
        system_id: SystemId,
        /// Whether it returned the message.
        accepted: bool,
        /// Whether it was a release: a nack that keeps the attempt within its bound
        /// (docs/semantics.md#releases).
        release: bool,
    },
    /// A `HandOver` request: the active `member` steps down, as step-down `seq`
    /// (docs/semantics.md#hand-over).
    HandOver {
        /// The active member.
        member: MemberId,
        /// The step-down (an earlier one in progress, when there was one).
        seq: u64,
    },
    /// The hand-over timeout of step-down `seq` passed: what its member still holds goes to
    /// its successor.
    StepDownOverdue {
        /// The step-down.
        seq: u64,
    },
    /// Cluster mode: the cluster made this member of an arbitrated singleton active.
    Activate {
        /// The member.
        member: MemberId,
        /// Its epoch, from the cluster.
        epoch: Epoch,
    },
    /// Cluster mode: the cluster's coordinator asks this arbitrated singleton's active member
    /// to step down at a message boundary (docs/semantics.md#cluster-priority-and-hand-over).
    StepDown {
        /// The active member.
        member: MemberId,
        /// Why.
        cause: crate::core::StepDownCause,
    },
    /// Cluster mode: the coordinator called off this member's step-down (no successor left).
    CallOffStepDown {
        /// The member, active still.
        member: MemberId,
    },
    /// Cluster mode: the cluster's line moved past this member, which stepped down: it is on
    /// standby now.
    SteppedDown {
        /// The member.
        member: MemberId,
    },
    /// Cluster mode: the cluster's line places this standby of an arbitrated singleton at
    /// `position` (1 = next).
    PlaceInLine {
        /// The member.
        member: MemberId,
        /// Its place.
        position: u32,
    },
    /// Cluster mode: these queued messages were taken out, to go back upstream.
    HandBack {
        /// The messages, head first.
        ids: Vec<SystemId>,
        /// What the next active member's gateway must know of what goes back: each of `ids`,
        /// and each carried message that had not come back here, with the attempt its next
        /// delivery carries.
        carry: Vec<(SystemId, u32)>,
    },
    /// A publish fenced by this SINGLETON subscription's `epoch` was checked
    /// (docs/semantics.md#fenced-publish), under this subscription's lock: `passed` when the
    /// epoch was the active one, so the publish went on to be stored (or refused for another
    /// reason, a full queue); otherwise it was refused, nothing stored.
    Fence {
        /// The epoch the publish named.
        epoch: Epoch,
        /// Whether the check let it through.
        passed: bool,
    },
    /// Drop-oldest: the broker's drop-oldest pool had no room for another subscription's
    /// publish, so this subscription dropped its oldest messages (the effects) to make it
    /// (docs/semantics.md#memory-budget).
    Evict,
    /// The subscription expired after its idle time; it held `held` messages.
    Expire {
        /// Messages it still held.
        held: usize,
    },
    /// The subscription was deleted (`DeleteSubscription`, with no member joined); it held
    /// `held` messages, discarded with it.
    Delete {
        /// Messages it still held.
        held: usize,
    },
}

/// One applied input.
#[derive(Debug)]
pub struct Observation<'a> {
    /// The subscription after the input.
    pub subscription: &'a Subscription,
    /// The input.
    pub input: &'a Input,
    /// The effects it produced, in order.
    pub effects: &'a [Effect],
}

/// Receives every [`Observation`], in order per subscription, while the subscription's lock is
/// held: keep it quick and never call back into the broker.
pub trait Observer: Send + Sync + 'static {
    /// Called after each input.
    fn observe(&self, observation: &Observation<'_>);
}
