//! The JetStream seam over `async-nats`: [`NatsJetStream`], [`NatsStream`] and [`NatsConsumer`].

use std::{future::IntoFuture, time::Duration};

use async_nats::jetstream::{
    AckKind,
    consumer::{self, PullConsumer},
};
use bytes::Bytes;

use super::{
    AckError, AckReply, Answer, ApiError, BoxFuture, Confirmation, Consumer, ConsumerConfig,
    ConsumerError, ConsumerInfo, CreateError, Deliveries, Delivery, DeliveryInfo, Found, JetStream,
    Outgoing, PubAck, PublishError, PullError, StoredMessage, Stream, StreamError,
};

/// The stream over an `async-nats` JetStream context.
#[derive(Debug, Clone)]
pub struct NatsJetStream {
    js: async_nats::jetstream::Context,
    client: async_nats::Client,
}

impl NatsJetStream {
    /// Publishes through `js` (its timeout bounds each try's wait for a `PubAck`), and answers
    /// deliveries on its client.
    pub fn new(js: async_nats::jetstream::Context) -> Self {
        let client = js.client();
        Self { js, client }
    }
}

fn ack_kind(answer: Answer) -> AckKind {
    match answer {
        Answer::Ack => AckKind::Ack,
        Answer::Nak(delay) => AckKind::Nak(delay),
        Answer::Progress => AckKind::Progress,
        Answer::Term => AckKind::Term,
    }
}

/// `message`'s header lines as NATS headers.
fn header_map(message: &Outgoing) -> Result<async_nats::HeaderMap, PublishError> {
    let mut map = async_nats::HeaderMap::new();
    for (name, value) in &message.headers {
        let name: async_nats::HeaderName = name
            .parse()
            .map_err(|_| PublishError::Other(format!("not a NATS header name: {name:?}")))?;
        let value: async_nats::HeaderValue = value
            .parse()
            .map_err(|_| PublishError::Other(format!("not a NATS header value: {value:?}")))?;
        map.insert(name, value);
    }
    Ok(map)
}

/// What async-nats' publish error says, in the seam's terms.
fn from_nats(error: async_nats::jetstream::context::PublishError) -> PublishError {
    use async_nats::jetstream::context::PublishErrorKind as Kind;
    let api = std::error::Error::source(&error)
        .and_then(|source| source.downcast_ref::<async_nats::jetstream::Error>())
        .map(|api| ApiError {
            status: u16::try_from(api.code()).unwrap_or(u16::MAX),
            code: api.error_code().0,
            description: api.to_string().rsplit_once(" (code ").map_or_else(
                || api.to_string(),
                |(description, _)| description.to_string(),
            ),
        });
    match (error.kind(), api) {
        (Kind::StreamNotFound, _) => PublishError::NoResponders,
        (Kind::TimedOut, _) => PublishError::Unanswered("timed out: didn't receive ack in time"),
        (Kind::BrokenPipe, _) => PublishError::Unanswered("broken pipe"),
        (Kind::MaxPayloadExceeded, _) => PublishError::TooLarge(
            std::error::Error::source(&error).map_or_else(String::new, ToString::to_string),
        ),
        (_, Some(api)) => PublishError::Refused(api),
        (_, None) => PublishError::Other(
            std::error::Error::source(&error)
                .map_or_else(|| error.kind().to_string(), ToString::to_string),
        ),
    }
}

