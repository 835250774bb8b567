//! The simulated world: the real server on host `broker`, which can be crashed and restarted
//! (losing everything it held in memory), replicas (real tonic clients) on hosts that can be
//! crashed, restarted and partitioned, and a publisher. Every host's behaviour follows from the
//! seed; everything observable lands in one [`Trace`].

use std::{
    cell::RefCell,
    collections::{BTreeMap, BTreeSet},
    rc::Rc,
    sync::Arc,
    time::Duration,
};

use tinybroker::{
    core::Limits,
    pb::{self, DeliveryMode, broker_client::BrokerClient, subscription_frame::Frame},
    server::{Server, ServerConfig},
};
use tokio::sync::mpsc;
use tonic::transport::Channel;
use turmoil::Sim;

use crate::{checker::Checker, clock::SimClock, net, rng::Rng, trace::Trace};

/// The broker's host.
const BROKER: &str = "broker";
/// The topic replicas subscribe to and the publisher publishes on.
pub const TOPIC: &str = "jobs.tick";
/// A second topic of the subscriptions' pattern (`jobs.*`), for bursts that switch topics.
pub const OTHER_TOPIC: &str = "jobs.tock";

/// What a replica does with a message it receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Process for a while, then ack (fenced with its member id).
    Ack,
    /// Process, then nack.
    Nack,
    /// Drop its stream while holding the message, then send the (now stale) fenced ack anyway,
    /// then rejoin.
    AbandonThenAck,
}

/// How a replica settles what it receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Carriage {
    /// Unary Ack/Nack naming its member id (the member fence).
    Fenced,
    /// The seed's two-field unary Ack/Nack, fenced by the connection it arrives on.
    Connection,
    /// Acks and nacks on its own Consume stream (fenced by construction); a late ack after it
    /// abandons the stream goes out as a two-field unary ack on the old connection.
    Stream,
}

/// How one replica behaves; decisions come from its own seeded generator, keyed by message and
/// attempt so a restarted replica decides the same way.
#[derive(Debug, Clone)]
pub struct Behaviour {
    pub seed: u64,
    /// Processing time range, milliseconds.
    pub process_ms: (u64, u64),
    /// Percent of deliveries nacked.
    pub nack_percent: u64,
    /// Percent of deliveries abandoned (stream dropped, late ack).
    pub abandon_percent: u64,
    /// Delay before the first join, so scenarios fix the join order.
    pub start_after: Duration,
    /// The replica's window (`max_in_flight`).
    pub window: u32,
    /// How it acks and nacks.
    pub carriage: Carriage,
    /// SINGLETON: after each message it processed, it publishes a side effect fenced by the
    /// epoch it got the message with (docs/semantics.md#fenced-publish), also after it abandoned
    /// its stream, as a deposed leader that wakes up late does.
    pub fenced_effects: bool,
    /// SINGLETON: its priority (docs/semantics.md#priority): one that outranks the leader
    /// takes over at a message boundary when it joins.
    pub priority: u32,
}

impl Behaviour {
    pub fn steady(process_ms: u64) -> Self {
        Self {
            seed: 0,
            process_ms: (process_ms, process_ms),
            nack_percent: 0,
            abandon_percent: 0,
            start_after: Duration::ZERO,
            window: 1,
            carriage: Carriage::Fenced,
            fenced_effects: false,
            priority: 0,
        }
    }

    pub fn with_window(mut self, window: u32) -> Self {
        self.window = window;
        self
    }

    pub fn starting_after(mut self, ms: u64) -> Self {
        self.start_after = Duration::from_millis(ms);
        self
    }

    fn decide(&self, system_id: u64, attempt: u32) -> (Action, Duration) {
        let mut rng = Rng::new(self.seed ^ (system_id << 8) ^ u64::from(attempt));
        let process = Duration::from_millis(rng.range(self.process_ms.0, self.process_ms.1));
        let roll = rng.range(0, 99);
        let action = if roll < self.abandon_percent {
            Action::AbandonThenAck
        } else if roll < self.abandon_percent + self.nack_percent {
            Action::Nack
        } else {
            Action::Ack
        };
        (action, process)
    }
}

