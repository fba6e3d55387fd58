//! The wgpu device's host buffer type ([`rgml::Device::host_buffer_type`]): page-aligned,
//! zero-initialised host memory used for staging between the host and a wgpu device.
//!
//! This module owns the crate's raw host allocations ([`PageMem`]) and the host buffers built
//! on them. The memory is plain host memory (`is_host`), so the CPU backend computes on it
//! directly and a scheduler may keep weights there. wgpu's safe API offers no pinned or
//! imported memory, so "staging" here means the copy paths avoid intermediate vectors:
//! - host buffer → device buffer: the device buffer's `copy_from` hands the host bytes straight
//!   to `queue.write_buffer` (see `WgpuBuffer::copy_from`, which does this for any host source,
//!   including a CPU buffer or a read-only file mapping);
//! - device buffer → host buffer: [`WgpuHostBuffer`]'s `copy_from` copies the device range into
//!   one mapped staging buffer and from its mapping directly into the host bytes.

use crate::device::{WgpuBuffer, WgpuDevice};
use rgml::backend::{Buffer, BufferImpl, BufferType, DeviceRef};
use rgml::{Error, Result};
use std::alloc::Layout;
use std::any::Any;
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

/// A zero-initialised, page-aligned heap block (an empty one allocates nothing).
pub(crate) struct PageMem {
    ptr: NonNull<u8>,
    size: usize,
}

// SAFETY: `PageMem` owns its allocation exclusively (like a `Box<[u8]>`); the raw pointer is not
// shared with anything that outlives it, so moving it to another thread is sound.
unsafe impl Send for PageMem {}
// SAFETY: `&PageMem` hands out the base pointer and bounds-checked slices; every write through
// them happens under the owning `Buffer`'s exclusive lock, every read under its shared lock.
unsafe impl Sync for PageMem {}

impl PageMem {
    fn new(size: usize, buffer_type: &str) -> Result<PageMem> {
        if size == 0 {
            return Ok(PageMem {
                ptr: NonNull::<[u8; HOST_TENSOR_ALIGNMENT]>::dangling().cast(),
                size: 0,
            });
        }
        let layout = Layout::from_size_align(size, HOST_PAGE).map_err(|_| Error::OutOfMemory {
            buffer_type: buffer_type.to_string(),
            size,
            reason: "size too large for an allocation",
        })?;
        // SAFETY: `layout` has a non-zero size (checked above) and a power-of-two alignment, as
        // `alloc_zeroed` requires.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or_else(|| Error::OutOfMemory {
            buffer_type: buffer_type.to_string(),
            size,
            reason: "the system allocator failed",
        })?;
        Ok(PageMem { ptr, size })
    }

    fn check(&self, what: &str, offset: usize, len: usize) -> Result<()> {
        if offset.checked_add(len).is_none_or(|end| end > self.size) {
            return Err(Error::OutOfBounds {
                what: what.to_string(),
                offset,
                size: len,
                limit: self.size,
            });
        }
        Ok(())
    }

    /// `len` bytes at `offset` (the caller holds at least the buffer's shared lock).
    fn bytes(&self, offset: usize, len: usize) -> Result<&[u8]> {
        self.check("wgpu host buffer read", offset, len)?;
        // SAFETY: the range is inside the allocation (checked above), whose bytes are all
        // initialised (zeroed at allocation); writers are excluded by the `Buffer` lock the
        // caller holds.
        Ok(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(offset), len) })
    }

    /// Mutable view of `len` bytes at `offset` through a shared reference: `Buffer` calls every
    /// mutating `BufferImpl` method under its exclusive write lock.
    #[allow(clippy::mut_from_ref)]
    fn bytes_mut(&self, offset: usize, len: usize) -> Result<&mut [u8]> {
        self.check("wgpu host buffer write", offset, len)?;
        // SAFETY: the range is inside the allocation (checked above); the caller holds the
        // buffer's exclusive lock, so no other reference to these bytes exists while the slice
        // lives.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(offset), len) })
    }
}

