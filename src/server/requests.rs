//! Bounds what unfinished request bodies can cost: a server-wide byte budget and a deadline.
//!
//! tonic reads a request body into its own buffer as it arrives (releasing HTTP/2 flow-control
//! window as it goes) until the whole message is there, so a client that sends most of a large
//! message and never the rest makes the server hold it, once per stream. This layer wraps every
//! request body:
//! - each data frame is charged to a server-wide budget (`max_pending_request_bytes`); a frame
//!   that does not fit fails its request with `RESOURCE_EXHAUSTED`, which frees its bytes. So
//!   ordinary small requests keep flowing while large ones are refused, requests whose bytes so
//!   far fit in [`SMALL_REQUEST_BYTES`] may use a further quarter of the budget.
//! - a request body must be complete within `request_timeout`, else `DEADLINE_EXCEEDED`.
//!
//! Bodies of [`LONG_LIVED_REQUEST_BODIES`] (client-streaming RPCs) may stay open: each of their
//! messages is charged only until it is complete, and the deadline runs only while one is
//! incomplete. A client-streaming RPC added to any service must be listed there.

use std::{
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    task::{Context, Poll, ready},
    time::Duration,
};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tokio::time::Sleep;
use tonic::{Status, body::Body, codegen::http};

use crate::transport::TransportStats;

/// Requests no larger than this so far may use the reserve above the budget.
pub const SMALL_REQUEST_BYTES: usize = 64 * 1024;

/// Paths whose request body is a long-lived stream of messages.
pub const LONG_LIVED_REQUEST_BODIES: &[&str] = &[
    "/tinybroker.v1.Broker/Consume",
    "/tinybroker.v1.Broker/PublishStream",
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
];

/// The server-wide budget of bytes held by unfinished request bodies.
#[derive(Debug)]
struct Budget {
    used: AtomicUsize,
    limit: usize,
    small_limit: usize,
}

impl Budget {
    fn charge(&self, bytes: usize, limit: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|total| *total <= limit)
            })
            .is_ok()
    }

    fn release(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }
}

#[derive(Debug)]
struct Shared {
    budget: Budget,
    timeout: Duration,
    stats: Arc<TransportStats>,
}

/// A tower layer applying the budget and deadline to every request body.
#[derive(Debug, Clone)]
pub struct RequestGuardLayer(Arc<Shared>);

impl RequestGuardLayer {
    /// A layer with `max_pending_bytes` of budget (plus a quarter for small requests) and
    /// `timeout` to receive a body.
    pub fn new(max_pending_bytes: usize, timeout: Duration, stats: Arc<TransportStats>) -> Self {
        Self(Arc::new(Shared {
            budget: Budget {
                used: AtomicUsize::new(0),
                limit: max_pending_bytes,
                small_limit: max_pending_bytes.saturating_add(max_pending_bytes / 4),
            },
            timeout,
            stats,
        }))
    }
}

impl<S> tower_layer::Layer<S> for RequestGuardLayer {
    type Service = RequestGuard<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RequestGuard {
            inner,
            shared: self.0.clone(),
        }
    }
}

/// The service [`RequestGuardLayer`] makes.
#[derive(Debug, Clone)]
pub struct RequestGuard<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> tonic::codegen::Service<http::Request<Body>> for RequestGuard<S>
where
    S: tonic::codegen::Service<http::Request<Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let long_lived = LONG_LIVED_REQUEST_BODIES.contains(&request.uri().path());
        let shared = self.shared.clone();
        let request = request.map(|body| {
            Body::new(GuardedBody {
                deadline: (!long_lived).then(|| Box::pin(tokio::time::sleep(shared.timeout))),
                inner: body,
                long_lived,
                charged: 0,
                framing: Framing::default(),
                failed: false,
                shared,
            })
        });
        self.inner.call(request)
    }
}

/// Where a body stands in gRPC's length-prefixed framing (1 flag byte, 4 length bytes, data).
#[derive(Debug, Default)]
struct Framing {
    header: [u8; 5],
    header_filled: usize,
    data_left: usize,
}

