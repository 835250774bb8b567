//! What gateways keep in the backplane: the keys and a subscription's value (see
//! [`super::coordinator`] for how they are used).

use serde::{Deserialize, Serialize};

pub use super::ids::{GatewayId, MemberUid};

/// The value of `sub.<subscription>`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubValue {
    /// Members in join order, across all gateways.
    pub line: Vec<MemberUid>,
    /// The active member (always the first of the line when set).
    pub active: Option<MemberUid>,
    /// The active member's epoch (the last one handed out when none is active).
    pub epoch: u64,
    /// Messages the last active member's gateway gave back, with the attempt their next
    /// delivery carries (stream sequence, attempt): JetStream counts deliveries to gateways,
    /// not the redeliveries inside one after a nack, and counts a delivery to a gateway that
    /// no member got. Written with the promotion
    /// that follows a clean close; replaced by the next promotion.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub carry: Vec<(u64, u32)>,
    /// Whether the active member took over from an earlier one (a promotion, counted as
    /// such by its gateway) rather than being the line's first.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub promoted: bool,
    /// Whether the active member took over from one whose gateway died (its lease was deleted):
    /// what that gateway held comes back from JetStream after its ack wait, named by no
    /// `carry`, so the new active member's gateway waits for it by count.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub took_over: bool,
    /// The metadata of the line's members that have any, in line order
    /// (docs/semantics.md#member-metadata): each written by its member's gateway.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub meta: Vec<(MemberUid, String)>,
    /// The priorities of the line's members that have one above 0, in line order
    /// (docs/semantics.md#priority): each written by its member's gateway. The standbys stand
    /// in priority order, highest first, then join order; the active member stands first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prio: Vec<(MemberUid, u32)>,
    /// The epoch a `HandOver` asked to end (0: none): the active member's gateway steps it
    /// down while it is the line's epoch and a standby of its priority or higher is in line
    /// (docs/semantics.md#cluster-priority-and-hand-over).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub hand_over: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Why an active member steps down (docs/semantics.md#hand-over).
pub use crate::core::StepDownCause;

impl SubValue {
    /// `member`'s metadata in this value (empty if none).
    pub fn meta_of(&self, member: MemberUid) -> &str {
        self.meta
            .iter()
            .find(|(m, _)| *m == member)
            .map_or("", |(_, meta)| meta.as_str())
    }

    /// The active member's metadata (empty if none, or none is active).
    pub fn active_meta(&self) -> &str {
        self.active.map_or("", |a| self.meta_of(a))
    }

    /// `member`'s priority in this value (0 if none).
    pub fn priority_of(&self, member: MemberUid) -> u32 {
        self.prio
            .iter()
            .find(|(m, _)| *m == member)
            .map_or(0, |(_, p)| *p)
    }

    /// The active member's successor by `cause`: the first standby in line, if it outranks
    /// the active member (a takeover by priority) or is of its priority or higher (a
    /// hand-over).
    pub fn successor(&self, cause: StepDownCause) -> Option<MemberUid> {
        let active = self.active?;
        let first = *self.line.iter().find(|m| **m != active)?;
        let (theirs, ours) = (self.priority_of(first), self.priority_of(active));
        let takes_over = match cause {
            StepDownCause::Priority => theirs > ours,
            StepDownCause::HandOver => theirs >= ours,
        };
        takes_over.then_some(first)
    }

    /// Why the active member must step down now, if it must: a hand-over asked for its
    /// epoch with a standby of its priority or higher, or a standby that outranks it.
    pub fn step_down_cause(&self) -> Option<StepDownCause> {
        if self.hand_over != 0
            && self.hand_over == self.epoch
            && self.successor(StepDownCause::HandOver).is_some()
        {
            return Some(StepDownCause::HandOver);
        }
        self.successor(StepDownCause::Priority)
            .map(|_| StepDownCause::Priority)
    }

    /// The bytes of metadata this value holds.
    pub fn meta_bytes(&self) -> usize {
        self.meta.iter().map(|(_, meta)| meta.len()).sum()
    }
}

/// A key of the coordination bucket, as the coordinator names it in its commands and reads it
/// from the watch: its shell writes `to_string()` and decides nothing from the spelling.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Key {
    /// `lease.<gateway>`: a gateway incarnation's lease.
    Lease(GatewayId),
    /// `sub.<subscription>`: a subscription's line ([`SubValue`]).
    Line(String),
    /// `ids`: the cluster's epoch floor ([`IdsValue`]).
    Ids,
}

impl Key {
    /// What every lease key starts with.
    pub const LEASES: &'static str = "lease.";

