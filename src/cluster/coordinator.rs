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
//! past it once it settled (`coordinator_step_down.rs`,
//! docs/semantics.md#cluster-priority-and-hand-over).
//!
//! This file is one state machine, longer than the rest (about 1,300 lines): its lease and
//! line handling share the pending writes, the blocks and the local members, and the safety
//! argument above reads against the whole of it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use bytes::Bytes;

use super::backplane::{KvError, Revision};
use super::values::standby_place;
pub use super::values::{GatewayId, MemberUid, StepDownCause, SubValue, lease_key, sub_key};
use crate::core::planted::{PlantedBug, active as planted};

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

/// An id matching a [`Command`] to its [`Coordinator::write_result`].
pub type RequestId = u64;

/// A write for the shell to run on the backplane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    /// Echo it in [`Coordinator::write_result`].
    pub id: RequestId,
    /// The key.
    pub key: String,
    /// What to do.
    pub op: Op,
}

/// A backplane write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// [`super::backplane::Backplane::create`].
    Create(Bytes),
    /// [`super::backplane::Backplane::update`].
    Update(Bytes, Revision),
    /// [`super::backplane::Backplane::delete`].
    Delete(Revision),
}

/// What became of a [`Coordinator::proclaim`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proclaimed {
    /// Taken: [`Effect::Proclaimed`] follows once the line holds it.
    Taken,
    /// This gateway holds no such member.
    NotHere,
    /// The line has no room for that much more metadata ([`MAX_LINE_METADATA`]).
    NoRoom,
}

/// Why a member's stream ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndStatus {
    /// The gateway lost its lease, or the cluster removed the member: the client rejoins.
    Unavailable,
    /// The line's value would pass [`MAX_LINE_BYTES`] with this member in it (joins at several
    /// gateways at once passed [`MAX_LINE_METADATA`] together): it never entered the line.
    LineFull,
}

