//! The wgpu registry and devices, the device buffer type and its buffers, and the device's
//! memory figures.
//!
//! Everything expensive is lazy: the registry enumerates adapters on its first `devices()` call
//! (so registering it costs nothing for commands that never look for a device), and a device
//! opens its wgpu device (queue, pipelines) on the first buffer or backend.
//!
//! The device's host buffer type is [`crate::WgpuHostBufferType`]. wgpu's safe API cannot import host
//! memory, so [`rgml::Device::buffer_from_host_memory`] is unsupported here (see
//! [`WgpuDevice`]'s implementation).

use crate::backend::WgpuBackend;
use crate::host::WgpuHostBufferType;
use crate::ops::{Kernels, Scratch};
use crate::WgpuOptions;
use rgml::backend::{
    Backend, BackendParams, Buffer, BufferImpl, BufferType, BufferTypeRef, DeviceCaps,
    DeviceMemory, DeviceType, HostMemory,
};
use rgml::registry::Registry;
use rgml::{Context, DeviceRef, Error, Result, TensorId};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock, Weak};

/// wgpu's copy and write granularity (`COPY_BUFFER_ALIGNMENT`).
const COPY_ALIGN: usize = 4;

/// Largest piece written at once by memset, so a large fill does not need one huge host vector.
const MEMSET_CHUNK: usize = 16 << 20;

fn align_down(x: usize) -> usize {
    x & !(COPY_ALIGN - 1)
}

fn align_up(x: usize) -> usize {
    x.div_ceil(COPY_ALIGN) * COPY_ALIGN
}

/// An open wgpu device: queue, kernels and the slot where wgpu reports errors.
pub(crate) struct Gpu {
    /// The rgml device name, for error messages.
    pub(crate) name: String,
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) kernels: Kernels,
    /// Scratch memory for kernels' intermediate results.
    pub(crate) scratch: Scratch,
    /// The first error wgpu reported since the last [`Gpu::check`].
    error: Arc<Mutex<Option<String>>>,
    /// Bytes held by the live [`WgpuBuffer`]s of this device (their rounded-up sizes; staging,
    /// uniform and kernel objects are not counted).
    allocated: AtomicUsize,
}

impl Gpu {
    fn open(
        name: &str,
        adapter: &wgpu::Adapter,
        options: WgpuOptions,
    ) -> std::result::Result<Gpu, String> {
        let desc = wgpu::DeviceDescriptor {
            label: Some(name),
            // f64 lets kernels sum as ggml-cpu does; the rest of the kernels need no features.
            required_features: adapter.features() & wgpu::Features::SHADER_F64,
            // The adapter's own limits: buffers and bindings as large as it allows.
            required_limits: adapter.limits(),
            experimental_features: wgpu::ExperimentalFeatures::disabled(),
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        };
        let (device, queue) =
            pollster::block_on(adapter.request_device(&desc)).map_err(|e| e.to_string())?;
        let error = Arc::new(Mutex::new(None::<String>));
        let slot = error.clone();
        // wgpu's default handler panics; keep the first error for the next check instead.
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            let mut s = slot.lock().unwrap_or_else(|p| p.into_inner());
            if s.is_none() {
                *s = Some(e.to_string());
            }
        }));
        let hw_fma = !options.soft_fma && crate::ops::probe_fused_fma(&device, &queue);
        let kernels = Kernels::new(&device, hw_fma);
        let gpu = Gpu {
            name: name.to_string(),
            device,
            queue,
            kernels,
            scratch: Scratch::default(),
            error,
            allocated: AtomicUsize::new(0),
        };
        gpu.check().map_err(|e| e.to_string())?;
        Ok(gpu)
    }

    /// An rgml error for this device.
    pub(crate) fn err(&self, message: impl Into<String>) -> Error {
        Error::Backend {
            backend: self.name.clone(),
            message: message.into(),
        }
    }

    /// The error wgpu reported since the last check, if any.
    pub(crate) fn check(&self) -> Result<()> {
        let taken = self.error.lock().unwrap_or_else(|p| p.into_inner()).take();
        match taken {
            Some(message) => Err(self.err(message)),
            None => Ok(()),
        }
    }

    /// Block until all submitted work completes.
    pub(crate) fn wait(&self) -> Result<()> {
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| self.err(e.to_string()))?;
        self.check()
    }

    /// Submit an encoder's commands.
    pub(crate) fn submit(&self, encoder: wgpu::CommandEncoder) -> Result<()> {
        self.queue.submit([encoder.finish()]);
        self.check()
    }

    fn encoder(&self) -> wgpu::CommandEncoder {
        self.device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None })
    }
}

