//! Tensor metadata: shape, strides, dtype, op and sources, view relation, flags, name, storage.
//!
//! A [`Tensor`] never owns memory: its storage is a `(buffer, offset)` pair set by an allocator.
//! Tensors live in a [`crate::Context`] arena and refer to each other by [`TensorId`].

use crate::backend::Buffer;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::op::Op;
use std::sync::Arc;

/// Maximum number of dimensions.
pub const MAX_DIMS: usize = 4;

/// A tensor of a [`crate::Context`]: its position in the arena and the process-unique serial
/// the context gave it when it was pushed.
///
/// The serial makes ids checkable: a context accepts an id only if the tensor at that position
/// carries the same serial, so an id from another context, or from before a
/// [`truncate`](crate::Context::truncate) that dropped its tensor, is an error instead of a
/// silent reference to whatever tensor now sits there. A [`Clone`] of a context keeps its
/// tensors' serials, so ids of tensors that existed before the clone work in both (a session's
/// graph context is a clone of its model's).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId {
    pub(crate) index: u32,
    pub(crate) serial: u64,
}

impl TensorId {
    /// Position in the context's arena.
    pub const fn index(self) -> usize {
        self.index as usize
    }
}

impl std::fmt::Debug for TensorId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TensorId({}#{})", self.index, self.serial)
    }
}

/// Role flags, as ggml's `GGML_TENSOR_FLAG_*`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TensorFlags(u8);

impl TensorFlags {
    /// Set by the caller before compute; allocated first and never overwritten by other nodes.
    pub const INPUT: TensorFlags = TensorFlags(1);
    /// Read by the caller after compute; its memory is never reused within the graph.
    pub const OUTPUT: TensorFlags = TensorFlags(2);
    /// A trainable parameter (kept as a graph node even without an op).
    pub const PARAM: TensorFlags = TensorFlags(4);
    /// Marked for computation by the scheduler.
    pub const COMPUTE: TensorFlags = TensorFlags(8);

    /// No flags.
    pub const fn empty() -> Self {
        TensorFlags(0)
    }
    /// Whether every flag in `other` is set.
    pub const fn contains(self, other: TensorFlags) -> bool {
        self.0 & other.0 == other.0
    }
    /// Set the flags in `other`.
    pub fn insert(&mut self, other: TensorFlags) {
        self.0 |= other.0;
    }
    /// Clear the flags in `other`.
    pub fn remove(&mut self, other: TensorFlags) {
        self.0 &= !other.0;
    }
}

/// Where a tensor's bytes are: a buffer and a byte offset into it.
#[derive(Clone, Debug)]
pub struct TensorData {
    /// The buffer holding the bytes.
    pub buffer: Arc<Buffer>,
    /// Byte offset of element 0 in the buffer.
    pub offset: usize,
}

/// Tensor metadata (ggml's `struct ggml_tensor` without the data pointer).
#[derive(Clone, Debug)]
pub struct Tensor {
    /// Element type.
    pub dtype: DType,
    /// Elements per dimension (unused dimensions are 1).
    pub ne: [usize; MAX_DIMS],
    /// Byte stride per dimension; `nb[0]` is the block size in bytes.
    pub nb: [usize; MAX_DIMS],
    /// The operation that computes this tensor.
    pub op: Op,
    /// Operands of `op`.
    pub src: Vec<TensorId>,
    /// The tensor whose memory this one views (always a non-view root).
    pub view_src: Option<TensorId>,
    /// Byte offset into `view_src`.
    pub view_offset: usize,
    /// Role flags.
    pub flags: TensorFlags,
    /// A name for debugging, traces and lookups.
    pub name: String,
    /// Storage, once allocated.
    pub data: Option<TensorData>,
}

impl Tensor {
    /// A contiguous tensor of `dtype` and shape `ne` with no op, no storage.
    pub fn new(dtype: DType, ne: [usize; MAX_DIMS]) -> Result<Tensor> {
        let nb = contiguous_strides(dtype, ne)?;
        Ok(Tensor {
            dtype,
            ne,
            nb,
            op: Op::None,
            src: Vec::new(),
            view_src: None,
            view_offset: 0,
            flags: TensorFlags::empty(),
            name: String::new(),
            data: None,
        })
    }

    /// Whether `size` bytes at byte `offset` lie inside the tensor's `nbytes` span (else
    /// [`Error::OutOfBounds`] naming it): the check of every tensor read and write.
    pub fn check_range(&self, offset: usize, size: usize) -> Result<()> {
        let nbytes = self.nbytes();
        if offset.checked_add(size).is_none_or(|end| end > nbytes) {
            return Err(Error::OutOfBounds {
                what: format!("tensor '{}'", self.display_name()),
                offset,
                size,
                limit: nbytes,
            });
        }
        Ok(())
    }

    /// Total number of elements.
    pub fn nelements(&self) -> usize {
        self.ne.iter().product()
    }

