//! Real gateways on turmoil hosts: each host runs the production `Gateway` (assembled over the
//! shared models of NATS, `gateway_models.rs`) behind the production tonic server, through the
//! same `Backend` as `tinybroker serve --nats`; members and publishers are gRPC clients on other
//! hosts, over turmoil's network. A host crashed loses everything it ran; the models keep what
//! JetStream and the bucket would.

use std::{cell::RefCell, rc::Rc, time::Duration};

use tinybroker::{
    backend::Backend,
    pb::{self, DeliveryMode, broker_client::BrokerClient, subscription_frame::Frame},
    server::{Server, ServerConfig},
};
use tonic::transport::Channel;
use turmoil::Sim;

use crate::{
    gateway_models::Models,
    gateway_process::{Process, step},
    net,
    true_time::TrueTime,
};

/// What the clients saw, in the order they saw it.
pub type Seen = Rc<RefCell<Vec<String>>>;

pub fn world(seed: u64) -> Sim<'static> {
    turmoil::Builder::new()
        .rng_seed(seed)
        .tick_duration(Duration::from_millis(1))
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(Duration::from_millis(20))
        .simulation_duration(Duration::from_secs(600))
        .build()
}

/// Host `name` runs gateway `n` over `models`, serving gRPC on the port.
pub fn gateway_host(sim: &mut Sim<'static>, name: &str, n: u64, models: &Models) {
    let models = models.clone();
    sim.host(name, move || {
        let models = models.clone();
        async move {
            let gateway = models.gateway(n).await;
            let config = ServerConfig {
                keepalive_interval: Some(net::KEEPALIVE_INTERVAL),
                keepalive_timeout: net::KEEPALIVE_TIMEOUT,
                ..ServerConfig::default()
            };
            let listener = turmoil::net::TcpListener::bind(("0.0.0.0", net::PORT)).await?;
            Server::with_backend(config, Backend::Gateway(gateway))
                .run(net::incoming(listener), std::future::pending())
                .await?;
            Ok(())
        }
    });
}

pub async fn client_of(gateway: &str) -> BrokerClient<Channel> {
    client_with(gateway, net::KEEPALIVE_TIMEOUT).await
}

