//! The coordinator's priorities and step-downs, driven by hand
//! (docs/semantics.md#cluster-priority-and-hand-over).

use super::tests::{config, drain, leased, ms, see_line, uid, value, written};
use super::*;

/// A line of `members` (the first active, with `epoch`), with these priorities.
fn line(members: &[MemberUid], epoch: u64, prio: &[(MemberUid, u32)]) -> SubValue {
    SubValue {
        line: members.to_vec(),
        active: members.first().copied(),
        epoch,
        prio: prio.to_vec(),
        ..SubValue::default()
    }
}

/// Gateway 7, leased, whose member 1 joined with `priority` and is active in `v` (at
/// revision 20), its activation drained.
fn active_here(priority: u32, v: &SubValue) -> Coordinator {
    let mut c = leased();
    c.member_joined_with(ms(3), "jobs", 1, String::new(), priority);
    let (creates, _) = drain(&mut c);
    see_line(&mut c, ms(4), v, 20);
    c.write_result(ms(4), creates[0].id, Err(KvError::Exists { current: 20 }));
    let (_, effects) = drain(&mut c);
    assert!(
        effects
            .iter()
            .any(|e| matches!(e, Effect::Activate { member: 1, .. })),
        "{effects:?}"
    );
    c
}

#[test]
fn a_join_enters_behind_the_standbys_of_its_priority_or_higher_and_never_ahead_of_the_active() {
    let mut c = leased();
    let v = line(&[uid(9, 1), uid(9, 2), uid(9, 3)], 5, &[(uid(9, 2), 4)]);
    see_line(&mut c, ms(3), &v, 9);
    c.member_joined_with(ms(4), "jobs", 10, String::new(), 4);
    c.member_joined_with(ms(4), "jobs", 11, String::new(), 2);
    let (cmds, _) = drain(&mut c);
    assert_eq!(
        value(&cmds[0]).line,
        vec![uid(9, 1), uid(9, 2), uid(7, 10), uid(9, 3)],
        "one write at a time: 11 follows"
    );
    c.write_result(ms(5), cmds[0].id, Ok(10));
    let (cmds, _) = drain(&mut c);
    let next = value(&cmds[0]);
    // 10 behind 2 (its priority, joined earlier), 11 ahead of 3 (priority 0).
    assert_eq!(
        next.line,
        vec![uid(9, 1), uid(9, 2), uid(7, 10), uid(7, 11), uid(9, 3)]
    );
    assert_eq!(next.active, Some(uid(9, 1)), "no takeover by a join itself");
    assert_eq!(
        next.prio,
        vec![(uid(9, 2), 4), (uid(7, 10), 4), (uid(7, 11), 2)]
    );
}

#[test]
fn a_new_line_stands_in_priority_order_and_its_highest_becomes_active() {
    let mut c = leased();
    c.member_joined_with(ms(3), "jobs", 1, String::new(), 0);
    c.member_joined_with(ms(3), "jobs", 2, String::new(), 5);
    let (cmds, _) = drain(&mut c);
    assert_eq!(value(&cmds[0]).line, vec![uid(7, 1)]);
    written(&mut c, ms(4), &cmds[0], 5);
    let (cmds, _) = drain(&mut c);
    let next = value(&cmds[0]);
    assert_eq!(next.line, vec![uid(7, 2), uid(7, 1)]);
    assert_eq!((next.active, next.epoch), (Some(uid(7, 2)), 5));
}

