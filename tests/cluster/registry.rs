//! `queued_for` across gateways (docs/cluster-internals.md#queued_for-across-gateways): a consumer
//! made or deleted is announced to every gateway before the join or delete is answered, so a
//! publish counts from its gateway's copy without a JetStream request of its own, exactly: every
//! subscription confirmed anywhere before it, none deleted before it. A gateway paused past its
//! lease (it may have missed an announcement) syncs before it counts again.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use tinybroker::pb::DeliveryMode;
use tokio_stream::StreamExt;

use crate::{
    faults::gateway_process,
    gateway,
    harness::{Carriage, open, within},
    lease::signal,
    nats_server::NatsCluster,
};

/// Counts the stream info requests JetStream gets for the gateways' stream.
async fn count_stream_infos(url: &str) -> Arc<AtomicUsize> {
    let client = async_nats::connect(url).await.unwrap();
    let mut infos = client
        .subscribe("$JS.API.STREAM.INFO.tinybroker")
        .await
        .unwrap();
    client.flush().await.unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    let counted = count.clone();
    tokio::spawn(async move {
        let _client = client;
        while infos.next().await.is_some() {
            counted.fetch_add(1, Ordering::Relaxed);
        }
    });
    count
}

fn broadcast(id: &str, pattern: &str) -> tinybroker::pb::OpenSubscription {
    open(id, DeliveryMode::Broadcast, "", &[pattern])
}

