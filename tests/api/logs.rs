//! Structured logs from the binary: `--log-format json` writes one JSON object per line, and
//! every line of a failover names the subscription, the member and its epoch.

use tinybroker::pb::broker_client::BrokerClient;
use tonic::transport::Channel;

use crate::{
    binary,
    harness::{Client, singleton},
};

// A failover logged as JSON: the promotion line carries subscription, member and epoch (from
// its fields and its `member_stream` span), and no message is logged per publish at info.
#[tokio::test]
async fn json_logs_name_subscription_member_and_epoch_on_failover() {
    let (mut broker, addr) = binary::serve(&["--log-format", "json"]).await;
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let client = Client::of(BrokerClient::new(channel));
    let mut active = client.subscribe(singleton("logged")).await.unwrap();
    let first = active.confirmed().await;
    let mut standby = client.subscribe(singleton("logged")).await.unwrap();
    for i in 0..5 {
        client.publish(&format!("jobs.{i}"), "x").await;
    }
    active.message().await;
    drop(active);
    let second = standby.confirmed().await;

    let mut lines = Vec::new();
    loop {
        let line = broker.line_with("").await;
        assert!(
            line.starts_with('{') && line.ends_with('}'),
            "not a JSON line: {line}"
        );
        let promoted = line.contains("standby promoted to active");
        lines.push(line);
        if promoted {
            break;
        }
    }
    let promotion = lines.last().unwrap();
    for needle in [
        r#""subscription":"logged""#.to_string(),
        format!(r#""left":{}"#, first.member_id),
        format!(r#""promoted":{}"#, second.member_id),
        format!(r#""epoch":{}"#, second.epoch),
        r#""name":"member_stream""#.to_string(),
        format!(r#""member":{}"#, first.member_id),
    ] {
        assert!(
            promotion.contains(&needle),
            "{needle} missing from {promotion}"
        );
    }
    let info_lines: Vec<_> = lines
        .iter()
        .filter(|l| l.contains(r#""level":"INFO""#))
        .collect();
    assert!(
        info_lines.len() <= 3,
        "more info lines than start, creation and promotion: {info_lines:#?}"
    );
}
