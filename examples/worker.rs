//! A queue worker (docs/semantics.md#modes `DELIVERY_MODE_QUEUE`): competing consumers share the messages of
//! `jobs.>`, each acked after it is processed; a worker that dies mid-job has its message
//! redelivered to another with `attempt` + 1. Ctrl-C stops it cleanly: it finishes the job in
//! hand, and closes its subscription, which returns once the broker has applied every ack, so
//! no job it did is done again.
//!
//! ```sh
//! cargo run --example worker            # in two terminals
//! cargo run --example worker -- --server http://127.0.0.1:50051 --window 8
//! tinybroker publish jobs.email 'send the welcome mail'
//! ```
//!
//! Start the workers first: a message published while no subscription matches its topic is not
//! kept (`queued_for` is 0).
//!
//! Flags: `--server URL` (default `http://127.0.0.1:50051`, env `TINYBROKER_SERVER`),
//! `--window N` (unacked messages per worker, default 1), `--token TOKEN`
//! (env `TINYBROKER_AUTH_TOKEN`), `--help`. The Python example
//! `clients/python/examples/worker.py` shares the same queue.

use std::process::ExitCode;

use tinybroker::client::{Client, ClientOptions, SubscriptionOptions};

const USAGE: &str = "\
usage: worker [--server URL] [--window N] [--token TOKEN]

  --server URL    broker URL (default http://127.0.0.1:50051, env TINYBROKER_SERVER)
  --window N      unacked messages this worker may hold (default 1)
  --token TOKEN   bearer token (env TINYBROKER_AUTH_TOKEN)
  --help          print this and exit
";

fn main() -> ExitCode {
    run(std::env::args().skip(1).collect())
}

/// Runs the worker with `flags` as given on the command line: exit code 0 after a Ctrl-C with
/// every ack applied (or after printing the usage for `--help`), 2 for bad flags, 1 when the
/// broker cannot be reached or ends the stream.
pub fn run(flags: Vec<String>) -> ExitCode {
    if flags.iter().any(|f| f == "--help" || f == "-h") {
        print!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime.block_on(work(flags)),
        Err(error) => {
            eprintln!("worker: cannot start the runtime: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn work(flags: Vec<String>) -> ExitCode {
    let mut server =
        std::env::var("TINYBROKER_SERVER").unwrap_or_else(|_| "http://127.0.0.1:50051".into());
    let mut token = std::env::var("TINYBROKER_AUTH_TOKEN").ok();
    let mut window = 1;
    let mut it = flags.into_iter();
    while let Some(flag) = it.next() {
        let value = it.next();
        match (flag.as_str(), value) {
            ("--server", Some(v)) => server = v,
            ("--token", Some(v)) => token = Some(v),
            ("--window", Some(v)) if v.parse::<u32>().is_ok() => window = v.parse().unwrap_or(1),
            _ => {
                eprint!("worker: {USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let options = ClientOptions {
        token,
        ..ClientOptions::default()
    };
    let client = match Client::connect_with(server.clone(), options).await {
        Ok(client) => client,
        Err(error) => {
            eprintln!("worker: cannot reach the broker at {server}: {error}");
            return ExitCode::FAILURE;
        }
    };
    let jobs = SubscriptionOptions::queue("jobs", "workers", ["jobs.>"]).max_in_flight(window);
    let mut subscription = match client.subscribe(jobs).await {
        Ok(subscription) => subscription,
        Err(error) => {
            eprintln!("worker: cannot subscribe: {error}");
            return ExitCode::FAILURE;
        }
    };
    let member = match subscription.active().await {
        Ok(member) => member,
        Err(error) => {
            eprintln!("worker: the subscription ended: {error}");
            return ExitCode::FAILURE;
        }
    };
    println!("waiting for jobs on jobs.> as member {}", member.member_id);
    // Created once: a Ctrl-C that comes while a job runs is seen at the next wait, after its
    // ack.
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        let delivery = tokio::select! {
            _ = &mut ctrl_c => break,
            delivery = subscription.next_delivery() => delivery,
        };
        let delivery = match delivery {
            Some(Ok(delivery)) => delivery,
            Some(Err(error)) => {
                eprintln!("worker: the subscription ended: {error}");
                return ExitCode::FAILURE;
            }
            None => {
                eprintln!("worker: the broker ended the subscription");
                return ExitCode::FAILURE;
            }
        };
        // The work. It must be idempotent: a redelivery (attempt > 1) may repeat it.
        println!(
            "job system_id={} topic={} attempt={} payload={:?}",
            delivery.system_id,
            delivery.topic,
            delivery.attempt,
            String::from_utf8_lossy(&delivery.payload)
        );
        if let Err(error) = delivery.ack() {
            eprintln!("worker: {error}");
            return ExitCode::FAILURE;
        }
    }
    // `ack` only queued the acks; returning now could lose the last ones, and the broker would
    // hand those jobs to another worker.
    match subscription.close().await {
        Ok(()) => {
            println!("stopped; every ack applied");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("worker: closing: {error}");
            ExitCode::FAILURE
        }
    }
}
