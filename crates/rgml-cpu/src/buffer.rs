//! Host memory for the CPU device: the "CPU" buffer type (64-byte aligned heap blocks) and
//! read-only buffers that wrap caller-owned host memory (e.g. a GGUF file mapping) without
//! copying.
//!
//! This module owns the crate's buffers (their allocations are core's
//! [`rgml::backend::AlignedMem`]); kernels only ever see pointers into memory allocated or
//! wrapped here, while a [`rgml::backend::HostAccess`] guard is held. Copies from other host
//! memory need nothing here: the core's `Buffer::copy_from` hands their bytes to `set`.

use crate::kernels::tiles::repack;
use rgml::backend::{AlignedMem, BufferImpl, BufferType, BufferTypeRef, DeviceRef, HostMemory};
use rgml::{DType, Error, OpKind, Result, Tensor};
use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, Weak};

/// Alignment of CPU buffers and of tensor offsets inside them (a cache line; enough for any
/// SIMD load and for every block struct).
pub const CPU_ALIGNMENT: usize = 64;

/// The CPU device's buffer type: plain host memory.
pub struct CpuBufferType {
    name: String,
    device: Weak<dyn rgml::Device>,
}

impl CpuBufferType {
    /// A buffer type called `name`, owned by `device` (a weak link: devices own their buffer
    /// types, not the other way round).
    pub fn new(name: impl Into<String>, device: Weak<dyn rgml::Device>) -> Self {
        CpuBufferType {
            name: name.into(),
            device,
        }
    }
}

impl BufferType for CpuBufferType {
    fn name(&self) -> &str {
        &self.name
    }

    fn alloc_buffer(&self, size: usize) -> Result<Box<dyn BufferImpl>> {
        let mem = AlignedMem::new(size, CPU_ALIGNMENT, &self.name)?;
        Ok(Box::new(CpuBuffer { mem }))
    }

    fn alignment(&self) -> usize {
        CPU_ALIGNMENT
    }

    fn is_host(&self) -> bool {
        true
    }

    fn device(&self) -> Option<DeviceRef> {
        self.device.upgrade()
    }

    /// [`AlignedMem`] is allocated zeroed (pages the kernel maps in on first touch).
    fn alloc_is_zeroed(&self) -> bool {
        true
    }
}

/// Storage of a CPU buffer.
pub struct CpuBuffer {
    mem: AlignedMem,
}

// SAFETY: `base` is the start of the `AlignedMem` this buffer owns (valid, initialised and
// fixed for its life, `size` bytes); the byte methods touch it only under the caller's lock
// (their contract).
unsafe impl BufferImpl for CpuBuffer {
    fn size(&self) -> usize {
        self.mem.len()
    }

    fn base(&self) -> Option<NonNull<u8>> {
        Some(self.mem.ptr())
    }

    unsafe fn set(&self, offset: usize, data: &[u8]) -> Result<()> {
        // SAFETY: the caller holds the lock this method requires (its contract).
        unsafe { self.mem.write(offset, data) }
    }

    unsafe fn get(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        // SAFETY: the caller holds the lock this method requires (its contract).
        unsafe { self.mem.read(offset, out) }
    }

    unsafe fn memset(&self, offset: usize, value: u8, size: usize) -> Result<()> {
        // SAFETY: the caller holds the lock this method requires (its contract).
        unsafe { self.mem.fill(offset, value, size) }
    }

    unsafe fn clear(&self, value: u8) -> Result<()> {
        // SAFETY: the caller holds the lock this method requires (its contract).
        unsafe { self.mem.fill(0, value, self.mem.len()) }
    }
}

/// A read-only buffer over caller-owned host memory (zero-copy).
pub struct HostMemoryBuffer {
    memory: Arc<dyn HostMemory>,
    /// Where `memory`'s bytes are, taken once: the address kernels read through.
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: `base` points into `memory`, which is `Send + Sync` and only ever read.
unsafe impl Send for HostMemoryBuffer {}
// SAFETY: as for `Send`: shared access only reads the wrapped memory.
unsafe impl Sync for HostMemoryBuffer {}

impl HostMemoryBuffer {
    /// Wrap `memory`.
    pub fn new(memory: Arc<dyn HostMemory>) -> Self {
        let bytes = memory.bytes();
        let len = bytes.len();
        let base = NonNull::new(bytes.as_ptr().cast_mut())
            .unwrap_or_else(|| NonNull::<[u8; CPU_ALIGNMENT]>::dangling().cast());
        HostMemoryBuffer { memory, base, len }
    }

