//! Validation, once, at the edge: protobuf requests become domain types ([`Draft`],
//! [`OpenRequest`], [`Fence`]) or an [`Error`] naming what is wrong (docs/semantics.md#joining-rules "Validation").

use std::sync::Arc;

use crate::{
    broker::{ConnectionId, Fence},
    core::{
        AckMode, Draft, Envelope, Error, Headers, Limits, MAX_METADATA_BYTES, MemberOptions, Mode,
        OpenRequest, Overflow, Pattern, Proclamation, PublishFence, SubscriptionSpec, Topic,
    },
    pb,
};

/// The window an ack-free member gets when it asks for none: deep enough that writing, not
/// the window, sets the pace.
pub const ACK_FREE_DEFAULT_WINDOW: u32 = 256;

fn invalid(message: impl Into<String>) -> Error {
    Error::InvalidArgument(message.into())
}

fn check_name(field: &str, value: &str, limits: &Limits) -> Result<(), Error> {
    if value.len() > limits.max_name_bytes {
        return Err(invalid(format!(
            "{field} is {} bytes, longer than the limit of {}",
            value.len(),
            limits.max_name_bytes
        )));
    }
    if value.chars().any(char::is_control) {
        return Err(invalid(format!("{field} contains a control character")));
    }
    Ok(())
}

/// Validates the `subscription_id` an Ack, Nack or DescribeSubscription names: required,
/// within `max_name_bytes`, no control characters, as `Subscribe` requires.
///
/// # Errors
/// [`Error::InvalidArgument`] naming the problem.
pub fn check_subscription_id(subscription_id: &str, limits: &Limits) -> Result<(), Error> {
    if subscription_id.is_empty() {
        return Err(invalid("subscription_id is required"));
    }
    check_name("subscription_id", subscription_id, limits)
}

/// Checks a member's metadata against [`MAX_METADATA_BYTES`] (docs/semantics.md#member-metadata).
fn check_metadata(metadata: &str) -> Result<(), Error> {
    if metadata.len() > MAX_METADATA_BYTES {
        return Err(invalid(format!(
            "metadata is {} bytes, over the limit of {MAX_METADATA_BYTES}",
            metadata.len()
        )));
    }
    Ok(())
}

/// Validates a `Proclaim` request.
///
/// # Errors
/// [`Error::InvalidArgument`] naming the missing or oversized field.
pub fn proclamation(request: pb::ProclaimRequest, limits: &Limits) -> Result<Proclamation, Error> {
    check_subscription_id(&request.subscription_id, limits)?;
    if request.member_id == 0 {
        return Err(invalid(
            "member_id is required: the active member's id from its confirmation",
        ));
    }
    if request.epoch == 0 {
        return Err(invalid(
            "epoch is required: the epoch of the active member's confirmation",
        ));
    }
    check_metadata(&request.metadata)?;
    Ok(Proclamation {
        subscription_id: request.subscription_id,
        member: request.member_id,
        epoch: request.epoch,
        metadata: std::sync::Arc::from(request.metadata),
    })
}

/// Page size of `ListSubscriptions` when the request gives none.
pub const DEFAULT_PAGE_SIZE: usize = 100;
/// Largest page of `ListSubscriptions`; larger requests get this many.
pub const MAX_PAGE_SIZE: usize = 1000;

/// Validates a `ListSubscriptions` request into (start after this id, page size).
///
/// # Errors
/// [`Error::InvalidArgument`] for a page token that no listing could have returned.
pub fn page(
    request: &pb::ListSubscriptionsRequest,
    limits: &Limits,
) -> Result<(Option<String>, usize), Error> {
    let size = match request.page_size as usize {
        0 => DEFAULT_PAGE_SIZE,
        n => n.min(MAX_PAGE_SIZE),
    };
    let after = match request.page_token.as_str() {
        "" => None,
        token => {
            check_name("page_token", token, limits)
                .map_err(|_| invalid("page_token is not a token a listing returned"))?;
            Some(token.to_string())
        }
    };
    Ok((after, size))
}