#[test]
fn a_standby_that_outranks_the_active_member_makes_it_step_down_then_the_line_moves_once_it_yielded()
 {
    let v = line(&[uid(7, 1), uid(9, 2)], 20, &[]);
    let mut c = active_here(0, &v);
    // A member of priority 3 joins at gateway 9: the line holds it ahead of 2.
    let outranked = line(&[uid(7, 1), uid(9, 5), uid(9, 2)], 20, &[(uid(9, 5), 3)]);
    see_line(&mut c, ms(10), &outranked, 21);
    let (cmds, effects) = drain(&mut c);
    assert!(cmds.is_empty(), "nothing moves before it settled: {cmds:?}");
    assert_eq!(
        effects,
        vec![Effect::StepDown {
            subscription: "jobs".into(),
            member: 1,
            cause: StepDownCause::Priority,
        }]
    );
    c.member_yielded(ms(20), "jobs", 1, vec![(40, 2)]);
    let (cmds, _) = drain(&mut c);
    assert_eq!(cmds.len(), 1, "{cmds:?}");
    let moved = value(&cmds[0]);
    // Displaced by a takeover: first among its priority, ahead of 2.
    assert_eq!(moved.line, vec![uid(9, 5), uid(7, 1), uid(9, 2)]);
    assert_eq!(moved.active, Some(uid(9, 5)));
    assert_eq!(moved.epoch, 21, "the revision it replaces");
    assert!(moved.promoted && !moved.took_over);
    assert_eq!(moved.carry, vec![(40, 2)]);
    c.write_result(ms(21), cmds[0].id, Ok(22));
    let (_, effects) = drain(&mut c);
    assert_eq!(
        effects,
        vec![Effect::SteppedDown {
            subscription: "jobs".into(),
            member: 1,
            position: 1,
            epoch: 20,
        }],
        "on standby, still a member"
    );
}

#[test]
fn a_step_down_is_called_off_when_the_standby_that_outranked_it_leaves() {
    let v = line(&[uid(7, 1), uid(9, 5)], 20, &[(uid(9, 5), 3)]);
    let mut c = active_here(0, &v);
    // Activated above; the step-down follows from the same line.
    let (_, effects) = drain(&mut c);
    assert!(effects.is_empty());
    see_line(&mut c, ms(10), &line(&[uid(7, 1)], 20, &[]), 21);
    let (cmds, effects) = drain(&mut c);
    assert!(cmds.is_empty());
    assert_eq!(
        effects,
        vec![Effect::CallOffStepDown {
            subscription: "jobs".into(),
            member: 1,
        }]
    );
    // A late yield moves nothing: no successor.
    c.member_yielded(ms(11), "jobs", 1, Vec::new());
    let (cmds, _) = drain(&mut c);
    assert!(cmds.is_empty(), "{cmds:?}");
}

#[test]
fn a_hand_over_is_marked_in_the_line_and_the_member_goes_behind_the_standbys_of_its_priority() {
    // Asked at gateway 8, which holds no member.
    let mut asking = Coordinator::new(GatewayId(8), config(), ms(0));
    let (cmds, _) = drain(&mut asking);
    asking.write_result(ms(1), cmds[0].id, Ok(1));
    let v = line(
        &[uid(7, 1), uid(9, 2), uid(9, 3)],
        20,
        &[(uid(7, 1), 1), (uid(9, 2), 1)],
    );
    asking.backplane_changed(
        ms(2),
        "sub.jobs",
        Some(&serde_json::to_vec(&v).unwrap()),
        20,
    );
    assert_eq!(asking.hand_over(ms(3), "jobs"), Ok((uid(7, 1), 20)));
    let (cmds, _) = drain(&mut asking);
    let marked = value(&cmds[0]);
    assert_eq!(marked.hand_over, 20);
    assert_eq!(
        (marked.line.clone(), marked.active),
        (v.line.clone(), v.active)
    );

    // At gateway 7, holding the active member.
    let mut c = active_here(1, &v);
    see_line(&mut c, ms(10), &marked, 21);
    let (_, effects) = drain(&mut c);
    assert_eq!(
        effects,
        vec![Effect::StepDown {
            subscription: "jobs".into(),
            member: 1,
            cause: StepDownCause::HandOver,
        }]
    );
    c.member_yielded(ms(20), "jobs", 1, Vec::new());
    let (cmds, _) = drain(&mut c);
    let moved = value(&cmds[0]);
    assert_eq!(moved.line, vec![uid(9, 2), uid(7, 1), uid(9, 3)]);
    assert_eq!(
        (moved.active, moved.epoch, moved.hand_over),
        (Some(uid(9, 2)), 21, 0)
    );
}

