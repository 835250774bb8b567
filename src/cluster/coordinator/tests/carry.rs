//! What rides with a promotion: the attempts a leaving gateway gave back
//! (docs/semantics.md#redelivery-order), and the take-over mark of a dead gateway's member.

use super::*;

// docs/semantics.md#redelivery-order: a message's attempt counts every delivery. What the leaving active member's gateway
// gave back, with the attempts their next deliveries must carry, rides in the promoting write,
// reaches the promoted member's activation, and the promotion after clears it.
#[test]
fn a_clean_close_carries_the_given_back_attempts_to_the_next_active_member() {
    let v = SubValue {
        line: vec![uid(7, 1), uid(7, 2)],
        active: Some(uid(7, 1)),
        epoch: 3,
        carry: Vec::new(),
        promoted: false,
        took_over: false,
        meta: Vec::new(),
        prio: Vec::new(),
        hand_over: 0,
    };
    let mut c = members_1_and_2_in(&v);
    c.member_left_carrying(ms(5), "jobs", 1, vec![(41, 3), (42, 2)]);
    let (cmds, _) = drain(&mut c);
    let next = value(&cmds[0]);
    assert_eq!(
        (next.active, next.carry.clone()),
        (Some(uid(7, 2)), vec![(41, 3), (42, 2)])
    );
    written(&mut c, ms(6), &cmds[0], 10);
    let (_, effects) = drain(&mut c);
    assert_eq!(
        effects,
        vec![Effect::Activate {
            subscription: "jobs".into(),
            member: 2,
            epoch: 9,
            carry: vec![(41, 3), (42, 2)],
            promoted: true,
            took_over: false,
        }]
    );
    c.member_joined(ms(7), "jobs", 3);
    let (cmds, _) = drain(&mut c);
    assert_eq!(
        value(&cmds[0]).carry,
        vec![(41, 3), (42, 2)],
        "kept while 2 leads"
    );
    written(&mut c, ms(8), &cmds[0], 11);
    c.member_left(ms(9), "jobs", 2);
    let (cmds, _) = drain(&mut c);
    let next = value(&cmds[0]);
    assert_eq!(
        (next.active, next.carry),
        (Some(uid(7, 3)), vec![]),
        "cleared by the next promotion"
    );
}

// The bridge gives its carry to the first member of the ones leaving together. When a standby
// of this gateway leaves just before the active one, the carry lands on the standby's leave,
// whose write keeps the active member: the carry must still ride with the promotion that
// follows the active member's leave (it used to be spent by the first write, and the promoting
// one carried nothing).
#[test]
fn a_carry_given_with_a_standbys_leave_rides_with_the_promotion_that_follows() {
    let v = SubValue {
        line: vec![uid(7, 1), uid(7, 2), uid(9, 5)],
        active: Some(uid(7, 1)),
        epoch: 3,
        carry: Vec::new(),
        promoted: false,
        took_over: false,
        meta: Vec::new(),
        prio: Vec::new(),
        hand_over: 0,
    };
    let mut c = members_1_and_2_in(&v);
    // Leaving together: 2 (a standby) first, with the carry, then 1 (the active member).
    c.member_left_carrying(ms(5), "jobs", 2, vec![(41, 3), (42, 2)]);
    c.member_left_carrying(ms(5), "jobs", 1, Vec::new());
    let mut rev = 10;
    let mut promoted = None;
    for _ in 0..4 {
        let (cmds, _) = drain(&mut c);
        for cmd in cmds {
            let next = value(&cmd);
            written(&mut c, ms(6), &cmd, rev);
            rev += 1;
            if next.active == Some(uid(9, 5)) {
                promoted = Some(next.carry.clone());
            }
        }
    }
    assert_eq!(
        promoted,
        Some(vec![(41, 3), (42, 2)]),
        "the write promoting 9/5 carries what 7 gave back"
    );
}

