//! `tinybroker bench`: the shipped load generator. It runs the three workloads by name against a
//! broker it starts as a separate process (so it can report the broker's own peak RSS), or
//! against `--server URL`:
//!
//! - `w1`: a work queue: one publisher, queue consumers that ack each message;
//! - `w2`: singleton failover: replica processes, the active one killed with SIGKILL again and
//!   again; the gap from kill to the first delivery at the new active, lost and duplicated;
//! - `w3`: fan-out to broadcast subscribers, acked or ack-free;
//! - `w4`: elections at scale: one process leads N singleton subscriptions, a second stands by
//!   on all N, the first is killed; joins a second, memory, and the time to promote all N.
//!
//! With `--nats URL`, w1 and w3 run through two gateways the bench starts (`serve --nats`;
//! consumers on one, the publisher on the other), then the same workload straight on
//! JetStream ([`jetstream`]): what the gateway costs. With `--nats-core URL`, w3 runs on plain
//! NATS core ([`nats_core`]): the broadcast without acks that ack-free fan-out is measured
//! against.
//!
//! Publishes and acks go unary (one HTTP/2 request each, as the seed's protocol has it) or
//! streaming (`PublishStream`, acks on the `Consume` stream). Each run prints a readable summary
//! and one JSON line.

mod cpu;
mod elections;
mod failover;
mod jetstream;
mod load;
mod nats_core;

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use clap::{Args, Subcommand, ValueEnum};
use serde::Serialize;

pub use elections::{Elector, elector};
pub use failover::{Replica, replica};

/// How publishes or acks travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Carriage {
    /// One unary request each (`Publish`, `Ack`).
    Unary,
    /// On one long-lived stream (`PublishStream`, `Consume`).
    Stream,
}

#[derive(Args)]
pub struct Bench {
    #[command(subcommand)]
    workload: Workload,
    #[command(flatten)]
    common: Common,
}

#[derive(Subcommand)]
enum Workload {
    /// Work queue: 1 publisher, queue consumers acking each message.
    W1(load::W1),
    /// Singleton failover: replica processes, the active one killed with SIGKILL repeatedly.
    W2(failover::W2),
    /// Fan-out: 1 publisher, broadcast subscribers, acked or ack-free.
    W3(load::W3),
    /// Elections at scale: one process leads --subscriptions singleton subscriptions, a second
    /// stands by on all; the first is killed with SIGKILL. Joins a second, memory, promotion.
    W4(elections::W4),
    /// Memory: --messages queued for a subscription with no consumer; the broker's RSS and the
    /// bytes it costs per queued message.
    Fill,
}