#[test]
fn a_hand_over_is_refused_without_a_standby_of_the_active_members_priority_or_higher() {
    let mut c = leased();
    assert!(c.hand_over(ms(3), "jobs").is_err(), "no line");
    see_line(&mut c, ms(3), &line(&[uid(9, 1)], 5, &[]), 9);
    let Err(reason) = c.hand_over(ms(4), "jobs") else {
        panic!("no standby");
    };
    assert!(reason.contains("no standby"), "{reason}");
    see_line(
        &mut c,
        ms(5),
        &line(&[uid(9, 1), uid(9, 2)], 5, &[(uid(9, 1), 2)]),
        10,
    );
    let Err(reason) = c.hand_over(ms(6), "jobs") else {
        panic!("only a lower standby");
    };
    assert!(reason.contains("priority 2"), "{reason}");
    let (cmds, _) = drain(&mut c);
    assert!(cmds.is_empty(), "a refusal writes nothing: {cmds:?}");
}

#[test]
fn a_mark_whose_standbys_left_is_cleared_by_the_next_write() {
    let mut c = leased();
    let mut v = line(&[uid(9, 1), uid(9, 2)], 5, &[]);
    v.hand_over = 5;
    see_line(&mut c, ms(3), &v, 9);
    // A standby of the active member's priority joins: it may take over, the mark stays.
    c.member_joined(ms(4), "jobs", 3);
    let (cmds, _) = drain(&mut c);
    assert_eq!(value(&cmds[0]).hand_over, 5);
    // The standby that could take over left; only one of lower priority joins.
    let mut c = leased();
    let mut v = line(&[uid(9, 1)], 5, &[(uid(9, 1), 4)]);
    v.hand_over = 5;
    see_line(&mut c, ms(3), &v, 9);
    c.member_joined(ms(4), "jobs", 3);
    let (cmds, _) = drain(&mut c);
    assert_eq!(
        value(&cmds[0]).hand_over,
        0,
        "a standby of lower priority cannot take over"
    );
}

/// Gateway 8, leased, holding no member, whose copy of the line is `v` at revision 20.
fn asking(v: &SubValue) -> Coordinator {
    let mut c = Coordinator::new(GatewayId(8), config(), ms(0));
    let (cmds, _) = drain(&mut c);
    c.write_result(ms(1), cmds[0].id, Ok(1));
    c.backplane_changed(ms(2), "sub.jobs", Some(&serde_json::to_vec(v).unwrap()), 20);
    c
}

// A hand-over whose standby left before its mark was written is over: a standby joining here
// later is not taken as a reason to mark it again (an adversarial review's finding).
#[test]
fn a_hand_over_whose_standby_left_before_its_mark_is_not_marked_when_another_joins() {
    let v = line(&[uid(9, 1), uid(9, 2)], 20, &[]);
    // The mark's write loses to the standby's leave: retried, it finds no standby.
    let mut c = asking(&v);
    assert!(c.hand_over(ms(3), "jobs").is_ok());
    let (cmds, _) = drain(&mut c);
    assert_eq!(value(&cmds[0]).hand_over, 20);
    see_line(&mut c, ms(4), &line(&[uid(9, 1)], 20, &[]), 21);
    c.write_result(
        ms(5),
        cmds[0].id,
        Err(KvError::WrongRevision {
            expected: 20,
            current: 21,
        }),
    );
    let (cmds, _) = drain(&mut c);
    assert!(cmds.is_empty(), "nothing to mark: {cmds:?}");
    c.member_joined(ms(6), "jobs", 5);
    let (cmds, _) = drain(&mut c);
    let joined = value(&cmds[0]);
    assert_eq!(joined.line, vec![uid(9, 1), uid(8, 5)]);
    assert_eq!(joined.hand_over, 0, "the refused hand-over is not marked");

    // Answered refused (the shell's waiter) while the mark's write waits: withdrawn.
    let mut c = asking(&v);
    assert!(c.hand_over(ms(3), "jobs").is_ok());
    let (cmds, _) = drain(&mut c);
    see_line(&mut c, ms(4), &line(&[uid(9, 1)], 20, &[]), 21);
    c.withdraw_hand_over("jobs", 20);
    c.member_joined(ms(5), "jobs", 5);
    c.write_result(
        ms(6),
        cmds[0].id,
        Err(KvError::WrongRevision {
            expected: 20,
            current: 21,
        }),
    );
    let (cmds, _) = drain(&mut c);
    assert_eq!(value(&cmds[0]).hand_over, 0, "withdrawn: {cmds:?}");
}

