//! The coordinator's leases, driven by hand: lapses, renewals, and other gateways taken for
//! dead only past the drift-stretched wait (docs/semantics.md#cluster-leases).

use super::*;

// docs/semantics.md#cluster-leases: the dead-gateway wait covers the lease stretched by the drift bound, both ways.
#[test]
fn dead_after_stretches_the_lease_by_the_drift_bound_and_adds_the_margin() {
    let wait = config().dead_after();
    assert_eq!(wait, ms(900 * 110 / 90 + 50));
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
            .map(|c| (c.key.to_string(), &c.op))
            .collect::<Vec<_>>(),
        vec![("lease.8".to_string(), &Op::Delete(2))]
    );
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
        (cmds[0].key.to_string(), &cmds[0].op),
        ("lease.8".to_string(), &Op::Delete(2))
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
        (cmds[0].key.to_string(), &cmds[0].op),
        ("lease.8".to_string(), &Op::Delete(2))
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
        (cmds.len(), cmds[0].key.to_string(), &cmds[0].op),
        (
            1,
            "lease.7".to_string(),
            &Op::Update(Bytes::from_static(b"{}"), 1)
        ),
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
            pending.push((cmd.id, t, cmd.op.clone(), cmd.key.to_string(), false));
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
            let result = match (&op, key.to_string().as_str()) {
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
