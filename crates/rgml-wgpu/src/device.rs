//! The wgpu registry and its devices ([`WgpuDevice`]: capabilities, memory figures, buffer
//! types, streams, events).
//!
//! The top of the crate's modules: a device puts together what the others provide (its
//! [`GpuCell`], buffer types, streams and events) and none of them refers back to it.
//!
//! Everything expensive is lazy: the registry enumerates adapters on its first `devices()` call
//! (so registering it costs nothing for commands that never look for a device), and a device
//! opens its wgpu device (queue, pipelines) on the first buffer or backend.
//!
//! The device's host buffer type is [`WgpuHostBufferType`]. wgpu's safe API cannot import
//! host memory, so [`rgml::Device::buffer_from_host_memory`] is unsupported here (see
//! [`WgpuDevice`]'s implementation).

use crate::backend::{WgpuBackend, WgpuEvent, DEFAULT_N_CB};
use crate::buffer::{WgpuBufferType, COPY_ALIGN};
use crate::gpu::{Gpu, GpuCell, WgpuOptions, TIMESTAMP_FEATURES};
use crate::host::WgpuHostBufferType;
use crate::ops::supports_op;
use rgml::backend::{
    Backend, BackendParams, Buffer, BufferTypeRef, DeviceCaps, DeviceMemory, DeviceType, HostMemory,
};
use rgml::registry::Registry;
use rgml::{Context, DeviceRef, Error, Result, TensorId};
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock, Weak};

/// One adapter as an rgml device (`Vulkan0`, ...).
pub struct WgpuDevice {
    name: String,
    description: String,
    /// The adapter and its wgpu device, opened on first use.
    cell: Arc<GpuCell>,
    device_type: DeviceType,
    /// The adapter is a CPU driver (lavapipe, SwiftShader), not a GPU.
    software: bool,
    /// The arithmetic a stream gets without an `exact=` parameter.
    exact: bool,
    /// Command buffers per graph for a stream without an `n_cb=` parameter (`None`: the
    /// backend's default).
    n_cb: Option<usize>,
    features: wgpu::Features,
    /// The largest device-local heap, where the backend tells (Vulkan).
    heap_bytes: Option<usize>,
    /// `min(max_buffer_size, max_storage_buffer_binding_size)`: the largest buffer a kernel can
    /// bind whole.
    max_size: usize,
    alignment: usize,
    buffer_type: BufferTypeRef,
    host_buffer_type: BufferTypeRef,
    me: Weak<WgpuDevice>,
}

/// What the adapter offers the kernels, for the device description: `"; shader-f16,
/// subgroups 32-32, timestamps, coopmat 16x16x16 F16>F32"` (empty when none).
fn capabilities(adapter: &wgpu::Adapter, info: &wgpu::AdapterInfo) -> String {
    let features = adapter.features();
    let mut caps = Vec::new();
    if features.contains(wgpu::Features::SHADER_F16) {
        caps.push("shader-f16".to_string());
    }
    if features.contains(wgpu::Features::SUBGROUP) {
        caps.push(format!(
            "subgroups {}-{}",
            info.subgroup_min_size, info.subgroup_max_size
        ));
    }
    if features.contains(TIMESTAMP_FEATURES) {
        caps.push("timestamps".to_string());
    }
    if features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
        for m in adapter.cooperative_matrix_properties() {
            let c = format!(
                "coopmat {}x{}x{} {:?}>{:?}",
                m.m_size, m.n_size, m.k_size, m.ab_type, m.cr_type
            );
            if !caps.contains(&c) {
                caps.push(c);
            }
        }
    }
    if caps.is_empty() {
        String::new()
    } else {
        format!("; {}", caps.join(", "))
    }
}

impl WgpuDevice {
    fn new(name: String, adapter: wgpu::Adapter, options: WgpuOptions) -> Arc<WgpuDevice> {
        let info = adapter.get_info();
        let limits = adapter.limits();
        let device_type = match info.device_type {
            wgpu::DeviceType::DiscreteGpu => DeviceType::Gpu,
            _ => DeviceType::IntegratedGpu,
        };
        let software = info.device_type == wgpu::DeviceType::Cpu;
        let exact = options.exact.unwrap_or(software);
        let n_cb = options.n_cb;
        let mode = if exact { "exact" } else { "fast" };
        let caps = capabilities(&adapter, &info);
        let description = if info.driver.is_empty() {
            format!("{}; {mode} arithmetic{caps}", info.name)
        } else {
            format!("{} ({}); {mode} arithmetic{caps}", info.name, info.driver)
        };
        let max_size = usize::try_from(
            limits
                .max_buffer_size
                .min(limits.max_storage_buffer_binding_size),
        )
        .unwrap_or(usize::MAX);
        let alignment = (limits.min_storage_buffer_offset_alignment as usize).max(COPY_ALIGN);
        let features = adapter.features();
        let heap_bytes = crate::buffer::device_local_bytes(&adapter);
        let cell = Arc::new(GpuCell::new(&name, adapter, options));
        Arc::new_cyclic(|weak: &Weak<WgpuDevice>| {
            let device: Weak<dyn rgml::Device> = weak.clone();
            WgpuDevice {
                buffer_type: Arc::new(WgpuBufferType::new(
                    name.clone(),
                    device.clone(),
                    cell.clone(),
                    max_size,
                    alignment,
                )),
                host_buffer_type: Arc::new(WgpuHostBufferType::new(&name, device)),
                max_size,
                alignment,
                name,
                description,
                cell,
                device_type,
                software,
                exact,
                n_cb,
                features,
                heap_bytes,
                me: weak.clone(),
            }
        })
    }

