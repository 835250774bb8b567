//! The cluster campaign as tests: random seeds, determinism, and proof that the checker catches
//! a gateway that keeps acting after its lease ended, or that waits for an expired deletion.

use std::time::Instant;

use tinybroker::core::planted::PlantedBug;

use crate::cluster_campaign::{self as cluster, ClusterOutcome};

/// Seeds run by default; `TINYBROKER_SIM_SEEDS` overrides.
const DEFAULT_SEEDS: u64 = 200;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// Runs `seeds` on the machine's threads (each simulation on one), with `bug` planted; in seed
/// order.
fn run_many(seeds: &[u64], bug: Option<PlantedBug>) -> Vec<ClusterOutcome> {
    let mut outcomes = crate::campaign::run_seeds(seeds, bug, cluster::run);
    outcomes.sort_by_key(|o| o.seed);
    outcomes
}

fn fail_on(outcomes: &[ClusterOutcome]) {
    let failed: Vec<_> = outcomes.iter().filter(|o| o.failed()).collect();
    if let Some(first) = failed.first() {
        eprintln!(
            "--- trace of cluster seed {} (last 60 lines) ---\n{}",
            first.seed,
            first.trace.tail(60)
        );
        let reports: String = failed.iter().map(|o| o.report()).collect();
        panic!(
            "{} of {} cluster seeds failed\n{reports}",
            failed.len(),
            outcomes.len()
        );
    }
}

// docs/semantics.md#cluster-mode, checks (a)-(d) of `cluster_checker`, on every seed. `TINYBROKER_SIM_SEED=<s>` replays
// one seed with its whole trace; `TINYBROKER_SIM_SEEDS=<n>` runs n seeds.
#[test]
fn cluster_campaign_random_seeds_hold_every_invariant() {
    if let Some(seed) = env_u64("TINYBROKER_SIM_SEED") {
        let outcome = cluster::run(seed);
        println!("{}", outcome.trace.render());
        fail_on(&[outcome]);
        return;
    }
    let count = env_u64("TINYBROKER_SIM_SEEDS").unwrap_or(DEFAULT_SEEDS);
    let base = env_u64("TINYBROKER_SIM_SEED_BASE").unwrap_or(0);
    let seeds: Vec<u64> = (base..base + count).collect();
    let started = Instant::now();
    let outcomes = run_many(&seeds, None);
    let skipped: u64 = outcomes.iter().map(|o| o.skipped_deletions).sum();
    let learned: u64 = outcomes.iter().map(|o| o.deletions_learned).sum();
    let taken_over: u64 = outcomes.iter().map(|o| o.hand_overs.0).sum();
    let clean: u64 = outcomes.iter().map(|o| o.hand_overs.1).sum();
    let acts: u64 = outcomes.iter().map(|o| o.acts).sum();
    let stored: u64 = outcomes.iter().map(|o| o.fenced.0).sum();
    let refused: u64 = outcomes.iter().map(|o| o.fenced.1).sum();
    let full: u64 = outcomes.iter().map(|o| o.fenced.2).sum();
    let step_downs: u64 = outcomes.iter().map(|o| o.step_downs).sum();
    let lapses: u64 = outcomes.iter().map(|o| o.lapses.0).sum();
    let resumed: u64 = outcomes.iter().map(|o| o.lapses.1).sum();
    println!(
        "cluster campaign: {} seeds in {:.1?}, {skipped} deliveries of expired deletions skipped, {learned} deletions learned from a refusal, hand-overs: {taken_over} from dead gateways, {clean} clean, {acts} deliveries and acks checked against the lease, fenced publishes: {stored} stored, {refused} refused, {full} record writes refused by a full stream, {step_downs} step-downs settled (priority or hand-over), {lapses} leases lapsed, {resumed} of them renewed with their members kept",
        outcomes.len(),
        started.elapsed()
    );
    // The campaign reaches the case the seam allows: a watch that never sees a deletion. (A
    // gateway that needs the refusal to learn of it is rare here: the scenario
    // `cluster_a_member_joining_after_an_unseen_expired_deletion_...` shows that case, and
    // `learned` counts mostly refusals that ran ahead of the watch.)
    if count >= DEFAULT_SEEDS {
        assert!(
            skipped > 0,
            "in {count} seeds, no watch skipped an expired deletion"
        );
        assert!(acts > 0, "in {count} seeds, no gateway acted");
        // Check (i) sees deposed leaders' fenced publishes refused, and leaders' stored.
        assert!(
            stored > 0 && refused > 0 && full > 0,
            "in {count} seeds, fenced publishes: {stored} stored, {refused} refused; {full} record writes refused as full"
        );
        // Check (j) sees step-downs (priorities and hand-overs are drawn).
        assert!(step_downs > 0, "in {count} seeds, no member stepped down");
        // Lapsed leases both renewed (members kept) and ended (docs/semantics.md#cluster-lease-lapse).
        assert!(
            resumed > 0 && lapses > resumed,
            "in {count} seeds, {lapses} leases lapsed, {resumed} renewed"
        );
        // Check (f) sees both kinds of hand-over.
        assert!(
            taken_over > 0 && clean > 0,
            "in {count} seeds, hand-overs: {taken_over} from dead gateways, {clean} clean"
        );
    }
    fail_on(&outcomes);
}

