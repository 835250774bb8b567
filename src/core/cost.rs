//! The memory-cost model: what each held message, member, subscription and pattern is charged
//! against the broker's budget (docs/semantics.md#memory-budget).

use super::{
    index::{self, PatternIndex},
    spec::SubscriptionSpec,
    topic::Pattern,
};

/// What one held message costs beyond its own bytes, charged in full by every subscription
/// holding it. Queued: its slot, one pointer (8 bytes, up to 16 just after the ring buffer
/// doubles), and its allocation beyond the payload: count, length, id, publish time and envelope
/// pointer (40 bytes), the allocator's 8-byte header and rounding to 16 (0 to 15): 56 to 79 in
/// all, 56 to 64 with a 128-byte payload. Not charged: an envelope of its own (a unary publish,
/// or a stream whose topic or headers change from one message to the next: about 50 bytes plus
/// the topic's own allocation; a stream to one topic shares one), and the in-flight record's
/// extra over a slot (an ordered-map entry, about 50 bytes, or in an ack-free subscription a
/// 24-byte slot of its member's list; the windows bound how many).
pub const MESSAGE_OVERHEAD: u64 = 80;
/// What one member costs: its record, its outlet and the stream's state.
pub const MEMBER_OVERHEAD: u64 = 1024;
/// What one subscription costs before any message or member.
pub const SUBSCRIPTION_OVERHEAD: u64 = 2048;
/// What each pattern costs beyond its text in the subscription's settings: its slot in the
/// pattern list and the text's shared allocation (its counts and the allocator's overhead).
pub const PATTERN_OVERHEAD: u64 =
    std::mem::size_of::<Pattern>() as u64 + 16 + index::ALLOCATION_OVERHEAD;

/// The budget cost of one pattern of a subscription: its text in the settings
/// ([`PATTERN_OVERHEAD`] beside it) and its entry in the broker's routing index, at most
/// [`PatternIndex::entry_cost`] however it shares nodes with other subscriptions' patterns.
pub fn pattern_cost(pattern: &Pattern) -> u64 {
    pattern.as_str().len() as u64 + PATTERN_OVERHEAD + PatternIndex::<u64>::entry_cost(pattern)
}

/// The budget cost of a subscription with `spec`'s patterns and nothing else.
pub fn subscription_cost(spec: &SubscriptionSpec) -> u64 {
    SUBSCRIPTION_OVERHEAD + spec.patterns.iter().map(pattern_cost).sum::<u64>()
}
