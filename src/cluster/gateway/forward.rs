//! Acks and nacks that name their member, forwarded to the gateway holding it (a load
//! balancer, grpcurl or a second client may send them to any gateway). The request goes to
//! every gateway on one subject; only a gateway where the member is live applies it and
//! answers, with the status it would have given. Silence until the timeout means no gateway
//! holds the member: `FAILED_PRECONDITION` (a stale ack). NATS request/reply is at most once,
//! so an answer lost on the way also looks like that, though the holder applied it; a repeat
//! then says `NOT_FOUND` ("not in flight"), which a client may take as done.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio_stream::StreamExt;
use tonic::{Code, Status};

use crate::{
    broker::{Broker, Fence},
    service,
};

/// What one gateway asks the others.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct SettleRequest {
    pub(super) subscription: String,
    pub(super) member: u64,
    pub(super) system_id: u64,
    pub(super) nack: bool,
}

#[derive(Debug, Serialize, Deserialize)]
struct SettleReply {
    code: i32,
    message: String,
}

/// Outside the stream's subjects (`<stream>.>`), so forwarded acks are never stored.
fn subject(stream: &str) -> String {
    format!("_tinybroker.{stream}.settle")
}

/// Starts answering forwarded acks for the members of `broker`.
pub(super) async fn serve(
    client: &async_nats::Client,
    stream: &str,
    broker: Broker,
) -> Result<tokio::task::JoinHandle<()>, async_nats::SubscribeError> {
    let mut requests = client.subscribe(subject(stream)).await?;
    let client = client.clone();
    Ok(tokio::spawn(async move {
        while let Some(message) = requests.next().await {
            let Some(reply) = message.reply else {
                continue;
            };
            let Ok(request) = serde_json::from_slice::<SettleRequest>(&message.payload) else {
                continue;
            };
            // Silence from every gateway but the member's own: the first answer is the answer.
            if !broker.has_member(&request.subscription, request.member) {
                continue;
            }
            let fence = Fence::Member(request.member);
            let result = if request.nack {
                broker.nack(&request.subscription, fence, request.system_id)
            } else {
                broker.ack(&request.subscription, fence, request.system_id)
            };
            let answer = match result {
                Ok(()) => SettleReply {
                    code: Code::Ok as i32,
                    message: String::new(),
                },
                Err(error) => {
                    let status = service::status(&error);
                    SettleReply {
                        code: status.code() as i32,
                        message: status.message().to_string(),
                    }
                }
            };
            let Ok(body) = serde_json::to_vec(&answer) else {
                continue;
            };
            if let Err(error) = client.publish(reply, body.into()).await {
                tracing::warn!(%error, "could not answer a forwarded ack");
            }
        }
    }))
}

/// Forwards one settle and returns the holder's answer.
pub(super) async fn request(
    client: &async_nats::Client,
    stream: &str,
    settle: SettleRequest,
    timeout: Duration,
) -> Result<(), Status> {
    let not_here = || {
        // As at home, an ack from a member that no longer holds anything is stale: it left, or
        // the cluster deposed it, and its message (if any) went to another member.
        Status::failed_precondition(service::cap_message(format!(
            "member {} of subscription {:?} is not connected to any gateway (it left or was deposed): this ack or nack is stale and changed nothing",
            settle.member, settle.subscription
        )))
    };
    let body = serde_json::to_vec(&settle).map_err(|e| Status::internal(e.to_string()))?;
    let answer =
        match tokio::time::timeout(timeout, client.request(subject(stream), body.into())).await {
            Ok(Ok(answer)) => answer,
            // Only holders answer: silence means no gateway holds the member.
            Err(_) => return Err(not_here()),
            Ok(Err(error)) if error.kind() == async_nats::RequestErrorKind::TimedOut => {
                return Err(not_here());
            }
            Ok(Err(error)) => {
                return Err(Status::unavailable(service::cap_message(format!(
                    "could not forward the ack to the gateway holding member {}: {error}",
                    settle.member
                ))));
            }
        };
    let reply: SettleReply = serde_json::from_slice(&answer.payload)
        .map_err(|e| Status::internal(format!("unreadable answer from a gateway: {e}")))?;
    match Code::from_i32(reply.code) {
        Code::Ok => Ok(()),
        code => Err(Status::new(code, reply.message)),
    }
}
