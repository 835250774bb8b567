//! A consumer made or deleted is announced to every gateway before the join or delete is
//! answered (docs/cluster-internals.md#queued_for-across-gateways): each gateway brings its
//! registry copy up to date and says so, so a publish counts its `queued_for` from the copy as it
//! is, without a JetStream round trip of its own, as long as its gateway's lease and NATS
//! connection held since its copy was last brought up to date
//! ([`Registry::current`](crate::cluster::gateway::control::registry::Registry::current)).
//!
//! The announcing gateway asks over NATS (`_tinybroker.<stream>.registry`, which every gateway
//! subscribes to) and waits for an answer from every gateway holding a lease in the
//! coordination bucket, for as long as another gateway waits before it takes a gateway for
//! dead (the lease stretched by the clocks' drift bound, and a margin; at most
//! [`MAX_ANNOUNCE_PATIENCE`]). One that has not answered by then (paused, its connection down)
//! cannot still hold the lease it held when the announcement went out, so its copy is not
//! current when it counts again: it syncs first. An announcement carries its change (the
//! consumer made, with its metadata, or the consumers deleted): each gateway applies it to its
//! copy and answers at once, with no listing, so joins at several gateways at once do not wait
//! for listings that JetStream holds while it makes their consumers. One without a change (a
//! gateway of an earlier version) marks the copy not current, and is answered only once a
//! listing after it succeeded.

use std::{
    collections::{BTreeSet, HashMap},
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use tokio_stream::StreamExt;

use crate::cluster::gateway::{
    Gateway,
    control::registry::{Change, Registry},
};

/// The longest an announcement waits for a gateway that does not answer. With a
/// `--gateway-lease` longer than this (by the drift bound and margin), a gateway paused for
/// longer than this but less than its lease can count without a change announced meanwhile
/// (docs/cluster-internals.md#queued_for-across-gateways).
pub(in crate::cluster::gateway) const MAX_ANNOUNCE_PATIENCE: Duration = Duration::from_secs(10);

/// At most this many announcements are being answered at once by one gateway (their refreshes
/// share syncs); more are dropped, and their announcers wait out their patience.
const ANSWERING: usize = 64;

/// A gateway's answer: its copy was brought up to date after the announcement arrived.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Refreshed {
    /// Its incarnation (its lease is `lease.<gateway>`).
    gateway: u64,
}

/// Outside the stream's subjects (`<stream>.>`), so nothing of it is stored.
fn subject(stream: &str) -> String {
    format!("_tinybroker.{stream}.registry")
}

/// Subscribes to announcements and answers each once this gateway's copy was brought up to
/// date after it arrived, with this gateway's incarnation.
pub(in crate::cluster::gateway) async fn serve(
    bus: std::sync::Arc<dyn crate::cluster::bus::Bus>,
    stream: &str,
    registry: Arc<Registry>,
    incarnation: Arc<std::sync::atomic::AtomicU64>,
) -> Result<tokio::task::JoinHandle<()>, String> {
    let mut asks = bus
        .subscribe(&subject(stream))
        .await
        .map_err(|e| format!("cannot subscribe to registry announcements: {e}"))?;
    bus.flush()
        .await
        .map_err(|e| format!("cannot subscribe to registry announcements: {e}"))?;
    Ok(tokio::spawn(async move {
        let mut answering = tokio::task::JoinSet::new();
        while let Some(message) = asks.next().await {
            while answering.try_join_next().is_some() {}
            let Some(reply) = message.reply else {
                continue;
            };
            // An announcement that carries its change is applied at once and answered: the
            // copy stays as current as it was. One that does not (a gateway of an earlier
            // version) is answered once a listing after it succeeded.
            if let Ok(change) = serde_json::from_slice::<Change>(&message.payload) {
                registry.apply(change);
                answer(bus.as_ref(), &reply, &incarnation).await;
                continue;
            }
            // Whatever follows, the copy may lack what was announced.
            registry.stale();
            if answering.len() >= ANSWERING {
                tracing::debug!("too many registry announcements at once: one left unanswered");
                continue;
            }
            let (bus, registry, incarnation) = (bus.clone(), registry.clone(), incarnation.clone());
            answering.spawn(async move {
                if !registry.refresh().await {
                    // Not listed: the announcer waits out its patience, and this copy stays
                    // not current (the next publish syncs).
                    return;
                }
                answer(bus.as_ref(), &reply, &incarnation).await;
            });
        }
    }))
}

