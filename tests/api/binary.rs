//! Running the `tinybroker` binary as a process: spawn `serve`, learn the address it bound from
//! its log, collect its log lines, and kill it if the test fails first.

use std::{
    io::{BufRead, BufReader},
    process::{Command, Output, Stdio},
    time::Duration,
};

use tokio::sync::mpsc;

use crate::harness::{EVENT_TIMEOUT, within};

/// Kills the process if the test ends before it exits.
pub struct Running {
    pub child: std::process::Child,
    /// Every stderr line, in order.
    pub lines: mpsc::UnboundedReceiver<String>,
    /// The lines [`serve`] read up to the bound address (start-up's own log).
    pub start: Vec<String>,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Running {
    /// Awaits the next log line containing `needle`; fails the test if the log ends first.
    pub async fn line_with(&mut self, needle: &str) -> String {
        loop {
            let line = within(self.lines.recv())
                .await
                .unwrap_or_else(|| panic!("log ended before a line with {needle:?}"));
            if line.contains(needle) {
                return line;
            }
        }
    }

    /// The first line containing `needle` logged before the bound address, if any.
    #[allow(dead_code)] // The cluster tests' (tests/cluster/limits.rs), which include this file.
    pub fn at_start(&self, needle: &str) -> Option<&str> {
        self.start
            .iter()
            .find(|l| l.contains(needle))
            .map(String::as_str)
    }
}

/// How long [`serve`] waits for the process to log its bound address. Longer than an event's timeout: a
/// gateway's start is a handful of JetStream requests, each allowed 5 s, and on a loaded
/// machine one of them can meet a server still settling (seen twice in CI: a gateway that
/// listened after more than 10 s). How long start-up takes is not what the tests check;
/// every step it waited on is in the panic message when it does not end.
const START_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Starts `tinybroker serve` with `args` (plus `--listen 127.0.0.1:0` unless given) and
/// returns it with the gRPC address it logged.
pub async fn serve(args: &[&str]) -> (Running, String) {
    serve_with_env(args, &[]).await
}

/// [`serve`] with these environment variables set too.
#[allow(dead_code)] // The cluster tests' (tests/cluster/secured.rs), which include this file.
pub async fn serve_with_env(args: &[&str], env: &[(&str, &str)]) -> (Running, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tinybroker"));
    command.arg("serve");
    if !args.contains(&"--listen") {
        command.args(["--listen", "127.0.0.1:0"]);
    }
    let mut child = command
        .args(args)
        .envs(env.iter().copied())
        .env("RUST_LOG", "info,tinybroker::cluster=debug")
        .env_remove("TINYBROKER_AUTH_TOKEN")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, lines) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut running = Running {
        child,
        lines,
        start: Vec::new(),
    };
    let started = std::time::Instant::now();
    let deadline = tokio::time::Instant::now() + START_TIMEOUT;
    let line = loop {
        let next = tokio::time::timeout_at(deadline, running.lines.recv()).await;
        let line = match next {
            Ok(Some(line)) => line,
            // What start-up logged says which step it waits on.
            Ok(None) => panic!(
                "log ended before the bound address:\n{}",
                running.start.join("\n")
            ),
            Err(_) => panic!(
                "no bound address logged {:?} after start; start-up logged:\n{}",
                started.elapsed(),
                running.start.join("\n")
            ),
        };
        if line.contains("listening on ") {
            break line;
        }
        running.start.push(line);
    };
    let addr = line
        .split("listening on ")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| c.is_whitespace() || c == '"').next())
        .expect("address after `listening on`")
        .to_string();
    (running, addr)
}

/// Runs a client subcommand of the binary to completion. One that does not finish in time is
/// killed (the test then fails), so a hung client cannot hold the test binary open.
pub async fn run_client(args: Vec<String>) -> Output {
    run_client_within(args, EVENT_TIMEOUT).await
}

/// [`run_client`] with a bound of its own, for a run that starts processes of its own (`bench
/// --nats` starts two gateways over a cluster just made, then runs two workloads). It runs in
/// a process group of its own: one that does not finish in time is killed with everything it
/// started, so no gateway it spawned outlives the test.
pub async fn run_client_within(args: Vec<String>, patience: Duration) -> Output {
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_tinybroker"))
        .args(&args)
        .env_remove("TINYBROKER_AUTH_TOKEN")
        .env_remove("TINYBROKER_SERVER")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .expect("the binary starts");
    let group = child.id();
    match tokio::time::timeout(patience, child.wait_with_output()).await {
        Ok(output) => output.unwrap(),
        Err(_) => {
            if let Some(group) = group {
                let _ = Command::new("kill")
                    .args(["-KILL", "--", &format!("-{group}")])
                    .status();
            }
            panic!("the client did not finish within {patience:?}: {args:?}");
        }
    }
}