/// One adapter as an rgml device (`Vulkan0`, ...).
pub struct WgpuDevice {
    name: String,
    description: String,
    adapter: wgpu::Adapter,
    device_type: DeviceType,
    features: wgpu::Features,
    /// `min(max_buffer_size, max_storage_buffer_binding_size)`: the largest buffer a kernel can
    /// bind whole.
    max_size: usize,
    alignment: usize,
    buffer_type: BufferTypeRef,
    host_buffer_type: BufferTypeRef,
    gpu: OnceLock<std::result::Result<Arc<Gpu>, String>>,
    options: WgpuOptions,
    me: Weak<WgpuDevice>,
}

impl WgpuDevice {
    fn new(name: String, adapter: wgpu::Adapter, options: WgpuOptions) -> Arc<WgpuDevice> {
        let info = adapter.get_info();
        let limits = adapter.limits();
        let device_type = match info.device_type {
            wgpu::DeviceType::DiscreteGpu => DeviceType::Gpu,
            _ => DeviceType::IntegratedGpu,
        };
        let description = if info.driver.is_empty() {
            info.name.clone()
        } else {
            format!("{} ({})", info.name, info.driver)
        };
        let max_size = usize::try_from(
            limits
                .max_buffer_size
                .min(limits.max_storage_buffer_binding_size),
        )
        .unwrap_or(usize::MAX);
        let alignment = (limits.min_storage_buffer_offset_alignment as usize).max(COPY_ALIGN);
        let features = adapter.features();
        Arc::new_cyclic(|weak: &Weak<WgpuDevice>| WgpuDevice {
            buffer_type: Arc::new(WgpuBufferType {
                name: name.clone(),
                device: weak.clone(),
                max_size,
                alignment,
            }),
            host_buffer_type: Arc::new(WgpuHostBufferType::new(&name, weak.clone())),
            max_size,
            alignment,
            name,
            description,
            adapter,
            device_type,
            features,
            gpu: OnceLock::new(),
            options,
            me: weak.clone(),
        })
    }

    /// The open wgpu device, opening it on first use.
    pub(crate) fn gpu(&self) -> Result<Arc<Gpu>> {
        self.gpu
            .get_or_init(|| Gpu::open(&self.name, &self.adapter, self.options).map(Arc::new))
            .clone()
            .map_err(|message| Error::Backend {
                backend: self.name.clone(),
                message: format!("cannot open the device: {message}"),
            })
    }

    /// Whether the adapter offers f16 arithmetic in shaders (`SHADER_F16`).
    pub fn has_shader_f16(&self) -> bool {
        self.features.contains(wgpu::Features::SHADER_F16)
    }

    /// Whether the adapter offers f64 arithmetic in shaders (`SHADER_F64`): RMS_NORM and
    /// SOFT_MAX then sum in f64 and ROPE's table takes libm's cos / sin, as ggml-cpu does, so
    /// their results are the CPU's bit for bit (see the crate docs).
    pub fn has_shader_f64(&self) -> bool {
        self.features.contains(wgpu::Features::SHADER_F64)
    }

    /// Whether the adapter offers subgroup operations in compute shaders (`SUBGROUP`).
    pub fn has_subgroups(&self) -> bool {
        self.features.contains(wgpu::Features::SUBGROUP)
    }

    /// The adapter's limits (buffer sizes, bindings, workgroups).
    pub fn limits(&self) -> wgpu::Limits {
        self.adapter.limits()
    }

    /// The device name (`Vulkan0`).
    pub fn name_str(&self) -> &str {
        &self.name
    }

    /// Bytes held by this process's live buffers of this device (0 before the device is open).
    /// Counts every [`WgpuBuffer`] at its allocated size (the requested size rounded up to 4
    /// bytes); short-lived staging and uniform buffers are not counted.
    pub fn allocated_bytes(&self) -> usize {
        match self.gpu.get() {
            Some(Ok(gpu)) => gpu.allocated.load(Ordering::Relaxed),
            _ => 0,
        }
    }

    /// Another buffer type of this device whose single allocations are capped at `max_size`
    /// bytes (at most the adapter's own limit; at least 4), named `"<device>_max<N>"`. Larger
    /// needs are split by the core into multi-buffers, so this exercises that path on a real
    /// device without allocating gigabytes; backends of this device accept its buffers.
    pub fn buffer_type_with_max_size(&self, max_size: usize) -> BufferTypeRef {
        let max_size = max_size.clamp(COPY_ALIGN, self.max_size.max(COPY_ALIGN));
        Arc::new(WgpuBufferType {
            name: format!("{}_max{max_size}", self.name),
            device: self.me.clone(),
            max_size,
            alignment: self.alignment,
        })
    }

    fn me(&self) -> Result<Arc<WgpuDevice>> {
        self.me.upgrade().ok_or_else(|| Error::Backend {
            backend: self.name.clone(),
            message: "device dropped".into(),
        })
    }
}

