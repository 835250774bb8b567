//! Two replicas of `examples/scheduler.rs` as real processes: the leader is killed with SIGKILL
//! and the other takes over with a higher epoch within the failover bound; and the broker itself,
//! a `tinybroker serve` process, is killed with SIGKILL and started again, twice, and each new
//! leader's epoch is above every earlier one (docs/semantics.md#singleton).
//!
//! Cargo does not build examples for `cargo test --test client`, so the example's source is
//! compiled into this test binary and the test re-executes the binary as each replica.

use std::{
    io::{BufRead, BufReader},
    path::PathBuf,
    process::{Child, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use tokio::sync::mpsc;

use crate::harness::{TestServer, within};

#[allow(dead_code)]
#[path = "../../examples/scheduler.rs"]
mod scheduler_example;

/// Set in a child process: the scheduler's flags, space-separated.
const CHILD_FLAGS: &str = "TINYBROKER_TEST_SCHEDULER_FLAGS";
/// The test a child process runs.
const CHILD_TEST: &str = "scheduler::scheduler_example_entry_point";

/// How long after the SIGKILL the standby must be leading (docs/semantics.md#singleton: promotion is immediate
/// when the stream closes; the bound leaves room for a loaded machine).
const FAILOVER_BOUND: Duration = Duration::from_secs(5);

// The entry point of the replica processes. Run by itself (no flags in the environment) it
// checks that the example refuses a bad flag with exit code 2 and answers `--help` with 0.
#[test]
fn scheduler_example_entry_point() {
    match std::env::var(CHILD_FLAGS) {
        Ok(flags) => {
            let code = scheduler_example::run(flags.split(' ').map(String::from).collect());
            // Only errors return; report them as the process's exit status.
            eprintln!("scheduler returned {code:?}");
            std::process::exit(1);
        }
        Err(_) => {
            let code = scheduler_example::run(vec!["--bogus".into()]);
            assert_eq!(code, std::process::ExitCode::from(2));
            let code = scheduler_example::run(vec!["--help".into()]);
            assert_eq!(code, std::process::ExitCode::SUCCESS);
        }
    }
}

/// A child process, killed (SIGKILL: no goodbye on the wire) and reaped when dropped.
struct Process(Child);

impl Process {
    fn kill(&mut self) -> ExitStatus {
        self.0.kill().unwrap();
        self.0.wait().unwrap()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a replica process whose stdout lines go to `tx`, each tagged with `tag`.
fn spawn_replica<T: Clone + Send + 'static>(
    flags: &str,
    tag: T,
    tx: mpsc::UnboundedSender<(T, String)>,
) -> Process {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([CHILD_TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_FLAGS, flags)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    // Blocking reads on a thread of their own; the channel hands lines to the test.
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send((tag.clone(), line)).is_err() {
                break;
            }
        }
    });
    Process(child)
}

/// Awaits a line containing `prefix`; returns its tag and what follows the prefix. (Contains,
/// not starts with: a child's first line follows libtest's own `test ... ` on the same line.)
async fn line_after<T>(
    lines: &mut mpsc::UnboundedReceiver<(T, String)>,
    prefix: &str,
) -> (T, String) {
    loop {
        let (tag, line) = lines
            .recv()
            .await
            .unwrap_or_else(|| panic!("the replicas exited before printing {prefix:?}"));
        if let Some(at) = line.find(prefix) {
            return (tag, line[at + prefix.len()..].to_string());
        }
    }
}

/// A replica process and its stdout lines.
struct Replica {
    process: Process,
    lines: mpsc::UnboundedReceiver<((), String)>,
}

impl Replica {
    fn start(flags: &str) -> Self {
        let (tx, lines) = mpsc::unbounded_channel();
        let process = spawn_replica(flags, (), tx);
        Self { process, lines }
    }

    /// Awaits a line containing `prefix` and returns what follows it.
    async fn line(&mut self, prefix: &str) -> String {
        line_after(&mut self.lines, prefix).await.1
    }

    fn kill(&mut self) -> ExitStatus {
        self.process.kill()
    }
}

/// `"3 member=7"` → 3.
fn epoch_of(rest: &str) -> u64 {
    rest.split_whitespace().next().unwrap().parse().unwrap()
}

// docs/semantics.md#singleton: exactly one replica runs the job; SIGKILL on the leader promotes the standby with a
// strictly higher epoch within the failover bound, and the epoch-fenced store only ever sees
// epochs go up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_scheduler_leader_is_replaced_by_the_standby_with_a_higher_epoch() {
    let server = TestServer::start().await;
    let store: PathBuf = std::env::temp_dir().join(format!(
        "tinybroker-scheduler-test-{}.log",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&store);
    let flags = format!(
        "--server http://{} --group replicas --every-ms 50 --store {}",
        server.addr,
        store.display()
    );

    let mut first = Replica::start(&flags);
    let first_epoch = epoch_of(&within(first.line("leading epoch=")).await);
    within(first.line(&format!("epoch={first_epoch} run=2"))).await;
    let mut second = Replica::start(&flags);
    assert_eq!(within(second.line("standby position=")).await, "1");

    let killed_at = Instant::now();
    let status = first.kill();
    assert!(!status.success());
    let second_epoch = epoch_of(
        &tokio::time::timeout(FAILOVER_BOUND, second.line("leading epoch="))
            .await
            .expect("the standby did not take over within the failover bound"),
    );
    let failover = killed_at.elapsed();
    assert!(second_epoch > first_epoch, "{second_epoch} > {first_epoch}");
    within(second.line(&format!("epoch={second_epoch} run=2"))).await;

    let text = std::fs::read_to_string(&store).unwrap();
    let epochs: Vec<u64> = text
        .lines()
        // A replica killed mid-write may leave a torn last line: read whole lines only.
        .filter_map(|l| l.strip_prefix("epoch=")?.split(' ').next()?.parse().ok())
        .collect();
    assert!(epochs.windows(2).all(|w| w[0] <= w[1]), "{epochs:?}");
    assert_eq!(epochs.last(), Some(&second_epoch));
    let _ = std::fs::remove_file(&store);
    eprintln!("failover after SIGKILL took {failover:?}");
}

/// Starts `tinybroker serve` on `addr` and waits until it listens.
async fn serve(addr: &str) -> Process {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tinybroker"))
        .args(["serve", "--listen", addr])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, listening) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        // Keep draining its log so it never blocks on a full pipe.
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("listening on ")
                && let Some(tx) = tx.take()
            {
                let _ = tx.send(());
            }
        }
    });
    let process = Process(child);
    within(listening)
        .await
        .expect("the broker exited before it listened");
    process
}

