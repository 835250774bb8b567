//! docs/semantics.md#priority and docs/semantics.md#hand-over: an active member steps down only
//! at a message boundary, to the first in line, with a higher epoch.

use super::*;

fn member(priority: u32, max_in_flight: u32) -> MemberOptions {
    MemberOptions {
        max_in_flight,
        notify_standby: false,
        priority,
    }
}

fn join_as(s: &mut Subscription, options: MemberOptions) -> (MemberId, Vec<Effect>) {
    let spec = s.spec().clone();
    let joined = s.join(&spec, options).unwrap();
    s.check_invariants().unwrap();
    joined
}

fn stepped_down(effects: &[Effect]) -> Vec<(MemberId, Epoch, u32)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::SteppedDown {
                member,
                epoch,
                position,
            } => Some((*member, *epoch, *position)),
            _ => None,
        })
        .collect()
}

fn stepping_down(effects: &[Effect]) -> Option<u64> {
    effects.iter().find_map(|e| match e {
        Effect::SteppingDown { seq, .. } => Some(*seq),
        _ => None,
    })
}

// A member of higher priority takes over only once the active member acked what it held: it
// gets nothing new meanwhile, and the successor gets the queue with a higher epoch.
#[test]
fn a_higher_priority_member_takes_over_after_the_active_member_settles() {
    let mut s = sub(Mode::Singleton);
    let (a, _) = join_as(&mut s, member(0, 2));
    s.enqueue(msg(1));
    s.enqueue(msg(2));
    let (b, fx) = join_as(&mut s, member(5, 2));
    assert!(stepping_down(&fx).is_some(), "{fx:?}");
    assert!(confirms(&fx).is_empty(), "no takeover mid-message: {fx:?}");
    assert!(
        delivered(&s.enqueue(msg(3))).is_empty(),
        "nothing new for a member that steps down"
    );
    assert!(confirms(&s.ack(Some(a), 1).unwrap()).is_empty());
    s.check_invariants().unwrap();
    let fx = s.ack(Some(a), 2).unwrap();
    assert_eq!(stepped_down(&fx), [(a, 1, 1)]);
    assert_eq!(confirms(&fx), [(b, 2)]);
    assert_eq!(delivered(&fx), [(b, 3, 1, 2)]);
    assert_eq!(s.counters().handovers, 1);
    assert_eq!(s.counters().promotions, 1);
    s.check_invariants().unwrap();
    // The member that stepped down waits in line, and follows when the new leader leaves.
    assert_eq!(confirms(&s.leave(b, NOW)), [(a, 3)]);
}

// Equal priority keeps join order: a later member of the same priority waits.
#[test]
fn equal_priority_keeps_join_order() {
    let mut s = sub(Mode::Singleton);
    let (a, _) = join_as(&mut s, member(3, 1));
    let (_, fx) = join_as(&mut s, member(3, 1));
    assert_eq!(stepping_down(&fx), None);
    let (c, fx) = join_as(&mut s, member(7, 1));
    assert!(stepping_down(&fx).is_some());
    // Nothing in flight: the takeover is immediate, and the member it displaced keeps its
    // place, first among its priority.
    assert_eq!(stepped_down(&fx), [(a, 1, 1)]);
    assert_eq!(confirms(&fx), [(c, 2)]);
    let infos = s.member_infos();
    let mut positions: Vec<(MemberId, u32)> =
        infos.iter().map(|i| (i.member_id, i.position)).collect();
    positions.sort_unstable();
    assert_eq!(positions, [(a, 1), (a + 1, 2), (c, 0)]);
}

// A hand-over puts the active member at the back of its priority and promotes the next.
#[test]
fn a_hand_over_promotes_the_next_in_line_and_queues_the_leader_behind_its_peers() {
    let mut s = sub(Mode::Singleton);
    let (a, _) = join(&mut s);
    let (b, _) = join(&mut s);
    let (c, _) = join(&mut s);
    let (step, fx) = s.hand_over().unwrap();
    assert_eq!((step.member, step.cause), (a, StepDownCause::HandOver));
    assert_eq!(
        stepped_down(&fx),
        [(a, 1, 2)],
        "behind c, the other standby"
    );
    assert_eq!(confirms(&fx), [(b, 2)]);
    s.check_invariants().unwrap();
    assert_eq!(
        confirms(&s.leave(b, NOW)),
        [(c, 3)],
        "c joined before a's hand-over"
    );
}

