//! The cluster campaign as tests: random seeds, determinism, and proof that the checker catches
//! a gateway that keeps acting after its lease ended.

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

// SPEC §9, checks (a)-(d) of `cluster_checker`, on every seed. `TINYBROKER_SIM_SEED=<s>` replays
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
    let seeds: Vec<u64> = (0..count).collect();
    let started = Instant::now();
    let outcomes = run_many(&seeds, None);
    println!(
        "cluster campaign: {} seeds in {:.1?}",
        outcomes.len(),
        started.elapsed()
    );
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
