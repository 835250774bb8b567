//! Joining a subscription at a gateway: its JetStream consumer checked against the request (or
//! created), every replica of the consumer waited for, the member joined to the local
//! broker, and the subscription's bridge started when none runs.

use std::{sync::Arc, time::Duration};

use crate::cluster::gateway::{
    Gateway,
    control::lease::JOIN_LEASE_PATIENCE,
    data::{acks::acked_upstream, bridge, router},
    wire::names,
};
use crate::cluster::jetstream::{ConsumerConfig, ConsumerInfo, CreateError, Found, Stream};
use crate::{
    broker::{ConnectionId, MemberStream},
    core::{Error, ErrorKind, Mode, OpenRequest},
};

impl Gateway {
    /// Joins a subscription at this gateway: checks (or creates) its JetStream consumer, joins
    /// the local subscription, and makes sure its bridge runs.
    ///
    /// # Errors
    /// A refusal of kind [`ErrorKind::FailedPrecondition`] for a join that differs from the
    /// subscription's settings or a consumer it cannot use; the local broker's refusals.
    pub async fn open(
        &self,
        request: &OpenRequest,
        connection: Option<ConnectionId>,
    ) -> Result<MemberStream, Error> {
        let singleton = request.spec.mode == Mode::Singleton;
        // Counted as under way until its member is in the local broker, and waits while a
        // delete holds the id (docs/semantics.md#deleting): it finds the old consumer or none.
        let _joining = self.inner.holds.enter(&request.subscription_id).await;
        let ((consumer, info), recorded, announce) = self.consumer(request).await?;
        // Beside the waits below: every gateway's registry has the consumer before the join is
        // answered (docs/cluster-internals.md#queued_for-across-gateways).
        let (made, metadata) = (info.name.clone(), info.metadata.clone());
        let announced = async {
            match announce {
                Announce::Made => {
                    let change = crate::cluster::gateway::control::registry::Change::Made {
                        name: made,
                        metadata,
                    };
                    self.announce_consumers_changed(change).await;
                }
                Announce::IfNew(name) => self.announce_if_new(&name, &metadata).await,
            }
        };
        let admitted = async {
            // A singleton member is admitted only under a valid lease, so its place in the
            // line is taken in the order joins arrive (docs/semantics.md#cluster-join-order).
            let incarnation = match singleton {
                true => Some(
                    self.inner
                        .shared
                        .singletons
                        .lease()
                        .wait_valid(JOIN_LEASE_PATIENCE)
                        .await
                        .ok_or_else(|| {
                            Error::Unavailable(format!(
                                "this gateway holds no cluster lease (it is starting, or NATS did not confirm its lease within {JOIN_LEASE_PATIENCE:?}): a singleton member cannot join here now; retry, or join at another gateway"
                            ))
                        })?,
                ),
                false => None,
            };
            await_replicas(self.inner.shared.stream.as_ref(), &info).await;
            Ok::<_, Error>(incarnation)
        };
        let (admitted, ()) = tokio::join!(admitted, announced);
        let incarnation = admitted?;
        // Joined with the subscription's own settings: a join that leaves
        // max_delivery_attempts or dead_letter_topic unset takes them from the subscription,
        // wherever it was created.
        let request = &OpenRequest {
            spec: recorded,
            ..request.clone()
        };
        let spec = &request.spec;
        // Covering filters bring messages the subscription does not want: its bridge checks.
        let only = (!names::filters(&spec.patterns).1).then(|| spec.patterns.clone());
        let broker = &self.inner.shared.broker;
        let member = broker.open(request, connection).inspect_err(|e| {
            crate::broker::refused_join(&request.subscription_id, e);
        })?;
        // Its id must be on this gateway's route, or acks forwarded to it would reach another
        // gateway: a subscription past 2^24 joins at one gateway run has none left
        // (docs/semantics.md#cluster-restart-identity). Dropping the stream leaves.
        let route = crate::cluster::ids::Route::of(broker.id_floor().unix_micros());
        if crate::cluster::ids::Route::of(member.member_id()) != route {
            tracing::error!(
                subscription = %request.subscription_id,
                "subscription {:?} has had 2^{} joins at this gateway since it started: its member ids are used up here; join at another gateway, or restart this one",
                request.subscription_id,
                crate::broker::GATEWAY_ROUTE_SHIFT
            );
            return Err(Error::Unavailable(format!(
                "this gateway has handed out every member id it has for subscription {:?} (2^{} joins since it started): join at another gateway, or restart this one",
                request.subscription_id,
                crate::broker::GATEWAY_ROUTE_SHIFT
            )));
        }
        let subscription: Arc<str> = Arc::from(request.subscription_id.as_str());
        if let router::Attach::New(wiring) = self.inner.router.attach(&subscription) {
            let bridge = bridge::Bridge::new(
                self.inner.shared.clone(),
                subscription.clone(),
                consumer,
                spec,
                wiring,
                self.ack_wait(spec.mode),
                self.inner.config.ack_wait,
                only,
            );
            let mut bridges = self.inner.bridges.lock().await;
            // Reap the finished ones, so the set stays as large as the live bridges.
            while bridges.try_join_next().is_some() {}
            bridges.spawn(bridge.run());
        }
        if let Some(incarnation) = incarnation {
            let singletons = &self.inner.shared.singletons;
            // After the bridge is there: it tells the coordinator when this member leaves.
            let in_line = singletons.joined(
                subscription.clone(),
                member.member_id(),
                incarnation,
                (request.metadata.clone(), request.member.priority),
            );
            // Answered once the member is in the line: a member joining anywhere after this
            // answer stands behind it. Bounded: NATS slow to answer leaves it waiting on
            // standby (a member ended meanwhile finds its stream ended).
            match tokio::time::timeout(JOIN_LEASE_PATIENCE, in_line).await {
                // Refused (no room for its metadata): dropping its stream makes it leave.
                Ok(Ok(Err(error))) => {
                    crate::broker::refused_join(&request.subscription_id, &error);
                    return Err(error);
                }
                Ok(_) => {}
                Err(_) => {
                    tracing::warn!(%subscription, member = member.member_id(), "the coordination bucket did not take this member into the line within {JOIN_LEASE_PATIENCE:?}: the join is answered, on standby");
                }
            }
        }
        Ok(member)
    }

