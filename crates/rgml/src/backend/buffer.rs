//! Buffers: what [`Buffer`] does with the storage a backend implements ([`BufferImpl`]), and
//! tensor byte access through it.
//!
//! This module owns the [`Buffer`] wrapper that bounds-checks and locks every access (the type
//! itself is declared in `traits`, beside the traits that hand it out), host access guards,
//! multi-buffers (one logical buffer over several allocations of one buffer type, see
//! [`Buffer::multi`]), and the `Context::tensor_*` byte accessors.
//!
//! # Multi-buffers
//! A buffer type may cap the size of one allocation
//! ([`BufferType::max_size`](super::BufferType::max_size)). Allocators that need more
//! (`alloc::alloc_ctx_tensors` and `alloc::GraphAllocator`) allocate several buffers
//! ("parts"), each at most `max_size`, and wrap them in a multi-buffer, as ggml's
//! `ggml_backend_multi_buffer` does:
//! - tensors point at the part they live in (`TensorData::buffer` is the part, the offset is
//!   relative to that part), so kernels and backends never see a multi-buffer and no tensor
//!   spans two parts;
//! - the multi-buffer owns the parts: it keeps them alive, its size is the sum of theirs, and
//!   [`Buffer::set_usage`], [`Buffer::clear`] and [`Buffer::reset`] apply to every part;
//! - its own bytes are the parts laid end to end (part 0 first), so [`Buffer::set`],
//!   [`Buffer::get`], [`Buffer::memset`] and copies on the multi-buffer itself also work, and may
//!   span parts. It is never host-addressable as a whole ([`Buffer::host_read`] is `None`).

use super::traits::{same_instance, Buffer, BufferImpl, BufferTypeRef};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::tensor::{Tensor, TensorId};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// What a buffer holds; schedulers and allocators treat weights and scratch differently.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufferUsage {
    /// Anything.
    Any = 0,
    /// Model weights (read by ops, not written).
    Weights = 1,
    /// Intermediate results of graph compute.
    Compute = 2,
}

static NEXT_BUFFER_ID: AtomicU64 = AtomicU64::new(1);

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffer")
            .field("type", &self.buffer_type.name())
            .field("size", &self.size)
            .field("id", &self.id)
            .field("parts", &self.parts.len())
            .finish()
    }
}

/// The lock a [`HostAccess`] holds.
enum HostGuard<'a> {
    Read(#[allow(dead_code)] RwLockReadGuard<'a, ()>),
    Write(#[allow(dead_code)] RwLockWriteGuard<'a, ()>),
}

/// Access to a host buffer's bytes while compute runs: shared ([`Buffer::host_read`], only
/// reads through the base pointer are allowed) or exclusive ([`Buffer::host_write`]). The base
/// pointer is valid for `size` bytes as long as the guard lives.
pub struct HostAccess<'a> {
    guard: HostGuard<'a>,
    base: NonNull<u8>,
    size: usize,
}

impl HostAccess<'_> {
    /// Whether the guard is exclusive, so the bytes may be written.
    pub fn is_exclusive(&self) -> bool {
        matches!(self.guard, HostGuard::Write(_))
    }
    /// Start of the memory.
    pub fn base(&self) -> NonNull<u8> {
        self.base
    }
    /// Size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }
}

impl Buffer {
    /// Allocate `size` bytes of `buffer_type`. A size of 0 gives an empty buffer.
    pub fn alloc(buffer_type: &BufferTypeRef, size: usize) -> Result<Arc<Buffer>> {
        if size > buffer_type.max_size() {
            return Err(Error::OutOfMemory {
                buffer_type: buffer_type.name().to_string(),
                size,
                reason: "larger than the buffer type's maximum size",
            });
        }
        // Refused before it is taken: a request beyond what the device has free would
        // otherwise succeed lazily (overcommit) and end with the process killed when touched.
        // (A device that reports no total does not know its memory: nothing to compare.)
        if let Some(device) = buffer_type.device() {
            let memory = device.memory();
            if memory.total > 0 && size > memory.free {
                return Err(Error::InsufficientMemory {
                    device: device.name().to_string(),
                    buffer_type: buffer_type.name().to_string(),
                    size,
                    free: memory.free,
                });
            }
        }
        let imp = buffer_type.alloc_buffer(size)?;
        if imp.size() < size {
            return Err(Error::OutOfMemory {
                buffer_type: buffer_type.name().to_string(),
                size,
                reason: "the buffer type allocated less than asked",
            });
        }
        Ok(Self::wrap(buffer_type.clone(), imp, size))
    }