// A promoting write answered "unavailable" may have landed: when the watch shows it, with the
// carry and the new active member, the carry is spent. It used to stay until a confirmed
// promotion, and ride with the next one, much later: that member's gateway would hold every
// new message for a given-back message long settled, and name it a stale attempt if it came.
#[test]
fn a_carry_whose_promotion_landed_unconfirmed_rides_with_no_later_one() {
    let v = SubValue {
        line: vec![uid(7, 1), uid(7, 2), uid(9, 5)],
        active: Some(uid(7, 1)),
        epoch: 3,
        carry: Vec::new(),
        promoted: false,
        took_over: false,
        meta: Vec::new(),
        prio: Vec::new(),
        hand_over: 0,
    };
    let mut c = members_1_and_2_in(&v);
    c.member_left_carrying(ms(5), "jobs", 1, vec![(41, 3)]);
    let (cmds, _) = drain(&mut c);
    assert_eq!(cmds.len(), 1);
    let promoting = value(&cmds[0]);
    assert_eq!(
        (promoting.active, promoting.carry.clone()),
        (Some(uid(7, 2)), vec![(41, 3)])
    );
    c.write_result(
        ms(6),
        cmds[0].id,
        Err(KvError::Unavailable("timed out".into())),
    );
    see_line(&mut c, ms(7), &promoting, 10);
    // Past the retry: the line already shows what this gateway wanted.
    c.tick(ms(100));
    let (cmds, _) = drain(&mut c);
    assert!(
        cmds.iter().all(|cmd| cmd.key != "sub.jobs"),
        "nothing to write: {cmds:?}"
    );
    assert!(!c.is_fenced());
    c.member_left(ms(101), "jobs", 2);
    let (cmds, _) = drain(&mut c);
    let next = cmds
        .iter()
        .find(|cmd| cmd.key == "sub.jobs")
        .map(value)
        .expect("the write promoting 9/5");
    assert_eq!(next.active, Some(uid(9, 5)));
    assert_eq!(
        next.carry,
        Vec::new(),
        "the carry was spent by 7/2's promotion"
    );
}

// README "A gateway that dies": here the member a take-over makes active (7:1) left this
// gateway before the take-over's value even reached it: it was never activated, nothing was
// counted, pulled or given back, so JetStream still owes everything the dead gateway 5 held,
// unnamed. The member promoted in its place (7:2) is activated; the promotion is this gateway's
// own (7:1 left), not a take-over, so it is not marked and its gateway does not count what
// JetStream owes (README "Not yet": those messages come in JetStream's order).
#[test]
fn a_take_over_whose_member_left_before_its_activation_promotes_the_next_member() {
    let before = SubValue {
        line: vec![uid(5, 4), uid(7, 1), uid(7, 2)],
        active: Some(uid(5, 4)),
        epoch: 3,
        carry: Vec::new(),
        promoted: false,
        took_over: false,
        meta: Vec::new(),
        prio: Vec::new(),
        hand_over: 0,
    };
    let mut c = members_1_and_2_in(&before);
    // 7:1's stream closes; this gateway's write (removing it) races gateway 8's, which took
    // over from dead gateway 5 and won.
    c.member_left(ms(5), "jobs", 1);
    let (cmds, _) = drain(&mut c);
    assert!(matches!(cmds[0].op, Op::Update(_, 9)), "{cmds:?}");
    let taken_over = SubValue {
        line: vec![uid(7, 1), uid(7, 2)],
        active: Some(uid(7, 1)),
        epoch: 9,
        carry: Vec::new(),
        promoted: true,
        took_over: true,
        meta: Vec::new(),
        prio: Vec::new(),
        hand_over: 0,
    };
    see_line(&mut c, ms(6), &taken_over, 10);
    c.write_result(
        ms(6),
        cmds[0].id,
        Err(KvError::WrongRevision {
            expected: 9,
            current: 10,
        }),
    );
    let (cmds, effects) = drain(&mut c);
    assert!(
        !effects
            .iter()
            .any(|e| matches!(e, Effect::Activate { member: 1, .. })),
        "7:1 left before: never activated here: {effects:?}"
    );
    assert_eq!(cmds.len(), 1, "{cmds:?}");
    let next = value(&cmds[0]);
    assert_eq!((next.active, next.epoch), (Some(uid(7, 2)), 10));
    c.write_result(ms(7), cmds[0].id, Ok(11));
    let (_, effects) = drain(&mut c);
    let activation = effects
        .iter()
        .find(|e| matches!(e, Effect::Activate { member: 2, .. }));
    assert!(
        matches!(
            activation,
            Some(Effect::Activate {
                epoch: 10,
                promoted: true,
                took_over: false,
                ..
            })
        ),
        "7:2 is promoted by this gateway after its own member left ({activation:?})"
    );
}

