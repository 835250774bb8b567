//! Asking every gateway at once over NATS (a delete's count, an announcement): one request on
//! a subject every gateway subscribes to, answered by each on the request's inbox, gathered
//! until every gateway expected answered or the patience ran out.

use std::{collections::BTreeSet, time::Duration};

use serde::de::DeserializeOwned;
use tokio_stream::StreamExt;

/// What came back: the answers, and the gateways expected that did not answer in time.
pub(in crate::cluster::gateway) struct Gathered<T> {
    pub(in crate::cluster::gateway) answers: Vec<T>,
    pub(in crate::cluster::gateway) silent: BTreeSet<u64>,
}

/// Sends `body` on `subject` and gathers JSON answers (`gateway_of` names each one's gateway)
/// until every gateway of `expected` answered, for `patience` at most. Answers that do not
/// parse, or from a gateway not expected, are left out.
///
/// # Errors
/// The request could not be sent (NATS unreachable).
pub(in crate::cluster::gateway) async fn gather<T: DeserializeOwned>(
    bus: &dyn crate::cluster::bus::Bus,
    subject: String,
    body: bytes::Bytes,
    expected: BTreeSet<u64>,
    patience: Duration,
    gateway_of: impl Fn(&T) -> u64,
) -> Result<Gathered<T>, String> {
    let inbox = bus.new_inbox();
    let mut replies = bus.subscribe(&inbox).await.map_err(|e| e.to_string())?;
    bus.publish_with_reply(&subject, &inbox, body)
        .await
        .map_err(|e| e.to_string())?;
    let mut silent = expected;
    let mut answers = Vec::new();
    let deadline = tokio::time::Instant::now() + patience;
    while !silent.is_empty() {
        match tokio::time::timeout_at(deadline, replies.next()).await {
            Ok(Some(reply)) => {
                if let Ok(answer) = serde_json::from_slice::<T>(&reply.payload)
                    && silent.remove(&gateway_of(&answer))
                {
                    answers.push(answer);
                }
            }
            Ok(None) | Err(_) => break,
        }
    }
    Ok(Gathered { answers, silent })
}
