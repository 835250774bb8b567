//! The coordinator alone, driven by hand: a single gateway over a hand-fed watch.

use std::time::Duration;

use super::*;

pub(super) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub(super) fn config() -> Config {
    Config {
        lease: ms(900),
        max_drift_percent: 10,
        margin: ms(50),
        retry: ms(50),
        lapse_patience: ms(2_000),
    }
}

pub(super) fn drain(c: &mut Coordinator) -> (Vec<Command>, Vec<Effect>) {
    let mut cmds = Vec::new();
    while let Some(x) = c.poll_command() {
        cmds.push(x);
    }
    let mut effects = Vec::new();
    while let Some(x) = c.poll_effect() {
        // Answers the join (the shell's); its own test is below.
        if !matches!(x, Effect::InLine { .. }) {
            effects.push(x);
        }
    }
    (cmds, effects)
}

fn in_line(c: &mut Coordinator) -> Vec<u64> {
    let mut members = Vec::new();
    while let Some(x) = c.poll_effect() {
        if let Effect::InLine { member, .. } = x {
            members.push(member);
        }
    }
    members
}

// docs/semantics.md#cluster-join-order: a join is answered once its member is in the line, from
// the write's answer or the watch, whichever comes first, once.
#[test]
fn a_member_is_reported_in_the_line_once_a_value_holds_it() {
    let mut c = leased();
    c.member_joined(ms(3), "jobs", 1);
    let mut cmds = Vec::new();
    while let Some(x) = c.poll_command() {
        cmds.push(x);
    }
    assert!(in_line(&mut c).is_empty(), "not before the line holds it");
    c.write_result(ms(4), cmds[0].id, Ok(5));
    assert_eq!(in_line(&mut c), vec![1]);
    c.member_joined(ms(5), "jobs", 2);
    let v = SubValue {
        line: vec![uid(7, 1), uid(7, 2)],
        active: Some(uid(7, 1)),
        epoch: 5,
        carry: Vec::new(),
        promoted: false,
        took_over: false,
        meta: Vec::new(),
        prio: Vec::new(),
        hand_over: 0,
    };
    see_line(&mut c, ms(6), &v, 9);
    assert_eq!(in_line(&mut c), vec![2], "member 1 is not reported again");
}

/// A gateway whose lease create succeeded at `t=0`, with revision 1.
pub(super) fn leased() -> Coordinator {
    let mut c = Coordinator::new(GatewayId(7), config(), ms(0));
    let (cmds, _) = drain(&mut c);
    assert_eq!(cmds.len(), 1);
    assert_eq!(cmds[0].key, "lease.7");
    assert!(matches!(cmds[0].op, Op::Create(_)));
    c.write_result(ms(1), cmds[0].id, Ok(1));
    c.backplane_changed(ms(2), "lease.7", Some(b"{}"), 1);
    c
}

/// Command `cmd` written at revision `rev`: its answer, then the watch delivering it (a
/// promotion waits for the watch to deliver what it replaces).
pub(super) fn written(c: &mut Coordinator, at: Duration, cmd: &Command, rev: Revision) {
    c.write_result(at, cmd.id, Ok(rev));
    let value = match &cmd.op {
        Op::Create(b) | Op::Update(b, _) => Some(b.clone()),
        Op::Delete(_) => None,
    };
    c.backplane_changed(at, &cmd.key, value.as_deref(), rev);
}

pub(super) fn value(cmd: &Command) -> SubValue {
    match &cmd.op {
        Op::Create(b) | Op::Update(b, _) => serde_json::from_slice(b).unwrap(),
        Op::Delete(_) => panic!("not a write of a value"),
    }
}

/// The watch shows `line` as "jobs"'s value at `revision`.
pub(super) fn see_line(c: &mut Coordinator, at: Duration, line: &SubValue, revision: Revision) {
    c.backplane_changed(
        at,
        "sub.jobs",
        Some(&serde_json::to_vec(line).unwrap()),
        revision,
    );
}

/// A leased gateway whose members 1 and 2 (joined in that order) are in `line`, the value the
/// watch shows at revision 9 after this gateway's create lost the race.
fn members_1_and_2_in(line: &SubValue) -> Coordinator {
    let mut c = leased();
    c.member_joined(ms(3), "jobs", 1);
    c.member_joined(ms(3), "jobs", 2);
    let (creates, _) = drain(&mut c);
    see_line(&mut c, ms(4), line, 9);
    c.write_result(ms(4), creates[0].id, Err(KvError::Exists { current: 9 }));
    drain(&mut c);
    c
}

pub(super) fn uid(g: u64, m: u64) -> MemberUid {
    MemberUid {
        gateway: GatewayId(g),
        member: m,
    }
}

// docs/semantics.md#cluster-leases: the dead-gateway wait covers the lease stretched by the drift bound, both ways.
#[test]
fn dead_after_stretches_the_lease_by_the_drift_bound_and_adds_the_margin() {
    let wait = config().dead_after();
    assert_eq!(wait, ms(900 * 110 / 90 + 50));
}

// Epochs: the first activation's epoch is the revision of the value it replaced.
#[test]
fn first_join_creates_the_line_then_promotes_with_the_replaced_revision_as_epoch() {
    let mut c = leased();
    c.member_joined(ms(3), "jobs", 1);
    let (cmds, effects) = drain(&mut c);
    assert!(effects.is_empty(), "no confirmation before the line exists");
    assert_eq!(cmds.len(), 1);
    assert_eq!(value(&cmds[0]).line, vec![uid(7, 1)]);
    assert_eq!(value(&cmds[0]).active, None);
    written(&mut c, ms(4), &cmds[0], 5);
    let (cmds, _) = drain(&mut c);
    assert_eq!(cmds.len(), 1, "the promotion follows");
    assert!(matches!(cmds[0].op, Op::Update(_, 5)));
    let v = value(&cmds[0]);
    assert_eq!((v.active, v.epoch), (Some(uid(7, 1)), 5));
    written(&mut c, ms(5), &cmds[0], 6);
    let (_, effects) = drain(&mut c);
    assert_eq!(
        effects,
        vec![Effect::Activate {
            subscription: "jobs".into(),
            member: 1,
            epoch: 5,
            carry: Vec::new(),
            promoted: false,
            took_over: false,
        }]
    );
}

/// A leased gateway (t=0, revision 1) whose member 1 is active on "jobs" (epoch 5), its
/// renewals answered up to 5 ms.
fn active_member_1() -> Coordinator {
    let mut c = leased();
    c.member_joined(ms(3), "jobs", 1);
    let (cmds, _) = drain(&mut c);
    written(&mut c, ms(4), &cmds[0], 5);
    let (cmds, _) = drain(&mut c);
    written(&mut c, ms(5), &cmds[0], 6);
    let (_, effects) = drain(&mut c);
    assert!(matches!(effects[..], [Effect::Activate { member: 1, .. }]));
    c
}