    fn read_only(&self) -> Error {
        Error::ReadOnlyBuffer("CPU host memory".into())
    }
}

// SAFETY: `base` is the start of the wrapped memory, captured once at construction: the
// `Arc<dyn HostMemory>` kept here holds it alive and unchanged, `len` bytes, never written
// (`is_read_only`, and every write method fails).
unsafe impl BufferImpl for HostMemoryBuffer {
    fn size(&self) -> usize {
        self.len
    }

    fn base(&self) -> Option<NonNull<u8>> {
        // Kernels only read through this pointer: graph compute refuses to write into read-only
        // buffers before it runs anything.
        Some(self.base)
    }

    fn is_read_only(&self) -> bool {
        true
    }

    unsafe fn set(&self, _offset: usize, _data: &[u8]) -> Result<()> {
        Err(self.read_only())
    }

    unsafe fn get(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        let bytes = self.memory.bytes();
        let src = bytes
            .get(offset..offset.saturating_add(out.len()))
            .ok_or_else(|| Error::OutOfBounds {
                what: "host memory read".into(),
                offset,
                size: out.len(),
                limit: bytes.len(),
            })?;
        out.copy_from_slice(src);
        Ok(())
    }

    unsafe fn memset(&self, _offset: usize, _value: u8, _size: usize) -> Result<()> {
        Err(self.read_only())
    }

    unsafe fn clear(&self, _value: u8) -> Result<()> {
        Err(self.read_only())
    }
}

/// The CPU's repacking buffer type (ggml's CPU_REPACK): Q4_0 / Q4_1 / Q8_0 weights that only
/// MUL_MAT and GET_ROWS read, stored with every 4 rows interleaved block by block
/// ([`crate::kernels::repack`]), so the matrix kernels load four rows' scales and quants with
/// one load each instead of gathering them from four streams.
///
/// Its memory is not plain host memory to anyone else (`is_host` is false): `set` packs,
/// `get` unpacks, so other backends and `tensor_get` see the usual layout; only the CPU
/// kernels read the packed bytes.
pub struct CpuRepackBufferType {
    name: String,
    device: Weak<dyn rgml::Device>,
}

impl CpuRepackBufferType {
    /// The repacking memory of `device`, called `name`.
    pub fn new(name: impl Into<String>, device: Weak<dyn rgml::Device>) -> Self {
        CpuRepackBufferType {
            name: name.into(),
            device,
        }
    }

    /// Whether `buffer_type` is a repacking buffer type (whose tensors the kernels must read
    /// packed).
    pub fn is_repack(buffer_type: &BufferTypeRef) -> bool {
        buffer_type.is::<CpuRepackBufferType>()
    }
}

/// Whether a tensor of this dtype and shape can be stored packed: a repacked dtype, whole
/// blocks per row, whole groups of rows per matrix, dense.
pub(crate) fn packable(tensor: &Tensor) -> bool {
    let dense =
        rgml::tensor::contiguous_strides(tensor.dtype, tensor.ne).is_ok_and(|nb| nb == tensor.nb);
    repack::supported(tensor.dtype)
        && tensor.view_src.is_none()
        && dense
        && tensor.ne[0] > 0
        && tensor.ne[0].is_multiple_of(tensor.dtype.block_size())
        && tensor.ne[1].is_multiple_of(repack::GROUP_ROWS)
}

impl BufferType for CpuRepackBufferType {
    fn name(&self) -> &str {
        &self.name
    }

    fn alloc_buffer(&self, size: usize) -> Result<Box<dyn BufferImpl>> {
        let mem = AlignedMem::new(size, CPU_ALIGNMENT, &self.name)?;
        Ok(Box::new(RepackBuffer {
            mem,
            tensors: Mutex::new(BTreeMap::new()),
        }))
    }

    fn alignment(&self) -> usize {
        CPU_ALIGNMENT
    }

    fn device(&self) -> Option<DeviceRef> {
        self.device.upgrade()
    }

