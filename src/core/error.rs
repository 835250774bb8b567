//! Every outcome the broker refuses, as data, with its [`ErrorKind`]. The service maps each kind
//! to a gRPC status in exactly one place (`service::status`); cluster mode's gateways carry the
//! kind of a forwarded settle's answer between them.

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
    /// A subscription cannot be deleted while members are joined (docs/semantics.md#deleting).
    #[error(
        "subscription {subscription:?} has {members} member(s) joined{where_}: every member must leave (close its stream) before it can be deleted; nothing changed"
    )]
    MembersJoined {
        /// The subscription named.
        subscription: String,
        /// How many members are joined (in cluster mode, at every gateway together).
        members: u64,
        /// Where they are, when it helps (cluster mode: " across the cluster's gateways").
        where_: &'static str,
    },
    /// No subscription has this id.
    #[error("subscription {0:?} not found")]
    SubscriptionNotFound(String),
    /// Leadership is watched on a subscription of another mode than SINGLETON.
    #[error(
        "subscription {subscription:?} is {mode}: only a SINGLETON subscription has an active member to watch, proclaim, fence a publish with or hand over"
    )]
    NotSingleton {
        /// The subscription named.
        subscription: String,
        /// Its mode.
        mode: crate::core::Mode,
    },
    /// `Proclaim` names a member the subscription does not have (it left, or never joined).
    #[error(
        "member {member} is not a member of subscription {subscription:?} (it left, or never joined it): nothing changed"
    )]
    MemberNotFound {
        /// The subscription named.
        subscription: String,
        /// The member named.
        member: u64,
    },
    /// `Proclaim` from a member that is not active with the epoch it names: on standby, or
    /// deposed since (docs/semantics.md#member-metadata).
    #[error(
        "member {member} of subscription {subscription:?} is not the active member with epoch {epoch} (it is {}; the subscription's epoch is {current}): nothing changed",
        if *active { "active with another epoch" } else { "on standby" }
    )]
    NotActive {
        /// The subscription named.
        subscription: String,
        /// The member named.
        member: u64,
        /// The epoch named.
        epoch: u64,
        /// The subscription's epoch now.
        current: u64,
        /// Whether the member is active (with another epoch).
        active: bool,
    },
    /// A fenced publish names an epoch that is not its subscription's active epoch as it is
    /// stored: its leader was deposed, or has not been promoted (docs/semantics.md#fenced-publish).
    #[error(
        "publish fenced by epoch {epoch} of subscription {subscription:?} refused: {}; nothing was stored",
        if *active { format!("the active epoch is {current}") } else { format!("it has no active member (its last epoch is {current})") }
    )]
    Fenced {
        /// The fencing subscription.
        subscription: String,
        /// The epoch the publish named.
        epoch: u64,
        /// The subscription's epoch now (its active member's, when `active`).
        current: u64,
        /// Whether a member is active (with `current`).
        active: bool,
    },
    /// A hand-over cannot happen (docs/semantics.md#hand-over): no member is active, no standby
    /// could take over, or it did not happen (the standbys left meanwhile).
    #[error("hand-over of subscription {subscription:?} refused: {reason}; nothing changed")]
    HandOverRefused {
        /// The subscription named.
        subscription: String,
        /// Why, in words.
        reason: String,
    },
    /// A watched subscription expired (no member within its idle timeout) or was deleted.
    #[error(
        "subscription {0:?} expired or was deleted: there is no leadership left to watch; watch again once a member joins it"
    )]
    SubscriptionGone(String),
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
        "the broker's memory budget is used up ({used} of the {max} bytes of max_memory_bytes not set aside for drop-oldest queues accounted, this needs {needed} more); ack or drain queues, or raise --max-memory-bytes"
    )]
    MemoryBudget {
        /// Bytes accounted now.
        used: u64,
        /// What the refused request would add.
        needed: u64,
        /// The limit: `max_memory_bytes` less the drop-oldest share.
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
    /// Cluster mode: this gateway cannot serve the request now (it lost its lease, the cluster
    /// removed the member, JetStream did not answer); the client retries or rejoins, at any
    /// gateway.
    #[error("{0}")]
    Unavailable(String),
    /// Cluster mode: the JetStream stream holding every topic reached one of its limits (with
    /// discard new), so it refuses new messages.
    #[error(
        "JetStream stream {stream} is full: its {limit} limit is reached ({detail}); ack or drain subscriptions' backlogs, or raise the limit"
    )]
    StreamFull {
        /// The stream's name.
        stream: String,
        /// Which limit, as the operator sets it.
        limit: &'static str,
        /// JetStream's own words.
        detail: String,
    },
    /// Cluster mode: an ack or nack that names no member, for a message not in flight at this
    /// gateway: never delivered, already acked, waiting for redelivery, or held by a member on
    /// another gateway (such a settle is fenced by the connection, and a gateway does not see
    /// the others' members). `NOT_FOUND`, as the embedded broker's [`Error::NotInFlight`].
    #[error(
        "message {system_id} is not in flight on subscription {subscription:?} at this gateway (never delivered, already acked, or waiting for redelivery; in cluster mode an ack or nack without member_id is fenced by the connection and works only at the gateway holding the member's stream: to ack from elsewhere, pass the member_id from the confirmation frame)"
    )]
    NotHeldHere {
        /// The subscription named.
        subscription: String,
        /// The message named.
        system_id: u64,
    },
    /// Cluster mode: an ack or nack names a member no gateway holds any more (it left, was
    /// deposed, or its gateway is gone).
    #[error(
        "member {member} of subscription {subscription:?} is not connected to any gateway ({reason}): this ack or nack is stale and changed nothing"
    )]
    MemberGone {
        /// The subscription named.
        subscription: String,
        /// The member named.
        member: u64,
        /// Why it is gone, as far as this gateway can tell.
        reason: String,
    },
    /// Cluster mode: a refusal whose words come from the cluster (a JetStream consumer that
    /// does not fit the request, the answer of the gateway holding a member, a batch's
    /// refusal with what JetStream stored after it), with its kind.
    #[error("{message}")]
    Cluster {
        /// What kind of refusal it is.
        kind: ErrorKind,
        /// What happened.
        message: String,
    },
}

