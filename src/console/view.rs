//! What the console's pages show, built from one [`Snapshot`] (docs/operations.md#console):
//! pure functions, so what a page says is tested without a server or a browser. Every string
//! here is data for the page to show as text; nothing is markup.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{
    hub::{Snapshot, SubRecord},
    timeline::{Reign, as_string, opt_as_string},
};
use crate::{cluster::values::SubValue, core::Mode};

/// Rows on one page of the overview.
pub const PAGE_SIZE: usize = 50;

/// The longest search the overview takes (longer is cut).
pub const MAX_QUERY_CHARS: usize = 200;

/// A memory pool: used and limit, in bytes.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Pool {
    pub used: u64,
    pub limit: u64,
}

/// Broker-wide figures.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BrokerFigures {
    pub subscriptions: usize,
    pub connections: u64,
    pub members: u64,
    pub publish_rate: f64,
    pub memory: Pool,
    pub drop_oldest_memory: Pool,
    pub storage: String,
}

/// Cluster mode: the gateway answering.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct GatewayFigures {
    #[serde(serialize_with = "as_string")]
    pub id: u64,
    pub nats: String,
    pub stream: String,
    pub gateways: usize,
    /// Whether its copy of the cluster's lines is current (it holds its lease).
    pub current: bool,
}

/// A singleton's active member.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Active {
    #[serde(serialize_with = "as_string")]
    pub member: u64,
    #[serde(serialize_with = "as_string")]
    pub epoch: u64,
    pub since_ms: Option<u64>,
    pub metadata: String,
    #[serde(serialize_with = "opt_as_string")]
    pub gateway: Option<u64>,
}

/// One subscription in the overview.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Row {
    pub id: String,
    pub mode: &'static str,
    pub group: String,
    pub patterns: Vec<String>,
    pub members: usize,
    pub active: Option<Active>,
    pub depth: u64,
    pub in_flight: u64,
    pub publish_rate: f64,
    pub ack_rate: f64,
    pub redelivered: u64,
    pub dead_lettered: u64,
    pub dropped: u64,
    pub refused: u64,
}

/// The overview page.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Overview {
    pub deployment: &'static str,
    pub gateway: Option<GatewayFigures>,
    pub read_only: bool,
    pub now_ms: u64,
    pub broker: BrokerFigures,
    pub q: String,
    pub page: usize,
    pub pages: usize,
    pub total: usize,
    pub subscriptions: Vec<Row>,
}

/// A member in a subscription's line.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LineMember {
    #[serde(serialize_with = "as_string")]
    pub member: u64,
    pub state: &'static str,
    pub position: u32,
    pub priority: u32,
    pub metadata: String,
    pub joined_ms: Option<u64>,
    pub in_flight: Option<u32>,
    #[serde(serialize_with = "opt_as_string")]
    pub gateway: Option<u64>,
    pub here: bool,
}

/// Rates over the last minutes, oldest first.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RateSeries {
    pub interval_ms: u64,
    pub published: Vec<f32>,
    pub acked: Vec<f32>,
}

/// A subscription's page.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Detail {
    pub now_ms: u64,
    pub read_only: bool,
    pub deployment: &'static str,
    pub subscription: Row,
    pub line: Vec<LineMember>,
    pub timeline: Vec<Reign>,
    pub rates: RateSeries,
}

fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Broadcast => "broadcast",
        Mode::Queue => "queue",
        Mode::Singleton => "singleton",
    }
}

/// The active member of a subscription: from the cluster's line when there is one, else from
/// the broker's own view.
pub fn active(record: &SubRecord, since_ms: Option<u64>) -> Option<Active> {
    let view = &record.description.view;
    if view.spec.mode != Mode::Singleton {
        return None;
    }
    if let Some(line) = &record.line {
        let uid = line.active?;
        return Some(Active {
            member: uid.member,
            epoch: line.epoch,
            since_ms,
            metadata: line.meta_of(uid).to_string(),
            gateway: Some(uid.gateway.0),
        });
    }
    let member = view.members.iter().find(|m| m.active)?;
    Some(Active {
        member: member.member_id,
        epoch: member.epoch,
        since_ms,
        metadata: view
            .metadata
            .get(&member.member_id)
            .map(|m| m.to_string())
            .unwrap_or_default(),
        gateway: None,
    })
}

