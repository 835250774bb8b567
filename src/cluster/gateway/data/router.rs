//! The gateway's observer of its local broker: it routes what the local core decides (acks,
//! drops, dead letters, members leaving, hand-backs, expiry) to the bridge of each
//! subscription, as [`Event`]s. Called under the subscription's lock, on the data path.

use std::{
    collections::HashMap,
    sync::{
        Arc, PoisonError, RwLock,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
};

use tokio::sync::{Notify, mpsc};

use crate::cluster::gateway::data::bridge::{Event, HandedBack, Wiring};
use crate::{
    broker::{Input, Observation, Observer},
    core::{Draft, Effect},
};

struct Link {
    events: mpsc::UnboundedSender<Event>,
    wake: Arc<Notify>,
    /// Cleared, under the subscription's lock, when the local subscription this bridge feeds
    /// expires: the broker checks it under that same lock before queuing what the bridge
    /// injects, so a stopping bridge can never feed a newer subscription of the same name.
    live: Arc<AtomicBool>,
    /// What the local subscription handed back (see [`Bridge::handed_back`]).
    handed_back: HandedBack,
    /// The last step-down whose member was reported settled ([`Event::Yielded`]): once each.
    yielded: AtomicU64,
}

/// Routes the local broker's decisions to the bridge of each subscription. It is the broker's
/// observer in cluster mode: called under the subscription's lock, it only looks up the
/// subscription's link and queues an event.
///
/// The event queues are unbounded in type but bounded in fact: each message a bridge holds
/// produces at most one `Acked` or `Dropped`, and a bridge holds at most its members' windows.
#[derive(Default)]
pub(in crate::cluster::gateway) struct Router {
    links: RwLock<HashMap<Arc<str>, Link>>,
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Router").finish_non_exhaustive()
    }
}

/// What [`Router::attach`] found.
pub(in crate::cluster::gateway) enum Attach {
    /// A bridge runs for the subscription: it was woken to pull for the new member.
    Running,
    /// None ran: start one with this.
    New(Wiring),
}

impl Router {
    /// A router with no bridges.
    pub(in crate::cluster::gateway) fn new() -> Arc<Self> {
        Arc::default()
    }

    /// Called once a member joined `subscription` locally: wakes its bridge, or registers a
    /// new one (in the same write lock, so two joins cannot both start one).
    pub(in crate::cluster::gateway) fn attach(&self, subscription: &Arc<str>) -> Attach {
        let mut links = self.links.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(link) = links.get(subscription) {
            link.wake.notify_one();
            return Attach::Running;
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let wake = Arc::new(Notify::new());
        let live = Arc::new(AtomicBool::new(true));
        let handed_back = HandedBack::default();
        links.insert(
            subscription.clone(),
            Link {
                events: tx,
                wake: wake.clone(),
                live: live.clone(),
                handed_back: handed_back.clone(),
                yielded: AtomicU64::new(0),
            },
        );
        Attach::New(Wiring {
            events: rx,
            wake,
            live,
            handed_back,
        })
    }

    /// Stops every bridge (the gateway is shutting down): each gives back what it holds.
    pub(in crate::cluster::gateway) fn stop_all(&self) {
        let mut links = self.links.write().unwrap_or_else(PoisonError::into_inner);
        for (_, link) in links.drain() {
            link.live.store(false, Ordering::Release);
            let _ = link.events.send(Event::Stop);
        }
    }
}

impl Observer for Router {
    fn observe(&self, observation: &Observation<'_>) {
        let id = observation.subscription.id();
        let arbitrated = observation.subscription.is_arbitrated();
        // A step-down in progress (docs/semantics.md#cluster-priority-and-hand-over): any input
        // may settle its member's last message.
        let settled = observation
            .subscription
            .stepping_down()
            .and_then(|_| observation.subscription.settled_step_down());
        let relevant = settled.is_some()
            || matches!(
                observation.input,
                Input::Ack { accepted: true, .. } | Input::Expire { .. } | Input::Delete { .. }
            )
            || (arbitrated
                && matches!(
                    observation.input,
                    Input::Leave { .. }
                        | Input::Activate { .. }
                        | Input::HandBack { .. }
                        | Input::CallOffStepDown { .. }
                ))
            || observation
                .effects
                .iter()
                .any(|e| matches!(e, Effect::Dropped { .. } | Effect::DeadLetter { .. }));
        if !relevant {
            return;
        }
        if let Input::Expire { .. } | Input::Delete { .. } = observation.input {
            // Unlinked here, under the subscription's lock, so a join that recreates the
            // subscription right after starts a new bridge instead of waking this one.
            let mut links = self.links.write().unwrap_or_else(PoisonError::into_inner);
            if let Some(link) = links.remove(id) {
                link.live.store(false, Ordering::Release);
                let _ = link.events.send(Event::Stop);
            }
            return;
        }
        let links = self.links.read().unwrap_or_else(PoisonError::into_inner);
        let Some(link) = links.get(id) else {
            return;
        };
        if let Input::Activate { .. } | Input::CallOffStepDown { .. } = observation.input {
            // The active member has window now (again, once its step-down is off): pull for it.
            link.wake.notify_one();
        }
        if let Input::HandBack { carry, .. } = observation.input {
            let mut handed_back = link
                .handed_back
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            for &(sequence, attempt) in carry {
                let kept = handed_back.entry(sequence).or_insert(attempt);
                *kept = (*kept).max(attempt);
            }
        }
        if let Input::Ack {
            accepted: true,
            system_id,
            ..
        } = observation.input
        {
            if !crate::cluster::gateway::data::acks::acked_upstream(observation.subscription.spec())
            {
                // Done once written: the bridge holds nothing of an ack-free QUEUE or
                // BROADCAST subscription to settle, only room to pull into (one wake, no event
                // per message). An ack-free singleton's consumer still expects the ack.
                link.wake.notify_one();
            } else {
                let _ = link.events.send(Event::Acked(*system_id));
            }
        }
        for effect in observation.effects {
            match effect {
                Effect::Dropped { system_id, .. } => {
                    let _ = link.events.send(Event::Dropped(*system_id));
                }
                Effect::DeadLetter { message, attempts } => {
                    if let Some(topic) = &observation.subscription.spec().dead_letter_topic {
                        let draft = Draft::dead_letter(message, id, topic.clone(), *attempts);
                        let _ = link
                            .events
                            .send(Event::DeadLettered(message.system_id(), draft));
                    }
                }
                _ => {}
            }
        }
        // After the message its last attempt ended with (dead-lettered or dropped): the bridge
        // terminates that one before it gives back what it holds, or JetStream would deliver
        // it again elsewhere, to be dead-lettered a second time.
        if let Input::Leave { member } = observation.input
            && arbitrated
        {
            let _ = link.events.send(Event::Left(*member));
        }
        if let Some(step) = settled
            && link.yielded.swap(step.seq, Ordering::AcqRel) != step.seq
        {
            let _ = link.events.send(Event::Yielded(step.member));
        }
    }
}