/// What the clients saw, for client-side checks and liveness.
#[derive(Default)]
pub struct Seen {
    /// Published system ids, in order.
    pub published: Vec<u64>,
    /// Published system ids that matched no subscription (none existed yet, e.g. right after a
    /// broker restart, before the replicas rejoined): no client can receive them.
    pub unrouted: BTreeSet<u64>,
    /// Accepted acks per subscription id.
    pub acked: BTreeMap<String, BTreeSet<u64>>,
    /// Messages some client received, per subscription id.
    pub received: BTreeMap<String, BTreeSet<u64>>,
    /// Client-side violations (e.g. a replica saw its epoch go down).
    pub violations: Vec<String>,
    /// What leadership watchers were told: (watcher, active member or 0, epoch).
    pub watched: Vec<(String, u64, u64)>,
}

impl Seen {
    fn record_publish(&mut self, reply: &pb::PublishResponse) {
        // docs/semantics.md#redelivery-order and docs/semantics.md#restart-identity: ids increase in publish order, also across broker restarts, so one
        // publisher's ids only go up.
        if let Some(&last) = self.published.last()
            && reply.system_id <= last
        {
            self.violations.push(format!(
                "publisher got #{} after #{last}: a system id repeated",
                reply.system_id
            ));
        }
        self.published.push(reply.system_id);
        if reply.queued_for == 0 {
            self.unrouted.insert(reply.system_id);
        }
    }
}

pub struct World {
    pub sim: Sim<'static>,
    pub trace: Trace,
    pub checker: Arc<Checker>,
    pub seen: Rc<RefCell<Seen>>,
    pub mode: DeliveryMode,
    /// Ack-free (at-most-once) subscriptions: nothing is acked, messages are done once written.
    pub ack_free: bool,
    /// Subscriptions use the drop-oldest overflow policy.
    pub drop_oldest: bool,
    pub replicas: Vec<String>,
    /// How many messages the publisher will publish.
    pub to_publish: usize,
}

/// Knobs for one world.
#[derive(Debug, Clone)]
pub struct Setup {
    pub seed: u64,
    pub mode: DeliveryMode,
    pub ack_free: bool,
    /// Drop-oldest overflow policy (with `limits.max_queue_messages` small, it bites).
    pub drop_oldest: bool,
    pub limits: Limits,
}

impl Setup {
    pub fn new(seed: u64, mode: DeliveryMode) -> Self {
        Self {
            seed,
            mode,
            ack_free: false,
            drop_oldest: false,
            limits: Limits {
                idle_timeout: Duration::from_secs(3600),
                ..Limits::default()
            },
        }
    }
}

impl World {
    pub fn new(setup: &Setup) -> Self {
        let mut sim = turmoil::Builder::new()
            .rng_seed(setup.seed)
            .tick_duration(Duration::from_millis(1))
            .min_message_latency(Duration::from_millis(1))
            .max_message_latency(Duration::from_millis(20))
            .simulation_duration(Duration::from_secs(3600))
            .build();
        let trace = Trace::default();
        let checker = Arc::new(Checker::new(trace.clone()));
        let observer = checker.clone();
        let limits = setup.limits.clone();
        sim.host(BROKER, move || {
            let config = ServerConfig {
                limits: limits.clone(),
                keepalive_interval: Some(net::KEEPALIVE_INTERVAL),
                keepalive_timeout: net::KEEPALIVE_TIMEOUT,
                clock: Arc::new(SimClock::new()),
                observer: Some(observer.clone()),
                ..ServerConfig::default()
            };
            async move {
                let listener = turmoil::net::TcpListener::bind(("0.0.0.0", net::PORT)).await?;
                Server::new(config)
                    .run(net::incoming(listener), std::future::pending())
                    .await?;
                Ok(())
            }
        });
        Self {
            sim,
            trace,
            checker,
            seen: Rc::default(),
            mode: setup.mode,
            ack_free: setup.ack_free,
            drop_oldest: setup.drop_oldest,
            replicas: Vec::new(),
            to_publish: 0,
        }
    }

