//! CPU backend for rgml: a registry with one "CPU" device, host buffers (64-byte aligned, or
//! zero-copy read-only wraps of caller memory), the repacking buffer type for weights
//! ([`CpuRepackBufferType`], offered as the device's extra buffer type), and [`CpuBackend`],
//! which computes graphs with per-op kernels on a persistent thread pool.
//!
//! Call [`register`] (or [`register_with`], for [`CpuOptions`]: extra devices, repacking, a
//! forced arithmetic) once to make the devices visible to [`rgml::registry`]; or create a
//! [`CpuBackend`] directly. The CPU's features are resolved once per device into a
//! [`CpuFeatures`] value that the backends hand to the kernels. This crate reads no
//! environment variable: the `rgml` command line maps its documented variables onto
//! [`CpuOptions`].
//!
//! The core's library sketch (the one in the repository's README; a test keeps the two the
//! same), compiled and run as a doc test:
//!
//! ```rust
//! use rgml::{alloc::alloc_ctx_tensors, Context, DType, Graph};
//! # fn main() -> rgml::Result<()> {
//!
//! rgml_cpu::register();
//! let mut backend = rgml::registry::init_backend("CPU:n_threads=2")?;
//! let mut ctx = Context::new();
//! let w = ctx.new_tensor(DType::Q4_0, &[64, 8])?;     // weights [k, m]
//! let x = ctx.new_tensor(DType::F32, &[64, 3])?;      // activations [k, n]
//! let y = ctx.mul_mat(w, x)?;                         // [m, n]
//! let graph = Graph::build(&mut ctx, &[y])?;
//! let _buffer = alloc_ctx_tensors(&mut ctx, &backend.default_buffer_type())?;
//! // ctx.tensor_set(w, 0, &bytes)?; ctx.tensor_set_f32(x, &values)?;
//! backend.graph_compute(&ctx, &graph)?;
//! let out = ctx.tensor_get_f32(y)?;
//! # assert_eq!(out.len(), 8 * 3);
//! # Ok(())
//! # }
//! ```
//!
//! # Threads
//!
//! Devices, buffer types and buffers are `Send + Sync` and shared (`Arc`); a buffer locks its
//! bytes (compute holds the buffers it only reads shared, so several backends read one set of
//! weights at once). A [`CpuBackend`] is a stream: `Send`, driven by one thread at a time
//! (`&mut self`), with its own thread pool.
//!
//! Cargo feature `testing`: the `testing` module (a deliberately wrong backend, `PerturbCPU`,
//! for testing graph comparison); off by default, so production builds cannot register it.
#![warn(missing_docs)]

mod backend;
mod barrier;
mod buffer;
mod device;
pub mod kernels;
mod pool;
#[cfg(feature = "testing")]
pub mod testing;

pub use backend::{AbortCallback, CpuBackend, CpuEvent};
pub use buffer::{
    CpuBuffer, CpuBufferType, CpuRepackBufferType, HostMemoryBuffer, RepackBuffer, CPU_ALIGNMENT,
};
pub use device::{CpuDevice, CpuOptions, CpuRegistry, MAX_EXTRA_DEVICES};
pub use kernels::check_supported;
pub use kernels::isa::{CpuFeatures, Isa, IsaChoice, ParseIsaError};

use std::sync::Arc;

/// Register the CPU registry with [`rgml::registry`] with default options: device "CPU", the
/// arithmetic of a native build on this CPU, repacked weights where they pay. Calling it again
/// replaces the registry with an equal one.
pub fn register() {
    rgml::registry::register(Arc::new(CpuRegistry::new()));
}

/// Register the CPU registry with [`rgml::registry`] with `options` ([`CpuRegistry::with_options`]:
/// "CPU" plus `options.extra_devices` devices `CPU0`, `CPU1`, ...). Replaces a registered CPU
/// registry. Too many extra devices is [`rgml::Error::InvalidParams`].
pub fn register_with(options: &CpuOptions) -> rgml::Result<()> {
    rgml::registry::register(Arc::new(CpuRegistry::with_options(options)?));
    Ok(())
}

/// Threads used when a backend is opened without `n_threads`: the available parallelism.
pub fn default_n_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

#[cfg(test)]
mod tests;

/// Internals exposed for `cargo bench` only (`benches/`); not a public API.
#[doc(hidden)]
pub mod bench_support;
