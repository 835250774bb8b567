//! `tinybroker publish` and `tinybroker subscribe`: a command-line client, enough to watch a
//! failover by hand.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use tinybroker::pb::{self, DeliveryMode, broker_client::BrokerClient, subscription_frame::Frame};
use tonic::{
    Request, Status,
    metadata::AsciiMetadataValue,
    service::{Interceptor, interceptor::InterceptedService},
    transport::{Certificate, Channel, ClientTlsConfig, Identity},
};

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

/// Adds `authorization: Bearer <token>` to every call.
#[derive(Clone)]
pub struct Bearer(Option<AsciiMetadataValue>);

impl Interceptor for Bearer {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// A Broker client with the connection's token attached.
pub type Client = BrokerClient<InterceptedService<Channel, Bearer>>;

impl Connection {
    /// Connects to the broker.
    pub async fn connect(&self) -> Result<Client, String> {
        let mut endpoint = Channel::from_shared(self.server.clone())
            .map_err(|e| format!("bad --server {:?}: {e}", self.server))?;
        if let Some(tls) = self.tls()? {
            endpoint = endpoint
                .tls_config(tls)
                .map_err(|e| format!("TLS settings: {e}"))?;
        }
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| format!("cannot connect to {}: {e}", self.server))?;
        let token = match &self.token_file {
            Some(path) => {
                let text = String::from_utf8(read_file(path)?)
                    .map_err(|_| format!("{}: the token must be UTF-8 text", path.display()))?;
                Some(text.trim().to_string())
            }
            None => self.token.clone(),
        };
        let token = match &token {
            Some(t) => Some(
                format!("Bearer {t}")
                    .parse()
                    .map_err(|_| "the token must be printable ASCII".to_string())?,
            ),
            None => None,
        };
        Ok(BrokerClient::with_interceptor(channel, Bearer(token)))
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

fn describe(status: Status) -> String {
    format!("{:?}: {}", status.code(), status.message())
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
    let mut client = args.connection.connect().await?;
    let reply = client
        .publish(pb::PublishRequest {
            topic: args.topic,
            payload: args.payload.into_bytes().into(),
            headers: args.headers.into_iter().collect(),
        })
        .await
        .map_err(describe)?
        .into_inner();
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

/// Exit code of `subscribe` when the broker ended the stream because it is shutting down.
pub const EXIT_BROKER_SHUTDOWN: u8 = 3;

/// How a `subscribe` session ended without a client-side error.
pub enum SubscribeEnd {
    /// The broker closed the stream normally.
    Ended,
    /// The broker is shutting down (the stream ended with `UNAVAILABLE`, or the connection
    /// closed under it).
    BrokerShutdown,
}

pub async fn subscribe(args: Subscribe) -> Result<SubscribeEnd, String> {
    let mut client = args.connection.connect().await?;
    let mode = match args.mode {
        ModeArg::Broadcast => DeliveryMode::Broadcast,
        ModeArg::Queue => DeliveryMode::Queue,
        ModeArg::Singleton => DeliveryMode::Singleton,
    };
    let mut stream = client
        .subscribe(pb::OpenSubscription {
            subscription_id: args.id.clone(),
            topic_patterns: args.patterns,
            mode: mode.into(),
            consumer_group: args.group,
            max_in_flight: args.max_in_flight,
            max_delivery_attempts: args.max_delivery_attempts,
            dead_letter_topic: args.dead_letter_topic,
            notify_standby: args.notify_standby,
            ..Default::default()
        })
        .await
        .map_err(describe)?
        .into_inner();
    println!("joined subscription={} (waiting to be confirmed)", args.id);
    let mut member_id = 0;
    loop {
        let frame = match stream.message().await {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(status) if status.code() == tonic::Code::Unavailable => {
                println!("broker shutting down");
                return Ok(SubscribeEnd::BrokerShutdown);
            }
            Err(status) => return Err(describe(status)),
        };
        match frame.frame {
            Some(Frame::Confirmation(c)) => {
                member_id = c.member_id;
                println!(
                    "confirmed subscription={} member={} epoch={} (active)",
                    c.subscription_id, c.member_id, c.epoch
                );
            }
            Some(Frame::Standby(s)) => println!(
                "standby subscription={} member={} position={}",
                s.subscription_id, s.member_id, s.position
            ),
            Some(Frame::Message(m)) => {
                println!(
                    "message system_id={} topic={} attempt={} epoch={} payload={:?}",
                    m.system_id,
                    m.topic,
                    m.delivery_attempt,
                    m.epoch,
                    String::from_utf8_lossy(&m.payload)
                );
                if !args.no_ack {
                    client
                        .ack(pb::Ack {
                            subscription_id: args.id.clone(),
                            system_id: m.system_id,
                            member_id,
                        })
                        .await
                        .map_err(describe)?;
                    println!("acked system_id={}", m.system_id);
                }
            }
            // Refusals only come on Consume streams; this client uses Subscribe.
            Some(Frame::Refused(_)) | None => {}
        }
    }
    println!("stream ended");
    Ok(SubscribeEnd::Ended)
}
