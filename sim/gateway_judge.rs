//! The judge of the real-gateway campaign (`gateway_campaign.rs`): what the clients saw, and
//! the checks on it.
//!
//! - (a) no epoch is confirmed to two activations, and each member's epochs rise;
//! - (b) deliveries' epochs never go back (once a member got a message under epoch e, none is
//!   delivered under an earlier epoch): the deposed stay silent;
//! - (c) a message whose ack was answered is not delivered again, unless the gateway that
//!   answered it crashed, froze past its lease or was cut off from NATS before JetStream could
//!   apply it (within [`ACK_RESIDUE`] of answering, or of the gateway's next try once JetStream
//!   had leaders again, when it had none), or answered it while cut off from NATS (docs/semantics.md#cluster-ack-final:
//!   such an ack is never confirmed; both counted apart, as the documented residue). An ack
//!   sent while its gateway was frozen past its lease is refused when it thaws, not answered
//!   (docs/semantics.md#cluster-lease-checks): answered and delivered again, it breaks (c);
//! - (d) every published message is acked by the end, once the faults healed, or its ack was
//!   sent and its member or that member's gateway lost (crashed, cut off, frozen past its
//!   lease) before the answer came (an ack in doubt: it may have been applied; counted apart);
//! - (e) each delivery of a message comes with a higher attempt than the one before (of a QUEUE
//!   message given back meanwhile by a gateway left without members, one that is not is
//!   counted apart: it carries JetStream's count, docs/semantics.md#cluster-attempts);
//! - (f) one active member at a time: once a member was confirmed active under epoch e, no
//!   message arrives under an earlier epoch later than a frame's flight ([`IN_FLIGHT`]);
//! - (k) a delivery's attempt is at most one more than the message's deliveries to members
//!   before it, plus [`UNSEEN`] deliveries to gateways no member saw;
//! - (h) no message in flight to two members at once: a message comes to a member only once
//!   every other member that got it acked it or let it go (its stream ended; it, its gateway
//!   or its link was lost; or its gateway was frozen long enough for its lease to end).
//!
//! Join order, (j), is judged in `gateway_join_judge.rs`; the watches, (w), here.
//!
//! A frame under an old epoch breaking (b), (e), (f) or (h) right after its gateway thawed, of a
//! message published before the freeze, one per member and thaw, is the documented residue of
//! a pause
//! (docs/semantics.md#cluster-lease-checks: handed to the transport before the freeze, written
//! after it): counted apart, never as a pass.

use std::{collections::BTreeMap, time::Duration};

/// How long after answering an ack a gateway's crash may still lose it (the ack's confirmation
/// to JetStream not yet applied).
pub const ACK_RESIDUE: Duration = Duration::from_millis(50);
/// How long after JetStream's consumers answer again an ack that waited through their loss may
/// still be on its way: the gateway sends each try again once the one before timed out (1 s,
/// `ACK_TRY`), and one sent during the loss is answered by nobody.
const ACK_TRY: Duration = Duration::from_secs(1);
/// How long a frame may take from a gateway to its member (turmoil's latency is at most
/// 20 ms, plus the gateway's network host).
pub const IN_FLIGHT: Duration = Duration::from_millis(100);
/// The least time a frozen gateway's lease lasts past the freeze: two thirds of the default
/// 3 s lease (renewals go every third of a lease).
const LEASE_FLOOR: Duration = Duration::from_secs(2);
/// How many deliveries of a message to gateways that no member saw JetStream may count (a
/// gateway giving back what it pulled for a member that left, read ahead, or brought while its
/// consumer was unchecked after a lapse; a gateway crashed after a pull), check (k): at most a
/// few in these worlds, where a gateway giving a message back into its own open pull counted
/// dozens (seed 810385).
const UNSEEN: u32 = 4;
/// How soon after a thaw a frame handed to the transport before the freeze is written.
pub const FRAME_RESIDUE: Duration = Duration::from_millis(100);

