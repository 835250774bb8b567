//! W4: elections at scale, as a leader-election service runs them. One elector process
//! (`tinybroker bench-elector`) joins `--subscriptions` SINGLETON subscriptions and leads them
//! all; a second joins every one of them and stands by; the first is killed with SIGKILL. It
//! reports how fast each joined (joins a second, `--concurrency` joins in flight at once), the
//! broker's or gateways' resident set and that of the NATS servers on this machine with every
//! member joined, and the time from the kill until the second leads each subscription (the
//! median and the last). Through two gateways (`bench --nats`), the electors join at different
//! gateways, so every promotion crosses them.

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    sync::{Arc, mpsc as std_mpsc},
    time::{SystemTime, UNIX_EPOCH},
};

use clap::Args;
use serde::Serialize;
use tinybroker::pb::{self, DeliveryMode, subscription_frame::Frame};
use tokio::sync::Semaphore;

use super::{Common, Target, proc_status};
use crate::cli::client::Connection;

#[derive(Args, Clone)]
pub struct W4 {
    /// SINGLETON subscriptions each elector joins.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    subscriptions: u64,
    /// Joins each elector keeps in flight at once (sent, not yet answered).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..=4_096))]
    concurrency: u64,
}

impl W4 {
    /// What the broker (or each gateway) must hold: every subscription, with room.
    pub fn serve_args(&self) -> Vec<String> {
        let room = self.subscriptions + 100;
        vec!["--max-subscriptions".into(), room.to_string()]
    }
}

/// `tinybroker bench-elector`: joins `--subscriptions` SINGLETON subscriptions named
/// `<prefix>-<i>` and keeps them. Prints `active I EPOCH UNIX_NANOS` when confirmed active on
/// subscription I and `standby I UNIX_NANOS` when told its place in line.
#[derive(Args)]
pub struct Elector {
    #[command(flatten)]
    connection: Connection,
    /// Subscription ids are `<prefix>-<i>`.
    #[arg(long)]
    prefix: String,
    #[arg(long)]
    subscriptions: u64,
    #[arg(long, default_value_t = 32)]
    concurrency: u64,
}

/// Streams one connection carries: under the server's default `--max-concurrent-streams`.
const STREAMS_PER_CONNECTION: u64 = 100;

fn unix_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

pub async fn elector(args: Elector) -> Result<(), String> {
    let connections = args.subscriptions.div_ceil(STREAMS_PER_CONNECTION);
    let mut clients = Vec::new();
    for _ in 0..connections {
        clients.push(args.connection.connect().await?);
    }
    let in_flight = Arc::new(Semaphore::new(
        usize::try_from(args.concurrency.max(1)).unwrap_or(1),
    ));
    let mut members = tokio::task::JoinSet::new();
    for i in 0..args.subscriptions {
        let permit = in_flight
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| e.to_string())?;
        let mut client = clients[usize::try_from(i / STREAMS_PER_CONNECTION).unwrap_or(0)].clone();
        let open = pb::OpenSubscription {
            subscription_id: format!("{}-{i}", args.prefix),
            topic_patterns: vec![format!("elect.{}.{i}", args.prefix)],
            mode: DeliveryMode::Singleton.into(),
            consumer_group: "elect".into(),
            notify_standby: true,
            ..Default::default()
        };
        members.spawn(async move {
            let mut permit = Some(permit);
            let mut frames = client
                .subscribe(open)
                .await
                .map_err(|e| format!("subscription {i}: {e}"))?
                .into_inner();
            while let Some(frame) = frames
                .message()
                .await
                .map_err(|e| format!("subscription {i}: {e}"))?
            {
                match frame.frame {
                    Some(Frame::Confirmation(c)) => {
                        println!("active {i} {} {}", c.epoch, unix_nanos());
                    }
                    Some(Frame::Standby(_)) => println!("standby {i} {}", unix_nanos()),
                    _ => continue,
                }
                // Answered: the next join may go.
                permit.take();
            }
            Err::<(), String>(format!("subscription {i}: the stream ended"))
        });
    }
    // Members keep their streams until this process is killed; the first that ends ends it.
    match members.join_next().await {
        Some(Ok(Err(error))) => Err(error),
        Some(Err(error)) => Err(error.to_string()),
        _ => Ok(()),
    }
}

