//! The cluster world (the campaign that drives it is `cluster_campaign.rs`): N gateways, each a [`Coordinator`] and a small driver, over the in-memory
//! backplane model, in one deterministic single-threaded loop with a virtual clock. Every
//! decision comes from one seed: latencies, each gateway's clock (offset and a rate within the
//! drift bound), the workload (members join and close on random gateways) and the faults
//! (gateway crashes and restarts as a new incarnation, partitions from the backplane and heals).
//! The [`ClusterChecker`] sees every activation, end and backplane value in true time; after the
//! faults heal, the cluster must settle within a budget.
//!
//! A request's write takes effect one latency after it is sent and its answer arrives one more
//! latency later; a gateway cut off from the backplane gets `Unavailable` only after the request
//! timeout, and an answer that arrives while it is cut off is lost (the write may have happened).
//!
//! The driver also models what the gateway's shell does around the coordinator:
//! - **acts**: every [`ACT_EVERY`], each gateway hands a message to its active members or sends
//!   an ack for them, only if its lease gate ([`Coordinator::may_act`]) says so at that moment;
//!   the checker sees every act (check (g));
//! - **frozen hosts**: a gateway frozen for a while (SIGSTOP) takes no event; what reaches it
//!   (answers, watch entries, timers, acts) waits in its buffer and is taken in order when it
//!   resumes, the clock having jumped;
//! - **joins**: a singleton join is admitted only while the gateway's lease is valid (it waits
//!   otherwise) and answered once its member is in the line ([`Effect::InLine`]); check (h)
//!   holds the line to the order joins were answered and arrived in;
//! - **a failed first lease create**: gateways start together, and a seed may make a gateway's
//!   first lease create fail unanswered ("no responders"): it starts a new incarnation after
//!   [`NEW_INCARNATION_PAUSE`], as the shell does.
//!
//! The shell's model is in `cluster_shell.rs`; this file is the one event loop that every
//! input goes through (about 700 lines), kept whole so its order of events reads in one place.

use std::{
    cmp::Reverse,
    collections::{BTreeMap, BinaryHeap},
    task::{Context, Poll, Waker},
    time::Duration,
};

use tinybroker::cluster::{
    backplane::{Backplane, Entry, KvError, Revision, Watch},
    coordinator::{Command, Config, Coordinator, Effect, GatewayId, Key, MemberUid, Op, SubValue},
};

use crate::{backplane::Model, cluster_checker::ClusterChecker, rng::Rng};

/// The driver's model of the gateway's shell around the coordinator: acts, frozen hosts, joins.
#[path = "cluster_shell.rs"]
mod shell;

/// The driver's model of fence records and fenced publishes.
#[path = "cluster_fence.rs"]
mod fence;

/// The lease (`--gateway-lease`) in the simulation.
pub const LEASE: Duration = Duration::from_millis(900);
/// The drift bound the coordinators assume; the simulated clocks stay within it.
pub const MAX_DRIFT_PERCENT: u32 = 10;
const REQUEST_TIMEOUT: Duration = Duration::from_millis(250);
/// Deletions expire after this long at most (each seed draws its own, from 100 ms up): far
/// shorter than production's 10 minutes, so that partitions and lagging watches outlast them.
const MAX_DELETION_TTL: Duration = Duration::from_millis(2_000);
/// The keys whose deletions expire, as in production: subscriptions' lines, not leases.
const EXPIRING: &str = "sub.";
/// How often a gateway hands messages to its active members or acks them.
pub const ACT_EVERY: Duration = Duration::from_millis(20);
/// How long a gateway whose lease lapsed keeps its members while it tries to renew, in the
/// seeds that set a patience.
pub const LAPSE_PATIENCE: Duration = Duration::from_millis(1_500);
/// The shell's pause before a new incarnation when the lease create was never confirmed.
const NEW_INCARNATION_PAUSE: Duration = Duration::from_secs(1);

