//! Every subscription in the cluster, as every gateway sees it (docs/semantics.md#cluster-durability):
//! what a publish's `queued_for` counts and what tells an unknown subscription from one whose
//! members are elsewhere.
//!
//! The registry is the stream's JetStream consumers: each subscription's consumer records its
//! id and patterns in its metadata (QUEUE and SINGLETON: one shared by every gateway;
//! BROADCAST: one per gateway), so nothing new is stored and nothing can disagree with what
//! JetStream delivers. A gateway keeps a copy (its subscriptions' patterns in the core's
//! routing index), kept up to date without a JetStream request per publish:
//!
//! - **Announced.** A gateway that makes or deletes a consumer tells every gateway before it
//!   answers the join or delete ([`announce`](crate::cluster::gateway::control::announce)); each brings its copy up to date
//!   and says so. A copy brought up to date under the gateway's current lease incarnation and
//!   NATS connection is [`current`](Registry::current): a publish counts from it at once.
//! - **Synced after the request arrived**, otherwise (a gateway starting, or whose lease lapsed
//!   or connection dropped since, so it may have missed an announcement): a publish takes a
//!   ticket when it arrives; the registry's task then reads the stream's consumer count from
//!   the stream's leader (one request, shared by every publish that arrived before it was
//!   sent), and lists the consumers again when the count differs from the copy's or a
//!   consumer was created or deleted since the last listing (JetStream's advisories, and
//!   announcements). Ack and describe paths always sync.
//! - So a subscription confirmed at any gateway before a publish arrived is counted, and one
//!   deleted before is not; one JetStream removed for inactivity is uncounted once its
//!   advisory arrived (a sync starts then).
//! - **Bounded.** At most [`MAX_SUBSCRIPTIONS`] subscriptions are indexed (each with at most
//!   64 patterns, as a join allows); past that a gateway logs a warning and counts only those.
//! - **When JetStream does not answer** within [`PATIENCE`], the copy answers as it is.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::sync::{Notify, watch};
use tokio_stream::StreamExt;

use crate::cluster::gateway::wire::names;
use crate::core::{Mode, Pattern, PatternIndex, Topic};

/// How long a sync waits for the servers.
pub(in crate::cluster::gateway) const PATIENCE: Duration = Duration::from_secs(2);

/// How many syncs may run at once.
const SYNCS: usize = 2;

/// How soon a consumer count the last listing disagreed with is listed again.
const RELIST_AFTER: Duration = Duration::from_secs(1);

/// How many more syncs a publish's count tries when the one covering it found no answer.
const RECOUNTS: u32 = 2;

/// The most subscriptions a gateway's registry indexes.
pub(in crate::cluster::gateway) const MAX_SUBSCRIPTIONS: usize = 100_000;

/// One subscription a consumer records.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    subscription: Arc<str>,
    mode: Mode,
    /// Its indexed patterns (to remove it).
    patterns: BTreeSet<Pattern>,
}

/// The copy: every consumer's name (tinybroker's or not, so counts compare), the
/// subscriptions among them, and their patterns indexed by consumer name.
#[derive(Debug, Default)]
struct Known {
    consumers: BTreeSet<String>,
    entries: BTreeMap<Arc<str>, Entry>,
    index: PatternIndex<Arc<str>>,
}

impl Known {
    /// A copy of `listed` (consumer names and their metadata), in name order: every gateway
    /// builds the same copy from the same consumers.
    fn of(listed: BTreeMap<String, std::collections::HashMap<String, String>>) -> Self {
        let mut known = Known::default();
        let mut warned = false;
        for (name, metadata) in listed {
            if !known.add(name, &metadata) && !warned {
                tracing::warn!(
                    "the stream has more than {MAX_SUBSCRIPTIONS} subscriptions' consumers: queued_for counts only the first {MAX_SUBSCRIPTIONS} (by consumer name)"
                );
                warned = true;
            }
        }
        known
    }

