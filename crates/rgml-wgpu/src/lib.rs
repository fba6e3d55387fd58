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
//! # What this first increment covers
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
//! - [`WgpuBackend`]: `graph_compute` encodes every node into one command encoder (one compute
//!   pass per node; wgpu orders the passes), submits once and waits; `synchronize` waits for
//!   the queue. wgpu errors become [`rgml::Error::Backend`] with the device's name.
//! - Naive WGSL kernels, any strides: ADD / SUB / MUL / DIV (src1 broadcast), SCALE, SILU,
//!   GELU, SWIGLU, RMS_NORM, NORM, DIAG_MASK_INF, ROPE (normal and NeoX, YaRN), SOFT_MAX
//!   (scale, optional f32 or f16 mask, ALiBi), CONCAT, ARGMAX, all f32; CPY / CONT / DUP
//!   between f32 and f16; SET_ROWS of f32 rows into f32 or f16; GET_ROWS from f32, f16, Q4_0,
//!   Q4_1 and Q8_0; MUL_MAT of f32, f16, Q4_0, Q4_1 or Q8_0 weights (dequantized in the kernel)
//!   × f32 (one invocation per output, broadcast over dims 2 and 3). Buffers are bound as
//!   `array<u32>`: f16 values and quantized blocks (which need not be 4-byte aligned) are read
//!   as bytes / halves of words; f16 results are stored with atomic and / or on their half of a
//!   word (`kernels_f16.wgsl`), so neighbouring invocations never lose each other's value. View
//!   ops compute nothing.
//!   `supports_op` is exact: anything else goes to the CPU.
//!
//! # What issue 5 still needs
//! - MUL_MAT with k-quant weights (Q4_K, Q6_K), a matrix-vector path for generation, tiled /
//!   subgroup kernels, f16 arithmetic where the adapter offers it.
//! - Encoding into `n_cb` command buffers, barriers only between dependent nodes, and telling
//!   the graph allocator which nodes may run concurrently (so it does not share their memory).
//! - `buffer_from_host_ptr` where memory can be imported (needs hal interop:
//!   `VK_EXT_external_memory_host`, Metal `newBufferWithBytesNoCopy`), asynchronous set/get and
//!   `cpy_tensor_async`, events from queue submissions.
//! - Real memory figures (Vulkan heap sizes and budgets are not in wgpu's safe API), trace spans
//!   for command buffers and copies, and the demo model fully or partly on `Vulkan0` matching
//!   the fixture.
#![warn(missing_docs)]

mod backend;
mod device;
mod host;
mod ops;

pub use backend::WgpuBackend;
pub use device::{WgpuBuffer, WgpuBufferType, WgpuDevice, WgpuRegistry};
pub use host::{WgpuHostBuffer, WgpuHostBufferType, HOST_PAGE, HOST_TENSOR_ALIGNMENT};

use std::sync::Arc;

/// Register the wgpu registry with [`rgml::registry`] (see [`WgpuRegistry::new`]). Calling it
/// again replaces the registry with a freshly enumerated one.
pub fn register() {
    rgml::registry::register(Arc::new(WgpuRegistry::new()));
}