/// One overview row; `since_ms`: when its leader began, as its timeline has it.
pub fn row(record: &SubRecord, since_ms: Option<u64>) -> Row {
    let rates = record.rates;
    let d = &record.description;
    let view = &d.view;
    let c = &record.activity.counters;
    let upstream_depth = d.upstream.as_ref().map_or(0, |u| u.pending);
    let members = match &record.line {
        Some(line) => line.line.len(),
        None => view.members.len(),
    };
    Row {
        id: view.subscription_id.to_string(),
        mode: mode_name(view.spec.mode),
        group: view.spec.consumer_group.clone(),
        patterns: view.spec.patterns.iter().map(ToString::to_string).collect(),
        members,
        active: active(record, since_ms),
        depth: record.activity.queued_messages + upstream_depth,
        in_flight: record.activity.in_flight + d.upstream.as_ref().map_or(0, |u| u.unacked),
        publish_rate: rates.0,
        ack_rate: rates.1,
        redelivered: c.redelivered + d.upstream.as_ref().map_or(0, |u| u.redelivered),
        dead_lettered: c.dead_lettered,
        dropped: c.dropped_max_attempts + c.dropped_full + c.dropped_overflow,
        refused: c.rejected_full,
    }
}

/// Whether `record` matches the search `q` (lowercase): its id, group, patterns or active
/// member's metadata hold it.
pub fn matches(record: &SubRecord, q: &str) -> bool {
    if q.is_empty() {
        return true;
    }
    let view = &record.description.view;
    let has = |text: &str| text.to_lowercase().contains(q);
    has(&view.subscription_id)
        || has(&view.spec.consumer_group)
        || view.spec.patterns.iter().any(|p| has(&p.to_string()))
        || active(record, None).is_some_and(|a| has(&a.metadata))
}

/// The search as the overview uses it: trimmed, lowercase, at most [`MAX_QUERY_CHARS`].
pub fn normalize_query(q: &str) -> String {
    q.trim()
        .chars()
        .take(MAX_QUERY_CHARS)
        .collect::<String>()
        .to_lowercase()
}

/// The overview's page `page` (1-based; past the last: the last) of the subscriptions
/// matching `q`, each row given its leader's start by `since`.
pub fn overview(
    snapshot: &Snapshot,
    q: &str,
    page: usize,
    read_only: bool,
    mut since: impl FnMut(&str) -> Option<u64>,
) -> Overview {
    let q = normalize_query(q);
    let matching: Vec<&SubRecord> = snapshot.subs.iter().filter(|r| matches(r, &q)).collect();
    let total = matching.len();
    let pages = total.div_ceil(PAGE_SIZE).max(1);
    let page = page.clamp(1, pages);
    let subscriptions = matching
        .into_iter()
        .skip((page - 1) * PAGE_SIZE)
        .take(PAGE_SIZE)
        .map(|record| row(record, since(&record.description.view.subscription_id)))
        .collect();
    Overview {
        deployment: snapshot.deployment(),
        gateway: snapshot.gateway.clone(),
        read_only,
        now_ms: snapshot.now_ms,
        broker: snapshot.broker.clone(),
        q,
        page,
        pages,
        total,
        subscriptions,
    }
}