/// Settings every workload shares.
#[derive(Args, Clone)]
pub struct Common {
    /// Broker URL; without it the bench starts `tinybroker serve` as its own process on a free
    /// loopback port and reports that process's peak RSS.
    #[arg(long, global = true, conflicts_with_all = ["nats", "nats_core"])]
    server: Option<String>,
    /// NATS URLs (comma-separated): run the workload through two gateways the bench starts over
    /// this JetStream cluster, then w1 or w3 straight on JetStream (w2 and w4 have no JetStream
    /// side).
    #[arg(long, global = true, conflicts_with = "nats_core")]
    nats: Option<String>,
    /// NATS URLs (comma-separated): run w3 on plain NATS core (no JetStream, no acks), one
    /// connection per subscriber; what it drops is counted, not waited for.
    #[arg(long, global = true)]
    nats_core: Option<String>,
    /// With `--nats`: JetStream alone gives each publish a message id (`Nats-Msg-Id`), as a
    /// gateway does so a publish sent again is stored once; JetStream's fastest idiom has none.
    #[arg(long, global = true, requires = "nats", conflicts_with = "nats_core")]
    jetstream_msg_ids: bool,
    /// With `--jetstream-msg-ids`: JetStream alone publishes in atomic batches of this many
    /// messages (nats-server 2.12 or later; `allow_atomic` on the bench's stream), the id on
    /// each batch's commit only: one id per batch still stores a batch sent again once, as
    /// JetStream stores a batch all or nothing. What per-message ids cost, measured.
    #[arg(long, global = true, requires = "jetstream_msg_ids", value_parser = clap::value_parser!(u64).range(2..=1000))]
    jetstream_batch: Option<u64>,
    /// Bearer token, if the broker requires one.
    #[arg(
        long,
        global = true,
        env = "TINYBROKER_AUTH_TOKEN",
        hide_env_values = true
    )]
    token: Option<String>,
    /// Messages to publish (at least 1).
    #[arg(long, global = true, default_value_t = 50_000, value_parser = clap::value_parser!(u64).range(1..))]
    messages: u64,
    /// Payload size in bytes (at least 8: a send timestamp rides in it).
    #[arg(long, global = true, default_value_t = 128)]
    payload_bytes: usize,
    /// How publishes travel.
    #[arg(long, global = true, value_enum, default_value = "stream")]
    publish: Carriage,
    /// How acks travel.
    #[arg(long, global = true, value_enum, default_value = "stream")]
    acks: Carriage,
    /// Publishes in flight at once (unary: concurrent requests; stream: unanswered messages).
    #[arg(long, global = true, default_value_t = 256)]
    pipeline: usize,
    /// With `--nats`, w1 and w3: run through the gateways and straight on JetStream this many
    /// times, alternating, then print each rep's ratio and their median (the machine's noise
    /// between runs is often larger than the difference measured).
    #[arg(long, global = true, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    reps: u32,
    /// With `--nats`, w1 and w3: straight on JetStream, the bench keeps as much CPU busy beside
    /// it as the two gateways used in the run through them just before (their CPU time over
    /// that run's time), so JetStream alone shares the machine's cores with the load a gateway
    /// layer on the same machine adds: how much of the difference is the gateways' CPU taken
    /// from the servers, and how much is not.
    #[arg(long, global = true, requires = "nats", conflicts_with = "nats_core")]
    jetstream_shares_cpu: bool,
    /// Set for a JetStream-alone run beside `--jetstream-shares-cpu`'s load: its cores.
    #[arg(skip)]
    beside_cpu_cores: Option<f64>,
    /// w1 and w3: the publisher first leads a singleton subscription of its own and fences
    /// every publish with its epoch (docs/semantics.md#fenced-publish): what the check costs
    /// against a plain run. With `--nats`, through the gateways only (JetStream alone has no
    /// fence to compare with).
    #[arg(long, global = true, conflicts_with = "nats_core")]
    fenced: bool,
}

/// One run's figures: printed as a summary and as one JSON line.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    workload: &'static str,
    /// `gateways` or `jetstream` for a `--nats` run, `nats-core` for a `--nats-core` run.
    #[serde(skip_serializing_if = "Option::is_none")]
    deployment: Option<&'static str>,
    publish: Option<Carriage>,
    acks: Option<Carriage>,
    messages: u64,
    payload_bytes: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    window: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    consumers: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ack_free: Option<bool>,
    /// Acked messages (w1) or deliveries (w3) per second, first publish to last ack/receipt.
    #[serde(skip_serializing_if = "Option::is_none")]
    rate_per_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    publish_rate_per_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    latency_p50_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    latency_p99_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    gap_median_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    gap_max_ms: Option<f64>,
    /// w2: from a kill to the frame of a `WatchLeadership` watcher that names the next leader.
    #[serde(skip_serializing_if = "Option::is_none")]
    watch_gap_median_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    watch_gap_max_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    kills: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lost: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    duplicated: Option<u64>,
    /// `--nats-core`: deliveries that arrived, and those NATS core dropped (never arrived).
    #[serde(skip_serializing_if = "Option::is_none")]
    delivered: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dropped: Option<u64>,
    /// The broker process's peak resident set (`VmHWM`), when the bench started it.
    #[serde(skip_serializing_if = "Option::is_none")]
    broker_peak_rss_bytes: Option<u64>,
    /// Through gateways: both gateway processes' CPU time (user and system) from the first
    /// publish to the last ack (or receipt), in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    gateways_cpu_s: Option<f64>,
    /// Straight on JetStream with `--jetstream-shares-cpu`: the cores kept busy beside it, and
    /// the CPU time that took, in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    beside_cpu_cores: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    beside_cpu_s: Option<f64>,
    /// `fill`: the broker's resident set with everything queued, and its growth per message.
    #[serde(skip_serializing_if = "Option::is_none")]
    broker_rss_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bytes_per_queued_message: Option<f64>,
}

impl Report {
    /// [`Report::print`], then the run's rate (for `--reps`).
    fn printed(&self, summary: &str) -> Result<f64, String> {
        self.print(summary)?;
        Ok(self.rate_per_s.unwrap_or_default())
    }

