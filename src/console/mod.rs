//! The live web console (docs/operations.md#console): who leads what, since when, who waits,
//! what is queued, in either deployment, from the same [`Backend`] the gRPC service uses.
//!
//! - [`hub`] looks at the deployment after each change and every second while a page is open,
//!   and keeps rates and leadership timelines; [`view`] and [`timeline`] are pure.
//! - This file is the HTTP shell: axum routes, the token check, the cross-site guard on
//!   actions, security headers (a Content-Security-Policy with no inline script), TLS when the
//!   gRPC listener has it, and bounds on connections and open live streams. Refusals become
//!   JSON with the gRPC code's name and the matching HTTP status, in [`refusal`] only.
//!
//! Its assets (`assets/`) are compiled into the binary: no network, no build step.

mod guard;
pub mod hub;
mod rates;
pub mod timeline;
pub mod view;

use guard::{Refusal, refusal_with};
pub use guard::{addressed_by_ip_or_localhost, addressed_to, authorized, refusal, same_origin};

use std::{convert::Infallible, net::SocketAddr, sync::Arc, time::Duration};

use axum::{
    Json, Router,
    extract::{Path, Query, State},
    http::{StatusCode, header},
    middleware,
    response::{
        IntoResponse, Response,
        sse::{Event, KeepAlive, Sse},
    },
    routing::{get, post},
};
use serde::{Deserialize, Serialize};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;

use self::hub::Hub;
use crate::{backend::Backend, clock::Clock, core::Error, transport::TransportStats};

/// The console's settings.
#[derive(Clone)]
pub struct ConsoleConfig {
    /// With a token, every request needs it (HTTP Basic with the token as password, or
    /// `Authorization: Bearer`).
    pub token: Option<Arc<str>>,
    /// No actions: `HandOver` and `DeleteSubscription` are refused and not offered.
    pub read_only: bool,
    /// Serve HTTPS with this acceptor (HTTP/1.1).
    pub tls: Option<TlsAcceptor>,
    /// Most connections open at once; more are closed at once.
    pub max_connections: usize,
    /// Most live streams (open pages) at once; more are answered 503.
    pub max_streams: usize,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        Self {
            token: None,
            read_only: false,
            tls: None,
            max_connections: 128,
            max_streams: 64,
        }
    }
}

impl std::fmt::Debug for ConsoleConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsoleConfig")
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("read_only", &self.read_only)
            .field("tls", &self.tls.is_some())
            .field("max_connections", &self.max_connections)
            .field("max_streams", &self.max_streams)
            .finish()
    }
}

/// Sent on every response: scripts and styles from this origin only, no inline script, no
/// framing, nothing fetched from elsewhere.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The header an action must carry: a page of another site cannot set it without the
/// console's consent (which it never gives), so a cross-site form or script cannot act.
pub const ACTION_HEADER: &str = "x-tinybroker-console";

/// How long a new connection may take to send its request headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a TLS handshake may take.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a request waits for the console's first look.
const FIRST_LOOK_PATIENCE: Duration = Duration::from_secs(5);

struct Shared {
    hub: Arc<Hub>,
    config: ConsoleConfig,
    streams: Arc<Semaphore>,
}

type AppState = Arc<Shared>;

/// The console's routes over `hub` (for tests and for [`serve`]).
pub fn router(hub: Arc<Hub>, config: ConsoleConfig) -> Router {
    let shared = Arc::new(Shared {
        hub,
        streams: Arc::new(Semaphore::new(config.max_streams.max(1))),
        config,
    });
    Router::new()
        .route("/", get(index))
        .route("/assets/{name}", get(asset))
        .route("/api/overview", get(overview))
        .route("/api/subscriptions/{id}", get(subscription))
        .route("/api/subscriptions/{id}/hand-over", post(hand_over))
        .route("/api/subscriptions/{id}/delete", post(delete))
        .route("/api/stream", get(stream))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(shared.clone(), guard::guard))
        .with_state(shared)
}

/// Starts the console's look at `backend` and serves it on `listener` until `shutdown`.
pub async fn serve(
    backend: Backend,
    clock: Arc<dyn Clock>,
    transport: Arc<TransportStats>,
    config: ConsoleConfig,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()>,
) {
    let hub = Arc::new(Hub::new(backend, clock, transport));
    let looking = tokio::spawn(hub.clone().run());
    let tls = config.tls.clone();
    let connections = Arc::new(Semaphore::new(config.max_connections.max(1)));
    let app = router(hub, config);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::debug!(%error, "console listener: accept failed");
                    continue;
                }
            },
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            tracing::debug!(%peer, "console: too many connections; one more closed");
            continue;
        };
        let app = app.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let _permit = permit;
            match tls {
                Some(acceptor) => {
                    match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await
                    {
                        Ok(Ok(tls)) => connection(tls, app, peer).await,
                        Ok(Err(error)) => {
                            tracing::debug!(%peer, %error, "console: TLS handshake failed");
                        }
                        Err(_) => tracing::debug!(%peer, "console: TLS handshake timed out"),
                    }
                }
                None => connection(stream, app, peer).await,
            }
        });
    }
    looking.abort();
}