impl Drop for PageMem {
    fn drop(&mut self) {
        if self.size == 0 {
            return;
        }
        if let Ok(layout) = Layout::from_size_align(self.size, HOST_PAGE) {
            // SAFETY: `ptr` was returned by `alloc_zeroed` with exactly this layout (same size
            // and alignment, validated when allocating) and is freed only here, once.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

/// The bytes `[offset, offset + size)` of `src` when it is host-addressable memory (a host
/// buffer, a CPU buffer, a file mapping); `None` for device memory. Out of range is an error.
///
/// Call only from a `copy_from` of another buffer: `Buffer::copy_from` holds `src`'s read lock
/// then, so nothing writes those bytes while the slice lives.
pub(crate) fn host_bytes(src: &Buffer, offset: usize, size: usize) -> Result<Option<&[u8]>> {
    if !src.is_host() {
        return Ok(None);
    }
    let Some(base) = src.imp().base() else {
        return Ok(None);
    };
    if offset.checked_add(size).is_none_or(|end| end > src.size()) {
        return Err(Error::OutOfBounds {
            what: "copy source".into(),
            offset,
            size,
            limit: src.size(),
        });
    }
    if size == 0 {
        return Ok(Some(&[]));
    }
    // SAFETY: `base` is valid for `src.size()` bytes of host memory and the range is inside it
    // (checked above); the caller's `Buffer::copy_from` holds the read lock, so nothing writes
    // these bytes while the slice lives.
    Ok(Some(unsafe {
        std::slice::from_raw_parts(base.as_ptr().add(offset), size)
    }))
}

/// Host memory for staging to and from one wgpu device (named `"<device>_Host"`, e.g.
/// `Vulkan0_Host`). Its buffers are host memory: the "CPU" device accepts them.
pub struct WgpuHostBufferType {
    name: String,
    device: Weak<WgpuDevice>,
}

impl WgpuHostBufferType {
    pub(crate) fn new(device_name: &str, device: Weak<WgpuDevice>) -> WgpuHostBufferType {
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
            mem: PageMem::new(size, &self.name)?,
        }))
    }

    fn alignment(&self) -> usize {
        HOST_TENSOR_ALIGNMENT
    }

    fn is_host(&self) -> bool {
        true
    }

    fn device(&self) -> Option<DeviceRef> {
        self.device.upgrade().map(|d| d as DeviceRef)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A buffer of [`WgpuHostBufferType`].
pub struct WgpuHostBuffer {
    mem: PageMem,
}

impl BufferImpl for WgpuHostBuffer {
    fn base(&self) -> Option<NonNull<u8>> {
        Some(self.mem.ptr)
    }

    fn set(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.mem
            .bytes_mut(offset, data.len())?
            .copy_from_slice(data);
        Ok(())
    }

    fn get(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        out.copy_from_slice(self.mem.bytes(offset, out.len())?);
        Ok(())
    }

    fn memset(&self, offset: usize, value: u8, size: usize) -> Result<()> {
        self.mem.bytes_mut(offset, size)?.fill(value);
        Ok(())
    }

    /// From a wgpu buffer: one mapped staging buffer, copied straight into our bytes. From any
    /// other host memory: a plain memory copy. Anything else: `Ok(false)` (through host).
    fn copy_from(
        &self,
        dst_offset: usize,
        src: &Buffer,
        src_offset: usize,
        size: usize,
    ) -> Result<bool> {
        let dst = self.mem.bytes_mut(dst_offset, size)?;
        if let Some(s) = src.imp().as_any().downcast_ref::<WgpuBuffer>() {
            s.read_into(src_offset, dst)?;
            return Ok(true);
        }
        // `src` is a different allocation from ours (`Buffer::copy_from` calls this only for
        // distinct buffers), so its bytes never alias `dst`.
        let Some(src_bytes) = host_bytes(src, src_offset, size)? else {
            return Ok(false);
        };
        dst.copy_from_slice(src_bytes);
        Ok(true)
    }

    fn clear(&self, value: u8) -> Result<()> {
        self.mem.bytes_mut(0, self.mem.size)?.fill(value);
        Ok(())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
