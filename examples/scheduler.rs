//! A scheduled job that runs on exactly one of N replicas (docs/semantics.md#singleton: leader election without
//! leases).
//!
//! Start a broker (`tinybroker serve`), then this in two or more terminals:
//!
//! ```sh
//! cargo run --example scheduler -- --group reporters --every-ms 1000 --store /tmp/report.log
//! cargo run --example scheduler -- --server http://127.0.0.1:50051 --group reporters --store /tmp/report.log
//! cargo run --example scheduler -- --help
//! ```
//!
//! One replica prints `leading epoch=E member=M` and then `epoch=E run=K` every interval; the
//! others print `standby position=P`. Kill the leader (even with SIGKILL) and the next in line
//! prints `leading` with a higher epoch. Restart the broker and the replicas rejoin by
//! themselves; the one that leads next has a higher epoch still (epochs never repeat, also
//! across broker restarts), so the store takes its writes at once. The job's side effect,
//! appending to `--store`, is fenced by the epoch: a deposed leader that wakes up late cannot
//! write over its successor. A store it cannot parse fails closed: anything but whole
//! `epoch=E run=K` lines (a stray byte, another format, a line cut short) stops every write
//! until it is fixed, since such a line might hold a higher epoch; only a store that does not
//! exist yet counts as empty. Each run's line is written in one `write`, so a replica killed
//! mid-run leaves a whole line or none.
//!
//! With `--emit TOPIC`, each run also publishes `epoch=E run=K` to TOPIC (for workers
//! subscribed to it), fenced by the leader's epoch (docs/semantics.md#fenced-publish): the
//! broker stores it only while this replica leads, so a deposed leader's late run reaches no
//! worker.
//!
//! The election's subscription id is `scheduler` (topic `election.scheduler`): the Python
//! example `clients/python/examples/scheduler.py` joins the same line and writes the same store.
//!
//! Flags: `--server URL` (default `http://127.0.0.1:50051`, env `TINYBROKER_SERVER`),
//! `--group NAME` (default `scheduler`), `--every-ms N` (default 1000), `--store PATH`
//! (optional), `--emit TOPIC` (optional), `--token TOKEN` (env `TINYBROKER_AUTH_TOKEN`),
//! `--help`.

use std::{path::PathBuf, process::ExitCode, time::Duration};

use tinybroker::client::{Client, ClientOptions, Error, Message, SubscriptionOptions};

const USAGE: &str = "\
usage: scheduler [--server URL] [--group NAME] [--every-ms N] [--store PATH] [--emit TOPIC]
                 [--token TOKEN]

  --server URL    broker URL (default http://127.0.0.1:50051, env TINYBROKER_SERVER)
  --group NAME    consumer group of the replicas (default scheduler); the election's
                  subscription id is `scheduler`, on the topic election.scheduler
  --every-ms N    run the job every N ms while leading (default 1000)
  --store PATH    append `epoch=E run=K` to PATH, fenced by the epoch (optional)
  --emit TOPIC    publish `epoch=E run=K` to TOPIC each run, fenced by the epoch: the broker
                  stores it only while this replica leads (optional)
  --token TOKEN   bearer token (env TINYBROKER_AUTH_TOKEN)
  --help          print this and exit
";

struct Args {
    server: String,
    group: String,
    every: Duration,
    store: Option<PathBuf>,
    emit: Option<String>,
    token: Option<String>,
}

/// What the command line asks for.
enum Parsed {
    Run(Args),
    Help,
}

fn parse_args(flags: Vec<String>) -> Result<Parsed, String> {
    let mut args = Args {
        server: std::env::var("TINYBROKER_SERVER")
            .unwrap_or_else(|_| "http://127.0.0.1:50051".into()),
        group: "scheduler".into(),
        every: Duration::from_millis(1000),
        store: None,
        emit: None,
        token: std::env::var("TINYBROKER_AUTH_TOKEN").ok(),
    };
    let mut it = flags.into_iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "-h" | "--help" => return Ok(Parsed::Help),
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
            "--emit" => args.emit = Some(value()?),
            "--token" => args.token = Some(value()?),
            other => return Err(format!("unknown flag {other:?} (see --help)")),
        }
    }
    Ok(Parsed::Run(args))
}

