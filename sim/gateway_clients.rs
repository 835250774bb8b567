//! The clients of the real-gateway campaign (`gateway_campaign.rs`), each on a turmoil host of
//! its own, noting what they see in the seed's log: members of a SINGLETON or QUEUE
//! subscription, a watcher of the leadership, and the publisher.

use std::{cell::RefCell, rc::Rc, time::Duration};

use tinybroker::pb::{self, subscription_frame::Frame};

use crate::{gateway_judge::Seen, gateway_world::client_with, net, rng::Rng};

/// What the clients (and the world's loop, for faults) saw, in order.
pub type Log = Rc<RefCell<Vec<(Duration, Seen)>>>;

pub fn note(log: &Log, seen: Seen) {
    let at = turmoil::sim_elapsed().unwrap_or_default();
    log.borrow_mut().push((at, seen));
}

/// An ack under way: its message, and whether the gateway answered it.
type Acking = std::pin::Pin<Box<dyn std::future::Future<Output = (u64, bool)>>>;

/// A member host: joins `subscription` at `gateway` (again after its stream ends) with a
/// window of 1 to 3, acks each message after a delay, and leaves after a few answered acks on
/// half its streams, all drawn from its own seed.
pub fn member_host(
    sim: &mut turmoil::Sim<'static>,
    (name, gateway): (&str, &str),
    subscription: &pb::OpenSubscription,
    seed: u64,
    log: &Log,
) {
    let (me, gateway, log) = (name.to_string(), gateway.to_string(), log.clone());
    let subscription = subscription.clone();
    sim.host(name, move || {
        let (me, gateway, log) = (me.clone(), gateway.clone(), log.clone());
        let subscription = subscription.clone();
        async move {
            let singleton = subscription.mode == pb::DeliveryMode::Singleton as i32;
            let mut rng = Rng::new(seed);
            // Its window: 1 to 3 messages in flight.
            let window = rng.range(1, 3) as u32;
            // Its keepalive: a gateway that does not answer is given up after 2 s (net's), or
            // after 10 s, so a member may outlast a frozen gateway's lease.
            let patience = if rng.range(0, 1) == 0 {
                net::KEEPALIVE_TIMEOUT
            } else {
                Duration::from_secs(10)
            };
            tokio::time::sleep(Duration::from_millis(rng.range(0, 800))).await;
            loop {
                let mut client = client_with(&gateway, patience).await;
                let open = pb::OpenSubscription {
                    max_in_flight: window,
                    ..subscription.clone()
                };
                let joining = Seen::Joining {
                    member: me.clone(),
                    gateway: gateway.clone(),
                };
                note(&log, joining);
                let mut frames = match client.subscribe(open).await {
                    Ok(frames) => {
                        note(&log, Seen::Joined { member: me.clone() });
                        frames.into_inner()
                    }
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    }
                };
                // Frames are noted as they arrive; messages are acked one at a time, in order,
                // each after its delay, while later frames keep arriving. Half the streams
                // (drawn) close (the member leaves, cleanly) once 1 to 5 of their acks were
                // answered, with no ack under way: what the member still holds goes on.
                let leave_after = (rng.range(0, 1) == 0).then(|| rng.range(1, 5));
                let mut answered_acks = 0;
                let mut member_id = 0;
                let mut queue: std::collections::VecDeque<u64> = Default::default();
                let mut acking: Option<Acking> = None;
                loop {
                    if acking.is_none()
                        && let Some(system_id) = queue.pop_front()
                    {
                        let delay = Duration::from_millis(rng.range(5, 150));
                        let (mut client, log, me, gateway) =
                            (client.clone(), log.clone(), me.clone(), gateway.clone());
                        let subscription_id = subscription.subscription_id.clone();
                        acking = Some(Box::pin(async move {
                            tokio::time::sleep(delay).await;
                            note(
                                &log,
                                Seen::AckSending {
                                    member: me,
                                    gateway,
                                    system_id,
                                },
                            );
                            let ack = pb::Ack {
                                subscription_id,
                                system_id,
                                member_id,
                            };
                            (system_id, client.ack(ack).await.is_ok())
                        }));
                    }
                    tokio::select! {
                        frame = frames.message() => {
                            let Ok(Some(frame)) = frame else { break };
                            match frame.frame {
                                Some(Frame::Confirmation(c)) => {
                                    member_id = c.member_id;
                                    // A QUEUE member's confirmation names no activation.
                                    if !singleton {
                                        continue;
                                    }
                                    note(
                                        &log,
                                        Seen::Active {
                                            member: me.clone(),
                                            member_id: c.member_id,
                                            epoch: c.epoch,
                                        },
                                    );
                                }
                                Some(Frame::Message(m)) => {
                                    note(
                                        &log,
                                        Seen::Delivered {
                                            member: me.clone(),
                                            gateway: gateway.clone(),
                                            system_id: m.system_id,
                                            attempt: m.delivery_attempt,
                                            epoch: m.epoch,
                                        },
                                    );
                                    queue.push_back(m.system_id);
                                }
                                _ => {}
                            }
                        }
                        (system_id, answered) = async { acking.as_mut().expect("guarded").await }, if acking.is_some() => {
                            acking = None;
                            if answered {
                                note(
                                    &log,
                                    Seen::Acked {
                                        member: me.clone(),
                                        gateway: gateway.clone(),
                                        system_id,
                                    },
                                );
                                answered_acks += 1;
                                if leave_after == Some(answered_acks) {
                                    break;
                                }
                            }
                        }
                    }
                }
                // Dropping the stream closes it (or it ended).
                drop(frames);
                note(&log, Seen::Ended { member: me.clone() });
                tokio::time::sleep(Duration::from_millis(rng.range(200, 1_000))).await;
            }
        }
    });
}

