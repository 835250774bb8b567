//! One gateway's coordination of singleton subscriptions, as a sans-IO state machine: no I/O, no
//! clock reads, no tokio. The shell feeds it inputs with `now` (the gateway's own monotonic clock)
//! and executes what it asks for.
//!
//! # Driving it
//! - inputs: [`Coordinator::member_joined`], [`Coordinator::member_left`],
//!   [`Coordinator::backplane_changed`] (every watch entry of the bucket, in order),
//!   [`Coordinator::write_result`] (the answer to a [`Command`]), [`Coordinator::tick`] (when
//!   [`Coordinator::poll_timeout`] is due);
//! - after every input, drain [`Coordinator::poll_command`] (writes to run on the backplane) and
//!   [`Coordinator::poll_effect`] (frames or stream ends for local members), then re-arm the timer
//!   from [`Coordinator::poll_timeout`]. When [`Coordinator::is_fenced`] turns true the gateway
//!   lost its lease: it has ended every member, and the shell starts a new incarnation with a new
//!   [`GatewayId`] (as if restarted).
//!
//! # Keys
//! - `lease.<gateway>`: the gateway's lease, created at start, renewed by compare-and-set every
//!   `lease / 3`, deleted (by compare-and-set) by another gateway that finds it stale.
//! - `sub.<subscription>`: a [`SubValue`]: the line (members in join order), the active member and
//!   its epoch, in ONE key, so that "remove the leaving active member and promote the next" is one
//!   compare-and-set and never half done. The write that empties the line deletes the key
//!   instead (by compare-and-set), so no gateway keeps subscriptions nobody is in (the bucket
//!   keeps the key's delete marker); the next join creates it again.
//!
//! # Epochs
//! A write that makes a member active stores as its epoch the revision of the value it replaces
//! (the revision it compare-and-sets against). For two successive promotions P1, P2 of one key,
//! P2 replaces a value at least as new as P1's own write, whose revision is above the one P1
//! replaced: epochs strictly increase, for as long as the bucket lives, whichever gateway wrote
//! them and across gateway restarts. Every reader finds the epoch in the value itself, also
//! after a gap in its watch.
//! Deleting an emptied key keeps this: revisions are bucket-wide, so the value that recreates
//! it, and so the first promotion after, replaces a revision above every one written before.
//!
//! With an epoch floor in the bucket (key `ids`, raised by each gateway at start so epochs are
//! above its start time), the epoch is `max(replaced revision, the floor's revision) +
//! offset`, made only once the watch delivered the replaced value. P1 saw its floor before it
//! wrote, so P2, whose replaced revision is above P1's write, has seen that floor or a higher
//! one (offsets only rise): its epoch is higher still (docs/semantics.md#cluster-restart-identity).
//!
//! # Promotion
//! Every gateway reconciles each subscription's value with what it holds: its own members in the
//! line are exactly those it holds locally (a member that left is removed, a new one appended),
//! members of dead gateways (lease deleted) are removed, and when the active member is removed
//! (or there is none) the first member of the new line becomes active, in the same write. So on a
//! clean close the leaving member's gateway promotes the next member, whichever gateway holds it;
//! that gateway sees the value on its watch and sends the confirmation ([`Effect::Activate`]).
//! Conflicts (a failed compare-and-set) are retried once the watch shows the newer value.
//!
//! # Leases and the clock assumption
//! Clocks may have any offset but run at a rate within `1 ± ρ` of true time (`max_drift_percent`
//! = ρ; only durations measured on one clock are ever compared).
//! - A gateway's lease is valid until `s + lease` on its own clock, where `s` is when it *sent*
//!   the last renewal that succeeded. It acts for a member (activates it; its shell hands it
//!   messages and acks for it) only while its lease is valid. Past that instant, unrenewed, it
//!   *lapses*: it acts for nobody and goes on renewing; a renewal confirmed ends the lapse
//!   (the lease is valid again from that renewal's send time). It ends every member's stream
//!   with `UNAVAILABLE` and fences itself for good (it activates nobody again) when it learns
//!   that its lease was deleted, or once it has been lapsed for `lapse_patience`.
//! - Another gateway that last observed a change of `lease.<g>` at `o` (its clock) deletes it, by
//!   compare-and-set on the revision it saw, once `lease·(1+ρ)/(1−ρ) + margin` has passed on its
//!   clock; only then (lease deleted) do gateways remove g's members and promote others. It
//!   counts that time only while its own writes are answered: while one of its writes goes
//!   unanswered (the bucket may have had no leader, for every gateway) it deletes nothing, and
//!   when its next write is answered, `o` moves later by the time since that write was sent.
//!   Moving `o` later only delays a deletion.
//!
//! Why two members are never active in overlapping periods: the renewal observed at `o` was sent
//! at some true time `s ≤ o`; g stops acting at most `lease/(1−ρ)` true time after the send of its
//! last *confirmed* renewal, which is no later than `s`. The observer waits at least
//! `(lease·(1+ρ)/(1−ρ) + margin)/(1+ρ) ≥ lease/(1−ρ)` true time after `o`. So g's members ended
//! before the deletion, and every later activation follows the deletion. A renewal the observer
//! did not see in time fails its compare-and-set against the deleted key: the deletion wins or
//! loses atomically. So does a lapsed gateway's renewal: if it is confirmed, no deletion came
//! before it (a deletion compares against the revision it replaced), so nobody promoted past
//! g's members, and g may act for them again; if a deletion came first, the renewal is refused
//! (no value) and g fences. A clean close promotes only after the leaving member's stream is
//! closed.
//!
//! # Messages
//! Messages are not the coordinator's: [`Effect::Activate`] is where the gateway's shell
//! (`gateway::control::singleton`) makes the member active on the local broker with the epoch as its
//! fence, and the subscription's bridge pulls for it from the JetStream consumer; what a
//! leaving gateway gave back rides with the promotion as its carry ([`SubValue::carry`]).
//!
//! # Priorities and hand-overs
//! The line stands in priority order behind its active member; the gateway holding the active
//! member steps it down at a message boundary when the line asks for it, and moves the line
//! past it once it settled (`step_down.rs`,
//! docs/semantics.md#cluster-priority-and-hand-over).
//!
//! # Files
//! One state machine in four files: this one holds its state, its inputs and the pending
//! writes both concerns share; [`liveness`] the leases (this gateway's and the others'), which
//! the safety argument above is about; [`line`] the reconciliation of each subscription's line
//! ("Promotion" above); `step_down.rs` priorities and hand-overs; `io.rs` the commands and
//! effects the shell carries out.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use bytes::Bytes;

