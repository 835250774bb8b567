//! Drop-oldest under pressure (docs/semantics.md#overflow-policies, docs/semantics.md#memory-budget),
//! with the shapes and sizes of the review that found the broken promises: ack-free
//! subscriptions that lag never make a publish fail, anywhere; and a stalled ack-free reader that
//! resumes gets the newest messages, not the first ones.

use super::*;
use tinybroker::pb::{AckMode, subscription_frame::Frame};

const KIB: usize = 1024;

fn ack_free(id: &str, mode: DeliveryMode, group: &str, patterns: &[&str]) -> pb::OpenSubscription {
    pb::OpenSubscription {
        ack_mode: AckMode::None.into(),
        ..open(id, mode, group, patterns)
    }
}

/// Seventeen ack-free QUEUE subscriptions on `feed.>` whose members left (idle expiry keeps
/// their queues), then 140 publishes of 512 KiB at the default limits: together their queues
/// could hold 17 × 64 MiB, more than the whole 1 GiB budget. Every publish is taken (the
/// subscriptions drop their oldest, and count it), and a publish to an unrelated acked
/// subscription is taken too. Before the drop-oldest pool, publish 121 and every one after it
/// were refused naming max_memory_bytes, with nothing dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lagging_ack_free_queues_never_refuse_a_publish_to_them_or_to_anyone() {
    let _serial = SERIAL.lock().await;
    let server = TestServer::start().await;
    let client = server.client().await;
    const LAGGING: usize = 17;
    for i in 0..LAGGING {
        let id = format!("feed-{i}");
        let mut member = client
            .subscribe(ack_free(&id, DeliveryMode::Queue, "g", &["feed.>"]))
            .await
            .unwrap();
        member.confirmed().await;
        drop(member);
    }
    let mut acked = client
        .subscribe(open("orders", DeliveryMode::Queue, "g", &["orders.*"]))
        .await
        .unwrap();
    acked.confirmed().await;
    // Wait until every lagging subscription has lost its member (the leave is asynchronous).
    within(async {
        loop {
            let list = client.list().await;
            let members: u32 = list
                .subscriptions
                .iter()
                .filter(|s| s.subscription_id.starts_with("feed-"))
                .map(|s| s.members.len() as u32)
                .sum();
            if members == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;

    let payload = vec![b'f'; 512 * KIB];
    for n in 1..=140 {
        let published = client.try_publish("feed.prices", payload.clone()).await;
        let published = published.unwrap_or_else(|s| panic!("publish {n} refused: {s:?}"));
        assert_eq!(published.queued_for, LAGGING as u32, "publish {n}");
    }
    // An acked subscription keeps its room: a 64 KiB publish to it is stored and delivered.
    let order = client
        .try_publish("orders.new", vec![b'o'; 64 * KIB])
        .await
        .expect("a publish to an acked subscription must not be refused");
    assert_eq!(acked.message().await.system_id, order.system_id);

    let c = counters(&client).await;
    assert_eq!(c.rejected_publishes, 0, "{c:?}");
    assert!(
        c.memory_accounted_bytes <= c.max_memory_bytes,
        "accounted {} of {}",
        c.memory_accounted_bytes,
        c.max_memory_bytes
    );
    let mut dropped = 0;
    for i in 0..LAGGING {
        let info = client.describe(&format!("feed-{i}")).await.unwrap();
        let counters = info.counters.unwrap_or_default();
        assert!(counters.dropped_overflow > 0, "feed-{i}: {counters:?}");
        assert_eq!(counters.rejected_full, 0, "feed-{i}: {counters:?}");
        dropped += counters.dropped_overflow;
        // What each kept is the newest: its queue ends with the last message published.
        assert!(info.queued_messages > 0, "feed-{i} kept nothing");
    }
    eprintln!(
        "17 lagging queues dropped {dropped} of {} messages",
        17 * 140
    );
}

/// One gRPC message of a response body, if `buf` holds a whole one.
fn take_grpc_message(buf: &mut BytesMut) -> Option<Bytes> {
    if buf.len() < 5 {
        return None;
    }
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if buf.len() < 5 + len {
        return None;
    }
    let mut message = buf.split_to(5 + len);
    Some(message.split_off(5).freeze())
}

/// Reads `stream` (after what `buf` already holds) until the message `last` arrives; returns
/// the ids of the messages that came, in order.
async fn read_through(stream: &mut h2::RecvStream, buf: &mut BytesMut, last: u64) -> Vec<u64> {
    use prost::Message as _;
    let mut got = Vec::new();
    within(async {
        while got.last() != Some(&last) {
            let Some(data) = stream.data().await else {
                panic!("the stream ended after {} messages: {:?}", got.len(), got);
            };
            let data = data.unwrap();
            let _ = stream.flow_control().release_capacity(data.len());
            buf.extend_from_slice(&data);
            while let Some(message) = take_grpc_message(buf) {
                let frame = pb::SubscriptionFrame::decode(message).unwrap();
                if let Some(Frame::Message(m)) = frame.frame {
                    got.push(m.system_id);
                }
            }
        }
    })
    .await;
    got
}

/// A raw HTTP/2 `Subscribe` to an ack-free broadcast subscription `stalled` on `ticks.*`
/// (window 128) whose stream window is 16 bytes: its frames wait for the socket. `widen` opens
/// the windows wide, as a reader that resumes.
struct Stalled {
    stream: h2::RecvStream,
    send: h2::SendStream<Bytes>,
    widen: tokio::sync::oneshot::Sender<()>,
    driver: tokio::task::JoinHandle<Result<(), h2::Error>>,
}

async fn stalled_member(server: &TestServer, client: &Client) -> Stalled {
    use prost::Message as _;
    let tcp = within(TcpStream::connect(server.addr)).await.unwrap();
    let (h2, mut connection) = within(
        h2::client::Builder::new()
            .initial_window_size(16)
            .initial_connection_window_size(1 << 20)
            .handshake::<_, Bytes>(tcp),
    )
    .await
    .unwrap();
    // The connection runs in a task; on the signal it opens the stream windows wide.
    let (widen, widened) = tokio::sync::oneshot::channel::<()>();
    let driver = tokio::spawn(async move {
        let mut widened = Some(widened);
        loop {
            tokio::select! {
                biased;
                signal = async { widened.as_mut().unwrap().await }, if widened.is_some() => {
                    widened = None;
                    if signal.is_ok() {
                        connection.set_initial_window_size(8 << 20).unwrap();
                        connection.set_target_window_size(64 << 20);
                    }
                }
                done = &mut connection => return done,
            }
        }
    });
    let mut h2 = within(h2.ready()).await.unwrap();
    let mut request = ack_free("stalled", DeliveryMode::Broadcast, "", &["ticks.*"]);
    request.max_in_flight = 128;
    let mut body = BytesMut::new();
    body.put_u8(0);
    body.put_u32(request.encoded_len() as u32);
    request.encode(&mut body).unwrap();
    let http_request = http::Request::builder()
        .method("POST")
        .uri(format!(
            "http://{}/tinybroker.v1.Broker/Subscribe",
            server.addr
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (response, mut send) = h2.send_request(http_request, false).unwrap();
    send.send_data(body.freeze(), true).unwrap();
    let response = within(response).await.unwrap();
    assert_eq!(response.status(), 200);
    let stream = response.into_body();
    // The member is in: the subscription has it (its confirmation waits behind the window).
    within(async {
        while client
            .describe("stalled")
            .await
            .map_or(true, |info| info.members.is_empty())
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    Stalled {
        stream,
        send,
        widen,
        driver,
    }
}

/// A member whose HTTP/2 stream window is 16 bytes and which reads nothing, then 300 publishes
/// of 512 KiB to its ack-free subscription (window 128, queue limit 64 MiB): the frames wait
/// for its socket. When it reads again it must get the newest messages, the last one published
/// among them, not the first 128. Before, it got #1–#128 and never #129–#300.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_ack_free_reader_that_resumes_gets_the_newest_messages() {
    let _serial = SERIAL.lock().await;
    let server = TestServer::start().await;
    let client = server.client().await;

    let Stalled {
        mut stream,
        send,
        widen,
        driver,
    } = stalled_member(&server, &client).await;

    let payload = vec![b't'; 512 * KIB];
    let mut last = 0;
    for _ in 0..300 {
        last = client
            .try_publish("ticks.eur", payload.clone())
            .await
            .unwrap()
            .system_id;
    }
    let info = client.describe("stalled").await.unwrap();
    let dropped = info.counters.unwrap_or_default().dropped_overflow;
    assert!(dropped >= 150, "only {dropped} dropped of 300");

    // Read again, with room: every frame that waited comes, and the last one published too.
    widen.send(()).unwrap();
    let got = read_through(&mut stream, &mut BytesMut::new(), last).await;
    // What came is a few frames the transport already held, then one unbroken run of the
    // newest messages, ending with the last one published.
    let first = last - 299;
    eprintln!(
        "{dropped} dropped; {} frames came: {:?} … {:?}",
        got.len(),
        got.iter()
            .take(4)
            .map(|id| id - first + 1)
            .collect::<Vec<_>>(),
        got.iter()
            .rev()
            .take(2)
            .map(|id| id - first + 1)
            .collect::<Vec<_>>()
    );
    let newest: Vec<u64> = got.iter().copied().filter(|id| *id > first + 150).collect();
    let expected: Vec<u64> = (newest.first().copied().unwrap_or(last)..=last).collect();
    assert_eq!(
        newest, expected,
        "the newest messages, unbroken: got {got:?}"
    );
    assert!(
        newest.len() >= 100,
        "only {} of the newest came: {got:?}",
        newest.len()
    );
    assert!(
        got.len() as u64 <= 300 - dropped,
        "{} frames, {dropped} dropped",
        got.len()
    );
    drop(stream);
    drop(send);
    driver.abort();
}

/// Through gRPC (docs/semantics.md#ack-free: a reader that stalls and
/// resumes gets the newest, "and at most the few frames the transport already held when it
/// stalled", "never a gap in the middle"). A member with a 16-byte HTTP/2 window and an
/// ack-free window of 128; 128 messages of 4 KiB fill its outlet; the reader then reads a few
/// bytes (its HTTP/2 window opens once, as any slow reader's does), and stalls again; 400 more
/// arrive (queue limit 200, so drop-oldest drops). On resuming it must get a few frames, then
/// one unbroken run of the newest. It got about 128 of the oldest when the stream took its whole
/// outlet at once (each counted as written), then a gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_ack_free_reader_that_read_once_gets_no_gap_in_the_middle() {
    let _serial = SERIAL.lock().await;
    let mut config = ServerConfig::default();
    config.limits.max_queue_messages = 200;
    let server = TestServer::with_config(config).await;
    let client = server.client().await;

    let Stalled {
        mut stream,
        send,
        widen,
        driver,
    } = stalled_member(&server, &client).await;

    let payload = vec![b't'; 4 * KIB];
    let mut first = 0;
    for n in 0..128 {
        let id = client
            .try_publish("ticks.eur", payload.clone())
            .await
            .unwrap()
            .system_id;
        if n == 0 {
            first = id;
        }
    }
    // The reader reads a little: until some bytes past the confirmation came (the stream has
    // then been polled with a full outlet), 16 bytes at a time.
    let mut buf = BytesMut::new();
    within(async {
        while buf.len() < 200 {
            let data = stream.data().await.unwrap().unwrap();
            let _ = stream.flow_control().release_capacity(data.len());
            buf.extend_from_slice(&data);
        }
    })
    .await;
    // Stalled again. 400 more.
    let mut last = 0;
    for _ in 0..400 {
        last = client
            .try_publish("ticks.eur", payload.clone())
            .await
            .unwrap()
            .system_id;
    }
    let dropped = client
        .describe("stalled")
        .await
        .unwrap()
        .counters
        .unwrap_or_default()
        .dropped_overflow;

    widen.send(()).unwrap();
    let got = read_through(&mut stream, &mut buf, last).await;
    let rel: Vec<u64> = got.iter().map(|id| id - first + 1).collect();
    // What docs/semantics.md#ack-free allows ahead of the newest: what the stream had taken (at
    // most ACK_FREE_TAKE frames, counted as written) and the transport's own buffers (tonic
    // encodes up to 32 KiB, 8 frames of 4 KiB, per chunk; the one frame the window let out).
    const TRANSPORT_HELD: usize = tinybroker::broker::ACK_FREE_TAKE + 8 + 1;
    let gaps: Vec<(u64, u64)> = rel
        .windows(2)
        .filter(|w| w[1] != w[0] + 1)
        .map(|w| (w[0], w[1]))
        .collect();
    eprintln!(
        "{dropped} dropped; {} frames came; gaps {gaps:?}",
        rel.len()
    );
    let before_last_gap = gaps
        .last()
        .map_or(0, |(at, _)| rel.iter().position(|id| id == at).unwrap() + 1);
    assert!(
        before_last_gap <= TRANSPORT_HELD,
        "{before_last_gap} frames came before the run of the newest (#{}..#{} of #1..#528), \
         gaps {gaps:?}",
        rel[0],
        rel[before_last_gap.saturating_sub(1)]
    );
    drop(stream);
    drop(send);
    driver.abort();
}
