//! `DeleteSubscription` through a gateway (docs/semantics.md#deleting,
//! docs/cluster-internals.md#each-rpc-through-a-gateway). A subscription's settings live in its
//! JetStream consumer's metadata (one consumer per QUEUE or SINGLETON id, one per gateway for
//! BROADCAST), so deleting it is deleting the consumer; a later join creates a new one with its own
//! settings.
//!
//! It must refuse while a member is joined at *any* gateway, and a join racing it must find the
//! old consumer (and make the delete refuse) or none. So the deleting gateway asks every gateway
//! over NATS (`_tinybroker.<stream>.delete`, which every gateway subscribes to):
//! 1. **Count and hold.** Each gateway answers how many members of the id it has, counting
//!    joins under way (from the moment a join starts looking for the consumer until its member
//!    is in the local broker). One with none *holds* the id: a join of it there waits until
//!    the hold is released, or for [`HOLD`] at most. Counting and holding are one step under
//!    the gateway's hold table's lock, so no join slips between them. The deleting gateway
//!    waits for an answer from every gateway holding a lease in the coordination bucket
//!    (every live gateway has one), for [`ASK_PATIENCE`] at most.
//! 2. A singleton's line in the bucket counts too (members whose gateway died stay in it until
//!    its lease is deleted).
//! 3. With no member anywhere, the consumer(s) of the id are deleted; what they still owed is
//!    the answer's `discarded_messages`.
//! 4. **Release**: every gateway drops its hold, and joins waiting there go on, finding no
//!    consumer and creating one with their own settings.
//!
//! The deleting gateway gives up (releasing the holds, `UNAVAILABLE`) rather than delete a
//! consumer after [`DELETE_BUDGET`] has passed on its clock, well within [`HOLD`] on any other
//! gateway's clock (the clock assumption, docs/cluster-internals.md#singleton-across-gateways), so
//! no hold runs out under a delete.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex, PoisonError, atomic::Ordering},
    time::Duration,
};

use crate::cluster::jetstream::{ConsumerError, ConsumerInfo};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use tokio_stream::StreamExt;

use crate::cluster::gateway::{Gateway, unavailable, wire::names};
use crate::{
    broker::{Broker, Deleted},
    cluster::values,
    core::{Error, ErrorKind, Mode},
};

/// How long a gateway holds an id for a delete at most: joins of it wait that long there.
pub(in crate::cluster::gateway) const HOLD: Duration = Duration::from_secs(10);

/// How long the deleting gateway waits for every gateway's answer.
const ASK_PATIENCE: Duration = Duration::from_secs(2);

/// The deleting gateway deletes no consumer once this much time has passed since it asked:
/// below [`HOLD`] by far more than the clocks' drift can eat.
const DELETE_BUDGET: Duration = Duration::from_secs(7);

/// How long a delete may take to read the gateways' leases: each incarnation that ever ran left
/// its lease's delete marker, and they stream at thousands a second or more.
const LEASE_LIST_PATIENCE: Duration = Duration::from_secs(5);

/// How long one JetStream request of a delete may take.
const REQUEST_PATIENCE: Duration = Duration::from_secs(2);

/// Outside the stream's subjects (`<stream>.>`), so nothing of it is stored.
fn subject(stream: &str) -> String {
    format!("_tinybroker.{stream}.delete")
}

/// What the deleting gateway sends every gateway.
#[derive(Debug, Serialize, Deserialize)]
enum Ask {
    /// How many members of `subscription` are joined there; hold it when none.
    Count { subscription: String, token: u64 },
    /// The delete is over: drop the hold `token` placed.
    Release { subscription: String, token: u64 },
}

/// One gateway's answer to [`Ask::Count`].
#[derive(Debug, Serialize, Deserialize)]
struct Counted {
    /// Its incarnation (its lease is `lease.<gateway>`).
    gateway: u64,
    /// Members joined there, joins under way included.
    members: u64,
}

