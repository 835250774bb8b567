//! The coordinator's part in priorities and hand-overs
//! (docs/semantics.md#cluster-priority-and-hand-over): a `HandOver` asked at this gateway, a
//! local member's settled step-down, and the write that moves the line past it. The line's
//! order and who must step down are [`SubValue`]'s ([`SubValue::step_down_cause`]).

use std::time::Duration;

use super::{Coordinator, MemberUid, StepDownCause, SubValue};

impl Coordinator {
    /// Local member `member`, stepping down ([`Effect::StepDown`]), holds nothing, and what
    /// this gateway held went back (`carry`, as for [`Coordinator::member_left_carrying`]):
    /// the line moves to its successor, and [`Effect::SteppedDown`] follows once it did.
    pub fn member_yielded(
        &mut self,
        now: Duration,
        subscription: &str,
        member: u64,
        carry: Vec<(u64, u32)>,
    ) {
        let Some(local) = self
            .local
            .get_mut(subscription)
            .and_then(|members| members.iter_mut().find(|m| m.id == member))
        else {
            return;
        };
        if local.stepping.is_none() {
            return;
        }
        local.yielded = true;
        self.give_carry(subscription, carry);
        self.step(now);
    }

    /// A `HandOver` of `subscription` asked at this gateway
    /// (docs/semantics.md#cluster-priority-and-hand-over): the line will ask its active member
    /// to step down. Returns the active member and the epoch the hand-over ends.
    ///
    /// # Errors
    /// Why it is refused, as this gateway's copy of the line says: no active member, no
    /// standby, or only standbys of lower priority.
    pub fn hand_over(
        &mut self,
        now: Duration,
        subscription: &str,
    ) -> Result<(MemberUid, u64), String> {
        let Some((v, _)) = self.subs.get(subscription) else {
            return Err("it has no active member".into());
        };
        let Some(active) = v.active else {
            return Err("it has no active member".into());
        };
        if v.successor(StepDownCause::HandOver).is_none() {
            return Err(if v.line.len() <= 1 {
                format!(
                    "active member {} has no standby to hand over to",
                    active.member
                )
            } else {
                format!(
                    "active member {} has priority {}, above every standby's: it would take over again at once",
                    active.member,
                    v.priority_of(active)
                )
            });
        }
        let epoch = v.epoch;
        if v.hand_over != epoch {
            self.asked.insert(subscription.to_string(), epoch);
            self.step(now);
        }
        Ok((active, epoch))
    }

    /// Whether local member `member` may be made active with `epoch` now: the line names it
    /// active with that epoch and it has not stepped down meanwhile (an activation waits for
    /// its fence record).
    pub fn still_active(&self, sub: &str, member: u64, epoch: u64) -> bool {
        let me = MemberUid {
            gateway: self.me,
            member,
        };
        self.line(sub)
            .is_some_and(|v| v.active == Some(me) && v.epoch == epoch)
            && self
                .local
                .get(sub)
                .and_then(|ms| ms.iter().find(|m| m.id == member))
                .is_some_and(|m| !m.yielded)
    }

    /// The local active member `kept_active` of `sub` that settled its step-down, and why it
    /// stepped down, when a standby can still take over in `line` (the line this write makes
    /// of `current`): the line then moves past it.
    pub(super) fn yielded_in(
        &self,
        sub: &str,
        current: &SubValue,
        line: &[MemberUid],
        kept_active: Option<MemberUid>,
        prio_of: &impl Fn(MemberUid) -> u32,
    ) -> Option<(MemberUid, StepDownCause)> {
        let a = kept_active.filter(|a| a.gateway == self.me)?;
        let cause = self
            .local
            .get(sub)?
            .iter()
            .find(|m| m.id == a.member && m.yielded)?
            .stepping?;
        let view = SubValue {
            line: line.to_vec(),
            active: Some(a),
            epoch: current.epoch,
            hand_over: current.hand_over,
            prio: line
                .iter()
                .map(|&u| (u, prio_of(u)))
                .filter(|(_, p)| *p > 0)
                .collect(),
            ..SubValue::default()
        };
        view.successor(cause).map(|_| (a, cause))
    }

    /// The `HandOver` of `subscription`'s `epoch` asked here was answered refused (this
    /// gateway's copy of the line showed no standby that could take over): it is not marked in
    /// the line any more, also when a standby joins later.
    pub fn withdraw_hand_over(&mut self, subscription: &str, epoch: u64) {
        if self.asked.get(subscription) == Some(&epoch) {
            self.asked.remove(subscription);
        }
    }
}