// Subscriptions joined at one gateway, then deleted at another, each counted (or not) by the
// very next publish at a third; and once the publishing gateway's copy is current, 200
// publishes cost JetStream no stream info request (before: one sync per burst of publishes,
// each a request to the stream's leader that the publish's answer waited for).
#[tokio::test]
async fn queued_for_counts_joins_and_deletes_anywhere_without_a_request_per_publish() {
    let cluster = NatsCluster::start(3).await;
    let urls = cluster.client_urls();
    let gateways = [
        gateway(&urls[0]).await,
        gateway(&urls[1]).await,
        gateway(&urls[2]).await,
    ];
    let mut clients = Vec::new();
    for gateway in &gateways {
        clients.push(gateway.client().await);
    }
    let mut members = Vec::new();
    for n in 0..6 {
        let id = format!("q{n}");
        let mut request = open(&id, DeliveryMode::Queue, "workers", &["reg.*"]);
        request.max_in_flight = 1;
        let mut member = clients[n % 3].subscribe(request).await.unwrap();
        member.confirmed().await;
        let answered = clients[(n + 1) % 3].publish("reg.x", "counted").await;
        assert_eq!(
            answered.queued_for,
            n as u32 + 1,
            "q{n} joined at gateway {}, published at gateway {}",
            n % 3,
            (n + 1) % 3
        );
        members.push(member);
    }
    let infos = count_stream_infos(&urls[2]).await;
    for _ in 0..200 {
        assert_eq!(clients[1].publish("reg.y", "steady").await.queued_for, 6);
    }
    let asked = infos.load(Ordering::Relaxed);
    assert!(asked <= 2, "{asked} stream info requests for 200 publishes");
    // Deleted at one gateway (its member gone), not counted by the next publish at another.
    drop(members);
    for n in 0..3 {
        let id = format!("q{n}");
        within(async {
            loop {
                let deleted = clients[(n + 2) % 3]
                    .0
                    .clone()
                    .delete_subscription(tinybroker::pb::DeleteSubscriptionRequest {
                        subscription_id: id.clone(),
                    })
                    .await;
                match deleted {
                    Ok(_) => break,
                    // Its member's leave is still on the way.
                    Err(status) if status.code() == tonic::Code::FailedPrecondition => {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    Err(status) => panic!("delete {id}: {status:?}"),
                }
            }
        })
        .await;
        let answered = clients[n % 3].publish("reg.z", "after").await;
        assert_eq!(answered.queued_for, 5 - n as u32, "after deleting q{n}");
    }
    // A BROADCAST subscription too.
    let mut fan = clients[2]
        .subscribe(broadcast("fan", "reg.*"))
        .await
        .unwrap();
    fan.confirmed().await;
    assert_eq!(clients[0].publish("reg.w", "fan").await.queued_for, 4);
}

/// How long a join may take while JetStream moves the killed node's leaders, and a resumed
/// gateway to publish again after its NATS node was killed.
const RESUME_PATIENCE: Duration = Duration::from_secs(60);

/// Runs `attempt` until it is not refused `UNAVAILABLE` (a client's retry while JetStream
/// moves leaders), for up to [`RESUME_PATIENCE`].
async fn until_available<T, F: Future<Output = Result<T, tonic::Status>>>(
    what: &str,
    mut attempt: impl FnMut() -> F,
) -> T {
    tokio::time::timeout(RESUME_PATIENCE, async {
        loop {
            match attempt().await {
                Ok(answer) => return answer,
                Err(status) if status.code() == tonic::Code::Unavailable => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(status) => panic!("{what} refused: {status:?}"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what} not answered within {RESUME_PATIENCE:?}"))
}

/// Two gateway processes on nodes 0 and 1 of a cluster, a QUEUE subscription "before" joined
/// at the second and counted by a publish at the first; then the first SIGSTOPped.
struct OneCountedThenStopped {
    stopped: crate::binary::Running,
    on_stopped: crate::harness::Client,
    _other: crate::binary::Running,
    on_other: crate::harness::Client,
    _before: crate::harness::Member,
}

impl OneCountedThenStopped {
    /// With gateway flags `args`, the subscription on `pattern`, the publish on `topic`.
    async fn start(cluster: &NatsCluster, args: &[&str], pattern: &str, topic: &str) -> Self {
        let (stopped, on_stopped) = gateway_process(&cluster.client_url(0), args).await;
        let (other, on_other) = gateway_process(&cluster.client_url(1), args).await;
        let mut before = on_other
            .subscribe(open("before", DeliveryMode::Queue, "w", &[pattern]))
            .await
            .unwrap();
        before.confirmed().await;
        // Current: counted at once.
        assert_eq!(on_stopped.publish(topic, "one").await.queued_for, 1);
        signal(stopped.child.id(), "-STOP");
        Self {
            stopped,
            on_stopped,
            _other: other,
            on_other,
            _before: before,
        }
    }
}

// A gateway SIGSTOPped past its 1 s lease while the NATS node it is connected to is killed
// misses the announcement of a subscription joined meanwhile at another gateway (the joiner
// waits for its answer as long as for a gateway taken for dead, then goes on), and JetStream's
// advisory of it. Resumed, it connects
// to another node under a new lease: its copy is not current, so its next publish syncs first and
// counts the subscription.
#[tokio::test]
async fn a_gateway_that_missed_an_announcement_syncs_before_it_counts() {
    let mut cluster = NatsCluster::start(3).await;
    let setup =
        OneCountedThenStopped::start(&cluster, &["--gateway-lease", "1s"], "lapse.*", "lapse.a")
            .await;
    let (pid, on_paused, on_other) = (setup.stopped.child.id(), &setup.on_stopped, &setup.on_other);
    cluster.kill(0);
    // Retried as a client would while JetStream moves the leaders the killed node held.
    let mut joined = until_available("the join", || {
        let during = open("during", DeliveryMode::Queue, "w", &["lapse.*"]);
        on_other.subscribe_within(Carriage::Unary, during, RESUME_PATIENCE)
    })
    .await;
    joined.confirmed().await;
    signal(pid, "-CONT");
    // It first leaves the dead node (three 1 s pings unanswered), and JetStream may elect the
    // stream's next leader (seconds).
    let answered = until_available("the publish", || {
        on_paused.try_publish("lapse.b", b"two".to_vec())
    })
    .await;
    assert_eq!(
        answered.queued_for, 2,
        "the subscription joined while this gateway was stopped"
    );
}

// A gateway SIGSTOPped under the default lease (3 s, renewed every second) while a subscription
// is joined at another gateway: the join waits for its answer for as long as a gateway is
// waited for before it is taken for dead (3.36 s), by which time its lease has lapsed by its own
// clock. A publish sent to it after the join's answer, answered once it resumes, counts the
// subscription (it syncs first). Before, the join waited 2 s, the paused gateway kept its lease
// and connection, and counted from its old copy (3 of 4 runs).
#[tokio::test]
async fn a_gateway_paused_within_the_default_lease_counts_a_subscription_joined_meanwhile() {
    let cluster = NatsCluster::start(3).await;
    let setup = OneCountedThenStopped::start(&cluster, &[], "held.*", "held.a").await;
    let (pid, on_paused, on_other) = (setup.stopped.child.id(), &setup.on_stopped, &setup.on_other);
    let mut during = on_other
        .subscribe(open("during", DeliveryMode::Queue, "w", &["held.*"]))
        .await
        .unwrap();
    during.confirmed().await;
    let (answered, ()) = tokio::join!(on_paused.publish("held.b", "two"), async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        signal(pid, "-CONT");
    });
    assert_eq!(
        answered.queued_for, 2,
        "the subscription confirmed at another gateway before this publish was sent"
    );
}

// docs/cluster-internals.md#queued_for-across-gateways: joins that make consumers at two gateways
// at the same moment, over three nodes, are each announced and confirmed by every gateway at once:
// an announcement carries the consumer it announces, so no gateway answers only after listing every
// consumer (a listing that JetStream holds for up to 4 s while another consumer it is making has no
// leader yet). Each pair's publish then counts both. Before, 8-10 joins of 10 took over 1 s (median
// 2.08 s, alone 0.08 s) and the gateways logged healthy gateways "taken for paused or gone".
#[tokio::test]
async fn joins_at_two_gateways_at_once_are_confirmed_by_every_gateway_at_once() {
    const ROUNDS: usize = 8;
    let cluster = NatsCluster::start(3).await;
    let urls = cluster.client_urls().join(",");
    let (mut a, on_a) = gateway_process(&urls, &[]).await;
    let (mut b, on_b) = gateway_process(&urls, &[]).await;
    let mut took = Vec::new();
    let mut members = Vec::new();
    for round in 0..ROUNDS {
        let (first, second) = (format!("together-a{round}"), format!("together-b{round}"));
        let started = std::time::Instant::now();
        let (at_a, at_b) = tokio::join!(
            async {
                let joined = on_a
                    .subscribe(open(&first, DeliveryMode::Queue, "w", &["pair.*"]))
                    .await;
                (joined, started.elapsed())
            },
            async {
                let joined = on_b
                    .subscribe(open(&second, DeliveryMode::Queue, "w", &["pair.*"]))
                    .await;
                (joined, started.elapsed())
            },
        );
        let (mut first, at_a_took) = at_a;
        let (mut second, at_b_took) = at_b;
        first.as_mut().unwrap().confirmed().await;
        second.as_mut().unwrap().confirmed().await;
        took.extend([at_a_took, at_b_took]);
        members.extend([first.unwrap(), second.unwrap()]);
        // Every gateway's copy has both: a publish anywhere counts them (and the earlier
        // rounds' subscriptions, on the same topic).
        for client in [&on_a, &on_b] {
            let published = client.publish("pair.go", "x").await;
            assert_eq!(
                published.queued_for,
                2 * (round as u32 + 1),
                "round {round}"
            );
        }
    }
    took.sort_unstable();
    eprintln!(
        "{} joins two at a time: median {:?}, slowest {:?}",
        took.len(),
        took[took.len() / 2],
        took[took.len() - 1]
    );
    for (name, gateway) in [("a", &mut a), ("b", &mut b)] {
        while let Ok(line) = gateway.lines.try_recv() {
            assert!(
                !line.contains("taken for paused or gone"),
                "gateway {name} took a healthy gateway for paused: {line}"
            );
        }
    }
}
