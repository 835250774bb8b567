//! The cluster campaign: one seed drives the number of gateways and subscriptions, the workload
//! (members join and close on random gateways) and the faults (gateways starting together, some
//! failing their first lease create; gateway crashes and restarts, partitions from the backplane
//! and heals, hosts frozen and resumed) for a fault phase; then everything heals, each
//! subscription gets a fresh member, and the cluster must settle within a budget.

use std::time::Duration;

use crate::{cluster::ClusterWorld, rng::Rng, trace::Trace};

const FAULT_PHASE: Duration = Duration::from_secs(15);
/// How long the healed cluster has to settle.
pub const SETTLE_BUDGET: Duration = Duration::from_secs(10);

/// What one seed did.
pub struct ClusterOutcome {
    pub seed: u64,
    pub violations: Vec<String>,
    /// Why the cluster did not settle after the faults healed, if it did not.
    pub unsettled: Option<String>,
    /// How many watch deliveries of a deletion were skipped because it expired first.
    pub skipped_deletions: u64,
    /// How many deletions gateways learned from a refused compare-and-set instead.
    pub deletions_learned: u64,
    /// Hand-overs check (f) saw: (from a dead gateway's member, clean).
    pub hand_overs: (u64, u64),
    /// Acts (deliveries and acks) check (g) saw.
    pub acts: u64,
    /// Step-downs (by priority or hand-over) whose member settled, check (j).
    pub step_downs: u64,
    /// Gateway leases that lapsed, and those of them a confirmed renewal ended (the gateway
    /// went on with its members).
    pub lapses: (u64, u64),
    /// Fenced publishes check (i) saw: (stored, refused), and record writes a full stream
    /// refused.
    pub fenced: (u64, u64, u64),
    pub trace: Trace,
}

impl ClusterOutcome {
    pub fn failed(&self) -> bool {
        !self.violations.is_empty() || self.unsettled.is_some()
    }

    pub fn report(&self) -> String {
        let mut out = format!("cluster seed {} failed:\n", self.seed);
        for v in self.violations.iter().take(10) {
            out.push_str(&format!("  {v}\n"));
        }
        if let Some(why) = &self.unsettled {
            out.push_str(&format!(
                "  (d) not settled {SETTLE_BUDGET:?} after the faults healed: {why}\n"
            ));
        }
        out.push_str(&format!(
            "reproduce with: TINYBROKER_SIM_SEED={} cargo test --test sim cluster_campaign -- --nocapture\n",
            self.seed
        ));
        out
    }
}

/// Runs one seed of the cluster campaign.
pub fn run(seed: u64) -> ClusterOutcome {
    let mut rng = Rng::new(seed);
    let gateways = rng.range(2, 4) as usize;
    let subs: Vec<String> = (0..rng.range(1, 2)).map(|i| format!("s{i}")).collect();
    let mut world = ClusterWorld::new(seed ^ 0xc1a5_7e12, gateways);
    // A third of the seeds join with priorities and ask for hand-overs
    // (docs/semantics.md#cluster-priority-and-hand-over).
    let ranked = rng.range(0, 2) == 0;
    let mut t = Duration::from_millis(100);
    // A backplane outage under way (the coordination bucket electing its leader): when it
    // ends, and the gateways it cut off.
    let mut outage: Option<(Duration, Vec<usize>)> = None;
    while t < FAULT_PHASE {
        t += Duration::from_millis(rng.range(20, 400));
        world.run_until(t);
        if outage.as_ref().is_some_and(|(until, _)| t >= *until) {
            let (_, cut) = outage.take().unwrap_or_default();
            for slot in cut {
                world.heal(slot);
            }
        }
        let live = world.live_slots();
        let slot = rng.range(0, gateways as u64 - 1) as usize;
        match rng.range(0, 20) {
            0..=7 if live.contains(&slot) => {
                let sub = subs[rng.range(0, subs.len() as u64 - 1) as usize].clone();
                if ranked {
                    world.join_ranked(slot, &sub, rng.range(0, 3) as u32);
                } else {
                    world.join(slot, &sub);
                }
            }
            // A hand-over asked at any gateway.
            17 if ranked && live.contains(&slot) => {
                let sub = subs[rng.range(0, subs.len() as u64 - 1) as usize].clone();
                world.hand_over(slot, &sub);
            }
            8..=12 => world.close_one(rng.next_u64()),
            13 if live.len() > 1 => {
                let back = Duration::from_millis(rng.range(100, 3000));
                world.crash(slot, back);
            }
            14..=15 if !world.is_partitioned(slot) => world.partition(slot),
            16..=18 => world.heal(slot),
            // A host frozen (SIGSTOP), often past its lease.
            19 if live.contains(&slot) => {
                let frozen = Duration::from_millis(rng.range(100, 2_500));
                world.freeze(slot, frozen);
            }
            // The backplane answers no gateway for a while (its leader lost: an election),
            // often past the lease, sometimes past the lapse patience
            // (docs/semantics.md#cluster-lease-lapse).
            20 if outage.is_none() => {
                let cut: Vec<usize> = (0..gateways)
                    .filter(|s| !world.is_partitioned(*s))
                    .collect();
                for slot in &cut {
                    world.partition(*slot);
                }
                let lasts = Duration::from_millis(rng.range(300, 2_500));
                outage = Some((t + lasts, cut));
            }
            _ => {}
        }
    }
    for slot in 0..gateways {
        world.heal(slot);
    }
    world.restart_crashed();
    for sub in &subs {
        let live = world.live_slots();
        let slot = live[rng.range(0, live.len() as u64 - 1) as usize];
        world.join(slot, sub);
    }
    world.checker.trace.at(world.now(), "HEALED: settle phase");
    let start = world.now();
    let mut unsettled = world.checker.unsettled();
    while unsettled.is_some() && world.now() < start + SETTLE_BUDGET {
        let next = world.now() + Duration::from_millis(50);
        world.run_until(next);
        unsettled = world.checker.unsettled();
    }
    world.checker.trace.close();
    ClusterOutcome {
        seed,
        violations: world.checker.violations().to_vec(),
        unsettled,
        skipped_deletions: world.skipped_deletions(),
        deletions_learned: world.deletions_learned(),
        hand_overs: world.checker.hand_overs,
        acts: world.checker.acts,
        step_downs: world.checker.step_downs,
        lapses: world.lapses(),
        fenced: world.fenced(),
        trace: world.checker.trace.clone(),
    }
}
