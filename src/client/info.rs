//! Inspection: what [`Client::describe`] and [`Client::list`] answer, as client types (the mode
//! and policies as enums, absent values as `None`) rather than the generated ones.

use std::time::Duration;

use tonic::Code;

use super::{AckMode, Client, Error, Mode, Overflow, Result};
pub use crate::core::Counters;
use crate::pb;

/// One member of a subscription as the broker describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberInfo {
    /// The member.
    pub member_id: u64,
    /// Whether it is active.
    pub active: bool,
    /// Its epoch, 0 while on standby.
    pub epoch: u64,
    /// Messages it holds.
    pub in_flight: u32,
    /// Its window.
    pub max_in_flight: u32,
    /// Place in line, 0 = first: priority order, highest first, then join order.
    pub position: u32,
    /// What it declared on joining or last proclaimed, empty if nothing (SINGLETON only;
    /// docs/semantics.md#member-metadata).
    pub metadata: String,
    /// Its priority (SINGLETON only; docs/semantics.md#priority).
    pub priority: u32,
}

/// One subscription as the broker describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubscriptionInfo {
    /// Its id.
    pub subscription_id: String,
    /// Delivery mode.
    pub mode: Mode,
    /// Consumer group; empty in broadcast mode.
    pub consumer_group: String,
    /// Topic patterns.
    pub patterns: Vec<String>,
    /// Members in promotion order: the first in line (highest priority, then earliest joined) first.
    pub members: Vec<MemberInfo>,
    /// The active member in singleton mode; `None` in the other modes, or with no member.
    pub active_member_id: Option<u64>,
    /// The active member's metadata in singleton mode; empty with none active or none declared.
    pub active_metadata: String,
    /// Singleton: the active member while it steps down (a hand-over, or a member of higher
    /// priority joined; docs/semantics.md#hand-over).
    pub stepping_down_member_id: Option<u64>,
    /// Highest epoch handed out on this subscription.
    pub epoch: u64,
    /// Messages waiting in the queue.
    pub queued_messages: u64,
    /// Their bytes.
    pub queued_bytes: u64,
    /// Messages delivered and not yet settled.
    pub in_flight: u64,
    /// Monotonic counters: acked, nacked, redelivered, drops by reason, …
    pub counters: Counters,
    /// Poison-message bound; 0 = unlimited.
    pub max_delivery_attempts: u32,
    /// Where poisoned messages go; `None` drops and counts them.
    pub dead_letter_topic: Option<String>,
    /// Acked or ack-free.
    pub ack_mode: AckMode,
    /// What a full queue does to a new message.
    pub overflow: Overflow,
    /// Set when the subscription has no members: the time left before it expires.
    pub expires_in: Option<Duration>,
    /// Cluster mode: what JetStream holds for the subscription (every other field is the
    /// answering gateway's own); `None` from an embedded broker.
    pub upstream: Option<UpstreamBacklog>,
}

/// A subscription's JetStream consumer, in cluster mode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpstreamBacklog {
    /// The consumer's name.
    pub consumer: String,
    /// Stored messages no gateway has taken yet.
    pub pending: u64,
    /// Taken by gateways and not acked yet.
    pub unacked: u64,
    /// Of those, the ones delivered more than once.
    pub redelivered: u64,
}

