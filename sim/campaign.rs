//! The randomized fault campaign: one seed drives the mode, acked or ack-free delivery, the
//! replicas' behaviour (processing time, nacks, abandoned streams with late acks, windows, and
//! how they ack: naming their member, by connection, or on their own stream), the publisher, and
//! a schedule of crashes, restarts, partitions, heals, holds and releases, and, one seed in four,
//! crashes and restarts of the broker itself; a singleton's leadership is watched by a client
//! that is no member. The checker watches every input; after the faults
//! stop, a liveness phase requires every published message to be acked (or, ack-free, written)
//! within a simulated-time budget (messages the broker held when it crashed are gone: it keeps
//! everything in memory).

use std::{collections::BTreeSet, time::Duration};

use tinybroker::{core::planted::PlantedBug, pb::DeliveryMode};

use crate::{
    rng::Rng,
    trace::Trace,
    world::{Behaviour, Carriage, Setup, World},
};

/// How long faults are injected, in simulated time.
const FAULT_PHASE: Duration = Duration::from_secs(12);
/// How long the healed system has to ack everything.
const LIVENESS_BUDGET: Duration = Duration::from_secs(60);

/// What one seed did.
pub struct Outcome {
    pub seed: u64,
    pub mode: DeliveryMode,
    pub violations: Vec<String>,
    pub live: bool,
    /// Why liveness failed, when it did.
    pub stuck: String,
    pub trace: Trace,
}

impl Outcome {
    pub fn failed(&self) -> bool {
        !self.violations.is_empty() || !self.live
    }

