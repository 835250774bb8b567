//! `tinybroker status [ID] [--json]`: the operator's view of a running broker. Subscriptions,
//! members in promotion order, who is active, epochs, queue depth, in flight and counters, as a
//! table for people or JSON for scripts.

use clap::Args;
use serde::Serialize;
use tinybroker::client::{BrokerCounters, Client, Error, SubscriptionInfo};

use super::client::Connection;

#[derive(Args)]
pub struct Status {
    #[command(flatten)]
    connection: Connection,
    /// Show only this subscription, with its members and counters.
    id: Option<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// With a SINGLETON subscription's ID: follow its leadership, a line per change (with
    /// `--json`, a JSON object per line), until interrupted or the subscription is gone.
    #[arg(long, requires = "id")]
    watch: bool,
}

/// The JSON document (and what the table shows). Written by hand rather than derived on the
/// generated types, so the JSON stays stable as the proto grows.
#[derive(Serialize)]
struct StatusView {
    /// Absent when one subscription was asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    broker: Option<BrokerView>,
    /// Where the broker keeps what it confirms (docs/cluster.md#durability); absent when one
    /// subscription was asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    storage: Option<StorageView>,
    subscriptions: Vec<SubscriptionView>,
}

#[derive(Serialize)]
struct StorageView {
    kind: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    stream: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    stream_storage: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    replicas: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_consumers: Option<i32>,
}

impl From<tinybroker::client::Storage> for StorageView {
    fn from(storage: tinybroker::client::Storage) -> Self {
        let jetstream = storage.kind == "jetstream";
        Self {
            replicas: jetstream.then_some(storage.replicas),
            max_consumers: jetstream.then_some(storage.max_consumers),
            kind: storage.kind,
            stream: storage.stream,
            stream_storage: storage.stream_storage,
        }
    }
}

impl StorageView {
    /// One line for the table: where confirmed messages live, and what that survives.
    fn line(&self) -> String {
        match self.kind.as_str() {
            "memory" => "storage: in this process's memory (embedded): a confirmed message does not outlive the broker process\n".into(),
            "jetstream" => format!(
                "storage: JetStream stream {} ({} storage, {} replicas, {}); what it survives depends on the servers' sync_interval: docs/cluster.md#durability\n",
                self.stream,
                self.stream_storage,
                self.replicas.unwrap_or(0),
                match self.max_consumers {
                    Some(n) if n > 0 => format!("at most {n} consumers"),
                    _ => "the servers' default consumer limit".into(),
                }
            ),
            other => format!("storage: {other}\n"),
        }
    }
}

#[derive(Serialize)]
struct BrokerView {
    published: u64,
    unrouted: u64,
    rejected_publishes: u64,
    subscriptions_expired: u64,
    messages_expired: u64,
    unconfirmed_acks: u64,
    subscriptions: u64,
    members: u64,
}

#[derive(Serialize)]
struct SubscriptionView {
    subscription_id: String,
    mode: String,
    consumer_group: String,
    topic_patterns: Vec<String>,
    ack_mode: String,
    overflow: String,
    epoch: u64,
    active_member_id: Option<u64>,
    /// The active member's metadata (docs/semantics.md#member-metadata); through gateways
    /// shown at every gateway, the member's own or not.
    #[serde(skip_serializing_if = "String::is_empty")]
    active_metadata: String,
    /// The active member while it steps down (docs/semantics.md#hand-over).
    #[serde(skip_serializing_if = "Option::is_none")]
    stepping_down_member_id: Option<u64>,
    queued_messages: u64,
    queued_bytes: u64,
    in_flight: u64,
    max_delivery_attempts: u32,
    dead_letter_topic: Option<String>,
    expires_in_ms: Option<u64>,
    /// Cluster mode: the subscription's JetStream consumer.
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream: Option<UpstreamView>,
    /// In promotion order: the first in line (highest priority, then earliest joined) first.
    members: Vec<MemberView>,
    counters: CountersView,
}

#[derive(Serialize)]
struct UpstreamView {
    consumer: String,
    pending: u64,
    unacked: u64,
    redelivered: u64,
}

#[derive(Serialize)]
struct MemberView {
    member_id: u64,
    position: u32,
    active: bool,
    epoch: u64,
    in_flight: u32,
    max_in_flight: u32,
    /// What it declared on joining or last proclaimed; empty if nothing.
    metadata: String,
    /// Its priority (docs/semantics.md#priority).
    priority: u32,
}

