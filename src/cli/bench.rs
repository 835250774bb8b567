//! `tinybroker bench`: a load generator for the work-queue pattern with ack-each.
//!
//! Publishers publish `--messages` messages; queue-mode consumers receive them and ack every one
//! with a unary `Ack`. Reports publish rate, end-to-end rate (first publish to last ack) and
//! publish-to-receive latency percentiles. Without `--server` it starts a broker in this process
//! on a free loopback port.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use clap::Args;
use tinybroker::{
    pb::{self, DeliveryMode, subscription_frame::Frame},
    server::{Server, ServerConfig},
};

use super::client::{Client, Connection};

#[derive(Args)]
pub struct Bench {
    /// Broker URL; without it a broker is started in this process on a free port.
    #[arg(long)]
    server: Option<String>,
    /// Bearer token, if the broker requires one.
    #[arg(long, env = "TINYBROKER_AUTH_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Messages to publish in total.
    #[arg(long, default_value_t = 100_000)]
    messages: u64,
    /// Payload size in bytes (at least 8: a send timestamp rides in it).
    #[arg(long, default_value_t = 64)]
    payload_bytes: usize,
    /// Concurrent publishers.
    #[arg(long, default_value_t = 4)]
    publishers: u64,
    /// Messages per PublishBatch call (1 = unary Publish).
    #[arg(long, default_value_t = 100)]
    batch: u64,
    /// Queue-mode consumers.
    #[arg(long, default_value_t = 4)]
    consumers: u64,
    /// Each consumer's window.
    #[arg(long, default_value_t = 16)]
    max_in_flight: u32,
}

fn percentile(sorted: &[u64], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    Duration::from_nanos(sorted[i])
}

pub async fn run(args: Bench) -> Result<(), String> {
    let (url, _server) = match &args.server {
        Some(url) => (url.clone(), None),
        None => {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .map_err(|e| e.to_string())?;
            let addr = listener.local_addr().map_err(|e| e.to_string())?;
            let mut config = ServerConfig::default();
            config.limits.max_queue_messages = config.limits.max_queue_messages.max(args.messages);
            config.limits.max_queue_bytes = u64::MAX;
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            tokio::spawn(Server::new(config).run(
                tinybroker::server::tcp_incoming(listener),
                async {
                    let _ = rx.await;
                },
            ));
            (format!("http://{addr}"), Some(tx))
        }
    };
    let connection = Connection {
        server: url.clone(),
        token: args.token.clone(),
        ..Connection::default()
    };
    let subscription = format!("bench-{}", std::process::id());
    let start = Instant::now();
    let received = Arc::new(AtomicU64::new(0));
    let mut consumers = Vec::new();
    for _ in 0..args.consumers {
        let client = connection.connect().await?;
        consumers.push(tokio::spawn(consume(
            client,
            subscription.clone(),
            args.max_in_flight,
            args.messages,
            received.clone(),
            start,
        )));
    }
    // Wait until every consumer has joined before publishing.
    let probe = connection.connect().await?;
    wait_for_members(&probe, &subscription, args.consumers).await?;

    let publish_start = Instant::now();
    let mut publishers = Vec::new();
    let per = args.messages / args.publishers.max(1);
    for p in 0..args.publishers.max(1) {
        let count = if p == 0 {
            args.messages - per * (args.publishers.max(1) - 1)
        } else {
            per
        };
        let client = connection.connect().await?;
        publishers.push(tokio::spawn(publish(
            client,
            count,
            args.batch.max(1),
            args.payload_bytes.max(8),
            start,
        )));
    }
    for p in publishers {
        p.await.map_err(|e| e.to_string())??;
    }
    let publish_elapsed = publish_start.elapsed();
    let mut latencies = Vec::new();
    for handle in consumers {
        latencies.extend(handle.await.map_err(|e| e.to_string())??);
    }
    let total_elapsed = publish_start.elapsed();
    latencies.sort_unstable();
    let rate = |d: Duration| args.messages as f64 / d.as_secs_f64();
    println!(
        "bench: {} messages of {} bytes, {} publishers (batch {}), {} consumers (window {}, ack each) against {url}",
        args.messages,
        args.payload_bytes,
        args.publishers,
        args.batch,
        args.consumers,
        args.max_in_flight
    );
    println!(
        "publish:     {:>10.0} msg/s ({:.2?})",
        rate(publish_elapsed),
        publish_elapsed
    );
    println!(
        "end to end:  {:>10.0} msg/s ({:.2?}, first publish to last ack)",
        rate(total_elapsed),
        total_elapsed
    );
    println!(
        "latency publish->receive: p50 {:.2?}  p99 {:.2?}  max {:.2?}",
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.99),
        percentile(&latencies, 1.0)
    );
    Ok(())
}

