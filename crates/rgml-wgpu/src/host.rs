//! The wgpu device's host buffer type ([`rgml::Device::host_buffer_type`]): page-aligned,
//! zero-initialised host memory used for staging between the host and a wgpu device.
//!
//! This module owns the host buffers (page-aligned [`AlignedMem`] from the core). The memory
//! is plain host memory (`is_host`), so the CPU backend computes on it directly and a scheduler
//! may keep weights there. wgpu's safe API offers no pinned or imported memory, so "staging"
//! here means the copy paths avoid intermediate vectors:
//! - host buffer → device buffer: the core's `Buffer::copy_from` hands the host bytes to the
//!   device buffer's `set`, which gives them straight to `queue.write_buffer` (so for any host
//!   source: a CPU buffer, a read-only file mapping);
//! - device buffer → host buffer: [`WgpuHostBuffer`]'s `copy_from` copies the device range into
//!   one mapped staging buffer and from its mapping directly into the host bytes.

use crate::buffer::WgpuBuffer;
use rgml::backend::{AlignedMem, BufferImpl, BufferType, DeviceRef};
use rgml::Result;
use std::ptr::NonNull;
use std::sync::Weak;

/// Alignment of host allocations: a page, so the memory could be handed to a driver that
/// imports whole pages (16 KiB pages on Apple silicon, 4 KiB elsewhere).
pub const HOST_PAGE: usize = if cfg!(all(target_vendor = "apple", target_arch = "aarch64")) {
    16 << 10
} else {
    4 << 10
};

/// Alignment of tensor offsets inside a host buffer: a cache line, as the CPU backend uses for
/// its own memory, so kernels see the same alignment there.
pub const HOST_TENSOR_ALIGNMENT: usize = 64;

/// Host memory for staging to and from one wgpu device (named `"<device>_Host"`, e.g.
/// `Vulkan0_Host`). Its buffers are host memory: the "CPU" device accepts them.
pub struct WgpuHostBufferType {
    name: String,
    device: Weak<dyn rgml::Device>,
}

impl WgpuHostBufferType {
    pub(crate) fn new(device_name: &str, device: Weak<dyn rgml::Device>) -> WgpuHostBufferType {
        WgpuHostBufferType {
            name: format!("{device_name}_Host"),
            device,
        }
    }
}

impl BufferType for WgpuHostBufferType {
    fn name(&self) -> &str {
        &self.name
    }

    fn alloc_buffer(&self, size: usize) -> Result<Box<dyn BufferImpl>> {
        Ok(Box::new(WgpuHostBuffer {
            mem: AlignedMem::new(size, HOST_PAGE, &self.name)?,
        }))
    }

    fn alignment(&self) -> usize {
        HOST_TENSOR_ALIGNMENT
    }

    fn is_host(&self) -> bool {
        true
    }

    fn device(&self) -> Option<DeviceRef> {
        self.device.upgrade()
    }
}

/// A buffer of [`WgpuHostBufferType`].
pub struct WgpuHostBuffer {
    mem: AlignedMem,
}

// SAFETY: `base` is the start of the `AlignedMem` this buffer owns (valid, initialised and
// fixed for its life, `size` bytes); the byte methods touch it only under the caller's lock
// (their contract).
unsafe impl BufferImpl for WgpuHostBuffer {
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

    /// From a wgpu buffer: one mapped staging buffer, copied straight into our bytes. Anything
    /// else: `Ok(false)` (the core copies host sources through `set`, others through host).
    unsafe fn copy_from(
        &self,
        dst_offset: usize,
        src: &dyn BufferImpl,
        src_offset: usize,
        size: usize,
    ) -> Result<bool> {
        // SAFETY: the caller holds this buffer's exclusive lock (this method's contract).
        let dst = unsafe { self.mem.bytes_mut(dst_offset, size)? };
        if let Some(s) = src.downcast_ref::<WgpuBuffer>() {
            s.read_into(src_offset, dst)?;
            return Ok(true);
        }
        // Other host sources: the core's `Buffer::copy_from` hands their bytes to `set`.
        Ok(false)
    }

    unsafe fn clear(&self, value: u8) -> Result<()> {
        // SAFETY: the caller holds the lock this method requires (its contract).
        unsafe { self.mem.fill(0, value, self.mem.len()) }
    }
}
