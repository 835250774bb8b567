//! What the coordinator asks of its shell: writes to run on the backplane ([`Command`]), and
//! what to do to local members ([`Effect`]).

use bytes::Bytes;

use crate::cluster::backplane::Revision;
use crate::cluster::values::{Key, StepDownCause};

/// An id matching a [`Command`] to its [`Coordinator::write_result`].
pub type RequestId = u64;

/// A write for the shell to run on the backplane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    /// Echo it in [`Coordinator::write_result`].
    pub id: RequestId,
    /// The key.
    pub key: Key,
    /// What to do.
    pub op: Op,
}

/// A backplane write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// [`super::backplane::Backplane::create`].
    Create(Bytes),
    /// [`super::backplane::Backplane::update`].
    Update(Bytes, Revision),
    /// [`super::backplane::Backplane::delete`].
    Delete(Revision),
}

/// What became of a [`Coordinator::proclaim`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proclaimed {
    /// Taken: [`Effect::Proclaimed`] follows once the line holds it.
    Taken,
    /// This gateway holds no such member.
    NotHere,
    /// The line has no room for that much more metadata ([`MAX_LINE_METADATA`]).
    NoRoom,
}

/// Why a member's stream ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndStatus {
    /// The gateway lost its lease, or the cluster removed the member: the client rejoins.
    Unavailable,
    /// The line's value would pass [`MAX_LINE_BYTES`] with this member in it (joins at several
    /// gateways at once passed [`MAX_LINE_METADATA`] together): it never entered the line.
    LineFull,
}

/// What the shell does to a local member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Send the confirmation frame: the member is active with this epoch.
    Activate {
        /// The subscription.
        subscription: String,
        /// The local member id.
        member: u64,
        /// Its fencing token.
        epoch: u64,
        /// The attempts the messages given back by the previous active member's gateway
        /// carry ([`SubValue::carry`]).
        carry: Vec<(u64, u32)>,
        /// It took over from an earlier active member ([`SubValue::promoted`]).
        promoted: bool,
        /// The earlier active member's gateway died ([`SubValue::took_over`]).
        took_over: bool,
    },
    /// The member's metadata as last given ([`Coordinator::proclaim`]) is in the line: its
    /// proclamation can be answered.
    Proclaimed {
        /// The subscription.
        subscription: String,
        /// The local member id.
        member: u64,
    },
    /// The member is in the line (this gateway saw a value holding it, its own write's or the
    /// watch's): its join can be answered. Every member that joins after this, on any
    /// gateway, stands behind it (a later append compare-and-sets a value holding it).
    InLine {
        /// The subscription.
        subscription: String,
        /// The local member id.
        member: u64,
    },
    /// The member, on standby, entered the line at `position` (1 = next): tell it, if it
    /// asked for standby notices.
    Standby {
        /// The subscription.
        subscription: String,
        /// The local member id.
        member: u64,
        /// Members ahead of it in the line when it entered.
        position: u32,
    },
    /// The line asks the member, active here, to step down at a message boundary
    /// (docs/semantics.md#cluster-priority-and-hand-over): send it nothing more; once it holds
    /// nothing and what waits here went back, tell [`Coordinator::member_yielded`].
    StepDown {
        /// The subscription.
        subscription: String,
        /// The local member id.
        member: u64,
        /// Why.
        cause: StepDownCause,
    },
    /// The member's step-down is off (no successor is left in the line): it goes on.
    CallOffStepDown {
        /// The subscription.
        subscription: String,
        /// The local member id.
        member: u64,
    },
    /// The line moved past the member, which stepped down: it is on standby at `position`
    /// (1 = next), and its epoch has ended.
    SteppedDown {
        /// The subscription.
        subscription: String,
        /// The local member id.
        member: u64,
        /// Its place among the standbys.
        position: u32,
        /// The epoch it held, which ended: recorded as ended before the member is told
        /// (docs/semantics.md#cluster-fenced-publish).
        epoch: u64,
    },
    /// End the member's stream with this status; the coordinator has forgotten it.
    End {
        /// The subscription.
        subscription: String,
        /// The local member id.
        member: u64,
        /// The gRPC status to end with.
        status: EndStatus,
    },
}
