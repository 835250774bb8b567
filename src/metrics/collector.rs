//! Reads the broker's counters and per-subscription views on each scrape.

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
};

use std::sync::Arc;

use crate::{
    broker::{Broker, SubscriptionView},
    transport::TransportStats,
};

/// The scrape-time half of the metrics: everything [`Broker::list`] knows, and the transport's
/// own counters (connections open, as the connection limit counts them).
#[derive(Debug)]
pub(super) struct BrokerCollector {
    broker: Broker,
    transport: Arc<TransportStats>,
}

impl BrokerCollector {
    pub(super) fn new(broker: Broker, transport: Arc<TransportStats>) -> Self {
        Self { broker, transport }
    }
}

type Field = fn(&SubscriptionView) -> u64;

/// Per-subscription gauges: name (after `tinybroker_subscription_`), help, value.
const SUBSCRIPTION_GAUGES: [(&str, &str, Field); 5] = [
    ("queued_messages", "Messages waiting in the queue.", |v| {
        v.queued_messages
    }),
    ("queued_bytes", "Bytes waiting in the queue.", |v| {
        v.queued_bytes
    }),
    ("in_flight", "Messages delivered and not yet acked.", |v| {
        v.in_flight
    }),
    ("members", "Member streams open on the subscription.", |v| {
        v.members.len() as u64
    }),
    (
        "active_epoch",
        "Highest epoch among the active members (0 with none active).",
        |v| {
            v.members
                .iter()
                .filter(|m| m.active)
                .map(|m| m.epoch)
                .max()
                .unwrap_or(0)
        },
    ),
];

/// Per-subscription counters (`_total` is appended by the encoder).
const SUBSCRIPTION_COUNTERS: [(&str, &str, Field); 12] = [
    ("enqueued", "Messages queued.", |v| v.counters.enqueued),
    ("delivered", "Deliveries, first or repeated.", |v| {
        v.counters.delivered
    }),
    ("redelivered", "Deliveries with attempt > 1.", |v| {
        v.counters.redelivered
    }),
    ("acked", "Messages released by an ack.", |v| {
        v.counters.acked
    }),
    ("nacked", "Nacks accepted.", |v| v.counters.nacked),
    (
        "released",
        "Releases accepted: messages given back unworked (docs/semantics.md#releases).",
        |v| v.counters.released,
    ),
    (
        "dead_lettered",
        "Poisoned messages sent to the dead-letter topic.",
        |v| v.counters.dead_lettered,
    ),
    (
        "rejected_publishes",
        "Publishes refused because this subscription was full.",
        |v| v.counters.rejected_full,
    ),
    ("promotions", "Standbys promoted to active.", |v| {
        v.counters.promotions
    }),
    (
        "stale_acks",
        "Fenced acks or nacks refused because the member no longer held the message.",
        |v| v.counters.stale_acks,
    ),
    (
        "handovers",
        "Active members that stepped down to a successor (a hand-over or a takeover by priority).",
        |v| v.counters.handovers,
    ),
    (
        "handovers_overdue",
        "Of those, the ones whose hand-over timeout passed with messages in flight, which went to the successor.",
        |v| v.counters.handovers_overdue,
    ),
];

impl Collector for BrokerCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let (views, stats) = self.broker.list();

        for (name, help, value) in [
            (
                "tinybroker_published",
                "Messages published (dead letters included).",
                stats.published,
            ),
            (
                "tinybroker_unrouted",
                "Published messages that matched no subscription.",
                stats.unrouted,
            ),
            (
                "tinybroker_rejected_publishes",
                "Publishes refused because a matching queue was full.",
                stats.rejected_publishes,
            ),
            (
                "tinybroker_subscriptions_expired",
                "Subscriptions expired after their idle timeout.",
                stats.subscriptions_expired,
            ),
            (
                "tinybroker_messages_expired",
                "Messages held by subscriptions when they expired.",
                stats.messages_expired,
            ),
            (
                "tinybroker_subscriptions_deleted",
                "Subscriptions removed by DeleteSubscription.",
                stats.subscriptions_deleted,
            ),
            (
                "tinybroker_messages_deleted",
                "Messages held by subscriptions when they were deleted.",
                stats.messages_deleted,
            ),
            (
                "tinybroker_unconfirmed_acks",
                "Cluster mode: acks JetStream did not confirm within the consumer's ack wait (their messages may come again).",
                stats.unconfirmed_acks,
            ),
            (
                "tinybroker_gateway_lease_lapses",
                "Cluster mode: times this gateway's lease lapsed unrenewed (its singleton members got nothing until it was renewed or they were ended).",
                stats.lease_lapses,
            ),
            (
                "tinybroker_gateway_lease_lapses_renewed",
                "Cluster mode: lapses of this gateway's lease that a renewal ended, its singleton members kept.",
                stats.lease_lapses_renewed,
            ),
        ] {
            let counter = ConstCounter::new(value);
            counter.encode(encoder.encode_descriptor(name, help, None, MetricType::Counter)?)?;
        }
        for (name, help, value) in [
            (
                "tinybroker_subscriptions",
                "Live subscriptions.",
                stats.subscriptions,
            ),
            (
                "tinybroker_open_member_streams",
                "Member streams open across all subscriptions.",
                stats.members,
            ),
            (
                "tinybroker_open_connections",
                "Client connections now open (admitted under max_connections).",
                self.transport.snapshot().connections_open,
            ),
            (
                "tinybroker_memory_accounted_bytes",
                "Bytes accounted against max_memory_bytes.",
                stats.memory_accounted_bytes,
            ),
            (
                "tinybroker_memory_drop_oldest_bytes",
                "The part of them drop-oldest subscriptions' messages hold (at most the drop-oldest share of max_memory_bytes).",
                stats.memory_drop_oldest_bytes,
            ),
        ] {
            let gauge = ConstGauge::new(saturating_i64(value));
            gauge.encode(encoder.encode_descriptor(name, help, None, MetricType::Gauge)?)?;
        }

        for (name, help, field) in SUBSCRIPTION_GAUGES {
            let name = format!("tinybroker_subscription_{name}");
            let mut family = encoder.encode_descriptor(&name, help, None, MetricType::Gauge)?;
            for view in &views {
                let labels = [("subscription", &*view.subscription_id)];
                ConstGauge::new(saturating_i64(field(view)))
                    .encode(family.encode_family(&labels)?)?;
            }
        }
        for (name, help, field) in SUBSCRIPTION_COUNTERS {
            let name = format!("tinybroker_subscription_{name}");
            let mut family = encoder.encode_descriptor(&name, help, None, MetricType::Counter)?;
            for view in &views {
                let labels = [("subscription", &*view.subscription_id)];
                ConstCounter::new(field(view)).encode(family.encode_family(&labels)?)?;
            }
        }
        let mut dropped = encoder.encode_descriptor(
            "tinybroker_subscription_dropped",
            "Messages that left the subscription unacked, by reason.",
            None,
            MetricType::Counter,
        )?;
        for view in &views {
            for (reason, value) in [
                ("max_delivery_attempts", view.counters.dropped_max_attempts),
                ("queue_full", view.counters.dropped_full),
                ("overflow", view.counters.dropped_overflow),
            ] {
                let labels = [("subscription", &*view.subscription_id), ("reason", reason)];
                ConstCounter::new(value).encode(dropped.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

fn saturating_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}
