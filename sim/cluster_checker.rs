//! The cluster checker: the truth of every singleton subscription across gateways, fed by the
//! cluster world in true simulated time, checking docs/semantics.md#cluster-mode continuously:
//!
//! (a) epochs per subscription strictly increase, in the order members are activated and in the
//!     backplane's values;
//! (b) no two members are active in overlapping periods (a period runs from the gateway's
//!     confirmation to the member's end: its stream closed, its gateway ended it, or its gateway
//!     crashed);
//! (c) promotion follows join order: every value keeps its line in order (removals anywhere,
//!     appends at the back), its active member is the first of the line, and a member leaves the
//!     line only once it is gone (a live member never loses its place);
//! (d) liveness, once faults heal: every subscription with live members has exactly one active
//!     member, the first of a line that holds exactly the live members;
//! (e) a standby notice goes to a live member that is not active, in the line, with a place
//!     (1 = next) no nearer the front than it stands in the newest value (places only move
//!     forward: appends go to the back);
//! (f) a hand-over says how the earlier active member went: a value that replaces it is marked
//!     `took_over` (what it held comes back unnamed, counted by the new gateway) only when
//!     another gateway wrote it once the earlier member's gateway's lease was deleted, and
//!     unmarked only when that member's own gateway wrote it (after giving back what it held);
//! (g) a gateway hands a singleton's message to a member, or acks one, only while its lease is
//!     valid (before the true time its lease ends) and while the backplane names that member
//!     active: never after it was frozen past its lease and others promoted;
//! (h) join order: a member whose join was answered before another's join arrived (on any
//!     gateway) stands ahead of it in every line that holds both;
//! (i) fenced publish (docs/semantics.md#cluster-fenced-publish): a publish fenced by epoch E
//!     is stored only if no member was confirmed with an epoch above E before it was stored.
//!
//! A frozen gateway's members count, for (b) and (c), only until its lease ends: from then on
//! it acts no more (check (g)), though it ends their streams only once it resumes.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use tinybroker::cluster::coordinator::{MemberUid, SubValue};

use crate::trace::Trace;

/// Violations recorded per seed, at most.
const MAX_VIOLATIONS: usize = 100;

#[derive(Default)]
struct SubTruth {
    /// Highest epoch confirmed to a member.
    last_epoch: u64,
    /// Members active now, with when they were confirmed.
    open: BTreeMap<MemberUid, (Duration, u64)>,
    /// Members whose streams are open (joined, not ended).
    alive: BTreeSet<MemberUid>,
    /// The backplane's latest value.
    kv: SubValue,
    /// Members that settled a step-down and wait for the line to move past them, with their
    /// active period.
    yielded: BTreeMap<MemberUid, Option<(Duration, u64)>>,
}

#[derive(Default)]
pub struct ClusterChecker {
    subs: BTreeMap<String, SubTruth>,
    sub_of: BTreeMap<MemberUid, String>,
    violations: Vec<String>,
    /// Hand-overs seen by check (f): (taken over from a dead gateway's member, clean).
    pub hand_overs: (u64, u64),
    /// Acts (deliveries, acks) check (g) saw.
    pub acts: u64,
    /// Members of frozen gateways, with the true time their gateway's lease ends.
    lapse: BTreeMap<MemberUid, Duration>,
    /// Members whose joins were answered and that are still live, per subscription.
    answered: BTreeMap<String, BTreeSet<u64>>,
    /// Per member: the members answered before its join arrived (h).
    behind: BTreeMap<u64, BTreeSet<u64>>,
    /// Members that stepped down once: they stand behind later joins of their priority (h).
    stepped_down: BTreeSet<u64>,
    /// The priority each member joined with, when above 0 (c).
    priority: BTreeMap<u64, u32>,
    /// Step-downs whose member settled (j).
    pub step_downs: u64,
    pub trace: Trace,
}

