//! Check (j) of the real-gateway campaign: join order across gateways, as the clients see it
//! (docs/semantics.md#cluster-join-order). A singleton join is answered once its member is in
//! the cluster's line, so a member whose join was answered stands ahead of every member whose
//! join was sent after that (a join reaches its gateway after it was sent).
//!
//! So when a member Y is confirmed active, every member X whose join was answered before Y's
//! join was sent was active itself since its join, or was let go before Y's confirmation:
//! - its stream ended, or it was cut off from its gateway and not seen alive on that stream
//!   since (the gateway may end it before the client notices), or its host crashed;
//! - its gateway crashed, or was cut off from NATS after the join was sent (its lease may end,
//!   its members ended while others promote past them) or frozen, either long enough for its
//!   lease to end;
//! - or its join took 5 s or more to answer: NATS slow to take it into the line, it is
//!   answered on standby all the same, without the promise (the same section).

use std::time::Duration;

use crate::gateway_judge::{Seen, cut_ended, cut_from_nats_past_the_lease, frozen_past_the_lease};

/// How long a gateway waits for a member's place in the line before it answers the join all
/// the same (`JOIN_LEASE_PATIENCE`): a join answered that late promises nothing of its order.
const PLACE_PATIENCE: Duration = Duration::from_secs(5);

/// One join of a member, as its client saw it.
struct Join<'a> {
    member: &'a str,
    gateway: &'a str,
    sent: Duration,
    answered: Option<Duration>,
}

/// Check (j) on what was seen.
pub fn judge_join_order(log: &[(Duration, Seen)]) -> Vec<String> {
    let mut violations = Vec::new();
    // Each member's latest join (a member joins again once its stream ended).
    let mut joins: Vec<Join> = Vec::new();
    for (at, seen) in log {
        match seen {
            Seen::Joining { member, gateway } => {
                joins.retain(|j| j.member != member);
                joins.push(Join {
                    member,
                    gateway,
                    sent: *at,
                    answered: None,
                });
            }
            Seen::Joined { member } => {
                if let Some(join) = joins.iter_mut().find(|j| j.member == member) {
                    join.answered = Some(*at);
                }
            }
            Seen::Active { member: y, .. } => {
                let Some(promoted) = joins.iter().find(|j| j.member == y) else {
                    continue;
                };
                for x in &joins {
                    let Some(answered) = x.answered else { continue };
                    if x.member == y
                        || answered >= promoted.sent
                        || answered >= x.sent + PLACE_PATIENCE
                        || let_go(log, x, answered, *at)
                    {
                        continue;
                    }
                    violations.push(format!(
                        "(j) {y} confirmed active at {at:?} (its join sent at {:?}) ahead of {}, whose join at {} was answered at {answered:?} and which was never active since",
                        promoted.sent, x.member, x.gateway
                    ));
                }
            }
            _ => {}
        }
    }
    violations
}

