//! The control path: the singleton shell over the coordinator, the lease gate every delivery and
//! ack passes, the fence records, the registry behind `queued_for` and the announcements that
//! keep every gateway's copy current.

pub(super) mod announce;
pub(super) mod fence;
pub(super) mod leaders;
pub(super) mod lease;
pub(super) mod registry;
pub mod singleton;
pub(super) mod waits;
pub(super) mod writes;