fn m(u: MemberUid) -> String {
    format!("g{}/m{}", u.gateway.0, u.member)
}

fn ms_list(v: &[MemberUid]) -> String {
    v.iter().map(|u| m(*u)).collect::<Vec<_>>().join(" ")
}

impl ClusterChecker {
    pub fn violations(&self) -> &[String] {
        &self.violations
    }

    fn violation(&mut self, at: Duration, text: String) {
        // The first ones tell; a planted bug that breaks a check on every act would otherwise
        // fill memory.
        if self.violations.len() >= MAX_VIOLATIONS {
            return;
        }
        self.trace.at(at, format!("VIOLATION {text}"));
        self.violations
            .push(format!("{:.3}s {text}", at.as_secs_f64()));
    }

    pub fn joined(&mut self, at: Duration, sub: &str, uid: MemberUid) {
        self.trace.at(at, format!("{sub}: {} joins", m(uid)));
        self.sub_of.insert(uid, sub.to_string());
        self.subs
            .entry(sub.to_string())
            .or_default()
            .alive
            .insert(uid);
    }

    /// The member's stream ended (`why`: closed, ended by its gateway, gateway crashed).
    pub fn ended(&mut self, at: Duration, uid: MemberUid, why: &str) {
        let Some(sub) = self.sub_of.remove(&uid) else {
            return;
        };
        self.trace.at(at, format!("{sub}: {} ends ({why})", m(uid)));
        if let Some(answered) = self.answered.get_mut(&sub) {
            answered.remove(&uid.member);
        }
        self.behind.remove(&uid.member);
        self.lapse.remove(&uid);
        let s = self.subs.entry(sub).or_default();
        s.alive.remove(&uid);
        s.open.remove(&uid);
        // Settled, then gone: the line may still move past it by the write in flight.
        if let Some(period) = s.yielded.get_mut(&uid) {
            *period = None;
        }
    }

    /// A join for `sub` arrived at a gateway (h): every member answered before stands ahead.
    pub fn arrives(&mut self, at: Duration, sub: &str, member: u64) {
        self.trace.at(at, format!("{sub}: m{member} arrives"));
        let before = self.answered.get(sub).cloned().unwrap_or_default();
        self.behind.insert(member, before);
    }

    /// The join of `uid` was answered: it is in the line (h).
    pub fn answered(&mut self, at: Duration, sub: &str, uid: MemberUid) {
        self.trace.at(at, format!("{sub}: {} answered", m(uid)));
        self.answered
            .entry(sub.to_string())
            .or_default()
            .insert(uid.member);
    }

    /// Whether the join of member `member` was answered (and it is still live).
    pub fn is_answered(&self, member: u64) -> bool {
        self.answered.values().any(|a| a.contains(&member))
    }

    /// The gateway of `members` froze; it may act for them until `lease_ends` (true time).
    pub fn froze(&mut self, members: &[MemberUid], lease_ends: Duration) {
        for uid in members {
            self.lapse.insert(*uid, lease_ends);
        }
    }

    /// The gateway of `members` resumed.
    pub fn thawed(&mut self, members: &[MemberUid]) {
        for uid in members {
            self.lapse.remove(uid);
        }
    }

    /// Gateway `uid.gateway` handed a message of `sub` to `uid`, or acked one for it, at
    /// `at`; its lease, as it holds it, ends at `lease_ends` (true time) (g).
    pub fn acted(&mut self, at: Duration, sub: &str, uid: MemberUid, lease_ends: Option<Duration>) {
        self.acts += 1;
        let mut found = Vec::new();
        if lease_ends.is_none_or(|ends| at >= ends) {
            found.push(format!(
                "(g) {sub}: g{} acted for {} past its lease (it ended at {:?})",
                uid.gateway.0,
                m(uid),
                lease_ends
            ));
        }
        let active = self.subs.get(sub).and_then(|s| s.kv.active);
        if active != Some(uid) {
            found.push(format!(
                "(g) {sub}: g{} acted for {} while the backplane names {:?} active",
                uid.gateway.0,
                m(uid),
                active.map(m)
            ));
        }
        for f in found {
            self.violation(at, f);
        }
    }

