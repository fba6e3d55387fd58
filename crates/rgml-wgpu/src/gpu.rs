//! An open wgpu device ([`Gpu`]: queue, compiled kernels, scratch memory, the error slot and
//! the bytes its buffers hold), opened lazily by [`GpuCell`] on first use, and the options it is
//! opened with ([`WgpuOptions`]).
//!
//! Below buffers, streams and devices: they all reach the wgpu device through here.

use crate::kernels::{
    coop_experimental_features, coop_shape, probe_fused_fma, subgroup_rows, Kernels,
};
use rgml::{Error, Result};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, OnceLock};

/// How the wgpu devices are set up; the default is what [`register`](crate::register) uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WgpuOptions {
    /// Compute fused multiply-adds with the integer emulation even where the device's WGSL
    /// `fma` rounds once (the results are the same; for testing the emulation on any device).
    pub soft_fma: bool,
    /// The arithmetic of every device's streams: `Some(true)` exact (the CPU's bits), `Some(false)`
    /// fast (native FMA, subgroups, tiles), `None` each adapter's default
    /// ([`WgpuDevice::exact_by_default`](crate::WgpuDevice::exact_by_default): exact on CPU
    /// drivers such as lavapipe, fast on GPUs). A stream's `exact=0|1` parameter overrides it.
    pub exact: Option<bool>,
    /// Never compute prompts on cooperative matrices (tensor cores), even where the adapter
    /// offers them (wgpu's experimental `EXPERIMENTAL_COOPERATIVE_MATRIX`): the fast
    /// arithmetic's register-tiled kernel instead.
    pub no_coopmat: bool,
    /// Weight rows per team (see [`WgpuOptions::mat_vec_team`]) of the block mat-vec that
    /// generation's MUL_MATs take (1 to 4;
    /// `Some(0)`: the older kernel of groups of 8 for every mat-vec); `None`: the default,
    /// [`DEFAULT_MV_ROWS`]. A tuning knob for measuring on a GPU.
    pub mat_vec_rows: Option<u32>,
    /// Invocations that share a row block of the block mat-vec: 32 (a warp per row block where
    /// subgroups are 32 wide) or 128 (the workgroup); `None`: [`DEFAULT_MV_TEAM`]. A tuning knob
    /// for measuring on a GPU.
    pub mat_vec_team: Option<u32>,
    /// The block mat-vec quantizes its activations to int8 and multiplies Q4_0, Q8_0, Q4_K and
    /// Q6_K weights with packed integer dots (DP4A, llama.cpp's `mul_mat_vecq`). Off by
    /// default: on an H200 it gained nothing (docs/GPU.md); a tuning knob.
    pub mat_vec_dp4a: bool,
    /// Keep a decode step's gate and up projections and their SwiGLU as three dispatches
    /// rather than one GLU block mat-vec. A tuning knob.
    pub no_glu_fusion: bool,
    /// Command buffers per graph of every stream without an `n_cb` parameter; `None`: the
    /// backend's default (8).
    pub n_cb: Option<usize>,
}

/// Weight rows per team of the block mat-vec unless [`WgpuOptions::mat_vec_rows`] says.
pub const DEFAULT_MV_ROWS: u32 = 1;

/// Invocations per row block of the block mat-vec unless [`WgpuOptions::mat_vec_team`] says.
pub const DEFAULT_MV_TEAM: u32 = 128;

/// What timing each dispatch on the GPU needs: timestamps, written inside compute passes.
pub(crate) const TIMESTAMP_FEATURES: wgpu::Features =
    wgpu::Features::TIMESTAMP_QUERY.union(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES);