async fn connection<IO>(io: IO, app: Router, peer: SocketAddr)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use tower::ServiceExt as _;
    let service =
        hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
            app.clone().oneshot(request.map(axum::body::Body::new))
        });
    if let Err(error) = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(hyper_util::rt::TokioIo::new(io), service)
        .await
    {
        tracing::debug!(%peer, %error, "console connection ended with an error");
    }
}

async fn not_found() -> Response {
    refusal_with(StatusCode::NOT_FOUND, "NOT_FOUND", "no such page")
}

const INDEX: &str = include_str!("assets/index.html");
const SCRIPT: &str = include_str!("assets/console.js");
const STYLE: &str = include_str!("assets/console.css");
const ICON: &str = include_str!("assets/favicon.svg");

async fn index() -> Response {
    static_asset("text/html; charset=utf-8", INDEX)
}

async fn asset(Path(name): Path<String>) -> Response {
    match name.as_str() {
        "console.js" => static_asset("text/javascript; charset=utf-8", SCRIPT),
        "console.css" => static_asset("text/css; charset=utf-8", STYLE),
        "favicon.svg" => static_asset("image/svg+xml", ICON),
        _ => not_found().await,
    }
}

fn static_asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// What a page shows: the overview (a search and a page) or one subscription.
#[derive(Debug, Clone, Deserialize)]
struct ViewQuery {
    #[serde(default)]
    view: Option<String>,
    #[serde(default)]
    q: Option<String>,
    #[serde(default)]
    page: Option<String>,
    #[serde(default)]
    id: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
enum Page {
    Overview { q: String, page: usize },
    Subscription(String),
}

impl Page {
    fn parse(query: &ViewQuery) -> Result<Self, Error> {
        match query.view.as_deref().unwrap_or("overview") {
            "overview" => Ok(Page::Overview {
                q: query.q.clone().unwrap_or_default(),
                page: query
                    .page
                    .as_deref()
                    .and_then(|p| p.parse().ok())
                    .unwrap_or(1),
            }),
            "subscription" => Ok(Page::Subscription(query.id.clone().unwrap_or_default())),
            other => Err(Error::InvalidArgument(format!(
                "view must be overview or subscription, not {:?}",
                other.chars().take(40).collect::<String>()
            ))),
        }
    }
}

/// A page rendered from one look: its event name and JSON.
fn render(shared: &Shared, snapshot: &hub::Snapshot, page: &Page) -> (&'static str, String) {
    let hub = &shared.hub;
    match page {
        Page::Overview { q, page } => {
            let overview = view::overview(snapshot, q, *page, shared.config.read_only, |id| {
                hub.since(id)
            });
            (
                "overview",
                serde_json::to_string(&overview).unwrap_or_default(),
            )
        }
        Page::Subscription(id) => match detail(shared, snapshot, id) {
            Some(detail) => (
                "subscription",
                serde_json::to_string(&detail).unwrap_or_default(),
            ),
            None => (
                "gone",
                serde_json::to_string(&Refusal {
                    error: &format!("subscription {id:?} not found"),
                    code: "NOT_FOUND",
                })
                .unwrap_or_default(),
            ),
        },
    }
}

fn detail(shared: &Shared, snapshot: &hub::Snapshot, id: &str) -> Option<view::Detail> {
    let record = shared.hub.fresh(snapshot.find(id)?);
    let record = &record;
    let since = shared.hub.since(id);
    let (timeline, samples) = shared.hub.history(id, snapshot.now_ms);
    let this_gateway = snapshot.gateway.as_ref().map(|g| g.id);
    Some(view::Detail {
        now_ms: snapshot.now_ms,
        read_only: shared.config.read_only,
        deployment: snapshot.deployment(),
        subscription: view::row(record, since),
        line: view::line(record, this_gateway),
        timeline,
        rates: view::RateSeries {
            interval_ms: hub::TICK.as_millis() as u64,
            published: samples.iter().map(|s| s.0).collect(),
            acked: samples.iter().map(|s| s.1).collect(),
        },
    })
}

fn json_body(body: String) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

async fn overview(State(shared): State<AppState>, Query(query): Query<ViewQuery>) -> Response {
    let page = match Page::parse(&ViewQuery {
        view: None,
        ..query
    }) {
        Ok(page) => page,
        Err(error) => return refusal(&error),
    };
    let _viewer = shared.hub.viewer();
    let snapshot = shared.hub.current(FIRST_LOOK_PATIENCE).await;
    json_body(render(&shared, &snapshot, &page).1)
}

async fn subscription(State(shared): State<AppState>, Path(id): Path<String>) -> Response {
    if let Err(error) =
        crate::service::validate::check_subscription_id(&id, shared.hub.backend().limits())
    {
        return refusal(&error);
    }
    let _viewer = shared.hub.viewer();
    let snapshot = shared.hub.current(FIRST_LOOK_PATIENCE).await;
    match render(&shared, &snapshot, &Page::Subscription(id)) {
        ("gone", body) => (StatusCode::NOT_FOUND, json_body(body)).into_response(),
        (_, body) => json_body(body),
    }
}

/// A live page: its first state at once, then each time what it shows changes.
async fn stream(State(shared): State<AppState>, Query(query): Query<ViewQuery>) -> Response {
    let page = match Page::parse(&query) {
        Ok(page) => page,
        Err(error) => return refusal(&error),
    };
    if let Page::Subscription(id) = &page
        && let Err(error) =
            crate::service::validate::check_subscription_id(id, shared.hub.backend().limits())
    {
        return refusal(&error);
    }
    let Ok(permit) = shared.streams.clone().try_acquire_owned() else {
        return refusal_with(
            StatusCode::SERVICE_UNAVAILABLE,
            "UNAVAILABLE",
            "too many console pages are open; close one and reload",
        );
    };
    // One event waits at most: a page that does not read holds that and its socket's buffers.
    let (events, receiver) = mpsc::channel::<Event>(1);
    let shared_task = shared.clone();
    tokio::spawn(async move {
        let _permit = permit;
        let _viewer = shared_task.hub.viewer();
        let mut snapshots = shared_task.hub.snapshots();
        shared_task.hub.current(FIRST_LOOK_PATIENCE).await;
        let mut last = String::new();
        loop {
            let snapshot = snapshots.borrow_and_update().clone();
            if snapshot.ready {
                let (name, body) = render(&shared_task, &snapshot, &page);
                if body != last {
                    if events
                        .send(Event::default().event(name).data(&body))
                        .await
                        .is_err()
                    {
                        return;
                    }
                    last = body;
                }
            }
            tokio::select! {
                changed = snapshots.changed() => if changed.is_err() { return },
                () = events.closed() => return,
            }
        }
    });
    let events = tokio_stream::wrappers::ReceiverStream::new(receiver);
    let events = tokio_stream::StreamExt::map(events, Ok::<_, Infallible>);
    Sse::new(events)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

#[derive(Serialize)]
struct HandOverAnswer {
    epoch: String,
    member: String,
    previous_epoch: String,
    previous_member: String,
}

#[derive(Serialize)]
struct DeleteAnswer {
    deleted_messages: u64,
}

async fn hand_over(State(shared): State<AppState>, Path(id): Path<String>) -> Response {
    act(&shared, &id, "hand-over", |backend, id| async move {
        backend.hand_over(&id).await.map(|done| HandOverAnswer {
            epoch: done.epoch.to_string(),
            member: done.member.to_string(),
            previous_epoch: done.previous_epoch.to_string(),
            previous_member: done.previous_member.to_string(),
        })
    })
    .await
}

async fn delete(State(shared): State<AppState>, Path(id): Path<String>) -> Response {
    act(&shared, &id, "delete", |backend, id| async move {
        backend.delete(&id).await.map(|deleted| DeleteAnswer {
            deleted_messages: deleted.discarded_messages,
        })
    })
    .await
}

/// An action on subscription `id`, unless the console is read-only or the id is invalid:
/// its answer as JSON, or its refusal; logged either way.
async fn act<T, F>(
    shared: &Shared,
    id: &str,
    what: &'static str,
    run: impl FnOnce(Backend, String) -> F,
) -> Response
where
    T: Serialize,
    F: Future<Output = Result<T, Error>>,
{
    if let Some(refused) = check_action(shared, id) {
        return refused;
    }
    match run(shared.hub.backend().clone(), id.to_string()).await {
        Ok(answer) => {
            tracing::info!(subscription = %id, action = what, "console: {what} done");
            Json(answer).into_response()
        }
        Err(error) => {
            tracing::info!(subscription = %id, action = what, %error, "console: {what} refused");
            refusal(&error)
        }
    }
}

fn check_action(shared: &Shared, id: &str) -> Option<Response> {
    if shared.config.read_only {
        return Some(refusal_with(
            StatusCode::FORBIDDEN,
            "PERMISSION_DENIED",
            "the console is read-only (--console-read-only)",
        ));
    }
    crate::service::validate::check_subscription_id(id, shared.hub.backend().limits())
        .err()
        .map(|e| refusal(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_is_the_overview_or_one_subscription() {
        let q = |view: Option<&str>, page: Option<&str>| ViewQuery {
            view: view.map(String::from),
            q: Some("x".into()),
            page: page.map(String::from),
            id: Some("a b".into()),
        };
        assert_eq!(
            Page::parse(&q(None, Some("3"))).unwrap(),
            Page::Overview {
                q: "x".into(),
                page: 3
            }
        );
        assert_eq!(
            Page::parse(&q(Some("overview"), Some("-1"))).unwrap(),
            Page::Overview {
                q: "x".into(),
                page: 1
            }
        );
        assert_eq!(
            Page::parse(&q(Some("subscription"), None)).unwrap(),
            Page::Subscription("a b".into())
        );
        assert!(Page::parse(&q(Some("<script>"), None)).is_err());
    }
}
