//! The backend API: buffer types allocate buffers, buffers hold tensors, backends (streams)
//! compute graphs, devices hand out buffer types and backends, events order work.
//!
//! These traits mirror ggml's vtables. Each optional slot of ggml (NULL there) is a default
//! method with ggml's fallback, so callers never ask whether a slot is implemented. This module
//! owns the traits and the bounds-checked wrappers around them, not any implementation.
//!
//! # Modules, and the one way their imports go
//! ```text
//! mod.rs       re-exports; downcasts; the fallbacks written once (tensor_copy_async, ...)
//!   |
//! buffer       Buffer's methods, multi-buffers, host access guards, Context::tensor_* access
//!   |
//! traits       the traits and the handles they name (Buffer, Event, BufferTypeRef, DeviceRef)
//!   |
//! props, plan, concurrency
//!              plain device values and backend parameters; graph plans; which nodes a
//!              backend may run at once (read by the graph allocator)
//!
//! aligned      aligned host memory (imports nothing of backend)
//! ```
//! The traits and handles name each other (a buffer type knows its device, a device hands out
//! buffer types, buffers and events), so they are declared together in `traits`; everything
//! that only uses them sits above it. Paths outside the crate are the re-exports below
//! (`rgml::backend::Buffer`, ...), whatever module declares the item.

mod aligned;
mod buffer;
mod concurrency;
mod plan;
mod props;
mod traits;

pub use aligned::AlignedMem;
pub use buffer::{BufferUsage, HostAccess};
pub use concurrency::Concurrency;
pub use plan::GraphPlan;
pub use props::{BackendParams, DeviceCaps, DeviceMemory, DeviceType};
pub use traits::{
    same_instance, Backend, Buffer, BufferImpl, BufferType, BufferTypeRef, Device, DeviceRef,
    Event, EventImpl, HostMemory,
};

/// Downcasting to an implementation's own type, through `Any` (every backend trait has it as a
/// supertrait, so no `as_any` method is needed).
macro_rules! downcasts {
    ($($tr:ident),*) => {$(
        impl dyn $tr {
            /// This object as a `T`, if it is one.
            pub fn downcast_ref<T: $tr>(&self) -> Option<&T> {
                (self as &dyn std::any::Any).downcast_ref()
            }
            /// Whether this object is a `T`.
            pub fn is<T: $tr>(&self) -> bool {
                (self as &dyn std::any::Any).is::<T>()
            }
        }
    )*};
}
downcasts!(BufferType, BufferImpl, Device, EventImpl, Backend);

impl dyn Backend {
    /// This stream as a `T`, mutably, if it is one (e.g. to set a CPU backend's threads).
    pub fn downcast_mut<T: Backend>(&mut self) -> Option<&mut T> {
        (self as &mut dyn std::any::Any).downcast_mut()
    }
}

/// How [`tensor_copy_async`] copied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyMode {
    /// Queued on the destination stream ([`Backend::cpy_tensor_async`]): complete once that
    /// stream reaches it.
    Queued,
    /// Both streams idle, then a blocking copy through host memory: complete now.
    Blocking,
}

/// Copy `src` (computed by `src_backend`) into `dst`, ordered after the work queued on
/// `dst_backend` (ggml's `ggml_backend_tensor_copy_async`): the destination stream's
/// [`Backend::cpy_tensor_async`] if it can, else ggml's fallback, written here once for every
/// caller: synchronize both streams, then copy through host memory.
pub fn tensor_copy_async(
    dst_backend: &mut dyn Backend,
    src_backend: &mut dyn Backend,
    ctx: &crate::Context,
    src: crate::TensorId,
    dst: crate::TensorId,
) -> crate::Result<CopyMode> {
    if dst_backend.cpy_tensor_async(src_backend, ctx, src, dst)? {
        return Ok(CopyMode::Queued);
    }
    src_backend.synchronize()?;
    dst_backend.synchronize()?;
    ctx.tensor_copy(src, dst)?;
    Ok(CopyMode::Blocking)
}

/// A new event of `device` if the device has events ([`DeviceCaps::events`]), `None` if it
/// has none (callers then synchronize instead, ggml's fallback). A device that has events but
/// fails to make one is an error, not a silent fallback.
pub fn event_if_supported(device: &dyn Device) -> crate::Result<Option<Event>> {
    if !device.caps().events {
        return Ok(None);
    }
    device.event_new().map(Some)
}

/// Two different elements of a slice, mutably (two backends of one copy); `None` when `a == b`
/// or either is out of range.
pub(crate) fn two_mut<T>(v: &mut [T], a: usize, b: usize) -> Option<(&mut T, &mut T)> {
    if a == b || a >= v.len() || b >= v.len() {
        return None;
    }
    if a < b {
        let (lo, hi) = v.split_at_mut(b);
        Some((&mut lo[a], &mut hi[0]))
    } else {
        let (lo, hi) = v.split_at_mut(a);
        Some((&mut hi[0], &mut lo[b]))
    }
}
