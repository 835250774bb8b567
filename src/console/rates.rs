//! A subscription's publish and ack rates for the console (docs/operations.md#console): pure,
//! told the counters and the time of each read.

use std::collections::VecDeque;

use super::hub::TICK;

/// Seconds of rates kept per subscription (three minutes).
pub const RATE_SAMPLES: usize = 180;

/// A subscription's rates: per second, over the time between two reads of its counters.
/// An idle subscription costs nothing: a second with no sample was a second of none.
#[derive(Debug, Clone, Default)]
pub struct Rates {
    /// Counters at the last sample: queued, acked, and when (ms).
    last: Option<(u64, u64, u64)>,
    /// The samples that were not zero, with when (ms), oldest first, over the last
    /// [`RATE_SAMPLES`] seconds.
    samples: VecDeque<(u64, f32, f32)>,
    /// The last sample.
    current: (f32, f32),
    /// When the first read was (ms): the series starts there.
    first_ms: Option<u64>,
}

impl Rates {
    pub fn now(&self) -> (f64, f64) {
        (f64::from(self.current.0), f64::from(self.current.1))
    }

    pub fn sample(&mut self, queued: u64, acked: u64, now_ms: u64) {
        match self.last {
            // After a pause longer than two ticks (nothing moved, so nothing was read): a
            // fresh start, not a rate spread over the pause.
            Some((_, _, at)) if now_ms.saturating_sub(at) > 2 * TICK.as_millis() as u64 => {
                self.last = Some((queued, acked, now_ms));
                self.current = (0.0, 0.0);
            }
            Some((q, a, at)) if now_ms.saturating_sub(at) >= 900 => {
                let seconds = (now_ms - at) as f64 / 1000.0;
                let per = |now: u64, then: u64| (now.saturating_sub(then) as f64 / seconds) as f32;
                self.current = (per(queued, q), per(acked, a));
                if self.current != (0.0, 0.0) {
                    self.samples
                        .push_back((now_ms, self.current.0, self.current.1));
                }
                let horizon = now_ms.saturating_sub(RATE_SAMPLES as u64 * 1000);
                while self.samples.front().is_some_and(|&(at, ..)| at <= horizon)
                    || self.samples.len() > RATE_SAMPLES
                {
                    self.samples.pop_front();
                }
                self.last = Some((queued, acked, now_ms));
            }
            Some(_) => {}
            None => {
                self.last = Some((queued, acked, now_ms));
                self.first_ms = Some(now_ms);
            }
        }
    }

    /// One value a second over the last [`RATE_SAMPLES`] seconds before `now_ms`, oldest first:
    /// published and acked.
    /// Since the first read, if that was less than [`RATE_SAMPLES`] seconds ago.
    pub fn series(&self, now_ms: u64) -> Vec<(f32, f32)> {
        let seconds = self
            .first_ms
            .map_or(0, |first| now_ms.saturating_sub(first) / 1000)
            .min(RATE_SAMPLES as u64) as usize;
        let mut series = vec![(0.0, 0.0); seconds];
        for &(at, p, a) in &self.samples {
            let back = now_ms.saturating_sub(at) / 1000;
            if let Some(slot) = (seconds as u64)
                .checked_sub(back + 1)
                .and_then(|i| series.get_mut(i as usize))
            {
                *slot = (p, a);
            }
        }
        series
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_per_second_over_the_time_between_samples_and_kept_three_minutes() {
        let mut rates = Rates::default();
        rates.sample(0, 0, 1_000);
        rates.sample(10, 5, 1_500); // too soon: not a sample
        rates.sample(20, 10, 3_000);
        assert_eq!(rates.now(), (10.0, 5.0));
        for i in 1..=(RATE_SAMPLES as u64 * 2) {
            rates.sample(20 + i, 10, 3_000 + i * 1_000);
        }
        assert!(rates.samples.len() <= RATE_SAMPLES);
        let now = 3_000 + RATE_SAMPLES as u64 * 2_000;
        let series = rates.series(now);
        assert_eq!(series.len(), RATE_SAMPLES);
        assert_eq!(series[RATE_SAMPLES - 1], (1.0, 0.0));
        // A new subscription's series is as long as it has been read.
        let mut young = Rates::default();
        young.sample(0, 0, 10_000);
        young.sample(5, 0, 11_000);
        assert_eq!(young.series(12_500), vec![(5.0, 0.0), (0.0, 0.0)]);
        // A counter that went back (a subscription made again) is no negative rate.
        rates.sample(0, 0, now + 1_000);
        assert_eq!(rates.now(), (0.0, 0.0));
        // A pause with nothing read is a fresh start, not a rate spread over the pause.
        rates.sample(1_000, 0, now + 60_000);
        assert_eq!(rates.now(), (0.0, 0.0));
        rates.sample(1_010, 0, now + 61_000);
        assert_eq!(rates.now(), (10.0, 0.0));
        // Seconds with nothing are zeros in the series, the last second this one.
        let series = rates.series(now + 61_000);
        assert_eq!(series[RATE_SAMPLES - 1], (10.0, 0.0));
        assert_eq!(series[RATE_SAMPLES - 2], (0.0, 0.0));
    }
}