    /// Wrap a backend's storage (used by devices that make buffers from host memory); the
    /// buffer's size is the storage's.
    pub fn from_impl(buffer_type: BufferTypeRef, imp: Box<dyn BufferImpl>) -> Arc<Buffer> {
        let size = imp.size();
        Self::wrap(buffer_type, imp, size)
    }

    /// `size` is at most `imp.size()`.
    fn wrap(buffer_type: BufferTypeRef, imp: Box<dyn BufferImpl>, size: usize) -> Arc<Buffer> {
        Arc::new(Buffer {
            imp,
            parts: Vec::new(),
            buffer_type,
            size,
            usage: AtomicU8::new(BufferUsage::Any as u8),
            id: NEXT_BUFFER_ID.fetch_add(1, Ordering::Relaxed),
            lock: RwLock::new(()),
        })
    }

    /// One logical buffer over `parts`, several allocations of the same buffer type (ggml's
    /// `ggml_backend_multi_buffer_alloc_buffer`); see the module docs for how tensors address
    /// it. Its size is the sum of the parts' sizes; its usage starts as the first part's.
    ///
    /// Errors: no parts, parts of different buffer types (not the same instance), or a part
    /// that is itself a multi-buffer.
    pub fn multi(parts: Vec<Arc<Buffer>>) -> Result<Arc<Buffer>> {
        let Some(first) = parts.first() else {
            return Err(Error::InvalidParams {
                params: "multi-buffer".into(),
                reason: "a multi-buffer needs at least one part".into(),
            });
        };
        let buffer_type = first.buffer_type.clone();
        let usage = first.usage();
        let mut size = 0usize;
        for p in &parts {
            if !same_instance(&p.buffer_type, &buffer_type) {
                return Err(Error::InvalidParams {
                    params: "multi-buffer".into(),
                    reason: format!(
                        "parts of different buffer types: '{}' and '{}'",
                        buffer_type.name(),
                        p.name()
                    ),
                });
            }
            if p.is_multi() {
                return Err(Error::InvalidParams {
                    params: "multi-buffer".into(),
                    reason: "a part is itself a multi-buffer".into(),
                });
            }
            size = size.checked_add(p.size).ok_or(Error::SizeOverflow)?;
        }
        let buffer = Arc::new(Buffer {
            imp: Box::new(MultiImpl {
                parts: parts.clone(),
            }),
            parts,
            buffer_type,
            size,
            usage: AtomicU8::new(BufferUsage::Any as u8),
            id: NEXT_BUFFER_ID.fetch_add(1, Ordering::Relaxed),
            lock: RwLock::new(()),
        });
        buffer.set_usage(usage);
        Ok(buffer)
    }

    /// Whether this is a multi-buffer (see [`Buffer::multi`]).
    pub fn is_multi(&self) -> bool {
        !self.parts.is_empty()
    }

    /// The parts of a multi-buffer, in address order; empty for a plain buffer.
    pub fn parts(&self) -> &[Arc<Buffer>] {
        &self.parts
    }

    /// Whether a tensor whose storage is `buffer` lives in this buffer: `buffer` is this buffer
    /// or one of its parts.
    pub fn holds(&self, buffer: &Buffer) -> bool {
        self.id == buffer.id || self.parts.iter().any(|p| p.id == buffer.id)
    }

    /// Size in bytes (for a multi-buffer, the sum of its parts).
    pub fn size(&self) -> usize {
        self.size
    }

    /// A process-unique id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The buffer type's name.
    pub fn name(&self) -> &str {
        self.buffer_type.name()
    }

    /// The buffer type.
    pub fn buffer_type(&self) -> &BufferTypeRef {
        &self.buffer_type
    }

    /// Whether the bytes are plain host memory.
    pub fn is_host(&self) -> bool {
        self.buffer_type.is_host() && self.imp.base().is_some()
    }

    /// Whether writes are refused.
    pub fn is_read_only(&self) -> bool {
        self.imp.is_read_only()
    }

    /// What the buffer holds.
    pub fn usage(&self) -> BufferUsage {
        match self.usage.load(Ordering::Relaxed) {
            1 => BufferUsage::Weights,
            2 => BufferUsage::Compute,
            _ => BufferUsage::Any,
        }
    }

    /// Declare what the buffer holds (for a multi-buffer, every part too).
    pub fn set_usage(&self, usage: BufferUsage) {
        self.usage.store(usage as u8, Ordering::Relaxed);
        for p in &self.parts {
            p.set_usage(usage);
        }
    }

