//! `tinybroker bench --nats`: w1 and w3 through two gateways, then straight on JetStream, on a
//! real three-node cluster; what the bench made in JetStream is gone afterwards.

use tokio_stream::StreamExt;

use crate::{binary, nats_server::NatsCluster};

/// How long one bench run may take here: it starts two gateways over a cluster just made (each
/// listens once it can serve) and runs the workload through them and on JetStream alone, on a
/// machine running the other cluster tests beside it (CI saw one take over 10 s).
const BENCH_PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);

/// Runs the bench with `args` to completion, within [`BENCH_PATIENCE`].
async fn run(args: Vec<String>) -> std::process::Output {
    binary::run_client_within(args, BENCH_PATIENCE).await
}

/// The JSON lines of a bench run's output.
fn reports(stdout: &[u8]) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).expect("a JSON report line"))
        .collect()
}

/// Asserts that no bench stream is left in `cluster`'s JetStream (each run deletes its own).
async fn no_bench_stream_left(cluster: &NatsCluster) {
    let client = async_nats::connect(&cluster.client_urls()[0])
        .await
        .unwrap();
    let js = async_nats::jetstream::new(client);
    let left: Vec<String> = js
        .stream_names()
        .collect::<Result<Vec<_>, _>>()
        .await
        .unwrap();
    assert!(
        left.iter().all(|name| !name.contains("bench")),
        "streams left behind: {left:?}"
    );
}

/// Runs the client with `args`, which must succeed with one report: that report, and the
/// output.
async fn one_report(args: &[&str]) -> (serde_json::Value, std::process::Output) {
    let output = run(args.iter().map(|a| a.to_string()).collect()).await;
    assert!(output.status.success(), "{output:?}");
    let mut reports = reports(&output.stdout);
    assert_eq!(reports.len(), 1, "{reports:?}");
    (reports.remove(0), output)
}

#[tokio::test]
async fn bench_with_nats_runs_each_workload_through_gateways_and_on_jetstream() {
    let cluster = NatsCluster::start(3).await;
    let urls = cluster.client_urls().join(",");
    for workload in [
        vec!["w1", "--window", "4"],
        vec!["w3", "--ack-free", "--subscribers", "2"],
        vec!["w3", "--subscribers", "2", "--window", "16"],
        vec![
            "--jetstream-msg-ids",
            "w3",
            "--ack-free",
            "--subscribers",
            "2",
        ],
        // 300 messages: four whole batches of 64 and one of 44, committed by the last
        // message; every one must reach both subscribers for the run to end.
        vec![
            "--jetstream-msg-ids",
            "--jetstream-batch",
            "64",
            "w3",
            "--ack-free",
            "--subscribers",
            "2",
        ],
        vec![
            "--jetstream-msg-ids",
            "--jetstream-batch",
            "7",
            "w1",
            "--window",
            "4",
        ],
    ] {
        let mut args: Vec<String> = ["bench", "--nats", &urls, "--messages", "300"]
            .map(String::from)
            .to_vec();
        args.extend(workload.iter().map(|s| s.to_string()));
        let output = run(args).await;
        assert!(output.status.success(), "{workload:?}: {output:?}");
        let reports = reports(&output.stdout);
        let deployments: Vec<&str> = reports
            .iter()
            .map(|r| r["deployment"].as_str().unwrap_or_default())
            .collect();
        // With message ids, JetStream alone is named for them: its publishes carry ids.
        let alone = if workload.contains(&"--jetstream-batch") {
            "jetstream+batch-ids"
        } else if workload.contains(&"--jetstream-msg-ids") {
            "jetstream+msg-ids"
        } else {
            "jetstream"
        };
        assert_eq!(deployments, ["gateways", alone], "{workload:?}");
        let name = workload.iter().find(|a| a.starts_with('w')).unwrap();
        for r in &reports {
            assert_eq!(r["workload"], *name, "{r}");
            assert_eq!(r["messages"], 300, "{r}");
            assert!(r["rate_per_s"].as_f64().unwrap_or_default() > 0.0, "{r}");
        }
    }
    no_bench_stream_left(&cluster).await;
}

