//! The invariant checker: an [`Observer`] on the broker that keeps its own model of every
//! subscription and checks docs/semantics.md#singleton-invariants after every input:
//!
//! 1. a singleton subscription has at most one active member, and exactly one whenever it has
//!    any member;
//! 2. promotion follows the line (the confirmed member is always the first in line: highest
//!    priority, then join order, a member that handed over at the back of its priority,
//!    docs/semantics.md#priority), and a member steps down only at a message boundary (it holds
//!    nothing when it goes on standby, unless its hand-over timeout passed and what it held
//!    was withdrawn, docs/semantics.md#hand-over);
//! 3. no message is lost: every queued message is acked, in flight, queued, or counted as
//!    dropped/dead-lettered/expired;
//! 4. a message is in flight to at most one member at a time;
//! 5. epochs only go up on a subscription id, also across expiry and broker restarts.
//!
//! Across broker restarts (the broker host crashed and started again) it also checks that member
//! ids on a subscription id only go up and that system ids never repeat: every id the new broker
//! hands out is above every id any earlier incarnation handed out. A crash forgets the messages
//! and members of the incarnation that crashed (it kept them in memory only, by design), but
//! never the ids.
//!
//! And docs/semantics.md#redelivery-order order: ids increase along every queue (each enqueue's id is above every earlier
//! one on that subscription), and in SINGLETON mode every delivery is the lowest-id message
//! waiting, so the active member gets messages in publish order with redeliveries first, also
//! right after a promotion, with nacks and windows above 1.
//!
//! It checks every fenced publish (docs/semantics.md#fenced-publish): it passes exactly when
//! its epoch is the active member's at that instant.
//!
//! It also checks the ack fence (an accepted ack that named a member comes from the holder; one
//! that named none arrived on the holder's connection) and the core's own bookkeeping (`Subscription::check_invariants`). Violations are collected, not panicked on,
//! so the driver can report the seed.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Mutex,
};

use tinybroker::{
    broker::{ConnectionId, Input, Observation, Observer},
    core::{Effect, MemberId, Mode, StepDownCause, SystemId},
};

use crate::trace::Trace;

#[derive(Default)]
struct SubModel {
    /// Live members in line order: priority, highest first, then join order.
    members: Vec<MemberId>,
    /// Each live member's priority.
    priority: BTreeMap<MemberId, u32>,
    /// The step-down in progress: its member, and whether it is a hand-over.
    stepping: Option<(MemberId, bool)>,
    active: BTreeSet<MemberId>,
    last_epoch: u64,
    holder: BTreeMap<SystemId, MemberId>,
    outstanding: BTreeSet<SystemId>,
    /// The connection each live member's stream runs on.
    connection: BTreeMap<MemberId, Option<ConnectionId>>,
    /// Messages the broker dropped and counted (a full drop-oldest queue, poison messages).
    dropped: BTreeSet<SystemId>,
    /// The highest id ever enqueued here.
    last_enqueued: SystemId,
    /// The highest member id ever joined here, over every incarnation of the broker.
    last_member: MemberId,
    /// Messages the broker held here when it crashed: gone with it.
    lost_in_crash: BTreeSet<SystemId>,
    /// Every (member, epoch) confirmed here.
    confirmed: BTreeSet<(MemberId, u64)>,
}

#[derive(Default)]
struct State {
    subs: BTreeMap<String, SubModel>,
    violations: Vec<String>,
    /// The highest system id enqueued by the running broker.
    highest_id: SystemId,
    /// The highest system id enqueued by any broker before the last crash: the running one must
    /// hand out ids above it.
    highest_id_before_crash: SystemId,
}

pub struct Checker {
    state: Mutex<State>,
    trace: Trace,
}

