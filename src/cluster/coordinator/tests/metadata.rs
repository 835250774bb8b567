//! Member metadata in the line (docs/semantics.md#cluster-metadata): each gateway writes its own
//! members', proclamations are answered once the line holds them, and a line stays bounded.

use super::*;

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
