//! The CPU registry and device: names, description, memory figures, the device's buffer type,
//! opening [`CpuBackend`] streams, and the typed options they are configured with
//! ([`CpuOptions`]).
//!
//! A registry may hold several CPU devices, each with its own buffer type (so multi-device code
//! can be exercised on one machine); [`CpuRegistry::new`] builds the single default "CPU"
//! device, [`CpuRegistry::with_options`] adds `CPU0` … `CPU{N-1}`, [`CpuRegistry::with_devices`]
//! takes any list of names.
//!
//! Configuration is by value only: this crate reads no environment variable. The `rgml`
//! command line maps `RGML_CPU_ISA`, `RGML_CPU_REPACK` and `RGML_CPU_DEVICES` onto
//! [`CpuOptions`].

use crate::backend::{CpuBackend, CpuEvent};
use crate::buffer::{CpuBufferType, CpuRepackBufferType, HostMemoryBuffer};
use crate::kernels::isa::{CpuFeatures, IsaChoice};
use rgml::backend::{
    Backend, BackendParams, Buffer, BufferTypeRef, DeviceCaps, DeviceMemory, DeviceType, Event,
    HostMemory,
};
use rgml::registry::Registry;
use rgml::{Context, DeviceRef, Error, Result, TensorId};
use std::sync::{Arc, Weak};

/// The most extra devices ([`CpuOptions::extra_devices`]) a registry makes: they stand in for
/// separate devices in tests and comparisons, and each has its own thread pool when used.
pub const MAX_EXTRA_DEVICES: usize = 64;

/// How the CPU registry and its devices are set up. The default is what [`crate::register`]
/// uses: the arithmetic of a native build on this CPU, repacked weights where they pay, no
/// extra devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuOptions {
    /// Devices `CPU0` … `CPU{N-1}` beside "CPU" (at most [`MAX_EXTRA_DEVICES`]), so that
    /// multi-device code runs on one machine. Used by the registry; a single device ignores it.
    pub extra_devices: usize,
    /// Offer the repacking buffer type (`<name>_REPACK`) for weights where this CPU's kernels
    /// read packed weights faster (`false`: plain weights, for comparisons).
    pub repack: bool,
    /// Force the arithmetic of one ggml build (`None`: the native build's; see
    /// [`crate::kernels::isa`]). The backend parameter `isa=` overrides it per backend.
    pub isa: Option<IsaChoice>,
    /// Use AMX tiles where the CPU has AMX-INT8 and Linux grants them (`false`: the AVX-512
    /// kernels, which give the same bits; for comparisons). The backend parameter `amx=`
    /// overrides it per backend.
    pub amx: bool,
    /// Use AVX-512 instructions where the CPU has them (`false`: the kernels an AVX2-only CPU
    /// runs, with the same bits; to measure and test that path on an AVX-512 CPU).
    pub avx512: bool,
}

impl Default for CpuOptions {
    fn default() -> Self {
        CpuOptions {
            extra_devices: 0,
            repack: true,
            isa: None,
            amx: true,
            avx512: true,
        }
    }
}

/// A CPU device. The device called "CPU" uses any host memory; others (`CPU0`, ...) only their
/// own buffer type (see `supports_buffer_type`).
pub struct CpuDevice {
    name: String,
    description: String,
    buffer_type: BufferTypeRef,
    /// Weights with rows interleaved for the matrix kernels (`<name>_REPACK`).
    repack: BufferTypeRef,
    /// What it was made with (`repack`: whether `extra_buffer_types` may offer `repack`).
    options: CpuOptions,
    /// Resolved once from `options.isa`, for the backends it opens (unless a backend
    /// parameter overrides it).
    features: CpuFeatures,
    /// Backends need a shared handle to their device; a device only has `&self`.
    me: Weak<CpuDevice>,
}

impl CpuDevice {
    /// A device called `name` whose buffer type has the same name, with default options.
    pub fn new(name: impl Into<String>) -> Arc<CpuDevice> {
        Self::with_options(name, &CpuOptions::default())
    }

    /// A device called `name` with `options` (`extra_devices` is the registry's and unused
    /// here).
    pub fn with_options(name: impl Into<String>, options: &CpuOptions) -> Arc<CpuDevice> {
        let name = name.into();
        let mut features = CpuFeatures::resolve(options.isa);
        if !options.amx {
            features = features.without_amx();
        }
        if !options.avx512 {
            features = features.without_avx512();
        }
        Arc::new_cyclic(|weak: &Weak<CpuDevice>| {
            let weak_dyn: Weak<dyn rgml::Device> = weak.clone();
            CpuDevice {
                description: cpu_description(),
                buffer_type: Arc::new(CpuBufferType::new(name.clone(), weak_dyn.clone())),
                repack: Arc::new(CpuRepackBufferType::new(format!("{name}_REPACK"), weak_dyn)),
                options: *options,
                features,
                name,
                me: weak.clone(),
            }
        })
    }

    /// The features the device's backends run with by default.
    pub fn features(&self) -> CpuFeatures {
        self.features
    }

