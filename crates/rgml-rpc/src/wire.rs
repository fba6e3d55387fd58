//! The wire format of ggml's RPC protocol 7.0 (`ggml/src/ggml-rpc/ggml-rpc.cpp` of ggml 0.25.3):
//! little-endian, packed structures, no padding.
//!
//! A request is `| command (1 byte) | payload size (8 bytes) | payload |`, a response
//! `| payload size (8 bytes) | payload |`. This module owns those frames, the commands, the
//! packed tensor description ([`RpcTensor`], 296 bytes) and the decoding of every request's
//! payload into a [`Request`]. Decoding never trusts a length or a count: a payload that is
//! short, long, or announces more than it holds is a [`WireError`], and a frame larger than the
//! reader's limit is refused before anything is allocated for it.

use std::io::{Read, Write};

/// The protocol version this crate speaks (`RPC_PROTO_*_VERSION`).
pub const PROTO_VERSION: (u8, u8, u8) = (7, 0, 0);

/// Bytes of the transport capabilities a HELLO carries (`RPC_CONN_CAPS_SIZE`).
pub const CONN_CAPS_SIZE: usize = 24;

/// ggml's limits the packed tensor is sized by.
pub const MAX_DIMS: usize = 4;
/// Sources per tensor (`GGML_MAX_SRC`).
pub const MAX_SRC: usize = 10;
/// Operation parameters per tensor, in 32-bit words (`GGML_MAX_OP_PARAMS / 4`).
pub const MAX_OP_PARAMS: usize = 16;
/// Bytes of a tensor's name, NUL-padded (`GGML_MAX_NAME`).
pub const MAX_NAME: usize = 64;

/// Writes larger than this are first offered by hash (SET_TENSOR_HASH), as ggml's client
/// does, so a server that cached them (`-c`) skips the transfer.
pub const HASH_THRESHOLD: usize = 10 << 20;

/// ggml's FNV-1a hash of `data` (SET_TENSOR_HASH and the server's cache file names).
pub fn fnv1a(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Bytes of one packed [`RpcTensor`].
pub const RPC_TENSOR_SIZE: usize =
    8 + 4 + 8 + 4 * MAX_DIMS * 2 + 4 + 4 * MAX_OP_PARAMS + 4 + 8 * MAX_SRC + 8 * 3 + MAX_NAME + 4;

/// Why bytes are not a valid message.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The connection failed or closed.
    #[error("connection: {0}")]
    Io(#[from] std::io::Error),
    /// A command byte the protocol does not have.
    #[error("unknown command {0}")]
    UnknownCommand(u8),
    /// A frame announcing more bytes than the reader accepts.
    #[error("a frame of {size} bytes is over the limit of {limit}")]
    TooLarge {
        /// Announced size.
        size: u64,
        /// The reader's limit.
        limit: u64,
    },
    /// A payload of the wrong length for its command.
    #[error("{what}: {got} bytes, expected {expected}")]
    BadLength {
        /// The message.
        what: &'static str,
        /// Its length.
        got: usize,
        /// What the command needs (the least, for variable-length payloads).
        expected: usize,
    },
}

/// Result of this module.
pub type Result<T> = std::result::Result<T, WireError>;

/// The commands, numbered as ggml's `rpc_cmd`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Command {
    /// Allocate a buffer on a device.
    AllocBuffer = 0,
    /// A device's buffer alignment.
    GetAlignment = 1,
    /// A device's largest buffer.
    GetMaxSize = 2,
    /// A buffer's base address.
    BufferGetBase = 3,
    /// Free a buffer.
    FreeBuffer = 4,
    /// Fill a buffer with a byte.
    BufferClear = 5,
    /// Write bytes into a tensor.
    SetTensor = 6,
    /// Write bytes the server has cached by hash.
    SetTensorHash = 7,
    /// Read bytes of a tensor.
    GetTensor = 8,
    /// Copy one tensor into another.
    CopyTensor = 9,
    /// Compute a graph.
    GraphCompute = 10,
    /// A device's free and total memory.
    GetDeviceMemory = 11,
    /// Initialise a tensor in its buffer.
    InitTensor = 12,
    /// Bytes a tensor needs in a device's buffer.
    GetAllocSize = 13,
    /// The handshake, always first (and always 14).
    Hello = 14,
    /// How many devices the server has.
    DeviceCount = 15,
    /// Compute the last graph again.
    GraphRecompute = 16,
    /// Fill bytes of a tensor.
    MemsetTensor = 17,
}