    /// Adds consumer `name` with its metadata (replacing one of that name); false when it
    /// records a subscription past [`MAX_SUBSCRIPTIONS`], which is not indexed.
    fn add(&mut self, name: String, metadata: &std::collections::HashMap<String, String>) -> bool {
        self.remove(&name);
        self.consumers.insert(name.clone());
        let Ok((id, spec)) = names::recorded(metadata) else {
            return true;
        };
        // A consumer whose name collides with another subscription's is not that one.
        if spec.mode != Mode::Broadcast && names::consumer_name(spec.mode, &id, "") != name {
            return true;
        }
        if self.entries.len() == MAX_SUBSCRIPTIONS {
            return false;
        }
        let key: Arc<str> = Arc::from(name.as_str());
        let patterns: BTreeSet<Pattern> = spec.patterns.iter().take(64).cloned().collect();
        for pattern in &patterns {
            self.index.insert(pattern, key.clone());
        }
        self.entries.insert(
            key,
            Entry {
                subscription: Arc::from(id.as_str()),
                mode: spec.mode,
                patterns,
            },
        );
        true
    }

    /// Removes consumer `name`, if known.
    fn remove(&mut self, name: &str) {
        self.consumers.remove(name);
        if let Some((key, entry)) = self.entries.remove_entry(name) {
            for pattern in &entry.patterns {
                self.index.remove(pattern, &key);
            }
        }
    }

    fn apply(&mut self, change: &Change) {
        match change {
            Change::Made { name, metadata } => {
                if !self.add(name.clone(), metadata) {
                    tracing::warn!(
                        consumer = %name,
                        "the stream has more than {MAX_SUBSCRIPTIONS} subscriptions' consumers: queued_for does not count this one"
                    );
                }
            }
            Change::Deleted { names } => {
                for name in names {
                    self.remove(name);
                }
            }
        }
    }
}

/// A change of the stream's consumers that a gateway made and announces
/// ([`announce`](crate::cluster::gateway::control::announce)): every gateway applies it to its copy at once, with no
/// listing (docs/cluster-internals.md#queued_for-across-gateways).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub(in crate::cluster::gateway) enum Change {
    /// A consumer made, with its metadata (what it records).
    Made {
        /// The consumer's name.
        name: String,
        /// Its metadata.
        metadata: std::collections::HashMap<String, String>,
    },
    /// Consumers deleted.
    Deleted {
        /// Their names.
        names: Vec<String>,
    },
}

/// How a publish's `queued_for` is counted (docs/cluster-internals.md#queued_for-across-gateways).
#[derive(Debug, Clone, Copy)]
pub(in crate::cluster::gateway) enum Count {
    /// From the copy as it is: it was current when the publish was sent.
    Now,
    /// After a sync begun once this ticket was taken (when it was sent).
    After(u64),
}

/// The gateway's registry: cheap to share.
#[derive(Debug)]
pub(in crate::cluster::gateway) struct Registry {
    known: Mutex<Known>,
    /// Tickets handed out: the last request that wants a sync.
    requested: AtomicU64,
    /// The last ticket a sync covers (sent after that ticket's request arrived).
    synced: watch::Sender<u64>,
    wake: Notify,
    /// A consumer was created or deleted since the last listing.
    changed: AtomicBool,
    /// The consumer count the last listing was made for, and when.
    listed: Mutex<Option<(usize, tokio::time::Instant)>>,
    /// Held from a sync's look at the copy to its listing's end: a sync that overlaps one
    /// still listing waits for that listing before it decides the copy is current (else it
    /// would cover its tickets with the copy from before).
    listing: tokio::sync::Mutex<()>,
    /// The ticket count when the listing the copy holds was begun: an older listing that ends
    /// later (syncs overlap) does not replace it.
    listed_at: AtomicU64,
    /// This gateway's lease, once it has one (set after start).
    lease: std::sync::OnceLock<Arc<crate::cluster::gateway::control::lease::LeaseGate>>,
    /// How often this gateway's NATS connection (re)connected: announcements sent while it was
    /// down were lost.
    connects: Arc<AtomicU64>,
    /// The lease's term (its incarnation, and every renewal after a lapse, begins a new one:
    /// [`crate::cluster::gateway::control::lease::LeaseGate::valid_term`]) and the connection count under which the last
    /// sync that ended began.
    current_as_of: Mutex<Option<(u64, u64)>>,
    /// The last ticket a sync that brought the copy up to date covers.
    succeeded: AtomicU64,
    /// How often the copy was marked stale ([`Registry::stale`]).
    stale_marks: AtomicU64,
    /// Changes applied from announcements, each with the ticket count when it was: a listing
    /// begun before one may not have seen its consumer, so it is applied again over the copy
    /// such a listing makes ([`Registry::apply`]). Kept until a listing begun after it ends.
    applied: Mutex<Vec<(u64, Change)>>,
}