#[derive(Serialize, Default)]
struct CountersView {
    enqueued: u64,
    delivered: u64,
    redelivered: u64,
    acked: u64,
    nacked: u64,
    released: u64,
    dead_lettered: u64,
    dropped_max_attempts: u64,
    rejected_full: u64,
    dropped_full: u64,
    dropped_overflow: u64,
    promotions: u64,
    stale_acks: u64,
    handovers: u64,
    handovers_overdue: u64,
}

impl From<SubscriptionInfo> for SubscriptionView {
    fn from(info: SubscriptionInfo) -> Self {
        let c = info.counters;
        Self {
            subscription_id: info.subscription_id,
            mode: info.mode.to_string(),
            consumer_group: info.consumer_group,
            topic_patterns: info.patterns,
            ack_mode: info.ack_mode.to_string(),
            overflow: info.overflow.to_string(),
            epoch: info.epoch,
            active_member_id: info.active_member_id,
            active_metadata: info.active_metadata,
            stepping_down_member_id: info.stepping_down_member_id,
            queued_messages: info.queued_messages,
            queued_bytes: info.queued_bytes,
            in_flight: info.in_flight,
            max_delivery_attempts: info.max_delivery_attempts,
            dead_letter_topic: info.dead_letter_topic,
            expires_in_ms: info.expires_in.map(|d| d.as_millis() as u64),
            upstream: info.upstream.map(|u| UpstreamView {
                consumer: u.consumer,
                pending: u.pending,
                unacked: u.unacked,
                redelivered: u.redelivered,
            }),
            // Already in promotion order.
            members: info
                .members
                .into_iter()
                .map(|m| MemberView {
                    member_id: m.member_id,
                    position: m.position,
                    active: m.active,
                    epoch: m.epoch,
                    in_flight: m.in_flight,
                    max_in_flight: m.max_in_flight,
                    metadata: m.metadata,
                    priority: m.priority,
                })
                .collect(),
            counters: CountersView {
                enqueued: c.enqueued,
                delivered: c.delivered,
                redelivered: c.redelivered,
                acked: c.acked,
                nacked: c.nacked,
                released: c.released,
                dead_lettered: c.dead_lettered,
                dropped_max_attempts: c.dropped_max_attempts,
                rejected_full: c.rejected_full,
                dropped_full: c.dropped_full,
                dropped_overflow: c.dropped_overflow,
                promotions: c.promotions,
                stale_acks: c.stale_acks,
                handovers: c.handovers,
                handovers_overdue: c.handovers_overdue,
            },
        }
    }
}

impl From<BrokerCounters> for BrokerView {
    fn from(broker: BrokerCounters) -> Self {
        Self {
            published: broker.published,
            unrouted: broker.unrouted,
            rejected_publishes: broker.rejected_publishes,
            subscriptions_expired: broker.subscriptions_expired,
            messages_expired: broker.messages_expired,
            unconfirmed_acks: broker.unconfirmed_acks,
            subscriptions: broker.subscriptions,
            members: broker.members,
        }
    }
}

/// Turns an error into the operator's message: unreachable is said plainly.
fn explain(error: Error, url: &str) -> String {
    match error {
        Error::Unavailable(_) | Error::Transport(_) => {
            format!("cannot reach the broker at {url}: {error}")
        }
        error => error.to_string(),
    }
}

/// Every subscription, plus the broker's counters.
async fn list_all(client: &Client) -> Result<StatusView, Error> {
    // `Client::list` follows ListSubscriptions' pages to the end.
    let listing = client.list().await?;
    let mut subscriptions: Vec<SubscriptionView> =
        listing.subscriptions.into_iter().map(Into::into).collect();
    subscriptions.sort_by(|a, b| a.subscription_id.cmp(&b.subscription_id));
    Ok(StatusView {
        broker: Some(listing.broker.into()),
        storage: listing.storage.map(Into::into),
        subscriptions,
    })
}

