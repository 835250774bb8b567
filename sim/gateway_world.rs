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

use crate::{gateway_models::Models, net, true_time::TrueTime};

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

/// Steps until `done` holds of what was seen, or `budget` of simulated time passes; the models'
/// `clock` follows.
fn until(
    sim: &mut Sim<'static>,
    clock: &TrueTime,
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
        clock.set(sim.elapsed());
        sim.step().expect("simulation step");
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
    let patience = net::KEEPALIVE_TIMEOUT;
    member_host(
        &mut sim,
        "a",
        "gw1",
        Duration::from_millis(500),
        (1, patience, None),
        seen,
    );
    member_host(
        &mut sim,
        "b",
        "gw2",
        Duration::from_millis(1500),
        (1, patience, None),
        seen,
    );
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
    until(&mut sim, &clock, seen, Duration::from_secs(30), |seen| {
        seen.iter().any(|l| l.starts_with("a message")) && published.borrow().is_some()
    });
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
    until(&mut sim, &clock, &seen, Duration::from_secs(30), |seen| {
        seen.iter().any(|l| l.starts_with("b message"))
    });
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
    until(&mut sim, &clock, &seen, Duration::from_secs(30), |seen| {
        seen.iter().any(|l| l.starts_with("b message"))
    });
    let lease = tinybroker::cluster::gateway::GatewayConfig::new("").lease;
    assert!(
        sim.elapsed() - crashed_at >= lease,
        "promoted {:?} after the crash, before the dead gateway's lease could end",
        sim.elapsed() - crashed_at
    );
    b_took_over_with_the_message_first(&seen, system_id, deposed);
}
