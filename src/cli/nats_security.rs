//! `serve --nats`'s flags for a secured NATS cluster (docs/cluster.md#securing-the-connection-to-nats):
//! one credential (a credentials file, an nkey seed, a user and password, or a token) and TLS
//! with the operator's CA and a client certificate. Secrets are read from files or the
//! environment; their flags exist, but a value given on the command line shows in `ps`.

use std::path::PathBuf;

use clap::Args;
use tinybroker::cluster::security::{NatsCredential, NatsSecurity, NatsTls, Secret};

/// No `Debug`: it holds the secrets given as values.
#[derive(Args)]
pub struct NatsSecurityArgs {
    /// Cluster mode: a NATS credentials file (the user's JWT and nkey seed, as `nsc` writes
    /// them) to connect with, for a cluster in operator mode [default: none].
    #[arg(
        long,
        env = "TINYBROKER_NATS_CREDS",
        value_name = "FILE",
        conflicts_with_all = ["nats_nkey", "nats_user", "nats_token", "nats_token_file"]
    )]
    nats_creds: Option<PathBuf>,
    /// Cluster mode: a file holding the NATS user's nkey seed (`SU…`) to connect with
    /// [default: none].
    #[arg(
        long,
        env = "TINYBROKER_NATS_NKEY",
        value_name = "FILE",
        conflicts_with_all = ["nats_user", "nats_token", "nats_token_file"]
    )]
    nats_nkey: Option<PathBuf>,
    /// Cluster mode: the NATS user to connect as; its password from --nats-password-file or
    /// TINYBROKER_NATS_PASSWORD [default: none].
    #[arg(
        long,
        env = "TINYBROKER_NATS_USER",
        conflicts_with_all = ["nats_token", "nats_token_file"]
    )]
    nats_user: Option<String>,
    /// Cluster mode: the password of --nats-user. Prefer the environment variable or
    /// --nats-password-file: a flag's value shows in the process list [default: none].
    #[arg(
        long,
        env = "TINYBROKER_NATS_PASSWORD",
        hide_env_values = true,
        requires = "nats_user"
    )]
    nats_password: Option<String>,
    /// Cluster mode: read the password of --nats-user from this file (surrounding whitespace
    /// trimmed) [default: none].
    #[arg(
        long,
        env = "TINYBROKER_NATS_PASSWORD_FILE",
        value_name = "FILE",
        requires = "nats_user",
        conflicts_with = "nats_password"
    )]
    nats_password_file: Option<PathBuf>,
    /// Cluster mode: the token to connect to NATS with. Prefer the environment variable or
    /// --nats-token-file: a flag's value shows in the process list [default: none].
    #[arg(long, env = "TINYBROKER_NATS_TOKEN", hide_env_values = true)]
    nats_token: Option<String>,
    /// Cluster mode: read the NATS token from this file (surrounding whitespace trimmed)
    /// [default: none].
    #[arg(
        long,
        env = "TINYBROKER_NATS_TOKEN_FILE",
        value_name = "FILE",
        conflicts_with = "nats_token"
    )]
    nats_token_file: Option<PathBuf>,
    /// Cluster mode: PEM CA certificate(s) the NATS servers' certificates must chain to; TLS is
    /// then required [default: the system's roots, when the servers or a tls:// URL ask for
    /// TLS].
    #[arg(long, env = "TINYBROKER_NATS_TLS_CA", value_name = "FILE")]
    nats_tls_ca: Option<PathBuf>,
    /// Cluster mode: PEM client certificate chain to present to the NATS servers (mutual TLS;
    /// needs --nats-tls-key); TLS is then required [default: none].
    #[arg(
        long,
        env = "TINYBROKER_NATS_TLS_CERT",
        value_name = "FILE",
        requires = "nats_tls_key"
    )]
    nats_tls_cert: Option<PathBuf>,
    /// Cluster mode: PEM private key of --nats-tls-cert [default: none].
    #[arg(
        long,
        env = "TINYBROKER_NATS_TLS_KEY",
        value_name = "FILE",
        requires = "nats_tls_cert"
    )]
    nats_tls_key: Option<PathBuf>,
}

impl NatsSecurityArgs {
    /// What the flags ask for; the files are read when the gateway connects.
    ///
    /// # Errors
    /// `--nats-user` without a password.
    pub fn security(&self) -> Result<NatsSecurity, String> {
        let credential = if let Some(path) = &self.nats_creds {
            Some(NatsCredential::CredsFile(path.clone()))
        } else if let Some(path) = &self.nats_nkey {
            Some(NatsCredential::NkeySeedFile(path.clone()))
        } else if let Some(user) = &self.nats_user {
            let password = match (&self.nats_password_file, &self.nats_password) {
                (Some(path), _) => Secret::File {
                    flag: "--nats-password-file",
                    path: path.clone(),
                },
                (None, Some(value)) => Secret::Value {
                    from: "--nats-password (TINYBROKER_NATS_PASSWORD)",
                    value: value.clone(),
                },
                (None, None) => {
                    return Err(format!(
                        "--nats-user {user} needs a password: --nats-password-file or TINYBROKER_NATS_PASSWORD"
                    ));
                }
            };
            Some(NatsCredential::UserPassword {
                user: user.clone(),
                password,
            })
        } else if let Some(path) = &self.nats_token_file {
            Some(NatsCredential::Token(Secret::File {
                flag: "--nats-token-file",
                path: path.clone(),
            }))
        } else {
            self.nats_token.as_ref().map(|value| {
                NatsCredential::Token(Secret::Value {
                    from: "--nats-token (TINYBROKER_NATS_TOKEN)",
                    value: value.clone(),
                })
            })
        };
        let client = self.nats_tls_cert.clone().zip(self.nats_tls_key.clone());
        let tls = (self.nats_tls_ca.is_some() || client.is_some()).then(|| NatsTls {
            ca: self.nats_tls_ca.clone(),
            client,
        });
        Ok(NatsSecurity { credential, tls })
    }
}
