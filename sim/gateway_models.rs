//! The production gateway ([`Gateway::assemble`]) over the models of everything it asks of NATS:
//! the bus (`bus.rs`), the stream and its consumers (`jetstream.rs`), and the coordination
//! bucket (`backplane.rs`). No nats-server runs here; the gateway's own code does, bridges,
//! acks, registry, fence records and singleton shell included. The first step of putting the
//! real gateway on turmoil hosts (docs/testing.md#the-real-gateway-over-the-models).

use std::{
    sync::{Arc, atomic::AtomicU64},
    time::Duration,
};

use bytes::Bytes;
use tinybroker::{
    broker::{Fence, MemberStream, Outbound},
    cluster::gateway::{Gateway, GatewayConfig, Parts, StreamSettings},
    core::{
        AckMode, Draft, Headers, Limits, MemberOptions, Mode, OpenRequest, Overflow, Pattern,
        SubscriptionSpec, Topic,
    },
};

use crate::{backplane::Model, bus::BusModel, jetstream::StreamModel, true_time::TrueTime};

/// The stream's name (and subjects' prefix).
const STREAM: &str = "tb";
/// Bound on anything that should come.
const SOON: Duration = Duration::from_secs(30);

/// The models one cluster shares.
#[derive(Clone)]
pub struct Models {
    bus: BusModel,
    stream: StreamModel,
    kv: Model,
    /// Starts so far: each names a gateway id of its own.
    starts: Arc<AtomicU64>,
    clock: TrueTime,
}

/// The world's wall clock at its start, in µs since the Unix epoch (2027-01-15): what a
/// gateway's start reads as the time when it raises the epoch floor and claims a route.
const UNIX_START_MICROS: u64 = 1_800_000_000_000_000;

impl Models {
    /// Models for a world on one tokio runtime.
    pub fn new() -> Self {
        Self::on(TrueTime::tokio())
    }

    /// Models keeping time by `clock`.
    pub fn on(clock: TrueTime) -> Self {
        let bus = BusModel::new();
        let stream = StreamModel::on(STREAM, clock.clone());
        stream.take_subjects(&format!("$TBFENCE.{STREAM}.>"));
        stream.advise_on(bus.client(0));
        Self {
            bus,
            stream,
            kv: Model::new(),
            starts: Arc::new(AtomicU64::new(0)),
            clock,
        }
    }

    /// The consumers' leaders are lost, nobody told (true), or elected again (false).
    pub fn consumers_unanswering(&self, unanswering: bool) {
        self.stream.consumers_unanswering(unanswering);
    }

    /// Gateway `n` cut off from NATS (true), or reconnected (false): its bus, its bucket and
    /// the stream answer it nothing meanwhile, while the other gateways reach them.
    pub fn cut_from_nats(&self, n: u64, cut: bool) {
        if cut {
            self.bus.partition(n);
            self.kv.partition(n);
        } else {
            self.bus.heal(n);
            self.kv.heal(n);
        }
        self.stream.cut_off(n, cut);
    }

    /// The next `n` publish answers are lost after their message was stored (the outcome
    /// unknown to the gateway, which sends it again with its message id), and the
    /// confirmations of the next `n` acks after they were applied (the gateway sends each again
    /// until one is confirmed).
    pub fn lose_answers(&self, n: u32) {
        self.stream.lose_answers(n);
        self.stream.lose_confirmations(n);
    }

    /// The payloads of the messages stored on `subject`, in stream order, with their sequences.
    pub fn stored_on(&self, subject: &str) -> Vec<(u64, bytes::Bytes)> {
        self.stream
            .stored()
            .into_iter()
            .filter(|m| m.subject == subject)
            .map(|m| (m.sequence, m.payload))
            .collect()
    }

    /// The stream and its consumers lose their leaders (true), or have them again (false).
    pub fn jetstream_leaderless(&self, leaderless: bool) {
        self.stream.leaderless(leaderless);
    }

