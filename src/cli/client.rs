//! `tinybroker publish` and `tinybroker subscribe`: a command-line client, enough to watch a
//! failover by hand.

use clap::{Args, ValueEnum};
use tinybroker::client::{self, ClientOptions, Event, Message, SubscriptionOptions};

/// Where the broker is and how to authenticate.
#[derive(Args, Clone)]
pub struct Connection {
    /// Broker URL.
    #[arg(
        long,
        env = "TINYBROKER_SERVER",
        default_value = "http://127.0.0.1:50051"
    )]
    pub server: String,
    /// Bearer token, if the broker requires one.
    #[arg(long, env = "TINYBROKER_AUTH_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

/// The generated client with the token attached, for `bench` (which drives the raw RPCs).
pub type Client = client::RawClient;

impl Connection {
    /// Connects with the library client and its defaults (keepalive on).
    ///
    /// # Errors
    /// "cannot reach the broker at URL: ..." when it cannot be reached.
    pub async fn client(&self) -> Result<client::Client, String> {
        let options = ClientOptions {
            token: self.token.clone(),
            ..ClientOptions::default()
        };
        client::Client::connect_with(self.server.clone(), options)
            .await
            .map_err(|e| format!("cannot reach the broker at {}: {e}", self.server))
    }

    /// Connects and hands back the generated client (see [`Client`]).
    ///
    /// # Errors
    /// As [`Connection::client`].
    pub async fn connect(&self) -> Result<Client, String> {
        Ok(self.client().await?.raw())
    }
}

#[derive(Args)]
pub struct Publish {
    #[command(flatten)]
    connection: Connection,
    /// Topic, e.g. schedule.daily.report.
    topic: String,
    /// Payload (UTF-8 text).
    #[arg(default_value = "")]
    payload: String,
    /// Header as KEY=VALUE; repeatable.
    #[arg(long = "header", value_parser = parse_header)]
    headers: Vec<(String, String)>,
}

fn parse_header(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("{text:?} is not KEY=VALUE"))
}

pub async fn publish(args: Publish) -> Result<(), String> {
    let client = args.connection.client().await?;
    let mut message = Message::new(args.topic, args.payload.into_bytes());
    message.headers = args.headers.into_iter().collect();
    let reply = client.publish(message).await.map_err(|e| e.to_string())?;
    println!(
        "published system_id={} queued_for={}",
        reply.system_id, reply.queued_for
    );
    Ok(())
}

#[derive(Clone, Copy, ValueEnum)]
enum ModeArg {
    Broadcast,
    Queue,
    Singleton,
}

#[derive(Args)]
pub struct Subscribe {
    #[command(flatten)]
    connection: Connection,
    /// Subscription id; streams with the same id are members of one subscription.
    #[arg(long)]
    id: String,
    /// Delivery mode.
    #[arg(long, value_enum, default_value = "singleton")]
    mode: ModeArg,
    /// Consumer group (required for queue and singleton).
    #[arg(long, default_value = "")]
    group: String,
    /// Window: unacked messages this member may hold.
    #[arg(long, default_value_t = 1)]
    max_in_flight: u32,
    /// Dead-letter after this many deliveries (0 = never).
    #[arg(long, default_value_t = 0)]
    max_delivery_attempts: u32,
    /// Where poisoned messages go.
    #[arg(long, default_value = "")]
    dead_letter_topic: String,
    /// Ask to be told when on standby, and the place in line.
    #[arg(long)]
    notify_standby: bool,
    /// Hold messages instead of acking them (to watch redelivery on failover).
    #[arg(long)]
    no_ack: bool,
    /// Topic patterns (`*` one token, `>` the rest).
    #[arg(required = true)]
    patterns: Vec<String>,
}

pub async fn subscribe(args: Subscribe) -> Result<(), String> {
    let client = args.connection.client().await?;
    let mut options = match args.mode {
        ModeArg::Broadcast => SubscriptionOptions::broadcast(&args.id, args.patterns),
        ModeArg::Queue => SubscriptionOptions::queue(&args.id, args.group, args.patterns),
        ModeArg::Singleton => SubscriptionOptions::singleton(&args.id, args.group, args.patterns),
    }
    .max_in_flight(args.max_in_flight)
    .max_delivery_attempts(args.max_delivery_attempts)
    .notify_standby(args.notify_standby);
    if !args.dead_letter_topic.is_empty() {
        options = options.dead_letter_topic(args.dead_letter_topic);
    }
    let mut subscription = client.subscribe(options).await.map_err(|e| e.to_string())?;
    println!("joined subscription={} (waiting to be confirmed)", args.id);
    // Held messages stay in flight until the stream ends (to watch redelivery on failover).
    let mut held = Vec::new();
    while let Some(event) = subscription.next_event().await {
        match event.map_err(|e| e.to_string())? {
            Event::Active { member_id, epoch } => println!(
                "confirmed subscription={} member={member_id} epoch={epoch} (active)",
                args.id
            ),
            Event::Standby {
                member_id,
                position,
            } => println!(
                "standby subscription={} member={member_id} position={position}",
                args.id
            ),
            Event::Delivery(m) => {
                println!(
                    "message system_id={} topic={} attempt={} epoch={} payload={:?}",
                    m.system_id,
                    m.topic,
                    m.attempt,
                    m.epoch,
                    String::from_utf8_lossy(&m.payload)
                );
                if args.no_ack {
                    held.push(m);
                } else {
                    let system_id = m.system_id;
                    m.ack().map_err(|e| e.to_string())?;
                    println!("acked system_id={system_id}");
                }
            }
            Event::Refused {
                system_id,
                nack,
                error,
            } => println!(
                "refused {} system_id={system_id}: {error}",
                if nack { "nack" } else { "ack" }
            ),
        }
    }
    println!("stream ended");
    Ok(())
}