/// Whether `x`, whose join was answered at `answered`, was active or let go between the join
/// and `at` (see the module's list). A join sent while its gateway was cut off from NATS is not
/// let go by that cut: it is taken into the line only once the cut heals (or answered after
/// 5 s, or refused), so its place is still owed.
fn let_go(log: &[(Duration, Seen)], x: &Join, answered: Duration, at: Duration) -> bool {
    log.iter()
        .filter(|(t, _)| (x.sent..=at).contains(t))
        .any(|(t, seen)| match seen {
            Seen::Active { member, .. } => member == x.member && *t >= answered,
            Seen::Ended { member } => member == x.member,
            Seen::Cut { member } => member == x.member && cut_ended(log, member, *t),
            Seen::Crashed { host } => host == x.member || host == x.gateway,
            Seen::CutFromNats { gateway, cut: true } => {
                gateway == x.gateway && cut_from_nats_past_the_lease(log, gateway, *t)
            }
            Seen::Frozen { gateway } => {
                gateway == x.gateway && frozen_past_the_lease(log, gateway, *t)
            }
            _ => false,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn joining(member: &str, gateway: &str) -> Seen {
        Seen::Joining {
            member: member.into(),
            gateway: gateway.into(),
        }
    }

    fn joined(member: &str) -> Seen {
        Seen::Joined {
            member: member.into(),
        }
    }

    fn active(member: &str, epoch: u64) -> Seen {
        Seen::Active {
            member: member.into(),
            member_id: 0,
            epoch,
        }
    }

    /// m1 active; m2 joins at gw2 and is answered before m3's join at gw1 is sent; m1 ends and
    /// m3 is promoted.
    fn m3_ahead_of_m2() -> Vec<(Duration, Seen)> {
        vec![
            (ms(0), joining("m1", "gw1")),
            (ms(10), joined("m1")),
            (ms(12), active("m1", 5)),
            (ms(100), joining("m2", "gw2")),
            (ms(110), joined("m2")),
            (ms(200), joining("m3", "gw1")),
            (ms(210), joined("m3")),
            (
                ms(4_000),
                Seen::Ended {
                    member: "m1".into(),
                },
            ),
            (ms(4_010), active("m3", 9)),
        ]
    }

    // Check (j) can fail: a member promoted ahead of one answered before it joined.
    #[test]
    fn cluster_real_gateway_judge_catches_a_promotion_out_of_join_order() {
        let log = m3_ahead_of_m2();
        let found = judge_join_order(&log);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].starts_with("(j) m3"), "{found:?}");
        // In join order: m2 promoted, then m3.
        let mut log = m3_ahead_of_m2();
        log.insert(8, (ms(4_005), active("m2", 7)));
        assert!(judge_join_order(&log).is_empty());
        // m3's join sent before m2's was answered: no order between them.
        let mut log = m3_ahead_of_m2();
        log[4].0 = ms(250);
        log.sort_by_key(|(at, _)| *at);
        assert!(judge_join_order(&log).is_empty());
    }

    // m2 let go before m3's promotion: cut off from its gateway, its gateway frozen past its
    // lease or cut off from NATS, or its join answered only after the 5 s NATS may take to
    // place it. A freeze within the lease lets nothing go.
    #[test]
    fn cluster_real_gateway_judge_excuses_only_a_member_let_go_before_the_promotion() {
        let with = |events: Vec<(Duration, Seen)>| {
            let mut log = m3_ahead_of_m2();
            log.extend(events);
            log.sort_by_key(|(at, _)| *at);
            judge_join_order(&log)
        };
        let frozen = |from, to| {
            vec![
                (
                    ms(from),
                    Seen::Frozen {
                        gateway: "gw2".into(),
                    },
                ),
                (
                    ms(to),
                    Seen::Thawed {
                        gateway: "gw2".into(),
                    },
                ),
            ]
        };
        assert_eq!(
            with(frozen(1_000, 1_500)).len(),
            1,
            "a freeze within the lease"
        );
        assert!(
            with(frozen(1_000, 3_500)).is_empty(),
            "frozen past the lease"
        );
        let cut = |ended| {
            let mut events = vec![(
                ms(300),
                Seen::Cut {
                    member: "m2".into(),
                },
            )];
            if ended {
                let end = Seen::Ended {
                    member: "m2".into(),
                };
                events.push((ms(2_500), end));
            }
            events
        };
        assert!(
            with(cut(true)).is_empty(),
            "m2 cut off from gw2, its stream lost"
        );
        assert!(
            with(cut(false)).is_empty(),
            "m2 cut off, its stream not seen alive since: gw2 may have ended it"
        );
        let from_nats = |at| {
            vec![(
                ms(at),
                Seen::CutFromNats {
                    gateway: "gw2".into(),
                    cut: true,
                },
            )]
        };
        assert!(
            with(from_nats(300)).is_empty(),
            "gw2 cut off from NATS after m2 joined"
        );
        let mut short = from_nats(300);
        let healed = Seen::CutFromNats {
            gateway: "gw2".into(),
            cut: false,
        };
        short.push((ms(800), healed));
        assert_eq!(with(short).len(), 1, "a cut from NATS within the lease");
        assert_eq!(
            with(from_nats(50)).len(),
            1,
            "m2 answered quickly though its gateway was cut off when it joined: its place is owed"
        );
        let mut slow = m3_ahead_of_m2();
        slow[3].0 = ms(0);
        slow[4].0 = ms(5_000);
        slow[5].0 = ms(5_001);
        slow[6].0 = ms(5_002);
        slow[7].0 = ms(6_000);
        slow[8].0 = ms(6_010);
        assert!(
            judge_join_order(&slow).is_empty(),
            "m2's join answered after 5 s: no place promised"
        );
    }
}
