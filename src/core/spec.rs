//! What a member asks for when it opens a subscription, and the broker's limits.

use std::{fmt, time::Duration};

use super::topic::{Pattern, Topic};

/// How a subscription hands messages to its members (docs/semantics.md#subscriptions).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mode {
    /// Every stream gets every matching message; one live stream per subscription id.
    Broadcast,
    /// Competing consumers: each message to exactly one member.
    Queue,
    /// One active member, the rest on standby, promoted in join order.
    Singleton,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Broadcast => "BROADCAST",
            Mode::Queue => "QUEUE",
            Mode::Singleton => "SINGLETON",
        })
    }
}

/// Whether members ack what they receive (docs/semantics.md#ack-free).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum AckMode {
    /// At-least-once: a message is done when its holder acks it.
    #[default]
    Explicit,
    /// At-most-once: a message is done once it is written to the member's stream; the shell
    /// settles it as it writes it.
    None,
}

impl fmt::Display for AckMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AckMode::Explicit => "EXPLICIT",
            AckMode::None => "NONE",
        })
    }
}

/// What a full queue does with a new message (docs/semantics.md#overflow-policies).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Overflow {
    /// Refuse the publish; it is queued on no subscription.
    #[default]
    RejectPublish,
    /// Drop the oldest queued (not in-flight) messages, counted, to make room.
    DropOldest,
}

impl fmt::Display for Overflow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Overflow::RejectPublish => "REJECT_PUBLISH",
            Overflow::DropOldest => "DROP_OLDEST",
        })
    }
}

/// The settings every member of one subscription must share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriptionSpec {
    /// Delivery mode.
    pub mode: Mode,
    /// Consumer group; non-empty in group modes, may be empty in broadcast.
    pub consumer_group: String,
    /// Patterns, sorted and without duplicates, so two members listing them in another order agree.
    pub patterns: Vec<Pattern>,
    /// Deliveries after which an unacked message is poisoned; 0 = unlimited.
    pub max_delivery_attempts: u32,
    /// Where poisoned messages go; `None` = drop and count.
    pub dead_letter_topic: Option<Topic>,
    /// Acked or ack-free delivery.
    pub ack_mode: AckMode,
    /// What a full queue does.
    pub overflow: Overflow,
}

impl SubscriptionSpec {
    /// Describes how `asked` differs from this (live) spec, or `None` when a member asking for
    /// `asked` may join. An unset poison policy in `asked` (0 attempts, no topic) inherits the
    /// subscription's.
    pub fn differences(&self, asked: &SubscriptionSpec) -> Option<String> {
        let mut diffs = Vec::new();
        if self.mode != asked.mode {
            diffs.push(format!(
                "mode is {}, request asks {}",
                self.mode, asked.mode
            ));
        }
        if self.consumer_group != asked.consumer_group {
            diffs.push(format!(
                "consumer_group is {:?}, request asks {:?}",
                self.consumer_group, asked.consumer_group
            ));
        }
        if self.patterns != asked.patterns {
            let list = |p: &[Pattern]| p.iter().map(Pattern::as_str).collect::<Vec<_>>().join(", ");
            diffs.push(format!(
                "topic_patterns are [{}], request asks [{}]",
                list(&self.patterns),
                list(&asked.patterns)
            ));
        }
        if self.ack_mode != asked.ack_mode {
            diffs.push(format!(
                "ack_mode is {}, request asks {}",
                self.ack_mode, asked.ack_mode
            ));
        }
        if self.overflow != asked.overflow {
            diffs.push(format!(
                "overflow is {}, request asks {}",
                self.overflow, asked.overflow
            ));
        }
        if asked.max_delivery_attempts != 0
            && asked.max_delivery_attempts != self.max_delivery_attempts
        {
            diffs.push(format!(
                "max_delivery_attempts is {}, request asks {}",
                self.max_delivery_attempts, asked.max_delivery_attempts
            ));
        }
        if asked.dead_letter_topic.is_some() && asked.dead_letter_topic != self.dead_letter_topic {
            diffs.push(format!(
                "dead_letter_topic is {:?}, request asks {:?}",
                self.dead_letter_topic
                    .as_ref()
                    .map(Topic::as_str)
                    .unwrap_or(""),
                asked
                    .dead_letter_topic
                    .as_ref()
                    .map(Topic::as_str)
                    .unwrap_or("")
            ));
        }
        (!diffs.is_empty()).then(|| diffs.join("; "))
    }
}

