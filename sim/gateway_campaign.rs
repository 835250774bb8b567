//! A seeded campaign of real gateways on turmoil hosts (`gateway_world.rs`): two or three
//! gateways, three SINGLETON members on gateways drawn from the seed (windows of 1 to 3), a
//! publisher, and faults
//! drawn from the seed (a member's host crashed and restarted, a gateway's host crashed and
//! restarted, a member cut off from its gateway for a while, JetStream without leaders for a
//! while: publishes, pulls, answers and consumer requests fail meanwhile). What the clients saw is judged:
//!
//! - (a) no epoch is confirmed to two activations, and each member's epochs rise;
//! - (b) deliveries' epochs never go back (once a member got a message under epoch e, none is
//!   delivered under an earlier epoch): the deposed stay silent;
//! - (c) a message whose ack was answered is not delivered again, unless the gateway that
//!   answered it crashed before JetStream could apply it: within [`ACK_RESIDUE`] of answering
//!   or of JetStream having leaders again, when it had none (docs/semantics.md#cluster-ack-final:
//!   counted apart, as the documented residue);
//! - (d) every published message is acked by the end, once the faults healed, or its ack was
//!   sent and its member or that member's gateway lost before the answer came (an ack in
//!   doubt: it may have been applied; counted apart);
//! - (e) each delivery of a message comes with a higher attempt than the one before.

use std::{cell::RefCell, collections::BTreeMap, rc::Rc, time::Duration};

use tinybroker::pb::{self, subscription_frame::Frame};

use crate::{
    gateway_models::Models,
    gateway_world::{client_of, gateway_host, singleton, world},
    rng::Rng,
};

/// How long after answering an ack a gateway's crash may still lose it (the ack's confirmation
/// to JetStream not yet applied).
const ACK_RESIDUE: Duration = Duration::from_millis(50);
/// Messages the publisher sends.
const MESSAGES: usize = 12;
/// Faults stop by then; the campaign then waits for every message to be acked.
const HEALED_BY: Duration = Duration::from_secs(16);
/// How long after healing everything must be acked.
const SETTLE: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
enum Seen {
    Active {
        member: String,
        epoch: u64,
    },
    Delivered {
        member: String,
        system_id: u64,
        attempt: u32,
        epoch: u64,
    },
    /// An ack about to be sent: if its member or gateway is lost before the answer, it may
    /// have been applied all the same.
    AckSending {
        member: String,
        gateway: String,
        system_id: u64,
    },
    Acked {
        member: String,
        gateway: String,
        system_id: u64,
    },
    Ended {
        member: String,
    },
    Published {
        system_id: u64,
    },
    Crashed {
        host: String,
    },
    Cut {
        member: String,
    },
    /// JetStream lost its leaders (true) or has them again (false).
    Leaderless(bool),
}

type Log = Rc<RefCell<Vec<(Duration, Seen)>>>;

fn note(log: &Log, seen: Seen) {
    let at = turmoil::sim_elapsed().unwrap_or_default();
    log.borrow_mut().push((at, seen));
}

/// What a seed did and what it broke.
pub struct Outcome {
    pub violations: Vec<String>,
    /// Acked messages delivered again within the documented residue.
    pub residue: u64,
    /// Messages whose ack was sent but not answered, its member or gateway lost meanwhile.
    pub in_doubt: u64,
    pub activations: u64,
    pub deliveries: u64,
    pub faults: Vec<String>,
    pub log: Vec<String>,
}

/// An ack under way: its message, and whether the gateway answered it.
type Acking = std::pin::Pin<Box<dyn std::future::Future<Output = (u64, bool)>>>;

