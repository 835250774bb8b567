//! The `tinybroker` binary: `serve` runs the broker; `publish`, `subscribe` and `bench` are small
//! clients for trying it out and measuring it; `status` and `delete` are the operator's.

mod cli;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "tinybroker",
    version,
    about = "A gRPC message broker with consumer groups, acks and singleton (leader-election) delivery: embedded in memory, or as gateways over NATS JetStream (serve --nats)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the broker.
    Serve(Box<cli::serve::Serve>),
    /// Publish one message.
    Publish(cli::client::Publish),
    /// Join a subscription and print every frame; acks each message unless --no-ack.
    Subscribe(cli::client::Subscribe),
    /// Delete a subscription no member is joined to (its settings and queued messages), so its
    /// id can be joined again with new settings.
    Delete(cli::client::Delete),
    /// Ask a SINGLETON subscription's active member to step down at a message boundary; the
    /// first standby in line takes over.
    #[command(name = "handover")]
    HandOver(cli::client::HandOver),
    /// Show subscriptions, members in promotion order, epochs, depths and counters.
    Status(cli::status::Status),
    /// Load generator: runs workload w1 (work queue), w2 (singleton failover), w3 (fan-out) or
    /// w4 (elections at scale).
    Bench(cli::bench::Bench),
    /// One replica of the w2 failover workload (started by `bench w2`).
    #[command(hide = true)]
    BenchReplica(cli::bench::Replica),
    /// One elector of the w4 elections workload (started by `bench w4`).
    #[command(hide = true)]
    BenchElector(cli::bench::Elector),
}

fn main() -> ExitCode {
    let Cli { command } = Cli::parse();
    cli::logging::init(match &command {
        Command::Serve(args) => args.log_format,
        _ => cli::logging::LogFormat::Text,
    });
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(error) => {
            eprintln!("tinybroker: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match command {
            Command::Serve(args) => cli::serve::run(*args).await.map(|()| ExitCode::SUCCESS),
            Command::Publish(args) => cli::client::publish(args).await.map(|()| ExitCode::SUCCESS),
            Command::Subscribe(args) => cli::client::subscribe(args).await.map(|end| match end {
                cli::client::SubscribeEnd::Ended => ExitCode::SUCCESS,
                cli::client::SubscribeEnd::BrokerShutdown => {
                    ExitCode::from(cli::client::EXIT_BROKER_SHUTDOWN)
                }
            }),
            Command::Delete(args) => cli::client::delete(args).await.map(|()| ExitCode::SUCCESS),
            Command::HandOver(args) => cli::client::hand_over(args)
                .await
                .map(|()| ExitCode::SUCCESS),
            Command::Status(args) => cli::status::run(args).await.map(|()| ExitCode::SUCCESS),
            Command::Bench(args) => cli::bench::run(args).await.map(|()| ExitCode::SUCCESS),
            Command::BenchReplica(args) => {
                cli::bench::replica(args).await.map(|()| ExitCode::SUCCESS)
            }
            Command::BenchElector(args) => {
                cli::bench::elector(args).await.map(|()| ExitCode::SUCCESS)
            }
        }
    });
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("tinybroker: {error}");
            ExitCode::FAILURE
        }
    }
}
