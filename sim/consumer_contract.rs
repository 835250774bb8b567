//! The JetStream consuming contract (`tinybroker::cluster::jetstream`'s module doc, under
//! "Consuming"), as generic checks any implementation must pass: here against the in-memory
//! model ([`crate::jetstream::StreamModel`] and its consumers); the NATS adapter runs the same
//! functions against a real nats-server (`jetstream_nats.rs`, through
//! [`every_consumer_contract_check`]). Each check takes a fresh stream of the subjects
//! `<prefix>.>` that holds at most [`MAX_CONSUMERS`] consumers, and makes its consumers through
//! a [`Consumers`] fixture.

use std::{collections::HashMap, time::Duration};

use bytes::Bytes;
use tinybroker::cluster::jetstream::{
    AckReply, Answer, Consumer, ConsumerConfig, ConsumerError, CreateError, Deliveries, JetStream,
    Outgoing, Stream,
};
use tokio_stream::StreamExt;

use crate::jetstream::StreamModel;

/// Calls `$run!(check)` for every check of the contract, so each implementation's runner runs
/// all of them (`jetstream_nats.rs` for NATS): a new check goes here too.
#[macro_export]
macro_rules! every_consumer_contract_check {
    ($run:ident) => {
        $run!(a_pull_brings_its_filter_in_stream_order_as_stored);
        $run!(a_pull_ends_once_it_brought_what_it_asked_for);
        $run!(a_nak_brings_a_message_again_first_with_one_delivery_more);
        $run!(an_ack_or_a_term_is_final);
        $run!(an_unanswered_message_comes_again_after_its_ack_wait_unless_kept);
        $run!(an_ack_free_consumer_delivers_each_message_once);
        $run!(a_consumer_deleted_or_made_again_is_told_apart);
        $run!(an_answer_is_confirmed_also_when_sent_again);
        $run!(consumers_are_found_listed_and_deleted_by_name);
        $run!(a_consumer_made_again_with_other_settings_is_refused);
        $run!(a_consumer_delivers_only_what_is_stored_after_its_making);
        $run!(a_stream_at_its_consumer_limit_refuses_one_more);
        $run!(a_subjects_last_message_is_read_and_older_ones_purged);
        $run!(a_handle_pulls_the_consumer_made_again_under_its_name);
        $run!(a_consumer_delivers_at_most_max_ack_pending_unanswered);
    };
}

/// What a check needs of an implementation: its stream's publishing side and its consumers.
pub trait Consumers {
    type Js: JetStream;
    type Stream: Stream;
    fn js(&self) -> &Self::Js;
    fn stream(&self) -> &Self::Stream;
    /// The stream's subjects are `<prefix>.>`.
    fn prefix(&self) -> &str;
}

/// Makes the consumer `name` of the subjects `filter`, as a gateway makes one.
async fn make(
    f: &impl Consumers,
    name: &str,
    filter: &str,
    explicit: bool,
    ack_wait: Duration,
) -> Box<dyn Consumer> {
    let config = config(name, filter, explicit, ack_wait);
    f.stream().create_consumer(config).await.unwrap().0
}

fn config(name: &str, filter: &str, explicit: bool, ack_wait: Duration) -> ConsumerConfig {
    ConsumerConfig {
        name: name.to_string(),
        filters: vec![filter.to_string()],
        explicit,
        ack_wait,
        max_ack_pending: 1000,
        inactive_threshold: Duration::from_secs(3600),
        metadata: HashMap::from([("of".to_string(), name.to_string())]),
    }
}

/// The most consumers each check's stream holds.
pub const MAX_CONSUMERS: usize = 2;

/// Bound on anything a check waits for that should come.
const SOON: Duration = Duration::from_secs(10);
/// Long enough for a pull that must bring nothing more to show it.
const QUIET: Duration = Duration::from_millis(500);
/// An ack wait no check reaches.
const LONG: Duration = Duration::from_secs(60);

/// What a check looks at of a delivery.
#[derive(Debug)]
struct Got {
    sequence: u64,
    delivered: i64,
    subject: String,
    headers: Vec<(String, String)>,
    payload: Bytes,
    published: i128,
    reply: AckReply,
}

async fn publish(
    js: &impl JetStream,
    subject: String,
    body: &str,
    headers: &[(&str, &str)],
) -> u64 {
    let message = Outgoing {
        subject,
        headers: headers
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect(),
        payload: Bytes::copy_from_slice(body.as_bytes()),
    };
    js.publish(message).await.unwrap().await.unwrap().sequence
}

