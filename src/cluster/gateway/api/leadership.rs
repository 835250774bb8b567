//! `WatchLeadership` through a gateway (docs/semantics.md#watching-leadership): a SINGLETON
//! subscription's leadership as the coordination bucket records it, so a watcher at any gateway
//! sees the promotions made at every gateway.
//!
//! The singleton shell keeps one state per watched subscription from its watch of the bucket
//! ([`Leaders`]).
//! Here one follower per watched subscription (whatever its number of watchers) forwards it to
//! the watchers and ends their watch once the subscription's JetStream consumer is gone
//! (deleted, or expired with no member): it asks JetStream every [`GONE_CHECK`] while no
//! member is active, one request per subscription, not per watcher.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, PoisonError, Weak},
    time::Duration,
};

use tokio::sync::watch;

use crate::cluster::gateway::{Gateway, Inner, data::forward};
use crate::{
    broker::{Broker, Leadership, LeadershipWatch},
    core::{Error, ErrorKind, Mode, Proclamation},
};

/// How often the follower of a subscription with no active member asks JetStream whether its
/// consumer still exists.
pub(in crate::cluster::gateway) const GONE_CHECK: Duration = Duration::from_secs(2);

/// The watched subscriptions' senders, one per subscription, shared by its watchers.
pub(in crate::cluster::gateway) type Watched =
    Mutex<BTreeMap<String, Arc<watch::Sender<Leadership>>>>;

impl Gateway {
    /// Watches SINGLETON subscription `subscription_id`'s leadership across the cluster.
    ///
    /// # Errors
    /// A refusal of kind not found when neither this gateway nor JetStream has it,
    /// [`Error::NotSingleton`], [`Error::Unavailable`] when JetStream did not answer.
    pub async fn watch_leadership(&self, subscription_id: &str) -> Result<LeadershipWatch, Error> {
        let described = self.describe(subscription_id).await?;
        let mode = described.view.spec.mode;
        if mode != Mode::Singleton {
            return Err(Error::NotSingleton {
                subscription: subscription_id.to_string(),
                mode,
            });
        }
        if let Some(sender) = lock(&self.inner.watched).get(subscription_id) {
            return Ok(sender.subscribe());
        }
        // Without a lease its copy of the lines may be behind: it answers no watch then, as it
        // admits no singleton member (docs/semantics.md#watching-leadership).
        let singletons = self
            .leased_singletons(
                "its view of the leadership may be behind; retry, or watch at another gateway",
            )
            .await?;
        // The consumer's creation time tells the subscription from one deleted and made again
        // under its id.
        let created = match self.singleton_consumer(subscription_id).await {
            Ok(Some(info)) => info.created,
            Ok(None) => {
                return Err(Error::cluster(
                    ErrorKind::NotFound,
                    format!("subscription {subscription_id:?} not found: no JetStream consumer"),
                ));
            }
            Err(why) => {
                return Err(Error::Unavailable(format!(
                    "JetStream did not answer for subscription {subscription_id:?}'s consumer: {why}"
                )));
            }
        };
        // Answered once this gateway's copy of the lines caught up with its lease
        // (docs/semantics.md#cluster-leadership-current): a gateway just started or resumed
        // waits for its watch rather than show a line it has not read yet.
        let patience = crate::cluster::gateway::control::lease::JOIN_LEASE_PATIENCE;
        let cluster = tokio::time::timeout(patience, singletons.watch(Arc::from(subscription_id)))
            .await
            .map_err(|_| {
                Error::Unavailable(format!(
                    "this gateway's copy of the cluster's lines did not catch up with its lease within {patience:?}: watch again, here or at another gateway"
                ))
            })??;
        let mut watched = lock(&self.inner.watched);
        // Another watch may have started its follower meanwhile.
        if let Some(sender) = watched.get(subscription_id) {
            return Ok(sender.subscribe());
        }
        let (sender, receiver) = watch::channel(cluster.borrow().clone());
        let sender = Arc::new(sender);
        watched.insert(subscription_id.to_string(), sender.clone());
        tokio::spawn(follow(
            Arc::downgrade(&self.inner),
            subscription_id.to_string(),
            created,
            cluster,
            sender,
        ));
        Ok(receiver)
    }
}

