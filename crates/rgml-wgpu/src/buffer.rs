//! The device buffer type ([`WgpuBufferType`]) and its buffers ([`WgpuBuffer`]): storage
//! buffers on a wgpu device, their set / get / memset / copy through the queue and mapped
//! staging buffers, and the device's count of bytes they hold.
//!
//! Above [`crate::gpu`], below everything that binds or copies device buffers (host buffers,
//! kernels' preparation, streams, the device).

use crate::gpu::{Gpu, GpuCell};
use rgml::backend::{BufferImpl, BufferType, DeviceRef};
use rgml::{Error, Result};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

/// wgpu's copy and write granularity (`COPY_BUFFER_ALIGNMENT`).
pub(crate) const COPY_ALIGN: usize = 4;
/// The granularity of buffer allocations: the widest vector a kernel reads.
const VECTOR_ALIGN: usize = 16;

/// Largest piece written at once by memset, so a large fill does not need one huge host vector.
const MEMSET_CHUNK: usize = 16 << 20;

fn align_down(x: usize) -> usize {
    x & !(COPY_ALIGN - 1)
}

fn align_up(x: usize) -> usize {
    x.div_ceil(COPY_ALIGN) * COPY_ALIGN
}

/// The size of the adapter's largest device-local memory heap, where its backend says
/// (Vulkan), for the device's memory figures: wgpu's safe API exposes no heap sizes, and the
/// largest buffer (`max_buffer_size`, often 4 GiB) is far below a discrete GPU's memory.
pub(crate) fn device_local_bytes(adapter: &wgpu::Adapter) -> Option<usize> {
    // SAFETY: the hal adapter is only read (its instance and physical-device handles) while
    // `adapter`, which owns it, is borrowed; no Vulkan object is created or destroyed.
    let hal = unsafe { adapter.as_hal::<wgpu::hal::api::Vulkan>() }?;
    let instance = hal.shared_instance().raw_instance();
    // SAFETY: the physical device belongs to this instance, which is alive.
    let props =
        unsafe { instance.get_physical_device_memory_properties(hal.raw_physical_device()) };
    props
        .memory_heaps_as_slice()
        .iter()
        .filter(|h| h.flags.contains(ash::vk::MemoryHeapFlags::DEVICE_LOCAL))
        .map(|h| usize::try_from(h.size).unwrap_or(usize::MAX))
        .max()
}

/// The device's memory: storage buffers of at most the adapter's binding size.
pub struct WgpuBufferType {
    name: String,
    device: Weak<dyn rgml::Device>,
    /// The device's wgpu device (opened by the first allocation).
    cell: Arc<GpuCell>,
    max_size: usize,
    alignment: usize,
}

impl WgpuBufferType {
    /// Memory of `device` (whose wgpu device `cell` opens), `max_size` bytes per buffer at
    /// most, tensors aligned to `alignment`.
    pub(crate) fn new(
        name: String,
        device: Weak<dyn rgml::Device>,
        cell: Arc<GpuCell>,
        max_size: usize,
        alignment: usize,
    ) -> WgpuBufferType {
        WgpuBufferType {
            name,
            device,
            cell,
            max_size,
            alignment,
        }
    }

    /// Whether this is memory of the device whose wgpu device `cell` opens.
    pub(crate) fn is_of(&self, cell: &Arc<GpuCell>) -> bool {
        Arc::ptr_eq(&self.cell, cell)
    }
}

impl BufferType for WgpuBufferType {
    fn name(&self) -> &str {
        &self.name
    }

    fn alloc_buffer(&self, size: usize) -> Result<Box<dyn BufferImpl>> {
        if self.device.strong_count() == 0 {
            return Err(Error::Backend {
                backend: self.name.clone(),
                message: "device dropped".into(),
            });
        }
        let gpu = self.cell.get()?;
        // Sizes are rounded up to 16 bytes (and an empty buffer gets 16), so every aligned
        // access of the logical size stays in the allocation, 16-byte vector reads included
        // (`mul_mv_blocks` reads activations as vec4).
        let alloc = size.max(1).div_ceil(VECTOR_ALIGN) * VECTOR_ALIGN;
        let buffer = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: alloc as u64,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        if let Err(e) = gpu.check() {
            buffer.destroy();
            return Err(Error::OutOfMemory {
                buffer_type: format!("{} ({e})", self.name),
                size,
                reason: "wgpu refused the buffer",
            });
        }
        gpu.allocated.fetch_add(alloc, Ordering::Relaxed);
        Ok(Box::new(WgpuBuffer {
            gpu,
            buffer,
            size,
            alloc,
        }))
    }

