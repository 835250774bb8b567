//! The streaming carriages beside the seed's unary calls (SPEC §8): `Consume`, a subscription
//! whose acks and nacks travel on its own stream, and `PublishStream`, publishes without one
//! HTTP/2 request each. Same broker, same semantics; only the carriage differs.

use std::{
    collections::VecDeque,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use tokio_stream::Stream;
use tonic::{Code, Request, Status, Streaming};

use super::{
    BrokerService, FrameStream, code, draft_reusing, open_request, status, wire::WireFrame,
};
use crate::{
    broker::{Broker, Published, Settler},
    cluster::gateway::{
        Gateway,
        publish::{Sent, Unconfirmed},
    },
    core::{AckMode, Draft, Envelope, Error, SystemId},
    pb::{self, consume_request::Request as Carried, subscription_frame::Frame},
    transport::{Signal, conn::connection_of},
};

type FrameResult = Result<WireFrame, Status>;

/// Most `PublishStream` requests read ahead of their answers and published together (one
/// routing and one round of locks for a run to one topic: [`Broker::publish_each`]).
const READ_AHEAD: usize = crate::broker::RUN_LIMIT;

/// Read-ahead stops once the requests read hold this many payload and envelope bytes (a single
/// larger message is still read, alone).
const READ_AHEAD_BYTES: usize = 64 * 1024;

/// A `Consume` stream: the member's frames, interleaved with refusals of its own settles, ended
/// by the first terminal status (the broker's, or one about the client's side of the stream).
///
/// The client's settles are read and applied inside `poll_next`, on the task that writes the
/// frames: an ack that frees the window is followed by the next frame in the same poll, with
/// no task in between to wake.
#[derive(Debug)]
pub struct ConsumeStream {
    frames: FrameStream,
    requests: Streaming<pb::ConsumeRequest>,
    settler: Settler,
    /// An ack-free member has nothing to settle, so its half-close changes nothing.
    ack_free: bool,
    requests_done: bool,
    refusals: VecDeque<FrameResult>,
    /// Why the stream ends, once the client's side said so; sent after pending refusals.
    terminal: Option<Status>,
    ended: bool,
}

impl ConsumeStream {
    /// Reads what the client sent so far, applying settles, until its side has nothing ready,
    /// ends, or a settle's refusals wait to be written. The refusals of at most one settle are
    /// ever held (a few frames naming at most the member's window of ids, no more than the
    /// client itself sent): a client that floods bad acks and never reads is slowed by HTTP/2
    /// flow control, not buffered.
    fn read_settles(&mut self, cx: &mut Context<'_>) {
        while !self.requests_done && self.terminal.is_none() && self.refusals.is_empty() {
            let request = match Pin::new(&mut self.requests).poll_next(cx) {
                Poll::Pending => return,
                Poll::Ready(request) => request,
            };
            let settle = match request {
                Some(Ok(pb::ConsumeRequest {
                    request: Some(Carried::Settle(settle)),
                })) => settle,
                Some(Ok(pb::ConsumeRequest {
                    request: Some(Carried::Open(_)),
                })) => {
                    self.terminal = Some(Status::invalid_argument(
                        "`open` may only be the first ConsumeRequest of a stream; the member left",
                    ));
                    return;
                }
                Some(Ok(pb::ConsumeRequest { request: None })) => {
                    self.terminal = Some(Status::invalid_argument(
                        "a ConsumeRequest must carry `settle`; the member left",
                    ));
                    return;
                }
                // Undecodable input or a transport error: the member leaves; nothing is lost.
                Some(Err(error)) => {
                    self.terminal = Some(oversize_as_resource_exhausted(error));
                    return;
                }
                None if self.ack_free => {
                    self.requests_done = true;
                    return;
                }
                None => {
                    self.terminal = Some(Status::new(
                        Code::Ok,
                        "the client closed its side of the stream, so it can settle nothing more: the member left and its unacked messages went back to the queue",
                    ));
                    return;
                }
            };
            match self.settler.settle(&settle.ack, &settle.nack) {
                Ok(refused) => self.refusals.extend(coalesce(refused)),
                Err(error) => self.refusals.push_back(refused_frame(
                    pb::SettleRefused {
                        system_id: 0,
                        ..Default::default()
                    },
                    &error,
                )),
            }
        }
    }
}

/// One frame per (ack or nack, kind of refusal) for the refusals of one settle, in the order
/// first seen: a settle's refusals cost a few frames, however many ids it named.
fn coalesce(refused: Vec<(SystemId, bool, Error)>) -> Vec<FrameResult> {
    let mut groups: Vec<(pb::SettleRefused, Error)> = Vec::new();
    for (system_id, nack, error) in refused {
        let code = code(&error) as i32;
        // Same kind of refusal, not only the same code: a frame's message gives the reason of
        // every id it names (not yet sent and not the holder share FAILED_PRECONDITION).
        let kind = std::mem::discriminant(&error);
        match groups.iter_mut().find(|(g, first)| {
            g.nack == nack && g.code == code && std::mem::discriminant(first) == kind
        }) {
            Some((group, _)) => group.more_system_ids.push(system_id),
            None => groups.push((
                pb::SettleRefused {
                    system_id,
                    nack,
                    code,
                    ..Default::default()
                },
                error,
            )),
        }
    }
    groups
        .into_iter()
        .map(|(group, error)| refused_frame(group, &error))
        .collect()
}

/// A refusal frame: `error`'s code and message (the first id's, with a count of the others).
fn refused_frame(mut frame: pb::SettleRefused, error: &Error) -> FrameResult {
    let refused = status(error);
    frame.code = refused.code() as i32;
    frame.message = match frame.more_system_ids.len() {
        0 => refused.message().to_string(),
        more => format!(
            "{} (and {more} more ids refused with the same code, listed in more_system_ids)",
            refused.message()
        ),
    };
    Ok(WireFrame::Frame(Box::new(pb::SubscriptionFrame {
        frame: Some(Frame::Refused(frame)),
    })))
}

impl Stream for ConsumeStream {
    type Item = FrameResult;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<FrameResult>> {
        let this = &mut *self;
        if this.ended {
            return Poll::Ready(None);
        }
        this.read_settles(cx);
        if let Some(refusal) = this.refusals.pop_front() {
            return Poll::Ready(Some(refusal));
        }
        if let Some(terminal) = this.terminal.take() {
            this.ended = true;
            return Poll::Ready(Some(Err(terminal)));
        }
        let item = Pin::new(&mut this.frames).poll_next(cx);
        if let Poll::Ready(Some(Err(_)) | None) = &item {
            this.ended = true;
        }
        item
    }
}

/// Opens the member from the first client message; its settles are then read as the stream is
/// polled.
pub(super) async fn consume(
    service: &BrokerService,
    request: Request<Streaming<pb::ConsumeRequest>>,
) -> Result<ConsumeStream, Status> {
    let connection = connection_of(&request);
    let mut requests = request.into_inner();
    let open = match requests.message().await? {
        Some(pb::ConsumeRequest {
            request: Some(Carried::Open(open)),
        }) => open,
        Some(_) => {
            return Err(Status::invalid_argument(
                "the first ConsumeRequest must carry `open` (an OpenSubscription)",
            ));
        }
        None => {
            return Err(Status::invalid_argument(
                "the stream closed before its first ConsumeRequest (`open`)",
            ));
        }
    };
    let open = open_request(open, service.broker.limits()).map_err(|e| status(&e))?;
    let ack_free = open.spec.ack_mode == AckMode::None;
    let member = service.open(&open, connection).await?;
    Ok(ConsumeStream {
        settler: member.settler(),
        frames: FrameStream(member),
        requests,
        ack_free,
        requests_done: false,
        refusals: VecDeque::new(),
        terminal: None,
        ended: false,
    })
}

type PendingPublish = Pin<Box<dyn Future<Output = Result<Published, Status>> + Send>>;

/// At most this many publishes of one `PublishStream` wait at a gateway for JetStream's
/// confirmation; the stream reads no more requests meanwhile (HTTP/2 flow control then paces
/// the publisher).
const GATEWAY_PIPELINE: usize = 256;

/// And at most this many bytes of them (message sizes as the limits count them), beyond the
/// first: a publish waiting for its confirmation is held for a resend, outside the memory
/// budget, so each stream's share stays small.
const GATEWAY_PIPELINE_BYTES: usize = 4 << 20;

/// One answer of a gateway's `PublishStream`, in request order.
enum Slot {
    /// Answered already: refused before it was sent.
    Ready(pb::PublishStreamResponse),
    /// Being sent to JetStream: only the newest slot, so sends keep the request order.
    Sending(Pin<Box<dyn Future<Output = Result<Sent, Status>> + Send>>),
    /// Sent; JetStream's confirmation to come.
    Confirming(Pin<Box<dyn Future<Output = Result<Published, Unconfirmed>> + Send>>),
    /// No JetStream server answered it while nothing after it had been sent: sent again, alone,
    /// for a bounded time (nothing is read meanwhile, so the order holds).
    Again(PendingPublish),
}

/// The responses of a `PublishStream`, one per request, in order, ended with `UNAVAILABLE`
/// once shutdown starts.
///
/// Requests are published in the order read, a refusal is an answer, not the end of the stream.
/// The embedded broker reads what has arrived (at most [`READ_AHEAD`] requests, about
/// [`READ_AHEAD_BYTES`]), publishes it, and answers it before it reads more: the order holds
/// and HTTP/2 flow control still paces a publisher that does not read its answers.
pub struct PublishResults {
    broker: Broker,
    /// In cluster mode, where publishes go: each is sent as it is read and answered once
    /// JetStream confirmed it, in order, up to [`GATEWAY_PIPELINE`] at once.
    gateway: Option<Gateway>,
    /// Cluster mode: the answers to come, oldest first, with each one's message size.
    slots: VecDeque<(Slot, usize)>,
    /// Cluster mode: the sizes in `slots` summed.
    slot_bytes: usize,
    /// Cluster mode: the client sent its last request.
    requests_done: bool,
    requests: Streaming<pb::PublishRequest>,
    /// The last envelope built, reused (or its topic) while a publisher keeps to one topic.
    recent: Option<Envelope>,
    /// Embedded: requests read and validated, not yet published (see [`READ_AHEAD`]).
    run: Vec<Draft>,
    /// Embedded: the broker's results for `run`, in order.
    results: Vec<Result<Published, Error>>,
    /// Embedded: answers to send, in request order.
    answers: VecDeque<pb::PublishStreamResponse>,
    /// The final status to end with once every earlier request is answered.
    end_with: Option<Status>,
    /// Completes when shutdown starts. Polled only while no request is ready, so a busy stream
    /// pays nothing for it; a busy stream meets the broker's own refusal instead.
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

impl PublishResults {
    /// Ends the stream with `status`: tonic sends it as the stream's final status.
    fn end(&mut self, status: Status) -> Poll<Option<<Self as Stream>::Item>> {
        self.ended = true;
        Poll::Ready(Some(Err(status)))
    }

    /// Cluster mode's `poll_next`: sends as it reads, answers in order (see [`Slot`]).
    fn poll_gateway(
        &mut self,
        gateway: &Gateway,
        cx: &mut Context<'_>,
    ) -> Poll<Option<<Self as Stream>::Item>> {
        loop {
            if let Some((newest, _)) = self.slots.back_mut()
                && let Slot::Sending(send) = newest
            {
                let sent = send.as_mut().poll(cx);
                match sent {
                    Poll::Ready(Ok(sent)) => *newest = Slot::Confirming(Box::pin(sent.confirmed())),
                    Poll::Ready(Err(refused)) => *newest = Slot::Ready(refusal(&refused)),
                    Poll::Pending => {}
                }
            }
            let alone = self.slots.len() == 1;
            if let Some((head, _)) = self.slots.front_mut() {
                let answered = match head {
                    Slot::Ready(_) => true,
                    Slot::Sending(_) => false,
                    Slot::Confirming(confirming) => match confirming.as_mut().poll(cx) {
                        Poll::Ready(Ok(published)) => {
                            *head = Slot::Ready(answer(published));
                            true
                        }
                        Poll::Ready(Err(Unconfirmed::NoResponders(draft))) if alone => {
                            let gateway = gateway.clone();
                            *head =
                                Slot::Again(Box::pin(async move { gateway.publish(draft).await }));
                            continue;
                        }
                        Poll::Ready(Err(unconfirmed)) => {
                            *head = Slot::Ready(refusal(&unconfirmed.status()));
                            true
                        }
                        Poll::Pending => false,
                    },
                    Slot::Again(again) => match again.as_mut().poll(cx) {
                        Poll::Ready(result) => {
                            *head = Slot::Ready(match result {
                                Ok(published) => answer(published),
                                Err(refused) => refusal(&refused),
                            });
                            true
                        }
                        Poll::Pending => false,
                    },
                };
                if answered && let Some((Slot::Ready(response), size)) = self.slots.pop_front() {
                    self.slot_bytes -= size;
                    return Poll::Ready(Some(Ok(response)));
                }
            }
            if self.requests_done {
                if self.slots.is_empty() {
                    if let Some(status) = self.end_with.take() {
                        return self.end(status);
                    }
                    self.ended = true;
                    return Poll::Ready(None);
                }
                return Poll::Pending;
            }
            let busy = matches!(
                self.slots.back(),
                Some((Slot::Sending(_) | Slot::Again(_), _))
            );
            if busy
                || self.slots.len() >= GATEWAY_PIPELINE
                || self.slot_bytes >= GATEWAY_PIPELINE_BYTES
            {
                return Poll::Pending;
            }
            let request = match Pin::new(&mut self.requests).poll_next(cx) {
                Poll::Ready(Some(Ok(request))) => request,
                // Undecodable input or a transport error: what was sent before it is still
                // answered (JetStream may have stored it), then the stream ends with it.
                Poll::Ready(Some(Err(status))) => {
                    self.requests_done = true;
                    self.end_with = Some(oversize_as_resource_exhausted(status));
                    continue;
                }
                Poll::Ready(None) => {
                    self.requests_done = true;
                    continue;
                }
                Poll::Pending => {
                    if self.stopping.as_mut().poll(cx).is_ready() {
                        return self.end(status(&Error::ShuttingDown));
                    }
                    return Poll::Pending;
                }
            };
            // Nothing here meets the broker's shutdown refusal, so look for it on every request.
            if self.stopping.as_mut().poll(cx).is_ready() {
                return self.end(status(&Error::ShuttingDown));
            }
            match draft_reusing(request, self.broker.limits(), &mut self.recent) {
                Ok(draft) => {
                    let size = draft.size();
                    let gateway = gateway.clone();
                    self.slot_bytes += size;
                    self.slots.push_back((
                        Slot::Sending(Box::pin(async move { gateway.send(draft).await })),
                        size,
                    ));
                }
                Err(error) => self
                    .slots
                    .push_back((Slot::Ready(refusal(&status(&error))), 0)),
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
        if let Some(gateway) = this.gateway.clone() {
            return this.poll_gateway(&gateway, cx);
        }
        this.poll_embedded(cx)
    }
}

impl PublishResults {
    /// The embedded broker's `poll_next`: reads what the client has sent (up to
    /// [`READ_AHEAD`] requests or [`READ_AHEAD_BYTES`]), publishes it in order with
    /// [`Broker::publish_each`] (a run to one topic is routed and locked once), then answers
    /// each request in order.
    fn poll_embedded(&mut self, cx: &mut Context<'_>) -> Poll<Option<<Self as Stream>::Item>> {
        if let Some(done) = self.next_answer_or_end() {
            return done;
        }
        let (mut read, mut bytes) = (0, 0);
        while read < READ_AHEAD && bytes < READ_AHEAD_BYTES && self.end_with.is_none() {
            match Pin::new(&mut self.requests).poll_next(cx) {
                Poll::Ready(Some(Ok(request))) => {
                    read += 1;
                    match draft_reusing(request, self.broker.limits(), &mut self.recent) {
                        Ok(draft) => {
                            bytes += draft.size();
                            self.run.push(draft);
                        }
                        Err(error) => {
                            self.publish_run();
                            if self.end_with.is_none() {
                                self.answers.push_back(refusal(&status(&error)));
                            }
                        }
                    }
                }
                // Undecodable input or a transport error ends the stream once what came
                // before it is answered (published first, so its answers come before the end).
                Poll::Ready(Some(Err(status))) => {
                    self.publish_run();
                    self.end_with
                        .get_or_insert(oversize_as_resource_exhausted(status));
                }
                Poll::Ready(None) => {
                    self.requests_done = true;
                    break;
                }
                Poll::Pending => break,
            }
        }
        self.publish_run();
        if let Some(done) = self.next_answer_or_end() {
            return done;
        }
        // The client may keep the stream open and idle for ever: without this, shutdown would
        // wait out the whole drain for it.
        if self.stopping.as_mut().poll(cx).is_ready() {
            return self.end(status(&Error::ShuttingDown));
        }
        Poll::Pending
    }

    /// The next answer, else the end once the requests are done or failed; `None` while more
    /// requests may come.
    fn next_answer_or_end(&mut self) -> Option<Poll<Option<<Self as Stream>::Item>>> {
        if let Some(answer) = self.answers.pop_front() {
            return Some(Poll::Ready(Some(Ok(answer))));
        }
        if let Some(status) = self.end_with.take() {
            return Some(self.end(status));
        }
        if self.requests_done {
            self.ended = true;
            return Some(Poll::Ready(None));
        }
        None
    }

    /// Publishes `run` and turns the results into answers; shutdown ends the stream after the
    /// answers before it, however fast the client keeps sending (what comes after the first
    /// `ShuttingDown` was refused with it too, unanswered).
    fn publish_run(&mut self) {
        if self.run.is_empty() {
            return;
        }
        self.broker
            .publish_each(self.run.drain(..), &mut self.results);
        let mut shutting_down = false;
        for result in self.results.drain(..) {
            if shutting_down {
                continue;
            }
            match result {
                Ok(published) => self.answers.push_back(answer(published)),
                Err(Error::ShuttingDown) => {
                    shutting_down = true;
                    self.end_with = Some(status(&Error::ShuttingDown));
                }
                Err(error) => self.answers.push_back(refusal(&status(&error))),
            }
        }
    }
}

fn answer(published: Published) -> pb::PublishStreamResponse {
    pb::PublishStreamResponse {
        system_id: published.system_id,
        queued_for: published.queued_for,
        code: Code::Ok as i32,
        message: String::new(),
    }
}

fn refusal(refused: &Status) -> pb::PublishStreamResponse {
    pb::PublishStreamResponse {
        system_id: 0,
        queued_for: 0,
        code: refused.code() as i32,
        message: refused.message().to_string(),
    }
}

/// Answers the `requests` of one `PublishStream` (see [`PublishResults`]); the stream ends
/// with `UNAVAILABLE` once `stopping` fires.
pub(super) fn publish_stream(
    broker: Broker,
    gateway: Option<Gateway>,
    requests: Streaming<pb::PublishRequest>,
    stopping: &Arc<Signal>,
) -> PublishResults {
    PublishResults {
        broker,
        gateway,
        slots: VecDeque::new(),
        slot_bytes: 0,
        requests_done: false,
        requests,
        recent: None,
        run: Vec::new(),
        results: Vec::new(),
        answers: VecDeque::new(),
        end_with: None,
        stopping: Box::pin(stopping.clone().wait()),
        ended: false,
    }
}

/// A request stream's error as the stream's final status. Tonic's decoder refuses a request
/// over `max_request_bytes` with `OUT_OF_RANGE`; SPEC §6 (and gRPC convention for size limits)
/// says `RESOURCE_EXHAUSTED`. A unary call's status is rewritten in its response headers
/// (`server::oversize`); a stream's travels in its trailers, so it is mapped here.
fn oversize_as_resource_exhausted(status: Status) -> Status {
    if status.code() == Code::OutOfRange {
        Status::resource_exhausted(format!(
            "request is larger than the max_request_bytes limit (messages are limited to max_message_bytes): {}",
            status.message()
        ))
    } else {
        status
    }
}