    /// Gateway `n` (1, 2, ...) over the models: its bus and bucket clients are `n`'s (cut off
    /// together by the models' partitions). Each start raises the epoch floor and claims a
    /// route in the bucket, as production's does (`tinybroker::cluster::identity`), and gets
    /// an id of its own. A start that fails (its gateway cut off from NATS) is made again by
    /// its supervisor, here every 500 ms, until one gets through.
    pub async fn gateway(&self, n: u64) -> Gateway {
        loop {
            match self.start(n).await {
                Ok(gateway) => return gateway,
                Err(error) => {
                    tracing::debug!(n, %error, "a model gateway's start failed; starting it again");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    }

    async fn start(&self, n: u64) -> Result<Gateway, String> {
        let start = self
            .starts
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            + 1;
        let kv = self.kv.client(n);
        let now = UNIX_START_MICROS + self.clock.now().as_micros() as u64;
        let epoch_floor = tinybroker::cluster::identity::raise_epoch_floor(&kv, now)
            .await
            .map_err(|e| e.to_string())?;
        let route = tinybroker::cluster::identity::claim_route(
            &kv,
            now,
            tinybroker::broker::GATEWAY_ROUTE_SHIFT,
        )
        .await
        .map_err(|e| e.to_string())?;
        let parts = Parts {
            bus: Arc::new(self.bus.client(n)),
            jetstream: Arc::new(self.stream.client(n)),
            records: Arc::new(self.stream.client(n)),
            stream: Arc::new(self.stream.client(n)),
            backplane: Arc::new(kv),
            settings: StreamSettings {
                name: STREAM.into(),
                replicas: 3,
                storage: "file",
                max_consumers: 1000,
                first_sequence: None,
                duplicate_window: Duration::from_secs(120),
            },
            batches: true,
            largest_message: 1 << 20,
            epoch_floor,
            route,
            id: format!("g{n}s{start}"),
            connects: Arc::new(AtomicU64::new(1)),
            server: Arc::new(move || format!("model {n}")),
        };
        let config = GatewayConfig {
            stream: STREAM.into(),
            ..GatewayConfig::new("model")
        };
        let clock = Arc::new(tinybroker::clock::TokioClock::new());
        Gateway::assemble(config, Limits::default(), clock, parts).await
    }
}

fn request(id: &str, mode: Mode, pattern: &str) -> OpenRequest {
    OpenRequest {
        subscription_id: id.into(),
        spec: SubscriptionSpec {
            mode,
            consumer_group: "g".into(),
            patterns: vec![Pattern::parse(pattern).unwrap()],
            max_delivery_attempts: 0,
            dead_letter_topic: None,
            ack_mode: AckMode::Explicit,
            overflow: Overflow::RejectPublish,
        },
        member: MemberOptions {
            max_in_flight: 10,
            ..MemberOptions::default()
        },
        metadata: "".into(),
    }
}

fn draft(topic: &str, body: &str) -> Draft {
    Draft::new(
        Topic::parse(topic).unwrap(),
        Bytes::copy_from_slice(body.as_bytes()),
        Headers::new(),
        &Limits::default(),
    )
    .unwrap()
}

/// The member's next frame, bounded.
async fn next(member: &mut MemberStream) -> Outbound {
    tokio::time::timeout(SOON, member.next())
        .await
        .expect("a frame within the bound")
        .expect("the stream is open")
}

/// Two gateways over `models`, and a member of SINGLETON `jobs` at the first, active: the
/// gateways, that member's stream, its id and its epoch.
async fn first_active(models: &Models) -> (Gateway, Gateway, MemberStream, u64, u64) {
    let (one, two) = (models.gateway(1).await, models.gateway(2).await);
    let mut first = one.open(&jobs(), None).await.unwrap();
    let Outbound::Confirm {
        member_id, epoch, ..
    } = next(&mut first).await
    else {
        panic!("the first member is active");
    };
    (one, two, first, member_id, epoch)
}

fn jobs() -> OpenRequest {
    request("jobs", Mode::Singleton, "jobs.>")
}

fn run(test: impl AsyncFnOnce()) {
    let rt = crate::clock::paused_runtime();
    rt.block_on(test());
}

// docs/semantics.md#cluster-ack-final: a QUEUE message published through the gateway is stored
// in the stream, delivered to the member through the gateway's bridge, and acked there: the
// consumer then holds nothing unacked.
#[test]
fn cluster_gateway_over_the_models_delivers_and_acks_a_queue_message() {
    run(async || {
        let models = Models::new();
        let gateway = models.gateway(1).await;
        let mut member = gateway
            .open(&request("orders", Mode::Queue, "orders.>"), None)
            .await
            .unwrap();
        let Outbound::Confirm { member_id, .. } = next(&mut member).await else {
            panic!("a confirmation first");
        };
        let published = gateway.publish(draft("orders.new", "one")).await.unwrap();
        let Outbound::Message {
            message, attempt, ..
        } = next(&mut member).await
        else {
            panic!("the message");
        };
        assert_eq!(
            (message.system_id(), attempt, message.payload()),
            (published.system_id, 1, &b"one"[..])
        );
        gateway
            .settle(
                "orders",
                Fence::Member(member_id),
                published.system_id,
                false,
            )
            .await
            .unwrap();
        assert_eq!(models.stored_on("tb.orders.new").len(), 1, "stored once");
        tokio::time::timeout(SOON, async {
            use tinybroker::cluster::jetstream::Stream;
            loop {
                let listed = models.stream.consumers().await.unwrap();
                if listed.iter().all(|c| c.ack_pending == 0) && !listed.is_empty() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the ack reached the consumer");
    });
}

// docs/semantics.md#cluster-singleton through two real gateways over the models: the member
// that joined first (at gateway 1) is active; the one at gateway 2 stands by. When the active
// member's stream closes holding a message, the standby is promoted with a higher epoch and
// gets that message first, its attempt one higher.
#[test]
fn cluster_gateways_over_the_models_promote_the_standby_with_the_unacked_message_first() {
    run(async || {
        let models = Models::new();
        let (_one, two, mut first, _, deposed) = first_active(&models).await;
        let mut second = two.open(&jobs(), None).await.unwrap();
        let published = two.publish(draft("jobs.run", "a")).await.unwrap();
        let Outbound::Message {
            message,
            attempt: 1,
            ..
        } = next(&mut first).await
        else {
            panic!("the active member gets the message");
        };
        assert_eq!(message.system_id(), published.system_id);
        drop(first);
        let closed = tokio::time::Instant::now();
        let promoted = loop {
            match next(&mut second).await {
                Outbound::Confirm { epoch, .. } => break epoch,
                Outbound::Standby { .. } => continue,
                other => panic!("a standby gets nothing before its promotion: {other:?}"),
            }
        };
        assert!(promoted > deposed, "epoch {promoted} after {deposed}");
        let Outbound::Message {
            message,
            attempt,
            epoch,
            ..
        } = next(&mut second).await
        else {
            panic!("the in-flight message first");
        };
        assert_eq!(
            (message.system_id(), attempt, epoch),
            (published.system_id, 2, promoted)
        );
        // Given back at once (a nak), not left to the consumer's ack wait (1.5 s here).
        assert!(
            closed.elapsed() < Duration::from_millis(500),
            "redelivered {:?} after the close",
            closed.elapsed()
        );
    });
}

// docs/semantics.md#cluster-ack-final, "what is left": a gateway cut off from NATS answers an
// ack of its active member while its lease lasts, but cannot tell JetStream; once its lease
// ended it sends nothing, counts the ack unconfirmed, and ends its member, and the message
// comes again to the member promoted at the other gateway, under a higher epoch. Past its
// lease, the cut-off gateway answers no settle as taken.
#[test]
fn cluster_gateway_cut_off_from_nats_counts_the_ack_it_could_not_send() {
    run(async || {
        let models = Models::new();
        let (one, two, mut first, member_id, deposed) = first_active(&models).await;
        let mut second = two.open(&jobs(), None).await.unwrap();
        let published = two.publish(draft("jobs.run", "a")).await.unwrap();
        let second_message = two.publish(draft("jobs.run", "b")).await.unwrap();
        for expected in [published.system_id, second_message.system_id] {
            let Outbound::Message { message, .. } = next(&mut first).await else {
                panic!("the active member gets the messages");
            };
            assert_eq!(message.system_id(), expected);
        }
        models.cut_from_nats(1, true);
        // Within its lease: answered.
        one.settle("jobs", Fence::Member(member_id), published.system_id, false)
            .await
            .expect("answered within the lease");
        assert_eq!(one.broker().list().1.unconfirmed_acks, 0);
        // The lease ends (3 s): the member's stream ends, the ack was never sent.
        loop {
            match next(&mut first).await {
                Outbound::End(_) => break,
                Outbound::Message { .. } => panic!("nothing handed over while cut off"),
                _ => {}
            }
        }
        // Past the lease nothing is answered as taken (the member ended, its messages given
        // back: not in flight).
        let late = one
            .settle(
                "jobs",
                Fence::Member(member_id),
                second_message.system_id,
                false,
            )
            .await;
        assert!(
            late.is_err(),
            "a settle past the lease was answered {late:?}"
        );
        tokio::time::timeout(SOON, async {
            while one.broker().list().1.unconfirmed_acks != 1 {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .expect("the unsent ack counted");
        let promoted = loop {
            match next(&mut second).await {
                Outbound::Confirm { epoch, .. } => break epoch,
                Outbound::Standby { .. } => continue,
                other => panic!("nothing before the promotion: {other:?}"),
            }
        };
        assert!(promoted > deposed);
        let Outbound::Message { message, epoch, .. } = next(&mut second).await else {
            panic!("the acked message comes again");
        };
        assert_eq!(
            (message.system_id(), epoch),
            (published.system_id, promoted)
        );
    });
}

// docs/semantics.md#cluster-ack-final: an ack JetStream applied whose confirmation was lost is
// sent again until one is confirmed. Nothing is counted unconfirmed, and the member promoted
// next does not get the acked message again: its first message is the one after it.
#[test]
fn cluster_gateway_sends_an_ack_again_when_its_confirmation_is_lost() {
    run(async || {
        let models = Models::new();
        let (one, two, mut first, member_id, _) = first_active(&models).await;
        let mut second = two.open(&jobs(), None).await.unwrap();
        let acked = two.publish(draft("jobs.run", "a")).await.unwrap();
        let Outbound::Message { message, .. } = next(&mut first).await else {
            panic!("the active member gets the message");
        };
        assert_eq!(message.system_id(), acked.system_id);
        // The next confirmation is lost once the ack was applied.
        models.stream.lose_confirmations(1);
        one.settle("jobs", Fence::Member(member_id), acked.system_id, false)
            .await
            .expect("the ack is answered");
        tokio::time::timeout(SOON, async {
            while models.stream.confirmations_to_lose() > 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the ack was sent and its confirmation lost");
        let after = two.publish(draft("jobs.run", "b")).await.unwrap();
        drop(first);
        let (message, epoch) = loop {
            match next(&mut second).await {
                Outbound::Message { message, epoch, .. } => break (message, epoch),
                Outbound::Confirm { .. } | Outbound::Standby { .. } => continue,
                other => panic!("unexpected before the first message: {other:?}"),
            }
        };
        assert_eq!(
            message.system_id(),
            after.system_id,
            "the promoted member's first message (epoch {epoch})"
        );
        // Past the gateway's patience for an ack (--nats-ack-wait), nothing was counted
        // unconfirmed: the ack sent again was confirmed.
        tokio::time::sleep(Duration::from_secs(31)).await;
        assert_eq!(one.broker().list().1.unconfirmed_acks, 0);
    });
}