// docs/semantics.md#cluster-lease-lapse: a gateway that cannot renew stops acting at its lease's
// end, measured from the send of the last renewal that succeeded; it keeps its members (it acts
// for none) while it tries to renew, and ends them once it has been lapsed for its patience.
#[test]
fn an_unrenewed_lease_lapses_at_send_time_plus_lease_and_ends_every_member_after_the_patience() {
    let mut c = active_member_1();
    // Renewals from now on never answer.
    c.tick(ms(300));
    let (cmds, _) = drain(&mut c);
    assert!(matches!(cmds[0].op, Op::Update(_, 1)), "renews at lease/3");
    assert_eq!(
        c.poll_timeout(),
        Some(ms(900)),
        "the lease ends 900 ms after the create was sent"
    );
    c.tick(ms(899));
    assert!(c.may_act(ms(899)) && !c.is_lapsed());
    c.tick(ms(900));
    assert!(!c.may_act(ms(900)), "acts for nobody past its lease");
    assert!(c.is_lapsed() && !c.is_fenced());
    let (_, effects) = drain(&mut c);
    assert!(effects.is_empty(), "its member is kept: {effects:?}");
    assert_eq!(c.poll_timeout(), Some(ms(900 + 2_000)), "the patience");
    c.tick(ms(2_899));
    assert!(!c.is_fenced());
    c.tick(ms(2_900));
    assert!(c.is_fenced());
    let (cmds, effects) = drain(&mut c);
    assert!(cmds.is_empty());
    assert_eq!(
        effects,
        vec![Effect::End {
            subscription: "jobs".into(),
            member: 1,
            status: EndStatus::Unavailable
        }]
    );
    assert_eq!(c.lapses(), (1, 0));
}

// docs/semantics.md#cluster-leases: with no lapse patience (the default), a gateway that cannot
// renew ends its members' streams at its lease's end, before any other gateway can promote.
#[test]
fn without_a_lapse_patience_an_unrenewed_lease_ends_every_member_at_its_end() {
    let mut c = Coordinator::new(
        GatewayId(7),
        Config {
            lapse_patience: Duration::ZERO,
            ..config()
        },
        ms(0),
    );
    let (cmds, _) = drain(&mut c);
    written(&mut c, ms(1), &cmds[0], 1);
    c.member_joined(ms(3), "jobs", 1);
    let (cmds, _) = drain(&mut c);
    written(&mut c, ms(4), &cmds[0], 5);
    let (cmds, _) = drain(&mut c);
    written(&mut c, ms(5), &cmds[0], 6);
    drain(&mut c);
    c.tick(ms(300));
    drain(&mut c);
    c.tick(ms(899));
    assert!(!c.is_fenced());
    c.tick(ms(900));
    assert!(c.is_fenced(), "ended at the lease's end");
    let (_, effects) = drain(&mut c);
    assert!(
        matches!(effects[..], [Effect::End { member: 1, .. }]),
        "{effects:?}"
    );
}

// docs/semantics.md#cluster-lease-lapse: a lapsed gateway's renewal confirmed (nobody deleted its
// lease: a deletion compares against the revision it replaced) lets it act for its members
// again, from that renewal's send time; nothing was ended, nothing activated again.
#[test]
fn a_lapsed_lease_renewed_keeps_every_member_and_acts_again() {
    let mut c = active_member_1();
    c.tick(ms(300));
    let (cmds, _) = drain(&mut c);
    let first = cmds[0].id;
    c.write_result(
        ms(550),
        first,
        Err(KvError::Unavailable("no responders".into())),
    );
    // Retried while the bucket elects its leader, each renewal followed by another when
    // unanswered for a sixth of the lease (the shell's bound): none answers.
    let mut t = ms(550);
    let mut last: Option<(RequestId, Duration)> = None;
    while t < ms(1_600) {
        t += ms(50);
        c.tick(t);
        if let Some((id, sent)) = last
            && t >= sent + ms(150)
        {
            c.write_slow(t, id);
        }
        let (cmds, effects) = drain(&mut c);
        assert!(effects.is_empty(), "{effects:?} at {t:?}");
        if let Some(cmd) = cmds.into_iter().find(|c| c.key == "lease.7") {
            assert!(matches!(cmd.op, Op::Update(_, 1)), "{cmd:?}");
            last = Some((cmd.id, t));
        }
    }
    assert!(c.is_lapsed() && !c.may_act(t));
    // The bucket has a leader again: the renewal in flight is confirmed.
    let (id, sent) = last.unwrap();
    assert!(sent + ms(900) > t + ms(5));
    c.write_result(t + ms(5), id, Ok(12));
    assert!(!c.is_lapsed());
    assert!(c.may_act(t + ms(5)), "acts for its member again");
    assert!(c.lease_valid_until().is_some_and(|u| u >= sent + ms(900)));
    let (cmds, effects) = drain(&mut c);
    assert!(
        effects.is_empty(),
        "no end, no second activation: {effects:?}"
    );
    assert!(cmds.is_empty(), "{cmds:?}");
    assert_eq!(c.lapses(), (1, 1));
    let at = c.poll_timeout().unwrap();
    c.tick(at);
    let (cmds, _) = drain(&mut c);
    assert!(
        matches!(cmds[0].op, Op::Update(_, 12)),
        "renews from the confirmed revision: {cmds:?}"
    );
}

// A renewal confirmed too late to make the lease valid again (sent more than a lease ago)
// clears the suspicion but not the lapse: the gateway still takes nobody for dead, and its
// timer is never due in the past (a past deadline would tick it without end).
#[test]
fn a_renewal_confirmed_too_late_leaves_the_lapse_and_no_timer_in_the_past() {
    let mut c = leased();
    c.backplane_changed(ms(10), "lease.8", Some(b"{}"), 2);
    c.tick(ms(300));
    let (cmds, _) = drain(&mut c);
    let old = cmds[0].id;
    c.write_slow(ms(450), old);
    drain(&mut c);
    c.tick(ms(1_300));
    assert!(c.is_lapsed());
    // The renewal sent at 300 ms is confirmed at 1,400 ms: valid until 1,200 ms, past.
    c.write_result(ms(1_400), old, Ok(5));
    assert!(c.is_lapsed());
    let next = c.poll_timeout().expect("a timer");
    assert!(next >= ms(1_400), "due in the past: {next:?}");
    c.tick(ms(1_400) + config().dead_after());
    let (cmds, _) = drain(&mut c);
    assert!(
        cmds.iter().all(|c| c.key != "lease.8"),
        "no deletion while lapsed: {cmds:?}"
    );
}

