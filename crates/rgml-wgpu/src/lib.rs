//! GPU backend for rgml on [wgpu]: one backend for Vulkan (Linux, Windows), Metal (macOS) and
//! DX12, with kernels in WGSL.
//!
//! Call [`register`] to add a registry named after the platform's native backend ("Vulkan" on
//! Linux, "Metal" on Apple platforms, "DX12" on Windows) with one device per adapter
//! (`Vulkan0`, `Vulkan1`, ...; discrete GPUs first). Registering is cheap: adapters are
//! enumerated on the registry's first `devices()` call. Without a driver the registry simply has
//! no devices. On Linux CI, Mesa's CPU Vulkan driver (lavapipe, package `mesa-vulkan-drivers`)
//! provides a real Vulkan device.
//!
//! # What it covers
//! - Devices with the adapter's name and driver, device type, capabilities read from the
//!   adapter ([`WgpuDevice::has_shader_f16`], [`WgpuDevice::has_subgroups`]), and memory
//!   figures (wgpu exposes no heap sizes: host `MemTotal` / `MemAvailable` for integrated / CPU
//!   adapters; for discrete GPUs `max_buffer_size` as the total and that minus the bytes this
//!   process holds in the device's buffers, [`WgpuDevice::allocated_bytes`], as free).
//! - A device buffer type: storage buffers of at most `min(max_buffer_size,
//!   max_storage_buffer_binding_size)` bytes (larger needs are served by the core's
//!   multi-buffers; [`WgpuDevice::buffer_type_with_max_size`] lowers the cap to test that),
//!   aligned to `min_storage_buffer_offset_alignment`; set (queue writes), get (a mapped
//!   staging buffer), memset / clear, copies between buffers of one device through a command
//!   encoder, and copies from any host memory straight to the queue. Not host memory.
//! - A host buffer type ([`WgpuHostBufferType`], `Vulkan0_Host`): page-aligned host memory the
//!   CPU computes on, for staging (one queue write to the device, one mapped staging buffer
//!   back). `buffer_from_host_memory` is [`rgml::Error::Unsupported`] (wgpu's safe API cannot
//!   import host memory) and `caps().buffer_from_host_ptr` is false; the model loader copies.
//! - [`WgpuBackend`] (the stream, see its module docs): a graph is encoded into `n_cb` command
//!   buffers (backend parameter `n_cb`, default 8; encoded on two threads when each has at
//!   least 32 dispatches), one compute pass per command buffer, each submitted as soon as it
//!   and those before it are encoded;
//!   `graph_compute_async` returns after the submit, `synchronize` waits and reports wgpu
//!   errors ([`rgml::Error::Backend`] with the device's name). Graph plans
//!   (`graph_plan_create` / `graph_plan_compute_async`): a graph's pipelines, bind groups,
//!   workgroup counts and parameters, prepared once and kept (the last few graphs) while the
//!   context's metadata is unchanged, so a decode step only encodes and submits. Events record a queue
//!   submission index (`Device::event_new`; caps `events` and `async_io`); `set_tensor_async`
//!   queues aligned writes, `get_tensor_async` synchronizes and reads, `cpy_tensor_async`
//!   copies between buffers of the device on the queue. With a trace recorder
//!   (`Backend::set_trace`, which the scheduler and the CLI's `--trace` call) every command
//!   buffer and asynchronous copy is a span. With `concurrency=1` the backend reports its
//!   dependency levels to the graph allocator (`Backend::graph_concurrency`), which then never
//!   gives nodes of one level shared memory; off by default because wgpu places a barrier
//!   between every two dispatches on one buffer (see the backend module), so nodes never
//!   overlap.
//! - WGSL kernels (`ops.rs` prepares each node, `plan.rs` a graph), any strides: ADD / SUB / MUL / DIV (src1
//!   broadcast), SCALE, SILU, GELU, SWIGLU, RMS_NORM, NORM, DIAG_MASK_INF, ROPE (normal,
//!   NeoX and the multi-section modes, YaRN, frequency factors), SOFT_MAX (scale, optional f32 or f16 mask, ALiBi), CONCAT, ARGMAX, all f32;
//!   CPY / CONT / DUP between f32 and f16; SET_ROWS of f32 rows into f32 or f16; GET_ROWS from
//!   f32, f16, Q4_0, Q4_1, Q8_0, Q4_K and Q6_K; MUL_MAT of those weights × f32 (broadcast over
//!   dims 2 and 3), and in the fast arithmetic also of BF16, Q5_0, Q5_1, Q2_K, Q3_K, Q5_K,
//!   IQ4_NL, IQ4_XS and MXFP4 weights (MUL_MAT_ID too), SSM_CONV, GATED_DELTA_NET,
//!   TANH, NEG, SIGMOID, EXP and SOFTPLUS. Buffers are bound as `array<u32>`: f16 values and quantized blocks (which
//!   need not be 4-byte aligned) are read as bytes / halves of words; f16 results are stored
//!   with atomic and / or on their half of a word (`kernels_f16.wgsl`), so neighbouring
//!   invocations never lose each other's value. View ops compute nothing. `supports_op` is
//!   exact: anything else goes to the CPU.
//!
//! # Modules
//! Imports go one way, from the bottom up: `kernels` (WGSL pipelines, the parameter block, the
//! `fma` probe) → `gpu` (the open wgpu device, opened lazily; [`WgpuOptions`]) → `buffer`
//! (device buffer type and buffers) → `host` (host buffer type) → `ops` (support check, each
//! node's dispatches) → `plan` (a graph's steps and parameters, ready to encode) → `backend`
//! (the stream and its events) → `device` (devices and the registry, which put the rest
//! together). No module imports one after it.
//!
//! # Two arithmetics
//! A stream computes in the exact arithmetic (below: the CPU's bits) or the fast one
//! (`kernels_fast.wgsl`: native FMA, a workgroup per row or tile, every weight type the CPU
//! multiplies decoded in registers, one pipeline per weight type compiled on first use). The
//! stream's `exact=0|1` parameter chooses; without it [`WgpuOptions::exact`] (the CLI's
//! `RGML_WGPU_EXACT`), else the adapter's default ([`WgpuDevice::exact_by_default`]: exact on
//! CPU drivers such as lavapipe, fast on GPUs). `supports_op` answers for the stream's own
//! arithmetic. `docs/GPU.md` says how each kernel maps work onto the GPU and what is left.
//!
//! # Same answers as llama.cpp (exact arithmetic)
//! The demo model turns a one-ulp difference in an activation (one flipped Q8 quant) into logit
//! differences of tenths, so the kernels of the LLaMA graph reproduce ggml-cpu's arithmetic (its
//! AVX-512 build, which the fixtures come from) bit for bit (`tests/parity.rs`):
//! - MUL_MAT of Q4_0 / Q4_1 / Q8_0 quantizes the activations first (`quantize_q8`, ggml's x86
//!   run-time Q8 quantizer) into a device scratch buffer, then sums exact integer products in
//!   8 lanes of 4, folding blocks in with fused multiply-adds, and adds the lanes in
//!   `hsum_float_8` order; f32 / f16 weights follow tinyBLAS (16 FMA lanes, activations rounded
//!   to f16 against f16 weights). Q4_K / Q6_K are dequantized against f32 activations (close to
//!   the CPU, not bit-equal).
//! - FMA is probed when the device opens (`ops::probe_fused_fma`); where WGSL's `fma` rounds
//!   twice (lavapipe) an integer emulation gives the fused result, about 3.5x slower there.
//!   [`WgpuOptions::soft_fma`] takes the emulation on any device (to test it); the `rgml`
//!   command line maps `RGML_WGPU_SOFT_FMA=1` onto it (this crate reads no environment).
//! - RMS_NORM and SOFT_MAX sum in f64 where the adapter has `SHADER_F64` (f32 elsewhere, e.g.
//!   Metal: close, not bit-equal); division and square root are corrected to IEEE rounding;
//!   SiLU / SWIGLU / SOFT_MAX use ggml's `ggml_v_expf` on whole groups of 16 and, on a row's
//!   tail (`ne0 % 16` elements, which ggml leaves to libm), x86-64 glibc's `expf` in f64
//!   where the adapter has `SHADER_F64` (the device's `exp` elsewhere: close, not bit-equal).
//!   ROPE's cos / sin table is filled on the GPU from the positions (and frequency factors)
//!   when the graph runs (no read-back, so plans hold): θ in f32 as ggml-cpu computes it and,
//!   where the adapter has `SHADER_F64`, cos / sin by x86-64 glibc's `cosf` / `sinf` algorithm
//!   in f64 (`kernels_f64.wgsl`), equal to the CPU's libm calls bit
//!   for bit (tested on random, large and negative positions); elsewhere the device's `cos` /
//!   `sin` (close, not bit-equal).
//!
//! # What is still missing
//! - Packed int8 dots in the fast mat-vec, larger cooperative-matrix tiles, split-KV flash
//!   attention for long decodes, fewer dispatches per block: what the H100 profile ranks (see
//!   `docs/GPU.md`).
//! - Barriers only between dependent nodes: wgpu's safe API places them itself (one between
//!   any two dispatches that use the same read-write buffer); dropping them needs wgpu-hal
//!   encoding. The allocator side (concurrency levels) is done and opt-in (`concurrency=1`).
//! - `buffer_from_host_ptr` where memory can be imported (needs hal interop:
//!   `VK_EXT_external_memory_host`, Metal `newBufferWithBytesNoCopy`); memory budgets (free
//!   memory as the driver sees it, `VK_EXT_memory_budget`): the heap sizes are read through
//!   wgpu-hal, other processes' use is not.
#![warn(missing_docs)]

// The order of their imports is in the crate docs ("Modules"); rustfmt sorts this list.
mod backend;
mod buffer;
mod device;
mod gpu;
mod host;
mod kernels;
mod ops;
mod plan;

pub use backend::WgpuBackend;
pub use buffer::{WgpuBuffer, WgpuBufferType};
pub use device::{WgpuDevice, WgpuRegistry};
pub use gpu::{WgpuOptions, DEFAULT_MV_ROWS, DEFAULT_MV_TEAM};
pub use host::{WgpuHostBuffer, WgpuHostBufferType, HOST_PAGE, HOST_TENSOR_ALIGNMENT};

use std::sync::Arc;

/// Register the wgpu registry with [`rgml::registry`] (see [`WgpuRegistry::new`]). Calling it
/// again replaces the registry with a freshly enumerated one.
pub fn register() {
    register_with(WgpuOptions::default());
}

/// As [`register`], with devices configured by `options` ([`WgpuRegistry::with_options`]).
pub fn register_with(options: WgpuOptions) {
    rgml::registry::register(Arc::new(WgpuRegistry::with_options(options)));
}
