//! The broker's clock in the simulation. Monotonic time is the broker host's own (simulated)
//! tokio clock, which starts again at zero when the host restarts. Wall time is the simulated
//! time since the simulation began, counted from the Unix epoch: it keeps going up across broker
//! restarts, as a real wall clock does, so a restarted broker's id floor is above its
//! predecessor's. Starting at zero keeps the first run's ids small (epoch 1, message #1), so the
//! traces read as before.

use std::{pin::Pin, time::Duration};

use tinybroker::clock::{Clock, TokioClock};

pub struct SimClock {
    inner: TokioClock,
}

impl SimClock {
    pub fn new() -> Self {
        Self {
            inner: TokioClock::new(),
        }
    }
}

/// Simulated time since the simulation began (zero outside a host, e.g. during teardown).
fn wall() -> Duration {
    turmoil::sim_elapsed().unwrap_or_default()
}

impl Clock for SimClock {
    fn now(&self) -> Duration {
        self.inner.now()
    }

    fn unix_millis(&self) -> u64 {
        wall().as_millis() as u64
    }

    fn unix_micros(&self) -> u64 {
        wall().as_micros() as u64
    }

    fn sleep_until(&self, deadline: Duration) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        self.inner.sleep_until(deadline)
    }
}

/// A current-thread runtime on tokio's paused clock: time moves only when every task waits,
/// straight to the next timer (the models' contract checks and the in-process gateway tests).
pub fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime")
}