fn planted(bug: tinybroker::core::planted::PlantedBug) -> bool {
    tinybroker::core::planted::is_planted(bug)
}

fn config(lapse_patience: Duration) -> Config {
    Config {
        lease: LEASE,
        max_drift_percent: MAX_DRIFT_PERCENT,
        margin: Duration::from_millis(50),
        retry: Duration::from_millis(50),
        lapse_patience,
    }
}

enum Ev {
    Apply(GatewayId, Command),
    Answer(usize, GatewayId, u64, Result<Revision, KvError>),
    Timeout(usize, GatewayId, u64),
    Watched(usize, GatewayId, Entry),
    Tick(usize, GatewayId, u64),
    Restart(usize),
    /// Every gateway acts now (one [`Ev::Act`] each).
    Pulse,
    Act(usize, GatewayId),
    Resume(usize, GatewayId),
    /// The gateway sends a fence record write.
    Record(usize, GatewayId, fence::Write),
    /// A record write reaches the stream.
    RecordStored(usize, GatewayId, fence::Write),
    /// The gateway hears what became of its write: stored (or a record at or above it was
    /// there), or refused by a full stream after the record below it was deleted (`true`).
    Recorded(usize, GatewayId, fence::Write, bool),
    /// A fenced publish reaches the stream: (subscription, publisher, epoch).
    Fenced(String, MemberUid, u64),
    /// A member stepping down settled what it held (docs/semantics.md#cluster-priority-and-hand-over):
    /// (subscription, member).
    Yield(usize, GatewayId, String, u64),
    /// A lease renewal unanswered for a sixth of the lease (the shell's bound): request id.
    Slow(usize, GatewayId, u64),
}

struct Gateway {
    coord: Option<Coordinator>,
    id: GatewayId,
    watch: Option<Watch>,
    /// Local clock: `offset + true_time * rate_ppm / 1e6`.
    rate_ppm: u64,
    offset_ns: u64,
    partitioned: bool,
    /// Local members held: member id → subscription.
    members: BTreeMap<u64, String>,
    /// Requests sent and not answered.
    pending: BTreeMap<u64, ()>,
    next_tick: Option<u64>,
    last_watch: u64,
    /// Local members the coordinator made active: member id → subscription.
    active: BTreeMap<u64, String>,
    /// Frozen: events for it wait here, in order.
    frozen: Option<Vec<Ev>>,
    /// Joins that arrived while it held no valid lease: (member, subscription).
    waiting: Vec<(u64, String)>,
    /// Between incarnations after a lease create that was never confirmed.
    pausing: bool,
    /// Its next lease create fails unanswered (no responders): drawn per seed at start.
    fail_create: bool,
    /// Local members asked to step down that have not settled yet.
    stepping: std::collections::BTreeSet<u64>,
    /// Activations whose fence record was stored while the lease was lapsed: (subscription,
    /// member, epoch), confirmed once it is renewed (docs/semantics.md#cluster-lease-lapse).
    deferred: Vec<(String, u64, u64)>,
}

impl Gateway {
    fn local(&self, t: u64) -> Duration {
        Duration::from_nanos(
            self.offset_ns + (u128::from(t) * u128::from(self.rate_ppm) / 1_000_000) as u64,
        )
    }

    /// The first true time at which the local clock reads `local` or later.
    fn true_time(&self, local: Duration) -> u64 {
        let l = (local.as_nanos() as u64).saturating_sub(self.offset_ns);
        (u128::from(l) * 1_000_000).div_ceil(u128::from(self.rate_ppm)) as u64
    }

    fn uid(&self, member: u64) -> MemberUid {
        MemberUid {
            gateway: self.id,
            member,
        }
    }
}