fn got(delivery: tinybroker::cluster::jetstream::Delivery) -> Got {
    let info = delivery.info().unwrap();
    let mut headers = Vec::new();
    delivery.for_each_header(|name, value| {
        if !name.starts_with("Nats-") {
            headers.push((name.to_string(), value.to_string()));
        }
    });
    Got {
        sequence: info.stream_sequence,
        delivered: info.delivered,
        subject: delivery.subject().to_string(),
        headers,
        payload: delivery.payload().clone(),
        published: info.published_nanos,
        reply: delivery.reply().cloned().unwrap(),
    }
}

/// Everything one pull brings, until it ends (bounded).
async fn drain(deliveries: Deliveries) -> Vec<Got> {
    tokio::time::timeout(SOON + LONG, async {
        let mut deliveries = deliveries;
        let mut all = Vec::new();
        while let Some(delivery) = deliveries.next().await {
            all.push(got(delivery.unwrap()));
        }
        all
    })
    .await
    .expect("a pull that never ends")
}

async fn pull(consumer: &dyn Consumer, max: usize, expires: Duration) -> Vec<Got> {
    drain(consumer.pull(max, expires).await.unwrap()).await
}

fn seen(all: &[Got]) -> Vec<(u64, i64)> {
    all.iter().map(|g| (g.sequence, g.delivered)).collect()
}

/// A pull brings the messages of its consumer's filter, none other, in stream order, each with
/// its stream sequence, delivery count 1, store time, subject, headers and body as stored.
pub async fn a_pull_brings_its_filter_in_stream_order_as_stored(f: &impl Consumers) {
    let p = f.prefix().to_string();
    let consumer = make(f, "c", &format!("{p}.in.>"), true, LONG).await;
    let a = publish(f.js(), format!("{p}.in.a"), "1", &[("k", "v 1")]).await;
    publish(f.js(), format!("{p}.out.x"), "not for it", &[]).await;
    let b = publish(f.js(), format!("{p}.in.b.c"), "2", &[]).await;
    let all = pull(consumer.as_ref(), 10, QUIET).await;
    assert_eq!(seen(&all), [(a, 1), (b, 1)]);
    assert_eq!(all[0].subject, format!("{p}.in.a"));
    assert_eq!(all[0].headers, [("k".to_string(), "v 1".to_string())]);
    assert_eq!(all[0].payload, Bytes::from_static(b"1"));
    assert_eq!(
        (all[1].subject.as_str(), all[1].headers.len()),
        (format!("{p}.in.b.c").as_str(), 0)
    );
    assert!(
        all[0].published > 0 && all[0].published <= all[1].published,
        "{all:?}"
    );
    let state = consumer.info().await.unwrap();
    assert_eq!(
        (
            state.pending,
            state.ack_pending,
            state.delivered_stream_sequence
        ),
        (0, 2, b)
    );
}

/// A pull asking for fewer messages than wait ends once it brought them, not at its expiry.
pub async fn a_pull_ends_once_it_brought_what_it_asked_for(f: &impl Consumers) {
    let p = f.prefix().to_string();
    let consumer = make(f, "c", &format!("{p}.>"), true, LONG).await;
    let mut sequences = Vec::new();
    for n in 0..3 {
        sequences.push(publish(f.js(), format!("{p}.a"), &n.to_string(), &[]).await);
    }
    let brought = tokio::time::timeout(SOON, pull(consumer.as_ref(), 2, LONG)).await;
    let brought = brought.expect("the pull waited for its expiry");
    assert_eq!(seen(&brought), [(sequences[0], 1), (sequences[1], 1)]);
    assert_eq!(consumer.info().await.unwrap().pending, 1);
}

/// A naked message comes again at once, ahead of new ones, its delivery count one higher; one
/// naked with a delay comes only after it.
pub async fn a_nak_brings_a_message_again_first_with_one_delivery_more(f: &impl Consumers) {
    let p = f.prefix().to_string();
    let consumer = make(f, "c", &format!("{p}.>"), true, LONG).await;
    let a = publish(f.js(), format!("{p}.a"), "a", &[]).await;
    let b = publish(f.js(), format!("{p}.b"), "b", &[]).await;
    let first = pull(consumer.as_ref(), 1, QUIET).await;
    assert_eq!(seen(&first), [(a, 1)]);
    f.js()
        .confirm(&first[0].reply, Answer::Nak(None), SOON)
        .await
        .unwrap();
    let next = pull(consumer.as_ref(), 2, SOON).await;
    assert_eq!(seen(&next), [(a, 2), (b, 1)]);
    f.js()
        .confirm(
            &next[1].reply,
            Answer::Nak(Some(Duration::from_secs(2))),
            SOON,
        )
        .await
        .unwrap();
    f.js()
        .confirm(&next[0].reply, Answer::Ack, SOON)
        .await
        .unwrap();
    assert_eq!(
        seen(&pull(consumer.as_ref(), 5, QUIET).await),
        [],
        "its delay holds it"
    );
    assert_eq!(seen(&pull(consumer.as_ref(), 1, SOON).await), [(b, 2)]);
}