    pub fn report(&self) -> String {
        let mut out = format!("seed {} ({:?}) failed:\n", self.seed, self.mode);
        for v in self.violations.iter().take(10) {
            out.push_str(&format!("  {v}\n"));
        }
        if !self.live {
            out.push_str(&format!(
                "  liveness: not every message was acked within {LIVENESS_BUDGET:?} after faults stopped: {}\n",
                self.stuck
            ));
        }
        out.push_str(&format!(
            "reproduce with: TINYBROKER_SIM_SEED={} cargo test --test sim campaign -- --nocapture\n",
            self.seed
        ));
        out
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// When the broker crashes and when it comes back, as (crash, restart) pairs in time order. From
/// their own stream, so older seeds keep their schedules: one seed in four crashes the broker once
/// or twice during the fault phase and brings it back after up to 1.5 s.
fn broker_outages(seed: u64) -> Vec<(Duration, Duration)> {
    let mut rng = Rng::new(seed ^ 0xb40c_e5ca_3e57);
    let mut outages = Vec::new();
    if rng.range(0, 3) != 0 {
        return outages;
    }
    let mut crash = ms(rng.range(1000, 5000));
    for _ in 0..rng.range(1, 2) {
        let back = crash + ms(rng.range(0, 1500));
        outages.push((crash, back));
        crash = back + ms(rng.range(1000, 4000));
        if crash >= FAULT_PHASE {
            break;
        }
    }
    outages
}

/// Runs one seed of the campaign.
pub fn run(seed: u64) -> Outcome {
    let mut rng = Rng::new(seed);
    let mode = match rng.range(0, 9) {
        0..=5 => DeliveryMode::Singleton,
        6..=7 => DeliveryMode::Queue,
        _ => DeliveryMode::Broadcast,
    };
    // Carriages and ack-free draws come from their own stream, so older seeds keep their modes,
    // replicas and fault schedules.
    let mut carriages = Rng::new(seed ^ 0x5eed_ca77_1a6e);
    let ack_free = carriages.range(0, 6) == 0;
    // One seed in five: queues so short that they overflow, under the drop-oldest policy.
    let mut setup = Setup::new(seed, mode);
    if carriages.range(0, 5) == 0 {
        setup.drop_oldest = true;
        setup.limits.max_queue_messages = carriages.range(2, 6);
    }
    // Priorities and hand-overs (docs/semantics.md#priority, docs/semantics.md#hand-over),
    // from their own stream too: one singleton seed in three gives its replicas priorities 0
    // to 2, one in two has an operator asking for hand-overs, with a 400 ms hand-over timeout
    // that slow replicas overrun.
    let mut leadership = Rng::new(seed ^ 0x9a10_7e11_ca5e);
    let ranked = mode == DeliveryMode::Singleton && leadership.range(0, 2) == 0;
    let handing_over = mode == DeliveryMode::Singleton && leadership.range(0, 1) == 0;
    if handing_over {
        setup.limits.handover_timeout = ms(400);
    }
    let mut world = World::new(&Setup { ack_free, ..setup });
    let mut windows = Rng::new(seed ^ 0x0bde_2f10_77a1);
    // Fenced side effects, from their own stream too: half the singleton seeds' replicas
    // publish one per message processed, also late, after abandoning their stream.
    let mut effects = Rng::new(seed ^ 0x00fe_0ced_e77e);
    let replicas = rng.range(2, 4);
    let mut names = Vec::new();
    for i in 0..replicas {
        let lo = rng.range(10, 200);
        let behaviour = Behaviour {
            seed: rng.next_u64(),
            process_ms: (lo, lo + rng.range(0, 800)),
            nack_percent: rng.range(0, 10),
            abandon_percent: rng.range(0, 8),
            start_after: ms(i * rng.range(0, 200)),
            window: match mode {
                DeliveryMode::Queue => rng.range(1, 3) as u32,
                // Singleton windows above 1 (from their own stream, so older seeds keep their
                // schedules): with nacks they make a member hold messages out of publish order,
                // which a failover must put back in order.
                DeliveryMode::Singleton => windows.range(1, 3) as u32,
                _ => 1,
            },
            carriage: match carriages.range(0, 3) {
                0 => Carriage::Connection,
                1 => Carriage::Stream,
                _ => Carriage::Fenced,
            },
            fenced_effects: mode == DeliveryMode::Singleton && effects.range(0, 2) == 0,
            priority: if ranked {
                leadership.range(0, 2) as u32
            } else {
                0
            },
        };
        let name = format!("r{i}");
        world.replica(&name, behaviour);
        names.push(name);
    }
    // A singleton's leadership is watched by a client that is no member
    // (docs/semantics.md#watching-leadership): the checker holds every frame it is told to an
    // activation the broker made, with rising epochs.
    if mode == DeliveryMode::Singleton {
        world.watcher("watcher");
    }
    if handing_over {
        world.operator("operator", leadership.next_u64(), FAULT_PHASE);
    }
    // One seed in three publishes in bursts of 2 to 16 on `PublishStream` (from its own
    // stream, so older seeds keep their schedules): the broker publishes each burst as runs.
    // A burst stays under the broker's 64-message round: a seed publishes at most 30 messages,
    // which slow replicas must still ack within the liveness phase (the shell's and the API's
    // tests cross that boundary).
    let mut bursts = Rng::new(seed ^ 0x0b57_9ab1_15e5);
    let burst = match bursts.range(0, 2) {
        0 => bursts.range(2, 16) as usize,
        _ => 1,
    };
    world.publisher_in_bursts(
        rng.range(10, 30) as usize,
        ms(300),
        ms(rng.range(50, 400)),
        burst,
    );

    let mut crashed = BTreeSet::new();
    let mut partitioned = BTreeSet::new();
    let mut held = BTreeSet::new();
    let mut broker_events: Vec<(Duration, bool)> = broker_outages(seed)
        .into_iter()
        .flat_map(|(crash, back)| [(crash, true), (back, false)])
        .collect();
    broker_events.reverse();
    let mut broker_down = false;
    let mut t = ms(500);
    while t < FAULT_PHASE {
        t += ms(rng.range(200, 1500));
        while let Some(&(at, crash)) = broker_events.last()
            && at <= t
        {
            world.run_until(at);
            if crash {
                world.crash_broker();
            } else {
                world.restart_broker();
            }
            broker_down = crash;
            broker_events.pop();
        }
        world.run_until(t);
        let name = names[rng.range(0, names.len() as u64 - 1) as usize].clone();
        match rng.range(0, 5) {
            0 if !crashed.contains(&name) => {
                world.crash(&name);
                crashed.insert(name);
            }
            1 if crashed.contains(&name) => {
                world.restart(&name);
                crashed.remove(&name);
            }
            2 if !partitioned.contains(&name) && !held.contains(&name) => {
                world.partition(&name);
                partitioned.insert(name);
            }
            3 if partitioned.contains(&name) => {
                world.repair(&name);
                partitioned.remove(&name);
            }
            4 if !held.contains(&name) && !partitioned.contains(&name) => {
                world.hold(&name);
                held.insert(name);
            }
            5 if held.contains(&name) => {
                world.release(&name);
                held.remove(&name);
            }
            _ => {}
        }
    }
    // Heal everything, then demand progress.
    if broker_down {
        world.restart_broker();
    }
    for name in std::mem::take(&mut partitioned) {
        world.repair(&name);
    }
    for name in std::mem::take(&mut held) {
        world.release(&name);
    }
    for name in std::mem::take(&mut crashed) {
        world.restart(&name);
    }
    world.trace.at(world.now(), "HEALED: liveness phase");
    let live = world.run_until_with_budget(LIVENESS_BUDGET, World::all_acked);
    world.trace.close();
    Outcome {
        seed,
        mode,
        violations: world.violations(),
        live,
        stuck: world.liveness_report(),
        trace: world.trace.clone(),
    }
}

/// Runs `seeds` on as many threads as the machine has (each simulation stays on one thread),
/// with `bug` planted in every one of them. Returns the outcomes in seed order.
pub fn run_many(seeds: &[u64], bug: Option<PlantedBug>) -> Vec<Outcome> {
    let mut outcomes = run_seeds(seeds, bug, run);
    outcomes.sort_by_key(|o| o.seed);
    outcomes
}

/// Runs `run` for each of `seeds`, spread over as many threads as the machine has, with `bug`
/// planted on each thread (a bug is planted per thread, and a simulation stays on its thread).
/// The outcomes come back grouped by thread; callers sort them.
pub fn run_seeds<O: Send>(seeds: &[u64], bug: Option<PlantedBug>, run: fn(u64) -> O) -> Vec<O> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(seeds.len().max(1));
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || {
                    plant(bug);
                    let mine: Vec<O> = seeds
                        .iter()
                        .skip(t)
                        .step_by(threads)
                        .map(|&s| run(s))
                        .collect();
                    plant(None);
                    mine
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("campaign thread panicked"))
            .collect()
    })
}

fn plant(bug: Option<PlantedBug>) {
    tinybroker::core::planted::plant(bug);
}
