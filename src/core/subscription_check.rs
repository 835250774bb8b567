//! One subscription's invariants, checked from outside the inputs: for tests, simulations and
//! fuzzing (docs/semantics.md#singleton-invariants).

use super::*;

impl Subscription {
    /// Checks docs/semantics.md#singleton-invariants (1 and 4) and the internal bookkeeping; for tests, simulations
    /// and fuzzing.
    ///
    /// # Errors
    /// A description of the first broken invariant.
    pub fn check_invariants(&self) -> Result<(), String> {
        let active: Vec<_> = self.active_members().collect();
        if self.spec.mode == Mode::Singleton {
            if active.len() > 1 {
                return Err(format!("{} active members: {active:?}", active.len()));
            }
            // Arbitrated: the cluster's line decides who is active and when, so neither "one
            // whenever there are members" nor "the earliest-joined here" holds locally.
            if !self.arbitrated && !self.members.is_empty() && active.len() != 1 {
                return Err("members but no active member".into());
            }
            // The active member is the first in line (priority, then join order), except
            // while it steps down to a successor (docs/semantics.md#hand-over).
            if let (Some(first), Some(active)) = (self.line.values().next(), active.first())
                && !self.arbitrated
            {
                match self.stepping_down {
                    Some(step) if step.member != *active => {
                        return Err(format!(
                            "member {} steps down but member {active} is active",
                            step.member
                        ));
                    }
                    None if first != active => {
                        return Err(format!(
                            "active member {active} is not the first in line, {first}"
                        ));
                    }
                    _ => {}
                }
                if self.active != Some(*active) {
                    return Err(format!(
                        "member {active} is active but the core names {:?}",
                        self.active
                    ));
                }
            }
            // In flight to the active member only: a member on standby holds nothing
            // (docs/semantics.md#priority, a takeover only at a message boundary).
            if let Some((id, _)) = self
                .members
                .iter()
                .find(|(_, m)| m.epoch.is_none() && m.in_flight > 0)
            {
                return Err(format!("member {id}, on standby, holds in-flight messages"));
            }
        } else if active.len() != self.members.len() {
            return Err("a non-singleton member is not active".into());
        }
        // docs/semantics.md#redelivery-order singleton order, as a state property: the queue is in id (publish) order
        // and everything in flight comes before it, so each delivery is the lowest id waiting.
        // A member that released (docs/semantics.md#releases) or steps down
        // (docs/semantics.md#hand-over) is sent nothing more: what it still holds may come
        // after what it gave back, and goes back in order when it leaves or its hand-over is
        // overdue.
        if self.spec.mode == Mode::Singleton {
            let ids: Vec<SystemId> = self
                .in_flight_ids()
                .filter(|(_, holder)| {
                    self.members
                        .get(holder)
                        .is_some_and(|m| !m.draining && !m.yielding)
                })
                .map(|(id, _)| id)
                .chain(self.queued_ids())
                .collect();
            if let Some(pair) = ids.windows(2).find(|pair| pair[0] >= pair[1]) {
                return Err(format!(
                    "singleton order: #{} waits in the queue behind #{}",
                    pair[1], pair[0]
                ));
            }
        }
        let ack_free = self.spec.ack_mode == AckMode::None;
        if ack_free && !self.in_flight.is_empty() {
            return Err("an ack-free subscription keeps records in the in-flight map".into());
        }
        if let Some((id, _)) = self
            .members
            .iter()
            .find(|(_, m)| !ack_free && !m.unwritten.is_empty())
        {
            return Err(format!(
                "member {id} of an acked subscription holds unwritten messages"
            ));
        }
        let unwritten = self.unwritten_records().count();
        if unwritten != self.unwritten {
            return Err(format!(
                "{} unwritten messages counted, members hold {unwritten}",
                self.unwritten
            ));
        }
        let mut held: BTreeMap<MemberId, u32> = BTreeMap::new();
        for (system_id, holder) in self.in_flight_ids() {
            if !self.members.contains_key(&holder) {
                return Err(format!(
                    "#{system_id} is in flight to member {holder}, which is gone"
                ));
            }
            *held.entry(holder).or_default() += 1;
        }
        if let Some((id, _)) = self
            .members
            .iter()
            .find(|(id, m)| m.unwritten.iter().any(|r| r.member != **id))
        {
            return Err(format!("member {id} holds a record naming another member"));
        }
        for (id, member) in &self.members {
            let holds = held.get(id).copied().unwrap_or(0);
            if member.in_flight != holds {
                return Err(format!(
                    "member {id} counts {} in flight but holds {holds}",
                    member.in_flight
                ));
            }
            if member.in_flight > member.options.max_in_flight {
                return Err(format!("member {id} is over its window"));
            }
        }
        if self
            .queue
            .iter()
            .any(|(m, _)| self.record(m.system_id()).is_some())
        {
            return Err("a message is both queued and in flight".into());
        }
        let bytes: u64 = self
            .queue
            .iter()
            .map(|(m, _)| m)
            .chain(self.in_flight_records().map(|f| &f.message))
            .map(|m| m.size() as u64)
            .sum();
        if bytes != self.held_bytes {
            return Err(format!(
                "held_bytes {} but messages add up to {bytes}",
                self.held_bytes
            ));
        }
        let in_flight_bytes: u64 = self
            .in_flight_records()
            .map(|f| f.message.size() as u64)
            .sum();
        if in_flight_bytes != self.in_flight_bytes {
            return Err(format!(
                "in_flight_bytes {} but in-flight messages add up to {in_flight_bytes}",
                self.in_flight_bytes
            ));
        }
        if self.line.len() != self.members.len()
            || self
                .line
                .iter()
                .any(|(place, id)| self.members.get(id).map(Member::place) != Some(*place))
        {
            return Err("the line does not match the members".into());
        }
        Ok(())
    }
}
