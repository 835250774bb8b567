//! A real server on a port-0 loopback listener, and a tonic client with helpers that await
//! events (with a timeout), never sleep.
//!
//! Which server is the including test binary's choice: its `deployment` module builds the
//! [`TestServer`] for a [`ServerConfig`] (one embedded broker for `tests/api`; two gateways over a
//! NATS cluster for `tests/api_gateways`, subscribers on one and publishers on the other).

use std::{net::SocketAddr, time::Duration};

use tinybroker::{
    pb::{
        self, DeliveryMode, OpenSubscription, PublishRequest, SubscriptionFrame,
        broker_client::BrokerClient, subscription_frame::Frame,
    },
    server::{Server, ServerConfig},
};
use tokio::{sync::oneshot, task::JoinHandle};
use tonic::{Code, Status, Streaming, transport::Channel};

pub use crate::deployment::GATEWAYS;

/// What `DescribeSubscription` shows as `queued_messages` when `queued` wait beyond the
/// members' windows: all of them on an embedded broker; through a gateway only what it pulled
/// (its members' windows), so 0, as the backlog stays in JetStream (README, cluster mode).
pub fn queued_here(queued: u64) -> u64 {
    if GATEWAYS { 0 } else { queued }
}

/// Asserts `after` is the epoch of the promotion right after `before`: one more on an embedded
/// broker; higher through gateways, whose epochs are the coordination bucket's revisions.
pub fn assert_next_epoch(before: u64, after: u64) {
    if GATEWAYS {
        assert!(after > before, "epoch {after} after {before}");
    } else {
        assert_eq!(after, before + 1);
    }
}

/// How long any single expected event may take before the test fails.
pub const EVENT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a join's answer may take: through gateways, a join that makes its consumer waits
/// for the consumer's replicas (up to 3 s) and for every gateway's registry (up to 3.36 s, a
/// silent gateway's dead-after wait), each a few JetStream requests that take seconds on a
/// loaded machine (docs/cluster-internals.md#queued_for-across-gateways).
pub const JOIN_TIMEOUT: Duration = Duration::from_secs(30);

pub struct TestServer {
    /// Where subscribers connect (and every call but publishes).
    pub addr: SocketAddr,
    /// Where [`Client::publish`] and unary acks go: `addr` itself, or another gateway.
    pub publish_addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), tinybroker::server::ServeError>>>,
    /// What the served server serves with, for a console over it ([`TestServer::console`]).
    backend: tinybroker::backend::Backend,
    transport: std::sync::Arc<tinybroker::transport::TransportStats>,
    /// The publishers' server when it is another one.
    peer: Option<Box<TestServer>>,
    /// What the deployment keeps alive beside the servers (a NATS cluster), dropped last.
    _keep: Option<Box<dyn std::any::Any + Send>>,
}

impl TestServer {
    pub async fn start() -> Self {
        Self::with_config(ServerConfig::default()).await
    }

    /// The including binary's deployment for `config`.
    pub async fn with_config(config: ServerConfig) -> Self {
        crate::deployment::start(config).await
    }

