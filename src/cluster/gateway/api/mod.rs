//! The gateway's answers to the backend seam's operations (`crate::backend`): joins, listings,
//! descriptions, deletes, hand-overs and leadership, each an `impl Gateway` of its own.

pub(super) mod delete;
pub(super) mod describe;
pub(super) mod forwarded;
pub(super) mod handover;
pub(super) mod join;
pub(super) mod leadership;
pub(super) mod list;
