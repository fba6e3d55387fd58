//! Host memory for the CPU device: the "CPU" buffer type (64-byte aligned heap blocks) and
//! read-only buffers that wrap caller-owned host memory (e.g. a GGUF file mapping) without
//! copying.
//!
//! This module owns the crate's buffers (their allocations are core's
//! [`rgml::backend::AlignedMem`]); kernels only ever see pointers into memory allocated or
//! wrapped here, while a [`rgml::backend::HostAccess`] guard is held. Copies from other host
//! memory need nothing here: the core's `Buffer::copy_from` hands their bytes to `set`.

use rgml::backend::{AlignedMem, BufferImpl, BufferType, DeviceRef, HostMemory};
use rgml::{Error, Result};
use std::any::Any;
use std::ptr::NonNull;
use std::sync::{Arc, Weak};

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
        self.mem.write(offset, data)
    }

    fn get(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.mem.read(offset, out)
    }

    fn memset(&self, offset: usize, value: u8, size: usize) -> Result<()> {
        self.mem.fill(offset, value, size)
    }

    fn clear(&self, value: u8) -> Result<()> {
        self.mem.fill(0, value, self.mem.len())
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