/// A line from an elector.
enum Line {
    Active { at: u64 },
    Standby { at: u64 },
}

/// An elector process and its lines.
struct ElectorProcess {
    child: Child,
    lines: std_mpsc::Receiver<Line>,
    started: u64,
}

impl ElectorProcess {
    fn spawn(url: &str, prefix: &str, w4: &W4) -> Result<Self, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut child = Command::new(exe)
            .args(["bench-elector", "--server", url, "--prefix", prefix])
            .args(["--subscriptions", &w4.subscriptions.to_string()])
            .args(["--concurrency", &w4.concurrency.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start an elector: {e}"))?;
        let started = unix_nanos();
        let stdout = child.stdout.take().ok_or("no elector stdout")?;
        let (tx, lines) = std_mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let words: Vec<&str> = line.split_whitespace().collect();
                let at = |n: usize| words.get(n).and_then(|w| w.parse().ok()).unwrap_or(0);
                let line = match words.first() {
                    Some(&"active") => Line::Active { at: at(3) },
                    Some(&"standby") => Line::Standby { at: at(2) },
                    _ => continue,
                };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Ok(Self {
            child,
            lines,
            started,
        })
    }

    /// Waits for `count` lines of the kind `want` picks, each within the stall bound; their
    /// times, in arrival order.
    fn await_lines(
        &mut self,
        count: u64,
        what: &str,
        want: impl Fn(&Line) -> Option<u64>,
    ) -> Result<Vec<u64>, String> {
        let mut times = Vec::new();
        while (times.len() as u64) < count {
            match self.lines.recv_timeout(super::STALL) {
                Ok(line) => times.extend(want(&line)),
                Err(_) => {
                    return Err(format!(
                        "{what}: {} of {count}, none more within {:?}",
                        times.len(),
                        super::STALL
                    ));
                }
            }
        }
        Ok(times)
    }
}

impl Drop for ElectorProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One run's figures, printed as a summary and one JSON line.
#[derive(Debug, Serialize)]
struct Elections {
    workload: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    deployment: Option<&'static str>,
    subscriptions: u64,
    concurrency: u64,
    /// The first elector's joins (each answered active) a second.
    joins_per_s: f64,
    /// The second's (each answered on standby).
    standby_joins_per_s: f64,
    /// From the SIGKILL to the second elector's confirmation, over every subscription.
    promote_median_ms: f64,
    promote_all_ms: f64,
    /// Resident set with both electors joined: the broker, or both gateways together.
    broker_rss_bytes: Option<u64>,
    /// Resident set of every `nats-server` process on this machine, together.
    servers_rss_bytes: Option<u64>,
    /// CPU used while every member is joined and nothing is published, over
    /// [`IDLE_WINDOW`], in cores: the broker's (both gateways'), and the NATS servers'.
    broker_idle_cores: Option<f64>,
    servers_idle_cores: Option<f64>,
}

/// How long the idle CPU is measured for, with every member joined.
const IDLE_WINDOW: std::time::Duration = std::time::Duration::from_secs(5);

pub async fn run_w4(_common: &Common, broker: &Target, w4: &W4) -> Result<(), String> {
    let urls = broker.consumer_urls();
    let prefix = format!("elect{}", std::process::id());
    let n = w4.subscriptions;
    let mut first = ElectorProcess::spawn(&urls[0], &prefix, w4)?;
    let actives = first.await_lines(n, "the first elector's joins", |line| match line {
        Line::Active { at } => Some(*at),
        Line::Standby { .. } => None,
    })?;
    let joins_per_s = rate(n, first.started, actives.iter().max().copied());
    let mut second = ElectorProcess::spawn(&urls[1 % urls.len()], &prefix, w4)?;
    let standbys = second.await_lines(n, "the second elector's joins", |line| match line {
        Line::Standby { at } => Some(*at),
        Line::Active { .. } => None,
    })?;
    let standby_joins_per_s = rate(n, second.started, standbys.iter().max().copied());
    let broker_rss_bytes = broker.rss_now();
    // The NATS servers the gateways run over, when they run here; none for the embedded broker.
    let servers = if broker.deployment().is_some() {
        nats_servers()
    } else {
        Vec::new()
    };
    let servers_rss_bytes = servers_rss(&servers);
    let cpu = |pids: &[u32]| -> Option<f64> {
        pids.iter()
            .map(|&pid| super::cpu::process_seconds(pid))
            .sum()
    };
    let broker_pids = broker.pids();
    let before = (cpu(&broker_pids), cpu(&servers));
    // A measurement window, not a wait for an event: what idle elections cost meanwhile.
    tokio::time::sleep(IDLE_WINDOW).await;
    let cores = |after: Option<f64>, before: Option<f64>, pids: &[u32]| {
        let seconds = after? - before?;
        (!pids.is_empty()).then(|| seconds / IDLE_WINDOW.as_secs_f64())
    };
    let broker_idle_cores = cores(cpu(&broker_pids), before.0, &broker_pids);
    let servers_idle_cores = cores(cpu(&servers), before.1, &servers);
    let killed = unix_nanos();
    first.child.kill().map_err(|e| e.to_string())?;
    let mut promoted = second.await_lines(n, "promotions after the kill", |line| match line {
        Line::Active { at } => Some(at.saturating_sub(killed)),
        Line::Standby { .. } => None,
    })?;
    promoted.sort_unstable();
    let ms = |nanos: u64| nanos as f64 / 1e6;
    let report = Elections {
        workload: "w4",
        deployment: broker.deployment(),
        subscriptions: n,
        concurrency: w4.concurrency,
        joins_per_s,
        standby_joins_per_s,
        promote_median_ms: ms(promoted[promoted.len() / 2]),
        promote_all_ms: ms(promoted[promoted.len() - 1]),
        broker_rss_bytes,
        servers_rss_bytes,
        broker_idle_cores,
        servers_idle_cores,
    };
    let mib = |b: Option<u64>| b.map_or("?".into(), |b| format!("{:.0} MiB", b as f64 / 1048576.0));
    let idle = |c: Option<f64>| c.map_or("?".into(), |c| format!("{c:.2} cores"));
    println!(
        "w4{}: {n} singleton subscriptions, {} joins in flight: joined {:.0}/s active, {:.0}/s on standby; after a SIGKILL of the leader of all, promoted in {:.0} ms (median {:.0} ms); RSS {} broker{}, {} NATS servers; idle CPU {} broker, {} NATS servers",
        broker.label(),
        w4.concurrency,
        report.joins_per_s,
        report.standby_joins_per_s,
        report.promote_all_ms,
        report.promote_median_ms,
        mib(report.broker_rss_bytes),
        if broker.deployment().is_some() {
            "s (both gateways)"
        } else {
            ""
        },
        mib(report.servers_rss_bytes),
        idle(report.broker_idle_cores),
        idle(report.servers_idle_cores),
    );
    println!(
        "{}",
        serde_json::to_string(&report).map_err(|e| e.to_string())?
    );
    Ok(())
}

/// `count` over the time from `from` to `to` (unix nanos), a second.
fn rate(count: u64, from: u64, to: Option<u64>) -> f64 {
    let nanos = to.unwrap_or(from).saturating_sub(from).max(1);
    count as f64 / (nanos as f64 / 1e9)
}

/// Every `nats-server` process on this machine (none when the servers run elsewhere, or
/// `/proc` cannot be read).
fn nats_servers() -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| comm.trim() == "nats-server")
        })
        .collect()
}

/// The resident set of these `nats-server` processes, together; `None` when there is none.
fn servers_rss(servers: &[u32]) -> Option<u64> {
    (!servers.is_empty()).then(|| {
        servers
            .iter()
            .map(|&pid| proc_status(pid, "VmRSS:").unwrap_or(0))
            .sum()
    })
}