/// Per-member settings; members of one subscription may differ here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberOptions {
    /// Window: unacked messages this member may hold (at least 1).
    pub max_in_flight: u32,
    /// Singleton only: send a standby notice with the place in line on joining.
    pub notify_standby: bool,
    /// Singleton only: the member's priority (docs/semantics.md#priority). The line is in
    /// priority order, highest first, then join order; a member of higher priority than the
    /// active one takes over at a message boundary. 0 (the default) for every member keeps
    /// plain join order.
    pub priority: u32,
}

impl Default for MemberOptions {
    fn default() -> Self {
        Self {
            max_in_flight: 1,
            notify_standby: false,
            priority: 0,
        }
    }
}

/// A validated request to join a subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenRequest {
    /// The subscription's id.
    pub subscription_id: String,
    /// Settings shared by all members.
    pub spec: SubscriptionSpec,
    /// This member's own settings.
    pub member: MemberOptions,
    /// SINGLETON only: the member's metadata, at most [`MAX_METADATA_BYTES`]
    /// (docs/semantics.md#member-metadata); empty when none.
    pub metadata: std::sync::Arc<str>,
}

/// A validated `Proclaim`: the subscription, the member and epoch it must be active with, the
/// new metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proclamation {
    /// The SINGLETON subscription.
    pub subscription_id: String,
    /// The member that must be active.
    pub member: u64,
    /// The epoch it must be active with.
    pub epoch: u64,
    /// Its new metadata.
    pub metadata: std::sync::Arc<str>,
}

/// The largest member metadata, in bytes (docs/semantics.md#member-metadata).
pub const MAX_METADATA_BYTES: usize = 1024;

/// Every limit that keeps the broker's memory bounded (docs/semantics.md#limits-table).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Largest message (payload + topic + headers), in bytes.
    pub max_message_bytes: usize,
    /// Most messages in one `PublishBatch`.
    pub max_batch_messages: usize,
    /// Most messages one subscription holds (queued + in flight).
    pub max_queue_messages: u64,
    /// Most bytes one subscription holds (queued + in flight).
    pub max_queue_bytes: u64,
    /// Most live subscriptions.
    pub max_subscriptions: usize,
    /// Most members of one subscription.
    pub max_members_per_subscription: usize,
    /// Largest window a member may ask for.
    pub max_in_flight: u32,
    /// Most patterns on one subscription.
    pub max_patterns: usize,
    /// Longest subscription id or consumer group, in bytes.
    pub max_name_bytes: usize,
    /// How long a subscription with no members keeps its queue before it expires.
    pub idle_timeout: Duration,
    /// Broker-wide budget for everything subscriptions hold, as [`footprint`] counts it.
    ///
    /// [`footprint`]: crate::core::Subscription::footprint
    pub max_memory_bytes: u64,
    /// The share of `max_memory_bytes`, in percent (1 to 99), that the messages of drop-oldest
    /// subscriptions (every ack-free one among them) may hold. Theirs never refuse a publish:
    /// when the share is used up they drop their oldest. The rest of the budget is for
    /// everything else, so what drop-oldest subscriptions hold never refuses a publish to a
    /// reject-publish one (docs/semantics.md#memory-budget).
    pub drop_oldest_memory_percent: u8,
    /// Most distinct wildcard shapes (a pattern prefix's length and the positions of its `*`s,
    /// whatever its literal tokens) among all live subscriptions' patterns: what bounds the
    /// nodes a publish's routing walk visits ([`PatternIndex::walk_bound`]: this, plus the
    /// topic's tokens, plus one).
    ///
    /// [`PatternIndex::walk_bound`]: crate::core::PatternIndex::walk_bound
    pub max_wildcard_shapes: usize,
    /// How long a SINGLETON's active member that steps down (a hand-over, or a takeover by a
    /// member of higher priority) has to settle what it holds; past it, what it still holds
    /// goes to its successor as on a failover (docs/semantics.md#hand-over).
    pub handover_timeout: Duration,
}