impl JetStream for NatsJetStream {
    fn publish(&self, message: Outgoing) -> BoxFuture<'_, Result<Confirmation, PublishError>> {
        Box::pin(async move {
            let headers = header_map(&message)?;
            let sent = self
                .js
                .publish_with_headers(message.subject, headers, message.payload)
                .await
                .map_err(from_nats)?;
            let confirmation: Confirmation = Box::pin(async move {
                sent.into_future()
                    .await
                    .map(|ack| PubAck {
                        sequence: ack.sequence,
                        duplicate: ack.duplicate,
                    })
                    .map_err(from_nats)
            });
            Ok(confirmation)
        })
    }

    fn send(&self, message: Outgoing) -> BoxFuture<'_, Result<(), PublishError>> {
        Box::pin(async move {
            let headers = header_map(&message)?;
            self.client
                .publish_with_headers(message.subject, headers, message.payload)
                .await
                .map_err(|error| {
                    // The seam's errors say what kind they are: only the cause goes in them.
                    let text = error.to_string();
                    let cause = |kind: &str| {
                        text.strip_prefix(kind)
                            .and_then(|rest| rest.strip_prefix(": "))
                            .unwrap_or(&text)
                            .to_string()
                    };
                    match error.kind() {
                        async_nats::client::PublishErrorKind::Send => {
                            PublishError::NotSent(cause("failed to send message"))
                        }
                        async_nats::client::PublishErrorKind::MaxPayloadExceeded => {
                            PublishError::TooLarge(cause("max payload size exceeded"))
                        }
                        _ => PublishError::Other(text.clone()),
                    }
                })
        })
    }

    fn answer(&self, reply: &AckReply, answer: Answer) -> BoxFuture<'_, Result<(), AckError>> {
        let subject = reply.subject().clone();
        Box::pin(async move {
            self.client
                .publish(subject, Bytes::from(ack_kind(answer)))
                .await
                .map_err(|error| AckError::Unavailable(error.to_string()))
        })
    }

    fn confirm(
        &self,
        reply: &AckReply,
        answer: Answer,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<(), AckError>> {
        let subject = reply.subject().clone();
        Box::pin(async move {
            let request = async_nats::Request::new()
                .payload(Bytes::from(ack_kind(answer)))
                .timeout(Some(timeout));
            // The whole wait, queueing the request included, is bounded by `timeout`.
            let answered =
                tokio::time::timeout(timeout, self.client.send_request(subject, request)).await;
            match answered {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(error)) => Err(match error.kind() {
                    async_nats::RequestErrorKind::TimedOut => AckError::TimedOut,
                    async_nats::RequestErrorKind::NoResponders => AckError::NoResponders,
                    _ => AckError::Unavailable(error.to_string()),
                }),
                Err(_) => Err(AckError::TimedOut),
            }
        })
    }

    fn flush(&self) -> BoxFuture<'_, Result<(), AckError>> {
        Box::pin(async move {
            self.client
                .flush()
                .await
                .map_err(|error| AckError::Unavailable(error.to_string()))
        })
    }
}

/// A pull consumer over `async-nats`.
#[derive(Debug)]
pub struct NatsConsumer {
    consumer: PullConsumer,
    name: String,
    created: i128,
}

impl NatsConsumer {
    /// The consumer `consumer` (its cached info names it and says when it was created).
    pub fn new(consumer: PullConsumer) -> Self {
        let info = consumer.cached_info();
        let (name, created) = (info.name.clone(), info.created.unix_timestamp_nanos());
        Self {
            consumer,
            name,
            created,
        }
    }
}

/// A JetStream message in the seam's terms: its metadata read from its reply subject once.
fn delivery(message: async_nats::jetstream::Message) -> Delivery {
    let info = message
        .info()
        .map(|info| DeliveryInfo {
            stream_sequence: info.stream_sequence,
            delivered: info.delivered,
            published_nanos: info.published.unix_timestamp_nanos(),
        })
        .map_err(|error| error.to_string());
    Delivery::from_nats(message.message, info)
}

impl Consumer for NatsConsumer {
    fn name(&self) -> &str {
        &self.name
    }

    fn created(&self) -> i128 {
        self.created
    }

    fn pull(
        &self,
        max_messages: usize,
        expires: Duration,
    ) -> BoxFuture<'_, Result<Deliveries, PullError>> {
        Box::pin(async move {
            let batch = self
                .consumer
                .batch()
                .max_messages(max_messages)
                .expires(expires)
                .messages()
                .await
                .map_err(|error| PullError(error.to_string()))?;
            let deliveries: Deliveries = Box::pin(tokio_stream::StreamExt::map(batch, |message| {
                message
                    .map(delivery)
                    .map_err(|error| PullError(error.to_string()))
            }));
            Ok(deliveries)
        })
    }

    fn info(&self) -> BoxFuture<'_, Result<ConsumerInfo, ConsumerError>> {
        Box::pin(async move {
            self.consumer
                .get_info()
                .await
                .map(|info| consumer_info(&info))
                .map_err(info_error)
        })
    }
}