impl Registry {
    /// A registry for `stream`, kept by a task of its own (ended by aborting it), watching
    /// JetStream's consumer advisories on `client`.
    pub(in crate::cluster::gateway) async fn start(
        bus: &dyn crate::cluster::bus::Bus,
        stream: Arc<dyn crate::cluster::jetstream::Stream>,
        connects: Arc<AtomicU64>,
    ) -> Result<(Arc<Self>, tokio::task::JoinHandle<()>), String> {
        let name = stream.name().to_string();
        let mut advisories = bus
            .subscribe(&format!("$JS.EVENT.ADVISORY.CONSUMER.*.{name}.*"))
            .await
            .map_err(|e| format!("cannot watch the stream's consumers: {e}"))?;
        let registry = Arc::new(Self::empty(connects));
        let task = {
            let registry = registry.clone();
            tokio::spawn(async move {
                let mut running = tokio::task::JoinSet::new();
                loop {
                    tokio::select! {
                        // Up to SYNCS at once: a publish waits for a sync begun after it, so
                        // one that began just before it would add its whole round trip.
                        () = registry.wake.notified(), if running.len() < SYNCS => {
                            let (registry, stream) = (registry.clone(), stream.clone());
                            running.spawn(async move { registry.sync(stream.as_ref()).await });
                        }
                        Some(_) = running.join_next() => {
                            // Tickets taken while SYNCS ran: their wake may have been spent.
                            if registry.requested.load(Ordering::SeqCst) > *registry.synced.borrow() {
                                registry.wake.notify_one();
                            }
                        }
                        advisory = advisories.next() => match advisory {
                            Some(advisory) => {
                                let subject = advisory.subject.as_str();
                                let created = subject.contains(".CREATED.");
                                // `...CONSUMER.<kind>.<stream>.<consumer>`: a consumer's name
                                // has no dot.
                                let consumer = subject.rsplit('.').next();
                                // One the copy already reflects (announced, applied) needs no
                                // listing; any other does, also when nobody publishes: a copy
                                // counted from at once drops a consumer JetStream removed by
                                // itself now.
                                if (created || subject.contains(".DELETED."))
                                    && consumer.is_none_or(|name| registry.advised(name, created))
                                {
                                    registry.changed();
                                    registry.ticket();
                                }
                            }
                            None => std::future::pending().await,
                        },
                    }
                }
            })
        };
        Ok((registry, task))
    }

    /// An empty copy, to be listed by the first sync.
    fn empty(connects: Arc<AtomicU64>) -> Self {
        Self {
            known: Mutex::new(Known::default()),
            requested: AtomicU64::new(0),
            synced: watch::Sender::new(0),
            wake: Notify::new(),
            changed: AtomicBool::new(true),
            listed: Mutex::new(None),
            listed_at: AtomicU64::new(0),
            listing: tokio::sync::Mutex::new(()),
            lease: std::sync::OnceLock::new(),
            connects,
            current_as_of: Mutex::new(None),
            succeeded: AtomicU64::new(0),
            stale_marks: AtomicU64::new(0),
            applied: Mutex::new(Vec::new()),
        }
    }

    /// A consumer was created or deleted: the next sync lists them again.
    pub(in crate::cluster::gateway) fn changed(&self) {
        self.changed.store(true, Ordering::SeqCst);
    }

    /// From now on, [`Registry::current`] holds only under a valid `lease`. Called once this
    /// gateway is subscribed to announcements (`announce::serve`): a sync begun after it makes
    /// the copy current, one begun before (which an announcement could have missed) does not.
    pub(in crate::cluster::gateway) fn watch_lease(
        &self,
        lease: Arc<crate::cluster::gateway::control::lease::LeaseGate>,
    ) {
        let _ = self.lease.set(lease);
    }