impl Limits {
    /// The bytes drop-oldest subscriptions' messages may hold: their share of the budget, but
    /// at least one message of `max_message_bytes` (so the largest message a publisher may
    /// send can reach a drop-oldest subscriber) unless that is more than half the budget.
    pub fn drop_oldest_memory_bytes(&self) -> u64 {
        let percent = u64::from(self.drop_oldest_memory_percent.clamp(1, 99));
        // u128: a budget near u64::MAX times 99 would overflow.
        let share = (u128::from(self.max_memory_bytes) * u128::from(percent) / 100) as u64;
        let one = self.max_message_bytes as u64 + super::subscription::MESSAGE_OVERHEAD;
        share.max(one.min(self.max_memory_bytes / 2))
    }

    /// The bytes everything else may hold: subscriptions, members, and the messages of
    /// reject-publish subscriptions.
    pub fn general_memory_bytes(&self) -> u64 {
        self.max_memory_bytes - self.drop_oldest_memory_bytes()
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_message_bytes: 1024 * 1024,
            max_batch_messages: 1000,
            max_queue_messages: 100_000,
            max_queue_bytes: 64 * 1024 * 1024,
            max_subscriptions: 10_000,
            max_members_per_subscription: 1_000,
            max_in_flight: 10_000,
            max_patterns: 64,
            max_name_bytes: 256,
            idle_timeout: Duration::from_secs(300),
            max_memory_bytes: 1 << 30,
            drop_oldest_memory_percent: 25,
            // Real pattern sets have a few to a few hundred (`orders.*.created`, and
            // `users.*.deleted` with it, have two: `x.*` and `x.*.x`); a walk at the limit
            // visits at most 512 + 33 nodes, about 10 µs.
            max_wildcard_shapes: 512,
            handover_timeout: Duration::from_secs(10),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live() -> SubscriptionSpec {
        SubscriptionSpec {
            mode: Mode::Queue,
            consumer_group: "g".into(),
            patterns: vec![Pattern::parse("jobs.>").unwrap()],
            max_delivery_attempts: 3,
            dead_letter_topic: Some(Topic::parse("dead.jobs").unwrap()),
            ack_mode: AckMode::Explicit,
            overflow: Overflow::RejectPublish,
        }
    }

    // docs/semantics.md#joining-rules and docs/semantics.md#ack-free: ack mode and overflow policy are shared settings; a joiner must repeat them.
    #[test]
    fn ack_mode_and_overflow_must_match() {
        let live = live();
        let other = SubscriptionSpec {
            ack_mode: AckMode::None,
            overflow: Overflow::DropOldest,
            ..live.clone()
        };
        assert_eq!(
            live.differences(&other).as_deref(),
            Some(
                "ack_mode is EXPLICIT, request asks NONE; overflow is REJECT_PUBLISH, request asks DROP_OLDEST"
            )
        );
    }

    // docs/semantics.md#joining-rules: a joiner that leaves the poison policy unset inherits the subscription's; one
    // that sets it must match it exactly.
    #[test]
    fn poison_policy_must_match_unless_left_unset() {
        let live = live();
        assert_eq!(live.differences(&live), None);
        let unset = SubscriptionSpec {
            max_delivery_attempts: 0,
            dead_letter_topic: None,
            ..live.clone()
        };
        assert_eq!(live.differences(&unset), None, "unset inherits");
        let other = SubscriptionSpec {
            max_delivery_attempts: 4,
            dead_letter_topic: Some(Topic::parse("dead.other").unwrap()),
            ..live.clone()
        };
        assert_eq!(
            live.differences(&other).as_deref(),
            Some(
                "max_delivery_attempts is 3, request asks 4; \
                 dead_letter_topic is \"dead.jobs\", request asks \"dead.other\""
            )
        );
    }

    #[test]
    fn modes_print_as_their_proto_names() {
        let names: Vec<String> = [Mode::Broadcast, Mode::Queue, Mode::Singleton]
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(names, ["BROADCAST", "QUEUE", "SINGLETON"]);
    }
}
