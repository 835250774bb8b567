//! Log context and throttling for the shell: a span per member stream event, so every line a
//! join or a failover produces names the subscription, the member and its epoch; and refusals
//! that can repeat once per publish logged on a doubling schedule instead of every time.

use super::SubState;
use crate::core::{Error, MemberId};

/// The span for work done on behalf of `member`'s stream (its join or its leave): fields
/// `subscription`, `member` and `epoch` (0 while on standby).
pub(super) fn member_span(state: &SubState, member: MemberId) -> tracing::Span {
    let epoch = state
        .core
        .member_infos()
        .into_iter()
        .find(|m| m.member_id == member)
        .map_or(0, |m| m.epoch);
    tracing::info_span!("member_stream", subscription = %state.core.id(), member, epoch)
}

/// Logs a publish refused by a full subscription on its 1st, 2nd, 4th, 8th… refusal: a queue
/// that stays full under load would otherwise log once per publish.
pub(super) fn queue_full(state: &SubState, error: &Error) {
    let refusals = state.core.counters().rejected_full;
    if refusals.is_power_of_two() {
        tracing::warn!(subscription = %state.core.id(), refusals, %error, "publish refused: subscription full");
    }
}

/// Logs a refused join once: at warn when a broker limit refused it (an operator may need to
/// raise the limit), at debug when the request itself was wrong (the client is told why).
pub(crate) fn refused_join(subscription_id: &str, error: &Error) {
    match error {
        Error::TooManySubscriptions { .. } | Error::TooManyMembers { .. } => {
            tracing::warn!(subscription = %subscription_id, %error, "join refused: limit reached");
        }
        _ => tracing::debug!(subscription = %subscription_id, %error, "join refused"),
    }
}
