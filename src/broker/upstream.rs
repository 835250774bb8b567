//! Entry points for a broker fed from upstream instead of by its own publishes: cluster mode's
//! gateway (`crate::cluster::stream`) keeps this broker for its local members' streams, windows
//! and fences, and injects the messages JetStream delivers into one subscription at a time,
//! named by JetStream's stream sequence so that every gateway names a message the same way.

use std::sync::atomic::AtomicBool;

use super::{Broker, Input};
use crate::core::{Error, MemberId, Message};

impl Broker {
    /// Queues `message` (its `system_id` chosen upstream) on the subscription `subscription_id`
    /// alone, its next delivery carrying `attempt`. Nothing is routed by topic and no id is
    /// taken from this broker's counter. `live` is the feeder's claim on the subscription: when
    /// the subscription it fed expired (and `live` was cleared under its lock), the message is
    /// refused as `SubscriptionNotFound`, even if a new subscription of the same name exists.
    ///
    /// # Errors
    /// [`Error::SubscriptionNotFound`], [`Error::QueueFull`] or [`Error::MemoryBudget`] (then
    /// nothing changes), or [`Error::ShuttingDown`].
    pub fn inject(
        &self,
        subscription_id: &str,
        message: Message,
        attempt: u32,
        live: &AtomicBool,
    ) -> Result<(), Error> {
        self.check_running()?;
        self.with_subscription(subscription_id, |state, dead| {
            // Read under the subscription's lock, where expiry clears it: a feeder whose
            // subscription expired finds it cleared even if a new one of the same name exists.
            if !live.load(std::sync::atomic::Ordering::Acquire) {
                return Err(Error::SubscriptionNotFound(subscription_id.to_string()));
            }
            let size = message.size();
            let share = size as u64 + crate::core::subscription::MESSAGE_OVERHEAD;
            self.reserve_memory(share)?;
            if let Err(error) = state.core.check_publish(size) {
                self.release_memory(share);
                return Err(error);
            }
            state.accounted += share;
            let system_id = message.system_id();
            let effects = state.core.enqueue_attempt(message, attempt);
            self.apply(state, Input::Enqueue { system_id }, effects, dead);
            Ok(())
        })
    }

    /// How many more messages `subscription_id`'s active members could take now (free window
    /// space less what is queued), or `None` when this broker has no such subscription.
    pub fn room(&self, subscription_id: &str) -> Option<u64> {
        self.with_subscription(subscription_id, |state, _| Ok(state.core.room()))
            .ok()
    }

    /// Whether `member` is a live member of `subscription_id` here.
    pub fn has_member(&self, subscription_id: &str, member: MemberId) -> bool {
        self.with_subscription(subscription_id, |state, _| {
            Ok(state.core.window(member).is_some())
        })
        .unwrap_or(false)
    }
}
