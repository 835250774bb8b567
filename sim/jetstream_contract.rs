//! The JetStream publishing contract (`tinybroker::cluster::jetstream`'s module doc), as
//! generic checks any implementation must pass: here against the in-memory model
//! ([`crate::jetstream::StreamModel`]); the NATS adapter runs the same functions against a
//! real nats-server (`jetstream_nats.rs`, through [`every_jetstream_contract_check`]). Each
//! takes a fresh stream of the subjects `<prefix>.>` with atomic batches allowed; the one named
//! `full` holds at most two messages (discard new).

use bytes::Bytes;
use tinybroker::cluster::jetstream::{JetStream, Outgoing, PubAck, PublishError};

use crate::jetstream::StreamModel;

/// Calls `$run!(check, limited)` for every check of the contract, so each implementation's
/// runner runs all of them (`jetstream_nats.rs` for NATS): a new check goes here too.
#[macro_export]
macro_rules! every_jetstream_contract_check {
    ($run:ident) => {
        $run!(sequences_rise_and_a_repeated_id_is_stored_once, false);
        $run!(
            an_expectation_stores_only_on_the_subjects_last_sequence,
            false
        );
        $run!(an_atomic_batch_is_stored_together_once, false);
        $run!(a_full_stream_refuses_with_its_limit, true);
    };
}

fn message(subject: String, body: &str, headers: &[(&str, &str)]) -> Outgoing {
    Outgoing {
        subject,
        headers: headers
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect(),
        payload: Bytes::copy_from_slice(body.as_bytes()),
    }
}

async fn publish(js: &impl JetStream, message: Outgoing) -> Result<PubAck, PublishError> {
    js.publish(message).await?.await
}

/// Sequences rise by one per stored message, in the order sent; a message whose id was stored
/// is confirmed with the first one's sequence, `duplicate`, and nothing is stored.
pub async fn sequences_rise_and_a_repeated_id_is_stored_once(js: &impl JetStream, prefix: &str) {
    let a = format!("{prefix}.a");
    let first = publish(js, message(a.clone(), "1", &[("Nats-Msg-Id", "m1")]))
        .await
        .unwrap();
    assert!(!first.duplicate);
    // Sent before either is awaited: stored in the order sent.
    let second = js
        .publish(message(format!("{prefix}.b"), "2", &[]))
        .await
        .unwrap();
    let third = js
        .publish(message(a.clone(), "3", &[("Nats-Msg-Id", "m3")]))
        .await
        .unwrap();
    let (second, third) = (second.await.unwrap(), third.await.unwrap());
    assert_eq!(
        (second.sequence, third.sequence),
        (first.sequence + 1, first.sequence + 2)
    );
    let again = publish(js, message(a.clone(), "1 again", &[("Nats-Msg-Id", "m1")]))
        .await
        .unwrap();
    assert_eq!(
        again,
        PubAck {
            sequence: first.sequence,
            duplicate: true
        }
    );
    let next = publish(js, message(a, "4", &[])).await.unwrap();
    assert_eq!(
        next.sequence,
        third.sequence + 1,
        "the repeat stored nothing"
    );
}

/// An expected last subject sequence stores the message only when the subject's last message
/// is there (0: none yet), on its own subject or the one named; otherwise 10071, nothing stored.
pub async fn an_expectation_stores_only_on_the_subjects_last_sequence(
    js: &impl JetStream,
    prefix: &str,
) {
    let fence = format!("{prefix}.fence");
    let expect = |n: u64| n.to_string();
    let first = publish(
        js,
        message(
            fence.clone(),
            "r1",
            &[("Nats-Expected-Last-Subject-Sequence", &expect(0))],
        ),
    )
    .await
    .unwrap();
    let stale = publish(
        js,
        message(
            fence.clone(),
            "r2",
            &[("Nats-Expected-Last-Subject-Sequence", &expect(0))],
        ),
    )
    .await;
    assert_eq!(
        stale.as_ref().err().and_then(PublishError::code),
        Some(10071),
        "{stale:?}"
    );
    let named = publish(
        js,
        message(
            format!("{prefix}.data"),
            "fenced",
            &[
                (
                    "Nats-Expected-Last-Subject-Sequence",
                    &expect(first.sequence),
                ),
                ("Nats-Expected-Last-Subject-Sequence-Subject", &fence),
            ],
        ),
    )
    .await
    .unwrap();
    assert_eq!(
        named.sequence,
        first.sequence + 1,
        "the refused one stored nothing"
    );
    let moved = publish(
        js,
        message(
            format!("{prefix}.data"),
            "fenced late",
            &[
                (
                    "Nats-Expected-Last-Subject-Sequence",
                    &expect(first.sequence + 7),
                ),
                ("Nats-Expected-Last-Subject-Sequence-Subject", &fence),
            ],
        ),
    )
    .await;
    assert_eq!(moved.err().and_then(|e| e.code()), Some(10071));
}

