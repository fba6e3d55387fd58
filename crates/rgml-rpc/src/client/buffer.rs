//! A remote device's memory: the buffer type ([`RpcBufferType`]) and its buffers
//! ([`RpcBuffer`]), whose bytes are reached only through SET_TENSOR, GET_TENSOR,
//! MEMSET_TENSOR, COPY_TENSOR and BUFFER_CLEAR.
//!
//! The protocol addresses bytes through tensors, so a byte range of a buffer travels as a
//! one-dimensional I8 tensor at the server's address of that range; ranges over ggml's 32-bit
//! sizes go in pieces.

use super::conn::{le_u64, Connection, Reply};
use crate::wire::{fnv1a, set_tensor_header, Command, Request, RpcTensor, HASH_THRESHOLD};
use rgml::backend::{BufferImpl, BufferType, DeviceRef};
use rgml::{DType, Error, Result, Tensor};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

/// ggml's `GGML_TYPE_I8`.
const GGML_I8: u32 = 24;

/// Largest byte range sent in one message (ggml's sizes on the wire are 32-bit).
const PIECE: usize = 1 << 30;

/// A tensor layout: dtype, sizes and strides.
type Layout = (DType, [usize; 4], [usize; 4]);

/// Memory of one device of a server.
pub struct RpcBufferType {
    pub(crate) name: String,
    pub(crate) conn: Arc<Connection>,
    pub(crate) device_index: u32,
    pub(crate) device: Weak<dyn rgml::Device>,
    pub(crate) alignment: usize,
    pub(crate) max_size: usize,
    /// GET_ALLOC_SIZE answers by (dtype, shape, strides): they never change for a tensor layout.
    pub(crate) alloc_sizes: Mutex<HashMap<Layout, usize>>,
}

impl RpcBufferType {
    /// Whether tensors of this layout ask the server for their size: quantized weights whose
    /// rows are not a multiple of 512 (a CUDA server pads them), as ggml's client does.
    fn asks_alloc_size(tensor: &Tensor) -> bool {
        tensor.dtype.is_quantized() && !tensor.ne[0].is_multiple_of(512) && !tensor.is_view()
    }
}

impl BufferType for RpcBufferType {
    fn name(&self) -> &str {
        &self.name
    }

    fn alloc_buffer(&self, size: usize) -> Result<Box<dyn BufferImpl>> {
        let req = Request::AllocBuffer {
            device: self.device_index,
            size: size as u64,
        };
        let rsp = self.conn.call(&req, Reply::Exactly(16))?;
        let (remote, remote_size) = (le_u64(&rsp, 0), le_u64(&rsp, 8));
        if remote == 0 {
            return Err(Error::OutOfMemory {
                buffer_type: self.name.clone(),
                size,
                reason: "the server refused the allocation",
            });
        }
        let buffer = RpcBuffer {
            conn: self.conn.clone(),
            remote,
            base: 0,
            size: usize::try_from(remote_size).unwrap_or(0),
        };
        if buffer.size < size {
            return Err(Error::Backend {
                backend: self.name.clone(),
                message: format!("asked for {size} bytes, the server gave {remote_size}"),
            });
        }
        let mut buffer = buffer;
        let rsp = self.conn.call(
            &Request::BufferGetBase { buffer: remote },
            Reply::Exactly(8),
        )?;
        buffer.base = le_u64(&rsp, 0);
        Ok(Box::new(buffer))
    }

    fn alignment(&self) -> usize {
        self.alignment
    }

    fn max_size(&self) -> usize {
        self.max_size
    }

    fn alloc_size(&self, tensor: &Tensor) -> usize {
        let nbytes = tensor.nbytes();
        if !Self::asks_alloc_size(tensor) {
            return nbytes;
        }
        let key = (tensor.dtype, tensor.ne, tensor.nb);
        let mut cache = self.alloc_sizes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&size) = cache.get(&key) {
            return size.max(nbytes);
        }
        let Ok(described) = super::describe::describe_unplaced(tensor) else {
            return nbytes;
        };
        let req = Request::GetAllocSize {
            device: self.device_index,
            tensor: Box::new(described),
            srcs: Vec::new(),
        };
        // This slot cannot fail; a lost connection shows at the allocation that follows.
        match self.conn.call(&req, Reply::Exactly(8)) {
            Ok(rsp) => {
                let size = usize::try_from(le_u64(&rsp, 0)).unwrap_or(usize::MAX);
                cache.insert(key, size);
                size.max(nbytes)
            }
            Err(_) => nbytes,
        }
    }

    fn device(&self) -> Option<DeviceRef> {
        self.device.upgrade()
    }
}

/// A buffer on the server: its id there, its base address there, and its size.
pub struct RpcBuffer {
    pub(crate) conn: Arc<Connection>,
    pub(crate) remote: u64,
    pub(crate) base: u64,
    size: usize,
}

