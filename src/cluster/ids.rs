//! The ids cluster mode names things by, each a type of its own: a gateway incarnation
//! ([`GatewayId`], also the id of its lease), a member across the cluster ([`MemberUid`]), and
//! a member id's route ([`Route`]: which gateway answers for it). Subjects and consumer names
//! are NATS's spelling of them (`gateway::wire::names`).

use serde::{Deserialize, Serialize};

/// A gateway incarnation: unique for the life of the bucket (a restarted or fenced gateway gets a
/// new one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct GatewayId(pub u64);

/// A member across the cluster: its gateway and its id there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct MemberUid {
    /// The gateway that holds the member's stream.
    pub gateway: GatewayId,
    /// The member's id on that gateway.
    pub member: u64,
}

/// The route of a member id: the gateway that admitted it listens for its route's forwarded
/// acks and proclamations. A gateway claims a route at start (in the coordination bucket, above
/// every earlier one) and its member ids start at `route << GATEWAY_ROUTE_SHIFT`, so a member
/// id's high bits name it (docs/semantics.md#cluster-restart-identity).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Route(pub u64);

impl Route {
    /// The route of member id `member`.
    pub fn of(member: u64) -> Self {
        Self(member >> crate::broker::GATEWAY_ROUTE_SHIFT)
    }
}

impl std::fmt::Display for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}
