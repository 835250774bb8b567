//! Acks and nacks that name their member, forwarded to the gateway that admitted it (a load
//! balancer, grpcurl or a second client may send them to any gateway). A gateway's member ids
//! share their high bits, its *route* ([`route_of`]); it listens on one subject for its
//! route, so a forwarded settle reaches that gateway alone, which answers as it would have
//! answered the member's own connection: applied, `NOT_FOUND` (not in flight), or
//! `FAILED_PRECONDITION` for a member that left or was deposed (counted as a stale ack where
//! the subscription is still held there). A gateway that does not answer within the timeout is
//! `UNAVAILABLE`: NATS request/reply is at most once, so the settle may or may not have been
//! applied; a repeat then says `NOT_FOUND` ("not in flight").
//!
//! "No responders" is only what this gateway's NATS server knows: a subscription made on another
//! server reaches it over the cluster's routes, later, and not at all while the route between
//! the two servers is down (a route re-forming after a server restart, or lost in the race of
//! two servers dialling each other, comes back after about a second). So a forwarded settle
//! that finds no responders is sent again (5 ms doubling to 200 ms) until the forward timeout:
//! nobody received it, so it cannot be applied twice. Only when no gateway answered on the
//! route for that long is it `FAILED_PRECONDITION`, stale (the gateway that admitted the
//! member stopped or died).
//!
//! A route found gone is remembered ([`GoneRoutes`]): a route is one gateway incarnation's (a
//! restarted gateway draws a new one), so the next settle for it is sent once, and stale at
//! once if that try finds no responders too, instead of each ack for a dead gateway's members
//! waiting out the timeout and holding a stream of its connection meanwhile. Any answer on the
//! route forgets it again (a NATS route that was down longer than the timeout came back).

use std::{
    collections::VecDeque,
    sync::{Mutex, PoisonError},
    time::Duration,
};

use serde::{Deserialize, Serialize};

use crate::cluster::{bus::BusError, ids::Route};
use crate::{
    broker::{Broker, Fence},
    core::{Error, ErrorKind},
};

/// How long a forwarded settle's try sent near the forward timeout may take past it.
const LAST_TRY_GRACE: Duration = Duration::from_millis(500);

/// The longest pause between two tries of a forwarded settle that found no responders.
const NO_RESPONDERS_MAX_DELAY: Duration = Duration::from_millis(200);

/// How many gone routes a gateway remembers, and how many routes' last answers; past it, the
/// longest-known is forgotten (a gone route's next settle then waits out the timeout once more).
const GONE_ROUTES: usize = 1024;

/// The routes on which no gateway answered for a whole forward timeout: each one's next
/// settle gets one try, not the timeout's worth of retries. Beside them, when each route last
/// answered: a settle that began before that answer does not mark its route gone (it found
/// no responders through an outage that another settle saw end). Both bounded by
/// [`GONE_ROUTES`].
#[derive(Debug, Default)]
pub(in crate::cluster::gateway) struct GoneRoutes(Mutex<Routes>);

#[derive(Debug, Default)]
struct Routes {
    gone: VecDeque<Route>,
    answered: VecDeque<(Route, tokio::time::Instant)>,
}

impl GoneRoutes {
    fn contains(&self, route: Route) -> bool {
        self.lock().gone.contains(&route)
    }

    /// `route` found gone by a settle that began at `since`.
    fn found_gone(&self, route: Route, since: tokio::time::Instant) {
        let mut routes = self.lock();
        let answered_after = routes
            .answered
            .iter()
            .any(|(r, at)| *r == route && *at >= since);
        if !answered_after && !routes.gone.contains(&route) {
            if routes.gone.len() == GONE_ROUTES {
                routes.gone.pop_front();
            }
            routes.gone.push_back(route);
        }
    }

