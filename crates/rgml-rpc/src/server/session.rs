//! One client's connection: its buffers, its streams and its last graph per device, and the
//! handling of each command.
//!
//! Buffers are named to the client by small ids and given made-up base addresses 1 TiB apart
//! (`(id + 1) << 40`), so a client's address maps back to one buffer and an offset by
//! arithmetic alone, and no address of this process is ever shown to the peer. Every byte
//! range a request names is checked against the tensor it describes and against the buffer
//! before anything is touched; a request that fails a check is a [`Refusal`] that ends the
//! connection (as ggml's server does), and allocations past the client's memory cap are
//! refused with a null buffer (ggml's "out of memory" reply), which the connection survives.

use super::graph::{rebuild, Locate, Rebuilt};
use super::{Refusal, ServerOptions};
use crate::wire::{Request, RpcTensor, CONN_CAPS_SIZE, PROTO_VERSION};
use rgml::backend::{Backend, BackendParams, Buffer, DeviceType};
use rgml::{DType, DeviceRef, Tensor};
use std::collections::HashMap;
use std::sync::Arc;

/// Spacing of the made-up base addresses, and so the largest buffer.
const ADDRESS_SPAN: u64 = 1 << 40;

/// What the connection answers, if anything.
pub(crate) type Reply = Option<Vec<u8>>;

struct Held {
    buffer: Arc<Buffer>,
    base: u64,
}

/// One client's state.
pub(crate) struct Session<'a> {
    options: &'a ServerOptions,
    buffers: HashMap<u64, Held>,
    next_id: u64,
    held_bytes: usize,
    backends: Vec<Option<Box<dyn Backend>>>,
    graphs: Vec<Option<Rebuilt>>,
}

fn refuse(why: impl Into<String>) -> Refusal {
    Refusal(why.into())
}

