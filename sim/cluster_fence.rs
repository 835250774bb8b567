//! The cluster world's model of fence records and fenced publishes
//! (`src/cluster/gateway/control/fence.rs`, docs/semantics.md#cluster-fenced-publish):
//!
//! - **records**: the gateway holding a member the coordinator makes active writes the record
//!   of its epoch ([`Ev::Record`], taken by the gateway only while its lease is valid, as the
//!   shell asks before every try), which reaches the stream one latency later and raises the
//!   subscription's record there ([`Ev::RecordStored`]: records only rise, as the real write's
//!   expected sequence makes them); one latency after that the gateway hears of it
//!   ([`Ev::Recorded`]) and activates the member only if the line still makes it active with
//!   that epoch under a valid lease. A gateway whose write deleted an emptied line records that
//!   its epoch ended, once the delete's answer reached it.
//! - **a full stream**: in a third of the seeds, a record write that would raise the record is
//!   refused as full half the time (drawn per write); the stream then deletes the record below
//!   it (no record passes a fenced publish), the gateway confirms the member all the same, and
//!   writes again in the background every 50 ms to 1 s while its lease is valid and, for an
//!   activation, while the member is still active there.
//! - **fenced publishes**: every member confirmed active is a client that publishes a fenced
//!   side effect with its epoch about every other pulse, through any gateway, while it leads
//!   and for [`LATE`] after it lost its place (a deposed leader's late side effects, its
//!   gateway frozen or not). Each reaches the stream one latency later ([`Ev::Fenced`]) and is
//!   stored exactly when the subscription's record there is that epoch, active.
//!
//! The checker's (i) holds every stored one to "no member was confirmed with a later epoch
//! before it was stored". Latencies and the publishers' draws come from a stream of their own.

use std::{collections::BTreeMap, time::Duration};

use tinybroker::cluster::coordinator::{GatewayId, MemberUid};

use super::{ClusterWorld, Ev, LEASE, ns, planted};
use crate::rng::Rng;

/// How long a member goes on publishing fenced side effects after it lost its place.
pub(super) const LATE: Duration = Duration::from_millis(2 * LEASE.as_millis() as u64);

/// A record write: the subscription, the record (epoch, ended), the member to confirm once
/// it is stored (an activation), and whether it is a background retry after a full stream
/// (its member already confirmed).
#[derive(Debug, Clone)]
pub(super) struct Write {
    sub: String,
    epoch: u64,
    ended: bool,
    member: Option<u64>,
    background: bool,
}

/// The stream's fence records and the fenced publishers.
pub(super) struct Fences {
    /// Per subscription: its record in the stream, (epoch, ended); none once deleted.
    records: BTreeMap<String, (u64, bool)>,
    /// Members confirmed active that publish fenced side effects: their subscription, epoch,
    /// and since when they no longer lead (true time), once they do not.
    publishers: BTreeMap<MemberUid, (String, u64, Option<u64>)>,
    rng: Rng,
    /// Whether this seed's stream is full at times (record writes refused half the time).
    fills: bool,
    /// Fenced publishes stored and refused, and record writes a full stream refused.
    counts: (u64, u64, u64),
}

impl Fences {
    pub(super) fn new(seed: u64) -> Self {
        let mut rng = Rng::new(seed ^ 0xfe4c_e5ee);
        let fills = rng.range(0, 2) == 0;
        Self {
            records: BTreeMap::new(),
            publishers: BTreeMap::new(),
            rng,
            fills,
            counts: (0, 0, 0),
        }
    }

    fn latency(&mut self) -> u64 {
        ns(Duration::from_micros(self.rng.range(500, 15_000)))
    }
}

impl ClusterWorld {
    /// Fenced publishes the stream took: (stored, refused, record writes refused as full).
    pub fn fenced(&self) -> (u64, u64, u64) {
        self.fences.counts
    }