/// Broker-wide counters, from [`Client::list`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BrokerCounters {
    /// Messages published.
    pub published: u64,
    /// Published messages that matched no subscription.
    pub unrouted: u64,
    /// Publishes refused (a queue was full).
    pub rejected_publishes: u64,
    /// Subscriptions expired after their idle time.
    pub subscriptions_expired: u64,
    /// Messages still queued when their subscription expired.
    pub messages_expired: u64,
    /// Subscriptions removed by [`Client::delete_subscription`] (at this gateway, in cluster
    /// mode).
    pub subscriptions_deleted: u64,
    /// Messages they held, discarded with them.
    pub messages_deleted: u64,
    /// Cluster mode: acks JetStream did not confirm (their messages may come again).
    pub unconfirmed_acks: u64,
    /// Live subscriptions.
    pub subscriptions: u64,
    /// Members across them.
    pub members: u64,
    /// Connections open now.
    pub connections_open: u64,
    /// Connections closed at once because the connection limit was reached.
    pub connections_refused: u64,
    /// Connections closed because no HTTP/2 preface came in time.
    pub handshake_timeouts: u64,
    /// Requests refused because unfinished request bodies held the pending-bytes budget.
    pub requests_over_budget: u64,
    /// Requests whose body did not arrive in time.
    pub request_timeouts: u64,
    /// Bytes accounted against the memory budget.
    pub memory_accounted_bytes: u64,
    /// The memory budget.
    pub max_memory_bytes: u64,
}

/// Every subscription and the broker's counters, from [`Client::list`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listing {
    /// In subscription id order.
    pub subscriptions: Vec<SubscriptionInfo>,
    /// Broker-wide counters.
    pub broker: BrokerCounters,
    /// Where the broker keeps what it confirms; `None` from a broker that does not say.
    pub storage: Option<Storage>,
}

/// Where a broker keeps what it confirms, and so what a confirmed publish survives
/// (docs/cluster.md#durability), from [`Client::list`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Storage {
    /// `memory` (the embedded broker's process memory) or `jetstream` (a gateway's stream).
    pub kind: String,
    /// JetStream: the stream, its storage (`file` or `memory`), replicas and consumer limit
    /// (0: the servers' default).
    pub stream: String,
    pub stream_storage: String,
    pub replicas: u32,
    pub max_consumers: i32,
}

impl From<pb::Storage> for Storage {
    fn from(storage: pb::Storage) -> Self {
        Self {
            kind: storage.kind,
            stream: storage.stream,
            stream_storage: storage.stream_storage,
            replicas: storage.replicas,
            max_consumers: storage.max_consumers,
        }
    }
}

/// A value newer than this client: refused rather than guessed, so nothing reads a mode or a
/// policy the broker did not mean.
fn unknown(what: &str, value: i32) -> Error {
    Error::Other {
        code: Code::Unimplemented,
        message: format!(
            "the broker sent {what} {value}, which this client does not know (a newer broker?)"
        ),
    }
}

impl TryFrom<pb::SubscriptionInfo> for SubscriptionInfo {
    type Error = Error;