/// A member host: joins `jobs` at `gateway` (again after its stream ends) with a window of 1
/// to 3, acks each message after a delay, both drawn from its own seed.
fn member_host(sim: &mut turmoil::Sim<'static>, name: &str, gateway: &str, seed: u64, log: &Log) {
    let (me, gateway, log) = (name.to_string(), gateway.to_string(), log.clone());
    sim.host(name, move || {
        let (me, gateway, log) = (me.clone(), gateway.clone(), log.clone());
        async move {
            let mut rng = Rng::new(seed);
            // Its window: 1 to 3 messages in flight.
            let window = rng.range(1, 3) as u32;
            tokio::time::sleep(Duration::from_millis(rng.range(0, 800))).await;
            loop {
                let mut client = client_of(&gateway).await;
                let open = pb::OpenSubscription {
                    max_in_flight: window,
                    ..singleton("jobs")
                };
                let mut frames = match client.subscribe(open).await {
                    Ok(frames) => frames.into_inner(),
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    }
                };
                // Frames are noted as they arrive; messages are acked one at a time, in order,
                // each after its delay, while later frames keep arriving.
                let mut member_id = 0;
                let mut queue: std::collections::VecDeque<u64> = Default::default();
                let mut acking: Option<Acking> = None;
                loop {
                    if acking.is_none()
                        && let Some(system_id) = queue.pop_front()
                    {
                        let delay = Duration::from_millis(rng.range(5, 150));
                        let (mut client, log, me, gateway) =
                            (client.clone(), log.clone(), me.clone(), gateway.clone());
                        acking = Some(Box::pin(async move {
                            tokio::time::sleep(delay).await;
                            note(
                                &log,
                                Seen::AckSending {
                                    member: me,
                                    gateway,
                                    system_id,
                                },
                            );
                            let ack = pb::Ack {
                                subscription_id: "jobs".into(),
                                system_id,
                                member_id,
                            };
                            (system_id, client.ack(ack).await.is_ok())
                        }));
                    }
                    tokio::select! {
                        frame = frames.message() => {
                            let Ok(Some(frame)) = frame else { break };
                            match frame.frame {
                                Some(Frame::Confirmation(c)) => {
                                    member_id = c.member_id;
                                    note(
                                        &log,
                                        Seen::Active {
                                            member: me.clone(),
                                            epoch: c.epoch,
                                        },
                                    );
                                }
                                Some(Frame::Message(m)) => {
                                    note(
                                        &log,
                                        Seen::Delivered {
                                            member: me.clone(),
                                            system_id: m.system_id,
                                            attempt: m.delivery_attempt,
                                            epoch: m.epoch,
                                        },
                                    );
                                    queue.push_back(m.system_id);
                                }
                                _ => {}
                            }
                        }
                        (system_id, answered) = async { acking.as_mut().expect("guarded").await }, if acking.is_some() => {
                            acking = None;
                            if answered {
                                note(
                                    &log,
                                    Seen::Acked {
                                        member: me.clone(),
                                        gateway: gateway.clone(),
                                        system_id,
                                    },
                                );
                            }
                        }
                    }
                }
                note(&log, Seen::Ended { member: me.clone() });
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    });
}

/// Runs seed `seed`.
pub fn run(seed: u64) -> Outcome {
    let mut rng = Rng::new(seed);
    let mut sim = world(seed);
    let models = Models::new();
    let log: Log = Rc::default();
    let gateways: Vec<String> = (1..=rng.range(2, 3)).map(|n| format!("gw{n}")).collect();
    for (n, name) in gateways.iter().enumerate() {
        gateway_host(&mut sim, name, n as u64 + 1, &models);
    }
    let members: Vec<(String, String)> = (1..=3)
        .map(|n| {
            let gateway = gateways[rng.range(0, gateways.len() as u64 - 1) as usize].clone();
            (format!("m{n}"), gateway)
        })
        .collect();
    for (n, (member, gateway)) in members.iter().enumerate() {
        member_host(&mut sim, member, gateway, seed ^ (n as u64 + 1) << 32, &log);
    }
    let publisher_seed = rng.next_u64();
    let (plog, pgateways) = (log.clone(), gateways.clone());
    sim.client("publisher", async move {
        let mut rng = Rng::new(publisher_seed);
        tokio::time::sleep(Duration::from_secs(2)).await;
        let mut sent = 0;
        while sent < MESSAGES {
            let gateway = &pgateways[rng.range(0, pgateways.len() as u64 - 1) as usize];
            let mut client = client_of(gateway).await;
            let request = pb::PublishRequest {
                topic: "jobs.run".into(),
                payload: format!("job {sent}").into_bytes().into(),
                ..Default::default()
            };
            if let Ok(reply) = client.publish(request).await {
                note(
                    &plog,
                    Seen::Published {
                        system_id: reply.into_inner().system_id,
                    },
                );
                sent += 1;
            }
            tokio::time::sleep(Duration::from_millis(rng.range(100, 600))).await;
        }
        Ok(())
    });
    // Faults: (start, end, what).
    let mut faults: Vec<(Duration, Duration, Fault)> = Vec::new();
    for _ in 0..rng.range(1, 3) {
        let at = Duration::from_millis(rng.range(2_500, 11_000));
        let lasting = Duration::from_millis(rng.range(300, 4_000));
        let fault = match rng.range(0, 3) {
            0 => Fault::Crash(members[rng.range(0, 2) as usize].0.clone()),
            1 => Fault::Crash(gateways[rng.range(0, gateways.len() as u64 - 1) as usize].clone()),
            2 => Fault::Leaderless,
            _ => {
                let (member, gateway) = members[rng.range(0, 2) as usize].clone();
                Fault::Cut(member, gateway)
            }
        };
        faults.push((at, at + lasting, fault));
    }
    let described = faults
        .iter()
        .map(|(at, end, f)| format!("{f:?} {at:?}..{end:?}"))
        .collect();
    let mut started = vec![false; faults.len()];
    let mut ended = vec![false; faults.len()];
    let open = |log: &Log| {
        let log = log.borrow();
        let published: Vec<u64> = log
            .iter()
            .filter_map(|(_, s)| match s {
                Seen::Published { system_id } => Some(*system_id),
                _ => None,
            })
            .collect();
        let open: Vec<u64> = published
            .iter()
            .copied()
            .filter(|&id| settled(&log, id) == Settled::Open)
            .collect();
        (published.len() == MESSAGES).then_some(open)
    };
    let deadline = HEALED_BY + SETTLE;
    let mut violations = Vec::new();
    let mut in_force: BTreeMap<String, u32> = BTreeMap::new();
    loop {
        let now = sim.elapsed();
        for (i, (at, end, fault)) in faults.iter().enumerate() {
            // Faults may overlap: each is in force while any fault of its kind and target is.
            let key = format!("{fault:?}");
            if !started[i] && now >= *at {
                started[i] = true;
                let count = in_force.entry(key.clone()).or_insert(0);
                *count += 1;
                if *count == 1 {
                    match fault {
                        Fault::Crash(host) => {
                            note_at(&log, now, Seen::Crashed { host: host.clone() });
                            sim.crash(host.as_str());
                        }
                        Fault::Cut(a, b) => {
                            note_at(&log, now, Seen::Cut { member: a.clone() });
                            sim.partition(a.as_str(), b.as_str());
                        }
                        Fault::Leaderless => {
                            note_at(&log, now, Seen::Leaderless(true));
                            models.jetstream_leaderless(true);
                        }
                    }
                }
            }
            if started[i] && !ended[i] && (now >= *end || now >= HEALED_BY) {
                ended[i] = true;
                let count = in_force.entry(key).or_insert(1);
                *count -= 1;
                if *count == 0 {
                    match fault {
                        Fault::Crash(host) => sim.bounce(host.as_str()),
                        Fault::Cut(a, b) => sim.repair(a.as_str(), b.as_str()),
                        Fault::Leaderless => {
                            note_at(&log, now, Seen::Leaderless(false));
                            models.jetstream_leaderless(false);
                        }
                    }
                }
            }
        }
        if now >= HEALED_BY && open(&log).is_some_and(|open| open.is_empty()) {
            break;
        }
        if now >= deadline {
            violations.push(format!(
                "(d) by {deadline:?}, not acked (nor its ack sent by a member lost before the answer): {:?}",
                open(&log)
            ));
            break;
        }
        if let Err(error) = sim.step() {
            violations.push(format!("the simulation failed: {error}"));
            break;
        }
    }
    let log = log.borrow().clone();
    let (mut judged, residue) = judge(&log);
    let in_doubt = log
        .iter()
        .filter_map(|(_, s)| match s {
            Seen::Published { system_id } => Some(*system_id),
            _ => None,
        })
        .filter(|&id| settled(&log, id) == Settled::InDoubt)
        .count() as u64;
    violations.append(&mut judged);
    Outcome {
        violations,
        residue,
        in_doubt,
        activations: log
            .iter()
            .filter(|(_, s)| matches!(s, Seen::Active { .. }))
            .count() as u64,
        deliveries: log
            .iter()
            .filter(|(_, s)| matches!(s, Seen::Delivered { .. }))
            .count() as u64,
        faults: described,
        log: log
            .iter()
            .map(|(at, s)| format!("{at:?} {}", describe(s)))
            .collect(),
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Settled {
    /// Its ack was answered.
    Acked,
    /// Its ack was sent, and its member or the member's gateway was lost before the answer:
    /// it may have been applied.
    InDoubt,
    /// Neither: it must still come, and be acked.
    Open,
}

/// What became of message `id`, as the clients saw it.
fn settled(log: &[(Duration, Seen)], id: u64) -> Settled {
    if log
        .iter()
        .any(|(_, s)| matches!(s, Seen::Acked { system_id, .. } if *system_id == id))
    {
        return Settled::Acked;
    }
    let lost_after = |at: Duration, member: &str, gateway: &str| {
        log.iter().any(|(t, s)| {
            *t >= at
                && match s {
                    Seen::Crashed { host } => host == member || host == gateway,
                    Seen::Cut { member: cut } => cut == member,
                    _ => false,
                }
        })
    };
    let in_doubt = log.iter().any(|(at, s)| {
        matches!(s, Seen::AckSending { member, gateway, system_id }
            if *system_id == id && lost_after(*at, member, gateway))
    });
    if in_doubt {
        Settled::InDoubt
    } else {
        Settled::Open
    }
}

/// One line of a seed's log.
fn describe(seen: &Seen) -> String {
    match seen {
        Seen::Active { member, epoch } => format!("{member} active under epoch {epoch}"),
        Seen::Delivered {
            member,
            system_id,
            attempt,
            epoch,
        } => {
            format!("{member} got #{system_id}, attempt {attempt}, epoch {epoch}")
        }
        Seen::AckSending {
            member,
            gateway,
            system_id,
        } => format!("{member} sends its ack of #{system_id} to {gateway}"),
        Seen::Acked {
            member,
            gateway,
            system_id,
        } => {
            format!("{member} acked #{system_id} at {gateway}")
        }
        Seen::Cut { member } => format!("{member} cut off from its gateway"),
        Seen::Leaderless(true) => "JetStream without leaders".to_string(),
        Seen::Leaderless(false) => "JetStream has leaders again".to_string(),
        Seen::Ended { member } => format!("{member}'s stream ended"),
        Seen::Published { system_id } => format!("published #{system_id}"),
        Seen::Crashed { host } => format!("{host} crashed"),
    }
}

fn note_at(log: &Log, at: Duration, seen: Seen) {
    log.borrow_mut().push((at, seen));
}

#[derive(Debug, Clone)]
enum Fault {
    /// A host crashed, restarted at the fault's end.
    Crash(String),
    /// A member cut off from its gateway, repaired at the fault's end.
    Cut(String, String),
    /// The stream and its consumers without a leader (JetStream electing one) until the
    /// fault's end.
    Leaderless,
}

/// When JetStream had leaders at or after `at`: `at` itself, or the end of the leaderless
/// period it fell in.
fn leaders_back(log: &[(Duration, Seen)], at: Duration) -> Duration {
    let mut leaderless_since = None;
    for (t, seen) in log {
        if let Seen::Leaderless(lost) = seen {
            match (lost, leaderless_since) {
                (true, None) => leaderless_since = Some(*t),
                (false, Some(since)) => {
                    if since <= at && at < *t {
                        return *t;
                    }
                    leaderless_since = None;
                }
                _ => {}
            }
        }
    }
    match leaderless_since {
        Some(since) if since <= at => Duration::MAX,
        _ => at,
    }
}

/// Checks (a) to (c) on what was seen; the acked messages delivered again within the residue.
fn judge(log: &[(Duration, Seen)]) -> (Vec<String>, u64) {
    let mut violations = Vec::new();
    let mut epochs: BTreeMap<u64, String> = BTreeMap::new();
    let mut last_of: BTreeMap<String, u64> = BTreeMap::new();
    let mut highest_delivery = 0;
    let mut acked: BTreeMap<u64, (Duration, String)> = BTreeMap::new();
    let mut residue = 0;
    let mut attempts: BTreeMap<u64, u32> = BTreeMap::new();
    for (at, seen) in log {
        match seen {
            Seen::Active { member, epoch } => {
                if let Some(other) = epochs.insert(*epoch, member.clone()) {
                    violations.push(format!(
                        "(a) epoch {epoch} confirmed to {other} and to {member} ({at:?})"
                    ));
                }
                if let Some(last) = last_of.insert(member.clone(), *epoch)
                    && last >= *epoch
                {
                    violations.push(format!(
                        "(a) {member} confirmed epoch {epoch} after {last} ({at:?})"
                    ));
                }
            }
            Seen::Delivered {
                member,
                system_id,
                epoch,
                attempt,
            } => {
                if let Some(last) = attempts.insert(*system_id, *attempt)
                    && last >= *attempt
                {
                    violations.push(format!(
                        "(e) #{system_id} came to {member} with attempt {attempt} after attempt {last} ({at:?})"
                    ));
                }
                if *epoch < highest_delivery {
                    violations.push(format!(
                        "(b) {member} got #{system_id} under epoch {epoch} after a delivery under {highest_delivery} ({at:?})"
                    ));
                }
                highest_delivery = highest_delivery.max(*epoch);
                if let Some((acked_at, gateway)) = acked.get(system_id) {
                    // JetStream could apply the ack once it had leaders again, if it had none.
                    let applicable = leaders_back(log, *acked_at);
                    let crashed_soon = log.iter().any(|(t, s)| {
                        matches!(s, Seen::Crashed { host } if host == gateway)
                            && *t >= *acked_at
                            && *t <= applicable + ACK_RESIDUE
                    });
                    if crashed_soon {
                        residue += 1;
                    } else {
                        violations.push(format!(
                            "(c) #{system_id} delivered to {member} at {at:?}, acked at {acked_at:?} through {gateway}"
                        ));
                    }
                }
            }
            Seen::Acked {
                gateway, system_id, ..
            } => {
                acked.entry(*system_id).or_insert((*at, gateway.clone()));
            }
            _ => {}
        }
    }
    (violations, residue)
}

/// Seeds run by default; `TINYBROKER_SIM_SEEDS` overrides.
const DEFAULT_SEEDS: u64 = 24;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

// The real-gateway campaign: checks (a)-(d) on every seed. `TINYBROKER_GATEWAY_SEED=<s>` replays
// one seed and prints what it saw; `TINYBROKER_SIM_SEEDS=<n>` runs n seeds from
// `TINYBROKER_SIM_SEED_BASE` and prints seeds per minute.
#[test]
fn cluster_real_gateway_campaign_holds_every_invariant() {
    if let Some(seed) = env_u64("TINYBROKER_GATEWAY_SEED") {
        // The gateways' own logs too, filtered by RUST_LOG (say `tinybroker=debug`).
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let outcome = run(seed);
        println!("faults: {:?}\n{}", outcome.faults, outcome.log.join("\n"));
        println!("acks in doubt: {}", outcome.in_doubt);
        assert!(outcome.violations.is_empty(), "{:?}", outcome.violations);
        return;
    }
    let count = env_u64("TINYBROKER_SIM_SEEDS").unwrap_or(DEFAULT_SEEDS);
    let base = env_u64("TINYBROKER_SIM_SEED_BASE").unwrap_or(0);
    let started = std::time::Instant::now();
    let (mut activations, mut deliveries, mut residue, mut in_doubt) = (0, 0, 0, 0);
    let mut failed = Vec::new();
    for seed in base..base + count {
        let outcome = run(seed);
        activations += outcome.activations;
        deliveries += outcome.deliveries;
        residue += outcome.residue;
        in_doubt += outcome.in_doubt;
        if !outcome.violations.is_empty() {
            failed.push(format!(
                "seed {seed}: {:?} (faults {:?})",
                outcome.violations, outcome.faults
            ));
        }
    }
    let elapsed = started.elapsed();
    println!(
        "real-gateway campaign: {count} seeds in {elapsed:.1?} ({:.0} seeds a minute), {activations} activations, {deliveries} deliveries, {residue} acked messages delivered again within the documented residue, {in_doubt} acks in doubt (sent, their member or gateway lost before the answer)",
        count as f64 * 60.0 / elapsed.as_secs_f64().max(1e-9)
    );
    assert!(
        failed.is_empty(),
        "{} of {count} seeds failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

/// Seeds from `base` until one with `bug` planted breaks the check named `check` (say "(c)"),
/// at most `limit`: how many it took, `None` when none did.
fn seeds_to_first_catch(
    bug: tinybroker::core::planted::PlantedBug,
    check: &str,
    base: u64,
    limit: u64,
) -> Option<u64> {
    tinybroker::core::planted::plant(Some(bug));
    let caught = (base..base + limit).position(|seed| {
        run(seed)
            .violations
            .iter()
            .any(|violation| violation.starts_with(check))
    });
    tinybroker::core::planted::plant(None);
    caught.map(|n| n as u64 + 1)
}

/// Runs `TINYBROKER_SIM_CAMPAIGNS` campaigns (1 by default; bases 0, 100,000, ...) with `bug`
/// planted, each until check `check` catches it (at most `limit` seeds), and prints the seeds
/// to each first catch and their median.
fn campaigns_catch(bug: tinybroker::core::planted::PlantedBug, check: &str, limit: u64) {
    let campaigns = env_u64("TINYBROKER_SIM_CAMPAIGNS").unwrap_or(1);
    let mut firsts: Vec<u64> = (0..campaigns)
        .map(|k| {
            seeds_to_first_catch(bug, check, k * 100_000, limit)
                .unwrap_or_else(|| panic!("{bug:?}, campaign {k}: not caught within {limit} seeds"))
        })
        .collect();
    firsts.sort_unstable();
    println!(
        "{bug:?}: seeds to the first catch {firsts:?}, median {}",
        firsts[firsts.len() / 2]
    );
}

// The planted AckGivenUpWithoutLeader (the real gateway's ack not sent again once it found no
// responders) is caught by check (c) of the real-gateway campaign. `TINYBROKER_SIM_CAMPAIGNS=<k>`
// runs k campaigns and prints the median seeds to the first catch.
#[test]
fn cluster_real_gateway_campaign_catches_an_ack_given_up_without_a_leader() {
    campaigns_catch(
        tinybroker::core::planted::PlantedBug::AckGivenUpWithoutLeader,
        "(c)",
        500,
    );
}
