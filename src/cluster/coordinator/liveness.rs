//! Lease liveness: this gateway's lease (renewed, lapsed, ended) and every other gateway's,
//! taken for dead only past the clock assumption's bound (see the safety argument in the
//! module doc of [`super`]).

use std::time::Duration;

use bytes::Bytes;

use super::{Block, Coordinator, Effect, EndStatus, LeaseView, Op, Pending};
use crate::cluster::backplane::{KvError, Revision};
use crate::cluster::values::{GatewayId, Key};
use crate::core::planted::{PlantedBug, active as planted};

impl Coordinator {
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

    pub(super) fn see_lease(
        &mut self,
        now: Duration,
        g: GatewayId,
        alive: bool,
        revision: Revision,
    ) {
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
        let key = Key::Lease(g);
        if let Some(Block::Conflict(r)) = self.blocks.get(&key)
            && revision > *r
        {
            self.blocks.remove(&key);
        }
    }

    /// A renewal sent at `sent` was confirmed at revision `rev`: the lease is valid until
    /// `sent + lease`, and a lapse it ends is over.
    pub(super) fn renewed(&mut self, now: Duration, rev: Revision, sent: Duration) {
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
    pub(super) fn suspect_since(&mut self, sent: Duration) {
        let since = sent.max(self.last_answer);
        self.suspect = Some(self.suspect.map_or(since, |s| s.min(since)));
    }

    /// A write of this gateway's was answered (a refusal too): the bucket answers again. The
    /// time it answered nothing is not counted in other gateways' silence, up to a bound in
    /// all per observation: a bucket that answers, however slowly, lets a dead gateway be found.
    pub(super) fn answered(&mut self, now: Duration) {
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
    pub(super) fn planted_resume(
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

    pub(super) fn lease_valid(&self, now: Duration) -> bool {
        !self.fenced
            && self.valid_until.is_some_and(|until| {
                now < until || planted(PlantedBug::GatewayActsAfterLeaseExpiry)
            })
    }

    pub(super) fn fence(&mut self) {
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

    pub(super) fn renew(&mut self, now: Duration) {
        if self.renewal.is_some() || now < self.next_renewal {
            return;
        }
        let key = Key::Lease(self.me);
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

    pub(super) fn is_dead(&self, g: GatewayId) -> bool {
        matches!(self.leases.get(&g), Some(LeaseView::Deleted))
    }

    pub(super) fn find_dead(&mut self, now: Duration) {
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
            let key = Key::Lease(g);
            if self.writable(now, &key) {
                self.issue(now, key, Op::Delete(rev), None);
            }
        }
    }
}