// Refusals change nothing: no standby, an active member that outranks every standby, another
// mode, no active member.
#[test]
fn a_hand_over_is_refused_when_no_one_could_take_over() {
    let mut s = sub(Mode::Singleton);
    assert!(matches!(s.hand_over(), Err(Error::HandOverRefused { .. })));
    let (a, _) = join_as(&mut s, member(2, 1));
    let Err(Error::HandOverRefused { reason, .. }) = s.hand_over() else {
        panic!("a lone member handed over");
    };
    assert!(reason.contains("no standby"), "{reason}");
    join_as(&mut s, member(1, 1));
    let Err(Error::HandOverRefused { reason, .. }) = s.hand_over() else {
        panic!("handed over to a lower priority");
    };
    assert!(reason.contains("priority 2"), "{reason}");
    assert_eq!(s.active_members().collect::<Vec<_>>(), [a]);
    assert_eq!(s.stepping_down(), None);
    let mut q = sub(Mode::Queue);
    join(&mut q);
    assert!(matches!(q.hand_over(), Err(Error::NotSingleton { .. })));
}

// Past the deadline, what the member still holds goes to the successor as on a failover: in
// publish order, attempt counted, withdrawn from the old member's stream; its late ack is stale.
#[test]
fn an_overdue_hand_over_gives_what_is_in_flight_to_the_successor() {
    let mut s = sub(Mode::Singleton);
    let (a, _) = join_as(&mut s, member(0, 3));
    let (b, _) = join_as(&mut s, member(0, 3));
    for id in 1..=3 {
        s.enqueue(msg(id));
    }
    s.nack(Some(a), 1).unwrap();
    let (step, fx) = s.hand_over().unwrap();
    assert!(stepped_down(&fx).is_empty());
    assert!(
        s.step_down_overdue(step.seq + 1).is_empty(),
        "another step-down"
    );
    let fx = s.step_down_overdue(step.seq);
    let withdrawn: Vec<SystemId> = fx
        .iter()
        .filter_map(|e| match e {
            Effect::Withdraw { member, system_id } if *member == a => Some(*system_id),
            _ => None,
        })
        .collect();
    assert_eq!(withdrawn, [1, 2, 3]);
    assert_eq!(stepped_down(&fx), [(a, 1, 1)]);
    assert_eq!(confirms(&fx), [(b, 2)]);
    assert_eq!(delivered(&fx), [(b, 1, 3, 2), (b, 2, 2, 2), (b, 3, 2, 2)]);
    assert_eq!(s.counters().handovers_overdue, 1);
    assert!(matches!(s.ack(Some(a), 2), Err(Error::NotHolder { .. })));
    s.check_invariants().unwrap();
    assert!(s.step_down_overdue(step.seq).is_empty(), "once only");
}

// A takeover whose successor leaves before it completes is called off: the active member goes
// on and is sent messages again. One whose member leaves is an ordinary failover.
#[test]
fn a_step_down_is_called_off_when_its_successor_leaves() {
    let mut s = sub(Mode::Singleton);
    let (a, _) = join_as(&mut s, member(0, 1));
    s.enqueue(msg(1));
    let (b, _) = join_as(&mut s, member(9, 1));
    assert!(s.stepping_down().is_some());
    assert!(s.leave(b, NOW).is_empty());
    assert_eq!(s.stepping_down(), None);
    s.enqueue(msg(2));
    assert_eq!(delivered(&s.ack(Some(a), 1).unwrap()), [(a, 2, 1, 1)]);
    let (c, _) = join_as(&mut s, member(9, 1));
    assert!(s.stepping_down().is_some());
    let fx = s.leave(a, NOW);
    assert_eq!(confirms(&fx), [(c, 2)]);
    assert_eq!(delivered(&fx), [(c, 2, 2, 2)]);
    assert_eq!((s.stepping_down(), s.counters().handovers), (None, 0));
    s.check_invariants().unwrap();
}

// The planted bug: the takeover does not wait, and a member on standby holds a message.
#[cfg(feature = "planted-bugs")]
#[test]
fn planted_take_over_mid_message_is_caught() {
    use crate::core::planted::{PlantedBug, plant};
    let mut s = sub(Mode::Singleton);
    let spec = s.spec().clone();
    s.join(&spec, member(0, 1)).unwrap();
    s.enqueue(msg(1));
    plant(Some(PlantedBug::TakeOverMidMessage));
    s.join(&spec, member(1, 1)).unwrap();
    plant(None);
    let caught = s.check_invariants().unwrap_err();
    assert!(caught.contains("on standby, holds in-flight"), "{caught}");
}