    /// Alignment of tensor offsets.
    pub fn alignment(&self) -> usize {
        self.buffer_type.alignment()
    }

    /// Bytes `tensor` needs in this buffer.
    pub fn alloc_size(&self, tensor: &Tensor) -> usize {
        self.buffer_type.alloc_size(tensor)
    }

    /// The implementation, for backends that downcast to their own type. Its byte methods are
    /// `unsafe` (they need this buffer's lock): use the buffer's own methods for the bytes.
    pub fn imp(&self) -> &dyn BufferImpl {
        self.imp.as_ref()
    }

    /// Let the implementation prepare a tensor placed here.
    pub fn init_tensor(&self, tensor: &Tensor) -> Result<()> {
        self.imp.init_tensor(tensor)
    }

    fn check(&self, what: &str, offset: usize, size: usize) -> Result<()> {
        if offset.checked_add(size).is_none_or(|end| end > self.size) {
            return Err(Error::OutOfBounds {
                what: format!("{what} in buffer '{}'", self.name()),
                offset,
                size,
                limit: self.size,
            });
        }
        Ok(())
    }

    fn check_writable(&self) -> Result<()> {
        if self.imp.is_read_only() {
            return Err(Error::ReadOnlyBuffer(self.name().to_string()));
        }
        Ok(())
    }

    /// Write `data` at byte `offset`.
    pub fn set(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check("write", offset, data.len())?;
        self.check_writable()?;
        let _guard = self.lock.write().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the exclusive lock is held.
        unsafe { self.imp.set(offset, data) }
    }

    /// Read `out.len()` bytes at byte `offset`.
    pub fn get(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check("read", offset, out.len())?;
        let _guard = self.lock.read().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the shared lock is held.
        unsafe { self.imp.get(offset, out) }
    }

    /// Fill `size` bytes at `offset` with `value`.
    pub fn memset(&self, offset: usize, value: u8, size: usize) -> Result<()> {
        self.check("memset", offset, size)?;
        self.check_writable()?;
        let _guard = self.lock.write().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the exclusive lock is held.
        unsafe { self.imp.memset(offset, value, size) }
    }

    /// Fill the whole buffer with `value` (for a multi-buffer, every part).
    pub fn clear(&self, value: u8) -> Result<()> {
        self.check_writable()?;
        let _guard = self.lock.write().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the exclusive lock is held.
        unsafe { self.imp.clear(value) }
    }

    /// Forget per-tensor state (for a multi-buffer, in every part).
    pub fn reset(&self) {
        self.imp.reset()
    }

    /// Copy `size` bytes from `src` at `src_offset` to this buffer at `dst_offset`: directly if
    /// the implementation can, else through host memory.
    pub fn copy_from(
        &self,
        dst_offset: usize,
        src: &Buffer,
        src_offset: usize,
        size: usize,
    ) -> Result<()> {
        self.check("copy destination", dst_offset, size)?;
        src.check("copy source", src_offset, size)?;
        self.check_writable()?;
        if self.id != src.id {
            let done = {
                // Lock in id order, the order compute paths use, so a copy never deadlocks
                // with an asynchronous backend that holds one of the two buffers.
                let (_dst, _src);
                if self.id < src.id {
                    _dst = self.lock.write().unwrap_or_else(|e| e.into_inner());
                    _src = src.lock.read().unwrap_or_else(|e| e.into_inner());
                } else {
                    _src = src.lock.read().unwrap_or_else(|e| e.into_inner());
                    _dst = self.lock.write().unwrap_or_else(|e| e.into_inner());
                }
                // SAFETY: this buffer's exclusive lock and the (different) source's shared lock
                // are held.
                let direct = unsafe {
                    self.imp
                        .copy_from(dst_offset, src.imp(), src_offset, size)?
                };
                direct || self.set_from_host(dst_offset, src, src_offset, size)?
            };
            if done {
                return Ok(());
            }
        }
        let mut staging = vec![0u8; size];
        src.get(src_offset, &mut staging)?;
        self.set(dst_offset, &staging)
    }