/// An atomic batch: the messages before the commit are answered by nothing; the commit names
/// the last one's sequence, all of them at consecutive sequences. A commit whose message id
/// was stored before is refused with 10201, nothing stored.
pub async fn an_atomic_batch_is_stored_together_once(js: &impl JetStream, prefix: &str) {
    let before = publish(js, message(format!("{prefix}.x"), "before", &[]))
        .await
        .unwrap();
    let send_batch = async |batch: &str| {
        for n in 1..=2 {
            js.send(message(
                format!("{prefix}.x"),
                &format!("b{n}"),
                &[
                    ("Nats-Batch-Id", batch),
                    ("Nats-Batch-Sequence", &n.to_string()),
                ],
            ))
            .await
            .unwrap();
        }
        publish(
            js,
            message(
                format!("{prefix}.x"),
                "b3",
                &[
                    ("Nats-Batch-Id", batch),
                    ("Nats-Batch-Sequence", "3"),
                    ("Nats-Batch-Commit", "1"),
                    ("Nats-Msg-Id", "batch-1"),
                ],
            ),
        )
        .await
    };
    let committed = send_batch("try-1").await.unwrap();
    assert_eq!(
        committed.sequence,
        before.sequence + 3,
        "three messages, together"
    );
    let again = send_batch("try-2").await;
    assert_eq!(
        again.as_ref().err().and_then(PublishError::code),
        Some(10201),
        "{again:?}"
    );
    let after = publish(js, message(format!("{prefix}.x"), "after", &[]))
        .await
        .unwrap();
    assert_eq!(
        after.sequence,
        committed.sequence + 1,
        "the second try stored nothing"
    );
}

/// A stream at its message limit (discard new) refuses: status 503, code 10077, and a
/// description that names the limit; nothing stored.
pub async fn a_full_stream_refuses_with_its_limit(js: &impl JetStream, prefix: &str) {
    for n in 0..2 {
        publish(js, message(format!("{prefix}.f"), &n.to_string(), &[]))
            .await
            .unwrap();
    }
    let refused = publish(js, message(format!("{prefix}.f"), "2", &[])).await;
    let api = refused.as_ref().err().and_then(PublishError::api).cloned();
    let api = api.unwrap_or_else(|| panic!("not a refusal: {refused:?}"));
    assert_eq!((api.status, api.code), (503, 10077), "{api:?}");
    assert!(api.description.contains("maximum messages"), "{api:?}");
}

fn run(limited: bool, check: impl AsyncFnOnce(&StreamModel, &str)) {
    let rt = crate::clock::paused_runtime();
    rt.block_on(async {
        let model = StreamModel::new("contract");
        if limited {
            model.limit_messages(2);
        }
        check(&model, "contract").await;
    });
}

#[test]
fn cluster_jetstream_model_keeps_every_contract_check() {
    macro_rules! check {
        ($name:ident, $limited:expr) => {
            run($limited, async |js, prefix| $name(js, prefix).await);
        };
    }
    crate::every_jetstream_contract_check!(check);
}

// The model's faults: with no leader nothing is stored ("no responders"); a lost answer leaves
// the message stored, and the same id sent again is confirmed as its duplicate.
#[test]
fn cluster_jetstream_model_faults_keep_the_outcome_knowable() {
    run(false, async |js, prefix| {
        js.leaderless(true);
        let lost = publish(js, message(format!("{prefix}.a"), "0", &[])).await;
        assert_eq!(lost, Err(PublishError::NoResponders));
        js.leaderless(false);
        js.lose_answers(1);
        let id = [("Nats-Msg-Id", "once")];
        let unknown = publish(js, message(format!("{prefix}.a"), "1", &id)).await;
        assert!(
            matches!(unknown, Err(PublishError::Unanswered(_))),
            "{unknown:?}"
        );
        let again = publish(js, message(format!("{prefix}.a"), "1", &id))
            .await
            .unwrap();
        assert!(again.duplicate, "{again:?}");
        assert_eq!(
            js.stored().len(),
            1,
            "stored once, nothing while leaderless"
        );
    });
}
