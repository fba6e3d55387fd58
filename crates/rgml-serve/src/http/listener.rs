//! A TCP listener that holds at most `max_connections` connections open: it takes a
//! semaphore permit before accepting, and each connection keeps its permit until it closes.
//! A connection over the limit waits in the kernel's accept queue rather than being refused.
//!
//! It also owns the connections' timeouts (llama-server's `--timeout`): a read that gets no
//! byte for the timeout fails while the connection has no request in hand (an idle keep-alive
//! connection, a request sent too slowly), and so does a write the client does not take for
//! that long. While a response is being computed or streamed ([`Activity`], marked by the
//! routes' middleware) reads are never timed: a long generation is not a slow client.

use axum::serve::Listener;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{sleep, Sleep};

/// Open connections, for `/metrics`.
#[derive(Clone, Debug)]
pub(crate) struct Connections {
    permits: Arc<Semaphore>,
    max: usize,
}

impl Connections {
    /// Room for `max` connections (at least one, at most what a semaphore can count).
    pub(crate) fn new(max: usize) -> Connections {
        let max = max.clamp(1, Semaphore::MAX_PERMITS);
        Connections {
            permits: Arc::new(Semaphore::new(max)),
            max,
        }
    }

    /// Connections open now.
    pub(crate) fn open(&self) -> usize {
        self.max - self.permits.available_permits()
    }
}

/// How many responses of one connection are in progress (a request handled, a body being
/// sent), and when the last one ended; the routes get it as connect info.
#[derive(Clone, Debug)]
pub(crate) struct Activity(Arc<ActivityState>);

#[derive(Debug)]
struct ActivityState {
    busy: AtomicUsize,
    idle_since: Mutex<Instant>,
}

impl Default for Activity {
    fn default() -> Activity {
        Activity(Arc::new(ActivityState {
            busy: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
        }))
    }
}

impl Activity {
    fn busy(&self) -> bool {
        self.0.busy.load(Ordering::Acquire) > 0
    }

    /// When the last response ended (or the connection opened).
    fn idle_since(&self) -> Instant {
        *self.0.idle_since.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks a response in progress until the guard is dropped.
    pub(crate) fn begin(&self) -> ActivityGuard {
        self.0.busy.fetch_add(1, Ordering::AcqRel);
        ActivityGuard(self.0.clone())
    }
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, LimitedListener>>
    for Activity
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, LimitedListener>) -> Activity {
        stream.io().activity.clone()
    }
}

/// A response in progress (see [`Activity::begin`]).
pub(crate) struct ActivityGuard(Arc<ActivityState>);

impl Drop for ActivityGuard {
    fn drop(&mut self) {
        *self.0.idle_since.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// [`TcpListener`] with a limit on open connections and their timeouts.
pub(crate) struct LimitedListener {
    inner: TcpListener,
    connections: Connections,
    timeout: Option<Duration>,
}

impl LimitedListener {
    /// `timeout`: see the module docs (`None`: never).
    pub(crate) fn new(
        inner: TcpListener,
        connections: Connections,
        timeout: Option<Duration>,
    ) -> LimitedListener {
        LimitedListener {
            inner,
            connections,
            timeout,
        }
    }
}

impl Listener for LimitedListener {
    type Io = LimitedIo;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (LimitedIo, SocketAddr) {
        // The semaphore is never closed, so acquiring fails never; were it closed, serving
        // without the limit beats serving nothing.
        let permit = self.connections.permits.clone().acquire_owned().await.ok();
        let (io, addr) = Listener::accept(&mut self.inner).await;
        // Streamed tokens are small writes that must leave at once; a failure only costs
        // latency.
        let _ = io.set_nodelay(true);
        (
            LimitedIo {
                io,
                _permit: permit,
                activity: Activity::default(),
                timeout: self.timeout,
                read_wait: None,
                write_deadline: None,
            },
            addr,
        )
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// A connection, its permit (released when the connection is dropped) and its timers.
pub(crate) struct LimitedIo {
    io: TcpStream,
    _permit: Option<OwnedSemaphorePermit>,
    activity: Activity,
    timeout: Option<Duration>,
    /// A pending read: since when, and its timer.
    read_wait: Option<(Instant, Pin<Box<Sleep>>)>,
    write_deadline: Option<Pin<Box<Sleep>>>,
}

/// A write's `poll`, or a timeout error once `deadline` (armed at the first pending poll,
/// cleared by progress) passes.
fn timed_write<T>(
    poll: Poll<io::Result<T>>,
    deadline: &mut Option<Pin<Box<Sleep>>>,
    timeout: Option<Duration>,
    cx: &mut Context<'_>,
) -> Poll<io::Result<T>> {
    let (Poll::Pending, Some(timeout)) = (&poll, timeout) else {
        *deadline = None;
        return poll;
    };
    let deadline = deadline.get_or_insert_with(|| Box::pin(sleep(timeout)));
    match deadline.as_mut().poll(cx) {
        Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("the client took no response bytes for {timeout:?}"),
        ))),
        Poll::Pending => Poll::Pending,
    }
}

impl LimitedIo {
    /// A pending read's timer: it fails the read once the connection has been idle (no
    /// response in progress, no byte read) for the timeout; while a response is in progress
    /// it only waits.
    fn read_timer(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let Some(timeout) = self.timeout else {
            return Poll::Pending;
        };
        let (since, deadline) = self
            .read_wait
            .get_or_insert_with(|| (Instant::now(), Box::pin(sleep(timeout))));
        while deadline.as_mut().poll(cx).is_ready() {
            let now = Instant::now();
            let quiet_until = match self.activity.busy() {
                true => now + timeout,
                false => self.activity.idle_since().max(*since) + timeout,
            };
            if quiet_until <= now {
                let message = format!("no request bytes for {timeout:?}");
                return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, message)));
            }
            deadline.as_mut().reset(quiet_until.into());
        }
        Poll::Pending
    }
}

impl AsyncRead for LimitedIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Pending => this.read_timer(cx),
            ready => {
                this.read_wait = None;
                ready
            }
        }
    }
}

impl AsyncWrite for LimitedIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.io).poll_write(cx, buf);
        timed_write(poll, &mut this.write_deadline, this.timeout, cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        timed_write(poll, &mut this.write_deadline, this.timeout, cx)
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
