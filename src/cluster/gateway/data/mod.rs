//! The data path: publishes into JetStream (one by one, grouped into atomic batches, streamed),
//! the bridges that pull from each consumer into the local broker, their acks and their
//! confirmations, reads ahead, the router of the local broker's decisions back to the bridges,
//! and acks forwarded to the gateway holding the member.

pub(super) mod acks;
pub(super) mod ahead;
pub(super) mod atomic;
pub(super) mod bridge;
pub(super) mod fenced;
pub(super) mod forward;
pub mod pipeline;
pub mod publish;
pub(super) mod router;
