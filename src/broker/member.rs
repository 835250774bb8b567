//! A member's side of the shell: the frames it receives, the channel that carries them, and the
//! guard that turns "its stream was dropped" into the core's `leave`.

use std::{
    collections::BTreeMap,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use tokio::sync::mpsc;

use super::{Broker, DeadLetters, SubCell};
use crate::core::{Draft, DropReason, Effect, Epoch, Error, MemberId, Message, Subscription};

/// One frame on a member's stream, in domain terms (the service turns it into protobuf).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outbound {
    /// This member is now active.
    Confirm {
        /// The subscription joined.
        subscription_id: Arc<str>,
        /// This member.
        member_id: MemberId,
        /// Its fencing token.
        epoch: Epoch,
    },
    /// This singleton member is on standby at `position` (1 = next).
    Standby {
        /// The subscription joined.
        subscription_id: Arc<str>,
        /// This member.
        member_id: MemberId,
        /// Place in line.
        position: u32,
    },
    /// A delivered message.
    Message {
        /// The message.
        message: Arc<Message>,
        /// 1 on first delivery.
        attempt: u32,
        /// The member's epoch.
        epoch: Epoch,
    },
    /// The broker ends the stream with this error (e.g. shutting down).
    End(Error),
}

/// Frames that can be queued for a member beyond its window: confirmation, standby notice, end.
const CONTROL_FRAMES: usize = 3;

/// A subscription's core state plus the channels to its members, under one lock, so effects
/// reach the streams in the order the core produced them.
#[derive(Debug)]
pub(crate) struct SubState {
    pub(crate) key: u64,
    pub(crate) core: Subscription,
    outlets: BTreeMap<MemberId, mpsc::Sender<Outbound>>,
}

impl SubState {
    pub(crate) fn new(key: u64, core: Subscription) -> Self {
        Self {
            key,
            core,
            outlets: BTreeMap::new(),
        }
    }

    /// Opens the channel for a member about to join; the window bounds what it can ever hold.
    pub(crate) fn outlet(window: u32) -> (mpsc::Sender<Outbound>, mpsc::Receiver<Outbound>) {
        mpsc::channel(window.max(1) as usize + CONTROL_FRAMES)
    }

    pub(crate) fn attach(&mut self, member: MemberId, tx: mpsc::Sender<Outbound>) {
        self.outlets.insert(member, tx);
    }

    pub(crate) fn detach(&mut self, member: MemberId) {
        self.outlets.remove(&member);
    }

    /// Ends every member's stream with `error`.
    pub(crate) fn end_all(&mut self, error: &Error) {
        for tx in std::mem::take(&mut self.outlets).into_values() {
            // A full channel cannot take the end frame; dropping the sender still ends the stream.
            let _ = tx.try_send(Outbound::End(error.clone()));
        }
    }

    /// Carries out the core's effects in order. Dead letters are collected for publishing once
    /// this subscription's lock is released.
    pub(crate) fn apply(&mut self, effects: Vec<Effect>, dead: &mut DeadLetters) {
        for effect in effects {
            match effect {
                Effect::Confirm { member, epoch } => {
                    let subscription_id = self.core.id().clone();
                    self.send(
                        member,
                        Outbound::Confirm {
                            subscription_id,
                            member_id: member,
                            epoch,
                        },
                    );
                }
                Effect::Standby { member, position } => {
                    let subscription_id = self.core.id().clone();
                    self.send(
                        member,
                        Outbound::Standby {
                            subscription_id,
                            member_id: member,
                            position,
                        },
                    );
                }
                Effect::Deliver {
                    member,
                    message,
                    attempt,
                    epoch,
                } => self.send(
                    member,
                    Outbound::Message {
                        message,
                        attempt,
                        epoch,
                    },
                ),
                Effect::DeadLetter { message, attempts } => {
                    if let Some(topic) = self.core.spec().dead_letter_topic.clone() {
                        tracing::warn!(
                            subscription = %self.core.id(),
                            system_id = message.system_id,
                            attempts,
                            dead_letter_topic = %topic,
                            "message reached max_delivery_attempts; dead-lettering it"
                        );
                        dead.push((
                            self.key,
                            Draft::dead_letter(&message, self.core.id(), topic, attempts),
                        ));
                    }
                }
                Effect::Dropped { system_id, reason } => {
                    let reason = match reason {
                        DropReason::MaxDeliveryAttempts => {
                            "max_delivery_attempts reached, no dead_letter_topic"
                        }
                        DropReason::QueueFull => "queue full",
                    };
                    tracing::warn!(subscription = %self.core.id(), system_id, reason, "message dropped");
                }
            }
        }
    }

    fn send(&self, member: MemberId, frame: Outbound) {
        let Some(tx) = self.outlets.get(&member) else {
            return;
        };
        match tx.try_send(frame) {
            Ok(()) => {}
            // The stream is gone; its guard's `leave` is on its way and will requeue the message.
            Err(mpsc::error::TrySendError::Closed(_)) => {}
            // Cannot happen: the channel has room for the window plus the control frames. If it
            // did, the message stays in flight and is redelivered when the member leaves.
            Err(mpsc::error::TrySendError::Full(_)) => {
                tracing::error!(subscription = %self.core.id(), member, "member channel full; frame not sent");
            }
        }
    }
}

/// The stream of frames one member receives. Dropping it (the client cancelled, the connection
/// reset, keepalive failed, or the server shut down) makes the member leave its subscription.
#[derive(Debug)]
pub struct MemberStream {
    rx: mpsc::Receiver<Outbound>,
    guard: MemberGuard,
}

impl MemberStream {
    pub(crate) fn new(
        rx: mpsc::Receiver<Outbound>,
        broker: Broker,
        cell: Arc<SubCell>,
        member: MemberId,
    ) -> Self {
        Self {
            rx,
            guard: MemberGuard {
                broker,
                cell,
                member,
            },
        }
    }

    /// This member's id.
    pub fn member_id(&self) -> MemberId {
        self.guard.member
    }

    /// The next frame, or `None` once the broker ended the stream.
    pub async fn next(&mut self) -> Option<Outbound> {
        self.rx.recv().await
    }

    /// The next frame if one is waiting, without blocking (for synchronous tests and models).
    pub fn try_next(&mut self) -> Option<Outbound> {
        self.rx.try_recv().ok()
    }
}

impl futures_core::Stream for MemberStream {
    type Item = Outbound;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Outbound>> {
        self.rx.poll_recv(cx)
    }
}

#[derive(Debug)]
struct MemberGuard {
    broker: Broker,
    cell: Arc<SubCell>,
    member: MemberId,
}

impl Drop for MemberGuard {
    fn drop(&mut self) {
        self.broker.leave(&self.cell, self.member);
    }
}