/// Ids held for a delete, and joins under way, at this gateway.
#[derive(Debug, Default)]
pub(in crate::cluster::gateway) struct Holds {
    table: Mutex<BTreeMap<String, Entry>>,
    released: Notify,
}

#[derive(Debug, Default)]
struct Entry {
    /// Joins of the id between their start and their member's arrival in the local broker.
    joining: usize,
    /// The deletes holding the id (their tokens), each until when at most: two deletes of one
    /// id may run at once, and the first one's release must not end the second one's hold.
    held: BTreeMap<u64, tokio::time::Instant>,
}

impl Entry {
    /// Until when the id is held, if it is now (holds that ran out are forgotten).
    fn held_until(&mut self, now: tokio::time::Instant) -> Option<tokio::time::Instant> {
        self.held.retain(|_, until| *until > now);
        self.held.values().max().copied()
    }

    fn unused(&self) -> bool {
        self.joining == 0 && self.held.is_empty()
    }
}

/// A join under way: counted by [`Holds::count_and_hold`] until dropped.
pub(in crate::cluster::gateway) struct Joining<'a> {
    holds: &'a Holds,
    id: String,
}

impl Drop for Joining<'_> {
    fn drop(&mut self) {
        let mut table = self.holds.lock();
        if let Some(entry) = table.get_mut(&self.id) {
            entry.joining -= 1;
            if entry.unused() {
                table.remove(&self.id);
            }
        }
    }
}

impl Holds {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Entry>> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A join of `id` starts: waits while a delete holds it (at most until the hold runs out),
    /// then counts as under way until the returned guard drops.
    pub(in crate::cluster::gateway) async fn enter(&self, id: &str) -> Joining<'_> {
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            // Registered before the table is read, so a release between the two is not missed.
            released.as_mut().enable();
            let until = {
                let mut table = self.lock();
                let entry = table.entry(id.to_string()).or_default();
                match entry.held_until(tokio::time::Instant::now()) {
                    Some(until) => until,
                    None => {
                        entry.joining += 1;
                        return Joining {
                            holds: self,
                            id: id.to_string(),
                        };
                    }
                }
            };
            let _ = tokio::time::timeout_at(until, released).await;
        }
    }

    /// How many members of `id` are here (`local`, read under the table's lock, plus joins
    /// under way); holds `id` for `token` when there are none. One step under the table's
    /// lock: a join either was counted or waits for the release.
    fn count_and_hold(&self, id: &str, token: u64, local: impl FnOnce() -> usize) -> u64 {
        let mut table = self.lock();
        let entry = table.entry(id.to_string()).or_default();
        let members = (local() + entry.joining) as u64;
        if members == 0 {
            entry.held.insert(token, tokio::time::Instant::now() + HOLD);
        } else if entry.unused() {
            table.remove(id);
        }
        members
    }

    /// The delete `token` is over: joins waiting for it go on (unless another delete holds
    /// the id too).
    fn release(&self, id: &str, token: u64) {
        {
            let mut table = self.lock();
            if let Some(entry) = table.get_mut(id) {
                entry.held.remove(&token);
                if entry.unused() {
                    table.remove(id);
                }
            }
        }
        self.released.notify_waiters();
    }
}

