//! Tests of the tools that test the core: the invariant checker must reject every kind of broken
//! bookkeeping it claims to check, each planted bug must break only what it claims to, and
//! `drain` must account for everything it throws away.

use super::*;

/// A queue subscription of four 16-byte messages: member `a` (window 2) holds 1 and 3, member
/// `b` (window 1) holds 2, and 4 waits in the queue.
fn busy_queue() -> (Subscription, MemberId, MemberId) {
    let mut s = sub(Mode::Queue);
    let spec = s.spec().clone();
    let (a, _) = s.join(&spec, window(2)).unwrap();
    let (b, _) = s.join(&spec, window(1)).unwrap();
    for id in 1..=4 {
        let _ = s.enqueue(msg(id));
    }
    s.check_invariants().unwrap();
    assert_eq!(
        s.in_flight_ids().collect::<Vec<_>>(),
        [(1, a), (2, b), (3, a)]
    );
    assert_eq!((s.queued(), s.held_bytes()), (1, 4 * 16));
    (s, a, b)
}

fn two_singleton_members() -> (Subscription, MemberId, MemberId) {
    let mut s = sub(Mode::Singleton);
    let (a, _) = join(&mut s);
    let (b, _) = join(&mut s);
    (s, a, b)
}

fn member(s: &mut Subscription, id: MemberId) -> &mut Member {
    s.members.get_mut(&id).unwrap()
}

/// A starting state, one way to corrupt it, and how the checker must describe the result.
type Corruption = (
    fn() -> (Subscription, MemberId, MemberId),
    fn(&mut Subscription, MemberId, MemberId),
    &'static str,
);

#[test]
fn checker_rejects_each_kind_of_broken_bookkeeping() {
    let cases: [Corruption; 9] = [
        (
            two_singleton_members,
            |s, _, b| member(s, b).epoch = Some(9),
            "2 active members: [1, 2]",
        ),
        (
            two_singleton_members,
            |s, a, _| member(s, a).epoch = None,
            "members but no active member",
        ),
        (
            two_singleton_members,
            |s, a, b| {
                member(s, a).epoch = None;
                member(s, b).epoch = Some(9);
            },
            "active member 2 is not the first in line, 1",
        ),
        (
            busy_queue,
            |s, a, _| member(s, a).epoch = None,
            "a non-singleton member is not active",
        ),
        (
            busy_queue,
            |s, _, b| member(s, b).in_flight += 1,
            "member 2 counts 2 in flight but holds 1",
        ),
        (
            busy_queue,
            |s, a, _| member(s, a).options.max_in_flight = 1,
            "member 1 is over its window",
        ),
        (
            busy_queue,
            |s, a, _| {
                s.members.remove(&a);
            },
            "#1 is in flight to member 1, which is gone",
        ),
        (
            busy_queue,
            |s, _, _| s.queue.push_back(msg(1)),
            "a message is both queued and in flight",
        ),
        (
            busy_queue,
            |s, _, _| s.held_bytes += 1,
            "held_bytes 65 but messages add up to 64",
        ),
    ];
    for (setup, corrupt, expected) in cases {
        let (mut s, a, b) = setup();
        s.check_invariants().unwrap();
        corrupt(&mut s, a, b);
        assert_eq!(s.check_invariants(), Err(expected.to_string()));
    }
}

// docs/semantics.md#idle-expiry: an expiring subscription reports every message it still held, queued or in flight.
#[test]
fn drain_reports_everything_it_held() {
    let (mut s, _, _) = busy_queue();
    assert_eq!(s.drain(), 4);
    assert_eq!((s.queued(), s.in_flight(), s.held_bytes()), (0, 0, 0));
    assert!(s.member_infos().iter().all(|m| m.in_flight == 0));
    assert_eq!(s.member_infos().len(), 2, "members stay until they leave");
    s.check_invariants().unwrap();
}

