//! Cluster mode's inputs to one subscription: a singleton whose active member the cluster's
//! coordinator chooses (docs/semantics.md#cluster-singleton).

use super::*;

impl Subscription {
    /// Cluster mode: hands the choice of this singleton's active member to the caller (the
    /// cluster's coordinator, which keeps the line across gateways). From now on a member
    /// joins on standby, the active member's leaving promotes nobody, and only
    /// [`Subscription::activate`] makes a member active, with the epoch the cluster gave it.
    /// Other modes ignore it.
    pub fn arbitrate(&mut self) {
        self.arbitrated = self.spec.mode == Mode::Singleton;
    }

    /// Whether the active member is chosen outside this core (see [`Subscription::arbitrate`]).
    pub fn is_arbitrated(&self) -> bool {
        self.arbitrated
    }

    /// Cluster mode: `member`, a standby of this arbitrated singleton, stands at `position` in
    /// the cluster's line (1 = next). A standby notice for it when it asked for one
    /// (`notify_standby`) and is still on standby; nothing otherwise.
    pub fn place_in_line(&self, member_id: MemberId, position: u32) -> Vec<Effect> {
        match self.members.get(&member_id) {
            Some(member)
                if self.arbitrated && member.epoch.is_none() && member.options.notify_standby =>
            {
                vec![Effect::Standby {
                    member: member_id,
                    position: position.max(1),
                }]
            }
            _ => Vec::new(),
        }
    }

    /// Makes `member_id` the active member of an arbitrated singleton, with `epoch` (the
    /// cluster's fencing token). It gets the confirmation, then what waits in the queue.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the subscription is not arbitrated, the member is not
    /// here, or another member is active; nothing changes then.
    pub fn activate(
        &mut self,
        member_id: MemberId,
        epoch: Epoch,
        promotion: bool,
    ) -> Result<Vec<Effect>, Error> {
        if !self.arbitrated {
            return Err(Error::InvalidArgument(format!(
                "subscription {:?} chooses its own active member",
                self.id
            )));
        }
        if let Some(active) = self.active_members().find(|&m| m != member_id) {
            return Err(Error::InvalidArgument(format!(
                "subscription {:?} already has active member {active}",
                self.id
            )));
        }
        let Some(member) = self.members.get_mut(&member_id) else {
            return Err(Error::InvalidArgument(format!(
                "subscription {:?} has no member {member_id}",
                self.id
            )));
        };
        if member.epoch.is_some() {
            return Ok(Vec::new());
        }
        member.epoch = Some(epoch);
        self.epoch = self.epoch.max(epoch);
        self.cluster_epoch = self.cluster_epoch.max(epoch);
        self.counters.promotions += u64::from(promotion);
        let mut out = vec![Effect::Confirm {
            member: member_id,
            epoch,
        }];
        self.dispatch(&mut out);
        Ok(out)
    }

    /// Takes every queued (not in-flight) message out, head first, with the attempt its next
    /// delivery would carry: an arbitrated singleton with no active member gives them back
    /// upstream, so that the next active member, on whichever gateway, gets them first.
    pub fn take_queued(&mut self) -> Vec<(Message, u32)> {
        let mut taken = Vec::with_capacity(self.queue.len());
        while let Some((message, attempt, _)) = self.queue.pop_front() {
            self.held_bytes -= message.size() as u64;
            taken.push((message, attempt));
        }
        taken
    }

    /// Cluster mode: the cluster's coordinator asks active member `member_id` of this
    /// arbitrated singleton to step down at a message boundary
    /// (docs/semantics.md#cluster-priority-and-hand-over): it is sent nothing more, and settles
    /// what it holds. Here it never completes by itself: once it holds nothing
    /// ([`Subscription::settled_step_down`]) the gateway gives back what waits here and the
    /// coordinator moves the line, then [`Subscription::stepped_down`] puts it on standby, or
    /// [`Subscription::call_off_step_down`] lets it go on. A step-down of it in progress is the
    /// answer (empty effects).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the subscription is not arbitrated, or `member_id` is
    /// not its active member; nothing changes then.
    pub fn step_down(
        &mut self,
        member_id: MemberId,
        cause: StepDownCause,
    ) -> Result<(StepDown, Vec<Effect>), Error> {
        let active = self
            .members
            .get(&member_id)
            .is_some_and(|m| m.epoch.is_some());
        if !self.arbitrated || !active {
            return Err(Error::InvalidArgument(format!(
                "subscription {:?} has no arbitrated active member {member_id} to step down",
                self.id
            )));
        }
        if let Some(step) = self.stepping_down {
            if step.member == member_id {
                return Ok((step, Vec::new()));
            }
            self.stepping_down = None;
        }
        let mut out = Vec::new();
        let Some(step) = self.begin_step_down(member_id, cause, &mut out) else {
            unreachable!("the member was found above");
        };
        self.dispatch(&mut out);
        Ok((step, out))
    }

    /// The arbitrated step-down in progress once its member holds nothing: the cluster may move
    /// the line.
    pub fn settled_step_down(&self) -> Option<StepDown> {
        let step = self.stepping_down.filter(|_| self.arbitrated)?;
        (self.members.get(&step.member)?.in_flight == 0).then_some(step)
    }

    /// Cluster mode: the coordinator calls off `member_id`'s step-down (no successor is left):
    /// it is sent messages again. Nothing happens when it is not stepping down.
    pub fn call_off_step_down(&mut self, member_id: MemberId) -> Vec<Effect> {
        let mut out = Vec::new();
        if self
            .stepping_down
            .is_none_or(|step| step.member != member_id)
        {
            return out;
        }
        self.stepping_down = None;
        if let Some(member) = self.members.get_mut(&member_id) {
            member.yielding = false;
        }
        self.dispatch(&mut out);
        out
    }

    /// Cluster mode: the cluster's line moved past `member_id` (it stepped down, and its
    /// successor follows at whichever gateway): it goes on standby, told so with the epoch it
    /// held and its place in the cluster's line (1 = next). What it still holds, if anything,
    /// goes back to the queue first. One the cluster never made active here (its activation
    /// was on its way) is told its place as any standby ([`Subscription::place_in_line`]).
    pub fn stepped_down(&mut self, member_id: MemberId, position: u32) -> Vec<Effect> {
        let mut out = Vec::new();
        if !self.arbitrated {
            return out;
        }
        if self
            .members
            .get(&member_id)
            .is_none_or(|m| m.epoch.is_none())
        {
            return self.place_in_line(member_id, position);
        }
        if self
            .stepping_down
            .is_some_and(|step| step.member == member_id)
        {
            self.stepping_down = None;
        }
        let returning = self.take_back(member_id);
        for record in &returning {
            out.push(Effect::Withdraw {
                member: member_id,
                system_id: record.message.system_id(),
            });
        }
        for record in returning.into_iter().rev() {
            self.in_flight_bytes -= record.message.size() as u64;
            self.give_back(record.message, record.attempt, &mut out);
        }
        let Some(member) = self.members.get_mut(&member_id) else {
            return out;
        };
        let epoch = member.epoch.take().unwrap_or(0);
        member.yielding = false;
        member.draining = false;
        self.counters.handovers += 1;
        out.push(Effect::SteppedDown {
            member: member_id,
            epoch,
            position: position.max(1),
        });
        out
    }
}
