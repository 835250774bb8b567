//! The tonic service: translates protobuf to domain types (validating once, here), calls the
//! broker, and maps every [`Error`] to a gRPC status in one place ([`status`]). The streaming
//! carriages (`Consume`, `PublishStream`) live in [`streams`].

mod streams;
pub mod wire;

use std::{
    collections::HashMap,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use prost_types::Timestamp;
use tonic::{Code, Request, Response, Status};

use crate::{
    broker::{Broker, BrokerStats, ConnectionId, Fence, MemberStream, Outbound, SubscriptionView},
    cluster::gateway::Gateway,
    core::{
        AckMode, Draft, Envelope, Error, Headers, Limits, MemberOptions, Mode, OpenRequest,
        Overflow, Pattern, SubscriptionSpec, Topic,
    },
    pb,
    server::{Signal, TransportSnapshot, TransportStats, conn::connection_of},
};

/// The window an ack-free member gets when it asks for none: deep enough that writing, not
/// the window, sets the pace.
pub const ACK_FREE_DEFAULT_WINDOW: u32 = 256;

/// The longest status message a client gets, in bytes: messages quote client input (ids,
/// topics), and an unbounded one would make a `grpc-message` header larger than any client
/// accepts, hiding the real error behind a transport one.
pub const MAX_STATUS_MESSAGE_BYTES: usize = 1024;

/// Cuts `message` to [`MAX_STATUS_MESSAGE_BYTES`] at a character boundary, marking the cut.
pub fn cap_message(mut message: String) -> String {
    if message.len() > MAX_STATUS_MESSAGE_BYTES {
        const MARK: &str = "…";
        let mut end = MAX_STATUS_MESSAGE_BYTES - MARK.len();
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push_str(MARK);
    }
    message
}

/// Maps a broker error to the gRPC status a client gets.
pub fn status(error: &Error) -> Status {
    Status::new(code(error), cap_message(error.to_string()))
}

/// The gRPC code of a broker error, without formatting its message.
pub fn code(error: &Error) -> Code {
    match error {
        Error::InvalidTopic { .. }
        | Error::InvalidPattern { .. }
        | Error::InvalidArgument(_)
        | Error::SettleTooLarge { .. } => Code::InvalidArgument,
        Error::SettingsMismatch { .. }
        | Error::NotHolder { .. }
        | Error::StaleConnection { .. }
        | Error::NotYetSent { .. }
        | Error::AckFree(_) => Code::FailedPrecondition,
        Error::BroadcastTaken(_) => Code::AlreadyExists,
        Error::SubscriptionNotFound(_) | Error::NotInFlight { .. } => Code::NotFound,
        Error::QueueFull { .. }
        | Error::MessageTooLarge { .. }
        | Error::MemoryBudget { .. }
        | Error::BatchTooLarge { .. }
        | Error::TooManySubscriptions { .. }
        | Error::TooManyWildcardShapes { .. }
        | Error::TooManyMembers { .. } => Code::ResourceExhausted,
        Error::ShuttingDown | Error::Unavailable(_) => Code::Unavailable,
    }
}

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
    let headers: Headers = request.headers.into_iter().collect();
    let same_topic = recent
        .as_ref()
        .filter(|envelope| envelope.topic().as_str() == request.topic);
    if let Some(envelope) = same_topic.filter(|envelope| *envelope.headers() == headers) {
        return Draft::in_envelope(envelope.clone(), &request.payload, limits);
    }
    let topic = match same_topic {
        Some(envelope) => envelope.topic().clone(),
        None => Topic::parse(&request.topic)?,
    };
    let draft = Draft::new(topic, request.payload, headers, limits)?;
    *recent = Some(draft.envelope().clone());
    Ok(draft)
}

/// Validates an `OpenSubscription` (SPEC §3 "Validation").
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
        },
    })
}

/// Validates the identifying fields of an Ack or Nack and picks its fence: the `member_id` it
/// names, or else the connection it arrived on (SPEC §4: the seed's two-field Ack).
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

/// Validates and publishes one message.
fn publish_one(
    broker: &Broker,
    request: pb::PublishRequest,
    recent: &mut Option<Envelope>,
) -> Result<pb::PublishResponse, Error> {
    let published = broker.publish(draft_reusing(request, broker.limits(), recent)?)?;
    Ok(pb::PublishResponse {
        system_id: published.system_id,
        queued_for: published.queued_for,
    })
}

fn mode_to_pb(mode: Mode) -> pb::DeliveryMode {
    match mode {
        Mode::Broadcast => pb::DeliveryMode::Broadcast,
        Mode::Queue => pb::DeliveryMode::Queue,
        Mode::Singleton => pb::DeliveryMode::Singleton,
    }
}