pub struct ClusterWorld {
    now: u64,
    seq: u64,
    queue: BinaryHeap<Reverse<(u64, u64, usize)>>,
    events: Vec<Option<Ev>>,
    model: Model,
    gateways: Vec<Gateway>,
    next_gateway: u64,
    next_member: u64,
    observer: Watch,
    rng: Rng,
    /// Every backplane write takes longer than the renewal bound (docs/semantics.md#cluster-lease-lapse).
    slow_bucket: bool,
    /// `--gateway-lapse-patience` of every gateway of this seed.
    lapse_patience: Duration,
    /// Deletions learned from refusals by gateway incarnations that are gone.
    learned_by_gone: u64,
    /// Lapses of gateway leases, and those a renewal ended, by incarnations gone.
    lapses_by_gone: (u64, u64),
    fences: fence::Fences,
    /// Members' priorities (docs/semantics.md#priority): those not here have 0.
    priority: BTreeMap<u64, u32>,
    pub checker: ClusterChecker,
}

fn poll_now<T>(f: &mut (impl Future<Output = T> + Unpin)) -> T {
    let mut cx = Context::from_waker(Waker::noop());
    match std::pin::Pin::new(f).poll(&mut cx) {
        Poll::Ready(v) => v,
        // The model answers at once; the driver models the time it takes.
        Poll::Pending => panic!("the backplane model never waits"),
    }
}

fn ns(d: Duration) -> u64 {
    d.as_nanos() as u64
}

impl ClusterWorld {
    pub fn new(seed: u64, gateways: usize) -> Self {
        let model = Model::new();
        // Drawn from its own stream, so the seed's workload and faults stay what they were.
        let ttl = Rng::new(seed ^ 0x7e1e_7e1e).range(100, MAX_DELETION_TTL.as_millis() as u64);
        model.expire_deletions_after(ttl * 1_000_000, EXPIRING);
        let observer = poll_now(&mut model.client(0).watch("sub.")).expect("observer watch");
        let mut world = Self {
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            events: Vec::new(),
            model,
            gateways: Vec::new(),
            next_gateway: 1,
            next_member: 1,
            observer,
            rng: Rng::new(seed),
            // A fifth of the seeds: a bucket that answers every write, slowly. Drawn from its
            // own stream, so the seed's workload and faults stay what they were.
            slow_bucket: Rng::new(seed ^ 0x5105_b0c7).range(0, 4) == 0,
            // Half the seeds as production runs by default (members end at the lapse), half
            // with a lapse patience.
            lapse_patience: if Rng::new(seed ^ 0x1a95_e000).range(0, 1) == 0 {
                Duration::ZERO
            } else {
                LAPSE_PATIENCE
            },
            learned_by_gone: 0,
            lapses_by_gone: (0, 0),
            fences: fence::Fences::new(seed),
            priority: BTreeMap::new(),
            checker: ClusterChecker::default(),
        };
        let rho = u64::from(MAX_DRIFT_PERCENT) * 10_000;
        for _ in 0..gateways {
            // Clocks at the bound's extremes often: that is where a wrong wait shows.
            let rate_ppm = match world.rng.range(0, 3) {
                0 => 1_000_000 - rho,
                1 => 1_000_000 + rho,
                _ => world.rng.range(1_000_000 - rho, 1_000_000 + rho),
            };
            let offset_ns = world.rng.range(0, 1 << 40);
            world.gateways.push(Gateway {
                coord: None,
                id: GatewayId(0),
                watch: None,
                rate_ppm,
                offset_ns,
                partitioned: false,
                members: BTreeMap::new(),
                pending: BTreeMap::new(),
                next_tick: None,
                last_watch: 0,
                active: BTreeMap::new(),
                frozen: None,
                waiting: Vec::new(),
                stepping: Default::default(),
                deferred: Vec::new(),
                pausing: false,
                fail_create: false,
            });
        }
        // Gateways start together; one in three fails its first lease create (drawn from a
        // stream of its own, so the seed's workload and faults stay what they were).
        let mut starts = Rng::new(seed ^ 0x1ea5_e000);
        for g in &mut world.gateways {
            g.fail_create = starts.range(0, 2) == 0;
        }
        for slot in 0..gateways {
            world.start(slot);
        }
        world.at(ns(ACT_EVERY), Ev::Pulse);
        world
    }