    pub fn activated(&mut self, at: Duration, sub: &str, uid: MemberUid, epoch: u64) {
        self.trace
            .at(at, format!("{sub}: {} ACTIVE epoch {epoch}", m(uid)));
        let s = self.subs.entry(sub.to_string()).or_default();
        let mut found = Vec::new();
        if epoch <= s.last_epoch {
            found.push(format!(
                "(a) {sub}: {} confirmed with epoch {epoch}, not above {}",
                m(uid),
                s.last_epoch
            ));
        }
        let lapse = &self.lapse;
        if let Some((other, (since, e))) = s
            .open
            .iter()
            .find(|(u, _)| lapse.get(u).is_none_or(|ends| at < *ends))
        {
            found.push(format!(
                "(b) {sub}: {} confirmed while {} is active (epoch {e}, since {:.3}s)",
                m(uid),
                m(*other),
                since.as_secs_f64()
            ));
        }
        if s.kv.active != Some(uid) {
            found.push(format!(
                "(c) {sub}: {} confirmed but the backplane's active member is {:?}",
                m(uid),
                s.kv.active.map(m)
            ));
        }
        s.last_epoch = s.last_epoch.max(epoch);
        s.open.insert(uid, (at, epoch));
        for f in found {
            self.violation(at, f);
        }
    }

    /// Member `member` joins with `priority` (docs/semantics.md#priority).
    pub fn ranked(&mut self, member: u64, priority: u32) {
        if priority > 0 {
            self.priority.insert(member, priority);
        }
    }

    /// `uid`, active, settled its step-down (docs/semantics.md#cluster-priority-and-hand-over):
    /// it is sent nothing more, so its active period ends here; the line may move past it.
    pub fn yielded(&mut self, at: Duration, sub: &str, uid: MemberUid) {
        self.trace.at(at, format!("{sub}: {} YIELDED", m(uid)));
        self.step_downs += 1;
        let s = self.subs.entry(sub.to_string()).or_default();
        // One not confirmed yet (its fence record on its way) settles at once.
        let period = s.open.remove(&uid);
        s.yielded.insert(uid, period);
    }

    /// `uid`'s step-down was called off: it is active again, with its epoch, unless the line
    /// moved past it meanwhile or another member was confirmed.
    pub fn resumed(&mut self, at: Duration, sub: &str, uid: MemberUid) {
        self.trace.at(at, format!("{sub}: {} RESUMES", m(uid)));
        let s = self.subs.entry(sub.to_string()).or_default();
        let Some(Some((since, epoch))) = s.yielded.remove(&uid) else {
            return;
        };
        if s.open.contains_key(&uid) {
            return;
        }
        let mut found = Vec::new();
        if epoch < s.last_epoch {
            found.push(format!(
                "(a) {sub}: {} resumes with epoch {epoch} after epoch {} was confirmed",
                m(uid),
                s.last_epoch
            ));
        }
        if s.kv.active != Some(uid) || s.kv.epoch != epoch {
            found.push(format!(
                "(c) {sub}: {} resumes but the backplane's active member is {:?} epoch {}",
                m(uid),
                s.kv.active.map(m),
                s.kv.epoch
            ));
        }
        // A lapsed or frozen gateway's member counts only until its lease's end, as for an
        // activation.
        let lapse = &self.lapse;
        if let Some(other) = s
            .open
            .keys()
            .find(|u| lapse.get(u).is_none_or(|ends| at < *ends))
        {
            found.push(format!(
                "(b) {sub}: {} resumes while {} is active",
                m(uid),
                m(*other)
            ));
        }
        s.open.insert(uid, (since, epoch));
        for f in found {
            self.violation(at, f);
        }
    }

