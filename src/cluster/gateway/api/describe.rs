//! `DescribeSubscription` through a gateway. What the gateway holds (its members, its local
//! queue, its counters) comes from its broker as on an embedded broker; what JetStream holds for
//! the subscription comes from its consumer (`upstream`). A QUEUE or SINGLETON subscription is
//! described at every gateway, also one where it has no member: its settings from its
//! consumer's metadata, its backlog from the consumer, and a singleton's active member and
//! epoch from the coordination bucket. A BROADCAST subscription's consumer is its gateway's
//! own; elsewhere it is found in the registry (the first by name when gateways each have one
//! of that id) and described from it as well.

use crate::cluster::jetstream::ConsumerInfo;

use crate::cluster::gateway::{Gateway, wire::names};
use crate::{
    broker::{Description, SubscriptionView, UpstreamBacklog},
    cluster::values,
    core::{Error, ErrorKind, Mode, SubscriptionSpec},
};

impl Gateway {
    /// The subscription as this gateway sees it, with its JetStream consumer's backlog.
    ///
    /// # Errors
    /// A refusal of kind [`ErrorKind::NotFound`] when neither this gateway nor JetStream has
    /// it; [`Error::Unavailable`] when it has no member here and JetStream did not answer.
    pub async fn describe(&self, subscription_id: &str) -> Result<Description, Error> {
        match self.inner.shared.broker.describe(subscription_id) {
            Ok(view) => {
                // Unset when the servers do not answer: the local view still stands.
                let consumer = self.consumer_backlog(view.spec.mode, subscription_id).await;
                let answered = consumer.is_ok();
                let upstream = consumer.ok().flatten().map(|c| backlog(&c));
                Ok(self.local(view, upstream, answered).await)
            }
            Err(Error::SubscriptionNotFound(_)) => self.describe_elsewhere(subscription_id).await,
            Err(e) => Err(e),
        }
    }

    /// A subscription with members here, with its consumer's backlog (`upstream`, when
    /// `answered` the servers answered for it).
    pub(in crate::cluster::gateway) async fn local(
        &self,
        view: SubscriptionView,
        upstream: Option<UpstreamBacklog>,
        answered: bool,
    ) -> Description {
        let singleton = view.spec.mode == Mode::Singleton;
        let mut described = Description {
            upstream,
            ..Description::from(view)
        };
        // The cluster's active member, epoch and line come from the bucket, also where a member
        // here is active: this gateway's broker may still hold one the line has passed (it was
        // paused past its lease), and counts places in its own part of the line only. Not
        // asked when the servers just did not answer: the answer would only wait longer.
        if answered
            && singleton
            && let Some(line) = self.cluster_line(&mut described).await
        {
            let here = values::GatewayId(
                self.inner
                    .incarnation
                    .load(std::sync::atomic::Ordering::Relaxed),
            );
            for member in &mut described.view.members {
                let uid = values::MemberUid {
                    gateway: here,
                    member: member.member_id,
                };
                // Its place in the cluster's line, as its standby notice counts it.
                if let Some(at) = line.line.iter().position(|u| *u == uid) {
                    member.position = u32::try_from(at).unwrap_or(u32::MAX);
                }
                if member.active && line.active != Some(uid) {
                    member.active = false;
                    member.epoch = 0;
                }
            }
        }
        described
    }

    /// A subscription with no member here: as JetStream records it.
    async fn describe_elsewhere(&self, id: &str) -> Result<Description, Error> {
        let not_found = || {
            Error::cluster(
                ErrorKind::NotFound,
                format!("subscription {id:?} not found: no member here and no JetStream consumer"),
            )
        };
        let unanswered = |why: String| {
            Error::Unavailable(format!(
                "subscription {id:?} has no member here, and JetStream did not answer for its consumer: {why}"
            ))
        };
        // Queue and singleton subscriptions share the consumer name; a BROADCAST one's is its
        // gateway's, found in the registry (the first by name if several gateways have one).
        let consumer = match self
            .any_consumer(Mode::Queue, id)
            .await
            .map_err(unanswered)?
        {
            Some(consumer) => consumer,
            None => {
                let registry = &self.inner.shared.registry;
                registry.synced(registry.ticket()).await;
                let name = registry.broadcast_consumer(id).ok_or_else(not_found)?;
                self.named_consumer(&name)
                    .await
                    .map_err(unanswered)?
                    .ok_or_else(not_found)?
            }
        };
        // As a join finds it: a consumer tinybroker did not make is named, not denied; one of
        // another subscription whose name collides is not this one.
        let spec = match names::recorded(&consumer.metadata) {
            Ok((of, spec)) if of == id => spec,
            Ok(_) => return Err(not_found()),
            Err(why) => {
                return Err(Error::cluster(
                    ErrorKind::FailedPrecondition,
                    format!(
                        "subscription {id:?} cannot use JetStream consumer {}: {why}",
                        consumer.name
                    ),
                ));
            }
        };
        Ok(self.elsewhere(id, spec, &consumer).await)
    }

