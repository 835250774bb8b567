//! CPU time, for `bench --nats`: what the gateway processes used (read from `/proc`), and
//! `--jetstream-shares-cpu`'s load, which keeps as much CPU busy beside JetStream alone
//! (docs/performance.md#shared-cores).

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

/// The clock ticks `/proc` counts CPU time in: `USER_HZ`, 100 a second on Linux's x86 and arm
/// ABIs.
const TICKS_PER_SECOND: f64 = 100.0;

/// A process's CPU time (user and system), in seconds, from a `/proc/PID/stat` line: fields 14
/// and 15, counted after the command name, which is in parentheses and may hold spaces or `)`.
fn cpu_seconds_of(stat: &str) -> Option<f64> {
    let (_, after_name) = stat.rsplit_once(')')?;
    let mut fields = after_name.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some((user + system) as f64 / TICKS_PER_SECOND)
}

/// Process `pid`'s CPU time so far, in seconds (`None` where `/proc` does not tell).
pub(super) fn process_seconds(pid: u32) -> Option<f64> {
    cpu_seconds_of(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The time on a CPU a `/proc/.../schedstat` line gives (its first field, nanoseconds), in
/// seconds.
fn schedstat_seconds(line: &str) -> Option<f64> {
    let nanos: u64 = line.split_whitespace().next()?.parse().ok()?;
    Some(nanos as f64 / 1e9)
}

/// The calling thread's CPU time so far, in seconds: to the nanosecond where the kernel keeps
/// `schedstat`, else in clock ticks.
fn thread_seconds() -> Option<f64> {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|line| schedstat_seconds(&line))
        .or_else(|| cpu_seconds_of(&std::fs::read_to_string("/proc/thread-self/stat").ok()?))
}

/// Why `--jetstream-shares-cpu` cannot run here, if it cannot: it reads CPU times from
/// Linux's `/proc`.
pub(super) fn unreadable() -> Option<String> {
    if process_seconds(std::process::id()).is_none() || thread_seconds().is_none() {
        return Some(
            "--jetstream-shares-cpu reads processes' and threads' CPU time from /proc (Linux), which this machine does not have".into(),
        );
    }
    None
}

/// How `cores` of load are spread: as many threads as whole cores it takes (at most the
/// machine's), each busy the same share of its time.
fn spread(cores: f64, machine: usize) -> (usize, f64) {
    if cores.is_nan() || cores <= 0.0 {
        return (0, 0.0);
    }
    let cores = cores.min(machine.max(1) as f64);
    let threads = cores.ceil() as usize;
    (threads, cores / threads as f64)
}

/// Threads that keep `cores` of CPU busy, by their own CPU time (not by the clock, which would
/// count the time another process held the core), until dropped.
pub(super) struct Load {
    cores: f64,
    stop: Arc<AtomicBool>,
    /// The CPU time its threads used so far, in microseconds (each adds its own as it goes).
    used_us: Arc<AtomicU64>,
    threads: Vec<JoinHandle<()>>,
}

impl Load {
    pub(super) fn start(cores: f64) -> Self {
        let machine = std::thread::available_parallelism().map_or(1, usize::from);
        let (count, share) = spread(cores, machine);
        let stop = Arc::new(AtomicBool::new(false));
        let used_us = Arc::new(AtomicU64::new(0));
        let threads = (0..count)
            .map(|_| {
                let (stop, used_us) = (stop.clone(), used_us.clone());
                std::thread::spawn(move || busy(share, &stop, &used_us))
            })
            .collect();
        Self {
            cores: share * count as f64,
            stop,
            used_us,
            threads,
        }
    }

    /// The cores it keeps busy.
    pub(super) fn cores(&self) -> f64 {
        self.cores
    }

    /// The CPU time its threads used so far, in seconds (as of their last step).
    fn used(&self) -> f64 {
        self.used_us.load(Ordering::Relaxed) as f64 / 1e6
    }

    /// Stops it; the CPU time its threads used, in seconds.
    pub(super) fn stop(mut self) -> f64 {
        self.halt()
    }

    fn halt(&mut self) -> f64 {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
        self.used()
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.halt();
    }
}

/// One thread's part: spins while its CPU time is behind `share` of the time since it started,
/// sleeps otherwise, in steps of [`STEP`]; adds what it used to `total_us` as it goes, and once
/// more when stopped.
fn busy(share: f64, stop: &AtomicBool, total_us: &AtomicU64) {
    const STEP: Duration = Duration::from_millis(5);
    let began = Instant::now();
    let start = thread_seconds().unwrap_or_default();
    let mut counted = 0.0;
    let mut count = |used: f64| {
        if used > counted {
            total_us.fetch_add(((used - counted) * 1e6) as u64, Ordering::Relaxed);
            counted = used;
        }
    };
    while !stop.load(Ordering::Relaxed) {
        let owed = share * began.elapsed().as_secs_f64();
        // Unreadable (checked before any load starts): nothing to go by, so no load.
        let Some(now) = thread_seconds() else { return };
        let used = now - start;
        count(used);
        if used < owed {
            let spin = Instant::now();
            while spin.elapsed() < STEP {
                std::hint::spin_loop();
            }
        } else {
            std::thread::sleep(STEP);
        }
    }
    if let Some(now) = thread_seconds() {
        count(now - start);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_read_after_the_command_name() {
        // utime 250 and stime 50 ticks: fields 14 and 15, the name holding a space and a ')'.
        let stat = "4242 (tiny broker) x) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 50 0 0 20 0 3 0 100 0 0";
        assert_eq!(cpu_seconds_of(stat), Some(3.0));
        assert_eq!(cpu_seconds_of("4242 (cut short) S 1 2"), None);
        assert_eq!(cpu_seconds_of("no parenthesis"), None);
        assert_eq!(schedstat_seconds("1500000000 20 7\n"), Some(1.5));
        assert_eq!(schedstat_seconds(""), None);
        assert!(unreadable().is_none(), "this machine has /proc");
    }

    /// Ticks /proc/PID/stat may lose against a precise count: two readings and the load's
    /// exited threads, each rounded down to a 10 ms tick, and one more.
    const TICK_SLACK: f64 = 0.05;

    #[test]
    fn a_load_uses_cpu_until_stopped() {
        let before = process_seconds(std::process::id()).expect("/proc/PID/stat");
        let load = Load::start(0.5);
        assert_eq!(load.cores(), 0.5);
        // Awaited, not slept for: its threads' CPU time as they count it (to the nanosecond).
        let deadline = Instant::now() + Duration::from_secs(60);
        while load.used() < 0.2 {
            assert!(
                Instant::now() < deadline,
                "the load used {} s in 60 s",
                load.used()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let used = load.stop();
        assert!(used >= 0.2, "{used}");
        let after = process_seconds(std::process::id()).expect("/proc/PID/stat");
        // /proc/PID/stat counts whole clock ticks (10 ms), each reading and each exited thread
        // rounded down: the process's count may trail the load's own by a few ticks, never by
        // more. (It trailed by 0.01 s once on a loaded machine when the bound was exact.)
        assert!(
            after - before >= used - TICK_SLACK,
            "the process's CPU time rose by {} while the load counted {used}",
            after - before
        );
    }

    #[test]
    fn a_load_is_spread_over_whole_cores() {
        assert_eq!(spread(0.0, 2), (0, 0.0));
        assert_eq!(spread(-1.0, 2), (0, 0.0));
        assert_eq!(spread(f64::NAN, 2), (0, 0.0));
        assert_eq!(spread(0.4, 2), (1, 0.4));
        assert_eq!(spread(1.5, 2), (2, 0.75));
        assert_eq!(spread(2.0, 2), (2, 1.0));
        assert_eq!(spread(3.0, 2), (2, 1.0), "at most the machine's cores");
    }

    #[test]
    fn a_load_of_nothing_starts_no_thread_and_stops_at_once() {
        let load = Load::start(0.0);
        assert_eq!(load.cores(), 0.0);
        assert_eq!(load.stop(), 0.0);
    }
}