    /// A publish fenced by `uid`'s `epoch` reached the stream and was `stored` or refused (i).
    pub fn fenced(&mut self, at: Duration, sub: &str, uid: MemberUid, epoch: u64, stored: bool) {
        let last = self.subs.get(sub).map_or(0, |s| s.last_epoch);
        if stored && last > epoch {
            self.violation(
                at,
                format!(
                    "(i) {sub}: a publish fenced by {}'s epoch {epoch} was stored after epoch {last} was confirmed",
                    m(uid)
                ),
            );
        }
    }

    /// A gateway told `uid` it stands at `position` in the line (e).
    pub fn standby(&mut self, at: Duration, sub: &str, uid: MemberUid, position: u32) {
        self.trace
            .at(at, format!("{sub}: {} standby, place {position}", m(uid)));
        let s = self.subs.entry(sub.to_string()).or_default();
        let place = s.kv.line.iter().position(|u| *u == uid);
        let mut found = Vec::new();
        if !s.alive.contains(&uid) {
            found.push(format!(
                "(e) {sub}: standby notice to {}, which is gone",
                m(uid)
            ));
        }
        if s.open.contains_key(&uid) {
            found.push(format!(
                "(e) {sub}: standby notice to {}, which is active",
                m(uid)
            ));
        }
        match place {
            None => found.push(format!(
                "(e) {sub}: standby notice to {}, not in the line [{}]",
                m(uid),
                ms_list(&s.kv.line)
            )),
            // A member of higher priority may have entered ahead of it since.
            Some(now) if position == 0 || ((position as usize) < now && s.kv.prio.is_empty()) => {
                found.push(format!(
                    "(e) {sub}: {} told place {position}, but it stands at {now} in [{}]",
                    m(uid),
                    ms_list(&s.kv.line)
                ));
            }
            Some(_) => {}
        }
        for f in found {
            self.violation(at, f);
        }
    }

    /// A new value of `sub.<sub>` on the backplane.
    /// Check (f): a write by `writer` replaced the active member `earlier` of `sub`.
    pub fn hand_over(
        &mut self,
        at: Duration,
        sub: &str,
        earlier: MemberUid,
        writer: tinybroker::cluster::coordinator::GatewayId,
        took_over: bool,
        lease_live: bool,
    ) {
        let fine = if took_over {
            self.hand_overs.0 += 1;
            writer != earlier.gateway && !lease_live
        } else {
            self.hand_overs.1 += 1;
            writer == earlier.gateway
        };
        if !fine {
            self.violation(
                at,
                format!(
                    "(f) {sub}: g{} replaced active {} with took_over={took_over} (its gateway's lease live: {lease_live})",
                    writer.0,
                    m(earlier)
                ),
            );
        }
    }

