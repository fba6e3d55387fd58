//! GPU backend for rgml on [wgpu]: one backend for Vulkan (Linux, Windows), Metal (macOS) and
//! DX12, with kernels in WGSL.
//!
//! Call [`register`] to add a registry named after the platform's native backend ("Vulkan" on
//! Linux, "Metal" on Apple platforms, "DX12" on Windows) with one device per adapter
//! (`Vulkan0`, `Vulkan1`, ...; discrete GPUs first). Without a driver the registry simply has no
//! devices. On Linux CI, Mesa's CPU Vulkan driver (lavapipe, package `mesa-vulkan-drivers`)
//! provides a real Vulkan device.
//!
//! # What this first increment covers
//! - Devices with the adapter's name and driver, device type, capabilities read from the
//!   adapter ([`WgpuDevice::has_shader_f16`], [`WgpuDevice::has_subgroups`]), and memory
//!   figures (wgpu exposes no heap sizes: host memory for integrated / CPU adapters, the
//!   maximum buffer size for discrete GPUs).
//! - A device buffer type: storage buffers of at most `min(max_buffer_size,
//!   max_storage_buffer_binding_size)` bytes (larger needs are served by the core's
//!   multi-buffers), aligned to `min_storage_buffer_offset_alignment`; set (queue writes),
//!   get (a mapped staging buffer), memset / clear, and copies between buffers of one device
//!   through a command encoder. Not host memory.
//! - [`WgpuBackend`] (the stream, see its module docs): a graph is encoded into `n_cb` command
//!   buffers (backend parameter `n_cb`, default 2; encoded on threads when each has at least
//!   32 dispatches), one compute pass per node, submitted with one `queue.submit`;
//!   `graph_compute_async` returns after the submit, `synchronize` waits and reports wgpu
//!   errors ([`rgml::Error::Backend`] with the device's name). Events record a queue
//!   submission index (`Device::event_new`; caps `events` and `async_io`); `set_tensor_async`
//!   queues aligned writes, `get_tensor_async` synchronizes and reads, `cpy_tensor_async`
//!   copies between buffers of the device on the queue. With a trace recorder
//!   (`Backend::set_trace`, which the scheduler and the CLI's `--trace` call) every command
//!   buffer and asynchronous copy is a span. With `concurrency=1` the backend reports its
//!   dependency levels to the graph allocator (`Backend::graph_concurrency`), which then never
//!   gives nodes of one level shared memory; off by default because wgpu places a barrier
//!   between every two dispatches on one buffer (see the backend module), so nodes never
//!   overlap.
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
//! - Barriers only between dependent nodes: wgpu's safe API places them itself (one between
//!   any two dispatches that use the same read-write buffer); dropping them needs wgpu-hal
//!   encoding. The allocator side (concurrency levels) is done and opt-in (`concurrency=1`).
//! - GPU timestamps for command-buffer spans (they are host-side now, encode to observed
//!   completion) where the adapter has `TIMESTAMP_QUERY`.
//! - A host-visible buffer type for staging, `buffer_from_host_ptr` where memory can be
//!   imported.
//! - Real memory figures (Vulkan heaps), and the demo model fully or partly on `Vulkan0`
//!   matching the fixture.
#![warn(missing_docs)]

mod backend;
mod device;
mod ops;

pub use backend::WgpuBackend;
pub use device::{WgpuBuffer, WgpuBufferType, WgpuDevice, WgpuRegistry};

use std::sync::Arc;

/// Register the wgpu registry with [`rgml::registry`] (see [`WgpuRegistry::new`]). Calling it
/// again replaces the registry with a freshly enumerated one.
pub fn register() {
    rgml::registry::register(Arc::new(WgpuRegistry::new()));
}
