//! One TCP connection to a server: the handshake, and request/response exchanges made one at a
//! time under a lock.
//!
//! A failed exchange (the peer closed, a short or malformed response) poisons the connection:
//! the socket is dropped and every later call fails at once with the first failure's reason, so
//! a lost server is an error on the next call, never a hang on a half-read stream.

use crate::wire::{self, Command, Request, CONN_CAPS_SIZE, PROTO_VERSION};
use rgml::{Error, Result};
use std::io::{BufReader, BufWriter};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// How long connecting may take before the server counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What a request expects back.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Reply {
    /// Nothing: the server answers these commands with silence.
    None,
    /// A payload of exactly this many bytes.
    Exactly(usize),
}

struct Socket {
    reader: BufReader<TcpStream>,
    writer: BufWriter<TcpStream>,
}

struct State {
    /// `None` once an exchange failed.
    socket: Option<Socket>,
    /// Why the socket was dropped.
    lost: String,
    /// The last graph sent to each device, packed, so an identical one is recomputed by
    /// GRAPH_RECOMPUTE instead of being sent again (the server keeps one graph per device and
    /// connection).
    last_graph: Vec<Option<Vec<u8>>>,
}

/// A connection to one server (`host:port`).
pub struct Connection {
    endpoint: String,
    state: Mutex<State>,
}

impl Connection {
    /// Connect to `endpoint` (`host:port`) and shake hands.
    pub(crate) fn open(endpoint: &str) -> Result<Connection> {
        let err = |message: String| Error::Backend {
            backend: format!("RPC[{endpoint}]"),
            message,
        };
        let addrs: Vec<_> = endpoint
            .to_socket_addrs()
            .map_err(|e| err(format!("bad address (expected HOST:PORT): {e}")))?
            .collect();
        let mut last = String::from("no address");
        let stream = addrs
            .iter()
            .find_map(|a| match TcpStream::connect_timeout(a, CONNECT_TIMEOUT) {
                Ok(s) => Some(s),
                Err(e) => {
                    last = e.to_string();
                    None
                }
            })
            .ok_or_else(|| err(format!("cannot connect: {last}")))?;
        stream
            .set_nodelay(true)
            .map_err(|e| err(format!("cannot set TCP_NODELAY: {e}")))?;
        let reader = stream
            .try_clone()
            .map_err(|e| err(format!("cannot clone the socket: {e}")))?;
        let conn = Connection {
            endpoint: endpoint.to_string(),
            state: Mutex::new(State {
                socket: Some(Socket {
                    reader: BufReader::with_capacity(1 << 16, reader),
                    writer: BufWriter::with_capacity(1 << 16, stream),
                }),
                lost: String::new(),
                last_graph: Vec::new(),
            }),
        };
        conn.hello()?;
        Ok(conn)
    }

    /// The server's `host:port`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    fn hello(&self) -> Result<()> {
        // No transport upgrades are offered: zero capabilities keep plain TCP.
        let req = Request::Hello {
            caps: [0; CONN_CAPS_SIZE],
        };
        let rsp = self.call(&req, Reply::Exactly(4 + CONN_CAPS_SIZE))?;
        let (major, minor, patch) = (rsp[0], rsp[1], rsp[2]);
        if major != PROTO_VERSION.0 || minor > PROTO_VERSION.1 {
            let message = format!(
                "server speaks RPC protocol {major}.{minor}.{patch}; this client speaks {}.{}.{}",
                PROTO_VERSION.0, PROTO_VERSION.1, PROTO_VERSION.2
            );
            self.poison(&mut self.lock(), message.clone());
            return Err(self.error(message));
        }
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn error(&self, message: String) -> Error {
        Error::Backend {
            backend: format!("RPC[{}]", self.endpoint),
            message,
        }
    }

    fn poison(&self, state: &mut State, why: String) {
        state.socket = None;
        state.lost = why;
        state.last_graph.clear();
    }

    /// Send `req` and read its reply.
    pub(crate) fn call(&self, req: &Request, reply: Reply) -> Result<Vec<u8>> {
        self.call_parts(req.command(), &[&req.encode()], reply)
    }

    /// Send a request whose payload is `parts` one after another, and read its reply.
    pub(crate) fn call_parts(
        &self,
        command: Command,
        parts: &[&[u8]],
        reply: Reply,
    ) -> Result<Vec<u8>> {
        let mut state = self.lock();
        self.exchange(&mut state, command, parts, reply)
    }

    fn exchange(
        &self,
        state: &mut State,
        command: Command,
        parts: &[&[u8]],
        reply: Reply,
    ) -> Result<Vec<u8>> {
        let Some(socket) = state.socket.as_mut() else {
            return Err(self.error(format!("connection lost earlier: {}", state.lost)));
        };
        let result =
            wire::write_request_parts(&mut socket.writer, command, parts).and_then(
                |()| match reply {
                    Reply::None => Ok(Vec::new()),
                    Reply::Exactly(n) => {
                        let rsp = wire::read_response(&mut socket.reader, n as u64)?;
                        if rsp.len() != n {
                            return Err(wire::WireError::BadLength {
                                what: "response",
                                got: rsp.len(),
                                expected: n,
                            });
                        }
                        Ok(rsp)
                    }
                },
            );
        result.map_err(|e| {
            let why = format!("{command:?}: {e}");
            self.poison(state, why.clone());
            self.error(format!("connection lost: {why}"))
        })
    }

    /// Compute a graph on `device`: GRAPH_RECOMPUTE when `packed` is the graph sent last to that
    /// device on this connection, else GRAPH_COMPUTE with it. Returns whether it recomputed.
    pub(crate) fn compute_graph(&self, device: u32, packed: Vec<u8>) -> Result<bool> {
        let mut state = self.lock();
        let slot = device as usize;
        if state.last_graph.len() <= slot {
            state.last_graph.resize(slot + 1, None);
        }
        if state.last_graph[slot].as_deref() == Some(&packed[..]) {
            let req = Request::GraphRecompute { device };
            self.exchange(
                &mut state,
                Command::GraphRecompute,
                &[&req.encode()],
                Reply::None,
            )?;
            return Ok(true);
        }
        // Forget the old graph first: if sending fails the server may hold neither.
        state.last_graph[slot] = None;
        self.exchange(&mut state, Command::GraphCompute, &[&packed], Reply::None)?;
        if let Some(g) = state.last_graph.get_mut(slot) {
            *g = Some(packed);
        }
        Ok(false)
    }
}

/// A little-endian integer at `at` of a reply whose length the exchange has checked.
pub(crate) fn le_u64(bytes: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(b)
}

/// As [`le_u64`], 32 bits.
pub(crate) fn le_u32(bytes: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(b)
}
