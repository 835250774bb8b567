//! How a gateway connects to a secured NATS cluster (docs/cluster.md#securing-the-connection-to-nats):
//! the credential it presents (a credentials file, an nkey seed, a user and password, or a
//! token) and its TLS (the CA it trusts for the servers, the client certificate it presents),
//! from `serve`'s `--nats-*` flags. [`connect_options`] builds the `async_nats::ConnectOptions`
//! every NATS connection of the gateway and of the backplane starts from.
//!
//! Secrets come from files or the environment, are read once at start, and are never printed:
//! `Debug` shows where a secret comes from, never its value, and every error names the flag
//! (and the path) it is about.

use std::{fmt, path::PathBuf, sync::Arc};

use async_nats::ConnectOptions;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};

/// What a gateway presents to NATS and what it trusts; the default is neither (a credential
/// inside the URLs still applies).
#[derive(Debug, Clone, Default)]
pub struct NatsSecurity {
    /// The credential, if any.
    pub credential: Option<NatsCredential>,
    /// TLS settings, if any: the servers are then required to speak TLS.
    pub tls: Option<NatsTls>,
}

/// One way to authenticate to NATS, as `nats` and the official clients take them.
#[derive(Debug, Clone)]
pub enum NatsCredential {
    /// A credentials file: a user JWT and its nkey seed (`--nats-creds`), operator mode.
    CredsFile(PathBuf),
    /// A file holding a user's nkey seed, `SU…` (`--nats-nkey`).
    NkeySeedFile(PathBuf),
    /// A user (`--nats-user`) and its password.
    UserPassword {
        /// The user's name.
        user: String,
        /// Where the password is.
        password: Secret,
    },
    /// A token (`--nats-token`, `--nats-token-file`).
    Token(Secret),
}

/// A secret: a file to read at start, or a value given in the environment (or on the command
/// line). Named, never shown.
#[derive(Clone)]
pub enum Secret {
    /// Read from `path` at start; surrounding whitespace (an editor's newline) is not part of it.
    File {
        /// The flag that named the file, for errors (`--nats-password-file`).
        flag: &'static str,
        /// The file.
        path: PathBuf,
    },
    /// Given as it is (from the environment, or the command line), taken as it is.
    Value {
        /// The flag and environment variable it came from, for errors.
        from: &'static str,
        /// The secret itself.
        value: String,
    },
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source())
    }
}

impl Secret {
    /// Where it comes from, as errors name it.
    fn source(&self) -> String {
        match self {
            Self::File { flag, path } => format!("{flag} {}", path.display()),
            Self::Value { from, .. } => (*from).to_string(),
        }
    }

    /// The secret.
    ///
    /// # Errors
    /// A sentence naming the flag and path of a file that cannot be read, is not UTF-8 or is
    /// empty, or the flag of an empty value.
    fn read(&self) -> Result<String, String> {
        let text = match self {
            Self::File { flag, path } => {
                let bytes = read_file(flag, path)?;
                String::from_utf8(bytes)
                    .map_err(|_| format!("{flag} {}: not UTF-8 text", path.display()))?
                    .trim()
                    .to_string()
            }
            Self::Value { value, .. } => value.clone(),
        };
        if text.is_empty() {
            return Err(format!("{}: empty", self.source()));
        }
        Ok(text)
    }
}

/// TLS to the NATS servers.
#[derive(Debug, Clone, Default)]
pub struct NatsTls {
    /// PEM CA certificate(s) the servers' certificates must chain to (`--nats-tls-ca`); none:
    /// the system's roots.
    pub ca: Option<PathBuf>,
    /// A PEM client certificate chain and its private key, for mutual TLS
    /// (`--nats-tls-cert`, `--nats-tls-key`).
    pub client: Option<(PathBuf, PathBuf)>,
}

impl NatsCredential {
    /// The credential as errors name it: its flag and where it is, never the secret.
    pub fn describe(&self) -> String {
        match self {
            Self::CredsFile(path) => format!("--nats-creds {}", path.display()),
            Self::NkeySeedFile(path) => format!("--nats-nkey {}", path.display()),
            Self::UserPassword { user, password } => {
                format!(
                    "--nats-user {user} with the password of {}",
                    password.source()
                )
            }
            Self::Token(token) => format!("the token of {}", token.source()),
        }
    }
}

impl NatsSecurity {
    /// What the gateway presents, as errors name it: the credential and the client
    /// certificate; `None` when it presents neither.
    pub fn presented(&self) -> Option<String> {
        let credential = self.credential.as_ref().map(NatsCredential::describe);
        let certificate =
            self.tls
                .as_ref()
                .and_then(|tls| tls.client.as_ref())
                .map(|(cert, key)| {
                    format!(
                        "the client certificate --nats-tls-cert {} with --nats-tls-key {}",
                        cert.display(),
                        key.display()
                    )
                });
        match (credential, certificate) {
            (Some(credential), Some(certificate)) => {
                Some(format!("{credential} and {certificate}"))
            }
            (one, other) => one.or(other),
        }
    }