    pub fn now(&self) -> Duration {
        Duration::from_nanos(self.now)
    }

    fn trace(&self, text: String) {
        self.checker.trace.at(self.now(), text);
    }

    fn at(&mut self, t: u64, ev: Ev) {
        self.seq += 1;
        self.events.push(Some(ev));
        self.queue
            .push(Reverse((t, self.seq, self.events.len() - 1)));
    }

    fn latency(&mut self) -> u64 {
        if self.slow_bucket {
            // Round trips of 160-240 ms: above the renewal bound (150 ms), within the request
            // timeout (250 ms).
            return ns(Duration::from_micros(self.rng.range(80_000, 120_000)));
        }
        ns(Duration::from_micros(self.rng.range(500, 15_000)))
    }

    /// Starts a new incarnation in `slot`.
    fn start(&mut self, slot: usize) {
        let id = GatewayId(self.next_gateway);
        self.next_gateway += 1;
        let client = self.model.client(id.0);
        let g = &mut self.gateways[slot];
        if g.partitioned {
            self.model.partition(id.0);
        }
        g.watch = Some(poll_now(&mut client.watch("")).unwrap_or_else(|_| {
            // Cut off at start: watch once reconnected (the model's watch resumes on heal).
            self.model.heal(id.0);
            let w = poll_now(&mut client.watch("")).expect("watch");
            self.model.partition(id.0);
            w
        }));
        g.id = id;
        g.members.clear();
        g.active.clear();
        g.pending.clear();
        g.deferred.clear();
        g.next_tick = None;
        g.pausing = false;
        let local = g.local(self.now);
        g.coord = Some(Coordinator::new(id, config(self.lapse_patience), local));
        self.trace(format!("slot {slot}: gateway g{} starts", id.0));
        self.pump(slot);
        self.pump_watches();
    }

