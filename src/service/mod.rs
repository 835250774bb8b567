//! The tonic service: validates protobuf into domain types, once, here ([`validate`]), calls
//! the [`Backend`] (the embedded broker or a cluster-mode gateway: this module never asks
//! which), and turns what comes back into protobuf ([`convert`], [`frames`]) and every
//! [`Error`] into a gRPC status in one place ([`status`]). The streaming carriages live in
//! [`consume`] and [`publish_stream`].

mod consume;
mod convert;
mod frames;
mod leadership;
mod publish_stream;
pub(crate) mod status;
pub(crate) mod validate;
pub mod wire;

use std::sync::Arc;

pub use consume::ConsumeStream;
pub use frames::{FrameStream, frame};
pub use leadership::LeadershipFrames;
pub use publish_stream::PublishResults;
pub use status::{MAX_STATUS_MESSAGE_BYTES, cap_message, code, status};
use tonic::{Request, Response, Status};
pub use validate::{
    ACK_FREE_DEFAULT_WINDOW, DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, check_subscription_id, draft,
    draft_reusing, fence, open_request, page, proclamation,
};

use crate::{
    backend::Backend,
    core::Error,
    pb,
    transport::{Signal, TransportStats, conn::connection_of},
};

/// The `tinybroker.v1.Broker` gRPC service, over either deployment.
#[derive(Debug, Clone)]
pub struct BrokerService {
    backend: Backend,
    transport: Arc<TransportStats>,
    stopping: Arc<Signal>,
}

impl BrokerService {
    /// Serves `backend`.
    pub fn new(backend: Backend) -> Self {
        Self::with_transport(backend, Arc::default(), Arc::default())
    }

    /// Serves `backend`, reporting the transport's counters in `ListSubscriptions`. When
    /// `stopping` fires (shutdown started), the streams the broker does not own
    /// (`PublishStream`) end with `UNAVAILABLE`, as the broker ends member streams.
    pub fn with_transport(
        backend: Backend,
        transport: Arc<TransportStats>,
        stopping: Arc<Signal>,
    ) -> Self {
        Self {
            backend,
            transport,
            stopping,
        }
    }

    /// A unary Ack or Nack: its fields validated, then settled.
    async fn settle(
        &self,
        subscription_id: &str,
        system_id: u64,
        member_id: u64,
        connection: Option<crate::broker::ConnectionId>,
        nack: bool,
    ) -> Result<(), Status> {
        check_subscription_id(subscription_id, self.backend.limits()).map_err(|e| status(&e))?;
        let fence =
            fence(subscription_id, system_id, member_id, connection).map_err(|e| status(&e))?;
        self.backend
            .settle(subscription_id, fence, system_id, nack)
            .await
            .map_err(|e| status(&e))
    }
}

#[tonic::async_trait]
impl pb::broker_server::Broker for BrokerService {
    async fn publish(
        &self,
        request: Request<pb::PublishRequest>,
    ) -> Result<Response<pb::PublishResponse>, Status> {
        let draft = draft(request.into_inner(), self.backend.limits()).map_err(|e| status(&e))?;
        let published = self.backend.publish(draft).await.map_err(|e| status(&e))?;
        Ok(Response::new(pb::PublishResponse {
            system_id: published.system_id,
            queued_for: published.queued_for,
        }))
    }