/// What kind of refusal an [`Error`] is: the gRPC status a client gets for it, numbered as gRPC
/// numbers its codes (cluster mode's gateways carry the number in a forwarded settle's
/// answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum ErrorKind {
    /// The failure has no better kind (an answer from another gateway with a code this one
    /// does not know).
    Unknown = 2,
    /// The request is malformed; sent again unchanged, it fails again.
    InvalidArgument = 3,
    /// What it names does not exist (or is not in flight).
    NotFound = 5,
    /// What it would create exists already.
    AlreadyExists = 6,
    /// A limit is reached; it may succeed later.
    ResourceExhausted = 8,
    /// The state does not allow it (another member holds the message, other settings).
    FailedPrecondition = 9,
    /// This deployment does not offer it (docs/semantics.md says why).
    Unimplemented = 12,
    /// A broken invariant inside the deployment (an unreadable answer between gateways).
    Internal = 13,
    /// Not now; retrying (elsewhere, or later) may succeed.
    Unavailable = 14,
}

impl ErrorKind {
    /// The kind numbered `code` (gRPC's numbering); [`ErrorKind::Unknown`] for any other number.
    pub fn from_code(code: i32) -> Self {
        match code {
            3 => Self::InvalidArgument,
            5 => Self::NotFound,
            6 => Self::AlreadyExists,
            8 => Self::ResourceExhausted,
            9 => Self::FailedPrecondition,
            12 => Self::Unimplemented,
            13 => Self::Internal,
            14 => Self::Unavailable,
            _ => Self::Unknown,
        }
    }

    /// Its number in gRPC's numbering.
    pub fn code(self) -> i32 {
        self as i32
    }
}

impl Error {
    /// What kind of refusal this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidTopic { .. }
            | Error::InvalidPattern { .. }
            | Error::InvalidArgument(_)
            | Error::SettleTooLarge { .. } => ErrorKind::InvalidArgument,
            Error::SettingsMismatch { .. }
            | Error::NotHolder { .. }
            | Error::StaleConnection { .. }
            | Error::NotYetSent { .. }
            | Error::AckFree(_)
            | Error::MemberGone { .. }
            | Error::NotSingleton { .. }
            | Error::NotActive { .. }
            | Error::Fenced { .. }
            | Error::HandOverRefused { .. }
            | Error::MembersJoined { .. } => ErrorKind::FailedPrecondition,
            Error::BroadcastTaken(_) => ErrorKind::AlreadyExists,
            Error::SubscriptionNotFound(_)
            | Error::SubscriptionGone(_)
            | Error::MemberNotFound { .. }
            | Error::NotInFlight { .. }
            | Error::NotHeldHere { .. } => ErrorKind::NotFound,
            Error::QueueFull { .. }
            | Error::MessageTooLarge { .. }
            | Error::MemoryBudget { .. }
            | Error::BatchTooLarge { .. }
            | Error::TooManySubscriptions { .. }
            | Error::TooManyWildcardShapes { .. }
            | Error::TooManyMembers { .. }
            | Error::StreamFull { .. } => ErrorKind::ResourceExhausted,
            Error::ShuttingDown | Error::Unavailable(_) => ErrorKind::Unavailable,
            Error::Cluster { kind, .. } => *kind,
        }
    }

    /// Cluster mode: a refusal of kind `kind` in the cluster's words.
    pub fn cluster(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error::Cluster {
            kind,
            message: message.into(),
        }
    }
}
