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
//! - When this gateway's lease lapses, nothing is done for a singleton member until it is
//!   renewed (docs/semantics.md#cluster-lease-lapse); when it ends for good (deleted by another
//!   gateway, or lapsed for `--gateway-lapse-patience`, 0 by default), the coordinator ends every local member with
//!   `UNAVAILABLE` ([`Upstream::end_member`]) and fences itself; this shell then starts a new
//!   incarnation, with a new gateway id, for members that join afterwards.
//!
//! - The shell publishes the lease it holds ([`LeaseGate`]) after every input: a member
//!   joins only while it is valid (and waits for it, bounded, when it is not), and the bridge
//!   hands a message to a member, or sends JetStream an ack, only while it is valid at that
//!   moment by the clock read then (docs/semantics.md#cluster-lease-checks).
//!
//! Time is the gateway's monotonic clock (tokio's), from when the shell started.

mod shell;

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use tokio::sync::{mpsc, oneshot};

use shell::Views;

use crate::cluster::gateway::{
    control::fence::{Fences, Recording},
    control::lease::LeaseGate,
};
use crate::{
    broker::{HandedOver, LeadershipWatch, Upstream},
    cluster::{
        backplane::Revision,
        coordinator::Config,
        values::{GatewayId, Key},
    },
    core::{Error, MemberId},
};

/// What the gateway tells the coordinator.
#[derive(Debug)]
enum Input {
    /// A member joined while incarnation `.2`'s lease was valid, with metadata and priority
    /// `.3`; `.4` is told once it is in the line (or why it cannot be).
    Joined(
        Arc<str>,
        MemberId,
        u64,
        (Arc<str>, u32),
        oneshot::Sender<Result<(), Error>>,
    ),
    /// A local active member replaces its metadata; told once the line holds it.
    Proclaim(
        Arc<str>,
        MemberId,
        Arc<str>,
        oneshot::Sender<Result<(), Error>>,
    ),
    Left(Arc<str>, MemberId, Vec<(u64, u32)>),
    /// A local member stepping down holds nothing, and what waited here went back (with these
    /// attempts): the line may move past it.
    Yielded(Arc<str>, MemberId, Vec<(u64, u32)>),
    /// A `HandOver`, asked of the line as the bucket's leader held it at revision `.1` (or
    /// later): told the outcome once the line shows it.
    HandOver(
        Arc<str>,
        Revision,
        oneshot::Sender<Result<HandedOver, Error>>,
    ),
    /// Someone watches the subscription's leadership: told its state now, then each change.
    Watch(Arc<str>, oneshot::Sender<LeadershipWatch>),
    /// The fence record of an activation's epoch is stored: the member may be activated.
    Recorded(Arc<str>, MemberId, crate::broker::Activation),
    /// What this gateway's copy of the line says: whether a member is active, and the epoch.
    Line(Arc<str>, oneshot::Sender<Option<(bool, u64)>>),
    /// The record of a stepped-down member's ended epoch is stored: the member is told, at
    /// its place in line `.2`.
    SteppedDown(Arc<str>, MemberId, u32),
    /// A console asks for this gateway's copy of every line, as it stands (docs/operations.md#console).
    Lines(oneshot::Sender<ClusterLines>),
}

/// This gateway's copy of the cluster's lines, for a console (docs/operations.md#console).
#[derive(Debug, Clone, Default)]
pub struct ClusterLines {
    /// This gateway's id (its incarnation) when asked.
    pub this_gateway: u64,
    /// Whether this gateway held its lease and had caught up with the bucket: when not, the
    /// copy may be behind.
    pub current: bool,
    /// How many gateways hold a lease, as this gateway last saw the bucket.
    pub gateways: usize,
    /// Every subscription's line, by subscription id.
    pub lines: std::collections::BTreeMap<Arc<str>, crate::cluster::values::SubValue>,
}

/// The gateway's line to its coordinator shell: cheap to clone.
#[derive(Debug, Clone)]
pub(in crate::cluster::gateway) struct Handle {
    inputs: mpsc::UnboundedSender<Input>,
    /// This gateway's id now (its lease is `lease.<id>`), for a delete's question to every
    /// gateway (`delete`).
    current_id: Arc<std::sync::atomic::AtomicU64>,
    lease: Arc<LeaseGate>,
    /// The gateways holding a lease, as this gateway's watch of the bucket last saw them.
    leased: Leased,
}