    /// Whether the copy is up to date without a sync: the last sync began under the lease
    /// term valid now (no lapse since) and on the NATS connection up now, so every announcement
    /// since reached this gateway (announcers wait for every leased gateway's answer, for as
    /// long as its lease could last).
    pub(in crate::cluster::gateway) fn current(&self) -> bool {
        let Some(incarnation) = self.lease.get().and_then(|lease| lease.valid_term()) else {
            return false;
        };
        let connects = self.connects.load(Ordering::SeqCst);
        *self
            .current_as_of
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            == Some((incarnation, connects))
    }

    /// The copy may lack a change (an announcement arrived): not current until a sync begun
    /// after this ends.
    pub(in crate::cluster::gateway) fn stale(&self) {
        let mut current = self
            .current_as_of
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *current = None;
        // A sync already under way may have listed before the change: it does not make the
        // copy current when it ends.
        self.stale_marks.fetch_add(1, Ordering::SeqCst);
    }

    /// Applies an announced change to the copy at once: a consumer another gateway made (or
    /// this one), with what it records, or consumers deleted. The copy stays as current as it
    /// was: the change is the one the announcement is for. Bounded: the changes kept for
    /// listings under way are at most [`MAX_SUBSCRIPTIONS`]; past that the oldest are dropped
    /// and the copy is listed again.
    pub(in crate::cluster::gateway) fn apply(&self, change: Change) {
        self.lock().apply(&change);
        let mut applied = self.applied.lock().unwrap_or_else(PoisonError::into_inner);
        if applied.len() >= MAX_SUBSCRIPTIONS {
            applied.clear();
            self.changed();
            self.ticket();
        }
        applied.push((self.requested.load(Ordering::SeqCst), change));
    }

    /// Whether an advisory of consumer `name` being created (or deleted, `created` false)
    /// tells the copy something new: one already known (or not known) needs no listing.
    fn advised(&self, name: &str, created: bool) -> bool {
        self.knows(name) != created
    }

    /// Brings the copy up to date: returns once a sync begun after this call ended (at most
    /// [`PATIENCE`] twice), whether one such sync brought the copy up to date.
    pub(in crate::cluster::gateway) async fn refresh(&self) -> bool {
        self.changed();
        let ticket = self.ticket();
        self.synced(ticket).await;
        self.succeeded.load(Ordering::SeqCst) >= ticket
    }

    /// A ticket for a request that just arrived: [`Registry::synced`] with it returns once the
    /// copy is at least as new as the cluster was when it was taken.
    pub(in crate::cluster::gateway) fn ticket(&self) -> u64 {
        let ticket = self.requested.fetch_add(1, Ordering::SeqCst) + 1;
        self.wake.notify_one();
        ticket
    }

    /// Waits until a sync begun after `ticket` was taken has ended (at most [`PATIENCE`] and a
    /// little more: a sync that finds no answer ends too).
    pub(in crate::cluster::gateway) async fn synced(&self, ticket: u64) {
        let mut synced = self.synced.subscribe();
        let _ =
            tokio::time::timeout(PATIENCE * 2, synced.wait_for(|&covered| covered >= ticket)).await;
    }

    /// How the `queued_for` of a publish sent now will be counted.
    pub(in crate::cluster::gateway) fn admit(&self) -> Count {
        if self.current() {
            Count::Now
        } else {
            Count::After(self.ticket())
        }
    }

    /// The `queued_for` of a publish of `topic` admitted as `count`, at its answer: from the
    /// copy as it is if it was current then and still is (an announcement may have come
    /// meanwhile, or the lease lapsed), else after a sync begun once it was sent (or now).
    ///
    /// A sync that found no answer (the gateway's connection was moving off a dead node, or
    /// the stream's leader was being elected) does not count: the publish was stored since, so
    /// JetStream answers now, and a sync begun now is tried, up to [`RECOUNTS`] times, before
    /// the copy answers as it is (logged).
    pub(in crate::cluster::gateway) async fn queued_for(&self, count: Count, topic: &Topic) -> u32 {
        let ticket = match count {
            Count::Now if self.current() => return self.matching(topic),
            Count::Now => self.ticket(),
            Count::After(ticket) => ticket,
        };
        self.synced(ticket).await;
        let mut recounts = 0;
        while self.succeeded.load(Ordering::SeqCst) < ticket {
            if recounts == RECOUNTS {
                tracing::warn!(
                    %topic,
                    "no sync of the subscriptions succeeded after this publish: its queued_for counts this gateway's last copy"
                );
                break;
            }
            recounts += 1;
            // Covers `ticket` too, if it succeeds: it is later.
            self.synced(self.ticket()).await;
        }
        self.matching(topic)
    }