fn timestamp(unix_millis: u64) -> Timestamp {
    Timestamp {
        seconds: (unix_millis / 1000) as i64,
        nanos: ((unix_millis % 1000) * 1_000_000) as i32,
    }
}

/// Turns a domain frame into its protobuf form; an `End` becomes the stream's final status.
/// The streams write frames as [`wire::WireFrame`]s, which encode the same.
pub fn frame(outbound: Outbound) -> Result<pb::SubscriptionFrame, Status> {
    use pb::subscription_frame::Frame;
    let frame = match outbound {
        Outbound::Confirm {
            subscription_id,
            member_id,
            epoch,
        } => Frame::Confirmation(pb::Confirmation {
            subscription_id: subscription_id.to_string(),
            member_id,
            epoch,
        }),
        Outbound::Standby {
            subscription_id,
            member_id,
            position,
        } => Frame::Standby(pb::StandbyNotice {
            subscription_id: subscription_id.to_string(),
            member_id,
            position,
        }),
        Outbound::Message {
            message,
            attempt,
            epoch,
            shared: _,
        } => Frame::Message(pb::DeliveredMessage {
            system_id: message.system_id(),
            topic: message.topic().to_string(),
            payload: message.payload_bytes(),
            headers: message
                .headers()
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect::<HashMap<_, _>>(),
            delivery_attempt: attempt,
            published_at: Some(timestamp(message.published_at_ms())),
            epoch,
        }),
        Outbound::End(error) => return Err(status(&error)),
    };
    Ok(pb::SubscriptionFrame { frame: Some(frame) })
}

pub(crate) fn info(view: SubscriptionView) -> pb::SubscriptionInfo {
    let c = view.counters;
    let active_member_id = match view.spec.mode {
        Mode::Singleton => view
            .members
            .iter()
            .find(|m| m.active)
            .map_or(0, |m| m.member_id),
        _ => 0,
    };
    pb::SubscriptionInfo {
        subscription_id: view.subscription_id.to_string(),
        mode: mode_to_pb(view.spec.mode).into(),
        consumer_group: view.spec.consumer_group,
        topic_patterns: view.spec.patterns.iter().map(|p| p.to_string()).collect(),
        members: view
            .members
            .iter()
            .map(|m| pb::MemberInfo {
                member_id: m.member_id,
                active: m.active,
                epoch: m.epoch,
                in_flight: m.in_flight,
                max_in_flight: m.max_in_flight,
                position: m.position,
            })
            .collect(),
        active_member_id,
        epoch: view.epoch,
        queued_messages: view.queued_messages,
        queued_bytes: view.queued_bytes,
        in_flight: view.in_flight,
        counters: Some(pb::SubscriptionCounters {
            enqueued: c.enqueued,
            delivered: c.delivered,
            redelivered: c.redelivered,
            acked: c.acked,
            nacked: c.nacked,
            dead_lettered: c.dead_lettered,
            dropped_max_attempts: c.dropped_max_attempts,
            rejected_full: c.rejected_full,
            dropped_full: c.dropped_full,
            promotions: c.promotions,
            stale_acks: c.stale_acks,
            dropped_overflow: c.dropped_overflow,
        }),
        max_delivery_attempts: view.spec.max_delivery_attempts,
        dead_letter_topic: view
            .spec
            .dead_letter_topic
            .map(|t| t.to_string())
            .unwrap_or_default(),
        expires_in_ms: view.expires_in.map(|d| d.as_millis() as u64),
        upstream: None,
        ack_mode: match view.spec.ack_mode {
            AckMode::Explicit => pb::AckMode::Explicit,
            AckMode::None => pb::AckMode::None,
        }
        .into(),
        overflow: match view.spec.overflow {
            Overflow::RejectPublish => pb::OverflowPolicy::RejectPublish,
            Overflow::DropOldest => pb::OverflowPolicy::DropOldest,
        }
        .into(),
    }
}

fn stats(stats: BrokerStats, transport: TransportSnapshot) -> pb::BrokerCounters {
    pb::BrokerCounters {
        connections_open: transport.connections_open,
        connections_refused: transport.connections_refused,
        handshake_timeouts: transport.handshake_timeouts,
        requests_over_budget: transport.requests_over_budget,
        request_timeouts: transport.request_timeouts,
        published: stats.published,
        unrouted: stats.unrouted,
        rejected_publishes: stats.rejected_publishes,
        subscriptions_expired: stats.subscriptions_expired,
        messages_expired: stats.messages_expired,
        subscriptions: stats.subscriptions,
        members: stats.members,
        memory_accounted_bytes: stats.memory_accounted_bytes,
        max_memory_bytes: stats.max_memory_bytes,
    }
}

/// A member's stream as protobuf frames.
#[derive(Debug)]
pub struct FrameStream(MemberStream);