    /// Packable matrices that matrix products read (and row lookups, which unpack one row).
    fn accepts_weight(&self, tensor: &Tensor, uses: &[OpKind]) -> bool {
        packable(tensor)
            && uses.contains(&OpKind::MulMat)
            && uses
                .iter()
                .all(|u| matches!(u, OpKind::MulMat | OpKind::GetRows))
    }
}

/// A tensor stored packed: what its bytes hold.
#[derive(Clone, Debug)]
struct Packed {
    dtype: DType,
    ne0: usize,
    nbytes: usize,
    /// Bytes of one group of interleaved rows (the unit of every write).
    group_bytes: usize,
    name: String,
}

/// Storage of a repacking buffer: the packed bytes and the tensors placed in them (recorded by
/// `init_tensor`, which is how `set` and `get` know the layout of a byte range).
pub struct RepackBuffer {
    mem: AlignedMem,
    tensors: Mutex<BTreeMap<usize, Packed>>,
}

impl RepackBuffer {
    /// The tensor whose bytes hold `[offset, offset + size)`, with the range relative to the
    /// tensor; an error for a range outside every tensor or across tensors.
    fn tensor_at(&self, what: &str, offset: usize, size: usize) -> Result<(usize, Packed)> {
        let tensors = self.tensors.lock().unwrap_or_else(|p| p.into_inner());
        let found = tensors
            .range(..=offset)
            .next_back()
            .filter(|(&start, t)| offset + size <= start + t.nbytes);
        match found {
            Some((&start, t)) => Ok((offset - start, t.clone())),
            None => Err(Error::Unsupported {
                backend: "CPU".into(),
                what: format!(
                    "{what} of bytes {offset}..{} of a repacked buffer: only tensors placed \
                     in it can be read and written",
                    offset + size
                ),
            }),
        }
    }
}

// SAFETY: `base` is the start of the `AlignedMem` this buffer owns (valid, initialised and
// fixed for its life, `size` bytes); the byte methods touch it only under the caller's lock
// (their contract).
unsafe impl BufferImpl for RepackBuffer {
    fn size(&self) -> usize {
        self.mem.len()
    }

    fn base(&self) -> Option<NonNull<u8>> {
        Some(self.mem.ptr())
    }

    fn init_tensor(&self, tensor: &Tensor) -> Result<()> {
        if tensor.view_src.is_some() {
            return Err(Error::Unsupported {
                backend: "CPU".into(),
                what: format!(
                    "view '{}' of a repacked weight (rows are interleaved there)",
                    tensor.display_name()
                ),
            });
        }
        if !packable(tensor) {
            return Err(Error::Unsupported {
                backend: "CPU".into(),
                what: format!(
                    "tensor '{}' ({} {:?}) in repacked memory: it takes dense {} matrices \
                     of whole blocks and whole groups of {} rows",
                    tensor.display_name(),
                    tensor.dtype,
                    tensor.ne,
                    "Q4_0/Q4_1/Q8_0",
                    repack::GROUP_ROWS
                ),
            });
        }
        let Some(data) = tensor.data.as_ref() else {
            return Ok(());
        };
        let entry = Packed {
            dtype: tensor.dtype,
            ne0: tensor.ne[0],
            nbytes: tensor.nbytes(),
            group_bytes: tensor.dtype.row_bytes(tensor.ne[0])? * repack::GROUP_ROWS,
            name: tensor.display_name().to_string(),
        };
        let mut tensors = self.tensors.lock().unwrap_or_else(|p| p.into_inner());
        tensors.insert(data.offset, entry);
        Ok(())
    }

    unsafe fn set(&self, offset: usize, data: &[u8]) -> Result<()> {
        let (at, t) = self.tensor_at("a write", offset, data.len())?;
        let group = t.group_bytes;
        if group == 0 || !at.is_multiple_of(group) || !data.len().is_multiple_of(group) {
            return Err(Error::Unsupported {
                backend: "CPU".into(),
                what: format!(
                    "a write of {} bytes at {at} into repacked '{}': writes cover whole groups \
                     of {} rows ({group} bytes)",
                    data.len(),
                    t.name,
                    repack::GROUP_ROWS
                ),
            });
        }
        let mut packed = vec![0u8; data.len()];
        repack::pack(t.dtype, t.ne0, data, &mut packed)?;
        // SAFETY: the caller holds the lock this method requires (its contract).
        unsafe { self.mem.write(offset, &packed) }
    }

    unsafe fn get(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        let (at, t) = self.tensor_at("a read", offset, out.len())?;
        let group = t.group_bytes.max(1);
        // The whole groups holding the range, unpacked, then the range cut out of them.
        let first = at / group * group;
        let end = (at + out.len()).div_ceil(group) * group;
        let mut packed = vec![0u8; end - first];
        // SAFETY: the caller holds the buffer's lock (this method's contract).
        unsafe { self.mem.read(offset - (at - first), &mut packed)? };
        let mut plain = vec![0u8; end - first];
        repack::unpack(t.dtype, t.ne0, &packed, &mut plain)?;
        out.copy_from_slice(&plain[at - first..at - first + out.len()]);
        Ok(())
    }

    /// A fill writes the same byte everywhere, which reads the same in any layout.
    unsafe fn memset(&self, offset: usize, value: u8, size: usize) -> Result<()> {
        // SAFETY: the caller holds the lock this method requires (its contract).
        unsafe { self.mem.fill(offset, value, size) }
    }

    unsafe fn clear(&self, value: u8) -> Result<()> {
        // SAFETY: the caller holds the lock this method requires (its contract).
        unsafe { self.mem.fill(0, value, self.mem.len()) }
    }

    fn reset(&self) {
        self.tensors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }
}
