//! What the singleton shell knows of each line's leadership, for `WatchLeadership`
//! (docs/semantics.md#watching-leadership): since when each live line has had its active
//! member and epoch, and one state per watched subscription, told on every change of its line.

use std::{collections::BTreeMap, sync::Arc};

use crate::{
    broker::{Leadership, LeadershipWatch},
    cluster::coordinator::Coordinator,
};

/// Since when each live line has had its active member and epoch, and the watched
/// subscriptions' states (docs/semantics.md#watching-leadership). Bounded by the live lines and
/// the watched subscriptions: a line's entry goes with its key, a watched one's with its last
/// watcher.
#[derive(Default)]
pub(in crate::cluster::gateway) struct Leaders {
    /// Per live line: its active member's id, its epoch, since when (ms since the Unix epoch).
    lines: BTreeMap<String, (Option<u64>, u64, u64)>,
    watched: BTreeMap<Arc<str>, tokio::sync::watch::Sender<Leadership>>,
}

impl Leaders {
    /// A watch of `sub`: its state now, then each change.
    pub(in crate::cluster::gateway) fn watch(
        &mut self,
        coordinator: &Coordinator,
        sub: Arc<str>,
    ) -> LeadershipWatch {
        self.watched.retain(|_, sender| sender.receiver_count() > 0);
        if let Some(sender) = self.watched.get(&sub) {
            return sender.subscribe();
        }
        let state = self.state(coordinator, &sub, 0);
        let (sender, receiver) = tokio::sync::watch::channel(state);
        self.watched.insert(sub, sender);
        receiver
    }

    /// `sub`'s leadership as `coordinator` last saw its line: with no line (its key deleted, or
    /// not seen yet), no active member and the highest epoch `seen` so far.
    fn state(&self, coordinator: &Coordinator, sub: &str, seen: u64) -> Leadership {
        let line = coordinator.line(sub);
        Leadership {
            active: line.and_then(|l| l.active).map(|a| a.member),
            epoch: line.map_or(seen, |l| l.epoch.max(seen)),
            metadata: Arc::from(line.map_or("", |l| l.active_meta())),
            since_unix_ms: self
                .lines
                .get(sub)
                .map_or_else(unix_ms, |(_, _, since)| *since),
            cut_off: false,
        }
    }

    /// After the bucket's watch delivered `sub`'s key: notes when its leadership changed, and
    /// tells its watchers, if any.
    pub(in crate::cluster::gateway) fn line_changed(
        &mut self,
        coordinator: &Coordinator,
        sub: &str,
    ) {
        match coordinator.line(sub) {
            Some(line) => {
                let now = (line.active.map(|a| a.member), line.epoch);
                match self.lines.get_mut(sub) {
                    Some(known) if (known.0, known.1) == now => {}
                    Some(known) => *known = (now.0, now.1, unix_ms()),
                    None => {
                        self.lines
                            .insert(sub.to_string(), (now.0, now.1, unix_ms()));
                    }
                }
            }
            None => {
                self.lines.remove(sub);
            }
        }
        let Some(sender) = self.watched.get(sub) else {
            return;
        };
        if sender.receiver_count() == 0 {
            self.watched.remove(sub);
            return;
        }
        let state = self.state(coordinator, sub, sender.borrow().epoch);
        sender.send_if_modified(|current| {
            if state.active == current.active
                && state.epoch == current.epoch
                && state.metadata == current.metadata
            {
                return false;
            }
            *current = state;
            true
        });
    }

    /// This gateway's lease lapsed: every watch here ends (`UNAVAILABLE`), and what it knew of
    /// the lines goes with the incarnation.
    pub(in crate::cluster::gateway) fn cut_off(&mut self) {
        for sender in std::mem::take(&mut self.watched).into_values() {
            sender.send_modify(|state| state.cut_off = true);
        }
        self.lines.clear();
    }
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
