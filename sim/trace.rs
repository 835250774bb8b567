//! One human-readable trace per simulation (never global: tests run in parallel threads).

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

#[derive(Clone, Default)]
pub struct Trace(Arc<Mutex<Lines>>);

#[derive(Default)]
struct Lines {
    lines: Vec<String>,
    closed: bool,
}

impl Trace {
    /// Records `text` at simulated time `at`.
    pub fn at(&self, at: Duration, text: impl AsRef<str>) {
        let line = format!("{:>8.3}s  {}", at.as_secs_f64(), text.as_ref());
        let mut inner = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if !inner.closed {
            inner.lines.push(line);
        }
    }

    /// Records `text` at the current simulated time (inside a host).
    pub fn line(&self, text: impl AsRef<str>) {
        self.at(turmoil::sim_elapsed().unwrap_or_default(), text);
    }

    /// Stops recording: what happens while the simulation is torn down is not part of the story.
    pub fn close(&self) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).closed = true;
    }

    pub fn render(&self) -> String {
        let inner = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = inner.lines.join("\n");
        out.push('\n');
        out
    }

    /// The last `n` lines, for failure reports.
    pub fn tail(&self, n: usize) -> String {
        let inner = self.0.lock().unwrap_or_else(|p| p.into_inner());
        inner.lines[inner.lines.len().saturating_sub(n)..].join("\n")
    }
}