/// Joins waiting for their place in the line, or proclamations for the line to hold them:
/// each answered once, by its member.
type Waiting = BTreeMap<(Arc<str>, MemberId), oneshot::Sender<Result<(), Error>>>;

/// Proclamations waiting for the line to hold them, by member: several of one member may
/// overlap, and the line holding the latest answers every one of them (the earlier ones were
/// replaced by the member itself).
type Proclaiming = BTreeMap<(Arc<str>, MemberId), Vec<oneshot::Sender<Result<(), Error>>>>;

/// The ids of the gateways holding a lease (`lease.<id>` keys), kept from the coordination
/// bucket's watch; `None` until the watch has delivered.
type Leased = Arc<std::sync::Mutex<Option<std::collections::BTreeSet<u64>>>>;

/// Applies one watched entry to the leased set: a lease key written adds its gateway, one
/// deleted removes it.
fn watched(leased: &Leased, key: &str, value: Option<&[u8]>) {
    let Some(Key::Lease(GatewayId(gateway))) = Key::parse(key) else {
        return;
    };
    let mut leased = leased
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let set = leased.get_or_insert_with(Default::default);
    if value.is_some_and(|v| !v.is_empty()) {
        set.insert(gateway);
    } else {
        set.remove(&gateway);
    }
}