// A hand-over asked for while a takeover by priority is in progress becomes a hand-over: if the
// newcomer leaves, a standby of the active member's priority still takes over.
#[test]
fn a_hand_over_during_a_takeover_outlives_the_newcomer() {
    let mut s = sub(Mode::Singleton);
    let (a, _) = join_as(&mut s, member(0, 1));
    let (b, _) = join_as(&mut s, member(0, 1));
    s.enqueue(msg(1));
    let (c, _) = join_as(&mut s, member(5, 1));
    let (step, _) = s.hand_over().unwrap();
    assert_eq!((step.member, step.cause), (a, StepDownCause::HandOver));
    assert!(s.leave(c, NOW).is_empty());
    assert!(s.stepping_down().is_some(), "b may still take over");
    let fx = s.ack(Some(a), 1).unwrap();
    assert_eq!(stepped_down(&fx), [(a, 1, 1)]);
    assert_eq!(confirms(&fx), [(b, 2)]);
    s.check_invariants().unwrap();
}

// docs/semantics.md#cluster-priority-and-hand-over: an arbitrated singleton's step-down is the
// cluster's: the member is sent nothing more, reports settled once it holds nothing, and goes on
// standby only when the coordinator says the line moved past it; nothing is promoted here.
#[test]
fn an_arbitrated_step_down_settles_and_waits_for_the_cluster() {
    let mut s = sub(Mode::Singleton);
    s.arbitrate();
    let (a, _) = join_as(&mut s, member(0, 2));
    let (b, _) = join_as(&mut s, member(0, 2));
    s.activate(a, 40, false).unwrap();
    s.enqueue(msg(1));
    assert!(matches!(
        s.step_down(b, StepDownCause::HandOver),
        Err(Error::InvalidArgument(_))
    ));
    let (step, fx) = s.step_down(a, StepDownCause::Priority).unwrap();
    assert_eq!(stepping_down(&fx), Some(step.seq));
    assert_eq!(s.settled_step_down(), None, "it holds #1");
    assert!(delivered(&s.enqueue(msg(2))).is_empty(), "nothing new");
    let fx = s.ack(Some(a), 1).unwrap();
    assert!(
        confirms(&fx).is_empty() && stepped_down(&fx).is_empty(),
        "{fx:?}"
    );
    assert_eq!(s.settled_step_down().map(|s| s.member), Some(a));
    // A second ask of the same member is the same step-down.
    assert_eq!(
        s.step_down(a, StepDownCause::HandOver).unwrap().0.seq,
        step.seq
    );
    let fx = s.stepped_down(a, 2);
    assert_eq!(stepped_down(&fx), [(a, 40, 2)]);
    assert_eq!(
        s.active_members().count(),
        0,
        "the cluster confirms the successor"
    );
    assert_eq!(s.counters().handovers, 1);
    assert_eq!(
        s.queued_ids().collect::<Vec<_>>(),
        [2],
        "waits here to go back"
    );
    s.check_invariants().unwrap();
}

// A called-off arbitrated step-down serves the member again; one past its deadline takes back
// what the member holds, and the member then reports settled.
#[test]
fn an_arbitrated_step_down_is_called_off_or_taken_back_when_overdue() {
    let mut s = sub(Mode::Singleton);
    s.arbitrate();
    let (a, _) = join_as(&mut s, member(0, 1));
    s.activate(a, 7, false).unwrap();
    s.enqueue(msg(1));
    s.step_down(a, StepDownCause::HandOver).unwrap();
    s.enqueue(msg(2));
    s.ack(Some(a), 1).unwrap();
    let fx = s.call_off_step_down(a);
    assert_eq!(delivered(&fx), [(a, 2, 1, 7)], "served again");
    let (step, _) = s.step_down(a, StepDownCause::HandOver).unwrap();
    assert_eq!(s.settled_step_down(), None);
    let fx = s.step_down_overdue(step.seq);
    assert!(
        fx.iter()
            .any(|e| matches!(e, Effect::Withdraw { system_id: 2, .. })),
        "{fx:?}"
    );
    assert_eq!(s.settled_step_down().map(|s| s.member), Some(a));
    assert_eq!(s.counters().handovers_overdue, 1);
    s.check_invariants().unwrap();
}
