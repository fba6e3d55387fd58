//! The wgpu registry and devices, the device buffer type and its buffers.
//!
//! The wgpu device (and its queue and pipelines) is opened lazily, on the first buffer or
//! backend, so registering and listing devices stays cheap.

use crate::backend::WgpuBackend;
use crate::ops::Kernels;
use rgml::backend::{
    Backend, BackendParams, Buffer, BufferImpl, BufferType, BufferTypeRef, DeviceCaps,
    DeviceMemory, DeviceType,
};
use rgml::registry::Registry;
use rgml::{Context, DeviceRef, Error, Result, TensorId};
use std::any::Any;
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
    /// The first error wgpu reported since the last [`Gpu::check`].
    error: Arc<Mutex<Option<String>>>,
}

impl Gpu {
    fn open(name: &str, adapter: &wgpu::Adapter) -> std::result::Result<Gpu, String> {
        let desc = wgpu::DeviceDescriptor {
            label: Some(name),
            required_features: wgpu::Features::empty(),
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
        let kernels = Kernels::new(&device);
        let gpu = Gpu {
            name: name.to_string(),
            device,
            queue,
            kernels,
            error,
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
    buffer_type: BufferTypeRef,
    gpu: OnceLock<std::result::Result<Arc<Gpu>, String>>,
    me: Weak<WgpuDevice>,
}

impl WgpuDevice {
    fn new(name: String, adapter: wgpu::Adapter) -> Arc<WgpuDevice> {
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
            name,
            description,
            adapter,
            device_type,
            features,
            gpu: OnceLock::new(),
            me: weak.clone(),
        })
    }

    /// The open wgpu device, opening it on first use.
    pub(crate) fn gpu(&self) -> Result<Arc<Gpu>> {
        self.gpu
            .get_or_init(|| Gpu::open(&self.name, &self.adapter).map(Arc::new))
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

    fn me(&self) -> Result<Arc<WgpuDevice>> {
        self.me.upgrade().ok_or_else(|| Error::Backend {
            backend: self.name.clone(),
            message: "device dropped".into(),
        })
    }
}

/// Host memory from `/proc/meminfo`, for adapters that share it (zeros where unreadable).
fn host_memory() -> DeviceMemory {
    let Ok(info) = std::fs::read_to_string("/proc/meminfo") else {
        return DeviceMemory::default();
    };
    let field = |key: &str| -> Option<usize> {
        let line = info.lines().find(|l| l.starts_with(key))?;
        let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
        kib.checked_mul(1024)
    };
    DeviceMemory {
        free: field("MemAvailable:")
            .or_else(|| field("MemFree:"))
            .unwrap_or(0),
        total: field("MemTotal:").unwrap_or(0),
    }
}

impl rgml::Device for WgpuDevice {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    /// wgpu exposes no heap sizes: adapters that share host memory (integrated GPUs, CPU
    /// drivers such as lavapipe) report the host's memory; discrete GPUs report the largest
    /// buffer the adapter allows as both figures (a lower bound of their memory).
    fn memory(&self) -> DeviceMemory {
        match self.device_type {
            DeviceType::Gpu => {
                let max = usize::try_from(self.adapter.limits().max_buffer_size).unwrap_or(0);
                DeviceMemory {
                    free: max,
                    total: max,
                }
            }
            _ => host_memory(),
        }
    }

    fn device_type(&self) -> DeviceType {
        self.device_type
    }

    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            async_io: true,
            host_buffer: false,
            buffer_from_host_ptr: false,
            events: true,
        }
    }

    fn init_backend(&self, params: &BackendParams) -> Result<Box<dyn Backend>> {
        // n_cb: command buffers per graph (see the backend module); concurrency: report
        // dependency levels to the graph allocator.
        params.check_known(&["n_cb", "concurrency"])?;
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

    fn supports_op(&self, ctx: &Context, id: TensorId) -> bool {
        crate::ops::supports_op(ctx, id)
    }

    fn supports_buffer_type(&self, buffer_type: &BufferTypeRef) -> bool {
        rgml::backend::same_instance(buffer_type, &self.buffer_type)
    }

    fn as_any(&self) -> &dyn Any {
        self
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
        Ok(Box::new(WgpuBuffer { gpu, buffer, size }))
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

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A storage buffer on a wgpu device.
pub struct WgpuBuffer {
    pub(crate) gpu: Arc<Gpu>,
    pub(crate) buffer: wgpu::Buffer,
    size: usize,
}

impl WgpuBuffer {
    /// Read the 4-byte-aligned range `[start, end)` through a mapped staging buffer.
    fn read_aligned(&self, start: usize, end: usize) -> Result<Vec<u8>> {
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
        let out = {
            let view = staging
                .get_mapped_range(..)
                .map_err(|e| self.gpu.err(format!("read-back range: {e}")))?;
            view.to_vec()
        };
        staging.unmap();
        Ok(out)
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
            let mut bytes = self.read_aligned(start, end)?;
            bytes[offset - start..offset - start + data.len()].copy_from_slice(data);
            self.gpu
                .queue
                .write_buffer(&self.buffer, start as u64, &bytes);
        }
        self.gpu.check()
    }
}

impl BufferImpl for WgpuBuffer {
    fn set(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.write(offset, data)
    }

    fn get(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        if out.is_empty() {
            return Ok(());
        }
        let start = align_down(offset);
        let end = align_up(offset + out.len());
        let bytes = self.read_aligned(start, end)?;
        out.copy_from_slice(&bytes[offset - start..offset - start + out.len()]);
        Ok(())
    }

    fn memset(&self, offset: usize, value: u8, size: usize) -> Result<()> {
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

    fn copy_from(
        &self,
        dst_offset: usize,
        src: &Buffer,
        src_offset: usize,
        size: usize,
    ) -> Result<bool> {
        let Some(s) = src.imp().as_any().downcast_ref::<WgpuBuffer>() else {
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

    fn clear(&self, value: u8) -> Result<()> {
        self.memset(0, value, self.size)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for WgpuBuffer {
    fn drop(&mut self) {
        self.buffer.destroy();
    }
}

/// The wgpu registry: one device per adapter of the platform's native backend.
pub struct WgpuRegistry {
    name: String,
    devices: Vec<DeviceRef>,
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
    /// Enumerate the adapters of the platform's native backend (Vulkan on Linux, Metal on
    /// Apple platforms, DX12 on Windows), discrete GPUs first. No adapter (no driver
    /// installed) gives a registry without devices.
    pub fn new() -> WgpuRegistry {
        let (backends, name) = native_backend();
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
        let devices = adapters
            .into_iter()
            .enumerate()
            .map(|(i, a)| WgpuDevice::new(format!("{name}{i}"), a) as DeviceRef)
            .collect();
        WgpuRegistry {
            name: name.to_string(),
            devices,
        }
    }
}

impl Default for WgpuRegistry {
    fn default() -> Self {
        Self::new()
    }
}

impl Registry for WgpuRegistry {
    fn name(&self) -> &str {
        &self.name
    }

    fn devices(&self) -> Vec<DeviceRef> {
        self.devices.clone()
    }
}
