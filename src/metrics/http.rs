//! A minimal HTTP/1.1 server for `GET /metrics`, on the hyper already under tonic.

use std::{convert::Infallible, time::Duration};

use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode, body::Bytes, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};

use super::Metrics;

/// The content type of the Prometheus text exposition format.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A scraper sends its request at once; a connection that dribbles its headers is closed
/// rather than held open forever.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

pub(super) async fn serve(
    metrics: Metrics,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()>,
) {
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            () = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    // Per-connection failures (e.g. the peer reset before accept); the listener
                    // itself stays usable.
                    tracing::debug!(%error, "metrics listener: accept failed");
                    continue;
                }
            },
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let metrics = metrics.clone();
                async move { Ok::<_, Infallible>(respond(&metrics, &request)) }
            });
            if let Err(error) = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%error, "metrics connection ended with an error");
            }
        });
    }
}

fn respond<B>(metrics: &Metrics, request: &Request<B>) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match (request.method(), request.uri().path()) {
        (&Method::GET, "/metrics") => (StatusCode::OK, CONTENT_TYPE, metrics.encode()),
        (_, "/metrics") => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "use GET\n".to_string(),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "metrics are at /metrics\n".to_string(),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = content_type.parse() {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, value);
    }
    response
}