impl TryFrom<u8> for Command {
    type Error = WireError;

    fn try_from(b: u8) -> Result<Command> {
        use Command::*;
        const ALL: [Command; 18] = [
            AllocBuffer,
            GetAlignment,
            GetMaxSize,
            BufferGetBase,
            FreeBuffer,
            BufferClear,
            SetTensor,
            SetTensorHash,
            GetTensor,
            CopyTensor,
            GraphCompute,
            GetDeviceMemory,
            InitTensor,
            GetAllocSize,
            Hello,
            DeviceCount,
            GraphRecompute,
            MemsetTensor,
        ];
        ALL.get(usize::from(b))
            .copied()
            .ok_or(WireError::UnknownCommand(b))
    }
}

/// A tensor as the protocol describes it (`rpc_tensor`): ids and addresses are the sender's,
/// nothing in it is trusted until the server checks it against its own buffers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RpcTensor {
    /// The sender's identifier (0: none).
    pub id: u64,
    /// ggml type number.
    pub dtype: u32,
    /// The remote buffer (0: none).
    pub buffer: u64,
    /// Elements per dimension.
    pub ne: [u32; MAX_DIMS],
    /// Bytes per step of each dimension.
    pub nb: [u32; MAX_DIMS],
    /// ggml op number.
    pub op: u32,
    /// The op's parameters.
    pub op_params: [i32; MAX_OP_PARAMS],
    /// ggml tensor flags.
    pub flags: i32,
    /// Source ids (0: none).
    pub src: [u64; MAX_SRC],
    /// The viewed tensor's id (0: not a view).
    pub view_src: u64,
    /// Byte offset into the viewed tensor.
    pub view_offs: u64,
    /// The data's address in its buffer.
    pub data: u64,
    /// The name, NUL-padded.
    pub name: [u8; MAX_NAME],
    /// Unused by the protocol; carried as sent.
    pub use_count: i32,
}

impl Default for RpcTensor {
    fn default() -> Self {
        RpcTensor {
            id: 0,
            dtype: 0,
            buffer: 0,
            ne: [0; MAX_DIMS],
            nb: [0; MAX_DIMS],
            op: 0,
            op_params: [0; MAX_OP_PARAMS],
            flags: 0,
            src: [0; MAX_SRC],
            view_src: 0,
            view_offs: 0,
            data: 0,
            name: [0; MAX_NAME],
            use_count: 0,
        }
    }
}

impl RpcTensor {
    /// Append the packed form.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.id.to_le_bytes());
        out.extend_from_slice(&self.dtype.to_le_bytes());
        out.extend_from_slice(&self.buffer.to_le_bytes());
        self.ne
            .iter()
            .for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
        self.nb
            .iter()
            .for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
        out.extend_from_slice(&self.op.to_le_bytes());
        self.op_params
            .iter()
            .for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
        out.extend_from_slice(&self.flags.to_le_bytes());
        self.src
            .iter()
            .for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
        for v in [self.view_src, self.view_offs, self.data] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.name);
        out.extend_from_slice(&self.use_count.to_le_bytes());
    }

    /// Read one packed tensor from `r`.
    fn decode(r: &mut Reader<'_>) -> Result<RpcTensor> {
        let mut t = RpcTensor {
            id: r.u64()?,
            dtype: r.u32()?,
            buffer: r.u64()?,
            ..RpcTensor::default()
        };
        for v in t.ne.iter_mut().chain(t.nb.iter_mut()) {
            *v = r.u32()?;
        }
        t.op = r.u32()?;
        for v in &mut t.op_params {
            *v = r.i32()?;
        }
        t.flags = r.i32()?;
        for v in &mut t.src {
            *v = r.u64()?;
        }
        t.view_src = r.u64()?;
        t.view_offs = r.u64()?;
        t.data = r.u64()?;
        t.name.copy_from_slice(r.bytes(MAX_NAME)?);
        t.use_count = r.i32()?;
        Ok(t)
    }

    /// The name up to its first NUL, lossily decoded.
    pub fn name(&self) -> String {
        let end = self.name.iter().position(|&b| b == 0).unwrap_or(MAX_NAME);
        String::from_utf8_lossy(&self.name[..end]).into_owned()
    }
}

