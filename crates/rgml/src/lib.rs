//! rgml core: dtypes and quantized blocks, tensors in an arena, ops and graphs, allocators, and
//! the backend API (buffer types, buffers, backends, devices, registries, events), and the
//! scheduler that splits one graph over several backends ([`sched`]).
//!
//! This crate knows no concrete backend: backends (rgml-cpu, rgml-wgpu, ...) implement the
//! traits in [`backend`] and register themselves with [`registry`].
#![warn(missing_docs)]

pub mod alloc;
pub mod backend;
pub mod compare;
pub mod context;
pub mod dtype;
pub mod error;
pub mod graph;
pub mod meta;
pub mod op;
pub mod quant;
pub mod registry;
pub mod sched;
pub mod tables;
pub mod tensor;
#[cfg(feature = "testing")]
pub mod testing;
pub mod trace;

pub use backend::{Backend, Buffer, BufferType, BufferTypeRef, Device, DeviceRef};
pub use context::Context;
pub use dtype::{DType, DTypeError};
pub use error::{Error, GraphAllocError, Result, SchedError};
pub use graph::Graph;
pub use op::{Op, OpKind, RopeMode, RopeParams, UnaryOp};
pub use sched::{Scheduler, SchedulerOptions};
pub use tensor::{Tensor, TensorFlags, TensorId};
