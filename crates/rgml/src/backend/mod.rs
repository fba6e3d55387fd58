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