// Determinism: the same seed twice gives byte-identical traces.
#[test]
fn cluster_campaign_same_seed_gives_identical_traces() {
    for seed in [3, 1234] {
        let first = cluster::run(seed).trace.render();
        let second = cluster::run(seed).trace.render();
        assert!(
            first.lines().count() > 50,
            "trace too short to mean anything"
        );
        assert_eq!(first, second, "cluster seed {seed} is not reproducible");
    }
}

// The checker has teeth: a gateway that keeps its active member after its lease ended is caught
// (two members active in overlapping periods), within a few seeds.
#[test]
fn cluster_campaign_catches_a_gateway_acting_after_its_lease_expired() {
    let bug = PlantedBug::GatewayActsAfterLeaseExpiry;
    let seeds: Vec<u64> = (0..40).collect();
    let caught = run_many(&seeds, Some(bug))
        .into_iter()
        .find(ClusterOutcome::failed);
    let caught = caught.unwrap_or_else(|| panic!("{bug:?} was not caught in 40 seeds"));
    println!("{bug:?}: caught by {}", caught.report());
    assert!(
        caught.violations.iter().any(|v| v.contains("(b)")),
        "caught, but not as two overlapping actives: {:?}",
        caught.violations
    );
}

/// A gateway whose watch never sees a line's deletion: slot 1 is cut off (for less than a
/// lease, so it keeps its lease) while the line's only member, on slot 0, leaves and the
/// deletion expires; then a member joins on slot 1. Returns why the cluster has not settled a
/// second after, if it has not, and how many deletions were learned from a refusal.
fn join_after_an_unseen_expired_deletion(bug: Option<PlantedBug>) -> (Option<String>, u64) {
    use std::time::Duration;
    let ms = Duration::from_millis;
    tinybroker::core::planted::plant(bug);
    let mut world = crate::cluster::ClusterWorld::new(7, 2);
    world.expire_deletions_after(ms(100));
    world.run_until(ms(200));
    world.join(0, "s");
    world.run_until(ms(400));
    assert_eq!(world.checker.unsettled(), None, "the first member leads");
    world.partition(1);
    world.close_one(0);
    world.run_until(ms(800));
    world.heal(1);
    world.run_until(ms(900));
    assert!(
        world.skipped_deletions() > 0,
        "slot 1's watch skipped the deletion"
    );
    world.join(1, "s");
    world.run_until(ms(1_900));
    let outcome = (world.checker.unsettled(), world.deletions_learned());
    tinybroker::core::planted::plant(None);
    outcome
}

// The seam: a deletion may expire before a watch delivers it. A gateway that learns of it from
// the refusal of its compare-and-set gets its new member into the line; one that waits for the
// watch, as for any conflict (the planted bug), never does, and the checker sees the cluster
// not settle.
#[test]
fn cluster_a_member_joining_after_an_unseen_expired_deletion_leads_and_waiting_is_caught() {
    let (unsettled, learned) = join_after_an_unseen_expired_deletion(None);
    assert_eq!(unsettled, None, "the new member leads");
    assert!(learned > 0, "learned from the refusal");
    let (unsettled, _) =
        join_after_an_unseen_expired_deletion(Some(PlantedBug::WaitForExpiredDeletion));
    assert!(
        unsettled.is_some(),
        "{:?} was not caught",
        PlantedBug::WaitForExpiredDeletion
    );
}