// docs/semantics.md#cluster-lease-lapse: a lapsed gateway whose lease another gateway deleted
// (the deletion came first) learns it from its renewal's refusal and ends its members: it never
// acts again.
#[test]
fn a_lapsed_lease_deleted_meanwhile_ends_every_member_at_the_refusal() {
    let mut c = active_member_1();
    c.tick(ms(300));
    let (cmds, _) = drain(&mut c);
    c.write_slow(ms(450), cmds[0].id);
    let (cmds, _) = drain(&mut c);
    c.tick(ms(1_000));
    assert!(c.is_lapsed());
    c.write_result(
        ms(1_200),
        cmds[0].id,
        Err(KvError::WrongRevision {
            expected: 1,
            current: 0,
        }),
    );
    assert!(c.is_fenced() && !c.may_act(ms(1_200)));
    let (_, effects) = drain(&mut c);
    assert!(matches!(effects[..], [Effect::End { member: 1, .. }]));
}

// docs/semantics.md#cluster-lease-lapse: a gateway whose own writes go unanswered (the bucket
// has no leader, for every gateway) does not count another gateway's silence meanwhile: it
// takes nobody for dead while they do, and the time they did not is left out of the wait. So a
// gateway that lapsed with it renews before anyone deletes its lease.
#[test]
fn another_gateways_silence_counts_only_while_this_gateways_writes_are_answered() {
    let mut c = leased();
    let mut rev = 100;
    c.backplane_changed(ms(10), "lease.8", Some(b"{}"), 2);
    let wait = config().dead_after();
    // The bucket stops answering at 250 ms: the renewal at 300 ms is unanswered.
    let cmds = tick_renewing(&mut c, ms(250), &mut rev);
    assert!(cmds.is_empty());
    c.tick(ms(300));
    let (cmds, _) = drain(&mut c);
    c.write_slow(ms(450), cmds[0].id);
    let mut t = ms(450);
    while t < ms(10) + wait * 2 {
        t += ms(50);
        c.tick(t);
        let (cmds, _) = drain(&mut c);
        assert!(
            cmds.iter().all(|c| c.key == "lease.7"),
            "no deletion while its own writes go unanswered: {cmds:?} at {t:?}"
        );
        for cmd in cmds {
            c.write_slow(t, cmd.id);
        }
    }
    assert!(c.is_lapsed());
    // Answered again: its renewal is confirmed; the time its writes went unanswered (from when
    // the renewal sent at 300 ms was found slow, at 450 ms) does not count in the other's
    // silence.
    let back = t + ms(1);
    let cmds = tick_renewing(&mut c, back, &mut rev);
    assert!(cmds.is_empty(), "{cmds:?}");
    assert!(!c.is_lapsed());
    let due = ms(10) + (back - ms(450)) + wait;
    assert!(due > back + wait / 2, "{due:?}");
    let mut t = back;
    while t < due - ms(1) {
        t = (t + ms(50)).min(due - ms(1));
        let cmds = tick_renewing(&mut c, t, &mut rev);
        assert!(
            cmds.is_empty(),
            "not before its silence, unanswered time not counted, reached the wait: {cmds:?} at {t:?}"
        );
    }
    let cmds = tick_renewing(&mut c, due, &mut rev);
    assert_eq!(
        cmds.iter()
            .map(|c| (c.key.as_str(), &c.op))
            .collect::<Vec<_>>(),
        vec![("lease.8", &Op::Delete(2))]
    );
}

// A clean close of the active member removes it and promotes the next in line, in one write.
#[test]
fn clean_close_of_the_active_member_promotes_the_next_in_line_in_one_write() {
    let mut c = leased();
    let v = SubValue {
        line: vec![uid(7, 1), uid(8, 4), uid(7, 2)],
        active: Some(uid(7, 1)),
        epoch: 3,
        carry: Vec::new(),
        promoted: false,
        took_over: false,
        meta: Vec::new(),
        prio: Vec::new(),
        hand_over: 0,
    };
    c.member_joined(ms(3), "jobs", 1);
    c.member_joined(ms(3), "jobs", 2);
    let (creates, _) = drain(&mut c);
    assert_eq!(creates.len(), 1);
    // Another gateway's view won: the create fails, the watch shows the line.
    see_line(&mut c, ms(4), &v, 9);
    c.write_result(ms(4), creates[0].id, Err(KvError::Exists { current: 9 }));
    let (cmds, effects) = drain(&mut c);
    assert!(cmds.is_empty(), "nothing to change: {cmds:?}");
    assert_eq!(
        effects,
        vec![
            Effect::Activate {
                subscription: "jobs".into(),
                member: 1,
                epoch: 3,
                carry: Vec::new(),
                promoted: false,
                took_over: false,
            },
            // Member 2 is told its place once: two members are ahead of it.
            Effect::Standby {
                subscription: "jobs".into(),
                member: 2,
                position: 2
            },
        ],
        "member 1 is confirmed, member 2 waits"
    );
    c.member_left(ms(5), "jobs", 1);
    let (cmds, effects) = drain(&mut c);
    assert!(effects.is_empty(), "no second notice: {effects:?}");
    assert_eq!(cmds.len(), 1);
    assert!(matches!(cmds[0].op, Op::Update(_, 9)));
    let next = value(&cmds[0]);
    assert_eq!(next.line, vec![uid(8, 4), uid(7, 2)]);
    assert_eq!((next.active, next.epoch), (Some(uid(8, 4)), 9));
    assert!(!next.took_over, "a clean close gives back what it held");
}

/// Runs `c` to `now`, answering its own lease renewals at once; returns the other commands.
fn tick_renewing(c: &mut Coordinator, now: Duration, rev: &mut u64) -> Vec<Command> {
    c.tick(now);
    let mut others = Vec::new();
    loop {
        let (cmds, _) = drain(c);
        if cmds.is_empty() {
            return others;
        }
        for cmd in cmds {
            if cmd.key == "lease.7" {
                *rev += 1;
                c.write_result(now, cmd.id, Ok(*rev));
            } else {
                others.push(cmd);
            }
        }
    }
}