    /// Drains a gateway's commands and effects and re-arms its timer.
    fn pump(&mut self, slot: usize) {
        loop {
            let g = &mut self.gateways[slot];
            let Some(coord) = g.coord.as_mut() else {
                return;
            };
            let id = g.id;
            if let Some(cmd) = coord.poll_command() {
                g.pending.insert(cmd.id, ());
                let req = cmd.id;
                let renewal = cmd.key == Key::Lease(id) && matches!(cmd.op, Op::Update(..));
                let lat = self.latency();
                self.at(self.now + lat, Ev::Apply(id, cmd));
                self.at(self.now + ns(REQUEST_TIMEOUT), Ev::Timeout(slot, id, req));
                if renewal {
                    // The shell's bound on a renewal: another follows one unanswered this long.
                    self.at(self.now + ns(LEASE / 6), Ev::Slow(slot, id, req));
                }
                continue;
            }
            if let Some(effect) = coord.poll_effect() {
                match effect {
                    Effect::Activate {
                        subscription,
                        member,
                        epoch,
                        ..
                    } => self.activation(slot, id, subscription, member, epoch),
                    Effect::InLine {
                        subscription,
                        member,
                    } => {
                        let uid = g.uid(member);
                        self.checker.answered(self.now(), &subscription, uid);
                    }
                    Effect::Standby {
                        subscription,
                        member,
                        position,
                    } => {
                        let uid = g.uid(member);
                        self.checker
                            .standby(self.now(), &subscription, uid, position);
                    }
                    Effect::End { member, .. } => {
                        let uid = g.uid(member);
                        g.members.remove(&member);
                        g.active.remove(&member);
                        self.checker
                            .ended(self.now(), uid, "ended by its gateway: unavailable");
                    }
                    // The simulation proclaims nothing.
                    Effect::Proclaimed { .. } => {}
                    Effect::StepDown {
                        subscription,
                        member,
                        ..
                    } => self.step_down(slot, subscription, member),
                    Effect::CallOffStepDown {
                        subscription,
                        member,
                    } => self.call_off(slot, &subscription, member),
                    Effect::SteppedDown {
                        subscription,
                        member,
                        position,
                        ..
                    } => {
                        let uid = g.uid(member);
                        self.checker
                            .standby(self.now(), &subscription, uid, position);
                    }
                }
                continue;
            }
            if coord.is_fenced() {
                let was_leased = coord.was_leased();
                self.learned_by_gone += coord.deletions_learned();
                let lapses = coord.lapses();
                self.count_lapses(lapses);
                self.trace(format!("slot {slot}: gateway g{} fenced itself", id.0));
                if was_leased {
                    self.start(slot);
                } else {
                    // Never leased: the shell pauses before its next incarnation.
                    let g = &mut self.gateways[slot];
                    g.coord = None;
                    g.watch = None;
                    g.pausing = true;
                    self.at(self.now + ns(NEW_INCARNATION_PAUSE), Ev::Restart(slot));
                }
                return;
            }
            let local = Duration::from_nanos(
                g.offset_ns + (u128::from(self.now) * u128::from(g.rate_ppm) / 1_000_000) as u64,
            );
            if !g.waiting.is_empty() && coord.may_act(local) {
                // Joins that waited for the lease, in the order they arrived.
                let (member, sub) = g.waiting.remove(0);
                g.members.insert(member, sub.clone());
                let uid = MemberUid {
                    gateway: id,
                    member,
                };
                self.checker
                    .joined(Duration::from_nanos(self.now), &sub, uid);
                let priority = self.priority.get(&member).copied().unwrap_or(0);
                coord.member_joined_with(local, &sub, member, String::new(), priority);
                continue;
            }
            let deadline = coord
                .poll_timeout()
                .map(|d| g.true_time(d).max(self.now + 1));
            if deadline.is_some() && deadline != g.next_tick {
                g.next_tick = deadline;
                let t = deadline.unwrap_or_default();
                self.at(t, Ev::Tick(slot, id, t));
            }
            return;
        }
    }

    /// Moves what the watches yield into delivery events, and feeds the checker's own watch.
    fn pump_watches(&mut self) {
        let mut cx = Context::from_waker(Waker::noop());
        while let Poll::Ready(Some(Ok(e))) = self.observer.as_mut().poll_next(&mut cx) {
            let Some(sub) = e.key.strip_prefix("sub.") else {
                continue;
            };
            let v: SubValue = e
                .value
                .as_ref()
                .and_then(|b| serde_json::from_slice(b).ok())
                .unwrap_or_default();
            self.checker.kv_changed(self.now(), sub, v, e.revision);
        }
        for slot in 0..self.gateways.len() {
            loop {
                let g = &mut self.gateways[slot];
                let (Some(w), Some(_)) = (g.watch.as_mut(), g.coord.as_ref()) else {
                    break;
                };
                let Poll::Ready(Some(Ok(e))) = w.as_mut().poll_next(&mut cx) else {
                    break;
                };
                let id = g.id;
                let lat = self.latency();
                let g = &mut self.gateways[slot];
                let t = (self.now + lat).max(g.last_watch);
                g.last_watch = t;
                self.at(t, Ev::Watched(slot, id, e));
            }
        }
    }

    /// A subscription's value as the store holds it now.
    fn read_sub(&self, key: &str) -> Option<SubValue> {
        let entry = poll_now(&mut self.model.client(u64::MAX).get(key)).ok()??;
        serde_json::from_slice(entry.value.as_ref()?).ok()
    }

