//! A bridge's acks to JetStream, confirmed (docs/semantics.md#cluster-ack-final).

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use crate::cluster::gateway::{Shared, control::lease::LeaseGate};
use crate::cluster::jetstream::{AckError, AckReply, Answer};

/// A singleton's lease check, read before every try of its acks
/// (docs/semantics.md#cluster-lease-checks): the gateway's lease, and the incarnation its held
/// messages were pulled under (any incarnation's lease when `None`).
pub(in crate::cluster::gateway) type Gate = (Arc<LeaseGate>, Option<u64>);

/// How long one try of an ack (or term) waits for JetStream's confirmation before it is sent
/// again.
const ACK_TRY: Duration = Duration::from_secs(1);
/// Most acks of one bridge awaiting JetStream's confirmation at once; one past them is sent
/// unconfirmed, and counted (`unconfirmed_acks`). Acks wait only while JetStream does not
/// answer, and then it delivers nothing new either, so this is reached only by a consumer with
/// windows this large.
pub(in crate::cluster::gateway) const MAX_CONFIRMING: usize = 16_384;
/// How long a stopping bridge waits for its acks' confirmations before leaving them to finish
/// on their own.
pub(in crate::cluster::gateway) const CONFIRM_ON_STOP: Duration = Duration::from_secs(2);

/// A bridge's acks and terms on their way (docs/semantics.md#cluster-ack-final): each is a
/// request JetStream answers once its consumer applied it (the "double ack"), sent again by a
/// task of its own until answered, so many go out at once and none waits for another, and the
/// bridge goes on meanwhile.
///
/// A fire-and-forget ack in flight to a consumer leader that stops is lost, and JetStream
/// redelivers the message after its ack wait: an acked message delivered again. Confirmed, it
/// is sent again (to the consumer's next leader) until JetStream answers, for up to
/// `--nats-ack-wait`; one still unanswered then is counted in `unconfirmed_acks`. Meanwhile a
/// redelivery of its message is acked again, not delivered.
#[derive(Default)]
pub(in crate::cluster::gateway) struct Confirming {
    pub(in crate::cluster::gateway) tasks: tokio::task::JoinSet<u64>,
    /// By stream sequence, what is being confirmed (and how many tasks for it).
    pub(in crate::cluster::gateway) sequences: BTreeMap<u64, (Answer, usize)>,
}

impl Confirming {
    /// Forgets the confirmations that ended.
    pub(in crate::cluster::gateway) fn reap(&mut self) {
        while let Some(done) = self.tasks.try_join_next() {
            if let Ok(sequence) = done {
                self.ended(sequence);
            }
        }
    }

    /// Waits until every confirmation on its way ended: confirmed, past its patience, or past
    /// the gateway's lease.
    pub(in crate::cluster::gateway) async fn settle_all(&mut self) {
        while let Some(done) = self.tasks.join_next().await {
            if let Ok(sequence) = done {
                self.ended(sequence);
            }
        }
    }

    fn ended(&mut self, sequence: u64) {
        if let Some((_, tasks)) = self.sequences.get_mut(&sequence) {
            *tasks -= 1;
            if *tasks == 0 {
                self.sequences.remove(&sequence);
            }
        }
    }
}

/// Sends `kind` (an ack or a term) for stream message `sequence` on `reply` until JetStream
/// answers, for up to `patience`; counts it in `unconfirmed_acks` when it never does. A
/// singleton's (`gate`) is sent only while the gateway's lease is valid, checked before each
/// try: while it is lapsed the ack waits for its renewal, and once it ended for good nothing
/// more is sent, and JetStream redelivers the message to the member the cluster promoted (its
/// epoch higher).
pub(in crate::cluster::gateway) async fn confirm(
    shared: Arc<Shared>,
    subscription: Arc<str>,
    reply: AckReply,
    kind: Answer,
    sequence: u64,
    patience: Duration,
    gate: Option<Gate>,
) -> u64 {
    let deadline = tokio::time::Instant::now() + patience;
    let mut delay = Duration::from_millis(5);
    let mut tries = 0u32;
    loop {
        if let Some((lease, incarnation)) = &gate {
            let leased = match incarnation {
                Some(incarnation) => lease.valid_for(*incarnation),
                None => lease.valid().is_some(),
            };
            // Lapsed: it waits (within its patience) for the lease renewed in the same
            // incarnation, which no other gateway took for dead
            // (docs/semantics.md#cluster-lease-lapse). Ended for good: nothing is sent.
            let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
            let renewed = !leased
                && match incarnation {
                    Some(incarnation) => lease.wait_valid_for(*incarnation, remaining).await,
                    None => lease.wait_valid(remaining).await.is_some(),
                };
            if !leased && !renewed {
                if incarnation.is_some_and(|i| lease.incarnation() != i) {
                    // Answered, never confirmed: its message goes to the member promoted
                    // (docs/semantics.md#cluster-ack-final).
                    shared.broker.count_unconfirmed_ack();
                    tracing::debug!(%subscription, sequence, ?kind, tries, "past this gateway's lease: the ack is not sent (again); JetStream redelivers to the member promoted");
                } else {
                    // Still lapsed past the patience: the member is about to be ended.
                    shared.broker.count_unconfirmed_ack();
                    tracing::warn!(%subscription, sequence, ?kind, tries, "this gateway's lease stayed lapsed for --nats-ack-wait: an ack was not sent; JetStream may deliver the message again");
                }
                return sequence;
            }
        }
        tries += 1;
        let error = match shared.jetstream.confirm(&reply, kind, ACK_TRY).await {
            Ok(_) => {
                if tries > 1 {
                    tracing::debug!(%subscription, sequence, tries, "JetStream confirmed an ack sent again");
                }
                return sequence;
            }
            Err(error) => error,
        };
        if error == AckError::NoResponders
            && crate::core::planted::active(
                crate::core::planted::PlantedBug::AckGivenUpWithoutLeader,
            )
        {
            return sequence;
        }
        if tokio::time::Instant::now() >= deadline {
            shared.broker.count_unconfirmed_ack();
            tracing::warn!(%subscription, sequence, ?kind, tries, %error, "JetStream did not confirm an ack within --nats-ack-wait; it may deliver the message again");
            return sequence;
        }
        // "No responders" (the consumer's leader moving) or a broken connection come at once:
        // paced, 5 ms doubling to 200 ms. A try not answered in time has already waited.
        if error != AckError::TimedOut {
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_millis(200));
        }
    }
}

/// Whether the subscription's JetStream consumer expects acks: for acked subscriptions, and
/// for ack-free singletons too, whose gateway acks a message once it is written to the active
/// member's stream (the local core's ack-free "done"). So what a gateway pulled but had not
/// yet written when its active member left goes back to JetStream with the rest, in order,
/// for the next active member, rather than being lost with JetStream counting it delivered.
/// An ack-free QUEUE or BROADCAST consumer acks nothing: the message is done once pulled.
pub(in crate::cluster::gateway) fn acked_upstream(spec: &crate::core::SubscriptionSpec) -> bool {
    spec.ack_mode == crate::core::AckMode::Explicit || spec.mode == crate::core::Mode::Singleton
}