/// Validates a publish request into a [`Draft`].
///
/// # Errors
/// [`Error::InvalidTopic`] or [`Error::MessageTooLarge`].
pub fn draft(request: pb::PublishRequest, limits: &Limits) -> Result<Draft, Error> {
    draft_reusing(request, limits, &mut None)
}

/// As [`draft`], reusing `recent`'s envelope when the request names the same topic and headers,
/// else its topic when the topic is the same (and remembering this draft's envelope): a stream or
/// batch publishing to one topic then shares one envelope, or at least one topic allocation,
/// among all its queued messages.
///
/// # Errors
/// As [`draft`].
pub fn draft_reusing(
    request: pb::PublishRequest,
    limits: &Limits,
    recent: &mut Option<Envelope>,
) -> Result<Draft, Error> {
    let fence = publish_fence(request.fence, limits)?;
    let headers: Headers = request.headers.into_iter().collect();
    let same_topic = recent
        .as_ref()
        .filter(|envelope| envelope.topic().as_str() == request.topic);
    if let Some(envelope) = same_topic.filter(|envelope| *envelope.headers() == headers) {
        return Draft::in_envelope(envelope.clone(), &request.payload, limits)
            .map(|draft| draft.fenced(fence));
    }
    let topic = match same_topic {
        Some(envelope) => envelope.topic().clone(),
        None => Topic::parse(&request.topic)?,
    };
    let draft = Draft::new(topic, request.payload, headers, limits)?;
    *recent = Some(draft.envelope().clone());
    Ok(draft.fenced(fence))
}

/// Validates a publish's fence (docs/semantics.md#fenced-publish): a subscription id and an
/// epoch above 0, or none at all.
///
/// # Errors
/// [`Error::InvalidArgument`] naming the field.
fn publish_fence(
    fence: Option<pb::PublishFence>,
    limits: &Limits,
) -> Result<Option<PublishFence>, Error> {
    let Some(fence) = fence else {
        return Ok(None);
    };
    if fence.subscription_id.is_empty() {
        return Err(invalid(
            "fence.subscription_id is required in a fenced publish (leave fence unset to publish unfenced)",
        ));
    }
    check_name("fence.subscription_id", &fence.subscription_id, limits)?;
    if fence.epoch == 0 {
        return Err(invalid(
            "fence.epoch must be the epoch of the publisher's confirmation (no member is ever active with epoch 0)",
        ));
    }
    Ok(Some(PublishFence {
        subscription_id: Arc::from(fence.subscription_id),
        epoch: fence.epoch,
    }))
}

