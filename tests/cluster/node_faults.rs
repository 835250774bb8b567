//! A NATS node killed (SIGKILL) or paused (SIGSTOP, then SIGCONT) under load
//! (docs/semantics.md#cluster-durability, docs/semantics.md#cluster-ack-final): four publishers and
//! a QUEUE subscription with an acking member on each of two gateway processes, both connected
//! to the node that fails. Clients see nothing of a minority's loss: no publish fails, none is
//! stored twice, every confirmed message is delivered, and no message a member acked is
//! delivered again.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use tinybroker::pb::{self, DeliveryMode, broker_client::BrokerClient};
use tokio::sync::watch;
use tonic::transport::Channel;

use crate::{
    binary::{self, Running},
    harness::{open, within},
    nats_server::NatsCluster,
};

/// The gateways' ack wait: longer than JetStream takes to elect a consumer's next leader (a
/// few seconds; its Raft election timeout is 4 to 9 s), so an ack the stopped leader never
/// applied can be confirmed by the next one before the message is due again.
const ACK_WAIT: &str = "15s";
/// Longest any one event of these tests may take: a publish, a delivery, the drain.
const PATIENCE: Duration = Duration::from_secs(60);
/// Publishes confirmed before the fault, and after it ends, before the load stops.
const CONFIRMED_AROUND_THE_FAULT: usize = 400;
/// Publishes a streaming publisher sends at once, then awaits (the gateway sends the first
/// alone and the others, read meanwhile, as one batch): about as many a second as two unary
/// publishers, so the members keep up.
const STREAMED: usize = 4;
/// Confirmed messages not yet delivered above which a streaming publisher waits.
const STREAMED_BACKLOG: usize = 200;

#[derive(Clone, Copy, Debug)]
enum Fault {
    Kill,
    Pause(Duration),
}

/// A `tinybroker serve --nats URL` process with a short ack wait, and a gRPC client of it.
async fn gateway_on(url: &str) -> (Running, BrokerClient<Channel>) {
    let (process, addr) = binary::serve(&["--nats", url, "--nats-ack-wait", ACK_WAIT]).await;
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    (process, BrokerClient::new(channel))
}

/// Awaits `count` confirmed publishes.
async fn await_confirmed(confirmed: &watch::Receiver<usize>, count: usize) {
    let mut confirmed = confirmed.clone();
    tokio::time::timeout(PATIENCE, confirmed.wait_for(|&n| n >= count))
        .await
        .expect("publishes stopped being confirmed")
        .unwrap();
}

/// What the load saw.
#[derive(Default)]
struct Seen {
    /// Confirmed publishes: payload to system id.
    confirmed: BTreeMap<String, u64>,
    /// Publishes that failed, with their status.
    failed: Vec<String>,
    /// The longest publish before the fault, and the longest once it began.
    longest_before: Duration,
    longest_after: Duration,
    /// Deliveries: system id to payload (one payload per id).
    delivered: BTreeMap<u64, String>,
    /// Messages a member acked.
    acked: BTreeSet<u64>,
    /// Deliveries of a message a member had acked before: (system id, attempt).
    acked_again: Vec<(u64, u32)>,
    /// Deliveries with attempt > 1 (not acked before).
    redelivered: usize,
}