/// A consumer's info in the seam's terms.
fn consumer_info(info: &consumer::Info) -> ConsumerInfo {
    // Every replica the consumer is to have holds it, current, or is known offline; not so
    // when the leader reports fewer replicas than configured (one not yet in the group).
    let (everywhere, behind) = match &info.cluster {
        None => (true, Vec::new()),
        Some(cluster) => {
            let replicas = match info.config.num_replicas {
                0 => cluster.replicas.len() + 1,
                n => n,
            };
            let behind: Vec<String> = cluster
                .replicas
                .iter()
                .filter(|r| !(r.current || r.offline))
                .map(|r| r.name.clone())
                .collect();
            (
                cluster.replicas.len() + 1 >= replicas && behind.is_empty(),
                behind,
            )
        }
    };
    ConsumerInfo {
        name: info.name.clone(),
        metadata: info.config.metadata.clone(),
        created: info.created.unix_timestamp_nanos(),
        pending: info.num_pending,
        ack_pending: info.num_ack_pending as u64,
        redelivered: info.num_redelivered as u64,
        delivered_stream_sequence: info.delivered.stream_sequence,
        everywhere,
        behind,
    }
}

fn info_error(error: async_nats::jetstream::context::ConsumerInfoError) -> ConsumerError {
    match error.kind() {
        async_nats::jetstream::context::ConsumerInfoErrorKind::NotFound => ConsumerError::NotFound,
        _ => ConsumerError::Other(error.to_string()),
    }
}

/// JetStream's "consumer not found".
const CONSUMER_NOT_FOUND: u64 = 10014;
/// JetStream's "temporarily unavailable" (its meta leader or the stream's being elected).
const JETSTREAM_UNAVAILABLE: u64 = 10008;

/// A stream's consumers over `async-nats`.
#[derive(Debug, Clone)]
pub struct NatsStream {
    stream: async_nats::jetstream::stream::Stream,
    name: String,
}

impl NatsStream {
    /// The consumers of `stream`.
    pub fn new(stream: async_nats::jetstream::stream::Stream) -> Self {
        let name = stream.cached_info().config.name.clone();
        Self { stream, name }
    }
}

fn found(consumer: PullConsumer) -> Found {
    let info = consumer_info(consumer.cached_info());
    (Box::new(NatsConsumer::new(consumer)), info)
}

/// What the seam says of a refused consumer.
fn create_error(error: async_nats::jetstream::stream::ConsumerCreateStrictError) -> CreateError {
    use async_nats::jetstream::{ErrorCode, stream::ConsumerCreateStrictErrorKind as Kind};
    match error.kind() {
        Kind::JetStream(api) if api.error_code() == ErrorCode::MAXIMUM_CONSUMERS_LIMIT => {
            CreateError::Limit
        }
        Kind::TimedOut | Kind::Request => CreateError::ForNow(error.to_string()),
        Kind::JetStream(api)
            if api.code() == 503 || api.error_code().0 == JETSTREAM_UNAVAILABLE =>
        {
            CreateError::ForNow(error.to_string())
        }
        _ => CreateError::Refused(error.to_string()),
    }
}

impl Stream for NatsStream {
    fn name(&self) -> &str {
        &self.name
    }