// docs/performance.md: `--reps 2` runs the gateways and JetStream alone twice each, alternating,
// then a comparison line whose rates are those of the four reports, in order, with each rep's
// ratio and their median; every rep's stream is deleted.
#[tokio::test]
async fn bench_with_nats_reps_alternates_and_compares() {
    let cluster = NatsCluster::start(3).await;
    let urls = cluster.client_urls().join(",");
    let output = run([
        "bench",
        "--nats",
        &urls,
        "--messages",
        "200",
        "--reps",
        "2",
        "w3",
        "--ack-free",
        "--subscribers",
        "2",
    ]
    .map(String::from)
    .to_vec())
    .await;
    assert!(output.status.success(), "{output:?}");
    let reports = reports(&output.stdout);
    let deployments: Vec<&str> = reports
        .iter()
        .map(|r| r["deployment"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        deployments,
        [
            "gateways",
            "jetstream",
            "gateways",
            "jetstream",
            "gateways/jetstream"
        ]
    );
    let rate = |n: usize| reports[n]["rate_per_s"].as_f64().unwrap();
    let comparison = &reports[4];
    assert_eq!(comparison["workload"], "w3");
    assert_eq!(comparison["reps"], 2);
    let floats = |key: &str| -> Vec<f64> {
        comparison[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect()
    };
    assert_eq!(floats("gateways_rate_per_s"), [rate(0), rate(2)]);
    assert_eq!(floats("jetstream_rate_per_s"), [rate(1), rate(3)]);
    // Within rounding: a rate read back from its JSON text may differ from the one the bench
    // divided in its last bit.
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(b.abs());
    let ratios = [rate(0) / rate(1), rate(2) / rate(3)];
    let reported = floats("ratios");
    assert!(
        reported.len() == 2 && close(reported[0], ratios[0]) && close(reported[1], ratios[1]),
        "{reported:?} against {ratios:?}"
    );
    let median = comparison["median_ratio"].as_f64().unwrap();
    assert!(close(median, (ratios[0] + ratios[1]) / 2.0), "{comparison}");
    // The gateways' CPU is reported; no load beside JetStream alone without the flag.
    assert_eq!(floats("gateways_cpu_cores").len(), 2, "{comparison}");
    assert!(comparison.get("beside_cpu_cores").is_none(), "{comparison}");
    assert!(
        reports[1].get("beside_cpu_cores").is_none(),
        "{}",
        reports[1]
    );
    no_bench_stream_left(&cluster).await;
}

// docs/performance.md#shared-cores: `--jetstream-shares-cpu` keeps, beside each rep's run on
// JetStream alone, as many cores busy as the gateways used in that rep's run through them: each
// gateway report's CPU time over its run's time is the load its JetStream report names, which
// the comparison lists with the gateways' cores; the load used CPU, and no more than asked.
#[tokio::test]
async fn bench_with_nats_shares_cpu_with_jetstream_alone() {
    let cluster = NatsCluster::start(3).await;
    let urls = cluster.client_urls().join(",");
    // Deliveries per run: 2,000 messages to 4 subscribers.
    let deliveries = 8000.0;
    let output = run([
        "bench",
        "--nats",
        &urls,
        "--messages",
        "2000",
        "--reps",
        "2",
        "--jetstream-shares-cpu",
        "w3",
        "--ack-free",
        "--subscribers",
        "4",
    ]
    .map(String::from)
    .to_vec())
    .await;
    assert!(output.status.success(), "{output:?}");
    let reports = reports(&output.stdout);
    assert_eq!(reports.len(), 5, "{reports:?}");
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * a.abs().max(b.abs()).max(1e-9);
    let machine = std::thread::available_parallelism().map_or(1, usize::from) as f64;
    let comparison = &reports[4];
    let listed = |key: &str| -> Vec<f64> {
        comparison[key]
            .as_array()
            .unwrap_or_else(|| panic!("{key} in {comparison}"))
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect()
    };
    let (gateway_cores, beside) = (listed("gateways_cpu_cores"), listed("beside_cpu_cores"));
    let beside_s = listed("beside_cpu_s");
    for rep in 0..2 {
        let (through, alone) = (&reports[2 * rep], &reports[2 * rep + 1]);
        assert_eq!(through["deployment"], "gateways");
        assert_eq!(alone["deployment"], "jetstream");
        // CPU seconds over the run's seconds, the run's seconds being its deliveries over its
        // rate.
        let cpu_s = through["gateways_cpu_s"].as_f64().unwrap();
        assert!(
            cpu_s > 0.0,
            "rep {rep}: gateways that used no CPU: {through}"
        );
        let seconds = deliveries / through["rate_per_s"].as_f64().unwrap();
        assert!(
            close(gateway_cores[rep], cpu_s / seconds),
            "rep {rep}: {} cores from {cpu_s} s over {seconds} s",
            gateway_cores[rep]
        );
        let load = alone["beside_cpu_cores"].as_f64().unwrap();
        assert!(
            close(load, gateway_cores[rep].min(machine)),
            "rep {rep}: a load of {load} cores beside JetStream alone, the gateways used {}",
            gateway_cores[rep]
        );
        assert!(close(beside[rep], load), "{comparison}");
        // The load ran: some of what it was asked (once that is more than its threads' 5 ms
        // steps), on a machine it shares with a cluster and a bench, and never more.
        let used = alone["beside_cpu_s"].as_f64().unwrap();
        let asked = load * deliveries / alone["rate_per_s"].as_f64().unwrap();
        assert!(close(beside_s[rep], used), "{comparison}");
        assert!(
            (asked < 0.05 || used > 0.2 * asked) && used <= asked + 0.05 * load.ceil(),
            "rep {rep}: the load used {used} s of CPU, asked {asked} s ({load} cores)"
        );
        eprintln!(
            "rep {rep}: gateways {cpu_s} s over {seconds} s; load {load} cores, asked {asked} s, used {used} s"
        );
    }
    no_bench_stream_left(&cluster).await;
}

// docs/performance.md: `--nats`, w1 and w3 only; not with `--fenced` (no JetStream side).
#[tokio::test]
async fn bench_with_nats_refuses_reps_without_a_jetstream_side() {
    for args in [
        vec!["--reps", "2", "w2"],
        vec!["--reps", "2", "--fenced", "w1"],
    ] {
        let mut all: Vec<String> = ["bench", "--nats", "nats://127.0.0.1:1"]
            .map(String::from)
            .to_vec();
        all.extend(args.iter().map(|s| s.to_string()));
        let output = run(all).await;
        assert!(!output.status.success(), "{args:?}");
        let said = String::from_utf8_lossy(&output.stderr);
        assert!(
            said.contains("--reps compares w1 or w3"),
            "{args:?}: {said}"
        );
    }
    let output = run(
        ["bench", "--nats", "nats://127.0.0.1:1", "--reps", "0", "w1"]
            .map(String::from)
            .to_vec(),
    )
    .await;
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("--reps"),
        "{output:?}"
    );
}

// docs/performance.md#shared-cores: `--jetstream-shares-cpu` with `--nats`, w1 and w3 only.
#[tokio::test]
async fn bench_refuses_shared_cpu_without_a_jetstream_side() {
    for args in [
        vec![
            "--nats",
            "nats://127.0.0.1:1",
            "--jetstream-shares-cpu",
            "w2",
        ],
        vec![
            "--nats",
            "nats://127.0.0.1:1",
            "--jetstream-shares-cpu",
            "--fenced",
            "w1",
        ],
        vec!["--jetstream-shares-cpu", "w1"],
        vec![
            "--nats-core",
            "nats://127.0.0.1:1",
            "--jetstream-shares-cpu",
            "w3",
        ],
    ] {
        let mut all = vec!["bench".to_string()];
        all.extend(args.iter().map(|s| s.to_string()));
        let output = run(all).await;
        assert!(!output.status.success(), "{args:?}");
        let said = String::from_utf8_lossy(&output.stderr);
        assert!(
            said.contains("--jetstream-shares-cpu loads the machine beside JetStream alone")
                || (said.contains("--jetstream-shares-cpu") && said.contains("--nats")),
            "{args:?}: {said}"
        );
        assert!(!said.contains("panicked"), "{args:?}: {said}");
    }
}

// docs/performance.md: `--fenced` through gateways fences every publish with the publisher's
// own leadership (docs/semantics.md#cluster-fenced-publish); every one is stored, and JetStream
// alone is not run (it has no fence to compare with).
#[tokio::test]
async fn bench_with_nats_fenced_runs_through_gateways_only() {
    let cluster = NatsCluster::start(3).await;
    let urls = cluster.client_urls().join(",");
    let (report, output) = one_report(&[
        "bench",
        "--nats",
        &urls,
        "--messages",
        "200",
        "--fenced",
        "w1",
        "--window",
        "4",
    ])
    .await;
    assert_eq!(report["deployment"], "gateways", "{report}");
    assert_eq!(report["messages"], 200, "{report}");
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("not run with --fenced"),
        "{output:?}"
    );
}

