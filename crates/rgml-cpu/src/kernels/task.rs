//! Floor 0 of the kernels: what a kernel runs on. [`TensorView`] (a tensor's pointer and
//! layout), [`NodeTask`] (one node's destination, sources and parameters), [`ThreadCtx`] (a
//! worker's index, scratch and the shared barrier), the thread splits of a node's work, and the
//! unsafe row accessors every op uses. See the memory-safety paragraph of [`super`].

use crate::barrier::SpinBarrier;
use crate::kernels::isa::CpuFeatures;
use rgml::{DType, Error, Op, Result, Tensor};
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A tensor as kernels see it: a base pointer, dtype, shape and byte strides.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TensorView {
    /// Element (0, 0, 0, 0).
    pub ptr: *mut u8,
    /// Element type.
    pub dtype: DType,
    /// Elements per dimension.
    pub ne: [usize; 4],
    /// Byte strides.
    pub nb: [usize; 4],
    /// Rows stored interleaved in groups ([`repack`]'s layout, a repacking buffer): row
    /// pointers then address whole groups, not single rows.
    pub packed: bool,
}

// SAFETY: a view is a pointer into a host buffer that the backend holds an exclusive guard on
// for the whole graph computation; threads that share views write disjoint rows (see the module
// docs), so sending and sharing the pointer between the compute threads is sound.
unsafe impl Send for TensorView {}
// SAFETY: as for `Send`: all accesses through shared views are partitioned between threads.
unsafe impl Sync for TensorView {}

impl TensorView {
    /// A view of `t` with its element 0 at `ptr`.
    pub fn new(t: &Tensor, ptr: *mut u8) -> Self {
        TensorView {
            ptr,
            dtype: t.dtype,
            ne: t.ne,
            nb: t.nb,
            packed: false,
        }
    }

    /// Number of rows.
    pub fn nrows(&self) -> usize {
        self.ne[1] * self.ne[2] * self.ne[3]
    }

    /// `(i1, i2, i3)` of flattened row `r`.
    pub fn row_index(&self, r: usize) -> (usize, usize, usize) {
        let i1 = r % self.ne[1];
        let i2 = (r / self.ne[1]) % self.ne[2];
        let i3 = r / (self.ne[1] * self.ne[2]);
        (i1, i2, i3)
    }

    /// Pointer to row `(i1, i2, i3)`; in bounds whenever the indices are below `ne`.
    pub fn row(&self, i1: usize, i2: usize, i3: usize) -> *mut u8 {
        self.ptr
            .wrapping_add(i1 * self.nb[1] + i2 * self.nb[2] + i3 * self.nb[3])
    }

    /// Whether each row is dense.
    pub fn rows_contiguous(&self) -> bool {
        self.nb[0] == self.dtype.block_bytes()
    }

    /// Bytes of one dense row.
    pub fn row_bytes(&self) -> usize {
        self.ne[0] / self.dtype.block_size() * self.dtype.block_bytes()
    }
}

/// The most sources a node has (GATED_DELTA_NET: q, k, v, g, beta, state).
pub(crate) const MAX_NODE_SRC: usize = 6;

/// One node ready to run: op, destination and sources.
#[derive(Clone, Debug)]
pub(crate) struct NodeTask {
    /// The op and its parameters.
    pub op: Op,
    /// The node's own memory.
    pub dst: TensorView,
    /// Its sources (unused slots are `None`).
    pub src: [Option<TensorView>; MAX_NODE_SRC],
    /// Whether the threads must all have finished the nodes before this one when it starts
    /// (false when it touches nothing they write, and writes nothing they touch).
    pub sync_before: bool,
    /// MUL_MAT: the work area already holds src1 converted as this node needs it (an earlier
    /// product of the same activations: q/k/v, gate/up), so phase 1 and its barrier are
    /// skipped.
    pub reuse_src1: bool,
    /// The instructions the kernel may use and the arithmetic it mirrors (the backend's).
    pub features: CpuFeatures,
    /// GATED_DELTA_NET: the new state is written over the state source (src 5) instead of
    /// into the result, whose state part stays unwritten (the plan fused the CPY that would
    /// copy it there and checked that nothing else reads it).
    pub state_in_place: bool,
    /// The backend's thread count: where ggml's rounding depends on how many threads share a
    /// node (FLASH_ATTN_EXT of one query over many cells), the kernel splits the work as that
    /// many ggml threads would, however many threads run it.
    pub threads: usize,
}