/// A graph to compute: the ids of its nodes in order, and every tensor they reach.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WireGraph {
    /// The device that computes it.
    pub device: u32,
    /// Node ids, in execution order.
    pub nodes: Vec<u64>,
    /// The tensors (nodes, their sources and views' bases).
    pub tensors: Vec<RpcTensor>,
}

/// A decoded request (tensors boxed: they are 296 bytes each).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// The handshake: the client's transport capabilities.
    Hello {
        /// Transport capabilities.
        caps: [u8; CONN_CAPS_SIZE],
    },
    /// How many devices.
    DeviceCount,
    /// Allocate `size` bytes on `device`.
    AllocBuffer {
        /// Device index.
        device: u32,
        /// Bytes.
        size: u64,
    },
    /// A device's alignment.
    GetAlignment {
        /// Device index.
        device: u32,
    },
    /// A device's largest buffer.
    GetMaxSize {
        /// Device index.
        device: u32,
    },
    /// A device's free and total memory.
    GetDeviceMemory {
        /// Device index.
        device: u32,
    },
    /// A buffer's base address.
    BufferGetBase {
        /// The buffer.
        buffer: u64,
    },
    /// Free a buffer.
    FreeBuffer {
        /// The buffer.
        buffer: u64,
    },
    /// Fill a buffer.
    BufferClear {
        /// The buffer.
        buffer: u64,
        /// The byte.
        value: u8,
    },
    /// Write `data` at `offset` bytes into `tensor`.
    SetTensor {
        /// The tensor.
        tensor: Box<RpcTensor>,
        /// Whether the server may cache the data by hash.
        cache: u8,
        /// Byte offset into the tensor.
        offset: u64,
        /// The bytes.
        data: Vec<u8>,
    },
    /// Write data the server cached, named by its hash.
    SetTensorHash {
        /// The tensor.
        tensor: Box<RpcTensor>,
        /// Byte offset into the tensor.
        offset: u64,
        /// The data's hash.
        hash: u64,
    },
    /// Read `size` bytes at `offset` of `tensor`.
    GetTensor {
        /// The tensor.
        tensor: Box<RpcTensor>,
        /// Byte offset.
        offset: u64,
        /// Bytes.
        size: u64,
    },
    /// Copy `src` into `dst`.
    CopyTensor {
        /// Source.
        src: Box<RpcTensor>,
        /// Destination.
        dst: Box<RpcTensor>,
    },
    /// Fill `size` bytes at `offset` of `tensor` with `value`.
    MemsetTensor {
        /// The tensor.
        tensor: Box<RpcTensor>,
        /// Byte offset.
        offset: u64,
        /// Bytes.
        size: u64,
        /// The byte.
        value: u8,
    },
    /// Initialise `tensor` in its buffer.
    InitTensor {
        /// The tensor.
        tensor: Box<RpcTensor>,
    },
    /// Bytes `tensor` (with its sources) needs on `device`.
    GetAllocSize {
        /// Device index.
        device: u32,
        /// The tensor.
        tensor: Box<RpcTensor>,
        /// Its sources (as many as ggml's maximum; unused ones are zero).
        srcs: Vec<RpcTensor>,
    },
    /// Compute a graph.
    GraphCompute(WireGraph),
    /// Compute the last graph of `device` again.
    GraphRecompute {
        /// Device index.
        device: u32,
    },
}

