//! The `tinybroker` binary: `serve` runs the broker; `publish`, `subscribe` and `bench` are small
//! clients for trying it out and measuring it; `status` is the operator's view.

mod cli;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(
    name = "tinybroker",
    version,
    about = "A single-node, in-memory gRPC message broker"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the broker.
    Serve(cli::serve::Serve),
    /// Publish one message.
    Publish(cli::client::Publish),
    /// Join a subscription and print every frame; acks each message unless --no-ack.
    Subscribe(cli::client::Subscribe),
    /// Show subscriptions, members in promotion order, epochs, depths and counters.
    Status(cli::status::Status),
    /// Load generator: publishers and ack-each consumers against a broker, reports msg/s.
    Bench(cli::bench::Bench),
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let Cli { command } = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(error) => {
            eprintln!("tinybroker: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match command {
            Command::Serve(args) => cli::serve::run(args).await,
            Command::Publish(args) => cli::client::publish(args).await,
            Command::Subscribe(args) => cli::client::subscribe(args).await,
            Command::Status(args) => cli::status::run(args).await,
            Command::Bench(args) => cli::bench::run(args).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("tinybroker: {error}");
            ExitCode::FAILURE
        }
    }
}