/// Validates an `OpenSubscription` (docs/semantics.md#joining-rules "Validation").
///
/// # Errors
/// [`Error::InvalidArgument`], [`Error::InvalidPattern`] or [`Error::InvalidTopic`] naming the
/// problem.
pub fn open_request(request: pb::OpenSubscription, limits: &Limits) -> Result<OpenRequest, Error> {
    if request.subscription_id.is_empty() {
        return Err(invalid("subscription_id is required"));
    }
    check_name("subscription_id", &request.subscription_id, limits)?;
    let mode = match pb::DeliveryMode::try_from(request.mode) {
        Ok(pb::DeliveryMode::Broadcast) => Mode::Broadcast,
        Ok(pb::DeliveryMode::Queue) => Mode::Queue,
        Ok(pb::DeliveryMode::Singleton) => Mode::Singleton,
        Ok(pb::DeliveryMode::Unspecified) => {
            return Err(invalid(
                "mode is required: DELIVERY_MODE_BROADCAST, DELIVERY_MODE_QUEUE or DELIVERY_MODE_SINGLETON",
            ));
        }
        Err(_) => {
            return Err(invalid(format!(
                "mode {} is not a known DeliveryMode",
                request.mode
            )));
        }
    };
    if request.topic_patterns.is_empty() {
        return Err(invalid("topic_patterns needs at least one pattern"));
    }
    if request.topic_patterns.len() > limits.max_patterns {
        return Err(invalid(format!(
            "{} topic_patterns, more than the limit of {}",
            request.topic_patterns.len(),
            limits.max_patterns
        )));
    }
    let mut patterns = request
        .topic_patterns
        .iter()
        .map(|p| Pattern::parse(p))
        .collect::<Result<Vec<_>, _>>()?;
    patterns.sort();
    patterns.dedup();
    if mode != Mode::Broadcast && request.consumer_group.is_empty() {
        return Err(invalid(format!(
            "consumer_group is required in {mode} mode"
        )));
    }
    check_name("consumer_group", &request.consumer_group, limits)?;
    if request.max_in_flight > limits.max_in_flight {
        return Err(invalid(format!(
            "max_in_flight {} is over the limit of {}",
            request.max_in_flight, limits.max_in_flight
        )));
    }
    if request.notify_standby && mode != Mode::Singleton {
        return Err(invalid(
            "notify_standby only applies to DELIVERY_MODE_SINGLETON",
        ));
    }
    if request.priority > 0 && mode != Mode::Singleton {
        return Err(invalid(
            "priority only applies to DELIVERY_MODE_SINGLETON (it orders the line of standbys)",
        ));
    }
    check_metadata(&request.metadata)?;
    if !request.metadata.is_empty() && mode != Mode::Singleton {
        return Err(invalid(
            "metadata only applies to DELIVERY_MODE_SINGLETON (it names the leader to watchers)",
        ));
    }
    let ack_mode = match pb::AckMode::try_from(request.ack_mode) {
        Ok(pb::AckMode::Unspecified | pb::AckMode::Explicit) => AckMode::Explicit,
        Ok(pb::AckMode::None) => AckMode::None,
        Err(_) => {
            return Err(invalid(format!(
                "ack_mode {} is not a known AckMode",
                request.ack_mode
            )));
        }
    };
    let overflow = match pb::OverflowPolicy::try_from(request.overflow) {
        Ok(pb::OverflowPolicy::Unspecified) if ack_mode == AckMode::None => Overflow::DropOldest,
        Ok(pb::OverflowPolicy::Unspecified | pb::OverflowPolicy::RejectPublish)
            if ack_mode == AckMode::None =>
        {
            return Err(invalid(
                "ACK_MODE_NONE needs OVERFLOW_POLICY_DROP_OLDEST: an ack-free member that falls behind must not block publishers to every subscription on its topics",
            ));
        }
        Ok(pb::OverflowPolicy::Unspecified | pb::OverflowPolicy::RejectPublish) => {
            Overflow::RejectPublish
        }
        Ok(pb::OverflowPolicy::DropOldest) => Overflow::DropOldest,
        Err(_) => {
            return Err(invalid(format!(
                "overflow {} is not a known OverflowPolicy",
                request.overflow
            )));
        }
    };
    if ack_mode == AckMode::None && request.max_delivery_attempts != 0 {
        return Err(invalid(
            "max_delivery_attempts does not apply to ACK_MODE_NONE: an ack-free message is delivered once",
        ));
    }
    let max_in_flight = match request.max_in_flight {
        0 if ack_mode == AckMode::None => ACK_FREE_DEFAULT_WINDOW.min(limits.max_in_flight),
        0 => 1,
        n => n,
    };
    let dead_letter_topic = match request.dead_letter_topic.as_str() {
        "" => None,
        text => Some(Topic::parse(text).map_err(|e| invalid(format!("dead_letter_topic: {e}")))?),
    };
    Ok(OpenRequest {
        subscription_id: request.subscription_id,
        spec: SubscriptionSpec {
            mode,
            consumer_group: request.consumer_group,
            patterns,
            max_delivery_attempts: request.max_delivery_attempts,
            dead_letter_topic,
            ack_mode,
            overflow,
        },
        member: MemberOptions {
            max_in_flight,
            notify_standby: request.notify_standby,
            priority: request.priority,
        },
        metadata: std::sync::Arc::from(request.metadata),
    })
}