use super::backplane::{KvError, Revision};
pub use super::values::{GatewayId, Key, MemberUid, StepDownCause, SubValue, lease_key, sub_key};
use crate::core::planted::{PlantedBug, active as planted};

mod io;
pub use io::{Command, Effect, EndStatus, Op, Proclaimed, RequestId};

/// Most given-back messages whose attempts one promotion carries ([`SubValue::carry`]).
pub const MAX_CARRY: usize = 1024;

/// Most bytes of member metadata one line holds ([`SubValue::meta`]): a line is one value of
/// the bucket, written whole on every join, leave and promotion, and must stay well within the
/// NATS servers' `max_payload` (docs/semantics.md#cluster-metadata).
pub const MAX_LINE_METADATA: usize = 64 * 1024;

/// Most bytes a line's value may encode to, whatever its members' metadata (escaped in JSON,
/// a control character takes six bytes) and however many gateways added members at once:
/// half of NATS's default `max_payload`, so a write of the line is never refused for its size.
/// Members this gateway would add past it are left out and ended ([`EndStatus::LineFull`]).
pub const MAX_LINE_BYTES: usize = 512 * 1024;

/// Timing. `lease` is `--gateway-lease`.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// How long a renewal keeps the lease valid, from its send time.
    pub lease: Duration,
    /// The clock drift rate bound ρ, in percent (below 100).
    pub max_drift_percent: u32,
    /// Added to the wait before declaring a gateway dead (timer and processing delays).
    pub margin: Duration,
    /// How long to wait before retrying a write that failed as unavailable.
    pub retry: Duration,
    /// How long a gateway whose lease lapsed keeps its members (silent, acting for none of
    /// them) while it tries to renew, before it ends them: a lease renewed meanwhile, which
    /// no other gateway deleted, lets it act for them again (docs/semantics.md#cluster-lease-lapse).
    pub lapse_patience: Duration,
}

