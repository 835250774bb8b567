//! A fenced publish (docs/semantics.md#cluster-fenced-publish): stored only while the fence's
//! epoch leads, which JetStream checks against the subscription's fence record (written by the
//! singleton shell, [`Fences`](crate::cluster::gateway::control::fence::Fences)) as the publish's expected last subject sequence.

use std::sync::Arc;

use crate::cluster::gateway::{
    Shared,
    control::fence::{Record, unavailable},
    data::publish::{self, Expect, Expected, publish_expecting},
    wire::{names, stream::named_consumer},
};
use crate::{
    broker::{BatchError, Published},
    core::{Draft, Error, Mode, PublishFence},
};

/// Publishes `draft`, fenced by `fence`: stored only while the record of the fence's
/// epoch, active, is the fence subject's last; otherwise refused naming the record there.
///
/// # Errors
/// [`Error::Fenced`] for another epoch (or one that ended), [`Error::SubscriptionNotFound`]
/// or [`Error::NotSingleton`] for a fence naming no SINGLETON subscription, and what any
/// publish may get.
pub(in crate::cluster::gateway) async fn publish(
    shared: &Arc<Shared>,
    draft: Draft,
    fence: &PublishFence,
) -> Result<Published, Error> {
    let fences = &shared.fences;
    let subject = names::fence_subject(fences.name(), &fence.subscription_id);
    let turn = fences.turn(&subject);
    let _turn = turn.lock().await;
    let wanted = Record::active(fence.epoch);
    let known = fences.known(&subject);
    let (sequence, record) = match known {
        Some((sequence, record)) if record == wanted => (sequence, record),
        _ => match fences.read(&subject).await.map_err(unavailable)? {
            Some(found) => found,
            None => return Err(no_record(shared, fence).await),
        },
    };
    if record != wanted {
        return Err(refusal(shared, fence, record).await);
    }
    let expect = Expect {
        subject: subject.clone(),
        sequence,
    };
    match publish_expecting(shared, draft, expect).await {
        Err(Expected::Moved) => {
            // A later record came: say which.
            let now = fences.read(&subject).await.map_err(unavailable)?;
            Err(match now {
                Some((_, record)) => refusal(shared, fence, record).await,
                None => no_record(shared, fence).await,
            })
        }
        Err(Expected::Failed(error)) => Err(error),
        Ok(published) => Ok(published),
    }
}

/// The refusal of a fence whose epoch is not the record's active one.
async fn refusal(shared: &Arc<Shared>, fence: &PublishFence, record: Record) -> Error {
    if record.ended
        && let Some(refusal) = not_singleton(shared, &fence.subscription_id).await
    {
        // Ended, and deleted or expired since.
        return refusal;
    }
    Error::Fenced {
        subscription: fence.subscription_id.to_string(),
        epoch: fence.epoch,
        current: record.epoch,
        active: !record.ended,
    }
}

/// The refusal of a fence whose subscription has no record: its line (this gateway's
/// copy) names the epoch now; with no line, no SINGLETON subscription of that id, or one
/// no member leads.
async fn no_record(shared: &Arc<Shared>, fence: &PublishFence) -> Error {
    // The line names the epoch now: a member confirmed while the stream was full has no
    // record until there is room.
    let line = shared.singletons.line(fence.subscription_id.clone()).await;
    match line {
        Some((true, epoch)) if epoch == fence.epoch => Error::Unavailable(format!(
            "epoch {epoch} of subscription {:?} leads, but its fence record is not stored yet (the stream was full when it began: it is written once there is room); no publish it fences is taken until then; nothing was stored: try again",
            fence.subscription_id
        )),
        Some((active, current)) => Error::Fenced {
            subscription: fence.subscription_id.to_string(),
            epoch: fence.epoch,
            current,
            active,
        },
        None => not_singleton(shared, &fence.subscription_id)
            .await
            .unwrap_or_else(|| Error::Fenced {
                subscription: fence.subscription_id.to_string(),
                epoch: fence.epoch,
                current: 0,
                active: false,
            }),
    }
}

/// Why `subscription` is not a SINGLETON subscription of this cluster, if it is not: none of
/// that id ([`Error::SubscriptionNotFound`]) or one of another mode ([`Error::NotSingleton`]).
async fn not_singleton(shared: &Arc<Shared>, subscription: &str) -> Option<Error> {
    let name = names::consumer_name(Mode::Singleton, subscription, "");
    match named_consumer(shared.stream.as_ref(), &name).await {
        Ok(Some(info)) => match names::recorded(&info.metadata) {
            Ok((id, spec)) if id == subscription && spec.mode == Mode::Singleton => None,
            Ok((id, spec)) if id == subscription => Some(Error::NotSingleton {
                subscription: subscription.to_string(),
                mode: spec.mode,
            }),
            _ => Some(Error::SubscriptionNotFound(subscription.to_string())),
        },
        Ok(None) => {
            // A BROADCAST subscription's consumers are per gateway: the registry knows them.
            shared.registry.refresh().await;
            Some(if shared.registry.exists(subscription) {
                Error::NotSingleton {
                    subscription: subscription.to_string(),
                    mode: Mode::Broadcast,
                }
            } else {
                Error::SubscriptionNotFound(subscription.to_string())
            })
        }
        Err(error) => Some(unavailable(error)),
    }
}

/// A batch with a fenced message: each message published and confirmed before the next is
/// sent (a fenced one is checked as JetStream stores it, which a pipelined message after it
/// would not wait for), stopping at the first refusal.
///
/// # Errors
/// The messages confirmed before the first refusal, and that refusal.
pub(in crate::cluster::gateway) async fn publish_one_by_one(
    shared: &Arc<Shared>,
    drafts: Vec<Draft>,
) -> Result<Vec<Published>, BatchError> {
    let mut published = Vec::with_capacity(drafts.len());
    for draft in drafts {
        let outcome = match draft.fence().cloned() {
            Some(fence) => publish(shared, draft, &fence).await,
            None => publish::publish(shared, draft).await,
        };
        match outcome {
            Ok(one) => published.push(one),
            Err(error) => return Err(BatchError { published, error }),
        }
    }
    Ok(published)
}
