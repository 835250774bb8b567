//! `tinybroker status` against a real server: the table, the JSON, and an unreachable broker.

use std::process::{Command, Output};

use tinybroker::client::{Client, Message, SubscriptionOptions};

use crate::harness::{TestServer, within};

/// Runs the `tinybroker` binary off the async runtime (it blocks).
async fn tinybroker(args: Vec<String>) -> Output {
    within(tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_tinybroker"))
            .args(args)
            .output()
            .unwrap()
    }))
    .await
    .unwrap()
}

// Inspection (docs/semantics.md#inspection): members in promotion order, the active one, epochs, depths and counters,
// as JSON a script can read and as a table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_members_in_promotion_order_with_the_active_one() {
    let server = TestServer::start().await;
    let url = format!("http://{}", server.addr);
    let client = within(Client::connect(url.clone())).await.unwrap();
    let leader = within(client.elect("cron", "replicas")).await.unwrap();
    within(leader.proclaim("host-a:9000")).await.unwrap();
    let other = client.clone();
    let _standby = tokio::spawn(async move { other.elect("cron", "replicas").await });
    let _queue = client
        .subscribe(SubscriptionOptions::queue("work", "workers", ["jobs.*"]))
        .await
        .unwrap();
    within(async {
        while client.describe("cron").await.unwrap().members.len() < 2 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    client.publish(Message::new("jobs.a", "1")).await.unwrap();
    client.publish(Message::new("jobs.b", "2")).await.unwrap();

    let out = tinybroker(vec![
        "status".into(),
        "--server".into(),
        url.clone(),
        "--json".into(),
    ])
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["broker"]["subscriptions"], 2);
    assert_eq!(json["broker"]["published"], 2);
    let cron = &json["subscriptions"][0];
    assert_eq!(cron["subscription_id"], "cron");
    assert_eq!(cron["mode"], "SINGLETON");
    assert_eq!(cron["epoch"], leader.epoch());
    assert_eq!(cron["active_member_id"], leader.member_id());
    assert_eq!(cron["active_metadata"], "host-a:9000");
    let members = cron["members"].as_array().unwrap();
    assert_eq!(members.len(), 2);
    assert_eq!(members[0]["member_id"], leader.member_id());
    assert_eq!(
        (&members[0]["active"], &members[1]["active"]),
        (&true.into(), &false.into())
    );
    assert_eq!(members[1]["position"], 1);
    assert_eq!(
        (&members[0]["metadata"], &members[1]["metadata"]),
        (&"host-a:9000".into(), &"".into())
    );
    let work = &json["subscriptions"][1];
    assert_eq!(work["subscription_id"], "work");
    // Window 1: one in flight, one queued.
    assert_eq!(
        (&work["in_flight"], &work["queued_messages"]),
        (&1.into(), &1.into())
    );
    assert_eq!(work["counters"]["enqueued"], 2);
    assert!(work.get("active_metadata").is_none(), "{work}");

    let out = tinybroker(vec!["status".into(), "--server".into(), url.clone()]).await;
    assert!(out.status.success());
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(table.contains("SUBSCRIPTION"), "{table}");
    let cron_row = table
        .lines()
        .find(|l| l.starts_with("cron "))
        .expect(&table);
    assert!(
        cron_row.contains(&format!("{}*,", leader.member_id())),
        "{cron_row}"
    );

    let out = tinybroker(vec![
        "status".into(),
        "--server".into(),
        url.clone(),
        "cron".into(),
    ])
    .await;
    assert!(out.status.success());
    let detail = String::from_utf8(out.stdout).unwrap();
    assert!(detail.contains("members, in promotion order"), "{detail}");
    assert!(detail.contains("standby"), "{detail}");
    assert!(detail.contains("METADATA"), "{detail}");
    assert!(detail.contains("\"host-a:9000\""), "{detail}");
    assert!(
        detail.contains(&format!(
            "active member {} (metadata \"host-a:9000\")",
            leader.member_id()
        )),
        "{detail}"
    );

    let out = tinybroker(vec![
        "status".into(),
        "--server".into(),
        url,
        "nobody".into(),
    ])
    .await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not found"));
}

// An operator pointing at the wrong place gets a clear message and a non-zero exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_says_plainly_when_the_broker_cannot_be_reached() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let out = tinybroker(vec!["status".into(), "--server".into(), url.clone()]).await;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("cannot reach the broker at {url}")),
        "{stderr}"
    );
}

/// Waits until subscription `id` has `n` members.
async fn until_members(client: &Client, id: &str, n: usize) {
    within(async {
        while client.describe(id).await.unwrap().members.len() != n {
            tokio::task::yield_now().await;
        }
    })
    .await;
}

/// `tinybroker COMMAND --server URL ID`.
async fn on_subscription(command: &str, url: &str, id: &str) -> Output {
    tinybroker([command, "--server", url, id].map(String::from).to_vec()).await
}

// docs/semantics.md#hand-over: `tinybroker handover ID` steps the leader down and names who
// took over; `status` shows the priorities; a refusal exits non-zero with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handover_hands_the_lead_to_the_next_in_line_and_status_shows_the_line() {
    let server = TestServer::start().await;
    let url = format!("http://{}", server.addr);
    let client = within(Client::connect(url.clone())).await.unwrap();
    let options = SubscriptionOptions::singleton("cron", "replicas", ["cron.*"]).priority(2);
    let leader = within(client.elect_with(options.clone(), |_| {}))
        .await
        .unwrap();
    let other = client.clone();
    let standby = tokio::spawn(async move { other.elect_with(options, |_| {}).await });
    until_members(&client, "cron", 2).await;
    let out = on_subscription("status", &url, "cron").await;
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("PRIORITY"), "{table}");

    let lost = leader.lost();
    let out = on_subscription("handover", &url, "cron").await;
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let successor = within(standby).await.unwrap().unwrap();
    assert!(
        printed.contains(&format!(
            "member {} (epoch {}) handed over to member {} (epoch {})",
            leader.member_id(),
            leader.epoch(),
            successor.member_id(),
            successor.epoch()
        )),
        "{printed}"
    );
    within(lost).await;
    // The old leader's Leadership left the line: no one to hand over to now.
    until_members(&client, "cron", 1).await;
    let out = on_subscription("handover", &url, "cron").await;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no standby to hand over to"), "{stderr}");
}
