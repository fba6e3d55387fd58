//! The core crate's error type. Everything a caller or a file can get wrong is one of these.

use crate::dtype::{DType, DTypeError};
use crate::op::OpKind;

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong, with enough context to say where.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A dtype name or id that rgml does not know.
    #[error("unknown dtype: {0}")]
    UnknownDType(String),
    /// A row length that is not a whole number of quantization blocks.
    #[error("{n} elements of {dtype} are not a multiple of its block size {block}")]
    BlockMisaligned {
        /// The dtype.
        dtype: DType,
        /// The element count.
        n: usize,
        /// The dtype's block size.
        block: usize,
    },
    /// A size computation overflowed `usize`.
    #[error("tensor size overflows usize")]
    SizeOverflow,
    /// Operand shapes an op cannot combine.
    #[error("{op}: shape mismatch: {lhs:?} vs {rhs:?}{}", fmt_reason(.reason))]
    ShapeMismatch {
        /// The op being built.
        op: OpKind,
        /// First operand's shape.
        lhs: [usize; 4],
        /// Second operand's shape.
        rhs: [usize; 4],
        /// Why they do not fit.
        reason: &'static str,
    },
    /// An operand dtype an op does not accept.
    #[error("{op}: unsupported dtype {dtype}{}", fmt_reason(.reason))]
    UnsupportedDType {
        /// The op.
        op: OpKind,
        /// The offending dtype.
        dtype: DType,
        /// Which operand / why.
        reason: &'static str,
    },
    /// Op parameters that make no sense (bad axes, bad view, ...).
    #[error("{op}: invalid argument: {reason}")]
    InvalidArgument {
        /// The op.
        op: OpKind,
        /// What is wrong.
        reason: String,
    },
    /// A tensor id that does not name a tensor of the context: it comes from another context,
    /// or its tensor was dropped by a truncation (the position may hold another tensor now).
    #[error(
        "tensor id {0} does not belong to this context (an id from another context, or from \
         before a truncation dropped its tensor)"
    )]
    InvalidTensor(usize),
    /// A read or write outside a tensor or buffer.
    #[error("out of bounds: {what}: offset {offset} + size {size} > {limit}")]
    OutOfBounds {
        /// What was accessed.
        what: String,
        /// Start of the access.
        offset: usize,
        /// Length of the access.
        size: usize,
        /// Size of what was accessed.
        limit: usize,
    },
    /// Typed values (`tensor_set_f32`, `tensor_get_i32`, ...) of a tensor of another dtype.
    #[error("tensor '{tensor}' is {dtype}, not {asked}")]
    DTypeMismatch {
        /// The tensor's display name.
        tensor: String,
        /// Its dtype.
        dtype: DType,
        /// The dtype of the values.
        asked: DType,
    },
    /// Typed values for a tensor whose elements are not contiguous.
    #[error("tensor '{0}' is not contiguous: its values cannot be read or written as one slice")]
    NotContiguous(String),
    /// Typed values whose count is not the tensor's element count.
    #[error("tensor '{tensor}' has {n_elements} elements, {given} values given")]
    ValueCount {
        /// The tensor's display name.
        tensor: String,
        /// Its element count.
        n_elements: usize,
        /// Values given (or room for them).
        given: usize,
    },
    /// A tensor that has no storage yet was read, written or computed.
    #[error("tensor '{0}' has no buffer")]
    NoStorage(String),
    /// A tensor larger than the largest buffer its buffer type can allocate, so it cannot be
    /// placed even in a buffer of its own.
    #[error("tensor '{tensor}' needs {size} bytes, more than the {max_size}-byte maximum buffer size of {buffer_type}")]
    TensorTooLarge {
        /// The tensor's display name.
        tensor: String,
        /// The buffer type.
        buffer_type: String,
        /// Bytes the tensor needs.
        size: usize,
        /// The buffer type's maximum buffer size.
        max_size: usize,
    },
    /// A buffer could not be allocated.
    #[error("{buffer_type}: failed to allocate {size} bytes{}", fmt_reason(.reason))]
    OutOfMemory {
        /// Buffer type asked.
        buffer_type: String,
        /// Requested bytes.
        size: usize,
        /// Extra detail.
        reason: &'static str,
    },
    /// A buffer larger than its device's free memory, refused before anything was taken.
    #[error(
        "{device}: {} asked for a {buffer_type} buffer, {} free",
        fmt_bytes(*.size),
        fmt_bytes(*.free)
    )]
    InsufficientMemory {
        /// The device.
        device: String,
        /// The buffer type asked.
        buffer_type: String,
        /// Requested bytes.
        size: usize,
        /// The device's free bytes when asked.
        free: usize,
    },
    /// A write to a buffer that wraps read-only memory.
    #[error("buffer '{0}' is read-only")]
    ReadOnlyBuffer(String),
    /// A device name that no registry provides.
    #[error("unknown device '{name}' (available: {available})")]
    UnknownDevice {
        /// The name asked for.
        name: String,
        /// Comma-separated names that exist.
        available: String,
    },
    /// A graph plan computed on a context it was not made from, or after the context's tensor
    /// metadata changed.
    #[error("{backend}: the graph plan is stale (another context, or its tensors changed since)")]
    StalePlan {
        /// The backend that made the plan.
        backend: String,
    },
    /// A device asked for before any backend registered its devices.
    #[error(
        "unknown device '{name}': no backend is registered (call the backend crate's register(), \
         e.g. rgml_cpu::register(), before opening devices)"
    )]
    NoBackendsRegistered {
        /// The name asked for.
        name: String,
    },
    /// Bad `key=value` parameters for a backend.
    #[error("invalid backend parameters '{params}': {reason}")]
    InvalidParams {
        /// The parameter string.
        params: String,
        /// What is wrong.
        reason: String,
    },
    /// A backend asked to run something it does not implement.
    #[error("{backend}: unsupported: {what}")]
    Unsupported {
        /// The backend or device name.
        backend: String,
        /// What it cannot do.
        what: String,
    },
    /// Computation stopped by the abort callback.
    #[error("computation aborted")]
    Aborted,
    /// A dtype that a conversion (quantize / dequantize / dot product) does not handle.
    #[error("no conversion for dtype {0}")]
    UnsupportedConversion(DType),
    /// A buffer or slice whose length does not match what the operation needs.
    #[error("{what}: expected length {expected}, got {actual}")]
    LengthMismatch {
        /// Which buffer.
        what: &'static str,
        /// The length required.
        expected: usize,
        /// The length given.
        actual: usize,
    },
    /// The graph allocator cannot place a graph (bad buffer ids, a graph that changed without
    /// a new reserve, ...).
    #[error("graph allocator: {0}")]
    GraphAlloc(#[from] GraphAllocError),
    /// The scheduler cannot place or run a graph (no backend supports a node, a pre-allocated
    /// tensor in memory no capable backend can use, bad backend lists, ...).
    #[error("scheduler: {0}")]
    Sched(#[from] SchedError),
    /// A split state that does not fit its tensor or devices (meta device).
    #[error("invalid split: {0}")]
    InvalidSplit(String),
    /// An op whose sources' split states no propagation rule can combine locally (meta device).
    #[error("{op}: unsupported split: {why}")]
    UnsupportedSplit {
        /// The op.
        op: OpKind,
        /// The states met and why they do not fit.
        why: String,
    },
    /// A backend-specific failure.
    #[error("{backend}: {message}")]
    Backend {
        /// The backend or device name.
        backend: String,
        /// What failed.
        message: String,
    },
}

/// Bytes in the unit a reader takes in at once (`512 B`, `12.0 MiB`, `21.42 GiB`).
pub(crate) fn fmt_bytes(bytes: usize) -> String {
    const KIB: f64 = 1024.0;
    let b = bytes as f64;
    if b < KIB {
        format!("{bytes} B")
    } else if b < KIB * KIB {
        format!("{:.1} KiB", b / KIB)
    } else if b < KIB * KIB * KIB {
        format!("{:.1} MiB", b / (KIB * KIB))
    } else {
        format!("{:.2} GiB", b / (KIB * KIB * KIB))
    }
}

fn fmt_reason(reason: &str) -> String {
    if reason.is_empty() {
        String::new()
    } else {
        format!(" ({reason})")
    }
}

/// Why the graph allocator cannot place a graph.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GraphAllocError {
    /// A buffer id outside the allocator's buffer types.
    #[error(
        "{what} {index} has buffer id {buffer_id}, but there are {n_buffer_types} buffer types"
    )]
    BufferIdOutOfRange {
        /// "node" or "leaf" (or "buffer").
        what: &'static str,
        /// Which node or leaf.
        index: usize,
        /// The id given.
        buffer_id: usize,
        /// How many buffer types the allocator has.
        n_buffer_types: usize,
    },
    /// A list of buffer ids whose length is not the graph's node or leaf count.
    #[error("{given} {what} buffer ids for {expected} {what}s")]
    BufferIdCount {
        /// "node" or "leaf".
        what: &'static str,
        /// Ids given.
        given: usize,
        /// Nodes or leaves in the graph.
        expected: usize,
    },
    /// The graph differs from the reserved one and the allocator has several buffer types, so
    /// it cannot guess where each tensor goes.
    #[error(
        "the graph differs from the reserved one and there are several buffer types: call \
         reserve_with with its buffer ids first"
    )]
    NeedsBufferIds,
    /// A concurrency plan that does not describe this graph.
    #[error("concurrency plan: {0}")]
    BadConcurrencyPlan(String),
    /// A tensor the plan gave no storage.
    #[error("tensor '{0}' has no storage and the plan gave it none")]
    NoPlacement(String),
    /// The allocator's own bookkeeping is inconsistent (a bug, reported instead of a panic).
    #[error("internal error: {0}")]
    Internal(String),
}