    /// Number of rows (product of dims 1..4).
    pub fn nrows(&self) -> usize {
        self.ne[1] * self.ne[2] * self.ne[3]
    }

    /// Bytes of one row of `ne[0]` elements.
    pub fn row_bytes(&self) -> usize {
        self.ne[0] / self.dtype.block_size() * self.dtype.block_bytes()
    }

    /// Bytes spanned from the first to one past the last element (ggml's `ggml_nbytes`).
    pub fn nbytes(&self) -> usize {
        if self.ne.contains(&0) {
            return 0;
        }
        let bs = self.dtype.block_size();
        let mut bytes = if bs == 1 {
            self.dtype.block_bytes()
        } else {
            self.ne[0] / bs * self.nb[0]
        };
        let first = if bs == 1 { 0 } else { 1 };
        for i in first..MAX_DIMS {
            bytes += (self.ne[i] - 1) * self.nb[i];
        }
        bytes
    }

    /// Whether the elements are stored densely in row-major order.
    pub fn is_contiguous(&self) -> bool {
        self.nb == contiguous_strides_unchecked(self.dtype, self.ne)
    }

    /// Whether each row is dense (`nb[0]` is the element size), whatever the outer strides.
    pub fn rows_contiguous(&self) -> bool {
        self.nb[0] == self.dtype.block_bytes()
    }

    /// Whether dims 0 and 1 are swapped in memory.
    pub fn is_transposed(&self) -> bool {
        self.nb[0] > self.nb[1]
    }

    /// Whether strides are not monotonic (a permutation of a contiguous tensor).
    pub fn is_permuted(&self) -> bool {
        self.nb[0] > self.nb[1] || self.nb[1] > self.nb[2] || self.nb[2] > self.nb[3]
    }

    /// Whether this tensor is a view into another tensor's memory.
    pub fn is_view(&self) -> bool {
        self.view_src.is_some()
    }

    /// Same shape as `other`.
    pub fn same_shape(&self, other: &Tensor) -> bool {
        self.ne == other.ne
    }

    /// Same shape and strides as `other`.
    pub fn same_layout(&self, other: &Tensor) -> bool {
        self.ne == other.ne && self.nb == other.nb && self.dtype == other.dtype
    }

    /// A display name: the tensor's name, or a placeholder.
    pub fn display_name(&self) -> &str {
        if self.name.is_empty() {
            "(unnamed)"
        } else {
            &self.name
        }
    }

    /// Byte offset of element `(i0, i1, i2, i3)` (i0 must be a block boundary for quantized types).
    pub fn offset_of(&self, i: [usize; MAX_DIMS]) -> usize {
        i[0] / self.dtype.block_size() * self.nb[0]
            + i[1] * self.nb[1]
            + i[2] * self.nb[2]
            + i[3] * self.nb[3]
    }
}

/// Dense row-major strides for `dtype` and `ne`, checking block alignment and overflow.
pub fn contiguous_strides(dtype: DType, ne: [usize; MAX_DIMS]) -> Result<[usize; MAX_DIMS]> {
    if !ne[0].is_multiple_of(dtype.block_size()) {
        return Err(Error::BlockMisaligned {
            dtype,
            n: ne[0],
            block: dtype.block_size(),
        });
    }
    // The total size must fit in usize (and in a sane allocation).
    let mut total = dtype.row_bytes(ne[0])?;
    for &n in &ne[1..] {
        total = total.checked_mul(n).ok_or(Error::SizeOverflow)?;
    }
    if total > isize::MAX as usize {
        return Err(Error::SizeOverflow);
    }
    Ok(contiguous_strides_unchecked(dtype, ne))
}

fn contiguous_strides_unchecked(dtype: DType, ne: [usize; MAX_DIMS]) -> [usize; MAX_DIMS] {
    let nb0 = dtype.block_bytes();
    let nb1 = nb0 * (ne[0] / dtype.block_size());
    let nb2 = nb1 * ne[1];
    let nb3 = nb2 * ne[2];
    [nb0, nb1, nb2, nb3]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strides_and_sizes() {
        let t = Tensor::new(DType::Q4_0, [64, 3, 2, 1]).unwrap();
        assert_eq!(t.nb, [18, 36, 108, 216]);
        assert_eq!(t.nbytes(), 216);
        assert!(t.is_contiguous());
        assert_eq!(t.nrows(), 6);
        assert!(Tensor::new(DType::Q4_0, [33, 1, 1, 1]).is_err());
        assert!(Tensor::new(DType::F32, [usize::MAX / 2, 4, 1, 1]).is_err());
    }

    #[test]
    fn flags() {
        let mut f = TensorFlags::empty();
        f.insert(TensorFlags::INPUT);
        f.insert(TensorFlags::OUTPUT);
        assert!(f.contains(TensorFlags::INPUT));
        f.remove(TensorFlags::INPUT);
        assert!(!f.contains(TensorFlags::INPUT) && f.contains(TensorFlags::OUTPUT));
    }
}
