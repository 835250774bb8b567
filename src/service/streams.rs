//! The streaming carriages beside the seed's unary calls (SPEC §8): `Consume`, a subscription
//! whose acks and nacks travel on its own stream, and `PublishStream`, publishes without one
//! HTTP/2 request each. Same broker, same semantics; only the carriage differs.

use std::{
    pin::Pin,
    task::{Context, Poll},
};

use tokio::{sync::mpsc, task::JoinHandle};
use tokio_stream::{Stream, StreamExt};
use tonic::{Code, Request, Status, Streaming};

use super::{FrameStream, open_request, publish_one, status};
use crate::{
    broker::{Broker, Settler},
    core::AckMode,
    pb::{self, consume_request::Request as Carried, subscription_frame::Frame},
    server::conn::connection_of,
};

/// Refusals the reader may queue before it stops reading the client's settles: a client that
/// floods bad acks and never reads its stream is slowed by HTTP/2 flow control, not buffered.
const PENDING_REFUSALS: usize = 16;

type FrameResult = Result<pb::SubscriptionFrame, Status>;

/// A `Consume` stream: the member's frames, interleaved with refusals of its own settles, ended
/// by the first terminal status (the broker's, or one about the client's side of the stream).
#[derive(Debug)]
pub struct ConsumeStream {
    frames: FrameStream,
    /// Refusals and the terminal status, from the task that reads the client's side.
    side: mpsc::Receiver<FrameResult>,
    side_open: bool,
    reader: JoinHandle<()>,
    ended: bool,
}

impl Drop for ConsumeStream {
    fn drop(&mut self) {
        // The client is gone: stop reading its side.
        self.reader.abort();
    }
}

impl Stream for ConsumeStream {
    type Item = FrameResult;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<FrameResult>> {
        let this = &mut *self;
        if this.ended {
            return Poll::Ready(None);
        }
        if this.side_open {
            match this.side.poll_recv(cx) {
                Poll::Ready(Some(item)) => {
                    this.ended = item.is_err();
                    return Poll::Ready(Some(item));
                }
                Poll::Ready(None) => this.side_open = false,
                Poll::Pending => {}
            }
        }
        let item = Pin::new(&mut this.frames).poll_next(cx);
        if let Poll::Ready(Some(Err(_)) | None) = &item {
            this.ended = true;
        }
        item
    }
}

/// Opens the member from the first client message, then reads settles until the client's side
/// ends.
pub(super) async fn consume(
    broker: &Broker,
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
    let open = open_request(open, broker.limits()).map_err(|e| status(&e))?;
    let ack_free = open.spec.ack_mode == AckMode::None;
    let member = broker.open(&open, connection).map_err(|e| status(&e))?;
    let settler = member.settler();
    let (side_tx, side) = mpsc::channel(PENDING_REFUSALS);
    let reader = tokio::spawn(read_settles(requests, settler, side_tx, ack_free));
    Ok(ConsumeStream {
        frames: FrameStream(member),
        side,
        side_open: true,
        reader,
        ended: false,
    })
}

async fn read_settles(
    mut requests: Streaming<pb::ConsumeRequest>,
    settler: Settler,
    side: mpsc::Sender<FrameResult>,
    ack_free: bool,
) {
    let terminal = loop {
        let settle = match requests.message().await {
            Ok(Some(pb::ConsumeRequest {
                request: Some(Carried::Settle(settle)),
            })) => settle,
            Ok(Some(pb::ConsumeRequest {
                request: Some(Carried::Open(_)),
            })) => {
                break Status::invalid_argument(
                    "`open` may only be the first ConsumeRequest of a stream; the member left",
                );
            }
            Ok(Some(pb::ConsumeRequest { request: None })) => {
                break Status::invalid_argument(
                    "a ConsumeRequest must carry `settle`; the member left",
                );
            }
            // An ack-free member has nothing to send: its half-close changes nothing.
            Ok(None) if ack_free => return,
            Ok(None) => {
                break Status::new(
                    Code::Ok,
                    "the client closed its side of the stream, so it can settle nothing more: the member left and its unacked messages went back to the queue",
                );
            }
            // Undecodable input or a transport error: the member leaves; nothing is lost.
            Err(error) => break error,
        };
        for (system_id, nack, error) in settler.settle(&settle.ack, &settle.nack) {
            let refused = status(&error);
            let frame = pb::SubscriptionFrame {
                frame: Some(Frame::Refused(pb::SettleRefused {
                    system_id,
                    nack,
                    code: refused.code() as i32,
                    message: refused.message().to_string(),
                })),
            };
            if side.send(Ok(frame)).await.is_err() {
                return;
            }
        }
    };
    let _ = side.send(Err(terminal)).await;
}

/// The responses of a `PublishStream`, one per request, in order.
pub type PublishResults =
    Pin<Box<dyn Stream<Item = Result<pb::PublishStreamResponse, Status>> + Send + 'static>>;

/// Publishes each request as it is read; a refusal is an answer, not the end of the stream.
/// Reading and answering in one pass keeps the order and lets HTTP/2 flow control pace a
/// publisher that does not read its answers.
pub(super) fn publish_stream(
    broker: Broker,
    requests: Streaming<pb::PublishRequest>,
) -> PublishResults {
    Box::pin(requests.map(move |request| {
        let request = request?;
        Ok(match publish_one(&broker, request) {
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
        })
    }))
}
