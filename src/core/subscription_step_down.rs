//! A SINGLETON's active member stepping down at a message boundary: to a member of higher
//! priority (docs/semantics.md#priority) or on request (docs/semantics.md#hand-over). It is sent
//! nothing more; once it holds nothing it goes on standby and its successor is promoted with a
//! higher epoch. Its deadline is the shell's: past it, [`Subscription::step_down_overdue`] gives
//! what it still holds to the successor, as a failover would.

use super::*;

impl Subscription {
    /// The step-down in progress, if any.
    pub fn stepping_down(&self) -> Option<StepDown> {
        self.stepping_down
    }

    /// The place in line of standby `id`: 1 = next.
    pub(super) fn standby_position(&self, id: MemberId) -> u32 {
        let Some(member) = self.members.get(&id) else {
            return 0;
        };
        let active_in_line = usize::from(self.active.is_some_and(|a| a != id));
        let ahead = if self.line.keys().next_back() == Some(&member.place()) {
            // The back of the line (every priority-0 join): no walk.
            self.line.len() - 1 - active_in_line
        } else {
            self.line
                .range(..member.place())
                .filter(|(_, m)| Some(**m) != self.active)
                .count()
        };
        ahead as u32 + 1
    }

    /// Makes standby `id` active with a new epoch.
    pub(super) fn promote(&mut self, id: MemberId, out: &mut Vec<Effect>) {
        let Some(member) = self.members.get_mut(&id) else {
            return;
        };
        self.epoch += 1;
        member.epoch = Some(self.epoch);
        self.active = Some(id);
        self.counters.promotions += 1;
        out.push(Effect::Confirm {
            member: id,
            epoch: self.epoch,
        });
    }

    /// After standby `joined` joined: when it outranks the active member, the active member
    /// steps down (docs/semantics.md#priority).
    pub(super) fn outranks_active(&mut self, joined: MemberId, out: &mut Vec<Effect>) {
        if self.stepping_down.is_some() || self.spec.mode != Mode::Singleton || self.arbitrated {
            return;
        }
        let priority = |id: Option<MemberId>| {
            id.and_then(|id| self.members.get(&id))
                .map(|m| m.options.priority)
        };
        if let (Some(new), Some(active)) = (priority(Some(joined)), priority(self.active))
            && new > active
            && let Some(member) = self.active
        {
            self.begin_step_down(member, StepDownCause::Priority, out);
        }
    }

    pub(super) fn begin_step_down(
        &mut self,
        member_id: MemberId,
        cause: StepDownCause,
        out: &mut Vec<Effect>,
    ) -> Option<StepDown> {
        let member = self.members.get_mut(&member_id)?;
        member.yielding = true;
        self.step_downs += 1;
        let step = StepDown {
            member: member_id,
            seq: self.step_downs,
            cause,
        };
        self.stepping_down = Some(step);
        out.push(Effect::SteppingDown {
            member: member_id,
            seq: step.seq,
            cause,
        });
        Some(step)
    }

    /// Asks the active member to hand over (docs/semantics.md#hand-over): it is sent nothing
    /// more, and once it holds nothing (or the shell's deadline passes,
    /// [`step_down_overdue`](Self::step_down_overdue)) it goes on standby, at the back of its
    /// priority, and the first standby in line, of its priority or higher, is promoted. A
    /// step-down already in progress is the answer to a second request (a takeover by
    /// priority in progress becomes a hand-over).
    ///
    /// # Errors
    /// [`Error::NotSingleton`]; [`Error::HandOverRefused`] with no active member, no standby,
    /// or an active member that outranks every standby (it would take over again at once);
    /// nothing changes then.
    pub fn hand_over(&mut self) -> Result<(StepDown, Vec<Effect>), Error> {
        self.require_singleton()?;
        let refused = |reason: String| Error::HandOverRefused {
            subscription: self.id.to_string(),
            reason,
        };
        if self.arbitrated {
            return Err(refused(
                "the cluster's coordinator chooses this subscription's active member".into(),
            ));
        }
        if let Some(mut step) = self.stepping_down {
            // A takeover by priority in progress becomes the hand-over asked for: any standby
            // of the active member's priority or higher may follow, and the member goes to the
            // back of its priority.
            step.cause = StepDownCause::HandOver;
            self.stepping_down = Some(step);
            return Ok((step, Vec::new()));
        }
        let Some(active) = self.active else {
            return Err(refused("it has no active member".into()));
        };
        if self.successor(active, StepDownCause::HandOver).is_none() {
            let reason = if self.members.len() == 1 {
                format!("active member {active} has no standby to hand over to")
            } else {
                let priority = self.members.get(&active).map_or(0, |m| m.options.priority);
                format!(
                    "active member {active} has priority {priority}, above every standby's: it would take over again at once"
                )
            };
            return Err(refused(reason));
        }
        let mut out = Vec::new();
        let Some(step) = self.begin_step_down(active, StepDownCause::HandOver, &mut out) else {
            unreachable!("an active member was found above");
        };
        self.dispatch(&mut out);
        Ok((step, out))
    }

