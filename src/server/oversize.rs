//! Makes an over-the-limit request answer `RESOURCE_EXHAUSTED`, as gRPC convention has it for
//! size limits, instead of tonic's own `OUT_OF_RANGE` from its decoder (docs/semantics.md#limits-table).
//!
//! The Broker handlers never answer `OUT_OF_RANGE` themselves, so on this service that status can
//! only come from the decoder refusing a request over `max_request_bytes`.

use std::{
    pin::Pin,
    task::{Context, Poll},
};

use tonic::{
    codegen::{Service, http},
    server::NamedService,
};

/// Wraps the Broker service; rewrites the decoder's `OUT_OF_RANGE` to `RESOURCE_EXHAUSTED`.
#[derive(Debug, Clone)]
pub struct OversizeAsResourceExhausted<S> {
    inner: S,
    message: http::HeaderValue,
}

impl<S> OversizeAsResourceExhausted<S> {
    /// Wraps `inner`, whose decode limit is `limit` bytes.
    pub fn new(inner: S, limit: usize) -> Self {
        // Printable ASCII only, so it needs no percent-encoding in `grpc-message`.
        let text = format!(
            "request is larger than the max_request_bytes limit of {limit} bytes (messages are limited to max_message_bytes; split large batches)"
        );
        Self {
            inner,
            message: http::HeaderValue::from_str(&text)
                .unwrap_or_else(|_| http::HeaderValue::from_static("request too large")),
        }
    }
}

impl<S: NamedService> NamedService for OversizeAsResourceExhausted<S> {
    const NAME: &'static str = S::NAME;
}

const OUT_OF_RANGE: &str = "11";
const RESOURCE_EXHAUSTED: &str = "8";

impl<S, Req, ResBody> Service<Req> for OversizeAsResourceExhausted<S>
where
    S: Service<Req, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let future = self.inner.call(request);
        let message = self.message.clone();
        Box::pin(async move {
            let mut response = future.await?;
            let headers = response.headers_mut();
            if headers
                .get("grpc-status")
                .is_some_and(|s| s == OUT_OF_RANGE)
            {
                headers.insert(
                    "grpc-status",
                    http::HeaderValue::from_static(RESOURCE_EXHAUSTED),
                );
                headers.insert("grpc-message", message);
            }
            Ok(response)
        })
    }
}
