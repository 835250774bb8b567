//! The clock seam. The core never reads a clock; the shell asks a [`Clock`] and passes `now` in.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Where the broker's time comes from.
pub trait Clock: Send + Sync + 'static {
    /// Monotonic time since the broker started; drives idle expiry.
    fn now(&self) -> Duration;
    /// Wall-clock time in milliseconds since the Unix epoch; stamps published messages.
    fn unix_millis(&self) -> u64;
    /// Wall-clock time in microseconds since the Unix epoch; read once at start, it sets the
    /// floor every id of the run is above ([`IdFloor`](crate::core::IdFloor)).
    fn unix_micros(&self) -> u64;
    /// Waits until [`now`](Self::now) reaches `deadline`.
    fn sleep_until(&self, deadline: Duration)
    -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;
}

/// The system's wall clock in microseconds since the Unix epoch (0 before it). The shell reads
/// it where an id floor is set: at start ([`TokioClock`]), and in cluster mode when a gateway
/// creates the JetStream stream or the coordination bucket (their first sequence).
pub fn system_unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Production clock: tokio's monotonic clock (so tokio's paused test clock and turmoil's simulated
/// clock drive it too) and the system wall clock for publish timestamps.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    origin: tokio::time::Instant,
}

impl TokioClock {
    /// A clock whose `now` starts at zero.
    pub fn new() -> Self {
        Self {
            origin: tokio::time::Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    fn unix_millis(&self) -> u64 {
        self.unix_micros() / 1000
    }

    fn unix_micros(&self) -> u64 {
        system_unix_micros()
    }

    fn sleep_until(
        &self,
        deadline: Duration,
    ) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> {
        // A deadline past what an Instant can hold (a timeout of centuries) never comes.
        match self.origin.checked_add(deadline) {
            Some(at) => Box::pin(tokio::time::sleep_until(at)),
            None => Box::pin(std::future::pending()),
        }
    }
}

/// A fully virtual clock for deterministic runs: monotonic time from tokio's (paused or
/// simulated) clock, wall time a fixed start plus that, so traces do not depend on the real date.
#[derive(Debug, Clone, Copy)]
pub struct VirtualClock {
    inner: TokioClock,
    start_unix_millis: u64,
}

impl VirtualClock {
    /// Starts wall time at `start_unix_millis`.
    pub fn new(start_unix_millis: u64) -> Self {
        Self {
            inner: TokioClock::new(),
            start_unix_millis,
        }
    }
}

impl Clock for VirtualClock {
    fn now(&self) -> Duration {
        self.inner.now()
    }

    fn unix_millis(&self) -> u64 {
        self.start_unix_millis + self.inner.now().as_millis() as u64
    }

    fn unix_micros(&self) -> u64 {
        self.start_unix_millis * 1000 + self.inner.now().as_micros() as u64
    }

    fn sleep_until(
        &self,
        deadline: Duration,
    ) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> {
        self.inner.sleep_until(deadline)
    }
}