/// The epochs in the store's whole lines, in order.
fn store_epochs(store: &PathBuf) -> Vec<u64> {
    std::fs::read_to_string(store)
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("epoch=")?.split(' ').next()?.parse().ok())
        .collect()
}

// docs/semantics.md#restart-identity, "strictly increasing, also across broker restarts": the broker process is killed with
// SIGKILL and started again on the same address, twice, while two scheduler replicas run. Each
// time they rejoin by themselves, the one that leads has an epoch above every earlier leader's,
// and the fenced store takes its writes: it sees one epoch per broker run, strictly increasing,
// and no leader's token is ever reused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduler_store_sees_strictly_increasing_epochs_across_broker_restarts() {
    let addr = {
        // A free port to come back to.
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().to_string()
    };
    let store: PathBuf = std::env::temp_dir().join(format!(
        "tinybroker-scheduler-restart-test-{}.log",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&store);
    let flags = format!(
        "--server http://{addr} --group restarts --every-ms 50 --store {}",
        store.display()
    );

    let mut broker = serve(&addr).await;
    let (tx, mut lines) = mpsc::unbounded_channel();
    let _replicas = [
        spawn_replica(&flags, 'a', tx.clone()),
        spawn_replica(&flags, 'b', tx),
    ];
    let (_, rest) = within(line_after(&mut lines, "leading epoch=")).await;
    let mut epochs = vec![epoch_of(&rest)];
    within(line_after(
        &mut lines,
        &format!("epoch={} run=2", epochs[0]),
    ))
    .await;

    for restart in 1..=2 {
        assert!(!broker.kill().success());
        broker = serve(&addr).await;
        // Leaders of the killed broker print `lost` and rejoin; the first `leading` after the
        // restart is the new broker's.
        let (leader, rest) = within(line_after(&mut lines, "leading epoch=")).await;
        let epoch = epoch_of(&rest);
        let before = *epochs.last().unwrap();
        assert!(
            epoch > before,
            "restart {restart}: replica {leader} leads with epoch {epoch}, not above {before}"
        );
        epochs.push(epoch);
        // The store takes the new leader's writes at once.
        within(line_after(&mut lines, &format!("epoch={epoch} run=2"))).await;
    }

    let mut seen = store_epochs(&store);
    assert!(seen.windows(2).all(|w| w[0] <= w[1]), "{seen:?}");
    seen.dedup();
    assert_eq!(seen, epochs, "one leader per broker run, in order");
    let _ = std::fs::remove_file(&store);
}