    /// The copy of a host-addressable source: its bytes go straight to this buffer's `set`,
    /// without a staging vector. `Ok(false)` for a source the host cannot address. The caller
    /// holds this buffer's write lock and the (distinct) source's read lock.
    fn set_from_host(
        &self,
        dst_offset: usize,
        src: &Buffer,
        src_offset: usize,
        size: usize,
    ) -> Result<bool> {
        if !src.is_host() {
            return Ok(false);
        }
        let Some(base) = src.imp.base() else {
            return Ok(false);
        };
        if size == 0 {
            return Ok(true);
        }
        // SAFETY: `base` is valid for the source's `size` bytes of host memory and the range is
        // inside it (`copy_from` checked it); the caller holds the source's read lock, so nothing
        // writes those bytes while the slice lives, and the source is a different buffer from
        // this one, so the slice never aliases what `set` writes.
        let bytes = unsafe { std::slice::from_raw_parts(base.as_ptr().add(src_offset), size) };
        // SAFETY: the caller holds this buffer's exclusive lock.
        unsafe { self.imp.set(dst_offset, bytes)? };
        Ok(true)
    }

    /// Shared access to the host bytes for computing with them (reads only); `None` for
    /// device memory. Compute code holds [`host_read`](Self::host_read) or
    /// [`host_write`](Self::host_write) for every buffer it touches (in [`Buffer::id`] order,
    /// to avoid deadlocks) while it accesses the bytes through the base pointer. Several
    /// computations may hold shared access to one buffer (weights) at once.
    pub fn host_read(&self) -> Option<HostAccess<'_>> {
        let base = self.imp.base()?;
        let guard = self.lock.read().unwrap_or_else(|e| e.into_inner());
        Some(HostAccess {
            guard: HostGuard::Read(guard),
            base,
            size: self.size,
        })
    }

    /// Exclusive access to the host bytes for computing in place (reads and writes); `None`
    /// for device memory. See [`host_read`](Self::host_read).
    pub fn host_write(&self) -> Option<HostAccess<'_>> {
        let base = self.imp.base()?;
        let guard = self.lock.write().unwrap_or_else(|e| e.into_inner());
        Some(HostAccess {
            guard: HostGuard::Write(guard),
            base,
            size: self.size,
        })
    }
}

/// The storage of a multi-buffer: its parts laid end to end. Accesses are bounds-checked by
/// [`Buffer`] against the total size and split at part boundaries; each piece goes through the
/// part's own [`Buffer`] (its checks and its lock).
struct MultiImpl {
    parts: Vec<Arc<Buffer>>,
}

impl MultiImpl {
    /// Call `f(part, offset in the part, offset in the request, length)` for each piece of the
    /// byte range `[offset, offset + size)`.
    fn each(
        &self,
        offset: usize,
        size: usize,
        mut f: impl FnMut(&Buffer, usize, usize, usize) -> Result<()>,
    ) -> Result<()> {
        let end = offset.checked_add(size).ok_or(Error::SizeOverflow)?;
        let mut start = 0usize;
        for p in &self.parts {
            let p_end = start + p.size();
            let lo = offset.max(start);
            let hi = end.min(p_end);
            if lo < hi {
                f(p, lo - start, lo - offset, hi - lo)?;
            }
            start = p_end;
            if start >= end {
                break;
            }
        }
        Ok(())
    }
}

// SAFETY: a multi-buffer has no base; every byte access goes through the parts' own `Buffer`
// methods, which take the parts' locks.
unsafe impl BufferImpl for MultiImpl {
    fn size(&self) -> usize {
        self.parts.iter().map(|p| p.size()).sum()
    }
    fn is_read_only(&self) -> bool {
        self.parts.iter().any(|p| p.is_read_only())
    }
    fn init_tensor(&self, tensor: &Tensor) -> Result<()> {
        // Tensors belong in a part; one placed in the multi-buffer itself is announced to every
        // part, so a backend with per-tensor state still sees it.
        for p in &self.parts {
            p.init_tensor(tensor)?;
        }
        Ok(())
    }
    unsafe fn set(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.each(offset, data.len(), |p, at, from, len| {
            p.set(at, &data[from..from + len])
        })
    }
    unsafe fn get(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.each(offset, out.len(), |p, at, from, len| {
            p.get(at, &mut out[from..from + len])
        })
    }
    unsafe fn memset(&self, offset: usize, value: u8, size: usize) -> Result<()> {
        self.each(offset, size, |p, at, _, len| p.memset(at, value, len))
    }
    unsafe fn clear(&self, value: u8) -> Result<()> {
        for p in &self.parts {
            p.clear(value)?;
        }
        Ok(())
    }
    fn reset(&self) {
        for p in &self.parts {
            p.reset();
        }
    }
}

fn storage(ctx: &Context, id: TensorId) -> Result<(&Tensor, &Arc<Buffer>, usize)> {
    let t = ctx.get(id)?;
    let data = t
        .data
        .as_ref()
        .ok_or_else(|| Error::NoStorage(t.display_name().to_string()))?;
    Ok((t, &data.buffer, data.offset))
}