    /// Check (f) for a write of `next` over `before` by gateway `writer`: a new active member
    /// took over from a dead gateway's (`took_over`) exactly when another gateway wrote it
    /// after the earlier active member's lease was deleted; otherwise the earlier active
    /// member's own gateway wrote it, after giving back what it held.
    fn check_hand_over(&mut self, key: &str, writer: GatewayId, before: &SubValue, next: &[u8]) {
        let Ok(next) = serde_json::from_slice::<SubValue>(next) else {
            return;
        };
        let (Some(earlier), Some(_)) = (before.active, next.active) else {
            return;
        };
        if next.active == before.active {
            return;
        }
        let lease = format!("lease.{}", earlier.gateway.0);
        let lease_live = poll_now(&mut self.model.client(u64::MAX).get(&lease))
            .ok()
            .flatten()
            .is_some_and(|e| e.value.is_some());
        let sub = key.trim_start_matches("sub.");
        self.checker
            .hand_over(self.now(), sub, earlier, writer, next.took_over, lease_live);
    }

    fn current(&self, slot: usize, id: GatewayId) -> bool {
        let g = &self.gateways[slot];
        g.coord.is_some() && g.id == id
    }

    fn handle(&mut self, ev: Ev) {
        if let Some((slot, id)) = ev.held_by()
            && self.current(slot, id)
            && let Some(buffer) = self.gateways[slot].frozen.as_mut()
        {
            buffer.push(ev);
            return;
        }
        match ev {
            Ev::Pulse => self.pulse(),
            Ev::Act(slot, id) => {
                if self.current(slot, id) {
                    self.act(slot);
                }
            }
            Ev::Resume(slot, id) => self.resume(slot, id),
            Ev::Record(slot, id, write) => {
                if self.current(slot, id) {
                    self.send_record(slot, id, write);
                }
            }
            Ev::RecordStored(slot, id, write) => self.record_stored(slot, id, write),
            Ev::Recorded(slot, id, write, full) => {
                self.recorded(slot, id, write, full);
                self.pump(slot);
            }
            Ev::Fenced(sub, uid, epoch) => self.fenced_arrives(&sub, uid, epoch),
            Ev::Yield(slot, id, sub, member) => {
                if self.current(slot, id) {
                    self.settled(slot, sub, member);
                }
            }
            Ev::Apply(id, cmd) => {
                // Sent is sent: a crashed gateway's request still reaches the store.
                let client = self.model.client(id.0);
                let spelled = cmd.key.to_string();
                // What the write replaces, for check (f) (read by a client never cut off).
                let before = match &cmd.op {
                    Op::Update(..) | Op::Delete(_) if cmd.key.line().is_some() => {
                        self.read_sub(&spelled)
                    }
                    _ => None,
                };
                let slot = self.gateways.iter().position(|g| g.id == id);
                if let Some(slot) = slot
                    && self.gateways[slot].fail_create
                    && matches!(cmd.key, Key::Lease(_))
                    && matches!(cmd.op, Op::Create(_))
                {
                    // No server took it: nothing stored, the answer says so.
                    self.gateways[slot].fail_create = false;
                    let lat = self.latency();
                    let e = KvError::Unavailable("no responders".into());
                    self.at(self.now + lat, Ev::Answer(slot, id, cmd.id, Err(e)));
                    return;
                }
                let deleting = matches!(cmd.op, Op::Delete(_));
                let result = match cmd.op {
                    Op::Create(v) => poll_now(&mut client.create(&spelled, v)),
                    Op::Update(v, r) => {
                        let written = poll_now(&mut client.update(&spelled, v.clone(), r));
                        if let (Ok(_), Some(before)) = (&written, &before) {
                            self.check_hand_over(&spelled, id, before, &v);
                        }
                        written
                    }
                    Op::Delete(r) => poll_now(&mut client.delete(&spelled, r)),
                };
                if let Some(slot) = self.gateways.iter().position(|g| g.id == id) {
                    let lat = self.latency();
                    let emptied = deleting && result.is_ok();
                    if let (true, Some(before)) = (emptied, &before)
                        && before.epoch != 0
                    {
                        // The shell records the ended epoch once the delete's answer is in.
                        let sub = cmd.key.line().unwrap_or_default().to_string();
                        self.line_emptied(slot, id, &sub, before.epoch, lat);
                    }
                    self.at(self.now + lat, Ev::Answer(slot, id, cmd.id, result));
                }
                self.pump_watches();
            }
            Ev::Answer(slot, id, req, result) => {
                // An answer to a cut-off gateway is lost: it sees the timeout instead.
                if self.current(slot, id)
                    && !self.gateways[slot].partitioned
                    && self.gateways[slot].pending.remove(&req).is_some()
                {
                    self.deliver(slot, |c, now| c.write_result(now, req, result));
                }
            }
            Ev::Timeout(slot, id, req) => {
                if self.current(slot, id) && self.gateways[slot].pending.remove(&req).is_some() {
                    let e = KvError::Unavailable("request timed out".into());
                    self.deliver(slot, |c, now| c.write_result(now, req, Err(e)));
                }
            }
            Ev::Watched(slot, id, e) => {
                if self.current(slot, id) {
                    self.deliver(slot, |c, now| {
                        c.backplane_changed(now, &e.key, e.value.as_deref(), e.revision)
                    });
                }
            }
            Ev::Tick(slot, id, t) => {
                if self.current(slot, id) && self.gateways[slot].next_tick == Some(t) {
                    self.gateways[slot].next_tick = None;
                    self.deliver(slot, |c, now| c.tick(now));
                }
            }
            Ev::Slow(slot, id, req) => {
                if self.current(slot, id) && self.gateways[slot].pending.contains_key(&req) {
                    self.deliver(slot, |c, now| c.write_slow(now, req));
                }
            }
            Ev::Restart(slot) => {
                if self.gateways[slot].coord.is_none() {
                    self.start(slot);
                }
            }
        }
    }