/// Validates the identifying fields of an Ack or Nack and picks its fence: the `member_id` it
/// names, or else the connection it arrived on (docs/semantics.md#connection-fence: the seed's two-field Ack).
///
/// # Errors
/// [`Error::InvalidArgument`] naming the missing field.
pub fn fence(
    subscription_id: &str,
    system_id: u64,
    member_id: u64,
    connection: Option<ConnectionId>,
) -> Result<Fence, Error> {
    if subscription_id.is_empty() {
        return Err(invalid("subscription_id is required"));
    }
    if system_id == 0 {
        return Err(invalid("system_id is required"));
    }
    match (member_id, connection) {
        (0, Some(connection)) => Ok(Fence::Connection(connection)),
        (0, None) => Err(invalid(
            "member_id is required on this transport: pass the member_id from your confirmation frame",
        )),
        (member, _) => Ok(Fence::Member(member)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A stream to one topic shares one envelope (else each queued message would carry its own,
    // about 50 bytes more: `bench fill`); other headers or another topic get their own, with
    // the topic's allocation still shared when only the headers differ.
    #[test]
    fn a_stream_to_one_topic_shares_one_envelope() {
        let limits = Limits::default();
        let mut recent = None;
        let mut draft = |topic: &str, headers: &[(&str, &str)]| {
            let request = pb::PublishRequest {
                topic: topic.into(),
                payload: vec![1, 2, 3].into(),
                headers: headers
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                fence: None,
            };
            draft_reusing(request, &limits, &mut recent).unwrap()
        };
        let first = draft("a.b", &[]);
        let second = draft("a.b", &[]);
        assert!(first.envelope().is_shared_with(second.envelope()));
        assert_eq!(second.payload(), [1, 2, 3]);
        let with_headers = draft("a.b", &[("k", "v")]);
        assert!(!with_headers.envelope().is_shared_with(first.envelope()));
        assert_eq!(with_headers.envelope().headers().len(), 1);
        let again = draft("a.b", &[("k", "v")]);
        assert!(again.envelope().is_shared_with(with_headers.envelope()));
        let other = draft("a.c", &[]);
        assert_eq!(other.topic().as_str(), "a.c");
        assert!(!other.envelope().is_shared_with(first.envelope()));
        assert!(
            draft("a.c", &[])
                .envelope()
                .is_shared_with(other.envelope())
        );
    }

    #[test]
    fn subscription_ids_are_checked_like_subscribe_checks_them() {
        let limits = Limits::default();
        assert!(check_subscription_id("orders", &limits).is_ok());
        assert!(check_subscription_id("", &limits).is_err());
        assert!(check_subscription_id("a\nb", &limits).is_err());
        let long = "x".repeat(limits.max_name_bytes + 1);
        let error = check_subscription_id(&long, &limits).unwrap_err();
        assert!(
            error.to_string().len() < 200,
            "the error does not echo the id"
        );
    }

    #[test]
    fn page_size_defaults_and_caps_and_tokens_are_checked() {
        let limits = Limits::default();
        let request = |page_size, token: &str| pb::ListSubscriptionsRequest {
            page_size,
            page_token: token.into(),
        };
        assert_eq!(
            page(&request(0, ""), &limits).unwrap(),
            (None, DEFAULT_PAGE_SIZE)
        );
        assert_eq!(
            page(&request(5000, "sub-9"), &limits).unwrap(),
            (Some("sub-9".into()), MAX_PAGE_SIZE)
        );
        assert!(page(&request(10, "bad\u{0}token"), &limits).is_err());
        let long = "x".repeat(limits.max_name_bytes + 1);
        assert!(page(&request(10, &long), &limits).is_err());
    }
}
