//! A scheduled job that runs on exactly one of N replicas (SPEC §5: leader election without
//! leases).
//!
//! Start a broker (`tinybroker serve`), then this in two or more terminals:
//!
//! ```sh
//! cargo run --example scheduler -- --group reporters --every-ms 1000 --store /tmp/report.log
//! ```
//!
//! One replica prints `leading epoch=E member=M` and then `epoch=E run=K` every interval; the
//! others print `standby position=P`. Kill the leader (even with SIGKILL) and the next in line
//! prints `leading` with a higher epoch. Restart the broker and the replicas rejoin by
//! themselves; the one that leads next has a higher epoch still (epochs never repeat, also
//! across broker restarts), so the store takes its writes at once. The job's side effect,
//! appending to `--store`, is fenced by the epoch: a deposed leader that wakes up late cannot
//! write over its successor.
//!
//! Flags: `--server URL` (default `http://127.0.0.1:50051`, env `TINYBROKER_SERVER`),
//! `--group NAME` (default `scheduler`), `--every-ms N` (default 1000), `--store PATH`
//! (optional), `--token TOKEN` (env `TINYBROKER_AUTH_TOKEN`).

use std::{path::PathBuf, process::ExitCode, time::Duration};

use tinybroker::client::{Client, ClientOptions, SubscriptionOptions};

struct Args {
    server: String,
    group: String,
    every: Duration,
    store: Option<PathBuf>,
    token: Option<String>,
}

fn parse_args(flags: Vec<String>) -> Result<Args, String> {
    let mut args = Args {
        server: std::env::var("TINYBROKER_SERVER")
            .unwrap_or_else(|_| "http://127.0.0.1:50051".into()),
        group: "scheduler".into(),
        every: Duration::from_millis(1000),
        store: None,
        token: std::env::var("TINYBROKER_AUTH_TOKEN").ok(),
    };
    let mut it = flags.into_iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--server" => args.server = value()?,
            "--group" => args.group = value()?,
            "--every-ms" => {
                let ms = value()?;
                args.every = Duration::from_millis(
                    ms.parse()
                        .map_err(|_| format!("--every-ms {ms:?} is not a number"))?,
                );
            }
            "--store" => args.store = Some(value()?.into()),
            "--token" => args.token = Some(value()?),
            other => return Err(format!("unknown flag {other:?}")),
        }
    }
    Ok(args)
}

/// Why the store did not take a write.
enum StoreError {
    /// A later leader wrote already: this one is deposed.
    Fenced(String),
    /// The store could not be read or written (missing mount, full disk, permissions): nothing
    /// is known about leadership, so the job is tried again at the next tick.
    Io(String),
}

/// The job's side effect, fenced by epoch: the store remembers the highest epoch that wrote to
/// it and refuses an older one. (A real store does this check atomically, e.g. a conditional
/// write `WHERE epoch <= :epoch`; one process per epoch writes here, so read-then-append does.)
/// A store it cannot read fails closed: only a store that does not exist yet counts as empty.
fn fenced_append(store: &PathBuf, epoch: u64, run: u64) -> Result<(), StoreError> {
    let bytes = match std::fs::read(store) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(error) => return Err(StoreError::Io(format!("cannot read the store: {error}"))),
    };
    let highest = String::from_utf8_lossy(&bytes)
        .lines()
        .filter_map(|line| {
            line.split_whitespace()
                .next()?
                .strip_prefix("epoch=")?
                .parse()
                .ok()
        })
        .max()
        .unwrap_or(0u64);
    if highest > epoch {
        return Err(StoreError::Fenced(format!(
            "fenced: the store has epoch {highest}, this leader has {epoch}"
        )));
    }
    use std::io::Write;
    let io = |e: std::io::Error| StoreError::Io(format!("cannot write the store: {e}"));
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(store)
        .map_err(io)?;
    writeln!(file, "epoch={epoch} run={run}").map_err(io)
}

fn main() -> ExitCode {
    run(std::env::args().skip(1).collect())
}

/// Runs the scheduler with `flags` as given on the command line; returns only on an error
/// (exit code 2 for bad flags, 1 when the broker cannot be reached or refuses to elect).
pub fn run(flags: Vec<String>) -> ExitCode {
    let args = match parse_args(flags) {
        Ok(args) => args,
        Err(error) => {
            eprintln!("scheduler: {error}");
            return ExitCode::from(2);
        }
    };
    match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime.block_on(schedule(args)),
        Err(error) => {
            eprintln!("scheduler: cannot start the runtime: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn schedule(args: Args) -> ExitCode {
    let options = ClientOptions {
        token: args.token.clone(),
        ..ClientOptions::default()
    };
    let client = match Client::connect_with(args.server.clone(), options).await {
        Ok(client) => client,
        Err(error) => {
            eprintln!(
                "scheduler: cannot reach the broker at {}: {error}",
                args.server
            );
            return ExitCode::FAILURE;
        }
    };
    let subscription =
        SubscriptionOptions::singleton("scheduler", &args.group, ["election.scheduler"]);
    loop {
        // Waits in line; rejoins by itself with backoff if the broker goes away meanwhile.
        let leadership = match client
            .elect_with(subscription.clone(), |position| {
                println!("standby position={position}");
            })
            .await
        {
            Ok(leadership) => leadership,
            Err(error) => {
                eprintln!("scheduler: cannot join the election: {error}");
                return ExitCode::FAILURE;
            }
        };
        let epoch = leadership.epoch();
        println!("leading epoch={epoch} member={}", leadership.member_id());
        let lost = leadership.lost();
        tokio::pin!(lost);
        let mut ticks = tokio::time::interval(args.every);
        let mut run = 0;
        loop {
            tokio::select! {
                // Losing comes first: with a tick due at the same moment, the job does not run
                // once more after the broker said another replica may lead.
                biased;
                lost = &mut lost => {
                    // Stop the job at once: another replica may be leading already.
                    println!("lost epoch={epoch}: {}", lost.cause);
                    break;
                }
                _ = ticks.tick() => {
                    run += 1;
                    match args.store.as_ref().map(|store| fenced_append(store, epoch, run)) {
                        Some(Err(StoreError::Fenced(error))) => {
                            // Only a deposed leader is refused: a successor has a higher epoch
                            // and runs the job. Stop, and rejoin once the broker says so.
                            println!("refused epoch={epoch} run={run}: {error}");
                            let lost = (&mut lost).await;
                            println!("lost epoch={epoch}: {}", lost.cause);
                            break;
                        }
                        Some(Err(StoreError::Io(error))) => {
                            println!("failed epoch={epoch} run={run}: {error} (trying again)");
                        }
                        Some(Ok(())) | None => println!("epoch={epoch} run={run}"),
                    }
                }
            }
        }
    }
}
