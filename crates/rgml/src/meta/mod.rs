//! The meta device's building blocks (tensor parallelism): how a tensor is split across several
//! devices ([`SplitState`]), how split states propagate through a graph, how a tensor's bytes
//! scatter to and gather from per-device slices, and the all-reduce that joins partial sums.
//!
//! This module owns the split arithmetic and the data movement between slices; it knows no
//! concrete backend (devices and backends are reached through the core traits).
//!
//! # Status (issue 6) and the plan for the device itself
//! Landed: [`split`] (states, segments, `split_sizes` by weights in whole granules), [`mod@scatter`]
//! (host scatter / gather with segments and quantized rows), propagation rules and the
//! all-reduce ([`AllReduce`]: fold, recursive doubling, broadcast, for any number of devices).
//! The model's side (which weight is split how) is `rgml_llm::tensor_split`.
//!
//! Still to build, in this order:
//! 1. `MetaBufferType` / `MetaBuffer`: one child buffer per device; a tensor at meta offset `o`
//!    keeps device `d`'s dense slice at offset `o` of child `d` (children as large as the meta
//!    buffer at first, so computed tensors need no state at allocation; per-device
//!    `alloc_size` later, for the memory saving). `init_tensor` records (offset → dtype, shape,
//!    name); set / get of a whole tensor scatter / gather by its state (weights' states from
//!    the loader, computed ones recorded by the backend), mirrored tensors any range.
//! 2. `MetaDevice::new(devices, states)`: name `Meta(CPU0,CPU1)`, memory the sum, caps the
//!    intersection, `supports_op` where every child supports the local op and a rule exists.
//! 3. `MetaBackend::graph_compute`: propagate states, build one local graph per device (local
//!    shapes; views remapped through the source's local strides), cut where a source must be
//!    reduced, run the pieces on the children and the all-reduce between them.
//! 4. `--split-mode tensor` in the session / CLI, then the model tests and bench.

pub mod allreduce;
pub mod buffer;
pub mod scatter;
pub mod split;

pub use allreduce::AllReduce;
pub use buffer::{MetaBuffer, MetaBufferType, SplitSource};
pub use scatter::{gather, scatter};
pub use split::{split_sizes, Segment, SplitState};
