//! `DescribeSubscription` through a gateway. What the gateway holds (its members, its local
//! queue, its counters) comes from its broker as on an embedded broker; what JetStream holds for
//! the subscription comes from its consumer (`upstream`). A QUEUE or SINGLETON subscription is
//! described at every gateway, also one where it has no member: its settings from its
//! consumer's metadata, its backlog from the consumer, and a singleton's active member and
//! epoch from the coordination bucket. A BROADCAST subscription's consumer is its gateway's
//! own, so it is described there only.

use async_nats::jetstream::{consumer, context::ConsumerInfoErrorKind};
use tonic::Status;

use super::{Gateway, names};
use crate::{
    broker::SubscriptionView,
    cluster::{backplane::Backplane, values},
    core::{Error, Mode},
    pb,
    service::{self, info},
};

/// How long a Describe waits for the servers' view of the consumer.
const PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);

impl Gateway {
    /// The subscription as this gateway sees it, with its JetStream consumer's backlog.
    ///
    /// # Errors
    /// `NOT_FOUND` when neither this gateway nor JetStream has it.
    pub async fn describe(&self, subscription_id: &str) -> Result<pb::SubscriptionInfo, Status> {
        match self.inner.shared.broker.describe(subscription_id) {
            Ok(view) => {
                let mode = view.spec.mode;
                let mut described = info(view);
                // Unset when the servers do not answer: the local view still stands.
                let consumer = self.consumer_backlog(mode, subscription_id).await;
                let answered = consumer.is_ok();
                described.upstream = consumer.ok().flatten().map(|c| backlog(&c));
                // A gateway holding only standbys knows the cluster's active member and epoch
                // from the bucket, as one with no member does (not asked when the servers just
                // did not answer: the answer would only wait longer).
                if answered && mode == Mode::Singleton && described.active_member_id == 0 {
                    self.cluster_line(&mut described).await;
                }
                Ok(described)
            }
            Err(Error::SubscriptionNotFound(_)) => self.describe_elsewhere(subscription_id).await,
            Err(e) => Err(service::status(&e)),
        }
    }

    /// A subscription with no member here: as JetStream records it.
    async fn describe_elsewhere(&self, id: &str) -> Result<pb::SubscriptionInfo, Status> {
        let not_found = || {
            Status::not_found(service::cap_message(format!(
                "subscription {id:?} not found: no member here and no JetStream consumer (a BROADCAST subscription is described at the gateway of its member)"
            )))
        };
        // Queue and singleton subscriptions share the consumer name.
        let consumer = self
            .any_consumer(Mode::Queue, id)
            .await
            .map_err(|why| {
                Status::unavailable(service::cap_message(format!(
                    "subscription {id:?} has no member here, and JetStream did not answer for its consumer: {why}"
                )))
            })?
            .ok_or_else(not_found)?;
        // As a join finds it: a consumer tinybroker did not make is named, not denied; one of
        // another subscription whose name collides is not this one.
        let spec = match names::recorded(&consumer.config.metadata) {
            Ok((of, spec)) if of == id => spec,
            Ok(_) => return Err(not_found()),
            Err(why) => {
                return Err(Status::failed_precondition(service::cap_message(format!(
                    "subscription {id:?} cannot use JetStream consumer {}: {why}",
                    consumer.name
                ))));
            }
        };
        let mode = spec.mode;
        let mut described = info(SubscriptionView {
            subscription_id: id.into(),
            spec,
            members: Vec::new(),
            epoch: 0,
            queued_messages: 0,
            queued_bytes: 0,
            in_flight: 0,
            counters: Default::default(),
            expires_in: None,
        });
        described.upstream = Some(backlog(&consumer));
        if mode == Mode::Singleton {
            self.cluster_line(&mut described).await;
        }
        Ok(described)
    }

    /// A singleton's active member and epoch as the coordination bucket holds its line; left
    /// as they are when nobody is in it or the servers do not answer.
    async fn cluster_line(&self, described: &mut pb::SubscriptionInfo) {
        let line = self
            .inner
            .backplane
            .get(&values::sub_key(&described.subscription_id))
            .await;
        if let Ok(Some(entry)) = line
            && let Some(value) = entry.value
            && let Ok(line) = serde_json::from_slice::<values::SubValue>(&value)
        {
            described.epoch = line.epoch;
            described.active_member_id = line.active.map_or(0, |a| a.member);
        }
    }

    /// The subscription's consumer as the servers report it now; `None` when there is none
    /// (or the one of that name records another subscription).
    ///
    /// # Errors
    /// Why the servers did not answer.
    async fn consumer_backlog(
        &self,
        mode: Mode,
        id: &str,
    ) -> Result<Option<consumer::Info>, String> {
        Ok(self
            .any_consumer(mode, id)
            .await?
            .filter(|info| names::recorded(&info.config.metadata).is_ok_and(|(of, _)| of == id)))
    }

    /// The consumer of the subscription's name, whatever its metadata records.
    ///
    /// # Errors
    /// Why the servers did not answer.
    async fn any_consumer(&self, mode: Mode, id: &str) -> Result<Option<consumer::Info>, String> {
        let name = names::consumer_name(mode, id, &self.inner.id);
        // JetStream's API requests wait the NATS client's request timeout (10 s), not the
        // context's: bound this one as an ack forwarded to another gateway is.
        let info = tokio::time::timeout(PATIENCE, self.inner.stream.consumer_info(&name))
            .await
            .map_err(|_| format!("no answer within {PATIENCE:?}"))?;
        match info {
            Ok(info) => Ok(Some(info)),
            Err(error) if matches!(error.kind(), ConsumerInfoErrorKind::NotFound) => Ok(None),
            Err(error) => {
                tracing::debug!(subscription = id, consumer = %name, %error, "no consumer info");
                Err(error.to_string())
            }
        }
    }
}

fn backlog(info: &consumer::Info) -> pb::UpstreamBacklog {
    pb::UpstreamBacklog {
        consumer: info.name.clone(),
        pending: info.num_pending,
        unacked: info.num_ack_pending as u64,
        redelivered: info.num_redelivered as u64,
    }
}