/// Subscribes to the deletes' subject and answers them for this gateway: counts its members of
/// the id (after expiring its member-less local subscriptions, which in cluster mode are due
/// at once, so a held id has no local leftover with the old settings), holds and releases.
pub(in crate::cluster::gateway) async fn serve(
    bus: std::sync::Arc<dyn crate::cluster::bus::Bus>,
    stream: &str,
    broker: Broker,
    holds: Arc<Holds>,
    incarnation: Arc<std::sync::atomic::AtomicU64>,
) -> Result<tokio::task::JoinHandle<()>, String> {
    let mut asks = bus
        .subscribe(&subject(stream))
        .await
        .map_err(|e| format!("cannot subscribe to deletes: {e}"))?;
    bus.flush()
        .await
        .map_err(|e| format!("cannot subscribe to deletes: {e}"))?;
    Ok(tokio::spawn(async move {
        while let Some(message) = asks.next().await {
            match serde_json::from_slice::<Ask>(&message.payload) {
                Ok(Ask::Count {
                    subscription,
                    token,
                }) => {
                    let Some(reply) = message.reply else {
                        continue;
                    };
                    broker.expire_idle();
                    let members = holds.count_and_hold(&subscription, token, || {
                        broker.member_count(&subscription)
                    });
                    let counted = Counted {
                        gateway: incarnation.load(Ordering::Relaxed),
                        members,
                    };
                    let Ok(body) = serde_json::to_vec(&counted) else {
                        continue;
                    };
                    if let Err(error) = bus.publish(&reply, body.into()).await {
                        tracing::warn!(%error, "could not answer a delete's count");
                    }
                }
                Ok(Ask::Release {
                    subscription,
                    token,
                }) => holds.release(&subscription, token),
                Err(_) => {}
            }
        }
    }))
}

impl Gateway {
    /// Deletes a subscription no member is joined to at any gateway: its JetStream consumer
    /// (QUEUE and SINGLETON: the cluster's one; BROADCAST: this gateway's own).
    ///
    /// # Errors
    /// [`Error::MembersJoined`] while a member is joined at some gateway (or in a singleton's
    /// line); a refusal of kind [`ErrorKind::NotFound`] when there is no consumer of it;
    /// [`Error::Unavailable`] when a gateway or JetStream did not answer in time. Nothing is
    /// deleted then.
    pub async fn delete(&self, id: &str) -> Result<Deleted, Error> {
        let token = self.inner.delete_tokens.fetch_add(1, Ordering::Relaxed);
        let asked = tokio::time::Instant::now();
        let outcome = self.delete_held(id, token, asked).await;
        let release = Ask::Release {
            subscription: id.to_string(),
            token,
        };
        if let Ok(body) = serde_json::to_vec(&release) {
            let bus = self.inner.shared.bus.as_ref();
            if let Err(error) = bus
                .publish(&subject(&self.inner.config.stream), body.into())
                .await
            {
                tracing::warn!(subscription = id, %error, "could not release a delete's holds (they run out by themselves)");
            }
            let _ = bus.flush().await;
        }
        if let Ok(deleted) = &outcome {
            self.inner.local.count_deleted(deleted.discarded_messages);
            tracing::info!(
                subscription = id,
                messages = deleted.discarded_messages,
                "subscription deleted"
            );
        }
        outcome
    }