    async fn publish_batch(
        &self,
        request: Request<pb::PublishBatchRequest>,
    ) -> Result<Response<pb::PublishBatchResponse>, Status> {
        let messages = request.into_inner().messages;
        let limits = self.backend.limits();
        if messages.len() > limits.max_batch_messages {
            return Err(status(&Error::BatchTooLarge {
                count: messages.len(),
                max: limits.max_batch_messages,
            }));
        }
        // Validate (and admit) everything first: an invalid message rejects the whole batch
        // untouched.
        let mut recent = None;
        let drafts = messages
            .into_iter()
            .enumerate()
            .map(|(i, m)| {
                draft_reusing(m, limits, &mut recent).map_err(|e| status::in_batch(i, &e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if let Some((i, error)) = drafts
            .iter()
            .enumerate()
            .find_map(|(i, d)| self.backend.admit(d).err().map(|e| (i, e)))
        {
            return Err(status::in_batch(i, &error));
        }
        let total = drafts.len();
        match self.backend.publish_batch(drafts).await {
            Ok(published) => Ok(Response::new(pb::PublishBatchResponse {
                results: published
                    .into_iter()
                    .map(|p| pb::PublishResponse {
                        system_id: p.system_id,
                        queued_for: p.queued_for,
                    })
                    .collect(),
            })),
            Err(refused) => Err(status::batch_refused(
                refused.published.len(),
                total,
                &refused.error,
            )),
        }
    }

    type SubscribeStream = FrameStream;

    async fn subscribe(
        &self,
        request: Request<pb::OpenSubscription>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let connection = connection_of(&request);
        let open =
            open_request(request.into_inner(), self.backend.limits()).map_err(|e| status(&e))?;
        let stream = self
            .backend
            .open(&open, connection)
            .await
            .map_err(|e| status(&e))?;
        Ok(Response::new(FrameStream(stream)))
    }

    type ConsumeStream = ConsumeStream;

    async fn consume(
        &self,
        request: Request<tonic::Streaming<pb::ConsumeRequest>>,
    ) -> Result<Response<Self::ConsumeStream>, Status> {
        consume::consume(self, request).await.map(Response::new)
    }

    type PublishStreamStream = PublishResults;

    async fn publish_stream(
        &self,
        request: Request<tonic::Streaming<pb::PublishRequest>>,
    ) -> Result<Response<Self::PublishStreamStream>, Status> {
        Ok(Response::new(publish_stream::publish_stream(
            &self.backend,
            request.into_inner(),
            &self.stopping,
        )))
    }

    async fn ack(&self, request: Request<pb::Ack>) -> Result<Response<pb::AckResponse>, Status> {
        let connection = connection_of(&request);
        let ack = request.into_inner();
        self.settle(
            &ack.subscription_id,
            ack.system_id,
            ack.member_id,
            connection,
            false,
        )
        .await?;
        Ok(Response::new(pb::AckResponse {}))
    }

    async fn nack(&self, request: Request<pb::Nack>) -> Result<Response<pb::NackResponse>, Status> {
        let connection = connection_of(&request);
        let nack = request.into_inner();
        self.settle(
            &nack.subscription_id,
            nack.system_id,
            nack.member_id,
            connection,
            true,
        )
        .await?;
        Ok(Response::new(pb::NackResponse {}))
    }

    async fn describe_subscription(
        &self,
        request: Request<pb::DescribeSubscriptionRequest>,
    ) -> Result<Response<pb::SubscriptionInfo>, Status> {
        let id = request.into_inner().subscription_id;
        check_subscription_id(&id, self.backend.limits()).map_err(|e| status(&e))?;
        let described = self.backend.describe(&id).await.map_err(|e| status(&e))?;
        Ok(Response::new(convert::info(described)))
    }

    async fn delete_subscription(
        &self,
        request: Request<pb::DeleteSubscriptionRequest>,
    ) -> Result<Response<pb::DeleteSubscriptionResponse>, Status> {
        let id = request.into_inner().subscription_id;
        check_subscription_id(&id, self.backend.limits()).map_err(|e| status(&e))?;
        // docs/semantics.md#deleting
        let deleted = self.backend.delete(&id).await.map_err(|e| status(&e))?;
        Ok(Response::new(pb::DeleteSubscriptionResponse {
            discarded_messages: deleted.discarded_messages,
        }))
    }

    type WatchLeadershipStream = LeadershipFrames;

    async fn watch_leadership(
        &self,
        request: Request<pb::WatchLeadershipRequest>,
    ) -> Result<Response<Self::WatchLeadershipStream>, Status> {
        let id = request.into_inner().subscription_id;
        check_subscription_id(&id, self.backend.limits()).map_err(|e| status(&e))?;
        // docs/semantics.md#watching-leadership
        let watch = self
            .backend
            .watch_leadership(&id)
            .await
            .map_err(|e| status(&e))?;
        Ok(Response::new(LeadershipFrames::new(
            watch,
            id,
            &self.stopping,
        )))
    }

    async fn proclaim(
        &self,
        request: Request<pb::ProclaimRequest>,
    ) -> Result<Response<pb::ProclaimResponse>, Status> {
        // docs/semantics.md#member-metadata
        let proclamation = validate::proclamation(request.into_inner(), self.backend.limits())
            .map_err(|e| status(&e))?;
        self.backend
            .proclaim(proclamation)
            .await
            .map_err(|e| status(&e))?;
        Ok(Response::new(pb::ProclaimResponse {}))
    }

    async fn hand_over(
        &self,
        request: Request<pb::HandOverRequest>,
    ) -> Result<Response<pb::HandOverResponse>, Status> {
        // docs/semantics.md#hand-over
        let request = request.into_inner();
        validate::check_subscription_id(&request.subscription_id, self.backend.limits())
            .map_err(|e| status(&e))?;
        let done = self
            .backend
            .hand_over(&request.subscription_id)
            .await
            .map_err(|e| status(&e))?;
        Ok(Response::new(pb::HandOverResponse {
            previous_member_id: done.previous_member,
            previous_epoch: done.previous_epoch,
            member_id: done.member,
            epoch: done.epoch,
            failed_over: done.failed_over,
        }))
    }

    async fn list_subscriptions(
        &self,
        request: Request<pb::ListSubscriptionsRequest>,
    ) -> Result<Response<pb::ListSubscriptionsResponse>, Status> {
        let (after, size) =
            page(request.get_ref(), self.backend.limits()).map_err(|e| status(&e))?;
        // One more than the page, to learn whether another page follows.
        let (mut described, broker) = self
            .backend
            .list_page(after.as_deref(), size + 1)
            .await
            .map_err(|e| status(&e))?;
        let more = described.len() > size;
        described.truncate(size);
        let next_page_token = match described.last() {
            Some(last) if more => last.view.subscription_id.to_string(),
            _ => String::new(),
        };
        Ok(Response::new(pb::ListSubscriptionsResponse {
            subscriptions: described.into_iter().map(convert::info).collect(),
            broker: Some(convert::stats(broker, self.transport.snapshot())),
            next_page_token,
            storage: Some(convert::storage(self.backend.storage())),
        }))
    }
}
