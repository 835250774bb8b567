//! What other gateways forward here (docs/semantics.md#cluster-mode): acks and nacks naming a
//! member this gateway holds, and proclamations of its active members, each answered as the
//! member's own connection would be answered. The asking side is [`forward`].

use std::time::Duration;

use tokio_stream::StreamExt;

use crate::broker::Broker;
use crate::cluster::gateway::data::forward::{SettleReply, SettleRequest, settle_here, subject};
use crate::core::Error;

/// What a starting gateway sends itself on its route's subject: no settle (it has no reply
/// subject), only the proof that its NATS server has the subscription.
const SERVE_PROBE: &[u8] = b"tinybroker: serving this route";

/// How long a starting gateway waits for its own probe to come back through its subscription.
const SERVE_PATIENCE: Duration = Duration::from_secs(10);

/// Starts answering forwarded acks for the members of `broker`, and returns once this gateway's
/// NATS server has the subscription: a message the gateway sends itself after subscribing has
/// come back through it (`flush` only writes to the socket). Other servers learn of it over
/// the cluster's routes, later; [`request`](crate::cluster::gateway::data::forward::request) is patient with them.
pub(in crate::cluster::gateway) async fn serve(
    bus: std::sync::Arc<dyn crate::cluster::bus::Bus>,
    stream: &str,
    broker: Broker,
    singletons: crate::cluster::gateway::control::singleton::Handle,
) -> Result<tokio::task::JoinHandle<()>, String> {
    let route = crate::cluster::ids::Route::of(broker.id_floor().unix_micros());
    let subject = subject(stream, route);
    let mut requests = bus
        .subscribe(&subject)
        .await
        .map_err(|e| format!("cannot subscribe to forwarded acks: {e}"))?;
    bus.publish(&subject, bytes::Bytes::from_static(SERVE_PROBE))
        .await
        .map_err(|e| format!("cannot subscribe to forwarded acks: {e}"))?;
    let served = tokio::time::timeout(SERVE_PATIENCE, async {
        while let Some(message) = requests.next().await {
            if message.reply.is_none() && &message.payload[..] == SERVE_PROBE {
                return true;
            }
            answer(&bus, &broker, &singletons, message).await;
        }
        false
    })
    .await;
    if served != Ok(true) {
        return Err(format!(
            "cannot subscribe to forwarded acks: the NATS server did not deliver on the subscription within {SERVE_PATIENCE:?}"
        ));
    }
    Ok(tokio::spawn(async move {
        while let Some(message) = requests.next().await {
            answer(&bus, &broker, &singletons, message).await;
        }
    }))
}

/// Answers one forwarded settle (a message without a reply subject or a settle is ignored);
/// a proclamation, which waits for the line, is answered by a task of its own.
async fn answer(
    bus: &std::sync::Arc<dyn crate::cluster::bus::Bus>,
    broker: &Broker,
    singletons: &crate::cluster::gateway::control::singleton::Handle,
    message: crate::cluster::bus::BusMessage,
) {
    let Some(reply) = message.reply else {
        return;
    };
    let Ok(request) = serde_json::from_slice::<SettleRequest>(&message.payload) else {
        return;
    };
    if let Some(proclaim) = request.proclaim {
        let Ok(permit) = PROCLAIMING.clone().try_acquire_owned() else {
            let busy = Error::Unavailable(format!(
                "the gateway holding member {} has {PROCLAIMS_AT_ONCE} proclamations waiting for the coordination bucket; retry",
                request.member
            ));
            reply_with(bus.as_ref(), &reply, Err(busy)).await;
            return;
        };
        let (bus, broker, singletons) = (bus.clone(), broker.clone(), singletons.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let result = crate::cluster::gateway::api::leadership::proclaim_here(
                &broker,
                &singletons,
                &request.subscription,
                request.member,
                proclaim.epoch,
                std::sync::Arc::from(proclaim.metadata),
            )
            .await;
            reply_with(bus.as_ref(), &reply, result).await;
        });
        return;
    }
    let result = settle_here(
        broker,
        &request.subscription,
        request.member,
        request.system_id,
        request.nack,
    );
    reply_with(bus.as_ref(), &reply, result).await;
}

/// Most forwarded proclamations a gateway waits on at once (each for the coordination bucket,
/// at most 5 s); past it, one is answered `UNAVAILABLE`.
const PROCLAIMS_AT_ONCE: usize = 1024;

static PROCLAIMING: std::sync::LazyLock<std::sync::Arc<tokio::sync::Semaphore>> =
    std::sync::LazyLock::new(|| {
        std::sync::Arc::new(tokio::sync::Semaphore::new(PROCLAIMS_AT_ONCE))
    });

/// Sends the holder's answer to a forwarded request.
async fn reply_with(bus: &dyn crate::cluster::bus::Bus, reply: &str, result: Result<(), Error>) {
    let answer = match result {
        Ok(()) => SettleReply {
            code: 0,
            message: String::new(),
        },
        Err(error) => SettleReply {
            code: error.kind().code(),
            message: error.to_string(),
        },
    };
    let Ok(body) = serde_json::to_vec(&answer) else {
        return;
    };
    if let Err(error) = bus.publish(reply, body.into()).await {
        tracing::warn!(%error, "could not answer a forwarded ack");
    }
}
