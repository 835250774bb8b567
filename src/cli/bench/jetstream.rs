//! `bench --nats`: the w1 and w3 workloads straight on JetStream through `async-nats`, run
//! after the same workload through two gateways, so the two lines side by side show what the
//! gateway costs. The stream is set up as a gateway sets up its own (file storage, interest
//! retention, replicas min(3, cluster size)); a pipelined publisher waits for each `PubAck`.
//! With `--jetstream-msg-ids` its publishes carry message ids as a gateway's do (JetStream then
//! deduplicates them, the guarantee a gateway's resends rely on), for a comparison at equal
//! guarantees beside the one against JetStream's fastest idiom.
//! Each side runs JetStream's fastest idiom for the workload: the work queue (w1) and acked
//! fan-out pull in batches ahead of their acks (the consumer's `max_ack_pending` is the
//! window) and double-ack each message (confirmed by JetStream, as the gateway's acks are);
//! ack-free fan-out uses push consumers (no pulls, no acks).

use std::{
    collections::VecDeque,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use async_nats::jetstream::{
    self, Context,
    consumer::{AckPolicy, DeliverPolicy, PullConsumer, pull, push},
    context::PublishAckFuture,
    stream::{RetentionPolicy, StorageType, Stream},
};
use tokio::task::JoinSet;
use tokio_stream::StreamExt;

use super::{Common, Progress, Report, cpu, load, per_second, quantile_us};

/// How long a new consumer may take to be reachable by pulls from the bench's connection.
const CONSUMER_PATIENCE: Duration = Duration::from_secs(10);

/// Deletes the stream `name` and its gateways' coordination bucket (what a `--nats` run
/// through gateways left in JetStream).
pub(super) async fn delete_stream(urls: &str, name: &str) {
    let Ok(client) = connect(urls).await else {
        return;
    };
    let js = jetstream::new(client);
    for stream in [name.to_string(), format!("KV_{name}-coordination")] {
        if let Err(error) = js.delete_stream(&stream).await {
            eprintln!("could not delete the bench stream {stream}: {error}");
        }
    }
}

async fn connect(urls: &str) -> Result<async_nats::Client, String> {
    let addrs = tinybroker::cluster::gateway::parse_urls(urls)?;
    async_nats::ConnectOptions::new()
        .name("tinybroker-bench")
        .connect(addrs)
        .await
        .map_err(|e| format!("cannot connect to NATS at {urls}: {e}"))
}

/// A stream made for one run, deleted when the run ends.
struct Bench {
    js: Context,
    stream: Stream,
    name: String,
}

impl Bench {
    async fn create(urls: &str, workload: &str, common: &Common) -> Result<Self, String> {
        let js = jetstream::new(connect(urls).await?);
        let name = format!("bench_js_{workload}_{}", std::process::id());
        let mut last = String::new();
        for replicas in [3, 1] {
            let config = jetstream::stream::Config {
                name: name.clone(),
                subjects: vec![format!("{name}.>")],
                retention: RetentionPolicy::Interest,
                storage: StorageType::File,
                num_replicas: replicas,
                allow_atomic_publish: common.jetstream_batch.is_some(),
                ..Default::default()
            };
            match js.create_stream(config).await {
                Ok(stream)
                    if common.jetstream_batch.is_some()
                        && !stream.cached_info().config.allow_atomic_publish =>
                {
                    let bench = Self { js, stream, name };
                    bench.delete().await;
                    return Err(
                        "JetStream did not turn on atomic batches (--jetstream-batch needs nats-server 2.12 or later)".into(),
                    );
                }
                Ok(stream) => return Ok(Self { js, stream, name }),
                Err(error) => last = error.to_string(),
            }
        }
        Err(format!("JetStream refused the stream {name}: {last}"))
    }

    /// A new consumer, returned once a pull from this connection reaches it: its leader's
    /// subscription for pulls reaches the other servers over the cluster's routes after the
    /// create is answered, and a pull sent before finds no responders (the pull stream then
    /// waits its 5 s timer before asking again, or the run failed on it). Nothing is published
    /// yet, so the probe takes no message.
    async fn consumer(&self, config: pull::Config) -> Result<PullConsumer, String> {
        let consumer = self
            .stream
            .create_consumer(config)
            .await
            .map_err(|e| format!("JetStream refused a consumer: {e}"))?;
        // A pull that waits for nothing: answered "no messages" by the consumer's leader once
        // this connection's server knows it, "no responders" before.
        let subject = format!(
            "$JS.API.CONSUMER.MSG.NEXT.{}.{}",
            self.name,
            consumer.cached_info().name
        );
        let deadline = Instant::now() + CONSUMER_PATIENCE;
        let mut delay = Duration::from_millis(5);
        loop {
            let probe = self
                .js
                .client()
                .request(subject.clone(), r#"{"batch":1,"no_wait":true}"#.into())
                .await;
            match probe {
                Err(error)
                    if error.kind() == async_nats::RequestErrorKind::NoResponders
                        && Instant::now() < deadline =>
                {
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_millis(200));
                }
                Err(error) => return Err(format!("pull: {error}")),
                Ok(_) => return Ok(consumer),
            }
        }
    }

    /// Publishes `common.messages`, at most `common.pipeline` unconfirmed at once; returns the
    /// time from the first publish to the last confirmation.
    async fn publish(&self, common: &Common, start: Instant) -> Result<Duration, String> {
        let subject = format!("{}.work", self.name);
        let began = Instant::now();
        let mut pending: VecDeque<PublishAckFuture> = VecDeque::new();
        let prefix = u64::from(std::process::id());
        // Batches: each confirmation covers a whole batch, so fewer are awaited at once.
        let per_ack = common.jetstream_batch.unwrap_or(1).max(1);
        let in_flight = (common.pipeline as u64 / per_ack).max(1) as usize;
        for n in 0..common.messages {
            if pending.len() >= in_flight
                && let Some(ack) = pending.pop_front()
            {
                ack.await
                    .map_err(|e| format!("publish not confirmed: {e}"))?;
            }
            let payload = load::payload(common.payload_bytes, start);
            if let Some(size) = common.jetstream_batch {
                // An atomic batch: numbered messages with the batch's id, the last one
                // (or the run's last) commits it and carries its message id.
                let (batch, position) = (n / size, n % size + 1);
                let id = format!("{prefix:016x}.{batch:x}");
                let mut headers = async_nats::HeaderMap::new();
                headers.insert("Nats-Batch-Id", id.as_str());
                headers.insert("Nats-Batch-Sequence", position.to_string().as_str());
                if position == size || n + 1 == common.messages {
                    headers.insert("Nats-Batch-Commit", "1");
                    headers.insert("Nats-Msg-Id", id.as_str());
                    let ack = self
                        .js
                        .publish_with_headers(subject.clone(), headers, payload)
                        .await
                        .map_err(|e| format!("publish refused: {e}"))?;
                    pending.push_back(ack);
                } else {
                    // Answered only by the commit: a plain publish, in order on the same
                    // connection.
                    self.js
                        .client()
                        .publish_with_headers(subject.clone(), headers, payload)
                        .await
                        .map_err(|e| format!("publish refused: {e}"))?;
                }
                continue;
            }
            let ack = if common.jetstream_msg_ids {
                // As long as a gateway's ids: 16 hex digits, a dot, a hex counter.
                let mut headers = async_nats::HeaderMap::new();
                headers.insert("Nats-Msg-Id", format!("{prefix:016x}.{n:x}").as_str());
                self.js
                    .publish_with_headers(subject.clone(), headers, payload)
                    .await
            } else {
                self.js.publish(subject.clone(), payload).await
            }
            .map_err(|e| format!("publish refused: {e}"))?;
            pending.push_back(ack);
        }
        for ack in pending {
            ack.await
                .map_err(|e| format!("publish not confirmed: {e}"))?;
        }
        Ok(began.elapsed())
    }

    async fn delete(self) {
        if let Err(error) = self.js.delete_stream(&self.name).await {
            eprintln!("could not delete the bench stream {}: {error}", self.name);
        }
    }
}

/// How a summary names `--jetstream-shares-cpu`'s load, if the run had one.
fn beside_text(report: &Report) -> String {
    match (report.beside_cpu_cores, report.beside_cpu_s) {
        (Some(cores), Some(used)) => {
            format!(" beside a load of {cores:.2} cores (the gateways' CPU; it used {used:.2} s)")
        }
        _ => String::new(),
    }
}

/// The report's name for this side: `jetstream+msg-ids` when its publishes carry message ids
/// (`--jetstream-msg-ids`), `jetstream+batch-ids` when they go in atomic batches with one id
/// each (`--jetstream-batch`).
fn deployment(common: &Common) -> &'static str {
    if common.jetstream_batch.is_some() {
        "jetstream+batch-ids"
    } else if common.jetstream_msg_ids {
        "jetstream+msg-ids"
    } else {
        "jetstream"
    }
}

