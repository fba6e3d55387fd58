//! The meta device's building blocks (tensor parallelism): how a tensor is split across several
//! devices ([`SplitState`]), how split states propagate through a graph, how a tensor's bytes
//! scatter to and gather from per-device slices, and the all-reduce that joins partial sums.
//!
//! This module owns the split arithmetic and the data movement between slices; it knows no
//! concrete backend (devices and backends are reached through the core traits).
//!
//! # Status (issue 6) and the plan for the device itself
//! Landed: [`split`] (states, segments, `split_sizes` by weights in whole granules), [`mod@scatter`]
//! (host scatter / gather with segments and quantized rows), [`mod@propagate`] (per-op rules, and
//! where partial sums must be reduced), [`buffer`] (the meta buffer type), and the
//! all-reduce ([`AllReduce`]: fold, recursive doubling, broadcast, for any number of devices).
//! The model's side (which weight is split how) is `rgml_llm::tensor_split`.
//!
//! The meta buffer keeps device `d`'s dense slice of a tensor at the tensor's own offset in
//! child `d` (children as large as the meta buffer for now, so computed tensors need no state
//! at allocation; per-device `alloc_size` is the memory saving still to come).
//!
//! Still to build, in this order:
//! 1. `MetaDevice::new(devices, states)`: name `Meta(CPU0,CPU1)`, memory the sum, caps the
//!    intersection, `supports_op` where every child supports the local op and a rule exists.
//! 2. `MetaBackend::graph_compute`: propagate states, build one local graph per device (local
//!    shapes; views remapped through the source's local strides), cut where a source must be
//!    reduced, run the pieces on the children and the all-reduce between them.
//! 3. `--split-mode tensor` in the session / CLI, then the model tests and bench.

pub mod allreduce;
pub mod buffer;
pub mod device;
pub mod propagate;
pub mod scatter;
pub mod split;

pub use allreduce::AllReduce;
pub use buffer::{MetaBuffer, MetaBufferType, SplitSource};
pub use device::{MetaBackend, MetaDevice};
pub use propagate::{propagate, propagate_graph, GraphSplit, Propagation, Reduce};
pub use scatter::{gather, scatter};
pub use split::{split_sizes, Segment, SplitState};
