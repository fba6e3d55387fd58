//! Host memory for the CPU device: the "CPU" buffer type (64-byte aligned heap blocks) and
//! read-only buffers that wrap caller-owned host memory (e.g. a GGUF file mapping) without
//! copying.
//!
//! This module owns every raw allocation of the crate; kernels only ever see pointers into
//! memory allocated here (or wrapped here), while a [`rgml::backend::HostAccess`] guard is held.

use rgml::backend::{Buffer, BufferImpl, BufferType, DeviceRef, HostMemory};
use rgml::{Error, Result};
use std::alloc::Layout;
use std::any::Any;
use std::ptr::NonNull;
use std::sync::{Arc, Weak};

/// Alignment of CPU buffers and of tensor offsets inside them (a cache line; enough for any
/// SIMD load and for every block struct).
pub const CPU_ALIGNMENT: usize = 64;

/// A zero-initialised, 64-byte aligned heap block. Used for CPU buffers and for the backends'
/// work buffers.
pub(crate) struct AlignedMem {
    ptr: NonNull<u8>,
    size: usize,
}

// SAFETY: `AlignedMem` owns its allocation exclusively (like a `Box<[u8]>`); the raw pointer is
// not shared with anything that outlives it, so moving it across threads is sound.
unsafe impl Send for AlignedMem {}
// SAFETY: `&AlignedMem` only hands out the base pointer; every read or write through it is
// synchronised by the owner (the `Buffer` lock or the backend's `&mut self`).
unsafe impl Sync for AlignedMem {}

impl AlignedMem {
    /// Allocate `size` zeroed bytes (0 allocates nothing).
    pub(crate) fn new(size: usize) -> Result<AlignedMem> {
        if size == 0 {
            return Ok(AlignedMem {
                ptr: NonNull::<[u8; CPU_ALIGNMENT]>::dangling().cast(),
                size: 0,
            });
        }
        let layout =
            Layout::from_size_align(size, CPU_ALIGNMENT).map_err(|_| Error::OutOfMemory {
                buffer_type: "CPU".into(),
                size,
                reason: "size too large for an allocation",
            })?;
        // SAFETY: `layout` has a non-zero size (checked above) and a valid power-of-two
        // alignment, as `alloc_zeroed` requires.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or(Error::OutOfMemory {
            buffer_type: "CPU".into(),
            size,
            reason: "the system allocator failed",
        })?;
        Ok(AlignedMem { ptr, size })
    }

    pub(crate) fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    pub(crate) fn len(&self) -> usize {
        self.size
    }

    /// The bytes (callers must hold whatever lock guards concurrent writers).
    fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `size` initialised (zeroed at allocation) bytes, or dangling
        // and aligned with `size == 0`; writers are excluded by the owner's lock.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.size) }
    }

    /// Mutable view of `len` bytes at `offset`, through a shared reference: the caller
    /// guarantees exclusive access (the `Buffer` write lock) and that the range is in bounds.
    #[allow(clippy::mut_from_ref)]
    fn bytes_mut(&self, offset: usize, len: usize) -> Result<&mut [u8]> {
        if offset.checked_add(len).is_none_or(|end| end > self.size) {
            return Err(Error::OutOfBounds {
                what: "CPU buffer access".into(),
                offset,
                size: len,
                limit: self.size,
            });
        }
        // SAFETY: the range is inside the allocation (checked above); `Buffer` calls every
        // mutating `BufferImpl` method under its exclusive write lock, so no other reference to
        // these bytes exists while the slice lives.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(offset), len) })
    }
}

