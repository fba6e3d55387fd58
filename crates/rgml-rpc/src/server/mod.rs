//! The server: rgml's devices for any client of ggml's RPC protocol 7.0 (llama.cpp's `--rpc`,
//! or rgml's own client).
//!
//! ```text
//! mod      accept loop, one thread per client (at most `max_clients` at once), framing,
//!          logging; the hash cache (`cache`)
//! session  one client's buffers, streams and stored graphs; each command, checked
//! graph    a client's graph rebuilt through rgml's op builders
//! ```
//!
//! Nothing a client sends is trusted: frames are size-capped before they are read, payloads
//! are decoded with every length checked ([`crate::wire`]), every byte range is checked against
//! its tensor and buffer, and graphs are rebuilt op by op. A bad message ends that connection
//! with the reason logged; the server goes on serving others.

mod graph;
mod session;

use crate::wire::{self, Command, Request, WireError};
use rgml::DeviceRef;
use session::Session;
use std::io::{BufReader, BufWriter, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Why a client's request was not served (the connection then ends).
#[derive(Debug)]
pub struct Refusal(pub String);

/// How the server serves.
#[derive(Clone)]
pub struct ServerOptions {
    /// The devices offered, in the order clients number them.
    pub devices: Vec<DeviceRef>,
    /// Compute threads of CPU streams (`None`: the CPU backend's default).
    pub threads: Option<usize>,
    /// Bytes of buffers one client may hold at once.
    pub client_memory: usize,
    /// Clients served at once; more wait to be accepted.
    pub max_clients: usize,
    /// Where SET_TENSOR data marked for caching is kept by hash (`-c`), if anywhere.
    pub cache_dir: Option<PathBuf>,
}

/// Log a line of the server's.
pub(crate) fn log(line: impl AsRef<str>) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "rpc-server: {}", line.as_ref());
}

/// Serve clients on `listener`, for ever: a failed `accept` is logged and serving goes on.
pub fn serve(listener: TcpListener, options: ServerOptions) -> std::io::Result<()> {
    let options = Arc::new(options);
    let active = Arc::new(AtomicUsize::new(0));
    loop {
        let (stream, peer) = match listener.accept() {
            Ok(c) => c,
            // A connection that failed while queued, or no file descriptor left for now:
            // the listener itself is fine, so serving goes on.
            Err(e) => {
                log(format!("accept: {e}"));
                std::thread::sleep(std::time::Duration::from_millis(100));
                continue;
            }
        };
        if active.load(Ordering::Acquire) >= options.max_clients {
            log(format!(
                "{peer}: refused, {} clients are connected",
                options.max_clients
            ));
            drop(stream);
            continue;
        }
        active.fetch_add(1, Ordering::AcqRel);
        let (options, active) = (options.clone(), active.clone());
        std::thread::spawn(move || {
            log(format!("{peer}: connected"));
            match serve_client(stream, &options) {
                Ok(()) => log(format!("{peer}: disconnected")),
                Err(why) => log(format!("{peer}: closed: {}", why.0)),
            }
            active.fetch_sub(1, Ordering::AcqRel);
        });
    }
}

/// Serve one client until it disconnects (`Ok`) or sends something refused (`Err`).
pub fn serve_client(stream: TcpStream, options: &ServerOptions) -> Result<(), Refusal> {
    let _ = stream.set_nodelay(true);
    let reader = stream
        .try_clone()
        .map_err(|e| Refusal(format!("socket: {e}")))?;
    serve_stream(
        BufReader::with_capacity(1 << 16, reader),
        BufWriter::with_capacity(1 << 16, stream),
        options,
    )
}

/// Serve the requests read from `reader`, replies to `writer`, until end of input (`Ok`) or a
/// refusal (`Err`): one client's connection, whatever carries it (a socket, or a fuzzer's
/// bytes).
pub fn serve_stream(
    mut reader: impl Read,
    mut writer: impl Write,
    options: &ServerOptions,
) -> Result<(), Refusal> {
    // The largest frame: a SET_TENSOR of all the client may hold, and its header.
    let limit = options.client_memory as u64 + 4096;
    let io = |e: WireError| Refusal(e.to_string());
    let next = |reader: &mut dyn Read| match wire::read_request(&mut &mut *reader, limit) {
        Ok(r) => Ok(Some(r)),
        Err(WireError::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
        Err(e) => Err(io(e)),
    };

    let Some((command, payload)) = next(&mut reader)? else {
        return Ok(());
    };
    if command != Command::Hello {
        return Err(Refusal(format!("{command:?} before HELLO")));
    }
    Request::decode(command, &payload).map_err(io)?;
    wire::write_response(&mut writer, &session::hello_reply()).map_err(io)?;

    let mut session = Session::new(options);
    while let Some((command, payload)) = next(&mut reader)? {
        let request = Request::decode(command, &payload).map_err(io)?;
        drop(payload);
        let reply = session
            .handle(request)
            .map_err(|r| Refusal(format!("{command:?}: {}", r.0)))?;
        if let Some(reply) = reply {
            wire::write_response(&mut writer, &reply).map_err(io)?;
        }
    }
    Ok(())
}

/// The hash cache of `-c`: SET_TENSOR data the client marks for caching is kept in a file
/// named by its FNV-1a hash (as ggml's server does), and SET_TENSOR_HASH finds it there.
pub(crate) mod cache {
    use super::ServerOptions;
    use crate::wire::fnv1a;

    fn path(options: &ServerOptions, hash: u64) -> Option<std::path::PathBuf> {
        Some(options.cache_dir.as_ref()?.join(format!("{hash:016x}")))
    }

    pub(crate) fn store(options: &ServerOptions, data: &[u8]) {
        if let Some(p) = path(options, fnv1a(data)) {
            if let Err(e) = std::fs::write(&p, data) {
                super::log(format!("cannot cache {}: {e}", p.display()));
            }
        }
    }

    /// The cached bytes of `hash`, if cached and still of that hash.
    pub(crate) fn load(options: &ServerOptions, hash: u64) -> Option<Vec<u8>> {
        let data = std::fs::read(path(options, hash)?).ok()?;
        (fnv1a(&data) == hash).then_some(data)
    }
}