    fn print(&self, summary: &str) -> Result<(), String> {
        println!("{summary}");
        if let Some(rss) = self.broker_peak_rss_bytes {
            println!("broker peak RSS: {:.1} MiB", rss as f64 / (1024.0 * 1024.0));
        }
        println!(
            "{}",
            serde_json::to_string(self).map_err(|e| e.to_string())?
        );
        Ok(())
    }
}

pub async fn run(args: Bench) -> Result<(), String> {
    let Bench { workload, common } = args;
    if let Some(urls) = common.nats.clone() {
        return run_nats(workload, &common, &urls).await;
    }
    if let Some(urls) = common.nats_core.clone() {
        return match &workload {
            Workload::W3(w3) => nats_core::run_w3(&common, &urls, w3).await,
            Workload::W1(_) | Workload::W2(_) | Workload::W4(_) | Workload::Fill => Err(
                "--nats-core runs w3 only (NATS core has no acks or queues to hold the others)"
                    .into(),
            ),
        };
    }
    let extra = match &workload {
        Workload::W4(w4) => w4.serve_args(),
        _ => Vec::new(),
    };
    let broker = match &common.server {
        Some(url) => Target::External(url.clone()),
        None => Target::Process(BrokerProcess::start_with(common.messages, &extra)?),
    };
    match workload {
        Workload::W1(w1) => load::run_w1(&common, &broker, &w1).await.map(drop),
        Workload::W2(w2) => failover::run_w2(&common, &broker, &w2).await,
        Workload::W3(w3) => load::run_w3(&common, &broker, &w3).await.map(drop),
        Workload::W4(w4) => elections::run_w4(&common, &broker, &w4).await,
        Workload::Fill => load::run_fill(&common, &broker).await,
    }
}

/// `bench --nats`: the workload through two gateways, then straight on JetStream; `--reps`
/// times, alternating, with each rep's ratio and their median at the end.
async fn run_nats(workload: Workload, common: &Common, urls: &str) -> Result<(), String> {
    if common.jetstream_msg_ids && matches!(workload, Workload::W2(_) | Workload::Fill) {
        return Err(
            "--jetstream-msg-ids sets how JetStream alone publishes, which only w1 and w3 run"
                .into(),
        );
    }
    if matches!(workload, Workload::Fill) {
        return Err(
            "--nats runs w1, w2 and w3 (fill measures the embedded broker's memory; a gateway holds no queue)".into(),
        );
    }
    if common.reps > 1 && (common.fenced || !matches!(workload, Workload::W1(_) | Workload::W3(_)))
    {
        return Err(
            "--reps compares w1 or w3 through the gateways with JetStream alone (w2, w4 and --fenced have no JetStream side)".into(),
        );
    }
    if common.jetstream_shares_cpu
        && (common.fenced || !matches!(workload, Workload::W1(_) | Workload::W3(_)))
    {
        return Err(
            "--jetstream-shares-cpu loads the machine beside JetStream alone in w1 or w3 (w2, w4 and --fenced have no JetStream side)".into(),
        );
    }
    if common.jetstream_shares_cpu
        && let Some(why) = cpu::unreadable()
    {
        return Err(why);
    }
    let mut rates = Vec::new();
    for rep in 1..=common.reps {
        if common.reps > 1 {
            println!("rep {rep} of {}", common.reps);
        }
        // A stream of its own for each rep's gateways, deleted at the rep's end.
        let stream = match rep {
            1 => format!("bench_gw_{}", std::process::id()),
            _ => format!("bench_gw_{}_{rep}", std::process::id()),
        };
        let Some(rep) = run_nats_once(&workload, common, urls, &stream).await? else {
            return Ok(());
        };
        rates.push(rep);
    }
    if rates.len() > 1 {
        Comparison::of(&workload, &rates).print()?;
    }
    Ok(())
}

/// One rep of `bench --nats`: the rates through the gateways and straight on JetStream, the
/// gateways' CPU time, and the load kept busy beside JetStream alone, if any.
#[derive(Debug, Clone, Copy, Default)]
struct Rep {
    gateways: f64,
    alone: f64,
    /// The gateways' CPU over their run, in cores.
    gateway_cores: Option<f64>,
    /// `--jetstream-shares-cpu`: the load beside JetStream alone, in cores, and the CPU time it
    /// used, in seconds.
    beside: Option<(f64, f64)>,
}

