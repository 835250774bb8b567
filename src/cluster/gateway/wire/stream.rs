//! The gateway's JetStream stream at start-up: found or created with its limits, then waited
//! for until publishes to it find a server.

use std::time::Duration;

use async_nats::jetstream::{
    self, ErrorCode,
    context::CreateStreamErrorKind,
    stream::{DiscardPolicy, RetentionPolicy, StorageType},
};

use crate::cluster::gateway::{GatewayConfig, wire::names};

/// How long a starting gateway waits for its NATS server to route publishes to the stream.
const STREAM_PATIENCE: Duration = Duration::from_secs(10);

/// Waits until a publish to the stream finds a JetStream server from this connection. Right
/// after the stream is created, a server that has not yet learned its subjects over the
/// cluster's routes answers publishes with "no responders"; a pipelined `PublishStream` or
/// batch could not send those again in order. The probe stores nothing: it expects a subject
/// sequence the stream can never have, so the stream refuses it, which is the answer waited for.
pub(in crate::cluster::gateway) async fn await_stream(
    js: &jetstream::Context,
    stream: &str,
) -> Result<(), String> {
    let subject = format!("{stream}._tinybroker.probe");
    let deadline = tokio::time::Instant::now() + STREAM_PATIENCE;
    crate::cluster::nats::await_probe(js, subject, deadline)
        .await
        .map_err(|_| {
            format!(
                "no JetStream server answered publishes to stream {stream} within {STREAM_PATIENCE:?}"
            )
        })
}

/// How long a starting gateway tries to find or create its stream: as long as it tries to
/// open the coordination bucket, for the same reasons (a cluster just started, a stream just
/// made by another gateway electing its leader, several gateways at once on a loaded machine).
const CREATE_PATIENCE: Duration = Duration::from_secs(30);

/// What a new stream's duplicate window keeps beyond `--nats-publish-timeout`: the last try's
/// own wait for its answer, and more.
const DUPLICATE_MARGIN: std::time::Duration = std::time::Duration::from_secs(10);

/// The stream, created when missing. Auto replicas try 3 first and take fewer when the
/// cluster is smaller. A stream the gateway creates is bounded (`max_messages`, `max_bytes`)
/// and refuses new messages when full (discard new), as the embedded broker's default
/// overflow policy refuses publishes: a confirmed message is never discarded to make room. Its
/// first sequence, and so its first `system_id`, is the wall clock at its creation in µs
/// (docs/semantics.md#restart-identity). One that exists is taken as it is, its limits logged.
///
/// Any number of gateways may start together: each creates the stream with its own first
/// sequence, so every create but the first is refused as a different configuration (10058),
/// and each of those binds the stream the first made, checked as any existing one. A create
/// refused for another reason is tried again (a cluster just started may not place it yet,
/// and a stream another gateway just made answers no look until its replicas elect a leader)
/// for up to [`CREATE_PATIENCE`], then named in the error.
pub(in crate::cluster::gateway) async fn ensure_stream(
    js: &jetstream::Context,
    config: &GatewayConfig,
) -> Result<jetstream::stream::Stream, String> {
    let deadline = tokio::time::Instant::now() + CREATE_PATIENCE;
    let mut delay = Duration::from_millis(50);
    loop {
        if let Ok(stream) = js.get_stream(&config.stream).await {
            return existing_stream(js, stream, config).await;
        }
        let refused = match create_stream(js, config).await {
            Ok(stream) => return Ok(stream),
            Err(Refused::ForGood(why)) => return Err(why),
            Err(Refused::ForNow(why)) => why,
        };
        // Made by another gateway meanwhile: found by the next look, with no wait.
        if let Ok(stream) = js.get_stream(&config.stream).await {
            return existing_stream(js, stream, config).await;
        }
        if tokio::time::Instant::now() + delay > deadline {
            return Err(format!(
                "JetStream refused the stream {}: {refused}",
                config.stream
            ));
        }
        tracing::debug!(error = %refused, "the stream is not made yet; trying again");
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(500));
    }
}

/// Why a stream was not created.
enum Refused {
    /// Trying again may succeed (a cluster still placing, a stream another gateway just made).
    ForNow(String),
    /// Trying again cannot: the whole refusal, naming what to change.
    ForGood(String),
}

