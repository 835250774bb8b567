//! `bench --nats-core URL w3`: the fan-out workload on plain NATS core (no JetStream, no acks,
//! no per-subscriber state), the broadcast a user could pick instead of an ack-free
//! subscription. Each subscriber has its own connection, as each tinybroker subscriber has its
//! own stream; one publisher on another connection publishes `--messages` to one subject.
//!
//! NATS core drops what a slow subscriber cannot take (the client's buffer is full, or the
//! server cuts the connection when its pending bytes pass the limit), so the run does not wait
//! forever for every delivery: once publishing is done it waits while deliveries still arrive,
//! and gives up after [`IDLE`] without one. What never arrived is reported as `dropped`.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use tokio::{sync::watch, task::JoinSet};
use tokio_stream::StreamExt;

use super::{Common, Report, load, per_second, quantile_us};

/// How long the run waits, publishing done, for a delivery before it counts the rest dropped.
const IDLE: Duration = Duration::from_secs(2);

/// The most messages a subscriber's client buffers before the client drops (NATS's default is
/// 65,536): enough for a whole run up to this size, so a subscriber that falls behind the
/// publisher for a while is not counted as dropping; bounded so a huge run stays bounded.
const SUBSCRIBER_BUFFER: u64 = 1 << 20;

async fn connect(urls: &str, name: &str, buffer: usize) -> Result<async_nats::Client, String> {
    let addrs = tinybroker::cluster::gateway::parse_urls(urls)?;
    async_nats::ConnectOptions::new()
        .name(name)
        .subscription_capacity(buffer)
        .connect(addrs)
        .await
        .map_err(|e| format!("cannot connect to NATS at {urls}: {e}"))
}

/// One subscriber's receipts, counted as they arrive.
struct Receipts {
    count: Arc<AtomicU64>,
    /// Nanoseconds from the run's start to the latest receipt.
    last_ns: Arc<AtomicU64>,
}

/// Receives until `target` messages arrived or `stop` says so; returns the latencies.
async fn receive(
    mut subscriber: async_nats::Subscriber,
    target: u64,
    receipts: Receipts,
    start: Instant,
    mut stop: watch::Receiver<bool>,
) -> Vec<u64> {
    let mut latencies = Vec::with_capacity(target.min(SUBSCRIBER_BUFFER) as usize);
    while (latencies.len() as u64) < target {
        tokio::select! {
            message = subscriber.next() => {
                let Some(message) = message else { break };
                latencies.push(load::latency_ns(&message.payload, start));
                receipts.count.fetch_add(1, Ordering::Relaxed);
                receipts
                    .last_ns
                    .fetch_max(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
            }
            _ = stop.changed() => break,
        }
    }
    latencies
}

/// w3 on NATS core: `--subscribers` plain subscriptions to one subject, each getting every
/// message; `--window` and `--ack-free` do not apply (NATS core never acks).
pub(super) async fn run_w3(common: &Common, urls: &str, args: &load::W3) -> Result<(), String> {
    let subject = format!("bench.core{}.work", std::process::id());
    let buffer = common.messages.clamp(1, SUBSCRIBER_BUFFER) as usize;
    let start = Instant::now();
    let (stop_tx, stop) = watch::channel(false);
    let mut tasks = JoinSet::new();
    let mut counts = Vec::new();
    let last_ns = Arc::new(AtomicU64::new(0));
    // Kept open until the end: a dropped client closes its subscriptions.
    let mut clients = Vec::new();
    for n in 0..args.subscribers {
        let client = connect(urls, &format!("tinybroker-bench-sub-{n}"), buffer).await?;
        let subscriber = client
            .subscribe(subject.clone())
            .await
            .map_err(|e| format!("subscribe: {e}"))?;
        // The server has the subscription once it answered the flush's PING.
        client
            .flush()
            .await
            .map_err(|e| format!("flush after subscribe: {e}"))?;
        let count = Arc::new(AtomicU64::new(0));
        counts.push(count.clone());
        let receipts = Receipts {
            count,
            last_ns: last_ns.clone(),
        };
        tasks.spawn(receive(
            subscriber,
            common.messages,
            receipts,
            start,
            stop.clone(),
        ));
        clients.push(client);
    }
    let publisher = connect(urls, "tinybroker-bench-pub", buffer).await?;
    let publish_start = Instant::now();
    let publish_start_ns = publish_start.duration_since(start).as_nanos() as u64;
    for _ in 0..common.messages {
        publisher
            .publish(subject.clone(), load::payload(common.payload_bytes, start))
            .await
            .map_err(|e| format!("publish: {e}"))?;
    }
    publisher
        .flush()
        .await
        .map_err(|e| format!("flush after publishing: {e}"))?;
    let publish_elapsed = publish_start.elapsed();
    let expected = common.messages * args.subscribers;
    let received = || {
        counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum::<u64>()
    };
    let (mut seen, mut progress_at) = (received(), Instant::now());
    while seen < expected && progress_at.elapsed() < IDLE {
        // The bench's own polling interval, as the other drivers watch their counts.
        tokio::time::sleep(Duration::from_millis(1)).await;
        let now = received();
        if now > seen {
            (seen, progress_at) = (now, Instant::now());
        }
    }
    let _ = stop_tx.send(true);
    let mut latencies = Vec::new();
    while let Some(done) = tasks.join_next().await {
        latencies.extend(done.map_err(|e| e.to_string())?);
    }
    drop(clients);
    latencies.sort_unstable();
    let delivered = latencies.len() as u64;
    // First publish to the last receipt (not to the end of the idle wait, when some dropped).
    let elapsed = Duration::from_nanos(
        last_ns
            .load(Ordering::Relaxed)
            .saturating_sub(publish_start_ns),
    );
    let report = Report {
        workload: "w3",
        deployment: Some("nats-core"),
        messages: common.messages,
        payload_bytes: common.payload_bytes,
        consumers: Some(args.subscribers),
        ack_free: Some(true),
        rate_per_s: Some(per_second(delivered, elapsed)),
        publish_rate_per_s: Some(per_second(common.messages, publish_elapsed)),
        latency_p50_us: Some(quantile_us(&latencies, 0.50)),
        latency_p99_us: Some(quantile_us(&latencies, 0.99)),
        delivered: Some(delivered),
        dropped: Some(expected.saturating_sub(delivered)),
        ..Report::default()
    };
    report.print(&format!(
        "w3 fan-out on NATS core: {} x {} B to {} subscribers (no acks): {:.0} deliveries/s (publish {:.0}/s), {delivered} delivered, {} dropped, latency p50 {:.0} us p99 {:.0} us",
        common.messages,
        common.payload_bytes,
        args.subscribers,
        report.rate_per_s.unwrap_or_default(),
        report.publish_rate_per_s.unwrap_or_default(),
        expected.saturating_sub(delivered),
        report.latency_p50_us.unwrap_or_default(),
        report.latency_p99_us.unwrap_or_default(),
    ))
}