    /// Whether the copy has consumer `name`.
    pub(in crate::cluster::gateway) fn knows(&self, name: &str) -> bool {
        self.lock().consumers.contains(name)
    }

    /// How many subscriptions match `topic` (after [`Registry::synced`]).
    pub(in crate::cluster::gateway) fn matching(&self, topic: &Topic) -> u32 {
        let known = self.lock();
        let mut matches = crate::core::index::Matches::new();
        known.index.matches_into(topic, &mut matches);
        u32::try_from(matches.len()).unwrap_or(u32::MAX)
    }

    /// Whether some gateway has a subscription of this id (after [`Registry::synced`]).
    pub(in crate::cluster::gateway) fn exists(&self, subscription: &str) -> bool {
        let known = self.lock();
        let shared = names::consumer_name(Mode::Queue, subscription, "");
        known
            .entries
            .get(shared.as_str())
            .is_some_and(|entry| &*entry.subscription == subscription)
            || known
                .entries
                .values()
                .any(|entry| entry.mode == Mode::Broadcast && &*entry.subscription == subscription)
    }

    /// The consumer of a BROADCAST subscription of this id at some gateway (after
    /// [`Registry::synced`]): the first by name when several gateways each have one.
    pub(in crate::cluster::gateway) fn broadcast_consumer(
        &self,
        subscription: &str,
    ) -> Option<String> {
        let known = self.lock();
        known
            .entries
            .iter()
            .find(|(_, entry)| {
                entry.mode == Mode::Broadcast && &*entry.subscription == subscription
            })
            .map(|(name, _)| name.to_string())
    }