/// Why the store did not take a write.
enum StoreError {
    /// A later leader wrote already: this one is deposed.
    Fenced(String),
    /// The store could not be read or written (missing mount, full disk, permissions): nothing
    /// is known about leadership, so the job is tried again at the next tick.
    Io(String),
}

/// What the store's bytes say: the highest epoch among its whole `epoch=E run=K` lines, and
/// the first thing that is not one (a stray byte, another format, a line cut short).
struct StoreState {
    highest: u64,
    unparsable: Option<String>,
}

fn read_store(bytes: &[u8]) -> StoreState {
    let mut state = StoreState {
        highest: 0,
        unparsable: None,
    };
    let body = match bytes.strip_suffix(b"\n") {
        Some(body) => body,
        None if bytes.is_empty() => return state,
        None => {
            state.unparsable = Some("cannot parse the store: its last line is not complete".into());
            bytes
        }
    };
    for (number, line) in body.split(|&b| b == b'\n').enumerate() {
        let parsed = std::str::from_utf8(line).ok().and_then(|line| {
            let (epoch, run) = line.strip_prefix("epoch=")?.split_once(" run=")?;
            let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
            if !digits(epoch) || !digits(run) {
                return None;
            }
            run.parse::<u64>().ok()?;
            epoch.parse::<u64>().ok()
        });
        match parsed {
            Some(epoch) => state.highest = state.highest.max(epoch),
            None if state.unparsable.is_none() => {
                let shown = String::from_utf8_lossy(&line[..line.len().min(60)]).into_owned();
                state.unparsable = Some(format!(
                    "cannot parse the store at line {}: {shown:?} is not `epoch=E run=K`",
                    number + 1
                ));
            }
            None => {}
        }
    }
    state
}

/// The job's side effect, fenced by epoch: the store remembers the highest epoch that wrote to
/// it and refuses an older one. (A real store does this check atomically, e.g. a conditional
/// write `WHERE epoch <= :epoch`; one process per epoch writes here, so read-then-append does.)
/// A store it cannot read or parse fails closed: only a store that does not exist yet counts as
/// empty.
fn fenced_append(store: &PathBuf, epoch: u64, run: u64) -> Result<(), StoreError> {
    let bytes = match std::fs::read(store) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(error) => return Err(StoreError::Io(format!("cannot read the store: {error}"))),
    };
    let StoreState {
        highest,
        unparsable,
    } = read_store(&bytes);
    if highest > epoch {
        return Err(StoreError::Fenced(format!(
            "fenced: the store has epoch {highest}, this leader has {epoch}"
        )));
    }
    // Fails closed: a line it cannot parse might hold a higher epoch.
    if let Some(why) = unparsable {
        return Err(StoreError::Io(why));
    }
    use std::io::Write;
    let io = |e: std::io::Error| StoreError::Io(format!("cannot write the store: {e}"));
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(store)
        .map_err(io)?;
    // One write of the whole line (`writeln!` on a file writes it piecewise): a replica killed
    // mid-run leaves a whole line or none, never one the next leader cannot parse.
    file.write_all(format!("epoch={epoch} run={run}\n").as_bytes())
        .map_err(io)
}

fn main() -> ExitCode {
    run(std::env::args().skip(1).collect())
}

/// Runs the scheduler with `flags` as given on the command line; returns only on an error
/// (exit code 2 for bad flags, 1 when the broker cannot be reached or refuses to elect), or
/// with success after printing the usage for `--help`.
pub fn run(flags: Vec<String>) -> ExitCode {
    let args = match parse_args(flags) {
        Ok(Parsed::Run(args)) => args,
        Ok(Parsed::Help) => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
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
                    if let Some(topic) = &args.emit {
                        let line = format!("epoch={epoch} run={run}");
                        match leadership.publish(Message::new(topic.clone(), line)).await {
                            Ok(_) => println!("emitted epoch={epoch} run={run}"),
                            Err(Error::FailedPrecondition(error)) => {
                                // The broker's fence: another epoch leads. Stop, as above.
                                println!("refused emit epoch={epoch} run={run}: {error}");
                                let lost = (&mut lost).await;
                                println!("lost epoch={epoch}: {}", lost.cause);
                                break;
                            }
                            Err(error) => {
                                println!("failed emit epoch={epoch} run={run}: {error} (trying again)");
                            }
                        }
                    }
                }
            }
        }
    }
}