/// One run through the gateways (over `stream`), then one straight on JetStream (beside the
/// gateways' CPU load, with `--jetstream-shares-cpu`), or `None` where there is no JetStream
/// side.
async fn run_nats_once(
    workload: &Workload,
    common: &Common,
    urls: &str,
    stream: &str,
) -> Result<Option<Rep>, String> {
    let gateways = || -> Result<Target, String> {
        let mut args = vec![
            "--nats".into(),
            urls.into(),
            "--nats-stream".into(),
            stream.to_string(),
        ];
        if let Workload::W4(w4) = workload {
            args.extend(w4.serve_args());
        }
        let start = |n: usize| {
            BrokerProcess::start_with(common.messages, &args)
                .map_err(|e| format!("gateway {n}: {e}"))
        };
        Ok(Target::Gateways(start(1)?, start(2)?))
    };
    let target = gateways()?;
    let through_gateways = match workload {
        Workload::W1(w1) => load::run_w1(common, &target, w1).await,
        Workload::W3(w3) => load::run_w3(common, &target, w3).await,
        Workload::W2(w2) => failover::run_w2(common, &target, w2)
            .await
            .map(|()| (0.0, None)),
        Workload::W4(w4) => elections::run_w4(common, &target, w4)
            .await
            .map(|()| (0.0, None)),
        Workload::Fill => Ok((0.0, None)),
    };
    drop(target);
    jetstream::delete_stream(urls, stream).await;
    let (through_gateways, gateway_cores) = through_gateways?;
    if common.fenced {
        println!(
            "straight on JetStream: not run with --fenced (JetStream alone has no fence: compare with a plain run through the gateways)"
        );
        return Ok(None);
    }
    let mut alone_common = common.clone();
    if common.jetstream_shares_cpu {
        let cores = gateway_cores.ok_or(
            "the gateways' CPU time could not be read from /proc: no load to share with JetStream alone",
        )?;
        alone_common.beside_cpu_cores = Some(cores);
    }
    let (alone, beside) = match workload {
        Workload::W1(w1) => jetstream::run_w1(&alone_common, urls, w1).await?,
        Workload::W3(w3) => jetstream::run_w3(&alone_common, urls, w3).await?,
        Workload::W2(_) => {
            println!(
                "w2 straight on JetStream: not run. JetStream has no consumer that promotes the next client in join order when the active one's connection closes (a pinned client of a priority group is re-pinned only after its pinned TTL, and with no fencing token)"
            );
            return Ok(None);
        }
        Workload::W4(_) => {
            println!(
                "w4 straight on JetStream: not run. JetStream has no election to compare with (no consumer promotes the next client in join order, and none hands out a fencing token)"
            );
            return Ok(None);
        }
        Workload::Fill => return Ok(None),
    };
    Ok(Some(Rep {
        gateways: through_gateways,
        alone,
        gateway_cores,
        beside,
    }))
}

/// `--reps`: each rep's rate through the gateways and straight on JetStream, and the medians.
#[derive(Debug, Serialize)]
struct Comparison {
    workload: &'static str,
    deployment: &'static str,
    reps: usize,
    gateways_rate_per_s: Vec<f64>,
    jetstream_rate_per_s: Vec<f64>,
    /// Each rep's gateways rate over its JetStream rate.
    ratios: Vec<f64>,
    /// Each rep's gateways' CPU over their run, in cores (CPU seconds a second).
    gateways_cpu_cores: Vec<f64>,
    /// With `--jetstream-shares-cpu`: each rep's load beside JetStream alone, in cores, and the
    /// CPU time it used, in seconds.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    beside_cpu_cores: Vec<f64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    beside_cpu_s: Vec<f64>,
    median_ratio: f64,
    median_gateways_rate_per_s: f64,
    median_jetstream_rate_per_s: f64,
}

