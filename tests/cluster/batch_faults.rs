//! Atomic batches (docs/cluster-internals.md#atomic-batches) across faults of the NATS node leading
//! the stream: `PublishStream`s keeping hundreds of publishes outstanding through two gateway
//! processes, so batches are large, while that node is paused again and again. A batch whose answer
//! did not come is sent again until JetStream confirms it (a try still being stored is answered
//! "duplicate message id is in process", a stored one "contains duplicate"): no publish fails, none
//! is stored twice, and each answer names where its message is.

use std::{
    collections::VecDeque,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use tinybroker::pb::{self, broker_client::BrokerClient};
use tokio::sync::watch;
use tonic::transport::Channel;

use crate::{binary, harness::within, nats_server::NatsCluster, node_faults::stream_led_by};

/// Publishes each streamed publisher keeps outstanding.
const WINDOW: usize = 400;
/// Longest any one answer may take.
const PATIENCE: Duration = Duration::from_secs(90);

/// What one publisher saw: each payload with its answer, in order.
type Answers = Vec<(String, Result<pb::PublishStreamResponse, String>)>;

/// A `PublishStream` keeping up to [`WINDOW`] publishes outstanding until `stop`.
async fn publisher(
    p: usize,
    mut gateway: BrokerClient<Channel>,
    stop: Arc<AtomicBool>,
    confirmed: Arc<watch::Sender<usize>>,
) -> Answers {
    let (tx, rx) = tokio::sync::mpsc::channel::<pb::PublishRequest>(WINDOW);
    let sent = Arc::new(Mutex::new(VecDeque::<String>::new()));
    let permits = Arc::new(tokio::sync::Semaphore::new(WINDOW));
    let mut answers =
        within(gateway.publish_stream(tokio_stream::wrappers::ReceiverStream::new(rx)))
            .await
            .unwrap()
            .into_inner();
    let sender = {
        let (sent, permits, stop) = (sent.clone(), permits.clone(), stop.clone());
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                permits.acquire().await.unwrap().forget();
                let payload = format!("p{p}-{n}");
                n += 1;
                sent.lock().unwrap().push_back(payload.clone());
                let request = pb::PublishRequest {
                    topic: "load.job".into(),
                    payload: payload.into_bytes().into(),
                    headers: Default::default(),
                    fence: None,
                };
                if tx.send(request).await.is_err() {
                    return;
                }
            }
        })
    };
    let mut seen = Vec::new();
    loop {
        let next = tokio::time::timeout(PATIENCE, answers.message()).await;
        let payload = sent.lock().unwrap().pop_front();
        match (next, payload) {
            (Ok(Ok(Some(answer))), Some(payload)) => {
                if answer.code == tonic::Code::Ok as i32 {
                    confirmed.send_modify(|n| *n += 1);
                }
                seen.push((payload, Ok(answer)));
                permits.add_permits(1);
            }
            (Ok(Ok(None)), _) | (_, None) => break,
            (other, Some(payload)) => {
                seen.push((payload, Err(format!("the stream ended: {other:?}"))));
                break;
            }
        }
    }
    sender.abort();
    seen
}

#[tokio::test]
async fn streamed_batches_ride_out_the_streams_leader_paused_again_and_again() {
    let mut cluster = NatsCluster::start(3).await;
    let doomed = 0;
    let doomed_url = cluster.client_url(doomed);
    let mut gateways = Vec::new();
    for _ in 0..2 {
        // Room for every message the load stores (a few hundred thousand here).
        let (process, addr) =
            binary::serve(&["--nats", &doomed_url, "--nats-max-messages", "20000000"]).await;
        let channel = Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        gateways.push((process, BrokerClient::new(channel)));
    }
    let admin = async_nats::connect(cluster.client_url(1)).await.unwrap();
    let js = async_nats::jetstream::new(admin.clone());
    // A consumer that never acks keeps every message stored (interest retention), to count.
    js.get_stream("tinybroker")
        .await
        .unwrap()
        .create_consumer(async_nats::jetstream::consumer::pull::Config {
            durable_name: Some("keep".into()),
            ack_policy: async_nats::jetstream::consumer::AckPolicy::Explicit,
            filter_subject: "tinybroker.load.>".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    stream_led_by(&admin, &js, doomed).await;

    let stop = Arc::new(AtomicBool::new(false));
    let (confirmed_tx, confirmed) = watch::channel(0usize);
    let confirmed_tx = Arc::new(confirmed_tx);
    let publishers: Vec<_> = (0..4)
        .map(|p| {
            tokio::spawn(publisher(
                p,
                gateways[p % 2].1.clone(),
                stop.clone(),
                confirmed_tx.clone(),
            ))
        })
        .collect();
    let await_confirmed = |count: usize| {
        let mut confirmed = confirmed.clone();
        async move {
            tokio::time::timeout(PATIENCE, confirmed.wait_for(|&n| n >= count))
                .await
                .expect("publishes stopped being confirmed")
                .unwrap();
        }
    };
    await_confirmed(3000).await;
    for _ in 0..6 {
        // The pauses are the fault injected: their lengths are the test's choice.
        cluster.pause(doomed);
        tokio::time::sleep(Duration::from_millis(2500)).await;
        cluster.resume(doomed);
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    let at_end = *confirmed.borrow();
    await_confirmed(at_end + 3000).await;
    stop.store(true, Ordering::Relaxed);
    let mut answers: Answers = Vec::new();
    for publisher in publishers {
        answers.extend(publisher.await.unwrap());
    }

    let failed: Vec<_> = answers
        .iter()
        .filter_map(|(payload, answer)| match answer {
            Ok(a) if a.code == tonic::Code::Ok as i32 => None,
            Ok(a) => Some(format!("{payload}: {} {}", a.code, a.message)),
            Err(e) => Some(format!("{payload}: {e}")),
        })
        .collect();
    eprintln!(
        "{} answers, {} failed, the first: {:?}",
        answers.len(),
        failed.len(),
        failed.first()
    );
    assert!(
        failed.is_empty(),
        "failed publishes: {:?}",
        &failed[..failed.len().min(5)]
    );
    // Stored once each: as many messages as confirmed publishes, every answer naming a
    // distinct sequence.
    let mut stream = js.get_stream("tinybroker").await.unwrap();
    let stored = stream.info().await.unwrap().state.messages;
    assert_eq!(
        stored,
        answers.len() as u64,
        "stored messages against confirmed publishes"
    );
    let mut ids: Vec<u64> = answers
        .iter()
        .map(|(_, a)| a.as_ref().unwrap().system_id)
        .collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(
        ids.len(),
        answers.len(),
        "two publishes answered with one sequence"
    );
    // Each answer names its own message: checked for every 97th (reading them all back
    // takes minutes).
    for (payload, answer) in answers.iter().step_by(97) {
        let id = answer.as_ref().unwrap().system_id;
        let message = stream.get_raw_message(id).await.unwrap();
        assert_eq!(message.payload, payload.as_bytes(), "sequence {id}");
    }
}