// Slot 1's first lease create lands but its answer is lost (cut off right after), so it never
// held a confirmed lease: slot 0 finds that lease stale and deletes it while slot 1 is cut off.
// A lease's deletion never expires (were it to, its renewals refused with "no value" would be
// the only news; those fence it too): once healed, slot 1 learns it is dead, starts again as a
// new incarnation, and a member that joins there leads.
#[test]
fn cluster_a_gateway_whose_lease_was_deleted_while_cut_off_starts_again() {
    use std::time::Duration;
    use tinybroker::cluster::coordinator::lease_key;
    let ms = Duration::from_millis;
    let mut world = crate::cluster::ClusterWorld::new(7, 2);
    world.expire_deletions_after(ms(100));
    let stale = world.gateway_id(1);
    let lease = lease_key(stale);
    assert!(
        world.run_until_state(Duration::from_micros(100), ms(100), |w| w
            .entry(&lease)
            .is_some()),
        "slot 1's lease create did not land"
    );
    // Its answer takes at least half a millisecond: it is lost.
    world.partition(1);
    assert!(
        world.run_until_state(ms(5), ms(3_000), |w| w
            .entry(&lease)
            .is_some_and(|e| e.value.is_none())),
        "slot 0 did not delete slot 1's stale lease"
    );
    // A lease's deletion never expires (only subscriptions' do): it is how gateways learn
    // that another is dead.
    world.run_until(world.now() + ms(1_000));
    assert!(
        world.entry(&lease).is_some_and(|e| e.value.is_none()),
        "the lease's deletion expired"
    );
    world.heal(1);
    assert!(
        world.run_until_state(ms(5), ms(1_000), |w| w.gateway_id(1) != stale),
        "slot 1's gateway g{} has no lease in the bucket, yet it neither fenced itself nor \
         started again",
        stale.0
    );
    world.join(1, "s");
    assert!(
        world.run_until_state(ms(5), ms(3_000), |w| w.checker.unsettled().is_none()),
        "the member on slot 1 does not lead: {:?}",
        world.checker.unsettled()
    );
}

// A dead gateway's members leave the lines once its lease is deleted. Here the gateway that
// deleted it (slot 1) is cut off before its line without the dead member lands. Were the
// lease's deletion to expire before any gateway with a lease saw it, every incarnation after
// would know nothing of the dead gateway and its member would stay active at the head of the
// line for good. So a lease's deletion never expires (only subscriptions' do): the next
// incarnations learn of it and remove the dead member.
#[test]
fn cluster_a_dead_gateways_member_leaves_the_line_when_its_deleter_is_cut_off() {
    use std::time::Duration;
    use tinybroker::cluster::coordinator::lease_key;
    let ms = Duration::from_millis;
    let mut world = crate::cluster::ClusterWorld::new(7, 2);
    world.expire_deletions_after(ms(100));
    world.run_until(ms(200));
    world.join(0, "s");
    assert!(
        world.run_until_state(ms(5), ms(500), |w| w.checker.unsettled().is_none()),
        "the first member does not lead: {:?}",
        world.checker.unsettled()
    );
    let dead = lease_key(world.gateway_id(0));
    world.partition(0);
    assert!(
        world.run_until_state(Duration::from_micros(100), ms(3_000), |w| w
            .entry(&dead)
            .is_some_and(|e| e.value.is_none())),
        "slot 1 did not delete slot 0's lease"
    );
    // The line without the dead member is written at least a millisecond later: it fails.
    let deleter = world.gateway_id(1);
    world.partition(1);
    // A lease's deletion never expires (only subscriptions' do): the next incarnations learn
    // of the dead gateway from it.
    world.run_until(world.now() + ms(1_000));
    assert!(
        world.entry(&dead).is_some_and(|e| e.value.is_none()),
        "the lease's deletion expired"
    );
    assert!(
        world.run_until_state(ms(5), ms(2_000), |w| w.gateway_id(1) != deleter),
        "slot 1, cut off, did not start again"
    );
    world.heal(0);
    world.heal(1);
    world.join(1, "s");
    assert!(
        world.run_until_state(ms(5), ms(5_000), |w| w.checker.unsettled().is_none()),
        "the dead gateway's member holds the line: {:?}",
        world.checker.unsettled()
    );
}