/// Runs the load through the fault and returns what it saw. `leaders_on_it`: the node that
/// fails also leads the stream and the subscription's consumer.
async fn under_load(fault: Fault, leaders_on_it: bool) -> Seen {
    let mut cluster = NatsCluster::start(3).await;
    let doomed = 0;
    let doomed_url = cluster.client_url(doomed);
    // Both gateways are connected to the node that fails (they learn the others from it).
    let (_a, on_a) = gateway_on(&doomed_url).await;
    let (_b, on_b) = gateway_on(&doomed_url).await;
    let subscription = "load";
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mut members = Vec::new();
    let (delivered_tx, delivered_rx) = watch::channel(0usize);
    let delivered_tx = Arc::new(delivered_tx);
    for gateway in [&on_a, &on_b] {
        let mut request = open(subscription, DeliveryMode::Queue, "workers", &["load.*"]);
        request.max_in_flight = 16;
        let mut stream = within(gateway.clone().subscribe(request))
            .await
            .unwrap()
            .into_inner();
        let member_id = match within(stream.message()).await.unwrap().unwrap().frame {
            Some(pb::subscription_frame::Frame::Confirmation(c)) => c.member_id,
            other => panic!("expected a confirmation, got {other:?}"),
        };
        let (gateway, seen, delivered_tx) = (gateway.clone(), seen.clone(), delivered_tx.clone());
        members.push(tokio::spawn(async move {
            let mut gateway = gateway;
            loop {
                let frame = match tokio::time::timeout(PATIENCE, stream.message()).await {
                    Ok(Ok(Some(frame))) => frame,
                    Ok(Ok(None)) => return,
                    Ok(Err(status)) => panic!("member stream failed: {status:?}"),
                    Err(_) => panic!("nothing delivered for {PATIENCE:?}"),
                };
                let Some(pb::subscription_frame::Frame::Message(m)) = frame.frame else {
                    continue;
                };
                let payload = String::from_utf8(m.payload.to_vec()).unwrap();
                {
                    let mut seen = seen.lock().unwrap();
                    if seen.acked.contains(&m.system_id) {
                        seen.acked_again.push((m.system_id, m.delivery_attempt));
                    } else if m.delivery_attempt > 1 {
                        seen.redelivered += 1;
                    }
                    seen.delivered.insert(m.system_id, payload);
                    delivered_tx.send_replace(seen.delivered.len());
                }
                let ack = pb::Ack {
                    subscription_id: "load".into(),
                    system_id: m.system_id,
                    member_id,
                };
                match tokio::time::timeout(PATIENCE, gateway.ack(ack)).await {
                    Ok(Ok(_)) => {
                        seen.lock().unwrap().acked.insert(m.system_id);
                    }
                    Ok(Err(status)) => panic!("ack of {} refused: {status:?}", m.system_id),
                    Err(_) => panic!("ack of {} not answered in {PATIENCE:?}", m.system_id),
                }
            }
        }));
    }

    // The admin connection is to another node, so it outlives the fault.
    let admin = async_nats::connect(cluster.client_url(1)).await.unwrap();
    let js = async_nats::jetstream::new(admin.clone());
    let consumer_name = tinybroker::cluster::gateway::wire::names::consumer_name(
        tinybroker::core::Mode::Queue,
        subscription,
        "",
    );
    // The stream's and the consumer's leader: the failing node, or another one.
    let leader = if leaders_on_it { doomed } else { 1 };
    {
        stream_led_by(&admin, &js, leader).await;
        let consumer_leader = || async {
            let stream = js.get_stream("tinybroker").await.ok()?;
            let mut consumer: async_nats::jetstream::consumer::PullConsumer =
                stream.get_consumer(&consumer_name).await.ok()?;
            consumer.info().await.ok()?.cluster.as_ref()?.leader.clone()
        };
        lead_on(
            &admin,
            &format!("$JS.API.CONSUMER.LEADER.STEPDOWN.tinybroker.{consumer_name}"),
            leader,
            consumer_leader,
        )
        .await;
    }

    // Four publishers, two per gateway, each with payloads of its own: two unary, two on a
    // `PublishStream` (atomic batches, docs/cluster-internals.md#atomic-batches).
    let stop = Arc::new(AtomicBool::new(false));
    let fault_began = Arc::new(Mutex::new(None::<Instant>));
    let (confirmed_tx, confirmed_rx) = watch::channel(0usize);
    let confirmed_tx = Arc::new(confirmed_tx);
    let mut publishers = Vec::new();
    for (p, gateway) in [&on_a, &on_b, &on_a, &on_b].into_iter().enumerate() {
        let (mut gateway, seen, stop) = (gateway.clone(), seen.clone(), stop.clone());
        let (fault_began, confirmed_tx) = (fault_began.clone(), confirmed_tx.clone());
        if p >= 2 {
            publishers.push(tokio::spawn(stream_publisher(
                p,
                gateway,
                seen,
                stop,
                fault_began,
                (confirmed_tx, delivered_rx.clone()),
            )));
            continue;
        }
        publishers.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let payload = format!("p{p}-{n}");
                n += 1;
                let started = Instant::now();
                let request = load_request(&payload);
                let answer = tokio::time::timeout(PATIENCE, gateway.publish(request)).await;
                let took = started.elapsed();
                // Across the fault: answered after it began.
                let after = fault_began.lock().unwrap().is_some();
                let mut seen = seen.lock().unwrap();
                if after {
                    seen.longest_after = seen.longest_after.max(took);
                } else {
                    seen.longest_before = seen.longest_before.max(took);
                }
                match answer {
                    Ok(Ok(response)) => {
                        let system_id = response.into_inner().system_id;
                        seen.confirmed.insert(payload, system_id);
                        confirmed_tx.send_replace(seen.confirmed.len());
                    }
                    Ok(Err(status)) => seen.failed.push(format!("{payload}: {status:?}")),
                    Err(_) => seen
                        .failed
                        .push(format!("{payload}: no answer in {PATIENCE:?}")),
                }
            }
        }));
    }
    await_confirmed(&confirmed_rx, CONFIRMED_AROUND_THE_FAULT).await;

    let began = Instant::now();
    *fault_began.lock().unwrap() = Some(began);
    match fault {
        Fault::Kill => cluster.kill(doomed),
        Fault::Pause(length) => {
            cluster.pause(doomed);
            // The pause itself is the fault injected: its length is the test's choice.
            tokio::time::sleep(length).await;
            cluster.resume(doomed);
        }
    }
    let at_fault_end = *confirmed_rx.borrow();
    await_confirmed(&confirmed_rx, at_fault_end + CONFIRMED_AROUND_THE_FAULT).await;
    stop.store(true, Ordering::Relaxed);
    for publisher in publishers {
        publisher.await.unwrap();
    }
    eprintln!(
        "{fault:?} (leaders on it: {leaders_on_it}): load stopped {:?} after the fault began",
        began.elapsed()
    );

    // Every confirmed message delivered, and nothing left for JetStream to deliver again:
    // the consumer has no message pending or awaiting an ack.
    let confirmed: BTreeSet<u64> = seen.lock().unwrap().confirmed.values().copied().collect();
    let mut delivered = delivered_rx.clone();
    tokio::time::timeout(PATIENCE, async {
        loop {
            let all = {
                let seen = seen.lock().unwrap();
                confirmed.iter().all(|id| seen.delivered.contains_key(id))
            };
            if all {
                break;
            }
            delivered.changed().await.unwrap();
        }
    })
    .await
    .unwrap_or_else(|_| {
        let seen = seen.lock().unwrap();
        let lost: Vec<_> = confirmed
            .iter()
            .filter(|id| !seen.delivered.contains_key(id))
            .collect();
        panic!(
            "{} confirmed messages never delivered ({} confirmed, {} delivered, {} failed), the first: {:?}",
            lost.len(),
            confirmed.len(),
            seen.delivered.len(),
            seen.failed.len(),
            &lost[..lost.len().min(10)]
        )
    });
    tokio::time::timeout(PATIENCE, async {
        loop {
            let stream = js.get_stream("tinybroker").await;
            if let Ok(stream) = stream
                && let Ok(info) = stream.consumer_info(&consumer_name).await
                && info.num_ack_pending == 0
                && info.num_pending == 0
            {
                return;
            }
            // Polling interval of the check, not a wait for the event itself.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the consumer still had messages pending or unacked");
    for member in members {
        if member.is_finished() {
            // It ended early: its panic says why.
            member.await.unwrap();
        } else {
            member.abort();
        }
    }
    std::mem::take(&mut *seen.lock().unwrap())
}

/// A publish of `payload` to the load's topic.
fn load_request(payload: &str) -> pb::PublishRequest {
    pb::PublishRequest {
        topic: "load.job".into(),
        payload: payload.as_bytes().to_vec().into(),
        headers: Default::default(),
        fence: None,
    }
}

/// A publisher on one `PublishStream`, [`STREAMED`] publishes at a time, until `stop`;
/// what it saw goes to `seen`, as the unary publishers' does.
async fn stream_publisher(
    p: usize,
    mut gateway: BrokerClient<Channel>,
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
    fault_began: Arc<Mutex<Option<Instant>>>,
    (confirmed_tx, mut delivered): (Arc<watch::Sender<usize>>, watch::Receiver<usize>),
) {
    let (tx, rx) = tokio::sync::mpsc::channel::<pb::PublishRequest>(STREAMED);
    let mut answers =
        within(gateway.publish_stream(tokio_stream::wrappers::ReceiverStream::new(rx)))
            .await
            .unwrap()
            .into_inner();
    let mut sent: std::collections::VecDeque<(String, Instant)> = Default::default();
    let mut n = 0u64;
    loop {
        // Paced by the members: a burst only while few confirmed messages wait for
        // delivery, so the load stays what the members drain (batched publishes outrun them).
        while !stop.load(Ordering::Relaxed) && sent.is_empty() {
            let backlog = {
                let seen = seen.lock().unwrap();
                seen.confirmed.len().saturating_sub(seen.delivered.len())
            };
            if backlog < STREAMED_BACKLOG {
                break;
            }
            // Bounded so that `stop` is seen: a re-check interval, not a wait for the event.
            let _ = tokio::time::timeout(Duration::from_millis(200), delivered.changed()).await;
        }
        if !stop.load(Ordering::Relaxed) && sent.is_empty() {
            for _ in 0..STREAMED {
                let payload = format!("p{p}-{n}");
                n += 1;
                let request = load_request(&payload);
                tx.send(request).await.unwrap();
                sent.push_back((payload, Instant::now()));
            }
        }
        let Some((payload, started)) = sent.pop_front() else {
            return;
        };
        let answer = tokio::time::timeout(PATIENCE, answers.message()).await;
        let took = started.elapsed();
        let after = fault_began.lock().unwrap().is_some();
        let mut seen = seen.lock().unwrap();
        if after {
            seen.longest_after = seen.longest_after.max(took);
        } else {
            seen.longest_before = seen.longest_before.max(took);
        }
        match answer {
            Ok(Ok(Some(answer))) if answer.code == tonic::Code::Ok as i32 => {
                seen.confirmed.insert(payload, answer.system_id);
                confirmed_tx.send_replace(seen.confirmed.len());
            }
            Ok(Ok(Some(answer))) => seen.failed.push(format!(
                "{payload} (streamed): code {} {}",
                answer.code, answer.message
            )),
            other => {
                seen.failed
                    .push(format!("{payload} (streamed): the stream ended: {other:?}"));
                return;
            }
        }
    }
}

/// Moves the stream's leadership to `node` ([`lead_on`]), asking through `admin`.
pub(crate) async fn stream_led_by(
    admin: &async_nats::Client,
    js: &async_nats::jetstream::Context,
    node: usize,
) {
    let stream_leader = || async {
        let mut stream = js.get_stream("tinybroker").await.ok()?;
        stream.info().await.ok()?.cluster.as_ref()?.leader.clone()
    };
    lead_on(
        admin,
        "$JS.API.STREAM.LEADER.STEPDOWN.tinybroker",
        node,
        stream_leader,
    )
    .await;
}

/// Moves the leadership `leader` reports to `node` with `stepdown` requests (each asking for
/// it as the preferred placement). Each read is bounded by a second: one sent while the
/// leadership moves may go unanswered.
pub(crate) async fn lead_on<F, Fut>(
    client: &async_nats::Client,
    stepdown: &str,
    node: usize,
    leader: F,
) where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Option<String>>,
{
    tokio::time::timeout(PATIENCE, async {
        loop {
            let now = tokio::time::timeout(Duration::from_secs(1), leader()).await;
            if now
                .ok()
                .flatten()
                .as_deref()
                .and_then(NatsCluster::node_named)
                == Some(node)
            {
                return;
            }
            let preferred = format!(r#"{{"placement":{{"preferred":"n{node}"}}}}"#);
            let request = async_nats::Request::new()
                .payload(preferred.into())
                .timeout(Some(Duration::from_secs(1)));
            let _ = client.send_request(stepdown.to_string(), request).await;
            // Polling interval of the check, not a wait for the event itself.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no leadership on node {node} through {stepdown}"));
}

/// The promises every fault keeps.
fn assert_invisible(seen: &Seen) {
    assert!(
        seen.failed.is_empty(),
        "failed publishes: {:?}",
        seen.failed
    );
    // One message per payload: one published twice would be delivered under two system ids.
    let mut by_payload: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for (id, payload) in &seen.delivered {
        by_payload.entry(payload).or_default().push(*id);
    }
    let twice: Vec<_> = by_payload.iter().filter(|(_, ids)| ids.len() > 1).collect();
    assert!(twice.is_empty(), "stored twice: {twice:?}");
    for (payload, id) in &seen.confirmed {
        assert_eq!(
            seen.delivered.get(id).map(String::as_str),
            Some(payload.as_str())
        );
    }
    assert!(
        seen.acked_again.is_empty(),
        "acked messages delivered again (system id, attempt): {:?}",
        seen.acked_again
    );
}

/// Prints what the load saw (before the assertions, so a failing run says all of it).
fn report(what: &str, seen: &Seen) {
    eprintln!(
        "{what}: {} publishes confirmed, {} failed; longest publish {:?} across the fault ({:?} before); {} delivered, {} redelivered before any ack, {} acked delivered again",
        seen.confirmed.len(),
        seen.failed.len(),
        seen.longest_after,
        seen.longest_before,
        seen.delivered.len(),
        seen.redelivered,
        seen.acked_again.len()
    );
}

// SIGKILL of the node both gateways are connected to, which also leads the stream and the
// consumer. Before, publishes in the election failed with UNAVAILABLE after 2 s of "no
// responders" (4 of 807 here), and acks in flight to the dead leader were lost: 12 acked
// messages came again after the ack wait.
#[tokio::test]
async fn a_killed_nats_node_leading_the_stream_and_consumer_is_invisible_to_clients() {
    let seen = under_load(Fault::Kill, true).await;
    report("node killed", &seen);
    assert_invisible(&seen);
}

// SIGSTOP for 15 s of the node both gateways are connected to, which also leads the stream
// and the consumer: publishes wait for the stream's next leader (JetStream elects it within
// about 10 s), not for the pause. Before, every publish across the pause failed after 5 s
// (8 of 815 here), and acks sent to the paused node were lost.
#[tokio::test]
async fn a_paused_nats_node_leading_the_stream_and_consumer_is_invisible_to_clients() {
    let pause = Duration::from_secs(15);
    let seen = under_load(Fault::Pause(pause), true).await;
    report("node paused 15 s", &seen);
    assert_invisible(&seen);
    assert!(
        seen.longest_after < pause,
        "a publish took {:?}, the whole pause",
        seen.longest_after
    );
}

// SIGSTOP for 12 s of the node both gateways are connected to, leading nothing: the gateways
// leave it within three ping intervals (1 s each) and a connection timeout (1 s, if they try
// it again first), and go on through another node, so a publish waits about 4 s plus one try
// (2 s). Before, publishes stalled and failed after 5 s (12 of 820), and 17 acked messages
// came again: their acks were lost with the connection.
#[tokio::test]
async fn a_gateway_leaves_a_paused_nats_node_within_seconds() {
    let pause = Duration::from_secs(12);
    let seen = under_load(Fault::Pause(pause), false).await;
    report("node paused 12 s, leading nothing", &seen);
    assert_invisible(&seen);
    assert!(
        seen.longest_after < Duration::from_secs(8),
        "a publish took {:?} across the pause",
        seen.longest_after
    );
}
