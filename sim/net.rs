//! turmoil ↔ tonic wiring: the server's incoming connections and the clients' connector.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_stream::Stream;
use tonic::transport::{Channel, Endpoint, Uri, server::Connected};
use turmoil::net::{TcpListener, TcpStream};

/// The broker's port inside the simulation.
pub const PORT: u16 = 50051;
/// Keepalive on both sides, so partitions are noticed (a healed partition otherwise leaves TCP
/// streams stuck with no error).
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
/// See [`KEEPALIVE_INTERVAL`].
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(2);

/// A connection tonic's server accepts: a turmoil TCP stream, or a process's end of a pipe
/// (`gateway_process.rs`).
pub struct Accepted<S = TcpStream>(pub S);

impl<S> Connected for Accepted<S> {
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl<S: AsyncRead + Unpin> AsyncRead for Accepted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Accepted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// Accepts connections on the broker host's port.
pub fn incoming(listener: TcpListener) -> impl Stream<Item = io::Result<Accepted>> {
    async_stream::stream! {
        loop {
            yield listener.accept().await.map(|(stream, _)| Accepted(stream));
        }
    }
}

/// A channel to the broker host, over turmoil's network, with keepalive.
pub async fn connect() -> Result<Channel, tonic::transport::Error> {
    connect_to("broker").await
}

/// A channel to `host` (a broker or a gateway), over turmoil's network, with keepalive.
pub async fn connect_to(host: &str) -> Result<Channel, tonic::transport::Error> {
    connect_with(host, KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT).await
}

/// A channel to `host` whose keepalive pings every `interval` and gives up after `timeout`
/// without an answer.
pub async fn connect_with(
    host: &str,
    interval: Duration,
    timeout: Duration,
) -> Result<Channel, tonic::transport::Error> {
    Endpoint::new(format!("http://{host}:{PORT}"))?
        .http2_keep_alive_interval(interval)
        .keep_alive_timeout(timeout)
        .keep_alive_while_idle(true)
        .connect_with_connector(tower::service_fn(|uri: Uri| async move {
            let authority = uri
                .authority()
                .map(|a| a.as_str().to_string())
                .unwrap_or_default();
            TcpStream::connect(authority).await.map(TokioIo::new)
        }))
        .await
}
