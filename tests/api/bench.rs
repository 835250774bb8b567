//! The shipped load generator against a running broker (`bench --server`).

use crate::binary;

// A bench run against a broker that refuses its publishes (here: each is larger than the
// broker's message limit) stops and says why. It used to wait forever for publish answers that
// could no longer come.
#[tokio::test]
async fn bench_against_a_broker_that_refuses_publishes_fails_and_says_why() {
    let (_server, addr) = binary::serve(&["--max-message-bytes", "64"]).await;
    let out = binary::run_client(vec![
        "bench".into(),
        "--server".into(),
        format!("http://{addr}"),
        "--messages".into(),
        "1000".into(),
        "w1".into(),
    ])
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("refused"), "{stderr}");
}

// `--jetstream-batch` sets how JetStream alone publishes beside the gateways, at equal
// guarantees: it needs `--jetstream-msg-ids` (and so `--nats`), and a batch of 2 to 1,000
// messages (JetStream's largest atomic batch). Refused before anything starts.
#[tokio::test]
async fn bench_refuses_a_jetstream_batch_without_message_ids_or_out_of_range() {
    for (args, says) in [
        (
            vec!["--nats", "nats://127.0.0.1:1", "--jetstream-batch", "64"],
            "--jetstream-msg-ids",
        ),
        (
            vec![
                "--nats",
                "nats://127.0.0.1:1",
                "--jetstream-msg-ids",
                "--jetstream-batch",
                "1",
            ],
            "2..=1000",
        ),
        (
            vec![
                "--nats",
                "nats://127.0.0.1:1",
                "--jetstream-msg-ids",
                "--jetstream-batch",
                "1001",
            ],
            "2..=1000",
        ),
    ] {
        let mut argv = vec!["bench".to_string()];
        argv.extend(args.iter().map(|a| a.to_string()));
        argv.push("w3".into());
        let out = binary::run_client(argv).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

// w2 on the embedded broker: every kill promotes the next replica, nothing is lost, and a
// leadership watcher (docs/semantics.md#watching-leadership) is told of every promotion: its
// gaps are reported beside the delivery gaps.
#[tokio::test]
async fn bench_w2_reports_the_watchers_gap_beside_the_delivery_gap() {
    let out = binary::run_client(
        [
            "bench",
            "w2",
            "--kills",
            "2",
            "--interval",
            "300ms",
            "--rate",
            "200",
        ]
        .map(String::from)
        .to_vec(),
    )
    .await;
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report: serde_json::Value = stdout
        .lines()
        .find(|l| l.starts_with('{'))
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no JSON report in {stdout}"));
    assert_eq!(
        (report["kills"].as_u64(), report["lost"].as_u64()),
        (Some(2), Some(0)),
        "{report}"
    );
    for field in ["gap_max_ms", "watch_gap_median_ms", "watch_gap_max_ms"] {
        let ms = report[field].as_f64().unwrap_or(f64::MAX);
        assert!(ms > 0.0 && ms < 5_000.0, "{field}: {report}");
    }
}