    fn alignment(&self) -> usize {
        self.alignment
    }

    fn max_size(&self) -> usize {
        self.max_size
    }

    fn device(&self) -> Option<DeviceRef> {
        self.device.upgrade()
    }
}

/// A storage buffer on a wgpu device.
pub struct WgpuBuffer {
    pub(crate) gpu: Arc<Gpu>,
    pub(crate) buffer: wgpu::Buffer,
    size: usize,
    /// The allocated size (`size` rounded up), counted in [`Gpu`]'s `allocated`.
    alloc: usize,
}

impl WgpuBuffer {
    /// Read `out.len()` bytes at `offset` (any alignment): the enclosing 4-byte-aligned range
    /// goes through one mapped staging buffer, and from its mapping straight into `out`.
    pub(crate) fn read_into(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        if out.is_empty() {
            return Ok(());
        }
        let start = align_down(offset);
        let end = align_up(offset + out.len());
        self.read_aligned(start, end, |bytes| {
            out.copy_from_slice(&bytes[offset - start..offset - start + out.len()]);
        })
    }

    /// Read the 4-byte-aligned range `[start, end)` through a mapped staging buffer and hand
    /// the mapped bytes to `f`.
    fn read_aligned(&self, start: usize, end: usize, f: impl FnOnce(&[u8])) -> Result<()> {
        let len = (end - start) as u64;
        let staging = self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("rgml read-back"),
            size: len,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut encoder = self.gpu.encoder();
        encoder.copy_buffer_to_buffer(&self.buffer, start as u64, &staging, 0, len);
        self.gpu.submit(encoder)?;
        self.gpu.read_mapped(&staging, "read-back", f)
    }

    /// Write `data` at `offset`; unaligned edges are read, patched and written back.
    fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let start = align_down(offset);
        let end = align_up(offset + data.len());
        if start == offset && end == offset + data.len() {
            self.gpu
                .queue
                .write_buffer(&self.buffer, offset as u64, data);
        } else {
            let mut bytes = vec![0u8; end - start];
            self.read_aligned(start, end, |b| bytes.copy_from_slice(b))?;
            bytes[offset - start..offset - start + data.len()].copy_from_slice(data);
            self.gpu
                .queue
                .write_buffer(&self.buffer, start as u64, &bytes);
        }
        self.gpu.check()
    }
}

// SAFETY: device memory has no base; every access goes through wgpu's queue and mapped
// staging buffers, which synchronise themselves.
unsafe impl BufferImpl for WgpuBuffer {
    fn size(&self) -> usize {
        self.size
    }

    unsafe fn set(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.write(offset, data)
    }

    unsafe fn get(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.read_into(offset, out)
    }

    unsafe fn memset(&self, offset: usize, value: u8, size: usize) -> Result<()> {
        if size == 0 {
            return Ok(());
        }
        if value == 0 && offset.is_multiple_of(COPY_ALIGN) && size.is_multiple_of(COPY_ALIGN) {
            let mut encoder = self.gpu.encoder();
            encoder.clear_buffer(&self.buffer, offset as u64, Some(size as u64));
            return self.gpu.submit(encoder);
        }
        let chunk = vec![value; size.min(MEMSET_CHUNK)];
        let mut done = 0;
        while done < size {
            let n = (size - done).min(chunk.len());
            self.write(offset + done, &chunk[..n])?;
            done += n;
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
        // Host sources need nothing here: the core's `Buffer::copy_from` hands their bytes to
        // `set`, which gives them straight to the queue.
        let Some(s) = src.downcast_ref::<WgpuBuffer>() else {
            return Ok(false);
        };
        let aligned = [dst_offset, src_offset, size]
            .iter()
            .all(|x| x.is_multiple_of(COPY_ALIGN));
        if !Arc::ptr_eq(&s.gpu, &self.gpu) || !aligned {
            return Ok(false);
        }
        if size == 0 {
            return Ok(true);
        }
        let mut encoder = self.gpu.encoder();
        encoder.copy_buffer_to_buffer(
            &s.buffer,
            src_offset as u64,
            &self.buffer,
            dst_offset as u64,
            size as u64,
        );
        self.gpu.submit(encoder)?;
        Ok(true)
    }

    unsafe fn clear(&self, value: u8) -> Result<()> {
        // SAFETY: forwarded from this method's contract (the caller holds the exclusive lock).
        unsafe { self.memset(0, value, self.size) }
    }
}

impl Drop for WgpuBuffer {
    fn drop(&mut self) {
        self.buffer.destroy();
        self.gpu.allocated.fetch_sub(self.alloc, Ordering::Relaxed);
    }
}
