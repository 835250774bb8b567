//! Fenced publishes through gateways (docs/semantics.md#cluster-fenced-publish).
//!
//! Every SINGLETON subscription has a fence subject in the stream,
//! `$TBFENCE.<stream>.<its consumer's name>`, outside the topics' `<stream>.>`, so no
//! subscription's consumer ever brings its messages. Its last message, the *record*, says the
//! subscription's epoch and whether a member is active with it:
//! - the gateway that activates a member writes the record of its epoch first, and activates
//!   the member only once JetStream stored it ([`Fences::record`]);
//! - the gateway whose write empties a line records that its epoch ended.
//!
//! Records on a subject only rise (by epoch, then active before ended): each write names, in
//! `Nats-Expected-Last-Subject-Sequence`, the record it read, and a writer that reads a record
//! at or above its own writes nothing. The records it replaced are purged after it.
//!
//! A fenced publish carries `Nats-Expected-Last-Subject-Sequence` with the sequence of its
//! epoch's record and `Nats-Expected-Last-Subject-Sequence-Subject` naming the fence subject:
//! JetStream stores it only while that record is the subject's last, in the same step as the
//! store. So once a member was made active with a later epoch (its record written first), no
//! publish fenced by an earlier one is stored, whichever gateway it comes through.
//!
//! The records are kept by one consumer of the stream ([`FENCE_CONSUMER`](names::FENCE_CONSUMER)) that nobody reads: the
//! stream's interest retention keeps a message only while some consumer has it pending.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use crate::cluster::jetstream::{JetStream, Outgoing};

use crate::cluster::gateway::{
    control::lease::LeaseGate,
    wire::codes::{EXPECTED_SEQUENCE, STREAM_FULL, WRONG_LAST_SEQUENCE, jetstream_code},
    wire::names,
};
use crate::{
    broker::Activation,
    core::{Error, MemberId, Mode},
};

/// How long a request about a record waits for JetStream (its API requests would otherwise
/// wait the NATS client's request timeout, 10 s).
const PATIENCE: Duration = Duration::from_secs(2);

/// How long an activation's record waits for a lapsed lease to be renewed: past the lapse
/// patience the lease has ended (a new incarnation), which ends the wait sooner.
const RECORD_LAPSE_WAIT: Duration = Duration::from_secs(15);

/// At most this many fence subjects' last records are kept in memory (then forgotten all at
/// once: a record not known is read from JetStream).
const MAX_KNOWN: usize = 4096;

/// What a fence record says: an epoch, and whether it ended (no member is active with it).
/// Ordered as records rise: by epoch, then active before ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(in crate::cluster::gateway) struct Record {
    pub(in crate::cluster::gateway) epoch: u64,
    pub(in crate::cluster::gateway) ended: bool,
}

impl Record {
    /// A member is active with `epoch`.
    pub(in crate::cluster::gateway) fn active(epoch: u64) -> Self {
        Self {
            epoch,
            ended: false,
        }
    }

    /// `epoch` ended with no member active after it.
    pub(in crate::cluster::gateway) fn ended(epoch: u64) -> Self {
        Self { epoch, ended: true }
    }

    fn encode(self) -> String {
        let state = if self.ended { "ended" } else { "active" };
        format!("{state} {}", self.epoch)
    }

    fn decode(payload: &[u8]) -> Option<Self> {
        let (state, epoch) = std::str::from_utf8(payload).ok()?.split_once(' ')?;
        let ended = match state {
            "active" => false,
            "ended" => true,
            _ => return None,
        };
        Some(Self {
            epoch: epoch.parse().ok()?,
            ended,
        })
    }
}

/// What one try of writing a record found.
enum Tried {
    /// A record at or above the one wanted is the subject's last.
    Done,
    /// The last record moved under the write: read it again.
    Moved,
    /// The stream is full: the record below the one wanted is gone, none written.
    Full,
}

/// A gateway's fence records: written at activations and emptied lines, read by fenced
/// publishes.
pub(in crate::cluster::gateway) struct Fences {
    jetstream: Arc<dyn JetStream>,
    /// The stream the records are kept in: read, purged, and asked whether a gone
    /// subscription's consumer is really gone.
    consumers: Arc<dyn crate::cluster::jetstream::Stream>,
    name: String,
    /// The last record this gateway read or wrote on each fence subject, with its sequence:
    /// a fenced publish names it without reading it again (JetStream refuses it if it moved).
    known: Mutex<HashMap<String, (u64, Record)>>,
    /// One fenced publish at a time per fence subject at this gateway: a replicated stream
    /// refuses a second expectation of one subject while the first is being stored.
    turns: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl std::fmt::Debug for Fences {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fences")
            .field("stream", &self.name)
            .finish_non_exhaustive()
    }
}

