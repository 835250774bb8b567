//! DELIVERY_MODE_SINGLETON over the wire (docs/semantics.md#singleton).

use crate::harness::*;

// docs/semantics.md#singleton: the active member drops its stream while holding an unacked message; the earliest
// standby gets the confirmation with a higher epoch, then that message with attempt 2, then the
// rest in order; later standbys get nothing.
over_carriages! {
async fn active_crash_mid_message_promotes_earliest_standby_with_redelivery_first(carriage: Carriage) {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut a = client.subscribe_via(carriage, singleton("report")).await.unwrap();
    let ca = a.confirmed().await;
    let mut b = client.subscribe_via(carriage, singleton("report")).await.unwrap();
    let mut c = client.subscribe_via(carriage, singleton("report")).await.unwrap();

    let ids: Vec<u64> = {
        let mut ids = Vec::new();
        for n in 1..=3 {
            ids.push(
                client
                    .publish("jobs.daily", &format!("m{n}"))
                    .await
                    .system_id,
            );
        }
        ids
    };
    let m1 = a.message().await;
    assert_eq!(
        (m1.system_id, m1.delivery_attempt, m1.epoch),
        (ids[0], 1, ca.epoch)
    );

    drop(a); // the client cancels mid-message: no ack

    let cb = b.confirmed().await;
    assert!(cb.epoch > ca.epoch, "epoch must increase on promotion");
    assert_ne!(cb.member_id, ca.member_id);
    let again = b.message().await;
    assert_eq!(
        (again.system_id, again.delivery_attempt, again.epoch),
        (ids[0], 2, cb.epoch)
    );
    assert_eq!(again.payload, b"m1".as_slice());
    b.ack(ids[0]).await;
    let m2 = b.message().await;
    assert_eq!((m2.system_id, m2.delivery_attempt), (ids[1], 1));
    b.ack(ids[1]).await;
    let m3 = b.message().await;
    assert_eq!(m3.system_id, ids[2]);
    b.ack(ids[2]).await;

    let info = client.describe("report").await.unwrap();
    assert_eq!(info.active_member_id, cb.member_id);
    assert_eq!(info.members.len(), 2);
    let counters = info.counters.unwrap();
    assert_eq!(
        (counters.acked, counters.redelivered, counters.promotions),
        (3, 1, 1)
    );

    // C received nothing while on standby: its first frame, on promotion, is the confirmation.
    drop(b);
    let cc = c.confirmed().await;
    assert!(cc.epoch > cb.epoch);
    let id = client.publish("jobs.weekly", "m4").await.system_id;
    assert_eq!(c.message().await.system_id, id);
}
}

// docs/semantics.md#singleton-invariants (2, 3, 5): a cascade of failovers follows join order, epochs strictly increase,
// and every message is eventually acked exactly once.
over_carriages! {
async fn cascade_of_failovers_loses_nothing_and_epochs_increase(carriage: Carriage) {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut members = Vec::new();
    for _ in 0..4 {
        members.push(client.subscribe_via(carriage, singleton("cascade")).await.unwrap());
    }
    let mut ids = Vec::new();
    for n in 0..6 {
        ids.push(client.publish("jobs.tick", &format!("{n}")).await.system_id);
    }
    let mut epochs = Vec::new();
    let mut acked = Vec::new();
    let mut members = members.into_iter();
    // Members 1-3 each ack one message, receive the next and die holding it.
    for _ in 0..3 {
        let mut m = members.next().unwrap();
        epochs.push(m.confirmed().await.epoch);
        let first = m.message().await;
        m.ack(first.system_id).await;
        acked.push(first.system_id);
        let held = m.message().await;
        assert!(!acked.contains(&held.system_id));
        drop(m);
    }
    let mut last = members.next().unwrap();
    epochs.push(last.confirmed().await.epoch);
    while acked.len() < ids.len() {
        let m = last.message().await;
        last.ack(m.system_id).await;
        acked.push(m.system_id);
    }
    assert!(epochs.windows(2).all(|w| w[0] < w[1]), "epochs {epochs:?}");
    // Each holder acked one and lost one, which the next one got first: publish order overall.
    assert_eq!(acked, ids);
    let info = client.describe("cascade").await.unwrap();
    assert_eq!((info.queued_messages, info.in_flight), (0, 0));
    assert_eq!(info.counters.unwrap().acked, 6);
}
}

// docs/semantics.md#singleton: later joiners never take over from the active member; promotion follows join order.
over_carriages! {
async fn late_joiner_never_preempts_and_waits_its_turn(carriage: Carriage) {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut a = client.subscribe_via(carriage, singleton("leader")).await.unwrap();
    a.confirmed().await;
    let mut b = client.subscribe_via(carriage, singleton("leader")).await.unwrap();
    let id = client.publish("jobs.run", "x").await.system_id;
    // The active member keeps receiving after B joined.
    assert_eq!(a.message().await.system_id, id);
    a.ack(id).await;
    let mut late = client.subscribe_via(carriage, singleton("leader")).await.unwrap();
    let id = client.publish("jobs.run", "y").await.system_id;
    assert_eq!(a.message().await.system_id, id);
    let info = client.describe("leader").await.unwrap();
    assert_eq!(info.active_member_id, a.member_id);
    assert_eq!(info.members.iter().filter(|m| m.active).count(), 1);
    drop(a);
    // B (earlier) is promoted, not the late joiner.
    b.confirmed().await;
    assert_eq!(b.message().await.system_id, id);
    drop(b);
    late.confirmed().await;
    assert_eq!(late.message().await.delivery_attempt, 3);
}
}

