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
