//! Counts open connections by wrapping each one the listener yields: the count goes up when the
//! listener hands it over and down when the server drops it, whatever ended it.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll},
};

use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_stream::{Stream, StreamExt};
use tonic::transport::server::Connected;

/// A connection counted in a gauge while it lives; reads, writes and connect info pass through.
#[derive(Debug)]
pub struct Counted<IO> {
    io: IO,
    gauge: Gauge,
}

impl<IO> Counted<IO> {
    fn new(io: IO, gauge: Gauge) -> Self {
        gauge.inc();
        Self { io, gauge }
    }
}

impl<IO> Drop for Counted<IO> {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

pub(super) fn count<I, IO, E>(
    incoming: I,
    gauge: Gauge,
) -> impl Stream<Item = Result<Counted<IO>, E>> + use<I, IO, E>
where
    I: Stream<Item = Result<IO, E>>,
{
    incoming.map(move |conn| conn.map(|io| Counted::new(io, gauge.clone())))
}

impl<IO: AsyncRead + Unpin> AsyncRead for Counted<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Counted<IO> {
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

impl<IO: Connected> Connected for Counted<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}
