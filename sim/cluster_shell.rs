//! The cluster world's model of what a gateway's shell does around its coordinator
//! (`src/cluster/gateway/control/singleton/`, `lease.rs`, `join.rs`): acts checked against the lease
//! gate, frozen hosts, and singleton joins that wait for a lease and are answered once in the
//! line. See the module doc of `cluster.rs`.

use std::time::Duration;

use tinybroker::cluster::coordinator::{GatewayId, MemberUid};

use super::{ACT_EVERY, ClusterWorld, Ev, ns, planted};

impl Ev {
    /// The gateway slot an event is for, when a frozen host must hold it.
    pub(super) fn held_by(&self) -> Option<(usize, GatewayId)> {
        match self {
            Ev::Answer(slot, id, ..)
            | Ev::Timeout(slot, id, _)
            | Ev::Watched(slot, id, _)
            | Ev::Tick(slot, id, _)
            | Ev::Act(slot, id)
            | Ev::Record(slot, id, ..)
            | Ev::Recorded(slot, id, ..)
            | Ev::Slow(slot, id, _)
            | Ev::Yield(slot, id, ..) => Some((*slot, *id)),
            _ => None,
        }
    }
}

impl ClusterWorld {
    /// Every gateway acts now (one [`Ev::Act`] each, held by a frozen one), and again later.
    pub(super) fn pulse(&mut self) {
        for slot in 0..self.gateways.len() {
            if self.gateways[slot].coord.is_some() {
                let id = self.gateways[slot].id;
                self.at(self.now, Ev::Act(slot, id));
            }
        }
        self.publish_fenced();
        self.at(self.now + ns(ACT_EVERY), Ev::Pulse);
    }

    /// A frozen gateway resumes: it takes what waited for it, in order, the clock having
    /// jumped.
    pub(super) fn resume(&mut self, slot: usize, id: GatewayId) {
        if !self.current(slot, id) {
            return;
        }
        let Some(buffer) = self.gateways[slot].frozen.take() else {
            return;
        };
        self.trace(format!(
            "slot {slot}: gateway g{} resumes ({} events waited)",
            id.0,
            buffer.len()
        ));
        let g = &self.gateways[slot];
        let members: Vec<MemberUid> = g.members.keys().map(|m| g.uid(*m)).collect();
        self.checker.thawed(&members);
        for ev in buffer {
            self.handle(ev);
        }
        self.pump(slot);
    }
    /// Makes the first lease create of the gateway in `slot` fail (or not), for a scenario;
    /// call before the world runs.
    pub fn fail_first_lease_create(&mut self, slot: usize, fail: bool) {
        self.gateways[slot].fail_create = fail;
    }

    /// The gateway hands messages to its active members, or acks them, if its lease gate
    /// says so now.
    pub(super) fn act(&mut self, slot: usize) {
        let g = &self.gateways[slot];
        let Some(coord) = g.coord.as_ref() else {
            return;
        };
        let local = g.local(self.now);
        let lease_ends = coord.lease_valid_until().map(|u| g.true_time(u));
        let members: Vec<MemberUid> = g.members.keys().map(|m| g.uid(*m)).collect();
        if !coord.may_act(local) {
            // Lapsed, unrenewed (docs/semantics.md#cluster-lease-lapse): it keeps its members
            // and acts for none; they count, for (b) and (c), only until its lease's end.
            if coord.is_lapsed() {
                let ends = lease_ends.map_or(Duration::ZERO, Duration::from_nanos);
                self.checker.froze(&members, ends);
            }
            return;
        }
        // Acting: renewed (also after a lapse), its members count again, and what a lapse
        // deferred is confirmed.
        self.checker.thawed(&members);
        if !self.gateways[slot].deferred.is_empty() {
            self.activate_deferred(slot);
        }
        let g = &self.gateways[slot];
        let acting: Vec<(String, MemberUid)> = g
            .active
            .iter()
            .map(|(m, sub)| (sub.clone(), g.uid(*m)))
            .collect();
        for (sub, uid) in acting {
            let lease_ends = lease_ends.map(Duration::from_nanos);
            self.checker.acted(self.now(), &sub, uid, lease_ends);
        }
    }

    /// Freezes the gateway in `slot` (SIGSTOP) for `duration`: time passes, what reaches it
    /// waits, then it takes all of it in order.
    pub fn freeze(&mut self, slot: usize, duration: Duration) {
        let g = &mut self.gateways[slot];
        let Some(coord) = g.coord.as_ref() else {
            return;
        };
        if g.frozen.is_some() {
            return;
        }
        // The last instant it may act, in true time: what it holds may be promoted elsewhere
        // from then on, and it must not act for it.
        let lease_ends = coord
            .lease_valid_until()
            .map_or(Duration::ZERO, |u| Duration::from_nanos(g.true_time(u)));
        g.frozen = Some(Vec::new());
        let id = g.id;
        let members: Vec<MemberUid> = g.members.keys().map(|m| g.uid(*m)).collect();
        self.trace(format!(
            "slot {slot}: gateway g{} FROZEN for {duration:?}",
            id.0
        ));
        self.checker.froze(&members, lease_ends);
        self.at(self.now + ns(duration), Ev::Resume(slot, id));
    }