// README "A gateway that dies": the member a take-over made active is activated with the
// `took_over` mark, also when its gateway sees the value only after a later write (a lagging
// watch keeps only a key's newest value): a write that keeps the active member keeps the mark.
#[test]
fn a_join_appended_after_a_take_over_keeps_it_marked() {
    let mut c = leased();
    c.backplane_changed(ms(2), "lease.8", Some(b"{}"), 2);
    let taken_over = SubValue {
        line: vec![uid(8, 1)],
        active: Some(uid(8, 1)),
        epoch: 9,
        carry: Vec::new(),
        promoted: true,
        took_over: true,
        meta: Vec::new(),
        prio: Vec::new(),
        hand_over: 0,
    };
    see_line(&mut c, ms(3), &taken_over, 10);
    c.member_joined(ms(4), "jobs", 1);
    let (cmds, _) = drain(&mut c);
    assert_eq!(cmds.len(), 1, "{cmds:?}");
    let next = value(&cmds[0]);
    assert_eq!(next.line, vec![uid(8, 1), uid(7, 1)]);
    assert_eq!(next.active, Some(uid(8, 1)));
    assert!(
        next.took_over,
        "8:1's gateway may activate it from this value"
    );
}

// A carry is for the promotion that follows this gateway's member. One given once the line
// shows another gateway's member active (this gateway was taken for dead and others promoted
// past it, as after a pause past its lease) is stale: riding with a later promotion, it named
// a message's attempt below one a member had already seen (the real-gateway campaign's seed
// 500272: attempt 1 after attempt 2).
#[test]
fn a_carry_given_after_another_gateway_promoted_past_this_one_rides_with_no_promotion() {
    let v = SubValue {
        line: vec![uid(7, 1), uid(7, 2), uid(9, 5)],
        active: Some(uid(9, 5)),
        epoch: 8,
        promoted: true,
        took_over: true,
        ..SubValue::default()
    };
    let mut c = members_1_and_2_in(&v);
    c.member_left_carrying(ms(5), "jobs", 1, vec![(41, 1)]);
    let (cmds, _) = drain(&mut c);
    let leave = value(&cmds[0]);
    assert_eq!(leave.line, vec![uid(7, 2), uid(9, 5)]);
    assert_eq!(
        leave.carry,
        Vec::new(),
        "a standby's leave carries nothing here"
    );
    written(&mut c, ms(6), &cmds[0], 10);
    drain(&mut c);
    // 9/5 goes; this gateway's 7/2 is promoted, with nothing carried.
    let gone = SubValue {
        line: vec![uid(7, 2)],
        active: None,
        ..v.clone()
    };
    see_line(&mut c, ms(7), &gone, 11);
    let (cmds, _) = drain(&mut c);
    let promoting = cmds
        .iter()
        .find(|cmd| cmd.key == "sub.jobs")
        .map(value)
        .expect("the write promoting 7/2");
    assert_eq!(promoting.active, Some(uid(7, 2)));
    assert_eq!(promoting.carry, Vec::new(), "no stale carry");
}

// Also when this gateway gave its carry while its view still showed its own member active, and
// the watch then shows another gateway's promotion past it, without that carry: the promotion
// it was for happened without it.
#[test]
fn a_carry_is_spent_by_another_gateways_promotion_past_this_ones_member() {
    let v = SubValue {
        line: vec![uid(7, 1), uid(7, 2), uid(9, 5)],
        active: Some(uid(7, 1)),
        epoch: 3,
        ..SubValue::default()
    };
    let mut c = members_1_and_2_in(&v);
    c.member_left_carrying(ms(5), "jobs", 1, vec![(41, 3)]);
    let (cmds, _) = drain(&mut c);
    assert_eq!(
        value(&cmds[0]).carry,
        vec![(41, 3)],
        "this gateway's promotion carries it"
    );
    c.write_result(
        ms(6),
        cmds[0].id,
        Err(KvError::WrongRevision {
            expected: 9,
            current: 10,
        }),
    );
    // Another gateway's write came first: 9/5 promoted past 7/1, nothing carried.
    let theirs = SubValue {
        line: vec![uid(7, 2), uid(9, 5)],
        active: Some(uid(9, 5)),
        epoch: 10,
        promoted: true,
        took_over: true,
        ..v.clone()
    };
    see_line(&mut c, ms(6), &theirs, 10);
    let (cmds, _) = drain(&mut c);
    assert!(
        cmds.iter().all(|cmd| cmd.key != "sub.jobs"),
        "the carry is not written onto 9/5's value: {cmds:?}"
    );
    let gone = SubValue {
        line: vec![uid(7, 2)],
        active: None,
        ..theirs.clone()
    };
    see_line(&mut c, ms(7), &gone, 11);
    let (cmds, _) = drain(&mut c);
    let promoting = cmds
        .iter()
        .find(|cmd| cmd.key == "sub.jobs")
        .map(value)
        .expect("the write promoting 7/2");
    assert_eq!(promoting.active, Some(uid(7, 2)));
    assert_eq!(promoting.carry, Vec::new(), "spent by 9/5's promotion");
}
