//! Tests of the tools that test the core: the invariant checker must reject every kind of broken
//! bookkeeping it claims to check, each planted bug must break only what it claims to, and
//! `drain` must account for everything it throws away.

use super::*;

/// A queue subscription whose member `a` (window 2) holds message 1 while 2 and 3 wait; `b` has
/// a full window of its own (message 2).
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

fn broken(mut s: Subscription, corrupt: impl FnOnce(&mut Subscription)) -> String {
    corrupt(&mut s);
    s.check_invariants().expect_err("corruption went unnoticed")
}

#[test]
fn checker_rejects_each_kind_of_broken_bookkeeping() {
    let (s, _, b) = two_singleton_members();
    assert_eq!(
        broken(s, |s| member(s, b).epoch = Some(9)),
        "2 active members: [1, 2]"
    );
    let (s, a, _) = two_singleton_members();
    assert_eq!(
        broken(s, |s| member(s, a).epoch = None),
        "members but no active member"
    );
    let (s, a, b) = two_singleton_members();
    assert_eq!(
        broken(s, |s| {
            member(s, a).epoch = None;
            member(s, b).epoch = Some(9);
        }),
        "active member 2 is not the earliest-joined 1"
    );
    let (s, a, _) = busy_queue();
    assert_eq!(
        broken(s, |s| member(s, a).epoch = None),
        "a non-singleton member is not active"
    );
    let (s, _, b) = busy_queue();
    assert_eq!(
        broken(s, |s| member(s, b).in_flight.push(1)),
        "member 2 lists 1 it does not hold"
    );
    let (s, a, _) = busy_queue();
    assert_eq!(
        broken(s, |s| member(s, a).options.max_in_flight = 1),
        "member 1 is over its window"
    );
    let (s, a, _) = busy_queue();
    assert_eq!(
        broken(s, |s| member(s, a).in_flight.clear()),
        "an in-flight message has no holder"
    );
    let (s, _, _) = busy_queue();
    assert_eq!(
        broken(s, |s| s.queue.push_back(Pending {
            message: msg(1),
            attempt: 1
        })),
        "a message is both queued and in flight"
    );
    let (s, _, _) = busy_queue();
    assert_eq!(
        broken(s, |s| s.held_bytes += 1),
        "held_bytes 65 but messages add up to 64"
    );
}

// SPEC §6: an expiring subscription reports every message it still held, queued or in flight.
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
        assert!(s.check_invariants().is_err());
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
