//! `HandOver` through a gateway (docs/semantics.md#cluster-priority-and-hand-over): asked at
//! any gateway, marked in the cluster's line by this gateway's coordinator, carried out by the
//! gateway holding the active member (`singleton`, the bridge), and answered from this
//! gateway's copy of the line.

use std::sync::Arc;

use crate::cluster::gateway::Gateway;
use crate::{
    cluster::values::{self},
    core::{Error, Mode},
};

impl Gateway {
    /// `HandOver` through a gateway (docs/semantics.md#cluster-priority-and-hand-over): the
    /// line, at whichever gateway holds the active member, asks it to step down at a message
    /// boundary; answered once this gateway's copy of the line shows the outcome.
    ///
    /// # Errors
    /// A refusal of kind not found when no gateway has the subscription,
    /// [`Error::NotSingleton`], [`Error::HandOverRefused`], and [`Error::Unavailable`] when
    /// this gateway holds no lease, or the outcome did not show within the hand-over timeout
    /// and a margin.
    pub async fn hand_over(
        &self,
        subscription_id: &str,
    ) -> Result<crate::broker::HandedOver, Error> {
        let mode = self.describe(subscription_id).await?.view.spec.mode;
        if mode != Mode::Singleton {
            return Err(Error::NotSingleton {
                subscription: subscription_id.to_string(),
                mode,
            });
        }
        // Without a lease its copy of the lines may be behind (as for a watch).
        let singletons = self
            .leased_singletons("ask another gateway, or retry")
            .await?;
        let patience = crate::cluster::gateway::control::lease::JOIN_LEASE_PATIENCE;
        // The active member's gateway completes it within its hand-over timeout; the line's
        // writes and the watch take a little more.
        let bound = self
            .inner
            .shared
            .broker
            .limits()
            .handover_timeout
            .saturating_add(patience);
        let broker = &self.inner.shared.broker;
        // The line as the bucket's leader holds it now: the request is for the member active
        // then, not for one this gateway's copy may still show (a hand-over answered a moment
        // ago at another gateway would otherwise be answered again here, as if this one's).
        let at_least = match tokio::time::timeout(
            patience,
            self.inner.backplane.get(&values::sub_key(subscription_id)),
        )
        .await
        {
            Ok(Ok(Some(entry))) => entry.revision,
            Ok(Ok(None)) => 0,
            Ok(Err(error)) => {
                return Err(Error::Unavailable(format!(
                    "the coordination bucket did not answer for subscription {subscription_id:?}'s line: {error}; nothing changed"
                )));
            }
            Err(_) => {
                return Err(Error::Unavailable(format!(
                    "the coordination bucket did not answer for subscription {subscription_id:?}'s line within {patience:?}; nothing changed"
                )));
            }
        };
        let asked = singletons.hand_over(Arc::from(subscription_id), at_least);
        match tokio::time::timeout(bound, asked).await {
            // A shutdown ends the members' streams, which the line then shows: that is no
            // outcome of the request (as embedded, UNAVAILABLE).
            Ok(_) if broker.is_shutting_down() => Err(Error::ShuttingDown),
            Ok(outcome) => outcome,
            Err(_) => Err(Error::Unavailable(format!(
                "the hand-over of subscription {subscription_id:?} did not show in the cluster's line within {bound:?}; it may yet happen: watch its leadership"
            ))),
        }
    }
}
