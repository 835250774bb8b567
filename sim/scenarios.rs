//! Named scenarios with fixed seeds. Each records a trace that insta compares with the committed
//! snapshot in `sim/snapshots/`, so a reviewer reads every failover as a story and any behaviour
//! change shows as a diff (`cargo insta review`).

use std::time::Duration;

use tinybroker::pb::DeliveryMode;

use crate::world::{Behaviour, Setup, World};

const BUDGET: Duration = Duration::from_secs(30);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Asserts liveness, no violations, and the trace snapshot.
fn finish(mut world: World, name: &str) {
    let done = world.run_until_with_budget(BUDGET, World::all_acked);
    // Let the last replies reach the clients, so the story ends on their side too.
    let settle = world.now() + Duration::from_secs(1);
    world.run_until(settle);
    world.trace.close();
    let violations = world.violations();
    assert!(
        violations.is_empty(),
        "violations: {violations:#?}\n{}",
        world.trace.render()
    );
    assert!(
        done,
        "not every message was acked within {BUDGET:?}\n{}",
        world.trace.render()
    );
    insta::assert_snapshot!(name, world.trace.render());
}

// docs/semantics.md#singleton: the active replica crashes holding an unacked message; the earliest standby is
// confirmed with a higher epoch, gets that message with attempt 2, then the rest in order.
#[test]
fn active_crash_mid_message_promotes_earliest_standby() {
    let mut w = World::new(&Setup::new(1, DeliveryMode::Singleton));
    w.replica("a", Behaviour::steady(2000));
    w.replica("b", Behaviour::steady(100).starting_after(100));
    w.replica("c", Behaviour::steady(100).starting_after(200));
    w.publisher(3, ms(500), ms(100));
    w.run_until(ms(1000));
    w.crash("a");
    finish(w, "active_crash_mid_message_promotes_earliest_standby");
}

// docs/semantics.md#singleton-invariants (2, 3, 5): A then B crash holding the same message; C leads with a higher
// epoch each time; the message comes to C with attempt 3 and nothing is lost.
#[test]
fn cascade_of_crashes_hands_leadership_down_the_line() {
    let mut w = World::new(&Setup::new(2, DeliveryMode::Singleton));
    w.replica("a", Behaviour::steady(2000));
    w.replica("b", Behaviour::steady(2000).starting_after(100));
    w.replica("c", Behaviour::steady(100).starting_after(200));
    w.publisher(4, ms(500), ms(100));
    w.run_until(ms(1000));
    w.crash("a");
    w.run_until(ms(1500));
    w.crash("b");
    finish(w, "cascade_of_crashes_hands_leadership_down_the_line");
}

// docs/semantics.md#singleton: a crashed replica that restarts rejoins at the back of the line and never preempts;
// it leads only when everyone ahead of it is gone.
#[test]
fn restarted_replica_rejoins_at_the_back_and_never_preempts() {
    let mut w = World::new(&Setup::new(3, DeliveryMode::Singleton));
    w.replica("a", Behaviour::steady(300));
    w.replica("b", Behaviour::steady(300).starting_after(100));
    w.publisher(12, ms(500), ms(250));
    w.run_until(ms(1000));
    w.crash("a");
    w.run_until(ms(1500));
    w.restart("a");
    w.run_until(ms(3000));
    w.crash("b");
    finish(
        w,
        "restarted_replica_rejoins_at_the_back_and_never_preempts",
    );
}

// docs/semantics.md#liveness: the active replica is partitioned (no FIN). Keepalive notices within its bound, the
// standby is promoted; after the partition heals, the old active's late ack is refused by the
// fence while the new holder still has the message.
#[test]
fn partitioned_active_is_replaced_and_its_late_ack_is_fenced() {
    let mut w = World::new(&Setup::new(4, DeliveryMode::Singleton));
    w.replica("a", Behaviour::steady(6000));
    w.replica("b", Behaviour::steady(5000).starting_after(100));
    w.publisher(1, ms(500), ms(100));
    w.run_until(ms(1000));
    w.partition("a");
    w.run_until(ms(5000));
    w.repair("a");
    finish(
        w,
        "partitioned_active_is_replaced_and_its_late_ack_is_fenced",
    );
}

// docs/semantics.md#singleton-invariant-3: replicas join and leave around a failover while the publisher keeps
// publishing; every message is acked.
#[test]
fn joins_and_leaves_during_failover_lose_nothing() {
    let mut w = World::new(&Setup::new(5, DeliveryMode::Singleton));
    w.replica("a", Behaviour::steady(150));
    w.replica("b", Behaviour::steady(150).starting_after(100));
    w.replica("c", Behaviour::steady(150).starting_after(200));
    w.replica("d", Behaviour::steady(150).starting_after(1100));
    w.publisher(20, ms(500), ms(100));
    w.run_until(ms(1000));
    w.crash("c");
    w.crash("a");
    w.run_until(ms(1200));
    w.restart("c");
    w.run_until(ms(1600));
    w.crash("b");
    finish(w, "joins_and_leaves_during_failover_lose_nothing");
}

// docs/semantics.md#subscriptions and docs/semantics.md#delivery: queue mode; a member crashes with several messages in flight; the others get them
// (attempt 2) and every message is acked.
#[test]
fn queue_member_crash_hands_its_messages_to_the_others() {
    let mut w = World::new(&Setup::new(6, DeliveryMode::Queue));
    w.replica("a", Behaviour::steady(3000).with_window(3));
    w.replica("b", Behaviour::steady(200).starting_after(100));
    w.replica("c", Behaviour::steady(200).starting_after(200));
    w.publisher(9, ms(500), ms(50));
    w.run_until(ms(1200));
    w.crash("a");
    finish(w, "queue_member_crash_hands_its_messages_to_the_others");
}

// docs/semantics.md#modes: broadcast; one subscriber's crash does not disturb the others, and when it comes
// back within the idle time its own queue is waiting for it.
#[test]
fn broadcast_subscriber_crash_does_not_disturb_the_others() {
    let mut w = World::new(&Setup::new(7, DeliveryMode::Broadcast));
    w.replica("a", Behaviour::steady(100));
    w.replica("b", Behaviour::steady(100));
    w.replica("c", Behaviour::steady(100));
    w.publisher(6, ms(500), ms(200));
    w.run_until(ms(900));
    w.crash("b");
    w.run_until(ms(2500));
    w.restart("b");
    finish(w, "broadcast_subscriber_crash_does_not_disturb_the_others");
}