    /// Reads the stream's consumer count and, when the copy may be out of date, lists the
    /// consumers; then covers every ticket taken before it began.
    async fn sync(&self, stream: &dyn crate::cluster::jetstream::Stream) {
        let covers = self.requested.load(Ordering::SeqCst);
        // Read before the connection count: a reconnection after it makes the copy not current.
        let connects = self.connects.load(Ordering::SeqCst);
        let began_under = self
            .lease
            .get()
            .and_then(|lease| lease.valid_term())
            .map(|incarnation| (incarnation, connects));
        let mut up_to_date = false;
        let marks = self.stale_marks.load(Ordering::SeqCst);
        let count = tokio::time::timeout(PATIENCE, stream.consumer_count()).await;
        let count = match count {
            Ok(Ok(count)) => Some(count),
            Ok(Err(error)) => {
                tracing::debug!(%error, "the stream's consumer count did not come");
                None
            }
            Err(_) => None,
        };
        // A count the listing disagrees with (a consumer whose leader is offline is counted
        // but not listed) is listed again once it changes, or after RELIST_AFTER: not on
        // every publish.
        let _turn = self.listing.lock().await;
        let listed = *self.listed.lock().unwrap_or_else(PoisonError::into_inner);
        let stale = count.is_some_and(|count| {
            count != self.lock().consumers.len()
                && listed.is_none_or(|(was, at)| was != count || at.elapsed() >= RELIST_AFTER)
        });
        if let Some(count) = count
            && (self.changed.swap(false, Ordering::SeqCst) || stale)
        {
            *self.listed.lock().unwrap_or_else(PoisonError::into_inner) =
                Some((count, tokio::time::Instant::now()));
            match tokio::time::timeout(PATIENCE, list(stream)).await {
                Ok(Ok(listed)) => {
                    let mut known = Known::of(listed);
                    let mut copy = self.lock();
                    if self.listed_at.fetch_max(covers, Ordering::SeqCst) <= covers {
                        // Changes announced since the listing began: it may have missed them.
                        let mut applied =
                            self.applied.lock().unwrap_or_else(PoisonError::into_inner);
                        applied.retain(|(at, _)| *at >= covers);
                        for (_, change) in applied.iter() {
                            known.apply(change);
                        }
                        *copy = known;
                    }
                    up_to_date = true;
                }
                Ok(Err(error)) => {
                    self.changed();
                    tracing::debug!(%error, "the stream's consumers were not listed");
                }
                Err(_) => self.changed(),
            }
        } else if count.is_some() {
            up_to_date = true;
        }
        if up_to_date {
            self.succeeded.fetch_max(covers, Ordering::SeqCst);
        }
        {
            // Not current after a failed sync either: the copy may lack what it was for. Nor
            // after one that a stale mark came during (it may have listed before the change).
            let mut current = self
                .current_as_of
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if !up_to_date {
                *current = None;
            } else if self.stale_marks.load(Ordering::SeqCst) == marks {
                *current = began_under;
            }
        }
        self.synced.send_if_modified(|covered| {
            let newer = covers > *covered;
            *covered = (*covered).max(covers);
            newer
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Known> {
        self.known.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Every consumer of the stream: its name and metadata.
async fn list(
    stream: &dyn crate::cluster::jetstream::Stream,
) -> Result<BTreeMap<String, std::collections::HashMap<String, String>>, String> {
    let listed = stream.consumers().await.map_err(|e| e.to_string())?;
    Ok(listed
        .into_iter()
        .map(|info| (info.name, info.metadata))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{AckMode, Overflow, SubscriptionSpec};

    fn consumer(
        mode: Mode,
        id: &str,
        patterns: &[&str],
    ) -> (String, std::collections::HashMap<String, String>) {
        let spec = SubscriptionSpec {
            mode,
            consumer_group: "g".into(),
            patterns: patterns
                .iter()
                .map(|p| Pattern::parse(p).unwrap())
                .collect(),
            max_delivery_attempts: 0,
            dead_letter_topic: None,
            ack_mode: AckMode::Explicit,
            overflow: Overflow::RejectPublish,
        };
        (
            names::consumer_name(mode, id, "gw1"),
            names::metadata(id, &spec),
        )
    }

    // docs/cluster-internals.md#queued_for-across-gateways: a publish counts from the copy without
    // a sync only while the lease and the NATS connection the last sync began under both still hold
    // (announcements since then all reached this gateway).
    #[tokio::test(start_paused = true)]
    async fn the_copy_is_current_only_under_the_lease_and_connection_its_sync_began_under() {
        use std::time::Duration;
        let connects = Arc::new(AtomicU64::new(1));
        let registry = Registry::empty(connects.clone());
        let lease = Arc::new(super::super::lease::LeaseGate::new(
            tokio::time::Instant::now(),
        ));
        assert!(!registry.current(), "no lease watched yet");
        registry.watch_lease(lease.clone());
        lease.publish(7, Some(Duration::from_secs(1)));
        assert!(!registry.current(), "never synced");
        let term = lease.valid_term().unwrap();
        *registry.current_as_of.lock().unwrap() = Some((term, 1));
        assert!(registry.current());
        connects.fetch_add(1, Ordering::SeqCst);
        assert!(!registry.current(), "the connection dropped since");
        *registry.current_as_of.lock().unwrap() = Some((term, 2));
        assert!(registry.current());
        tokio::time::advance(Duration::from_millis(1_001)).await;
        assert!(!registry.current(), "the lease lapsed");
        lease.publish(7, Some(Duration::from_secs(5)));
        assert!(
            !registry.current(),
            "renewed after a lapse: announcements may have been missed"
        );
        *registry.current_as_of.lock().unwrap() = Some((lease.valid_term().unwrap(), 2));
        assert!(registry.current());
        lease.publish(8, Some(Duration::from_secs(5)));
        assert!(
            !registry.current(),
            "a new incarnation: announcements may have been missed"
        );
    }

    // docs/semantics.md#cluster-durability: queued_for counts the subscriptions whose patterns
    // match, each once (overlapping patterns included), every mode, on any gateway; consumers
    // tinybroker did not make are counted as consumers but match nothing.
    #[test]
    fn the_copy_counts_each_matching_subscription_once() {
        let listed = BTreeMap::from([
            consumer(Mode::Queue, "q", &["a.*", "a.>", "a.*"]),
            consumer(Mode::Singleton, "s", &["a.b"]),
            consumer(Mode::Broadcast, "b", &["a.b", "x.y"]),
            consumer(Mode::Queue, "other", &["z.*"]),
            ("ops-tool".to_string(), Default::default()),
        ]);
        let known = Known::of(listed);
        assert_eq!(known.consumers.len(), 5);
        let registry = Registry::empty(Arc::new(AtomicU64::new(0)));
        *registry.known.lock().unwrap() = known;
        let topic = |t: &str| Topic::parse(t).unwrap();
        assert_eq!(registry.matching(&topic("a.b")), 3);
        assert_eq!(registry.matching(&topic("a.b.c")), 1);
        assert_eq!(registry.matching(&topic("x.y")), 1);
        assert_eq!(registry.matching(&topic("nothing")), 0);
        assert!(registry.exists("q") && registry.exists("s") && registry.exists("b"));
        assert!(!registry.exists("nope") && !registry.exists("ops-tool"));
        assert_eq!(
            registry.broadcast_consumer("b"),
            Some(names::consumer_name(Mode::Broadcast, "b", "gw1"))
        );
        assert_eq!(registry.broadcast_consumer("q"), None);
    }

    // docs/cluster-internals.md#queued_for-across-gateways: an announced change is applied to the
    // copy as a listing would have it: a consumer made is counted with its patterns, one made again
    // with other patterns replaces them, deleted ones count no more.
    #[test]
    fn an_announced_change_is_applied_as_a_listing_would_have_it() {
        let registry = Registry::empty(Arc::new(AtomicU64::new(0)));
        let topic = |t: &str| Topic::parse(t).unwrap();
        let (name, metadata) = consumer(Mode::Queue, "q", &["a.*", "a.>"]);
        registry.apply(Change::Made {
            name: name.clone(),
            metadata,
        });
        assert!(registry.knows(&name) && registry.exists("q"));
        assert_eq!(registry.matching(&topic("a.b")), 1);
        let (_, other) = consumer(Mode::Queue, "q", &["x.y"]);
        registry.apply(Change::Made {
            name: name.clone(),
            metadata: other,
        });
        assert_eq!(
            registry.matching(&topic("a.b")),
            0,
            "its old patterns are gone"
        );
        assert_eq!(registry.matching(&topic("x.y")), 1);
        let (b, metadata) = consumer(Mode::Broadcast, "b", &["x.*"]);
        registry.apply(Change::Made {
            name: b.clone(),
            metadata,
        });
        assert_eq!(registry.matching(&topic("x.y")), 2);
        registry.apply(Change::Deleted {
            names: vec![name.clone(), "never-known".into()],
        });
        assert!(!registry.knows(&name) && !registry.exists("q"));
        assert_eq!(registry.matching(&topic("x.y")), 1);
        assert_eq!(registry.lock().consumers.len(), 1);
        // The same as a listing of what is left.
        let listed = Known::of(BTreeMap::from([consumer(Mode::Broadcast, "b", &["x.*"])]));
        assert_eq!(registry.lock().consumers, listed.consumers);
        assert_eq!(registry.lock().entries, listed.entries);
        // An advisory of what the copy already has needs no listing.
        assert!(!registry.advised(&b, true) && registry.advised(&b, false));
        assert!(registry.advised(&name, true) && !registry.advised(&name, false));
    }

    // An announced change is kept for the listings under way when it came: the copy one of
    // them makes has it too (its listing may have been read before the consumer was made).
    #[test]
    fn a_change_is_kept_until_a_listing_begun_after_it() {
        let registry = Registry::empty(Arc::new(AtomicU64::new(0)));
        let before = registry.ticket();
        let (name, metadata) = consumer(Mode::Queue, "late", &["l.*"]);
        registry.apply(Change::Made { name, metadata });
        let applied = registry.applied.lock().unwrap();
        assert_eq!(applied.len(), 1);
        assert!(
            applied[0].0 >= before,
            "replayed over a listing that covers {before}"
        );
    }
}