// docs/semantics.md#cluster-lease-lapse, from cluster campaign seed 4079 (check (j), found by a
// review): a member that yielded
// (its step-down settled) just before its gateway lapsed. While lapsed, the watch shows the line
// move past it and then another gateway promote it again (its successor left). The lapsed branch
// of `local_effects` skips every transition, so the member keeps `activated`, `stepping` and
// `yielded` from the old step-down. Once the lease is renewed, the coordinator never emits the
// Activate for the new epoch (it thinks the member is active already) and calls off a step-down
// that was settled long ago: the line names member 1 active at epoch 22, its gateway never
// activates it (nothing delivered, nobody else promoted), and a later step-down is taken as
// settled at once from the stale `yielded`.
#[test]
fn a_member_promoted_again_while_its_gateway_was_lapsed_is_activated_once_renewed() {
    let v = line(&[uid(7, 1), uid(9, 2)], 20, &[]);
    let mut c = active_here(0, &v);
    let outranked = line(&[uid(7, 1), uid(9, 5), uid(9, 2)], 20, &[(uid(9, 5), 3)]);
    see_line(&mut c, ms(10), &outranked, 21);
    drain(&mut c);
    c.member_yielded(ms(20), "jobs", 1, Vec::new());
    let (cmds, _) = drain(&mut c);
    assert_eq!(cmds.len(), 1, "{cmds:?}");
    let moved_write = cmds[0].id;
    let moved = value(&cmds[0]);
    // The renewal at 300 ms goes unanswered for now: the lease (valid until 900) lapses.
    c.tick(ms(300));
    let (cmds, _) = drain(&mut c);
    let renewal = cmds
        .iter()
        .find(|c| c.key == "lease.7")
        .expect("a renewal")
        .id;
    c.tick(ms(900));
    assert!(c.is_lapsed());
    // While lapsed: its write lands, the watch shows it, then 9/5 leaves and gateway 9 promotes
    // member 1 again (epoch 22).
    c.write_result(ms(950), moved_write, Ok(22));
    see_line(&mut c, ms(950), &moved, 22);
    let again = SubValue {
        promoted: true,
        ..line(&[uid(7, 1), uid(9, 2)], 22, &[])
    };
    see_line(&mut c, ms(1_000), &again, 25);
    let (_, effects) = drain(&mut c);
    assert!(effects.is_empty(), "nothing while lapsed: {effects:?}");
    // The renewal sent at 300 ms is confirmed: valid until 1,200 ms.
    c.write_result(ms(1_100), renewal, Ok(30));
    assert!(!c.is_lapsed() && c.may_act(ms(1_100)));
    let (first, mut effects) = drain(&mut c);
    // Seconds more, every renewal answered, the line unchanged: still never activated.
    let mut rev = 30;
    for cmd in first {
        assert_eq!(cmd.key, "lease.7", "{cmd:?}");
        rev += 1;
        c.write_result(ms(1_100), cmd.id, Ok(rev));
    }
    let mut t = ms(1_100);
    while t < ms(6_000) {
        t += ms(50);
        c.tick(t);
        let (cmds, more) = drain(&mut c);
        effects.extend(more);
        for cmd in cmds {
            assert_eq!(cmd.key, "lease.7", "{cmd:?}");
            rev += 1;
            c.write_result(t, cmd.id, Ok(rev));
        }
    }
    assert!(
        effects.iter().any(|e| matches!(
            e,
            Effect::Activate {
                member: 1,
                epoch: 22,
                ..
            }
        )),
        "member 1 is the line's active member at epoch 22 but is never activated: {effects:?}"
    );
}