impl Config {
    /// The most time one observation of another gateway's lease is moved later because this
    /// gateway's own writes went unanswered: past it, a gateway lapsed that long has ended its
    /// members whatever happened (the lapse patience, and the lease that preceded it).
    pub fn most_unanswered(&self) -> Duration {
        self.lapse_patience + self.lease
    }

    /// How long another gateway waits, on its own clock, after the last observed renewal.
    pub fn dead_after(&self) -> Duration {
        let rho = u128::from(self.max_drift_percent.min(99));
        let nanos = self.lease.as_nanos() * (100 + rho) / (100 - rho);
        Duration::from_nanos(nanos as u64) + self.margin
    }
}

#[derive(Debug)]
struct Local {
    id: u64,
    /// Seen in the line at least once: if it disappears, someone removed it.
    seen_in_line: bool,
    activated: bool,
    /// The epoch it was activated with (when `activated`).
    activated_epoch: u64,
    /// Its metadata, as the line must hold it.
    metadata: String,
    /// A proclamation waits for the line to hold `metadata`.
    proclaiming: bool,
    /// Its priority (docs/semantics.md#priority).
    priority: u32,
    /// Asked to step down ([`Effect::StepDown`]), and why.
    stepping: Option<StepDownCause>,
    /// Stepping down, it holds nothing and what waited here went back: the line may move.
    yielded: bool,
}

/// What this gateway knows of another's lease.
#[derive(Debug, Clone, Copy)]
enum LeaseView {
    Alive {
        revision: Revision,
        /// When this gateway saw that revision, moved later by time its own writes went
        /// unanswered since (`shifted` in all, at most [`Config::most_unanswered`]).
        observed: Duration,
        shifted: Duration,
    },
    Deleted,
}

/// Why a key cannot be written right now.
#[derive(Debug, Clone, Copy)]
enum Block {
    InFlight,
    /// A compare-and-set against this revision failed: wait for the watch to go past it.
    Conflict(Revision),
    RetryAt(Duration),
}

struct Pending {
    key: Key,
    /// The value written (sub keys), to update the mirror on success.
    value: Option<SubValue>,
    /// The revision compare-and-set against (0 for a create).
    expected: Revision,
    /// The gateway whose lease this deletes.
    deletes_lease: Option<GatewayId>,
    /// Whether this deletes a subscription's emptied key.
    deletes_sub: bool,
    sent: Duration,
}

/// What this gateway gave back for a subscription, to ride with the promotion that follows.
#[derive(Debug)]
struct Carry {
    carry: Vec<(u64, u32)>,
    /// The line's active member when it was given: a value with another one carrying it is
    /// the promotion it rode with.
    active: Option<MemberUid>,
}