/// An acked or terminated message never comes again; a naked one does.
pub async fn an_ack_or_a_term_is_final(f: &impl Consumers) {
    let p = f.prefix().to_string();
    let consumer = make(f, "c", &format!("{p}.>"), true, LONG).await;
    let mut sequences = Vec::new();
    for n in 0..3 {
        sequences.push(publish(f.js(), format!("{p}.a"), &n.to_string(), &[]).await);
    }
    let all = pull(consumer.as_ref(), 3, SOON).await;
    assert_eq!(all.len(), 3);
    let js = f.js();
    js.confirm(&all[0].reply, Answer::Ack, SOON).await.unwrap();
    js.confirm(&all[1].reply, Answer::Term, SOON).await.unwrap();
    js.confirm(&all[2].reply, Answer::Nak(None), SOON)
        .await
        .unwrap();
    assert_eq!(
        seen(&pull(consumer.as_ref(), 10, QUIET).await),
        [(sequences[2], 2)]
    );
    assert_eq!(consumer.info().await.unwrap().ack_pending, 1);
}

/// A message not answered within its consumer's ack wait comes again; one kept with progress
/// answers does not.
pub async fn an_unanswered_message_comes_again_after_its_ack_wait_unless_kept(f: &impl Consumers) {
    let p = f.prefix().to_string();
    let consumer = make(f, "c", &format!("{p}.>"), true, Duration::from_secs(1)).await;
    let a = publish(f.js(), format!("{p}.a"), "a", &[]).await;
    let b = publish(f.js(), format!("{p}.b"), "b", &[]).await;
    let first = pull(consumer.as_ref(), 2, SOON).await;
    assert_eq!(seen(&first), [(a, 1), (b, 1)]);
    let kept = first[1].reply.clone();
    let mut deliveries = consumer.pull(10, Duration::from_secs(3)).await.unwrap();
    let mut progress = tokio::time::interval(Duration::from_millis(200));
    let mut again = Vec::new();
    loop {
        tokio::select! {
            delivery = deliveries.next() => match delivery {
                Some(delivery) => {
                    let delivery = got(delivery.unwrap());
                    // Acked at once, so it does not come a third time meanwhile.
                    f.js().confirm(&delivery.reply, Answer::Ack, SOON).await.unwrap();
                    again.push(delivery);
                }
                None => break,
            },
            _ = progress.tick() => f.js().answer(&kept, Answer::Progress).await.unwrap(),
        }
    }
    assert_eq!(seen(&again), [(a, 2)]);
}

/// A consumer that takes no acks counts a message done once delivered: it never comes again.
pub async fn an_ack_free_consumer_delivers_each_message_once(f: &impl Consumers) {
    let p = f.prefix().to_string();
    let consumer = make(f, "c", &format!("{p}.>"), false, Duration::from_secs(1)).await;
    let a = publish(f.js(), format!("{p}.a"), "a", &[]).await;
    let b = publish(f.js(), format!("{p}.b"), "b", &[]).await;
    assert_eq!(
        seen(&pull(consumer.as_ref(), 10, QUIET).await),
        [(a, 1), (b, 1)]
    );
    let later = pull(consumer.as_ref(), 10, Duration::from_secs(2)).await;
    assert_eq!(seen(&later), [], "past the ack wait, nothing comes again");
    assert_eq!(consumer.info().await.unwrap().ack_pending, 0);
}

/// A deleted consumer's state is "not found"; one made again under the name is told apart by
/// its creation time.
pub async fn a_consumer_deleted_or_made_again_is_told_apart(f: &impl Consumers) {
    let p = f.prefix().to_string();
    let consumer = make(f, "c", &format!("{p}.>"), true, LONG).await;
    assert_eq!(consumer.info().await.unwrap().created, consumer.created());
    f.stream().delete_consumer("c").await.unwrap();
    assert_eq!(consumer.info().await, Err(ConsumerError::NotFound));
    let again = make(f, "c", &format!("{p}.>"), true, LONG).await;
    let now = consumer.info().await.unwrap();
    assert_eq!(now.created, again.created());
    assert_ne!(
        now.created,
        consumer.created(),
        "made again: another creation time"
    );
}

