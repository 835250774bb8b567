//! Connection admission: what stands between the listener and hyper.
//!
//! - [`Admission`] wraps any incoming stream (TCP, turmoil): it refuses connections over
//!   `max_connections` by closing them at once (counted), and it can be closed from outside, so
//!   shutdown stops accepting immediately instead of leaving the listener's backlog to fill.
//! - [`Guarded`] wraps each admitted connection: it holds the connection's slot until dropped,
//!   terminates TLS when the server serves it (see `tls`), fails the connection once the
//!   handshake deadline passes before the client sent its HTTP/2 preface (decrypted, over TLS),
//!   and fails every read and write once the kill switch fires (the end of the drain).
//! - [`TcpAccept`] is the TCP listener as a stream that backs off on accept errors (EMFILE)
//!   instead of retrying in a busy loop, and logs once per burst of errors.

use std::{
    io,
    pin::Pin,
    sync::{Arc, Mutex, PoisonError},
    task::{Context, Poll, ready},
    time::Duration,
};

use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::{OwnedSemaphorePermit, Semaphore},
    time::Sleep,
};
use tokio_rustls::TlsAcceptor;
use tokio_stream::Stream;
use tonic::transport::server::Connected;

use super::tls::Transport;
use crate::{
    broker::ConnectionId,
    transport::{Signal, TransportStats, conn::ConnectionInfo},
};

/// Bytes a client must send before its handshake counts as done: the 24-byte HTTP/2 preface
/// plus the 9-byte header of the SETTINGS frame that must follow it. Over TLS they are counted
/// after decryption, so the TLS handshake must be over too.
const HANDSHAKE_BYTES: usize = 24 + 9;

/// Most connections taken from the inner stream in one poll, so a flood of connections to
/// refuse cannot monopolise the task that also runs the accept loop.
const ADMIT_BATCH: usize = 64;

type Shared<I> = Arc<Mutex<Option<Pin<Box<I>>>>>;

/// Closes an [`Admission`]'s inner stream (and so the listener it owns) from outside.
pub struct Closer<I>(Shared<I>);

impl<I> Closer<I> {
    /// Drops the inner stream: the listener closes, so new clients are refused by the kernel at
    /// once rather than left waiting in the backlog; the [`Admission`] stream then ends.
    pub fn close(&self) {
        let inner = self.0.lock().unwrap_or_else(PoisonError::into_inner).take();
        drop(inner);
    }
}

/// The incoming stream with a connection limit, TLS if configured, a handshake deadline per
/// connection and a way to stop accepting at once.
pub struct Admission<I> {
    inner: Shared<I>,
    slots: Arc<Semaphore>,
    tls: Option<TlsAcceptor>,
    handshake_timeout: Duration,
    stats: Arc<TransportStats>,
    /// Fires at the end of the drain: every [`Guarded`] connection fails from then on, so
    /// connections a client keeps busy (a subscriber that never reads) close instead of
    /// lingering.
    kill: Arc<Signal>,
    refusing: bool,
    /// Numbers the admitted connections (see [`ConnectionInfo`]).
    last_id: ConnectionId,
}

impl<I> Admission<I> {
    /// Wraps `incoming`, serving TLS with `tls` when given; returns the stream and its
    /// [`Closer`].
    pub fn new(
        incoming: I,
        max_connections: usize,
        tls: Option<TlsAcceptor>,
        handshake_timeout: Duration,
        stats: Arc<TransportStats>,
        kill: Arc<Signal>,
    ) -> (Self, Closer<I>) {
        let inner: Shared<I> = Arc::new(Mutex::new(Some(Box::pin(incoming))));
        let slots = Arc::new(Semaphore::new(max_connections.min(Semaphore::MAX_PERMITS)));
        let admission = Self {
            inner: inner.clone(),
            slots,
            tls,
            handshake_timeout,
            stats,
            kill,
            refusing: false,
            last_id: 0,
        };
        (admission, Closer(inner))
    }
}