    /// The TLS the gateway connects with, as errors name it: what it checks the servers'
    /// certificates against, and the client certificate it presents.
    fn tls_described(&self) -> Option<String> {
        let tls = self.tls.as_ref()?;
        let trusted = match &tls.ca {
            Some(ca) => format!("--nats-tls-ca {}", ca.display()),
            None => "the system's roots".to_string(),
        };
        let client = match &tls.client {
            Some((cert, key)) => format!(
                "the client certificate --nats-tls-cert {} with --nats-tls-key {} (the key must be the certificate's)",
                cert.display(),
                key.display()
            ),
            None => "no client certificate (--nats-tls-cert)".to_string(),
        };
        Some(format!(
            "TLS, the servers' certificates checked against {trusted}, {client}"
        ))
    }

    /// Why a connection failed, naming what was presented and trusted: an authorization
    /// violation names the credential; a TLS failure, the CA and client certificate (to follow
    /// "cannot connect to NATS at URLS: ").
    pub fn connect_error(&self, error: &async_nats::ConnectError) -> String {
        use async_nats::ConnectErrorKind;
        let presented = self.presented().unwrap_or_else(|| {
            "none: no --nats-creds, --nats-nkey, --nats-user or --nats-token given".into()
        });
        match error.kind() {
            ConnectErrorKind::AuthorizationViolation => {
                format!(
                    "NATS refused the gateway's credentials ({presented}): authorization violation"
                )
            }
            ConnectErrorKind::Authentication => {
                format!("cannot answer NATS's challenge with {presented}: {error}")
            }
            _ => match self.tls_described() {
                Some(tls) => format!("{error} ({tls})"),
                None => error.to_string(),
            },
        }
    }
}

/// The options every NATS connection of a gateway starts from: the credential and TLS of
/// `security`, read and checked now (callers add their name, timeouts and event callback).
///
/// # Errors
/// A sentence naming the flag and path of a file that cannot be read or does not hold what it
/// should (a credentials file, a user's nkey seed, PEM certificates, a private key).
pub fn connect_options(security: &NatsSecurity) -> Result<ConnectOptions, String> {
    let mut options = ConnectOptions::new();
    match &security.credential {
        None => {}
        Some(NatsCredential::CredsFile(path)) => {
            let text = String::from_utf8(read_file("--nats-creds", path)?)
                .map_err(|_| format!("--nats-creds {}: not UTF-8 text", path.display()))?;
            options = options.credentials(&text).map_err(|e| {
                format!(
                    "--nats-creds {}: not a NATS credentials file (a user JWT and its nkey seed): {e}",
                    path.display()
                )
            })?;
        }
        Some(NatsCredential::NkeySeedFile(path)) => {
            let seed = Secret::File {
                flag: "--nats-nkey",
                path: path.clone(),
            }
            .read()?;
            check_user_seed(&seed)
                .map_err(|why| format!("--nats-nkey {}: {why}", path.display()))?;
            options = options.nkey(seed);
        }
        Some(NatsCredential::UserPassword { user, password }) => {
            if user.is_empty() {
                return Err("--nats-user: empty".into());
            }
            options = options.user_and_password(user.clone(), password.read()?);
        }
        Some(NatsCredential::Token(token)) => options = options.token(token.read()?),
    }
    if let Some(tls) = &security.tls {
        if let Some(ca) = &tls.ca {
            let certificates = read_certificates("--nats-tls-ca", ca)?;
            // Each must be usable as a trust anchor, as async-nats takes it.
            for certificate in &certificates {
                webpki_anchor(certificate).map_err(|e| {
                    format!("--nats-tls-ca {}: not a CA certificate: {e}", ca.display())
                })?;
            }
            options = options.add_root_certificates(ca.clone());
        }
        if let Some((cert, key)) = &tls.client {
            read_certificates("--nats-tls-cert", cert)?;
            let pem = read_file("--nats-tls-key", key)?;
            PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
                format!(
                    "--nats-tls-key {}: no PEM private key in it: {e}",
                    key.display()
                )
            })?;
            options = options.add_client_certificate(cert.clone(), key.clone());
        }
        options = options.require_tls(true);
    }
    Ok(options)
}

/// The most a credential, key or certificate file may hold: far more than any does.
const MAX_FILE_BYTES: u64 = 1 << 20;