/// One gateway's singleton coordination (see the module doc).
pub struct Coordinator {
    me: GatewayId,
    config: Config,
    /// Latest valid sub values seen, with their revisions.
    subs: BTreeMap<String, (SubValue, Revision)>,
    leases: BTreeMap<GatewayId, LeaseView>,
    /// Local members per subscription, in local join order.
    local: BTreeMap<String, Vec<Local>>,
    own_revision: Option<Revision>,
    valid_until: Option<Duration>,
    renewal: Option<RequestId>,
    /// Renewals given up on ([`Coordinator::write_slow`]) whose answer may still come: a late
    /// success extends the lease from its own send time.
    late_renewals: BTreeSet<RequestId>,
    next_renewal: Duration,
    /// The lease passed its end unrenewed: nothing is done for members until a renewal is
    /// confirmed (then it resumes) or `lapse_patience` passes (then it fences).
    lapsed: bool,
    /// Lapses, and lapses that ended with a confirmed renewal.
    lapses: u64,
    resumes: u64,
    /// Since when writes of this gateway's went unanswered (or answered "unavailable"), since
    /// its last answered one: the bucket may have had no leader, for everyone, so other
    /// gateways' silence over that time does not count. Nobody is taken for dead meanwhile,
    /// and the next answered write moves every observation later by that time (waiting longer
    /// before a deletion is always safe, see the module doc).
    suspect: Option<Duration>,
    /// When a write of this gateway's was last answered (a refusal too).
    last_answer: Duration,
    fenced: bool,
    blocks: BTreeMap<Key, Block>,
    pending: BTreeMap<RequestId, Pending>,
    next_id: RequestId,
    commands: VecDeque<Command>,
    effects: VecDeque<Effect>,
    /// Entries that were not a valid value (counted, ignored).
    bad_values: u64,
    /// Deletions learned from a refusal naming no value instead of from the watch.
    deletions_learned: u64,
    /// The highest revision the watch delivered: it delivers in revision order, so every key's
    /// state up to this revision has been seen (a deletion included, which leaves no trace).
    watched: Revision,
    /// The cluster's epoch floor as the watch last delivered it: its revision and its offset
    /// ([`super::values::IdsValue`]); zero before any.
    floor: (Revision, u64),
    /// The revision of the renewal that (re)started this gateway's lease: its first, or one
    /// confirmed once the lease had passed its end (a lapse, a pause). The copy of the lines is
    /// current for this term once the watch delivered it ([`Coordinator::caught_up`]).
    term: Option<Revision>,
    /// Attempts to hand to the next active member, per subscription, until written.
    carry: BTreeMap<String, Carry>,
    /// Hand-overs asked here and not yet in the line: the epoch each asks to end.
    asked: BTreeMap<String, u64>,
}

impl Coordinator {
    /// A gateway incarnation starting at `now`: its first command creates its lease.
    pub fn new(me: GatewayId, config: Config, now: Duration) -> Self {
        let mut c = Self {
            me,
            config,
            subs: BTreeMap::new(),
            leases: BTreeMap::new(),
            local: BTreeMap::new(),
            own_revision: None,
            valid_until: None,
            renewal: None,
            late_renewals: BTreeSet::new(),
            next_renewal: now,
            lapsed: false,
            lapses: 0,
            resumes: 0,
            suspect: None,
            last_answer: now,
            fenced: false,
            blocks: BTreeMap::new(),
            pending: BTreeMap::new(),
            next_id: 1,
            commands: VecDeque::new(),
            effects: VecDeque::new(),
            bad_values: 0,
            deletions_learned: 0,
            watched: 0,
            term: None,
            floor: (0, 0),
            carry: BTreeMap::new(),
            asked: BTreeMap::new(),
        };
        c.step(now);
        c
    }

    /// Its timing.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// This incarnation's id.
    pub fn id(&self) -> GatewayId {
        self.me
    }

    /// Whether this gateway may answer leadership questions (who leads, with which epoch; a
    /// hand-over; a watch's first frame) from its copy of the lines at `now`: its lease is
    /// valid, and its watch has delivered the renewal that (re)started it, so every line's
    /// state up to a moment within this lease has been seen. A gateway just started, or
    /// resumed from a pause or a lapse, is not caught up until then
    /// (docs/semantics.md#cluster-leadership-current).
    pub fn caught_up(&self, now: Duration) -> bool {
        self.lease_valid(now) && self.term.is_some_and(|term| self.watched >= term)
    }