/// Slot 0 holds the active member, slot 1 a standby; slot 0's host is frozen for `frozen`
/// (SIGSTOP), with messages and acks for its member queued meanwhile, then resumes. Returns
/// the violations and how many acts the checker saw.
fn frozen_active_gateway(
    bug: Option<PlantedBug>,
    frozen: std::time::Duration,
) -> (Vec<String>, u64) {
    use std::time::Duration;
    let ms = Duration::from_millis;
    tinybroker::core::planted::plant(bug);
    let mut world = crate::cluster::ClusterWorld::new(11, 2);
    world.fail_first_lease_create(0, false);
    world.fail_first_lease_create(1, false);
    world.run_until(ms(200));
    world.join(0, "s");
    world.run_until(ms(400));
    world.join(1, "s");
    world.run_until(ms(700));
    assert_eq!(world.checker.unsettled(), None, "slot 0's member leads");
    let before = world.checker.acts;
    assert!(before > 0, "slot 0 acts for its member while it leads");
    world.freeze(0, frozen);
    world.run_until(world.now() + frozen + ms(2_000));
    let settled = world.checker.unsettled();
    let outcome = (world.checker.violations().to_vec(), world.checker.acts);
    tinybroker::core::planted::plant(None);
    assert_eq!(settled, None, "the cluster settles after the resume");
    outcome
}

// docs/semantics.md#cluster-lease-checks, check (g): a gateway frozen past its lease (2 s, the
// lease is 0.9 s) resumes with deliveries and acks queued for its deposed member: it checks
// its lease at each and sends none. A gateway that skips the check (the planted bug) delivers
// them after the standby elsewhere was promoted, and the checker says so.
#[test]
fn cluster_a_gateway_frozen_past_its_lease_delivers_and_acks_nothing_when_it_resumes() {
    use std::time::Duration;
    let (violations, _) = frozen_active_gateway(None, Duration::from_secs(2));
    assert!(violations.is_empty(), "{violations:#?}");
    // A short freeze, within the lease: it goes on acting for its member.
    let (violations, acts) = frozen_active_gateway(None, Duration::from_millis(200));
    assert!(violations.is_empty(), "{violations:#?}");
    assert!(acts > 100, "{acts} acts");
    let bug = PlantedBug::GatewaySkipsLeaseCheck;
    let (violations, _) = frozen_active_gateway(Some(bug), Duration::from_secs(2));
    assert!(
        violations.iter().any(|v| v.contains("(g)")),
        "{bug:?} was not caught: {violations:#?}"
    );
}

// Check (g) over the campaign: with the lease check skipped, some seed's frozen gateway acts
// past its lease.
#[test]
fn cluster_campaign_catches_a_gateway_that_skips_its_lease_check() {
    campaign_catches(PlantedBug::GatewaySkipsLeaseCheck, "(g)");
}

/// Runs 60 campaign seeds with `bug` planted: some seed's violations name `check`; prints how
/// many caught it and the first one's report.
fn campaign_catches(bug: PlantedBug, check: &str) {
    let seeds: Vec<u64> = (0..60).collect();
    let outcomes = run_many(&seeds, Some(bug));
    let caught: Vec<&ClusterOutcome> = outcomes
        .iter()
        .filter(|o| o.violations.iter().any(|v| v.contains(check)))
        .collect();
    println!(
        "{bug:?}: caught by {} of {} seeds",
        caught.len(),
        seeds.len()
    );
    let first = caught
        .first()
        .unwrap_or_else(|| panic!("{bug:?} was not caught in {} seeds", seeds.len()));
    println!("{}", first.report());
}

