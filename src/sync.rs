//! The synchronisation primitives the shell uses. Under `--cfg tinybroker_loom` they are loom's,
//! so the same shell code can be model-checked; otherwise they are std's.
//!
//! `Arc` stays std's everywhere (loom's cannot hold trait objects or `str`); the model checks the
//! locks and atomics, which is where the interleavings are.
//!
//! std locks, not tokio's: every critical section is short and never awaits, and std locks can be
//! taken from `Drop` (where a member's stream end is noticed).

#[cfg(tinybroker_loom)]
pub use loom::sync::{
    Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard,
    atomic::{AtomicBool, AtomicU64, Ordering},
};
#[cfg(not(tinybroker_loom))]
pub use std::sync::{
    Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard,
    atomic::{AtomicBool, AtomicU64, Ordering},
};

/// Locks `mutex`, recovering from poisoning: the core's state stays consistent across a panic
/// because each input is applied whole or not at all, and losing every queued message to one
/// poisoned lock would be worse.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poison| poison.into_inner())
}

/// Locks `mutex` if no one holds it (the caller included), recovering from poisoning (see
/// [`lock`]); `None` when it is held.
pub fn try_lock<T>(mutex: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    match mutex.try_lock() {
        Ok(guard) => Some(guard),
        Err(std::sync::TryLockError::Poisoned(poison)) => Some(poison.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

/// Read-locks `lock`, recovering from poisoning (see [`lock`]).
pub fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|poison| poison.into_inner())
}

/// Write-locks `lock`, recovering from poisoning (see [`lock`]).
pub fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|poison| poison.into_inner())
}
