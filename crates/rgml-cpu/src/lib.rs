//! CPU backend for rgml: a registry with one "CPU" device, host buffers (64-byte aligned, or
//! zero-copy read-only wraps of caller memory), and [`CpuBackend`], which computes graphs with
//! per-op kernels on a persistent thread pool.
//!
//! Call [`register`] once to make the device visible to [`rgml::registry`]; or create a
//! [`CpuBackend`] directly.
#![warn(missing_docs)]

mod backend;
mod barrier;
mod buffer;
mod device;
pub mod kernels;
pub mod testing;

pub use backend::{AbortCallback, CpuBackend, CpuEvent};
pub use buffer::{
    CpuBuffer, CpuBufferType, CpuRepackBufferType, HostMemoryBuffer, RepackBuffer, CPU_ALIGNMENT,
};
pub use device::{CpuDevice, CpuRegistry};
pub use kernels::check_supported;

use std::sync::Arc;

/// Register the CPU registry with [`rgml::registry`]: device "CPU", plus `CPU0` … `CPU{N-1}`
/// when `RGML_CPU_DEVICES=N` is set ([`CpuRegistry::from_env`]). Calling it again replaces the
/// registry with an equal one.
pub fn register() {
    rgml::registry::register(Arc::new(CpuRegistry::from_env()));
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
pub mod bench_support {
    /// The barrier the compute threads meet at after every graph node.
    pub struct Barrier(crate::barrier::SpinBarrier);

    impl Barrier {
        /// A barrier for `n` threads.
        pub fn new(n: usize) -> Self {
            Barrier(crate::barrier::SpinBarrier::new(n))
        }

        /// Wait until all `n` threads have arrived.
        pub fn wait(&self) {
            self.0.wait()
        }
    }
}