// docs/semantics.md#cluster-leases: another gateway's lease is deleted (by compare-and-set on the revision seen) only once
// the drift-stretched wait has passed since its last observed renewal; only then are its members
// removed and the next member promoted.
#[test]
fn stale_lease_is_deleted_only_after_the_wait_then_its_members_make_way() {
    let mut c = leased();
    let mut rev = 100;
    c.backplane_changed(ms(10), "lease.8", Some(b"{}"), 2);
    c.member_joined(ms(10), "jobs", 1);
    let (creates, _) = drain(&mut c);
    let v = SubValue {
        line: vec![uid(8, 4), uid(7, 1)],
        active: Some(uid(8, 4)),
        epoch: 3,
        carry: Vec::new(),
        promoted: false,
        took_over: false,
        meta: Vec::new(),
        prio: Vec::new(),
        hand_over: 0,
    };
    see_line(&mut c, ms(11), &v, 9);
    c.write_result(ms(11), creates[0].id, Err(KvError::Exists { current: 9 }));
    let wait = config().dead_after();
    let mut t = ms(11);
    while t < ms(10) + wait - ms(1) {
        t += ms(50).min(ms(10) + wait - ms(1) - t);
        let cmds = tick_renewing(&mut c, t, &mut rev);
        assert!(
            cmds.is_empty(),
            "nothing before the wait ends: {cmds:?} at {t:?}"
        );
    }
    assert_eq!(c.poll_timeout(), Some(ms(10) + wait));
    let cmds = tick_renewing(&mut c, ms(10) + wait, &mut rev);
    assert_eq!(cmds.len(), 1);
    assert_eq!(
        (cmds[0].key.as_str(), &cmds[0].op),
        ("lease.8", &Op::Delete(2))
    );
    c.write_result(ms(10) + wait, cmds[0].id, Ok(rev + 1));
    let (cmds, _) = drain(&mut c);
    assert_eq!(cmds.len(), 1, "the dead gateway's member makes way");
    assert!(matches!(cmds[0].op, Op::Update(_, 9)));
    let next = value(&cmds[0]);
    assert_eq!(next.line, vec![uid(7, 1)]);
    assert_eq!((next.active, next.epoch), (Some(uid(7, 1)), 9));
    assert!(
        next.took_over,
        "taken over from a dead gateway's member: what it held comes back unnamed"
    );
}

// Bad input from the backplane never panics and changes nothing; it is counted.
#[test]
fn unparseable_backplane_entries_are_counted_and_ignored() {
    let mut c = leased();
    c.member_joined(ms(3), "jobs", 1);
    drain(&mut c);
    c.backplane_changed(ms(4), "sub.jobs", Some(b"not json"), 9);
    c.backplane_changed(ms(4), "lease.x", Some(b"{}"), 10);
    let (cmds, effects) = drain(&mut c);
    assert_eq!(c.bad_values(), 2);
    assert!(
        cmds.is_empty() && effects.is_empty(),
        "{cmds:?} {effects:?}"
    );
}

// Memory is bounded: a gateway keeps nothing per subscription for its local members once the
// last of them left. A client joining and leaving singletons under ever new ids must not grow
// the coordinator's local table (walked on every input) without bound.
#[test]
fn a_subscription_whose_local_members_all_left_is_forgotten_locally() {
    let mut c = leased();
    for n in 0..50u64 {
        let sub = format!("churn-{n}");
        c.member_joined(ms(3), &sub, n + 1);
        c.member_left(ms(3), &sub, n + 1);
        drain(&mut c);
    }
    assert_eq!(c.local.len(), 0, "{:?}", c.local.keys().collect::<Vec<_>>());
}

// Bounded state: the write that empties a subscription's line deletes its key (compare-and-set
// on the revision it replaces), and the gateway forgets the subscription. A later join creates
// it again, and its first epoch is still above every earlier one: revisions are bucket-wide.
#[test]
fn an_emptied_line_is_deleted_and_forgotten_and_epochs_still_rise_when_it_returns() {
    let mut c = leased();
    c.member_joined(ms(3), "jobs", 1);
    let (cmds, _) = drain(&mut c);
    written(&mut c, ms(4), &cmds[0], 5);
    let (cmds, _) = drain(&mut c);
    written(&mut c, ms(5), &cmds[0], 6);
    let (_, effects) = drain(&mut c);
    assert!(matches!(effects[..], [Effect::Activate { epoch: 5, .. }]));

    c.member_left(ms(6), "jobs", 1);
    let (cmds, _) = drain(&mut c);
    assert_eq!(cmds.len(), 1);
    assert_eq!(cmds[0].key, "sub.jobs");
    assert_eq!(
        cmds[0].op,
        Op::Delete(6),
        "deleted against the revision it replaces"
    );
    written(&mut c, ms(7), &cmds[0], 9);
    assert!(
        c.subs.is_empty(),
        "forgotten: {:?}",
        c.subs.keys().collect::<Vec<_>>()
    );
    // The deletion as the watch shows it changes nothing more.
    c.backplane_changed(ms(8), "sub.jobs", None, 9);
    let (cmds, _) = drain(&mut c);
    assert!(cmds.is_empty(), "{cmds:?}");

    c.member_joined(ms(9), "jobs", 2);
    let (cmds, _) = drain(&mut c);
    assert!(matches!(cmds[0].op, Op::Create(_)));
    written(&mut c, ms(10), &cmds[0], 12);
    let (cmds, _) = drain(&mut c);
    written(&mut c, ms(11), &cmds[0], 13);
    let (_, effects) = drain(&mut c);
    assert!(
        matches!(
            effects[..],
            [Effect::Activate {
                member: 2,
                epoch: 12,
                ..
            }]
        ),
        "{effects:?}"
    );
}

// No stall: a create refused because another gateway's line existed, when the watch already
// showed that line and then its deletion before the refusal came back. Nothing more of the key
// need ever come, so waiting for the watch to pass the refused revision would leave the local
// member out of every line (on standby, never promoted): the create is retried at once.
#[test]
fn a_create_refused_by_a_line_the_watch_already_saw_deleted_is_retried() {
    let mut c = leased();
    c.member_joined(ms(3), "jobs", 1);
    let (creates, _) = drain(&mut c);
    assert_eq!(creates.len(), 1);
    assert!(matches!(creates[0].op, Op::Create(_)));
    // Gateway 8's member came and went while our create was on its way.
    let theirs = SubValue {
        line: vec![uid(8, 4)],
        active: None,
        epoch: 0,
        carry: Vec::new(),
        promoted: false,
        took_over: false,
        meta: Vec::new(),
        prio: Vec::new(),
        hand_over: 0,
    };
    see_line(&mut c, ms(4), &theirs, 5);
    c.backplane_changed(ms(4), "sub.jobs", None, 6);
    c.write_result(ms(5), creates[0].id, Err(KvError::Exists { current: 5 }));
    let mut rev = 100;
    let mut retried = tick_renewing(&mut c, ms(5), &mut rev);
    let mut t = ms(5);
    while retried.is_empty() && t < ms(2000) {
        t += ms(50);
        retried = tick_renewing(&mut c, t, &mut rev);
    }
    assert!(!c.is_fenced(), "the lease was renewed throughout");
    assert!(
        matches!(&retried[..], [Command { key, op: Op::Create(_), .. }] if key == "sub.jobs"),
        "the local member's line is created again: {retried:?}"
    );
}

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