impl SubModel {
    /// Puts `member` in line behind every member of its priority or higher.
    fn line_up(&mut self, member: MemberId) {
        let priority = self.priority.get(&member).copied().unwrap_or(0);
        let at = self
            .members
            .iter()
            .position(|m| self.priority.get(m).copied().unwrap_or(0) < priority)
            .unwrap_or(self.members.len());
        self.members.insert(at, member);
    }
}

impl Checker {
    pub fn new(trace: Trace) -> Self {
        Self {
            state: Mutex::new(State::default()),
            trace,
        }
    }

    pub fn violations(&self) -> Vec<String> {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .violations
            .clone()
    }

    /// Every (member, epoch) the broker confirmed on `subscription`, over every incarnation.
    pub fn confirmations(&self, subscription: &str) -> BTreeSet<(MemberId, u64)> {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state
            .subs
            .get(subscription)
            .map(|s| s.confirmed.clone())
            .unwrap_or_default()
    }

    /// Messages `subscription` dropped and counted: no client need ever receive them.
    pub fn dropped(&self, subscription: &str) -> BTreeSet<SystemId> {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state
            .subs
            .get(subscription)
            .map(|s| s.dropped.clone())
            .unwrap_or_default()
    }

    /// Messages `subscription` held when the broker crashed.
    pub fn lost_in_crash(&self, subscription: &str) -> BTreeSet<SystemId> {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state
            .subs
            .get(subscription)
            .map(|s| s.lost_in_crash.clone())
            .unwrap_or_default()
    }

    /// The broker host crashed: every member, queue and in-flight message went with it. What
    /// stays is what the next broker must stay above: epochs, member ids and system ids.
    pub fn broker_crashed(&self) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.highest_id_before_crash = state.highest_id_before_crash.max(state.highest_id);
        for m in state.subs.values_mut() {
            let held = std::mem::take(&mut m.outstanding);
            m.lost_in_crash.extend(held);
            m.members.clear();
            m.priority.clear();
            m.stepping = None;
            m.active.clear();
            m.holder.clear();
            m.connection.clear();
        }
    }

    /// Messages queued on any subscription and not yet acked (or dropped or dead-lettered).
    pub fn outstanding(&self) -> usize {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.subs.values().map(|s| s.outstanding.len()).sum()
    }

    fn describe(input: &Input) -> String {
        match input {
            Input::Join {
                member, priority, ..
            } if *priority > 0 => format!("join m{member} priority {priority}"),
            Input::Join { member, .. } => format!("join m{member}"),
            Input::HandOver { member, seq } => format!("hand-over of m{member} (step-down {seq})"),
            Input::StepDownOverdue { seq } => format!("step-down {seq} overdue"),
            Input::Leave { member } => format!("leave m{member}"),
            Input::Enqueue { system_id } => format!("enqueue #{system_id}"),
            Input::Ack {
                member,
                connection,
                system_id,
                accepted,
            } => {
                format!(
                    "ack #{system_id} by {}{} {}",
                    fence(*member),
                    via(*connection),
                    verdict(*accepted)
                )
            }
            Input::Nack {
                member,
                connection,
                system_id,
                accepted,
                release,
            } => {
                format!(
                    "{} #{system_id} by {}{} {}",
                    if *release { "release" } else { "nack" },
                    fence(*member),
                    via(*connection),
                    verdict(*accepted)
                )
            }
            Input::Expire { held } => format!("expire ({held} held)"),
            Input::Delete { held } => format!("delete ({held} held)"),
            Input::Evict => "evict (drop-oldest pool)".to_string(),
            Input::Activate { member, epoch } => format!("activate m{member} epoch {epoch}"),
            Input::PlaceInLine { member, position } => {
                format!("m{member} placed {position} in the cluster's line")
            }
            Input::HandBack { ids, .. } => format!("hand back {ids:?}"),
            Input::StepDown { member, cause } => {
                format!("the cluster asks m{member} to step down ({cause:?})")
            }
            Input::CallOffStepDown { member } => {
                format!("the cluster calls off m{member}'s step-down")
            }
            Input::SteppedDown { member } => {
                format!("the cluster's line moved past m{member}")
            }
            Input::Fence { epoch, passed } => format!(
                "publish fenced by epoch {epoch} {}",
                if *passed { "passed" } else { "refused" }
            ),
        }
    }
}

