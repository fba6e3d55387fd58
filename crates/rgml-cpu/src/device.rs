//! The CPU registry and device: names, description, memory figures, the device's buffer type,
//! and opening [`CpuBackend`] streams.
//!
//! A registry may hold several CPU devices, each with its own buffer type (so multi-device code
//! can be exercised on one machine); [`CpuRegistry::new`] builds the single default "CPU"
//! device, [`CpuRegistry::with_devices`] any list of names.

use crate::backend::{CpuBackend, CpuEvent};
use crate::buffer::{CpuBufferType, CpuRepackBufferType, HostMemoryBuffer};
use rgml::backend::{
    Backend, BackendParams, Buffer, BufferTypeRef, DeviceCaps, DeviceMemory, DeviceType, Event,
    HostMemory,
};
use rgml::registry::Registry;
use rgml::{Context, DeviceRef, Result, TensorId};
use std::any::Any;
use std::sync::{Arc, Weak};

/// A CPU device. The device called "CPU" uses any host memory; others (`CPU0`, ...) only their
/// own buffer type (see `supports_buffer_type`).
pub struct CpuDevice {
    name: String,
    description: String,
    buffer_type: BufferTypeRef,
    /// Weights with rows interleaved for the matrix kernels (`<name>_REPACK`).
    repack: BufferTypeRef,
    /// Backends need a shared handle to their device; a device only has `&self`.
    me: Weak<CpuDevice>,
}

impl CpuDevice {
    /// A device called `name` whose buffer type has the same name.
    pub fn new(name: impl Into<String>) -> Arc<CpuDevice> {
        let name = name.into();
        Arc::new_cyclic(|weak: &Weak<CpuDevice>| {
            let weak_dyn: Weak<dyn rgml::Device> = weak.clone();
            CpuDevice {
                description: cpu_description(),
                buffer_type: Arc::new(CpuBufferType::new(name.clone(), weak_dyn.clone())),
                repack: Arc::new(CpuRepackBufferType::new(format!("{name}_REPACK"), weak_dyn)),
                name,
                me: weak.clone(),
            }
        })
    }
}

/// The CPU model from `/proc/cpuinfo`, or a generic description.
fn cpu_description() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name") || l.starts_with("Model"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("{} CPU", std::env::consts::ARCH))
}

/// Free and total memory from `/proc/meminfo` (zeros where it cannot be read).
fn host_memory() -> DeviceMemory {
    let Ok(info) = std::fs::read_to_string("/proc/meminfo") else {
        return DeviceMemory::default();
    };
    let field = |key: &str| -> Option<usize> {
        let line = info.lines().find(|l| l.starts_with(key))?;
        let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
        kib.checked_mul(1024)
    };
    let total = field("MemTotal:").unwrap_or(0);
    let free = field("MemAvailable:")
        .or_else(|| field("MemFree:"))
        .unwrap_or(0);
    DeviceMemory { free, total }
}

impl rgml::Device for CpuDevice {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn memory(&self) -> DeviceMemory {
        host_memory()
    }