impl Comparison {
    fn of(workload: &Workload, reps: &[Rep]) -> Self {
        let ratios: Vec<f64> = reps
            .iter()
            .map(|rep| {
                if rep.alone > 0.0 {
                    rep.gateways / rep.alone
                } else {
                    0.0
                }
            })
            .collect();
        let gateways: Vec<f64> = reps.iter().map(|r| r.gateways).collect();
        let alone: Vec<f64> = reps.iter().map(|r| r.alone).collect();
        Self {
            workload: match workload {
                Workload::W1(_) => "w1",
                Workload::W2(_) => "w2",
                Workload::W3(_) => "w3",
                Workload::W4(_) => "w4",
                Workload::Fill => "fill",
            },
            deployment: "gateways/jetstream",
            reps: reps.len(),
            median_ratio: median(&ratios),
            median_gateways_rate_per_s: median(&gateways),
            median_jetstream_rate_per_s: median(&alone),
            gateways_rate_per_s: gateways,
            jetstream_rate_per_s: alone,
            ratios,
            gateways_cpu_cores: reps
                .iter()
                .map(|r| r.gateway_cores.unwrap_or_default())
                .collect(),
            beside_cpu_cores: reps.iter().filter_map(|r| r.beside.map(|b| b.0)).collect(),
            beside_cpu_s: reps.iter().filter_map(|r| r.beside.map(|b| b.1)).collect(),
        }
    }

    fn print(&self) -> Result<(), String> {
        let each: Vec<String> = self
            .gateways_rate_per_s
            .iter()
            .zip(&self.jetstream_rate_per_s)
            .zip(&self.ratios)
            .map(|((g, j), r)| format!("{g:.0} / {j:.0} ({r:.2}x)"))
            .collect();
        println!(
            "{} through gateways / straight on JetStream{}, {} reps alternating: {}; median {:.2}x (gateways {:.0}/s, JetStream {:.0}/s)",
            self.workload,
            if self.beside_cpu_cores.is_empty() {
                ""
            } else {
                " (beside a load of the gateways' CPU)"
            },
            self.reps,
            each.join(", "),
            self.median_ratio,
            self.median_gateways_rate_per_s,
            self.median_jetstream_rate_per_s,
        );
        println!(
            "{}",
            serde_json::to_string(self).map_err(|e| e.to_string())?
        );
        Ok(())
    }
}

/// How long a run may go without one more delivery or ack before the bench gives up on it (a
/// stalled cluster, a broker that stopped answering) instead of waiting for ever.
const STALL: Duration = Duration::from_secs(30);

/// A run's progress: its counts of deliveries or acks (each counted once, however many
/// consumers share it), and since when their total stands.
struct Progress {
    counts: Vec<Arc<AtomicU64>>,
    /// What the counts reach at the run's end.
    of: u64,
    total: u64,
    since: tokio::time::Instant,
}

impl Progress {
    /// Watches `counts`, each with the number it reaches at the run's end.
    fn watching(counts: impl IntoIterator<Item = (Arc<AtomicU64>, u64)>) -> Self {
        let mut unique: Vec<(Arc<AtomicU64>, u64)> = Vec::new();
        for (count, target) in counts {
            if !unique.iter().any(|(seen, _)| Arc::ptr_eq(seen, &count)) {
                unique.push((count, target));
            }
        }
        Self {
            of: unique.iter().map(|(_, target)| target).sum(),
            counts: unique.into_iter().map(|(count, _)| count).collect(),
            total: 0,
            since: tokio::time::Instant::now(),
        }
    }

    /// Reads the counts now: an error once their total has not moved for [`STALL`].
    fn check(&mut self) -> Result<(), String> {
        let total = self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum();
        let now = tokio::time::Instant::now();
        if total != self.total {
            self.total = total;
            self.since = now;
        } else if now.duration_since(self.since) >= STALL {
            return Err(format!(
                "the run stalled: {total} of {} deliveries or acks, none in the last {STALL:?}",
                self.of
            ));
        }
        Ok(())
    }
}

/// The median of `values` (the mean of the middle two for an even count).
fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// The broker under test.
enum Target {
    External(String),
    Process(BrokerProcess),
    /// Two gateways over NATS: consumers on the first, the publisher on the second.
    Gateways(BrokerProcess, BrokerProcess),
}

impl Target {
    /// Where consumers connect.
    fn url(&self) -> &str {
        match self {
            Target::External(url) => url,
            Target::Process(p) | Target::Gateways(p, _) => &p.url,
        }
    }

    /// Where w2's replicas connect, alternating: both gateways, so promotions cross them.
    fn consumer_urls(&self) -> Vec<String> {
        match self {
            Target::Gateways(a, b) => vec![a.url.clone(), b.url.clone()],
            other => vec![other.url().to_string()],
        }
    }

    /// Where the publisher connects.
    fn publish_url(&self) -> &str {
        match self {
            Target::Gateways(_, p) => &p.url,
            other => other.url(),
        }
    }

