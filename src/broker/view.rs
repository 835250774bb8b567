//! What `DescribeSubscription` and `ListSubscriptions` answer, in domain terms: a
//! subscription's [`SubscriptionView`] as the broker holding its members sees it, and in cluster
//! mode what JetStream and the cluster's line add. The service turns it into protobuf.

use super::SubscriptionView;
use crate::core::MemberId;

/// One subscription, described.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Description {
    /// What the broker here holds of it (in cluster mode, a subscription with no member here
    /// has its settings only: no members, nothing queued, zero counters).
    pub view: SubscriptionView,
    /// Cluster mode: what its JetStream consumer holds for it.
    pub upstream: Option<UpstreamBacklog>,
    /// Cluster mode: a singleton's active member as the cluster's line names it (0: none),
    /// when this gateway holds no active member of it; `view.epoch` is then the line's.
    pub active_member: Option<MemberId>,
    /// Cluster mode: that active member's metadata, as the line holds it.
    pub active_metadata: Option<std::sync::Arc<str>>,
}

impl From<SubscriptionView> for Description {
    fn from(view: SubscriptionView) -> Self {
        Self {
            view,
            upstream: None,
            active_member: None,
            active_metadata: None,
        }
    }
}

/// Cluster mode: a subscription's JetStream consumer, as the servers report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamBacklog {
    /// The consumer's name.
    pub consumer: String,
    /// Messages in the stream it has not delivered yet.
    pub pending: u64,
    /// Messages delivered to a gateway and not acked yet.
    pub unacked: u64,
    /// Messages delivered more than once.
    pub redelivered: u64,
}
