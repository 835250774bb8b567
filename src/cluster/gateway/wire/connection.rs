//! The gateway's connection to NATS: the options [`security::connect_options`] builds from the
//! gateway's credential and TLS, its pings and timeouts, and what it watches among the
//! connection's events (connections made and lost, permissions NATS refused).

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

use crate::cluster::gateway::{DEAD_LETTER_HEADROOM, GatewayConfig, config, parse_urls};
use crate::{cluster::security, core::Limits};

/// A connected client and what the gateway keeps of its connection.
pub(in crate::cluster::gateway) struct Connected {
    pub(in crate::cluster::gateway) client: async_nats::Client,
    /// Counts connections made and lost: an announcement sent while this gateway's connection
    /// was down did not reach it (`registry`).
    pub(in crate::cluster::gateway) connects: Arc<AtomicU64>,
    /// The permissions NATS refused this connection: the first ends the start.
    pub(in crate::cluster::gateway) refusals: security::Refusals,
    /// The credential presented, as errors name it.
    pub(in crate::cluster::gateway) credential: String,
    /// The largest message a client may publish here: `limits`' largest, below the NATS
    /// servers' `max_payload` by [`DEAD_LETTER_HEADROOM`], so its dead letter fits too.
    pub(in crate::cluster::gateway) largest_message: usize,
}

/// Connects to `config.urls` with `config.security`.
///
/// # Errors
/// A sentence naming what failed: the URLs, a credential or certificate file, or what NATS
/// refused (the credential presented, the TLS).
pub(in crate::cluster::gateway) async fn connect(
    config: &GatewayConfig,
    limits: &Limits,
) -> Result<Connected, String> {
    let urls = parse_urls(&config.urls)?;
    let connects = Arc::new(AtomicU64::new(0));
    let counted = connects.clone();
    // What a gateway's NATS user is not permitted, NATS refuses by dropping the request and
    // telling the connection, apart, which subject it refused: the request itself is only
    // unanswered. Every refusal is logged; the first during the start ends it at once.
    let refusals = security::Refusals::default();
    let observed = refusals.clone();
    let credential = config
        .security
        .presented()
        .unwrap_or_else(|| "no credential".to_string());
    let presented = credential.clone();
    // A server that stops answering (paused, partitioned) is left within three ping
    // intervals: async-nats pings after each interval without traffic from the server and
    // drops the connection at the third ping unanswered, then connects to another; a server
    // that takes connections but never greets (paused too) is given up after the connection
    // timeout.
    let client = security::connect_options(&config.security)?
        .name("tinybroker-gateway")
        .event_callback(move |event| {
            if matches!(
                event,
                async_nats::Event::Connected | async_nats::Event::Disconnected
            ) {
                counted.fetch_add(1, Ordering::SeqCst);
            }
            observed.observe(&event, &presented);
            async {}
        })
        .ping_interval(config.ping_interval)
        .connection_timeout(config::connection_timeout(config.ping_interval))
        .connect(urls)
        .await
        .map_err(|e| {
            format!(
                "cannot connect to NATS at {}: {}",
                config.urls,
                config.security.connect_error(&e)
            )
        })?;
    let max_payload = client.server_info().max_payload;
    let max_message = limits.max_message_bytes;
    let largest_message = max_message.min(max_payload.saturating_sub(DEAD_LETTER_HEADROOM));
    if largest_message < max_message {
        tracing::info!(
            max_message_bytes = max_message,
            max_payload,
            largest_message,
            "messages above {largest_message} bytes are refused with INVALID_ARGUMENT: the NATS servers' max_payload {max_payload} less {DEAD_LETTER_HEADROOM} bytes kept for a dead letter's headers (--max-message-bytes is {max_message})"
        );
    }
    Ok(Connected {
        client,
        connects,
        refusals,
        credential,
        largest_message,
    })
}