    /// The member ids in `sub`'s line, in order, as the store holds it.
    pub fn line(&self, sub: &str) -> Vec<u64> {
        self.read_sub(&format!("sub.{sub}"))
            .map(|v| v.line.iter().map(|u| u.member).collect())
            .unwrap_or_default()
    }

    /// A singleton join arrives at the gateway in `slot`: admitted at once while its lease is
    /// valid, else when it is (also under its next incarnation); answered once in the line.
    /// Returns the member id.
    pub fn join(&mut self, slot: usize, sub: &str) -> u64 {
        use tinybroker::core::planted::PlantedBug;
        let member = self.next_member;
        self.next_member += 1;
        let now = self.now();
        self.checker.arrives(now, sub, member);
        let g = &mut self.gateways[slot];
        if planted(PlantedBug::JoinWithoutLease) {
            // Answered at once; the coordinator hears of it when there is one (its next
            // incarnation after a pause).
            let uid = g.uid(member);
            self.checker.answered(now, sub, uid);
            if g.coord.is_none() {
                g.waiting.push((member, sub.to_string()));
                return member;
            }
            g.members.insert(member, sub.to_string());
            self.checker.joined(now, sub, uid);
            self.deliver(slot, |c, now| c.member_joined(now, sub, member));
            return member;
        }
        g.waiting.push((member, sub.to_string()));
        if g.frozen.is_none() {
            self.pump(slot);
        }
        member
    }

    /// As [`ClusterWorld::join`], with a priority (docs/semantics.md#priority).
    pub fn join_ranked(&mut self, slot: usize, sub: &str, priority: u32) -> u64 {
        let member = self.next_member;
        if priority > 0 {
            self.priority.insert(member, priority);
        }
        self.checker.ranked(member, priority);
        self.join(slot, sub)
    }

    /// A `HandOver` of `sub` reaches the gateway in `slot` (docs/semantics.md#cluster-priority-and-hand-over):
    /// refused or marked in the line, as its copy of the line says.
    pub fn hand_over(&mut self, slot: usize, sub: &str) {
        if self.gateways[slot].frozen.is_some() {
            return;
        }
        let mut asked = None;
        self.deliver(slot, |c, now| asked = Some(c.hand_over(now, sub)));
        if let Some(Ok((member, epoch))) = asked {
            self.trace(format!(
                "slot {slot}: hand-over of {sub} asked: g{}/m{} epoch {epoch}",
                member.gateway.0, member.member
            ));
        }
    }

    /// The coordinator asks `member` to step down: the local core sends it nothing more, and
    /// it settles what it holds a moment later (as long as a message's ack takes), or at once
    /// when it was not active here yet (its fence record on its way).
    pub(super) fn step_down(&mut self, slot: usize, sub: String, member: u64) {
        let g = &mut self.gateways[slot];
        g.stepping.insert(member);
        let id = g.id;
        if !g.active.contains_key(&member) {
            self.settled(slot, sub, member);
            return;
        }
        let after = ns(Duration::from_millis(self.rng.range(0, 200)));
        self.at(self.now + after, Ev::Yield(slot, id, sub, member));
    }

    /// `member`, stepping down, holds nothing: it acts no more, and the coordinator hears of it.
    pub(super) fn settled(&mut self, slot: usize, sub: String, member: u64) {
        use tinybroker::core::planted::PlantedBug;
        let g = &mut self.gateways[slot];
        if !g.stepping.remove(&member) || !g.members.contains_key(&member) {
            return;
        }
        let uid = g.uid(member);
        if !planted(PlantedBug::StepDownBeforeSettled) {
            // (With the bug, the coordinator moved the line at once and the member acts on.)
            g.active.remove(&member);
            self.checker.yielded(self.now(), &sub, uid);
        }
        self.deliver(slot, |c, now| {
            c.member_yielded(now, &sub, member, Vec::new())
        });
    }

    /// The coordinator calls `member`'s step-down off: it is served again.
    pub(super) fn call_off(&mut self, slot: usize, sub: &str, member: u64) {
        let g = &mut self.gateways[slot];
        g.stepping.remove(&member);
        if !g.members.contains_key(&member) {
            return;
        }
        let uid = g.uid(member);
        if g.coord
            .as_ref()
            .is_some_and(|c| c.line(sub).is_some_and(|v| v.active == Some(uid)))
        {
            g.active.insert(member, sub.to_string());
            self.checker.resumed(self.now(), sub, uid);
        }
    }
}
