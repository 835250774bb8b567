//! The cluster world's model of what a gateway's shell does around its coordinator
//! (`src/cluster/gateway/singleton.rs`, `lease.rs`, `join.rs`): acts checked against the lease
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
            | Ev::Recorded(slot, id, ..) => Some((*slot, *id)),
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
        if !coord.may_act(local) {
            return;
        }
        let lease_ends = coord.lease_valid_until().map(|u| g.true_time(u));
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
}
