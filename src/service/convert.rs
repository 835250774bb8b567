//! Domain values as protobuf: a subscription's [`Description`] as `SubscriptionInfo`, the
//! broker's and the transport's counters as `BrokerCounters`.

use prost_types::Timestamp;

use crate::{
    broker::{BrokerStats, Description, UpstreamBacklog},
    core::{AckMode, Mode, Overflow},
    pb,
    transport::TransportSnapshot,
};

fn mode_to_pb(mode: Mode) -> pb::DeliveryMode {
    match mode {
        Mode::Broadcast => pb::DeliveryMode::Broadcast,
        Mode::Queue => pb::DeliveryMode::Queue,
        Mode::Singleton => pb::DeliveryMode::Singleton,
    }
}

pub(super) fn timestamp(unix_millis: u64) -> Timestamp {
    Timestamp {
        seconds: (unix_millis / 1000) as i64,
        nanos: ((unix_millis % 1000) * 1_000_000) as i32,
    }
}

/// A subscription's description as `SubscriptionInfo`.
pub(super) fn info(described: Description) -> pb::SubscriptionInfo {
    let Description {
        view,
        upstream,
        active_member,
        active_metadata,
    } = described;
    let c = view.counters;
    let active_member_id = match view.spec.mode {
        Mode::Singleton => active_member.unwrap_or_else(|| {
            view.members
                .iter()
                .find(|m| m.active)
                .map_or(0, |m| m.member_id)
        }),
        _ => 0,
    };
    let metadata_of = |member| {
        view.metadata
            .get(&member)
            .map_or_else(String::new, |m| m.to_string())
    };
    let active_metadata = match active_metadata {
        Some(metadata) => metadata.to_string(),
        None if active_member_id != 0 => metadata_of(active_member_id),
        None => String::new(),
    };
    // In line order (a stable sort: members of one place, at a gateway, in join order).
    let mut in_line: Vec<&crate::core::MemberInfo> = view.members.iter().collect();
    in_line.sort_by_key(|m| m.position);
    pb::SubscriptionInfo {
        stepping_down_member_id: view.stepping_down.unwrap_or(0),
        subscription_id: view.subscription_id.to_string(),
        mode: mode_to_pb(view.spec.mode).into(),
        consumer_group: view.spec.consumer_group,
        topic_patterns: view.spec.patterns.iter().map(|p| p.to_string()).collect(),
        members: in_line
            .into_iter()
            .map(|m| pb::MemberInfo {
                member_id: m.member_id,
                active: m.active,
                epoch: m.epoch,
                in_flight: m.in_flight,
                max_in_flight: m.max_in_flight,
                position: m.position,
                metadata: metadata_of(m.member_id),
                priority: m.priority,
            })
            .collect(),
        active_member_id,
        active_metadata,
        epoch: view.epoch,
        queued_messages: view.queued_messages,
        queued_bytes: view.queued_bytes,
        in_flight: view.in_flight,
        counters: Some(pb::SubscriptionCounters {
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
            promotions: c.promotions,
            stale_acks: c.stale_acks,
            dropped_overflow: c.dropped_overflow,
            handovers: c.handovers,
            handovers_overdue: c.handovers_overdue,
        }),
        max_delivery_attempts: view.spec.max_delivery_attempts,
        dead_letter_topic: view
            .spec
            .dead_letter_topic
            .map(|t| t.to_string())
            .unwrap_or_default(),
        expires_in_ms: view.expires_in.map(|d| d.as_millis() as u64),
        upstream: upstream.map(backlog),
        ack_mode: match view.spec.ack_mode {
            AckMode::Explicit => pb::AckMode::Explicit,
            AckMode::None => pb::AckMode::None,
        }
        .into(),
        overflow: match view.spec.overflow {
            Overflow::RejectPublish => pb::OverflowPolicy::RejectPublish,
            Overflow::DropOldest => pb::OverflowPolicy::DropOldest,
        }
        .into(),
    }
}

/// The broker's and the transport's counters as `BrokerCounters`.
pub(super) fn storage(storage: crate::backend::Storage) -> pb::Storage {
    match storage {
        crate::backend::Storage::Memory => pb::Storage {
            kind: "memory".into(),
            ..Default::default()
        },
        crate::backend::Storage::JetStream {
            stream,
            storage,
            replicas,
            max_consumers,
        } => pb::Storage {
            kind: "jetstream".into(),
            stream,
            stream_storage: storage.into(),
            replicas: u32::try_from(replicas).unwrap_or(u32::MAX),
            max_consumers: max_consumers.max(0),
        },
    }
}

pub(super) fn stats(stats: BrokerStats, transport: TransportSnapshot) -> pb::BrokerCounters {
    pb::BrokerCounters {
        connections_open: transport.connections_open,
        connections_refused: transport.connections_refused,
        handshake_timeouts: transport.handshake_timeouts,
        requests_over_budget: transport.requests_over_budget,
        request_timeouts: transport.request_timeouts,
        published: stats.published,
        unrouted: stats.unrouted,
        rejected_publishes: stats.rejected_publishes,
        subscriptions_expired: stats.subscriptions_expired,
        messages_expired: stats.messages_expired,
        subscriptions_deleted: stats.subscriptions_deleted,
        messages_deleted: stats.messages_deleted,
        unconfirmed_acks: stats.unconfirmed_acks,
        subscriptions: stats.subscriptions,
        members: stats.members,
        memory_accounted_bytes: stats.memory_accounted_bytes,
        max_memory_bytes: stats.max_memory_bytes,
    }
}

fn backlog(upstream: UpstreamBacklog) -> pb::UpstreamBacklog {
    pb::UpstreamBacklog {
        consumer: upstream.consumer,
        pending: upstream.pending,
        unacked: upstream.unacked,
        redelivered: upstream.redelivered,
    }
}