#[tokio::test]
async fn bench_with_nats_refuses_what_it_does_not_run() {
    let output = run(["bench", "--nats", "nats://127.0.0.1:1", "fill"]
        .map(String::from)
        .to_vec())
    .await;
    assert!(!output.status.success());
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(said.contains("--nats runs w1, w2 and w3"), "{said}");
    // Refused before any gateway starts: the URL reaches no server.
    for workload in ["w2", "fill"] {
        let output = run([
            "bench",
            "--nats",
            "nats://127.0.0.1:1",
            "--jetstream-msg-ids",
            workload,
        ]
        .map(String::from)
        .to_vec())
        .await;
        assert!(!output.status.success(), "{workload}");
        let said = String::from_utf8_lossy(&output.stderr);
        assert!(
            said.contains("--jetstream-msg-ids sets how JetStream alone publishes"),
            "{workload}: {said}"
        );
    }
}

// w2 through two gateways: replicas alternate between them, every kill promotes across, and
// every publish reaches a replica. JetStream alone has no such workload, and the bench says so.
#[tokio::test]
async fn bench_with_nats_runs_w2_across_gateways() {
    let cluster = NatsCluster::start(3).await;
    let urls = cluster.client_urls().join(",");
    let args = [
        "bench",
        "--nats",
        &urls,
        "w2",
        "--kills",
        "2",
        "--interval",
        "300ms",
        "--rate",
        "200",
    ]
    .map(String::from)
    .to_vec();
    let output = run(args).await;
    assert!(output.status.success(), "{output:?}");
    let reports = reports(&output.stdout);
    assert_eq!(reports.len(), 1, "{reports:?}");
    let r = &reports[0];
    assert_eq!(
        (r["workload"].as_str(), r["deployment"].as_str()),
        (Some("w2"), Some("gateways")),
        "{r}"
    );
    assert_eq!(
        (r["kills"].as_u64(), r["lost"].as_u64()),
        (Some(2), Some(0)),
        "{r}"
    );
    assert!(r["messages"].as_u64().unwrap_or_default() > 0, "{r}");
    assert!(
        r["gap_max_ms"].as_f64().unwrap_or(f64::MAX) < 5_000.0,
        "{r}"
    );
    // A leadership watcher at the publishers' gateway was told of every promotion.
    let told = r["watch_gap_max_ms"].as_f64().unwrap_or(f64::MAX);
    assert!(told > 0.0 && told < 5_000.0, "{r}");
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("w2 straight on JetStream: not run"),
        "{output:?}"
    );
}