/// What the shell does to a local member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Send the confirmation frame: the member is active with this epoch.
    Activate {
        /// The subscription.
        subscription: String,
        /// The local member id.
        member: u64,
        /// Its fencing token.
        epoch: u64,
        /// The attempts the messages given back by the previous active member's gateway
        /// carry ([`SubValue::carry`]).
        carry: Vec<(u64, u32)>,
        /// It took over from an earlier active member ([`SubValue::promoted`]).
        promoted: bool,
        /// The earlier active member's gateway died ([`SubValue::took_over`]).
        took_over: bool,
    },
    /// The member's metadata as last given ([`Coordinator::proclaim`]) is in the line: its
    /// proclamation can be answered.
    Proclaimed {
        /// The subscription.
        subscription: String,
        /// The local member id.
        member: u64,
    },
    /// The member is in the line (this gateway saw a value holding it, its own write's or the
    /// watch's): its join can be answered. Every member that joins after this, on any
    /// gateway, stands behind it (a later append compare-and-sets a value holding it).
    InLine {
        /// The subscription.
        subscription: String,
        /// The local member id.
        member: u64,
    },
    /// The member, on standby, entered the line at `position` (1 = next): tell it, if it
    /// asked for standby notices.
    Standby {
        /// The subscription.
        subscription: String,
        /// The local member id.
        member: u64,
        /// Members ahead of it in the line when it entered.
        position: u32,
    },
    /// The line asks the member, active here, to step down at a message boundary
    /// (docs/semantics.md#cluster-priority-and-hand-over): send it nothing more; once it holds
    /// nothing and what waits here went back, tell [`Coordinator::member_yielded`].
    StepDown {
        /// The subscription.
        subscription: String,
        /// The local member id.
        member: u64,
        /// Why.
        cause: StepDownCause,
    },
    /// The member's step-down is off (no successor is left in the line): it goes on.
    CallOffStepDown {
        /// The subscription.
        subscription: String,
        /// The local member id.
        member: u64,
    },
    /// The line moved past the member, which stepped down: it is on standby at `position`
    /// (1 = next), and its epoch has ended.
    SteppedDown {
        /// The subscription.
        subscription: String,
        /// The local member id.
        member: u64,
        /// Its place among the standbys.
        position: u32,
        /// The epoch it held, which ended: recorded as ended before the member is told
        /// (docs/semantics.md#cluster-fenced-publish).
        epoch: u64,
    },
    /// End the member's stream with this status; the coordinator has forgotten it.
    End {
        /// The subscription.
        subscription: String,
        /// The local member id.
        member: u64,
        /// The gRPC status to end with.
        status: EndStatus,
    },
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
    key: String,
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
    blocks: BTreeMap<String, Block>,
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

    /// Whether the gateway lost its lease: it has ended every member and does nothing more.
    pub fn is_fenced(&self) -> bool {
        self.fenced
    }

    /// Whether the lease passed its end unrenewed and the gateway waits for a renewal to act
    /// again (docs/semantics.md#cluster-lease-lapse).
    pub fn is_lapsed(&self) -> bool {
        self.lapsed && !self.fenced
    }

    /// How many times the lease lapsed, and how many of those lapses a confirmed renewal
    /// ended (the members kept).
    pub fn lapses(&self) -> (u64, u64) {
        (self.lapses, self.resumes)
    }

    /// Whether this incarnation ever held a confirmed lease (a create or renewal answered).
    pub fn was_leased(&self) -> bool {
        self.valid_until.is_some()
    }

    /// Until when this gateway's lease is valid on its own clock, as it stands now: the send
    /// time of its last confirmed renewal plus the lease. `None` before the first confirmed
    /// renewal and once fenced. The shell publishes it for the checks made where messages and
    /// acks leave the gateway (docs/semantics.md#cluster-lease-checks).
    pub fn lease_valid_until(&self) -> Option<Duration> {
        if self.fenced {
            return None;
        }
        self.valid_until
    }

    /// Whether the gateway may hand a singleton's message to a member, or ack one, at `now`:
    /// while its lease is valid by its own clock (the check the shell's lease gate makes).
    pub fn may_act(&self, now: Duration) -> bool {
        !self.fenced
            && self
                .valid_until
                .is_some_and(|until| now < until || planted(PlantedBug::GatewaySkipsLeaseCheck))
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

    /// Whether `subscription`'s line has room for `more` bytes of metadata within
    /// [`MAX_LINE_METADATA`]: the other gateways' members' as the value holds them, and this
    /// gateway's members' as it will write them.
    pub fn metadata_room(&self, subscription: &str, more: usize) -> bool {
        let me = self.me;
        let theirs: usize = self.subs.get(subscription).map_or(0, |(v, _)| {
            v.meta
                .iter()
                .filter(|(uid, _)| uid.gateway != me)
                .map(|(_, meta)| meta.len())
                .sum()
        });
        let ours: usize = self
            .local
            .get(subscription)
            .map_or(0, |members| members.iter().map(|m| m.metadata.len()).sum());
        theirs + ours + more <= MAX_LINE_METADATA
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

    /// Keeps what this gateway gave back for `subscription`, to ride with the promotion that
    /// follows ([`SubValue::carry`]).
    fn give_carry(&mut self, subscription: &str, mut carry: Vec<(u64, u32)>) {
        if carry.is_empty() {
            return;
        }
        // A value stays small: past this, attempts are JetStream's count (README).
        carry.truncate(MAX_CARRY);
        let active = self.subs.get(subscription).and_then(|(v, _)| v.active);
        self.carry
            .insert(subscription.to_string(), Carry { carry, active });
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
        if let Some(sub) = key.strip_prefix("sub.") {
            match value.map(serde_json::from_slice::<SubValue>) {
                Some(Ok(v)) => self.see_sub(sub, v, revision),
                // The line emptied: forget it (the next join creates it again).
                None => self.forget_sub(sub, revision),
                Some(Err(_)) => self.bad_values += 1,
            }
        } else if let Some(g) = key.strip_prefix("lease.") {
            match g.parse::<u64>() {
                Ok(g) => self.see_lease(now, GatewayId(g), value.is_some(), revision),
                Err(_) => self.bad_values += 1,
            }
        } else if key == super::values::IDS_KEY {
            match value.map(serde_json::from_slice::<super::values::IdsValue>) {
                // Only ever raised: a lower offset (a bad write) is not taken.
                Some(Ok(ids)) if revision > self.floor.0 => {
                    self.floor = (revision, ids.epoch_offset.max(self.floor.1));
                }
                Some(Ok(_)) | None => {}
                Some(Err(_)) => self.bad_values += 1,
            }
        }
        self.step(now);
    }

    /// The epoch of a promotion that replaces the value at `replaced`: above every epoch made
    /// before, by any gateway, and above the time the last gateway to raise the floor started
    /// (docs/semantics.md#cluster-restart-identity). Made only once the watch delivered
    /// `replaced`, so every floor written before it has been seen: for two promotions P1 then
    /// P2, P2 replaces a revision above P1's write, itself above the floor P1 used, and P2's
    /// floor is at least P1's, so its epoch is higher.
    fn epoch_after(&self, replaced: Revision) -> u64 {
        let (at, offset) = self.floor;
        if at == 0 {
            replaced
        } else {
            replaced.max(at).saturating_add(offset)
        }
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
                if let Some(sub) = p.key.strip_prefix("sub.") {
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
                    && p.key
                        .strip_prefix("sub.")
                        .is_some_and(|sub| !self.subs.contains_key(sub)) =>
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
                if let Some(sub) = p.key.strip_prefix("sub.") {
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
                && !self.blocks.contains_key(&lease_key(*g))
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

    fn revision_of(&self, key: &str) -> Revision {
        if let Some(sub) = key.strip_prefix("sub.") {
            return self.subs.get(sub).map_or(0, |(_, r)| *r);
        }
        if let Some(g) = key.strip_prefix("lease.").and_then(|g| g.parse().ok()) {
            return match self.leases.get(&GatewayId(g)) {
                Some(LeaseView::Alive { revision, .. }) => *revision,
                _ => 0,
            };
        }
        0
    }

    fn see_sub(&mut self, sub: &str, v: SubValue, revision: Revision) {
        let newer = self.subs.get(sub).is_none_or(|(_, r)| revision > *r);
        // A carry is spent once the line shows it with another active member than the one
        // active when it was given: the promotion it rode with, whether this gateway learned
        // of it by the write's answer or by the watch (a write answered "unavailable" may have
        // landed), and also when a newer value came first. One written beside a standby's
        // leave, the active member unchanged, still rides with the promotion that follows.
        if let Some(given) = self.carry.get(sub)
            && given.carry == v.carry
            && given.active != v.active
        {
            self.carry.remove(sub);
        }
        if newer {
            // A hand-over asked here is in the line, or its epoch is over.
            if self.asked.get(sub).is_some_and(|&epoch| {
                v.hand_over == epoch || v.epoch != epoch || v.active.is_none()
            }) {
                self.asked.remove(sub);
            }
            self.subs.insert(sub.to_string(), (v, revision));
            let key = sub_key(sub);
            if let Some(Block::Conflict(r)) = self.blocks.get(&key)
                && revision > *r
            {
                self.blocks.remove(&key);
            }
        }
    }

    /// The subscription's key was deleted at `revision` (its line emptied).
    fn forget_sub(&mut self, sub: &str, revision: Revision) {
        if self.subs.get(sub).is_some_and(|(_, r)| revision <= *r) {
            return;
        }
        self.subs.remove(sub);
        self.carry.remove(sub);
        self.asked.remove(sub);
        let key = sub_key(sub);
        if let Some(Block::Conflict(r)) = self.blocks.get(&key)
            && revision > *r
        {
            self.blocks.remove(&key);
        }
    }

    fn see_lease(&mut self, now: Duration, g: GatewayId, alive: bool, revision: Revision) {
        if matches!(self.leases.get(&g), Some(LeaseView::Deleted)) {
            return;
        }
        if let Some(LeaseView::Alive { revision: r, .. }) = self.leases.get(&g)
            && revision <= *r
        {
            return;
        }
        let view = if alive {
            LeaseView::Alive {
                revision,
                observed: now,
                shifted: Duration::ZERO,
            }
        } else {
            LeaseView::Deleted
        };
        self.leases.insert(g, view);
        if g == self.me {
            if alive {
                self.own_revision = Some(self.own_revision.unwrap_or(0).max(revision));
            } else if !(self.lapsed && planted(PlantedBug::LapseResumesOnAnyAnswer)) {
                // Another gateway found this lease stale: whatever this clock says, stop.
                self.fence();
            }
        }
        let key = lease_key(g);
        if let Some(Block::Conflict(r)) = self.blocks.get(&key)
            && revision > *r
        {
            self.blocks.remove(&key);
        }
    }

    /// A renewal sent at `sent` was confirmed at revision `rev`: the lease is valid until
    /// `sent + lease`, and a lapse it ends is over.
    fn renewed(&mut self, now: Duration, rev: Revision, sent: Duration) {
        self.own_revision = Some(self.own_revision.unwrap_or(0).max(rev));
        if self.valid_until.is_none_or(|u| now >= u) {
            // The lease (re)starts: what happened in the lines meanwhile is known once the
            // watch reaches this write.
            self.term = Some(self.term.unwrap_or(0).max(rev));
        }
        let until = sent + self.config.lease;
        self.valid_until = Some(self.valid_until.map_or(until, |u| u.max(until)));
        if self.lapsed && self.valid_until.is_some_and(|u| now < u) {
            self.lapsed = false;
            self.resumes += 1;
        }
    }

    /// A write sent at `sent` went unanswered (or was answered "unavailable"): the bucket
    /// answered nothing since the later of its send and the last answer.
    fn suspect_since(&mut self, sent: Duration) {
        let since = sent.max(self.last_answer);
        self.suspect = Some(self.suspect.map_or(since, |s| s.min(since)));
    }

    /// A write of this gateway's was answered (a refusal too): the bucket answers again. The
    /// time it answered nothing is not counted in other gateways' silence, up to a bound in
    /// all per observation: a bucket that answers, however slowly, lets a dead gateway be found.
    fn answered(&mut self, now: Duration) {
        self.last_answer = self.last_answer.max(now);
        let Some(since) = self.suspect.take() else {
            return;
        };
        let unanswered = now.saturating_sub(since);
        let most = self.config.most_unanswered();
        for view in self.leases.values_mut() {
            if let LeaseView::Alive {
                observed, shifted, ..
            } = view
            {
                let add = unanswered.min(most.saturating_sub(*shifted));
                *observed += add;
                *shifted += add;
            }
        }
    }

    /// The planted [`PlantedBug::LapseResumesOnAnyAnswer`]: a lapsed gateway's renewal refused
    /// is taken as confirmed.
    fn planted_resume(
        &self,
        p: &Pending,
        result: Result<Revision, KvError>,
        renewal: bool,
    ) -> Result<Revision, KvError> {
        if renewal && self.lapsed && planted(PlantedBug::LapseResumesOnAnyAnswer) {
            return result.or(Ok(p.expected + 1));
        }
        result
    }

    fn lease_valid(&self, now: Duration) -> bool {
        !self.fenced
            && self.valid_until.is_some_and(|until| {
                now < until || planted(PlantedBug::GatewayActsAfterLeaseExpiry)
            })
    }

    fn fence(&mut self) {
        if self.fenced {
            return;
        }
        self.fenced = true;
        for (sub, members) in std::mem::take(&mut self.local) {
            for m in members {
                self.effects.push_back(Effect::End {
                    subscription: sub.clone(),
                    member: m.id,
                    status: EndStatus::Unavailable,
                });
            }
        }
        self.commands.clear();
    }

    fn issue(&mut self, now: Duration, key: String, op: Op, value: Option<SubValue>) -> RequestId {
        let id = self.next_id;
        self.next_id += 1;
        let (expected, deletes_lease) = match &op {
            Op::Create(_) => (0, None),
            Op::Update(_, r) => (*r, None),
            Op::Delete(r) => (
                *r,
                key.strip_prefix("lease.")
                    .and_then(|g| g.parse().ok())
                    .map(GatewayId),
            ),
        };
        let deletes_sub = matches!(op, Op::Delete(_)) && key.starts_with("sub.");
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

    fn writable(&self, now: Duration, key: &str) -> bool {
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

    fn renew(&mut self, now: Duration) {
        if self.renewal.is_some() || now < self.next_renewal {
            return;
        }
        let key = lease_key(self.me);
        let value = Bytes::from_static(b"{}");
        let op = match self.own_revision {
            Some(rev) => Op::Update(value, rev),
            None => Op::Create(value),
        };
        let id = self.issue(now, key.clone(), op, None);
        // The lease key has a single writer while alive: never blocked by the generic rule.
        self.blocks.remove(&key);
        self.renewal = Some(id);
    }

    fn is_dead(&self, g: GatewayId) -> bool {
        matches!(self.leases.get(&g), Some(LeaseView::Deleted))
    }

    fn find_dead(&mut self, now: Duration) {
        let dead_after = self.config.dead_after();
        let stale: Vec<(GatewayId, Revision)> = self
            .leases
            .iter()
            .filter_map(|(g, v)| match v {
                LeaseView::Alive {
                    revision, observed, ..
                } if *g != self.me && now >= *observed + dead_after => Some((*g, *revision)),
                _ => None,
            })
            .collect();
        for (g, rev) in stale {
            let key = lease_key(g);
            if self.writable(now, &key) {
                self.issue(now, key, Op::Delete(rev), None);
            }
        }
    }

    fn local_effects(&mut self, now: Duration) {
        let may_activate = self.lease_valid(now);
        let me = self.me;
        for (sub, members) in &mut self.local {
            let Some((v, _)) = self.subs.get(sub) else {
                continue;
            };
            members.retain_mut(|m| {
                let uid = MemberUid {
                    gateway: me,
                    member: m.id,
                };
                let in_line = v.line.contains(&uid);
                let is_active = v.active == Some(uid);
                if !may_activate {
                    // Lapsed (or not leased yet): the watch may be far behind, and nothing is
                    // told to a member but that it lost its place (a member stepping down
                    // keeps it); the rest waits for a valid lease.
                    let deposed = m.activated && !is_active && m.stepping.is_none();
                    if (m.seen_in_line && !in_line) || deposed {
                        self.effects.push_back(Effect::End {
                            subscription: sub.clone(),
                            member: m.id,
                            status: EndStatus::Unavailable,
                        });
                        return false;
                    }
                    return true;
                }
                if m.activated && is_active && v.epoch != m.activated_epoch {
                    // Active under another epoch than the one it was activated with: the line
                    // moved past it and back while this gateway saw none of the values between
                    // (it was lapsed, or its watch skipped them).
                    if m.stepping.is_none() {
                        // It never stepped down here: deposed meanwhile, so it lost its place.
                        self.effects.push_back(Effect::End {
                            subscription: sub.clone(),
                            member: m.id,
                            status: EndStatus::Unavailable,
                        });
                        return false;
                    }
                    // Its step-down completed, then it was promoted again: on standby first,
                    // then activated with the line's epoch below.
                    m.activated = false;
                    m.stepping = None;
                    m.yielded = false;
                    self.effects.push_back(Effect::SteppedDown {
                        subscription: sub.clone(),
                        member: m.id,
                        position: 1,
                        epoch: m.activated_epoch,
                    });
                }
                if m.activated && !is_active && in_line && m.stepping.is_some() {
                    // Its step-down moved the line past it: on standby, still a member.
                    m.activated = false;
                    m.stepping = None;
                    m.yielded = false;
                    let ahead = v.line.iter().position(|u| *u == uid).unwrap_or(1);
                    self.effects.push_back(Effect::SteppedDown {
                        subscription: sub.clone(),
                        member: m.id,
                        position: u32::try_from(ahead).unwrap_or(u32::MAX),
                        epoch: m.activated_epoch,
                    });
                    return true;
                }
                if (m.seen_in_line && !in_line) || (m.activated && !is_active) {
                    // Removed or deposed by another gateway: it lost its place.
                    self.effects.push_back(Effect::End {
                        subscription: sub.clone(),
                        member: m.id,
                        status: EndStatus::Unavailable,
                    });
                    return false;
                }
                let entered = in_line && !m.seen_in_line;
                m.seen_in_line |= in_line;
                if entered {
                    self.effects.push_back(Effect::InLine {
                        subscription: sub.clone(),
                        member: m.id,
                    });
                }
                // At the head of the line with nobody active it is about to be promoted, not
                // waiting: no notice.
                let ahead = v.line.iter().position(|u| *u == uid).unwrap_or(0);
                if entered && !is_active && ahead > 0 {
                    self.effects.push_back(Effect::Standby {
                        subscription: sub.clone(),
                        member: m.id,
                        position: u32::try_from(ahead).unwrap_or(u32::MAX),
                    });
                }
                if m.proclaiming && in_line && v.meta_of(uid) == m.metadata {
                    m.proclaiming = false;
                    self.effects.push_back(Effect::Proclaimed {
                        subscription: sub.clone(),
                        member: m.id,
                    });
                }
                if is_active && !m.activated && may_activate {
                    m.activated = true;
                    m.activated_epoch = v.epoch;
                    self.effects.push_back(Effect::Activate {
                        subscription: sub.clone(),
                        member: m.id,
                        epoch: v.epoch,
                        carry: v.carry.clone(),
                        promoted: v.promoted,
                        took_over: v.took_over,
                    });
                }
                // Active here (its activation may still wait for its fence record): a step-down
                // begins, changes its cause, or is called off as the line says
                // (docs/semantics.md#cluster-priority-and-hand-over).
                if is_active && m.activated {
                    match (m.stepping, v.step_down_cause()) {
                        (None, Some(cause)) => {
                            m.stepping = Some(cause);
                            m.yielded = planted(PlantedBug::StepDownBeforeSettled);
                            self.effects.push_back(Effect::StepDown {
                                subscription: sub.clone(),
                                member: m.id,
                                cause,
                            });
                        }
                        (Some(_), None) => {
                            m.stepping = None;
                            m.yielded = false;
                            self.effects.push_back(Effect::CallOffStepDown {
                                subscription: sub.clone(),
                                member: m.id,
                            });
                        }
                        (Some(_), Some(cause)) => m.stepping = Some(cause),
                        (None, None) => {}
                    }
                }
                true
            });
        }
        self.local.retain(|_, members| !members.is_empty());
    }

    fn reconcile(&mut self, now: Duration, sub: &str) {
        let key = sub_key(sub);
        if !self.writable(now, &key) {
            return;
        }
        let wanted: Vec<u64> = self
            .local
            .get(sub)
            .map(|ms| ms.iter().map(|m| m.id).collect())
            .unwrap_or_default();
        let me = self.me;
        let metadata_of = |member: u64| {
            self.local
                .get(sub)
                .and_then(|ms| ms.iter().find(|m| m.id == member))
                .map_or("", |m| m.metadata.as_str())
        };
        let priority_of = |member: u64| {
            self.local
                .get(sub)
                .and_then(|ms| ms.iter().find(|m| m.id == member))
                .map_or(0, |m| m.priority)
        };
        let Some((current, revision)) = self.subs.get(sub).cloned() else {
            if wanted.is_empty() {
                return;
            }
            let mut line: Vec<MemberUid> = Vec::with_capacity(wanted.len());
            for &member in &wanted {
                let uid = MemberUid {
                    gateway: me,
                    member,
                };
                let at = standby_place(&line, None, priority_of(member), true, |u| {
                    priority_of(u.member)
                });
                line.insert(at, uid);
            }
            let prio = line
                .iter()
                .filter(|u| priority_of(u.member) > 0)
                .map(|u| (*u, priority_of(u.member)))
                .collect();
            let v = SubValue {
                line,
                active: None,
                epoch: 0,
                carry: Vec::new(),
                promoted: false,
                took_over: false,
                meta: wanted
                    .iter()
                    .filter(|&&member| !metadata_of(member).is_empty())
                    .map(|&member| {
                        let uid = MemberUid {
                            gateway: me,
                            member,
                        };
                        (uid, metadata_of(member).to_string())
                    })
                    .collect(),
                prio,
                hand_over: 0,
            };
            let mut v = v;
            self.trim_to_fit(sub, &mut v, &[]);
            if v.line.is_empty() {
                return;
            }
            let bytes = encode(&v);
            self.issue(now, key, Op::Create(bytes), Some(v));
            return;
        };
        let mut line: Vec<MemberUid> = current
            .line
            .iter()
            .copied()
            .filter(|m| {
                if m.gateway == me {
                    wanted.contains(&m.member)
                } else {
                    !self.is_dead(m.gateway)
                }
            })
            .collect();
        // Each member's priority as its gateway gives it.
        let prio_of = |uid: MemberUid| {
            if uid.gateway == me {
                priority_of(uid.member)
            } else {
                current.priority_of(uid)
            }
        };
        let kept_active = current.active.filter(|a| line.contains(a));
        for &member in &wanted {
            let uid = MemberUid {
                gateway: me,
                member,
            };
            // A member once seen in the line and now gone was removed by others: not re-added
            // (local_effects ended it); only new ones enter, behind the standbys of their
            // priority or higher (docs/semantics.md#priority).
            if !current.line.contains(&uid) && !line.contains(&uid) {
                let at = standby_place(&line, kept_active, priority_of(member), true, prio_of);
                line.insert(at, uid);
            }
        }
        // This gateway's active member stepped down and holds nothing: the line moves to its
        // successor (docs/semantics.md#cluster-priority-and-hand-over).
        let yielded = self.yielded_in(sub, &current, &line, kept_active, &prio_of);
        if let Some((stepping, cause)) = yielded {
            super::values::step_past(&mut line, stepping, cause, prio_of);
        }
        let (active, epoch) = match kept_active {
            Some(a) if yielded.is_none() => (Some(a), current.epoch),
            _ => match line.first() {
                // A promotion waits for the watch to deliver the value it replaces (this
                // gateway's own write may be known from its answer first): its epoch needs
                // every floor written before it.
                Some(_) if !self.has_seen(revision) => return,
                Some(first) => (Some(*first), self.epoch_after(revision)),
                None => (None, current.epoch),
            },
        };
        // What this gateway gave back rides with the promotion; a promotion without any clears
        // what an earlier one carried.
        let carry = match self.carry.get(sub) {
            Some(given) => given.carry.clone(),
            None if active != current.active => Vec::new(),
            None => current.carry.clone(),
        };
        // A new active member after an earlier one (or after a line that had handed out an
        // epoch) is a promotion; the line's first is not.
        let promoted = if active == current.active {
            current.promoted
        } else {
            active.is_some() && (current.active.is_some() || current.epoch != 0)
        };
        // Taking over from a dead gateway's member: nobody gave its messages back.
        let took_over = if active == current.active {
            current.took_over
        } else {
            active.is_some()
                && current
                    .active
                    .is_some_and(|a| a.gateway != me && self.is_dead(a.gateway))
        };
        // Each member's metadata as its gateway gives it: this gateway's own, the others' as
        // the value holds them.
        let meta = line
            .iter()
            .filter_map(|&uid| {
                let meta = if uid.gateway == me {
                    metadata_of(uid.member)
                } else {
                    current.meta_of(uid)
                };
                (!meta.is_empty()).then(|| (uid, meta.to_string()))
            })
            .collect();
        let prio = line
            .iter()
            .map(|&uid| (uid, prio_of(uid)))
            .filter(|(_, p)| *p > 0)
            .collect();
        // A hand-over asked here marks the line's epoch; the mark goes once that epoch is over
        // or no standby could take over (docs/semantics.md#cluster-priority-and-hand-over).
        let asked = self.asked.get(sub).copied().filter(|&e| e == current.epoch);
        let mut next = SubValue {
            line,
            active,
            epoch,
            carry,
            promoted,
            took_over,
            meta,
            prio,
            hand_over: asked.unwrap_or(current.hand_over),
        };
        if next.hand_over != 0
            && (next.hand_over != next.epoch || next.successor(StepDownCause::HandOver).is_none())
        {
            next.hand_over = 0;
        }
        // A hand-over asked here that cannot be is over: it is not marked again later, when
        // another standby joins.
        if asked.is_some() && next.hand_over == 0 {
            self.asked.remove(sub);
        }
        self.trim_to_fit(sub, &mut next, &current.line);
        if next.line.is_empty() {
            self.issue(now, key, Op::Delete(revision), None);
        } else if next != current {
            let bytes = encode(&next);
            self.issue(now, key, Op::Update(bytes, revision), Some(next));
        }
    }
}

impl Coordinator {
    /// Leaves out of `next` the members this gateway would add to the line (not in `before`),
    /// newest first, while its value encodes to more than [`MAX_LINE_BYTES`]; each is
    /// forgotten and ended ([`EndStatus::LineFull`]). Members already in the line stay.
    fn trim_to_fit(&mut self, sub: &str, next: &mut SubValue, before: &[MemberUid]) {
        let me = self.me;
        while encode(next).len() > MAX_LINE_BYTES {
            let Some(at) = next
                .line
                .iter()
                .rposition(|uid| uid.gateway == me && !before.contains(uid))
            else {
                tracing::warn!(
                    subscription = sub,
                    "a singleton's line encodes to more than {MAX_LINE_BYTES} bytes with only members already in it"
                );
                return;
            };
            let uid = next.line.remove(at);
            next.meta.retain(|(u, _)| *u != uid);
            next.prio.retain(|(u, _)| *u != uid);
            if next.active == Some(uid) {
                next.active = next.line.first().copied();
            }
            if let Some(members) = self.local.get_mut(sub) {
                members.retain(|m| m.id != uid.member);
            }
            self.effects.push_back(Effect::End {
                subscription: sub.to_string(),
                member: uid.member,
                status: EndStatus::LineFull,
            });
        }
    }
}

fn encode(v: &SubValue) -> Bytes {
    Bytes::from(serde_json::to_vec(v).unwrap_or_default())
}

#[path = "coordinator_step_down.rs"]
mod step_down;

#[cfg(test)]
#[path = "coordinator_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "coordinator_step_down_tests.rs"]
mod step_down_tests;
