//! The coordination bucket's writes under way at a gateway: at most [`MAX_IN_FLIGHT`] at once,
//! the rest queued in the order the coordinator issued them, and lease renewals never queued.
//!
//! Every write goes to one replicated stream (the bucket's), which applies them in the order
//! they arrive. Unbounded, a burst of joins (a rollout starting a thousand elections at once)
//! puts a thousand line writes ahead of the next renewal, which then waits for all of them: on
//! a loaded cluster past the lease, and the gateway's members lose their places
//! (docs/cluster.md#subscriptions-and-consumers). Bounded, a renewal waits for at most
//! [`MAX_IN_FLIGHT`] writes ahead of it; the rest wait here, in memory bounded by the lines
//! the coordinator holds (one write in flight or queued per key).

use std::{collections::VecDeque, future::Future, pin::Pin};

use tokio::task::JoinSet;

use crate::cluster::{backplane::KvError, coordinator::RequestId, values::Key};

/// Most writes other than renewals sent to the bucket and not yet answered.
pub(in crate::cluster::gateway) const MAX_IN_FLIGHT: usize = 32;

/// What a write answers: its request, its key, and the bucket's answer.
pub(in crate::cluster::gateway) type Written = (RequestId, Key, Result<u64, KvError>);

type Write = Pin<Box<dyn Future<Output = Written> + Send>>;

/// The writes under way and those waiting for room.
#[derive(Default)]
pub(in crate::cluster::gateway) struct Writes {
    running: JoinSet<Written>,
    /// Renewals among `running`: they take no room.
    renewals: usize,
    /// Whether each running write is a renewal, by task id.
    kinds: std::collections::HashMap<tokio::task::Id, bool>,
    queued: VecDeque<Write>,
}

impl Writes {
    /// Sends `write` now if there is room (a renewal always has), else queues it.
    pub(in crate::cluster::gateway) fn submit(
        &mut self,
        renewal: bool,
        write: impl Future<Output = Written> + Send + 'static,
    ) {
        if renewal || self.running.len() - self.renewals < MAX_IN_FLIGHT {
            self.start(renewal, Box::pin(write));
        } else {
            self.queued.push_back(Box::pin(write));
        }
    }

    fn start(&mut self, renewal: bool, write: Write) {
        let handle = self.running.spawn(write);
        self.kinds.insert(handle.id(), renewal);
        self.renewals += usize::from(renewal);
    }

    /// Whether nothing runs (queued writes wait only while others run).
    pub(in crate::cluster::gateway) fn is_empty(&self) -> bool {
        self.running.is_empty()
    }

    /// The next answer; queued writes take the room it leaves.
    pub(in crate::cluster::gateway) async fn next(&mut self) -> Option<Written> {
        let (id, answer) = match self.running.join_next_with_id().await? {
            Ok((id, answer)) => (id, Some(answer)),
            Err(error) => (error.id(), None),
        };
        if self.kinds.remove(&id) == Some(true) {
            self.renewals -= 1;
        }
        while self.running.len() - self.renewals < MAX_IN_FLIGHT
            && let Some(write) = self.queued.pop_front()
        {
            self.start(false, write);
        }
        answer
    }

    /// Writes sent and not answered, and writes waiting for room.
    #[cfg(test)]
    fn counts(&self) -> (usize, usize) {
        (self.running.len(), self.queued.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn write(id: u64, key: &str, after: Duration) -> impl Future<Output = Written> + Send {
        let key = Key::parse(key).expect("a coordinator's key");
        async move {
            tokio::time::sleep(after).await;
            (id, key, Ok(id))
        }
    }

    // A burst of line writes takes at most MAX_IN_FLIGHT at once; a renewal issued behind
    // them is sent at once and answered first; the queued ones go in issue order as room frees.
    #[tokio::test(start_paused = true)]
    async fn a_burst_is_bounded_and_a_renewal_never_waits_behind_it() {
        let mut writes = Writes::default();
        for id in 0..100 {
            writes.submit(false, write(id, "sub.x", Duration::from_millis(10)));
        }
        assert_eq!(writes.counts(), (MAX_IN_FLIGHT, 100 - MAX_IN_FLIGHT));
        writes.submit(true, write(1_000, "lease.1", Duration::from_millis(1)));
        assert_eq!(writes.counts(), (MAX_IN_FLIGHT + 1, 100 - MAX_IN_FLIGHT));
        let first = writes.next().await.unwrap();
        assert_eq!(
            first.1.to_string(),
            "lease.1",
            "the renewal is answered first"
        );
        let mut answered = Vec::new();
        while let Some((id, _, _)) = writes.next().await {
            answered.push(id);
            let (running, _) = writes.counts();
            assert!(running <= MAX_IN_FLIGHT, "{running} in flight");
        }
        assert_eq!(answered.len(), 100);
        // Issue order is kept: each write is sent once every write issued MAX_IN_FLIGHT
        // before it was, so every batch of MAX_IN_FLIGHT is answered before the next.
        let batch = |id: &u64| *id / MAX_IN_FLIGHT as u64;
        assert!(
            answered.windows(2).all(|w| batch(&w[0]) <= batch(&w[1])),
            "{answered:?}"
        );
        assert!(writes.is_empty());
    }
}
