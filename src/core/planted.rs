//! Deliberately broken behaviours, compiled in only with the test-only `planted-bugs` feature, so
//! the simulation campaign can prove its checker catches each one. A bug is planted for the
//! current thread only (a simulation runs every host on its test's thread), so parallel tests do
//! not see each other's bugs. Production builds never enable the feature.

/// A bug the checker must catch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlantedBug {
    /// Promote the newest standby instead of the earliest-joined (breaks invariant 2). Planted
    /// in `core::subscription` and in the cluster's line (`cluster::coordinator`), where the
    /// real-gateway campaign's join-order check catches it.
    PromoteNewestStandby,
    /// Drop a leaving member's in-flight messages instead of requeuing them (breaks invariant 3).
    ForgetRedelivery,
    /// Make the second singleton member active too (breaks invariant 1).
    TwoActiveMembers,
    /// Let any member's ack release a message (breaks the ack fence, docs/semantics.md#fencing).
    AckIgnoresFence,
    /// Let an ack that names no member release a message held on another connection (breaks
    /// the connection fence, docs/semantics.md#connection-fence). Planted in the shell, which owns connections.
    ConnectionFenceIgnored,
    /// Requeue a leaving member's in-flight messages newest first instead of in publish order
    /// (breaks singleton order after a failover, docs/semantics.md#redelivery-order).
    RequeueNewestFirst,
    /// Start every broker run's epochs, member ids and system ids at zero instead of above the
    /// wall-clock time it started at, so a restarted broker hands out ids again (breaks docs/semantics.md#restart-identity:
    /// "also across broker restarts").
    CountersRestartAtZero,
    /// Cluster mode: a gateway ignores its own lease expiry and keeps its members active while
    /// cut off from the backplane (breaks "never two active members in overlapping lease
    /// periods", docs/semantics.md#cluster-mode). Planted in `cluster::coordinator`.
    GatewayActsAfterLeaseExpiry,
    /// Cluster mode: a refused compare-and-set that says the key has no value is waited out on
    /// the watch, like any conflict, though the key's deletion may have expired unseen (breaks
    /// liveness: a member that joins there never gets into the line). Planted in
    /// `cluster::coordinator`.
    WaitForExpiredDeletion,
    /// Cluster mode: a gateway hands a singleton's messages to members and acks them without
    /// checking its lease at that moment, so a paused gateway that resumes past its lease
    /// delivers and acks what it had queued (breaks docs/semantics.md#cluster-lease-checks). Planted
    /// in `cluster::coordinator::Coordinator::may_act` and the gateway's lease gate.
    GatewaySkipsLeaseCheck,
    /// Cluster mode: a singleton join is answered at once, whether or not the gateway holds a
    /// lease and the member is in the line (breaks join order across gateways,
    /// docs/semantics.md#cluster-join-order). Planted in the cluster simulation's model of the
    /// gateway's join (`sim/cluster.rs`).
    JoinWithoutLease,
    /// A leadership watch is told of a promotion with the epoch before it (breaks
    /// docs/semantics.md#watching-leadership: a frame names the active member with its epoch).
    /// Planted in `broker::leadership` and in the gateway's watch
    /// (`cluster::gateway::api::leadership`).
    WatchReportsStaleEpoch,
    /// A fenced publish is stored when it names the epoch just before the active one: a
    /// deposed leader's late publish gets through (breaks docs/semantics.md#fenced-publish).
    /// Planted in `core::subscription::Subscription::check_fence`.
    FenceAcceptsDeposedEpoch,
    /// A higher-priority member takes over while the active member still holds messages: the
    /// step-down completes at once, and a member on standby holds in-flight messages (breaks
    /// docs/semantics.md#priority: "only at a message boundary"). Planted in
    /// `core::subscription::Subscription::settle_step_down`.
    TakeOverMidMessage,
    /// Cluster mode: a gateway confirms a member active before the fence record of its epoch
    /// is stored, so a deposed leader's fenced publish can be stored after its successor was
    /// confirmed (breaks docs/semantics.md#cluster-fenced-publish). Planted in the cluster
    /// simulation's model of the gateway's activation (`sim/cluster_fence.rs`).
    ActivateBeforeFenceRecord,
    /// Cluster mode: a gateway moves the line past its active member as soon as it asks it to
    /// step down, not once it settled what it holds, so its successor is confirmed while it
    /// still works (breaks docs/semantics.md#cluster-priority-and-hand-over: "at a message
    /// boundary"). Planted in `cluster::coordinator` (and the simulation's model of the
    /// member, which then acts on).
    StepDownBeforeSettled,
    /// Cluster mode: a gateway whose lease lapsed takes any answer to a renewal as its
    /// confirmation, also the refusal that says its lease was deleted, and acts again for its
    /// members though others promoted past them (breaks docs/semantics.md#cluster-lease-lapse).
    /// Planted in `cluster::coordinator`.
    LapseResumesOnAnyAnswer,
    /// Cluster mode: an ack whose confirmation finds no responders (its consumer's leader being
    /// elected) is not sent again, so JetStream delivers the acked message again after its ack
    /// wait (breaks docs/semantics.md#cluster-ack-final). Planted in the real gateway
    /// (`cluster::gateway::data::acks`), caught by the real-gateway campaign.
    AckGivenUpWithoutLeader,
    /// Cluster mode: a QUEUE or BROADCAST bridge whose consumer is not yet checked again after a
    /// lease lapse pulls all the same, and gives what its pull brings back at once, into that
    /// same open pull: JetStream counts a delivery each time it brings it again, so a member
    /// gets a message with an attempt no member saw (breaks docs/semantics.md#cluster-attempts).
    /// Planted in the real gateway (`cluster::gateway::data::bridge`), caught by the
    /// real-gateway campaign.
    GiveBackIntoOpenPull,
    /// Cluster mode: a publish goes to JetStream without its message id, so one whose answer
    /// was lost and that the gateway sends again is stored twice (breaks "stored once",
    /// docs/semantics.md#cluster-mode). Planted in the real gateway
    /// (`cluster::gateway::data::publish`), caught by the real-gateway campaign.
    PublishWithoutMessageId,
}

#[cfg(feature = "planted-bugs")]
mod imp {
    use std::cell::Cell;

    use super::PlantedBug;

    thread_local! {
        static PLANTED: Cell<Option<PlantedBug>> = const { Cell::new(None) };
    }

    /// Plants `bug` (or clears it) for the current thread.
    pub fn plant(bug: Option<PlantedBug>) {
        PLANTED.with(|p| p.set(bug));
    }

    pub(crate) fn active(bug: PlantedBug) -> bool {
        PLANTED.with(|p| p.get() == Some(bug))
    }
}

#[cfg(feature = "planted-bugs")]
pub use imp::plant;

/// Whether `bug` is planted on this thread (for models of the shell outside this crate, the
/// cluster simulation's).
#[cfg(feature = "planted-bugs")]
pub fn is_planted(bug: PlantedBug) -> bool {
    imp::active(bug)
}

#[cfg(feature = "planted-bugs")]
pub(crate) use imp::active;

#[cfg(not(feature = "planted-bugs"))]
#[inline(always)]
pub(crate) const fn active(_bug: PlantedBug) -> bool {
    false
}