    pub fn kv_changed(&mut self, at: Duration, sub: &str, new: SubValue, revision: u64) {
        self.trace.at(
            at,
            format!(
                "{sub}: backplane @{revision} line [{}] active {:?} epoch {}",
                ms_list(&new.line),
                new.active.map(m),
                new.epoch
            ),
        );
        let s = self.subs.entry(sub.to_string()).or_default();
        let old = std::mem::replace(&mut s.kv, new.clone());
        let mut found = Vec::new();
        // A step-down (docs/semantics.md#cluster-priority-and-hand-over): the active member
        // stays in the line, another becomes active. Only once it settled (j).
        let stepped = old
            .active
            .filter(|a| new.line.contains(a) && new.active != Some(*a));
        if let Some(a) = stepped
            && s.yielded.remove(&a).is_none()
        {
            found.push(format!(
                "(j) {sub}: the line moved past {} before it settled its step-down",
                m(a)
            ));
        }
        // The members both lines hold keep their order, but the one that stepped down; a new
        // member enters behind the standbys of its priority or higher, so the newcomers may
        // stand anywhere behind the active member, with the standbys in priority order.
        let kept_new: Vec<MemberUid> = new
            .line
            .iter()
            .copied()
            .filter(|u| old.line.contains(u) && Some(*u) != stepped)
            .collect();
        let kept_old: Vec<MemberUid> = old
            .line
            .iter()
            .copied()
            .filter(|u| new.line.contains(u) && Some(*u) != stepped)
            .collect();
        let prioritised = !new.prio.is_empty() || !old.prio.is_empty() || stepped.is_some();
        let appended_at_back = kept_new.is_empty() || new.line[..kept_new.len()] == kept_new[..];
        if kept_new != kept_old || (!prioritised && !appended_at_back) {
            found.push(format!(
                "(c) {sub}: line reordered from [{}] to [{}]",
                ms_list(&old.line),
                ms_list(&new.line)
            ));
        }
        let standbys: Vec<u32> = new
            .line
            .iter()
            .filter(|u| Some(**u) != new.active)
            .map(|u| new.priority_of(*u))
            .collect();
        for u in &new.line {
            let joined = self.priority.get(&u.member).copied().unwrap_or(0);
            if new.priority_of(*u) != joined {
                found.push(format!(
                    "(c) {sub}: {} stands with priority {} in the line, joined with {joined}",
                    m(*u),
                    new.priority_of(*u)
                ));
            }
        }
        if standbys.windows(2).any(|w| w[0] < w[1]) {
            found.push(format!(
                "(c) {sub}: standbys out of priority order in [{}] ({standbys:?})",
                ms_list(&new.line)
            ));
        }
        if let Some(a) = new.active
            && new.line.first() != Some(&a)
        {
            found.push(format!(
                "(c) {sub}: {} active but the line is [{}]",
                m(a),
                ms_list(&new.line)
            ));
        }
        if new.active.is_some() && new.active != old.active && new.epoch <= old.epoch {
            found.push(format!(
                "(a) {sub}: promotion to epoch {} after epoch {}",
                new.epoch, old.epoch
            ));
        }
        for gone in old.line.iter().filter(|u| !new.line.contains(u)) {
            if s.alive.contains(gone) && self.lapse.get(gone).is_none_or(|ends| at < *ends) {
                found.push(format!(
                    "(c) {sub}: {} removed from the line while its stream is open",
                    m(*gone)
                ));
            }
        }
        if let Some(a) = stepped {
            self.stepped_down.insert(a.member);
        }
        for (i, y) in new.line.iter().enumerate() {
            for x in self.behind.get(&y.member).into_iter().flatten() {
                // A higher priority stands ahead, and a member that handed over went behind.
                if let Some(j) = new.line.iter().position(|u| u.member == *x)
                    && j > i
                    && new.priority_of(*y) <= new.priority_of(new.line[j])
                    && !self.stepped_down.contains(x)
                {
                    found.push(format!(
                        "(h) {sub}: {} stands ahead of m{x}, whose join was answered before it arrived: [{}]",
                        m(*y),
                        ms_list(&new.line)
                    ));
                }
            }
        }
        for f in found {
            self.violation(at, f);
        }
    }

    /// Why the cluster has not converged, or `None` once it has (d).
    pub fn unsettled(&self) -> Option<String> {
        for (sub, s) in &self.subs {
            let line: BTreeSet<MemberUid> = s.kv.line.iter().copied().collect();
            if line != s.alive {
                return Some(format!(
                    "{sub}: line [{}], live members [{}]",
                    ms_list(&s.kv.line),
                    ms_list(&s.alive.iter().copied().collect::<Vec<_>>())
                ));
            }
            if !s.alive.is_empty() {
                let open: Vec<MemberUid> = s.open.keys().copied().collect();
                if open.len() != 1 || s.kv.line.first() != open.first() {
                    return Some(format!(
                        "{sub}: active [{}], line [{}]",
                        ms_list(&open),
                        ms_list(&s.kv.line)
                    ));
                }
            }
        }
        None
    }
}