fn u64s(values: &[u64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

impl<'a> Session<'a> {
    pub(crate) fn new(options: &'a ServerOptions) -> Session<'a> {
        let n = options.devices.len();
        Session {
            options,
            buffers: HashMap::new(),
            next_id: 0,
            held_bytes: 0,
            backends: (0..n).map(|_| None).collect(),
            graphs: (0..n).map(|_| None).collect(),
        }
    }

    fn device(&self, index: u32) -> Result<&DeviceRef, Refusal> {
        self.options
            .devices
            .get(index as usize)
            .ok_or_else(|| refuse(format!("device {index} does not exist")))
    }

    /// Handle one request; `Ok(None)`: the command has no reply.
    pub(crate) fn handle(&mut self, req: Request) -> Result<Reply, Refusal> {
        match req {
            Request::Hello { .. } => Err(refuse("a second HELLO")),
            Request::DeviceCount => Ok(Some(
                (self.options.devices.len() as u32).to_le_bytes().to_vec(),
            )),
            Request::GetAlignment { device } => {
                let a = self.device(device)?.buffer_type().alignment();
                Ok(Some(u64s(&[a as u64])))
            }
            Request::GetMaxSize { device } => {
                let m = self.device(device)?.buffer_type().max_size() as u64;
                Ok(Some(u64s(&[m.min(ADDRESS_SPAN - 1)])))
            }
            Request::GetDeviceMemory { device } => {
                let mem = self.device(device)?.memory();
                Ok(Some(u64s(&[mem.free as u64, mem.total as u64])))
            }
            Request::AllocBuffer { device, size } => self.alloc(device, size).map(Some),
            Request::BufferGetBase { buffer } => Ok(Some(u64s(&[self.held(buffer)?.base]))),
            Request::FreeBuffer { buffer } => {
                let held = self
                    .buffers
                    .remove(&buffer)
                    .ok_or_else(|| refuse(format!("FREE_BUFFER of unknown buffer {buffer}")))?;
                self.held_bytes -= held.buffer.size();
                // A stored graph may use the buffer: forget them all rather than keep it alive.
                self.graphs.iter_mut().for_each(|g| *g = None);
                Ok(None)
            }
            Request::BufferClear { buffer, value } => {
                self.held(buffer)?.buffer.clear(value).map_err(core)?;
                Ok(None)
            }
            Request::SetTensor {
                tensor,
                cache,
                offset,
                data,
            } => {
                let (buffer, at) = self.range(&tensor, offset, data.len() as u64)?;
                if cache != 0 {
                    super::cache::store(self.options, &data);
                }
                buffer.set(at, &data).map_err(core)?;
                Ok(None)
            }
            Request::SetTensorHash {
                tensor,
                offset,
                hash,
            } => {
                let Some(data) = super::cache::load(self.options, hash) else {
                    return Ok(Some(vec![0]));
                };
                let (buffer, at) = self.range(&tensor, offset, data.len() as u64)?;
                buffer.set(at, &data).map_err(core)?;
                super::log(format!(
                    "{} bytes written from the cache ({hash:016x})",
                    data.len()
                ));
                Ok(Some(vec![1]))
            }
            Request::GetTensor {
                tensor,
                offset,
                size,
            } => {
                let (buffer, at) = self.range(&tensor, offset, size)?;
                let mut out = vec![0u8; size as usize];
                buffer.get(at, &mut out).map_err(core)?;
                Ok(Some(out))
            }
            Request::MemsetTensor {
                tensor,
                offset,
                size,
                value,
            } => {
                let (buffer, at) = self.range(&tensor, offset, size)?;
                buffer.memset(at, value, size as usize).map_err(core)?;
                Ok(None)
            }
            Request::CopyTensor { src, dst } => self.copy(&src, &dst).map(Some),
            Request::InitTensor { tensor } => {
                // rgml's buffers need no per-tensor set-up; the description is still checked.
                self.range(&tensor, 0, 0)?;
                Ok(None)
            }
            Request::GetAllocSize { device, tensor, .. } => {
                let t = describe(&tensor)?;
                let size = self.device(device)?.buffer_type().alloc_size(&t);
                Ok(Some(u64s(&[size as u64])))
            }
            Request::GraphCompute(graph) => {
                let device = graph.device;
                self.device(device)?;
                let rebuilt = rebuild(&graph, self)?;
                self.check_supported(device, &rebuilt)?;
                self.compute(device, &rebuilt)?;
                self.graphs[device as usize] = Some(rebuilt);
                Ok(None)
            }
            Request::GraphRecompute { device } => {
                self.device(device)?;
                let rebuilt = self.graphs[device as usize]
                    .take()
                    .ok_or_else(|| refuse("GRAPH_RECOMPUTE without a graph"))?;
                let result = self.compute(device, &rebuilt);
                self.graphs[device as usize] = Some(rebuilt);
                result.map(|()| None)
            }
        }
    }

    fn held(&self, buffer: u64) -> Result<&Held, Refusal> {
        self.buffers
            .get(&buffer)
            .ok_or_else(|| refuse(format!("unknown buffer {buffer}")))
    }

    fn alloc(&mut self, device: u32, size: u64) -> Result<Vec<u8>, Refusal> {
        let bt = self.device(device)?.buffer_type();
        let fits = usize::try_from(size)
            .ok()
            .filter(|&s| s < ADDRESS_SPAN as usize)
            .filter(|&s| self.held_bytes.saturating_add(s) <= self.options.client_memory);
        let Some(size) = fits else {
            super::log(format!(
                "refusing a buffer of {size} bytes: {} held, the cap is {}",
                self.held_bytes, self.options.client_memory
            ));
            return Ok(u64s(&[0, 0]));
        };
        let buffer = match Buffer::alloc(&bt, size.max(1)) {
            Ok(b) => b,
            Err(e) => {
                super::log(format!("allocation of {size} bytes failed: {e}"));
                return Ok(u64s(&[0, 0]));
            }
        };
        // Ids start at 1: 0 is the protocol's "no buffer".
        self.next_id += 1;
        let id = self.next_id;
        let base = (id % (u64::MAX / ADDRESS_SPAN)).max(1) * ADDRESS_SPAN;
        self.held_bytes += buffer.size();
        let reply = u64s(&[id, size as u64]);
        self.buffers.insert(id, Held { buffer, base });
        Ok(reply)
    }

    /// The buffer and buffer offset of `size` bytes at `offset` into `tensor`, checked against
    /// the tensor's bytes and the buffer's.
    fn range(
        &self,
        tensor: &RpcTensor,
        offset: u64,
        size: u64,
    ) -> Result<(Arc<Buffer>, usize), Refusal> {
        let nbytes = span(tensor)?;
        if offset.checked_add(size).is_none_or(|end| end > nbytes) {
            return Err(refuse(format!(
                "{size} bytes at offset {offset} of a tensor of {nbytes} bytes"
            )));
        }
        let (buffer, start) = self.locate(tensor.buffer, tensor.data)?;
        let end = (start as u64).checked_add(nbytes);
        if end.is_none_or(|e| e > buffer.size() as u64) {
            return Err(refuse(format!(
                "a tensor of {nbytes} bytes at offset {start} of a buffer of {} bytes",
                buffer.size()
            )));
        }
        Ok((buffer, start + offset as usize))
    }

    fn copy(&self, src: &RpcTensor, dst: &RpcTensor) -> Result<Vec<u8>, Refusal> {
        let n = span(src)?;
        let (from, at) = self.range(src, 0, n)?;
        let (to, to_at) = self.range(dst, 0, 0)?;
        if (to_at as u64)
            .checked_add(n)
            .is_none_or(|e| e > to.size() as u64)
        {
            return Err(refuse("COPY_TENSOR past the end of the destination buffer"));
        }
        let n = n as usize;
        if Arc::ptr_eq(&from, &to) {
            // One buffer: through host memory (the ranges may overlap).
            let mut tmp = vec![0u8; n];
            from.get(at, &mut tmp).map_err(core)?;
            to.set(to_at, &tmp).map_err(core)?;
        } else {
            to.copy_from(to_at, &from, at, n).map_err(core)?;
        }
        Ok(vec![1])
    }

    /// Refuse `rebuilt` unless `device` computes every node of it: checked once, when a graph
    /// arrives, not again for each GRAPH_RECOMPUTE of it.
    fn check_supported(&self, device: u32, rebuilt: &Rebuilt) -> Result<(), Refusal> {
        let dev = self.device(device)?;
        for &n in rebuilt.graph.nodes() {
            if !dev.supports_op(&rebuilt.ctx, n) {
                let t = rebuilt.ctx.get(n).map_err(core)?;
                return Err(refuse(format!(
                    "{} cannot compute {} of tensor '{}'",
                    dev.name(),
                    t.op.kind(),
                    t.display_name()
                )));
            }
        }
        Ok(())
    }

    fn compute(&mut self, device: u32, rebuilt: &Rebuilt) -> Result<(), Refusal> {
        let dev = self.device(device)?.clone();
        let slot = &mut self.backends[device as usize];
        if slot.is_none() {
            let params = match (dev.device_type(), self.options.threads) {
                (DeviceType::Cpu, Some(n)) => format!("n_threads={n}"),
                _ => String::new(),
            };
            let params = BackendParams::parse(&params).map_err(core)?;
            *slot = Some(dev.init_backend(&params).map_err(core)?);
        }
        let Some(backend) = slot.as_mut() else {
            return Err(refuse("internal: no stream"));
        };
        backend
            .graph_compute(&rebuilt.ctx, &rebuilt.graph)
            .map_err(core)
    }
}

impl Locate for Session<'_> {
    fn locate(&self, buffer: u64, address: u64) -> Result<(Arc<Buffer>, usize), Refusal> {
        let held = self.held(buffer)?;
        let offset = address
            .checked_sub(held.base)
            .filter(|&o| o <= held.buffer.size() as u64)
            .ok_or_else(|| refuse(format!("address {address:#x} is outside buffer {buffer}")))?;
        Ok((held.buffer.clone(), offset as usize))
    }
}

/// `tensor`'s dtype and layout as an rgml tensor (no storage), checked: a type rgml knows,
/// whole blocks in a row, and ggml's element stride.
fn describe(tensor: &RpcTensor) -> Result<Tensor, Refusal> {
    let dtype = DType::from_ggml_id(tensor.dtype)
        .map_err(|_| refuse(format!("ggml type {} is not supported", tensor.dtype)))?;
    let ne = tensor.ne.map(|v| v as usize);
    let mut t = Tensor::new(dtype, ne).map_err(core)?;
    let nb = tensor.nb.map(|v| v as usize);
    if nb[0] != t.nb[0] {
        return Err(refuse(format!("element stride {} for {dtype}", nb[0])));
    }
    t.nb = nb;
    Ok(t)
}

/// ggml's plain integer types, which carry bytes (clients address byte ranges as I8 tensors)
/// but which rgml does not compute with: their ggml number and element size.
const BYTE_TYPES: [(u32, u64); 4] = [(24, 1), (25, 2), (26, 4), (27, 8)];

/// The bytes `tensor` spans (ggml's `ggml_nbytes`), for any type rgml knows or a plain
/// integer type, with its layout checked as in [`describe`].
fn span(tensor: &RpcTensor) -> Result<u64, Refusal> {
    let Some(&(_, size)) = BYTE_TYPES.iter().find(|(t, _)| *t == tensor.dtype) else {
        return Ok(describe(tensor)?.nbytes() as u64);
    };
    if tensor.nb[0] as u64 != size {
        return Err(refuse(format!(
            "element stride {} for ggml type {}",
            tensor.nb[0], tensor.dtype
        )));
    }
    if tensor.ne.contains(&0) {
        return Ok(0);
    }
    Ok((0..4).fold(size, |acc, i| {
        acc + (tensor.ne[i] as u64 - 1) * tensor.nb[i] as u64
    }))
}

fn core(e: rgml::Error) -> Refusal {
    Refusal(e.to_string())
}

/// The HELLO reply: our version and no transport capabilities.
pub(crate) fn hello_reply() -> Vec<u8> {
    let mut r = vec![PROTO_VERSION.0, PROTO_VERSION.1, PROTO_VERSION.2, 0];
    r.extend_from_slice(&[0; CONN_CAPS_SIZE]);
    r
}