fn fence(member: Option<MemberId>) -> String {
    member.map_or("unfenced".to_string(), |m| format!("m{m}"))
}

fn via(connection: Option<ConnectionId>) -> String {
    connection.map_or(String::new(), |c| format!(" via connection {c}"))
}

fn verdict(accepted: bool) -> &'static str {
    if accepted { "accepted" } else { "refused" }
}

/// docs/semantics.md#fencing: an accepted ack or nack comes from the holder: the member it named, or, naming none,
/// over the connection the holder's stream runs on.
fn check_fence(
    m: &SubModel,
    what: &str,
    member: Option<MemberId>,
    connection: Option<ConnectionId>,
    system_id: SystemId,
    violations: &mut Vec<String>,
) {
    let Some(holder) = m.holder.get(&system_id) else {
        return;
    };
    if let Some(member) = member
        && member != *holder
    {
        violations.push(format!(
            "fence broken: {what} of #{system_id} by m{member} released m{holder}'s copy"
        ));
    }
    if let Some(connection) = connection
        && m.connection.get(holder) != Some(&Some(connection))
    {
        violations.push(format!(
            "connection fence broken: {what} of #{system_id} via connection {connection} released m{holder}'s copy, whose stream runs on {:?}",
            m.connection.get(holder)
        ));
    }
}