    /// The subscription a replica joins: one shared id in group modes, its own in broadcast.
    pub fn subscription_of(&self, replica: &str) -> String {
        match self.mode {
            DeliveryMode::Broadcast => format!("feed-{replica}"),
            _ => "report".to_string(),
        }
    }

    /// Adds a replica host that joins, processes per `behaviour`, and rejoins whenever its
    /// stream ends.
    pub fn replica(&mut self, name: &str, behaviour: Behaviour) {
        let trace = self.trace.clone();
        let seen = self.seen.clone();
        let open = pb::OpenSubscription {
            subscription_id: self.subscription_of(name),
            topic_patterns: vec!["jobs.*".into()],
            mode: self.mode.into(),
            consumer_group: if self.mode == DeliveryMode::Broadcast {
                String::new()
            } else {
                "replicas".into()
            },
            max_in_flight: behaviour.window,
            priority: behaviour.priority,
            ack_mode: if self.ack_free {
                pb::AckMode::None
            } else {
                pb::AckMode::Explicit
            }
            .into(),
            overflow: if self.drop_oldest {
                pb::OverflowPolicy::DropOldest
            } else {
                pb::OverflowPolicy::Unspecified
            }
            .into(),
            ..Default::default()
        };
        self.replicas.push(name.to_string());
        let host = name.to_string();
        self.sim.host(name, move || {
            replica(
                host.clone(),
                open.clone(),
                behaviour.clone(),
                trace.clone(),
                seen.clone(),
            )
        });
    }

    /// Adds an operator host that asks the singleton subscription's leader to hand over
    /// (docs/semantics.md#hand-over) every 0.3 to 2 s of simulated time, as drawn from
    /// `seed`, until `until`; it traces each answer.
    pub fn operator(&mut self, name: &str, seed: u64, until: Duration) {
        let trace = self.trace.clone();
        let host = name.to_string();
        self.sim.host(name, move || {
            operator(host.clone(), seed, until, trace.clone())
        });
    }

    /// Adds a host that watches the singleton subscription's leadership (docs/semantics.md#watching-leadership)
    /// for the whole run, opening its watch again whenever it ends (the subscription not made
    /// yet, the broker restarted, a partition), and records every frame in [`Seen::watched`].
    pub fn watcher(&mut self, name: &str) {
        let trace = self.trace.clone();
        let seen = self.seen.clone();
        let host = name.to_string();
        self.sim.host(name, move || {
            watcher(host.clone(), trace.clone(), seen.clone())
        });
    }

    /// Adds a publisher host that publishes `count` messages, one every `every`.
    pub fn publisher(&mut self, count: usize, start_after: Duration, every: Duration) {
        self.publisher_in_bursts(count, start_after, every, 1);
    }

    /// As [`publisher`](Self::publisher), but with `burst` above 1, `burst` messages at a
    /// time on one `PublishStream`, all sent before any answer is read (the broker reads them
    /// together and publishes them in runs), to two topics of the subscription's pattern in
    /// turns of three (so a burst holds several runs), at the same average rate (a burst every
    /// `burst` times `every`, so the faults still land while it publishes).
    pub fn publisher_in_bursts(
        &mut self,
        count: usize,
        start_after: Duration,
        every: Duration,
        burst: usize,
    ) {
        let trace = self.trace.clone();
        let seen = self.seen.clone();
        self.to_publish += count;
        self.sim.host("publisher", move || {
            let (trace, seen) = (trace.clone(), seen.clone());
            async move {
                if burst > 1 {
                    burst_publisher(count, start_after, every, burst, trace, seen).await
                } else {
                    publisher(count, start_after, every, trace, seen).await
                }
            }
        });
    }

    pub fn now(&self) -> Duration {
        self.sim.elapsed()
    }

    /// Steps the simulation until simulated time `t`.
    pub fn run_until(&mut self, t: Duration) {
        while self.sim.elapsed() < t {
            self.sim.step().expect("simulation step failed");
        }
    }