    /// Whether the watch has delivered every change up to `revision`.
    pub fn has_seen(&self, revision: Revision) -> bool {
        self.watched >= revision
    }

    /// Backplane entries that did not parse (ignored).
    pub fn bad_values(&self) -> u64 {
        self.bad_values
    }

    /// Deletions this gateway learned from a compare-and-set refused with no value, its watch
    /// not having shown them (an expired deletion, or a watch still behind).
    pub fn deletions_learned(&self) -> u64 {
        self.deletions_learned
    }

    /// A member opened a singleton stream on this gateway; it waits for [`Effect::Activate`].
    pub fn member_joined(&mut self, now: Duration, subscription: &str, member: u64) {
        self.member_joined_with(now, subscription, member, String::new(), 0);
    }

    /// As [`Coordinator::member_joined`], for a member with metadata and a priority: the line
    /// carries them ([`SubValue::meta`], [`SubValue::prio`]).
    pub fn member_joined_with(
        &mut self,
        now: Duration,
        subscription: &str,
        member: u64,
        metadata: String,
        priority: u32,
    ) {
        if self.fenced {
            self.effects.push_back(Effect::End {
                subscription: subscription.to_string(),
                member,
                status: EndStatus::Unavailable,
            });
            return;
        }
        self.local
            .entry(subscription.to_string())
            .or_default()
            .push(Local {
                id: member,
                seen_in_line: false,
                activated: false,
                activated_epoch: 0,
                metadata,
                proclaiming: false,
                priority,
                stepping: None,
                yielded: false,
            });
        self.step(now);
    }

    /// Local member `member` replaces its metadata (the service checked it is active with its
    /// epoch): the line will hold it, then [`Effect::Proclaimed`] follows.
    pub fn proclaim(
        &mut self,
        now: Duration,
        subscription: &str,
        member: u64,
        metadata: String,
    ) -> Proclaimed {
        let Some(old) = self
            .local
            .get(subscription)
            .and_then(|members| members.iter().find(|m| m.id == member))
            .map(|m| m.metadata.len())
        else {
            return Proclaimed::NotHere;
        };
        if metadata.len() > old && !self.metadata_room(subscription, metadata.len() - old) {
            return Proclaimed::NoRoom;
        }
        if let Some(local) = self
            .local
            .get_mut(subscription)
            .and_then(|members| members.iter_mut().find(|m| m.id == member))
        {
            local.metadata = metadata;
            local.proclaiming = true;
        }
        self.step(now);
        Proclaimed::Taken
    }

    /// A member's stream closed (cleanly or not): it acts no more, and leaves the line.
    pub fn member_left(&mut self, now: Duration, subscription: &str, member: u64) {
        self.member_left_carrying(now, subscription, member, Vec::new());
    }

    /// As [`Coordinator::member_left`], when this gateway gave back messages whose next
    /// attempt JetStream would undercount: `carry` goes into the write that promotes the next
    /// member ([`SubValue::carry`]).
    pub fn member_left_carrying(
        &mut self,
        now: Duration,
        subscription: &str,
        member: u64,
        carry: Vec<(u64, u32)>,
    ) {
        self.give_carry(subscription, carry);
        if let Some(members) = self.local.get_mut(subscription) {
            members.retain(|m| m.id != member);
            // Nothing is kept for a subscription without local members: ids come and go.
            if members.is_empty() {
                self.local.remove(subscription);
            }
        }
        self.step(now);
    }