impl Request {
    /// Decode the payload of a `command` request.
    pub fn decode(command: Command, payload: &[u8]) -> Result<Request> {
        let mut r = Reader::new(payload);
        let req = match command {
            Command::Hello => {
                let mut caps = [0u8; CONN_CAPS_SIZE];
                caps.copy_from_slice(r.bytes(CONN_CAPS_SIZE)?);
                Request::Hello { caps }
            }
            Command::DeviceCount => Request::DeviceCount,
            Command::AllocBuffer => Request::AllocBuffer {
                device: r.u32()?,
                size: r.u64()?,
            },
            Command::GetAlignment => Request::GetAlignment { device: r.u32()? },
            Command::GetMaxSize => Request::GetMaxSize { device: r.u32()? },
            Command::GetDeviceMemory => Request::GetDeviceMemory { device: r.u32()? },
            Command::GraphRecompute => Request::GraphRecompute { device: r.u32()? },
            Command::BufferGetBase => Request::BufferGetBase { buffer: r.u64()? },
            Command::FreeBuffer => Request::FreeBuffer { buffer: r.u64()? },
            Command::BufferClear => Request::BufferClear {
                buffer: r.u64()?,
                value: r.u8()?,
            },
            Command::SetTensor => {
                let tensor = Box::new(RpcTensor::decode(&mut r)?);
                let (cache, offset) = (r.u8()?, r.u64()?);
                let data = r.rest().to_vec();
                Request::SetTensor {
                    tensor,
                    cache,
                    offset,
                    data,
                }
            }
            Command::SetTensorHash => Request::SetTensorHash {
                tensor: Box::new(RpcTensor::decode(&mut r)?),
                offset: r.u64()?,
                hash: r.u64()?,
            },
            Command::GetTensor => Request::GetTensor {
                tensor: Box::new(RpcTensor::decode(&mut r)?),
                offset: r.u64()?,
                size: r.u64()?,
            },
            Command::CopyTensor => Request::CopyTensor {
                src: Box::new(RpcTensor::decode(&mut r)?),
                dst: Box::new(RpcTensor::decode(&mut r)?),
            },
            Command::MemsetTensor => Request::MemsetTensor {
                tensor: Box::new(RpcTensor::decode(&mut r)?),
                offset: r.u64()?,
                size: r.u64()?,
                value: r.u8()?,
            },
            Command::InitTensor => Request::InitTensor {
                tensor: Box::new(RpcTensor::decode(&mut r)?),
            },
            Command::GetAllocSize => Request::GetAllocSize {
                device: r.u32()?,
                tensor: Box::new(RpcTensor::decode(&mut r)?),
                srcs: (0..MAX_SRC)
                    .map(|_| RpcTensor::decode(&mut r))
                    .collect::<Result<_>>()?,
            },
            Command::GraphCompute => Request::GraphCompute(decode_graph(&mut r)?),
        };
        r.finish(command)?;
        Ok(req)
    }
}

impl Request {
    /// The command this request is sent with.
    pub fn command(&self) -> Command {
        match self {
            Request::Hello { .. } => Command::Hello,
            Request::DeviceCount => Command::DeviceCount,
            Request::AllocBuffer { .. } => Command::AllocBuffer,
            Request::GetAlignment { .. } => Command::GetAlignment,
            Request::GetMaxSize { .. } => Command::GetMaxSize,
            Request::GetDeviceMemory { .. } => Command::GetDeviceMemory,
            Request::BufferGetBase { .. } => Command::BufferGetBase,
            Request::FreeBuffer { .. } => Command::FreeBuffer,
            Request::BufferClear { .. } => Command::BufferClear,
            Request::SetTensor { .. } => Command::SetTensor,
            Request::SetTensorHash { .. } => Command::SetTensorHash,
            Request::GetTensor { .. } => Command::GetTensor,
            Request::CopyTensor { .. } => Command::CopyTensor,
            Request::MemsetTensor { .. } => Command::MemsetTensor,
            Request::InitTensor { .. } => Command::InitTensor,
            Request::GetAllocSize { .. } => Command::GetAllocSize,
            Request::GraphCompute(_) => Command::GraphCompute,
            Request::GraphRecompute { .. } => Command::GraphRecompute,
        }
    }

