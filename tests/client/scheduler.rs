//! Two replicas of `examples/scheduler.rs` as real processes: the leader is killed with SIGKILL
//! and the other takes over with a higher epoch within the failover bound (SPEC §5).
//!
//! Cargo does not build examples for `cargo test --test client`, so the example's source is
//! compiled into this test binary and the test re-executes the binary as each replica.

use std::{
    io::{BufRead, BufReader},
    path::PathBuf,
    process::{Child, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use tokio::sync::mpsc;

use crate::harness::{TestServer, within};

#[allow(dead_code)]
#[path = "../../examples/scheduler.rs"]
mod scheduler_example;

/// Set in a child process: the scheduler's flags, space-separated.
const CHILD_FLAGS: &str = "TINYBROKER_TEST_SCHEDULER_FLAGS";
/// The test a child process runs.
const CHILD_TEST: &str = "scheduler::scheduler_example_entry_point";

/// How long after the SIGKILL the standby must be leading (SPEC §5: promotion is immediate
/// when the stream closes; the bound leaves room for a loaded machine).
const FAILOVER_BOUND: Duration = Duration::from_secs(5);

// The entry point of the replica processes. Run by itself (no flags in the environment) it
// checks that the example refuses a bad flag with exit code 2.
#[test]
fn scheduler_example_entry_point() {
    match std::env::var(CHILD_FLAGS) {
        Ok(flags) => {
            let code = scheduler_example::run(flags.split(' ').map(String::from).collect());
            // Only errors return; report them as the process's exit status.
            eprintln!("scheduler returned {code:?}");
            std::process::exit(1);
        }
        Err(_) => {
            let code = scheduler_example::run(vec!["--bogus".into()]);
            assert_eq!(code, std::process::ExitCode::from(2));
        }
    }
}

/// A replica process and its stdout lines; killed and reaped when dropped.
struct Replica {
    child: Child,
    lines: mpsc::UnboundedReceiver<String>,
}

impl Replica {
    fn start(flags: &str) -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([CHILD_TEST, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_FLAGS, flags)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::unbounded_channel();
        // Blocking reads on a thread of their own; the channel hands lines to the test.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self { child, lines }
    }

    /// Awaits a line containing `prefix` and returns what follows it. (Contains, not starts
    /// with: the child's first line follows libtest's own `test ... ` on the same line.)
    async fn line(&mut self, prefix: &str) -> String {
        loop {
            let line = self
                .lines
                .recv()
                .await
                .unwrap_or_else(|| panic!("the replica exited before printing {prefix:?}"));
            if let Some(at) = line.find(prefix) {
                return line[at + prefix.len()..].to_string();
            }
        }
    }

    fn kill(&mut self) -> ExitStatus {
        self.child.kill().unwrap(); // SIGKILL: no goodbye on the wire
        self.child.wait().unwrap()
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `"3 member=7"` → 3.
fn epoch_of(rest: &str) -> u64 {
    rest.split_whitespace().next().unwrap().parse().unwrap()
}

// SPEC §5: exactly one replica runs the job; SIGKILL on the leader promotes the standby with a
// strictly higher epoch within the failover bound, and the epoch-fenced store only ever sees
// epochs go up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_scheduler_leader_is_replaced_by_the_standby_with_a_higher_epoch() {
    let server = TestServer::start().await;
    let store: PathBuf = std::env::temp_dir().join(format!(
        "tinybroker-scheduler-test-{}.log",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&store);
    let flags = format!(
        "--server http://{} --group replicas --every-ms 50 --store {}",
        server.addr,
        store.display()
    );

    let mut first = Replica::start(&flags);
    let first_epoch = epoch_of(&within(first.line("leading epoch=")).await);
    within(first.line(&format!("epoch={first_epoch} run=2"))).await;
    let mut second = Replica::start(&flags);
    assert_eq!(within(second.line("standby position=")).await, "1");

    let killed_at = Instant::now();
    let status = first.kill();
    assert!(!status.success());
    let second_epoch = epoch_of(
        &tokio::time::timeout(FAILOVER_BOUND, second.line("leading epoch="))
            .await
            .expect("the standby did not take over within the failover bound"),
    );
    let failover = killed_at.elapsed();
    assert!(second_epoch > first_epoch, "{second_epoch} > {first_epoch}");
    within(second.line(&format!("epoch={second_epoch} run=2"))).await;

    let text = std::fs::read_to_string(&store).unwrap();
    let epochs: Vec<u64> = text
        .lines()
        // A replica killed mid-write may leave a torn last line: read whole lines only.
        .filter_map(|l| l.strip_prefix("epoch=")?.split(' ').next()?.parse().ok())
        .collect();
    assert!(epochs.windows(2).all(|w| w[0] <= w[1]), "{epochs:?}");
    assert_eq!(epochs.last(), Some(&second_epoch));
    let _ = std::fs::remove_file(&store);
    eprintln!("failover after SIGKILL took {failover:?}");
}