    /// An entry from the watch of the whole bucket, in revision order.
    pub fn backplane_changed(
        &mut self,
        now: Duration,
        key: &str,
        value: Option<&[u8]>,
        revision: Revision,
    ) {
        self.watched = self.watched.max(revision);
        match Key::parse(key) {
            Some(Key::Line(sub)) => match value.map(serde_json::from_slice::<SubValue>) {
                Some(Ok(v)) => self.see_sub(&sub, v, revision),
                // The line emptied: forget it (the next join creates it again).
                None => self.forget_sub(&sub, revision),
                Some(Err(_)) => self.bad_values += 1,
            },
            Some(Key::Lease(g)) => self.see_lease(now, g, value.is_some(), revision),
            Some(Key::Ids) => match value.map(serde_json::from_slice::<super::values::IdsValue>) {
                // Only ever raised: a lower offset (a bad write) is not taken.
                Some(Ok(ids)) if revision > self.floor.0 => {
                    self.floor = (revision, ids.epoch_offset.max(self.floor.1));
                }
                Some(Ok(_)) | None => {}
                Some(Err(_)) => self.bad_values += 1,
            },
            // A lease key whose gateway does not parse is a bad value; `routes` is not ours.
            None if key.starts_with("lease.") => self.bad_values += 1,
            None => {}
        }
        self.step(now);
    }

    /// The answer to command `id`.
    pub fn write_result(
        &mut self,
        now: Duration,
        id: RequestId,
        result: Result<Revision, KvError>,
    ) {
        let Some(p) = self.pending.remove(&id) else {
            return;
        };
        let late = self.late_renewals.remove(&id);
        let result = self.planted_resume(&p, result, late || self.renewal == Some(id));
        if result.is_ok() || result.as_ref().is_err_and(KvError::is_conflict) {
            self.answered(now);
        } else {
            self.suspect_since(p.sent);
        }
        if late {
            // A renewal given up on, answered after all: a success extends the lease from its
            // own send time (it was sent then); a refusal naming no value is the deletion.
            match result {
                Ok(rev) => self.renewed(now, rev, p.sent),
                Err(KvError::WrongRevision { current: 0, .. }) => {
                    self.deletions_learned += 1;
                    self.fence();
                }
                Err(_) => {}
            }
            self.step(now);
            return;
        }
        if self.renewal == Some(id) {
            self.renewal = None;
            match result {
                Ok(rev) => {
                    self.renewed(now, rev, p.sent);
                    self.next_renewal = p.sent + self.config.lease / 3;
                }
                // An incarnation creates its lease once. A create that was not confirmed may
                // have landed, been found stale by others and been deleted meanwhile: a second
                // create would then succeed over the deletion and bring back a gateway others
                // count dead, whose members they no longer respect. Start again instead, with a
                // new id (a lease that did land is deleted as stale; it never had a member).
                Err(_) if p.expected == 0 => {
                    self.fence();
                }
                // Only this gateway writes its lease a value: no value now means another
                // gateway found it stale and deleted it. The watch brings that deletion, unless
                // it expired first; either way it is the news the deletion is: stop.
                Err(KvError::WrongRevision { current: 0, .. }) if p.expected != 0 => {
                    self.deletions_learned += 1;
                    self.fence();
                }
                // A value at another revision is this gateway's own: a renewal whose answer was
                // lost (its try timed out while NATS elected the bucket's leader) landed. Renew
                // from it at once; the lease is extended only by a confirmed renewal, from its
                // own send time.
                Err(KvError::WrongRevision { current, .. })
                    if p.expected != 0 && current > p.expected =>
                {
                    self.own_revision = Some(self.own_revision.unwrap_or(0).max(current));
                    self.next_renewal = now;
                }
                Err(_) => self.next_renewal = now + self.config.retry,
            }
            self.step(now);
            return;
        }
        let block = match result {
            Ok(rev) => {
                if let Some(sub) = p.key.line() {
                    match p.value {
                        Some(v) => self.see_sub(sub, v, rev),
                        None if p.deletes_sub => self.forget_sub(sub, rev),
                        None => {}
                    }
                }
                if let Some(g) = p.deletes_lease {
                    self.leases.insert(g, LeaseView::Deleted);
                }
                None
            }
            // The watch already went past the revision we expected: retry from it at once.
            Err(e) if e.is_conflict() && self.revision_of(&p.key) > p.expected => None,
            // Someone created the key: wait until the watch shows that value (unless it already
            // went past it: the key was deleted since, see below).
            Err(KvError::Exists { current }) if current > self.watched => {
                Some(Block::Conflict(current.saturating_sub(1)))
            }
            // The watch already showed the key deleted (its line emptied): create it again now,
            // as no later revision of it need ever come.
            Err(e)
                if e.is_conflict()
                    && p.key.line().is_some_and(|sub| !self.subs.contains_key(sub)) =>
            {
                None
            }
            // The key has no value now, while the watch still shows the one compared against:
            // it was deleted since. The watch brings that deletion, unless it expired first (a
            // watch that lagged past the marker TTL skips it, and no later revision need ever
            // come): take the refusal as the news, as the deletion itself would be taken.
            Err(KvError::WrongRevision { current: 0, .. })
                if p.expected != 0
                    && self.revision_of(&p.key) == p.expected
                    && !planted(PlantedBug::WaitForExpiredDeletion) =>
            {
                self.deletions_learned += 1;
                if let Some(sub) = p.key.line() {
                    // At least one above the value seen: a later value on the watch still wins.
                    self.forget_sub(sub, p.expected + 1);
                } else if let Some(g) = p.deletes_lease {
                    self.leases.insert(g, LeaseView::Deleted);
                }
                None
            }
            Err(e) if e.is_conflict() => Some(Block::Conflict(p.expected)),
            Err(_) => Some(Block::RetryAt(now + self.config.retry)),
        };
        match block {
            Some(b) => self.blocks.insert(p.key, b),
            None => self.blocks.remove(&p.key),
        };
        self.step(now);
    }