impl Observer for Checker {
    fn observe(&self, o: &Observation<'_>) {
        let sub = o.subscription;
        let id = sub.id().to_string();
        let singleton = sub.spec().mode == Mode::Singleton;
        let mut lines = vec![format!("broker {id}: {}", Self::describe(o.input))];
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut violations = Vec::new();
        if let Input::Enqueue { system_id } = o.input {
            // docs/semantics.md#restart-identity: a restarted broker never hands out a system id an earlier one did.
            if *system_id <= state.highest_id_before_crash {
                violations.push(format!(
                    "system id #{system_id} handed out again: a broker before the restart handed out ids up to #{}",
                    state.highest_id_before_crash
                ));
            }
            state.highest_id = state.highest_id.max(*system_id);
        }
        let m = state.subs.entry(id.clone()).or_default();

        match o.input {
            Input::Join {
                member,
                connection,
                priority,
            } => {
                // Join order, and never a member id handed out before (also by a broker before a
                // restart).
                if *member <= m.last_member {
                    violations.push(format!(
                        "member id {member} is not above {}, the highest joined before (live: {:?})",
                        m.last_member, m.members
                    ));
                }
                m.last_member = m.last_member.max(*member);
                m.priority.insert(*member, *priority);
                m.line_up(*member);
                m.connection.insert(*member, *connection);
            }
            Input::Leave { member } => {
                m.members.retain(|x| x != member);
                m.priority.remove(member);
                if m.stepping.is_some_and(|(s, _)| s == *member) {
                    m.stepping = None;
                }
                m.connection.remove(member);
                m.active.remove(member);
                m.holder.retain(|_, h| h != member);
            }
            Input::Enqueue { system_id } => {
                if *system_id <= m.last_enqueued {
                    violations.push(format!(
                        "order: #{system_id} enqueued after #{}",
                        m.last_enqueued
                    ));
                }
                m.last_enqueued = m.last_enqueued.max(*system_id);
                let dropped = o
                    .effects
                    .iter()
                    .any(|e| matches!(e, Effect::Dropped { system_id: d, .. } if d == system_id));
                if !dropped {
                    m.outstanding.insert(*system_id);
                }
            }
            Input::Ack {
                member,
                connection,
                system_id,
                accepted: true,
            } => {
                check_fence(m, "ack", *member, *connection, *system_id, &mut violations);
                m.holder.remove(system_id);
                m.outstanding.remove(system_id);
            }
            Input::Nack {
                member,
                connection,
                system_id,
                accepted: true,
                ..
            } => {
                check_fence(m, "nack", *member, *connection, *system_id, &mut violations);
                m.holder.remove(system_id);
            }
            Input::Ack { .. }
            | Input::Nack { .. }
            | Input::Evict
            | Input::Activate { .. }
            | Input::PlaceInLine { .. }
            | Input::StepDownOverdue { .. }
            | Input::StepDown { .. }
            | Input::SteppedDown { .. } => {}
            Input::CallOffStepDown { member } => {
                if m.stepping.is_some_and(|(s, _)| s == *member) {
                    m.stepping = None;
                }
            }
            // docs/semantics.md#hand-over: a hand-over asked for during a takeover by priority
            // makes it a hand-over (its member goes to the back of its priority).
            Input::HandOver { member, .. } => {
                if let Some((stepping, handover)) = &mut m.stepping
                    && stepping == member
                {
                    *handover = true;
                }
            }
            // docs/semantics.md#fenced-publish: a fenced publish passes exactly when its epoch
            // is the active member's, as this model knows it at the same instant.
            Input::Fence { epoch, passed } => {
                let active_epoch = (!m.active.is_empty()).then_some(m.last_epoch);
                if *passed != (active_epoch == Some(*epoch)) {
                    violations.push(format!(
                        "fenced publish: epoch {epoch} {} while the active epoch is {active_epoch:?}",
                        if *passed { "passed" } else { "was refused" }
                    ));
                }
            }
            Input::HandBack { ids, .. } => {
                for id in ids {
                    m.outstanding.remove(id);
                }
            }
            Input::Expire { .. } | Input::Delete { .. } => {
                m.outstanding.clear();
                m.holder.clear();
            }
        }

        for effect in o.effects {
            match effect {
                Effect::Confirm { member, epoch } => {
                    lines.push(format!("broker {id}: confirm m{member} epoch {epoch}"));
                    m.confirmed.insert((*member, *epoch));
                    if *epoch <= m.last_epoch {
                        violations.push(format!(
                            "invariant 5: epoch {epoch} for m{member} is not above {}",
                            m.last_epoch
                        ));
                    }
                    m.last_epoch = *epoch;
                    if singleton {
                        if !m.active.is_empty() {
                            violations.push(format!(
                                "invariant 1: m{member} confirmed while {:?} still active",
                                m.active
                            ));
                        }
                        if m.members.first() != Some(member) && !sub.is_arbitrated() {
                            violations.push(format!(
                                "invariant 2: m{member} promoted but the line is {:?}",
                                m.members
                            ));
                        }
                    }
                    m.active.insert(*member);
                }
                Effect::Standby { member, position } => {
                    lines.push(format!(
                        "broker {id}: standby m{member} position {position}"
                    ));
                }
                Effect::Deliver {
                    member,
                    message,
                    attempt,
                    epoch,
                } => {
                    let sid = message.system_id();
                    lines.push(format!(
                        "broker {id}: deliver #{sid} to m{member} attempt {attempt} epoch {epoch}"
                    ));
                    if !m.active.contains(member) {
                        violations.push(format!(
                            "delivered #{sid} to m{member}, which is not active"
                        ));
                    }
                    if singleton
                        && let Some(lowest) =
                            m.outstanding.iter().find(|id| !m.holder.contains_key(id))
                        && *lowest != sid
                    {
                        violations.push(format!(
                            "order: #{sid} delivered to m{member} while #{lowest} waits ahead of it"
                        ));
                    }
                    if let Some(other) = m.holder.insert(sid, *member) {
                        violations.push(format!(
                            "invariant 4: #{sid} delivered to m{member} while in flight to m{other}"
                        ));
                    }
                }
                Effect::DeadLetter { message, attempts } => {
                    lines.push(format!(
                        "broker {id}: dead-letter #{} after {attempts}",
                        message.system_id()
                    ));
                    m.outstanding.remove(&message.system_id());
                    m.holder.remove(&message.system_id());
                }
                Effect::SteppingDown { member, seq, cause } => {
                    lines.push(format!(
                        "broker {id}: m{member} steps down ({cause:?}, step-down {seq})"
                    ));
                    if !m.active.contains(member) {
                        violations.push(format!("m{member} steps down but is not active"));
                    }
                    m.stepping = Some((*member, *cause == StepDownCause::HandOver));
                }
                Effect::SteppedDown {
                    member,
                    epoch,
                    position,
                } => {
                    lines.push(format!(
                        "broker {id}: m{member} stepped down from epoch {epoch}, standby position {position}"
                    ));
                    // docs/semantics.md#priority: only at a message boundary.
                    let held: Vec<SystemId> = m
                        .holder
                        .iter()
                        .filter(|(_, h)| *h == member)
                        .map(|(id, _)| *id)
                        .collect();
                    if !held.is_empty() {
                        violations.push(format!(
                            "m{member} stepped down while it still holds {held:?}: a takeover mid-message"
                        ));
                    }
                    m.active.remove(member);
                    let handover = match m.stepping.take() {
                        Some((stepping, handover)) if stepping == *member => handover,
                        other => {
                            violations.push(format!(
                                "m{member} stepped down without stepping down first ({other:?})"
                            ));
                            false
                        }
                    };
                    if handover {
                        // To the back of its priority.
                        m.members.retain(|x| x != member);
                        m.line_up(*member);
                    }
                }
                Effect::Withdraw { member, system_id } => {
                    lines.push(format!("broker {id}: withdraw #{system_id} from m{member}"));
                    if m.holder.get(system_id) != Some(member) {
                        violations.push(format!(
                            "withdrew #{system_id} from m{member}, which does not hold it"
                        ));
                    }
                    if matches!(o.input, Input::StepDownOverdue { .. }) {
                        // Back to the queue, for the successor: no longer in flight.
                        m.holder.remove(system_id);
                    }
                }
                Effect::Dropped { system_id, reason } => {
                    lines.push(format!("broker {id}: drop #{system_id} ({reason:?})"));
                    m.dropped.insert(*system_id);
                    m.outstanding.remove(system_id);
                    m.holder.remove(system_id);
                }
            }
        }

        if singleton && !m.members.is_empty() && m.active.len() != 1 {
            violations.push(format!(
                "invariant 1: {} active members among {:?}",
                m.active.len(),
                m.members
            ));
        }
        // Invariant 3: what the model says is outstanding is exactly what the broker holds.
        let held: BTreeSet<SystemId> = sub
            .queued_ids()
            .chain(sub.in_flight_ids().map(|(sid, _)| sid))
            .collect();
        if held != m.outstanding {
            let lost: Vec<_> = m.outstanding.difference(&held).collect();
            let extra: Vec<_> = held.difference(&m.outstanding).collect();
            violations.push(format!("invariant 3: lost {lost:?}, unexpected {extra:?}"));
        }
        let holders: BTreeMap<SystemId, MemberId> = sub.in_flight_ids().collect();
        if holders != m.holder {
            violations.push(format!(
                "in-flight holders differ: broker {holders:?}, model {:?}",
                m.holder
            ));
        }
        if let Err(e) = sub.check_invariants() {
            violations.push(format!("core bookkeeping: {e}"));
        }

        for line in &lines {
            self.trace.line(line);
        }
        for v in &violations {
            self.trace.line(format!("VIOLATION {id}: {v}"));
        }
        state
            .violations
            .extend(violations.into_iter().map(|v| format!("{id}: {v}")));
    }
}
