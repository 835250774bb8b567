//! W1 (work queue) and W3 (fan-out): one pipelined publisher, consumers that ack by the chosen
//! carriage or need no ack, publish-to-receive latency from a timestamp in each payload.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use clap::Args;
use tinybroker::pb::{self, DeliveryMode, subscription_frame::Frame};
use tokio::{
    sync::{Semaphore, mpsc, watch},
    task::JoinSet,
};
use tokio_stream::{StreamExt, wrappers::ReceiverStream};

use super::{Carriage, Common, Progress, Report, Target, per_second, quantile_us};
use crate::cli::client::{Client, Connection};

#[derive(Args)]
pub struct W1 {
    /// Queue consumers.
    #[arg(long, default_value_t = 3)]
    pub(super) consumers: u64,
    /// Each consumer's window (`max_in_flight`).
    #[arg(long, default_value_t = 1)]
    pub(super) window: u32,
}

#[derive(Args)]
pub struct W3 {
    /// Broadcast subscribers.
    #[arg(long, default_value_t = 8)]
    pub(super) subscribers: u64,
    /// Ack-free (at-most-once) subscriptions; otherwise each subscriber acks every message.
    #[arg(long)]
    pub(super) ack_free: bool,
    /// Each subscriber's window (acked), or how many frames may wait to be written (ack-free).
    #[arg(long, default_value_t = 256)]
    pub(super) window: u32,
}

/// What one consumer does with its stream.
#[derive(Clone)]
struct Consumer {
    open: pb::OpenSubscription,
    acks: Option<Carriage>,
    /// Messages counted so far, shared by the consumers that together must reach `target`.
    count: Arc<AtomicU64>,
    target: u64,
    start: Instant,
}

/// Its rate, and the gateways' CPU over the run in cores (through gateways).
pub(super) async fn run_w1(
    common: &Common,
    broker: &Target,
    args: &W1,
) -> Result<(f64, Option<f64>), String> {
    let subscription = format!("bench-w1-{}", std::process::id());
    let count = Arc::new(AtomicU64::new(0));
    let consumers = (0..args.consumers)
        .map(|_| Consumer {
            open: pb::OpenSubscription {
                subscription_id: subscription.clone(),
                topic_patterns: vec![format!("{}.>", run_prefix())],
                mode: DeliveryMode::Queue.into(),
                consumer_group: "bench".into(),
                max_in_flight: args.window,
                ..Default::default()
            },
            acks: Some(common.acks),
            count: count.clone(),
            target: common.messages,
            start: Instant::now(),
        })
        .collect();
    let run = drive(common, broker, consumers).await?;
    let cores = run.cores();
    let report = Report {
        workload: "w1",
        deployment: broker.deployment(),
        publish: Some(common.publish),
        acks: Some(common.acks),
        messages: common.messages,
        payload_bytes: common.payload_bytes,
        window: Some(args.window),
        consumers: Some(args.consumers),
        rate_per_s: Some(per_second(common.messages, run.elapsed)),
        publish_rate_per_s: Some(per_second(common.messages, run.publish_elapsed)),
        latency_p50_us: Some(quantile_us(&run.latencies, 0.50)),
        latency_p99_us: Some(quantile_us(&run.latencies, 0.99)),
        broker_peak_rss_bytes: broker.peak_rss(),
        gateways_cpu_s: run.cpu_s,
        ..Report::default()
    };
    report.printed(&format!(
        "w1 work queue{}: {} x {} B, publish {:?}, {} consumers window {}, acks {:?}: {:.0} acked msg/s (publish {:.0}/s), latency p50 {:.0} us p99 {:.0} us",
        broker.label(),
        common.messages,
        common.payload_bytes,
        common.publish,
        args.consumers,
        args.window,
        common.acks,
        report.rate_per_s.unwrap_or_default(),
        report.publish_rate_per_s.unwrap_or_default(),
        report.latency_p50_us.unwrap_or_default(),
        report.latency_p99_us.unwrap_or_default(),
    ))
    .map(|rate| (rate, cores))
}