    /// Who takes over from `active`: in a priority step-down, the first standby in line if it
    /// outranks it; in a hand-over, the first standby in line, of its priority or higher.
    fn successor(&self, active: MemberId, cause: StepDownCause) -> Option<MemberId> {
        let priority = self.members.get(&active)?.options.priority;
        let ((std::cmp::Reverse(first_priority), _), &first) =
            self.line.iter().find(|(_, id)| **id != active)?;
        let takes_over = match cause {
            StepDownCause::Priority => *first_priority > priority,
            StepDownCause::HandOver => *first_priority >= priority,
        };
        takes_over.then_some(first)
    }

    /// While a step-down is in progress, after every input: it is called off when no successor
    /// is left (the member goes on as before), and completes once its member holds nothing.
    pub(super) fn settle_step_down(&mut self, out: &mut Vec<Effect>) {
        let Some(step) = self.stepping_down else {
            return;
        };
        // The cluster's coordinator completes or calls off an arbitrated one
        // (docs/semantics.md#cluster-priority-and-hand-over).
        if self.arbitrated {
            return;
        }
        let Some(member) = self.members.get(&step.member) else {
            self.stepping_down = None;
            return;
        };
        let holds = member.in_flight > 0;
        if self.successor(step.member, step.cause).is_none() {
            if let Some(member) = self.members.get_mut(&step.member) {
                member.yielding = false;
            }
            self.stepping_down = None;
            return;
        }
        if holds && !planted(PlantedBug::TakeOverMidMessage) {
            return;
        }
        self.complete_step_down(step, out);
    }

    /// The member of `step` goes on standby (a hand-over: at the back of its priority) and its
    /// successor is promoted.
    fn complete_step_down(&mut self, step: StepDown, out: &mut Vec<Effect>) {
        let Some(successor) = self.successor(step.member, step.cause) else {
            return;
        };
        let Some(member) = self.members.get_mut(&step.member) else {
            return;
        };
        self.stepping_down = None;
        let epoch = member.epoch.take().unwrap_or(0);
        member.yielding = false;
        // A standby holds nothing: what a release said about it ("send it nothing more") is
        // spent, and it is served again if it is promoted again.
        member.draining = false;
        if step.cause == StepDownCause::HandOver {
            let before = member.place();
            self.last_ticket += 1;
            member.ticket = self.last_ticket;
            let after = member.place();
            self.line.remove(&before);
            self.line.insert(after, step.member);
        }
        self.active = None;
        self.counters.handovers += 1;
        let at = out.len();
        self.promote(successor, out);
        let position = self.standby_position(step.member);
        out.insert(
            at,
            Effect::SteppedDown {
                member: step.member,
                epoch,
                position,
            },
        );
    }

    /// The shell's deadline for step-down `seq` passed: what its member still holds goes back
    /// to the queue for the successor, withdrawn from its stream where not written yet (a
    /// failover's redelivery: the attempt counts), and the step-down completes; or, with no
    /// successor left, it is called off. Nothing happens when `seq` is not in progress.
    pub fn step_down_overdue(&mut self, seq: u64) -> Vec<Effect> {
        let mut out = Vec::new();
        let Some(step) = self.stepping_down.filter(|step| step.seq == seq) else {
            return out;
        };
        // An arbitrated one's successor may be at another gateway: the coordinator knows it.
        if self.arbitrated || self.successor(step.member, step.cause).is_some() {
            let returning = self.take_back(step.member);
            if !returning.is_empty() {
                self.counters.handovers_overdue += 1;
            }
            for record in &returning {
                out.push(Effect::Withdraw {
                    member: step.member,
                    system_id: record.message.system_id(),
                });
            }
            // Back at the head in publish order: the lowest id first (docs/semantics.md#redelivery-order).
            for record in returning.into_iter().rev() {
                self.in_flight_bytes -= record.message.size() as u64;
                self.give_back(record.message, record.attempt, &mut out);
            }
        }
        self.dispatch(&mut out);
        out
    }

    /// Takes every in-flight record of member `id` out, in id order.
    pub(super) fn take_back(&mut self, id: MemberId) -> Vec<InFlight> {
        let Some(member) = self.members.get_mut(&id) else {
            return Vec::new();
        };
        let holds = member.in_flight as usize;
        member.in_flight = 0;
        if self.spec.ack_mode == AckMode::None {
            let mut records = Vec::from(std::mem::take(&mut member.unwritten));
            self.unwritten -= records.len();
            records.sort_unstable_by_key(|r| r.message.system_id());
            return records;
        }
        let ids: Vec<SystemId> = self
            .in_flight
            .iter()
            .filter(|(_, record)| record.member == id)
            .map(|(id, _)| *id)
            .take(holds)
            .collect();
        ids.iter()
            .filter_map(|id| self.in_flight.remove(id))
            .collect()
    }
}
