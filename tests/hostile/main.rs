//! Hostile and careless clients against a real server on loopback (issue "hardening"): each
//! attack is bounded in count and time; during it an ordinary publish → deliver → ack must
//! still complete within a second, and the process's memory must stay within the configured
//! budget plus a fixed slack.

#[path = "../api/certs.rs"]
#[allow(dead_code)]
mod certs;
#[path = "../api/embedded.rs"]
#[allow(dead_code)]
mod deployment;
#[path = "../api/harness.rs"]
#[allow(dead_code)]
mod harness;
mod load;
mod overflow;
mod routing;
mod transport;

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use bytes::{BufMut, Bytes, BytesMut};
use certs::Ca;
use harness::{Client, TestServer, assert_code, open, within};
use tinybroker::{
    pb::{self, DeliveryMode},
    server::ServerConfig,
};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};
use tokio_rustls::{
    TlsConnector,
    rustls::{
        ClientConfig, ClientConnection, RootCertStore,
        crypto::ring,
        pki_types::{CertificateDer, ServerName, pem::PemObject},
    },
};
use tonic::{
    Code,
    transport::{Channel, ClientTlsConfig},
};

/// The tests measure the whole process's memory, so they run one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const MIB: u64 = 1024 * 1024;

/// Memory the process holds beyond what an attack may cost: allocator slack, runtime, clients.
const RSS_SLACK: u64 = 64 * MIB;

/// The process's resident set size, in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status");
    kib * 1024
}

/// Samples RSS every few milliseconds until dropped; `peak()` is the highest seen.
struct RssPeak {
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl RssPeak {
    fn start() -> Self {
        let peak = Arc::new(AtomicU64::new(rss()));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (peak.clone(), stop.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                p.fetch_max(rss(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        Self { peak, stop }
    }

    fn peak(&self) -> u64 {
        self.peak.fetch_max(rss(), Ordering::Relaxed).max(rss())
    }
}

impl Drop for RssPeak {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn assert_rss_within(baseline: u64, peak: &RssPeak, budget: u64) {
    let grown = peak.peak().saturating_sub(baseline);
    assert!(
        grown <= budget + RSS_SLACK,
        "RSS grew by {} MiB during the attack; the bound is {} MiB budget + {} MiB slack",
        grown / MIB,
        budget / MIB,
        RSS_SLACK / MIB
    );
    eprintln!("RSS grew by {} MiB during the attack", grown / MIB);
}

/// An ordinary client's publish → deliver → ack on a fresh broadcast subscription, which must
/// complete within a second even while the broker is under attack.
async fn ordinary_round_trip(client: &Client, name: &str) {
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(1), async {
        let topic = format!("ordinary.{name}");
        let mut member = client
            .subscribe(open(name, DeliveryMode::Broadcast, "", &[&topic]))
            .await
            .unwrap();
        member.confirmed().await;
        let published = client.publish(&topic, "hello").await;
        let message = member.message().await;
        assert_eq!(message.system_id, published.system_id);
        member.ack(message.system_id).await;
    })
    .await
    .unwrap_or_else(|_| panic!("the ordinary round trip {name} took over 1 s"));
    eprintln!("ordinary round trip {name}: {:?}", started.elapsed());
}

async fn counters(client: &Client) -> pb::BrokerCounters {
    client.list().await.broker.expect("broker counters")
}
