//! Prometheus metrics: a registry the `/metrics` endpoint encodes on each scrape.
//!
//! Counters and depths are not kept here: a [`collector`] reads them from the broker's
//! inspection views on each scrape, so the hot path pays nothing for them and an expired
//! subscription's series vanish with it. What the views cannot say is measured where it
//! happens: the two latency histograms (through the broker's [`Timings`] hook). Open connections
//! come from the server's transport counters, which the connection limit already keeps.

mod collector;
mod http;

use std::{sync::Arc, time::Duration};

use prometheus_client::{
    metrics::histogram::Histogram,
    registry::{Registry, Unit},
};

use crate::{
    broker::{Broker, Timings},
    transport::TransportStats,
};

/// Failover is a lock and a few channel sends: expect well under a millisecond, and make
/// a slow one (lock contention, a starved runtime) stand out up to a second.
const FAILOVER_BUCKETS: [f64; 12] = [
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.01, 0.05, 0.25,
    1.0,
];

/// Publish-to-ack spans the consumer's processing and any queueing: milliseconds to minutes.
/// The broker stamps publishes in whole milliseconds, so nothing finer is measurable.
const PUBLISH_TO_ACK_BUCKETS: [f64; 14] = [
    0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0, 300.0,
];

/// The broker's metrics; cheap to clone, every clone is the same registry.
#[derive(Clone, Debug)]
pub struct Metrics {
    registry: Arc<Registry>,
}

/// The two histograms, fed by the broker as events happen.
#[derive(Debug)]
struct Histograms {
    failover: Histogram,
    publish_to_ack: Histogram,
}

impl Timings for Histograms {
    fn failover(&self, took: Duration) {
        self.failover.observe(took.as_secs_f64());
    }

    fn publish_to_ack(&self, took: Duration) {
        self.publish_to_ack.observe(took.as_secs_f64());
    }
}

impl Metrics {
    /// Metrics for `broker` and its server's `transport` counters
    /// ([`Server::transport_stats`](crate::server::Server::transport_stats)): registers the
    /// scrape-time collector and installs the histograms as the broker's [`Timings`] sink.
    pub fn new(broker: &Broker, transport: Arc<TransportStats>) -> Self {
        let mut registry = Registry::default();
        let histograms = Arc::new(Histograms {
            failover: Histogram::new(FAILOVER_BUCKETS),
            publish_to_ack: Histogram::new(PUBLISH_TO_ACK_BUCKETS),
        });
        registry.register_with_unit(
            "tinybroker_failover",
            "Time from an active member's stream end to the next member's confirmation being sent",
            Unit::Seconds,
            histograms.failover.clone(),
        );
        registry.register_with_unit(
            "tinybroker_publish_to_ack",
            "Time from a message's publish to the ack that released it, per acked delivery",
            Unit::Seconds,
            histograms.publish_to_ack.clone(),
        );
        registry.register_collector(Box::new(collector::BrokerCollector::new(
            broker.clone(),
            transport,
        )));
        broker.set_timings(histograms);
        Self {
            registry: Arc::new(registry),
        }
    }

    /// The metrics in the Prometheus text exposition format (version 0.0.4).
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail; an encoder error would be a bug in a collector,
        // and a partial page is still better than none for the operator reading it.
        if let Err(error) =
            prometheus_client::encoding::prometheus_text::encode(&mut text, &self.registry)
        {
            tracing::error!(%error, "encoding metrics failed");
        }
        text
    }

    /// Serves `GET /metrics` on `listener` until `shutdown` completes.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()>,
    ) {
        http::serve(self, listener, shutdown).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{
        broker::Outbound,
        clock::VirtualClock,
        core::{Draft, Limits, MemberOptions, Mode, OpenRequest, Pattern, SubscriptionSpec, Topic},
    };

    fn singleton(id: &str) -> OpenRequest {
        OpenRequest {
            subscription_id: id.into(),
            spec: SubscriptionSpec {
                mode: Mode::Singleton,
                consumer_group: "g".into(),
                patterns: vec![Pattern::parse("a.*").unwrap()],
                max_delivery_attempts: 0,
                dead_letter_topic: None,
                ack_mode: Default::default(),
                overflow: Default::default(),
            },
            member: MemberOptions::default(),
            metadata: std::sync::Arc::from(""),
        }
    }

    fn draft(topic: &str) -> Draft {
        Draft::new(
            Topic::parse(topic).unwrap(),
            bytes::Bytes::from_static(b"x"),
            Default::default(),
            &Limits::default(),
        )
        .unwrap()
    }

    fn sample<'a>(page: &'a str, series: &str) -> &'a str {
        page.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {series} in\n{page}"))
    }

    // Publish-to-ack latency is measured on the broker's clock (here a paused virtual one, so
    // the latency is exact), and each promotion is one failover observation.
    #[tokio::test(start_paused = true)]
    async fn histograms_use_the_broker_clock() {
        let broker = Broker::new(
            Limits::default(),
            Arc::new(VirtualClock::new(1_700_000_000_000)),
        );
        let metrics = Metrics::new(&broker, Arc::default());
        let mut active = broker.open(&singleton("s"), None).unwrap();
        let _standby = broker.open(&singleton("s"), None).unwrap();
        let id = broker.publish(draft("a.b")).unwrap().system_id;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(matches!(active.try_next(), Some(Outbound::Confirm { .. })));
        assert!(matches!(active.try_next(), Some(Outbound::Message { .. })));
        broker
            .ack("s", crate::broker::Fence::Member(active.member_id()), id)
            .unwrap();
        let page = metrics.encode();
        assert_eq!(
            sample(&page, "tinybroker_publish_to_ack_seconds_sum"),
            "1.5"
        );
        assert_eq!(
            sample(&page, r#"tinybroker_publish_to_ack_seconds_bucket{le="1"}"#),
            "0"
        );
        assert_eq!(
            sample(
                &page,
                r#"tinybroker_publish_to_ack_seconds_bucket{le="2.5"}"#
            ),
            "1"
        );
        assert_eq!(sample(&page, "tinybroker_failover_seconds_count"), "0");

        drop(active);
        let page = metrics.encode();
        assert_eq!(sample(&page, "tinybroker_failover_seconds_count"), "1");
        assert_eq!(
            sample(
                &page,
                r#"tinybroker_subscription_promotions_total{subscription="s"}"#
            ),
            "1"
        );
        assert_eq!(
            sample(
                &page,
                r#"tinybroker_subscription_acked_total{subscription="s"}"#
            ),
            "1"
        );
    }

    // A second sink cannot replace the first: the histograms stay the ones the registry shows.
    #[test]
    fn timings_are_installed_once() {
        let broker = Broker::new(Limits::default(), Arc::new(VirtualClock::new(0)));
        let _metrics = Metrics::new(&broker, Arc::default());
        let other = Arc::new(Histograms {
            failover: Histogram::new(FAILOVER_BUCKETS),
            publish_to_ack: Histogram::new(PUBLISH_TO_ACK_BUCKETS),
        });
        assert!(!broker.set_timings(other));
    }
}
