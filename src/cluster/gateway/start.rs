//! A gateway's start over NATS: its stream found or made and answering, the coordination
//! bucket bound, the cluster's epoch floor raised and a member-id route claimed, and the seams
//! the gateway then runs over ([`Parts`]), each over the one connection.

use std::{
    sync::{Arc, atomic::AtomicU64},
    time::Instant,
};

use async_nats::jetstream;

use crate::cluster::gateway::{
    GatewayConfig, Parts, StreamSettings,
    data::publish::{IN_FLIGHT, PUBLISH_TRY},
    wire::stream::{self, await_stream, ensure_stream},
};

/// Everything a gateway needs of NATS, over `client` (connected, `connects` counting its
/// connections), for `config`.
///
/// # Errors
/// A sentence saying what failed: JetStream disabled or refusing the stream or the bucket.
pub(in crate::cluster::gateway) async fn over_nats(
    config: &GatewayConfig,
    client: async_nats::Client,
    connects: Arc<AtomicU64>,
    largest_message: usize,
    started: Instant,
) -> Result<Parts, String> {
    let mut js = jetstream::ContextBuilder::new()
        .max_ack_inflight(IN_FLIGHT)
        .build(client.clone());
    let mut stream = ensure_stream(&js, config).await?;
    let batches = stream::allow_atomic(&js, &mut stream).await;
    tracing::debug!(elapsed = ?started.elapsed(), "gateway start: stream {} found or created", config.stream);
    await_stream(&js, &config.stream).await?;
    tracing::debug!(elapsed = ?started.elapsed(), "gateway start: stream {} answers publishes", config.stream);
    stream::keep_fences(&stream).await?;
    let id = format!(
        "{:x}{:x}",
        crate::clock::system_unix_micros(),
        std::process::id()
    );
    let backplane = crate::cluster::nats::NatsBackplane::open(
        client.clone(),
        &crate::cluster::nats::NatsConfig {
            bucket: format!("{}-coordination", config.stream),
            // The stream's own, which every gateway reads alike (a count from the servers
            // a client learned can differ between gateways started together, and a bucket
            // created twice with different settings is refused).
            replicas: Some(stream.cached_info().config.num_replicas),
            ..crate::cluster::nats::NatsConfig::new(Vec::<String>::new())
        },
    )
    .await
    .map_err(|e| e.to_string())?;
    tracing::debug!(elapsed = ?started.elapsed(), bucket = backplane.bucket(), "gateway start: coordination bucket bound");
    // Before the coordinator runs: every epoch it makes is above this start
    // (docs/semantics.md#cluster-restart-identity).
    let epoch_floor =
        crate::cluster::identity::raise_epoch_floor(&backplane, crate::clock::system_unix_micros())
            .await
            .map_err(|e| {
                format!("cannot raise the cluster's epoch floor in the coordination bucket: {e}")
            })?;
    // Member ids above every earlier gateway's, and above this start.
    let route = crate::cluster::identity::claim_route(
        &backplane,
        crate::clock::system_unix_micros(),
        crate::broker::GATEWAY_ROUTE_SHIFT,
    )
    .await
    .map_err(|e| format!("cannot claim a member-id route in the coordination bucket: {e}"))?;
    // The fence records and the stream's consumers are asked with the context's own timeout;
    // publishes wait PUBLISH_TRY for each `PubAck`, then are sent again.
    let records = Arc::new(crate::cluster::jetstream::NatsJetStream::new(js.clone()));
    let consumers = Arc::new(crate::cluster::jetstream::NatsStream::new(stream.clone()));
    js.set_timeout(PUBLISH_TRY);
    let server = client.clone();
    Ok(Parts {
        bus: Arc::new(crate::cluster::bus::NatsBus::new(client)),
        jetstream: Arc::new(crate::cluster::jetstream::NatsJetStream::new(js)),
        records,
        stream: consumers,
        backplane: Arc::new(backplane),
        settings: settings_of(stream.cached_info()),
        batches,
        largest_message,
        epoch_floor,
        route,
        id,
        connects,
        server: Arc::new(move || {
            let info = server.server_info();
            format!("{}:{} ({})", info.host, info.port, info.server_name)
        }),
    })
}

/// The stream's settings as JetStream describes it.
fn settings_of(info: &jetstream::stream::Info) -> StreamSettings {
    let config = &info.config;
    StreamSettings {
        name: config.name.clone(),
        replicas: config.num_replicas,
        storage: match config.storage {
            jetstream::stream::StorageType::File => "file",
            jetstream::stream::StorageType::Memory => "memory",
        },
        max_consumers: config.max_consumers,
        first_sequence: config.first_sequence,
        duplicate_window: config.duplicate_window,
    }
}
