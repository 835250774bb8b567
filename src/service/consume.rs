//! `Consume` (docs/semantics.md#carriages): a subscription whose acks and nacks travel on its own stream. Same
//! member, same semantics as `Subscribe` plus unary settles; only the carriage differs.

use std::{
    collections::VecDeque,
    pin::Pin,
    task::{Context, Poll},
};

use tokio_stream::Stream;
use tonic::{Request, Status, Streaming};

use super::{
    BrokerService,
    frames::FrameStream,
    open_request,
    status::{closed_by_client, code, oversize_as_resource_exhausted, status},
    wire::WireFrame,
};
use crate::{
    broker::Settler,
    core::{AckMode, Error, Settlement, SystemId},
    pb::{self, consume_request::Request as Carried, subscription_frame::Frame},
    transport::conn::connection_of,
};

type FrameResult = Result<WireFrame, Status>;

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
                    self.terminal = Some(status(&Error::InvalidArgument(
                        "`open` may only be the first ConsumeRequest of a stream; the member left"
                            .into(),
                    )));
                    return;
                }
                Some(Ok(pb::ConsumeRequest { request: None })) => {
                    self.terminal = Some(status(&Error::InvalidArgument(
                        "a ConsumeRequest must carry `settle`; the member left".into(),
                    )));
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
                    self.terminal = Some(closed_by_client());
                    return;
                }
            };
            match self
                .settler
                .settle(&settle.ack, &settle.nack, &settle.release)
            {
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
fn coalesce(refused: Vec<(SystemId, Settlement, Error)>) -> Vec<FrameResult> {
    let mut groups: Vec<(pb::SettleRefused, Error)> = Vec::new();
    for (system_id, kind_asked, error) in refused {
        // A release is a nack that keeps its attempt: `nack` too, so a client that knows no
        // release reads it as a nack (docs/semantics.md#releases).
        let nack = kind_asked != Settlement::Ack;
        let release = kind_asked == Settlement::Release;
        let code = code(&error) as i32;
        // Same kind of refusal, not only the same code: a frame's message gives the reason of
        // every id it names (not yet sent and not the holder share FAILED_PRECONDITION).
        let kind = std::mem::discriminant(&error);
        match groups.iter_mut().find(|(g, first)| {
            g.nack == nack
                && g.release == release
                && g.code == code
                && std::mem::discriminant(first) == kind
        }) {
            Some((group, _)) => group.more_system_ids.push(system_id),
            None => groups.push((
                pb::SettleRefused {
                    system_id,
                    nack,
                    release,
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
            return Err(status(&Error::InvalidArgument(
                "the first ConsumeRequest must carry `open` (an OpenSubscription)".into(),
            )));
        }
        None => {
            return Err(status(&Error::InvalidArgument(
                "the stream closed before its first ConsumeRequest (`open`)".into(),
            )));
        }
    };
    let open = open_request(open, service.backend.limits()).map_err(|e| status(&e))?;
    let ack_free = open.spec.ack_mode == AckMode::None;
    let member = service
        .backend
        .open(&open, connection)
        .await
        .map_err(|e| status(&e))?;
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