impl Fences {
    pub(in crate::cluster::gateway) fn new(
        jetstream: Arc<dyn JetStream>,
        consumers: Arc<dyn crate::cluster::jetstream::Stream>,
    ) -> Self {
        let name = consumers.name().to_string();
        Self {
            jetstream,
            consumers,
            name,
            known: Mutex::default(),
            turns: Mutex::default(),
        }
    }

    /// The stream's name.
    pub(in crate::cluster::gateway) fn name(&self) -> &str {
        &self.name
    }

    /// The last record this gateway read or wrote on `subject`, with its sequence.
    pub(in crate::cluster::gateway) fn known(&self, subject: &str) -> Option<(u64, Record)> {
        self.known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(subject)
            .copied()
    }

    /// Moves `subscription`'s fence to `wanted`: writes it as the record, unless a record at
    /// or above it is there already. Returns `true` once no record below `wanted` is left to
    /// pass a fenced publish, `false` if `still` turned false first (it is asked before every
    /// try). Tries again after a failure, 5 ms doubling to 200 ms.
    ///
    /// A full stream (discard new) takes no new record: then the record below `wanted` is
    /// removed instead, so no fenced publish of the subscription passes (`true`), and an
    /// active record's write goes on in the background, every second at most, until it is
    /// stored, a record at or above it is, or `still` turns false. A promotion so never waits
    /// for room in the stream. (An ended epoch needs no record written later: with none,
    /// nothing passes either.)
    pub(in crate::cluster::gateway) async fn record(
        self: &Arc<Self>,
        subscription: &str,
        wanted: Record,
        still: impl Fn() -> bool + Send + Sync + 'static,
    ) -> bool {
        let subject = names::fence_subject(&self.name, subscription);
        let mut delay = Duration::from_millis(5);
        loop {
            if !still() {
                return false;
            }
            match self.try_record(&subject, wanted, &still).await {
                Ok(Tried::Done) => return true,
                // Another writer moved the record meanwhile: read it again.
                Ok(Tried::Moved) => {}
                Ok(Tried::Full) if !wanted.ended => {
                    tracing::warn!(%subscription, ?wanted, "the stream is full: the fence record waits for room, and until it is stored no publish fenced by this subscription is taken");
                    let this = self.clone();
                    tokio::spawn(async move {
                        this.record_when_room(&subject, wanted, still).await;
                    });
                    return true;
                }
                Ok(Tried::Full) => return true,
                Err(error) => {
                    tracing::debug!(%subscription, ?wanted, %error, "a fence record was not written; trying again");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_millis(200));
                }
            }
        }
    }

    /// [`Fences::record`]'s write that a full stream refused, tried again every second at most.
    async fn record_when_room(
        &self,
        subject: &str,
        wanted: Record,
        still: impl Fn() -> bool + Send + Sync,
    ) {
        let mut delay = Duration::from_millis(50);
        while still() {
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(1));
            match self.try_record(subject, wanted, &still).await {
                Ok(Tried::Done) => {
                    tracing::info!(%subject, ?wanted, "the fence record that waited for room is stored");
                    break;
                }
                Ok(Tried::Moved) => delay = Duration::from_millis(5),
                Ok(Tried::Full) | Err(_) => {}
            }
        }
    }

    /// One try of [`Fences::record`].
    async fn try_record(
        &self,
        subject: &str,
        wanted: Record,
        still: &(dyn Fn() -> bool + Send + Sync),
    ) -> Result<Tried, String> {
        let last = self.read(subject).await?;
        if let Some((_, record)) = last
            && record >= wanted
        {
            return Ok(Tried::Done);
        }
        if last.is_none() && wanted.ended {
            // With no record nothing passes already; one written now could outlive its
            // subscription (deleted meanwhile, its record removed).
            return Ok(Tried::Done);
        }
        // Asked again after the read, which may have taken a while: the write follows at once.
        if !still() {
            return Err("given up".into());
        }
        let expected = last.map_or(0, |(sequence, _)| sequence);
        let message = Outgoing {
            subject: subject.to_string(),
            headers: vec![(EXPECTED_SEQUENCE.to_string(), expected.to_string())],
            payload: wanted.encode().into(),
        };
        let sent = self
            .jetstream
            .publish(message)
            .await
            .map_err(|e| e.to_string())?;
        match sent.await {
            Ok(ack) => {
                self.remember(subject, ack.sequence, wanted);
                if expected != 0 {
                    // The replaced record, and any older one left behind: nothing names them.
                    let stream = self.consumers.clone();
                    let subject = subject.to_string();
                    tokio::spawn(async move {
                        let _ = purge_through(stream.as_ref(), &subject, expected).await;
                    });
                }
                Ok(Tried::Done)
            }
            Err(error) => match jetstream_code(&error) {
                Some(WRONG_LAST_SEQUENCE) => Ok(Tried::Moved),
                Some(code) if STREAM_FULL.contains(&code) => {
                    if expected != 0 {
                        // The record below `wanted` goes, so that none passes, and with it any
                        // older one a lost clean-up left behind (which would be the last
                        // again). A record at or above it written meanwhile is never removed:
                        // it comes after the one read.
                        purge_through(self.consumers.as_ref(), subject, expected).await?;
                        self.forget(subject);
                    }
                    Ok(Tried::Full)
                }
                _ => Err(error.to_string()),
            },
        }
    }

    /// The last record of `subject` from the stream's leader, remembered.
    pub(in crate::cluster::gateway) async fn read(
        &self,
        subject: &str,
    ) -> Result<Option<(u64, Record)>, String> {
        let read = tokio::time::timeout(PATIENCE, self.consumers.last_message(subject))
            .await
            .map_err(|_| format!("no answer within {PATIENCE:?}"))?;
        match read {
            Ok(Some(message)) => {
                let record = Record::decode(&message.payload).ok_or_else(|| {
                    format!(
                        "the fence record {} on {subject} is unreadable",
                        message.sequence
                    )
                })?;
                self.remember(subject, message.sequence, record);
                Ok(Some((message.sequence, record)))
            }
            Ok(None) => {
                self.forget(subject);
                Ok(None)
            }
            Err(error) => Err(error.to_string()),
        }
    }

    fn remember(&self, subject: &str, sequence: u64, record: Record) {
        let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        // Never back: a slower read may end after a newer write.
        if known.get(subject).is_some_and(|&(at, _)| at > sequence) {
            return;
        }
        if known.len() >= MAX_KNOWN && !known.contains_key(subject) {
            known.clear();
        }
        known.insert(subject.to_string(), (sequence, record));
    }

    fn forget(&self, subject: &str) {
        self.known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(subject);
    }

    pub(in crate::cluster::gateway) fn turn(&self, subject: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut turns = self.turns.lock().unwrap_or_else(PoisonError::into_inner);
        // Turns nobody holds or waits for go.
        if turns.len() >= MAX_KNOWN {
            turns.retain(|_, turn| Arc::strong_count(turn) > 1);
        }
        turns.entry(subject.to_string()).or_default().clone()
    }

    /// The consumer `consumer` was deleted (`DeleteSubscription`, or JetStream removed it after
    /// its idle timeout): its subscription's last record, if it says its epoch ended, is
    /// deleted, so records do not outlive their subscriptions. One that says a member is
    /// active stays: it is a new subscription's of that id (made again meanwhile). Either
    /// way nothing passes that did not before: with no record no fenced publish passes.
    fn gone(self: &Arc<Self>, consumer: &str) {
        if !consumer.starts_with("tb-q-") {
            return;
        }
        let subject = names::fence_subject_of(&self.name, consumer);
        let consumer = consumer.to_string();
        let this = self.clone();
        tokio::spawn(async move {
            let outcome = match this.read(&subject).await {
                Ok(Some((sequence, record))) => {
                    // An active record stays if its subscription lives (made again
                    // meanwhile); one whose consumer is gone is left over from the line's
                    // last epoch (its end not recorded yet, or never).
                    let orphan = record.ended || !this.consumer_exists(&consumer).await;
                    if orphan {
                        this.forget(&subject);
                        purge_through(this.consumers.as_ref(), &subject, sequence).await
                    } else {
                        Ok(())
                    }
                }
                Ok(None) => Ok(()),
                Err(error) => Err(error),
            };
            if let Err(error) = outcome {
                tracing::debug!(%subject, %error, "a gone subscription's fence record stays");
            }
        });
    }

    /// Whether the consumer `name` exists (taken as existing when JetStream does not say).
    async fn consumer_exists(&self, name: &str) -> bool {
        !matches!(
            crate::cluster::gateway::wire::stream::named_consumer(self.consumers.as_ref(), name)
                .await,
            Ok(None)
        )
    }

    /// Follows the stream's consumer deletions ([`Fences::gone`]) until `client` closes.
    pub(in crate::cluster::gateway) async fn follow_deletions(
        self: Arc<Self>,
        bus: &dyn crate::cluster::bus::Bus,
    ) -> Result<tokio::task::JoinHandle<()>, String> {
        use tokio_stream::StreamExt;
        let mut deleted = bus
            .subscribe(&format!(
                "$JS.EVENT.ADVISORY.CONSUMER.DELETED.{}.*",
                self.name
            ))
            .await
            .map_err(|e| format!("cannot watch the stream's consumer deletions: {e}"))?;
        Ok(tokio::spawn(async move {
            while let Some(advisory) = deleted.next().await {
                if let Some(consumer) = advisory.subject.as_str().rsplit('.').next() {
                    self.gone(consumer);
                }
            }
        }))
    }
}