    fn consumer(&self, name: &str) -> BoxFuture<'_, Result<Option<Found>, ConsumerError>> {
        let name = name.to_string();
        Box::pin(async move {
            match self
                .stream
                .get_consumer::<consumer::pull::Config>(&name)
                .await
            {
                Ok(consumer) => Ok(Some(found(consumer))),
                Err(error) => {
                    use async_nats::jetstream::context::{
                        ConsumerInfoError, ConsumerInfoErrorKind,
                    };
                    match error.downcast_ref::<ConsumerInfoError>() {
                        Some(info) if info.kind() == ConsumerInfoErrorKind::NotFound => Ok(None),
                        _ => Err(ConsumerError::Other(error.to_string())),
                    }
                }
            }
        })
    }

    fn create_consumer(&self, config: ConsumerConfig) -> BoxFuture<'_, Result<Found, CreateError>> {
        let config = consumer::pull::Config {
            durable_name: Some(config.name),
            filter_subjects: config.filters,
            deliver_policy: consumer::DeliverPolicy::New,
            ack_policy: if config.explicit {
                consumer::AckPolicy::Explicit
            } else {
                consumer::AckPolicy::None
            },
            ack_wait: config.ack_wait,
            max_deliver: -1,
            max_ack_pending: config.max_ack_pending,
            inactive_threshold: config.inactive_threshold,
            metadata: config.metadata,
            ..Default::default()
        };
        Box::pin(async move {
            self.stream
                .create_consumer_strict(config)
                .await
                .map(found)
                .map_err(create_error)
        })
    }

    fn consumer_info(&self, name: &str) -> BoxFuture<'_, Result<ConsumerInfo, ConsumerError>> {
        let name = name.to_string();
        Box::pin(async move {
            self.stream
                .consumer_info(&name)
                .await
                .map(|info| consumer_info(&info))
                .map_err(info_error)
        })
    }

    fn consumers(&self) -> BoxFuture<'_, Result<Vec<ConsumerInfo>, ConsumerError>> {
        Box::pin(async move {
            let mut listed = Vec::new();
            let mut consumers = self.stream.consumers();
            while let Some(info) = tokio_stream::StreamExt::next(&mut consumers).await {
                let info = info.map_err(|error| ConsumerError::Other(error.to_string()))?;
                listed.push(consumer_info(&info));
            }
            // The servers list them in no particular order.
            listed.sort_by(|a, b| a.name.cmp(&b.name));
            Ok(listed)
        })
    }

    fn consumer_count(&self) -> BoxFuture<'_, Result<usize, ConsumerError>> {
        Box::pin(async move {
            self.stream
                .get_info()
                .await
                .map(|info| info.state.consumer_count)
                .map_err(|error| ConsumerError::Other(error.to_string()))
        })
    }

    fn last_message(
        &self,
        subject: &str,
    ) -> BoxFuture<'_, Result<Option<StoredMessage>, StreamError>> {
        let subject = subject.to_string();
        Box::pin(async move {
            use async_nats::jetstream::stream::LastRawMessageErrorKind;
            match self.stream.get_last_raw_message_by_subject(&subject).await {
                Ok(message) => Ok(Some(StoredMessage {
                    sequence: message.sequence,
                    headers: message
                        .headers
                        .iter()
                        .filter_map(|(name, values)| {
                            Some((name.to_string(), values.last()?.to_string()))
                        })
                        .collect(),
                    payload: message.payload,
                })),
                Err(error) if error.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
                Err(error) => Err(StreamError(error.to_string())),
            }
        })
    }

    fn purge(&self, subject: &str, below: u64) -> BoxFuture<'_, Result<(), StreamError>> {
        let subject = subject.to_string();
        Box::pin(async move {
            self.stream
                .purge()
                .filter(subject)
                .sequence(below)
                .into_future()
                .await
                .map(|_| ())
                .map_err(|error| StreamError(error.to_string()))
        })
    }

    fn delete_consumer(&self, name: &str) -> BoxFuture<'_, Result<(), ConsumerError>> {
        let name = name.to_string();
        Box::pin(async move {
            match self.stream.delete_consumer(&name).await {
                Ok(_) => Ok(()),
                Err(error) => match error.kind() {
                    async_nats::jetstream::stream::ConsumerErrorKind::JetStream(api)
                        if api.error_code().0 == CONSUMER_NOT_FOUND =>
                    {
                        Err(ConsumerError::NotFound)
                    }
                    _ => Err(ConsumerError::Other(error.to_string())),
                },
            }
        })
    }
}