// A store that fails to take a write for a reason other than the fence (here its directory does
// not exist yet: a missing mount, a full disk, a permission) is not a deposition. The leader must
// not sit on the leadership forever running nothing: once the store can take writes again the
// job must run again (on this replica or a successor). The example instead awaits `lost`, which
// never comes while the broker keeps it active: the job stops for good on every replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduler_store_io_error_does_not_stop_the_job_forever() {
    let server = TestServer::start().await;
    let dir: PathBuf = std::env::temp_dir().join(format!(
        "tinybroker-scheduler-io-error-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let store = dir.join("report.log");
    let flags = format!(
        "--server http://{} --group io-error --every-ms 50 --store {}",
        server.addr,
        store.display()
    );
    let mut leader = Replica::start(&flags);
    let epoch = epoch_of(&within(leader.line("leading epoch=")).await);
    // The first write fails: the store's directory is missing.
    within(leader.line(&format!("failed epoch={epoch} run=1"))).await;
    // The store comes back.
    std::fs::create_dir_all(&dir).unwrap();
    let resumed = tokio::time::timeout(FAILOVER_BOUND, async {
        loop {
            let line = leader.line("").await;
            if line.contains(" run=") && line.starts_with("epoch=") {
                return line;
            }
        }
    })
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        resumed.is_ok(),
        "the store took writes again but no replica ran the job within {FAILOVER_BOUND:?}: \
         the leader waits for a deposition that an I/O error never brings"
    );
}

// The epoch fence must fail closed. A store the scheduler cannot read as UTF-8 (one stray byte,
// e.g. from another writer or a corrupted block) holding a higher epoch than this leader's is
// read as empty (`read_to_string(..).unwrap_or_default()`), so the fence sees epoch 0 and a
// deposed leader's write goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduler_fence_refuses_a_lower_epoch_even_if_the_store_has_a_non_utf8_byte() {
    let server = TestServer::start().await;
    let store: PathBuf = std::env::temp_dir().join(format!(
        "tinybroker-scheduler-fence-utf8-{}.log",
        std::process::id()
    ));
    // A successor's epoch far above any this broker hands out, then a stray byte.
    std::fs::write(&store, b"epoch=9000000000000000 run=1\n\xff\n").unwrap();
    let flags = format!(
        "--server http://{} --group fence-utf8 --every-ms 50 --store {}",
        server.addr,
        store.display()
    );
    let mut leader = Replica::start(&flags);
    let epoch = epoch_of(&within(leader.line("leading epoch=")).await);
    assert!(epoch < 9_000_000_000_000_000);
    let outcome = within(async {
        loop {
            let line = leader.line("").await;
            if line.contains("refused epoch=") || line.starts_with(&format!("epoch={epoch} run=1"))
            {
                return line;
            }
        }
    })
    .await;
    let text = std::fs::read(&store).unwrap();
    let _ = std::fs::remove_file(&store);
    assert!(
        outcome.contains("refused"),
        "a leader with epoch {epoch} wrote past a store holding epoch 9000000000000000: {outcome:?}; store now {:?}",
        String::from_utf8_lossy(&text)
    );
}

// The fence fails closed on anything it cannot parse, not only on a stray byte after a valid
// line: a store that is garbage, not UTF-8, has a non-numeric epoch, holds an epoch in another
// format (`1796151620428999 1`: an epoch without `epoch=`), or ends in a line cut short, takes no
// write; only a missing store counts as empty. Each leader says `failed` (and tries again at the
// next tick), and the store keeps its bytes. (The example's election id is always `scheduler`,
// so every case uses one group: a subscription's settings outlive its members.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduler_store_that_cannot_be_parsed_fails_closed() {
    let server = TestServer::start().await;
    let cases: [&[u8]; 5] = [
        b"garbage\n",
        b"\xff\xfe\n",
        b"epoch=abc run=1\n",
        b"1796151620428999 1\n",
        b"epoch=5 run=1\nepoch=1",
    ];
    for (n, content) in cases.into_iter().enumerate() {
        let store: PathBuf = std::env::temp_dir().join(format!(
            "tinybroker-scheduler-fail-closed-{}-{n}.log",
            std::process::id()
        ));
        std::fs::write(&store, content).unwrap();
        let flags = format!(
            "--server http://{} --group fail-closed --every-ms 50 --store {}",
            server.addr,
            store.display()
        );
        let mut leader = Replica::start(&flags);
        let epoch = epoch_of(&within(leader.line("leading epoch=")).await);
        let first_run = within(async {
            loop {
                let line = leader.line("").await;
                if line.contains(&format!("epoch={epoch} run=1")) {
                    return line;
                }
            }
        })
        .await;
        let after = std::fs::read(&store).unwrap();
        let _ = std::fs::remove_file(&store);
        assert!(
            first_run.starts_with("failed") && first_run.contains("cannot parse the store"),
            "store {:?}: the leader ran the job: {first_run:?}",
            String::from_utf8_lossy(content)
        );
        assert_eq!(
            after, content,
            "the store took a write past what it cannot parse"
        );
        leader.kill();
    }
}
