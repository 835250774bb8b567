//! What a member asks for when it joins: the fields of `OpenSubscription`, with constructors per
//! delivery mode.

use super::{AckMode, Mode, Overflow};
use crate::pb;

/// What to join: the fields of `OpenSubscription`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubscriptionOptions {
    /// Names the logical subscription; streams with the same id share its queue.
    pub subscription_id: String,
    /// Delivery mode.
    pub mode: Mode,
    /// Required in queue and singleton mode; every member gives the same one.
    pub consumer_group: String,
    /// NATS-style patterns: `*` one token, `>` one or more trailing tokens.
    pub patterns: Vec<String>,
    /// This member's window; 0 is the broker's default (1, or 256 when ack-free).
    pub max_in_flight: u32,
    /// Dead-letter (or drop) a message delivered this many times; 0 = unlimited.
    pub max_delivery_attempts: u32,
    /// Where poisoned messages go; `None` drops and counts them.
    pub dead_letter_topic: Option<String>,
    /// Singleton only: be told when on standby, and the place in line.
    pub notify_standby: bool,
    /// Acked (default) or ack-free delivery.
    pub ack_mode: AckMode,
    /// What a full queue does to a new message; `None` is the broker's default for the ack mode.
    pub overflow: Option<Overflow>,
    /// Singleton only: what watchers of the leadership see while this member leads (for
    /// example its address), at most 1024 bytes; empty for none.
    pub metadata: String,
    /// Singleton only: this member's priority (docs/semantics.md#priority); 0, the default,
    /// for every member keeps join order.
    pub priority: u32,
}

impl SubscriptionOptions {
    fn new(
        id: impl Into<String>,
        mode: Mode,
        group: impl Into<String>,
        patterns: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        Self {
            subscription_id: id.into(),
            mode,
            consumer_group: group.into(),
            patterns: patterns.into_iter().map(Into::into).collect(),
            max_in_flight: 0,
            max_delivery_attempts: 0,
            dead_letter_topic: None,
            notify_standby: false,
            ack_mode: AckMode::Explicit,
            overflow: None,
            metadata: String::new(),
            priority: 0,
        }
    }

    /// Every stream gets every matching message.
    pub fn broadcast(
        id: impl Into<String>,
        patterns: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        Self::new(id, Mode::Broadcast, "", patterns)
    }

    /// Competing consumers in `group`.
    pub fn queue(
        id: impl Into<String>,
        group: impl Into<String>,
        patterns: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        Self::new(id, Mode::Queue, group, patterns)
    }

    /// One active member in `group`, the others on standby.
    pub fn singleton(
        id: impl Into<String>,
        group: impl Into<String>,
        patterns: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        Self::new(id, Mode::Singleton, group, patterns)
    }

    /// Sets the window.
    #[must_use]
    pub fn max_in_flight(mut self, window: u32) -> Self {
        self.max_in_flight = window;
        self
    }

    /// Sets the poison-message bound.
    #[must_use]
    pub fn max_delivery_attempts(mut self, attempts: u32) -> Self {
        self.max_delivery_attempts = attempts;
        self
    }

    /// Sets the dead-letter topic.
    #[must_use]
    pub fn dead_letter_topic(mut self, topic: impl Into<String>) -> Self {
        self.dead_letter_topic = Some(topic.into());
        self
    }

    /// Asks for standby notices (singleton only).
    #[must_use]
    pub fn notify_standby(mut self, notify: bool) -> Self {
        self.notify_standby = notify;
        self
    }

    /// Sets the ack mode; with [`AckMode::None`] deliveries need no ack.
    #[must_use]
    pub fn ack_mode(mut self, mode: AckMode) -> Self {
        self.ack_mode = mode;
        self
    }

    /// Sets this member's metadata (singleton only; docs/semantics.md#member-metadata).
    #[must_use]
    pub fn metadata(mut self, metadata: impl Into<String>) -> Self {
        self.metadata = metadata.into();
        self
    }

    /// Sets this member's priority (singleton only; docs/semantics.md#priority): it takes over
    /// from an active member of lower priority once that one has settled what it holds.
    #[must_use]
    pub fn priority(mut self, priority: u32) -> Self {
        self.priority = priority;
        self
    }

    /// Sets the overflow policy.
    #[must_use]
    pub fn overflow(mut self, overflow: Overflow) -> Self {
        self.overflow = Some(overflow);
        self
    }

    pub(super) fn to_pb(&self) -> pb::OpenSubscription {
        pb::OpenSubscription {
            subscription_id: self.subscription_id.clone(),
            topic_patterns: self.patterns.clone(),
            mode: match self.mode {
                Mode::Broadcast => pb::DeliveryMode::Broadcast,
                Mode::Queue => pb::DeliveryMode::Queue,
                Mode::Singleton => pb::DeliveryMode::Singleton,
            }
            .into(),
            consumer_group: self.consumer_group.clone(),
            max_in_flight: self.max_in_flight,
            max_delivery_attempts: self.max_delivery_attempts,
            dead_letter_topic: self.dead_letter_topic.clone().unwrap_or_default(),
            notify_standby: self.notify_standby,
            ack_mode: match self.ack_mode {
                AckMode::Explicit => pb::AckMode::Explicit,
                AckMode::None => pb::AckMode::None,
            }
            .into(),
            overflow: match self.overflow {
                None => pb::OverflowPolicy::Unspecified,
                Some(Overflow::RejectPublish) => pb::OverflowPolicy::RejectPublish,
                Some(Overflow::DropOldest) => pb::OverflowPolicy::DropOldest,
            }
            .into(),
            metadata: self.metadata.clone(),
            priority: self.priority,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_map_onto_open_subscription() {
        let open = SubscriptionOptions::singleton("s", "g", ["a.>"])
            .max_in_flight(4)
            .max_delivery_attempts(3)
            .dead_letter_topic("dead.s")
            .notify_standby(true)
            .ack_mode(AckMode::None)
            .overflow(Overflow::DropOldest)
            .to_pb();
        assert_eq!(open.mode, pb::DeliveryMode::Singleton as i32);
        assert_eq!((open.max_in_flight, open.max_delivery_attempts), (4, 3));
        assert_eq!(open.dead_letter_topic, "dead.s");
        assert!(open.notify_standby);
        assert_eq!(open.ack_mode, pb::AckMode::None as i32);
        assert_eq!(open.overflow, pb::OverflowPolicy::DropOldest as i32);
        let default = SubscriptionOptions::broadcast("b", ["x"]).to_pb();
        assert_eq!(
            (
                default.ack_mode,
                default.overflow,
                default.dead_letter_topic.as_str()
            ),
            (
                pb::AckMode::Explicit as i32,
                pb::OverflowPolicy::Unspecified as i32,
                ""
            )
        );
    }
}