    /// `route` answered a settle.
    fn answered(&self, route: Route) {
        let mut routes = self.lock();
        routes.gone.retain(|r| *r != route);
        routes.answered.retain(|(r, _)| *r != route);
        if routes.answered.len() == GONE_ROUTES {
            routes.answered.pop_front();
        }
        routes
            .answered
            .push_back((route, tokio::time::Instant::now()));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Routes> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What one gateway asks the others.
#[derive(Debug, Serialize, Deserialize)]
pub(in crate::cluster::gateway) struct SettleRequest {
    pub(in crate::cluster::gateway) subscription: String,
    pub(in crate::cluster::gateway) member: u64,
    pub(in crate::cluster::gateway) system_id: u64,
    pub(in crate::cluster::gateway) nack: bool,
    /// Not a settle: the member's proclamation (docs/semantics.md#member-metadata).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(in crate::cluster::gateway) proclaim: Option<ProclaimRequest>,
}

/// A proclamation forwarded to the gateway holding the member.
#[derive(Debug, Serialize, Deserialize)]
pub(in crate::cluster::gateway) struct ProclaimRequest {
    pub(in crate::cluster::gateway) epoch: u64,
    pub(in crate::cluster::gateway) metadata: String,
}

/// The answer: `code` is the refusal's [`ErrorKind`] in gRPC's numbering (0 when applied).
#[derive(Debug, Serialize, Deserialize)]
pub(in crate::cluster::gateway) struct SettleReply {
    pub(in crate::cluster::gateway) code: i32,
    pub(in crate::cluster::gateway) message: String,
}

/// Outside the stream's subjects (`<stream>.>`), so forwarded acks are never stored.
pub(in crate::cluster::gateway) fn subject(stream: &str, route: Route) -> String {
    format!("_tinybroker.{stream}.settle.{route}")
}

/// Settles at this gateway, the one that admitted `member`, answering as its own connection
/// would have been answered. A subscription it no longer holds (its last member here left, so
/// the local part was forgotten) makes the settle stale, as the member is gone.
pub(in crate::cluster::gateway) fn settle_here(
    broker: &Broker,
    subscription: &str,
    member: u64,
    system_id: u64,
    nack: bool,
) -> Result<(), Error> {
    let fence = Fence::Member(member);
    let result = if nack {
        broker.nack(subscription, fence, system_id)
    } else {
        broker.ack(subscription, fence, system_id)
    };
    result.map_err(|error| match error {
        Error::SubscriptionNotFound(_) => stale(subscription, member),
        error => error,
    })
}

/// As at home, an ack from a member that no longer holds anything is stale: it left, or the
/// cluster deposed it, and its message (if any) went to another member.
fn stale(subscription: &str, member: u64) -> Error {
    Error::MemberGone {
        subscription: subscription.to_string(),
        member,
        reason: "it left or was deposed".into(),
    }
}

/// Forwards one settle and returns the holder's answer.
pub(in crate::cluster::gateway) async fn request(
    bus: &dyn crate::cluster::bus::Bus,
    stream: &str,
    gone: &GoneRoutes,
    settle: SettleRequest,
    timeout: Duration,
) -> Result<(), Error> {
    let body = bytes::Bytes::from(
        serde_json::to_vec(&settle)
            .map_err(|e| Error::cluster(ErrorKind::Internal, e.to_string()))?,
    );
    let route = Route::of(settle.member);
    let since = tokio::time::Instant::now();
    let known_gone = gone.contains(route);
    let subject = subject(stream, route);
    let late = || {
        Error::Unavailable(format!(
            "the gateway holding member {} did not answer within {timeout:?}: the ack, nack or proclamation may or may not have been applied",
            settle.member
        ))
    };
    let deadline = tokio::time::Instant::now() + timeout;
    let mut delay = Duration::from_millis(5);
    let answer = loop {
        let request = bus.request(&subject, body.clone(), timeout);
        // A try sent just before the deadline still gets its answer: on a loaded machine the
        // server's "no responders" can take longer than what was left, and a settle whose
        // every try found no responders is stale, not "may or may not have been applied".
        let until = deadline.max(tokio::time::Instant::now() + LAST_TRY_GRACE);
        match tokio::time::timeout_at(until, request).await {
            Ok(Ok(answer)) => {
                gone.answered(route);
                break answer;
            }
            // No responders at this gateway's server (yet): see the module doc.
            Ok(Err(BusError::NoResponders)) => {
                let now = tokio::time::Instant::now();
                if known_gone || now + delay >= deadline {
                    gone.found_gone(route, since);
                    let why = if known_gone {
                        format!("none answered on its route for {timeout:?} before, nor now")
                    } else {
                        format!("none answered on its route within {timeout:?}")
                    };
                    return Err(Error::MemberGone {
                        subscription: settle.subscription,
                        member: settle.member,
                        reason: format!("the gateway that admitted it is gone: {why}"),
                    });
                }
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(NO_RESPONDERS_MAX_DELAY);
            }
            Err(_) => return Err(late()),
            Ok(Err(BusError::TimedOut)) => {
                return Err(late());
            }
            Ok(Err(error)) => {
                return Err(Error::Unavailable(format!(
                    "could not forward the ack to the gateway holding member {}: {error}",
                    settle.member
                )));
            }
        }
    };
    let reply: SettleReply = serde_json::from_slice(&answer.payload).map_err(|e| {
        Error::cluster(
            ErrorKind::Internal,
            format!("unreadable answer from a gateway: {e}"),
        )
    })?;
    match reply.code {
        0 => Ok(()),
        code => Err(Error::cluster(ErrorKind::from_code(code), reply.message)),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{GONE_ROUTES, GoneRoutes, Route};

    // A route is marked gone by a settle that found no responders for the timeout, unmarked by
    // an answer; a settle that began before the route's last answer does not mark it (it
    // found no responders through an outage another settle saw end).
    #[tokio::test(start_paused = true)]
    async fn a_route_is_gone_until_it_answers_and_only_by_a_settle_begun_after_its_answer() {
        let gone = GoneRoutes::default();
        let before = tokio::time::Instant::now();
        gone.found_gone(Route(7), before);
        assert!(gone.contains(Route(7)));
        tokio::time::advance(Duration::from_millis(10)).await;
        gone.answered(Route(7));
        assert!(!gone.contains(Route(7)));
        gone.found_gone(Route(7), before);
        assert!(!gone.contains(Route(7)), "began before the answer");
        tokio::time::advance(Duration::from_millis(10)).await;
        gone.found_gone(Route(7), tokio::time::Instant::now());
        assert!(gone.contains(Route(7)), "began after the answer");
        assert!(!gone.contains(Route(8)));
    }

    // Bounded: past GONE_ROUTES the longest-known is forgotten, gone routes and answers alike.
    #[tokio::test(start_paused = true)]
    async fn the_memory_of_routes_is_bounded() {
        let gone = GoneRoutes::default();
        let now = tokio::time::Instant::now();
        for route in 0..=GONE_ROUTES as u64 {
            gone.found_gone(Route(route), now);
            gone.answered(Route(route + 10_000));
        }
        let routes = gone.lock();
        assert_eq!(routes.gone.len(), GONE_ROUTES);
        assert_eq!(routes.answered.len(), GONE_ROUTES);
        assert!(
            !routes.gone.contains(&Route(0)) && routes.gone.contains(&Route(GONE_ROUTES as u64))
        );
        assert!(!routes.answered.iter().any(|(r, _)| *r == Route(10_000)));
    }
}
