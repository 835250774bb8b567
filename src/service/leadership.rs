//! `WatchLeadership`: a SINGLETON subscription's leadership as a stream of frames
//! (docs/semantics.md#watching-leadership). The stream reads the latest state each time the
//! transport asks for a frame, so a watcher that does not read holds one state, never a
//! backlog: changes meanwhile coalesce into the latest.

use std::{
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use futures_core::Stream;
use tokio_stream::wrappers::WatchStream;
use tonic::Status;

use super::{convert, status};
use crate::{
    broker::{Leadership, LeadershipWatch},
    core::Error,
    pb,
    transport::Signal,
};

/// The frames of one watch: the current state first, then each change; it ends with
/// `NOT_FOUND` once the subscription is gone, and with `UNAVAILABLE` when the server stops.
pub struct LeadershipFrames {
    states: WatchStream<Leadership>,
    subscription: String,
    stopping: Pin<Box<dyn Future<Output = ()> + Send>>,
    ended: bool,
}

impl LeadershipFrames {
    pub(super) fn new(
        watch: LeadershipWatch,
        subscription: String,
        stopping: &Arc<Signal>,
    ) -> Self {
        Self {
            states: WatchStream::new(watch),
            subscription,
            stopping: Box::pin(stopping.clone().wait()),
            ended: false,
        }
    }
}

impl Stream for LeadershipFrames {
    type Item = Result<pb::LeadershipFrame, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.ended {
            return Poll::Ready(None);
        }
        if self.stopping.as_mut().poll(cx).is_ready() {
            self.ended = true;
            return Poll::Ready(Some(Err(status(&Error::ShuttingDown))));
        }
        match Pin::new(&mut self.states).poll_next(cx) {
            Poll::Ready(Some(state)) if state.cut_off => {
                self.ended = true;
                let cut_off = Error::Unavailable(
                    "this gateway lost its cluster lease, so its view of the leadership is not current; watch again (at any gateway)".into(),
                );
                Poll::Ready(Some(Err(status(&cut_off))))
            }
            Poll::Ready(Some(state)) => Poll::Ready(Some(Ok(frame(state)))),
            Poll::Ready(None) => {
                self.ended = true;
                let gone = Error::SubscriptionGone(self.subscription.clone());
                Poll::Ready(Some(Err(status(&gone))))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

/// One state as the API carries it.
pub(super) fn frame(state: Leadership) -> pb::LeadershipFrame {
    pb::LeadershipFrame {
        active_member_id: state.active.unwrap_or(0),
        epoch: state.epoch,
        since: Some(convert::timestamp(state.since_unix_ms)),
        metadata: state.metadata.to_string(),
    }
}