/// Called once the record of an activation's epoch is stored: the shell activates the member
/// if the line still makes it active with that epoch.
type OnRecorded = Arc<dyn Fn(Arc<str>, MemberId, Activation) + Send + Sync>;

/// Called once the record of a stepped-down member's ended epoch is stored (or could not be,
/// the lease having ended): the shell tells the member, at its place in line.
type OnEnded = Arc<dyn Fn(Arc<str>, MemberId, u32) + Send + Sync>;

/// Per local member (subscription, member id) whose activation's record is being written:
/// whether it still may be.
/// Per local member whose activation was handed here: its record write's flag (whether it
/// still may be written), and whether the shell has applied the activation since (settled).
type Live = BTreeMap<(String, MemberId), (Arc<AtomicBool>, bool)>;

/// What the singleton shell writes fence records with: an activation waits for its epoch's
/// record, and an emptied line's epoch is recorded as ended. Each is given up once this
/// gateway's lease is not valid (it activates nobody then); an activation's also once its
/// member left or was ended ([`Recording::lost`]), so a write that a full stream held back
/// never lands after its member's successor was made active.
#[derive(Clone)]
pub(in crate::cluster::gateway) struct Recording {
    fences: Arc<Fences>,
    lease: Arc<LeaseGate>,
    on_recorded: OnRecorded,
    on_ended: OnEnded,
    /// Per local member whose activation's record is being written: whether it still may be.
    live: Arc<Mutex<Live>>,
}