    /// The payload, packed as ggml packs it (the inverse of [`Request::decode`]).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            Request::Hello { caps } => out.extend_from_slice(caps),
            Request::DeviceCount => {}
            Request::AllocBuffer { device, size } => {
                put_u32(&mut out, *device);
                put_u64(&mut out, *size);
            }
            Request::GetAlignment { device }
            | Request::GetMaxSize { device }
            | Request::GetDeviceMemory { device }
            | Request::GraphRecompute { device } => put_u32(&mut out, *device),
            Request::BufferGetBase { buffer } | Request::FreeBuffer { buffer } => {
                put_u64(&mut out, *buffer)
            }
            Request::BufferClear { buffer, value } => {
                put_u64(&mut out, *buffer);
                out.push(*value);
            }
            Request::SetTensor {
                tensor,
                cache,
                offset,
                data,
            } => {
                out = set_tensor_header(tensor, *cache, *offset);
                out.extend_from_slice(data);
            }
            Request::SetTensorHash {
                tensor,
                offset,
                hash,
            } => {
                tensor.encode(&mut out);
                put_u64(&mut out, *offset);
                put_u64(&mut out, *hash);
            }
            Request::GetTensor {
                tensor,
                offset,
                size,
            } => {
                tensor.encode(&mut out);
                put_u64(&mut out, *offset);
                put_u64(&mut out, *size);
            }
            Request::CopyTensor { src, dst } => {
                src.encode(&mut out);
                dst.encode(&mut out);
            }
            Request::MemsetTensor {
                tensor,
                offset,
                size,
                value,
            } => {
                tensor.encode(&mut out);
                put_u64(&mut out, *offset);
                put_u64(&mut out, *size);
                out.push(*value);
            }
            Request::InitTensor { tensor } => tensor.encode(&mut out),
            Request::GetAllocSize {
                device,
                tensor,
                srcs,
            } => {
                put_u32(&mut out, *device);
                tensor.encode(&mut out);
                let none = RpcTensor::default();
                (0..MAX_SRC).for_each(|i| srcs.get(i).unwrap_or(&none).encode(&mut out));
            }
            Request::GraphCompute(graph) => graph.encode(&mut out),
        }
        out
    }
}

/// The part of a SET_TENSOR payload before the data (`| tensor | cache flag | offset |`), so a
/// sender can write the data from where it is instead of copying it into one payload.
pub fn set_tensor_header(tensor: &RpcTensor, cache: u8, offset: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(RPC_TENSOR_SIZE + 9);
    tensor.encode(&mut out);
    out.push(cache);
    put_u64(&mut out, offset);
    out
}

impl WireGraph {
    /// Append the packed form (see [`decode_graph`]).
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.reserve(12 + 8 * self.nodes.len() + RPC_TENSOR_SIZE * self.tensors.len());
        put_u32(out, self.device);
        put_u32(out, self.nodes.len() as u32);
        self.nodes.iter().for_each(|&id| put_u64(out, id));
        put_u32(out, self.tensors.len() as u32);
        self.tensors.iter().for_each(|t| t.encode(out));
    }
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// `| device (4) | n_nodes (4) | node ids (8 each) | n_tensors (4) | tensors |`; the counts are
/// checked against the bytes left before anything is allocated for them.
fn decode_graph(r: &mut Reader<'_>) -> Result<WireGraph> {
    let device = r.u32()?;
    let n_nodes = r.count(8, "graph nodes")?;
    let nodes = (0..n_nodes).map(|_| r.u64()).collect::<Result<_>>()?;
    let n_tensors = r.count(RPC_TENSOR_SIZE, "graph tensors")?;
    let tensors = (0..n_tensors)
        .map(|_| RpcTensor::decode(r))
        .collect::<Result<_>>()?;
    Ok(WireGraph {
        device,
        nodes,
        tensors,
    })
}

