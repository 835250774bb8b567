//! Connection admission: what stands between the listener and hyper.
//!
//! - [`Admission`] wraps any incoming stream (TCP, turmoil): it refuses connections over
//!   `max_connections` by closing them at once (counted), and it can be closed from outside, so
//!   shutdown stops accepting immediately instead of leaving the listener's backlog to fill.
//! - [`Guarded`] wraps each admitted connection: it holds the connection's slot until dropped,
//!   fails reads once the handshake deadline passes before the client sent its HTTP/2 preface,
//!   and fails every read and write once the [`KillSwitch`] fires (the end of the drain).
//! - [`TcpAccept`] is the TCP listener as a stream that backs off on accept errors (EMFILE)
//!   instead of retrying in a busy loop, and logs once per burst of errors.

use std::{
    io,
    pin::Pin,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll, ready},
    time::Duration,
};

use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::{Notify, OwnedSemaphorePermit, Semaphore},
    time::Sleep,
};
use tokio_stream::Stream;
use tonic::transport::server::Connected;

use super::conn::ConnectionInfo;
use crate::broker::ConnectionId;

use super::stats::TransportStats;

/// Bytes a client must send before its handshake counts as done: the 24-byte HTTP/2 preface
/// plus the 9-byte header of the SETTINGS frame that must follow it. (Over TLS these are the
/// first bytes of the ClientHello, so the deadline then bounds only the start of the handshake.)
const HANDSHAKE_BYTES: usize = 24 + 9;

/// Most connections taken from the inner stream in one poll, so a flood of connections to
/// refuse cannot monopolise the task that also runs the accept loop.
const ADMIT_BATCH: usize = 64;

/// Fires once, at the end of the drain: every [`Guarded`] connection fails from then on, so
/// connections a client keeps busy (a subscriber that never reads) close instead of lingering.
#[derive(Debug, Default)]
pub struct KillSwitch {
    fired: AtomicBool,
    notify: Notify,
}

impl KillSwitch {
    /// Fails every connection admitted so far or later.
    pub fn fire(&self) {
        self.fired.store(true, Ordering::Release);
        self.notify.notify_waiters();
    }

    fn fired(&self) -> bool {
        self.fired.load(Ordering::Acquire)
    }
}

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

/// The incoming stream with a connection limit, a handshake deadline per connection and a way
/// to stop accepting at once.
pub struct Admission<I> {
    inner: Shared<I>,
    slots: Arc<Semaphore>,
    handshake_timeout: Duration,
    stats: Arc<TransportStats>,
    kill: Arc<KillSwitch>,
    refusing: bool,
    /// Numbers the admitted connections (see [`ConnectionInfo`]).
    last_id: ConnectionId,
}

impl<I> Admission<I> {
    /// Wraps `incoming`; returns the stream and its [`Closer`].
    pub fn new(
        incoming: I,
        max_connections: usize,
        handshake_timeout: Duration,
        stats: Arc<TransportStats>,
        kill: Arc<KillSwitch>,
    ) -> (Self, Closer<I>) {
        let inner: Shared<I> = Arc::new(Mutex::new(Some(Box::pin(incoming))));
        let slots = Arc::new(Semaphore::new(max_connections.min(Semaphore::MAX_PERMITS)));
        let admission = Self {
            inner: inner.clone(),
            slots,
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

struct Handshake {
    deadline: Pin<Box<Sleep>>,
    remaining: usize,
}

/// An admitted connection. Holds its slot under `max_connections` until dropped, and tells
/// requests which connection they arrived on.
pub struct Guarded<IO> {
    io: IO,
    info: ConnectionInfo,
    _slot: OwnedSemaphorePermit,
    handshake: Option<Handshake>,
    stats: Arc<TransportStats>,
    kill: Arc<KillSwitch>,
    killed: Pin<Box<dyn Future<Output = ()> + Send>>,
}

impl<IO> Guarded<IO> {
    fn new(
        io: IO,
        info: ConnectionInfo,
        slot: OwnedSemaphorePermit,
        handshake_timeout: Duration,
        stats: Arc<TransportStats>,
        kill: Arc<KillSwitch>,
    ) -> Self {
        stats.connection_opened();
        let killed = {
            let kill = kill.clone();
            Box::pin(async move { kill.notify.notified().await })
        };
        Self {
            io,
            info,
            _slot: slot,
            handshake: Some(Handshake {
                deadline: Box::pin(tokio::time::sleep(handshake_timeout)),
                remaining: HANDSHAKE_BYTES,
            }),
            stats,
            kill,
            killed,
        }
    }

    /// Whether the kill switch fired. Polls the notification first, so that a later `fire`
    /// wakes this connection's task; then reads the flag, which covers a `fire` before that.
    fn killed(&mut self, cx: &mut Context<'_>) -> bool {
        self.killed.as_mut().poll(cx).is_ready() || self.kill.fired()
    }
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

impl<IO: AsyncRead + Unpin> AsyncRead for Guarded<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.killed(cx) {
            return Poll::Ready(Err(aborted()));
        }
        if let Some(handshake) = &mut this.handshake
            && handshake.deadline.as_mut().poll(cx).is_ready()
        {
            this.handshake = None;
            this.stats.handshake_timed_out();
            tracing::debug!("closing a connection that did not finish its handshake in time");
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client did not send the HTTP/2 preface within handshake_timeout",
            )));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        if let (Poll::Ready(Ok(())), Some(handshake)) = (&polled, &mut this.handshake) {
            let read = buf.filled().len() - before;
            handshake.remaining = handshake.remaining.saturating_sub(read);
            if handshake.remaining == 0 {
                this.handshake = None;
            }
        }
        polled
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Guarded<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.killed(cx) {
            return Poll::Ready(Err(aborted()));
        }
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
        Pin::new(&mut this.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
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