impl NodeTask {
    /// Source `i`, or an error naming the op if the graph lacks it.
    pub fn src(&self, i: usize) -> Result<&TensorView> {
        self.src
            .get(i)
            .and_then(|s| s.as_ref())
            .ok_or_else(|| Error::Backend {
                backend: "CPU".into(),
                message: format!("{}: missing source {i}", self.op.kind()),
            })
    }
}

/// Shared work area (MUL_MAT's converted src1), written in phases separated by the barrier.
#[derive(Clone, Copy)]
pub(crate) struct SharedWork {
    pub ptr: *mut u8,
    pub len: usize,
}

impl SharedWork {
    /// The pointer `offset` bytes into the area (a method, so closures capture the whole
    /// `Sync` struct rather than its raw pointer field).
    pub fn at(&self, offset: usize) -> *mut u8 {
        self.ptr.wrapping_add(offset)
    }
}

// SAFETY: the work area is owned by the backend (borrowed mutably for the whole graph); threads
// write disjoint parts before a barrier and only read it after, so sharing the pointer is sound.
unsafe impl Send for SharedWork {}
// SAFETY: see `Send`.
unsafe impl Sync for SharedWork {}

/// What one thread gets for running a node.
pub(crate) struct ThreadCtx<'a> {
    /// This thread's index.
    pub ith: usize,
    /// Number of threads.
    pub nth: usize,
    /// This thread's private scratch.
    pub scratch: &'a mut [f32],
    /// The area shared by all threads.
    pub shared: SharedWork,
    /// Synchronises phases inside a node.
    pub barrier: &'a SpinBarrier,
    /// The node's work counter, zero when the node starts (see [`ThreadCtx::claim`]).
    pub claim: &'a AtomicUsize,
}

impl ThreadCtx<'_> {
    /// This thread's share of `0..n`: contiguous, balanced ranges.
    pub fn split(&self, n: usize) -> Range<usize> {
        split(n, self.ith, self.nth)
    }
}

/// The most weight rows of one [`row_block`].
pub(crate) const MAX_BLOCK_ROWS: usize = 64;

/// Weight rows per block of MUL_MAT's phase 2, where `m` rows of each of `batches` weight
/// matrices are shared in blocks taken on demand ([`claimed`]): about 8 blocks per thread, at
/// least `min` and at most 64 rows, a multiple of `multiple` (a kernel's row group), at most
/// `m`.
pub(crate) fn row_block(
    m: usize,
    batches: usize,
    nth: usize,
    min: usize,
    multiple: usize,
) -> usize {
    (m * batches)
        .div_ceil((nth * 8).max(1))
        .clamp(min, MAX_BLOCK_ROWS)
        .next_multiple_of(multiple)
        .min(m.max(1))
}

/// The units of `0..n` this thread takes from a node's work counter (`ThreadCtx::claim`), one
/// at a time, until none is left.
///
/// Work handed out on demand instead of by thread index: on a busy machine a thread that is
/// descheduled mid-node leaves its remaining units to the others instead of making them wait
/// for it at the next barrier. A node may use its counter for one loop only (it is not reset
/// within the node), and a unit's results must not depend on which thread takes it.
pub(crate) fn claimed(counter: &AtomicUsize, n: usize) -> impl Iterator<Item = usize> + '_ {
    std::iter::from_fn(move || {
        let unit = counter.fetch_add(1, Ordering::Relaxed);
        (unit < n).then_some(unit)
    })
}

/// Thread `ith`'s share of `0..n` among `nth` threads.
pub(crate) fn split(n: usize, ith: usize, nth: usize) -> Range<usize> {
    let per = n.div_ceil(nth.max(1));
    let start = (ith * per).min(n);
    let end = (start + per).min(n);
    start..end
}

// ---------------------------------------------------------------------------------------------
// Row helpers shared by the kernel modules.

/// Whether byte ranges `[a, a + alen)` and `[b, b + blen)` intersect.
pub(crate) fn overlaps(a: *const u8, alen: usize, b: *const u8, blen: usize) -> bool {
    let (a, b) = (a as usize, b as usize);
    alen > 0 && blen > 0 && a < b.saturating_add(blen) && b < a.saturating_add(alen)
}