/// Its rate, and the gateways' CPU over the run in cores (through gateways).
pub(super) async fn run_w3(
    common: &Common,
    broker: &Target,
    args: &W3,
) -> Result<(f64, Option<f64>), String> {
    let pid = std::process::id();
    let consumers = (0..args.subscribers)
        .map(|n| Consumer {
            open: pb::OpenSubscription {
                subscription_id: format!("bench-w3-{pid}-{n}"),
                topic_patterns: vec![format!("{}.>", run_prefix())],
                mode: DeliveryMode::Broadcast.into(),
                max_in_flight: args.window,
                ack_mode: if args.ack_free {
                    pb::AckMode::None
                } else {
                    pb::AckMode::Explicit
                }
                .into(),
                ..Default::default()
            },
            acks: (!args.ack_free).then_some(common.acks),
            count: Arc::new(AtomicU64::new(0)),
            target: common.messages,
            start: Instant::now(),
        })
        .collect();
    let run = drive(common, broker, consumers).await?;
    let cores = run.cores();
    let deliveries = common.messages * args.subscribers;
    let report = Report {
        workload: "w3",
        deployment: broker.deployment(),
        publish: Some(common.publish),
        acks: (!args.ack_free).then_some(common.acks),
        messages: common.messages,
        payload_bytes: common.payload_bytes,
        window: Some(args.window),
        consumers: Some(args.subscribers),
        ack_free: Some(args.ack_free),
        rate_per_s: Some(per_second(deliveries, run.elapsed)),
        publish_rate_per_s: Some(per_second(common.messages, run.publish_elapsed)),
        latency_p50_us: Some(quantile_us(&run.latencies, 0.50)),
        latency_p99_us: Some(quantile_us(&run.latencies, 0.99)),
        broker_peak_rss_bytes: broker.peak_rss(),
        gateways_cpu_s: run.cpu_s,
        ..Report::default()
    };
    report.printed(&format!(
        "w3 fan-out{}: {} x {} B to {} subscribers ({}), publish {:?}: {:.0} deliveries/s (publish {:.0}/s), latency p50 {:.0} us p99 {:.0} us",
        broker.label(),
        common.messages,
        common.payload_bytes,
        args.subscribers,
        if args.ack_free {
            "ack-free".to_string()
        } else {
            format!("acks {:?}", common.acks)
        },
        common.publish,
        report.rate_per_s.unwrap_or_default(),
        report.publish_rate_per_s.unwrap_or_default(),
        report.latency_p50_us.unwrap_or_default(),
        report.latency_p99_us.unwrap_or_default(),
    ))
    .map(|rate| (rate, cores))
}

pub(super) async fn run_fill(common: &Common, broker: &Target) -> Result<(), String> {
    let connection = Connection {
        server: broker.url().to_string(),
        token: common.token.clone(),
        ..Connection::default()
    };
    let mut client = connection.connect().await?;
    // Join and leave at once: the member-less subscription keeps its queue (idle expiry).
    let open = pb::OpenSubscription {
        subscription_id: format!("bench-fill-{}", std::process::id()),
        topic_patterns: vec![format!("{}.>", run_prefix())],
        mode: DeliveryMode::Queue.into(),
        consumer_group: "bench".into(),
        ..Default::default()
    };
    let mut frames = client
        .subscribe(open)
        .await
        .map_err(|e| format!("Subscribe: {e}"))?
        .into_inner();
    frames.message().await.map_err(|e| e.to_string())?;
    drop(frames);
    let before = broker.rss();
    let start = Instant::now();
    publish(client, common, start).await?;
    let elapsed = start.elapsed();
    let after = broker.rss();
    let per_message = before
        .zip(after)
        .map(|(b, a)| a.saturating_sub(b) as f64 / common.messages.max(1) as f64);
    let report = Report {
        workload: "fill",
        publish: Some(common.publish),
        messages: common.messages,
        payload_bytes: common.payload_bytes,
        publish_rate_per_s: Some(per_second(common.messages, elapsed)),
        broker_peak_rss_bytes: broker.peak_rss(),
        broker_rss_bytes: after,
        bytes_per_queued_message: per_message,
        ..Report::default()
    };
    report.print(&format!(
        "fill: {} x {} B queued for a subscription with no consumer: broker RSS {:.1} MiB, {:.0} bytes per queued message ({:.0} beyond the payload)",
        common.messages,
        common.payload_bytes,
        after.unwrap_or_default() as f64 / (1024.0 * 1024.0),
        per_message.unwrap_or_default(),
        per_message.unwrap_or_default() - common.payload_bytes as f64,
    ))
}

