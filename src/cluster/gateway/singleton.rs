//! SINGLETON subscriptions across gateways: the shell that runs this gateway's
//! [`Coordinator`] over the KV backplane ([`NatsBackplane`]) and carries out what it decides on
//! the local broker.
//!
//! - A singleton member that joins here joins the local (arbitrated) subscription on standby
//!   and is announced to the coordinator, which appends it to the subscription's line in the
//!   bucket. When the line makes it active, [`Upstream::activate`] sends its confirmation with
//!   the cluster's epoch and the bridge starts pulling for it.
//! - When a member leaves, the bridge first gives back what this gateway held (when no active
//!   member remains here), then tells the coordinator ([`Handle::left`]), whose write promotes
//!   the next member in the line, on whichever gateway it is.
//! - When this gateway's lease lapses, the coordinator ends every local member with
//!   `UNAVAILABLE` ([`Upstream::end_member`]) and fences itself; this shell then starts a new
//!   incarnation, with a new gateway id, for members that join afterwards.
//!
//! Time is the gateway's monotonic clock (tokio's), from when the shell started.

use std::{sync::Arc, time::Duration};

use tokio::{sync::mpsc, task::JoinSet};
use tokio_stream::StreamExt;

use crate::{
    broker::Upstream,
    cluster::{
        backplane::{Backplane, BoxFuture, KvError, Revision, Watch},
        coordinator::{Command, Config, Coordinator, Effect, Op, RequestId},
        nats::NatsBackplane,
        values::GatewayId,
    },
    core::{Error, MemberId},
};

/// What the gateway tells the coordinator.
#[derive(Debug)]
enum Input {
    Joined(Arc<str>, MemberId),
    Left(Arc<str>, MemberId, Vec<(u64, u32)>),
}

/// The gateway's line to its coordinator shell: cheap to clone.
#[derive(Debug, Clone)]
pub(super) struct Handle {
    inputs: mpsc::UnboundedSender<Input>,
    /// This gateway's incarnation now (its lease is `lease.<id>`), for a delete's question to
    /// every gateway (`delete`).
    incarnation: Arc<std::sync::atomic::AtomicU64>,
}

impl Handle {
    /// A singleton member joined the local subscription (on standby).
    pub(super) fn joined(&self, subscription: Arc<str>, member: MemberId) {
        let _ = self.inputs.send(Input::Joined(subscription, member));
    }

    /// A singleton member left, and what it held was given back; `carry` names the attempts
    /// those messages' next deliveries must carry at least.
    pub(super) fn left(&self, subscription: Arc<str>, member: MemberId, carry: Vec<(u64, u32)>) {
        let _ = self.inputs.send(Input::Left(subscription, member, carry));
    }

    /// This gateway's incarnation now (the id its lease is kept under).
    pub(super) fn incarnation(&self) -> Arc<std::sync::atomic::AtomicU64> {
        self.incarnation.clone()
    }
}

/// Starts the shell; it runs until every [`Handle`] is dropped.
pub(super) fn spawn(
    backplane: NatsBackplane,
    broker: Upstream,
    config: Config,
) -> (Handle, tokio::task::JoinHandle<()>) {
    let (inputs, rx) = mpsc::unbounded_channel();
    let incarnation = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let task = tokio::spawn(run(backplane, broker, config, rx, incarnation.clone()));
    (
        Handle {
            inputs,
            incarnation,
        },
        task,
    )
}

/// How long a gateway whose lease create was not confirmed waits before its next incarnation.
const NEW_INCARNATION_PAUSE: Duration = Duration::from_secs(1);

/// A gateway id for a new incarnation: random, so unique for the life of the bucket with
/// overwhelming probability (the OS seeds std's hasher keys).
fn fresh_id() -> GatewayId {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    // Keep it within JSON's exact integers, for anyone reading the bucket with other tools.
    GatewayId(hasher.finish() >> 11)
}