    /// Write `id` has not been answered within the shell's bound for a lease renewal (a sixth of
    /// the lease): when it is the renewal in flight, the next one goes out at once, and this
    /// one's answer, if it still comes, is taken as a late one. Nothing happens otherwise.
    pub fn write_slow(&mut self, now: Duration, id: RequestId) {
        if self.renewal != Some(id) {
            return;
        }
        self.renewal = None;
        self.late_renewals.insert(id);
        // Unanswered from now on: a bucket answering every write, slowly, is not taken for one
        // that answers nothing.
        self.suspect_since(now);
        self.next_renewal = now;
        self.step(now);
    }

    /// Time passed: renew the lease, fence on its expiry, find dead gateways, retry writes.
    pub fn tick(&mut self, now: Duration) {
        self.step(now);
    }

    /// The next instant [`Coordinator::tick`] is due, on this gateway's clock.
    pub fn poll_timeout(&self) -> Option<Duration> {
        if self.fenced {
            return None;
        }
        let mut next = Vec::new();
        if self.renewal.is_none() {
            next.push(self.next_renewal);
        }
        if !planted(PlantedBug::GatewayActsAfterLeaseExpiry) {
            // Lapsed: the end of its patience is next.
            let patience = if self.lapsed {
                self.config.lapse_patience
            } else {
                Duration::ZERO
            };
            next.extend(self.valid_until.map(|until| until + patience));
        }
        // Dead-gateway checks only once leased (before, nothing is written), only while the
        // lease is valid (not lapsed) and this gateway's own writes are answered, and only for
        // leases not already being deleted.
        let dead_after = self.config.dead_after();
        for (g, view) in &self.leases {
            if let LeaseView::Alive { observed, .. } = view
                && *g != self.me
                && self.valid_until.is_some()
                && !self.lapsed
                && self.suspect.is_none()
                && !self.blocks.contains_key(&Key::Lease(*g))
            {
                next.push(*observed + dead_after);
            }
        }
        for b in self.blocks.values() {
            if let Block::RetryAt(at) = b {
                next.push(*at);
            }
        }
        next.into_iter().min()
    }