/// A subscription's line, active member first, then its standbys in order (a SINGLETON), or
/// its members in join order.
pub fn line(record: &SubRecord, this_gateway: Option<u64>) -> Vec<LineMember> {
    let view = &record.description.view;
    let local: BTreeMap<u64, &crate::core::MemberInfo> =
        view.members.iter().map(|m| (m.member_id, m)).collect();
    if let Some(cluster) = &record.line {
        return cluster_line(cluster, view, &local, this_gateway);
    }
    let singleton = view.spec.mode == Mode::Singleton;
    let mut members: Vec<&crate::core::MemberInfo> = view.members.iter().collect();
    if singleton {
        members.sort_by_key(|m| (!m.active, m.position));
    }
    let mut next_standby = 0;
    members
        .into_iter()
        .map(|m| {
            let (state, position) = if !singleton {
                ("member", 0)
            } else if m.active {
                let stepping = view.stepping_down == Some(m.member_id);
                (if stepping { "stepping down" } else { "active" }, 0)
            } else {
                next_standby += 1;
                ("standby", next_standby)
            };
            LineMember {
                member: m.member_id,
                state,
                position,
                priority: m.priority,
                metadata: view
                    .metadata
                    .get(&m.member_id)
                    .map(|s| s.to_string())
                    .unwrap_or_default(),
                joined_ms: view.joined_unix_ms.get(&m.member_id).copied(),
                in_flight: Some(m.in_flight),
                gateway: None,
                here: true,
            }
        })
        .collect()
}