/// The f32 row of `n` elements at `src`, as a slice that may be held while the `dst_len`-byte
/// destination row at `dst` is written: a copy in `scratch` when the two overlap (in-place ops).
///
/// # Safety
/// `src` must point to `n` readable, initialised, 4-byte aligned f32 values inside a buffer the
/// caller holds the host guard of, which no other thread writes while the slice lives (except
/// through `dst`, which is why overlap is copied); `scratch` must hold at least `n` values.
pub(crate) unsafe fn f32_row_for_write(
    src: *const u8,
    n: usize,
    dst: *const u8,
    dst_len: usize,
    scratch: &mut [f32],
) -> Result<&[f32]> {
    if overlaps(src, n * 4, dst, dst_len) {
        let tmp = scratch_slice(scratch, n)?;
        // SAFETY: per the contract `src` is valid for `n` f32 reads; `tmp` is a distinct
        // allocation (the work buffer), so the regions do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(src.cast::<f32>(), tmp.as_mut_ptr(), n) };
        Ok(tmp)
    } else {
        // SAFETY: per the contract the row is valid and nobody writes it while the slice lives
        // (it does not overlap the destination row, the only memory this thread writes).
        Ok(unsafe { std::slice::from_raw_parts(src.cast::<f32>(), n) })
    }
}

/// The first `n` values of `scratch`, or an error if the plan made it too small.
pub(crate) fn scratch_slice(scratch: &mut [f32], n: usize) -> Result<&mut [f32]> {
    let len = scratch.len();
    scratch.get_mut(..n).ok_or_else(|| Error::Backend {
        backend: "CPU".into(),
        message: format!("scratch of {len} values too small for {n}"),
    })
}

/// A mutable f32 row.
///
/// # Safety
/// `ptr` must point to `n` writable, 4-byte aligned f32 values that no other live reference
/// covers and no other thread accesses while the slice lives.
pub(crate) unsafe fn f32_row_mut<'a>(ptr: *mut u8, n: usize) -> &'a mut [f32] {
    // SAFETY: guaranteed by the caller.
    unsafe { std::slice::from_raw_parts_mut(ptr.cast::<f32>(), n) }
}

/// A shared f32 row.
///
/// # Safety
/// `ptr` must point to `n` readable, 4-byte aligned f32 values that nobody writes while the
/// slice lives.
pub(crate) unsafe fn f32_row<'a>(ptr: *const u8, n: usize) -> &'a [f32] {
    // SAFETY: guaranteed by the caller.
    unsafe { std::slice::from_raw_parts(ptr.cast::<f32>(), n) }
}

/// A shared byte range.
///
/// # Safety
/// `ptr` must point to `n` readable bytes that nobody writes while the slice lives.
pub(crate) unsafe fn bytes<'a>(ptr: *const u8, n: usize) -> &'a [u8] {
    // SAFETY: guaranteed by the caller.
    unsafe { std::slice::from_raw_parts(ptr, n) }
}

/// A mutable byte range.
///
/// # Safety
/// `ptr` must point to `n` writable bytes that no other reference covers and no other thread
/// accesses while the slice lives.
pub(crate) unsafe fn bytes_mut<'a>(ptr: *mut u8, n: usize) -> &'a mut [u8] {
    // SAFETY: guaranteed by the caller.
    unsafe { std::slice::from_raw_parts_mut(ptr, n) }
}

/// The activation columns of a product with ggml's broadcast: every src1 row of the `r2 x r3`
/// batches broadcast onto one weight matrix (grouped-query attention's heads) is a column of
/// that matrix's product.
pub(crate) struct Columns {
    ne11: usize,
    r2: usize,
    r3: usize,
    /// Columns per weight matrix.
    pub n: usize,
}

impl Columns {
    pub(crate) fn new(dst: &TensorView, a: &TensorView) -> Self {
        let (ne11, ne12, ne13) = (dst.ne[1], dst.ne[2], dst.ne[3]);
        let r2 = ne12 / a.ne[2].max(1);
        let r3 = ne13 / a.ne[3].max(1);
        Columns {
            ne11,
            r2,
            r3,
            n: ne11 * r2 * r3,
        }
    }

    /// Column c of weight batch (i02, i03): src1 row `(c % ne11, i02 * r2 + j % r2, i03 * r3 +
    /// j / r2)` with `j = c / ne11`.
    #[inline]
    pub(crate) fn at(&self, c: usize, i02: usize, i03: usize) -> (usize, usize, usize) {
        let j = c / self.ne11.max(1);
        (
            c % self.ne11.max(1),
            i02 * self.r2 + j % self.r2.max(1),
            i03 * self.r3 + j / self.r2.max(1),
        )
    }
}
