//! Pipelined publishing over one `PublishStream`: [`Publisher::send`] queues a message and hands
//! back a [`PendingPublish`] that resolves to the broker's answer, so hundreds of publishes can
//! be in flight on one HTTP/2 stream.

use std::{
    collections::VecDeque,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use tokio::sync::{mpsc, oneshot};
use tokio_stream::{StreamExt, wrappers::UnboundedReceiverStream};
use tonic::Code;

use super::{Error, Message, Published, RawClient, Result};
use crate::pb;

/// Publishes a [`Publisher`] may have sent and not yet had answered. Past it, [`Publisher::send`]
/// waits: memory stays bounded however fast the caller sends.
pub const MAX_PENDING_PUBLISHES: usize = 4096;

type Reply = oneshot::Sender<Result<Published>>;

/// A streaming publisher. Answers come back in send order; a refused message does not end the
/// stream. Cheap to clone: clones share the stream (their messages interleave in the order
/// `send` is called).
#[derive(Clone, Debug)]
pub struct Publisher {
    commands: mpsc::Sender<(pb::PublishRequest, Reply)>,
}

/// The answer to one [`Publisher::send`], in flight.
#[derive(Debug)]
#[must_use = "the publish may be refused: await its answer"]
pub struct PendingPublish(oneshot::Receiver<Result<Published>>);

impl Future for PendingPublish {
    type Output = Result<Published>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx).map(|answer| {
            answer.unwrap_or_else(|_| Err(Error::Unavailable("the publish stream ended".into())))
        })
    }
}

impl Publisher {
    pub(super) async fn open(mut raw: RawClient) -> Result<Self> {
        let (requests_tx, requests_rx) = mpsc::unbounded_channel();
        let responses = raw
            .publish_stream(UnboundedReceiverStream::new(requests_rx))
            .await?
            .into_inner();
        let (commands, commands_rx) = mpsc::channel(256);
        // The driver ends by itself once every clone is dropped and the pending answers are in,
        // so answers already sent for can still be awaited.
        tokio::spawn(drive(commands_rx, requests_tx, responses));
        Ok(Self { commands })
    }

    /// Queues `message` and returns its pending answer. Waits only when
    /// [`MAX_PENDING_PUBLISHES`] publishes are already unanswered.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when the stream has ended (its cause went to the pending answers).
    pub async fn send(&self, message: Message) -> Result<PendingPublish> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send((message.into_pb(), reply))
            .await
            .map_err(|_| Error::Unavailable("the publish stream ended".into()))?;
        Ok(PendingPublish(answer))
    }

    /// Publishes `message` and waits for its answer (no pipelining; see [`Publisher::send`]).
    ///
    /// # Errors
    /// As [`super::Client::publish`].
    pub async fn publish(&self, message: Message) -> Result<Published> {
        self.send(message).await?.await
    }
}

/// Owns both halves of the stream: forwards requests while fewer than the maximum are
/// unanswered, and matches each response to the oldest pending reply (the broker answers in
/// order). One task does both so the pairing needs no lock.
async fn drive(
    mut commands: mpsc::Receiver<(pb::PublishRequest, Reply)>,
    requests: mpsc::UnboundedSender<pb::PublishRequest>,
    mut responses: tonic::Streaming<pb::PublishStreamResponse>,
) {
    let mut pending: VecDeque<Reply> = VecDeque::new();
    let mut accepting = true;
    let failure = loop {
        tokio::select! {
            command = commands.recv(), if accepting && pending.len() < MAX_PENDING_PUBLISHES => {
                match command {
                    Some((request, reply)) => {
                        if requests.send(request).is_err() {
                            let _ = reply.send(Err(Error::Unavailable("the publish stream ended".into())));
                            continue;
                        }
                        pending.push_back(reply);
                    }
                    // Every Publisher is gone; answer what is pending, then stop.
                    None => accepting = false,
                }
            }
            response = responses.next() => match response {
                Some(Ok(response)) => {
                    let Some(reply) = pending.pop_front() else {
                        break Error::Other {
                            code: Code::Internal,
                            message: "the broker answered a publish that was not sent".into(),
                        };
                    };
                    let answer = if response.code == Code::Ok as i32 {
                        Ok(Published {
                            system_id: response.system_id,
                            queued_for: response.queued_for,
                        })
                    } else {
                        Err(Error::from_code(response.code, response.message))
                    };
                    let _ = reply.send(answer);
                }
                Some(Err(status)) => break Error::from(status),
                None => break Error::Unavailable("the broker ended the publish stream".into()),
            },
        }
        if !accepting && pending.is_empty() {
            return;
        }
    };
    // The broker answers every request it read before ending a stream over one request too
    // large to read (RESOURCE_EXHAUSTED), so that is the oldest unanswered one; those after it
    // were never read, so never published: they are told so, not given its size refusal. Any
    // other end (a transport failure, shutdown, an undecodable request, whose INTERNAL a
    // broken connection can also give) goes to every pending send as it is: what the broker
    // read before it is not known here.
    let mut pending = pending.into_iter();
    let rest = match &failure {
        Error::ResourceExhausted(_) => {
            if let Some(oldest) = pending.next() {
                let _ = oldest.send(Err(failure.clone()));
            }
            Error::Unavailable(format!(
                "not published: the publish stream ended ({failure}) before the broker read this message"
            ))
        }
        _ => failure,
    };
    for reply in pending {
        let _ = reply.send(Err(rest.clone()));
    }
    // Later sends fail fast: dropping the receiver closes the channel.
    drop(commands);
}