struct Run {
    /// First publish to the last ack (or receipt).
    elapsed: Duration,
    publish_elapsed: Duration,
    /// Publish-to-receive latencies, nanoseconds, sorted.
    latencies: Vec<u64>,
    /// Through gateways: their CPU time over `elapsed`, in seconds.
    cpu_s: Option<f64>,
}

impl Run {
    /// The gateways' CPU over the run, in cores (what `--jetstream-shares-cpu` keeps busy).
    fn cores(&self) -> Option<f64> {
        self.cpu_s
            .map(|cpu| cpu / self.elapsed.as_secs_f64().max(f64::EPSILON))
    }
}

/// Joins every consumer, waits until all are members, publishes, and waits for every consumer
/// to reach its target.
async fn drive(common: &Common, broker: &Target, consumers: Vec<Consumer>) -> Result<Run, String> {
    let connection = Connection {
        server: broker.url().to_string(),
        token: common.token.clone(),
        ..Connection::default()
    };
    let (stop_tx, stop) = watch::channel(false);
    let start = Instant::now();
    let mut tasks = JoinSet::new();
    let mut joined = Vec::new();
    let targets: Vec<(Arc<AtomicU64>, u64)> = consumers
        .iter()
        .map(|c| (c.count.clone(), c.target))
        .collect();
    for mut consumer in consumers {
        consumer.start = start;
        let client = connection.connect().await?;
        let (ready_tx, ready) = tokio::sync::oneshot::channel();
        joined.push(ready);
        tasks.spawn(consume(client, consumer, ready_tx, stop.clone()));
    }
    for ready in joined {
        ready
            .await
            .map_err(|_| "a consumer failed before it was confirmed")?;
    }
    let publisher = Connection {
        server: broker.publish_url().to_string(),
        ..connection.clone()
    }
    .connect()
    .await?;
    let (publish_start, cpu_before) = (Instant::now(), broker.cpu_seconds());
    publish(publisher, common, start).await?;
    let publish_elapsed = publish_start.elapsed();
    // Queue consumers share one count: whichever is waiting for a frame when the others reach
    // the target would wait forever, so watch the counts and then tell everyone to stop.
    let mut latencies = Vec::new();
    let mut progress = Progress::watching(targets.iter().cloned());
    while !targets
        .iter()
        .all(|(count, target)| count.load(Ordering::Relaxed) >= *target)
    {
        if let Some(done) = tasks.try_join_next() {
            latencies.extend(done.map_err(|e| e.to_string())??);
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
        progress.check()?;
    }
    let elapsed = publish_start.elapsed();
    let cpu_s = Option::zip(cpu_before, broker.cpu_seconds()).map(|(before, after)| after - before);
    if common.jetstream_shares_cpu
        && let Some(cpu_s) = cpu_s
        && cpu_s < 0.5
    {
        println!(
            "note: the gateways used {cpu_s:.2} s of CPU over this run, counted in 10 ms ticks: too short a run for --jetstream-shares-cpu to load JetStream alone by it closely (more --messages)"
        );
    }
    let _ = stop_tx.send(true);
    while let Some(done) = tasks.join_next().await {
        latencies.extend(done.map_err(|e| e.to_string())??);
    }
    latencies.sort_unstable();
    Ok(Run {
        elapsed,
        publish_elapsed,
        latencies,
        cpu_s,
    })
}

/// Nanoseconds from the send time in `payload` (see [`payload`]) to now.
pub(super) fn latency_ns(payload: &[u8], start: Instant) -> u64 {
    let sent = payload
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes);
    (start.elapsed().as_nanos() as u64).saturating_sub(sent)
}

/// A payload of `bytes` (at least 8) carrying the send time since `start`.
pub(super) fn payload(bytes: usize, start: Instant) -> bytes::Bytes {
    let mut payload = vec![0u8; bytes.max(8)];
    payload[..8].copy_from_slice(&(start.elapsed().as_nanos() as u64).to_le_bytes());
    payload.into()
}