    /// Steps 1 to 3 of the module's doc; the caller releases the holds.
    async fn delete_held(
        &self,
        id: &str,
        token: u64,
        asked: tokio::time::Instant,
    ) -> Result<Deleted, Error> {
        let members = self.count_everywhere(id, token).await?;
        let joined = |members: u64| Error::MembersJoined {
            subscription: id.to_string(),
            members,
            where_: " across the cluster's gateways",
        };
        if members > 0 {
            return Err(joined(members));
        }
        let line = tokio::time::timeout(
            REQUEST_PATIENCE,
            self.inner.backplane.get(&values::sub_key(id)),
        )
        .await
        .map_err(|_| unavailable("the coordination bucket did not answer", "timed out"))?
        .map_err(|e| unavailable("the coordination bucket did not answer", e))?;
        if let Some(line) = line
            .and_then(|entry| entry.value)
            .and_then(|value| serde_json::from_slice::<values::SubValue>(&value).ok())
            && !line.line.is_empty()
        {
            return Err(joined(line.line.len() as u64));
        }
        let mut found = Vec::new();
        for mode in [Mode::Queue, Mode::Broadcast] {
            let name = names::consumer_name(mode, id, &self.inner.id);
            if let Some(info) = self.consumer_of(id, &name).await? {
                found.push(info);
            }
        }
        let not_found = || {
            Error::cluster(
                ErrorKind::NotFound,
                format!(
                    "subscription {id:?} not found: no JetStream consumer records it (a BROADCAST subscription is deleted at the gateway of its member)"
                ),
            )
        };
        if found.is_empty() {
            return Err(not_found());
        }
        let mut discarded = 0;
        let mut removed = Vec::new();
        for info in found {
            if asked.elapsed() > DELETE_BUDGET {
                return Err(Error::Unavailable(format!(
                    "deleting subscription {id:?} took longer than {DELETE_BUDGET:?} (JetStream slow to answer); try again"
                )));
            }
            let deleted = tokio::time::timeout(
                REQUEST_PATIENCE,
                self.inner.shared.stream.delete_consumer(&info.name),
            )
            .await
            .map_err(|_| {
                unavailable(
                    "JetStream did not answer the consumer's delete in time",
                    "it may still be deleted; ask again (NOT_FOUND then says it was)",
                )
            })?;
            match deleted {
                // Its fence record goes on JetStream's advisory of the deletion (`fence`).
                Ok(_) => removed.push(info.name.clone()),
                // Gone meanwhile (another delete of it, or its inactivity threshold ran out):
                // nothing left to delete, and not this delete's to count.
                Err(ConsumerError::NotFound) => continue,
                Err(error) => {
                    return Err(unavailable(
                        &format!("JetStream did not delete consumer {}", info.name),
                        error,
                    ));
                }
            }
            discarded += info.pending + info.ack_pending;
        }
        if removed.is_empty() {
            return Err(not_found());
        }
        // A publish anywhere after this answer does not count it.
        self.announce_consumers_changed(
            crate::cluster::gateway::control::registry::Change::Deleted { names: removed },
        )
        .await;
        Ok(Deleted {
            discarded_messages: discarded,
        })
    }

    /// Step 1: every gateway's members of `id`, each holding it when it has none.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when a gateway holding a lease did not answer in time.
    async fn count_everywhere(&self, id: &str, token: u64) -> Result<u64, Error> {
        let bus = self.inner.shared.bus.as_ref();
        let mut expected = self.leased_gateways().await?;
        // This gateway answers too, leased or not yet.
        expected.insert(self.inner.incarnation.load(Ordering::Relaxed));
        let ask = Ask::Count {
            subscription: id.to_string(),
            token,
        };
        let body = serde_json::to_vec(&ask).map_err(|e| unavailable("cannot ask", e))?;
        let gathered = crate::cluster::gateway::wire::ask::gather(
            bus,
            subject(&self.inner.config.stream),
            body.into(),
            expected,
            ASK_PATIENCE,
            |counted: &Counted| counted.gateway,
        )
        .await
        .map_err(|e| unavailable("cannot ask the other gateways", e))?;
        if !gathered.silent.is_empty() {
            return Err(Error::Unavailable(format!(
                "subscription {id:?} was not deleted: {} gateway(s) holding a lease did not say within {ASK_PATIENCE:?} whether members are joined there (a gateway that died keeps its lease for about 3.4 s); try again",
                gathered.silent.len()
            )));
        }
        let members = gathered.answers.iter().map(|counted| counted.members).sum();
        Ok(members)
    }

    /// The incarnations holding a lease in the coordination bucket: every live gateway, and
    /// dead ones whose lease has not lapsed yet, as the bucket's leader holds them
    /// ([`Backplane::live_keys`](crate::cluster::backplane::Backplane::live_keys): a lease
    /// made before the read is never missed).
    pub(in crate::cluster::gateway) async fn leased_gateways(
        &self,
    ) -> Result<BTreeSet<u64>, Error> {
        use crate::cluster::values::{GatewayId, Key};
        let failed = |e: String| unavailable("the coordination bucket did not list the leases", e);
        let keys = tokio::time::timeout(
            LEASE_LIST_PATIENCE,
            self.inner.backplane.live_keys(Key::LEASES),
        )
        .await
        .map_err(|_| failed("timed out".into()))?
        .map_err(|e| failed(e.to_string()))?;
        Ok(keys
            .iter()
            .filter_map(|key| match Key::parse(key)? {
                Key::Lease(GatewayId(gateway)) => Some(gateway),
                _ => None,
            })
            .collect())
    }

