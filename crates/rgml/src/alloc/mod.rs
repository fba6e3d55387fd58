//! Allocators: place tensors in buffers.
//!
//! [`TensorAllocator`] is a bump allocator over one buffer (weights, inputs, small graphs);
//! [`alloc_ctx_tensors`] sizes and fills one buffer with every tensor of a context (several,
//! wrapped in a multi-buffer, when the buffer type's maximum size requires it). The graph
//! allocator [`GraphAllocator`] places compute graphs with liveness-based reuse and in-place ops,
//! in chunks of at most the maximum size, honouring a backend's [`Concurrency`] plan.

mod graph_alloc;
mod tensor_alloc;

/// The plan a backend reports is part of the backend API (declared there, so that the backend
/// traits need nothing of this module); it is re-exported here beside its reader.
pub use crate::backend::Concurrency;
pub use graph_alloc::{op_can_inplace, GraphAllocator};

pub use tensor_alloc::{align_up, alloc_ctx_tensors, TensorAllocator};
