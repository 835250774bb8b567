//! `ListSubscriptions` through a gateway: what `DescribeSubscription` at this gateway can
//! describe, in id order. Those with members here come from the local broker, with their
//! consumer's backlog; QUEUE and SINGLETON subscriptions with no member here come from their
//! JetStream consumers (shared by every gateway, their settings in the consumer's metadata),
//! and a singleton's active member and epoch from the coordination bucket, as
//! [`Gateway::describe`] gives them; BROADCAST ones with no member here from their gateway's
//! consumer. The broker-wide counters are this gateway's.

use std::collections::BTreeMap;

use crate::cluster::gateway::{Gateway, api::describe::backlog, wire::names};
use crate::cluster::jetstream::ConsumerInfo;
use crate::{
    broker::{BrokerStats, Description},
    core::{Error, Mode, SubscriptionSpec},
};

/// How long a listing waits for the servers' list of consumers.
const PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);

impl Gateway {
    /// Up to `limit` subscriptions whose ids come after `after`, in id order, as
    /// [`Gateway::describe`] describes each, plus this gateway's broker-wide counters.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when JetStream did not list the stream's consumers.
    pub async fn list_page(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<Description>, BrokerStats), Error> {
        let consumers = self.consumers().await?;
        let (local, stats) = self.inner.local.list_page(after, limit);
        let mut page: BTreeMap<String, Option<crate::broker::SubscriptionView>> = local
            .into_iter()
            .map(|view| (view.subscription_id.to_string(), Some(view)))
            .collect();
        for id in consumers.keys() {
            if after.is_none_or(|after| id.as_str() > after) {
                page.entry(id.clone()).or_insert(None);
            }
        }
        let mut described = Vec::with_capacity(limit.min(page.len()));
        for (id, view) in page.into_iter().take(limit) {
            described.push(match view {
                Some(view) => {
                    let name = names::consumer_name(view.spec.mode, &id, &self.inner.id);
                    let upstream = consumers
                        .get(&id)
                        .filter(|(_, info)| info.name == name)
                        .map(|(_, info)| backlog(info));
                    self.local(view, upstream, true).await
                }
                None => {
                    let (spec, info) = &consumers[&id];
                    self.elsewhere(&id, spec.clone(), info).await
                }
            });
        }
        Ok((described, stats))
    }

    /// Every subscription [`list_page`](Self::list_page) would list, in id order, with its
    /// consumer's backlog but without asking the coordination bucket for each singleton's line:
    /// a console takes the lines from [`cluster_lines`](Self::cluster_lines), one question for
    /// all of them (docs/operations.md#console).
    ///
    /// # Errors
    /// [`Error::Unavailable`] when JetStream did not list the stream's consumers.
    pub async fn list_brief(&self) -> Result<(Vec<Description>, BrokerStats), Error> {
        let consumers = self.consumers().await?;
        let (local, stats) = self.inner.local.list();
        let mut all: BTreeMap<String, Description> = BTreeMap::new();
        for view in local {
            let id = view.subscription_id.to_string();
            let name = names::consumer_name(view.spec.mode, &id, &self.inner.id);
            let upstream = consumers
                .get(&id)
                .filter(|(_, info)| info.name == name)
                .map(|(_, info)| backlog(info));
            all.insert(
                id,
                Description {
                    upstream,
                    ..Description::from(view)
                },
            );
        }
        for (id, (spec, info)) in consumers {
            all.entry(id.clone()).or_insert_with(|| {
                crate::cluster::gateway::api::describe::without_members(&id, spec, &info)
            });
        }
        Ok((all.into_values().collect(), stats))
    }

    /// This gateway's copy of the cluster's lines (`None` once its coordination stopped).
    pub async fn cluster_lines(
        &self,
    ) -> Option<crate::cluster::gateway::control::singleton::ClusterLines> {
        self.inner.shared.singletons.lines().await
    }

    /// Every consumer of the stream that records a subscription, by subscription id, with its
    /// recorded settings: for a QUEUE or SINGLETON id the one named as a join would name it (a
    /// consumer whose name collides with another subscription's is left out); for a BROADCAST
    /// id this gateway's, else the first by name of another gateway's, as `describe` finds it.
    async fn consumers(&self) -> Result<BTreeMap<String, (SubscriptionSpec, ConsumerInfo)>, Error> {
        let listed = tokio::time::timeout(PATIENCE, async {
            let mut found = BTreeMap::new();
            let consumers = self.inner.shared.stream.consumers().await;
            for info in consumers.map_err(|e| e.to_string())? {
                let Ok((id, spec)) = names::recorded(&info.metadata) else {
                    continue;
                };
                let own = names::consumer_name(spec.mode, &id, &self.inner.id) == info.name;
                if own {
                    found.insert(id, (spec, info));
                } else if spec.mode == Mode::Broadcast {
                    // Listed in name order: the first of another gateway's, unless this one's.
                    let mine = names::consumer_name(Mode::Broadcast, &id, &self.inner.id);
                    let keep = found.get(&id).is_some_and(
                        |(kept_spec, kept): &(SubscriptionSpec, ConsumerInfo)| {
                            kept_spec.mode != Mode::Broadcast
                                || kept.name == mine
                                || kept.name < info.name
                        },
                    );
                    if !keep {
                        found.insert(id, (spec, info));
                    }
                }
            }
            Ok::<_, String>(found)
        })
        .await
        .map_err(|_| format!("no answer within {PATIENCE:?}"))
        .and_then(|listed| listed);
        listed.map_err(|why| {
            Error::Unavailable(format!(
                "JetStream did not list the subscriptions' consumers: {why}"
            ))
        })
    }
}