    fn deliver(&mut self, slot: usize, f: impl FnOnce(&mut Coordinator, Duration)) {
        let g = &mut self.gateways[slot];
        let local = g.local(self.now);
        if let Some(c) = g.coord.as_mut() {
            f(c, local);
        }
        self.pump(slot);
    }

    /// Runs every event up to true time `until`.
    pub fn run_until(&mut self, until: Duration) {
        let until = ns(until);
        while let Some(&Reverse((t, _, i))) = self.queue.peek() {
            if t > until {
                break;
            }
            self.queue.pop();
            self.now = t;
            self.model.advance(t);
            if let Some(ev) = self.events[i].take() {
                self.handle(ev);
            }
        }
        self.now = until;
        // Events are taken as they run; drop the spent prefix now and then.
        if self.queue.is_empty() {
            self.events.clear();
        }
    }

    /// Deletions expire `ttl` after they are written, from now on (instead of the seed's).
    pub fn expire_deletions_after(&self, ttl: Duration) {
        self.model.expire_deletions_after(ns(ttl), EXPIRING);
    }

    /// What the bucket holds under `key` now (a deletion not yet expired is an entry without a
    /// value), read by the observer, which is never cut off.
    pub fn entry(&self, key: &str) -> Option<Entry> {
        poll_now(&mut self.model.client(0).get(key)).expect("the observer is never cut off")
    }

    /// The id of the gateway incarnation in `slot`.
    pub fn gateway_id(&self, slot: usize) -> GatewayId {
        self.gateways[slot].id
    }

    /// Runs in steps of `step` until `done` holds, for at most `within`; whether it held.
    pub fn run_until_state(
        &mut self,
        step: Duration,
        within: Duration,
        mut done: impl FnMut(&Self) -> bool,
    ) -> bool {
        let deadline = self.now() + within;
        while !done(self) {
            if self.now() >= deadline {
                return false;
            }
            let next = self.now() + step;
            self.run_until(next);
        }
        true
    }

    /// How many watch deliveries of a deletion were skipped because it expired first.
    pub fn skipped_deletions(&self) -> u64 {
        self.model.skipped_deletions()
    }