pub async fn run(args: Status) -> Result<(), String> {
    let url = args.connection.server.clone();
    let client = args.connection.client().await?;
    if let (true, Some(id)) = (args.watch, &args.id) {
        return watch(&client, id, args.json)
            .await
            .map_err(|e| explain(e, &url));
    }
    let view = match &args.id {
        Some(id) => StatusView {
            broker: None,
            storage: None,
            subscriptions: vec![
                client
                    .describe(id)
                    .await
                    .map_err(|e| explain(e, &url))?
                    .into(),
            ],
        },
        None => list_all(&client).await.map_err(|e| explain(e, &url))?,
    };
    if args.json {
        let text = serde_json::to_string_pretty(&view).map_err(|e| e.to_string())?;
        println!("{text}");
    } else if args.id.is_some() {
        for subscription in &view.subscriptions {
            print!("{}", detail(subscription));
        }
    } else {
        print!("{}", overview(&view));
    }
    Ok(())
}

/// A leadership state as `status --watch --json` prints it, one object per line.
#[derive(Serialize)]
struct LeaderLine {
    subscription_id: String,
    /// 0 when no member is active.
    active_member_id: u64,
    epoch: u64,
    /// The active member's metadata; empty with none active or none declared.
    metadata: String,
    /// When the server learned of it, in milliseconds since the Unix epoch.
    since_unix_ms: u64,
}

/// `status ID --watch`: a line per leadership state, the current one first, until the
/// subscription is gone (docs/semantics.md#watching-leadership).
async fn watch(client: &Client, id: &str, json: bool) -> Result<(), Error> {
    let mut states = client.watch_leadership(id).await?;
    loop {
        let state = states.next().await?;
        let line = LeaderLine {
            subscription_id: id.to_string(),
            active_member_id: state.active_member_id.unwrap_or(0),
            epoch: state.epoch,
            metadata: state.metadata.clone(),
            since_unix_ms: state
                .since
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        };
        if json {
            println!("{}", serde_json::to_string(&line).unwrap_or_default());
        } else {
            match state.active_member_id {
                Some(member) if state.metadata.is_empty() => {
                    println!("{id}: member {member} active, epoch {}", state.epoch);
                }
                Some(member) => println!(
                    "{id}: member {member} active, epoch {}, metadata {:?}",
                    state.epoch, state.metadata
                ),
                None => println!("{id}: no active member (last epoch {})", state.epoch),
            }
        }
    }
}

/// Left-aligned columns, two spaces apart.
fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(c, cell)| format!("{cell:<width$}", width = widths[c]))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// Members in promotion order, the active one starred: `7*,9,12`.
fn member_list(s: &SubscriptionView) -> String {
    const SHOWN: usize = 5;
    let mut ids: Vec<String> = s
        .members
        .iter()
        .take(SHOWN)
        .map(|m| format!("{}{}", m.member_id, if m.active { "*" } else { "" }))
        .collect();
    if s.members.len() > SHOWN {
        ids.push(format!("+{}", s.members.len() - SHOWN));
    }
    if ids.is_empty() {
        match s.expires_in_ms {
            Some(ms) => format!("none (expires in {ms} ms)"),
            None => "none".into(),
        }
    } else {
        ids.join(",")
    }
}