/// The bytes of a regular file of at most [`MAX_FILE_BYTES`], or a sentence naming `flag` and
/// `path`: a FIFO or device would block the start or never end.
fn read_file(flag: &str, path: &std::path::Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let cannot = |e: std::io::Error| format!("{flag} {}: cannot read it: {e}", path.display());
    let metadata = std::fs::metadata(path).map_err(cannot)?;
    if !metadata.is_file() {
        return Err(format!("{flag} {}: not a regular file", path.display()));
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|file| file.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes))
        .map_err(cannot)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(format!(
            "{flag} {}: larger than {MAX_FILE_BYTES} bytes, not a credential, key or certificate",
            path.display()
        ));
    }
    Ok(bytes)
}

/// The PEM certificates in `path` (at least one).
fn read_certificates(
    flag: &str,
    path: &std::path::Path,
) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = read_file(flag, path)?;
    let certificates = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{flag} {}: not PEM certificates: {e}", path.display()))?;
    if certificates.is_empty() {
        return Err(format!(
            "{flag} {}: no PEM certificate in it",
            path.display()
        ));
    }
    Ok(certificates)
}

/// Whether `certificate` parses as a trust anchor.
fn webpki_anchor(certificate: &CertificateDer<'_>) -> Result<(), String> {
    let mut roots = tokio_rustls::rustls::RootCertStore::empty();
    roots.add(certificate.clone()).map_err(|e| e.to_string())
}

/// Whether `seed` is a user's nkey seed (`SU…`), saying what it is otherwise; the seed itself
/// is never in the answer.
fn check_user_seed(seed: &str) -> Result<(), String> {
    let pair = nkeys::KeyPair::from_seed(seed).map_err(|e| format!("not an nkey seed ({e})"))?;
    match pair.key_pair_type() {
        nkeys::KeyPairType::User => Ok(()),
        other => Err(format!(
            "holds the seed of a{} {other:?} key; a user's seed (SU…) is needed",
            if matches!(
                other,
                nkeys::KeyPairType::Account | nkeys::KeyPairType::Operator
            ) {
                "n"
            } else {
                ""
            }
        )),
    }
}

/// The first permission NATS refused a connection, kept for start-up to fail on.
#[derive(Clone)]
pub(crate) struct Refusals {
    first: Arc<tokio::sync::watch::Sender<Option<String>>>,
}

impl Default for Refusals {
    fn default() -> Self {
        Self {
            first: Arc::new(tokio::sync::watch::channel(None).0),
        }
    }
}

impl Refusals {
    /// Looks at one event of the connection: a permission NATS refused is logged at error
    /// level (naming the credential, `presented`) and kept when it is the first; another
    /// error from the server is logged at warn level.
    pub(crate) fn observe(&self, event: &async_nats::Event, presented: &str) {
        let async_nats::Event::ServerError(error) = event else {
            return;
        };
        match error {
            async_nats::ServerError::Other(text) if is_permission_violation(text) => {
                tracing::error!(
                    refused = %text,
                    credential = %presented,
                    "NATS refused the gateway: {text} (connected with {presented}); grant its NATS user the permissions docs/cluster.md#securing-the-connection-to-nats lists"
                );
                self.first.send_if_modified(|first| {
                    if first.is_none() {
                        *first = Some(text.clone());
                        true
                    } else {
                        false
                    }
                });
            }
            other => tracing::warn!(error = %other, "NATS server error: {other}"),
        }
    }

    /// Waits for the first permission refused, and returns it.
    pub(crate) async fn first(&self) -> String {
        let mut receiver = self.first.subscribe();
        match receiver.wait_for(Option::is_some).await {
            Ok(first) => first.clone().unwrap_or_default(),
            // The sender lives as long as `self`: never closed while awaited.
            Err(_) => std::future::pending().await,
        }
    }
}