/// An open wgpu device: queue, kernels and the slot where wgpu reports errors.
pub(crate) struct Gpu {
    /// The rgml device name, for error messages.
    pub(crate) name: String,
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) kernels: Kernels,
    /// Scratch memory for kernels' intermediate results.
    pub(crate) scratch: Scratch,
    /// ggml's GELU table as f32 values (see [`Gpu::gelu_table`]), made on first use.
    gelu_table: std::sync::OnceLock<wgpu::Buffer>,
    /// The first error wgpu reported since the last [`Gpu::check`].
    error: Arc<Mutex<Option<String>>>,
    /// Bytes held by the live [`WgpuBuffer`]s of this device (their rounded-up sizes; staging,
    /// uniform and kernel objects are not counted).
    pub(crate) allocated: AtomicUsize,
    /// Fuse a decode step's gate, up and SwiGLU into one block mat-vec
    /// (not [`WgpuOptions::no_glu_fusion`]).
    pub(crate) fuse_glu: bool,
}

impl Gpu {
    fn open(
        name: &str,
        adapter: &wgpu::Adapter,
        options: WgpuOptions,
    ) -> std::result::Result<Gpu, String> {
        // f64 lets kernels sum as ggml-cpu does; timestamps between dispatches time kernels
        // for traces. The rest of the kernels need no features.
        let mut features = adapter.features() & wgpu::Features::SHADER_F64;
        if adapter.features().contains(TIMESTAMP_FEATURES) {
            features |= TIMESTAMP_FEATURES;
        }
        // Cooperative matrices for prompts, unless the options turn them off.
        let coop = coop_shape(adapter).filter(|_| !options.no_coopmat);
        // Subgroup sums for the mat-vec's rows where a subgroup is one row's 32 invocations.
        let subgroup_rows = subgroup_rows(adapter);
        if subgroup_rows {
            features |= wgpu::Features::SUBGROUP;
        }
        let mut experimental = wgpu::ExperimentalFeatures::disabled();
        if coop.is_some() {
            features |=
                wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX | wgpu::Features::SHADER_F16;
            experimental = coop_experimental_features();
        }
        let desc = wgpu::DeviceDescriptor {
            label: Some(name),
            required_features: features,
            // The adapter's own limits: buffers and bindings as large as it allows.
            required_limits: adapter.limits(),
            experimental_features: experimental,
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
        let hw_fma = !options.soft_fma && probe_fused_fma(&device, &queue);
        let kernels = Kernels::new(
            &device,
            hw_fma,
            coop,
            subgroup_rows,
            options.mat_vec_rows.unwrap_or(DEFAULT_MV_ROWS),
            options.mat_vec_team.unwrap_or(DEFAULT_MV_TEAM),
            options.mat_vec_dp4a,
        );
        let gpu = Gpu {
            name: name.to_string(),
            device,
            queue,
            kernels,
            scratch: Scratch::default(),
            gelu_table: std::sync::OnceLock::new(),
            error,
            allocated: AtomicUsize::new(0),
            fuse_glu: !options.no_glu_fusion,
        };
        gpu.check().map_err(|e| e.to_string())?;
        Ok(gpu)
    }

    /// ggml's GELU table ([`rgml::tables::gelu_f16_table`]) as 65536 f32 values indexed by
    /// an f16's bits: what GELU and GEGLU read (binding C), so that they give ggml-cpu's
    /// results bit for bit.
    pub(crate) fn gelu_table(&self) -> wgpu::Buffer {
        let table = self.gelu_table.get_or_init(|| {
            let values: Vec<u32> = rgml::tables::gelu_f16_table()
                .iter()
                .map(|&h| half::f16::from_bits(h).to_f32().to_bits())
                .collect();
            let bytes: &[u8] = bytemuck::cast_slice(&values);
            let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("gelu table"),
                size: bytes.len() as u64,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            // A failed upload is reported at the next submit's check.
            self.queue.write_buffer(&buffer, 0, bytes);
            buffer
        });
        table.clone()
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

    /// Whether the device writes timestamps between dispatches (traces then time each kernel).
    pub(crate) fn times_kernels(&self) -> bool {
        self.device.features().contains(TIMESTAMP_FEATURES)
    }

    /// Wait for the queue, map `buffer` (`MAP_READ`, its copies already submitted) and hand its
    /// bytes to `f`; `what` names the read in errors.
    pub(crate) fn read_mapped<R>(
        &self,
        buffer: &wgpu::Buffer,
        what: &str,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R> {
        let (tx, rx) = std::sync::mpsc::channel();
        buffer.map_async(wgpu::MapMode::Read, .., move |r| {
            // The receiver waits below; a send can only fail if it is gone, which it is not.
            let _ = tx.send(r);
        });
        self.wait()?;
        match rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(self.err(format!("mapping {what}: {e}"))),
            Err(_) => return Err(self.err(format!("{what} was never mapped"))),
        }
        let out = {
            let view = buffer
                .get_mapped_range(..)
                .map_err(|e| self.err(format!("{what} range: {e}")))?;
            f(&view)
        };
        buffer.unmap();
        Ok(out)
    }

    /// Submit an encoder's commands.
    pub(crate) fn submit(&self, encoder: wgpu::CommandEncoder) -> Result<()> {
        self.queue.submit([encoder.finish()]);
        self.check()
    }

    /// A command encoder on this device.
    pub(crate) fn encoder(&self) -> wgpu::CommandEncoder {
        self.device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None })
    }
}

