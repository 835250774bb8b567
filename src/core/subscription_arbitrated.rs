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
}
