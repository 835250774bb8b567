//! The real-gateway judge's checks on synthetic logs: each can fail, and each excuse lets go
//! only what the docs allow.

use super::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn delivered(member: &str, gateway: &str, id: u64, (attempt, epoch): (u32, u64)) -> Seen {
    Seen::Delivered {
        member: member.into(),
        gateway: gateway.into(),
        system_id: id,
        attempt,
        epoch,
    }
}

fn checks(log: &[(Duration, Seen)]) -> Vec<String> {
    judge(log, true)
        .0
        .iter()
        .map(|v| v[..3].to_string())
        .collect()
}

// Checks (f) and (h) can fail: a message to a second member while the first holds it, under
// an epoch below one confirmed seconds before.
#[test]
fn cluster_real_gateway_judge_catches_a_message_in_flight_to_two_members_and_a_late_epoch() {
    let active = |member: &str, epoch| Seen::Active {
        member: member.into(),
        member_id: 0,
        epoch,
    };
    let mut log = vec![
        (ms(0), active("m1", 3)),
        (ms(10), delivered("m1", "gw1", 7, (1, 3))),
        (ms(5_000), active("m2", 6)),
        (ms(5_001), delivered("m2", "gw2", 7, (2, 6))),
    ];
    assert_eq!(checks(&log), ["(h)"], "m1 still holds #7");
    log.insert(
        2,
        (
            ms(3_000),
            Seen::Ended {
                member: "m1".into(),
            },
        ),
    );
    assert!(
        checks(&log).is_empty(),
        "m1 let it go: {:?}",
        judge(&log, true).0
    );
    log.push((ms(6_000), delivered("m1", "gw1", 8, (1, 3))));
    assert_eq!(checks(&log), ["(b)", "(f)"], "m1 late, under epoch 3");
}

// A freeze lets a holder go only when it lasted long enough for its gateway's lease to end:
// a gateway thawed within its lease renews it and goes on holding.
#[test]
fn cluster_real_gateway_judge_excuses_only_a_freeze_past_the_lease() {
    let frozen = |at, thawed| {
        vec![
            (ms(10), delivered("m1", "gw1", 7, (1, 3))),
            (
                ms(at),
                Seen::Frozen {
                    gateway: "gw1".into(),
                },
            ),
            (
                ms(thawed),
                Seen::Thawed {
                    gateway: "gw1".into(),
                },
            ),
            (ms(5_000), delivered("m2", "gw2", 7, (2, 6))),
        ]
    };
    assert_eq!(
        checks(&frozen(1_000, 1_100)),
        ["(h)"],
        "thawed within its lease"
    );
    assert!(checks(&frozen(1_000, 4_000)).is_empty(), "frozen 3 s");
}

// A frame that arrives from a gateway already frozen (handed to the transport just before
// the freeze) leaves its member holding nothing once the freeze outlasted the lease; within
// the lease it still holds (seed 603745 of 29c7b52 flagged (h) here).
#[test]
fn cluster_real_gateway_judge_lets_a_frame_arriving_from_a_frozen_gateway_go_with_its_lease() {
    let log = |thawed| {
        vec![
            (
                ms(6_513),
                Seen::Frozen {
                    gateway: "gw2".into(),
                },
            ),
            (ms(6_519), delivered("m1", "gw2", 9, (1, 5))),
            (
                ms(thawed),
                Seen::Thawed {
                    gateway: "gw2".into(),
                },
            ),
            (ms(9_449), delivered("m3", "gw1", 9, (2, 12))),
        ]
    };
    let mut past = log(11_119);
    past.sort_by_key(|(t, _)| *t);
    assert!(checks(&past).is_empty(), "{:?}", judge(&past, true).0);
    assert_eq!(checks(&log(7_000)), ["(h)"], "thawed within its lease");
}

// Check (w) can fail: a watch's epoch falling, and a frame naming another member under
// a confirmed epoch.
#[test]
fn cluster_real_gateway_judge_catches_a_watch_going_back_or_naming_another_member() {
    let watched = |watch, active, epoch| Seen::Watched {
        watch,
        active,
        epoch,
    };
    let mut log = vec![
        (
            ms(0),
            Seen::Active {
                member: "m1".into(),
                member_id: 11,
                epoch: 3,
            },
        ),
        (ms(1), watched(1, 11, 3)),
        (ms(2), watched(2, 11, 3)),
        (ms(3), watched(2, 0, 3)),
        (ms(4), watched(1, 12, 6)),
    ];
    assert!(judge_watches(&log).is_empty(), "{:?}", judge_watches(&log));
    log.push((ms(5), watched(1, 11, 3)));
    assert_eq!(judge_watches(&log).len(), 1, "{:?}", judge_watches(&log));
    log.push((ms(6), watched(3, 12, 3)));
    assert_eq!(judge_watches(&log).len(), 3, "{:?}", judge_watches(&log));
}

// Check (c) can fail on a thaw: an ack sent while its gateway was frozen past its lease
// and answered as it thawed is a broken promise when the message comes again (such an ack
// is refused, docs/semantics.md#cluster-lease-checks); an ack in doubt is not.
#[test]
fn cluster_real_gateway_judge_catches_an_ack_answered_on_a_thaw_past_the_lease() {
    let gw1 = |thawed: bool| {
        let gateway = "gw1".into();
        if thawed {
            Seen::Thawed { gateway }
        } else {
            Seen::Frozen { gateway }
        }
    };
    let mut log = vec![
        (ms(10), delivered("m1", "gw1", 7, (1, 3))),
        (ms(1_000), gw1(false)),
        (
            ms(1_500),
            Seen::AckSending {
                member: "m1".into(),
                gateway: "gw1".into(),
                system_id: 7,
            },
        ),
        (ms(4_000), gw1(true)),
        (ms(5_000), delivered("m2", "gw2", 7, (2, 6))),
    ];
    assert!(checks(&log).is_empty(), "{:?}", judge(&log, true).0);
    log.insert(
        4,
        (
            ms(4_010),
            Seen::Acked {
                member: "m1".into(),
                gateway: "gw1".into(),
                system_id: 7,
            },
        ),
    );
    assert_eq!(
        checks(&log),
        ["(c)"],
        "answered on the thaw, delivered again"
    );
}