    /// The coordinator made `member` of the gateway in `slot` active with `epoch`: its record
    /// first, the activation once the gateway hears it was stored.
    pub(super) fn activation(
        &mut self,
        slot: usize,
        id: GatewayId,
        sub: String,
        member: u64,
        epoch: u64,
    ) {
        use tinybroker::core::planted::PlantedBug;
        let write = Write {
            sub,
            epoch,
            ended: false,
            member: Some(member),
            background: false,
        };
        if planted(PlantedBug::ActivateBeforeFenceRecord) {
            // Confirmed at once, its record written after: a deposed leader's fenced publish
            // can be stored after the successor was confirmed.
            self.activate(slot, &write.sub, member, epoch);
            let lat = self.fences.latency();
            let write = Write {
                background: true,
                ..write
            };
            self.at(self.now + lat, Ev::Record(slot, id, write));
            return;
        }
        let lat = self.fences.latency();
        self.at(self.now + lat, Ev::Record(slot, id, write));
    }

    /// Confirms `member` active with `epoch`.
    /// The activations deferred by a lapse, now that the lease is valid again: each confirmed if
    /// its member still is the line's active member with that epoch.
    pub(super) fn activate_deferred(&mut self, slot: usize) {
        let deferred = std::mem::take(&mut self.gateways[slot].deferred);
        for (sub, member, epoch) in deferred {
            let g = &self.gateways[slot];
            let still = g
                .coord
                .as_ref()
                .is_some_and(|c| c.still_active(&sub, member, epoch));
            if still && g.members.contains_key(&member) {
                self.activate(slot, &sub, member, epoch);
            }
        }
    }

    fn activate(&mut self, slot: usize, sub: &str, member: u64, epoch: u64) {
        let g = &mut self.gateways[slot];
        let uid = g.uid(member);
        g.active.insert(member, sub.to_string());
        self.checker.activated(self.now(), sub, uid, epoch);
        self.fences
            .publishers
            .insert(uid, (sub.to_string(), epoch, None));
    }

    /// A gateway's write deleted `sub`'s emptied line (its answer arrives now + `after`): the
    /// gateway records that `epoch` ended.
    pub(super) fn line_emptied(
        &mut self,
        slot: usize,
        id: GatewayId,
        sub: &str,
        epoch: u64,
        after: u64,
    ) {
        let write = Write {
            sub: sub.to_string(),
            epoch,
            ended: true,
            member: None,
            background: false,
        };
        self.at(self.now + after, Ev::Record(slot, id, write));
    }

    /// Whether the gateway in `slot` may still write `write`: its lease is valid now and, for
    /// an activation's, its member was not ended or gone since.
    fn may_write(&self, slot: usize, write: &Write) -> bool {
        let g = &self.gateways[slot];
        let Some(coord) = g.coord.as_ref() else {
            return false;
        };
        let live = match write.member {
            Some(member) if write.background => g.active.get(&member) == Some(&write.sub),
            Some(member) => g.members.get(&member) == Some(&write.sub),
            None => true,
        };
        live && coord.may_act(g.local(self.now))
    }

    /// Whether the gateway in `slot` waits to write `write`: its lease is lapsed (not ended)
    /// and its member is still there. The shell waits for the renewal, then writes.
    fn waits_to_write(&self, slot: usize, write: &Write) -> bool {
        let g = &self.gateways[slot];
        let Some(coord) = g.coord.as_ref() else {
            return false;
        };
        let live = match write.member {
            Some(member) => g.members.get(&member) == Some(&write.sub),
            None => true,
        };
        live && !write.background && !coord.is_fenced() && !coord.may_act(g.local(self.now))
    }

    /// The gateway in `slot` sends a record write, if it still may.
    pub(super) fn send_record(&mut self, slot: usize, id: GatewayId, write: Write) {
        if !self.may_write(slot, &write) {
            // Lapsed: tried again once renewed (the shell waits for it). The shell gives up a
            // record once its lease ended for good or its member is gone, and a background
            // retry (a full stream) once its lease is not valid.
            if self.waits_to_write(slot, &write) {
                self.at(
                    self.now + ns(Duration::from_millis(50)),
                    Ev::Record(slot, id, write),
                );
            }
            return;
        }
        let lat = self.fences.latency();
        self.at(self.now + lat, Ev::RecordStored(slot, id, write));
    }