    /// Two servers as one deployment: subscribers on `self`, publishers on `peer`, with `keep`
    /// alive until both are dropped.
    #[allow(
        dead_code,
        reason = "the gateways' deployment (tests/cluster) pairs servers"
    )]
    pub fn paired(mut self, peer: TestServer, keep: Box<dyn std::any::Any + Send>) -> Self {
        self.publish_addr = peer.addr;
        self.peer = Some(Box::new(peer));
        self._keep = Some(keep);
        self
    }

    /// Serves `server` (built by the caller, e.g. as a cluster-mode gateway).
    pub async fn run(server: Server) -> Self {
        Self::run_then(server, async {}).await
    }

    /// Serves `server`; once it stopped, awaits `after` before [`TestServer::stop`] returns
    /// (a gateway's `close`, as `tinybroker serve` calls it).
    pub async fn run_then(
        server: Server,
        after: impl Future<Output = ()> + Send + 'static,
    ) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let backend = server.backend().clone();
        let transport = server.transport_stats();
        let (tx, rx) = oneshot::channel();
        let served = server.run(tinybroker::server::tcp_incoming(listener), async {
            let _ = rx.await;
        });
        let task = tokio::spawn(async move {
            let result = served.await;
            after.await;
            result
        });
        Self {
            addr,
            publish_addr: addr,
            shutdown: Some(tx),
            task: Some(task),
            backend,
            transport,
            peer: None,
            _keep: None,
        }
    }

    /// Serves the console (docs/operations.md#console) over this server (at a gateway: the
    /// subscribers'), on a port-0 loopback listener, until the test ends.
    pub async fn console(&self, config: tinybroker::console::ConsoleConfig) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(tinybroker::console::serve(
            self.backend.clone(),
            std::sync::Arc::new(tinybroker::clock::TokioClock::new()),
            self.transport.clone(),
            config,
            listener,
            std::future::pending(),
        ));
        addr
    }

    pub async fn client(&self) -> Client {
        let connect = |addr: SocketAddr| async move {
            let channel = Channel::from_shared(format!("http://{addr}"))
                .unwrap()
                .connect()
                .await
                .unwrap();
            BrokerClient::new(channel)
        };
        let here = connect(self.addr).await;
        let publisher = if self.publish_addr == self.addr {
            here.clone()
        } else {
            connect(self.publish_addr).await
        };
        Client(here, publisher)
    }

    /// Triggers graceful shutdown and waits for the server (and its peer) to return.
    pub async fn stop(mut self) -> Result<(), tinybroker::server::ServeError> {
        let _ = self.shutdown.take().unwrap().send(());
        let result = within(self.task.take().unwrap()).await.unwrap();
        match self.peer.take() {
            Some(peer) => result.and(Box::pin(peer.stop()).await),
            None => result,
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Awaits `future`, failing the test if it takes longer than [`EVENT_TIMEOUT`].
pub async fn within<F: Future>(future: F) -> F::Output {
    tokio::time::timeout(EVENT_TIMEOUT, future)
        .await
        .expect("timed out waiting for an event")
}

/// A client of a deployment: `.0` talks to the subscribers' server, `.1` to the publishers'
/// (the same connection on an embedded broker).
#[derive(Clone)]
pub struct Client(pub BrokerClient<Channel>, pub BrokerClient<Channel>);

pub fn open(id: &str, mode: DeliveryMode, group: &str, patterns: &[&str]) -> OpenSubscription {
    OpenSubscription {
        subscription_id: id.into(),
        topic_patterns: patterns.iter().map(|p| p.to_string()).collect(),
        mode: mode.into(),
        consumer_group: group.into(),
        ..Default::default()
    }
}

pub fn singleton(id: &str) -> OpenSubscription {
    open(id, DeliveryMode::Singleton, "replicas", &["jobs.*"])
}

/// How a member settles its messages: the seed's unary Ack/Nack beside a `Subscribe` stream, or
/// `Settle` messages on its own `Consume` stream. Tests of delivery semantics run over both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Carriage {
    Unary,
    Stream,
}

/// Runs a test body once per [`Carriage`]: `name::unary` and `name::stream`.
#[allow(unused_macros)]
macro_rules! over_carriages {
    ($(#[doc = $doc:literal])* async fn $name:ident($carriage:ident: Carriage) $body:block) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            async fn body($carriage: Carriage) $body

            #[tokio::test]
            async fn unary() {
                body(Carriage::Unary).await
            }

            #[tokio::test]
            async fn stream() {
                body(Carriage::Stream).await
            }
        }
    };
}

impl Client {
    /// A client whose every call goes over one connection (a server the test built itself).
    pub fn of(client: BrokerClient<Channel>) -> Self {
        Self(client.clone(), client)
    }

    /// This client's calls all at the publishers' server (through gateways, the other
    /// gateway; embedded, the same broker): for a member joining elsewhere.
    pub fn at_publishers(&self) -> Self {
        Self::of(self.1.clone())
    }

    /// Opens a subscription stream. Returns once the broker has accepted the member (the
    /// response headers arrive after the join), not when it becomes active.
    pub async fn subscribe(&self, request: OpenSubscription) -> Result<Member, Status> {
        self.subscribe_via(Carriage::Unary, request).await
    }

    /// Opens a subscription stream that settles by `carriage`.
    pub async fn subscribe_via(
        &self,
        carriage: Carriage,
        request: OpenSubscription,
    ) -> Result<Member, Status> {
        self.subscribe_within(carriage, request, JOIN_TIMEOUT).await
    }

    /// [`Client::subscribe_via`], the join's answer awaited for up to `patience` (a join
    /// while JetStream moves a killed node's leaders).
    pub async fn subscribe_within(
        &self,
        carriage: Carriage,
        request: OpenSubscription,
        patience: Duration,
    ) -> Result<Member, Status> {
        async fn within<F: Future>(patience: Duration, future: F) -> F::Output {
            tokio::time::timeout(patience, future)
                .await
                .expect("timed out waiting for a join's answer")
        }
        let (stream, settles) = match carriage {
            Carriage::Unary => (
                within(patience, self.0.clone().subscribe(request.clone()))
                    .await?
                    .into_inner(),
                None,
            ),
            Carriage::Stream => {
                let (tx, rx) = tokio::sync::mpsc::channel(64);
                tx.send(pb::ConsumeRequest {
                    request: Some(pb::consume_request::Request::Open(request.clone())),
                })
                .await
                .unwrap();
                let stream = within(
                    patience,
                    self.0
                        .clone()
                        .consume(tokio_stream::wrappers::ReceiverStream::new(rx)),
                )
                .await?
                .into_inner();
                (stream, Some(tx))
            }
        };
        Ok(Member {
            id: request.subscription_id,
            stream,
            member_id: 0,
            epoch: 0,
            client: self.clone(),
            settles,
        })
    }

    pub async fn publish(&self, topic: &str, payload: &str) -> pb::PublishResponse {
        self.try_publish(topic, payload.as_bytes().to_vec())
            .await
            .unwrap()
    }

    pub async fn try_publish(
        &self,
        topic: &str,
        payload: Vec<u8>,
    ) -> Result<pb::PublishResponse, Status> {
        within(self.1.clone().publish(PublishRequest {
            topic: topic.into(),
            payload: payload.into(),
            headers: Default::default(),
            fence: None,
        }))
        .await
        .map(|r| r.into_inner())
    }

    pub async fn describe(&self, id: &str) -> Result<pb::SubscriptionInfo, Status> {
        within(
            self.0
                .clone()
                .describe_subscription(pb::DescribeSubscriptionRequest {
                    subscription_id: id.into(),
                }),
        )
        .await
        .map(|r| r.into_inner())
    }

    pub async fn list(&self) -> pb::ListSubscriptionsResponse {
        self.list_page(0, "").await.unwrap()
    }

    /// `ListSubscriptions` at the publishers' server, whose broker counters count the publishes.
    pub async fn publishers_list(&self) -> pb::ListSubscriptionsResponse {
        within(
            self.1
                .clone()
                .list_subscriptions(pb::ListSubscriptionsRequest::default()),
        )
        .await
        .unwrap()
        .into_inner()
    }

    pub async fn list_page(
        &self,
        page_size: u32,
        page_token: &str,
    ) -> Result<pb::ListSubscriptionsResponse, Status> {
        within(
            self.0
                .clone()
                .list_subscriptions(pb::ListSubscriptionsRequest {
                    page_size,
                    page_token: page_token.into(),
                }),
        )
        .await
        .map(|r| r.into_inner())
    }

    /// The connection a unary settle goes over: one naming its member goes to the publishers'
    /// server (through a gateway, forwarded to the member's own), the two-field form over the
    /// subscribers' connection, which fences it.
    fn settler(&self, member_id: u64) -> BrokerClient<Channel> {
        if member_id == 0 {
            self.0.clone()
        } else {
            self.1.clone()
        }
    }

    pub async fn ack(&self, id: &str, member_id: u64, system_id: u64) -> Result<(), Status> {
        within(self.settler(member_id).ack(pb::Ack {
            subscription_id: id.into(),
            system_id,
            member_id,
        }))
        .await
        .map(|_| ())
    }

    pub async fn nack(&self, id: &str, member_id: u64, system_id: u64) -> Result<(), Status> {
        within(self.settler(member_id).nack(pb::Nack {
            subscription_id: id.into(),
            system_id,
            member_id,
        }))
        .await
        .map(|_| ())
    }
}

pub struct Member {
    pub id: String,
    pub stream: Streaming<SubscriptionFrame>,
    pub member_id: u64,
    pub epoch: u64,
    client: Client,
    /// Set for a `Consume` member: where its settles go.
    pub settles: Option<tokio::sync::mpsc::Sender<pb::ConsumeRequest>>,
}

impl Member {
    pub async fn frame(&mut self) -> Frame {
        match within(self.stream.message()).await {
            Ok(Some(frame)) => frame.frame.expect("frame without content"),
            Ok(None) => panic!("stream {} ended", self.id),
            Err(status) => panic!("stream {} failed: {status:?}", self.id),
        }
    }

    /// Awaits the confirmation frame, which must be the next frame; records member id and epoch.
    pub async fn confirmed(&mut self) -> pb::Confirmation {
        match self.frame().await {
            Frame::Confirmation(c) => {
                assert_eq!(c.subscription_id, self.id);
                self.member_id = c.member_id;
                self.epoch = c.epoch;
                c
            }
            other => panic!("expected the confirmation first, got {other:?}"),
        }
    }

    pub async fn message(&mut self) -> pb::DeliveredMessage {
        match self.frame().await {
            Frame::Message(m) => m,
            other => panic!("expected a message, got {other:?}"),
        }
    }

    /// Acks by the member's carriage and returns once the broker counted it.
    pub async fn ack(&self, system_id: u64) {
        self.settle(system_id, false).await;
    }

    /// Nacks by the member's carriage and returns once the broker counted it.
    pub async fn nack(&self, system_id: u64) {
        self.settle(system_id, true).await;
    }

    /// Releases on the member's `Consume` stream (docs/semantics.md#releases) and returns once
    /// the broker counted it.
    pub async fn release(&self, system_ids: &[u64]) {
        let settles = self
            .settles
            .as_ref()
            .expect("a release needs a Consume stream");
        let released = |info: &pb::SubscriptionInfo| info.counters.unwrap_or_default().released;
        let before = released(&self.client.describe(&self.id).await.unwrap());
        settles
            .send(pb::ConsumeRequest {
                request: Some(pb::consume_request::Request::Settle(pb::Settle {
                    release: system_ids.to_vec(),
                    ..Default::default()
                })),
            })
            .await
            .unwrap();
        let want = before + system_ids.len() as u64;
        within(async {
            while released(&self.client.describe(&self.id).await.unwrap()) < want {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await;
    }

    async fn settle(&self, system_id: u64, nack: bool) {
        let Some(settles) = &self.settles else {
            let result = if nack {
                self.client.nack(&self.id, self.member_id, system_id).await
            } else {
                self.client.ack(&self.id, self.member_id, system_id).await
            };
            return result.unwrap();
        };
        // A stream settle has no answer (only refusals, as frames): await its effect instead.
        let count = |info: &pb::SubscriptionInfo| {
            let c = info.counters.unwrap_or_default();
            if nack { c.nacked } else { c.acked }
        };
        let before = count(&self.client.describe(&self.id).await.unwrap());
        let settle = if nack {
            pb::Settle {
                nack: vec![system_id],
                ..Default::default()
            }
        } else {
            pb::Settle {
                ack: vec![system_id],
                ..Default::default()
            }
        };
        settles
            .send(pb::ConsumeRequest {
                request: Some(pb::consume_request::Request::Settle(settle)),
            })
            .await
            .unwrap();
        within(async {
            while count(&self.client.describe(&self.id).await.unwrap()) == before {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await;
    }

    /// Awaits the stream's end and returns its final status code (`Ok` for a clean end).
    pub async fn ended(&mut self) -> Result<(), Status> {
        loop {
            match within(self.stream.message()).await {
                Ok(Some(_)) => continue,
                Ok(None) => return Ok(()),
                Err(status) => return Err(status),
            }
        }
    }
}

pub fn assert_code(result: Result<impl std::fmt::Debug, Status>, code: Code, needle: &str) {
    let status = result.expect_err("expected an error status");
    assert_eq!(status.code(), code, "{status:?}");
    assert!(
        status.message().contains(needle),
        "status message {:?} does not mention {needle:?}",
        status.message()
    );
}
