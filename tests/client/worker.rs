//! `examples/worker.rs` as a real process stopped by Ctrl-C (SIGINT): it finishes, closes its
//! subscription and exits 0, and none of the jobs it did is handed out again.
//!
//! As for the scheduler, the example's source is compiled into this test binary, which
//! re-executes itself as the worker.

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
};

use tinybroker::client::{Client, Message, SubscriptionOptions};
use tokio::sync::mpsc;

use crate::harness::{TestServer, within};

#[allow(dead_code)]
#[path = "../../examples/worker.rs"]
mod worker_example;

/// Set in a child process: the worker's flags, space-separated.
const CHILD_FLAGS: &str = "TINYBROKER_TEST_WORKER_FLAGS";
/// The test a child process runs.
const CHILD_TEST: &str = "worker::worker_example_entry_point";

// The entry point of the worker process. Run by itself (no flags in the environment) it checks
// that the example refuses a bad flag with exit code 2 and answers `--help` with 0.
#[test]
fn worker_example_entry_point() {
    match std::env::var(CHILD_FLAGS) {
        Ok(flags) => {
            let code = worker_example::run(flags.split(' ').map(String::from).collect());
            // libtest would print its own summary: report the example's code as the process's.
            let code = if code == std::process::ExitCode::SUCCESS {
                0
            } else {
                1
            };
            std::process::exit(code);
        }
        Err(_) => {
            let code = worker_example::run(vec!["--bogus".into()]);
            assert_eq!(code, std::process::ExitCode::from(2));
            let code = worker_example::run(vec!["--help".into()]);
            assert_eq!(code, std::process::ExitCode::SUCCESS);
        }
    }
}

/// The worker process and its stdout lines; killed and reaped if dropped early.
struct Worker {
    child: Child,
    lines: mpsc::UnboundedReceiver<String>,
}

impl Worker {
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

    /// Awaits a line containing `text`.
    async fn line(&mut self, text: &str) {
        loop {
            let line = self
                .lines
                .recv()
                .await
                .unwrap_or_else(|| panic!("the worker exited before printing {text:?}"));
            if line.contains(text) {
                return;
            }
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// Issue 17 item 8: Ctrl-C stops the worker cleanly: it exits 0 once every ack is applied, so
// the next worker gets none of its jobs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_example_stops_on_ctrl_c_with_every_ack_applied() {
    let server = TestServer::start().await;
    let url = format!("http://{}", server.addr);
    let client = within(Client::connect(url.clone())).await.unwrap();
    let mut worker = Worker::start(&format!("--server {url} --window 4"));
    within(worker.line("waiting for jobs")).await;
    for n in 0..6 {
        let published = client
            .publish(Message::new("jobs.email", format!("job {n}")))
            .await
            .unwrap();
        assert_eq!(published.queued_for, 1);
    }
    for n in 0..6 {
        within(worker.line(&format!("payload=\"job {n}\""))).await;
    }

    let pid = worker.child.id().to_string();
    let sent = Command::new("kill").args(["-INT", &pid]).status().unwrap();
    assert!(sent.success());
    within(worker.line("every ack applied")).await;
    let status = within(tokio::task::spawn_blocking(move || worker.child.wait()))
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status:?}");

    let info = client.describe("jobs").await.unwrap();
    assert_eq!(
        (
            info.counters.acked,
            info.counters.redelivered,
            info.in_flight
        ),
        (6, 0, 0),
        "{info:?}"
    );
    assert_eq!(info.queued_messages, 0);
    // A successor starts from an empty queue.
    let mut next = client
        .subscribe(SubscriptionOptions::queue("jobs", "workers", ["jobs.>"]))
        .await
        .unwrap();
    within(next.active()).await.unwrap();
    assert_eq!(client.describe("jobs").await.unwrap().in_flight, 0);
}
