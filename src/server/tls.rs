//! TLS, terminated here rather than by tonic, so the handshake deadline (`incoming::Guarded`)
//! counts *decrypted* bytes: over TLS as over plaintext, a connection must send the HTTP/2
//! preface and the header of its first frame within `handshake_timeout`, and the TLS handshake
//! falls inside that deadline too. (Terminated by tonic, TLS is invisible to the deadline: the
//! first raw bytes are the ClientHello, and a client stalling its handshake or sending nothing
//! after it would hold a connection slot forever.)
//!
//! The handshake runs lazily, on the connection's own task, driven by hyper's first read or
//! write ([`Transport`]): a slow handshake holds up no one else, and needs no queue of its own.

use std::{
    io,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_rustls::{
    Accept, TlsAcceptor,
    rustls::{
        self, RootCertStore, ServerConfig,
        crypto::ring,
        pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
        server::WebPkiClientVerifier,
    },
    server::TlsStream,
};
use tonic::transport::Certificate;

/// The only application protocol served: gRPC needs HTTP/2.
const ALPN_H2: &[u8] = b"h2";

/// The server's certificate chain and private key, PEM.
#[derive(Clone)]
pub struct TlsIdentity {
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
}

impl TlsIdentity {
    /// A certificate chain (leaf first) and its private key (PKCS#8, PKCS#1 or SEC1), PEM. They
    /// are parsed when the server starts ([`TlsError`] then).
    pub fn from_pem(cert: impl AsRef<[u8]>, key: impl AsRef<[u8]>) -> Self {
        Self {
            cert_pem: cert.as_ref().to_vec(),
            key_pem: key.as_ref().to_vec(),
        }
    }
}

impl std::fmt::Debug for TlsIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsIdentity").finish_non_exhaustive()
    }
}

/// TLS material the server cannot use.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The certificate chain is not PEM, or holds no certificate.
    #[error("cannot read the certificate chain: {0}")]
    Certificate(String),
    /// The private key is not a PEM key.
    #[error("cannot read the private key: {0}")]
    Key(String),
    /// The client CA is not PEM, or holds no usable certificate.
    #[error("cannot use the client CA: {0}")]
    ClientCa(String),
    /// The key does not fit the certificate, or rustls refused the configuration.
    #[error("{0}")]
    Config(#[from] rustls::Error),
}

fn certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    if certs.is_empty() {
        return Err("no PEM certificate found".into());
    }
    Ok(certs)
}

/// The acceptor for `identity`, asking clients for a certificate signed by `client_ca` when
/// given (mutual TLS); HTTP/2 is the only protocol offered (ALPN `h2`).
///
/// # Errors
/// [`TlsError`] naming what could not be read or used.
pub(super) fn acceptor(
    identity: &TlsIdentity,
    client_ca: Option<&Certificate>,
) -> Result<TlsAcceptor, TlsError> {
    acceptor_for(identity, client_ca, ALPN_H2)
}

/// The acceptor for the console (docs/operations.md#console): the same identity and client CA
/// as the gRPC listener, offering HTTP/1.1 (ALPN `http/1.1`).
///
/// # Errors
/// [`TlsError`] naming what could not be read or used.
pub fn console_acceptor(
    identity: &TlsIdentity,
    client_ca: Option<&Certificate>,
) -> Result<TlsAcceptor, TlsError> {
    acceptor_for(identity, client_ca, b"http/1.1")
}

fn acceptor_for(
    identity: &TlsIdentity,
    client_ca: Option<&Certificate>,
    alpn: &[u8],
) -> Result<TlsAcceptor, TlsError> {
    // One provider named explicitly: the process-wide default is ambiguous when a dependency
    // enables a second one.
    let provider = Arc::new(ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            let (added, _ignored) = roots
                .add_parsable_certificates(certificates(ca.get_ref()).map_err(TlsError::ClientCa)?);
            if added == 0 {
                return Err(TlsError::ClientCa("no usable certificate".into()));
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                .build()
                .map_err(|e| TlsError::ClientCa(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let chain = certificates(&identity.cert_pem).map_err(TlsError::Certificate)?;
    let key = PrivateKeyDer::from_pem_slice(&identity.key_pem)
        .map_err(|e| TlsError::Key(e.to_string()))?;
    let mut config = builder.with_single_cert(chain, key)?;
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// A connection's bytes: plaintext, or TLS whose handshake is driven by the first reads and
/// writes and whose decrypted bytes are what the reader sees.
pub(super) enum Transport<IO> {
    /// No TLS.
    Plain(IO),
    /// The TLS handshake, under way.
    Handshaking(Box<Accept<IO>>),
    /// TLS, after the handshake.
    Tls(Box<TlsStream<IO>>),
    /// The TLS handshake failed; the connection is finished.
    Failed,
}

fn handshake_failed() -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, "the TLS handshake failed")
}

impl<IO: AsyncRead + AsyncWrite + Unpin> Transport<IO> {
    /// Drives the TLS handshake, if one is under way, to its end.
    fn poll_handshake(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Self::Handshaking(accept) = self {
            match ready!(Pin::new(&mut **accept).poll(cx)) {
                Ok(stream) => *self = Self::Tls(Box::new(stream)),
                Err(error) => {
                    tracing::debug!(%error, "TLS handshake failed");
                    *self = Self::Failed;
                    return Poll::Ready(Err(error));
                }
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for Transport<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_handshake(cx))?;
        match this {
            Self::Plain(io) => Pin::new(io).poll_read(cx, buf),
            Self::Tls(stream) => Pin::new(&mut **stream).poll_read(cx, buf),
            Self::Handshaking(_) | Self::Failed => Poll::Ready(Err(handshake_failed())),
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Transport<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_handshake(cx))?;
        match this {
            Self::Plain(io) => Pin::new(io).poll_write(cx, buf),
            Self::Tls(stream) => Pin::new(&mut **stream).poll_write(cx, buf),
            Self::Handshaking(_) | Self::Failed => Poll::Ready(Err(handshake_failed())),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_handshake(cx))?;
        match this {
            Self::Plain(io) => Pin::new(io).poll_write_vectored(cx, bufs),
            Self::Tls(stream) => Pin::new(&mut **stream).poll_write_vectored(cx, bufs),
            Self::Handshaking(_) | Self::Failed => Poll::Ready(Err(handshake_failed())),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Plain(io) => io.is_write_vectored(),
            Self::Tls(stream) => stream.is_write_vectored(),
            // h2 reads this once, when the connection starts, still handshaking, to choose how
            // much to copy before a write: answer for the TLS stream the handshake becomes.
            Self::Handshaking(_) => true,
            Self::Failed => false,
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_handshake(cx))?;
        match this {
            Self::Plain(io) => Pin::new(io).poll_flush(cx),
            Self::Tls(stream) => Pin::new(&mut **stream).poll_flush(cx),
            Self::Handshaking(_) | Self::Failed => Poll::Ready(Err(handshake_failed())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(io) => Pin::new(io).poll_shutdown(cx),
            Self::Tls(stream) => Pin::new(&mut **stream).poll_shutdown(cx),
            // Mid-handshake there is no TLS session to close: close the socket itself.
            Self::Handshaking(accept) => match accept.get_mut() {
                Some(io) => Pin::new(io).poll_shutdown(cx),
                None => Poll::Ready(Ok(())),
            },
            Self::Failed => Poll::Ready(Ok(())),
        }
    }
}
