//! `DeleteSubscription` (docs/semantics.md#deleting): an idle subscription is removed with its
//! settings and messages, so its id takes new settings; a joined member anywhere refuses it and
//! nothing changes; unknown and malformed ids are refused as every call refuses them.

use tinybroker::pb::{self, DeliveryMode};
use tonic::{Code, Status};

use crate::{
    binary,
    harness::{Client, GATEWAYS, TestServer, assert_code, open, within},
};

pub(crate) async fn delete(
    client: &Client,
    id: &str,
) -> Result<pb::DeleteSubscriptionResponse, Status> {
    within(
        client
            .0
            .clone()
            .delete_subscription(pb::DeleteSubscriptionRequest {
                subscription_id: id.into(),
            }),
    )
    .await
    .map(|r| r.into_inner())
}

/// Deletes `id` once its last member's leave has been applied everywhere: a delete is refused
/// (FAILED_PRECONDITION) until then (through gateways, until the member's gateway saw its
/// stream end).
pub(crate) async fn delete_once_left(client: &Client, id: &str) -> pb::DeleteSubscriptionResponse {
    within(async {
        loop {
            match delete(client, id).await {
                Err(status) if status.code() == Code::FailedPrecondition => continue,
                other => return other.unwrap(),
            }
        }
    })
    .await
}

// docs/semantics.md#deleting: deleting a subscription with no member joined removes its settings
// and discards (and counts) its messages, queued and given back; a join with other settings
// that was refused before it then creates the subscription anew, and gets none of the old
// messages.
#[tokio::test]
async fn deleting_an_idle_subscription_lets_its_id_be_joined_with_other_settings() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let id = "delete-settings";
    let mut member = client
        .subscribe(open(id, DeliveryMode::Queue, "workers", &["jobs.*"]))
        .await
        .unwrap();
    member.confirmed().await;
    client.publish("jobs.a", "given back").await;
    client.publish("jobs.b", "queued").await;
    // Window 1: the first is in flight (given back when the member leaves), the second waits.
    assert_eq!(member.message().await.payload, b"given back".as_slice());
    drop(member);
    let election = pb::OpenSubscription {
        ack_mode: pb::AckMode::None.into(),
        ..open(id, DeliveryMode::Singleton, "replicas", &["jobs.*"])
    };
    if GATEWAYS {
        // The consumer's leader may count a publish a moment after its confirmation: wait until
        // it counts both, so the delete's answer is known.
        let held = |info: &pb::SubscriptionInfo| {
            info.upstream.as_ref().map(|u| u.pending + u.unacked) == Some(2)
        };
        within(async { while !held(&client.describe(id).await.unwrap()) {} }).await;
    }
    assert_code(
        client.subscribe(election.clone()).await.map(|_| ()),
        Code::FailedPrecondition,
        "settings",
    );
    let deleted = delete_once_left(&client, id).await;
    assert_eq!(
        deleted.discarded_messages, 2,
        "the in-flight one given back and the queued one"
    );
    let broker = client.list().await.broker.unwrap();
    assert_eq!(
        (broker.subscriptions_deleted, broker.messages_deleted),
        (1, 2)
    );
    assert_code(client.describe(id).await, Code::NotFound, "not found");
    assert_code(delete(&client, id).await, Code::NotFound, "not found");

    let mut leader = client.subscribe(election).await.unwrap();
    leader.confirmed().await;
    let fresh = client.publish("jobs.c", "new").await.system_id;
    let first = leader.message().await;
    assert_eq!(
        (first.system_id, first.delivery_attempt),
        (fresh, 1),
        "none of the deleted subscription's messages comes back"
    );
    let info = client.describe(id).await.unwrap();
    assert_eq!(info.mode, DeliveryMode::Singleton as i32);
    assert_eq!(info.ack_mode, pb::AckMode::None as i32);
}

// docs/semantics.md#deleting: a member joined anywhere (through gateways, at the other gateway
// than the one the delete goes to) refuses the delete, naming how many are joined; nothing
// changes: the member keeps receiving and the settings stay.
#[tokio::test]
async fn delete_is_refused_while_a_member_is_joined_and_changes_nothing() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let elsewhere = client.at_publishers();
    for (id, mode, group) in [
        ("delete-busy-queue", DeliveryMode::Queue, "workers"),
        ("delete-busy-singleton", DeliveryMode::Singleton, "replicas"),
    ] {
        let topic = format!("{id}.x");
        let pattern = format!("{id}.*");
        let mut member = elsewhere
            .subscribe(open(id, mode, group, &[&pattern]))
            .await
            .unwrap();
        member.confirmed().await;
        assert_code(
            delete(&client, id).await,
            Code::FailedPrecondition,
            "1 member(s) joined",
        );
        let sent = client.publish(&topic, "still delivered").await.system_id;
        let got = member.message().await;
        assert_eq!((got.system_id, got.delivery_attempt), (sent, 1), "{id}");
        member.ack(got.system_id).await;
        let info = elsewhere.describe(id).await.unwrap();
        assert_eq!((info.mode, info.members.len()), (mode as i32, 1), "{id}");
        let broker = client.list().await.broker.unwrap();
        assert_eq!(broker.subscriptions_deleted, 0);
    }
}