    /// A shared handle to this device (a new equal one only if the handle is gone, which it
    /// never is while `&self` is borrowed from the `Arc`; this keeps the code total).
    fn shared(&self) -> DeviceRef {
        match self.me.upgrade() {
            Some(d) => d,
            None => CpuDevice::with_options(self.name.clone(), &self.options),
        }
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

    /// Parameters: `n_threads` (default: all cores), `async` (0 or 1; default 1 for the
    /// stand-in devices `CPU0`, ..., 0 for "CPU"), `isa` (`avx2`, `avx512` or
    /// `avx512-nobf16`: the arithmetic of that ggml build, see [`IsaChoice`]; default: the
    /// device's), `adapt` (0 or 1, default 1: runs use fewer threads while other processes
    /// keep the cores busy, see [`CpuBackend::set_adaptive_threads`]), `amx` (0 or 1; default:
    /// the device's, see [`CpuOptions::amx`]; 1 never enables AMX the CPU or OS lacks).
    fn init_backend(&self, params: &BackendParams) -> Result<Box<dyn Backend>> {
        params.check_known(&["n_threads", "async", "isa", "adapt", "amx"])?;
        let n_threads = params
            .get_parsed::<usize>("n_threads")?
            .unwrap_or_else(crate::default_n_threads);
        // The devices standing in for separate ones (`CPU0`, ...) run asynchronously by
        // default, so work on several of them overlaps; "CPU" stays synchronous.
        let asynchronous = flag(params, "async")?.unwrap_or(self.name != "CPU");
        let adapt = flag(params, "adapt")?.unwrap_or(true);
        let features = match params.get("isa") {
            None => self.features,
            Some(v) => {
                let choice = v.parse::<IsaChoice>().map_err(|e| Error::InvalidParams {
                    params: format!("isa={v}"),
                    reason: e.to_string(),
                })?;
                self.features.with_choice(Some(choice))
            }
        };
        let features = match flag(params, "amx")? {
            Some(false) => features.without_amx(),
            // Also on a device made without AMX: the hardware's answer again.
            Some(true) => features.with_amx_as_detected(),
            None => features,
        };
        let mut backend = CpuBackend::with_mode(self.shared(), n_threads, asynchronous)?;
        backend.set_features(features);
        backend.set_adaptive_threads(adapt);
        Ok(Box::new(backend))
    }

    fn buffer_type(&self) -> BufferTypeRef {
        self.buffer_type.clone()
    }

    /// The repacking buffer type, where the device's kernels read packed weights faster than
    /// plain ones (AVX-512 VNNI with the AVX-512 arithmetic, see `kernels::repack::fast`; the
    /// AVX2 build, whose generation reads a packed run of rows as one stream, see
    /// `kernels::repack_avx2`) and [`CpuOptions::repack`] is on (off: for measuring against
    /// plain weights).
    fn extra_buffer_types(&self) -> Vec<BufferTypeRef> {
        if self.options.repack
            && (crate::kernels::tiles::repack::fast(self.features)
                || crate::kernels::tiles::repack::avx2_matvec(self.features))
        {
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
        Ok(Event::new(self.shared(), Box::new(CpuEvent::new())))
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

    /// One device per name, each with its own buffer type, with default options.
    pub fn with_devices<S: Into<String>>(names: impl IntoIterator<Item = S>) -> Self {
        Self::with_devices_and_options(names, &CpuOptions::default())
    }

    /// One device per name, each with its own buffer type, all with `options` (whose
    /// `extra_devices` is not used: the names are the devices).
    pub fn with_devices_and_options<S: Into<String>>(
        names: impl IntoIterator<Item = S>,
        options: &CpuOptions,
    ) -> Self {
        CpuRegistry {
            devices: names
                .into_iter()
                .map(|n| CpuDevice::with_options(n, options) as DeviceRef)
                .collect(),
        }
    }

    /// "CPU", plus `CPU0` … `CPU{N-1}` for `options.extra_devices = N` (so multi-device code
    /// can run on one machine), all with `options`. More than [`MAX_EXTRA_DEVICES`] is
    /// [`Error::InvalidParams`].
    pub fn with_options(options: &CpuOptions) -> Result<Self> {
        let extra = options.extra_devices;
        if extra > MAX_EXTRA_DEVICES {
            return Err(Error::InvalidParams {
                params: format!("extra_devices={extra}"),
                reason: format!("at most {MAX_EXTRA_DEVICES} extra CPU devices"),
            });
        }
        let names = std::iter::once("CPU".to_string()).chain((0..extra).map(|i| format!("CPU{i}")));
        Ok(Self::with_devices_and_options(names, options))
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

/// Backend parameter `name` as a boolean (`0`/`false` or `1`/`true`), if given.
fn flag(params: &BackendParams, name: &str) -> Result<Option<bool>> {
    match params.get(name) {
        None => Ok(None),
        Some("1" | "true") => Ok(Some(true)),
        Some("0" | "false") => Ok(Some(false)),
        Some(other) => Err(Error::InvalidParams {
            params: format!("{name}={other}"),
            reason: format!("{name} must be 0 or 1"),
        }),
    }
}