impl Recording {
    pub(in crate::cluster::gateway) fn new(
        fences: Arc<Fences>,
        lease: Arc<LeaseGate>,
        on_recorded: impl Fn(Arc<str>, MemberId, Activation) + Send + Sync + 'static,
        on_ended: impl Fn(Arc<str>, MemberId, u32) + Send + Sync + 'static,
    ) -> Self {
        Self {
            fences,
            lease,
            on_recorded: Arc::new(on_recorded),
            on_ended: Arc::new(on_ended),
            live: Arc::default(),
        }
    }

    /// `member` of `subscription` stepped down from `epoch`, which no member holds any more:
    /// its record says so before the member is told (at `position`), so a publish it fences
    /// with that epoch once told is refused (docs/semantics.md#cluster-fenced-publish). A
    /// record already above it (its successor's) is left as it is. Tried while this gateway's
    /// lease is valid; the member is told either way.
    pub(in crate::cluster::gateway) fn stepped_down(
        &self,
        subscription: String,
        member: MemberId,
        position: u32,
        epoch: u64,
    ) {
        let this = self.clone();
        tokio::spawn(async move {
            let lease = this.lease.clone();
            this.fences
                .record(&subscription, Record::ended(epoch), move || {
                    lease.valid().is_some()
                })
                .await;
            (this.on_ended)(Arc::from(subscription), member, position);
        });
    }

    /// Writes the record of `activation`'s epoch, then hands the activation back.
    pub(in crate::cluster::gateway) fn activate(
        &self,
        subscription: String,
        member: MemberId,
        activation: Activation,
    ) {
        let live = Arc::new(AtomicBool::new(true));
        let earlier = self
            .live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert((subscription.clone(), member), (live.clone(), false));
        if let Some((earlier, _)) = earlier {
            earlier.store(false, Ordering::SeqCst);
        }
        let this = self.clone();
        // Written only under a valid lease, checked right before the write: a full stream
        // deletes the record below the one it refused, so a deposed gateway's late write could
        // lower it. While the lease is lapsed the write waits for its renewal, and is given up
        // once the member is gone or the lease ended for good (a new incarnation): a member is
        // confirmed only after its record (docs/semantics.md#cluster-lease-lapse).
        let incarnation = self.lease.incarnation();
        tokio::spawn(async move {
            let lease = this.lease.clone();
            let wanted = Record::active(activation.epoch);
            loop {
                let (live_now, lease_now) = (live.clone(), lease.clone());
                let still =
                    move || live_now.load(Ordering::SeqCst) && lease_now.valid_for(incarnation);
                if this.fences.record(&subscription, wanted, still).await {
                    (this.on_recorded)(Arc::from(subscription), member, activation);
                    return;
                }
                if !live.load(Ordering::SeqCst)
                    || !lease.wait_valid_for(incarnation, RECORD_LAPSE_WAIT).await
                {
                    return;
                }
            }
        });
    }