/// An ack confirmed, and the same ack sent again (its confirmation lost, say), is confirmed
/// again; the message stays done.
pub async fn an_answer_is_confirmed_also_when_sent_again(f: &impl Consumers) {
    let p = f.prefix().to_string();
    let consumer = make(f, "c", &format!("{p}.>"), true, LONG).await;
    let a = publish(f.js(), format!("{p}.a"), "a", &[]).await;
    let all = pull(consumer.as_ref(), 1, SOON).await;
    assert_eq!(seen(&all), [(a, 1)]);
    f.js()
        .confirm(&all[0].reply, Answer::Ack, SOON)
        .await
        .unwrap();
    f.js()
        .confirm(&all[0].reply, Answer::Ack, SOON)
        .await
        .unwrap();
    assert_eq!(seen(&pull(consumer.as_ref(), 1, QUIET).await), []);
}

/// A consumer is found by name with what it records, listed in name order with the others,
/// counted, and deleted; a second delete finds none.
pub async fn consumers_are_found_listed_and_deleted_by_name(f: &impl Consumers) {
    let p = f.prefix().to_string();
    let stream = f.stream();
    let none = stream.consumer("b").await.unwrap();
    assert!(none.is_none(), "{none:?}");
    make(f, "b", &format!("{p}.b"), true, LONG).await;
    make(f, "a", &format!("{p}.a"), false, LONG).await;
    let (found, info) = stream.consumer("b").await.unwrap().expect("made");
    assert_eq!((found.name(), info.name.as_str()), ("b", "b"));
    assert_eq!(info.metadata.get("of").map(String::as_str), Some("b"));
    assert_eq!(found.created(), info.created);
    let listed: Vec<String> = stream
        .consumers()
        .await
        .unwrap()
        .into_iter()
        .map(|info| info.name)
        .collect();
    assert_eq!(listed, ["a", "b"]);
    assert_eq!(stream.consumer_count().await.unwrap(), 2);
    stream.delete_consumer("b").await.unwrap();
    assert!(stream.consumer("b").await.unwrap().is_none());
    assert_eq!(
        stream.consumer_info("b").await,
        Err(ConsumerError::NotFound)
    );
    assert_eq!(
        stream.delete_consumer("b").await,
        Err(ConsumerError::NotFound)
    );
    assert_eq!(stream.consumer_count().await.unwrap(), 1);
}

/// Made again with the same settings, a consumer is the one there; with others, refused.
pub async fn a_consumer_made_again_with_other_settings_is_refused(f: &impl Consumers) {
    let p = f.prefix().to_string();
    let first = make(f, "c", &format!("{p}.>"), true, LONG).await;
    let same = make(f, "c", &format!("{p}.>"), true, LONG).await;
    assert_eq!(same.created(), first.created(), "the same consumer");
    let other = config("c", &format!("{p}.other"), true, LONG);
    let refused = f
        .stream()
        .create_consumer(other)
        .await
        .map(|(_, info)| info);
    assert!(
        matches!(refused, Err(CreateError::Refused(_))),
        "{refused:?}"
    );
}

/// A consumer delivers what is stored from its making on, not what was stored before.
pub async fn a_consumer_delivers_only_what_is_stored_after_its_making(f: &impl Consumers) {
    let p = f.prefix().to_string();
    publish(f.js(), format!("{p}.a"), "before", &[]).await;
    let consumer = make(f, "c", &format!("{p}.>"), true, LONG).await;
    let after = publish(f.js(), format!("{p}.a"), "after", &[]).await;
    assert_eq!(
        seen(&pull(consumer.as_ref(), 10, QUIET).await),
        [(after, 1)]
    );
}

/// A stream holding its most consumers refuses one more with [`CreateError::Limit`]; one
/// deleted makes room.
pub async fn a_stream_at_its_consumer_limit_refuses_one_more(f: &impl Consumers) {
    let p = f.prefix().to_string();
    for name in ["a", "b"] {
        make(f, name, &format!("{p}.{name}"), true, LONG).await;
    }
    let refused = f
        .stream()
        .create_consumer(config("c", &format!("{p}.c"), true, LONG))
        .await
        .map(|(_, info)| info);
    assert_eq!(refused, Err(CreateError::Limit));
    f.stream().delete_consumer("a").await.unwrap();
    make(f, "c", &format!("{p}.c"), true, LONG).await;
}