async fn run(
    backplane: NatsBackplane,
    broker: Upstream,
    config: Config,
    mut inputs: mpsc::UnboundedReceiver<Input>,
    incarnation: Arc<std::sync::atomic::AtomicU64>,
) {
    let start = tokio::time::Instant::now();
    let now = || start.elapsed();
    loop {
        let id = fresh_id();
        incarnation.store(id.0, std::sync::atomic::Ordering::Relaxed);
        let mut coordinator = Coordinator::new(id, config, now());
        tracing::info!(gateway = id.0, bucket = backplane.bucket(), lease = ?config.lease, "singleton coordination started");
        let mut watch: Option<Watch> = None;
        // (Re)opening the watch is one more event of the loop, never a wait outside it: the
        // lease's timer, renewals and members are served meanwhile, so a gateway whose lease
        // lapses while NATS is slow to answer still ends its members on time.
        let mut opening: Option<BoxFuture<'_, Result<Watch, KvError>>> = Some(backplane.watch(""));
        let mut writes: JoinSet<(RequestId, Result<Revision, KvError>)> = JoinSet::new();
        loop {
            carry_out(&mut coordinator, &backplane, &broker, &mut writes);
            if coordinator.is_fenced() {
                if coordinator.was_leased() {
                    tracing::error!(
                        gateway = id.0,
                        "this gateway's cluster lease lapsed: its singleton members were ended with UNAVAILABLE; starting a new incarnation"
                    );
                } else {
                    // Never leased: its lease create was not confirmed (NATS unreachable or
                    // slow), and a create is never repeated. Pause before the next one, so an
                    // answer that comes at once (no responders) does not make a tight loop.
                    tracing::warn!(
                        gateway = id.0,
                        pause = ?NEW_INCARNATION_PAUSE,
                        "NATS did not confirm this gateway's cluster lease: its singleton members were ended with UNAVAILABLE; starting a new incarnation after a pause"
                    );
                    tokio::time::sleep(NEW_INCARNATION_PAUSE).await;
                }
                break;
            }
            if watch.is_none() && opening.is_none() {
                let backplane = &backplane;
                opening = Some(Box::pin(async move {
                    tokio::time::sleep(config.retry).await;
                    backplane.watch("").await
                }));
            }
            let deadline = coordinator.poll_timeout().map(|t| start + t);
            tokio::select! {
                input = inputs.recv() => match input {
                    Some(Input::Joined(sub, member)) => coordinator.member_joined(now(), &sub, member),
                    Some(Input::Left(sub, member, carry)) => coordinator.member_left_carrying(now(), &sub, member, carry),
                    None => return,
                },
                opened = async { opening.as_mut()?.await.into() }, if opening.is_some() => {
                    opening = None;
                    match opened {
                        Some(Ok(w)) => watch = Some(w),
                        Some(Err(error)) => tracing::warn!(%error, "cannot watch the coordination bucket; retrying"),
                        None => {}
                    }
                }
                entry = async { watch.as_mut()?.next().await }, if watch.is_some() => match entry {
                    Some(Ok(e)) => coordinator.backplane_changed(now(), &e.key, e.value.as_deref(), e.revision),
                    Some(Err(error)) => tracing::warn!(%error, "the coordination watch lost contact; it resumes"),
                    None => watch = None,
                },
                Some(done) = writes.join_next(), if !writes.is_empty() => {
                    if let Ok((request, result)) = done {
                        coordinator.write_result(now(), request, result);
                    }
                }
                () = sleep_until(deadline) => coordinator.tick(now()),
            }
        }
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Runs the coordinator's writes and applies its effects to the local broker.
fn carry_out(
    coordinator: &mut Coordinator,
    backplane: &NatsBackplane,
    broker: &Upstream,
    writes: &mut JoinSet<(RequestId, Result<Revision, KvError>)>,
) {
    while let Some(Command { id, key, op }) = coordinator.poll_command() {
        let backplane = backplane.clone();
        writes.spawn(async move {
            let result = match op {
                Op::Create(value) => backplane.create(&key, value).await,
                Op::Update(value, expected) => backplane.update(&key, value, expected).await,
                Op::Delete(expected) => backplane.delete(&key, expected).await,
            };
            (id, result)
        });
    }
    while let Some(effect) = coordinator.poll_effect() {
        match effect {
            Effect::Activate {
                subscription,
                member,
                epoch,
                carry,
                promoted,
                took_over,
            } => {
                let activation = crate::broker::Activation {
                    epoch,
                    carry,
                    promoted,
                    took_over,
                };
                if let Err(error) = broker.activate(&subscription, member, activation) {
                    // It left meanwhile: its leaving is on its way to the coordinator.
                    tracing::debug!(%subscription, member, %error, "could not activate a member");
                }
            }
            Effect::Standby {
                subscription,
                member,
                position,
            } => broker.place_in_line(&subscription, member, position),
            Effect::End {
                subscription,
                member,
                ..
            } => broker.end_member(
                &subscription,
                member,
                &Error::Unavailable(
                    "this gateway lost its place in the cluster (its lease lapsed, or the cluster removed this member): rejoin, at any gateway"
                        .into(),
                ),
            ),
        }
    }
}

/// Coordinator timing for a gateway lease of `lease`: renewals every third of it, a clock
/// drift bound of 1 %, and a margin of a tenth of the lease (at least 100 ms) for timers and
/// processing.
pub fn config(lease: Duration) -> Config {
    Config {
        lease,
        max_drift_percent: 1,
        margin: (lease / 10).max(Duration::from_millis(100)),
        retry: (lease / 20).max(Duration::from_millis(50)),
    }
}