impl Gateway {
    /// This gateway's singleton coordination once it holds a lease (waited for, bounded): its
    /// copy of the lines may be behind without one. `why` ends the refusal's message.
    ///
    /// # Errors
    /// [`Error::Unavailable`] with no lease within the join's patience.
    pub(in crate::cluster::gateway) async fn leased_singletons(
        &self,
        why: &str,
    ) -> Result<&crate::cluster::gateway::control::singleton::Handle, Error> {
        let singletons = &self.inner.shared.singletons;
        let patience = crate::cluster::gateway::control::lease::JOIN_LEASE_PATIENCE;
        if singletons.lease().wait_valid(patience).await.is_none() {
            return Err(Error::Unavailable(format!(
                "this gateway holds no cluster lease (it is starting, or NATS did not confirm its lease within {patience:?}): {why}"
            )));
        }
        Ok(singletons)
    }

    /// The active member replaces its metadata (docs/semantics.md#member-metadata): checked
    /// and answered by the gateway holding it (forwarded there from any other), once the
    /// cluster's line holds it.
    ///
    /// # Errors
    /// [`Error::SubscriptionNotFound`] when no gateway has the subscription,
    /// [`Error::MemberNotFound`] for a member no gateway holds, [`Error::NotActive`],
    /// [`Error::NotSingleton`], and [`Error::Unavailable`] when the bucket or the holding
    /// gateway did not answer in time.
    pub async fn proclaim(&self, proclamation: Proclamation) -> Result<(), Error> {
        let Proclamation {
            subscription_id,
            member,
            epoch,
            metadata,
        } = proclamation;
        let broker = &self.inner.shared.broker;
        let result = if broker.has_member(&subscription_id, member)
            || crate::cluster::ids::Route::of(member)
                == crate::cluster::ids::Route::of(broker.id_floor().unix_micros())
        {
            proclaim_here(
                broker,
                &self.inner.shared.singletons,
                &subscription_id,
                member,
                epoch,
                metadata,
            )
            .await
        } else {
            forward::request(
                self.inner.shared.bus.as_ref(),
                &self.inner.config.stream,
                &self.inner.gone_routes,
                forward::SettleRequest {
                    subscription: subscription_id.clone(),
                    member,
                    system_id: 0,
                    nack: false,
                    proclaim: Some(forward::ProclaimRequest {
                        epoch,
                        metadata: metadata.to_string(),
                    }),
                },
                self.inner.config.forward_timeout,
            )
            .await
        };
        match result {
            // No gateway holds the member (one that never was, or one that left), here or at
            // the gateway it was forwarded to: as embedded, an unknown subscription or another
            // mode is named before an unknown member.
            Err(error)
                if matches!(error, Error::MemberGone { .. })
                    || error.kind() == ErrorKind::NotFound =>
            {
                let mode = self.describe(&subscription_id).await?.view.spec.mode;
                if mode == Mode::Singleton {
                    Err(Error::MemberNotFound {
                        subscription: subscription_id,
                        member,
                    })
                } else {
                    Err(Error::NotSingleton {
                        subscription: subscription_id,
                        mode,
                    })
                }
            }
            result => result,
        }
    }
}