fn cluster_line(
    cluster: &SubValue,
    view: &crate::broker::SubscriptionView,
    local: &BTreeMap<u64, &crate::core::MemberInfo>,
    this_gateway: Option<u64>,
) -> Vec<LineMember> {
    let mut next_standby = 0;
    cluster
        .line
        .iter()
        .map(|uid| {
            let here = Some(uid.gateway.0) == this_gateway;
            let mine = here.then(|| local.get(&uid.member)).flatten();
            let (state, position) = if cluster.active == Some(*uid) {
                let stepping = here && view.stepping_down == Some(uid.member);
                (if stepping { "stepping down" } else { "active" }, 0)
            } else {
                next_standby += 1;
                ("standby", next_standby)
            };
            LineMember {
                member: uid.member,
                state,
                position,
                priority: cluster.priority_of(*uid),
                metadata: cluster.meta_of(*uid).to_string(),
                joined_ms: if here {
                    view.joined_unix_ms.get(&uid.member).copied()
                } else {
                    None
                },
                in_flight: mine.map(|m| m.in_flight),
                gateway: Some(uid.gateway.0),
                here,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{
        broker::{Description, SubscriptionView},
        cluster::values::{GatewayId, MemberUid},
        core::{MemberInfo, SubscriptionSpec},
    };

    fn record(id: &str, mode: Mode, members: Vec<MemberInfo>) -> SubRecord {
        let spec = SubscriptionSpec {
            mode,
            consumer_group: "workers".into(),
            patterns: vec![crate::core::Pattern::parse("jobs.>").unwrap()],
            max_delivery_attempts: 0,
            dead_letter_topic: None,
            ack_mode: Default::default(),
            overflow: Default::default(),
        };
        let metadata = members
            .iter()
            .map(|m| {
                (
                    m.member_id,
                    Arc::from(format!("<img src=x onerror=alert({})>", m.member_id)),
                )
            })
            .collect();
        SubRecord::new(Description::from(SubscriptionView {
            subscription_id: id.into(),
            spec,
            epoch: members.iter().map(|m| m.epoch).max().unwrap_or(0),
            members,
            queued_messages: 4,
            queued_bytes: 40,
            in_flight: 1,
            counters: Default::default(),
            expires_in: None,
            metadata,
            stepping_down: None,
            joined_unix_ms: [(7, 1_000)].into_iter().collect(),
        }))
    }

    fn member(id: u64, active: bool, epoch: u64, position: u32, priority: u32) -> MemberInfo {
        MemberInfo {
            member_id: id,
            active,
            epoch,
            in_flight: u32::from(active),
            max_in_flight: 1,
            position,
            priority,
        }
    }

    #[test]
    fn an_embedded_singletons_line_puts_the_active_member_first_then_its_standbys_in_order() {
        let r = record(
            "jobs",
            Mode::Singleton,
            vec![
                member(7, false, 0, 2, 0),
                member(8, true, 3, 0, 0),
                member(9, false, 0, 1, 0),
            ],
        );
        let line = line(&r, None);
        let got: Vec<_> = line
            .iter()
            .map(|m| (m.member, m.state, m.position))
            .collect();
        assert_eq!(
            got,
            vec![(8, "active", 0), (9, "standby", 1), (7, "standby", 2)]
        );
        assert_eq!(line[2].joined_ms, Some(1_000));
        let row = row(&r, Some(99));
        let active = row.active.unwrap();
        assert_eq!(
            (active.member, active.epoch, active.since_ms),
            (8, 3, Some(99))
        );
        // Hostile metadata stays the text it was: escaping is the page's job (textContent).
        assert_eq!(active.metadata, "<img src=x onerror=alert(8)>");
        assert_eq!(row.depth, 4);
    }

    #[test]
    fn a_cluster_line_names_each_members_gateway_and_which_are_here() {
        let mut r = record("jobs", Mode::Singleton, vec![member(7, false, 0, 0, 0)]);
        let a = MemberUid {
            gateway: GatewayId(100),
            member: 5,
        };
        let b = MemberUid {
            gateway: GatewayId(200),
            member: 7,
        };
        r.line = Some(Arc::new(SubValue {
            line: vec![a, b],
            active: Some(a),
            epoch: 12,
            meta: vec![(a, "host=a".into())],
            prio: vec![(b, 2)],
            ..SubValue::default()
        }));
        let line = line(&r, Some(200));
        assert_eq!(line[0].gateway, Some(100));
        assert!(!line[0].here && line[1].here);
        assert_eq!(
            (line[0].state, line[1].state, line[1].position),
            ("active", "standby", 1)
        );
        assert_eq!(line[1].priority, 2);
        assert_eq!(line[1].joined_ms, Some(1_000));
        let active = active(&r, None).unwrap();
        assert_eq!(
            (active.member, active.epoch, active.gateway),
            (5, 12, Some(100))
        );
        assert_eq!(active.metadata, "host=a");
    }

    #[test]
    fn search_finds_by_id_group_pattern_or_active_metadata_and_pages_past_the_end_show_the_last() {
        let subs: Vec<SubRecord> = (0..120)
            .map(|i| record(&format!("sub-{i:03}"), Mode::Queue, vec![]))
            .collect();
        let snapshot = Snapshot::for_tests(subs);
        let all = overview(&snapshot, "", 9, false, |_| None);
        assert_eq!((all.total, all.pages, all.page), (120, 3, 3));
        assert_eq!(all.subscriptions.len(), 20);
        assert_eq!(all.subscriptions[0].id, "sub-100");
        let some = overview(&snapshot, "  SUB-01", 1, false, |_| None);
        assert_eq!(some.total, 10);
        assert_eq!(
            overview(&snapshot, "WORKERS", 1, false, |_| None).total,
            120
        );
        assert_eq!(overview(&snapshot, "jobs.>", 1, false, |_| None).total, 120);
        assert_eq!(overview(&snapshot, "nothing", 1, false, |_| None).total, 0);
        let long = "x".repeat(10_000);
        assert_eq!(normalize_query(&long).len(), MAX_QUERY_CHARS);
    }

    #[test]
    fn member_ids_and_epochs_are_strings_in_json() {
        let r = record(
            "jobs",
            Mode::Singleton,
            vec![member(u64::MAX, true, u64::MAX, 0, 0)],
        );
        let json = serde_json::to_string(&row(&r, None)).unwrap();
        assert!(
            json.contains("\"member\":\"18446744073709551615\"")
                && json.contains("\"epoch\":\"18446744073709551615\""),
            "{json}"
        );
    }
}
