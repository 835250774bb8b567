//! `PublishStream` (docs/semantics.md#carriages): publishes without one HTTP/2 request each. One state machine for
//! both deployments: it reads the requests, validates each into a draft (or its refusal), hands
//! them to the backend's [`Publisher`] while it takes more, and writes one answer per request,
//! in request order. What differs (published together and answered at once by the embedded
//! broker, sent one by one and answered on JetStream's confirmations by a gateway) is the
//! publisher's.

use std::{
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use tokio_stream::Stream;
use tonic::{Code, Status, Streaming};

use super::{
    draft_reusing,
    status::{oversize_as_resource_exhausted, status},
};
use crate::{
    backend::{Backend, Publisher},
    broker::Published,
    core::{Envelope, Error, Limits},
    pb,
    transport::Signal,
};

/// The responses of a `PublishStream`, one per request, in order, ended with `UNAVAILABLE`
/// once shutdown starts.
///
/// Requests are published in the order read; a refusal is an answer, not the end of the
/// stream. An undecodable request or a transport error ends the stream once every request
/// before it is answered.
pub struct PublishResults {
    publisher: Publisher,
    limits: Limits,
    requests: Streaming<pb::PublishRequest>,
    /// The client sent its last request (or its side broke: `end_with`).
    requests_done: bool,
    /// The last envelope built, reused (or its topic) while a publisher keeps to one topic.
    recent: Option<Envelope>,
    /// The final status to end with once every earlier request is answered.
    end_with: Option<Status>,
    /// Completes when shutdown starts. Polled only while no request is ready (and before each
    /// one when the publisher does not meet the broker's own shutdown refusal), so a busy
    /// stream to the embedded broker pays nothing for it.
    stopping: Pin<Box<dyn Future<Output = ()> + Send>>,
    ended: bool,
}

impl std::fmt::Debug for PublishResults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PublishResults")
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

/// Why reading stopped for now.
enum Read {
    /// Requests were taken (or the client's side ended): answer them first.
    Took,
    /// The publisher takes no more until its answers move on (it wakes the stream).
    Full,
    /// The client has sent nothing more yet.
    Idle,
}

impl PublishResults {
    /// Ends the stream with `status`: tonic sends it as the stream's final status.
    fn end(&mut self, status: Status) -> Poll<Option<<Self as Stream>::Item>> {
        self.ended = true;
        Poll::Ready(Some(Err(status)))
    }

    /// Reads what the client has sent while the publisher takes it. `Err` carries the status
    /// the stream ends with at once (shutdown, seen between two requests).
    fn read(&mut self, cx: &mut Context<'_>) -> Result<Read, Status> {
        let mut took = false;
        loop {
            if self.publisher.poll_ready(cx).is_pending() {
                return Ok(if took { Read::Took } else { Read::Full });
            }
            match Pin::new(&mut self.requests).poll_next(cx) {
                Poll::Ready(Some(Ok(request))) => {
                    // Nothing at a gateway meets the broker's shutdown refusal, so look for
                    // shutdown before every request there.
                    if !self.publisher.refused_at_shutdown()
                        && self.stopping.as_mut().poll(cx).is_ready()
                    {
                        return Err(status(&Error::ShuttingDown));
                    }
                    let draft = draft_reusing(request, &self.limits, &mut self.recent);
                    self.publisher.push(draft);
                    took = true;
                }
                // Undecodable input or a transport error: what was sent before it is still
                // answered (a gateway's JetStream may have stored it), then the stream ends
                // with it.
                Poll::Ready(Some(Err(status))) => {
                    self.requests_done = true;
                    self.end_with = Some(oversize_as_resource_exhausted(status));
                    return Ok(Read::Took);
                }
                Poll::Ready(None) => {
                    self.requests_done = true;
                    return Ok(Read::Took);
                }
                Poll::Pending => return Ok(if took { Read::Took } else { Read::Idle }),
            }
        }
    }
}

impl Stream for PublishResults {
    type Item = Result<pb::PublishStreamResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.ended {
            return Poll::Ready(None);
        }
        loop {
            match this.publisher.poll_answer(cx) {
                // What came after the broker's first `ShuttingDown` was refused with it too:
                // the stream ends there.
                Poll::Ready(Some(Err(Error::ShuttingDown))) => {
                    return this.end(status(&Error::ShuttingDown));
                }
                Poll::Ready(Some(result)) => return Poll::Ready(Some(Ok(answer(result)))),
                Poll::Ready(None) if this.requests_done => {
                    if let Some(status) = this.end_with.take() {
                        return this.end(status);
                    }
                    this.ended = true;
                    return Poll::Ready(None);
                }
                Poll::Ready(None) | Poll::Pending => {}
            }
            // The client is done: what it sent is answered as the publisher confirms it.
            if this.requests_done {
                return Poll::Pending;
            }
            match this.read(cx) {
                Ok(Read::Took) => continue,
                Ok(Read::Full) => return Poll::Pending,
                Ok(Read::Idle) => {
                    // The client may keep the stream open and idle for ever: without this,
                    // shutdown would wait out the whole drain for it.
                    if this.stopping.as_mut().poll(cx).is_ready() {
                        return this.end(status(&Error::ShuttingDown));
                    }
                    return Poll::Pending;
                }
                Err(status) => return this.end(status),
            }
        }
    }
}

/// A request's answer: its publish, or why it was refused.
fn answer(result: Result<Published, Error>) -> pb::PublishStreamResponse {
    match result {
        Ok(published) => pb::PublishStreamResponse {
            system_id: published.system_id,
            queued_for: published.queued_for,
            code: Code::Ok as i32,
            message: String::new(),
        },
        Err(error) => {
            let refused = status(&error);
            pb::PublishStreamResponse {
                system_id: 0,
                queued_for: 0,
                code: refused.code() as i32,
                message: refused.message().to_string(),
            }
        }
    }
}

/// Answers the `requests` of one `PublishStream` (see [`PublishResults`]); the stream ends
/// with `UNAVAILABLE` once `stopping` fires.
pub(super) fn publish_stream(
    backend: &Backend,
    requests: Streaming<pb::PublishRequest>,
    stopping: &Arc<Signal>,
) -> PublishResults {
    PublishResults {
        publisher: backend.publisher(),
        limits: backend.limits().clone(),
        requests,
        requests_done: false,
        recent: None,
        end_with: None,
        stopping: Box::pin(stopping.clone().wait()),
        ended: false,
    }
}