    /// Steps until `done` holds or `budget` of simulated time passes; returns whether it held.
    pub fn run_until_with_budget(
        &mut self,
        budget: Duration,
        mut done: impl FnMut(&World) -> bool,
    ) -> bool {
        let deadline = self.sim.elapsed() + budget;
        while self.sim.elapsed() < deadline {
            if done(self) {
                return true;
            }
            self.sim.step().expect("simulation step failed");
        }
        done(self)
    }

    pub fn crash(&mut self, host: &str) {
        self.trace.at(self.now(), format!("FAULT crash {host}"));
        self.sim.crash(host);
    }

    pub fn restart(&mut self, host: &str) {
        self.trace.at(self.now(), format!("FAULT restart {host}"));
        self.sim.bounce(host);
    }

    /// Crashes the broker host: its connections go, and with them everything it held in memory
    /// (queues, members, in-flight messages). The checker forgets that incarnation's messages but
    /// not the ids it handed out.
    pub fn crash_broker(&mut self) {
        self.trace.at(self.now(), format!("FAULT crash {BROKER}"));
        self.sim.crash(BROKER);
        self.checker.broker_crashed();
    }

    /// Starts the crashed broker host again: a new, empty broker on the same address.
    pub fn restart_broker(&mut self) {
        self.restart(BROKER);
    }

    pub fn partition(&mut self, host: &str) {
        self.link("partition", host, |sim| sim.partition(host, "broker"));
    }

    pub fn repair(&mut self, host: &str) {
        self.link("repair", host, |sim| sim.repair(host, "broker"));
    }

    pub fn hold(&mut self, host: &str) {
        self.link("hold", host, |sim| sim.hold(host, "broker"));
    }

    pub fn release(&mut self, host: &str) {
        self.link("release", host, |sim| sim.release(host, "broker"));
    }

