//! This gateway's lease as its coordinator shell last confirmed it, for the checks made where a
//! singleton's messages and acks leave the gateway (docs/semantics.md#cluster-lease-checks).
//!
//! The coordinator decides when the lease lapses, but it runs on its own task: after the
//! process was paused (SIGSTOP, a VM frozen, a long GC-like stall of the host), whichever task
//! the runtime polls first may hold work queued before the pause: a pulled message to hand to
//! a member, an ack to send. So every such hand-over reads the monotonic clock itself and
//! compares it with the published "valid until": a pause past the lease is seen at the moment
//! of the hand-over, by whichever task comes first, before the coordinator's own timer fires.
//!
//! Each incarnation of the coordinator has a number; a hand-over names the incarnation it works
//! for (the one under which its messages were pulled), so a new incarnation's lease never
//! lets an old incarnation's held messages be acked.

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use tokio::{sync::Notify, time::Instant};

use crate::core::planted::{PlantedBug, active as planted};

/// How long a singleton join waits for this gateway's lease when it holds none (starting, or
/// between incarnations after a lapse) before it is refused with `UNAVAILABLE`.
pub(in crate::cluster::gateway) const JOIN_LEASE_PATIENCE: Duration = Duration::from_secs(5);

/// The lease as the shell last published it: readable from any task, cheaply.
#[derive(Debug)]
pub(crate) struct LeaseGate {
    /// The shell's clock origin: `now` is `start.elapsed()`.
    start: Instant,
    /// The incarnation the lease below belongs to (0: none yet).
    incarnation: AtomicU64,
    /// Valid until this many nanoseconds after `start`; 0: not valid.
    until: AtomicU64,
    /// Counts the times the lease became valid after it was not (a first lease, or one renewed
    /// after a lapse): announcements may have been missed in between ([`LeaseGate::valid_term`]).
    terms: AtomicU64,
    changed: Notify,
}

impl LeaseGate {
    /// A gate closed until the first confirmed lease, on the clock that started at `start`.
    pub(crate) fn new(start: Instant) -> Self {
        Self {
            start,
            incarnation: AtomicU64::new(0),
            until: AtomicU64::new(0),
            terms: AtomicU64::new(0),
            changed: Notify::new(),
        }
    }

    /// Publishes incarnation `incarnation`'s lease: valid until `until` on the shell's clock,
    /// or not valid (`None`). A new incarnation closes the gate before it names itself, so no
    /// reader pairs one incarnation's number with another's deadline.
    pub(crate) fn publish(&self, incarnation: u64, until: Option<Duration>) {
        let until = until.map_or(0, |u| {
            u64::try_from(u.as_nanos()).unwrap_or(u64::MAX).max(1)
        });
        let now = self.now_nanos();
        let mut changed = false;
        let old = self.until.load(Ordering::SeqCst);
        let was_valid =
            old != 0 && now < old && self.incarnation.load(Ordering::SeqCst) == incarnation;
        if !was_valid && until > now {
            // Counted before it is published valid: a reader never sees the new lease with the
            // old term.
            self.terms.fetch_add(1, Ordering::SeqCst);
        }
        if self.incarnation.load(Ordering::SeqCst) != incarnation {
            self.until.store(0, Ordering::SeqCst);
            self.incarnation.store(incarnation, Ordering::SeqCst);
            changed = true;
        }
        if self.until.swap(until, Ordering::SeqCst) != until || changed {
            self.changed.notify_waiters();
        }
    }

    fn now_nanos(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// While the lease is valid, the stretch of validity it belongs to: a new one begins with
    /// every new incarnation and every renewal after a lapse (when this gateway may have
    /// missed what others told the leased gateways). `None` while not valid.
    pub(crate) fn valid_term(&self) -> Option<u64> {
        let term = self.terms.load(Ordering::SeqCst);
        self.valid()?;
        (self.terms.load(Ordering::SeqCst) == term).then_some(term)
    }

    /// The incarnation whose lease is valid at this instant, by the monotonic clock read now.
    pub(crate) fn valid(&self) -> Option<u64> {
        self.valid_within(Duration::ZERO)
    }

    /// Whether a singleton's settle may be applied now: the lease is valid, or lapsed for less
    /// than `patience` within the same incarnation (it may yet be renewed: the settle waits
    /// for it, docs/semantics.md#cluster-lease-lapse). Past that, the lease ended for good.
    pub(crate) fn valid_or_lapsed_within(&self, patience: Duration) -> bool {
        self.valid_within(patience).is_some()
    }

    /// The incarnation whose lease is valid, or lapsed for less than `slack`, at this instant.
    fn valid_within(&self, slack: Duration) -> Option<u64> {
        let incarnation = self.incarnation.load(Ordering::SeqCst);
        let until = self.until.load(Ordering::SeqCst);
        let slack = u64::try_from(slack.as_nanos()).unwrap_or(u64::MAX);
        let in_time = self.now_nanos() < until.saturating_add(slack)
            || planted(PlantedBug::GatewaySkipsLeaseCheck);
        (until != 0 && in_time && self.incarnation.load(Ordering::SeqCst) == incarnation)
            .then_some(incarnation)
    }

    /// Whether incarnation `incarnation`'s lease is valid at this instant.
    pub(crate) fn valid_for(&self, incarnation: u64) -> bool {
        self.valid() == Some(incarnation)
    }

    /// The incarnation named now, whether or not its lease is valid (0: none yet). Within one
    /// incarnation a lease that lapsed may be renewed (docs/semantics.md#cluster-lease-lapse);
    /// a new one begins only once every member of the one before was ended.
    pub(crate) fn incarnation(&self) -> u64 {
        self.incarnation.load(Ordering::SeqCst)
    }

    /// Waits until incarnation `incarnation`'s lease is valid, for at most `within`: false if it
    /// is not by then, or once another incarnation is named (its lease ended for good).
    pub(crate) async fn wait_valid_for(&self, incarnation: u64, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.valid_for(incarnation) {
                return true;
            }
            if self.incarnation() != incarnation {
                return false;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return self.valid_for(incarnation);
            }
        }
    }

