//! The backplane seam: the few key-value operations cluster mode needs from its coordination
//! store, modelled on JetStream KV. Two implementations: NATS in production
//! ([`super::nats`], over `async-nats`) and the in-memory model in `sim/backplane.rs`; one
//! contract suite (`sim/backplane_contract.rs`) holds both to the semantics below, the NATS one
//! against a real three-node cluster.
//!
//! # Semantics every implementation must keep
//! - One bucket, one **revision counter**: every successful write (create, update, delete) gets a
//!   revision strictly above every revision the bucket handed out before, for any key. (JetStream:
//!   the stream sequence.)
//! - Every operation is **linearizable**: it takes effect at one instant between its call and its
//!   answer, and the compare-and-set checks see every write that took effect before that instant.
//!   (JetStream: the stream's leader orders writes; `expected last subject sequence`.)
//! - An operation that fails with [`KvError::Unavailable`] **may or may not have taken effect**
//!   (the request reached the store, the answer was lost). Callers learn the outcome from the
//!   watch, never by assuming either way.
//! - A [`Backplane::watch`] delivers, per prefix, first the latest entry of every matching key
//!   (deletions included), then every later change, all in revision order and without gaps while
//!   connected. A client cut off from the store sees its watch stop; when it reconnects the watch
//!   resumes after the last revision it delivered (JetStream: an ordered consumer), with the
//!   latest revision of every key that changed meanwhile, in revision order: a revision that was
//!   overwritten while the watch was cut off may be skipped (the bucket keeps each key's latest
//!   only; the model replays them all, which the contract allows). Watchers treat entries as
//!   state, newest revision wins, never as a log of every step.
//! - A **deletion of a key under the bucket's expiring prefix may expire** (cluster mode: `sub.`,
//!   a subscription's line; a lease's deletion never does): once it is older than the bucket's
//!   marker TTL the store may forget it, and the key is then as if never written (`get` answers `None`, `create` needs nothing to
//!   replace, a compare-and-set on it reports current revision 0). A watch that was cut off, or
//!   lagged, for longer than that may never deliver the deletion: it goes straight to the key's
//!   next write, if any. The revision counter is not affected. A caller that still holds a value
//!   for such a key learns of the deletion only from a compare-and-set that reports revision 0.
//! - A watch may yield an `Err` item ([`KvError::Unavailable`]: it lost contact) and go on after
//!   it; it ends only when its client is gone.
//!
//! Implementations: [`super::nats::NatsBackplane`] (JetStream KV, with how each operation maps
//! in its module doc) and the model in `sim/backplane.rs`.
//!
//! No NATS type appears here: the coordinator and the simulation speak only this.

use std::{fmt, future::Future, pin::Pin};

use bytes::Bytes;
use futures_core::Stream;

/// A bucket-wide revision: strictly increasing over every write to any key.
pub type Revision = u64;

/// A boxed future, so the trait stays object-safe and `Send` for the tokio shell.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A watch: entries in revision order (see the module doc).
pub type Watch = Pin<Box<dyn Stream<Item = Result<Entry, KvError>> + Send>>;

/// One key's state at one revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The key.
    pub key: String,
    /// The value, or `None` when this revision deleted the key.
    pub value: Option<Bytes>,
    /// The revision of the write that produced this state.
    pub revision: Revision,
}

/// Why an operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    /// `create` on a key that exists (and is not deleted).
    #[error("key exists at revision {current}")]
    Exists {
        /// The key's current revision.
        current: Revision,
    },
    /// A compare-and-set whose expected revision is not the key's current one (0: no such key).
    #[error("expected revision {expected}, key is at {current}")]
    WrongRevision {
        /// What the caller expected.
        expected: Revision,
        /// What the key is at (0 when it does not exist).
        current: Revision,
    },
    /// The store could not be reached or did not answer in time: the operation may or may not
    /// have taken effect.
    #[error("backplane unavailable: {0}")]
    Unavailable(String),
}

impl KvError {
    /// Whether the operation certainly did not take effect because the key moved on: retry only
    /// after the watch shows a newer revision of the key.
    pub fn is_conflict(&self) -> bool {
        matches!(self, KvError::Exists { .. } | KvError::WrongRevision { .. })
    }
}

/// The coordination store: JetStream KV semantics (see the module doc).
pub trait Backplane: Send + Sync {
    /// Writes `value` under `key` if the key does not exist or was deleted; returns the revision.
    ///
    /// # Errors
    /// [`KvError::Exists`] if the key holds a value; [`KvError::Unavailable`].
    fn create(&self, key: &str, value: Bytes) -> BoxFuture<'_, Result<Revision, KvError>>;

    /// Writes `value` under `key` if the key's current revision is `expected` (compare-and-set).
    ///
    /// # Errors
    /// [`KvError::WrongRevision`] on a mismatch (also when the key is deleted or missing);
    /// [`KvError::Unavailable`].
    fn update(
        &self,
        key: &str,
        value: Bytes,
        expected: Revision,
    ) -> BoxFuture<'_, Result<Revision, KvError>>;

    /// Deletes `key` if its current revision is `expected`; the deletion is itself a revision,
    /// which watches deliver as an entry without a value.
    ///
    /// # Errors
    /// [`KvError::WrongRevision`] on a mismatch; [`KvError::Unavailable`].
    fn delete(&self, key: &str, expected: Revision) -> BoxFuture<'_, Result<Revision, KvError>>;

    /// The key's latest entry, `None` if it never existed (a deleted key gives its deletion until
    /// the deletion expires, then `None`).
    ///
    /// # Errors
    /// [`KvError::Unavailable`].
    fn get(&self, key: &str) -> BoxFuture<'_, Result<Option<Entry>, KvError>>;

    /// Watches every key that starts with `prefix` (see the module doc for the order).
    ///
    /// # Errors
    /// [`KvError::Unavailable`] if the watch cannot start.
    fn watch(&self, prefix: &str) -> BoxFuture<'_, Result<Watch, KvError>>;

    /// Every key that starts with `prefix` whose latest entry is a value (not a deletion), in
    /// key order: none written before the call is left out. One deleted just before may still
    /// be in (read from a replica behind its leader): a caller counting live gateways errs on
    /// the side of one more.
    ///
    /// # Errors
    /// [`KvError::Unavailable`].
    fn live_keys(&self, prefix: &str) -> BoxFuture<'_, Result<Vec<String>, KvError>>;

    /// The bucket's last revision: the latest write's, whatever its key, deletions included
    /// (0 before the first).
    ///
    /// # Errors
    /// [`KvError::Unavailable`].
    fn last_revision(&self) -> BoxFuture<'_, Result<Revision, KvError>>;
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.value {
            Some(v) => write!(f, "{}@{} ({} bytes)", self.key, self.revision, v.len()),
            None => write!(f, "{}@{} (deleted)", self.key, self.revision),
        }
    }
}