/// Two gateways start together; slot 0's first lease create fails unanswered, so it waits a
/// pause for its next incarnation. A member joins at slot 0 during the pause, another at
/// slot 1 after that join was answered. Returns the violations and the line's member ids.
fn started_together_with_a_failed_create(
    bug: Option<PlantedBug>,
) -> (Vec<String>, Vec<u64>, (u64, u64)) {
    use std::time::Duration;
    let ms = Duration::from_millis;
    tinybroker::core::planted::plant(bug);
    let mut world = crate::cluster::ClusterWorld::new(5, 2);
    world.fail_first_lease_create(0, true);
    world.fail_first_lease_create(1, false);
    world.run_until(ms(100));
    let first = world.join(0, "s");
    // Answered once it is in the line (or at once, with the bug): then the second arrives.
    world.run_until_state(ms(5), ms(5_000), |w| w.checker.is_answered(first));
    let second = world.join(1, "s");
    world.run_until(world.now() + ms(3_000));
    let outcome = (
        world.checker.violations().to_vec(),
        world.line("s"),
        (first, second),
    );
    tinybroker::core::planted::plant(None);
    outcome
}

// docs/semantics.md#cluster-join-order, check (h): a gateway without a lease (its first create
// failed, it waits for its next incarnation) admits no member: the join waits for the lease
// and is answered once in the line, so a member that joins later elsewhere stands behind it.
// A gateway that answers joins at once (the planted bug) lets the later one ahead.
#[test]
fn cluster_gateways_started_together_keep_join_order_though_a_first_lease_create_fails() {
    let (violations, line, (first, second)) = started_together_with_a_failed_create(None);
    assert!(violations.is_empty(), "{violations:#?}");
    assert_eq!(line, vec![first, second]);
    let bug = PlantedBug::JoinWithoutLease;
    let (violations, line, _) = started_together_with_a_failed_create(Some(bug));
    assert!(
        violations.iter().any(|v| v.contains("(h)")),
        "{bug:?} was not caught (line {line:?}): {violations:#?}"
    );
}

// Check (h) over the campaign: joins answered without a lease are caught in some seed.
#[test]
fn cluster_campaign_catches_joins_answered_without_a_lease() {
    let bug = PlantedBug::JoinWithoutLease;
    let seeds: Vec<u64> = (0..60).collect();
    let outcomes = run_many(&seeds, Some(bug));
    let caught = outcomes
        .iter()
        .filter(|o| o.violations.iter().any(|v| v.contains("(h)")))
        .count();
    println!("{bug:?}: caught by {caught} of {} seeds", seeds.len());
    assert!(
        caught > 0,
        "{bug:?} was not caught in {} seeds",
        seeds.len()
    );
}

// docs/semantics.md#cluster-fenced-publish, check (i): a gateway frozen past its lease holds
// the leader, whose client goes on publishing fenced side effects; the standby elsewhere is
// confirmed only after its epoch's record is stored, so none of the deposed leader's is stored
// after that. Confirming before the record (the planted bug) lets some through, and the
// campaign says so.
#[test]
fn cluster_a_deposed_leaders_fenced_publishes_stop_at_its_successors_record() {
    use std::time::Duration;
    let (violations, _) = frozen_active_gateway(None, Duration::from_secs(2));
    assert!(violations.is_empty(), "{violations:#?}");
    campaign_catches(PlantedBug::ActivateBeforeFenceRecord, "(i)");
}

// docs/semantics.md#cluster-priority-and-hand-over, check (j): a gateway that moves the line
// past its active member as soon as it asks it to step down, not once it settled, is caught.
#[test]
fn cluster_campaign_catches_a_step_down_before_the_member_settled() {
    campaign_catches(PlantedBug::StepDownBeforeSettled, "(j)");
}

// docs/semantics.md#cluster-lease-lapse: a lapsed gateway that takes any answer to its renewal
// as a confirmation, also the refusal saying another gateway deleted its lease, acts again for
// a member others promoted past: check (g) catches it.
#[test]
fn cluster_campaign_catches_a_lapsed_gateway_resuming_without_a_confirmed_renewal() {
    campaign_catches(PlantedBug::LapseResumesOnAnyAnswer, "(g)");
}