impl futures_core::Stream for FrameStream {
    type Item = Result<wire::WireFrame, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.0)
            .poll_next(cx)
            .map(|o| o.map(wire::WireFrame::of))
    }
}

/// The `tinybroker.v1.Broker` gRPC service.
///
/// In cluster mode (`gateway` set) publishes go to JetStream and joins and unary settles go
/// through the gateway, which keeps using `broker` for its local members; everything else
/// (validation, frames, carriages, inspection) is the same code for both deployments.
#[derive(Debug, Clone)]
pub struct BrokerService {
    broker: Broker,
    gateway: Option<Gateway>,
    transport: Arc<TransportStats>,
    stopping: Arc<Signal>,
}

impl BrokerService {
    /// Serves `broker`.
    pub fn new(broker: Broker) -> Self {
        Self::with_transport(broker, Arc::default(), Arc::default())
    }

    /// Serves `broker`, reporting the transport's counters in `ListSubscriptions`. When
    /// `stopping` fires (shutdown started), the streams the broker does not own
    /// (`PublishStream`) end with `UNAVAILABLE`, as the broker ends member streams.
    pub fn with_transport(
        broker: Broker,
        transport: Arc<TransportStats>,
        stopping: Arc<Signal>,
    ) -> Self {
        Self {
            broker,
            gateway: None,
            transport,
            stopping,
        }
    }

    /// Serves as a cluster-mode gateway: `broker` holds this gateway's members, `gateway`
    /// reaches JetStream.
    pub fn with_gateway(mut self, gateway: Option<Gateway>) -> Self {
        self.gateway = gateway;
        self
    }

    /// Opens a member here, or through the gateway in cluster mode.
    async fn open(
        &self,
        open: &OpenRequest,
        connection: Option<ConnectionId>,
    ) -> Result<MemberStream, Status> {
        match &self.gateway {
            Some(gateway) => gateway.open(open, connection).await,
            None => self.broker.open(open, connection).map_err(|e| {
                crate::broker::refused_join(&open.subscription_id, &e);
                status(&e)
            }),
        }
    }

    /// A unary Ack or Nack, after its fields were validated.
    async fn settle(
        &self,
        subscription_id: &str,
        fence: Fence,
        system_id: u64,
        nack: bool,
    ) -> Result<(), Status> {
        if let Some(gateway) = &self.gateway {
            return gateway
                .settle(subscription_id, fence, system_id, nack)
                .await;
        }
        if nack {
            self.broker.nack(subscription_id, fence, system_id)
        } else {
            self.broker.ack(subscription_id, fence, system_id)
        }
        .map_err(|e| status(&e))
    }
}

#[tonic::async_trait]
impl pb::broker_server::Broker for BrokerService {
    async fn publish(
        &self,
        request: Request<pb::PublishRequest>,
    ) -> Result<Response<pb::PublishResponse>, Status> {
        if let Some(gateway) = &self.gateway {
            let draft =
                draft(request.into_inner(), self.broker.limits()).map_err(|e| status(&e))?;
            let published = gateway.publish(draft).await?;
            return Ok(Response::new(pb::PublishResponse {
                system_id: published.system_id,
                queued_for: published.queued_for,
            }));
        }
        publish_one(&self.broker, request.into_inner(), &mut None)
            .map(Response::new)
            .map_err(|e| status(&e))
    }