// docs/semantics.md#deleting: an unknown id is NOT_FOUND; a malformed one INVALID_ARGUMENT,
// validated as every other call's subscription_id.
#[tokio::test]
async fn delete_refuses_unknown_and_malformed_ids() {
    let server = TestServer::start().await;
    let client = server.client().await;
    assert_code(
        delete(&client, "never-was").await,
        Code::NotFound,
        "never-was",
    );
    assert_code(
        delete(&client, "").await,
        Code::InvalidArgument,
        "subscription_id",
    );
    assert_code(
        delete(&client, &"x".repeat(257)).await,
        Code::InvalidArgument,
        "subscription_id",
    );
    assert_code(
        delete(&client, "bell\u{7}").await,
        Code::InvalidArgument,
        "subscription_id",
    );
}

// docs/semantics.md#deleting: `tinybroker delete ID` says what was discarded, and why nothing
// was deleted otherwise, exiting non-zero then.
#[tokio::test]
async fn the_delete_command_reports_each_answer() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let server_url = format!("http://{}", server.addr);
    let run = |id: &str| {
        binary::run_client(vec![
            "delete".into(),
            "--server".into(),
            server_url.clone(),
            id.into(),
        ])
    };
    let id = "delete-cli";
    let member = client
        .subscribe(open(id, DeliveryMode::Queue, "workers", &["cli.*"]))
        .await
        .unwrap();
    let busy = run(id).await;
    assert!(!busy.status.success());
    let said = String::from_utf8_lossy(&busy.stderr);
    assert!(
        said.contains("was not deleted") && said.contains("1 member(s) joined"),
        "{said}"
    );
    drop(member);
    within(async {
        loop {
            let out = run(id).await;
            if out.status.success() {
                let said = String::from_utf8_lossy(&out.stdout).to_string();
                assert!(
                    said.contains("deleted subscription \"delete-cli\": 0 message(s) discarded"),
                    "{said}"
                );
                return;
            }
        }
    })
    .await;
    let gone = run(id).await;
    assert!(!gone.status.success());
    let said = String::from_utf8_lossy(&gone.stderr);
    assert!(
        said.contains("no subscription \"delete-cli\" to delete"),
        "{said}"
    );
}

/// A singleton join of `id` with consumer group `group` (its settings).
fn leadership(id: &str, group: &str) -> pb::OpenSubscription {
    open(id, DeliveryMode::Singleton, group, &["race.*"])
}

// docs/semantics.md#deleting ("No half-deleted state"), #cluster-delete, #restart-identity: a
// join racing a delete (at the other gateway, through gateways) finds the old subscription
// whole, and the delete is refused, or none, and creates one with its own settings; a member
// it joins is never left on a deleted subscription (it gets what is published next). Over many
// rounds of delete and recreate, epochs and member ids keep rising.
#[tokio::test]
async fn a_join_racing_a_delete_finds_the_old_subscription_whole_or_none() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let elsewhere = client.at_publishers();
    let id = "delete-race";
    let (mut epoch, mut member_id) = (0, 0);
    let mut rising = |c: &pb::Confirmation, round: usize| {
        assert!(
            c.epoch > epoch && c.member_id > member_id,
            "round {round}: epoch {} after {epoch}, member id {} after {member_id}",
            c.epoch,
            c.member_id
        );
        (epoch, member_id) = (c.epoch, c.member_id);
    };
    for round in 0..12 {
        let same = round % 2 == 1;
        let old = leadership(id, &format!("g{round}"));
        let mut first = elsewhere.subscribe(old.clone()).await.unwrap();
        rising(&first.confirmed().await, round);
        drop(first);
        let new = if same {
            old.clone()
        } else {
            leadership(id, &format!("h{round}"))
        };
        let mut joined = within(async {
            loop {
                let (deleted, joined) =
                    tokio::join!(delete(&client, id), elsewhere.subscribe(new.clone()));
                let refused = |s: &Status| s.code() == Code::FailedPrecondition;
                match (deleted, joined) {
                    (Ok(_), Ok(member)) => return member,
                    // The join found the old subscription whole (same settings): it joined it,
                    // and the delete was refused.
                    (Err(d), Ok(member)) if refused(&d) && same => return member,
                    (Err(d), Ok(_)) => panic!(
                        "round {round}: a join with new settings succeeded, so the old subscription was gone, yet the delete said {d:?}"
                    ),
                    // The join found the old subscription whole (other settings) before the
                    // delete removed it.
                    (Ok(_), Err(j)) if refused(&j) && !same => {
                        return elsewhere.subscribe(new.clone()).await.unwrap();
                    }
                    // Its last member's leave not yet applied: both refused; again.
                    (Err(d), Err(j)) if refused(&d) && refused(&j) && !same => {}
                    (deleted, joined) => panic!(
                        "round {round}: delete {deleted:?}, join {:?}",
                        joined.map(|m| m.member_id)
                    ),
                }
            }
        })
        .await;
        rising(&joined.confirmed().await, round);
        let sent = client.publish("race.x", "after").await.system_id;
        assert_eq!(
            joined.message().await.system_id,
            sent,
            "round {round}: the member joined a live subscription"
        );
        let info = client.describe(id).await.unwrap();
        assert_eq!(info.consumer_group, new.consumer_group, "round {round}");
        drop(joined);
        delete_once_left(&client, id).await;
    }
}