// The seam: a deletion may expire before a lagging watch delivers it. A compare-and-set that
// reports the key has no value is then the only news of it: the line is forgotten and the
// local member's line created again, rather than waiting for a revision that never comes.
#[test]
fn a_line_whose_deletion_expired_unseen_is_created_again_on_a_refusal_naming_no_value() {
    let mut c = leased();
    let theirs = SubValue {
        line: vec![uid(8, 4)],
        active: Some(uid(8, 4)),
        epoch: 3,
        carry: Vec::new(),
        promoted: false,
        took_over: false,
        meta: Vec::new(),
        prio: Vec::new(),
        hand_over: 0,
    };
    see_line(&mut c, ms(4), &theirs, 5);
    // The line emptied and its deletion expired while this watch lagged: it never arrives.
    c.member_joined(ms(6), "jobs", 1);
    let (cmds, _) = drain(&mut c);
    assert_eq!(cmds.len(), 1);
    assert!(matches!(cmds[0].op, Op::Update(_, 5)), "{:?}", cmds[0].op);
    c.write_result(
        ms(7),
        cmds[0].id,
        Err(KvError::WrongRevision {
            expected: 5,
            current: 0,
        }),
    );
    let (cmds, _) = drain(&mut c);
    assert!(
        matches!(&cmds[..], [Command { key, op: Op::Create(_), .. }] if key == "sub.jobs"),
        "the local member's line is created at once: {cmds:?}"
    );
    assert_eq!(value(&cmds[0]).line, vec![uid(7, 1)]);
    // A refusal naming a value is still waited out on the watch.
    let mut c = leased();
    see_line(&mut c, ms(4), &theirs, 5);
    c.member_joined(ms(6), "jobs", 1);
    let (cmds, _) = drain(&mut c);
    c.write_result(
        ms(7),
        cmds[0].id,
        Err(KvError::WrongRevision {
            expected: 5,
            current: 9,
        }),
    );
    let (cmds, _) = drain(&mut c);
    assert!(
        cmds.is_empty(),
        "waits for revision 9 on the watch: {cmds:?}"
    );
}

// The same for a dead gateway's lease whose deletion (by another gateway) expired unseen: the
// refusal of our own deletion counts it deleted, and its members make way.
#[test]
fn a_lease_whose_deletion_expired_unseen_counts_as_deleted_on_a_refusal_naming_no_value() {
    let mut c = leased();
    let mut rev = 100;
    c.backplane_changed(ms(10), "lease.8", Some(b"{}"), 2);
    let v = SubValue {
        line: vec![uid(8, 4), uid(7, 1)],
        active: Some(uid(8, 4)),
        epoch: 3,
        carry: Vec::new(),
        promoted: false,
        took_over: false,
        meta: Vec::new(),
        prio: Vec::new(),
        hand_over: 0,
    };
    c.member_joined(ms(10), "jobs", 1);
    let (creates, _) = drain(&mut c);
    see_line(&mut c, ms(11), &v, 9);
    c.write_result(ms(11), creates[0].id, Err(KvError::Exists { current: 9 }));
    let at = ms(10) + config().dead_after();
    let mut t = ms(11);
    while t < at {
        t = (t + ms(50)).min(at);
        if t < at {
            assert!(tick_renewing(&mut c, t, &mut rev).is_empty());
        }
    }
    let cmds = tick_renewing(&mut c, at, &mut rev);
    assert_eq!(
        (cmds[0].key.as_str(), &cmds[0].op),
        ("lease.8", &Op::Delete(2))
    );
    c.write_result(
        at,
        cmds[0].id,
        Err(KvError::WrongRevision {
            expected: 2,
            current: 0,
        }),
    );
    let (cmds, _) = drain(&mut c);
    assert_eq!(
        cmds.len(),
        1,
        "the dead gateway's member makes way: {cmds:?}"
    );
    let next = value(&cmds[0]);
    assert_eq!(next.line, vec![uid(7, 1)]);
    assert_eq!(next.active, Some(uid(7, 1)));
}