/// Publishes `common.messages` messages with up to `common.pipeline` unanswered at once.
async fn publish(mut client: Client, common: &Common, start: Instant) -> Result<(), String> {
    let topic = format!("{}.work", run_prefix());
    // Held open for the whole run: the publisher leads while it publishes.
    let (fence, _leading) = if common.fenced {
        let (fence, stream) = lead(&mut client).await?;
        (Some(fence), Some(stream))
    } else {
        (None, None)
    };
    let request = |start| pb::PublishRequest {
        topic: topic.clone(),
        payload: payload(common.payload_bytes, start),
        headers: Default::default(),
        fence: fence.clone(),
    };
    let pipeline = common.pipeline.max(1);
    match common.publish {
        Carriage::Unary => {
            let mut calls = JoinSet::new();
            for _ in 0..common.messages {
                while calls.len() >= pipeline {
                    answered(calls.join_next().await)?;
                }
                let mut client = client.clone();
                let request = request(start);
                calls.spawn(async move { client.publish(request).await.map(|_| ()) });
            }
            while let Some(call) = calls.join_next().await {
                answered(Some(call))?;
            }
        }
        Carriage::Stream => {
            let credit = Arc::new(Semaphore::new(pipeline));
            let (tx, rx) = mpsc::channel(pipeline);
            let mut answers = client
                .publish_stream(ReceiverStream::new(rx))
                .await
                .map_err(|e| format!("PublishStream: {e}"))?
                .into_inner();
            let reader = {
                let credit = credit.clone();
                let expected = common.messages;
                tokio::spawn(async move {
                    let mut got = 0;
                    let read = async {
                        while got < expected {
                            let Some(answer) = answers.next().await else {
                                return Err(format!("PublishStream ended after {got} answers"));
                            };
                            let answer = answer.map_err(|e| e.to_string())?;
                            if answer.code != 0 {
                                return Err(format!("publish refused: {}", answer.message));
                            }
                            got += 1;
                            credit.add_permits(1);
                        }
                        Ok(())
                    }
                    .await;
                    // No more credit comes: the publisher must not wait for it.
                    credit.close();
                    read
                })
            };
            for _ in 0..common.messages {
                // Closed: the reader stopped, and says why below.
                let Ok(permit) = credit.acquire().await else {
                    break;
                };
                permit.forget();
                if tx.send(request(start)).await.is_err() {
                    break;
                }
            }
            drop(tx);
            reader.await.map_err(|e| e.to_string())??;
        }
    }
    Ok(())
}

fn answered(
    call: Option<Result<Result<(), tonic::Status>, tokio::task::JoinError>>,
) -> Result<(), String> {
    match call {
        Some(result) => result
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("publish refused: {e}")),
        None => Ok(()),
    }
}

/// The frames and settle channel of one consumer.
struct Stream {
    frames: tonic::Streaming<pb::SubscriptionFrame>,
    settles: Option<mpsc::Sender<pb::ConsumeRequest>>,
}

async fn open(client: &mut Client, consumer: &Consumer) -> Result<Stream, String> {
    if consumer.acks != Some(Carriage::Stream) {
        let frames = client
            .subscribe(consumer.open.clone())
            .await
            .map_err(|e| format!("Subscribe: {e}"))?
            .into_inner();
        return Ok(Stream {
            frames,
            settles: None,
        });
    }
    let (tx, rx) = mpsc::channel(1024);
    tx.send(pb::ConsumeRequest {
        request: Some(pb::consume_request::Request::Open(consumer.open.clone())),
    })
    .await
    .map_err(|e| e.to_string())?;
    let frames = client
        .consume(ReceiverStream::new(rx))
        .await
        .map_err(|e| format!("Consume: {e}"))?
        .into_inner();
    Ok(Stream {
        frames,
        settles: Some(tx),
    })
}