    fn deployment(&self) -> Option<&'static str> {
        matches!(self, Target::Gateways(..)).then_some("gateways")
    }

    /// How a summary line names the deployment.
    fn label(&self) -> &'static str {
        match self {
            Target::Gateways(..) => " through two gateways",
            _ => "",
        }
    }

    /// Both gateways' CPU time so far, in seconds; `None` for any other broker.
    fn cpu_seconds(&self) -> Option<f64> {
        match self {
            Target::Gateways(a, b) => {
                Some(cpu::process_seconds(a.child.id())? + cpu::process_seconds(b.child.id())?)
            }
            Target::External(_) | Target::Process(_) => None,
        }
    }

    /// The broker's peak resident set; both gateways' together.
    fn peak_rss(&self) -> Option<u64> {
        match self {
            Target::External(_) => None,
            Target::Process(p) => proc_status(p.child.id(), "VmHWM:"),
            Target::Gateways(a, b) => {
                Some(proc_status(a.child.id(), "VmHWM:")? + proc_status(b.child.id(), "VmHWM:")?)
            }
        }
    }

    /// The broker's process, or both gateways'; none for an external broker.
    fn pids(&self) -> Vec<u32> {
        match self {
            Target::External(_) => Vec::new(),
            Target::Process(p) => vec![p.child.id()],
            Target::Gateways(a, b) => vec![a.child.id(), b.child.id()],
        }
    }

    /// The broker's resident set now; both gateways' together.
    fn rss_now(&self) -> Option<u64> {
        match self {
            Target::External(_) => None,
            Target::Process(p) => proc_status(p.child.id(), "VmRSS:"),
            Target::Gateways(a, b) => {
                Some(proc_status(a.child.id(), "VmRSS:")? + proc_status(b.child.id(), "VmRSS:")?)
            }
        }
    }

    fn rss(&self) -> Option<u64> {
        match self {
            Target::External(_) | Target::Gateways(..) => None,
            Target::Process(p) => proc_status(p.child.id(), "VmRSS:"),
        }
    }
}

/// `tinybroker serve` as a child process, killed when dropped.
struct BrokerProcess {
    child: Child,
    url: String,
}

impl BrokerProcess {
    /// Starts the broker with queues deep enough for the whole run, and `extra` `serve`
    /// arguments, and waits for the address it logs once bound.
    fn start_with(messages: u64, extra: &[String]) -> Result<Self, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut child = Command::new(exe)
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(extra)
            .args(["--max-queue-messages", &messages.max(100_000).to_string()])
            .args(["--max-queue-bytes", &(16u64 << 30).to_string()])
            .args(["--max-memory-bytes", &(16u64 << 30).to_string()])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start the broker: {e}"))?;
        let stderr = child.stderr.take().ok_or("no broker stderr")?;
        let mut lines = BufReader::new(stderr).lines();
        let addr = loop {
            let Some(Ok(line)) = lines.next() else {
                let _ = child.kill();
                return Err("the broker exited before it logged its address".into());
            };
            if let Some((_, rest)) = line.split_once("listening on ") {
                break rest
                    .split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_string();
            }
        };
        // Keep draining its log so it never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        Ok(Self {
            child,
            url: format!("http://{addr}"),
        })
    }
}

impl Drop for BrokerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A size line of `/proc/PID/status` (`VmHWM:` peak or `VmRSS:` current resident set), in bytes.
fn proc_status(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The `p`-quantile of sorted nanosecond samples, in microseconds.
fn quantile_us(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i] as f64 / 1000.0
}

fn per_second(count: u64, elapsed: Duration) -> f64 {
    count as f64 / elapsed.as_secs_f64().max(f64::EPSILON)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_run_that_stops_moving_is_given_up_after_the_stall_bound() {
        // Two consumers sharing one count (w1's), a third with its own: 10 in all.
        let (shared, own) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let mut progress =
            Progress::watching([(shared.clone(), 5), (shared.clone(), 5), (own.clone(), 5)]);
        progress.check().unwrap();
        tokio::time::advance(STALL - Duration::from_millis(1)).await;
        progress.check().unwrap();
        // One more delivery: the bound starts again.
        shared.fetch_add(1, Ordering::Relaxed);
        progress.check().unwrap();
        tokio::time::advance(STALL - Duration::from_millis(1)).await;
        progress.check().unwrap();
        tokio::time::advance(Duration::from_millis(1)).await;
        let error = progress.check().unwrap_err();
        assert!(error.contains("1 of 10"), "{error}");
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[]), 0.0);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
    }
}