/// A watcher host: watches `jobs`' leadership at a gateway drawn from its seed, noting every
/// frame, and watches again (at another drawn gateway) whenever a watch ends or cannot open.
pub fn watcher_host(sim: &mut turmoil::Sim<'static>, gateways: &[String], seed: u64, log: &Log) {
    let (gateways, log) = (gateways.to_vec(), log.clone());
    sim.host("watcher", move || {
        let (gateways, log) = (gateways.clone(), log.clone());
        async move {
            let mut rng = Rng::new(seed);
            let mut watch = 0;
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let gateway = &gateways[rng.range(0, gateways.len() as u64 - 1) as usize];
                let mut client = client_with(gateway, net::KEEPALIVE_TIMEOUT).await;
                let request = pb::WatchLeadershipRequest {
                    subscription_id: "jobs".into(),
                };
                let Ok(frames) = client.watch_leadership(request).await else {
                    continue;
                };
                watch += 1;
                let mut frames = frames.into_inner();
                while let Ok(Some(frame)) = frames.message().await {
                    note(
                        &log,
                        Seen::Watched {
                            watch,
                            active: frame.active_member_id,
                            epoch: frame.epoch,
                        },
                    );
                }
            }
        }
    });
}

/// The publisher: from 2 s on, publishes `messages` messages to `jobs.run`, each at a gateway
/// drawn from its seed, 100–600 ms apart, sending a message again (as another request, with a
/// payload of its own, so check (g) can tell a request stored twice) until one is answered.
pub fn publisher(
    sim: &mut turmoil::Sim<'static>,
    gateways: &[String],
    messages: usize,
    seed: u64,
    log: &Log,
) {
    let (log, gateways) = (log.clone(), gateways.to_vec());
    sim.client("publisher", async move {
        let mut rng = Rng::new(seed);
        tokio::time::sleep(Duration::from_secs(2)).await;
        let mut published = 0;
        let mut tries = 0;
        while published < messages {
            let gateway = &gateways[rng.range(0, gateways.len() as u64 - 1) as usize];
            let mut client = client_with(gateway, net::KEEPALIVE_TIMEOUT).await;
            tries += 1;
            let request = pb::PublishRequest {
                topic: "jobs.run".into(),
                payload: format!("job {published} request {tries}")
                    .into_bytes()
                    .into(),
                ..Default::default()
            };
            let sent = turmoil::sim_elapsed().unwrap_or_default();
            if let Ok(reply) = client.publish(request).await {
                let reply = reply.into_inner();
                let seen = Seen::Published {
                    system_id: reply.system_id,
                    queued_for: reply.queued_for,
                    sent,
                };
                note(&log, seen);
                published += 1;
            }
            tokio::time::sleep(Duration::from_millis(rng.range(100, 600))).await;
        }
        Ok(())
    });
}