/// Creates the stream: one try per replica count (3 then 1 when auto); the last refusal.
async fn create_stream(
    js: &jetstream::Context,
    config: &GatewayConfig,
) -> Result<jetstream::stream::Stream, Refused> {
    let tries: &[usize] = match config.replicas {
        0 => &[3, 1],
        n => &[n][..],
    };
    let mut last = String::new();
    for &replicas in tries {
        let stream_config = jetstream::stream::Config {
            name: config.stream.clone(),
            subjects: vec![
                format!("{}.>", config.stream),
                names::fence_subjects(&config.stream),
            ],
            retention: RetentionPolicy::Interest,
            storage: StorageType::File,
            num_replicas: replicas,
            max_messages: config.max_messages,
            max_bytes: config.max_bytes,
            max_consumers: config.max_consumers,
            discard: DiscardPolicy::New,
            // As long as a publish may be sent again (JetStream's default is 2 minutes): every
            // id of the window is kept in memory on each of the stream's servers, so a shorter
            // one costs them less per publish.
            duplicate_window: config.publish_timeout + DUPLICATE_MARGIN,
            first_sequence: Some(crate::clock::system_unix_micros()),
            ..Default::default()
        };
        match js.create_stream(stream_config).await {
            Ok(stream) => return Ok(stream),
            Err(error) => {
                if let CreateStreamErrorKind::JetStream(jetstream_error) = error.kind()
                    && jetstream_error.error_code() == ErrorCode::STREAM_SUBJECT_OVERLAP
                {
                    return Err(Refused::ForGood(
                        overlap(js, config, &error.to_string()).await,
                    ));
                }
                last = error.to_string();
            }
        }
    }
    Err(Refused::ForNow(last))
}

/// The refusal of a stream whose subjects another stream takes, naming that stream.
async fn overlap(js: &jetstream::Context, config: &GatewayConfig, error: &str) -> String {
    let subjects = format!("{}.>", config.stream);
    let fences = names::fence_subjects(&config.stream);
    let mut owners = Vec::new();
    for subject in [format!("{}.x", config.stream), fences.replace('>', "x")] {
        if let Ok(Ok(name)) =
            tokio::time::timeout(Duration::from_secs(5), js.stream_by_subject(subject)).await
            && !owners.contains(&name)
        {
            owners.push(name);
        }
    }
    let by = if owners.is_empty() {
        "another stream".to_string()
    } else {
        format!("stream {}", owners.join(", stream "))
    };
    format!(
        "JetStream refused the stream {}: its subjects {subjects} and {fences} overlap {by} ({error}); pick another --nats-stream, or change that stream's subjects",
        config.stream
    )
}

/// A stream that exists: refused if it does not take the gateway's subjects (naming them),
/// its fence subjects added if it was made before they existed, its limits logged.
async fn existing_stream(
    js: &jetstream::Context,
    mut stream: jetstream::stream::Stream,
    config: &GatewayConfig,
) -> Result<jetstream::stream::Stream, String> {
    let subjects = format!("{}.>", config.stream);
    let fences = names::fence_subjects(&config.stream);
    let existing = &stream.cached_info().config;
    if !existing.subjects.contains(&subjects) {
        return Err(format!(
            "JetStream stream {} exists but does not take {subjects} (its subjects: {}); a gateway needs {subjects} and {fences}",
            config.stream,
            existing.subjects.join(", ")
        ));
    }
    if !existing.subjects.contains(&fences) {
        // Made before fenced publishes worked in cluster mode: its fence subjects added.
        let mut updated = existing.clone();
        updated.subjects.push(fences.clone());
        js.update_stream(&updated).await.map_err(|e| {
            format!(
                "JetStream stream {} exists without the fence subjects {fences}, and adding them was refused: {e}",
                config.stream
            )
        })?;
        stream = js
            .get_stream(&config.stream)
            .await
            .map_err(|e| format!("JetStream stream {}: {e}", config.stream))?;
    }
    if stream.cached_info().config.max_consumers <= 0 {
        stream = raise_max_consumers(js, stream, config).await;
    }
    let existing = &stream.cached_info().config;
    if existing.max_messages < 0 && existing.max_bytes < 0 {
        tracing::warn!(
            stream = %config.stream,
            "JetStream stream {} exists without max_msgs or max_bytes: its backlog is bounded only by the servers' disks (set them with `nats stream edit`)",
            config.stream
        );
    } else if existing.discard == DiscardPolicy::Old {
        // Discard old makes room by dropping the oldest messages, confirmed ones included:
        // a backlog that reaches a limit loses messages silently, nothing is refused.
        tracing::warn!(
            stream = %config.stream,
            max_msgs = existing.max_messages,
            max_bytes = existing.max_bytes,
            "JetStream stream {} exists with discard old: when it reaches a limit, JetStream drops its oldest messages, confirmed ones a subscription has not yet taken included, instead of refusing publishes (set discard new with `nats stream edit --discard new`)",
            config.stream
        );
    } else {
        tracing::info!(
            stream = %config.stream,
            max_msgs = existing.max_messages,
            max_bytes = existing.max_bytes,
            discard = ?existing.discard,
            "JetStream stream {} exists: its own limits apply, not --nats-max-messages/--nats-max-bytes",
            config.stream
        );
    }
    Ok(stream)
}