/// A subject's last message is read with its sequence, headers and body (none when it has
/// none); a purge below a sequence removes that subject's older messages only, and an
/// expectation then names the last one left.
pub async fn a_subjects_last_message_is_read_and_older_ones_purged(f: &impl Consumers) {
    let p = f.prefix().to_string();
    let (a, b) = (format!("{p}.a"), format!("{p}.b"));
    let stream = f.stream();
    assert_eq!(stream.last_message(&a).await.unwrap(), None);
    let a1 = publish(f.js(), a.clone(), "a1", &[]).await;
    let b1 = publish(f.js(), b.clone(), "b1", &[]).await;
    let a2 = publish(f.js(), a.clone(), "a2", &[("k", "v")]).await;
    let last = stream
        .last_message(&a)
        .await
        .unwrap()
        .expect("a has messages");
    assert_eq!(last.sequence, a2);
    assert_eq!(last.payload, Bytes::from_static(b"a2"));
    assert!(
        last.headers.contains(&("k".to_string(), "v".to_string())),
        "{last:?}"
    );
    stream.purge(&a, a2).await.unwrap();
    assert_eq!(
        stream.last_message(&a).await.unwrap().map(|m| m.sequence),
        Some(a2)
    );
    assert_eq!(
        stream.last_message(&b).await.unwrap().map(|m| m.sequence),
        Some(b1)
    );
    // What the purge kept is still the subject's last: an expectation of a1 is refused.
    let expecting = |sequence: u64, body: &str| Outgoing {
        subject: a.clone(),
        headers: vec![(
            "Nats-Expected-Last-Subject-Sequence".to_string(),
            sequence.to_string(),
        )],
        payload: Bytes::copy_from_slice(body.as_bytes()),
    };
    let stale = f.js().publish(expecting(a1, "stale")).await.unwrap().await;
    assert_eq!(stale.err().and_then(|e| e.code()), Some(10071));
    stream.purge(&a, a2 + 1).await.unwrap();
    assert_eq!(
        stream.last_message(&a).await.unwrap(),
        None,
        "all of a purged"
    );
    let fresh = f.js().publish(expecting(0, "fresh")).await.unwrap().await;
    assert!(
        fresh.is_ok(),
        "none left: an expectation of none stores: {fresh:?}"
    );
}

/// A handle pulls the consumer of its name: one deleted and made again under the name is the
/// one it pulls (a bridge tells them apart by the creation time).
pub async fn a_handle_pulls_the_consumer_made_again_under_its_name(f: &impl Consumers) {
    let p = f.prefix().to_string();
    let old = make(f, "c", &format!("{p}.>"), true, LONG).await;
    f.stream().delete_consumer("c").await.unwrap();
    let again = make(f, "c", &format!("{p}.>"), true, LONG).await;
    let a = publish(f.js(), format!("{p}.a"), "a", &[]).await;
    assert_eq!(seen(&pull(old.as_ref(), 10, QUIET).await), [(a, 1)]);
    assert_ne!(old.created(), again.created());
}

/// A consumer delivers at most `max_ack_pending` messages unanswered; an ack makes room.
pub async fn a_consumer_delivers_at_most_max_ack_pending_unanswered(f: &impl Consumers) {
    let p = f.prefix().to_string();
    let mut config = config("c", &format!("{p}.>"), true, LONG);
    config.max_ack_pending = 2;
    let consumer = f.stream().create_consumer(config).await.unwrap().0;
    let mut sequences = Vec::new();
    for n in 0..3 {
        sequences.push(publish(f.js(), format!("{p}.a"), &n.to_string(), &[]).await);
    }
    let first = pull(consumer.as_ref(), 10, QUIET).await;
    assert_eq!(seen(&first), [(sequences[0], 1), (sequences[1], 1)]);
    f.js()
        .confirm(&first[0].reply, Answer::Ack, SOON)
        .await
        .unwrap();
    assert_eq!(
        seen(&pull(consumer.as_ref(), 10, QUIET).await),
        [(sequences[2], 1)]
    );
}

/// The model as a [`Consumers`] fixture.
struct Model(StreamModel);

impl Consumers for Model {
    type Js = StreamModel;
    type Stream = StreamModel;

    fn js(&self) -> &StreamModel {
        &self.0
    }

    fn stream(&self) -> &StreamModel {
        &self.0
    }

    fn prefix(&self) -> &str {
        "contract"
    }
}

fn run(check: impl AsyncFnOnce(&Model)) {
    let rt = crate::clock::paused_runtime();
    rt.block_on(async {
        let model = StreamModel::new("contract");
        model.limit_consumers(MAX_CONSUMERS);
        check(&Model(model)).await;
    });
}

#[test]
fn cluster_consumer_model_keeps_every_contract_check() {
    macro_rules! check {
        ($name:ident) => {
            run(async |f| $name(f).await);
        };
    }
    crate::every_consumer_contract_check!(check);
}