/// Host memory from `/proc/meminfo`, for adapters that share it (`None` where unreadable).
fn host_memory() -> Option<DeviceMemory> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |key: &str| -> Option<usize> {
        let line = info.lines().find(|l| l.starts_with(key))?;
        let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
        kib.checked_mul(1024)
    };
    let total = field("MemTotal:")?;
    let free = field("MemAvailable:").or_else(|| field("MemFree:"))?;
    Some(DeviceMemory {
        free: free.min(total),
        total,
    })
}

impl rgml::Device for WgpuDevice {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    /// wgpu's safe API exposes no heap sizes or budgets, so the figures are estimates:
    /// - adapters that share host memory (integrated GPUs, CPU drivers such as lavapipe), where
    ///   `/proc/meminfo` is readable: `total` is the host's `MemTotal` and `free` its
    ///   `MemAvailable`, which already reflects this device's allocations (they are host
    ///   memory);
    /// - otherwise (discrete GPUs, or no `/proc/meminfo`): `total` is the largest buffer the
    ///   adapter allows (`max_buffer_size`, a lower bound of its memory) and `free` is that minus
    ///   the bytes this process holds in buffers of this device ([`WgpuDevice::allocated_bytes`];
    ///   other processes' use is invisible).
    ///
    /// `free <= total` always holds.
    fn memory(&self) -> DeviceMemory {
        if self.device_type == DeviceType::IntegratedGpu {
            if let Some(mem) = host_memory() {
                return mem;
            }
        }
        let total = usize::try_from(self.adapter.limits().max_buffer_size).unwrap_or(usize::MAX);
        DeviceMemory {
            free: total.saturating_sub(self.allocated_bytes()),
            total,
        }
    }

    fn device_type(&self) -> DeviceType {
        self.device_type
    }

    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            async_io: true,
            host_buffer: true,
            // See `buffer_from_host_memory`.
            buffer_from_host_ptr: false,
            events: true,
        }
    }

    fn init_backend(&self, params: &BackendParams) -> Result<Box<dyn Backend>> {
        // n_cb: command buffers per graph (see the backend module); concurrency: report
        // dependency levels to the graph allocator. n_threads is accepted and has nothing to
        // set here: one parameter list goes to every device of a split (`rgml -t 2 --device
        // Vulkan0,CPU`), and the GPU has no host threads.
        params.check_known(&["n_cb", "concurrency", "n_threads"])?;
        let n_cb = params.get_parsed::<usize>("n_cb")?.unwrap_or(2);
        if n_cb == 0 {
            return Err(Error::InvalidParams {
                params: "n_cb=0".into(),
                reason: "n_cb must be at least 1".into(),
            });
        }
        let concurrency = params.get_parsed::<u8>("concurrency")?.unwrap_or(0) != 0;
        let gpu = self.gpu()?;
        Ok(Box::new(WgpuBackend::new(
            self.me()?,
            gpu,
            n_cb,
            concurrency,
        )))
    }

    fn event_new(&self) -> Result<rgml::backend::Event> {
        let gpu = self.gpu()?;
        Ok(rgml::backend::Event::new(
            self.me()? as DeviceRef,
            Box::new(crate::backend::WgpuEvent::new(gpu)),
        ))
    }

    fn buffer_type(&self) -> BufferTypeRef {
        self.buffer_type.clone()
    }

    /// Page-aligned host memory for staging ([`crate::WgpuHostBufferType`]): plain host
    /// memory, so the CPU computes on it; copies between it and this device's buffers go
    /// through one queue write or one mapped staging buffer.
    fn host_buffer_type(&self) -> Option<BufferTypeRef> {
        Some(self.host_buffer_type.clone())
    }

    /// Unsupported: wgpu's safe API cannot wrap existing host memory as a GPU buffer (Vulkan's
    /// `VK_EXT_external_memory_host` and Metal's `newBufferWithBytesNoCopy` are only reachable
    /// through unsafe hal interop, which this crate does not use). `caps().buffer_from_host_ptr`
    /// is `false` accordingly; callers copy into [`rgml::Device::buffer_type`] memory instead
    /// (the model loader does so when the capability is off or this returns
    /// [`Error::Unsupported`]).
    fn buffer_from_host_memory(
        &self,
        _memory: Arc<dyn HostMemory>,
        _max_tensor_size: usize,
    ) -> Result<Arc<Buffer>> {
        Err(Error::Unsupported {
            backend: self.name.clone(),
            what: "buffers from host memory (wgpu cannot import host memory; copy into the \
                   device's buffer type instead)"
                .into(),
        })
    }

    fn supports_op(&self, ctx: &Context, id: TensorId) -> bool {
        crate::ops::supports_op(ctx, id)
    }

    /// This device's own buffer types only: [`rgml::Device::buffer_type`] and those made by
    /// [`WgpuDevice::buffer_type_with_max_size`]. Not host memory: kernels bind wgpu buffers.
    fn supports_buffer_type(&self, buffer_type: &BufferTypeRef) -> bool {
        buffer_type
            .downcast_ref::<WgpuBufferType>()
            .is_some_and(|bt| std::ptr::eq(bt.device.as_ptr(), self))
    }
}