/// One thing the clients (or the world's loop, for faults) saw, at a simulated time.
#[derive(Debug, Clone)]
pub enum Seen {
    Active {
        member: String,
        member_id: u64,
        epoch: u64,
    },
    /// A frame of leadership watch `watch` (each watch opened has its own number): the active
    /// member's id (0: none) and the epoch.
    Watched {
        watch: u64,
        active: u64,
        epoch: u64,
    },
    Delivered {
        member: String,
        /// The member's gateway.
        gateway: String,
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
    /// A member sends its join (`Subscribe`) to `gateway`.
    Joining {
        member: String,
        gateway: String,
    },
    /// A member's join was answered (its stream's response headers came).
    Joined {
        member: String,
    },
    Ended {
        member: String,
    },
    /// A publish sent at `sent` was answered: its id, and how many subscriptions it was queued
    /// for.
    Published {
        system_id: u64,
        queued_for: u32,
        sent: Duration,
    },
    Crashed {
        host: String,
    },
    /// A gateway process stopped (SIGSTOP): nothing of it runs until it is thawed.
    Frozen {
        gateway: String,
    },
    Thawed {
        gateway: String,
    },
    Cut {
        member: String,
    },
    /// A gateway cut off from NATS (true: its bus, bucket and stream answer it nothing), or
    /// reconnected (false).
    CutFromNats {
        gateway: String,
        cut: bool,
    },
    /// JetStream lost its leaders (true) or has them again (false).
    Leaderless(bool),
    /// The consumers' leaders lost, nobody told (true), or new ones elected (false).
    ConsumersUnanswering(bool),
}

#[derive(Debug, PartialEq, Eq)]
pub enum Settled {
    /// Its ack was answered.
    Acked,
    /// Its ack was sent, and its member or the member's gateway was lost before the answer:
    /// it may have been applied.
    InDoubt,
    /// Neither: it must still come, and be acked.
    Open,
}

/// What became of message `id`, as the clients saw it.
pub fn settled(log: &[(Duration, Seen)], id: u64) -> Settled {
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
                    Seen::Frozen { gateway: frozen } => {
                        frozen == gateway && frozen_past_the_lease(log, gateway, *t)
                    }
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
pub fn describe(seen: &Seen) -> String {
    match seen {
        Seen::Active {
            member,
            member_id,
            epoch,
        } => format!("{member} (member {member_id}) active under epoch {epoch}"),
        Seen::Watched {
            watch,
            active,
            epoch,
        } => format!("watch {watch}: member {active} active under epoch {epoch}"),
        Seen::Delivered {
            member,
            gateway,
            system_id,
            attempt,
            epoch,
        } => {
            format!("{member} got #{system_id} from {gateway}, attempt {attempt}, epoch {epoch}")
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
        Seen::CutFromNats { gateway, cut: true } => format!("{gateway} cut off from NATS"),
        Seen::CutFromNats {
            gateway,
            cut: false,
        } => format!("{gateway} reconnected to NATS"),
        Seen::Leaderless(true) => "JetStream without leaders".to_string(),
        Seen::Leaderless(false) => "JetStream has leaders again".to_string(),
        Seen::ConsumersUnanswering(true) => {
            "the consumers' leaders lost: answers and pulls vanish".to_string()
        }
        Seen::ConsumersUnanswering(false) => "the consumers have leaders again".to_string(),
        Seen::Joining { member, gateway } => format!("{member} sends its join to {gateway}"),
        Seen::Joined { member } => format!("{member}'s join answered"),
        Seen::Ended { member } => format!("{member}'s stream ended"),
        Seen::Published {
            system_id,
            queued_for,
            sent,
        } => format!("published #{system_id} (sent at {sent:?}), queued for {queued_for}"),
        Seen::Crashed { host } => format!("{host} crashed"),
        Seen::Frozen { gateway } => format!("{gateway} frozen"),
        Seen::Thawed { gateway } => format!("{gateway} thawed"),
    }
}

/// Whether `gateway` had, at some instant from `from` to `to`, no member of the subscription
/// the log is of with its stream open (each ended, cut off or crashed), or was itself lost
/// (crashed, frozen past its lease, cut off from NATS): a QUEUE gateway then gives back what it
/// held, and what comes next carries JetStream's count, which saw none of the gateway's own
/// redeliveries (docs/semantics.md#cluster-attempts).
fn emptied(log: &[(Duration, Seen)], gateway: &str, from: Duration, to: Duration) -> bool {
    let mut joined_at: BTreeMap<&str, &str> = BTreeMap::new();
    let mut open: std::collections::BTreeSet<&str> = Default::default();
    for (t, seen) in log.iter().take_while(|(t, _)| *t <= to) {
        let during = *t >= from;
        match seen {
            Seen::Joining { member, gateway: g } => {
                joined_at.insert(member, g);
            }
            Seen::Joined { member } if joined_at.get(member.as_str()) == Some(&gateway) => {
                open.insert(member);
            }
            Seen::Ended { member } => {
                open.remove(member.as_str());
            }
            Seen::Cut { member } if cut_ended(log, member, *t) => {
                open.remove(member.as_str());
            }
            Seen::Crashed { host } if host == gateway => {
                if during {
                    return true;
                }
                open.clear();
            }
            Seen::Crashed { host } => {
                open.remove(host.as_str());
            }
            Seen::Frozen { gateway: g }
                if during && g == gateway && frozen_past_the_lease(log, g, *t) =>
            {
                return true;
            }
            Seen::CutFromNats {
                gateway: g,
                cut: true,
            } if during && g == gateway && cut_from_nats_past_the_lease(log, g, *t) => {
                return true;
            }
            _ => {}
        }
        if during && open.is_empty() {
            return true;
        }
    }
    false
}

/// Whether `gateway` was cut off from NATS at `at` (by the last change of its link before).
fn cut_from_nats_at(log: &[(Duration, Seen)], gateway: &str, at: Duration) -> bool {
    log.iter()
        .take_while(|(t, _)| *t <= at)
        .filter_map(|(_, s)| match s {
            Seen::CutFromNats { gateway: g, cut } if g == gateway => Some(*cut),
            _ => None,
        })
        .last()
        .unwrap_or(false)
}

/// When JetStream had leaders for its consumers at or after `at`: `at` itself, or the end of
/// the period without (of either fault, or both overlapping) it fell in.
fn leaders_back(log: &[(Duration, Seen)], at: Duration) -> Duration {
    let mut lost = 0;
    let mut since = None;
    for (t, seen) in log {
        let change = match seen {
            Seen::Leaderless(l) | Seen::ConsumersUnanswering(l) => *l,
            _ => continue,
        };
        if change {
            lost += 1;
            since.get_or_insert(*t);
        } else {
            lost -= 1;
            if lost == 0 {
                if since.is_some_and(|since| since <= at) && at < *t {
                    return *t;
                }
                since = None;
            }
        }
    }
    match since {
        Some(since) if since <= at => Duration::MAX,
        _ => at,
    }
}

/// Each gateway's freezes in `log`: the gateway, when it froze, and when it thawed (`None`:
/// frozen to the end).
fn freezes(log: &[(Duration, Seen)]) -> impl Iterator<Item = (&str, Duration, Option<Duration>)> {
    log.iter().filter_map(move |(from, seen)| match seen {
        Seen::Frozen { gateway } => {
            let thawed = log.iter().find_map(|(t, s)| match s {
                Seen::Thawed { gateway: g } if g == gateway && t >= from => Some(*t),
                _ => None,
            });
            Some((gateway.as_str(), *from, thawed))
        }
        _ => None,
    })
}

/// Whether delivery of `id` by `gateway` at `at` can be a frame the gateway handed to its
/// transport before it was frozen and that was written when it thawed: it came within
/// [`FRAME_RESIDUE`] of a thaw, and the message was published before that freeze began. The
/// thaw's time.
fn written_on_thaw(
    log: &[(Duration, Seen)],
    at: Duration,
    gateway: &str,
    id: u64,
) -> Option<Duration> {
    // Its publish answered at most a network's latency after the store.
    let published = log.iter().find_map(|(t, s)| match s {
        Seen::Published { system_id, .. } if *system_id == id => Some(*t),
        _ => None,
    })?;
    freezes(log).find_map(|(g, from, thawed)| {
        thawed.filter(|&thawed| {
            g == gateway
                && (thawed..=thawed + FRAME_RESIDUE).contains(&at)
                && published <= from + IN_FLIGHT
        })
    })
}

/// Whether `gateway`, frozen at `at`, stayed frozen for at least [`LEASE_FLOOR`], so its lease
/// may have ended meanwhile (a shorter freeze is within the lease: it renews on thawing).
pub fn frozen_past_the_lease(log: &[(Duration, Seen)], gateway: &str, at: Duration) -> bool {
    freezes(log)
        .find(|&(g, from, _)| g == gateway && from == at)
        .is_none_or(|(_, from, thawed)| thawed.is_none_or(|thawed| thawed >= from + LEASE_FLOOR))
}

/// Whether `gateway`, cut off from NATS at `at`, stayed cut off for at least [`LEASE_FLOOR`],
/// so its lease may have ended meanwhile (a shorter cut is within the lease).
pub fn cut_from_nats_past_the_lease(log: &[(Duration, Seen)], gateway: &str, at: Duration) -> bool {
    let healed = log.iter().find_map(|(t, s)| match s {
        Seen::CutFromNats {
            gateway: g,
            cut: false,
        } if g == gateway && *t >= at => Some(*t),
        _ => None,
    });
    healed.is_none_or(|healed| healed >= at + LEASE_FLOOR)
}

/// Whether member `member`, cut off from its gateway at `at`, may have lost its stream to it:
/// unless its client shows that stream alive afterwards (a frame, or an ack answered, before
/// the stream's end), the gateway may have ended it while the client, its keepalive patient,
/// had not noticed yet.
pub fn cut_ended(log: &[(Duration, Seen)], member: &str, at: Duration) -> bool {
    log.iter()
        .filter(|(t, _)| *t > at)
        .find_map(|(_, s)| match s {
            Seen::Ended { member: m } | Seen::Joining { member: m, .. } if m == member => {
                Some(true)
            }
            Seen::Delivered { member: m, .. }
            | Seen::Active { member: m, .. }
            | Seen::Acked { member: m, .. }
                if m == member =>
            {
                Some(false)
            }
            _ => None,
        })
        .unwrap_or(true)
}

/// Whether a frame that arrived at `t` from `gateway` came while that gateway was frozen (handed
/// to the transport just before the freeze), by a freeze past its lease that began at least
/// [`LEASE_FLOOR`] before `at`: its member holds nothing at `at`, as one whose gateway froze
/// after the frame came.
fn arrived_frozen(log: &[(Duration, Seen)], t: Duration, gateway: &str, at: Duration) -> bool {
    freezes(log).any(|(g, from, thawed)| {
        g == gateway
            && from <= t
            && thawed.is_none_or(|thawed| thawed > t)
            && from + LEASE_FLOOR <= at
            && frozen_past_the_lease(log, g, from)
    })
}

/// Another member that holds message `id` when it is delivered to `member` at `at`: it got the
/// message, sent no ack for it, and meanwhile neither its stream ended nor it, its gateway or
/// its link to it was lost, nor its gateway's lease could have ended (a gateway frozen at `f`
/// holds a lease until `f` plus two thirds of one at the earliest: renewals go every third).
/// The holder and when it got the message.
fn held_elsewhere(
    log: &[(Duration, Seen)],
    at: Duration,
    member: &str,
    id: u64,
) -> Option<(String, Duration)> {
    let mut holders: BTreeMap<&str, (Duration, &str)> = BTreeMap::new();
    for (t, seen) in log {
        if *t >= at {
            break;
        }
        match seen {
            Seen::Delivered {
                member: m,
                gateway,
                system_id,
                ..
            } if *system_id == id
                && m != member
                && written_on_thaw(log, *t, gateway, id).is_none()
                && !arrived_frozen(log, *t, gateway, at) =>
            {
                holders.insert(m, (*t, gateway));
            }
            Seen::AckSending {
                member: m,
                system_id,
                ..
            } if *system_id == id => {
                holders.remove(m.as_str());
            }
            Seen::Ended { member: m } | Seen::Cut { member: m } => {
                holders.remove(m.as_str());
            }
            Seen::Crashed { host } => {
                holders.retain(|m, (_, g)| m != host && g != host);
            }
            Seen::Frozen { gateway }
                if *t + LEASE_FLOOR <= at && frozen_past_the_lease(log, gateway, *t) =>
            {
                holders.retain(|_, (_, g)| g != gateway);
            }
            _ => {}
        }
    }
    holders
        .into_iter()
        .next()
        .map(|(holder, (since, _))| (holder.to_string(), since))
}

/// What the judge found besides violations.
#[derive(Default, Debug)]
pub struct Residue {
    /// Acked messages delivered again within the documented residue.
    pub acks: u64,
    /// Frames written on a thaw under the epoch they were handed over with.
    pub frames: u64,
    /// Acks answered while their gateway was cut off from NATS, whose messages came again.
    pub cut_acks: u64,
    /// QUEUE deliveries whose attempt was not above the one before, the message given back
    /// by a gateway left without members meanwhile (JetStream's count does not see a
    /// gateway's own redeliveries).
    pub recounted: u64,
}

impl Residue {
    /// Adds `other`'s counts (another subscription's).
    pub fn add(&mut self, other: Residue) {
        self.acks += other.acks;
        self.frames += other.frames;
        self.cut_acks += other.cut_acks;
        self.recounted += other.recounted;
    }
}

/// The ids of the messages published, in the order their publishes were answered.
pub fn published(log: &[(Duration, Seen)]) -> Vec<u64> {
    log.iter()
        .filter_map(|(_, s)| match s {
            Seen::Published { system_id, .. } => Some(*system_id),
            _ => None,
        })
        .collect()
}

/// What one subscription's members (named `members`) saw, with everything no member saw
/// (faults, publishes, watches): the log one subscription is judged on.
pub fn of_members(log: &[(Duration, Seen)], members: &[String]) -> Vec<(Duration, Seen)> {
    log.iter()
        .filter(|(_, seen)| match seen {
            Seen::Active { member, .. }
            | Seen::Joining { member, .. }
            | Seen::Joined { member }
            | Seen::Delivered { member, .. }
            | Seen::AckSending { member, .. }
            | Seen::Acked { member, .. }
            | Seen::Ended { member }
            | Seen::Cut { member } => members.contains(member),
            _ => true,
        })
        .cloned()
        .collect()
}

/// Check (q) (docs/semantics.md#cluster-durability: `queued_for` counts every subscription
/// whose join was answered at any gateway before the publish was sent): a publish sent once
/// a join of each subscription (its members named in `subscriptions`) was answered is queued
/// for all of them. None is deleted here.
pub fn judge_queued_for(log: &[(Duration, Seen)], subscriptions: &[&[String]]) -> Vec<String> {
    let joined = |members: &[String]| {
        log.iter().find_map(|(at, s)| match s {
            Seen::Joined { member } if members.contains(member) => Some(*at),
            _ => None,
        })
    };
    let Some(all_joined) = subscriptions
        .iter()
        .map(|members| joined(members))
        .collect::<Option<Vec<_>>>()
        .and_then(|at| at.into_iter().max())
    else {
        return Vec::new();
    };
    log.iter()
        .filter_map(|(at, s)| match s {
            Seen::Published {
                system_id,
                queued_for,
                sent,
            } if *sent > all_joined && *queued_for as usize != subscriptions.len() => Some(format!(
                "(q) #{system_id} sent at {sent:?}, answered at {at:?} queued for {queued_for}, with {} subscriptions joined by {all_joined:?}",
                subscriptions.len()
            )),
            _ => None,
        })
        .collect()
}

/// Checks (a) to (c), (e), (f) and (h) on what a SINGLETON subscription's members saw, or
/// (c), (e) and (h) on what a QUEUE subscription's saw (`singleton` false: each of its members
/// is active under an epoch of its own, docs/semantics.md#epochs).
pub fn judge(log: &[(Duration, Seen)], singleton: bool) -> (Vec<String>, Residue) {
    let mut violations = Vec::new();
    let mut epochs: BTreeMap<u64, String> = BTreeMap::new();
    let mut last_of: BTreeMap<String, u64> = BTreeMap::new();
    let mut highest_delivery = 0;
    // The highest epoch confirmed so far: to whom, when.
    let mut highest_confirmed: Option<(u64, String, Duration)> = None;
    let mut acked: BTreeMap<u64, (Duration, String)> = BTreeMap::new();
    let mut residue = Residue::default();
    // Deliveries of each message to members so far (k).
    let mut deliveries: BTreeMap<u64, u32> = BTreeMap::new();
    // Each message's last delivery: its attempt, its gateway, when.
    let mut attempts: BTreeMap<u64, (u32, &str, Duration)> = BTreeMap::new();
    // (member, thaw) of the frames counted as written on a thaw.
    let mut written: std::collections::BTreeSet<(String, Duration)> = Default::default();
    for (at, seen) in log {
        match seen {
            Seen::Active { member, epoch, .. } => {
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
                if highest_confirmed
                    .as_ref()
                    .is_none_or(|(highest, _, _)| highest < epoch)
                {
                    highest_confirmed = Some((*epoch, member.clone(), *at));
                }
            }
            Seen::Delivered {
                member,
                gateway,
                system_id,
                epoch,
                attempt,
            } => {
                let mut broken = Vec::new();
                let seen_before = deliveries.entry(*system_id).or_insert(0);
                if *attempt > *seen_before + 1 + UNSEEN {
                    broken.push(format!(
                        "(k) #{system_id} came to {member} with attempt {attempt} after {seen_before} deliveries to members ({at:?})"
                    ));
                }
                *seen_before += 1;
                let before = attempts.insert(*system_id, (*attempt, gateway.as_str(), *at));
                if let Some((last, last_gateway, since)) = before
                    && last >= *attempt
                {
                    if !singleton && emptied(log, last_gateway, since, *at) {
                        // docs/semantics.md#cluster-attempts: given back by a QUEUE gateway
                        // left without members, it comes with JetStream's count.
                        residue.recounted += 1;
                    } else {
                        broken.push(format!(
                            "(e) #{system_id} came to {member} with attempt {attempt} after attempt {last} ({at:?})"
                        ));
                    }
                }
                if singleton && *epoch < highest_delivery {
                    broken.push(format!(
                        "(b) {member} got #{system_id} under epoch {epoch} after a delivery under {highest_delivery} ({at:?})"
                    ));
                }
                if let Some((confirmed, to, since)) = &highest_confirmed
                    && singleton
                    && confirmed > epoch
                    && *at > *since + IN_FLIGHT
                {
                    broken.push(format!(
                        "(f) {member} got #{system_id} under epoch {epoch} at {at:?}, after {to} was confirmed active under {confirmed} at {since:?}"
                    ));
                }
                if let Some((holder, since)) = held_elsewhere(log, *at, member, *system_id) {
                    broken.push(format!(
                        "(h) #{system_id} delivered to {member} at {at:?} while {holder} held it (delivered at {since:?}, neither acked nor let go)"
                    ));
                }
                if !broken.is_empty() {
                    // One frame per member and thaw: the one handed over when it froze.
                    match written_on_thaw(log, *at, gateway, *system_id) {
                        Some(thawed) if written.insert((member.clone(), thawed)) => {
                            residue.frames += 1;
                        }
                        _ => violations.append(&mut broken),
                    }
                }
                highest_delivery = highest_delivery.max(*epoch);
                if let Some((acked_at, gateway)) = acked.get(system_id) {
                    // JetStream could apply the ack once it had leaders again, if it had none,
                    // and the gateway's next try came.
                    let back = leaders_back(log, *acked_at);
                    let applicable = if back > *acked_at {
                        back.saturating_add(ACK_TRY)
                    } else {
                        back
                    };
                    let lost_soon = log.iter().any(|(t, s)| {
                        let lost = match s {
                            Seen::Crashed { host } => host == gateway,
                            Seen::CutFromNats {
                                gateway: cut,
                                cut: true,
                            } => cut == gateway,
                            Seen::Frozen { gateway: frozen } => {
                                frozen == gateway && frozen_past_the_lease(log, gateway, *t)
                            }
                            _ => false,
                        };
                        lost && *t >= *acked_at && *t <= applicable + ACK_RESIDUE
                    });
                    if lost_soon {
                        residue.acks += 1;
                    } else if cut_from_nats_at(log, gateway, *acked_at) {
                        // Answered while its gateway could not tell JetStream: never confirmed
                        // (docs/semantics.md#cluster-ack-final).
                        residue.cut_acks += 1;
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

/// Check (w), on the leadership watches' frames (docs/semantics.md#watching-leadership): within
/// one watch epochs never fall, and no frame names a member under an epoch confirmed to
/// another, or that another frame named another member under.
pub fn judge_watches(log: &[(Duration, Seen)]) -> Vec<String> {
    let mut violations = Vec::new();
    let confirmed: BTreeMap<u64, (u64, &str)> = log
        .iter()
        .filter_map(|(_, s)| match s {
            Seen::Active {
                member,
                member_id,
                epoch,
            } => Some((*epoch, (*member_id, member.as_str()))),
            _ => None,
        })
        .collect();
    let mut last_of: BTreeMap<u64, u64> = BTreeMap::new();
    let mut named: BTreeMap<u64, u64> = BTreeMap::new();
    for (at, seen) in log {
        let Seen::Watched {
            watch,
            active,
            epoch,
        } = seen
        else {
            continue;
        };
        if let Some(last) = last_of.insert(*watch, *epoch)
            && last > *epoch
        {
            violations.push(format!(
                "(w) watch {watch} showed epoch {epoch} after {last} ({at:?})"
            ));
        }
        if *active == 0 {
            continue;
        }
        if let Some((id, member)) = confirmed.get(epoch)
            && id != active
        {
            violations.push(format!(
                "(w) watch {watch} named member {active} under epoch {epoch}, confirmed to {member} (member {id}) ({at:?})"
            ));
        }
        if let Some(other) = named.insert(*epoch, *active)
            && other != *active
        {
            violations.push(format!(
                "(w) watch {watch} named member {active} under epoch {epoch}, which a frame gave member {other} ({at:?})"
            ));
        }
    }
    violations
}

#[cfg(test)]
#[path = "gateway_judge_tests.rs"]
mod tests;