    /// The shell applied `member`'s activation (or found it stale): it is on its way no more.
    /// A record write still under way for it goes on (its flag is its own).
    pub(in crate::cluster::gateway) fn settled(&self, subscription: &str, member: MemberId) {
        // A member that left (`lost`) has no entry any more, and gets none.
        if let Some((_, settled)) = self
            .live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_mut(&(subscription.to_string(), member))
        {
            *settled = true;
        }
    }

    /// Whether an activation of `member` of `subscription` was handed here and is still on its
    /// way: its record being written, or the shell not yet having applied it.
    pub(in crate::cluster::gateway) fn activating(
        &self,
        subscription: &str,
        member: MemberId,
    ) -> bool {
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&(subscription.to_string(), member))
            .is_some_and(|(live, settled)| !settled && live.load(Ordering::SeqCst))
    }

    /// `member` of `subscription` left or was ended: its activation's record is written no
    /// more.
    pub(in crate::cluster::gateway) fn lost(&self, subscription: &str, member: MemberId) {
        if let Some((live, _)) = self
            .live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&(subscription.to_string(), member))
        {
            live.store(false, Ordering::SeqCst);
        }
    }

    /// Every member here was ended (the lease ended for good).
    pub(in crate::cluster::gateway) fn lost_all(&self) {
        let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        for (_, (flag, _)) in std::mem::take(&mut *live) {
            flag.store(false, Ordering::SeqCst);
        }
    }

    /// Records that `epoch` of `subscription` ended: its line was emptied by this gateway's
    /// write.
    pub(in crate::cluster::gateway) fn ended(&self, subscription: String, epoch: u64) {
        let this = self.clone();
        tokio::spawn(async move {
            let lease = this.lease.clone();
            let written = this
                .fences
                .record(&subscription, Record::ended(epoch), move || {
                    lease.valid().is_some()
                })
                .await;
            if written {
                // The subscription may have expired (or been deleted) while this was written:
                // its consumer's deletion advisory then found the record below this one, and
                // this one would outlive its subscription.
                let consumer = names::consumer_name(Mode::Singleton, &subscription, "");
                if !this.fences.consumer_exists(&consumer).await {
                    this.fences.gone(&consumer);
                }
            }
        });
    }
}

pub(in crate::cluster::gateway) fn unavailable(why: String) -> Error {
    Error::Unavailable(format!(
        "the fence's record could not be read from JetStream ({why}); nothing was stored: try again"
    ))
}

/// Removes every message of `subject` up to and including `sequence` (records a newer one
/// replaced, never one after it).
async fn purge_through(
    stream: &dyn crate::cluster::jetstream::Stream,
    subject: &str,
    sequence: u64,
) -> Result<(), String> {
    let purge = stream.purge(subject, sequence + 1);
    match tokio::time::timeout(PATIENCE, purge).await {
        Err(_) => Err(format!("the old fence records of {subject}: no answer")),
        Ok(Ok(_)) => Ok(()),
        Ok(Err(error)) => Err(format!("the old fence records of {subject}: {error}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_rise_by_epoch_then_active_before_ended() {
        assert!(Record::active(3) < Record::ended(3));
        assert!(Record::ended(3) < Record::active(4));
        for record in [Record::active(7), Record::ended(u64::MAX)] {
            assert_eq!(Record::decode(record.encode().as_bytes()), Some(record));
        }
        for bad in ["", "active", "active x", "gone 3", "active 3 4"] {
            assert_eq!(Record::decode(bad.as_bytes()), None, "{bad:?}");
        }
    }

    #[test]
    fn fence_subjects_sit_outside_the_topics() {
        let subject = names::fence_subject("tb", "jobs.leader");
        assert!(subject.starts_with("$TBFENCE.tb."), "{subject}");
        assert_eq!(names::topic_of("tb", &subject), None);
        assert_eq!(
            subject.split('.').count(),
            3,
            "one token for the id: {subject}"
        );
    }
}