/// A stream that exists with no consumer limit of its own (made by an earlier gateway, or by
/// hand without one) is given `--nats-max-consumers`: nats-server 2.15 gives such a stream
/// 1,000, and each subscription is a consumer. Servers that refuse the change (an account
/// limit below it, nats-server before 2.12 that cannot edit it) leave the stream as it was,
/// named at warn level. A limit the stream sets itself is kept: it is the operator's.
async fn raise_max_consumers(
    js: &jetstream::Context,
    stream: jetstream::stream::Stream,
    config: &GatewayConfig,
) -> jetstream::stream::Stream {
    let mut updated = stream.cached_info().config.clone();
    updated.max_consumers = config.max_consumers;
    let error = match js.update_stream(&updated).await {
        Ok(info) if info.config.max_consumers == config.max_consumers => {
            tracing::info!(
                stream = %config.stream,
                max_consumers = config.max_consumers,
                "JetStream stream {} had no consumer limit of its own (nats-server 2.15 gives it 1,000): set to --nats-max-consumers",
                config.stream
            );
            return js.get_stream(&config.stream).await.unwrap_or(stream);
        }
        Ok(_) => "the servers kept their own limit".to_string(),
        Err(error) => error.to_string(),
    };
    tracing::warn!(
        stream = %config.stream,
        %error,
        "JetStream stream {} has no consumer limit of its own, and setting it to {} was refused: the servers' default applies (1,000 on nats-server 2.15), and each subscription is a consumer; raise it with `nats stream edit {} --max-consumers N`",
        config.stream,
        config.max_consumers,
        config.stream
    );
    stream
}

/// Turns on atomic batches on the stream where they are off (nats-server 2.12 or later; a
/// stream made by an earlier gateway has them off): a `PublishStream`'s waiting publishes then
/// go to JetStream as one batch (docs/cluster-internals.md#atomic-batches). Returns whether the
/// stream takes them; servers that refuse the setting, or ignore it (before 2.12), leave single
/// publishes, as before.
pub(in crate::cluster::gateway) async fn allow_atomic(
    js: &jetstream::Context,
    stream: &mut jetstream::stream::Stream,
) -> bool {
    let config = &stream.cached_info().config;
    if config.allow_atomic_publish {
        return true;
    }
    let name = config.name.clone();
    let mut updated = config.clone();
    updated.allow_atomic_publish = true;
    match js.update_stream(&updated).await {
        Ok(info) if info.config.allow_atomic_publish => {
            if let Ok(fresh) = js.get_stream(&name).await {
                *stream = fresh;
            }
            true
        }
        Ok(_) => {
            tracing::info!(stream = %name, "the NATS servers do not take atomic batches (nats-server before 2.12): publishes go to JetStream one by one");
            false
        }
        Err(error) => {
            tracing::warn!(stream = %name, %error, "JetStream refused to turn on atomic batches for the stream: publishes go to JetStream one by one");
            false
        }
    }
}

/// Makes the consumer that keeps the stream's fence records
/// (docs/cluster-internals.md#fenced-publishes), if missing: nobody reads it, and under the
/// stream's interest retention a message no consumer has pending is removed at once. Tried for up
/// to [`STREAM_PATIENCE`]: right after the stream is made (several gateways starting together), its
/// leader may not answer yet.
pub(in crate::cluster::gateway) async fn keep_fences(
    stream: &jetstream::stream::Stream,
) -> Result<(), String> {
    let name = &stream.cached_info().config.name;
    let config = jetstream::consumer::pull::Config {
        durable_name: Some(names::FENCE_CONSUMER.to_string()),
        filter_subject: names::fence_subjects(name),
        ack_policy: jetstream::consumer::AckPolicy::Explicit,
        description: Some(
            "tinybroker: keeps the fence records of SINGLETON subscriptions; never read".into(),
        ),
        ..Default::default()
    };
    let deadline = tokio::time::Instant::now() + STREAM_PATIENCE;
    let mut delay = Duration::from_millis(50);
    loop {
        let made = tokio::time::timeout(
            Duration::from_secs(2),
            stream.get_or_create_consumer(names::FENCE_CONSUMER, config.clone()),
        )
        .await;
        let error = match made {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(error)) => error.to_string(),
            Err(_) => "no answer within 2s".to_string(),
        };
        if tokio::time::Instant::now() + delay > deadline {
            return Err(format!(
                "JetStream did not make the consumer {} of stream {name} within {STREAM_PATIENCE:?}: {error}",
                names::FENCE_CONSUMER
            ));
        }
        tracing::debug!(%error, "the fence records' consumer is not made yet; trying again");
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(500));
    }
}

/// How long a Describe waits for the servers' view of the consumer.
const CONSUMER_INFO_PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);

/// The consumer named `name` of `stream`, as the servers report it now; `None` when there is
/// none.
///
/// # Errors
/// Why the servers did not answer.
pub(in crate::cluster::gateway) async fn named_consumer(
    stream: &dyn crate::cluster::jetstream::Stream,
    name: &str,
) -> Result<Option<crate::cluster::jetstream::ConsumerInfo>, String> {
    // JetStream's API requests wait the NATS client's request timeout (10 s), not the
    // context's: bound this one as an ack forwarded to another gateway is.
    let info = tokio::time::timeout(CONSUMER_INFO_PATIENCE, stream.consumer_info(name))
        .await
        .map_err(|_| format!("no answer within {CONSUMER_INFO_PATIENCE:?}"))?;
    match info {
        Ok(info) => Ok(Some(info)),
        Err(crate::cluster::jetstream::ConsumerError::NotFound) => Ok(None),
        Err(error) => {
            tracing::debug!(consumer = %name, %error, "no consumer info");
            Err(error.to_string())
        }
    }
}