/// Messages a pull asks for at once, whatever the window: the consumer's `max_ack_pending`
/// bounds what is unacked, so a pull open ahead of the acks gets the next message as soon as an
/// ack frees room, with no pull round trip in between (JetStream's own work-queue idiom).
const PULL_BATCH: usize = 256;
/// Acks a consumer waits for JetStream to confirm at once; past them it waits for the oldest.
const MAX_CONFIRMING: usize = 4096;

/// Where one consumer's messages come from: a pull consumer's `messages()` stream or a
/// push consumer's.
type Deliveries =
    std::pin::Pin<Box<dyn futures_core::Stream<Item = Result<jetstream::Message, String>> + Send>>;

/// A pull consumer's messages, `batch` asked for per pull request, the next pull sent when half
/// of them arrived.
async fn pulled(consumer: &PullConsumer, batch: usize) -> Result<Deliveries, String> {
    let messages = consumer
        .stream()
        .max_messages_per_batch(batch)
        .expires(Duration::from_millis(500))
        .messages()
        .await
        .map_err(|e| format!("pull: {e}"))?;
    Ok(Box::pin(
        messages.map(|m| m.map_err(|e| format!("pull: {e}"))),
    ))
}

/// One consumer: takes messages until `count` (shared by the consumers of one queue) reaches
/// `target` or `stop` is set, acking each when `ack` is set: a double ack (a request JetStream
/// answers once the consumer applied it), as the gateway confirms its acks; many confirmations
/// in flight at once, the next message taken meanwhile, all awaited before it returns. Returns
/// publish-to-receive latencies.
async fn consume(
    mut messages: Deliveries,
    ack: bool,
    count: Arc<AtomicU64>,
    target: u64,
    start: Instant,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Result<Vec<u64>, String> {
    let mut latencies = Vec::new();
    let mut confirming = JoinSet::new();
    while count.load(Ordering::Relaxed) < target {
        let message = tokio::select! {
            message = messages.next() => message,
            _ = stop.wait_for(|stop| *stop) => None,
        };
        let Some(message) = message else {
            break;
        };
        let message = message?;
        latencies.push(load::latency_ns(&message.payload, start));
        if ack {
            while confirming.len() >= MAX_CONFIRMING {
                if let Some(done) = confirming.join_next().await {
                    done.map_err(|e| e.to_string())??;
                }
            }
            confirming.spawn(async move {
                message
                    .double_ack()
                    .await
                    .map_err(|e| format!("ack not confirmed: {e}"))
            });
        }
        count.fetch_add(1, Ordering::Relaxed);
    }
    while let Some(done) = confirming.join_next().await {
        done.map_err(|e| e.to_string())??;
    }
    Ok(latencies)
}

/// What [`drive`] measured.
struct Driven {
    /// First publish to the last ack (or receipt).
    elapsed: Duration,
    publish_elapsed: Duration,
    /// Publish-to-receive latencies, nanoseconds, sorted.
    latencies: Vec<u64>,
    /// `--jetstream-shares-cpu`: its load's cores, and the CPU time it used, in seconds.
    beside: Option<(f64, f64)>,
}

/// Consumes with `consumers` while the run publishes; waits until every count is reached (the
/// rate's end: each message received and its ack sent), then for the acks' confirmations.
async fn drive(
    bench: &Bench,
    common: &Common,
    consumers: Vec<(Deliveries, bool, Arc<AtomicU64>)>,
) -> Result<Driven, String> {
    let start = Instant::now();
    let targets: Vec<Arc<AtomicU64>> = consumers.iter().map(|c| c.2.clone()).collect();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut tasks = JoinSet::new();
    for (messages, ack, count) in consumers {
        tasks.spawn(consume(
            messages,
            ack,
            count,
            common.messages,
            start,
            stopped.clone(),
        ));
    }
    let began = Instant::now();
    // `--jetstream-shares-cpu`: the gateways' CPU load, kept busy from the first publish to the
    // last receipt, as the gateways' was measured.
    let load = common.beside_cpu_cores.map(cpu::Load::start);
    let publish_elapsed = bench.publish(common, start).await?;
    let mut latencies = Vec::new();
    let reached = || {
        targets
            .iter()
            .all(|count| count.load(Ordering::Relaxed) >= common.messages)
    };
    let mut progress = Progress::watching(targets.iter().map(|c| (c.clone(), common.messages)));
    while !reached() {
        match tasks.try_join_next() {
            Some(done) => latencies.extend(done.map_err(|e| e.to_string())??),
            None => tokio::time::sleep(Duration::from_millis(1)).await,
        }
        if tasks.is_empty() && !reached() {
            return Err("the consumers stopped before every message arrived".into());
        }
        progress.check()?;
    }
    let elapsed = began.elapsed();
    let beside = load.map(|load| {
        let cores = load.cores();
        let used = load.stop();
        let got = used / elapsed.as_secs_f64().max(f64::EPSILON);
        if elapsed >= Duration::from_secs(1) && got < 0.9 * cores {
            println!(
                "note: the load beside JetStream alone got {got:.2} of its {cores:.2} cores (the machine was busier than the gateways' run left it)"
            );
        }
        (cores, used)
    });
    // Queue consumers waiting for a message that will not come stop here.
    let _ = stop.send(true);
    while let Some(done) = tasks.join_next().await {
        latencies.extend(done.map_err(|e| e.to_string())??);
    }
    latencies.sort_unstable();
    Ok(Driven {
        elapsed,
        publish_elapsed,
        latencies,
        beside,
    })
}

/// w1 straight on JetStream: one durable pull consumer shared by `--consumers` pullers, at most
/// `--consumers` × `--window` unacked messages among them (`max_ack_pending`), each puller's
/// pull open ahead of its acks.
/// Its rate, and `--jetstream-shares-cpu`'s load (cores, and the CPU time it used).
pub(super) async fn run_w1(
    common: &Common,
    urls: &str,
    args: &load::W1,
) -> Result<(f64, Option<(f64, f64)>), String> {
    let bench = Bench::create(urls, "w1", common).await?;
    let result = async {
        let consumer = bench
            .consumer(pull::Config {
                durable_name: Some("w1".into()),
                ack_policy: AckPolicy::Explicit,
                max_ack_pending: (args.consumers * u64::from(args.window.max(1))) as i64,
                ..Default::default()
            })
            .await?;
        let count = Arc::new(AtomicU64::new(0));
        let batch = (args.window.max(1) as usize).max(PULL_BATCH);
        let mut consumers = Vec::new();
        for _ in 0..args.consumers {
            consumers.push((pulled(&consumer, batch).await?, true, count.clone()));
        }
        drive(&bench, common, consumers).await
    }
    .await;
    bench.delete().await;
    let run = result?;
    let report = Report {
        workload: "w1",
        deployment: Some(deployment(common)),
        beside_cpu_cores: run.beside.map(|(cores, _)| cores),
        beside_cpu_s: run.beside.map(|(_, used)| used),
        messages: common.messages,
        payload_bytes: common.payload_bytes,
        window: Some(args.window),
        consumers: Some(args.consumers),
        rate_per_s: Some(per_second(common.messages, run.elapsed)),
        publish_rate_per_s: Some(per_second(common.messages, run.publish_elapsed)),
        latency_p50_us: Some(quantile_us(&run.latencies, 0.50)),
        latency_p99_us: Some(quantile_us(&run.latencies, 0.99)),
        ..Report::default()
    };
    report.printed(&format!(
        "w1 work queue straight on JetStream{}: {} x {} B, {} pullers window {}: {:.0} acked msg/s (publish {:.0}/s), latency p50 {:.0} us p99 {:.0} us",
        beside_text(&report),
        common.messages,
        common.payload_bytes,
        args.consumers,
        args.window,
        report.rate_per_s.unwrap_or_default(),
        report.publish_rate_per_s.unwrap_or_default(),
        report.latency_p50_us.unwrap_or_default(),
        report.latency_p99_us.unwrap_or_default(),
    ))
    .map(|rate| (rate, run.beside))
}

/// w3 straight on JetStream: one consumer per subscriber, each getting every message: a pull
/// consumer double-acking each (`max_ack_pending` `--window`) or, ack-free, a push consumer
/// acking nothing.
/// Its rate, and `--jetstream-shares-cpu`'s load (cores, and the CPU time it used).
pub(super) async fn run_w3(
    common: &Common,
    urls: &str,
    args: &load::W3,
) -> Result<(f64, Option<(f64, f64)>), String> {
    let bench = Bench::create(urls, "w3", common).await?;
    let result = async {
        let mut consumers = Vec::new();
        for n in 0..args.subscribers {
            let messages = if args.ack_free {
                // JetStream's fastest fan-out: a push consumer, no acks, no pulls. Not an
                // ordered one: those are single-replica, and JetStream refuses a consumer whose
                // replicas differ from an interest-retention stream's. A push consumer delivers
                // only once its deliver subject has interest, so nothing is lost before then.
                let consumer = bench
                    .stream
                    .create_consumer(push::Config {
                        durable_name: Some(format!("w3-{n}")),
                        deliver_subject: bench.js.client().new_inbox(),
                        deliver_policy: DeliverPolicy::All,
                        ack_policy: AckPolicy::None,
                        flow_control: true,
                        idle_heartbeat: Duration::from_secs(5),
                        ..Default::default()
                    })
                    .await
                    .map_err(|e| format!("JetStream refused a consumer: {e}"))?;
                let messages = consumer
                    .messages()
                    .await
                    .map_err(|e| format!("push: {e}"))?;
                Box::pin(messages.map(|m| m.map_err(|e| format!("push: {e}")))) as Deliveries
            } else {
                let consumer = bench
                    .consumer(pull::Config {
                        durable_name: Some(format!("w3-{n}")),
                        deliver_policy: DeliverPolicy::All,
                        ack_policy: AckPolicy::Explicit,
                        max_ack_pending: i64::from(args.window.max(1)),
                        ..Default::default()
                    })
                    .await?;
                pulled(&consumer, (args.window.max(1) as usize).max(PULL_BATCH)).await?
            };
            consumers.push((messages, !args.ack_free, Arc::new(AtomicU64::new(0))));
        }
        drive(&bench, common, consumers).await
    }
    .await;
    bench.delete().await;
    let run = result?;
    let deliveries = common.messages * args.subscribers;
    let report = Report {
        workload: "w3",
        deployment: Some(deployment(common)),
        beside_cpu_cores: run.beside.map(|(cores, _)| cores),
        beside_cpu_s: run.beside.map(|(_, used)| used),
        messages: common.messages,
        payload_bytes: common.payload_bytes,
        window: Some(args.window),
        consumers: Some(args.subscribers),
        ack_free: Some(args.ack_free),
        rate_per_s: Some(per_second(deliveries, run.elapsed)),
        publish_rate_per_s: Some(per_second(common.messages, run.publish_elapsed)),
        latency_p50_us: Some(quantile_us(&run.latencies, 0.50)),
        latency_p99_us: Some(quantile_us(&run.latencies, 0.99)),
        ..Report::default()
    };
    report.printed(&format!(
        "w3 fan-out straight on JetStream{}: {} x {} B to {} consumers ({}): {:.0} deliveries/s (publish {:.0}/s), latency p50 {:.0} us p99 {:.0} us",
        beside_text(&report),
        common.messages,
        common.payload_bytes,
        args.subscribers,
        if args.ack_free { "ack-free" } else { "acked" },
        report.rate_per_s.unwrap_or_default(),
        report.publish_rate_per_s.unwrap_or_default(),
        report.latency_p50_us.unwrap_or_default(),
        report.latency_p99_us.unwrap_or_default(),
    ))
    .map(|rate| (rate, run.beside))
}