    /// The consumer `name` if it exists and records subscription `id`.
    async fn consumer_of(&self, id: &str, name: &str) -> Result<Option<ConsumerInfo>, Error> {
        let info = tokio::time::timeout(
            REQUEST_PATIENCE,
            self.inner.shared.stream.consumer_info(name),
        )
        .await
        .map_err(|_| unavailable("JetStream did not answer for the consumer", "timed out"))?;
        match info {
            Ok(info) => Ok(names::recorded(&info.metadata)
                .is_ok_and(|(of, _)| of == id)
                .then_some(info)),
            Err(ConsumerError::NotFound) => Ok(None),
            Err(error) => Err(unavailable(
                "JetStream did not answer for the consumer",
                error,
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A join under way is counted, so no delete holds its id; once it is in (the local count
    // says so) the id is still not held; a hold makes the next join wait for its release.
    #[tokio::test(start_paused = true)]
    async fn a_hold_makes_joins_wait_and_a_join_under_way_refuses_the_hold() {
        let holds = Holds::default();
        let joining = holds.enter("a").await;
        assert_eq!(holds.count_and_hold("a", 1, || 0), 1);
        drop(joining);
        assert_eq!(holds.count_and_hold("a", 1, || 1), 1);
        assert_eq!(holds.count_and_hold("a", 2, || 0), 0);
        let waiting = holds.enter("a");
        tokio::pin!(waiting);
        assert!(
            tokio::time::timeout(Duration::from_secs(1), waiting.as_mut())
                .await
                .is_err(),
            "a held id makes a join wait"
        );
        holds.release("a", 1); // another delete's token: no effect
        assert!(
            tokio::time::timeout(Duration::from_secs(1), waiting.as_mut())
                .await
                .is_err()
        );
        holds.release("a", 2);
        let joined = tokio::time::timeout(Duration::from_secs(1), waiting).await;
        assert!(joined.is_ok(), "the release lets it go on");
    }

    // Two deletes of one id at once: the first one's release leaves the second one's hold.
    #[tokio::test(start_paused = true)]
    async fn a_release_ends_only_its_own_hold() {
        let holds = Holds::default();
        assert_eq!(holds.count_and_hold("a", 1, || 0), 0);
        assert_eq!(holds.count_and_hold("a", 2, || 0), 0);
        holds.release("a", 1);
        let waiting = holds.enter("a");
        tokio::pin!(waiting);
        let early = tokio::time::timeout(Duration::from_secs(1), waiting.as_mut()).await;
        assert!(early.is_err(), "still held by the second delete");
        holds.release("a", 2);
        let late = tokio::time::timeout(Duration::from_secs(1), waiting).await;
        assert!(late.is_ok());
    }

    // A join under way at a gateway with members keeps being counted.
    #[tokio::test(start_paused = true)]
    async fn a_join_under_way_stays_counted_beside_members() {
        let holds = Holds::default();
        let _joining = holds.enter("a").await;
        assert_eq!(holds.count_and_hold("a", 1, || 2), 3);
        assert_eq!(
            holds.count_and_hold("a", 1, || 0),
            1,
            "the join under way is not forgotten"
        );
    }

    // A hold nobody releases (its deleting gateway died) runs out by itself.
    #[tokio::test(start_paused = true)]
    async fn a_hold_runs_out_after_its_time() {
        let holds = Holds::default();
        assert_eq!(holds.count_and_hold("a", 1, || 0), 0);
        let started = tokio::time::Instant::now();
        let _joining = holds.enter("a").await;
        assert_eq!(started.elapsed(), HOLD);
    }
}
