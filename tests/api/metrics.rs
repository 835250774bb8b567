//! The Prometheus endpoint, scraped while publishing, acking, nacking and failing over: every
//! counter moves as the inspection API says, the histograms count each failover and each ack,
//! and an expired subscription's series disappear (README "Operations").

use std::{collections::BTreeMap, net::SocketAddr, time::Duration};

use tinybroker::{
    core::Limits,
    metrics::Metrics,
    pb::broker_client::BrokerClient,
    server::{Server, ServerConfig},
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    sync::oneshot,
};
use tonic::{Code, transport::Channel};

use crate::{
    binary,
    harness::{Client, singleton, within},
};

/// A server on port 0 with its metrics on another port-0 listener.
struct MeteredServer {
    addr: SocketAddr,
    metrics_addr: SocketAddr,
    _stop: oneshot::Sender<()>,
}

impl MeteredServer {
    async fn start(config: ServerConfig) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let metrics_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let metrics_addr = metrics_listener.local_addr().unwrap();
        let server = Server::new(config);
        let metrics = Metrics::new(server.broker(), server.transport_stats());
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(
            metrics
                .clone()
                .serve(metrics_listener, std::future::pending()),
        );
        let incoming = tinybroker::server::tcp_incoming(listener);
        tokio::spawn(server.run(incoming, async {
            let _ = stopped.await;
        }));
        Self {
            addr,
            metrics_addr,
            _stop: stop,
        }
    }

    async fn client(&self) -> Client {
        let channel = Channel::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect()
            .await
            .unwrap();
        Client::of(BrokerClient::new(channel))
    }

    async fn scrape(&self) -> Scrape {
        scrape(self.metrics_addr).await
    }

    /// Scrapes until `ready` holds (the server notices a closed connection, or an idle
    /// subscription expires, on its own time), failing after the event timeout.
    async fn scrape_until(&self, ready: impl Fn(&Scrape) -> bool) -> Scrape {
        within(async {
            loop {
                let scrape = self.scrape().await;
                if ready(&scrape) {
                    return scrape;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
    }
}

/// One scrape: the raw page and its samples by `name{labels}`.
struct Scrape {
    page: String,
    samples: BTreeMap<String, f64>,
}

impl Scrape {
    /// The sample's value, failing the test if the page lacks it.
    fn get(&self, series: &str) -> f64 {
        *self
            .samples
            .get(series)
            .unwrap_or_else(|| panic!("no series {series} in\n{}", self.page))
    }

    fn sub(&self, name: &str, subscription: &str) -> f64 {
        self.get(&format!(
            "tinybroker_subscription_{name}{{subscription=\"{subscription}\"}}"
        ))
    }
}

/// `GET /metrics` over a plain TCP connection, as Prometheus does it.
async fn scrape(addr: SocketAddr) -> Scrape {
    let mut stream = within(tokio::net::TcpStream::connect(addr)).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: broker\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    within(stream.read_to_string(&mut response)).await.unwrap();
    let (head, page) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    let samples = page
        .lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').expect("`series value`");
            let value = value
                .parse()
                .unwrap_or_else(|_| panic!("value in {line:?}"));
            (series.to_string(), value)
        })
        .collect();
    Scrape {
        page: page.to_string(),
        samples,
    }
}

// Broker-wide and per-subscription series follow a singleton's life: publish, ack, failover
// (with redelivery and a refused stale ack), nack, and finally idle expiry, which removes the
// subscription's series.
#[tokio::test]
async fn counters_follow_publish_ack_failover_and_expiry() {
    let server = MeteredServer::start(ServerConfig {
        limits: Limits {
            idle_timeout: Duration::from_millis(200),
            ..Limits::default()
        },
        ..ServerConfig::default()
    })
    .await;
    let client = server.client().await;

    let before = server
        .scrape_until(|s| s.get("tinybroker_open_connections") == 1.0)
        .await;
    assert_eq!(before.get("tinybroker_published_total"), 0.0);
    assert_eq!(before.get("tinybroker_subscriptions"), 0.0);
    assert_eq!(before.get("tinybroker_failover_seconds_count"), 0.0);
    assert!(!before.page.contains("subscription=\""), "{}", before.page);

    let mut active = client.subscribe(singleton("m")).await.unwrap();
    let epoch = active.confirmed().await.epoch;
    let mut standby = client.subscribe(singleton("m")).await.unwrap();
    let ids: Vec<u64> = [
        client.publish("jobs.1", "a").await,
        client.publish("jobs.2", "b").await,
        client.publish("jobs.3", "c").await,
    ]
    .iter()
    .map(|p| p.system_id)
    .collect();
    client.publish("nowhere.at.all", "d").await;
    assert_eq!(active.message().await.system_id, ids[0]);
    active.ack(ids[0]).await;
    assert_eq!(active.message().await.system_id, ids[1]);

    let steady = server.scrape().await;
    assert_eq!(steady.get("tinybroker_published_total"), 4.0);
    assert_eq!(steady.get("tinybroker_unrouted_total"), 1.0);
    assert_eq!(steady.get("tinybroker_subscriptions"), 1.0);
    assert_eq!(steady.get("tinybroker_open_member_streams"), 2.0);
    assert_eq!(steady.sub("members", "m"), 2.0);
    // Epochs are below 2^53, so the gauge carries them exactly.
    assert_eq!(steady.sub("active_epoch", "m"), epoch as f64);
    assert_eq!(steady.sub("in_flight", "m"), 1.0);
    assert_eq!(steady.sub("queued_messages", "m"), 1.0);
    assert!(steady.sub("queued_bytes", "m") > 0.0);
    assert_eq!(steady.sub("enqueued_total", "m"), 3.0);
    assert_eq!(steady.sub("delivered_total", "m"), 2.0);
    assert_eq!(steady.sub("acked_total", "m"), 1.0);
    assert_eq!(steady.get("tinybroker_publish_to_ack_seconds_count"), 1.0);

    // Failover: the active stream ends holding ids[1]; the standby takes over with the next
    // epoch.
    let stale_member = active.member_id;
    drop(active);
    assert_eq!(standby.confirmed().await.epoch, epoch + 1);
    let redelivered = standby.message().await;
    assert_eq!(
        (redelivered.system_id, redelivered.delivery_attempt),
        (ids[1], 2)
    );
    let stale = client.ack("m", stale_member, ids[1]).await;
    assert_eq!(stale.unwrap_err().code(), Code::FailedPrecondition);
    client.nack("m", standby.member_id, ids[1]).await.unwrap();
    assert_eq!(standby.message().await.delivery_attempt, 3);
    standby.ack(ids[1]).await;
    assert_eq!(standby.message().await.system_id, ids[2]);
    standby.ack(ids[2]).await;

    let after = server.scrape().await;
    assert_eq!(after.get("tinybroker_failover_seconds_count"), 1.0);
    assert_eq!(after.get("tinybroker_publish_to_ack_seconds_count"), 3.0);
    assert_eq!(after.get("tinybroker_open_member_streams"), 1.0);
    assert_eq!(after.sub("members", "m"), 1.0);
    assert_eq!(after.sub("active_epoch", "m"), (epoch + 1) as f64);
    assert_eq!(after.sub("in_flight", "m"), 0.0);
    assert_eq!(after.sub("queued_messages", "m"), 0.0);
    assert_eq!(after.sub("delivered_total", "m"), 5.0);
    assert_eq!(after.sub("redelivered_total", "m"), 2.0);
    assert_eq!(after.sub("acked_total", "m"), 3.0);
    assert_eq!(after.sub("nacked_total", "m"), 1.0);
    assert_eq!(after.sub("stale_acks_total", "m"), 1.0);
    assert_eq!(after.sub("promotions_total", "m"), 1.0);
    assert_eq!(
        after
            .get("tinybroker_subscription_dropped_total{subscription=\"m\",reason=\"queue_full\"}"),
        0.0
    );
    // The scrape agrees with the inspection API, counter for counter.
    let counters = client.describe("m").await.unwrap().counters.unwrap();
    assert_eq!(after.sub("delivered_total", "m"), counters.delivered as f64);
    assert_eq!(
        after.sub("promotions_total", "m"),
        counters.promotions as f64
    );

    // The last member leaves; after the idle timeout the subscription and its series go.
    drop(standby);
    let expired = server
        .scrape_until(|s| s.get("tinybroker_subscriptions_expired_total") == 1.0)
        .await;
    assert_eq!(expired.get("tinybroker_subscriptions"), 0.0);
    assert_eq!(expired.get("tinybroker_open_member_streams"), 0.0);
    assert!(
        !expired.page.contains("subscription=\"m\""),
        "{}",
        expired.page
    );
}

// Open connections count client connections as they come and go.
#[tokio::test]
async fn open_connections_follow_clients() {
    let server = MeteredServer::start(ServerConfig::default()).await;
    let first = server.client().await;
    let second = server.client().await;
    first.publish("jobs.x", "x").await;
    second.publish("jobs.x", "x").await;
    server
        .scrape_until(|s| s.get("tinybroker_open_connections") == 2.0)
        .await;
    drop(second);
    server
        .scrape_until(|s| s.get("tinybroker_open_connections") == 1.0)
        .await;
}

// A refused publish (queue full) counts in the broker-wide and per-subscription series.
#[tokio::test]
async fn refused_publishes_are_counted() {
    let server = MeteredServer::start(ServerConfig {
        limits: Limits {
            max_queue_messages: 1,
            ..Limits::default()
        },
        ..ServerConfig::default()
    })
    .await;
    let client = server.client().await;
    let _member = client.subscribe(singleton("full")).await.unwrap();
    client.publish("jobs.1", "kept").await;
    let refused = client.try_publish("jobs.2", b"refused".to_vec()).await;
    assert_eq!(refused.unwrap_err().code(), Code::ResourceExhausted);
    let scrape = server.scrape().await;
    assert_eq!(scrape.get("tinybroker_rejected_publishes_total"), 1.0);
    assert_eq!(scrape.sub("rejected_publishes_total", "full"), 1.0);
    assert_eq!(scrape.get("tinybroker_published_total"), 1.0);
}

// `serve --metrics-listen` serves the page; anything but /metrics is 404.
#[tokio::test]
async fn binary_serves_metrics_when_asked() {
    let (mut broker, _addr) = binary::serve(&["--metrics-listen", "127.0.0.1:0"]).await;
    let line = broker.line_with("/metrics").await;
    let metrics_addr: SocketAddr = line
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .expect("metrics address in the log")
        .parse()
        .unwrap();
    let scrape = scrape(metrics_addr).await;
    assert_eq!(scrape.get("tinybroker_published_total"), 0.0);

    let mut stream = tokio::net::TcpStream::connect(metrics_addr).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: broker\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    within(stream.read_to_string(&mut response)).await.unwrap();
    assert!(response.starts_with("HTTP/1.1 404"), "{response}");
}