/// A client of `gateway`, once it connects, whose keepalive gives up on a gateway that does
/// not answer after `patience`.
pub async fn client_with(gateway: &str, patience: Duration) -> BrokerClient<Channel> {
    loop {
        if let Ok(channel) = net::connect_with(gateway, net::KEEPALIVE_INTERVAL, patience).await {
            return BrokerClient::new(channel);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub fn singleton(id: &str) -> pb::OpenSubscription {
    pb::OpenSubscription {
        subscription_id: id.into(),
        topic_patterns: vec!["jobs.*".into()],
        mode: DeliveryMode::Singleton.into(),
        consumer_group: "replicas".into(),
        max_in_flight: 1,
        ..Default::default()
    }
}

/// Host `name` joins SINGLETON `jobs` at `gateway` after `after`, and notes each frame in
/// `seen` as `<name> <kind> <fields>`, with a window of `window` messages. It acks each message
/// once `acks` (when given) holds, noting `<name> acked <id>` when answered; otherwise never.
/// Its keepalive gives up on a silent gateway after `patience`.
pub fn member_host(
    sim: &mut Sim<'static>,
    name: &str,
    gateway: &str,
    after: Duration,
    (window, patience, acks): (u32, Duration, Option<Rc<std::cell::Cell<bool>>>),
    seen: &Seen,
) {
    let (me, gateway, seen) = (name.to_string(), gateway.to_string(), seen.clone());
    sim.host(name, move || {
        let (me, gateway, seen, acks) = (me.clone(), gateway.clone(), seen.clone(), acks.clone());
        async move {
            tokio::time::sleep(after).await;
            let mut client = client_with(&gateway, patience).await;
            let open = pb::OpenSubscription {
                max_in_flight: window,
                ..singleton("jobs")
            };
            let mut frames = client.subscribe(open).await?.into_inner();
            let mut member_id = 0;
            loop {
                let frame = match frames.message().await {
                    Ok(Some(frame)) => frame,
                    Ok(None) => break,
                    // Its gateway gone: the stream ends with an error, noted.
                    Err(status) => {
                        seen.borrow_mut()
                            .push(format!("{me} ended {:?}", status.code()));
                        break;
                    }
                };
                let line = match frame.frame {
                    Some(Frame::Confirmation(c)) => {
                        member_id = c.member_id;
                        format!("{me} active {}", c.epoch)
                    }
                    Some(Frame::Message(m)) => {
                        if let Some(acks) = &acks {
                            let (acks, mut client, seen, me) =
                                (acks.clone(), client.clone(), seen.clone(), me.clone());
                            tokio::task::spawn_local(async move {
                                while !acks.get() {
                                    tokio::time::sleep(Duration::from_millis(10)).await;
                                }
                                let ack = pb::Ack {
                                    subscription_id: "jobs".into(),
                                    system_id: m.system_id,
                                    member_id,
                                };
                                if client.ack(ack).await.is_ok() {
                                    seen.borrow_mut()
                                        .push(format!("{me} acked {}", m.system_id));
                                }
                            });
                        }
                        format!(
                            "{me} message {} {} {}",
                            m.system_id, m.delivery_attempt, m.epoch
                        )
                    }
                    Some(Frame::Standby(_)) => format!("{me} standby"),
                    other => format!("{me} other {other:?}"),
                };
                seen.borrow_mut().push(line);
            }
            Ok(())
        }
    });
}

/// Steps `sim` and `processes` (gateway processes, if any) until `done` holds of what was
/// seen, or `budget` of simulated time passes; the models' `clock` follows.
pub fn until(
    sim: &mut Sim<'static>,
    clock: &TrueTime,
    processes: &mut [&mut Process],
    seen: &Seen,
    budget: Duration,
    done: impl Fn(&[String]) -> bool,
) {
    let deadline = sim.elapsed() + budget;
    while !done(&seen.borrow()) {
        assert!(
            sim.elapsed() < deadline,
            "not within {budget:?}; seen: {:?}",
            seen.borrow()
        );
        step(sim, clock, processes.iter_mut().map(|p| &mut **p)).expect("simulation step");
    }
}

pub fn field(line: &str, n: usize) -> u64 {
    line.split(' ')
        .nth(n)
        .and_then(|f| f.parse().ok())
        .unwrap_or(0)
}

/// Two gateways; member `a` joins at gateway 1, then `b` at gateway 2; a message published at
/// gateway 2 reaches `a`, which holds it. Returns the world (and its models' clock) once `a`
/// holds it, with the message's id and the epoch `a` was active under.
fn a_holds_a_message(seed: u64, seen: &Seen) -> (Sim<'static>, TrueTime, u64, u64) {
    let mut sim = world(seed);
    let clock = TrueTime::stepped();
    let models = Models::on(clock.clone());
    gateway_host(&mut sim, "gw1", 1, &models);
    gateway_host(&mut sim, "gw2", 2, &models);
    for (member, gateway, after) in [("a", "gw1", 500), ("b", "gw2", 1500)] {
        let after = Duration::from_millis(after);
        let options = (1, net::KEEPALIVE_TIMEOUT, None);
        member_host(&mut sim, member, gateway, after, options, seen);
    }
    let published: Rc<RefCell<Option<u64>>> = Rc::default();
    let noted = published.clone();
    sim.client("publisher", async move {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let mut client = client_of("gw2").await;
        let reply = client
            .publish(pb::PublishRequest {
                topic: "jobs.run".into(),
                payload: b"a".to_vec().into(),
                ..Default::default()
            })
            .await?
            .into_inner();
        *noted.borrow_mut() = Some(reply.system_id);
        Ok(())
    });
    until(
        &mut sim,
        &clock,
        &mut [],
        seen,
        Duration::from_secs(30),
        |seen| seen.iter().any(|l| l.starts_with("a message")) && published.borrow().is_some(),
    );
    let system_id = published.borrow().expect("published");
    let seen = seen.borrow();
    let active = seen.iter().find(|l| l.starts_with("a active"));
    let held = seen.iter().find(|l| l.starts_with("a message")).unwrap();
    assert_eq!((field(held, 2), field(held, 3)), (system_id, 1), "{held}");
    assert!(
        !seen.iter().any(|l| l.starts_with("b active")),
        "one active member: {seen:?}"
    );
    (
        sim,
        clock,
        system_id,
        field(active.expect("a was active"), 2),
    )
}

/// Steps until `b` got a message (within 30 s).
fn until_b_gets_a_message(sim: &mut Sim<'static>, clock: &TrueTime, seen: &Seen) {
    until(sim, clock, &mut [], seen, Duration::from_secs(30), |seen| {
        seen.iter().any(|l| l.starts_with("b message"))
    });
}

/// After a failover: `b` was promoted above epoch `deposed` and got message `system_id` first,
/// attempt 2, under its new epoch.
fn b_took_over_with_the_message_first(seen: &Seen, system_id: u64, deposed: u64) {
    let seen = seen.borrow();
    let promoted = seen
        .iter()
        .find(|l| l.starts_with("b active"))
        .expect("b promoted");
    let first = seen.iter().find(|l| l.starts_with("b message")).unwrap();
    assert!(
        field(promoted, 2) > deposed,
        "{promoted} after epoch {deposed}"
    );
    assert_eq!(
        (field(first, 2), field(first, 3), field(first, 4)),
        (system_id, 2, field(promoted, 2)),
        "{seen:?}"
    );
}

// docs/semantics.md#cluster-singleton through two real gateways on turmoil hosts: member `a`
// (at gateway 1) is active and holds a message published at gateway 2; its host crashes; member
// `b` (at gateway 2) is promoted with a higher epoch and gets that message first, attempt 2.
#[test]
fn cluster_real_gateways_on_turmoil_promote_the_standby_when_the_active_members_host_crashes() {
    let seen: Seen = Rc::default();
    let (mut sim, clock, system_id, deposed) = a_holds_a_message(7, &seen);
    let crashed_at = sim.elapsed();
    sim.crash("a");
    until_b_gets_a_message(&mut sim, &clock, &seen);
    // Given back at once (a nak), not left to the consumer's ack wait (1.5 s here).
    assert!(
        sim.elapsed() - crashed_at < Duration::from_millis(500),
        "redelivered {:?} after the crash",
        sim.elapsed() - crashed_at
    );
    b_took_over_with_the_message_first(&seen, system_id, deposed);
}

// docs/semantics.md#cluster-lease-lapse through real gateways on turmoil hosts: the host of
// the active member's gateway crashes while the member holds a message; once that gateway's
// lease runs out, the standby at the other gateway is promoted with a higher epoch and gets the
// message again, attempt 2.
#[test]
fn cluster_real_gateways_on_turmoil_promote_the_standby_when_the_active_gateway_crashes() {
    let seen: Seen = Rc::default();
    let (mut sim, clock, system_id, deposed) = a_holds_a_message(11, &seen);
    let crashed_at = sim.elapsed();
    sim.crash("gw1");
    until_b_gets_a_message(&mut sim, &clock, &seen);
    let lease = tinybroker::cluster::gateway::GatewayConfig::new("").lease;
    assert!(
        sim.elapsed() - crashed_at >= lease,
        "promoted {:?} after the crash, before the dead gateway's lease could end",
        sim.elapsed() - crashed_at
    );
    b_took_over_with_the_message_first(&seen, system_id, deposed);
}

/// Member `a` (at gateway 1, whose keepalive outlasts the pause) is active and holds a message;
/// gateway 1 is frozen past its lease; `b` (at gateway 2) is promoted and takes the message;
/// meanwhile `a` acks its message and a second message is sent to gateway 1, which reads both
/// when it thaws, every timer of its due at once. What `a` got after the thaw (messages, and
/// an answer to its ack), and all that was seen.
fn frozen_past_the_lease() -> (Vec<String>, Vec<String>) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let seen: Seen = Rc::default();
    let mut sim = world(3);
    let clock = TrueTime::stepped();
    let models = Models::on(clock.clone());
    let mut gw1 = Process::new(&mut sim, "gw1", 1, &models);
    let mut gw2 = Process::new(&mut sim, "gw2", 2, &models);
    let patience = Duration::from_secs(60);
    // `a` acks what it holds once this is set.
    let ack: Rc<std::cell::Cell<bool>> = Rc::default();
    member_host(
        &mut sim,
        "a",
        "gw1",
        Duration::from_millis(500),
        (1, patience, Some(ack.clone())),
        &seen,
    );
    member_host(
        &mut sim,
        "b",
        "gw2",
        Duration::from_millis(1500),
        (1, patience, None),
        &seen,
    );
    // Steps until `done` holds of what was seen (within 30 s).
    let wait = |sim: &mut Sim<'static>,
                [gw1, gw2]: [&mut Process; 2],
                done: &dyn Fn(&[String]) -> bool| {
        until(
            sim,
            &clock,
            &mut [gw1, gw2],
            &seen,
            Duration::from_secs(30),
            done,
        )
    };
    let publish = |sim: &mut Sim<'static>, name: &str, gateway: &'static str| {
        let noted = seen.clone();
        let name = name.to_string();
        sim.client(name.clone(), async move {
            let mut client = client_of(gateway).await;
            noted.borrow_mut().push(format!("{name} sending"));
            let reply = client
                .publish(pb::PublishRequest {
                    topic: "jobs.run".into(),
                    payload: name.as_bytes().to_vec().into(),
                    ..Default::default()
                })
                .await?
                .into_inner();
            noted
                .borrow_mut()
                .push(format!("{name} published {}", reply.system_id));
            Ok(())
        });
    };
    wait(&mut sim, [&mut gw1, &mut gw2], &|s| {
        s.iter().any(|l| l.starts_with("a active"))
    });
    publish(&mut sim, "first", "gw2");
    wait(&mut sim, [&mut gw1, &mut gw2], &|s| {
        s.iter().any(|l| l.starts_with("a message"))
    });
    gw1.freeze();
    wait(&mut sim, [&mut gw1, &mut gw2], &|s| {
        s.iter().any(|l| l.starts_with("b message"))
    });
    // While gateway 1 is frozen, `a` acks the message it holds and a second message is sent to
    // gateway 1.
    ack.set(true);
    publish(&mut sim, "second", "gw1");
    wait(&mut sim, [&mut gw1, &mut gw2], &|s| {
        s.iter().any(|l| l.starts_with("second sending"))
    });
    // Its request crosses the network (20 ms at most) into gateway 1's buffers.
    let sent = sim.elapsed();
    while sim.elapsed() < sent + Duration::from_millis(100) {
        step(&mut sim, &clock, [&mut gw1, &mut gw2]).expect("simulation step");
    }
    let frozen_lines = seen.borrow().len();
    gw1.thaw();
    // The thawed gateway stores the second message, and its lapse ends `a`'s stream (a new
    // incarnation starts): nothing reaches `a` first.
    wait(&mut sim, [&mut gw1, &mut gw2], &|s| {
        s[frozen_lines..].iter().any(|l| l.starts_with("a ended"))
            && s.iter().any(|l| l.starts_with("second published"))
    });
    let seen = seen.borrow();
    let after: Vec<&String> = seen[frozen_lines..]
        .iter()
        .filter(|l| l.starts_with("a message") || l.starts_with("a acked"))
        .collect();
    (after.into_iter().cloned().collect(), seen.clone())
}

// docs/semantics.md#cluster-lease-checks, the SIGSTOP case, through two real gateway processes:
// the deposed stay silent when their gateway thaws, whichever of its tasks runs first: no
// message, and no ack answered. (Here the thawed gateway's lapse runs first; the campaign's
// frozen gateways reach other orders, and catch the lease check planted away, GatewaySkipsLeaseCheck.)
#[test]
fn cluster_real_gateway_frozen_past_its_lease_hands_its_deposed_member_nothing_when_thawed() {
    let (after, seen) = frozen_past_the_lease();
    assert!(
        seen.iter().any(|l| l.starts_with("b message")),
        "b was promoted: {seen:?}"
    );
    assert!(
        after.is_empty(),
        "the deposed member got {after:?} after the thaw; seen: {seen:?}"
    );
}