/// Whether a server error is a permission violation (`Permissions Violation for Publish to
/// "<subject>"`, or `for Subscription to`).
fn is_permission_violation(text: &str) -> bool {
    text.to_ascii_lowercase()
        .starts_with("permissions violation")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory of its own for one test, removed when dropped.
    struct Dir(PathBuf);

    impl Dir {
        fn new(test: &str) -> Self {
            let dir = std::env::temp_dir()
                .join(format!("tinybroker-security-{}-{test}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }

        fn file(&self, name: &str, contents: &[u8]) -> PathBuf {
            let path = self.0.join(name);
            std::fs::write(&path, contents).unwrap();
            path
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    // Hostile paths: a file too large for any credential, a directory, a FIFO (which would
    // block the start for ever) are refused at once, naming the flag and the path.
    #[test]
    fn a_huge_file_a_directory_or_a_fifo_is_refused_naming_it() {
        let dir = Dir::new("hostile");
        let huge = dir.file("huge.token", &vec![b'a'; (MAX_FILE_BYTES + 1) as usize]);
        let error = read_file("--nats-token-file", &huge).unwrap_err();
        assert!(
            error.contains("--nats-token-file") && error.contains("larger than"),
            "{error}"
        );
        let error = read_file("--nats-creds", &dir.0).unwrap_err();
        assert!(error.contains("not a regular file"), "{error}");
        let fifo = dir.0.join("fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if made.is_ok_and(|s| s.success()) {
            let error = read_file("--nats-tls-key", &fifo).unwrap_err();
            assert!(
                error.contains("--nats-tls-key") && error.contains("not a regular file"),
                "{error}"
            );
        }
        let fine = dir.file("ok.token", b"secret\n");
        assert_eq!(read_file("--nats-token-file", &fine).unwrap(), b"secret\n");
    }

    fn error_of(security: NatsSecurity) -> String {
        match connect_options(&security) {
            Ok(_) => panic!("{security:?} was taken"),
            Err(error) => error,
        }
    }

    #[test]
    fn unreadable_or_wrong_files_are_named_with_their_flag() {
        let dir = Dir::new("files");
        let temp = |name: &str, contents: &[u8]| dir.file(name, contents);
        let missing = PathBuf::from("/nonexistent/tinybroker/creds");
        let error = error_of(NatsSecurity {
            credential: Some(NatsCredential::CredsFile(missing.clone())),
            tls: None,
        });
        assert!(
            error.starts_with("--nats-creds /nonexistent/tinybroker/creds: cannot read it"),
            "{error}"
        );
        let garbage = temp("garbage.creds", b"not a credentials file");
        let error = error_of(NatsSecurity {
            credential: Some(NatsCredential::CredsFile(garbage.clone())),
            tls: None,
        });
        assert!(
            error.contains("--nats-creds") && error.contains("not a NATS credentials file"),
            "{error}"
        );
        let account = nkeys::KeyPair::new_account().seed().unwrap();
        let seed = temp("account.nk", account.as_bytes());
        let error = error_of(NatsSecurity {
            credential: Some(NatsCredential::NkeySeedFile(seed)),
            tls: None,
        });
        assert!(
            error.contains("--nats-nkey") && error.contains("a user's seed"),
            "{error}"
        );
        assert!(
            !error.contains(&account),
            "the seed is never printed: {error}"
        );
        let error = error_of(NatsSecurity {
            credential: Some(NatsCredential::NkeySeedFile(garbage.clone())),
            tls: None,
        });
        assert!(
            error.contains("--nats-nkey") && error.contains("not an nkey seed"),
            "{error}"
        );
        let empty = temp("empty", b"\n");
        let error = error_of(NatsSecurity {
            credential: Some(NatsCredential::Token(Secret::File {
                flag: "--nats-token-file",
                path: empty.clone(),
            })),
            tls: None,
        });
        assert!(
            error.starts_with("--nats-token-file") && error.ends_with("empty"),
            "{error}"
        );
        for (tls, flag) in [
            (
                NatsTls {
                    ca: Some(garbage.clone()),
                    client: None,
                },
                "--nats-tls-ca",
            ),
            (
                NatsTls {
                    ca: None,
                    client: Some((garbage.clone(), garbage.clone())),
                },
                "--nats-tls-cert",
            ),
        ] {
            let error = error_of(NatsSecurity {
                credential: None,
                tls: Some(tls),
            });
            assert!(
                error.starts_with(flag) && error.contains("no PEM certificate"),
                "{error}"
            );
        }
    }

    #[test]
    fn secrets_are_read_trimmed_and_never_shown() {
        let dir = Dir::new("secrets");
        let path = dir.file("password", b"  s3cret\n");
        let password = Secret::File {
            flag: "--nats-password-file",
            path: path.clone(),
        };
        assert_eq!(password.read().unwrap(), "s3cret");
        let credential = NatsCredential::UserPassword {
            user: "gw".into(),
            password,
        };
        let shown = format!("{credential:?} {}", credential.describe());
        assert!(!shown.contains("s3cret"), "{shown}");
        let token = Secret::Value {
            from: "--nats-token (TINYBROKER_NATS_TOKEN)",
            value: "t0ken".into(),
        };
        assert!(!format!("{token:?}").contains("t0ken"));
        assert!(
            connect_options(&NatsSecurity {
                credential: Some(NatsCredential::Token(token)),
                tls: None
            })
            .is_ok()
        );
    }

    #[test]
    fn permission_violations_are_told_from_other_server_errors() {
        assert!(is_permission_violation(
            "Permissions Violation for Publish to \"$JS.API.STREAM.INFO.tinybroker\""
        ));
        assert!(is_permission_violation(
            "Permissions Violation for Subscription to \"_INBOX.x.*\""
        ));
        assert!(!is_permission_violation("Stale Connection"));
    }
}
