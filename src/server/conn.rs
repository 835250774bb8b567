//! Gives every accepted connection a number, so the service can tell which connection a request
//! arrived on: the fence for acks that name no member (SPEC §4) is "the holder's stream runs on
//! this ack's connection". Works for any transport the server runs on (TCP, TLS, simulation).

use std::{
    io,
    pin::Pin,
    sync::atomic::{AtomicU64, Ordering},
    task::{Context, Poll},
};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

use crate::broker::ConnectionId;

/// What a request knows of its connection (found in the request's extensions, or inside
/// `TlsConnectInfo` when serving TLS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionInfo {
    /// Unique for the server's lifetime.
    pub id: ConnectionId,
}

/// A connection with its number.
#[derive(Debug)]
pub struct Numbered<IO> {
    io: IO,
    info: ConnectionInfo,
}

/// Hands out connection numbers.
#[derive(Debug, Default)]
pub struct Numbering(AtomicU64);

impl Numbering {
    /// Numbers `io`.
    pub fn number<IO>(&self, io: IO) -> Numbered<IO> {
        Numbered {
            io,
            info: ConnectionInfo {
                id: self.0.fetch_add(1, Ordering::Relaxed) + 1,
            },
        }
    }
}

impl<IO> Connected for Numbered<IO>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    type ConnectInfo = ConnectionInfo;

    fn connect_info(&self) -> ConnectionInfo {
        self.info
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Numbered<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Numbered<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// The connection a request arrived on, if the server numbered it.
pub fn connection_of<T>(request: &tonic::Request<T>) -> Option<ConnectionId> {
    let extensions = request.extensions();
    extensions
        .get::<ConnectionInfo>()
        .or_else(|| {
            extensions
                .get::<tonic::transport::server::TlsConnectInfo<ConnectionInfo>>()
                .map(|tls| tls.get_ref())
        })
        .map(|info| info.id)
}