/// Says this gateway's copy has what was announced, with its incarnation.
async fn answer(
    bus: &dyn crate::cluster::bus::Bus,
    reply: &str,
    incarnation: &std::sync::atomic::AtomicU64,
) {
    let me = Refreshed {
        gateway: incarnation.load(Ordering::Relaxed),
    };
    let Ok(body) = serde_json::to_vec(&me) else {
        return;
    };
    if let Err(error) = bus.publish(reply, body.into()).await {
        tracing::debug!(%error, "could not answer a registry announcement");
    }
}

impl Gateway {
    /// A join found consumer `name` made by another gateway: announces it too when this
    /// gateway's copy, brought up to date first if it is not current, does not have it (its
    /// maker may still be announcing it), so a publish anywhere after the join's answer counts
    /// it. A gateway starting, whose copy was never listed, lists it once instead of
    /// announcing every subscription its members join again.
    pub(in crate::cluster::gateway) async fn announce_if_new(
        &self,
        name: &str,
        metadata: &HashMap<String, String>,
    ) {
        let registry = &self.inner.shared.registry;
        if !registry.current() {
            registry.refresh().await;
        }
        if !registry.knows(name) {
            self.announce_consumers_changed(Change::Made {
                name: name.to_string(),
                metadata: metadata.clone(),
            })
            .await;
        }
    }

    /// Tells every gateway that the stream's consumers changed (one made or deleted here) and
    /// waits until each holding a lease, this one included, brought its registry copy up to
    /// date, or could no longer hold the lease it held then (see the module doc). Never
    /// fails: a gateway that did not answer is logged.
    pub(in crate::cluster::gateway) async fn announce_consumers_changed(&self, change: Change) {
        let registry = &self.inner.shared.registry;
        // As the bucket's watch last saw them; listed from the bucket only before it has.
        let watched = self.inner.shared.singletons.leased_gateways();
        let mut expected = match watched {
            Some(expected) => expected,
            None => match self.leased_gateways().await {
                Ok(expected) => expected,
                Err(error) => {
                    tracing::warn!(%error, "could not list the gateways to announce a new or deleted consumer to: others count queued_for without it until JetStream's advisory reaches them");
                    BTreeSet::new()
                }
            },
        };
        let me = self.inner.incarnation.load(Ordering::Relaxed);
        let patience = crate::cluster::gateway::control::singleton::config(
            self.inner.config.lease,
            self.inner.config.lapse_patience,
        )
        .dead_after()
        .min(MAX_ANNOUNCE_PATIENCE);
        expected.insert(me);
        let body = serde_json::to_vec(&change).unwrap_or_default();
        let gathered = crate::cluster::gateway::wire::ask::gather(
            self.inner.shared.bus.as_ref(),
            subject(&self.inner.config.stream),
            body.into(),
            expected.clone(),
            patience,
            |refreshed: &Refreshed| refreshed.gateway,
        )
        .await;
        let silent = gathered.map_or(expected, |gathered| gathered.silent);
        if !silent.is_empty() {
            tracing::warn!(
                unanswered = silent.len(),
                "gateways did not confirm a new or deleted consumer within {patience:?}: taken for paused or gone (their copies sync before they count again)"
            );
            // This gateway's own copy at least.
            if silent.contains(&me) {
                registry.refresh().await;
            }
        }
    }
}