    /// How long JetStream waits for an ack on a consumer of this mode. A singleton's is half
    /// the gateway lease: a dead gateway's last progress ack was sent at most a sixth of the
    /// lease before it died, so what it held is redelivered at most two thirds of a lease
    /// after, while its successor is promoted no sooner than `dead_after` (above the lease)
    /// after the last renewal others saw, sent at most a third of a lease before the death:
    /// later than two thirds of a lease after it. So the held messages come first.
    pub(in crate::cluster::gateway) fn ack_wait(&self, mode: Mode) -> Duration {
        match mode {
            Mode::Singleton => self.inner.config.ack_wait.min(self.inner.config.lease / 2),
            Mode::Queue | Mode::Broadcast => self.inner.config.ack_wait,
        }
    }

    /// The subscription's consumer and its settings: checked against those its metadata
    /// records when it exists, created otherwise.
    async fn consumer(
        &self,
        request: &OpenRequest,
    ) -> Result<(Found, crate::core::SubscriptionSpec, Announce), Error> {
        let spec = &request.spec;
        let name = names::consumer_name(spec.mode, &request.subscription_id, &self.inner.id);
        let stream = &self.inner.shared.stream;
        let refused = |message: String| Error::cluster(ErrorKind::FailedPrecondition, message);
        let check = |info: &ConsumerInfo| -> Result<crate::core::SubscriptionSpec, Error> {
            let (id, recorded) = names::recorded(&info.metadata).map_err(|why| {
                refused(format!(
                    "subscription {:?} cannot use JetStream consumer {name}: {why}",
                    request.subscription_id
                ))
            })?;
            if id != request.subscription_id {
                return Err(refused(format!(
                    "subscription {:?}: its JetStream consumer name {name} is taken by subscription {id:?}",
                    request.subscription_id
                )));
            }
            match recorded.differences(spec) {
                None => Ok(recorded),
                Some(diff) => Err(refused(format!(
                    "subscription {:?} exists with other settings (on some gateway): {diff}",
                    request.subscription_id
                ))),
            }
        };
        if let Ok(Some(found)) = stream.consumer(&name).await {
            let recorded = check(&found.1)?;
            return Ok((found, recorded, Announce::IfNew(name)));
        }
        let config = ConsumerConfig {
            name: name.clone(),
            // Patterns that overlap are not filters JetStream takes as they are.
            filters: names::filters(&spec.patterns)
                .0
                .iter()
                .map(|p| names::subject(&self.inner.shared.prefix, p))
                .collect(),
            explicit: acked_upstream(spec),
            ack_wait: self.ack_wait(spec.mode),
            // Every gateway pulls at most its members' windows; this bounds them all together.
            max_ack_pending: i64::try_from(self.inner.shared.broker.limits().max_queue_messages)
                .unwrap_or(i64::MAX),
            inactive_threshold: self.inner.config.idle_timeout,
            metadata: names::metadata(&request.subscription_id, spec),
        };
        // JetStream "temporarily unavailable" (a leader being elected, a node gone) or not
        // answering is waited out, as publishes wait for an election (docs/semantics.md#cluster-durability).
        let deadline = tokio::time::Instant::now() + JOIN_LEASE_PATIENCE;
        let mut delay = Duration::from_millis(50);
        loop {
            let error = match stream.create_consumer(config.clone()).await {
                Ok(found) => return Ok((found, spec.clone(), Announce::Made)),
                Err(error) => error,
            };
            // Another gateway may have created it first, with other settings.
            if let Ok(Some(found)) = stream.consumer(&name).await {
                let recorded = check(&found.1)?;
                return Ok((found, recorded, Announce::IfNew(name)));
            }
            match error {
                CreateError::Limit => {
                    return Err(self.consumer_limit_reached(&request.subscription_id));
                }
                CreateError::Refused(_) => {
                    return Err(refused(format!(
                        "JetStream refused the consumer of subscription {:?}: {error}",
                        request.subscription_id
                    )));
                }
                CreateError::ForNow(_) => {}
            }
            if tokio::time::Instant::now() + delay > deadline {
                return Err(Error::Unavailable(format!(
                    "JetStream could not make the consumer of subscription {:?} within {JOIN_LEASE_PATIENCE:?} ({error}); nothing changed: join again",
                    request.subscription_id
                )));
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_millis(500));
        }
    }
}