impl RpcBuffer {
    /// `len` bytes at `offset` as a one-dimensional I8 tensor.
    fn bytes(&self, offset: usize, len: usize) -> RpcTensor {
        let len32 = len as u32;
        RpcTensor {
            dtype: GGML_I8,
            buffer: self.remote,
            ne: [len32, 1, 1, 1],
            nb: [1, len32, len32, len32],
            data: self.base.wrapping_add(offset as u64),
            ..RpcTensor::default()
        }
    }

    /// `(offset, len)` pieces of at most [`PIECE`] bytes covering `len` bytes at `offset`.
    fn pieces(offset: usize, len: usize) -> impl Iterator<Item = (usize, usize)> {
        (0..len)
            .step_by(PIECE)
            .map(move |at| (offset + at, PIECE.min(len - at)))
    }
}

// SAFETY: `base` returns `None`: nothing dereferences this memory in this process, and every
// method only sends messages, so no byte here is touched outside the caller's lock.
unsafe impl BufferImpl for RpcBuffer {
    fn size(&self) -> usize {
        self.size
    }

    fn init_tensor(&self, tensor: &Tensor) -> Result<()> {
        if !RpcBufferType::asks_alloc_size(tensor) {
            return Ok(());
        }
        let Some(data) = &tensor.data else {
            return Ok(());
        };
        let mut described = super::describe::describe_unplaced(tensor)?;
        described.buffer = self.remote;
        described.data = self.base.wrapping_add(data.offset as u64);
        let req = Request::InitTensor {
            tensor: Box::new(described),
        };
        self.conn.call(&req, Reply::None).map(drop)
    }

    unsafe fn set(&self, offset: usize, data: &[u8]) -> Result<()> {
        let mut sent = 0;
        for (at, len) in Self::pieces(offset, data.len()) {
            let chunk = &data[sent..sent + len];
            sent += len;
            let mut cache = 0;
            if len > HASH_THRESHOLD {
                // Offered by hash first: a server that cached these bytes writes them itself;
                // otherwise they follow, marked for its cache.
                let req = Request::SetTensorHash {
                    tensor: Box::new(self.bytes(at, len)),
                    offset: 0,
                    hash: fnv1a(chunk),
                };
                if self.conn.call(&req, Reply::Exactly(1))?[0] != 0 {
                    continue;
                }
                cache = 1;
            }
            let header = set_tensor_header(&self.bytes(at, len), cache, 0);
            self.conn
                .call_parts(Command::SetTensor, &[&header, chunk], Reply::None)?;
        }
        Ok(())
    }

    unsafe fn get(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        let mut got = 0;
        for (at, len) in Self::pieces(offset, out.len()) {
            let req = Request::GetTensor {
                tensor: Box::new(self.bytes(at, len)),
                offset: 0,
                size: len as u64,
            };
            let rsp = self.conn.call(&req, Reply::Exactly(len))?;
            out[got..got + len].copy_from_slice(&rsp);
            got += len;
        }
        Ok(())
    }

    unsafe fn memset(&self, offset: usize, value: u8, size: usize) -> Result<()> {
        for (at, len) in Self::pieces(offset, size) {
            let req = Request::MemsetTensor {
                tensor: Box::new(self.bytes(at, len)),
                offset: 0,
                size: len as u64,
                value,
            };
            self.conn.call(&req, Reply::None)?;
        }
        Ok(())
    }

    unsafe fn copy_from(
        &self,
        dst_offset: usize,
        src: &dyn BufferImpl,
        src_offset: usize,
        size: usize,
    ) -> Result<bool> {
        let Some(src) = src.downcast_ref::<RpcBuffer>() else {
            return Ok(false);
        };
        if !Arc::ptr_eq(&src.conn, &self.conn) || size == 0 {
            return Ok(size == 0);
        }
        for (k, (at, len)) in Self::pieces(dst_offset, size).enumerate() {
            let req = Request::CopyTensor {
                src: Box::new(src.bytes(src_offset + k * PIECE, len)),
                dst: Box::new(self.bytes(at, len)),
            };
            let rsp = self.conn.call(&req, Reply::Exactly(1))?;
            if rsp[0] == 0 {
                // The server's device cannot copy between these buffers itself: the caller
                // then copies the whole range through host memory.
                return Ok(false);
            }
        }
        Ok(true)
    }

    unsafe fn clear(&self, value: u8) -> Result<()> {
        let req = Request::BufferClear {
            buffer: self.remote,
            value,
        };
        self.conn.call(&req, Reply::None).map(drop)
    }
}

impl Drop for RpcBuffer {
    fn drop(&mut self) {
        // Nothing to do with a failure here: a lost server has freed everything anyway.
        let _ = self.conn.call(
            &Request::FreeBuffer {
                buffer: self.remote,
            },
            Reply::None,
        );
    }
}