    /// A subscription with no member here, from its consumer and, for a singleton, the line.
    pub(in crate::cluster::gateway) async fn elsewhere(
        &self,
        id: &str,
        spec: SubscriptionSpec,
        consumer: &ConsumerInfo,
    ) -> Description {
        let singleton = spec.mode == Mode::Singleton;
        let mut described = without_members(id, spec, consumer);
        if singleton {
            self.cluster_line(&mut described).await;
        }
        described
    }

    /// A singleton's active member and epoch as the coordination bucket holds its line (read
    /// from the bucket's leader), and the line; left as they are, and `None`, when nobody is in
    /// it or the servers do not answer.
    async fn cluster_line(&self, described: &mut Description) -> Option<values::SubValue> {
        let line = self
            .inner
            .backplane
            .get(&values::sub_key(&described.view.subscription_id))
            .await;
        if let Ok(Some(entry)) = line
            && let Some(value) = entry.value
            && let Ok(line) = serde_json::from_slice::<values::SubValue>(&value)
        {
            described.view.epoch = line.epoch;
            described.active_member = Some(line.active.map_or(0, |a| a.member));
            described.active_metadata = Some(std::sync::Arc::from(line.active_meta()));
            return Some(line);
        }
        None
    }

    /// SINGLETON subscription `id`'s consumer as the servers report it now; `None` when there
    /// is none (a watch of its leadership ends then).
    ///
    /// # Errors
    /// Why the servers did not answer.
    pub(in crate::cluster::gateway) async fn singleton_consumer(
        &self,
        id: &str,
    ) -> Result<Option<ConsumerInfo>, String> {
        self.consumer_backlog(Mode::Singleton, id).await
    }

    /// The subscription's consumer as the servers report it now; `None` when there is none
    /// (or the one of that name records another subscription).
    ///
    /// # Errors
    /// Why the servers did not answer.
    async fn consumer_backlog(&self, mode: Mode, id: &str) -> Result<Option<ConsumerInfo>, String> {
        Ok(self
            .any_consumer(mode, id)
            .await?
            .filter(|info| names::recorded(&info.metadata).is_ok_and(|(of, _)| of == id)))
    }

    /// The consumer of the subscription's name, whatever its metadata records.
    ///
    /// # Errors
    /// Why the servers did not answer.
    async fn any_consumer(&self, mode: Mode, id: &str) -> Result<Option<ConsumerInfo>, String> {
        self.named_consumer(&names::consumer_name(mode, id, &self.inner.id))
            .await
            .inspect_err(|_| tracing::debug!(subscription = id, "no consumer info"))
    }

    /// The consumer named `name`, as the servers report it now ([`named_consumer`](crate::cluster::gateway::wire::stream::named_consumer)).
    async fn named_consumer(&self, name: &str) -> Result<Option<ConsumerInfo>, String> {
        crate::cluster::gateway::wire::stream::named_consumer(
            self.inner.shared.stream.as_ref(),
            name,
        )
        .await
    }
}

pub(in crate::cluster::gateway) fn backlog(info: &ConsumerInfo) -> UpstreamBacklog {
    UpstreamBacklog {
        consumer: info.name.clone(),
        pending: info.pending,
        unacked: info.ack_pending,
        redelivered: info.redelivered,
    }
}

/// A subscription with no member here, from its consumer alone.
pub(in crate::cluster::gateway) fn without_members(
    id: &str,
    spec: SubscriptionSpec,
    consumer: &ConsumerInfo,
) -> Description {
    Description {
        upstream: Some(backlog(consumer)),
        ..Description::from(SubscriptionView {
            subscription_id: id.into(),
            spec,
            members: Vec::new(),
            epoch: 0,
            queued_messages: 0,
            queued_bytes: 0,
            in_flight: 0,
            counters: Default::default(),
            expires_in: None,
            metadata: Default::default(),
            stepping_down: None,
            joined_unix_ms: Default::default(),
        })
    }
}