    fn try_from(info: pb::SubscriptionInfo) -> Result<Self> {
        let mode = match pb::DeliveryMode::try_from(info.mode) {
            Ok(pb::DeliveryMode::Broadcast) => Mode::Broadcast,
            Ok(pb::DeliveryMode::Queue) => Mode::Queue,
            Ok(pb::DeliveryMode::Singleton) => Mode::Singleton,
            _ => return Err(unknown("delivery mode", info.mode)),
        };
        let ack_mode = match pb::AckMode::try_from(info.ack_mode) {
            Ok(pb::AckMode::Explicit) => AckMode::Explicit,
            Ok(pb::AckMode::None) => AckMode::None,
            _ => return Err(unknown("ack mode", info.ack_mode)),
        };
        let overflow = match pb::OverflowPolicy::try_from(info.overflow) {
            Ok(pb::OverflowPolicy::RejectPublish) => Overflow::RejectPublish,
            Ok(pb::OverflowPolicy::DropOldest) => Overflow::DropOldest,
            _ => return Err(unknown("overflow policy", info.overflow)),
        };
        let mut members: Vec<MemberInfo> = info
            .members
            .into_iter()
            .map(|m| MemberInfo {
                member_id: m.member_id,
                active: m.active,
                epoch: m.epoch,
                in_flight: m.in_flight,
                max_in_flight: m.max_in_flight,
                position: m.position,
                metadata: m.metadata,
                priority: m.priority,
            })
            .collect();
        members.sort_by_key(|m| m.position);
        let c = info.counters.unwrap_or_default();
        Ok(Self {
            subscription_id: info.subscription_id,
            mode,
            consumer_group: info.consumer_group,
            patterns: info.topic_patterns,
            members,
            active_member_id: (info.active_member_id != 0).then_some(info.active_member_id),
            active_metadata: info.active_metadata,
            stepping_down_member_id: (info.stepping_down_member_id != 0)
                .then_some(info.stepping_down_member_id),
            epoch: info.epoch,
            queued_messages: info.queued_messages,
            queued_bytes: info.queued_bytes,
            in_flight: info.in_flight,
            counters: Counters {
                enqueued: c.enqueued,
                delivered: c.delivered,
                redelivered: c.redelivered,
                acked: c.acked,
                nacked: c.nacked,
                released: c.released,
                dead_lettered: c.dead_lettered,
                dropped_max_attempts: c.dropped_max_attempts,
                rejected_full: c.rejected_full,
                dropped_full: c.dropped_full,
                promotions: c.promotions,
                stale_acks: c.stale_acks,
                dropped_overflow: c.dropped_overflow,
                handovers: c.handovers,
                handovers_overdue: c.handovers_overdue,
            },
            max_delivery_attempts: info.max_delivery_attempts,
            dead_letter_topic: (!info.dead_letter_topic.is_empty())
                .then_some(info.dead_letter_topic),
            ack_mode,
            overflow,
            expires_in: info.expires_in_ms.map(Duration::from_millis),
            upstream: info.upstream.map(|u| UpstreamBacklog {
                consumer: u.consumer,
                pending: u.pending,
                unacked: u.unacked,
                redelivered: u.redelivered,
            }),
        })
    }
}

impl From<pb::BrokerCounters> for BrokerCounters {
    fn from(b: pb::BrokerCounters) -> Self {
        Self {
            published: b.published,
            unrouted: b.unrouted,
            rejected_publishes: b.rejected_publishes,
            subscriptions_expired: b.subscriptions_expired,
            messages_expired: b.messages_expired,
            subscriptions_deleted: b.subscriptions_deleted,
            messages_deleted: b.messages_deleted,
            unconfirmed_acks: b.unconfirmed_acks,
            subscriptions: b.subscriptions,
            members: b.members,
            connections_open: b.connections_open,
            connections_refused: b.connections_refused,
            handshake_timeouts: b.handshake_timeouts,
            requests_over_budget: b.requests_over_budget,
            request_timeouts: b.request_timeouts,
            memory_accounted_bytes: b.memory_accounted_bytes,
            max_memory_bytes: b.max_memory_bytes,
        }
    }
}

impl Client {
    /// Describes one subscription: members, who is active, epoch, depths, counters.
    ///
    /// # Errors
    /// [`Error::NotFound`] for an unknown subscription; [`Error::Other`] with
    /// `Code::Unimplemented` for a mode or policy this client does not know.
    pub async fn describe(&self, subscription_id: &str) -> Result<SubscriptionInfo> {
        let reply = self
            .raw
            .clone()
            .describe_subscription(pb::DescribeSubscriptionRequest {
                subscription_id: subscription_id.into(),
            })
            .await?;
        reply.into_inner().try_into()
    }

    /// Deletes a subscription no member is joined to: its settings and the messages it holds
    /// are gone, so its id can be joined again with other settings
    /// (docs/semantics.md#deleting). Returns how many messages were discarded with it.
    ///
    /// # Errors
    /// [`Error::FailedPrecondition`] while a member is joined (at any gateway, in cluster
    /// mode; nothing changes), [`Error::NotFound`] for an unknown subscription,
    /// [`Error::InvalidArgument`] for a malformed id, [`Error::Unavailable`] when a gateway
    /// could not ask the whole cluster.
    pub async fn delete_subscription(&self, subscription_id: &str) -> Result<u64> {
        let reply = self
            .raw
            .clone()
            .delete_subscription(pb::DeleteSubscriptionRequest {
                subscription_id: subscription_id.into(),
            })
            .await?;
        Ok(reply.into_inner().discarded_messages)
    }