// Another gateway found this gateway's lease stale and deleted it, and this gateway's watch has
// not delivered that deletion yet: the renewal refused with no value is news of it. Only this
// gateway writes its lease a value, so it fences itself, as the deletion on the watch would make
// it, instead of retrying without a lease.
#[test]
fn a_renewal_refused_with_no_value_fences_the_gateway_whose_lease_was_deleted_unseen() {
    let mut c = leased();
    c.member_joined(ms(3), "jobs", 1);
    drain(&mut c);
    let at = c.poll_timeout().expect("a renewal is due");
    c.tick(at);
    let (cmds, _) = drain(&mut c);
    assert_eq!(
        (cmds.len(), cmds[0].key.as_str(), &cmds[0].op),
        (1, "lease.7", &Op::Update(Bytes::from_static(b"{}"), 1)),
        "{cmds:?}"
    );
    c.write_result(
        at,
        cmds[0].id,
        Err(KvError::WrongRevision {
            expected: 1,
            current: 0,
        }),
    );
    let (_, effects) = drain(&mut c);
    assert!(c.is_fenced(), "its lease is gone, yet it goes on renewing");
    assert!(c.was_leased());
    assert_eq!(
        effects,
        vec![Effect::End {
            subscription: "jobs".to_string(),
            member: 1,
            status: EndStatus::Unavailable,
        }]
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

// docs/semantics.md#cluster-leases "never two active members": an incarnation creates its lease once. A create whose
// answer was lost may have landed, been found stale and been deleted by another gateway; a
// second create would succeed over that deletion and lease a gateway the others count dead
// (they no longer respect its members). So an unconfirmed create fences the incarnation, and
// the shell starts a new one with a new id.
#[test]
fn an_unconfirmed_lease_create_fences_rather_than_creating_the_lease_again() {
    for refusal in [
        KvError::Unavailable("timed out".into()),
        KvError::Exists { current: 4 },
    ] {
        let mut c = Coordinator::new(GatewayId(7), config(), ms(0));
        c.member_joined(ms(0), "jobs", 1);
        let (cmds, _) = drain(&mut c);
        assert!(matches!(cmds[0].op, Op::Create(_)) && cmds[0].key == "lease.7");
        c.write_result(ms(250), cmds[0].id, Err(refusal.clone()));
        assert!(c.is_fenced(), "after {refusal:?}");
        assert!(
            !c.was_leased(),
            "the shell pauses before the next incarnation"
        );
        let (cmds, effects) = drain(&mut c);
        assert!(cmds.is_empty(), "no second create: {cmds:?}");
        assert!(
            effects
                .iter()
                .any(|e| matches!(e, Effect::End { member: 1, .. })),
            "its member is ended: {effects:?}"
        );
    }
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

/// A leased gateway whose member 1 joined "jobs" with `metadata` and is active at epoch 5, its
/// line at revision 6.
fn active_with(metadata: &str) -> Coordinator {
    let mut c = leased();
    c.member_joined_with(ms(3), "jobs", 1, metadata.to_string(), 0);
    let (cmds, _) = drain(&mut c);
    assert_eq!(value(&cmds[0]).meta_of(uid(7, 1)), metadata);
    written(&mut c, ms(4), &cmds[0], 5);
    let (cmds, _) = drain(&mut c);
    written(&mut c, ms(5), &cmds[0], 6);
    let (_, effects) = drain(&mut c);
    assert!(matches!(effects[..], [Effect::Activate { member: 1, .. }]));
    c
}

// docs/semantics.md#cluster-metadata: each member's metadata is written into the line by its
// own gateway; another gateway's members' metadata is kept as that gateway wrote it.
#[test]
fn each_gateway_writes_its_own_members_metadata_and_keeps_the_others() {
    let mut c = active_with("a:1");
    let theirs = SubValue {
        line: vec![uid(7, 1), uid(8, 4)],
        active: Some(uid(7, 1)),
        epoch: 5,
        carry: Vec::new(),
        promoted: false,
        took_over: false,
        meta: vec![(uid(7, 1), "a:1".into()), (uid(8, 4), "b:4".into())],
        prio: Vec::new(),
        hand_over: 0,
    };
    see_line(&mut c, ms(6), &theirs, 7);
    let (cmds, _) = drain(&mut c);
    assert!(cmds.is_empty(), "nothing to change: {cmds:?}");
    c.member_joined_with(ms(7), "jobs", 2, String::new(), 0);
    let (cmds, _) = drain(&mut c);
    let next = value(&cmds[0]);
    assert_eq!(next.line, vec![uid(7, 1), uid(8, 4), uid(7, 2)]);
    assert_eq!(
        next.meta,
        vec![(uid(7, 1), "a:1".into()), (uid(8, 4), "b:4".into())],
        "no entry for a member without metadata; gateway 8's kept"
    );
    // A value that lost this gateway's entry (another gateway's write) gets it back.
    let lost = SubValue {
        meta: vec![(uid(8, 4), "b:4".into())],
        ..next
    };
    c.write_result(ms(8), cmds[0].id, Err(KvError::Exists { current: 9 }));
    see_line(&mut c, ms(8), &lost, 9);
    let (cmds, _) = drain(&mut c);
    assert_eq!(value(&cmds[0]).meta_of(uid(7, 1)), "a:1", "{cmds:?}");
}

// docs/semantics.md#member-metadata: a proclamation is written into the line and answered once a
// value holds it; one for a member this gateway does not hold is not taken.
#[test]
fn a_proclamation_is_answered_once_the_line_holds_it() {
    let mut c = active_with("");
    assert_eq!(
        c.proclaim(ms(6), "jobs", 99, "x".into()),
        Proclaimed::NotHere
    );
    assert_eq!(
        c.proclaim(ms(6), "jobs", 1, "a:2".into()),
        Proclaimed::Taken
    );
    let (cmds, effects) = drain(&mut c);
    assert!(
        effects.is_empty(),
        "not before the line holds it: {effects:?}"
    );
    assert_eq!(cmds.len(), 1);
    let v = value(&cmds[0]);
    assert_eq!(
        (v.active, v.epoch),
        (Some(uid(7, 1)), 5),
        "leadership unchanged"
    );
    assert_eq!(v.active_meta(), "a:2");
    written(&mut c, ms(7), &cmds[0], 7);
    let (_, effects) = drain(&mut c);
    assert_eq!(
        effects,
        vec![Effect::Proclaimed {
            subscription: "jobs".into(),
            member: 1
        }]
    );
    // Proclaiming what the line holds already is answered without a write.
    assert_eq!(
        c.proclaim(ms(8), "jobs", 1, "a:2".into()),
        Proclaimed::Taken
    );
    let (cmds, effects) = drain(&mut c);
    assert!(cmds.is_empty(), "{cmds:?}");
    assert!(matches!(
        effects[..],
        [Effect::Proclaimed { member: 1, .. }]
    ));
}

// docs/semantics.md#cluster-metadata: a line holds at most MAX_LINE_METADATA bytes of metadata,
// counting what its members here have not written yet; a join or proclamation past it finds no
// room, a proclamation that does not grow always does.
#[test]
fn a_line_holds_at_most_max_line_metadata_bytes() {
    let mut c = active_with(&"a".repeat(1000));
    for member in 2..=64 {
        c.member_joined_with(ms(6), "jobs", member, "b".repeat(1024), 0);
    }
    let room = MAX_LINE_METADATA - 1000 - 63 * 1024;
    assert!(c.metadata_room("jobs", room));
    assert!(!c.metadata_room("jobs", room + 1));
    assert!(c.metadata_room("elsewhere", MAX_LINE_METADATA));
    assert_eq!(
        c.proclaim(ms(6), "jobs", 1, "a".repeat(1000 + room + 1)),
        Proclaimed::NoRoom
    );
    assert_eq!(
        c.proclaim(ms(6), "jobs", 1, "a".repeat(1000 + room)),
        Proclaimed::Taken
    );
    assert_eq!(
        c.proclaim(ms(6), "jobs", 2, "small".into()),
        Proclaimed::Taken
    );
    assert!(c.metadata_room("jobs", 1019));
}

// docs/semantics.md#cluster-metadata: joins at several gateways at once may pass
// MAX_LINE_METADATA together, each gateway checking its own copy; the value a gateway writes
// still never encodes to more than MAX_LINE_BYTES: its newest members that would pass it are
// left out and ended (LineFull), those already in the line stay.
#[test]
fn a_lines_value_never_passes_max_line_bytes() {
    let mut c = active_with("");
    // Another gateway's members carry metadata of control characters (six bytes each in
    // JSON): 80 of 1 KiB, past the bound on their own once escaped... but in the line already.
    let heavy = "\u{1}".repeat(1024);
    let theirs = SubValue {
        line: std::iter::once(uid(7, 1))
            .chain((1..=60).map(|m| uid(8, m)))
            .collect(),
        active: Some(uid(7, 1)),
        epoch: 5,
        carry: Vec::new(),
        promoted: false,
        took_over: false,
        meta: (1..=60).map(|m| (uid(8, m), heavy.clone())).collect(),
        prio: Vec::new(),
        hand_over: 0,
    };
    see_line(&mut c, ms(6), &theirs, 7);
    drain(&mut c);
    // This gateway's view said there was room for each (it checks raw bytes).
    for member in 2..=40 {
        c.member_joined_with(ms(7), "jobs", member, heavy.clone(), 0);
    }
    // Each write succeeds; the next one adds who is left.
    let mut effects = Vec::new();
    let mut next = None;
    for revision in 8..100 {
        let (cmds, more) = drain(&mut c);
        effects.extend(more);
        let Some(cmd) = cmds.last() else { break };
        let Op::Update(bytes, _) = &cmd.op else {
            panic!("{cmd:?}")
        };
        assert!(
            bytes.len() <= MAX_LINE_BYTES,
            "{} bytes written",
            bytes.len()
        );
        next = Some(value(cmd));
        written(&mut c, ms(8), cmd, revision);
    }
    let next = next.expect("a write of the line");
    let ended: Vec<u64> = effects
        .iter()
        .filter_map(|e| match e {
            Effect::End {
                member,
                status: EndStatus::LineFull,
                ..
            } => Some(*member),
            _ => None,
        })
        .collect();
    assert!(!ended.is_empty(), "some joins had to be left out");
    for member in &ended {
        assert!(!next.line.contains(&uid(7, *member)), "{member} left out");
    }
    // The newest are the ones left out; everything already in the line stays.
    assert_eq!(ended.iter().max(), Some(&40));
    assert!(theirs.line.iter().all(|u| next.line.contains(u)));
    assert_eq!(next.active, Some(uid(7, 1)));
}

// docs/semantics.md#cluster-leases: a renewal whose answer was lost but which landed (its try
// timed out while NATS elected the bucket's leader) is this gateway's own value: the next
// renewal compare-and-sets from it at once, and the lease is extended only by that confirmed
// renewal, from its send time.
#[test]
fn a_renewal_that_landed_unanswered_is_renewed_from() {
    let mut c = leased();
    c.tick(ms(300));
    let (cmds, _) = drain(&mut c);
    assert!(matches!(cmds[0].op, Op::Update(_, 1)), "{cmds:?}");
    c.write_result(
        ms(450),
        cmds[0].id,
        Err(KvError::Unavailable("no answer".into())),
    );
    // The retry, against the revision it knew, finds the landed one.
    c.tick(ms(500));
    let (cmds, _) = drain(&mut c);
    assert!(matches!(cmds[0].op, Op::Update(_, 1)), "{cmds:?}");
    c.write_result(
        ms(510),
        cmds[0].id,
        Err(KvError::WrongRevision {
            expected: 1,
            current: 2,
        }),
    );
    assert!(!c.is_fenced());
    let (cmds, _) = drain(&mut c);
    assert!(
        matches!(cmds[0].op, Op::Update(_, 2)),
        "renewed from it at once: {cmds:?}"
    );
    assert_eq!(
        c.lease_valid_until(),
        Some(ms(900)),
        "not extended by the lost one"
    );
    c.write_result(ms(520), cmds[0].id, Ok(3));
    assert_eq!(c.lease_valid_until(), Some(ms(510 + 900)));
}

// docs/semantics.md#cluster-leases: a renewal not answered within the shell's bound is followed
// by another at once; the slow one's late success still extends the lease from its own send
// time, and the next one, refused by it, renews from it (a slow but healthy bucket does not
// lapse the lease).
#[test]
fn a_slow_renewal_is_followed_by_another_and_still_counts_when_answered() {
    let mut c = leased();
    c.tick(ms(300));
    let (cmds, _) = drain(&mut c);
    let slow = cmds[0].id;
    c.write_slow(ms(450), slow);
    let (cmds, _) = drain(&mut c);
    assert!(
        matches!(cmds[0].op, Op::Update(_, 1)),
        "another at once: {cmds:?}"
    );
    let next = cmds[0].id;
    c.write_slow(ms(460), slow);
    assert!(
        drain(&mut c).0.is_empty(),
        "not the renewal in flight: nothing more"
    );
    c.write_result(ms(700), slow, Ok(2));
    assert_eq!(
        c.lease_valid_until(),
        Some(ms(300 + 900)),
        "from its send time"
    );
    c.write_result(
        ms(710),
        next,
        Err(KvError::WrongRevision {
            expected: 1,
            current: 2,
        }),
    );
    let (cmds, _) = drain(&mut c);
    assert!(matches!(cmds[0].op, Op::Update(_, 2)), "{cmds:?}");
    assert!(!c.is_fenced());
}

// docs/semantics.md#cluster-lease-lapse: a bucket that answers every write, but each in 200 ms
// (more than the shell's renewal bound, a sixth of the 900 ms lease; well within the lease):
// only time in which nothing was answered is left out of another gateway's silence, so a dead
// gateway's lease (lease.8, never renewed after 10 ms) is deleted about on time. A review found
// it never deleted: each slow renewal moved the observation later by its whole wait.
#[test]
fn a_consistently_slow_but_answering_bucket_still_finds_a_dead_gateway() {
    slow_bucket_finds_a_dead_gateway(ms(200));
}

// The same with every write answered in 100 ms (under the bound).
#[test]
fn a_bucket_answering_within_the_bound_finds_a_dead_gateway() {
    slow_bucket_finds_a_dead_gateway(ms(100));
}

fn slow_bucket_finds_a_dead_gateway(latency: Duration) {
    let mut c = leased();
    c.backplane_changed(ms(10), "lease.8", Some(b"{}"), 2);
    let bound = config().lease / 6;
    let mut lease7 = 1u64;
    let mut next_rev = 100u64;
    // (id, sent, op, slow reported)
    let mut pending: Vec<(RequestId, Duration, Op, String, bool)> = Vec::new();
    let mut deleted_at = None;
    let mut t = ms(10);
    while t < ms(20_000) && deleted_at.is_none() {
        t += ms(10);
        c.tick(t);
        let (cmds, _) = drain(&mut c);
        for cmd in cmds {
            pending.push((cmd.id, t, cmd.op.clone(), cmd.key.clone(), false));
        }
        for p in pending.iter_mut() {
            if !p.4 && t >= p.1 + bound {
                p.4 = true;
                c.write_slow(t, p.0);
            }
        }
        let due: Vec<_> = pending
            .iter()
            .filter(|p| t >= p.1 + latency)
            .cloned()
            .collect();
        pending.retain(|p| t < p.1 + latency);
        for (id, _, op, key, _) in due {
            let result = match (&op, key.as_str()) {
                (Op::Update(_, expected), "lease.7") => {
                    if *expected == lease7 {
                        next_rev += 1;
                        lease7 = next_rev;
                        Ok(lease7)
                    } else {
                        Err(KvError::WrongRevision {
                            expected: *expected,
                            current: lease7,
                        })
                    }
                }
                (Op::Delete(2), "lease.8") => {
                    deleted_at = Some(t);
                    next_rev += 1;
                    Ok(next_rev)
                }
                _ => {
                    next_rev += 1;
                    Ok(next_rev)
                }
            };
            c.write_result(t, id, result);
        }
        assert!(
            !c.is_fenced(),
            "a healthy (slow) bucket fenced the gateway at {t:?}"
        );
    }
    assert!(!c.is_lapsed(), "its renewals are answered within the lease");
    let wait = config().dead_after();
    let deleted_at = deleted_at.expect("lease.8 never deleted in 20 s");
    assert!(
        deleted_at <= ms(10) + wait + ms(1_000),
        "lease.8 deleted only at {deleted_at:?} (wait {wait:?})"
    );
}

// docs/semantics.md#cluster-lease-lapse: "while one of its writes goes unanswered it takes
// nobody for dead", on any step (here a join, its lease still valid), not only on the
// dead-gateway timer (a review found the deletion issued then).
#[test]
fn a_suspect_gateway_deletes_nobody_on_any_step() {
    let mut c = leased();
    c.backplane_changed(ms(10), "lease.8", Some(b"{}"), 2);
    c.tick(ms(300));
    let (cmds, _) = drain(&mut c);
    c.write_result(ms(301), cmds[0].id, Ok(3));
    assert_eq!(c.lease_valid_until(), Some(ms(1_200)));
    // The bucket stops answering: the renewal at 600 ms is unanswered, so are the next ones.
    c.tick(ms(600));
    let (cmds, _) = drain(&mut c);
    assert_eq!(cmds.len(), 1);
    let mut last = cmds[0].id;
    for t in [750, 900, 1_050] {
        c.write_slow(ms(t), last);
        let (cmds, _) = drain(&mut c);
        assert!(cmds.iter().all(|c| c.key == "lease.7"), "{cmds:?} at {t}");
        last = cmds[0].id;
    }
    // 1,170 ms: past lease.8's wait (10 + 1,150), this gateway's lease still valid (1,200):
    // a member joins here.
    assert!(c.may_act(ms(1_170)));
    c.member_joined(ms(1_170), "jobs", 1);
    let (cmds, _) = drain(&mut c);
    assert!(
        cmds.iter().all(|c| c.key != "lease.8"),
        "took lease.8 for dead while its own writes go unanswered: {cmds:?}"
    );
}

// docs/semantics.md#cluster-leadership-current: a gateway answers leadership questions from its
// copy of the lines only once its watch has reached the renewal that (re)started its lease:
// at start, its create; after a lapse, the renewal that ended it. Before, a gateway whose lease
// was confirmed answered from whatever its watch had delivered so far (nothing, at start).
#[test]
fn leadership_is_answered_only_once_the_watch_reaches_the_leases_term() {
    let mut c = Coordinator::new(GatewayId(7), config(), ms(0));
    assert!(!c.caught_up(ms(0)), "no lease yet");
    let (cmds, _) = drain(&mut c);
    c.write_result(ms(1), cmds[0].id, Ok(5));
    assert!(c.may_act(ms(2)), "leased");
    assert!(!c.caught_up(ms(2)), "the watch has delivered nothing");
    let line = SubValue {
        line: vec![uid(8, 1)],
        active: Some(uid(8, 1)),
        epoch: 3,
        ..SubValue::default()
    };
    see_line(&mut c, ms(3), &line, 3);
    assert!(
        !c.caught_up(ms(3)),
        "revision 3 is before the lease's create"
    );
    c.backplane_changed(ms(4), "lease.7", Some(b"{}"), 5);
    assert!(c.caught_up(ms(4)));
    assert_eq!(c.line("jobs").map(|v| v.epoch), Some(3));

    // Unrenewed past its end (a pause): not caught up, whatever it saw.
    assert!(!c.caught_up(ms(901)));
    // A renewal confirmed after the end starts a new term, at its revision.
    let mut t = ms(901);
    let renewal = loop {
        c.tick(t);
        let (cmds, _) = drain(&mut c);
        if let Some(cmd) = cmds.into_iter().find(|c| c.key == "lease.7") {
            break cmd;
        }
        t += ms(10);
    };
    c.write_result(t + ms(1), renewal.id, Ok(40));
    assert!(c.may_act(t + ms(2)), "renewed");
    assert!(!c.caught_up(t + ms(2)), "the watch is at 5, the term at 40");
    c.backplane_changed(t + ms(3), "lease.7", Some(b"{}"), 40);
    assert!(c.caught_up(t + ms(3)));
    // Renewals within the lease keep the term.
    let until = c.lease_valid_until().unwrap();
    let mut rev = 40;
    let mut t = t + ms(3);
    while t < until + ms(900) {
        t += ms(100);
        tick_renewing(&mut c, t, &mut rev);
        assert!(c.caught_up(t), "at {t:?}: renewed in time, rev {rev}");
    }
}

fn ids(offset: u64) -> Vec<u8> {
    serde_json::to_vec(&super::super::values::IdsValue {
        epoch_offset: offset,
    })
    .unwrap()
}

// docs/semantics.md#cluster-restart-identity: with an epoch floor in the bucket, a promotion's
// epoch is the later of the replaced revision and the floor's, plus the floor's offset; a floor
// raised later raises the epochs after it, and a lower offset is not taken. Epochs never fall.
#[test]
fn epochs_stand_above_the_epoch_floor_and_rise_with_it() {
    let mut c = leased();
    c.backplane_changed(ms(2), IDS_KEY_FOR_TESTS, Some(&ids(1_000_000)), 3);
    c.member_joined(ms(3), "jobs", 1);
    let (cmds, _) = drain(&mut c);
    written(&mut c, ms(4), &cmds[0], 5);
    let (cmds, _) = drain(&mut c);
    let first = value(&cmds[0]);
    assert_eq!(
        first.epoch, 1_000_005,
        "the replaced revision 5, plus the offset"
    );
    written(&mut c, ms(5), &cmds[0], 6);
    drain(&mut c);
    // Another gateway started later and raised the floor; then a second member takes over.
    c.backplane_changed(ms(6), IDS_KEY_FOR_TESTS, Some(&ids(2_000_000)), 9);
    // A lower offset written after it (a gateway whose clock is behind) is not taken.
    c.backplane_changed(ms(7), IDS_KEY_FOR_TESTS, Some(&ids(5)), 10);
    c.member_joined(ms(8), "jobs", 2);
    let (cmds, _) = drain(&mut c);
    written(&mut c, ms(9), &cmds[0], 11);
    drain(&mut c);
    c.member_left(ms(10), "jobs", 1);
    let (cmds, _) = drain(&mut c);
    let next = value(&cmds[0]);
    assert_eq!(next.active, Some(uid(7, 2)));
    assert_eq!(next.epoch, 2_000_011);
    assert!(next.epoch > first.epoch);
}

// A promotion waits for the watch to deliver the value it replaces, even when this gateway's
// own write answered first: a floor raised between its last watched revision and that value
// is seen before the epoch is made. Without the wait, the epoch would be made from the older
// floor, below one another gateway made from the newer.
#[test]
fn a_promotion_waits_for_the_watch_to_reach_the_value_it_replaces() {
    let mut c = leased();
    c.member_joined(ms(3), "jobs", 1);
    let (cmds, _) = drain(&mut c);
    c.write_result(ms(4), cmds[0].id, Ok(6));
    let (waiting, _) = drain(&mut c);
    assert!(
        waiting.is_empty(),
        "no promotion before the watch reaches 6: {waiting:?}"
    );
    c.backplane_changed(ms(5), IDS_KEY_FOR_TESTS, Some(&ids(7_000)), 4);
    let value_at_6 = match &cmds[0].op {
        Op::Create(b) => b.clone(),
        other => panic!("{other:?}"),
    };
    c.backplane_changed(ms(6), "sub.jobs", Some(&value_at_6), 6);
    let (cmds, _) = drain(&mut c);
    assert_eq!(
        value(&cmds[0]).epoch,
        7_006,
        "made with the floor written at 4"
    );
}

const IDS_KEY_FOR_TESTS: &str = super::super::values::IDS_KEY;