    /// How many deletions gateways learned from a refusal naming no value, not from the watch.
    pub fn deletions_learned(&self) -> u64 {
        let live: u64 = self
            .gateways
            .iter()
            .filter_map(|g| g.coord.as_ref())
            .map(Coordinator::deletions_learned)
            .sum();
        self.learned_by_gone + live
    }

    /// Lapses of gateway leases in this run, and those a confirmed renewal ended (the
    /// gateway went on with its members).
    pub fn lapses(&self) -> (u64, u64) {
        let (lapses, resumes) = self
            .gateways
            .iter()
            .filter_map(|g| g.coord.as_ref())
            .map(Coordinator::lapses)
            .fold(self.lapses_by_gone, |(a, b), (c, d)| (a + c, b + d));
        (lapses, resumes)
    }

    fn count_lapses(&mut self, (lapses, resumes): (u64, u64)) {
        self.lapses_by_gone.0 += lapses;
        self.lapses_by_gone.1 += resumes;
    }

    /// Slots whose gateway runs (also one between incarnations, which takes joins).
    pub fn live_slots(&self) -> Vec<usize> {
        (0..self.gateways.len())
            .filter(|&s| self.gateways[s].coord.is_some() || self.gateways[s].pausing)
            .collect()
    }

    /// Closes a random member's stream cleanly, if any is held.
    pub fn close_one(&mut self, pick: u64) {
        let all: Vec<(usize, u64, String)> = self
            .gateways
            .iter()
            .enumerate()
            .filter(|(_, g)| g.coord.is_some())
            .flat_map(|(s, g)| g.members.iter().map(move |(m, sub)| (s, *m, sub.clone())))
            .collect();
        if all.is_empty() {
            return;
        }
        let (slot, member, sub) = all[(pick % all.len() as u64) as usize].clone();
        if self.gateways[slot].frozen.is_some() {
            // Its client closes; a frozen gateway notices when it resumes (not modelled).
            return;
        }
        let uid = self.gateways[slot].uid(member);
        self.gateways[slot].members.remove(&member);
        self.gateways[slot].active.remove(&member);
        self.checker.ended(self.now(), uid, "stream closed");
        self.deliver(slot, |c, now| c.member_left(now, &sub, member));
    }

    pub fn crash(&mut self, slot: usize, back_after: Duration) {
        let g = &mut self.gateways[slot];
        let Some(gone) = g.coord.take() else {
            return;
        };
        self.learned_by_gone += gone.deletions_learned();
        let lapses = gone.lapses();
        g.watch = None;
        g.frozen = None;
        g.waiting.clear();
        let members: Vec<MemberUid> = g.members.keys().map(|m| g.uid(*m)).collect();
        g.members.clear();
        g.active.clear();
        self.trace(format!(
            "slot {slot}: gateway g{} CRASHES",
            self.gateways[slot].id.0
        ));
        self.count_lapses(lapses);
        for uid in members {
            self.checker.ended(self.now(), uid, "gateway crashed");
        }
        self.at(self.now + ns(back_after), Ev::Restart(slot));
    }

    pub fn partition(&mut self, slot: usize) {
        let g = &mut self.gateways[slot];
        g.partitioned = true;
        self.model.partition(g.id.0);
        self.trace(format!(
            "slot {slot}: gateway g{} PARTITIONED",
            self.gateways[slot].id.0
        ));
    }

    pub fn heal(&mut self, slot: usize) {
        let g = &mut self.gateways[slot];
        if !g.partitioned {
            return;
        }
        g.partitioned = false;
        self.model.heal(g.id.0);
        self.trace(format!(
            "slot {slot}: gateway g{} healed",
            self.gateways[slot].id.0
        ));
        self.pump_watches();
    }

    pub fn is_partitioned(&self, slot: usize) -> bool {
        self.gateways[slot].partitioned
    }

    pub fn restart_crashed(&mut self) {
        for slot in 0..self.gateways.len() {
            if self.gateways[slot].coord.is_none() {
                self.start(slot);
            }
        }
    }
}