impl Handle {
    /// The gateways holding a lease, as the bucket's watch last saw them (`None` before it
    /// delivered): whom an announcement waits for (`announce`), without a listing of the
    /// bucket per join.
    pub(in crate::cluster::gateway) fn leased_gateways(
        &self,
    ) -> Option<std::collections::BTreeSet<u64>> {
        self.leased
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// A singleton member joined the local subscription (on standby), admitted while
    /// `incarnation`'s lease was valid ([`LeaseGate::wait_valid`]). If that incarnation has
    /// ended by the time the coordinator hears of it, the member is ended with `UNAVAILABLE`
    /// rather than appended to the line late, behind members that joined later elsewhere.
    /// Resolves once the member is in the line (a closed channel: it was ended first; an
    /// error: the line has no room for its metadata).
    pub(in crate::cluster::gateway) fn joined(
        &self,
        subscription: Arc<str>,
        member: MemberId,
        incarnation: u64,
        (metadata, priority): (Arc<str>, u32),
    ) -> oneshot::Receiver<Result<(), Error>> {
        let (in_line, told) = oneshot::channel();
        let _ = self.inputs.send(Input::Joined(
            subscription,
            member,
            incarnation,
            (metadata, priority),
            in_line,
        ));
        told
    }

    /// Local member `member`, stepping down, holds nothing, and what this gateway held went
    /// back; `carry` as for [`Handle::left`].
    pub(in crate::cluster::gateway) fn yielded(
        &self,
        subscription: Arc<str>,
        member: MemberId,
        carry: Vec<(u64, u32)>,
    ) {
        let _ = self
            .inputs
            .send(Input::Yielded(subscription, member, carry));
    }

    /// Asks `subscription`'s active member, at whichever gateway, to hand over
    /// (docs/semantics.md#cluster-priority-and-hand-over); resolves with the outcome once this
    /// gateway's copy of the line shows it.
    ///
    /// # Errors
    /// [`Error::HandOverRefused`] as the line says; [`Error::Unavailable`] when the shell
    /// stopped, or this gateway lost its lease, before the outcome was known.
    pub(in crate::cluster::gateway) async fn hand_over(
        &self,
        subscription: Arc<str>,
        at_least: Revision,
    ) -> Result<HandedOver, Error> {
        let (reply, answer) = oneshot::channel();
        let _ = self
            .inputs
            .send(Input::HandOver(subscription.clone(), at_least, reply));
        answer.await.unwrap_or_else(|_| {
            Err(Error::Unavailable(format!(
                "this gateway lost its place in the cluster before the hand-over of subscription {subscription:?} was seen; it may yet happen: watch its leadership"
            )))
        })
    }

    /// Local active member `member` replaces its metadata in the line
    /// (docs/semantics.md#member-metadata). Resolves once the line holds it (a closed
    /// channel: the member left, or was ended, first).
    pub(in crate::cluster::gateway) fn proclaim(
        &self,
        subscription: Arc<str>,
        member: MemberId,
        metadata: Arc<str>,
    ) -> oneshot::Receiver<Result<(), Error>> {
        let (done, told) = oneshot::channel();
        let _ = self
            .inputs
            .send(Input::Proclaim(subscription, member, metadata, done));
        told
    }

    /// This gateway's lease as the shell last published it.
    pub(in crate::cluster::gateway) fn lease(&self) -> &Arc<LeaseGate> {
        &self.lease
    }

    /// A singleton member left, and what it held was given back; `carry` names the attempts
    /// those messages' next deliveries must carry at least.
    pub(in crate::cluster::gateway) fn left(
        &self,
        subscription: Arc<str>,
        member: MemberId,
        carry: Vec<(u64, u32)>,
    ) {
        let _ = self.inputs.send(Input::Left(subscription, member, carry));
    }

    /// Watches subscription `subscription`'s leadership as the coordination bucket records
    /// it: its line's active member and epoch, from this gateway's watch of the bucket.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when the shell has stopped.
    pub(in crate::cluster::gateway) async fn watch(
        &self,
        subscription: Arc<str>,
    ) -> Result<LeadershipWatch, Error> {
        let (reply, answer) = oneshot::channel();
        let _ = self.inputs.send(Input::Watch(subscription, reply));
        answer.await.map_err(|_| {
            Error::Unavailable("this gateway's singleton coordination has stopped".into())
        })
    }

    /// Whether this gateway's copy of `subscription`'s line has an active member, and its
    /// epoch; `None` with no line (or no coordination).
    pub(in crate::cluster::gateway) async fn line(
        &self,
        subscription: Arc<str>,
    ) -> Option<(bool, u64)> {
        let (reply, answer) = oneshot::channel();
        let _ = self.inputs.send(Input::Line(subscription, reply));
        answer.await.ok().flatten()
    }

    /// This gateway's copy of every line, for a console; `None` once the shell stopped.
    pub(in crate::cluster::gateway) async fn lines(&self) -> Option<ClusterLines> {
        let (reply, answer) = oneshot::channel();
        let _ = self.inputs.send(Input::Lines(reply));
        answer.await.ok()
    }

    /// This gateway's incarnation now (the id its lease is kept under).
    pub(in crate::cluster::gateway) fn incarnation(&self) -> Arc<std::sync::atomic::AtomicU64> {
        self.current_id.clone()
    }
}

/// Starts the shell; it runs until every [`Handle`] is dropped.
pub(in crate::cluster::gateway) fn spawn(
    backplane: Arc<dyn crate::cluster::backplane::Backplane>,
    broker: Upstream,
    config: Config,
    fences: Arc<Fences>,
) -> (Handle, tokio::task::JoinHandle<()>) {
    let (inputs, rx) = mpsc::unbounded_channel();
    let current_id = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let start = tokio::time::Instant::now();
    let lease = Arc::new(LeaseGate::new(start));
    let gate = lease.clone();
    broker.gate_singleton_deliveries(Arc::new(move || gate.valid_term()));
    // A lease past its end and the lapse patience is over: a settle then would be answered
    // and never sent to JetStream. Within the patience, a settle waits for the renewal
    // (docs/semantics.md#cluster-lease-lapse).
    let gate = lease.clone();
    let patience = config.lapse_patience;
    broker.gate_singleton_settles(Arc::new(move || gate.valid_or_lapsed_within(patience)));
    let leased: Leased = Arc::default();
    let task = tokio::spawn(shell::run(
        backplane,
        broker,
        config,
        rx,
        start,
        Views {
            lease: lease.clone(),
            current_id: current_id.clone(),
            leased: leased.clone(),
        },
        Recording::new(
            fences,
            lease.clone(),
            {
                let inputs = inputs.clone();
                move |subscription, member, activation| {
                    let _ = inputs.send(Input::Recorded(subscription, member, activation));
                }
            },
            {
                let inputs = inputs.clone();
                move |subscription, member, position| {
                    let _ = inputs.send(Input::SteppedDown(subscription, member, position));
                }
            },
        ),
    ));
    (
        Handle {
            inputs,
            current_id,
            lease,
            leased,
        },
        task,
    )
}

/// Coordinator timing for a gateway lease of `lease`: renewals every third of it, a clock
/// drift bound of 1 %, and a margin of a tenth of the lease (at least 100 ms) for timers and
/// processing.
pub fn config(lease: Duration, lapse_patience: Duration) -> Config {
    Config {
        lease,
        max_drift_percent: 1,
        margin: (lease / 10).max(Duration::from_millis(100)),
        retry: (lease / 20).max(Duration::from_millis(50)),
        lapse_patience,
    }
}