    /// Waits until a lease is valid, for at most `within`: the incarnation, or `None`.
    pub(crate) async fn wait_valid(&self, within: Duration) -> Option<u64> {
        let deadline = Instant::now() + within;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if let Some(incarnation) = self.valid() {
                return Some(incarnation);
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return self.valid();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_gate_closes_when_the_clock_passes_the_lease_without_any_publish() {
        let gate = LeaseGate::new(Instant::now());
        assert_eq!(gate.valid(), None, "closed before the first lease");
        gate.publish(1, Some(Duration::from_secs(1)));
        assert!(gate.valid_for(1));
        assert!(!gate.valid_for(2), "another incarnation's lease");
        // A pause: the clock jumps past the lease, nobody publishes anything.
        tokio::time::advance(Duration::from_millis(1_001)).await;
        assert_eq!(gate.valid(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_renewed_after_a_lapse_begins_a_new_term_and_one_renewed_in_time_does_not() {
        let gate = LeaseGate::new(Instant::now());
        assert_eq!(gate.valid_term(), None);
        gate.publish(1, Some(Duration::from_secs(1)));
        let first = gate.valid_term().expect("valid");
        tokio::time::advance(Duration::from_millis(500)).await;
        gate.publish(1, Some(Duration::from_millis(1_500)));
        assert_eq!(gate.valid_term(), Some(first), "renewed in time");
        // A pause past the lease, then a renewal: a new term, though nobody published between.
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(gate.valid_term(), None);
        gate.publish(1, Some(Duration::from_secs(4)));
        let second = gate.valid_term().expect("renewed");
        assert_ne!(second, first);
        gate.publish(2, Some(Duration::from_secs(10)));
        assert_ne!(gate.valid_term(), Some(second), "a new incarnation");
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_incarnation_never_validates_an_old_one() {
        let gate = LeaseGate::new(Instant::now());
        gate.publish(1, Some(Duration::from_secs(5)));
        gate.publish(2, None);
        assert_eq!(gate.valid(), None);
        gate.publish(2, Some(Duration::from_secs(5)));
        assert!(gate.valid_for(2));
        assert!(!gate.valid_for(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_lapsed_lease_renewed_in_its_incarnation_is_waited_for_and_a_new_incarnation_is_not()
    {
        let gate = std::sync::Arc::new(LeaseGate::new(Instant::now()));
        gate.publish(1, Some(Duration::from_secs(1)));
        tokio::time::advance(Duration::from_millis(1_500)).await;
        assert!(!gate.valid_for(1), "lapsed");
        assert_eq!(gate.incarnation(), 1);
        // Renewed within the wait: the same incarnation's wait ends true.
        let publisher = gate.clone();
        let waiting = {
            let gate = gate.clone();
            tokio::spawn(async move { gate.wait_valid_for(1, Duration::from_secs(10)).await })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        publisher.publish(1, Some(Duration::from_secs(5)));
        assert!(waiting.await.unwrap());
        // Lapsed again, then a new incarnation is named: the old one's wait ends false at once.
        tokio::time::advance(Duration::from_secs(4)).await;
        let waiting = {
            let gate = gate.clone();
            tokio::spawn(async move { gate.wait_valid_for(1, Duration::from_secs(10)).await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        publisher.publish(2, None);
        let started = Instant::now();
        assert!(!waiting.await.unwrap());
        assert!(started.elapsed() < Duration::from_secs(1));
        // Never renewed: false at the bound.
        assert!(!gate.wait_valid_for(2, Duration::from_millis(200)).await);
    }

    #[tokio::test(start_paused = true)]
    async fn waiting_for_a_lease_ends_when_one_is_published_or_at_the_bound() {
        let gate = std::sync::Arc::new(LeaseGate::new(Instant::now()));
        assert_eq!(gate.wait_valid(Duration::from_millis(100)).await, None);
        let publisher = gate.clone();
        let waiting = tokio::spawn(async move { gate.wait_valid(Duration::from_secs(10)).await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        publisher.publish(3, Some(Duration::from_secs(60)));
        assert_eq!(waiting.await.unwrap(), Some(3));
    }
}
