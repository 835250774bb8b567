//! W2: singleton failover under load. Replica processes (`tinybroker bench-replica`) join one
//! singleton subscription and ack what they get; a publisher runs at a fixed rate; every
//! interval the active replica is killed with SIGKILL and a fresh one joins at the back. For
//! each kill: the gap from the kill to the first delivery at the new active, and to a
//! leadership watcher's frame naming it (`WatchLeadership`, at the publishers' server). At the end: how
//! many published messages were never acked (lost) and how many were delivered more than once.
//! Through two gateways (`bench --nats`), replicas alternate between them, so a kill on one
//! promotes a replica on the other.

use std::{
    collections::{BTreeMap, BTreeSet},
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    sync::mpsc as std_mpsc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use clap::Args;
use tinybroker::pb::{self, DeliveryMode, subscription_frame::Frame};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::{Carriage, Common, Report, Target};
use crate::cli::client::Connection;

#[derive(Args)]
pub struct W2 {
    /// Replica processes kept running.
    #[arg(long, default_value_t = 3)]
    replicas: usize,
    /// Publish rate, messages per second.
    #[arg(long, default_value_t = 2_000)]
    rate: u64,
    /// How many times the active replica is killed.
    #[arg(long, default_value_t = 5)]
    kills: u32,
    /// Time between kills.
    #[arg(long, default_value = "1500ms", value_parser = humantime::parse_duration)]
    interval: Duration,
}

/// `tinybroker bench-replica`: one W2 replica. Prints `standby POSITION` when told its place
/// in line, `active EPOCH` when confirmed and `got SYSTEM_ID ATTEMPT UNIX_NANOS` for each
/// message, then acks it.
#[derive(Args)]
pub struct Replica {
    #[command(flatten)]
    connection: Connection,
    /// Subscription id.
    #[arg(long)]
    id: String,
    /// How acks travel.
    #[arg(long, value_enum, default_value = "stream")]
    acks: Carriage,
}

fn unix_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

pub async fn replica(args: Replica) -> Result<(), String> {
    let mut client = args.connection.connect().await?;
    let open = pb::OpenSubscription {
        subscription_id: args.id.clone(),
        topic_patterns: vec!["bench.>".into()],
        mode: DeliveryMode::Singleton.into(),
        consumer_group: "bench".into(),
        notify_standby: true,
        ..Default::default()
    };
    let (tx, rx) = mpsc::channel(64);
    let mut frames = match args.acks {
        Carriage::Unary => client
            .subscribe(open)
            .await
            .map_err(|e| e.to_string())?
            .into_inner(),
        Carriage::Stream => {
            let first = pb::ConsumeRequest {
                request: Some(pb::consume_request::Request::Open(open)),
            };
            tx.send(first).await.map_err(|e| e.to_string())?;
            client
                .consume(ReceiverStream::new(rx))
                .await
                .map_err(|e| e.to_string())?
                .into_inner()
        }
    };
    let mut member_id = 0;
    while let Some(frame) = frames.message().await.map_err(|e| e.to_string())? {
        match frame.frame {
            Some(Frame::Confirmation(c)) => {
                member_id = c.member_id;
                println!("active {}", c.epoch);
            }
            Some(Frame::Standby(notice)) => println!("standby {}", notice.position),
            Some(Frame::Message(m)) => {
                println!(
                    "got {} {} {}",
                    m.system_id,
                    m.delivery_attempt,
                    unix_nanos()
                );
                match args.acks {
                    Carriage::Stream => {
                        let settle = pb::Settle {
                            ack: vec![m.system_id],
                            nack: Vec::new(),
                            release: Vec::new(),
                        };
                        let request = pb::ConsumeRequest {
                            request: Some(pb::consume_request::Request::Settle(settle)),
                        };
                        tx.send(request).await.map_err(|e| e.to_string())?;
                    }
                    Carriage::Unary => {
                        let ack = pb::Ack {
                            subscription_id: args.id.clone(),
                            system_id: m.system_id,
                            member_id,
                        };
                        client.ack(ack).await.map_err(|e| e.to_string())?;
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// A line from a replica process.
enum Event {
    /// In line (it is there for good: promotion order is join order).
    Standby {
        replica: usize,
    },
    Active {
        replica: usize,
    },
    Got {
        replica: usize,
        system_id: u64,
        at: u64,
    },
}

struct Replicas {
    /// Replica n connects to `urls[n % urls.len()]`.
    urls: Vec<String>,
    subscription: String,
    acks: Carriage,
    children: BTreeMap<usize, Child>,
    events: std_mpsc::Sender<(Event, u64)>,
    next: usize,
}

impl Replicas {
    fn spawn(&mut self) -> Result<usize, String> {
        let n = self.next;
        self.next += 1;
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let url = &self.urls[n % self.urls.len()];
        let mut child = Command::new(exe)
            .args(["bench-replica", "--server", url, "--id", &self.subscription])
            .args([
                "--acks",
                if self.acks == Carriage::Stream {
                    "stream"
                } else {
                    "unary"
                },
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start a replica: {e}"))?;
        let stdout = child.stdout.take().ok_or("no replica stdout")?;
        let events = self.events.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let mut words = line.split_whitespace();
                let event = match words.next() {
                    Some("active") => Event::Active { replica: n },
                    Some("standby") => Event::Standby { replica: n },
                    Some("got") => {
                        let system_id = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
                        let _attempt = words.next();
                        let at = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
                        Event::Got {
                            replica: n,
                            system_id,
                            at,
                        }
                    }
                    _ => continue,
                };
                if events.send((event, unix_nanos())).is_err() {
                    return;
                }
            }
        });
        self.children.insert(n, child);
        Ok(n)
    }
}

impl Drop for Replicas {
    fn drop(&mut self) {
        for child in self.children.values_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub(super) async fn run_w2(common: &Common, broker: &Target, args: &W2) -> Result<(), String> {
    let (events_tx, events) = std_mpsc::channel();
    let mut replicas = Replicas {
        urls: broker.consumer_urls(),
        subscription: format!("bench-w2-{}", std::process::id()),
        acks: common.acks,
        children: BTreeMap::new(),
        events: events_tx,
        next: 0,
    };
    let mut active = None;
    // Join one at a time, each in line before the next, so the join order (and so the
    // promotion order) is known.
    for _ in 0..args.replicas.max(2) {
        let n = replicas.spawn()?;
        if active.is_none() {
            active = Some(wait_active(&events, &mut Default::default())?);
        } else {
            wait_standby(&events, n)?;
        }
    }
    let connection = Connection {
        server: broker.publish_url().to_string(),
        token: common.token.clone(),
        ..Connection::default()
    };
    let client = connection.connect().await?;
    // A leadership watcher at the publishers' server (through gateways, one of the two the
    // replicas alternate between): each frame with the time it arrived.
    let mut watcher = connection.connect().await?;
    let mut frames = watcher
        .watch_leadership(pb::WatchLeadershipRequest {
            subscription_id: replicas.subscription.clone(),
        })
        .await
        .map_err(|e| format!("WatchLeadership: {e}"))?
        .into_inner();
    let (watched_tx, mut watched) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok(Some(frame)) = frames.message().await {
            if watched_tx.send((frame.epoch, unix_nanos())).is_err() {
                return;
            }
        }
    });
    let mut epoch = 0;
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let publisher = tokio::spawn(publish_at_rate(client, args.rate, stop));

    let mut received: BTreeMap<u64, u32> = BTreeMap::new();
    let mut gaps = Vec::new();
    let mut watch_gaps = Vec::new();
    for _ in 0..args.kills {
        pump(&events, &mut received, args.interval, &mut active)?;
        let victim = active.ok_or("no active replica to kill")?;
        // The victim's epoch: the latest the watcher was told before the kill.
        while let Ok((told, _)) = watched.try_recv() {
            epoch = epoch.max(told);
        }
        let killed_at = unix_nanos();
        if let Some(mut child) = replicas.children.remove(&victim) {
            child.kill().map_err(|e| e.to_string())?;
            let _ = child.wait();
        }
        // The first delivery at any other replica after the kill ends the gap.
        let gap = loop {
            let (event, _) = events
                .recv_timeout(Duration::from_secs(10))
                .map_err(|_| "no delivery within 10 s of a kill")?;
            match event {
                Event::Active { .. } | Event::Standby { .. } => {}
                Event::Got {
                    replica,
                    system_id,
                    at,
                } => {
                    *received.entry(system_id).or_default() += 1;
                    if replica != victim && at >= killed_at {
                        active = Some(replica);
                        break Duration::from_nanos(at - killed_at);
                    }
                }
            }
        };
        gaps.push(gap);
        // The watcher's first frame with a higher epoch ends its gap.
        let told = tokio::time::timeout(Duration::from_secs(10), async {
            while let Some((told, at)) = watched.recv().await {
                if told > epoch {
                    return Some((told, at));
                }
            }
            None
        })
        .await
        .ok()
        .flatten()
        .ok_or("the leadership watcher was told of no promotion within 10 s of a kill")?;
        epoch = told.0;
        watch_gaps.push(Duration::from_nanos(told.1.saturating_sub(killed_at)));
        replicas.spawn()?;
    }
    let _ = stop_tx.send(true);
    let published = publisher.await.map_err(|e| e.to_string())??;
    // Drain: everything published must reach some replica.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while published.iter().any(|id| !received.contains_key(id))
        && std::time::Instant::now() < deadline
    {
        pump(
            &events,
            &mut received,
            Duration::from_millis(100),
            &mut active,
        )?;
    }
    let lost = published
        .iter()
        .filter(|id| !received.contains_key(id))
        .count() as u64;
    let duplicated = received.values().filter(|n| **n > 1).count() as u64;
    gaps.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let median = gaps.get(gaps.len() / 2).copied().unwrap_or_default();
    let max = gaps.last().copied().unwrap_or_default();
    watch_gaps.sort();
    let watch_median = watch_gaps
        .get(watch_gaps.len() / 2)
        .copied()
        .unwrap_or_default();
    let watch_max = watch_gaps.last().copied().unwrap_or_default();
    let report = Report {
        workload: "w2",
        publish: Some(Carriage::Unary),
        acks: Some(common.acks),
        messages: published.len() as u64,
        payload_bytes: 8,
        consumers: Some(args.replicas as u64),
        gap_median_ms: Some(ms(median)),
        gap_max_ms: Some(ms(max)),
        watch_gap_median_ms: Some(ms(watch_median)),
        watch_gap_max_ms: Some(ms(watch_max)),
        kills: Some(args.kills),
        lost: Some(lost),
        duplicated: Some(duplicated),
        broker_peak_rss_bytes: broker.peak_rss(),
        deployment: broker.deployment(),
        ..Report::default()
    };
    report.print(&format!(
        "w2 singleton failover{}: {} replicas, {} msg/s, {} kills (SIGKILL every {:?}), acks {:?}: gap median {:.2} ms, max {:.2} ms; a watcher told median {:.2} ms, max {:.2} ms after the kill; {} published, {lost} lost, {duplicated} delivered twice (the in-flight message at each kill)",
        broker.label(),
        args.replicas,
        args.rate,
        args.kills,
        args.interval,
        common.acks,
        ms(median),
        ms(max),
        ms(watch_median),
        ms(watch_max),
        published.len(),
    ))
}

/// Reads replica events for `for_how_long`, counting receipts.
fn pump(
    events: &std_mpsc::Receiver<(Event, u64)>,
    received: &mut BTreeMap<u64, u32>,
    for_how_long: Duration,
    active: &mut Option<usize>,
) -> Result<(), String> {
    let until = std::time::Instant::now() + for_how_long;
    while let Some(left) = until.checked_duration_since(std::time::Instant::now()) {
        match events.recv_timeout(left) {
            Ok((Event::Active { replica }, _)) => *active = Some(replica),
            Ok((Event::Standby { .. }, _)) => {}
            Ok((
                Event::Got {
                    replica, system_id, ..
                },
                _,
            )) => {
                *received.entry(system_id).or_default() += 1;
                *active = Some(replica);
            }
            Err(std_mpsc::RecvTimeoutError::Timeout) => break,
            Err(std_mpsc::RecvTimeoutError::Disconnected) => return Err("replicas gone".into()),
        }
    }
    Ok(())
}

fn wait_active(
    events: &std_mpsc::Receiver<(Event, u64)>,
    received: &mut BTreeMap<u64, u32>,
) -> Result<usize, String> {
    loop {
        match events.recv_timeout(Duration::from_secs(10)) {
            Ok((Event::Active { replica }, _)) => return Ok(replica),
            Ok((Event::Got { system_id, .. }, _)) => *received.entry(system_id).or_default() += 1,
            Ok((Event::Standby { .. }, _)) => {}
            Err(_) => return Err("the first replica was not confirmed within 10 s".into()),
        }
    }
}

/// Waits until replica `n` is in line (its standby notice); nothing else happens meanwhile.
fn wait_standby(events: &std_mpsc::Receiver<(Event, u64)>, n: usize) -> Result<(), String> {
    loop {
        match events.recv_timeout(Duration::from_secs(10)) {
            Ok((Event::Standby { replica }, _)) if replica == n => return Ok(()),
            Ok(_) => {}
            Err(_) => return Err(format!("replica {n} was not in line within 10 s")),
        }
    }
}

async fn publish_at_rate(
    mut client: crate::cli::client::Client,
    rate: u64,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Result<BTreeSet<u64>, String> {
    let mut published = BTreeSet::new();
    let mut tick = tokio::time::interval(Duration::from_nanos(1_000_000_000 / rate.max(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    loop {
        tokio::select! {
            biased;
            _ = stop.changed() => return Ok(published),
            _ = tick.tick() => {}
        }
        let reply = client
            .publish(pb::PublishRequest {
                topic: "bench.tick".into(),
                payload: bytes::Bytes::from_static(b"tick"),
                headers: Default::default(),
                fence: None,
            })
            .await
            .map_err(|e| e.to_string())?;
        published.insert(reply.into_inner().system_id);
    }
}
