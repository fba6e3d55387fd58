//! The backend API: buffer types allocate buffers, buffers hold tensors, backends (streams)
//! compute graphs, devices hand out buffer types and backends, events order work.
//!
//! These traits mirror ggml's vtables. Each optional slot of ggml (NULL there) is a default
//! method with ggml's fallback, so callers never ask whether a slot is implemented. This module
//! owns the traits and the bounds-checked wrappers around them, not any implementation.

mod aligned;
mod buffer;
mod device;
mod event;

pub use aligned::AlignedMem;
pub use buffer::{
    Buffer, BufferImpl, BufferType, BufferTypeRef, BufferUsage, HostAccess, HostMemory,
};
pub use device::{Backend, BackendParams, Device, DeviceCaps, DeviceMemory, DeviceRef, DeviceType};
pub use event::{Event, EventImpl};

/// Whether two shared objects (buffer types, devices) are the same instance.
pub fn same_instance<T: ?Sized>(a: &std::sync::Arc<T>, b: &std::sync::Arc<T>) -> bool {
    std::ptr::addr_eq(std::sync::Arc::as_ptr(a), std::sync::Arc::as_ptr(b))
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
