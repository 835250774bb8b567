//! What JetStream reads and answers on the wire: the headers that instruct it and the error
//! codes the gateway acts on (each named where it is acted on, with what it means).

use crate::cluster::jetstream::PublishError;

/// The NATS header JetStream deduplicates publishes by, within the stream's duplicate window.
pub(in crate::cluster::gateway) const MSG_ID: &str = "Nats-Msg-Id";

/// JetStream's "duplicate message id is in process" (409): a try with this id is being stored
/// right now (an earlier one whose answer did not come in time); sent again, the next try is
/// answered as that one's duplicate.
pub(in crate::cluster::gateway) const ID_IN_PROCESS: u64 = 10158;

/// JetStream's header: the expected last sequence of a subject.
pub(in crate::cluster::gateway) const EXPECTED_SEQUENCE: &str =
    "Nats-Expected-Last-Subject-Sequence";

/// JetStream's header (nats-server 2.11 and later): the subject `EXPECTED_SEQUENCE` is about,
/// when it is not the message's own.
pub(in crate::cluster::gateway) const EXPECTED_SUBJECT: &str =
    "Nats-Expected-Last-Subject-Sequence-Subject";

/// JetStream's "wrong last sequence": the expected record is no longer the subject's last.
pub(in crate::cluster::gateway) const WRONG_LAST_SEQUENCE: u64 = 10071;

/// JetStream's refusal of an expected last subject sequence while another message naming that
/// subject is still being stored (a replicated stream checks one at a time): nothing was
/// stored, and a later try can pass.
pub(in crate::cluster::gateway) const EXPECTATION_BUSY: u64 = 10164;

/// JetStream's "maximum messages exceeded" and "maximum bytes exceeded" (discard new).
pub(in crate::cluster::gateway) const STREAM_FULL: [u64; 2] = [10077, 10047];

/// The batch's id, the same on each of its messages (a new one on every try).
pub(in crate::cluster::gateway) const BATCH_ID: &str = "Nats-Batch-Id";

/// A message's place in its batch, from 1.
pub(in crate::cluster::gateway) const BATCH_SEQUENCE: &str = "Nats-Batch-Sequence";

/// On the last message: store the batch.
pub(in crate::cluster::gateway) const BATCH_COMMIT: &str = "Nats-Batch-Commit";

/// JetStream's "atomic publish batch contains duplicate message id": an earlier try of this
/// batch was stored (nothing of this one is).
pub(in crate::cluster::gateway) const CONTAINS_DUPLICATE: u64 = 10201;

/// JetStream's "atomic publish too many inflight": the stream has as many batches open as its
/// servers allow (50 by default), nothing of this one stored; sent again after a pause.
pub(in crate::cluster::gateway) const TOO_MANY_IN_FLIGHT: u64 = 10210;

/// Whether JetStream answered "unavailable for now" (503: its cluster or the stream's leader
/// is not ready), which a later try can get past.
pub(in crate::cluster::gateway) fn unavailable_for_now(error: &PublishError) -> bool {
    error.api().is_some_and(|api| api.status == 503)
}

/// JetStream's error code, when it refused a publish.
pub(in crate::cluster::gateway) fn jetstream_code(error: &PublishError) -> Option<u64> {
    error.code()
}