// docs/semantics.md#deleting: two deletes of one idle subscription at once (through gateways,
// one at each): one deletes it, the other finds nothing to delete (NOT_FOUND), and the
// subscription is counted deleted once, with its messages once.
#[tokio::test]
async fn two_deletes_at_once_delete_once() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let elsewhere = client.at_publishers();
    for round in 0..5 {
        let id = format!("delete-twice-{round}");
        let pattern = format!("{id}.*");
        let mut member = client
            .subscribe(open(&id, DeliveryMode::Queue, "workers", &[&pattern]))
            .await
            .unwrap();
        member.confirmed().await;
        drop(member);
        // Once its leave is applied at both gateways: a delete that is refused changes nothing.
        within(async {
            loop {
                let (mut a, mut b) = tokio::join!(delete(&client, &id), delete(&elsewhere, &id));
                // UNAVAILABLE is "nothing deleted, try again" (docs/semantics.md#cluster-delete),
                // which a loaded machine can answer: that one is sent again.
                let unavailable = |r: &Result<_, Status>| {
                    r.as_ref().is_err_and(|s| s.code() == Code::Unavailable)
                };
                while unavailable(&a) {
                    a = delete(&client, &id).await;
                }
                while unavailable(&b) {
                    b = delete(&elsewhere, &id).await;
                }
                let refused = |r: &Result<_, Status>| {
                    r.as_ref()
                        .is_err_and(|s: &Status| s.code() == Code::FailedPrecondition)
                };
                if refused(&a) || refused(&b) {
                    if a.is_ok() || b.is_ok() {
                        return;
                    }
                    continue;
                }
                let codes = [&a, &b].map(|r| r.as_ref().map_err(Status::code).map(|_| ()));
                assert!(
                    codes.contains(&Ok(())) && codes.contains(&Err(Code::NotFound)),
                    "round {round}: one deletes, the other finds nothing: {a:?} {b:?}"
                );
                return;
            }
        })
        .await;
    }
    let deleted = client.list().await.broker.unwrap().subscriptions_deleted
        + if GATEWAYS {
            elsewhere.list().await.broker.unwrap().subscriptions_deleted
        } else {
            0
        };
    assert_eq!(deleted, 5, "each subscription counted deleted once");
}

// docs/semantics.md#deleting, #bad-input: any valid id, whatever its characters (those a NATS
// subject or key gives a meaning to included), is joined, deleted and joined again.
#[tokio::test]
async fn odd_ids_are_deleted_like_any_other() {
    let server = TestServer::start().await;
    let client = server.client().await;
    let long = "x".repeat(256);
    for id in [
        "ünïcødé-😀",
        "a.b.c",
        "a.*.>",
        "with space",
        "=3D=",
        ".lead",
        "trail.",
        "a..b",
        "$JS.API",
        long.as_str(),
    ] {
        let member = client
            .subscribe(open(id, DeliveryMode::Queue, "workers", &["odd.*"]))
            .await
            .unwrap_or_else(|s| panic!("{id:?}: {s:?}"));
        drop(member);
        let deleted = within(async {
            loop {
                match delete(&client, id).await {
                    Err(status) if status.code() == Code::FailedPrecondition => continue,
                    other => return other,
                }
            }
        })
        .await;
        assert!(deleted.is_ok(), "{id:?}: {deleted:?}");
        assert_code(client.describe(id).await, Code::NotFound, "not found");
        let again = client
            .subscribe(open(id, DeliveryMode::Broadcast, "", &["odd.*"]))
            .await;
        assert!(again.is_ok(), "{id:?} joined again with other settings");
    }
}
