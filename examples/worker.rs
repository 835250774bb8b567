//! A queue worker (SPEC §3 `DELIVERY_MODE_QUEUE`): competing consumers share the messages of
//! `jobs.>`, each acked after it is processed; a worker that dies mid-job has its message
//! redelivered to another with `attempt` + 1.
//!
//! ```sh
//! cargo run --example worker            # in two terminals
//! tinybroker publish jobs.email 'send the welcome mail'
//! ```
//!
//! Flags: `--server URL` (default `http://127.0.0.1:50051`, env `TINYBROKER_SERVER`),
//! `--window N` (unacked messages per worker, default 1), `--token TOKEN`
//! (env `TINYBROKER_AUTH_TOKEN`).

use std::process::ExitCode;

use tinybroker::client::{Client, ClientOptions, SubscriptionOptions};

#[tokio::main]
async fn main() -> ExitCode {
    let mut server =
        std::env::var("TINYBROKER_SERVER").unwrap_or_else(|_| "http://127.0.0.1:50051".into());
    let mut token = std::env::var("TINYBROKER_AUTH_TOKEN").ok();
    let mut window = 1;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next();
        match (flag.as_str(), value) {
            ("--server", Some(v)) => server = v,
            ("--token", Some(v)) => token = Some(v),
            ("--window", Some(v)) if v.parse::<u32>().is_ok() => window = v.parse().unwrap_or(1),
            _ => {
                eprintln!("worker: usage: worker [--server URL] [--window N] [--token TOKEN]");
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
    println!("waiting for jobs on jobs.>");
    while let Some(delivery) = subscription.next_delivery().await {
        let delivery = match delivery {
            Ok(delivery) => delivery,
            Err(error) => {
                eprintln!("worker: the subscription ended: {error}");
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
    ExitCode::SUCCESS
}
