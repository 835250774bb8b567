//! The gateway broker's upstream entry points, driven by hand on tokio's paused clock.

use std::{sync::atomic::Ordering, time::Duration};

use super::*;
use crate::{
    broker::{Fence, MemberStream, Observation, Outbound},
    clock::VirtualClock,
    core::{MemberOptions, Mode, OpenRequest, Pattern, SubscriptionSpec},
};

struct Unobserved;
impl Observer for Unobserved {
    fn observe(&self, _: &Observation<'_>) {}
}

/// A gateway's broker, as `serve --nats` builds it: a subscription expires with its last
/// member.
fn gateway() -> Upstream {
    gateway_on(ROUTE)
}

/// A gateway whose claimed route is `route`.
fn gateway_on(route: u64) -> Upstream {
    let limits = Limits {
        idle_timeout: Duration::ZERO,
        ..Limits::default()
    };
    Broker::gateway(
        limits,
        Arc::new(VirtualClock::new(1_700_000_000_000)),
        Arc::new(Unobserved),
        route,
    )
    .1
}

/// A route as a gateway claims one at 2026-12-06 (its start in µs, shifted).
const ROUTE: u64 = (1_796_590_000_000_000 >> GATEWAY_ROUTE_SHIFT) + 1;

fn request(id: &str, mode: Mode) -> OpenRequest {
    OpenRequest {
        subscription_id: id.into(),
        spec: SubscriptionSpec {
            mode,
            consumer_group: "g".into(),
            patterns: vec![Pattern::parse("a.*").unwrap()],
            max_delivery_attempts: 0,
            dead_letter_topic: None,
            ack_mode: Default::default(),
            overflow: Default::default(),
        },
        member: MemberOptions::default(),
        metadata: std::sync::Arc::from(""),
    }
}

async fn confirmed_member(member: &mut MemberStream) -> MemberId {
    match tokio::time::timeout(Duration::from_secs(5), member.next()).await {
        Ok(Some(Outbound::Confirm { member_id, .. })) => member_id,
        other => panic!("expected a confirmation, got {other:?}"),
    }
}

async fn confirmed_epoch(member: &mut MemberStream) -> Epoch {
    match tokio::time::timeout(Duration::from_secs(5), member.next()).await {
        Ok(Some(Outbound::Confirm { epoch, .. })) => epoch,
        other => panic!("expected a confirmation, got {other:?}"),
    }
}

// docs/semantics.md#restart-identity / README "Restart identity": a restarted broker never hands out an epoch an
// earlier run handed out. A queue member's epoch is the gateway's own (the cluster chooses
// only a singleton's), so a restarted gateway, or a second one, must not start it again
// where the first started.
#[tokio::test(start_paused = true)]
async fn a_restarted_gateway_does_not_hand_out_the_same_queue_epoch_again() {
    let first = gateway();
    let mut a = first.open(&request("q", Mode::Queue), None).unwrap();
    let before = confirmed_epoch(&mut a).await;
    drop((a, first));
    // It claims the next route at start (docs/semantics.md#cluster-restart-identity).
    let restarted = gateway_on(ROUTE + 1);
    let mut b = restarted.open(&request("q", Mode::Queue), None).unwrap();
    let after = confirmed_epoch(&mut b).await;
    assert!(
        after > before,
        "the restarted gateway handed out queue epoch {after} after {before}"
    );
}

// docs/semantics.md#cluster-restart-identity: a gateway's member ids start at its route's
// boundary (so forwarded acks find it), above the start time its route was claimed for, and
// below 2^53 (read exactly as doubles by jq, JavaScript).
#[tokio::test(start_paused = true)]
async fn a_gateways_ids_start_at_its_routes_boundary_above_its_start() {
    let floor = gateway().id_floor().unix_micros();
    assert_eq!(floor, ROUTE << GATEWAY_ROUTE_SHIFT);
    assert!(
        floor > 1_796_590_000_000_000 && floor < 1 << 53,
        "floor {floor}"
    );
    let mut m = gateway().open(&request("q", Mode::Queue), None).unwrap();
    let member = confirmed_member(&mut m).await;
    assert!(
        member > floor && member >> GATEWAY_ROUTE_SHIFT == ROUTE,
        "member {member}"
    );
}

// README cluster mode: "A subscription's epoch is the cluster's." A singleton's local
// subscription must not show an epoch of another subscription that expired on this gateway
// (the broker-wide retired floor), above the cluster's.
#[tokio::test(start_paused = true)]
async fn a_gateways_singleton_shows_the_clusters_epoch_after_another_subscription_expired() {
    let broker = gateway();
    for _ in 0..3 {
        let mut m = broker.open(&request("q", Mode::Queue), None).unwrap();
        confirmed_epoch(&mut m).await;
        drop(m);
        broker.expire_idle();
    }
    let mut s = broker.open(&request("s", Mode::Singleton), None).unwrap();
    let activation = Activation {
        epoch: 2,
        ..Activation::default()
    };
    broker.activate("s", s.member_id(), activation).unwrap();
    assert_eq!(confirmed_epoch(&mut s).await, 2);
    assert_eq!(
        broker.describe("s").unwrap().epoch,
        2,
        "the singleton's epoch is the cluster's"
    );
}

/// A gateway's singleton "s" whose member (window `window`) the cluster promoted after a clean
/// close with `carry`: the given-back messages it waits for. Returns the feeder's `live` claim
/// too.
async fn promoted(
    window: u32,
    carry: Vec<(SystemId, u32)>,
) -> (Upstream, MemberStream, AtomicBool) {
    activated(
        window,
        Activation {
            epoch: 2,
            carry,
            promoted: true,
            took_over: false,
        },
    )
    .await
}

/// A gateway's singleton "s" whose member (window `window`) the cluster made active so.
async fn activated(window: u32, activation: Activation) -> (Upstream, MemberStream, AtomicBool) {
    let broker = gateway();
    let mut req = request("s", Mode::Singleton);
    req.member.max_in_flight = window;
    let mut s = broker.open(&req, None).unwrap();
    broker.activate("s", s.member_id(), activation).unwrap();
    confirmed_epoch(&mut s).await;
    (broker, s, AtomicBool::new(true))
}

fn message(id: SystemId) -> Message {
    let envelope = crate::core::Envelope::new(
        crate::core::Topic::parse("a.b").unwrap(),
        crate::core::Headers::new(),
    );
    Message::new(id, 0, envelope, b"x")
}

async fn delivered(member: &mut MemberStream) -> Option<(SystemId, u32)> {
    match tokio::time::timeout(Duration::from_millis(10), member.next()).await {
        Ok(Some(Outbound::Message {
            message, attempt, ..
        })) => Some((message.system_id(), attempt)),
        Ok(other) => panic!("expected a message, got {other:?}"),
        Err(_) => None,
    }
}

// README cluster mode: JetStream may redeliver given-back messages out of the order they
// were given back in; the promoted gateway delivers them in stream order (the promotion
// names them: carry), then what came after them.
#[tokio::test(start_paused = true)]
async fn given_back_messages_reach_the_promoted_member_in_order_whatever_order_they_return_in() {
    let (broker, mut s, live) = promoted(10, vec![(5, 2), (6, 3), (7, 2)]).await;
    for id in [7, 8] {
        broker.inject("s", message(id), 1, &live).unwrap();
    }
    assert_eq!(delivered(&mut s).await, None, "7 and 8 wait for 5 and 6");
    assert_eq!(
        broker.room("s"),
        Some(10 + 2 - 1),
        "the missing two can be pulled (8 takes window room, 7 was carried)"
    );
    broker.inject("s", message(5), 1, &live).unwrap();
    assert_eq!(delivered(&mut s).await, Some((5, 2)));
    assert_eq!(delivered(&mut s).await, None, "7 and 8 wait for 6");
    broker.inject("s", message(6), 1, &live).unwrap();
    let mut rest = Vec::new();
    while let Some(d) = delivered(&mut s).await {
        rest.push(d);
    }
    assert_eq!(rest, [(6, 3), (7, 2), (8, 1)]);
}

// The carry's attempt is the one delivered, also below JetStream's count: JetStream counts a
// delivery to the last gateway that no member got (a message that came in its open pull after
// the member left, or one queued there that no member was given), which used to raise it.
#[tokio::test(start_paused = true)]
async fn a_carried_attempt_below_jetstreams_count_is_the_one_delivered() {
    let (broker, mut s, live) = promoted(10, vec![(5, 1), (6, 3)]).await;
    broker.inject("s", message(5), 2, &live).unwrap();
    broker.inject("s", message(6), 2, &live).unwrap();
    broker.inject("s", message(7), 1, &live).unwrap();
    let mut got = Vec::new();
    while let Some(d) = delivered(&mut s).await {
        got.push(d);
    }
    assert_eq!(got, [(5, 1), (6, 3), (7, 1)]);
}

// A given-back message that never comes back is waited for at most HOLD_BACK_PATIENCE:
// then what came after it is delivered.
#[tokio::test(start_paused = true)]
async fn a_given_back_message_that_never_returns_is_waited_for_a_bounded_time() {
    let (broker, mut s, live) = promoted(10, vec![(5, 2)]).await;
    broker.inject("s", message(6), 1, &live).unwrap();
    assert_eq!(delivered(&mut s).await, None);
    let patience = super::super::member::HOLD_BACK_PATIENCE;
    tokio::time::advance(patience - Duration::from_millis(100)).await;
    assert_eq!(
        broker.room("s"),
        Some(10 + 1 - 1),
        "not yet past the patience"
    );
    assert_eq!(delivered(&mut s).await, None);
    tokio::time::advance(Duration::from_millis(200)).await;
    broker.room("s");
    assert_eq!(delivered(&mut s).await, Some((6, 1)));
    // Nothing is waited for any more.
    broker.inject("s", message(9), 1, &live).unwrap();
    assert_eq!(delivered(&mut s).await, Some((9, 1)));
}

// README cluster mode: what waits is bounded by "the member's window plus the carried
// ones", and the carried ones still missing can always be pulled. Carried messages that
// came back early and wait for an earlier one must not use up the room that earlier one
// needs: with a window of 1, 6 and 7 back before 5 left no room to pull 5, which then came
// only after the patience, behind 6 and 7.
#[tokio::test(start_paused = true)]
async fn a_missing_carried_message_can_be_pulled_while_later_carried_ones_wait() {
    let (broker, mut s, live) = promoted(1, vec![(5, 2), (6, 2), (7, 2)]).await;
    for id in [7, 6] {
        broker.inject("s", message(id), 1, &live).unwrap();
    }
    assert_eq!(delivered(&mut s).await, None, "6 and 7 wait for 5");
    assert!(
        broker.room("s").unwrap() >= 1,
        "5 is missing and must be pullable, room {:?}",
        broker.room("s")
    );
    broker.inject("s", message(5), 1, &live).unwrap();
    assert_eq!(delivered(&mut s).await, Some((5, 2)));
}

// README cluster mode: a held-back message is "counted in the budget" for as long as it
// waits, whatever else the subscription does meanwhile (here an ack).
#[tokio::test(start_paused = true)]
async fn a_held_back_message_stays_counted_in_the_memory_budget() {
    let (broker, mut s, live) = promoted(10, vec![(5, 1), (7, 1)]).await;
    let accounted = |b: &Broker| b.list().1.memory_accounted_bytes;
    broker.inject("s", message(5), 1, &live).unwrap();
    assert_eq!(delivered(&mut s).await, Some((5, 1)));
    let with_one = accounted(&broker);
    broker.inject("s", message(8), 1, &live).unwrap();
    assert_eq!(delivered(&mut s).await, None, "8 waits for 7");
    let share = accounted(&broker) - with_one;
    assert!(share > 0);
    broker
        .ack("s", crate::broker::Fence::Member(s.member_id()), 5)
        .unwrap();
    assert_eq!(
        accounted(&broker),
        with_one,
        "5 left (the same size as 8), 8 still waits here"
    );
    // A redelivery of the waiting 8 keeps one copy, counted once.
    broker.inject("s", message(8), 1, &live).unwrap();
    assert_eq!(accounted(&broker), with_one, "8 counted once");
    assert_eq!(
        broker.hand_back("s"),
        [(8, 1), (7, 1)],
        "8 given back, 7's carry goes on"
    );
    assert_eq!(accounted(&broker), with_one - share);
}

// README cluster mode: `queued_messages` counts what the gateway pulled; a message held
// back for order was pulled and waits here, as a queued one does.
#[tokio::test(start_paused = true)]
async fn a_held_back_message_shows_as_queued() {
    let (broker, mut s, live) = promoted(10, vec![(5, 1)]).await;
    broker.inject("s", message(6), 1, &live).unwrap();
    assert_eq!(delivered(&mut s).await, None, "6 waits for 5");
    let size = message(6).size() as u64;
    let view = broker.describe("s").unwrap();
    assert_eq!((view.queued_messages, view.queued_bytes), (1, size));
    let listed = &broker.list().0[0];
    assert_eq!((listed.queued_messages, listed.queued_bytes), (1, size));
}

// README cluster mode: "the promotion carries their ids (`carry`) to the next active
// member's gateway", which puts them in order and delivers each with at least its carried
// attempt. When the promoted member leaves too before a carried message came back here,
// that message is still JetStream's to redeliver, to the gateway after: its carry must go
// on with what this gateway gives back, or it comes there with a lower attempt and
// unordered.
#[tokio::test(start_paused = true)]
async fn a_carried_message_still_missing_is_carried_on_when_the_promoted_member_leaves() {
    let (broker, mut s, live) = promoted(10, vec![(5, 3), (6, 3)]).await;
    broker.inject("s", message(6), 1, &live).unwrap();
    assert_eq!(delivered(&mut s).await, None, "6 waits for 5");
    broker.end_member("s", s.member_id(), &Error::Unavailable("left".into()));
    let mut given_back = broker.hand_back("s");
    given_back.sort_unstable();
    assert_eq!(given_back, [(5, 3), (6, 3)]);
}

// An activation of the member already active here changes nothing (the core's answer):
// neither does it forget the carried messages still missing, which would let what waits
// for them go first.
#[tokio::test(start_paused = true)]
async fn activating_the_active_member_again_keeps_waiting_for_the_carried_ones() {
    let (broker, mut s, live) = promoted(10, vec![(5, 3)]).await;
    broker.inject("s", message(6), 1, &live).unwrap();
    let again = Activation {
        epoch: 2,
        promoted: true,
        ..Activation::default()
    };
    broker.activate("s", s.member_id(), again).unwrap();
    broker.room("s");
    assert_eq!(delivered(&mut s).await, None, "6 still waits for 5");
    broker.inject("s", message(5), 1, &live).unwrap();
    assert_eq!(delivered(&mut s).await, Some((5, 3)));
    assert_eq!(delivered(&mut s).await, Some((6, 1)));
}

/// A member that took over from a dead gateway's member (window `window`).
async fn took_over(window: u32) -> (Upstream, MemberStream, AtomicBool) {
    activated(
        window,
        Activation {
            epoch: 2,
            carry: Vec::new(),
            promoted: true,
            took_over: true,
        },
    )
    .await
}

// README cluster mode: after a take-over from a dead gateway, no carry names what it held, and
// JetStream redelivers it in the order its ack waits ran out, not always stream order. Nothing
// is pulled until the consumer's backlog is counted; then what arrives waits until every owed
// redelivery (ids up to the consumer's last delivered one) came, and all of it is delivered in
// id order, new messages after.
#[tokio::test(start_paused = true)]
async fn after_a_take_over_the_dead_gateways_messages_come_first_and_in_order() {
    let (broker, mut s, live) = took_over(2).await;
    assert_eq!(broker.room("s"), Some(0), "nothing pulled before the count");
    assert!(broker.owes_count("s"));
    broker.count_owed("s", 3, 10);
    assert!(!broker.owes_count("s"));
    assert_eq!(
        broker.room("s"),
        Some(2 + 3),
        "the window and the owed three"
    );
    for id in [12, 9, 7] {
        broker.inject("s", message(id), 2, &live).unwrap();
    }
    assert_eq!(delivered(&mut s).await, None, "8 is still owed");
    assert_eq!(
        broker.room("s"),
        Some(2 + 1 - 1),
        "8 can be pulled; 12 took room"
    );
    broker.inject("s", message(8), 2, &live).unwrap();
    assert_eq!(delivered(&mut s).await, Some((7, 2)));
    assert_eq!(delivered(&mut s).await, Some((8, 2)));
    assert_eq!(delivered(&mut s).await, None, "window 2");
    s.settler().settle(&[7], &[], &[]).unwrap();
    assert_eq!(delivered(&mut s).await, Some((9, 2)));
    s.settler().settle(&[8], &[], &[]).unwrap();
    assert_eq!(delivered(&mut s).await, Some((12, 2)));
}

// A take-over with nothing owed (the dead gateway held nothing) waits for nothing.
#[tokio::test(start_paused = true)]
async fn a_take_over_with_nothing_owed_delivers_at_once() {
    let (broker, mut s, live) = took_over(2).await;
    broker.count_owed("s", 0, 10);
    assert_eq!(broker.room("s"), Some(2));
    broker.inject("s", message(11), 1, &live).unwrap();
    assert_eq!(delivered(&mut s).await, Some((11, 1)));
}

// Owed redeliveries that never come (or a count that never arrives) are waited for at most
// HOLD_BACK_PATIENCE from the activation: then what came is delivered in id order.
#[tokio::test(start_paused = true)]
async fn owed_redeliveries_are_waited_for_a_bounded_time() {
    let patience = super::super::member::HOLD_BACK_PATIENCE;
    let (broker, mut s, live) = took_over(4).await;
    broker.count_owed("s", 2, 10);
    broker.inject("s", message(11), 1, &live).unwrap();
    broker.inject("s", message(9), 2, &live).unwrap();
    tokio::time::advance(patience - Duration::from_millis(100)).await;
    broker.room("s");
    assert_eq!(delivered(&mut s).await, None, "not yet past the patience");
    tokio::time::advance(Duration::from_millis(200)).await;
    broker.room("s");
    assert_eq!(delivered(&mut s).await, Some((9, 2)));
    assert_eq!(delivered(&mut s).await, Some((11, 1)));

    let (broker, _s, _live) = took_over(4).await;
    assert_eq!(broker.room("s"), Some(0));
    tokio::time::advance(patience + Duration::from_millis(100)).await;
    assert_eq!(
        broker.room("s"),
        Some(4),
        "a count that never came is not waited for forever"
    );
}

// What waits for owed redeliveries goes back upstream when the member leaves.
#[tokio::test(start_paused = true)]
async fn a_member_that_leaves_while_owed_gives_back_what_waits() {
    let (broker, mut s, live) = took_over(2).await;
    broker.count_owed("s", 2, 10);
    broker.inject("s", message(9), 2, &live).unwrap();
    broker.inject("s", message(11), 1, &live).unwrap();
    broker.end_member("s", s.member_id(), &Error::Unavailable("left".into()));
    let mut given_back = broker.hand_back("s");
    given_back.sort_unstable();
    assert_eq!(given_back, [(9, 2), (11, 1)]);
    assert!(
        matches!(s.next().await, Some(Outbound::End(_))),
        "nothing was delivered before the end"
    );
}

// README "A gateway that dies": when the dead gateway's member was its line's only one, the
// line is deleted with it, and a member joining later is the first of a new line: no
// hand-over names or marks what that gateway held, which JetStream redelivers all the same,
// in the order its ack waits ran out. A line's first activation counts it as a take-over does.
#[tokio::test(start_paused = true)]
async fn a_lines_first_activation_counts_what_jetstream_owes_before_pulling() {
    let first = Activation {
        epoch: 5,
        ..Activation::default()
    };
    let (broker, mut s, live) = activated(2, first).await;
    assert_eq!(broker.room("s"), Some(0), "nothing pulled before the count");
    assert!(broker.owes_count("s"));
    broker.count_owed("s", 2, 10);
    for id in [9, 7] {
        broker.inject("s", message(id), 2, &live).unwrap();
    }
    assert_eq!(delivered(&mut s).await, Some((7, 2)));
    assert_eq!(delivered(&mut s).await, Some((9, 2)));
}

// A clean close's promotion names what was given back (its carry) and pulls at once: no
// consumer read before the first pull on the path promotion latency is measured on.
#[tokio::test(start_paused = true)]
async fn a_clean_close_promotion_pulls_at_once() {
    let clean = Activation {
        epoch: 2,
        carry: vec![(5, 2)],
        promoted: true,
        took_over: false,
    };
    let (broker, mut s, live) = activated(2, clean).await;
    assert!(!broker.owes_count("s"));
    assert_eq!(
        broker.room("s"),
        Some(2 + 1),
        "the window and the carried one"
    );
    broker.inject("s", message(5), 1, &live).unwrap();
    assert_eq!(delivered(&mut s).await, Some((5, 2)));
}

/// Records the carry of every hand-back it observes.
#[derive(Default)]
struct HandBacks(std::sync::Mutex<Vec<Vec<(SystemId, u32)>>>);

impl Observer for HandBacks {
    fn observe(&self, observation: &Observation<'_>) {
        if let Input::HandBack { carry, .. } = observation.input {
            self.0.lock().unwrap().push(carry.clone());
        }
    }
}

// README "Clean close": a gateway's singleton expires as soon as its last member there leaves,
// often before the gateway gives back what it holds (its open pull ends first). What the
// subscription queued (the left member's in-flight messages with attempt + 1, the rest) and
// the carried messages that had not come back are handed back to the observer as it expires,
// for the promotion that follows to carry; none of it counts as expired (it goes back to
// JetStream). They used to be drained uncarried, so the next active member's gateway neither
// raised their attempts nor kept their order.
#[tokio::test(start_paused = true)]
async fn a_singleton_that_expires_with_its_last_member_hands_back_what_it_queued() {
    let observer = Arc::new(HandBacks::default());
    let limits = Limits {
        idle_timeout: Duration::ZERO,
        ..Limits::default()
    };
    let broker = Broker::gateway(
        limits,
        Arc::new(VirtualClock::new(1_700_000_000_000)),
        observer.clone(),
        ROUTE,
    )
    .1;
    let mut req = request("s", Mode::Singleton);
    req.member.max_in_flight = 2;
    let mut s = broker.open(&req, None).unwrap();
    let activation = Activation {
        epoch: 2,
        carry: vec![(20, 3)],
        promoted: true,
        took_over: false,
    };
    broker.activate("s", s.member_id(), activation).unwrap();
    confirmed_epoch(&mut s).await;
    let live = AtomicBool::new(true);
    for id in [7, 8, 9] {
        broker.inject("s", message(id), 1, &live).unwrap();
    }
    assert_eq!(delivered(&mut s).await, Some((7, 1)));
    assert_eq!(delivered(&mut s).await, Some((8, 1)));
    // Its stream closes: a clean close.
    drop(s);
    assert_eq!(broker.expire_idle(), 1);
    assert_eq!(
        *observer.0.lock().unwrap(),
        [vec![(7, 2), (8, 2), (9, 1), (20, 3)]],
        "the in-flight ones with attempt + 1, the queued one, the carried one still missing"
    );
    assert_eq!(broker.list().1.messages_expired, 0);
    assert!(broker.hand_back("s").is_empty(), "gone, nothing left");
}

/// A lease gate the test opens and closes: each opening begins a new term, as a lease renewed
/// after a lapse does.
#[derive(Default)]
struct TestGate {
    /// The term while open; 0 while closed.
    term: std::sync::atomic::AtomicU64,
    terms: std::sync::atomic::AtomicU64,
}

impl TestGate {
    fn set(&self, open: bool) {
        let term = if open {
            self.terms.fetch_add(1, Ordering::SeqCst) + 1
        } else {
            0
        };
        self.term.store(term, Ordering::SeqCst);
    }
}

/// A gateway's singleton "s" with window 4, its member active, behind a lease gate the test
/// opens and closes.
async fn gated() -> (Upstream, MemberStream, AtomicBool, Arc<TestGate>) {
    let (broker, s, live) = promoted(4, Vec::new()).await;
    let open = Arc::new(TestGate::default());
    open.set(true);
    let gate = open.clone();
    broker.gate_singleton_deliveries(Arc::new(move || {
        Some(gate.term.load(Ordering::SeqCst)).filter(|&t| t != 0)
    }));
    (broker, s, live, open)
}

// docs/semantics.md#cluster-lease-lapse: while the gateway's lease is lapsed, a member's stream
// writes none of its messages; they wait, in order, and are written once the lease is renewed.
#[tokio::test(start_paused = true)]
async fn messages_wait_while_the_lease_is_lapsed_and_are_written_in_order_once_renewed() {
    let (broker, mut s, live, open) = gated().await;
    broker.inject("s", message(1), 1, &live).unwrap();
    assert_eq!(delivered(&mut s).await, Some((1, 1)));
    open.set(false);
    for id in [2, 3, 4] {
        broker.inject("s", message(id), 1, &live).unwrap();
    }
    assert_eq!(
        delivered(&mut s).await,
        None,
        "nothing written while lapsed"
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(delivered(&mut s).await, None, "nor seconds later");
    open.set(true);
    let mut got = Vec::new();
    while let Some(d) = delivered(&mut s).await {
        got.push(d);
    }
    assert_eq!(
        got,
        [(2, 1), (3, 1), (4, 1)],
        "each once, in order, attempt 1"
    );
}

// docs/semantics.md#cluster-lease-lapse: a member ended while its messages waited for the lease
// (the gateway's lease ended for good) gets none of them, also once a lease (its gateway's
// next incarnation's) is valid again: its stream ends.
#[tokio::test(start_paused = true)]
async fn messages_waiting_for_the_lease_are_dropped_when_the_member_is_ended() {
    let (broker, mut s, live, open) = gated().await;
    open.set(false);
    for id in [2, 3] {
        broker.inject("s", message(id), 1, &live).unwrap();
    }
    assert_eq!(delivered(&mut s).await, None);
    let member = s.member_id();
    broker.end_member("s", member, &Error::Unavailable("lease ended".into()));
    open.set(true);
    match tokio::time::timeout(Duration::from_secs(1), s.next()).await {
        Ok(Some(Outbound::End(Error::Unavailable(_)))) => {}
        other => panic!("expected the end, got {other:?}"),
    }
    assert!(
        tokio::time::timeout(Duration::from_secs(1), s.next())
            .await
            .is_ok_and(|f| f.is_none()),
        "nothing after the end"
    );
}

// docs/semantics.md#cluster-lease-lapse: a message frame the member's stream took before the
// lapse, while its transport did not poll it through the lapse (the client's HTTP/2 window
// full), is not written once the member was ended and a lease (the next incarnation's) opens
// the gate again (a review found it written).
#[tokio::test(start_paused = true)]
async fn a_message_taken_before_the_lapse_is_not_written_after_the_member_was_ended() {
    let (broker, mut s, live, open) = gated().await;
    for id in [1, 2] {
        broker.inject("s", message(id), 1, &live).unwrap();
    }
    // Both frames are taken at once; 1 is written, 2 stays in `taken`.
    assert_eq!(delivered(&mut s).await, Some((1, 1)));
    // The lease lapses; the stream is not polled (flow control) while the gateway learns its
    // lease was deleted, ends the member (2 goes back: another gateway's member gets it) ...
    open.set(false);
    let member = s.member_id();
    broker.end_member("s", member, &Error::Unavailable("lease ended".into()));
    // ... and its next incarnation's lease is valid: the gate (any incarnation) is open.
    open.set(true);
    match tokio::time::timeout(Duration::from_secs(1), s.next()).await {
        Ok(Some(Outbound::End(Error::Unavailable(_)))) => {}
        other => panic!("message 2 written to a member ended past its lease: {other:?}"),
    }
}

// docs/semantics.md#cluster-lease-checks: past its lease (no lapse patience), a gateway's
// member of an arbitrated singleton settles nothing it holds, whichever way the settle comes
// (unary naming the member, or on its own stream): refused `UNAVAILABLE`, and nothing changes,
// so the message is still the member's until it is ended and given back. A settle of a
// message it does not hold gets its usual answer.
#[tokio::test(start_paused = true)]
async fn past_the_lease_a_settle_of_a_held_message_is_refused_and_changes_nothing() {
    let (broker, mut s, live) = promoted(4, Vec::new()).await;
    let open = Arc::new(AtomicBool::new(true));
    let gate = open.clone();
    broker.gate_singleton_settles(Arc::new(move || gate.load(Ordering::SeqCst)));
    for id in [1, 2] {
        broker.inject("s", message(id), 1, &live).unwrap();
    }
    assert_eq!(delivered(&mut s).await, Some((1, 1)));
    assert_eq!(delivered(&mut s).await, Some((2, 1)));
    let member = s.member_id();
    open.store(false, Ordering::SeqCst);
    for (nack, what) in [(false, "ack"), (true, "nack")] {
        let refused = if nack {
            broker.nack("s", Fence::Member(member), 1)
        } else {
            broker.ack("s", Fence::Member(member), 1)
        };
        match refused {
            Err(Error::Unavailable(why)) => assert!(
                why.contains("lease") && why.contains(&format!("the {what} of message 1")),
                "{why}"
            ),
            other => panic!("a {what} past the lease was answered {other:?}"),
        }
    }
    let refused = s.settler().settle(&[2], &[], &[]).unwrap();
    assert!(
        matches!(refused.as_slice(), [(2, _, Error::Unavailable(_))]),
        "{refused:?}"
    );
    assert!(
        matches!(
            broker.ack("s", Fence::Member(member), 9),
            Err(Error::NotInFlight { .. })
        ),
        "a message not held gets its usual answer"
    );
    assert_eq!(delivered(&mut s).await, None, "the nack changed nothing");
    // The lease valid again (a lapse renewed): both are still held, and settle.
    open.store(true, Ordering::SeqCst);
    broker.ack("s", Fence::Member(member), 1).unwrap();
    assert!(s.settler().settle(&[2], &[], &[]).unwrap().is_empty());
}

// docs/semantics.md#cluster-lease-checks: past the lease, a settle by a member that does not
// hold the message (a standby, or a member id nobody has) gets its usual answer, not the
// lease's refusal.
#[tokio::test(start_paused = true)]
async fn past_the_lease_a_settle_by_a_member_not_holding_the_message_gets_its_usual_answer() {
    let (broker, mut s, live) = promoted(4, Vec::new()).await;
    let mut req = request("s", Mode::Singleton);
    req.member.max_in_flight = 4;
    let standby = broker.open(&req, None).unwrap();
    broker.inject("s", message(1), 1, &live).unwrap();
    assert_eq!(delivered(&mut s).await, Some((1, 1)));
    let answers = || {
        [standby.member_id(), 424_242].map(|member| {
            match broker.ack("s", Fence::Member(member), 1) {
                Err(e) => format!("{:?}", e.kind()),
                Ok(()) => "OK".into(),
            }
        })
    };
    let before = answers();
    let open = Arc::new(AtomicBool::new(false));
    let gate = open.clone();
    broker.gate_singleton_settles(Arc::new(move || gate.load(Ordering::SeqCst)));
    assert_eq!(
        answers(),
        before,
        "(standby, unknown member) past the lease"
    );
    assert!(
        !before.iter().any(|a| a == "OK" || a == "Unavailable"),
        "{before:?}"
    );
}