#[cfg(feature = "planted-bugs")]
mod planted_bugs {
    use super::*;
    use crate::core::planted::plant;

    fn with<T>(bug: PlantedBug, f: impl FnOnce() -> T) -> T {
        plant(Some(bug));
        let result = f();
        plant(None);
        result
    }

    // Invariant 1 broken in exactly the way the simulations look for: a second active member.
    #[test]
    fn two_active_members_activates_the_second_joiner_only() {
        let mut s = sub(Mode::Singleton);
        let spec = s.spec().clone();
        with(PlantedBug::TwoActiveMembers, || {
            for _ in 0..3 {
                s.join(&spec, MemberOptions::default()).unwrap();
            }
        });
        assert_eq!(s.active_members().collect::<Vec<_>>(), [1, 2]);
        assert_eq!(
            s.check_invariants(),
            Err("2 active members: [1, 2]".to_string())
        );
    }

    // Invariant 2 broken: the newest standby is promoted over the earliest-joined one.
    #[test]
    fn promote_newest_standby_skips_the_line() {
        let mut s = sub(Mode::Singleton);
        let ids: Vec<MemberId> = (0..3).map(|_| join(&mut s).0).collect();
        let fx = with(PlantedBug::PromoteNewestStandby, || s.leave(ids[0], NOW));
        assert_eq!(confirms(&fx), [(ids[2], 2)]);
        assert_eq!(
            s.check_invariants(),
            Err("active member 3 is not the first in line, 2".to_string())
        );
    }

    // The ack fence broken: a member that does not hold a message releases it.
    #[test]
    fn ack_ignores_fence_lets_another_member_release_a_message() {
        let mut s = sub(Mode::Queue);
        let (a, _) = join(&mut s);
        let (b, _) = join(&mut s);
        let _ = s.enqueue(msg(1));
        assert_eq!(s.in_flight_ids().collect::<Vec<_>>(), [(1, a)]);
        with(PlantedBug::AckIgnoresFence, || s.ack(Some(b), 1)).unwrap();
        assert_eq!(
            (s.in_flight(), s.counters().acked, s.counters().stale_acks),
            (0, 1, 0)
        );
        s.check_invariants().unwrap();
    }

    // Invariant 3 broken while the books stay balanced: only a delivery checker can notice.
    #[test]
    fn forget_redelivery_loses_the_message_but_keeps_the_books() {
        let mut s = sub(Mode::Singleton);
        let (a, _) = join(&mut s);
        let _ = s.enqueue(msg(1));
        let fx = with(PlantedBug::ForgetRedelivery, || s.leave(a, NOW));
        assert_eq!(fx, []);
        assert_eq!((s.queued(), s.in_flight(), s.held_bytes()), (0, 0, 0));
        s.check_invariants().unwrap();
    }
}

// README ("Limits"): the memory budget charges a subscription 2 KiB plus, per pattern, twice
// its length and 560 bytes (its text in the settings and its routing-index entry); one of 64
// patterns of 254 bytes is charged 69 KiB. The tests of what the index really holds
// (`tests/index.rs`) check that the charge covers it.
#[test]
fn the_budget_charges_what_the_readme_says() {
    let pattern = |n: usize| Pattern::parse(&format!("p{n:03}.{}", "x".repeat(249))).unwrap();
    assert_eq!(pattern(0).as_str().len(), 254);
    assert_eq!(pattern_cost(&pattern(0)), 2 * 254 + 560);
    assert_eq!(pattern_cost(&Pattern::parse("a.*").unwrap()), 2 * 3 + 560);
    let spec = SubscriptionSpec {
        patterns: (0..64).map(pattern).collect(),
        ..busy_queue().0.spec().clone()
    };
    let cost = subscription_cost(&spec);
    assert_eq!(cost, 2048 + 64 * (2 * 254 + 560));
    assert_eq!(cost.div_ceil(1024), 69, "{cost} bytes");
}