async fn wait_for_members(client: &Client, subscription: &str, members: u64) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(info) = client
            .clone()
            .describe_subscription(pb::DescribeSubscriptionRequest {
                subscription_id: subscription.to_string(),
            })
            .await
            && info.into_inner().members.len() as u64 >= members
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err("consumers did not join within 30s".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn publish(
    mut client: Client,
    count: u64,
    batch: u64,
    payload_bytes: usize,
    start: Instant,
) -> Result<(), String> {
    let mut sent = 0;
    while sent < count {
        let n = batch.min(count - sent);
        let messages: Vec<_> = (0..n)
            .map(|_| {
                let mut payload = vec![0u8; payload_bytes];
                payload[..8].copy_from_slice(&(start.elapsed().as_nanos() as u64).to_le_bytes());
                pb::PublishRequest {
                    topic: "bench.work".into(),
                    payload: payload.into(),
                    headers: Default::default(),
                }
            })
            .collect();
        if n == 1 {
            let Some(message) = messages.into_iter().next() else {
                break;
            };
            client.publish(message).await.map_err(|e| e.to_string())?;
        } else {
            client
                .publish_batch(pb::PublishBatchRequest { messages })
                .await
                .map_err(|e| e.to_string())?;
        }
        sent += n;
    }
    Ok(())
}

async fn consume(
    mut client: Client,
    subscription: String,
    window: u32,
    total: u64,
    received: Arc<AtomicU64>,
    start: Instant,
) -> Result<Vec<u64>, String> {
    let mut stream = client
        .subscribe(pb::OpenSubscription {
            subscription_id: subscription.clone(),
            topic_patterns: vec!["bench.>".into()],
            mode: DeliveryMode::Queue.into(),
            consumer_group: "bench".into(),
            max_in_flight: window,
            ..Default::default()
        })
        .await
        .map_err(|e| e.to_string())?
        .into_inner();
    let mut member_id = 0;
    let mut latencies = Vec::new();
    let mut acks = tokio::task::JoinSet::new();
    while received.load(Ordering::Relaxed) < total {
        let frame = tokio::select! {
            frame = stream.message() => match frame.map_err(|e| e.to_string())? {
                Some(frame) => frame.frame,
                None => break,
            },
            // Another consumer may take the last messages: look at the count again now and then.
            () = tokio::time::sleep(Duration::from_millis(50)) => None,
        };
        match frame {
            Some(Frame::Confirmation(c)) => member_id = c.member_id,
            Some(Frame::Message(m)) => {
                let sent = u64::from_le_bytes(m.payload[..8].try_into().unwrap_or_default());
                latencies.push((start.elapsed().as_nanos() as u64).saturating_sub(sent));
                let mut client = client.clone();
                let ack = pb::Ack {
                    subscription_id: subscription.clone(),
                    system_id: m.system_id,
                    member_id,
                };
                // Acks run concurrently, up to the window, so a window > 1 pipelines.
                acks.spawn(async move { client.ack(ack).await.map(|_| ()) });
                while acks.len() >= window as usize {
                    if let Some(result) = acks.join_next().await {
                        count_ack(result, &received)?;
                    }
                }
            }
            _ => {}
        }
        while let Some(result) = acks.try_join_next() {
            count_ack(result, &received)?;
        }
    }
    while let Some(result) = acks.join_next().await {
        count_ack(result, &received)?;
    }
    Ok(latencies)
}

/// Counts one finished ack, or reports why it failed.
fn count_ack(
    result: Result<Result<(), tonic::Status>, tokio::task::JoinError>,
    received: &AtomicU64,
) -> Result<(), String> {
    result
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    received.fetch_add(1, Ordering::Relaxed);
    Ok(())
}
