//! One human-readable trace per simulation (never global: tests run in parallel threads).

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

#[derive(Clone, Default)]
pub struct Trace(Arc<Mutex<Vec<String>>>);

impl Trace {
    /// Records `text` at simulated time `at`.
    pub fn at(&self, at: Duration, text: impl AsRef<str>) {
        let line = format!("{:>8.3}s  {}", at.as_secs_f64(), text.as_ref());
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(line);
    }

    /// Records `text` at the current simulated time (inside a host).
    pub fn line(&self, text: impl AsRef<str>) {
        self.at(turmoil::sim_elapsed().unwrap_or_default(), text);
    }

    pub fn render(&self) -> String {
        let lines = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = lines.join("\n");
        out.push('\n');
        out
    }

    pub fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// The last `n` lines, for failure reports.
    pub fn tail(&self, n: usize) -> String {
        let lines = self.0.lock().unwrap_or_else(|p| p.into_inner());
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}