    fn device_type(&self) -> DeviceType {
        DeviceType::Cpu
    }

    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            async_io: false,
            host_buffer: false,
            buffer_from_host_ptr: true,
            events: true,
        }
    }

    fn init_backend(&self, params: &BackendParams) -> Result<Box<dyn Backend>> {
        params.check_known(&["n_threads", "async"])?;
        let n_threads = params
            .get_parsed::<usize>("n_threads")?
            .unwrap_or_else(crate::default_n_threads);
        // The devices standing in for separate ones (`CPU0`, ...) run asynchronously by
        // default, so work on several of them overlaps; "CPU" stays synchronous.
        let asynchronous = match params.get("async") {
            None => self.name != "CPU",
            Some("1" | "true") => true,
            Some("0" | "false") => false,
            Some(other) => {
                return Err(rgml::Error::InvalidParams {
                    params: format!("async={other}"),
                    reason: "async must be 0 or 1".into(),
                })
            }
        };
        let device: DeviceRef = match self.me.upgrade() {
            Some(d) => d,
            // Unreachable while `&self` is borrowed from the Arc; stay total anyway.
            None => CpuDevice::new(self.name.clone()),
        };
        Ok(Box::new(CpuBackend::with_mode(
            device,
            n_threads,
            asynchronous,
        )?))
    }

    fn buffer_type(&self) -> BufferTypeRef {
        self.buffer_type.clone()
    }

    /// The repacking buffer type, where this CPU's kernels read packed weights faster than
    /// plain ones (AVX-512 VNNI; see `kernels::repack::fast`) and `RGML_CPU_REPACK` is not
    /// `0` (for measuring against plain weights).
    fn extra_buffer_types(&self) -> Vec<BufferTypeRef> {
        let disabled = std::env::var("RGML_CPU_REPACK").is_ok_and(|v| v.trim() == "0");
        if crate::kernels::repack::fast() && !disabled {
            vec![self.repack.clone()]
        } else {
            Vec::new()
        }
    }

    fn buffer_from_host_memory(
        &self,
        memory: Arc<dyn HostMemory>,
        _max_tensor_size: usize,
    ) -> Result<Arc<Buffer>> {
        Ok(Buffer::from_impl(
            self.buffer_type.clone(),
            Box::new(HostMemoryBuffer::new(memory)),
        ))
    }

    fn supports_op(&self, ctx: &Context, id: TensorId) -> bool {
        crate::kernels::check_supported(ctx, id).is_ok()
    }

    /// The plain "CPU" device reads any host memory. Any other CPU device (`CPU0`, `CPU1`, ...)
    /// stands in for a separate device, so it only accepts its own buffer type: memory of the
    /// other devices must be copied in, as it would between real devices (the scheduler's
    /// copies between them are then real copies, and tested as such).
    fn supports_buffer_type(&self, buffer_type: &BufferTypeRef) -> bool {
        if rgml::backend::same_instance(buffer_type, &self.repack) {
            return true;
        }
        if self.name == "CPU" {
            buffer_type.is_host()
        } else {
            rgml::backend::same_instance(buffer_type, &self.buffer_type)
        }
    }

    fn event_new(&self) -> Result<Event> {
        let device: DeviceRef = match self.me.upgrade() {
            Some(d) => d,
            None => CpuDevice::new(self.name.clone()),
        };
        Ok(Event::new(device, Box::new(CpuEvent::new())))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The CPU registry.
pub struct CpuRegistry {
    devices: Vec<DeviceRef>,
}

impl CpuRegistry {
    /// One device called "CPU".
    pub fn new() -> Self {
        Self::with_devices(["CPU"])
    }

    /// One device per name, each with its own buffer type.
    pub fn with_devices<S: Into<String>>(names: impl IntoIterator<Item = S>) -> Self {
        CpuRegistry {
            devices: names
                .into_iter()
                .map(|n| CpuDevice::new(n) as DeviceRef)
                .collect(),
        }
    }

    /// "CPU", plus `CPU0` … `CPU{N-1}` when the environment sets `RGML_CPU_DEVICES=N` (so
    /// multi-device code can run on one machine). Unparsable values are ignored; N is capped
    /// at 64.
    pub fn from_env() -> Self {
        let extra = std::env::var("RGML_CPU_DEVICES")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(0)
            .min(64);
        let names = std::iter::once("CPU".to_string()).chain((0..extra).map(|i| format!("CPU{i}")));
        Self::with_devices(names)
    }
}

impl Default for CpuRegistry {
    fn default() -> Self {
        Self::new()
    }
}

impl Registry for CpuRegistry {
    fn name(&self) -> &str {
        "CPU"
    }

    fn devices(&self) -> Vec<DeviceRef> {
        self.devices.clone()
    }
}
