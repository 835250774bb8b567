//! `WatchLeadership` through a gateway (docs/semantics.md#watching-leadership): a SINGLETON
//! subscription's leadership as the coordination bucket records it, so a watcher at any gateway
//! sees the promotions made at every gateway. The singleton shell keeps one state per watched
//! subscription from its watch of the bucket; each watch forwards it, and ends once the
//! subscription's JetStream consumer is gone (deleted, or expired with no member), which it
//! checks every [`GONE_CHECK`] while no member is active.

use std::{sync::Arc, time::Duration};

use tokio::sync::watch;

use super::Gateway;
use crate::{
    broker::{Leadership, LeadershipWatch},
    core::{Error, Mode},
};

/// How often a watch of a subscription with no active member asks JetStream whether its
/// consumer still exists.
pub(super) const GONE_CHECK: Duration = Duration::from_secs(2);

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
        let Some(singletons) = &self.inner.shared.singletons else {
            return Err(Error::Unavailable(
                "this gateway runs no singleton coordination".into(),
            ));
        };
        let cluster = singletons.watch(Arc::from(subscription_id)).await?;
        let (sender, receiver) = watch::channel(*cluster.borrow());
        tokio::spawn(follow(
            self.clone(),
            subscription_id.to_string(),
            cluster,
            sender,
        ));
        Ok(receiver)
    }
}

/// Forwards the cluster's state to one watcher until it stops watching, the shell stops, or
/// the subscription's consumer is gone (the sender dropped: its stream ends with `NOT_FOUND`).
async fn follow(
    gateway: Gateway,
    subscription: String,
    mut cluster: LeadershipWatch,
    sender: watch::Sender<Leadership>,
) {
    let mut check = tokio::time::interval(GONE_CHECK);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = sender.closed() => return,
            changed = cluster.changed() => {
                if changed.is_err() {
                    return;
                }
                let state = *cluster.borrow_and_update();
                sender.send_replace(state);
            }
            _ = check.tick() => {
                if sender.borrow().active.is_none()
                    && matches!(gateway.singleton_consumer(&subscription).await, Ok(None))
                {
                    tracing::debug!(%subscription, "watched subscription is gone");
                    return;
                }
            }
        }
    }
}
