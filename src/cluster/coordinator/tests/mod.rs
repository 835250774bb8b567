//! The coordinator alone, driven by hand: a single gateway over a hand-fed watch.

use std::time::Duration;

use super::*;

mod carry;
mod liveness;
mod metadata;

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
    c.backplane_changed(at, &cmd.key.to_string(), value.as_deref(), rev);
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
        matches!(&retried[..], [Command { key, op: Op::Create(_), .. }] if *key == "sub.jobs"),
        "the local member's line is created again: {retried:?}"
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
        matches!(&cmds[..], [Command { key, op: Op::Create(_), .. }] if *key == "sub.jobs"),
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
