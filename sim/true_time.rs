//! The one clock the models of NATS keep time by (ack waits, nak delays, pull expiries, store
//! times), whichever runtime calls them. Each turmoil host, and each gateway process
//! (`gateway_process.rs`), runs its own tokio runtime whose clock starts from the real instant
//! it was built (a host restarted later starts later), so their `Instant`s are not comparable;
//! the models must not mix them.

use std::{
    sync::{
        Arc, OnceLock,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::time::Instant;

#[derive(Clone)]
pub enum TrueTime {
    /// The clock of the one (paused) tokio runtime that everything runs on, from its first
    /// reading.
    Tokio(Arc<OnceLock<Instant>>),
    /// The simulated time since a turmoil world began, as its loop sets it before each step.
    Stepped(Arc<AtomicU64>),
}

impl TrueTime {
    /// For worlds on one tokio runtime.
    pub fn tokio() -> Self {
        Self::Tokio(Arc::default())
    }

    /// For turmoil worlds: [`TrueTime::set`] before each step.
    pub fn stepped() -> Self {
        Self::Stepped(Arc::default())
    }

    pub fn now(&self) -> Duration {
        match self {
            Self::Tokio(origin) => origin.get_or_init(Instant::now).elapsed(),
            Self::Stepped(nanos) => Duration::from_nanos(nanos.load(Ordering::SeqCst)),
        }
    }

    /// A stepped world's time is now `elapsed` (no effect on a tokio one).
    pub fn set(&self, elapsed: Duration) {
        if let Self::Stepped(nanos) = self {
            nanos.store(elapsed.as_nanos() as u64, Ordering::SeqCst);
        }
    }

    /// Sleeps on the calling runtime's clock until this clock reads `deadline` (clocks of one
    /// world run at one rate).
    pub async fn sleep_until(&self, deadline: Duration) {
        tokio::time::sleep(deadline.saturating_sub(self.now())).await;
    }
}