    /// The key spelled `key` in the bucket; `None` for one the coordinator does not keep
    /// (`routes`, or one that does not parse).
    pub fn parse(key: &str) -> Option<Self> {
        if let Some(sub) = key.strip_prefix("sub.") {
            return Some(Self::Line(sub.to_string()));
        }
        if let Some(gateway) = key.strip_prefix(Self::LEASES) {
            return gateway.parse().ok().map(|g| Self::Lease(GatewayId(g)));
        }
        (key == IDS_KEY).then_some(Self::Ids)
    }

    /// The subscription whose line this is.
    pub fn line(&self) -> Option<&str> {
        match self {
            Self::Line(sub) => Some(sub),
            _ => None,
        }
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Lease(gateway) => write!(f, "lease.{}", gateway.0),
            Self::Line(sub) => write!(f, "sub.{sub}"),
            Self::Ids => f.write_str(IDS_KEY),
        }
    }
}

/// A key equals its spelling in the bucket.
impl PartialEq<&str> for Key {
    fn eq(&self, spelled: &&str) -> bool {
        Self::parse(spelled).as_ref() == Some(self)
    }
}

/// The key of a subscription's value.
pub fn sub_key(subscription: &str) -> String {
    Key::Line(subscription.to_string()).to_string()
}

/// The key of the cluster's epoch floor ([`IdsValue`]).
pub const IDS_KEY: &str = "ids";

/// The value of [`IDS_KEY`]: what every epoch adds to the revision it is made from, raised by
/// each gateway at start so that epochs are above the time it started
/// (docs/semantics.md#cluster-restart-identity). A promotion's epoch is
/// `max(replaced revision, this value's revision) + epoch_offset`, from the value as the
/// promoting gateway's watch last delivered it; without one, the replaced revision.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdsValue {
    /// Added to revisions to make epochs; only ever raised.
    pub epoch_offset: u64,
}

/// The key of the last member-id route a gateway claimed ([`RoutesValue`]).
pub const ROUTES_KEY: &str = "routes";

/// The value of [`ROUTES_KEY`]: the last route a gateway claimed at start. Each claims the
/// next one above it and above its start time, so member ids (a route's ids are
/// `route << GATEWAY_ROUTE_SHIFT` and up) rise across gateway starts and stand above the time
/// (docs/semantics.md#cluster-restart-identity).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoutesValue {
    /// The last route claimed.
    pub last: u64,
}

/// The key of a gateway's lease.
pub fn lease_key(gateway: GatewayId) -> String {
    Key::Lease(gateway).to_string()
}

/// Where a standby of priority `priority` enters `line` (whose members' priorities `of`
/// gives), skipping `active` (first, whatever its priority): behind every standby of a
/// higher priority, and behind those of its own too when `behind_equals` (a join, a
/// hand-over), ahead of them otherwise (the member a takeover by priority displaced: first
/// among its priority).
pub fn standby_place(
    line: &[MemberUid],
    active: Option<MemberUid>,
    priority: u32,
    behind_equals: bool,
    of: impl Fn(MemberUid) -> u32,
) -> usize {
    line.iter()
        .rposition(|&m| {
            Some(m) == active || of(m) > priority || (behind_equals && of(m) == priority)
        })
        .map_or(0, |at| at + 1)
}

/// Moves `line` past its first member `stepping`, which stepped down for `cause`: its
/// successor, the first standby, stands first, and it stands among the standbys behind those
/// of its priority (a hand-over) or first among them (displaced by a higher priority).
pub fn step_past(
    line: &mut Vec<MemberUid>,
    stepping: MemberUid,
    cause: StepDownCause,
    of: impl Fn(MemberUid) -> u32,
) {
    line.retain(|u| *u != stepping);
    let at = standby_place(
        line,
        line.first().copied(),
        of(stepping),
        cause == StepDownCause::HandOver,
        of,
    );
    line.insert(at, stepping);
}

#[cfg(test)]
mod tests {
    use super::*;

    // The coordinator's keys are spelled in the bucket as before the type (old buckets read
    // alike), parse back, and a key it does not keep parses to none.
    #[test]
    fn keys_spell_as_the_bucket_has_them_and_parse_back() {
        for (key, spelled) in [
            (Key::Lease(GatewayId(42)), "lease.42"),
            (Key::Line("jobs.leader".into()), "sub.jobs.leader"),
            (Key::Ids, "ids"),
        ] {
            assert_eq!(key.to_string(), spelled);
            assert_eq!(Key::parse(spelled), Some(key.clone()));
            assert!(key == spelled);
        }
        assert_eq!(sub_key("a"), "sub.a");
        assert_eq!(lease_key(GatewayId(7)), "lease.7");
        assert_eq!(Key::parse(ROUTES_KEY), None);
        assert_eq!(Key::parse("lease.x"), None);
        assert_eq!(Key::parse("other"), None);
        assert_eq!(Key::Line("a".into()).line(), Some("a"));
        assert_eq!(Key::Ids.line(), None);
    }
}
