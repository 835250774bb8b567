//! Settles a SINGLETON member sends while its gateway process is stopped (SIGSTOP) past its
//! lease, read when it resumes (SIGCONT): none is answered OK, so no acked message reaches the
//! member promoted meanwhile (docs/semantics.md#cluster-lease-checks). Without a lapse patience,
//! and with one when the pause outlasts the lease and the patience
//! (docs/semantics.md#cluster-lease-lapse).
//!
//! Each round: an active member at the gateway to be paused (window 32) holds `HELD` messages
//! unacked, a standby waits at the other gateway. The paused gateway is stopped; the member
//! then sends, over its own connection, a unary Ack naming itself, a two-field Ack
//! (connection-fenced) and a Nack for its held messages, in turn, and late in the pause Acks
//! naming it through the other gateway (forwarded); the gateway stays stopped for `pause`, then
//! resumes. Afterwards the new active member (the standby) acks whatever comes.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use tinybroker::pb;
use tonic::Code;

use crate::{
    faults::{gateway_process, publish_confirmed},
    harness::{singleton, within},
    lease::signal,
    nats_server::NatsCluster,
};

/// Messages the old member holds when its gateway is stopped.
const HELD: usize = 12;

#[derive(Debug, Default)]
struct Outcome {
    /// (system id, what, answer) of every settle answered OK after the resume.
    answered_ok: Vec<(u64, &'static str)>,
    /// Of those acked OK, the ones the new member was given again.
    acked_ok_then_redelivered: Vec<u64>,
    /// Every answer, by code.
    codes: BTreeMap<String, usize>,
    /// One refusal's message of each code.
    messages: BTreeMap<String, String>,
}

async fn rounds(extra: &[&str], pause: Duration, rounds: usize) -> Vec<Outcome> {
    let cluster = NatsCluster::start(3).await;
    let urls = cluster.client_urls().join(",");
    let mut args = vec!["--gateway-lease", "1s"];
    args.extend_from_slice(extra);
    let (paused, on_paused) = gateway_process(&urls, &args).await;
    let (_other, on_other) = gateway_process(&urls, &args).await;
    let pid = paused.child.id();
    let mut outcomes = Vec::new();
    for round in 0..rounds {
        let id = format!("thaw{round}");
        let mut request = singleton(&id);
        request.max_in_flight = 32;
        let mut old = on_paused.subscribe(request.clone()).await.unwrap();
        old.confirmed().await;
        let mut new = on_other.subscribe(request).await.unwrap();
        let mut published = BTreeSet::new();
        for n in 0..HELD {
            published.insert(publish_confirmed(&on_other, "jobs.run", &format!("m{n}")).await);
        }
        let mut held = Vec::new();
        while held.len() < HELD {
            held.push(old.message().await.system_id);
        }
        signal(pid, "-STOP");
        // The signal delivered (a process running on another core stops within a moment).
        tokio::time::sleep(Duration::from_millis(50)).await;
        // Sent while the gateway is stopped: they wait in its socket.
        let mut settles = Vec::new();
        let spawn_settles = |settles: &mut Vec<_>, forwarded: bool| {
            for (i, &system_id) in held.iter().enumerate() {
                if (i % 4 == 3) != forwarded {
                    continue;
                }
                let mut client = if forwarded {
                    on_other.0.clone()
                } else {
                    on_paused.0.clone()
                };
                let (sub, member) = (id.clone(), old.member_id);
                settles.push(tokio::spawn(async move {
                    let ack = |member_id| pb::Ack {
                        subscription_id: sub.clone(),
                        system_id,
                        member_id,
                    };
                    let (what, answer) = match i % 4 {
                        3 => (
                            "ack naming its member, forwarded from the other gateway",
                            client.ack(ack(member)).await.map(|_| ()),
                        ),
                        0 => (
                            "ack naming its member",
                            client.ack(ack(member)).await.map(|_| ()),
                        ),
                        1 => ("two-field ack", client.ack(ack(0)).await.map(|_| ())),
                        2 => (
                            "nack naming its member",
                            client
                                .nack(pb::Nack {
                                    subscription_id: sub.clone(),
                                    system_id,
                                    member_id: member,
                                })
                                .await
                                .map(|_| ()),
                        ),
                        _ => unreachable!(),
                    };
                    (system_id, what, answer)
                }));
            }
        };
        spawn_settles(&mut settles, false);
        // Forwarded ones late in the pause, so the forward (2 s) is still waiting at the resume.
        tokio::time::sleep(pause - Duration::from_millis(500)).await;
        spawn_settles(&mut settles, true);
        tokio::time::sleep(Duration::from_millis(500)).await;
        signal(pid, "-CONT");
        let mut outcome = Outcome::default();
        let mut acked_ok = BTreeSet::new();
        for settle in settles {
            let (system_id, what, answer) = within(settle).await.unwrap();
            let code = match &answer {
                Ok(()) => "OK".to_string(),
                Err(status) => format!("{:?}", status.code()),
            };
            *outcome.codes.entry(code.clone()).or_default() += 1;
            match answer {
                Ok(()) => {
                    outcome.answered_ok.push((system_id, what));
                    if what != "nack naming its member" {
                        acked_ok.insert(system_id);
                    }
                }
                Err(status) => {
                    outcome
                        .messages
                        .entry(code)
                        .or_insert_with(|| status.message().to_string());
                    if status.code() == Code::Ok {
                        unreachable!()
                    }
                }
            }
        }
        // The new member: everything published, but for what the old one's accepted acks
        // took, comes (within the ack wait and the promotion); an acked one must not.
        within(new.confirmed()).await;
        let mut missing: BTreeSet<u64> = published.difference(&acked_ok).copied().collect();
        let mut redelivered = BTreeSet::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(8);
        loop {
            let wait = if missing.is_empty() {
                // Then a little longer, for the acked ones to (not) come.
                Duration::from_secs(2)
            } else {
                deadline.saturating_duration_since(tokio::time::Instant::now())
            };
            match tokio::time::timeout(wait, new.stream.message()).await {
                Ok(Ok(Some(pb::SubscriptionFrame {
                    frame: Some(pb::subscription_frame::Frame::Message(m)),
                }))) => {
                    on_other
                        .ack(&new.id, new.member_id, m.system_id)
                        .await
                        .unwrap();
                    missing.remove(&m.system_id);
                    if acked_ok.contains(&m.system_id) {
                        redelivered.insert(m.system_id);
                    }
                }
                Ok(other) => panic!("round {round}: the new member's stream: {other:?}"),
                Err(_) => break,
            }
        }
        assert!(
            missing.is_empty(),
            "round {round}: never reached the new member: {missing:?}"
        );
        outcome.acked_ok_then_redelivered = redelivered.into_iter().collect();
        eprintln!(
            "round {round}: answers {:?}; acked OK, then given to the new member again: {:?}; answered OK: {:?}; a refusal of each code: {:?}",
            outcome.codes, outcome.acked_ok_then_redelivered, outcome.answered_ok, outcome.messages
        );
        outcomes.push(outcome);
        drop(old);
        drop(new);
    }
    outcomes
}

/// No settle answered OK after the resume, so no acked message given again to the new member.
fn none_answered_ok(outcomes: &[Outcome], past: &str) {
    let ok: Vec<_> = outcomes
        .iter()
        .flat_map(|o| o.answered_ok.clone())
        .collect();
    let broken: Vec<_> = outcomes
        .iter()
        .flat_map(|o| o.acked_ok_then_redelivered.clone())
        .collect();
    assert!(
        ok.is_empty() && broken.is_empty(),
        "answered OK after a resume past {past}: {ok:?}; of those acks, given again to the new member: {broken:?}"
    );
}

// Without a lapse patience (the default): the gateway stopped for 2 s, twice its lease. No
// settle is answered OK after the resume, so no acked message is delivered again.
#[tokio::test]
async fn settles_sent_while_a_gateway_is_stopped_past_its_lease_are_never_answered_ok() {
    let outcomes = rounds(&[], Duration::from_secs(2), 5).await;
    none_answered_ok(&outcomes, "the lease");
}

// With `--gateway-lapse-patience 1s`: stopped for 4 s, past the lease and the patience (so the
// lease ended for good, and the standby was promoted meanwhile): refused as without a patience.
#[tokio::test]
async fn with_a_lapse_patience_settles_sent_while_stopped_past_lease_and_patience_are_never_answered_ok()
 {
    let outcomes = rounds(
        &["--gateway-lapse-patience", "1s"],
        Duration::from_secs(4),
        5,
    )
    .await;
    none_answered_ok(&outcomes, "the lease and the patience");
}