/// Receives until the consumers sharing its count reach their target; returns latencies.
async fn consume(
    mut client: Client,
    consumer: Consumer,
    ready: tokio::sync::oneshot::Sender<()>,
    mut stop: watch::Receiver<bool>,
) -> Result<Vec<u64>, String> {
    let mut stream = open(&mut client, &consumer).await?;
    let mut ready = Some(ready);
    let mut member_id = 0;
    let mut latencies = Vec::new();
    let mut acks = JoinSet::new();
    let window = consumer.open.max_in_flight.max(1) as usize;
    let sub = consumer.open.subscription_id.clone();
    loop {
        if consumer.count.load(Ordering::Relaxed) >= consumer.target {
            break;
        }
        let frame = tokio::select! {
            biased;
            _ = stop.changed() => break,
            // Count unary acks as they complete, even while no frame comes.
            Some(done) = acks.join_next(), if !acks.is_empty() => {
                count_ack(Some(done), &consumer.count)?;
                continue;
            }
            frame = stream.frames.message() => match frame.map_err(|e| e.to_string())? {
                Some(frame) => frame.frame,
                None => break,
            },
        };
        let message = match frame {
            Some(Frame::Confirmation(c)) => {
                member_id = c.member_id;
                if let Some(ready) = ready.take() {
                    let _ = ready.send(());
                }
                continue;
            }
            Some(Frame::Message(m)) => m,
            Some(Frame::Refused(r)) => return Err(format!("settle refused: {}", r.message)),
            _ => continue,
        };
        latencies.push(latency_ns(&message.payload, consumer.start));
        match (consumer.acks, &stream.settles) {
            (None, _) => {
                consumer.count.fetch_add(1, Ordering::Relaxed);
            }
            (Some(Carriage::Stream), Some(settles)) => {
                let settle = pb::Settle {
                    ack: vec![message.system_id],
                    nack: Vec::new(),
                    release: Vec::new(),
                };
                settles
                    .send(pb::ConsumeRequest {
                        request: Some(pb::consume_request::Request::Settle(settle)),
                    })
                    .await
                    .map_err(|_| "the Consume stream closed")?;
                consumer.count.fetch_add(1, Ordering::Relaxed);
            }
            _ => {
                // Unary acks run concurrently, up to the window, so a window > 1 pipelines.
                let mut client = client.clone();
                let ack = pb::Ack {
                    subscription_id: sub.clone(),
                    system_id: message.system_id,
                    member_id,
                };
                acks.spawn(async move { client.ack(ack).await.map(|_| ()) });
                while acks.len() >= window {
                    count_ack(acks.join_next().await, &consumer.count)?;
                }
                while let Some(done) = acks.try_join_next() {
                    count_ack(Some(done), &consumer.count)?;
                }
            }
        }
    }
    while let Some(done) = acks.join_next().await {
        count_ack(Some(done), &consumer.count)?;
    }
    Ok(latencies)
}

fn count_ack(
    done: Option<Result<Result<(), tonic::Status>, tokio::task::JoinError>>,
    count: &AtomicU64,
) -> Result<(), String> {
    if let Some(done) = done {
        done.map_err(|e| e.to_string())?
            .map_err(|e| format!("ack refused: {e}"))?;
        count.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

/// The topic prefix of this bench run: its own, so that a run against a long-lived broker
/// (`--server`) neither feeds nor is fed by the subscriptions earlier runs left to idle out.
/// Joins a singleton subscription of the run's own (on a topic nobody publishes to) and waits
/// for its confirmation: the fence every publish of a `--fenced` run names, and the stream
/// that keeps it leading.
async fn lead(
    client: &mut Client,
) -> Result<(pb::PublishFence, tonic::Streaming<pb::SubscriptionFrame>), String> {
    let id = format!("{}-fence", run_prefix());
    let mut stream = client
        .subscribe(pb::OpenSubscription {
            subscription_id: id.clone(),
            topic_patterns: vec![format!("{}.fence-election", run_prefix())],
            mode: DeliveryMode::Singleton.into(),
            consumer_group: "bench".into(),
            ..Default::default()
        })
        .await
        .map_err(|e| format!("joining the fence's election: {e}"))?
        .into_inner();
    loop {
        match stream.next().await {
            Some(Ok(pb::SubscriptionFrame {
                frame: Some(Frame::Confirmation(c)),
            })) => {
                let fence = pb::PublishFence {
                    subscription_id: id,
                    epoch: c.epoch,
                };
                return Ok((fence, stream));
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(format!("the fence's election: {e}")),
            None => return Err("the fence's election ended before it led".into()),
        }
    }
}

fn run_prefix() -> String {
    format!("bench.run{}", std::process::id())
}