    /// Applies a fault to the link between `host` and the broker, and records it.
    fn link(&mut self, what: &str, host: &str, fault: impl FnOnce(&Sim<'static>)) {
        self.trace
            .at(self.now(), format!("FAULT {what} {host} <-> {BROKER}"));
        fault(&self.sim);
    }

    /// Liveness: everything was published and the broker holds nothing unacked (its own
    /// accounting, checked by the checker against what it delivered). In group modes some client
    /// must also have received every published message.
    pub fn all_acked(&self) -> bool {
        self.liveness_report().is_empty()
    }

    /// Why liveness does not hold (empty when it does).
    pub fn liveness_report(&self) -> String {
        let seen = self.seen.borrow();
        let mut out = Vec::new();
        if seen.published.len() < self.to_publish {
            out.push(format!(
                "published {} of {}",
                seen.published.len(),
                self.to_publish
            ));
        }
        let held = self.checker.outstanding();
        if held > 0 {
            out.push(format!("the broker still holds {held} unacked messages"));
        }
        // At-most-once: an ack-free message written to a stream that then broke is done without
        // any client receiving it. Excused: messages the broker dropped and counted, messages it
        // held when it crashed (it keeps nothing across a restart, by design), and messages that
        // matched no subscription.
        if self.mode != DeliveryMode::Broadcast && !self.ack_free {
            let received = seen.received.get("report");
            let dropped = self.checker.dropped("report");
            let crashed = self.checker.lost_in_crash("report");
            let missing: Vec<_> = seen
                .published
                .iter()
                .filter(|id| {
                    !received.is_some_and(|r| r.contains(id))
                        && !dropped.contains(id)
                        && !crashed.contains(id)
                        && !seen.unrouted.contains(id)
                })
                .collect();
            if !missing.is_empty() {
                out.push(format!("no client ever received {missing:?}"));
            }
        }
        out.join("; ")
    }

    /// Every violation the checker and the clients found.
    pub fn violations(&self) -> Vec<String> {
        let mut all = self.checker.violations();
        let seen = self.seen.borrow();
        all.extend(seen.violations.iter().cloned());
        // docs/semantics.md#watching-leadership: a frame naming an active member names one the
        // broker made active, with the epoch it was confirmed with.
        let confirmed = self.checker.confirmations("report");
        for (watcher, member, epoch) in &seen.watched {
            if *member != 0 && !confirmed.contains(&(*member, *epoch)) {
                all.push(format!(
                    "{watcher} was told m{member} leads with epoch {epoch}, which the broker never confirmed"
                ));
            }
        }
        all
    }
}

async fn connect_retrying(name: &str, trace: &Trace) -> BrokerClient<Channel> {
    loop {
        match net::connect().await {
            Ok(channel) => return BrokerClient::new(channel),
            Err(e) => {
                trace.line(format!("{name}: connect failed ({e}); retrying"));
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// A replica's open stream: frames in, and (for the Stream carriage) settles out.
struct Joined {
    frames: tonic::Streaming<pb::SubscriptionFrame>,
    settles: Option<mpsc::Sender<pb::ConsumeRequest>>,
}

async fn join(
    client: &mut BrokerClient<Channel>,
    open: &pb::OpenSubscription,
    carriage: Carriage,
) -> Result<Joined, tonic::Status> {
    if carriage != Carriage::Stream {
        let frames = client.subscribe(open.clone()).await?.into_inner();
        return Ok(Joined {
            frames,
            settles: None,
        });
    }
    let (tx, rx) = mpsc::channel(16);
    let first = pb::ConsumeRequest {
        request: Some(pb::consume_request::Request::Open(open.clone())),
    };
    tx.send(first).await.expect("receiver held below");
    let frames = client
        .consume(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await?
        .into_inner();
    Ok(Joined {
        frames,
        settles: Some(tx),
    })
}

/// Sends an ack or nack by the replica's carriage. `None` when it went on the stream (which
/// answers only refusals, as frames).
async fn settle(
    client: &mut BrokerClient<Channel>,
    joined: Option<&Joined>,
    carriage: Carriage,
    sub: &str,
    (system_id, member_id): (u64, u64),
    nack: bool,
) -> Option<Result<(), tonic::Status>> {
    if let (Carriage::Stream, Some(tx)) = (carriage, joined.and_then(|j| j.settles.as_ref())) {
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
        let request = pb::ConsumeRequest {
            request: Some(pb::consume_request::Request::Settle(settle)),
        };
        // A closed stream drops the settle, as a crashed process would.
        let _ = tx.send(request).await;
        return None;
    }
    // Only the Fenced carriage names the member; the others (and a Stream replica's late ack
    // after abandoning its stream) rely on the connection fence.
    let member_id = if carriage == Carriage::Fenced {
        member_id
    } else {
        0
    };
    Some(if nack {
        client
            .nack(pb::Nack {
                subscription_id: sub.to_string(),
                system_id,
                member_id,
            })
            .await
            .map(|_| ())
    } else {
        client
            .ack(pb::Ack {
                subscription_id: sub.to_string(),
                system_id,
                member_id,
            })
            .await
            .map(|_| ())
    })
}

async fn replica(
    name: String,
    open: pb::OpenSubscription,
    behaviour: Behaviour,
    trace: Trace,
    seen: Rc<RefCell<Seen>>,
) -> turmoil::Result {
    let sub = open.subscription_id.clone();
    let ack_free = open.ack_mode == i32::from(pb::AckMode::None);
    let carriage = behaviour.carriage;
    tokio::time::sleep(behaviour.start_after).await;
    trace.line(format!("{name}: start"));
    let mut client = connect_retrying(&name, &trace).await;
    let mut last_epoch = 0;
    loop {
        let mut joined = match join(&mut client, &open, carriage).await {
            Ok(joined) => joined,
            Err(status) => {
                trace.line(format!("{name}: subscribe refused: {:?}", status.code()));
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        trace.line(format!("{name}: joined {sub}"));
        let mut member_id = 0;
        let ended = loop {
            let frame = match joined.frames.message().await {
                Ok(Some(frame)) => frame,
                Ok(None) => break "stream ended".to_string(),
                Err(status) => break format!("stream failed: {:?}", status.code()),
            };
            match frame.frame {
                Some(Frame::Confirmation(c)) => {
                    trace.line(format!(
                        "{name}: confirmed m{} epoch {}",
                        c.member_id, c.epoch
                    ));
                    if c.epoch <= last_epoch && open.mode == i32::from(DeliveryMode::Singleton) {
                        seen.borrow_mut().violations.push(format!(
                            "{name} saw epoch go from {last_epoch} to {}",
                            c.epoch
                        ));
                    }
                    last_epoch = c.epoch;
                    member_id = c.member_id;
                }
                Some(Frame::Message(m)) => {
                    trace.line(format!(
                        "{name}: got #{} attempt {} epoch {}",
                        m.system_id, m.delivery_attempt, m.epoch
                    ));
                    if m.epoch != last_epoch {
                        seen.borrow_mut().violations.push(format!(
                            "{name} got #{} with epoch {} but was confirmed with {last_epoch}",
                            m.system_id, m.epoch
                        ));
                    }
                    let first_time = seen
                        .borrow_mut()
                        .received
                        .entry(sub.clone())
                        .or_default()
                        .insert(m.system_id);
                    if ack_free && !first_time {
                        // At-most-once: a written message is done, so it never comes twice.
                        seen.borrow_mut().violations.push(format!(
                            "{name} got #{} twice on ack-free {sub}",
                            m.system_id
                        ));
                    }
                    let (action, process) = behaviour.decide(m.system_id, m.delivery_attempt);
                    let id = (m.system_id, member_id);
                    if action == Action::AbandonThenAck {
                        trace.line(format!("{name}: abandons its stream holding #{}", id.0));
                        drop(joined);
                        tokio::time::sleep(process).await;
                        let late = settle(&mut client, None, carriage, &sub, id, false).await;
                        record_ack(&name, &sub, id.0, late, &trace, &seen);
                        if behaviour.fenced_effects {
                            fenced_effect(&mut client, &name, &sub, id.0, m.epoch, &trace).await;
                        }
                        break "abandoned".to_string();
                    }
                    tokio::time::sleep(process).await;
                    match action {
                        _ if ack_free => {}
                        Action::AbandonThenAck => unreachable!("handled above"),
                        Action::Nack => {
                            let result =
                                settle(&mut client, Some(&joined), carriage, &sub, id, true).await;
                            trace.line(format!("{name}: nack #{} -> {}", id.0, outcome(&result)));
                        }
                        Action::Ack => {
                            let result =
                                settle(&mut client, Some(&joined), carriage, &sub, id, false).await;
                            record_ack(&name, &sub, id.0, result, &trace, &seen);
                            if behaviour.fenced_effects {
                                fenced_effect(&mut client, &name, &sub, id.0, m.epoch, &trace)
                                    .await;
                            }
                        }
                    }
                }
                Some(Frame::Standby(s)) if s.stepped_down_epoch != 0 => {
                    // docs/semantics.md#hand-over: it stays in line, on standby.
                    trace.line(format!(
                        "{name}: stepped down from epoch {}, standby position {}",
                        s.stepped_down_epoch, s.position
                    ));
                    if s.stepped_down_epoch != last_epoch {
                        seen.borrow_mut().violations.push(format!(
                            "{name} stepped down from epoch {} but was confirmed with {last_epoch}",
                            s.stepped_down_epoch
                        ));
                    }
                }
                Some(Frame::Standby(s)) => {
                    trace.line(format!("{name}: standby position {}", s.position))
                }
                Some(Frame::Refused(r)) => trace.line(format!(
                    "{name}: {} #{} refused on the stream: {:?}",
                    if r.nack { "nack" } else { "ack" },
                    r.system_id,
                    tonic::Code::from(r.code)
                )),
                None => {}
            }
        };
        trace.line(format!("{name}: {ended}; rejoining"));
        tokio::time::sleep(Duration::from_millis(300)).await;
        client = connect_retrying(&name, &trace).await;
    }
}

/// The side effect of processing `#id`: a publish fenced by `epoch` of `sub`, to a topic no
/// subscription matches. The checker holds the broker's answer to the fence
/// (docs/semantics.md#fenced-publish); here it is only traced.
async fn fenced_effect(
    client: &mut BrokerClient<Channel>,
    name: &str,
    sub: &str,
    id: u64,
    epoch: u64,
    trace: &Trace,
) {
    let result = client
        .publish(pb::PublishRequest {
            topic: format!("effects.{name}"),
            payload: format!("effect of #{id}").into_bytes().into(),
            headers: Default::default(),
            fence: Some(pb::PublishFence {
                subscription_id: sub.to_string(),
                epoch,
            }),
        })
        .await;
    let said = match result {
        Ok(_) => "stored".to_string(),
        Err(status) => format!("{:?}", status.code()),
    };
    trace.line(format!(
        "{name}: effect of #{id} fenced by epoch {epoch} -> {said}"
    ));
}

fn outcome(result: &Option<Result<(), tonic::Status>>) -> String {
    match result {
        None => "sent on the stream".into(),
        Some(Ok(())) => "ok".into(),
        Some(Err(status)) => format!("{:?}", status.code()),
    }
}

fn record_ack(
    name: &str,
    sub: &str,
    id: u64,
    result: Option<Result<(), tonic::Status>>,
    trace: &Trace,
    seen: &Rc<RefCell<Seen>>,
) {
    trace.line(format!("{name}: ack #{id} -> {}", outcome(&result)));
    if matches!(result, Some(Ok(())))
        && !seen
            .borrow_mut()
            .acked
            .entry(sub.to_string())
            .or_default()
            .insert(id)
    {
        // Group modes ack each message once per subscription; a second accepted ack means the
        // broker released one message twice.
        seen.borrow_mut()
            .violations
            .push(format!("#{id} acked twice on {sub}"));
    }
}

async fn publisher(
    count: usize,
    start_after: Duration,
    every: Duration,
    trace: Trace,
    seen: Rc<RefCell<Seen>>,
) -> turmoil::Result {
    tokio::time::sleep(start_after).await;
    let mut client = connect_retrying("publisher", &trace).await;
    let mut n = 0;
    while n < count {
        let request = pb::PublishRequest {
            topic: TOPIC.into(),
            payload: format!("job {n}").into_bytes().into(),
            headers: Default::default(),
            fence: None,
        };
        match client.publish(request).await {
            Ok(reply) => {
                let reply = reply.into_inner();
                trace.line(format!(
                    "publisher: published #{} to {}",
                    reply.system_id, reply.queued_for
                ));
                seen.borrow_mut().record_publish(&reply);
                n += 1;
                tokio::time::sleep(every).await;
            }
            Err(status) => {
                trace.line(format!("publisher: publish failed: {:?}", status.code()));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    trace.line("publisher: done");
    std::future::pending::<()>().await;
    Ok(())
}

/// Publishes `count` messages in bursts of `burst` on `PublishStream`s, every answer checked
/// as a unary publish's is; a refused or unanswered message is sent again in a later burst. A
/// stream the broker ends cleanly must have answered every request (a published message whose
/// answer went missing is a violation).
async fn burst_publisher(
    count: usize,
    start_after: Duration,
    every: Duration,
    burst: usize,
    trace: Trace,
    seen: Rc<RefCell<Seen>>,
) -> turmoil::Result {
    tokio::time::sleep(start_after).await;
    let mut client = connect_retrying("publisher", &trace).await;
    let mut n = 0;
    while n < count {
        let requests: Vec<_> = (n..count.min(n + burst))
            .map(|i| pb::PublishRequest {
                topic: if (i / 3) % 2 == 0 { TOPIC } else { OTHER_TOPIC }.into(),
                payload: format!("job {i}").into_bytes().into(),
                headers: Default::default(),
                fence: None,
            })
            .collect();
        let sent = requests.len();
        let mut answered = 0;
        let mut answers_seen = 0;
        match client.publish_stream(tokio_stream::iter(requests)).await {
            Ok(answers) => {
                let mut answers = answers.into_inner();
                loop {
                    match answers.message().await {
                        Ok(Some(answer)) if answer.code == 0 => {
                            answers_seen += 1;
                            trace.line(format!(
                                "publisher: published #{} to {} (burst of {sent})",
                                answer.system_id, answer.queued_for
                            ));
                            seen.borrow_mut().record_publish(&pb::PublishResponse {
                                system_id: answer.system_id,
                                queued_for: answer.queued_for,
                            });
                            answered += 1;
                        }
                        Ok(Some(answer)) => {
                            answers_seen += 1;
                            trace.line(format!(
                                "publisher: publish refused: {:?}",
                                tonic::Code::from(answer.code)
                            ));
                        }
                        Ok(None) => {
                            if answers_seen != sent {
                                seen.borrow_mut().violations.push(format!(
                                    "a PublishStream ended cleanly after answering {answers_seen} of {sent} requests"
                                ));
                            }
                            break;
                        }
                        Err(status) => {
                            trace.line(format!(
                                "publisher: publish stream failed: {:?}",
                                status.code()
                            ));
                            break;
                        }
                    }
                }
            }
            Err(status) => trace.line(format!(
                "publisher: publish stream failed: {:?}",
                status.code()
            )),
        }
        n += answered;
        let pause = if answered == sent {
            every * sent as u32
        } else {
            Duration::from_millis(100)
        };
        tokio::time::sleep(pause).await;
    }
    trace.line("publisher: done");
    std::future::pending::<()>().await;
    Ok(())
}

/// The operator: asks for a hand-over of "report" now and then until `until`.
async fn operator(
    name: String,
    seed: u64,
    until: Duration,
    trace: Trace,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut rng = Rng::new(seed);
    let started = tokio::time::Instant::now();
    let mut client = connect_retrying(&name, &trace).await;
    loop {
        tokio::time::sleep(Duration::from_millis(rng.range(300, 2000))).await;
        if started.elapsed() >= until {
            break;
        }
        let answer = client
            .hand_over(pb::HandOverRequest {
                subscription_id: "report".into(),
            })
            .await;
        match answer {
            Ok(done) => {
                let done = done.into_inner();
                trace.line(format!(
                    "{name}: hand-over m{} epoch {} -> m{} epoch {}",
                    done.previous_member_id, done.previous_epoch, done.member_id, done.epoch
                ));
            }
            Err(status) => {
                trace.line(format!("{name}: hand-over refused: {:?}", status.code()));
                if status.code() == tonic::Code::Unavailable {
                    client = connect_retrying(&name, &trace).await;
                }
            }
        }
    }
    trace.line(format!("{name}: done"));
    std::future::pending::<()>().await;
    Ok(())
}

/// A leadership watcher: watches "report" again whenever its watch ends, and checks that the
/// epochs it is told never fall, across watches and broker restarts alike
/// (docs/semantics.md#watching-leadership, docs/semantics.md#restart-identity).
async fn watcher(
    name: String,
    trace: Trace,
    seen: Rc<RefCell<Seen>>,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut floor = 0;
    loop {
        let mut client = connect_retrying(&name, &trace).await;
        let opened = client
            .watch_leadership(pb::WatchLeadershipRequest {
                subscription_id: "report".into(),
            })
            .await;
        let mut frames = match opened {
            Ok(frames) => frames.into_inner(),
            Err(status) => {
                trace.line(format!("{name}: watch refused: {:?}", status.code()));
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        loop {
            match frames.message().await {
                Ok(Some(frame)) => {
                    trace.line(format!(
                        "{name}: leader m{} epoch {}",
                        frame.active_member_id, frame.epoch
                    ));
                    let mut seen = seen.borrow_mut();
                    if frame.epoch < floor {
                        seen.violations.push(format!(
                            "{name} was told epoch {} after epoch {floor}",
                            frame.epoch
                        ));
                    }
                    floor = floor.max(frame.epoch);
                    seen.watched
                        .push((name.clone(), frame.active_member_id, frame.epoch));
                }
                Ok(None) => break,
                Err(status) => {
                    trace.line(format!("{name}: watch ended: {:?}", status.code()));
                    break;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