impl Framing {
    fn advance(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            if self.data_left > 0 {
                let taken = self.data_left.min(data.len());
                self.data_left -= taken;
                data = &data[taken..];
            } else {
                let taken = (5 - self.header_filled).min(data.len());
                self.header[self.header_filled..self.header_filled + taken]
                    .copy_from_slice(&data[..taken]);
                self.header_filled += taken;
                data = &data[taken..];
                if self.header_filled == 5 {
                    let [_, a, b, c, d] = self.header;
                    self.data_left = u32::from_be_bytes([a, b, c, d]) as usize;
                    self.header_filled = 0;
                }
            }
        }
    }

    fn between_messages(&self) -> bool {
        self.header_filled == 0 && self.data_left == 0
    }
}

struct GuardedBody {
    inner: Body,
    shared: Arc<Shared>,
    deadline: Option<Pin<Box<Sleep>>>,
    long_lived: bool,
    charged: usize,
    framing: Framing,
    failed: bool,
}

impl GuardedBody {
    fn release(&mut self) {
        self.shared.budget.release(self.charged);
        self.charged = 0;
    }

    fn fail(&mut self, status: Status) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        self.failed = true;
        self.deadline = None;
        self.release();
        Poll::Ready(Some(Err(status)))
    }

    /// Charges `bytes` more of this request; `false` if the budget cannot take them.
    fn charge(&mut self, bytes: usize) -> bool {
        let budget = &self.shared.budget;
        let total = self.charged.saturating_add(bytes);
        let limit = if total <= SMALL_REQUEST_BYTES {
            budget.small_limit
        } else {
            budget.limit
        };
        let ok = budget.charge(bytes, limit);
        if ok {
            self.charged = total;
        }
        ok
    }
}

impl Drop for GuardedBody {
    fn drop(&mut self) {
        self.release();
    }
}

impl HttpBody for GuardedBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        if this.failed {
            return Poll::Ready(None);
        }
        if let Some(deadline) = &mut this.deadline
            && deadline.as_mut().poll(cx).is_ready()
        {
            this.shared.stats.request_timed_out();
            let timeout = this.shared.timeout;
            return this.fail(Status::deadline_exceeded(format!(
                "the request body did not arrive within the request_timeout of {timeout:?}"
            )));
        }
        match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    if !this.charge(data.len()) {
                        this.shared.stats.request_over_budget();
                        let limit = this.shared.budget.limit;
                        return this.fail(Status::resource_exhausted(format!(
                            "the server is already receiving its max_pending_request_bytes of {limit} bytes of unfinished requests; retry later"
                        )));
                    }
                    if this.long_lived {
                        this.framing.advance(data);
                        if this.framing.between_messages() {
                            // Every message so far is complete and goes to the handler now.
                            this.release();
                            this.deadline = None;
                        } else if this.deadline.is_none() {
                            // A message has started: it must be complete in time.
                            this.deadline = Some(Box::pin(tokio::time::sleep(this.shared.timeout)));
                        }
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Some(Err(status)) => Poll::Ready(Some(Err(status))),
            None => {
                this.deadline = None;
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn framing_finds_message_boundaries_across_chunks() {
        let mut framing = Framing::default();
        assert!(framing.between_messages());
        framing.advance(&[0, 0, 0]);
        assert!(!framing.between_messages());
        framing.advance(&[0, 3, b'a']);
        assert!(!framing.between_messages());
        framing.advance(&[b'b', b'c', 0, 0, 0, 0, 0]);
        // The second message is empty: its header completes it.
        assert!(framing.between_messages());
    }

    #[test]
    fn small_requests_may_use_the_reserve_large_ones_may_not() {
        let budget = Budget {
            used: AtomicUsize::new(0),
            limit: 100,
            small_limit: 125,
        };
        assert!(budget.charge(100, budget.limit));
        assert!(!budget.charge(1, budget.limit));
        assert!(budget.charge(25, budget.small_limit));
        assert!(!budget.charge(1, budget.small_limit));
        budget.release(125);
        assert_eq!(budget.used.load(Ordering::Relaxed), 0);
    }
}
