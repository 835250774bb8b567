//! Every outcome the broker refuses, as data. The transport maps each variant to a gRPC status in
//! exactly one place (`service::status`).

/// Why the broker refused a request. A refused request changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A topic failed validation.
    #[error("invalid topic {topic:?}: {reason}")]
    InvalidTopic {
        /// The topic as given (truncated).
        topic: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A pattern failed validation.
    #[error("invalid topic pattern {pattern:?}: {reason}")]
    InvalidPattern {
        /// The pattern as given (truncated).
        pattern: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Some other field of a request is missing or malformed.
    #[error("{0}")]
    InvalidArgument(String),
    /// A member asked to join a live subscription with different settings.
    #[error("subscription {subscription:?} exists with different settings: {differences}")]
    SettingsMismatch {
        /// The subscription joined.
        subscription: String,
        /// What differs, e.g. `mode is QUEUE, request asks SINGLETON`.
        differences: String,
    },
    /// A broadcast subscription id already names a live stream.
    #[error(
        "broadcast subscription {0:?} already has a live stream; each broadcast stream needs its own subscription_id"
    )]
    BroadcastTaken(String),
    /// No subscription has this id.
    #[error("subscription {0:?} not found")]
    SubscriptionNotFound(String),
    /// Ack or nack for a message that is not in flight on the subscription.
    #[error(
        "message {system_id} is not in flight on subscription {subscription:?} (never delivered, already acked, or waiting for redelivery)"
    )]
    NotInFlight {
        /// The subscription named.
        subscription: String,
        /// The message named.
        system_id: u64,
    },
    /// Fenced ack or nack from a member that no longer holds the message.
    #[error(
        "message {system_id} on subscription {subscription:?} is held by member {holder}, not member {member}: this member's copy was redelivered, so its ack/nack is stale and changed nothing"
    )]
    NotHolder {
        /// The subscription named.
        subscription: String,
        /// The message named.
        system_id: u64,
        /// The member that sent the ack.
        member: u64,
        /// The member that holds the message now.
        holder: u64,
    },
    /// An ack or nack that named no member arrived on another connection than the holder's
    /// stream: it comes from a member whose stream ended (its copy was redelivered).
    #[error(
        "message {system_id} on subscription {subscription:?} is held by a member whose stream runs on another connection: this ack/nack is stale (its sender's stream ended and the message was redelivered) and changed nothing; pass member_id to ack from another channel"
    )]
    StaleConnection {
        /// The subscription named.
        subscription: String,
        /// The message named.
        system_id: u64,
    },
    /// Ack or nack for a message whose frame the member's stream has not written yet.
    #[error(
        "message {system_id} on subscription {subscription:?} has not been sent to member {member} yet; ack or nack only messages you received"
    )]
    NotYetSent {
        /// The subscription named.
        subscription: String,
        /// The message named.
        system_id: u64,
        /// The member it waits for.
        member: u64,
    },
    /// Ack or nack on an ack-free subscription.
    #[error(
        "subscription {0:?} is ack-free (ACK_MODE_NONE): its messages are done once written and take no ack or nack"
    )]
    AckFree(String),
    /// A subscription's queue limit would be exceeded.
    #[error(
        "subscription {subscription:?} is full: {limit} limit of {max} reached; ack messages or raise the limit"
    )]
    QueueFull {
        /// The full subscription.
        subscription: String,
        /// Which limit: `max_queue_messages` or `max_queue_bytes`.
        limit: &'static str,
        /// The limit's value.
        max: u64,
    },
    /// The broker-wide memory budget would be exceeded.
    #[error(
        "the broker's memory budget is used up ({used} of max_memory_bytes {max} accounted, this needs {needed} more); ack or drain queues, or raise --max-memory-bytes"
    )]
    MemoryBudget {
        /// Bytes accounted now.
        used: u64,
        /// What the refused request would add.
        needed: u64,
        /// The limit.
        max: u64,
    },
    /// A message is larger than the broker accepts.
    #[error("message is {size} bytes, over the max_message_bytes limit of {max}")]
    MessageTooLarge {
        /// Payload plus topic plus headers, in bytes.
        size: usize,
        /// The limit.
        max: usize,
    },
    /// A batch has more messages than the broker accepts in one call.
    #[error("batch has {count} messages, over the max_batch_messages limit of {max}")]
    BatchTooLarge {
        /// Messages in the batch.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// The broker holds as many subscriptions as it may.
    #[error("the broker already holds {max} subscriptions (max_subscriptions)")]
    TooManySubscriptions {
        /// The limit.
        max: usize,
    },
    /// A new subscription's patterns would take the routing index past its limit of distinct
    /// wildcard shapes, which bounds every publish's routing walk.
    #[error(
        "these topic_patterns would bring the broker's distinct wildcard shapes (a pattern prefix's token count and the positions of its `*`s) to {shapes}, over the max_wildcard_shapes limit of {max}; place `*` in fewer distinct ways, or raise --max-wildcard-shapes"
    )]
    TooManyWildcardShapes {
        /// What the count would be with the subscription's patterns.
        shapes: usize,
        /// The limit.
        max: usize,
    },
    /// The subscription has as many members as it may.
    #[error(
        "subscription {subscription:?} already has {max} members (max_members_per_subscription)"
    )]
    TooManyMembers {
        /// The subscription joined.
        subscription: String,
        /// The limit.
        max: usize,
    },
    /// A `Settle` names more ids than its member can hold in flight: it cannot be valid, so it
    /// is refused whole without looking at any id.
    #[error(
        "a Settle names {ids} ids but this member's window (max_in_flight) is {window}, so it can hold at most that many unacked messages; nothing in it was applied"
    )]
    SettleTooLarge {
        /// Acks plus nacks in the Settle.
        ids: usize,
        /// The member's window.
        window: u32,
    },
    /// The broker is shutting down and takes no new work.
    #[error("the broker is shutting down")]
    ShuttingDown,
    /// Cluster mode: this gateway cannot serve the request now (it lost its lease, or the
    /// cluster removed the member); the client retries or rejoins, at any gateway.
    #[error("{0}")]
    Unavailable(String),
}