// docs/semantics.md#standby-notice (optional notice): a member that asks is told it is on standby and its place in line
// (through gateways, its place in the cluster's line).
#[tokio::test]
async fn standby_notice_reports_place_in_line_when_asked() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut a = client.subscribe(singleton("notice")).await.unwrap();
    a.confirmed().await;
    let mut ask = singleton("notice");
    ask.notify_standby = true;
    use tinybroker::pb::subscription_frame::Frame;
    let mut b = client.subscribe(ask.clone()).await.unwrap();
    let Frame::Standby(nb) = b.frame().await else {
        panic!("expected a standby notice for b");
    };
    // Through gateways c joins at the other one: its place counts members everywhere.
    let mut c = client.at_publishers().subscribe(ask).await.unwrap();
    let Frame::Standby(nc) = c.frame().await else {
        panic!("expected a standby notice for c");
    };
    assert_eq!((nb.position, nc.position), (1, 2));
    assert_eq!(
        (nb.subscription_id.as_str(), nc.subscription_id.as_str()),
        ("notice", "notice")
    );
    // A member that did not ask gets no notice: its first frame is its confirmation.
    let mut d = client.subscribe(singleton("notice")).await.unwrap();
    drop(a);
    b.confirmed().await;
    assert_eq!(b.member_id, nb.member_id, "the notice named b");
    drop(b);
    c.confirmed().await;
    assert_eq!(c.member_id, nc.member_id, "the notice named c");
    drop(c);
    d.confirmed().await;
}

// docs/semantics.md#fencing: a demoted member's late ack cannot release the new holder's copy.
over_carriages! {
async fn stale_ack_after_failover_is_refused_and_changes_nothing(carriage: Carriage) {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut a = client.subscribe_via(carriage, singleton("fence")).await.unwrap();
    a.confirmed().await;
    let mut b = client.subscribe_via(carriage, singleton("fence")).await.unwrap();
    let id = client.publish("jobs.fence", "x").await.system_id;
    assert_eq!(a.message().await.system_id, id);
    let (a_member, a_client) = (a.member_id, client.clone());
    drop(a);
    b.confirmed().await;
    assert_eq!(b.message().await.delivery_attempt, 2);
    // A's late ack, fenced with its member id, is refused.
    assert_code(
        a_client.ack("fence", a_member, id).await,
        tonic::Code::FailedPrecondition,
        "stale",
    );
    assert_code(
        a_client.nack("fence", a_member, id).await,
        tonic::Code::FailedPrecondition,
        "stale",
    );
    let info = client.describe("fence").await.unwrap();
    assert_eq!(info.in_flight, 1, "B still holds its copy");
    assert_eq!(info.counters.unwrap().stale_acks, 2);
    b.ack(id).await;
    assert_eq!(client.describe("fence").await.unwrap().in_flight, 0);
}
}

// docs/semantics.md#redelivery-order order after a nack and a failover (issue 17 part 3): window 2, A gets 1 and 2, nacks 1
// and gets it again, so it holds 2 then 1. When A leaves, the promoted B gets them in publish
// order (1, then 2), then 3. B used to get 2 first.
over_carriages! {
async fn failover_after_a_nack_with_window_2_keeps_publish_order(carriage: Carriage) {
    let server = TestServer::start().await;
    let client = server.client().await;
    let mut request = singleton("ordered");
    request.max_in_flight = 2;
    let mut a = client.subscribe_via(carriage, request.clone()).await.unwrap();
    a.confirmed().await;
    let mut b = client.subscribe_via(carriage, request).await.unwrap();
    let mut ids = Vec::new();
    for n in 1..=3 {
        ids.push(client.publish("jobs.daily", &format!("m{n}")).await.system_id);
    }
    assert_eq!(a.message().await.system_id, ids[0]);
    assert_eq!(a.message().await.system_id, ids[1]);
    a.nack(ids[0]).await;
    let again = a.message().await;
    assert_eq!((again.system_id, again.delivery_attempt), (ids[0], 2));
    drop(a);
    b.confirmed().await;
    let first = b.message().await;
    let second = b.message().await;
    assert_eq!(
        [(first.system_id, first.delivery_attempt), (second.system_id, second.delivery_attempt)],
        [(ids[0], 3), (ids[1], 2)],
        "publish order after the failover"
    );
    b.ack(ids[0]).await;
    assert_eq!(b.message().await.system_id, ids[2]);
}
}