impl<I, IO, IE> Stream for Admission<I>
where
    I: Stream<Item = Result<IO, IE>>,
    IO: AsyncRead + AsyncWrite + Unpin,
{
    type Item = Result<Guarded<IO>, IE>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let mut guard = this.inner.lock().unwrap_or_else(PoisonError::into_inner);
        for _ in 0..ADMIT_BATCH {
            let Some(inner) = guard.as_mut() else {
                return Poll::Ready(None);
            };
            let io = match ready!(inner.as_mut().poll_next(cx)) {
                None => return Poll::Ready(None),
                Some(Err(error)) => return Poll::Ready(Some(Err(error))),
                Some(Ok(io)) => io,
            };
            match this.slots.clone().try_acquire_owned() {
                Ok(slot) => {
                    if this.refusing {
                        this.refusing = false;
                        tracing::info!("accepting connections again");
                    }
                    this.last_id += 1;
                    let io = match &this.tls {
                        // Only sets the handshake up: it runs on the connection's own task.
                        Some(tls) => Transport::Handshaking(Box::new(tls.accept(io))),
                        None => Transport::Plain(io),
                    };
                    return Poll::Ready(Some(Ok(Guarded::new(
                        io,
                        ConnectionInfo { id: this.last_id },
                        slot,
                        this.handshake_timeout,
                        this.stats.clone(),
                        this.kill.clone(),
                    ))));
                }
                Err(_) => {
                    // Dropping the socket closes it: the client fails fast and can retry or
                    // go elsewhere, rather than wait on a connection nobody will serve.
                    drop(io);
                    this.stats.connection_refused();
                    if !this.refusing {
                        this.refusing = true;
                        tracing::warn!(
                            "max_connections reached: refusing new connections until one closes (counted as connections_refused)"
                        );
                    }
                }
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// Where a connection stands with its handshake deadline.
enum Handshake {
    /// Armed: `remaining` bytes of the preface and first frame header are still to come.
    Awaited {
        deadline: Pin<Box<Sleep>>,
        remaining: usize,
    },
    /// The client sent them in time: no deadline any more.
    Done,
    /// The deadline passed first: the connection fails from then on.
    Missed,
}

/// An admitted connection. Holds its slot under `max_connections` until dropped, and tells
/// requests which connection they arrived on.
pub struct Guarded<IO> {
    /// Declared (so dropped) before `io`: the slot is free again by the time the client sees
    /// its connection close.
    _slot: OwnedSemaphorePermit,
    io: Transport<IO>,
    info: ConnectionInfo,
    handshake: Handshake,
    stats: Arc<TransportStats>,
    kill: Arc<Signal>,
    killed: Pin<Box<dyn Future<Output = ()> + Send>>,
}

impl<IO> Guarded<IO> {
    fn new(
        io: Transport<IO>,
        info: ConnectionInfo,
        slot: OwnedSemaphorePermit,
        handshake_timeout: Duration,
        stats: Arc<TransportStats>,
        kill: Arc<Signal>,
    ) -> Self {
        stats.connection_opened();
        Self {
            _slot: slot,
            io,
            info,
            handshake: Handshake::Awaited {
                deadline: Box::pin(tokio::time::sleep(handshake_timeout)),
                remaining: HANDSHAKE_BYTES,
            },
            stats,
            killed: Box::pin(kill.clone().wait()),
            kill,
        }
    }

    /// Whether the kill switch fired. Polls the notification first, so that a later `fire`
    /// wakes this connection's task; then reads the flag, which covers a `fire` before that.
    fn killed(&mut self, cx: &mut Context<'_>) -> bool {
        self.killed.as_mut().poll(cx).is_ready() || self.kill.fired()
    }

    /// Fails once the handshake deadline passed before the client sent its preface. Checked by
    /// every read, write and flush while the deadline is armed, not by reads alone: over TLS,
    /// hyper's first step is writing its SETTINGS, which waits on the TLS handshake, so a
    /// client stalling that handshake meets a write, and no read is pending to notice the time.
    fn check_handshake(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        match &mut self.handshake {
            Handshake::Done => Ok(()),
            Handshake::Missed => Err(handshake_missed()),
            Handshake::Awaited { deadline, .. } => {
                if deadline.as_mut().poll(cx).is_pending() {
                    return Ok(());
                }
                self.handshake = Handshake::Missed;
                self.stats.handshake_timed_out();
                tracing::debug!("closing a connection that did not finish its handshake in time");
                Err(handshake_missed())
            }
        }
    }
}

fn handshake_missed() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        "the client did not send the HTTP/2 preface within handshake_timeout",
    )
}

impl<IO> Drop for Guarded<IO> {
    fn drop(&mut self) {
        self.stats.connection_closed();
    }
}

fn aborted() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "the server shut down and the drain time is over",
    )
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for Guarded<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.killed(cx) {
            return Poll::Ready(Err(aborted()));
        }
        this.check_handshake(cx)?;
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        if let (Poll::Ready(Ok(())), Handshake::Awaited { remaining, .. }) =
            (&polled, &mut this.handshake)
        {
            // Decrypted bytes over TLS: the handshake's own bytes never count.
            let read = buf.filled().len() - before;
            *remaining = remaining.saturating_sub(read);
            if *remaining == 0 {
                this.handshake = Handshake::Done;
            }
        }
        polled
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Guarded<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.killed(cx) {
            return Poll::Ready(Err(aborted()));
        }
        this.check_handshake(cx)?;
        Pin::new(&mut this.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.killed(cx) {
            return Poll::Ready(Err(aborted()));
        }
        this.check_handshake(cx)?;
        Pin::new(&mut this.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check_handshake(cx)?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> Connected for Guarded<IO> {
    type ConnectInfo = ConnectionInfo;

    fn connect_info(&self) -> ConnectionInfo {
        self.info
    }
}

/// First pause after an accept error; doubled on each further error, up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(10);
/// Longest pause between accept attempts while they keep failing.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// A bound TCP listener as a stream of connections with `TCP_NODELAY` set.
///
/// tonic retries a failed accept at once, so when the process is out of file descriptors the
/// accept loop spins on a core and logs nothing. This stream never yields an error: on one it
/// pauses (10 ms, doubling to 1 s), logs the first error of each burst, and tries again.
pub struct TcpAccept {
    listener: TcpListener,
    pause: Option<Pin<Box<Sleep>>>,
    backoff: Duration,
    errors_in_burst: u64,
}

impl TcpAccept {
    /// Accepts on `listener`.
    pub fn new(listener: TcpListener) -> Self {
        Self {
            listener,
            pause: None,
            backoff: MIN_BACKOFF,
            errors_in_burst: 0,
        }
    }
}

/// Errors that concern one connection that died before it was accepted, not the listener.
fn is_per_connection(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
    )
}

impl Stream for TcpAccept {
    type Item = io::Result<TcpStream>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(pause) = &mut this.pause {
                ready!(pause.as_mut().poll(cx));
                this.pause = None;
            }
            match ready!(this.listener.poll_accept(cx)) {
                Ok((stream, _)) => {
                    if this.errors_in_burst > 0 {
                        tracing::info!(
                            errors = this.errors_in_burst,
                            "accepting connections again"
                        );
                        this.errors_in_burst = 0;
                        this.backoff = MIN_BACKOFF;
                    }
                    if let Err(error) = stream.set_nodelay(true) {
                        tracing::debug!(%error, "cannot set TCP_NODELAY");
                    }
                    return Poll::Ready(Some(Ok(stream)));
                }
                Err(error) if is_per_connection(&error) => continue,
                Err(error) => {
                    if this.errors_in_burst == 0 {
                        tracing::warn!(
                            %error,
                            "accept failed (out of file descriptors? see max_connections); retrying with backoff up to {MAX_BACKOFF:?}, further errors of this burst not logged"
                        );
                    }
                    this.errors_in_burst += 1;
                    this.pause = Some(Box::pin(tokio::time::sleep(this.backoff)));
                    this.backoff = (this.backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }
}