    /// The open wgpu device, opening it on first use.
    fn gpu(&self) -> Result<Arc<Gpu>> {
        self.cell.get()
    }

    /// Whether the adapter is a CPU driver (lavapipe, SwiftShader) rather than a GPU: a
    /// program choosing where to offload a model skips it, as llama.cpp's Vulkan backend
    /// skips CPU devices.
    pub fn is_software(&self) -> bool {
        self.software
    }

    /// The arithmetic a stream of this device computes in unless its `exact=0|1` parameter says
    /// otherwise: exact (the CPU backend's bits, see the crate docs) on CPU drivers, where it is
    /// the only arithmetic tests can compare bit for bit, fast on GPUs; [`WgpuOptions::exact`]
    /// sets it for every device.
    pub fn exact_by_default(&self) -> bool {
        self.exact
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

    /// The size of the adapter's largest device-local memory heap, where its backend says
    /// (Vulkan): what [`rgml::Device::memory`] reports as a discrete GPU's total.
    pub fn device_local_bytes(&self) -> Option<usize> {
        self.heap_bytes
    }

    /// Whether the adapter writes timestamps between dispatches of a compute pass
    /// (`TIMESTAMP_QUERY_INSIDE_PASSES`): a traced stream then times each kernel on the GPU.
    pub fn times_kernels(&self) -> bool {
        self.features.contains(TIMESTAMP_FEATURES)
    }

    /// The adapter's limits (buffer sizes, bindings, workgroups).
    pub fn limits(&self) -> wgpu::Limits {
        self.cell.adapter().limits()
    }

    /// The device name (`Vulkan0`).
    pub fn name_str(&self) -> &str {
        &self.name
    }

    /// Bytes held by this process's live buffers of this device (0 before the device is open).
    /// Counts every [`WgpuBuffer`](crate::WgpuBuffer) at its allocated size (the requested size rounded up to 4
    /// bytes); short-lived staging and uniform buffers are not counted.
    pub fn allocated_bytes(&self) -> usize {
        self.cell
            .opened()
            .map_or(0, |gpu| gpu.allocated.load(Ordering::Relaxed))
    }

    /// Another buffer type of this device whose single allocations are capped at `max_size`
    /// bytes (at most the adapter's own limit; at least 4), named `"<device>_max<N>"`. Larger
    /// needs are split by the core into multi-buffers, so this exercises that path on a real
    /// device without allocating gigabytes; backends of this device accept its buffers.
    pub fn buffer_type_with_max_size(&self, max_size: usize) -> BufferTypeRef {
        let max_size = max_size.clamp(COPY_ALIGN, self.max_size.max(COPY_ALIGN));
        let device: Weak<dyn rgml::Device> = self.me.clone();
        Arc::new(WgpuBufferType::new(
            format!("{}_max{max_size}", self.name),
            device,
            self.cell.clone(),
            max_size,
            self.alignment,
        ))
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
    ///   other processes' use is invisible). On Vulkan `total` is the largest device-local
    ///   heap instead (the card's memory), read once when the device is listed.
    ///
    /// `free <= total` always holds.
    fn memory(&self) -> DeviceMemory {
        if self.device_type == DeviceType::IntegratedGpu {
            if let Some(mem) = host_memory() {
                return mem;
            }
        }
        let total = self.heap_bytes.unwrap_or_else(|| {
            usize::try_from(self.cell.adapter().limits().max_buffer_size).unwrap_or(usize::MAX)
        });
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
        params.check_known(&["n_cb", "concurrency", "exact", "n_threads"])?;
        let n_cb = params
            .get_parsed::<usize>("n_cb")?
            .or(self.n_cb)
            .unwrap_or(DEFAULT_N_CB);
        if n_cb == 0 {
            return Err(Error::InvalidParams {
                params: "n_cb=0".into(),
                reason: "n_cb must be at least 1".into(),
            });
        }
        let concurrency = params.get_parsed::<u8>("concurrency")?.unwrap_or(0) != 0;
        let exact = match params.get_parsed::<u8>("exact")? {
            None => self.exact,
            Some(0) => false,
            Some(1) => true,
            Some(v) => {
                return Err(Error::InvalidParams {
                    params: format!("exact={v}"),
                    reason: "exact must be 0 (fast arithmetic) or 1 (the CPU's bits)".into(),
                })
            }
        };
        let gpu = self.gpu()?;
        Ok(Box::new(WgpuBackend::new(
            self.me()? as DeviceRef,
            gpu,
            n_cb,
            concurrency,
            exact,
        )))
    }

    fn event_new(&self) -> Result<rgml::backend::Event> {
        let gpu = self.gpu()?;
        Ok(rgml::backend::Event::new(
            self.me()? as DeviceRef,
            Box::new(WgpuEvent::new(gpu)),
        ))
    }

    fn buffer_type(&self) -> BufferTypeRef {
        self.buffer_type.clone()
    }

    /// Page-aligned host memory for staging ([`WgpuHostBufferType`]): plain host
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
        supports_op(ctx, id, self.exact)
    }

    /// This device's own buffer types only: [`rgml::Device::buffer_type`] and those made by
    /// [`WgpuDevice::buffer_type_with_max_size`]. Not host memory: kernels bind wgpu buffers.
    fn supports_buffer_type(&self, buffer_type: &BufferTypeRef) -> bool {
        buffer_type
            .downcast_ref::<WgpuBufferType>()
            .is_some_and(|bt| bt.is_of(&self.cell))
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