    /// A record write reaches the stream: it raises the subscription's record (or finds one
    /// at or above it), or a full stream refuses it and deletes the record below it; the
    /// writer hears of it one latency later.
    pub(super) fn record_stored(&mut self, slot: usize, id: GatewayId, write: Write) {
        let wanted = (write.epoch, write.ended);
        let current = self.fences.records.get(&write.sub).copied();
        let full = current.is_none_or(|c| wanted > c)
            && self.fences.fills
            && self.fences.rng.range(0, 1) == 0;
        if full {
            self.fences.counts.2 += 1;
            if self.fences.records.remove(&write.sub).is_some() {
                self.trace(format!("fence record of {}: deleted (full)", write.sub));
            }
        } else if current.is_none_or(|c| wanted > c) {
            self.fences.records.insert(write.sub.clone(), wanted);
            self.trace(format!(
                "fence record of {}: {} {}",
                write.sub,
                if write.ended { "ended" } else { "active" },
                write.epoch
            ));
        }
        let lat = self.fences.latency();
        self.at(self.now + lat, Ev::Recorded(slot, id, write, full));
    }

    /// The gateway hears what became of its write. An activation's member is confirmed if the
    /// line still makes it active with that epoch and its lease is valid; after a full stream,
    /// the write goes on in the background.
    pub(super) fn recorded(&mut self, slot: usize, id: GatewayId, write: Write, full: bool) {
        if !self.current(slot, id) {
            return;
        }
        if let Some(member) = write.member
            && !write.background
        {
            let g = &self.gateways[slot];
            let Some(coord) = g.coord.as_ref() else {
                return;
            };
            // As the shell: still the line's active member with that epoch, not stepped down.
            let still = coord.still_active(&write.sub, member, write.epoch);
            let here = still && g.members.contains_key(&member);
            if here && coord.may_act(g.local(self.now)) {
                self.activate(slot, &write.sub, member, write.epoch);
            } else if here && !coord.is_fenced() {
                // Confirmed once the lease is renewed, if it still is the active member then.
                self.gateways[slot]
                    .deferred
                    .push((write.sub.clone(), member, write.epoch));
            }
        }
        if full {
            let after = ns(Duration::from_millis(self.fences.rng.range(50, 1_000)));
            let write = Write {
                background: true,
                ..write
            };
            self.at(self.now + after, Ev::Record(slot, id, write));
        }
    }

    /// Each pulse: the fenced publishers send (about every other pulse each), and those that
    /// lost their place longer than [`LATE`] ago stop.
    pub(super) fn publish_fenced(&mut self) {
        let now = self.now;
        let leading: Vec<MemberUid> = self
            .gateways
            .iter()
            .filter(|g| g.coord.is_some())
            .flat_map(|g| g.active.keys().map(|m| g.uid(*m)))
            .collect();
        let mut sends = Vec::new();
        self.fences.publishers.retain(|uid, (sub, epoch, lost)| {
            if lost.is_none() && !leading.contains(uid) {
                *lost = Some(now);
            }
            if lost.is_some_and(|at| now > at + ns(LATE)) {
                return false;
            }
            sends.push((sub.clone(), *uid, *epoch));
            true
        });
        for (sub, uid, epoch) in sends {
            if self.fences.rng.range(0, 1) == 0 {
                let lat = self.fences.latency();
                self.at(now + lat, Ev::Fenced(sub, uid, epoch));
            }
        }
    }

    /// A fenced publish reaches the stream: stored exactly when the record is its epoch, active.
    pub(super) fn fenced_arrives(&mut self, sub: &str, uid: MemberUid, epoch: u64) {
        let stored = self.fences.records.get(sub) == Some(&(epoch, false));
        if stored {
            self.fences.counts.0 += 1;
        } else {
            self.fences.counts.1 += 1;
        }
        self.checker.fenced(self.now(), sub, uid, epoch, stored);
    }
}