    async fn publish_batch(
        &self,
        request: Request<pb::PublishBatchRequest>,
    ) -> Result<Response<pb::PublishBatchResponse>, Status> {
        let messages = request.into_inner().messages;
        let limits = self.broker.limits();
        if messages.len() > limits.max_batch_messages {
            return Err(status(&Error::BatchTooLarge {
                count: messages.len(),
                max: limits.max_batch_messages,
            }));
        }
        // Validate everything first: an invalid message rejects the whole batch untouched.
        let mut recent = None;
        let drafts = messages
            .into_iter()
            .enumerate()
            .map(|(i, m)| {
                draft_reusing(m, limits, &mut recent).map_err(|e| {
                    let s = status(&e);
                    Status::new(
                        s.code(),
                        format!("message {} of the batch: {}", i + 1, s.message()),
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let total = drafts.len();
        let result = match &self.gateway {
            Some(gateway) => {
                // Checked up front like the rest: a batch with a message too large for cluster
                // mode is refused whole.
                for (i, draft) in drafts.iter().enumerate() {
                    gateway.check_size(draft).map_err(|s| {
                        Status::new(
                            s.code(),
                            format!("message {} of the batch: {}", i + 1, s.message()),
                        )
                    })?;
                }
                gateway.publish_batch(drafts).await
            }
            None => self
                .broker
                .publish_batch(drafts)
                .map_err(|e| (e.published, status(&e.error))),
        };
        match result {
            Ok(published) => Ok(Response::new(pb::PublishBatchResponse {
                results: published
                    .into_iter()
                    .map(|p| pb::PublishResponse {
                        system_id: p.system_id,
                        queued_for: p.queued_for,
                    })
                    .collect(),
            })),
            Err((published, s)) => {
                let done = published.len();
                let mut s = Status::new(
                    s.code(),
                    format!(
                        "published {done} of {total} messages; message {} was refused: {}",
                        done + 1,
                        s.message()
                    ),
                );
                if let Ok(value) = done.to_string().parse() {
                    s.metadata_mut().insert("tinybroker-published-count", value);
                }
                Err(s)
            }
        }
    }

    type SubscribeStream = FrameStream;

    async fn subscribe(
        &self,
        request: Request<pb::OpenSubscription>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let connection = connection_of(&request);
        let open =
            open_request(request.into_inner(), self.broker.limits()).map_err(|e| status(&e))?;
        let stream = self.open(&open, connection).await?;
        Ok(Response::new(FrameStream(stream)))
    }

    type ConsumeStream = streams::ConsumeStream;

    async fn consume(
        &self,
        request: Request<tonic::Streaming<pb::ConsumeRequest>>,
    ) -> Result<Response<Self::ConsumeStream>, Status> {
        streams::consume(self, request).await.map(Response::new)
    }

    type PublishStreamStream = streams::PublishResults;

    async fn publish_stream(
        &self,
        request: Request<tonic::Streaming<pb::PublishRequest>>,
    ) -> Result<Response<Self::PublishStreamStream>, Status> {
        Ok(Response::new(streams::publish_stream(
            self.broker.clone(),
            self.gateway.clone(),
            request.into_inner(),
            &self.stopping,
        )))
    }

    async fn ack(&self, request: Request<pb::Ack>) -> Result<Response<pb::AckResponse>, Status> {
        let connection = connection_of(&request);
        let ack = request.into_inner();
        check_subscription_id(&ack.subscription_id, self.broker.limits())
            .map_err(|e| status(&e))?;
        let fence = fence(
            &ack.subscription_id,
            ack.system_id,
            ack.member_id,
            connection,
        )
        .map_err(|e| status(&e))?;
        self.settle(&ack.subscription_id, fence, ack.system_id, false)
            .await?;
        Ok(Response::new(pb::AckResponse {}))
    }

    async fn nack(&self, request: Request<pb::Nack>) -> Result<Response<pb::NackResponse>, Status> {
        let connection = connection_of(&request);
        let nack = request.into_inner();
        check_subscription_id(&nack.subscription_id, self.broker.limits())
            .map_err(|e| status(&e))?;
        let fence = fence(
            &nack.subscription_id,
            nack.system_id,
            nack.member_id,
            connection,
        )
        .map_err(|e| status(&e))?;
        self.settle(&nack.subscription_id, fence, nack.system_id, true)
            .await?;
        Ok(Response::new(pb::NackResponse {}))
    }

    async fn describe_subscription(
        &self,
        request: Request<pb::DescribeSubscriptionRequest>,
    ) -> Result<Response<pb::SubscriptionInfo>, Status> {
        let id = request.into_inner().subscription_id;
        check_subscription_id(&id, self.broker.limits()).map_err(|e| status(&e))?;
        if let Some(gateway) = &self.gateway {
            return Ok(Response::new(gateway.describe(&id).await?));
        }
        let view = self.broker.describe(&id).map_err(|e| status(&e))?;
        Ok(Response::new(info(view)))
    }

    async fn list_subscriptions(
        &self,
        request: Request<pb::ListSubscriptionsRequest>,
    ) -> Result<Response<pb::ListSubscriptionsResponse>, Status> {
        let (after, size) =
            page(request.get_ref(), self.broker.limits()).map_err(|e| status(&e))?;
        // One more than the page, to learn whether another page follows.
        let (mut views, broker) = self.broker.list_page(after.as_deref(), size + 1);
        let more = views.len() > size;
        views.truncate(size);
        let next_page_token = match views.last() {
            Some(last) if more => last.subscription_id.to_string(),
            _ => String::new(),
        };
        Ok(Response::new(pb::ListSubscriptionsResponse {
            subscriptions: views.into_iter().map(info).collect(),
            broker: Some(stats(broker, self.transport.snapshot())),
            next_page_token,
        }))
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
    fn long_status_messages_are_cut_at_a_char_boundary() {
        let long = "é".repeat(2000);
        let cut = cap_message(long);
        assert!(cut.len() <= MAX_STATUS_MESSAGE_BYTES, "{}", cut.len());
        assert!(cut.ends_with('…'));
        assert_eq!(cap_message("short".into()), "short");
        let status = status(&Error::SubscriptionNotFound("x".repeat(1_000_000)));
        assert!(status.message().len() <= MAX_STATUS_MESSAGE_BYTES);
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
