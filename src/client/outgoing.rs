//! The request half of a `Consume` stream: the `open`, then the member's settlements in
//! batches, then the half-close.

use std::{
    pin::Pin,
    task::{Context, Poll},
};

use tokio::sync::{mpsc, oneshot};
use tokio_stream::Stream;

use crate::pb::{self, consume_request::Request as Carried};

/// Settlements that are ready together travel in one `Settle`, up to this many.
pub(super) const MAX_SETTLE_BATCH: usize = 1024;

/// Where [`super::Delivery::ack`] and [`super::Delivery::nack`] queue their settlement for the
/// stream.
///
/// Unbounded on purpose, as `ack` is not async: the window bounds it. Every queued settlement
/// names a message the broker still counts in flight to this member (it only stops counting
/// once it has read the settlement), and the broker sends nothing past the window, so at most
/// `max_in_flight` settlements can wait here.
pub(super) type SettleSender = mpsc::UnboundedSender<Settlement>;

/// One ack, nack or release (docs/semantics.md#releases), by system id.
#[derive(Clone, Copy, Debug)]
pub(super) enum Settlement {
    Ack(u64),
    Nack(u64),
    Release(u64),
}

/// The request side of a `Consume` stream: the `open`, then batches of settlements; ends once
/// the [`super::Subscription`] closes or is dropped (after sending what was queued), which makes
/// the member leave.
pub(super) struct Outgoing {
    pub(super) open: Option<pb::OpenSubscription>,
    pub(super) settles: mpsc::UnboundedReceiver<Settlement>,
    pub(super) close: oneshot::Receiver<()>,
    /// Dropped with this stream. The transport drops it when the stream ends: after the close,
    /// or when the broker reset the stream or the connection failed. So its receiver notices a
    /// dead stream without reading the frames queued ahead of the end.
    pub(super) _alive: oneshot::Sender<()>,
}

impl Stream for Outgoing {
    type Item = pb::ConsumeRequest;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if let Some(open) = this.open.take() {
            return Poll::Ready(Some(pb::ConsumeRequest {
                request: Some(Carried::Open(open)),
            }));
        }
        // Settlements first, so acks made just before the close still count: the broker
        // applies the settles it read before the half-close.
        let mut settle = pb::Settle::default();
        let mut closed = false;
        while settle.ack.len() + settle.nack.len() + settle.release.len() < MAX_SETTLE_BATCH {
            match this.settles.poll_recv(cx) {
                Poll::Ready(Some(Settlement::Ack(id))) => settle.ack.push(id),
                Poll::Ready(Some(Settlement::Nack(id))) => settle.nack.push(id),
                Poll::Ready(Some(Settlement::Release(id))) => settle.release.push(id),
                Poll::Ready(None) => {
                    closed = true;
                    break;
                }
                Poll::Pending => break,
            }
        }
        if !settle.ack.is_empty() || !settle.nack.is_empty() || !settle.release.is_empty() {
            return Poll::Ready(Some(pb::ConsumeRequest {
                request: Some(Carried::Settle(settle)),
            }));
        }
        if closed || Pin::new(&mut this.close).poll(cx).is_ready() {
            return Poll::Ready(None);
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use std::task::Waker;

    use super::*;
    use crate::client::SubscriptionOptions;

    fn poll(outgoing: &mut Outgoing) -> Poll<Option<pb::ConsumeRequest>> {
        Pin::new(outgoing).poll_next(&mut Context::from_waker(Waker::noop()))
    }

    fn settle(request: Poll<Option<pb::ConsumeRequest>>) -> pb::Settle {
        match request {
            Poll::Ready(Some(pb::ConsumeRequest {
                request: Some(Carried::Settle(settle)),
            })) => settle,
            other => panic!("expected a Settle, got {other:?}"),
        }
    }

    // The open goes first; settlements ready together travel in one Settle; settlements made
    // before the subscription was dropped are still sent, then the request side ends.
    #[test]
    fn outgoing_opens_then_batches_ready_settlements_and_flushes_before_closing() {
        let (tx, settles) = mpsc::unbounded_channel();
        let (close, close_rx) = oneshot::channel();
        let (alive, _request_side) = oneshot::channel();
        let mut outgoing = Outgoing {
            open: Some(SubscriptionOptions::queue("s", "g", ["a.*"]).to_pb()),
            settles,
            close: close_rx,
            _alive: alive,
        };
        assert!(matches!(
            poll(&mut outgoing),
            Poll::Ready(Some(pb::ConsumeRequest {
                request: Some(Carried::Open(open))
            })) if open.subscription_id == "s" && open.mode == pb::DeliveryMode::Queue as i32
        ));
        assert!(poll(&mut outgoing).is_pending());
        for settlement in [Settlement::Ack(1), Settlement::Nack(2), Settlement::Ack(3)] {
            tx.send(settlement).unwrap();
        }
        let batch = settle(poll(&mut outgoing));
        assert_eq!((batch.ack, batch.nack), (vec![1, 3], vec![2]));
        assert!(poll(&mut outgoing).is_pending());

        tx.send(Settlement::Ack(4)).unwrap();
        drop(close);
        assert_eq!(settle(poll(&mut outgoing)).ack, vec![4]);
        assert!(matches!(poll(&mut outgoing), Poll::Ready(None)));
    }

    #[test]
    fn a_large_burst_is_split_at_the_batch_limit() {
        let (tx, settles) = mpsc::unbounded_channel();
        let (_close, close_rx) = oneshot::channel();
        let (alive, _request_side) = oneshot::channel();
        let mut outgoing = Outgoing {
            open: None,
            settles,
            close: close_rx,
            _alive: alive,
        };
        for id in 0..(MAX_SETTLE_BATCH as u64 + 5) {
            tx.send(Settlement::Ack(id)).unwrap();
        }
        assert_eq!(settle(poll(&mut outgoing)).ack.len(), MAX_SETTLE_BATCH);
        assert_eq!(settle(poll(&mut outgoing)).ack.len(), 5);
    }
}
