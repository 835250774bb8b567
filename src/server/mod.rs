//! The whole server on any listener: `run(config, incoming, shutdown)`. The binary passes a TCP
//! listener and a signal future; tests pass a port-0 listener; simulations pass turmoil's.

mod incoming;
mod oversize;
mod requests;
mod tls;

use std::{error::Error as StdError, sync::Arc, time::Duration};

pub use crate::transport::{Signal, TransportSnapshot, TransportStats};
use incoming::Admission;
pub use incoming::{Guarded, TcpAccept};
use oversize::OversizeAsResourceExhausted;
use requests::RequestGuardLayer;
pub use requests::{LONG_LIVED_REQUEST_BODIES, SMALL_REQUEST_BYTES};
pub use tls::{TlsError, TlsIdentity, console_acceptor};

use tokio::io::{AsyncRead, AsyncWrite};
use tokio_stream::Stream;
use tonic::{
    Request, Status,
    service::Interceptor,
    transport::{Certificate, server::Connected},
};

use crate::{
    backend::Backend,
    broker::{Broker, Observer},
    clock::{Clock, TokioClock},
    core::Limits,
    pb::{self, broker_server::BrokerServer},
    service::BrokerService,
};

/// Everything the server can be configured with; `Default` is the in-memory, loopback-friendly
/// setup `tinybroker serve` starts with.
#[derive(Clone)]
pub struct ServerConfig {
    /// Queue, size and membership limits.
    pub limits: Limits,
    /// Largest gRPC request the transport decodes. Must exceed `limits.max_message_bytes` so an
    /// oversized message gets the broker's own `RESOURCE_EXHAUSTED` naming the limit.
    pub max_request_bytes: usize,
    /// HTTP/2 keepalive ping interval; `None` disables keepalive (a vanished host then goes
    /// unnoticed until TCP gives up).
    pub keepalive_interval: Option<Duration>,
    /// How long a keepalive ping may go unanswered before the connection, and every member
    /// stream on it, is closed.
    pub keepalive_timeout: Duration,
    /// When set, every Broker RPC must carry `authorization: Bearer <token>`.
    pub auth_token: Option<String>,
    /// When set, serve TLS with this certificate and key.
    pub tls: Option<TlsIdentity>,
    /// With `tls`: accept only clients presenting a certificate signed by this CA (mutual TLS).
    pub tls_client_ca: Option<Certificate>,
    /// How long shutdown waits for connections to drain after ending every stream; then every
    /// connection still open is closed.
    pub drain_timeout: Duration,
    /// Most open connections; more are closed at once and counted (`connections_refused`).
    /// Keep it below the process's file-descriptor limit (`ulimit -n`).
    pub max_connections: usize,
    /// How long a new connection may take to send the HTTP/2 preface (and, over TLS, to finish
    /// the TLS handshake first) before it is closed.
    pub handshake_timeout: Duration,
    /// Most concurrent HTTP/2 streams per connection (each subscription member is one).
    pub max_concurrent_streams: u32,
    /// How long a request body may take to arrive in full.
    pub request_timeout: Duration,
    /// Most bytes the server holds for request bodies still arriving, over all connections;
    /// requests up to 64 KiB may use a quarter more. Never less than `max_request_bytes`.
    pub max_pending_request_bytes: usize,
    /// Where time comes from.
    pub clock: Arc<dyn Clock>,
    /// Sees every input applied to every subscription of the embedded broker [`Server::new`]
    /// builds (simulations and tests). A gateway builds its own broker, observed by itself.
    pub observer: Option<Arc<dyn Observer>>,
}

impl ServerConfig {
    /// The request size that fits any message `limits` accept, with room for its envelope:
    /// twice the message limit plus 64 KiB.
    pub fn request_bytes_for(limits: &Limits) -> usize {
        limits
            .max_message_bytes
            .saturating_mul(2)
            .saturating_add(64 * 1024)
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        let limits = Limits::default();
        Self {
            max_request_bytes: ServerConfig::request_bytes_for(&limits),
            limits,
            keepalive_interval: Some(Duration::from_secs(10)),
            keepalive_timeout: Duration::from_secs(10),
            auth_token: None,
            tls: None,
            tls_client_ca: None,
            drain_timeout: Duration::from_secs(5),
            max_connections: 512,
            handshake_timeout: Duration::from_secs(10),
            max_concurrent_streams: 128,
            request_timeout: Duration::from_secs(10),
            max_pending_request_bytes: 64 * 1024 * 1024,
            clock: Arc::new(TokioClock::new()),
            observer: None,
        }
    }
}

impl std::fmt::Debug for ServerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerConfig")
            .field("limits", &self.limits)
            .field("max_request_bytes", &self.max_request_bytes)
            .field("keepalive_interval", &self.keepalive_interval)
            .field("keepalive_timeout", &self.keepalive_timeout)
            .field("auth_token", &self.auth_token.as_ref().map(|_| "<set>"))
            .field("tls", &self.tls.is_some())
            .field("drain_timeout", &self.drain_timeout)
            .field("max_connections", &self.max_connections)
            .field("handshake_timeout", &self.handshake_timeout)
            .field("max_concurrent_streams", &self.max_concurrent_streams)
            .field("request_timeout", &self.request_timeout)
            .field("max_pending_request_bytes", &self.max_pending_request_bytes)
            .finish_non_exhaustive()
    }
}

/// Checks the bearer token on Broker RPCs.
#[derive(Clone)]
struct BearerAuth(Option<Arc<str>>);