    /// The next write to run.
    #[must_use]
    pub fn poll_command(&mut self) -> Option<Command> {
        self.commands.pop_front()
    }

    /// The next effect on a local member.
    #[must_use]
    pub fn poll_effect(&mut self) -> Option<Effect> {
        self.effects.pop_front()
    }

    /// The latest value of subscription `sub`'s line this gateway saw (none once its key was
    /// deleted), for a watch of its leadership.
    pub fn line(&self, sub: &str) -> Option<&SubValue> {
        self.subs.get(sub).map(|(value, _)| value)
    }

    /// How many gateways hold a lease, as this gateway last saw the bucket (for a console).
    pub fn live_gateways(&self) -> usize {
        self.leases
            .values()
            .filter(|l| matches!(l, LeaseView::Alive { .. }))
            .count()
    }

    /// Every line this gateway saw, by subscription id, in id order (for a console).
    pub fn lines(&self) -> impl Iterator<Item = (&str, &SubValue)> {
        self.subs
            .iter()
            .map(|(sub, (value, _))| (sub.as_str(), value))
    }

    fn issue(&mut self, now: Duration, key: Key, op: Op, value: Option<SubValue>) -> RequestId {
        let id = self.next_id;
        self.next_id += 1;
        let (expected, deletes_lease) = match &op {
            Op::Create(_) => (0, None),
            Op::Update(_, r) => (*r, None),
            Op::Delete(r) => (
                *r,
                match key {
                    Key::Lease(g) => Some(g),
                    _ => None,
                },
            ),
        };
        let deletes_sub = matches!(op, Op::Delete(_)) && matches!(key, Key::Line(_));
        self.pending.insert(
            id,
            Pending {
                key: key.clone(),
                value,
                expected,
                deletes_lease,
                deletes_sub,
                sent: now,
            },
        );
        self.blocks.insert(key.clone(), Block::InFlight);
        self.commands.push_back(Command { id, key, op });
        id
    }

    fn writable(&self, now: Duration, key: &Key) -> bool {
        match self.blocks.get(key) {
            None => true,
            Some(Block::RetryAt(at)) => now >= *at,
            Some(_) => false,
        }
    }

    /// Everything that follows from the state at `now`: lease upkeep, effects, writes.
    fn step(&mut self, now: Duration) {
        if self.fenced {
            return;
        }
        self.blocks
            .retain(|_, b| !matches!(b, Block::RetryAt(at) if now >= *at));
        if let Some(until) = self.valid_until
            && now >= until
            && !planted(PlantedBug::GatewayActsAfterLeaseExpiry)
        {
            // Past the lease: act for nobody (the lease gate is closed), keep renewing. Others
            // may delete the lease only by compare-and-set on the revision they saw, which a
            // confirmed renewal replaces: so a renewal confirmed now means nobody did, and
            // nobody promoted past these members (docs/semantics.md#cluster-lease-lapse).
            if !self.lapsed {
                self.lapsed = true;
                self.lapses += 1;
                self.suspect_since(now);
            }
            if now >= until + self.config.lapse_patience {
                self.fence();
                return;
            }
        }
        self.renew(now);
        self.local_effects(now);
        if !self.lease_valid(now) {
            return;
        }
        if self.suspect.is_none() {
            self.find_dead(now);
        }
        let subs: BTreeSet<String> = self.subs.keys().chain(self.local.keys()).cloned().collect();
        for sub in subs {
            self.reconcile(now, &sub);
        }
    }
}

fn encode(v: &SubValue) -> Bytes {
    Bytes::from(serde_json::to_vec(v).unwrap_or_default())
}

mod line;
mod liveness;
mod step_down;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod step_down_tests;
