//! `tinybroker publish` and `tinybroker subscribe`: a command-line client, enough to watch a
//! failover by hand.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use tinybroker::client::{self, ClientOptions, Event, Message, SubscriptionOptions};
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

/// Where the broker is and how to authenticate.
#[derive(Args, Clone, Default)]
pub struct Connection {
    /// Broker URL; `https://` talks TLS (give --ca-cert).
    #[arg(
        long,
        env = "TINYBROKER_SERVER",
        default_value = "http://127.0.0.1:50051"
    )]
    pub server: String,
    /// Bearer token, if the broker requires one [default: none].
    #[arg(long, env = "TINYBROKER_AUTH_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Read the bearer token from this file (trailing newline trimmed) [default: none].
    #[arg(long, env = "TINYBROKER_AUTH_TOKEN_FILE", conflicts_with = "token")]
    pub token_file: Option<PathBuf>,
    /// PEM CA certificate that signed the broker's certificate (TLS) [default: none].
    #[arg(long, env = "TINYBROKER_CA_CERT")]
    pub ca_cert: Option<PathBuf>,
    /// PEM client certificate, for a broker that requires mutual TLS (needs --client-key)
    /// [default: none].
    #[arg(long, env = "TINYBROKER_CLIENT_CERT", requires = "client_key")]
    pub client_cert: Option<PathBuf>,
    /// PEM private key for --client-cert [default: none].
    #[arg(long, env = "TINYBROKER_CLIENT_KEY", requires = "client_cert")]
    pub client_key: Option<PathBuf>,
}

fn read_file(path: &PathBuf) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))
}

/// The generated client with the token attached, for `bench` (which drives the raw RPCs).
pub type Client = client::RawClient;

