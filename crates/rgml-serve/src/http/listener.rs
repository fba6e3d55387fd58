//! A TCP listener that holds at most `max_connections` connections open: it takes a
//! semaphore permit before accepting, and each connection keeps its permit until it closes.
//! A connection over the limit waits in the kernel's accept queue rather than being refused.

use axum::serve::Listener;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

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

/// [`TcpListener`] with a limit on open connections.
pub(crate) struct LimitedListener {
    inner: TcpListener,
    connections: Connections,
}

impl LimitedListener {
    pub(crate) fn new(inner: TcpListener, connections: Connections) -> LimitedListener {
        LimitedListener { inner, connections }
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
            },
            addr,
        )
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// A connection and its permit (released when the connection is dropped).
pub(crate) struct LimitedIo {
    io: TcpStream,
    _permit: Option<OwnedSemaphorePermit>,
}

impl AsyncRead for LimitedIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl AsyncWrite for LimitedIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
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