/// Reads little-endian fields of a payload, each checked against what is left.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf, pos: 0 }
    }

    fn bytes(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        let Some(end) = end else {
            return Err(WireError::BadLength {
                what: "payload",
                got: self.buf.len(),
                expected: self.pos.saturating_add(n),
            });
        };
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.bytes(N)?);
        Ok(a)
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.array::<1>()?[0])
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn i32(&mut self) -> Result<i32> {
        Ok(i32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A u32 count of items of `item` bytes each, which must fit in what is left.
    fn count(&mut self, item: usize, what: &'static str) -> Result<usize> {
        let n = self.u32()? as usize;
        let left = self.buf.len() - self.pos;
        match n.checked_mul(item) {
            Some(bytes) if bytes <= left => Ok(n),
            _ => Err(WireError::BadLength {
                what,
                got: left,
                expected: n.saturating_mul(item),
            }),
        }
    }

    fn rest(&mut self) -> &'a [u8] {
        let out = &self.buf[self.pos..];
        self.pos = self.buf.len();
        out
    }

    /// Nothing may follow a message.
    fn finish(&self, command: Command) -> Result<()> {
        if self.pos == self.buf.len() {
            return Ok(());
        }
        Err(WireError::BadLength {
            what: command_name(command),
            got: self.buf.len(),
            expected: self.pos,
        })
    }
}

fn command_name(c: Command) -> &'static str {
    match c {
        Command::AllocBuffer => "ALLOC_BUFFER",
        Command::GetAlignment => "GET_ALIGNMENT",
        Command::GetMaxSize => "GET_MAX_SIZE",
        Command::BufferGetBase => "BUFFER_GET_BASE",
        Command::FreeBuffer => "FREE_BUFFER",
        Command::BufferClear => "BUFFER_CLEAR",
        Command::SetTensor => "SET_TENSOR",
        Command::SetTensorHash => "SET_TENSOR_HASH",
        Command::GetTensor => "GET_TENSOR",
        Command::CopyTensor => "COPY_TENSOR",
        Command::GraphCompute => "GRAPH_COMPUTE",
        Command::GetDeviceMemory => "GET_DEVICE_MEMORY",
        Command::InitTensor => "INIT_TENSOR",
        Command::GetAllocSize => "GET_ALLOC_SIZE",
        Command::Hello => "HELLO",
        Command::DeviceCount => "DEVICE_COUNT",
        Command::GraphRecompute => "GRAPH_RECOMPUTE",
        Command::MemsetTensor => "MEMSET_TENSOR",
    }
}

/// Read one request frame: its command and payload. A payload announced larger than `limit`
/// bytes is refused before it is read (the connection is then unusable).
pub fn read_request(r: &mut impl Read, limit: u64) -> Result<(Command, Vec<u8>)> {
    let mut cmd = [0u8; 1];
    r.read_exact(&mut cmd)?;
    let command = Command::try_from(cmd[0])?;
    Ok((command, read_sized(r, limit)?))
}

/// Read one response frame's payload (at most `limit` bytes).
pub fn read_response(r: &mut impl Read, limit: u64) -> Result<Vec<u8>> {
    read_sized(r, limit)
}

fn read_sized(r: &mut impl Read, limit: u64) -> Result<Vec<u8>> {
    let mut size = [0u8; 8];
    r.read_exact(&mut size)?;
    let size = u64::from_le_bytes(size);
    if size > limit {
        return Err(WireError::TooLarge { size, limit });
    }
    let mut payload = Vec::new();
    r.take(size).read_to_end(&mut payload)?;
    if payload.len() as u64 != size {
        return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
    }
    Ok(payload)
}

/// Write one request frame.
pub fn write_request(w: &mut impl Write, command: Command, payload: &[u8]) -> Result<()> {
    write_request_parts(w, command, &[payload])
}

/// Write one request frame whose payload is `parts` one after another.
pub fn write_request_parts(w: &mut impl Write, command: Command, parts: &[&[u8]]) -> Result<()> {
    let size: usize = parts.iter().map(|p| p.len()).sum();
    w.write_all(&[command as u8])?;
    w.write_all(&(size as u64).to_le_bytes())?;
    parts.iter().try_for_each(|p| w.write_all(p))?;
    Ok(w.flush()?)
}

/// Write one response frame.
pub fn write_response(w: &mut impl Write, payload: &[u8]) -> Result<()> {
    w.write_all(&(payload.len() as u64).to_le_bytes())?;
    w.write_all(payload)?;
    Ok(w.flush()?)
}

#[cfg(test)]
mod tests;