impl Connection {
    /// Connects with the library client and its defaults (keepalive on).
    ///
    /// # Errors
    /// "cannot reach the broker at URL: ..." when it cannot be reached, or unreadable TLS or
    /// token files.
    pub async fn client(&self) -> Result<client::Client, String> {
        let token = match &self.token_file {
            Some(path) => {
                let text = String::from_utf8(read_file(path)?)
                    .map_err(|_| format!("{}: the token must be UTF-8 text", path.display()))?;
                Some(text.trim().to_string())
            }
            None => self.token.clone(),
        };
        let options = ClientOptions {
            token,
            tls: self.tls()?,
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

    /// TLS settings when the URL is `https://` or any TLS file is given; the broker's
    /// certificate is checked against --ca-cert only (no system roots are compiled in).
    fn tls(&self) -> Result<Option<ClientTlsConfig>, String> {
        let https = self.server.starts_with("https://");
        if !https && self.ca_cert.is_none() && self.client_cert.is_none() {
            return Ok(None);
        }
        let mut tls = ClientTlsConfig::new();
        if let Some(ca) = &self.ca_cert {
            tls = tls.ca_certificate(Certificate::from_pem(read_file(ca)?));
        }
        if let (Some(cert), Some(key)) = (&self.client_cert, &self.client_key) {
            tls = tls.identity(Identity::from_pem(read_file(cert)?, read_file(key)?));
        }
        Ok(Some(tls))
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

#[derive(Args)]
pub struct Delete {
    #[command(flatten)]
    connection: Connection,
    /// Subscription id to delete; no member may be joined to it (docs/semantics.md#deleting).
    id: String,
}

/// `tinybroker delete ID`: prints what was discarded, or why nothing was deleted.
pub async fn delete(args: Delete) -> Result<(), String> {
    let client = args.connection.client().await?;
    let id = &args.id;
    match client.delete_subscription(id).await {
        Ok(discarded) => {
            println!(
                "deleted subscription {id:?}: {discarded} message(s) discarded; its id can be joined again with new settings"
            );
            Ok(())
        }
        Err(client::Error::FailedPrecondition(why)) => Err(format!(
            "subscription {id:?} was not deleted (close its members' streams first): {why}"
        )),
        Err(client::Error::NotFound(why)) => {
            Err(format!("no subscription {id:?} to delete: {why}"))
        }
        Err(client::Error::InvalidArgument(why)) => {
            Err(format!("invalid subscription id {id:?}: {why}"))
        }
        Err(e) => Err(format!("subscription {id:?} was not deleted: {e}")),
    }
}

#[derive(Args)]
pub struct HandOver {
    #[command(flatten)]
    connection: Connection,
    /// SINGLETON subscription whose active member should hand over (docs/semantics.md#hand-over).
    id: String,
}

/// `tinybroker handover ID`: asks the active member to step down at a message boundary and
/// prints who took over, or why no one did.
pub async fn hand_over(args: HandOver) -> Result<(), String> {
    let client = args.connection.client().await?;
    let id = &args.id;
    match client.hand_over(id).await {
        Ok(done) => {
            println!(
                "subscription {id:?}: member {} (epoch {}) handed over to member {} (epoch {})",
                done.previous_member_id, done.previous_epoch, done.member_id, done.epoch
            );
            Ok(())
        }
        Err(client::Error::NotFound(why)) => Err(format!("no subscription {id:?}: {why}")),
        Err(e) => Err(format!("subscription {id:?} did not hand over: {e}")),
    }
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
    /// Singleton: this member's priority; a higher one takes over from the active member at a
    /// message boundary (docs/semantics.md#priority).
    #[arg(long, default_value_t = 0)]
    priority: u32,
    /// Hold messages instead of acking them (to watch redelivery on failover).
    #[arg(long)]
    no_ack: bool,
    /// Topic patterns (`*` one token, `>` the rest).
    #[arg(required = true)]
    patterns: Vec<String>,
}

/// Exit code of `subscribe` when the broker ended the stream because it is shutting down.
pub const EXIT_BROKER_SHUTDOWN: u8 = 3;

/// How a `subscribe` session ended without a client-side error.
pub enum SubscribeEnd {
    /// The broker closed the stream normally.
    Ended,
    /// The broker is shutting down (the stream ended with `UNAVAILABLE`).
    BrokerShutdown,
}

pub async fn subscribe(args: Subscribe) -> Result<SubscribeEnd, String> {
    let client = args.connection.client().await?;
    let mut options = match args.mode {
        ModeArg::Broadcast => SubscriptionOptions::broadcast(&args.id, args.patterns),
        ModeArg::Queue => SubscriptionOptions::queue(&args.id, args.group, args.patterns),
        ModeArg::Singleton => SubscriptionOptions::singleton(&args.id, args.group, args.patterns),
    }
    .max_in_flight(args.max_in_flight)
    .max_delivery_attempts(args.max_delivery_attempts)
    .notify_standby(args.notify_standby)
    .priority(args.priority);
    if !args.dead_letter_topic.is_empty() {
        options = options.dead_letter_topic(args.dead_letter_topic);
    }
    let mut subscription = client.subscribe(options).await.map_err(|e| e.to_string())?;
    println!("joined subscription={} (waiting to be confirmed)", args.id);
    // Held messages stay in flight until the stream ends (to watch redelivery on failover).
    let mut held = Vec::new();
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        let event = tokio::select! {
            biased;
            _ = &mut ctrl_c => {
                // Acks are sent in the background: close flushes them and waits for the broker
                // to end the member, so none is lost; held messages go back to the queue.
                drop(held);
                subscription.close().await.map_err(|e| e.to_string())?;
                println!("closed: every ack applied");
                return Ok(SubscribeEnd::Ended);
            }
            event = subscription.next_event() => event,
        };
        let Some(event) = event else { break };
        let event = match event {
            Ok(event) => event,
            Err(client::Error::Unavailable(_)) => {
                println!("broker shutting down");
                return Ok(SubscribeEnd::BrokerShutdown);
            }
            Err(error) => return Err(error.to_string()),
        };
        match event {
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
            Event::SteppedDown {
                member_id,
                epoch,
                position,
            } => println!(
                "stepped down subscription={} member={member_id} epoch={epoch} ended; standby position={position}",
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
                system_ids,
                nack,
                release,
                error,
            } => println!(
                "refused {} system_ids={system_ids:?}: {error}",
                match (release, nack) {
                    (true, _) => "release",
                    (false, true) => "nack",
                    (false, false) => "ack",
                }
            ),
        }
    }
    println!("stream ended");
    Ok(SubscribeEnd::Ended)
}