impl Context {
    /// Write raw bytes into tensor `id` at byte `offset` (ggml's `tensor_set`).
    pub fn tensor_set(&self, id: TensorId, offset: usize, data: &[u8]) -> Result<()> {
        let (t, buffer, base) = storage(self, id)?;
        t.check_range(offset, data.len())?;
        buffer.set(base + offset, data)
    }

    /// Read raw bytes of tensor `id` at byte `offset` (ggml's `tensor_get`).
    pub fn tensor_get(&self, id: TensorId, offset: usize, out: &mut [u8]) -> Result<()> {
        let (t, buffer, base) = storage(self, id)?;
        t.check_range(offset, out.len())?;
        buffer.get(base + offset, out)
    }

    /// Fill `size` bytes of tensor `id` at `offset` with `value`.
    pub fn tensor_memset(&self, id: TensorId, offset: usize, value: u8, size: usize) -> Result<()> {
        let (t, buffer, base) = storage(self, id)?;
        t.check_range(offset, size)?;
        buffer.memset(base + offset, value, size)
    }

    /// All bytes of tensor `id` (its `nbytes` span).
    pub fn tensor_bytes(&self, id: TensorId) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.get(id)?.nbytes()];
        self.tensor_get(id, 0, &mut out)?;
        Ok(out)
    }

    /// Write f32 values into a contiguous f32 tensor (length must equal its element count).
    pub fn tensor_set_f32(&self, id: TensorId, values: &[f32]) -> Result<()> {
        self.check_plain(id, crate::DType::F32, values.len())?;
        self.tensor_set(id, 0, bytemuck::cast_slice(values))
    }

    /// Read a contiguous f32 tensor.
    pub fn tensor_get_f32(&self, id: TensorId) -> Result<Vec<f32>> {
        let mut out = vec![0f32; self.get(id)?.nelements()];
        self.tensor_get_f32_into(id, &mut out)?;
        Ok(out)
    }

    /// Read a contiguous f32 tensor into `out`, whose length must be its element count (for
    /// callers that read the same tensor repeatedly into one buffer).
    pub fn tensor_get_f32_into(&self, id: TensorId, out: &mut [f32]) -> Result<()> {
        self.check_plain(id, crate::DType::F32, out.len())?;
        self.tensor_get(id, 0, bytemuck::cast_slice_mut(out))
    }

    /// Write i32 values into a contiguous i32 tensor.
    pub fn tensor_set_i32(&self, id: TensorId, values: &[i32]) -> Result<()> {
        self.check_plain(id, crate::DType::I32, values.len())?;
        self.tensor_set(id, 0, bytemuck::cast_slice(values))
    }

    /// Read a contiguous i32 tensor.
    pub fn tensor_get_i32(&self, id: TensorId) -> Result<Vec<i32>> {
        let n = self.get(id)?.nelements();
        self.check_plain(id, crate::DType::I32, n)?;
        let mut out = vec![0i32; n];
        self.tensor_get(id, 0, bytemuck::cast_slice_mut(&mut out))?;
        Ok(out)
    }

    fn check_plain(&self, id: TensorId, dtype: crate::DType, len: usize) -> Result<()> {
        let t = self.get(id)?;
        if t.dtype != dtype {
            return Err(Error::DTypeMismatch {
                tensor: t.display_name().to_string(),
                dtype: t.dtype,
                asked: dtype,
            });
        }
        if !t.is_contiguous() {
            return Err(Error::NotContiguous(t.display_name().to_string()));
        }
        if len != t.nelements() {
            return Err(Error::ValueCount {
                tensor: t.display_name().to_string(),
                n_elements: t.nelements(),
                given: len,
            });
        }
        Ok(())
    }

    /// Copy the bytes of `src` into `dst` (same layout; any buffers), ggml's `tensor_copy`.
    pub fn tensor_copy(&self, src: TensorId, dst: TensorId) -> Result<()> {
        let (ts, sbuf, soff) = storage(self, src)?;
        let (td, dbuf, doff) = storage(self, dst)?;
        if ts.nbytes() != td.nbytes() || ts.dtype != td.dtype {
            return Err(Error::ShapeMismatch {
                op: crate::OpKind::Cpy,
                lhs: ts.ne,
                rhs: td.ne,
                reason: "tensor copy needs the same dtype and size",
            });
        }
        dbuf.copy_from(doff, sbuf, soff, ts.nbytes())
    }
}
