//! The meta device's building blocks (tensor parallelism): how a tensor is split across several
//! devices ([`SplitState`]), how split states propagate through a graph, how a tensor's bytes
//! scatter to and gather from per-device slices, and the all-reduce that joins partial sums.
//!
//! This module owns the split arithmetic and the data movement between slices; it knows no
//! concrete backend (devices and backends are reached through the core traits).

pub mod propagate;
pub mod split;

pub use propagate::{propagate, propagate_graph, GraphSplit, Propagation, Reduce};
pub use split::{Segment, SplitState};