// Check (q) can fail: a publish sent once both subscriptions were joined, answered queued
// for one. One sent before the second subscription's first join was answered is not held
// to it.
#[test]
fn cluster_real_gateway_judge_catches_a_publish_not_queued_for_every_subscription() {
    let joined = |member: &str| Seen::Joined {
        member: member.into(),
    };
    let published = |id, queued_for, sent| Seen::Published {
        system_id: id,
        queued_for,
        sent: ms(sent),
    };
    let (jobs, work) = (vec!["m1".to_string()], vec!["q1".to_string()]);
    let subscriptions = [jobs.as_slice(), work.as_slice()];
    let mut log = vec![
        (ms(100), joined("m1")),
        (ms(150), published(1, 1, 120)),
        (ms(200), joined("q1")),
        (ms(300), published(2, 2, 250)),
    ];
    assert!(judge_queued_for(&log, &subscriptions).is_empty());
    log.push((ms(400), published(3, 1, 350)));
    let found = judge_queued_for(&log, &subscriptions);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].starts_with("(q) #3"), "{found:?}");
}

// A QUEUE subscription's members are each active under an epoch of their own: epochs that
// differ between them break nothing, while a message in flight to two of them still does.
#[test]
fn cluster_real_gateway_judge_holds_a_queue_to_its_own_checks() {
    let mut log = vec![
        (ms(10), delivered("q1", "gw1", 7, (1, 30))),
        (ms(20), delivered("q2", "gw2", 8, (1, 20))),
    ];
    assert!(
        judge(&log, false).0.is_empty(),
        "{:?}",
        judge(&log, false).0
    );
    assert_eq!(
        checks(&log),
        ["(b)"],
        "held to a singleton's, it would break (b)"
    );
    log.push((ms(30), delivered("q2", "gw2", 7, (2, 20))));
    let found: Vec<String> = judge(&log, false)
        .0
        .iter()
        .map(|v| v[..3].to_string())
        .collect();
    assert_eq!(found, ["(h)"], "#7 still held by q1");
}

// docs/semantics.md#cluster-attempts: a QUEUE message given back by a gateway left without
// members comes with JetStream's count, which saw none of that gateway's own redeliveries:
// counted apart. While another member was open at that gateway, the message went from
// member to member there, and its attempt must rise (e).
#[test]
fn cluster_real_gateway_judge_counts_apart_only_an_attempt_recounted_after_a_give_back() {
    let joining = |member: &str| Seen::Joining {
        member: member.into(),
        gateway: "gw1".into(),
    };
    let joined = |member: &str| Seen::Joined {
        member: member.into(),
    };
    let ended = |member: &str| Seen::Ended {
        member: member.into(),
    };
    let mut log = vec![
        (ms(0), joining("q1")),
        (ms(5), joined("q1")),
        (ms(10), delivered("q1", "gw1", 7, (3, 30))),
        (ms(20), ended("q1")),
        (ms(500), joining("q1")),
        (ms(505), joined("q1")),
        (ms(510), delivered("q1", "gw1", 7, (3, 31))),
    ];
    let (found, residue) = judge(&log, false);
    assert!(found.is_empty(), "{found:?}");
    assert_eq!(residue.recounted, 1);
    // q2, at the same gateway, open throughout: no give-back.
    log.splice(0..0, [(ms(0), joining("q2")), (ms(1), joined("q2"))]);
    let (found, residue) = judge(&log, false);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].starts_with("(e)"), "{found:?}");
    assert_eq!(residue.recounted, 0);
}

// Check (k) can fail: a message's first delivery to a member with an attempt JetStream could
// only have counted by giving it to gateways many times unseen (seed 810385's 33).
#[test]
fn cluster_real_gateway_judge_catches_an_attempt_no_member_saw_counted_many_times() {
    let mut log = vec![(ms(10), delivered("q1", "gw1", 7, (1 + UNSEEN, 30)))];
    assert!(
        judge(&log, false).0.is_empty(),
        "{:?}",
        judge(&log, false).0
    );
    log.push((ms(20), delivered("q1", "gw1", 8, (2 + UNSEEN, 30))));
    let found = judge(&log, false).0;
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].starts_with("(k) #8"), "{found:?}");
}

// A cut lets a QUEUE member's stream go, for (e)'s give-back, only when that stream is not seen
// alive after it: a delivery on it after the cut shows the gateway kept it.
#[test]
fn cluster_real_gateway_judge_lets_a_cut_go_only_when_its_stream_was_not_seen_since() {
    let joining = Seen::Joining {
        member: "q1".into(),
        gateway: "gw1".into(),
    };
    let joined = Seen::Joined {
        member: "q1".into(),
    };
    let cut = Seen::Cut {
        member: "q1".into(),
    };
    let log = vec![
        (ms(0), joining),
        (ms(5), joined),
        (ms(10), delivered("q1", "gw1", 7, (3, 30))),
        (ms(20), cut),
        (ms(900), delivered("q1", "gw1", 8, (1, 30))),
        (ms(910), delivered("q1", "gw1", 7, (3, 30))),
    ];
    let (found, residue) = judge(&log, false);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].starts_with("(e) #7"), "{found:?}");
    assert_eq!(residue.recounted, 0);
}
