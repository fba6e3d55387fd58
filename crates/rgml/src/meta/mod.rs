//! The meta device's building blocks (tensor parallelism): how a tensor is split across several
//! devices ([`SplitState`]), how split states propagate through a graph, how a tensor's bytes
//! scatter to and gather from per-device slices, and the all-reduce that joins partial sums.
//!
//! This module owns the split arithmetic and the data movement between slices; it knows no
//! concrete backend (devices and backends are reached through the core traits).
//!
//! # The pieces
//! - [`split`]: states, segments, `split_sizes` by weights in whole granules;
//! - [`mod@scatter`]: host scatter / gather with segments and quantized rows;
//! - [`mod@propagate`]: per-op rules, where partial sums must be reduced and where split
//!   computed tensors must be gathered (an op run mirrored);
//! - [`buffer`]: the meta buffer type (a child buffer per device; device `d`'s dense slice of a
//!   tensor at the tensor's own offset in child `d`);
//! - [`AllReduce`]: fold, recursive doubling, broadcast, for any number of devices;
//! - [`device`]: [`MetaDevice`] and [`MetaBackend`], which run a graph as one local graph per
//!   device, in pieces between all-reduces and all-gathers.
//!
//! The model's side (which weight is split how) is `rgml_llm::tensor_split`; `rgml run
//! --split-mode tensor` puts it together.
//!
//! Not yet: children hold the whole size of every tensor (per-device `alloc_size` would give
//! the memory saving tensor parallelism is for; the in-place all-gather relies on that room
//! today); all-reduce copies between different devices, and every all-gather, go through host
//! memory; local graphs are rebuilt for every graph.

pub mod allreduce;
pub mod buffer;
pub mod device;
pub mod propagate;
pub mod scatter;
pub mod split;

pub use allreduce::AllReduce;
pub use buffer::{MetaBuffer, MetaBufferType, SplitSource};
pub use device::{MetaBackend, MetaDevice};
pub use propagate::{propagate, propagate_graph, Gather, GraphSplit, Propagation, Reduce};
pub use scatter::{gather, scatter};
pub use split::{split_sizes, Segment, SplitState};
