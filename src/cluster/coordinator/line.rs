//! Line reconciliation: each subscription's value as the watch shows it, made to hold exactly
//! this gateway's members (joins appended, leaves removed, dead gateways' members removed), with
//! the next member promoted in the same write (see "Promotion" in the module doc of [`super`]).

use std::time::Duration;

use super::{
    Block, Carry, Coordinator, Effect, EndStatus, LeaseView, MAX_CARRY, MAX_LINE_BYTES,
    MAX_LINE_METADATA, Op, encode,
};
use crate::cluster::backplane::Revision;
use crate::cluster::values::{Key, MemberUid, StepDownCause, SubValue, standby_place};
use crate::core::planted::{PlantedBug, active as planted};

impl Coordinator {
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

    /// Keeps what this gateway gave back for `subscription`, to ride with the promotion that
    /// follows ([`SubValue::carry`]).
    pub(super) fn give_carry(&mut self, subscription: &str, mut carry: Vec<(u64, u32)>) {
        if carry.is_empty() {
            return;
        }
        // A value stays small: past this, attempts are JetStream's count (README).
        carry.truncate(MAX_CARRY);
        let active = self.subs.get(subscription).and_then(|(v, _)| v.active);
        // Only the promotion that follows this gateway's active member may carry it: once the
        // line shows no member of this gateway's active (others promoted past it, as after a
        // pause past its lease), what it gave back comes with JetStream's count, and a carry
        // riding with a later promotion would name an attempt below one already seen.
        if active.is_none_or(|active| active.gateway != self.id()) {
            return;
        }
        self.carry
            .insert(subscription.to_string(), Carry { carry, active });
    }

    /// The epoch of a promotion that replaces the value at `replaced`: above every epoch made
    /// before, by any gateway, and above the time the last gateway to raise the floor started
    /// (docs/semantics.md#cluster-restart-identity). Made only once the watch delivered
    /// `replaced`, so every floor written before it has been seen: for two promotions P1 then
    /// P2, P2 replaces a revision above P1's write, itself above the floor P1 used, and P2's
    /// floor is at least P1's, so its epoch is higher.
    pub(super) fn epoch_after(&self, replaced: Revision) -> u64 {
        let (at, offset) = self.floor;
        if at == 0 {
            replaced
        } else {
            replaced.max(at).saturating_add(offset)
        }
    }

    pub(super) fn revision_of(&self, key: &Key) -> Revision {
        match key {
            Key::Line(sub) => self.subs.get(sub).map_or(0, |(_, r)| *r),
            Key::Lease(g) => match self.leases.get(g) {
                Some(LeaseView::Alive { revision, .. }) => *revision,
                _ => 0,
            },
            Key::Ids => 0,
        }
    }

    pub(super) fn see_sub(&mut self, sub: &str, v: SubValue, revision: Revision) {
        let newer = self.subs.get(sub).is_none_or(|(_, r)| revision > *r);
        // A carry is spent once the line shows it with another active member than the one
        // active when it was given: the promotion it rode with, whether this gateway learned
        // of it by the write's answer or by the watch (a write answered "unavailable" may have
        // landed), and also when a newer value came first. One written beside a standby's
        // leave, the active member unchanged, still rides with the promotion that follows.
        // A newer value with another active member spends it too, whatever it carries:
        // another gateway promoted past this one's member without it.
        if let Some(given) = self.carry.get(sub)
            && given.active != v.active
            && (given.carry == v.carry || newer)
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
            let key = Key::Line(sub.to_string());
            if let Some(Block::Conflict(r)) = self.blocks.get(&key)
                && revision > *r
            {
                self.blocks.remove(&key);
            }
        }
    }

    /// The subscription's key was deleted at `revision` (its line emptied).
    pub(super) fn forget_sub(&mut self, sub: &str, revision: Revision) {
        if self.subs.get(sub).is_some_and(|(_, r)| revision <= *r) {
            return;
        }
        self.subs.remove(sub);
        self.carry.remove(sub);
        self.asked.remove(sub);
        let key = Key::Line(sub.to_string());
        if let Some(Block::Conflict(r)) = self.blocks.get(&key)
            && revision > *r
        {
            self.blocks.remove(&key);
        }
    }

    pub(super) fn local_effects(&mut self, now: Duration) {
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

    pub(super) fn reconcile(&mut self, now: Duration, sub: &str) {
        let key = Key::Line(sub.to_string());
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
            crate::cluster::values::step_past(&mut line, stepping, cause, prio_of);
        }
        let (active, epoch) = match kept_active {
            Some(a) if yielded.is_none() => (Some(a), current.epoch),
            _ => match line.first() {
                // A promotion waits for the watch to deliver the value it replaces (this
                // gateway's own write may be known from its answer first): its epoch needs
                // every floor written before it.
                Some(_) if !self.has_seen(revision) => return,
                // Planted: the newest of the line, not the first.
                Some(first) => match planted(PlantedBug::PromoteNewestStandby) {
                    true => (line.last().copied(), self.epoch_after(revision)),
                    false => (Some(*first), self.epoch_after(revision)),
                },
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

    /// Leaves out of `next` the members this gateway would add to the line (not in `before`),
    /// newest first, while its value encodes to more than [`MAX_LINE_BYTES`]; each is
    /// forgotten and ended ([`EndStatus::LineFull`]). Members already in the line stay.
    pub(super) fn trim_to_fit(&mut self, sub: &str, next: &mut SubValue, before: &[MemberUid]) {
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