    /// Lists every subscription (following `ListSubscriptions` page by page) plus the
    /// broker-wide counters.
    ///
    /// # Errors
    /// [`Error::Unavailable`] or [`Error::Transport`] when the broker cannot be reached; as
    /// [`Client::describe`] for a value this client does not know.
    pub async fn list(&self) -> Result<Listing> {
        let mut all = Listing::default();
        let mut broker = None;
        let mut page_token = String::new();
        loop {
            let reply = self
                .raw
                .clone()
                .list_subscriptions(pb::ListSubscriptionsRequest {
                    page_size: 0,
                    page_token,
                })
                .await?
                .into_inner();
            for info in reply.subscriptions {
                all.subscriptions.push(info.try_into()?);
            }
            broker = broker.or(reply.broker);
            if all.storage.is_none() {
                all.storage = reply.storage.map(Into::into);
            }
            if reply.next_page_token.is_empty() {
                all.broker = broker.map(Into::into).unwrap_or_default();
                return Ok(all);
            }
            page_token = reply.next_page_token;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The generated type's integers become enums and options; an unknown value is refused
    // rather than read as some default.
    #[test]
    fn subscription_info_maps_enums_and_absent_values() {
        let raw = pb::SubscriptionInfo {
            subscription_id: "s".into(),
            mode: pb::DeliveryMode::Singleton.into(),
            consumer_group: "g".into(),
            topic_patterns: vec!["a.>".into()],
            members: vec![
                pb::MemberInfo {
                    member_id: 9,
                    position: 1,
                    ..Default::default()
                },
                pb::MemberInfo {
                    member_id: 7,
                    active: true,
                    epoch: 3,
                    position: 0,
                    metadata: "host-a".into(),
                    ..Default::default()
                },
            ],
            active_member_id: 7,
            active_metadata: "host-a".into(),
            epoch: 3,
            counters: Some(pb::SubscriptionCounters {
                acked: 5,
                dropped_overflow: 2,
                ..Default::default()
            }),
            ack_mode: pb::AckMode::None.into(),
            overflow: pb::OverflowPolicy::DropOldest.into(),
            expires_in_ms: Some(1500),
            ..Default::default()
        };
        let info = SubscriptionInfo::try_from(raw.clone()).unwrap();
        assert_eq!(
            (info.mode, info.ack_mode, info.overflow),
            (Mode::Singleton, AckMode::None, Overflow::DropOldest)
        );
        assert_eq!(
            info.members.iter().map(|m| m.member_id).collect::<Vec<_>>(),
            vec![7, 9]
        );
        assert_eq!(info.active_member_id, Some(7));
        assert_eq!(
            (
                info.members[0].metadata.as_str(),
                info.members[1].metadata.as_str()
            ),
            ("host-a", "")
        );
        assert_eq!(info.active_metadata, "host-a");
        assert_eq!(
            (info.counters.acked, info.counters.dropped_overflow),
            (5, 2)
        );
        assert_eq!(info.dead_letter_topic, None);
        assert_eq!(info.expires_in, Some(Duration::from_millis(1500)));

        let queue = pb::SubscriptionInfo {
            mode: pb::DeliveryMode::Queue.into(),
            active_member_id: 0,
            dead_letter_topic: "dead".into(),
            ..raw.clone()
        };
        let info = SubscriptionInfo::try_from(queue).unwrap();
        assert_eq!(info.active_member_id, None);
        assert_eq!(info.dead_letter_topic.as_deref(), Some("dead"));

        let newer = pb::SubscriptionInfo { mode: 42, ..raw };
        assert!(matches!(
            SubscriptionInfo::try_from(newer),
            Err(Error::Other { code: Code::Unimplemented, message }) if message.contains("42")
        ));
    }
}