/// `bench --nats-core`: w3 on plain NATS core, a report of the same shape with every delivery
/// either counted as arrived or as dropped.
#[tokio::test]
async fn bench_with_nats_core_runs_w3_and_accounts_for_every_delivery() {
    let cluster = NatsCluster::start(1).await;
    let url = cluster.client_urls()[0].clone();
    let (report, _) = one_report(&[
        "bench",
        "--nats-core",
        &url,
        "--messages",
        "500",
        "w3",
        "--subscribers",
        "3",
    ])
    .await;
    let r = &report;
    assert_eq!(r["workload"], "w3", "{r}");
    assert_eq!(r["deployment"], "nats-core", "{r}");
    assert_eq!(r["messages"], 500, "{r}");
    assert_eq!(r["consumers"], 3, "{r}");
    let delivered = r["delivered"].as_u64().expect("delivered");
    let dropped = r["dropped"].as_u64().expect("dropped");
    assert_eq!(delivered + dropped, 500 * 3, "{r}");
    // Each subscriber's client buffers a whole run this small, and the server's pending limit
    // (64 MiB) is far off: nothing can be dropped on loopback.
    assert_eq!(dropped, 0, "{r}");
    assert!(r["rate_per_s"].as_f64().unwrap_or_default() > 0.0, "{r}");
    assert!(
        r["publish_rate_per_s"].as_f64().unwrap_or_default() > 0.0,
        "{r}"
    );
}

#[tokio::test]
async fn bench_with_nats_core_refuses_what_it_does_not_run() {
    let output = run(["bench", "--nats-core", "nats://127.0.0.1:1", "w1"]
        .map(String::from)
        .to_vec())
    .await;
    assert!(!output.status.success());
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(said.contains("--nats-core runs w3 only"), "{said}");
}

// docs/performance.md#elections-at-scale: w4 through two gateways joins every subscription at
// both (active at one, standby at the other), and after the SIGKILL of the first elector the
// second leads every one; it reports joins a second, promotion times, and RSS and idle CPU.
#[tokio::test]
async fn bench_with_nats_runs_w4_elections_across_gateways() {
    let cluster = NatsCluster::start(3).await;
    let urls = cluster.client_urls().join(",");
    let args = ["bench", "--nats", &urls, "w4", "--subscriptions", "20"]
        .map(String::from)
        .to_vec();
    let output = run(args).await;
    assert!(output.status.success(), "{output:?}");
    let reports = reports(&output.stdout);
    assert_eq!(reports.len(), 1, "{reports:?}");
    let r = &reports[0];
    assert_eq!(
        (
            r["workload"].as_str(),
            r["deployment"].as_str(),
            r["subscriptions"].as_u64()
        ),
        (Some("w4"), Some("gateways"), Some(20)),
        "{r}"
    );
    for rate in ["joins_per_s", "standby_joins_per_s"] {
        assert!(r[rate].as_f64().unwrap_or_default() > 0.0, "{rate}: {r}");
    }
    let (median, all) = (
        r["promote_median_ms"].as_f64().unwrap_or(f64::MAX),
        r["promote_all_ms"].as_f64().unwrap_or(f64::MAX),
    );
    assert!(median <= all && all < 15_000.0, "{r}");
    assert!(
        r["broker_rss_bytes"].as_u64().unwrap_or_default() > 0,
        "{r}"
    );
    assert!(r["broker_idle_cores"].as_f64().is_some(), "{r}");
}