impl Interceptor for BearerAuth {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(token) = &self.0 else {
            return Ok(request);
        };
        let given = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        match given {
            Some(given) if constant_time_eq(given.as_bytes(), token.as_bytes()) => Ok(request),
            Some(_) => Err(Status::unauthenticated("bearer token does not match")),
            None => Err(Status::unauthenticated(
                "missing `authorization: Bearer <token>` metadata",
            )),
        }
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Errors that stop the server.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The transport failed (listener error).
    #[error("transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The TLS certificate, key or client CA cannot be used.
    #[error("tls: {0}")]
    Tls(#[from] TlsError),
    /// The reflection service could not be built from the descriptor set.
    #[error("reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
}

/// A configured server and its backend, before it starts.
#[derive(Debug)]
pub struct Server {
    config: ServerConfig,
    backend: Backend,
    transport: Arc<TransportStats>,
}

impl Server {
    /// A server with a fresh, empty embedded broker.
    pub fn new(config: ServerConfig) -> Self {
        let broker = Broker::with_observer(
            config.limits.clone(),
            config.clock.clone(),
            config.observer.clone(),
        );
        Self::with_backend(config, Backend::Embedded(broker))
    }

    /// A server for `backend` (a cluster-mode gateway, or a broker built by the caller). Its
    /// limits are the backend's; `config` sets the transport.
    pub fn with_backend(config: ServerConfig, backend: Backend) -> Self {
        Self {
            config,
            backend,
            transport: Arc::default(),
        }
    }

    /// The broker holding the member streams this server will serve (for in-process
    /// inspection; a gateway's local broker).
    pub fn broker(&self) -> &Broker {
        self.backend.broker()
    }

    /// What the server serves.
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// The counters of the connection and request guards (for in-process inspection).
    pub fn transport_stats(&self) -> Arc<TransportStats> {
        self.transport.clone()
    }

    /// Serves the Broker, gRPC health and reflection services on `incoming` until `shutdown`
    /// completes; then drops `incoming` (so the listener refuses new clients at once), ends every
    /// member stream and every `PublishStream` with `UNAVAILABLE`, waits up to the drain timeout
    /// for connections to close, closes those still open, and returns.
    ///
    /// # Errors
    /// [`ServeError`] if the transport or reflection service cannot start.
    pub async fn run<I, IO, IE, F>(self, incoming: I, shutdown: F) -> Result<(), ServeError>
    where
        I: Stream<Item = Result<IO, IE>>,
        IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
        IO::ConnectInfo: Clone + Send + Sync + 'static,
        IE: Into<Box<dyn StdError + Send + Sync>>,
        F: Future<Output = ()>,
    {
        let Self {
            config,
            backend,
            transport,
        } = self;
        let broker = backend.broker().clone();
        let tls = match &config.tls {
            Some(identity) => Some(tls::acceptor(identity, config.tls_client_ca.as_ref())?),
            None => None,
        };
        let (health, health_service) = tonic_health::server::health_reporter();
        health.set_serving::<BrokerServer<BrokerService>>().await;
        let reflection = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1()?;
        let reflection_alpha = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1alpha()?;
        // Fired when shutdown starts: ends the service's streams the broker does not own.
        let stopping_streams = Arc::new(Signal::default());
        let service = BrokerServer::new(BrokerService::with_transport(
            backend,
            transport.clone(),
            stopping_streams.clone(),
        ))
        .max_decoding_message_size(config.max_request_bytes);
        let auth = BearerAuth(config.auth_token.as_deref().map(Arc::from));
        let service = OversizeAsResourceExhausted::new(
            tonic::service::interceptor::InterceptedService::new(service, auth),
            config.max_request_bytes,
        );

        // TLS is terminated by `Admission`'s connections, not by tonic: see `tls`.
        let mut builder = tonic::transport::Server::builder()
            .http2_keepalive_interval(config.keepalive_interval)
            .http2_keepalive_timeout(Some(config.keepalive_timeout))
            .max_concurrent_streams(Some(config.max_concurrent_streams.max(1)))
            .layer(RequestGuardLayer::new(
                config
                    .max_pending_request_bytes
                    .max(config.max_request_bytes),
                config.request_timeout,
                transport.clone(),
            ));
        let kill = Arc::new(Signal::default());
        let (incoming, closer) = Admission::new(
            incoming,
            config.max_connections.max(1),
            tls,
            config.handshake_timeout,
            transport,
            kill.clone(),
        );

        let expiry = tokio::spawn(broker.clone().run_expiry());
        let (drained_tx, drained_rx) = tokio::sync::oneshot::channel::<()>();
        let stopping = {
            let broker = broker.clone();
            async move {
                shutdown.await;
                closer.close();
                tracing::info!("shutting down: stopped accepting; ending every member stream");
                health
                    .set_not_serving::<BrokerServer<BrokerService>>()
                    .await;
                broker.shutdown();
                stopping_streams.fire();
                let _ = drained_tx.send(());
            }
        };
        let serve = builder
            .add_service(health_service)
            .add_service(reflection)
            .add_service(reflection_alpha)
            .add_service(service)
            .serve_with_incoming_shutdown(incoming, stopping);
        let drain_timeout = config.drain_timeout;
        let result = tokio::select! {
            biased;
            result = serve => result.map_err(ServeError::from),
            () = async {
                if drained_rx.await.is_ok() {
                    tokio::time::sleep(drain_timeout).await;
                } else {
                    std::future::pending::<()>().await;
                }
            } => {
                tracing::warn!(?drain_timeout, "connections did not drain in time; closing them");
                kill.fire();
                Ok(())
            }
        };
        expiry.abort();
        result
    }
}

/// The incoming connections of a bound TCP listener, with `TCP_NODELAY` set on each (without it
/// Nagle's algorithm holds small frames, acks and single deliveries, back for tens of
/// milliseconds), backing off on accept errors (see [`TcpAccept`]).
pub fn tcp_incoming(listener: tokio::net::TcpListener) -> TcpAccept {
    TcpAccept::new(listener)
}
