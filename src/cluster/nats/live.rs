//! [`Backplane::live_keys`](crate::cluster::backplane::Backplane::live_keys) over the bucket's
//! stream: which keys under a prefix hold a value now (a delete reads the gateways' leases so).
//!
//! A bucket whose keys are made once, renewed, then deleted for good (a gateway's lease) holds
//! far more deletions than live keys: every incarnation that ever ran left its delete marker.
//! So the keys are read in bulk through an ordered consumer of their subjects (their last
//! message each, headers only), which streams tens of thousands a second, deleted once read.
//! Such a consumer is served by any replica of the stream, which may be behind the leader.
//! Behind can only hide a key made recently (a replica that shows a key live shows it live
//! only if it was; a deletion it has not seen yet keeps the key listed, which is the safe side
//! for a delete: it waits for an answer rather than go past a member). So the stream's leader
//! then names every subject it holds under the prefix, and any the consumer did not bring is
//! read from the leader.

use std::{collections::BTreeMap, time::Duration};

use async_nats::jetstream::{
    consumer::{DeliverPolicy, ReplayPolicy, push::OrderedConfig},
    stream::LastRawMessageErrorKind,
};
use tokio_stream::StreamExt;

use super::{NatsBackplane, decode_key, is_deletion, unavailable, watch_filters};
use crate::cluster::backplane::KvError;

/// How long the read's consumer is given to be deleted (one left behind goes by itself once
/// idle).
const DELETE_PATIENCE: Duration = Duration::from_secs(2);

impl NatsBackplane {
    /// Every key under `prefix` whose last message is a value, in key order.
    pub(super) async fn live_keys_under(&self, prefix: &str) -> Result<Vec<String>, KvError> {
        let filters: Vec<String> = watch_filters(prefix)
            .into_iter()
            .map(|filter| format!("{}{filter}", self.prefix))
            .collect();
        let seen = self.last_of_each(&filters).await?;
        // The leader's list, taken after the bulk read: every subject made before it.
        let mut unseen = Vec::new();
        for filter in &filters {
            let mut listed = self
                .store
                .stream
                .info_with_subjects(filter.clone())
                .await
                .map_err(|e| unavailable("list the keys", e))?;
            while let Some(subject) = listed.next().await {
                let (subject, _) = subject.map_err(|e| unavailable("list the keys", e))?;
                if !seen.contains_key(&subject) {
                    unseen.push(subject);
                }
            }
        }
        let mut live: Vec<String> = seen
            .into_iter()
            .filter(|(_, live)| *live)
            .map(|(subject, _)| subject)
            .collect();
        for subject in unseen {
            // From the leader (not a direct get, which any replica answers).
            match self
                .store
                .stream
                .get_last_raw_message_by_subject(&subject)
                .await
            {
                Ok(message) if !is_deletion(&message.headers) => live.push(subject),
                Ok(_) => {}
                Err(error) if error.kind() == LastRawMessageErrorKind::NoMessageFound => {}
                Err(error) => return Err(unavailable("read a key", error)),
            }
        }
        let mut keys: Vec<String> = live
            .iter()
            .filter_map(|subject| subject.strip_prefix(&self.prefix))
            .map(decode_key)
            .filter(|key| key.starts_with(prefix))
            .collect();
        keys.sort();
        keys.dedup();
        Ok(keys)
    }

    /// Every subject matching `filters` a consumer of the bucket's stream holds, and whether
    /// its last message is a value (not a deletion). The consumer is deleted once read.
    async fn last_of_each(&self, filters: &[String]) -> Result<BTreeMap<String, bool>, KvError> {
        let stream = &self.store.stream;
        let consumer = stream
            .create_consumer(OrderedConfig {
                deliver_subject: self.js.client().new_inbox(),
                description: Some(
                    "tinybroker: a read of the coordination bucket's live keys".into(),
                ),
                filter_subjects: filters.to_vec(),
                headers_only: true,
                replay_policy: ReplayPolicy::Instant,
                deliver_policy: DeliverPolicy::LastPerSubject,
                ..Default::default()
            })
            .await
            .map_err(|e| unavailable("read the keys", e))?;
        let name = consumer.cached_info().name.clone();
        let pending = consumer.cached_info().num_pending;
        let read = async {
            let mut seen = BTreeMap::new();
            if pending == 0 {
                return Ok(seen);
            }
            let mut messages = consumer
                .messages()
                .await
                .map_err(|e| unavailable("read the keys", e))?;
            while let Some(message) = messages.next().await {
                let message = message.map_err(|e| unavailable("read the keys", e))?;
                let live = !message.headers.as_ref().is_some_and(is_deletion);
                seen.insert(message.subject.to_string(), live);
                let info = message
                    .info()
                    .map_err(|e| unavailable("read the keys", e))?;
                if info.pending == 0 {
                    return Ok(seen);
                }
            }
            Err(unavailable(
                "read the keys",
                "the read ended before it was done",
            ))
        };
        let seen = read.await;
        let stream = stream.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(DELETE_PATIENCE, stream.delete_consumer(&name)).await;
        });
        seen
    }
}