/// Why the scheduler cannot place or run a graph.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SchedError {
    /// An empty backend list.
    #[error("no backends")]
    NoBackends,
    /// More backends than the scheduler supports.
    #[error("{n} backends, at most {max} are supported")]
    TooManyBackends {
        /// Backends given.
        n: usize,
        /// The limit.
        max: usize,
    },
    /// `n_copies` of 0.
    #[error("n_copies must be at least 1")]
    NoCopies,
    /// The last backend (the fallback for every op) is not a CPU backend.
    #[error("the last backend must be a CPU backend, got '{0}'")]
    LastBackendNotCpu(String),
    /// A buffer type list of the wrong length.
    #[error("{n_buffer_types} buffer types for {n_backends} backends")]
    BufferTypeCount {
        /// Buffer types given.
        n_buffer_types: usize,
        /// Backends given.
        n_backends: usize,
    },
    /// A backend given a buffer type it cannot use.
    #[error("backend '{backend}' cannot use buffer type '{buffer_type}'")]
    BufferTypeUnusable {
        /// The backend.
        backend: String,
        /// The buffer type.
        buffer_type: String,
    },
    /// A backend index (an override) past the backend list.
    #[error("backend {index} does not exist ({n_backends} backends)")]
    UnknownBackend {
        /// The index given.
        index: usize,
        /// Backends there are.
        n_backends: usize,
    },
    /// An override naming a device none of the scheduler's backends runs on.
    #[error("no backend of the scheduler runs on device '{0}'")]
    NoBackendOnDevice(String),
    /// A node no backend supports.
    #[error("no backend supports node '{node}' ({op})")]
    NoBackendSupports {
        /// The node's name.
        node: String,
        /// Its op.
        op: OpKind,
    },
    /// A node assigned (by an override or its weights) to a backend that cannot compute it.
    #[error("node '{node}' ({op}) is assigned to backend '{backend}', which does not support it")]
    AssignedBackendUnsupported {
        /// The node's name.
        node: String,
        /// Its op.
        op: OpKind,
        /// The backend.
        backend: String,
    },
    /// A pre-allocated tensor in memory that no backend able to compute its op can use.
    #[error(
        "tensor '{tensor}' ({op}) lives in buffer type '{buffer_type}', and no backend that can \
         use that memory supports the op"
    )]
    MemoryUnusable {
        /// The tensor's name.
        tensor: String,
        /// Its op.
        op: OpKind,
        /// Where it lives.
        buffer_type: String,
    },
    /// A graph larger than the scheduler was sized for.
    #[error("the graph has {n_tensors} tensors, the scheduler was made for at most {graph_size}")]
    GraphTooLarge {
        /// Tensors in the graph.
        n_tensors: usize,
        /// The scheduler's graph size.
        graph_size: usize,
    },
    /// Computing before a graph was allocated.
    #[error("no graph is allocated")]
    NotAllocated,
    /// A backend's concurrency plan of the wrong size.
    #[error("backend '{0}' reported a concurrency plan of the wrong size")]
    BadConcurrencyPlan(String),
    /// The scheduler's own bookkeeping is inconsistent (a bug, reported instead of a panic).
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<DTypeError> for Error {
    fn from(e: DTypeError) -> Error {
        match e {
            DTypeError::Unknown(what) => Error::UnknownDType(what),
            DTypeError::BlockMisaligned { dtype, n, block } => {
                Error::BlockMisaligned { dtype, n, block }
            }
            DTypeError::SizeOverflow => Error::SizeOverflow,
        }
    }
}