fn overview(view: &StatusView) -> String {
    let mut out = String::new();
    if let Some(storage) = &view.storage {
        out.push_str(&storage.line());
    }
    if let Some(b) = &view.broker {
        out.push_str(&format!(
            "broker: {} subscriptions, {} members; published {} (unrouted {}, rejected {}); expired {} subscriptions ({} messages){}\n\n",
            b.subscriptions,
            b.members,
            b.published,
            b.unrouted,
            b.rejected_publishes,
            b.subscriptions_expired,
            b.messages_expired,
            // A gateway's acks JetStream did not confirm: shown only when there are some.
            if b.unconfirmed_acks > 0 {
                format!("; unconfirmed acks {}", b.unconfirmed_acks)
            } else {
                String::new()
            }
        ));
    }
    if view.subscriptions.is_empty() {
        out.push_str("no subscriptions\n");
        return out;
    }
    let mut rows = vec![
        [
            "SUBSCRIPTION",
            "MODE",
            "GROUP",
            "EPOCH",
            "MEMBERS (* active)",
            "QUEUED",
            "IN FLIGHT",
            "ACKED",
            "REDELIVERED",
            "PATTERNS",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for s in &view.subscriptions {
        rows.push(vec![
            s.subscription_id.clone(),
            s.mode.clone(),
            if s.consumer_group.is_empty() {
                "-".into()
            } else {
                s.consumer_group.clone()
            },
            s.epoch.to_string(),
            member_list(s),
            s.queued_messages.to_string(),
            s.in_flight.to_string(),
            s.counters.acked.to_string(),
            s.counters.redelivered.to_string(),
            s.topic_patterns.join(" "),
        ]);
    }
    out.push_str(&table(&rows));
    out
}

fn detail(s: &SubscriptionView) -> String {
    let mut out = format!(
        "subscription {} ({}{}) on {}\n",
        s.subscription_id,
        s.mode,
        if s.consumer_group.is_empty() {
            String::new()
        } else {
            format!(", group {}", s.consumer_group)
        },
        s.topic_patterns.join(" ")
    );
    out.push_str(&format!(
        "  epoch {}, active member {}, queued {} messages ({} bytes), in flight {}\n",
        s.epoch,
        match (s.active_member_id, s.active_metadata.as_str()) {
            (None, _) => "none".to_string(),
            (Some(m), "") => m.to_string(),
            // Quoted: the member's own text.
            (Some(m), metadata) => format!("{m} (metadata {metadata:?})"),
        },
        s.queued_messages,
        s.queued_bytes,
        s.in_flight
    ));
    if let Some(u) = &s.upstream {
        out.push_str(&format!(
            "  JetStream consumer {}: {} pending, {} unacked ({} redelivered)\n",
            u.consumer, u.pending, u.unacked, u.redelivered
        ));
    }
    out.push_str(&format!(
        "  ack mode {}, overflow {}",
        s.ack_mode, s.overflow
    ));
    if s.max_delivery_attempts > 0 {
        out.push_str(&format!(
            ", max delivery attempts {} then {}",
            s.max_delivery_attempts,
            s.dead_letter_topic
                .as_deref()
                .map_or("drop".into(), |t| format!("dead-letter to {t}"))
        ));
    }
    out.push('\n');
    if let Some(ms) = s.expires_in_ms {
        out.push_str(&format!("  no members: expires in {ms} ms\n"));
    }
    if !s.members.is_empty() {
        out.push_str("  members, in promotion order:\n");
        // The priority column only when some member has one (docs/semantics.md#priority).
        let ranked = s.members.iter().any(|m| m.priority > 0);
        let mut header = [
            "    POSITION",
            "MEMBER",
            "STATE",
            "EPOCH",
            "IN FLIGHT",
            "WINDOW",
            "METADATA",
        ]
        .map(String::from)
        .to_vec();
        if ranked {
            header.insert(2, "PRIORITY".into());
        }
        let mut rows = vec![header];
        for m in &s.members {
            let mut row = vec![
                format!("    {}", m.position),
                m.member_id.to_string(),
                match (m.active, s.stepping_down_member_id == Some(m.member_id)) {
                    (true, true) => "stepping down".into(),
                    (true, false) => "active".into(),
                    (false, _) => "standby".into(),
                },
                if m.active {
                    m.epoch.to_string()
                } else {
                    "-".into()
                },
                m.in_flight.to_string(),
                m.max_in_flight.to_string(),
                // Quoted: metadata is the member's own text, possibly with spaces or newlines.
                if m.metadata.is_empty() {
                    String::new()
                } else {
                    format!("{:?}", m.metadata)
                },
            ];
            if ranked {
                row.insert(2, m.priority.to_string());
            }
            rows.push(row);
        }
        out.push_str(&table(&rows));
    }
    let c = &s.counters;
    out.push_str(&format!(
        "  counters: enqueued {} delivered {} redelivered {} acked {} nacked {} released {} promotions {} stale_acks {}\n            dead_lettered {} dropped_max_attempts {} rejected_full {} dropped_full {} dropped_overflow {}\n",
        c.enqueued,
        c.delivered,
        c.redelivered,
        c.acked,
        c.nacked,
        c.released,
        c.promotions,
        c.stale_acks,
        c.dead_lettered,
        c.dropped_max_attempts,
        c.rejected_full,
        c.dropped_full,
        c.dropped_overflow
    ));
    if c.handovers > 0 {
        out.push_str(&format!(
            "            handovers {} (overdue {})\n",
            c.handovers, c.handovers_overdue
        ));
    }
    out
}