/// A device-wide scratch buffer for intermediate results of a node (quantized activations),
/// grown on demand. Every node may reuse it from offset 0: wgpu orders the dispatches that use
/// one buffer, and all work of a device goes through its one queue.
#[derive(Default)]
pub(crate) struct Scratch {
    buffer: std::sync::Mutex<Option<wgpu::Buffer>>,
}

impl Scratch {
    /// A scratch buffer of at least `size` bytes.
    pub(crate) fn get(&self, device: &wgpu::Device, size: usize) -> wgpu::Buffer {
        let mut slot = self.buffer.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(b) = slot.as_ref() {
            if b.size() >= size as u64 {
                return b.clone();
            }
        }
        let old = slot.as_ref().map_or(0, |b| b.size());
        // Doubling keeps a graph of growing nodes from allocating once per node; the old
        // buffer lives on while queued work still uses it (wgpu counts references).
        let size = (size as u64)
            .max(old.saturating_mul(2))
            .max(4)
            .next_multiple_of(4);
        let b = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("rgml scratch"),
            size,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        *slot = Some(b.clone());
        b
    }
}

/// A device's [`Gpu`], opened on first use (by a buffer or a stream) and shared by the device
/// and its buffer types, so they need not know each other.
pub(crate) struct GpuCell {
    name: String,
    adapter: wgpu::Adapter,
    options: WgpuOptions,
    gpu: OnceLock<std::result::Result<Arc<Gpu>, String>>,
}

impl GpuCell {
    pub(crate) fn new(name: &str, adapter: wgpu::Adapter, options: WgpuOptions) -> GpuCell {
        GpuCell {
            name: name.to_string(),
            adapter,
            options,
            gpu: OnceLock::new(),
        }
    }

    /// The adapter the device is on.
    pub(crate) fn adapter(&self) -> &wgpu::Adapter {
        &self.adapter
    }

    /// The open wgpu device, opening it on first use. A device that does not open with wgpu's
    /// experimental cooperative matrices is opened again without them.
    pub(crate) fn get(&self) -> Result<Arc<Gpu>> {
        self.gpu
            .get_or_init(|| {
                Gpu::open(&self.name, &self.adapter, self.options)
                    .or_else(|first| {
                        let plain = WgpuOptions {
                            no_coopmat: true,
                            ..self.options
                        };
                        if plain == self.options || coop_shape(&self.adapter).is_none() {
                            return Err(first);
                        }
                        Gpu::open(&self.name, &self.adapter, plain).map_err(|second| {
                            format!("{first}; without cooperative matrices: {second}")
                        })
                    })
                    .map(Arc::new)
            })
            .clone()
            .map_err(|message| Error::Backend {
                backend: self.name.clone(),
                message: format!("cannot open the device: {message}"),
            })
    }

    /// The wgpu device if it is open (without opening it).
    pub(crate) fn opened(&self) -> Option<&Arc<Gpu>> {
        self.gpu.get().and_then(|g| g.as_ref().ok())
    }
}