impl Gateway {
    /// The refusal of a join whose consumer the stream has no room for: what a consumer is,
    /// and the setting to raise (docs/cluster.md#subscriptions-and-consumers).
    fn consumer_limit_reached(&self, subscription: &str) -> Error {
        let stream = &self.inner.config.stream;
        let limit = self.inner.settings.max_consumers;
        let limit = if limit > 0 {
            format!("{limit}, its max_consumers, or its account's limit")
        } else {
            "the servers' default (1,000 on nats-server 2.15), or its account's limit".into()
        };
        Error::cluster(
            ErrorKind::ResourceExhausted,
            format!(
                "subscription {subscription:?} was not joined: JetStream stream {stream} holds its most consumers ({limit}), and each subscription is one (each BROADCAST member one more, the fence records one); delete subscriptions no longer used, or raise the limit (`nats stream edit {stream} --max-consumers N`; a stream a gateway creates takes --nats-max-consumers)"
            ),
        )
    }
}

/// What a join announces to the other gateways about the consumer it found or made.
enum Announce {
    /// It made the consumer.
    Made,
    /// Another gateway made it: announced too if this gateway's copy lacks it.
    IfNew(String),
}

/// How long a join waits for every replica of its consumer to hold it ([`await_replicas`]).
const REPLICA_PATIENCE: Duration = Duration::from_secs(3);

/// Waits until every replica of the subscription's consumer has it, so every server of the
/// stream keeps the messages published from now on for it.
///
/// JetStream answers a consumer's creation from the consumer's leader, once a quorum of its
/// peers elected it; a server that applies the cluster's log later (loaded, or slow) does not
/// know the consumer yet. Under interest retention such a server does not store a message no
/// consumer it knows wants, yet when it leads the stream the publish is confirmed: the message
/// is then held only by the other servers (and the stream counts it nowhere for its limits),
/// and lost for the subscription once its consumer's leader moves to that server. So a join is
/// answered only once the consumer's leader reports every other replica current in the
/// consumer's group: a server takes part in that group once it has applied the consumer's
/// creation, which registers the consumer with its stream a moment after (the consumer's store
/// is made in between). Replicas the cluster knows to be offline are not waited for; past
/// [`REPLICA_PATIENCE`] the join is answered all the same, and the gateway says so. A consumer
/// created longer ago than that is not waited for either: a replica that is not current then
/// is down or far behind (a killed node stays "not current, not offline" for minutes), and
/// every later join would otherwise wait the whole patience for it.
async fn await_replicas(stream: &dyn Stream, info: &ConsumerInfo) {
    let created = info.created;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128);
    let old = now - created > REPLICA_PATIENCE.as_nanos() as i128;
    if old || info.everywhere {
        return;
    }
    let deadline = tokio::time::Instant::now() + REPLICA_PATIENCE;
    let mut delay = Duration::from_millis(5);
    loop {
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(100));
        // Bounded by the deadline: a JetStream request waits up to its context's 5 s when the
        // consumer has no leader.
        let seen = tokio::time::timeout_at(deadline, stream.consumer_info(&info.name)).await;
        let behind = match seen {
            Ok(Ok(seen)) if seen.everywhere => return,
            Ok(Ok(seen)) => seen.behind,
            _ => info.behind.clone(),
        };
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!(
                consumer = %info.name,
                ?behind,
                "a replica of the consumer was not current within {REPLICA_PATIENCE:?}: the join is answered, but messages published before that server applies the consumer's creation may be kept only by the other servers"
            );
            return;
        }
    }
}