/// A proclamation at the gateway holding the member: checked by its broker (active, with that
/// epoch), then written into the line; answered once the line holds it.
pub(in crate::cluster::gateway) async fn proclaim_here(
    broker: &Broker,
    singletons: &crate::cluster::gateway::control::singleton::Handle,
    subscription: &str,
    member: u64,
    epoch: u64,
    metadata: Arc<str>,
) -> Result<(), Error> {
    let not_here = || Error::MemberNotFound {
        subscription: subscription.to_string(),
        member,
    };
    let previous = match broker.proclaim(subscription, member, epoch, metadata.clone()) {
        Ok(previous) => previous,
        // Its last member here left, so the local part was forgotten.
        Err(Error::SubscriptionNotFound(_)) => return Err(not_here()),
        // The local broker knows only the epochs it activated here; the refusal names the
        // cluster's, as the embedded broker names its successor's.
        Err(Error::NotActive {
            subscription,
            member,
            epoch,
            current,
            active,
        }) => {
            // Bounded: a gateway whose copy of the lines is not caught up names its own.
            let line = tokio::time::timeout(
                crate::cluster::gateway::control::lease::JOIN_LEASE_PATIENCE,
                singletons.line(Arc::from(subscription.as_str())),
            )
            .await
            .ok()
            .flatten();
            return Err(Error::NotActive {
                current: line.map_or(current, |(_, cluster)| cluster.max(current)),
                subscription,
                member,
                epoch,
                active,
            });
        }
        Err(error) => return Err(error),
    };
    let patience = crate::cluster::gateway::control::lease::JOIN_LEASE_PATIENCE;
    match tokio::time::timeout(
        patience,
        singletons.proclaim(Arc::from(subscription), member, metadata.clone()),
    )
    .await
    {
        Ok(Ok(Ok(()))) => Ok(()),
        // No room in the line: refused, so nothing changes here either.
        Ok(Ok(Err(error))) => {
            broker.unproclaim(subscription, member, &metadata, previous);
            Err(error)
        }
        // Ended (it left, or this gateway lost its lease) before the line held it.
        Ok(Err(_)) => Err(Error::Unavailable(format!(
            "member {member} of subscription {subscription:?} was ended before the cluster's line held its metadata"
        ))),
        Err(_) => Err(Error::Unavailable(format!(
            "the coordination bucket did not take member {member}'s metadata within {patience:?}; it may yet: proclaim again"
        ))),
    }
}

fn lock(
    watched: &Watched,
) -> std::sync::MutexGuard<'_, BTreeMap<String, Arc<watch::Sender<Leadership>>>> {
    watched.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Forwards the cluster's state to a subscription's watchers until none is left, the gateway
/// or its shell stops, or the subscription's consumer is gone: its sender is then dropped, and
/// every watch of it ends (`NOT_FOUND`).
async fn follow(
    gateway: Weak<Inner>,
    subscription: String,
    created: i128,
    mut cluster: LeadershipWatch,
    sender: Arc<watch::Sender<Leadership>>,
) {
    // Whether the subscription watched is gone: its consumer deleted, or deleted and made
    // again (another creation time). Unknown when JetStream does not answer: not gone.
    let gone = async |inner: Arc<Inner>| {
        let gateway = Gateway { inner };
        match gateway.singleton_consumer(&subscription).await {
            Ok(None) => true,
            Ok(Some(info)) => info.created != created,
            Err(_) => false,
        }
    };
    let mut check = tokio::time::interval(GONE_CHECK);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = sender.closed() => {
                let Some(inner) = gateway.upgrade() else { return };
                let mut watched = lock(&inner.watched);
                // A watch that came meanwhile keeps it going.
                if sender.receiver_count() == 0 {
                    watched.remove(&subscription);
                    return;
                }
            }
            changed = cluster.changed() => {
                if changed.is_err() {
                    break;
                }
                let mut state = cluster.borrow_and_update().clone();
                // A member made active after none was: the subscription may have been deleted
                // and made again meanwhile, which ends this watch rather than follow the new one.
                if state.active.is_some() && sender.borrow().active.is_none() && !state.cut_off {
                    let Some(inner) = gateway.upgrade() else { return };
                    if gone(inner).await {
                        tracing::debug!(%subscription, "watched subscription is gone");
                        break;
                    }
                }
                if crate::core::planted::active(crate::core::planted::PlantedBug::WatchReportsStaleEpoch) {
                    let before = sender.borrow();
                    if before.active.is_some() && state.active.is_some() && before.active != state.active {
                        // The planted bug: the new active member with the old epoch.
                        state.epoch = before.epoch;
                    }
                }
                sender.send_replace(state);
            }
            _ = check.tick() => {
                if sender.borrow().active.is_some() {
                    continue;
                }
                let Some(inner) = gateway.upgrade() else { return };
                if gone(inner).await {
                    tracing::debug!(%subscription, "watched subscription is gone");
                    break;
                }
            }
        }
    }
    if let Some(inner) = gateway.upgrade() {
        lock(&inner.watched).remove(&subscription);
    }
}