impl Drop for AlignedMem {
    fn drop(&mut self) {
        if self.size == 0 {
            return;
        }
        if let Ok(layout) = Layout::from_size_align(self.size, CPU_ALIGNMENT) {
            // SAFETY: `ptr` was returned by `alloc_zeroed` with exactly this layout (same size
            // and alignment, validated when allocating) and is freed only here, once.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

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
        let mem = AlignedMem::new(size).map_err(|e| match e {
            Error::OutOfMemory { size, reason, .. } => Error::OutOfMemory {
                buffer_type: self.name.clone(),
                size,
                reason,
            },
            other => other,
        })?;
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

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Storage of a CPU buffer.
pub struct CpuBuffer {
    mem: AlignedMem,
}

impl BufferImpl for CpuBuffer {
    fn base(&self) -> Option<NonNull<u8>> {
        Some(self.mem.ptr())
    }

    fn set(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.mem
            .bytes_mut(offset, data.len())?
            .copy_from_slice(data);
        Ok(())
    }

    fn get(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        let src = self
            .mem
            .bytes()
            .get(offset..offset.saturating_add(out.len()))
            .ok_or_else(|| Error::OutOfBounds {
                what: "CPU buffer read".into(),
                offset,
                size: out.len(),
                limit: self.mem.len(),
            })?;
        out.copy_from_slice(src);
        Ok(())
    }

    fn memset(&self, offset: usize, value: u8, size: usize) -> Result<()> {
        self.mem.bytes_mut(offset, size)?.fill(value);
        Ok(())
    }

    fn copy_from(
        &self,
        dst_offset: usize,
        src: &Buffer,
        src_offset: usize,
        size: usize,
    ) -> Result<bool> {
        // Fast path: any host source is read directly into our bytes. `Buffer::copy_from` holds
        // our write lock and the source's read lock and only calls this for distinct buffers.
        if !src.is_host() {
            return Ok(false);
        }
        let Some(src_base) = src.imp().base() else {
            return Ok(false);
        };
        if src_offset
            .checked_add(size)
            .is_none_or(|end| end > src.size())
        {
            return Err(Error::OutOfBounds {
                what: "copy source".into(),
                offset: src_offset,
                size,
                limit: src.size(),
            });
        }
        let dst = self.mem.bytes_mut(dst_offset, size)?;
        // SAFETY: the source range lies inside the source buffer (checked above), which is a
        // different allocation from ours (distinct buffer ids) and is read-locked by the caller,
        // so nothing writes it while we read.
        let src_bytes =
            unsafe { std::slice::from_raw_parts(src_base.as_ptr().add(src_offset), size) };
        dst.copy_from_slice(src_bytes);
        Ok(true)
    }

    fn clear(&self, value: u8) -> Result<()> {
        self.mem.bytes_mut(0, self.mem.len())?.fill(value);
        Ok(())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A read-only buffer over caller-owned host memory (zero-copy).
pub struct HostMemoryBuffer {
    memory: Arc<dyn HostMemory>,
}

impl HostMemoryBuffer {
    /// Wrap `memory`.
    pub fn new(memory: Arc<dyn HostMemory>) -> Self {
        HostMemoryBuffer { memory }
    }

    fn read_only(&self) -> Error {
        Error::ReadOnlyBuffer("CPU host memory".into())
    }
}

impl BufferImpl for HostMemoryBuffer {
    fn base(&self) -> Option<NonNull<u8>> {
        // Kernels only read through this pointer: graph compute refuses to write into read-only
        // buffers before it runs anything.
        let bytes = self.memory.bytes();
        NonNull::new(bytes.as_ptr().cast_mut())
            .or_else(|| Some(NonNull::<[u8; CPU_ALIGNMENT]>::dangling().cast()))
    }

    fn is_read_only(&self) -> bool {
        true
    }

    fn set(&self, _offset: usize, _data: &[u8]) -> Result<()> {
        Err(self.read_only())
    }

    fn get(&self, offset: usize, out: &mut [u8]) -> Result<()> {
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

    fn memset(&self, _offset: usize, _value: u8, _size: usize) -> Result<()> {
        Err(self.read_only())
    }

    fn clear(&self, _value: u8) -> Result<()> {
        Err(self.read_only())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