/// The device's memory: storage buffers of at most the adapter's binding size.
pub struct WgpuBufferType {
    name: String,
    device: Weak<WgpuDevice>,
    max_size: usize,
    alignment: usize,
}

impl BufferType for WgpuBufferType {
    fn name(&self) -> &str {
        &self.name
    }

    fn alloc_buffer(&self, size: usize) -> Result<Box<dyn BufferImpl>> {
        let device = self.device.upgrade().ok_or_else(|| Error::Backend {
            backend: self.name.clone(),
            message: "device dropped".into(),
        })?;
        let gpu = device.gpu()?;
        // Sizes are rounded up to wgpu's copy granularity (and an empty buffer gets 4 bytes),
        // so every aligned access of the logical size stays in the allocation.
        let alloc = align_up(size.max(1));
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
        self.device.upgrade().map(|d| d as DeviceRef)
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
        let (tx, rx) = mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            // The receiver waits below; a send can only fail if it is gone, which it is not.
            let _ = tx.send(r);
        });
        self.gpu.wait()?;
        match rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(self.gpu.err(format!("mapping for read-back: {e}"))),
            Err(_) => return Err(self.gpu.err("read-back was never mapped")),
        }
        {
            let view = staging
                .get_mapped_range(..)
                .map_err(|e| self.gpu.err(format!("read-back range: {e}")))?;
            f(&view);
        }
        staging.unmap();
        Ok(())
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

/// The wgpu registry: one device per adapter of the platform's native backend, enumerated on
/// the first [`Registry::devices`] call (enumerating Vulkan adapters loads every installed
/// driver, which costs tenths of a second that commands needing no device should not pay).
pub struct WgpuRegistry {
    name: &'static str,
    backends: wgpu::Backends,
    options: WgpuOptions,
    devices: OnceLock<Vec<DeviceRef>>,
}

/// The platform's native backend and its name.
fn native_backend() -> (wgpu::Backends, &'static str) {
    if cfg!(any(target_os = "macos", target_os = "ios")) {
        (wgpu::Backends::METAL, "Metal")
    } else if cfg!(windows) {
        (wgpu::Backends::DX12, "DX12")
    } else {
        (wgpu::Backends::VULKAN, "Vulkan")
    }
}

impl WgpuRegistry {
    /// A registry for the adapters of the platform's native backend (Vulkan on Linux, Metal on
    /// Apple platforms, DX12 on Windows). Cheap: adapters are enumerated on the first
    /// [`Registry::devices`] call, discrete GPUs first. No adapter (no driver installed) gives
    /// a registry without devices.
    pub fn new() -> WgpuRegistry {
        Self::with_options(WgpuOptions::default())
    }

    /// As [`WgpuRegistry::new`], with devices configured by `options`.
    pub fn with_options(options: WgpuOptions) -> WgpuRegistry {
        let (backends, name) = native_backend();
        WgpuRegistry {
            name,
            backends,
            options,
            devices: OnceLock::new(),
        }
    }

    fn enumerate(&self) -> Vec<DeviceRef> {
        let (backends, name) = (self.backends, self.name);
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
        desc.backends = backends;
        desc.flags = wgpu::InstanceFlags::empty();
        let instance = wgpu::Instance::new(desc);
        let mut adapters = pollster::block_on(instance.enumerate_adapters(backends));
        adapters.sort_by_key(|a| match a.get_info().device_type {
            wgpu::DeviceType::DiscreteGpu => 0,
            wgpu::DeviceType::IntegratedGpu => 1,
            wgpu::DeviceType::VirtualGpu | wgpu::DeviceType::Other => 2,
            wgpu::DeviceType::Cpu => 3,
        });
        adapters
            .into_iter()
            .enumerate()
            .map(|(i, a)| WgpuDevice::new(format!("{name}{i}"), a, self.options) as DeviceRef)
            .collect()
    }
}

impl Default for WgpuRegistry {
    fn default() -> Self {
        Self::new()
    }
}

impl Registry for WgpuRegistry {
    fn name(&self) -> &str {
        self.name
    }

    fn devices(&self) -> Vec<DeviceRef> {
        self.devices.get_or_init(|| self.enumerate()).clone()
    }
}
