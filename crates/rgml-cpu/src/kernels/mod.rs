//! CPU kernels: one module per op family, the per-node task description they run on, and the
//! support table ([`check_supported`]) that says exactly which (op, dtypes, layouts) they
//! implement.
//!
//! Which SIMD paths and which ggml build's arithmetic a kernel uses is decided by the
//! [`CpuFeatures`] of its node (`NodeTask::features`, the backend's, resolved once when the
//! device or backend was made; see [`isa`]): kernels never detect CPU features themselves.
//!
//! Kernels follow ggml's threading model: every thread of the backend calls the kernel of a node
//! with its index `ith` of `nth`, and the kernel picks its share of the work (usually a range of
//! destination rows). Phased kernels (MUL_MAT) synchronise with the shared barrier. Kernels
//! never allocate: per-thread scratch and the shared work area are sized in advance by
//! [`work_size`].
//!
//! Memory safety: a [`TensorView`] is a raw pointer into a host buffer whose exclusive
//! [`rgml::backend::HostAccess`] guard the backend holds for the whole graph, and whose extent
//! (`nbytes`) the backend checked against the buffer size. Every row pointer a kernel forms is
//! therefore in bounds. Threads write disjoint destination rows; a destination that overlaps a
//! source is accepted by the backend only as an exact alias (same pointer and layout) for the
//! in-place ops, and kernels copy such a source row to scratch before writing the row.

pub mod dot;

pub(crate) mod activations;
mod bf16;
mod convert;
mod copy;
mod elementwise;
#[cfg(target_arch = "x86_64")]
mod flash_attn;
mod float_avx2;
mod fp16;
pub mod isa;
mod kquant_dot;
mod ktiled;
mod lowbit_dot;
pub(crate) mod matmul;
mod norm;
pub(crate) mod repack;
mod rope;
mod rows;
mod softmax;
pub(crate) mod tiled;
mod vec_float;
mod vexp;

pub(crate) use convert::quant_available;

/// Row encoding, for the tests.
#[cfg(test)]
pub(crate) fn row_from_f32_for_tests(dtype: DType, src: &[f32], dst: &mut [u8]) -> Result<()> {
    convert::row_from_f32(dtype, src, dst)
}

/// ROPE's YaRN correction dims, for the reference in the tests.
#[cfg(test)]
pub(crate) fn rope_corr_dims_for_tests(p: &rgml::RopeParams) -> [f32; 2] {
    rope::corr_dims(p)
}

use crate::barrier::SpinBarrier;
pub(crate) use isa::CpuFeatures;
use rgml::{Context, DType, Error, Op, OpKind, Result, Tensor, TensorId};
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

/// The most sources a node has (FLASH_ATTN_EXT: q, k, v, mask, sinks).
pub(crate) const MAX_NODE_SRC: usize = 5;

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

/// The error for a node the kernels do not implement.
fn unsupported(what: String) -> Error {
    Error::Unsupported {
        backend: "CPU".into(),
        what,
    }
}

/// `OP(dst <- src0, src1, ...)` with dtypes, for error messages.
fn describe(ctx: &Context, t: &Tensor) -> String {
    let srcs: Vec<String> = t
        .src
        .iter()
        .map(|&s| {
            ctx.get(s)
                .map(|s| s.dtype.name().to_string())
                .unwrap_or_else(|_| "?".into())
        })
        .collect();
    format!(
        "{} ({} <- {})",
        t.op.kind(),
        t.dtype.name(),
        srcs.join(", ")
    )
}

/// Whether the CPU kernels implement node `id` as it is (op, dtypes, layouts); the error says
/// what is missing. View ops are always supported (nothing runs for them).
pub fn check_supported(ctx: &Context, id: TensorId) -> Result<()> {
    let t = ctx.get(id)?;
    let kind = t.op.kind();
    if kind.is_view() {
        return Ok(());
    }
    let mut srcs = Vec::with_capacity(t.src.len());
    for &s in &t.src {
        srcs.push(ctx.get(s)?);
    }
    // Packed weights are read by the ops that know their layout, as the first source, whole.
    let packed_ok = !in_repack_memory(ctx, t)
        && srcs.iter().enumerate().all(|(i, src)| {
            !in_repack_memory(ctx, src)
                || (i == 0
                    && crate::buffer::packable(src)
                    && matches!(t.op, Op::MulMat { .. } | Op::GetRows))
        });
    let ok = packed_ok && supported(t, &srcs);
    if ok {
        Ok(())
    } else {
        Err(unsupported(describe(ctx, t)))
    }
}

/// Whether `t`'s bytes (its own, or its view source's) live in repacked memory.
pub(crate) fn in_repack_memory(ctx: &Context, t: &Tensor) -> bool {
    let root = match t.view_src {
        Some(v) => ctx.get(v).ok(),
        None => Some(t),
    };
    root.and_then(|r| r.data.as_ref())
        .or(t.data.as_ref())
        .is_some_and(|d| crate::CpuRepackBufferType::is_repack(d.buffer.buffer_type()))
}

fn supported(t: &Tensor, s: &[&Tensor]) -> bool {
    use DType::*;
    let n = |k: usize| s.len() == k;
    let f32_rows = |x: &Tensor| x.dtype == F32 && x.rows_contiguous();
    let plain = |d: DType| matches!(d, F32 | F16 | BF16);
    // A kernel's dtype must be decodable (plain, or quantized with codecs available).
    let decodable = |d: DType| plain(d) || (d.is_quantized() && quant_available());
    let block_ok = |x: &Tensor| x.ne[0].is_multiple_of(x.dtype.block_size());
    if !block_ok(t) || s.iter().any(|x| !block_ok(x)) {
        return false;
    }
    match t.op {
        Op::FlashAttnExt { mask, sinks, .. } => flash_attn::supported(t, s, mask, sinks),
        Op::Dup | Op::Cont => n(1) && copy::supported(s[0], t),
        Op::Cpy => n(2) && copy::supported(s[0], t),
        Op::GetRows => {
            n(2) && s[1].dtype == I32
                && s[1].rows_contiguous()
                && t.rows_contiguous()
                && s[0].rows_contiguous()
                && t.ne == [s[0].ne[0], s[1].ne[0], s[1].ne[1], s[1].ne[2]]
                && s[0].ne[2] == s[1].ne[1]
                && s[0].ne[3] == s[1].ne[2]
                && s[1].ne[3] == 1
                && if s[0].dtype == I32 {
                    t.dtype == I32
                } else {
                    t.dtype == F32 && decodable(s[0].dtype)
                }
        }
        Op::SetRows => {
            n(3) && f32_rows(s[1])
                && matches!(s[2].dtype, I32 | I64)
                && s[2].rows_contiguous()
                && t.rows_contiguous()
                && t.ne[0] == s[1].ne[0]
                && t.ne[2] == s[1].ne[2]
                && t.ne[3] == s[1].ne[3]
                && s[2].ne[0] == s[1].ne[1]
                && s[2].ne[1] > 0
                && s[2].ne[2] > 0
                && s[1].ne[2].is_multiple_of(s[2].ne[1])
                && s[1].ne[3].is_multiple_of(s[2].ne[2])
                && s[2].ne[3] == 1
                && (plain(t.dtype)
                    || (quant_available() && matches!(t.dtype, Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0)))
        }
        Op::Add | Op::Sub | Op::Mul | Op::Div => {
            n(2) && plain(t.dtype)
                && t.dtype == s[0].dtype
                && plain(s[1].dtype)
                && t.rows_contiguous()
                && s[0].rows_contiguous()
                && s[1].rows_contiguous()
                && t.ne == s[0].ne
                && (0..4).all(|i| s[1].ne[i] > 0 && t.ne[i].is_multiple_of(s[1].ne[i]))
        }
        Op::Scale { .. }
        | Op::Unary(_)
        | Op::RmsNorm { .. }
        | Op::Norm { .. }
        | Op::DiagMaskInf { .. } => n(1) && f32_rows(t) && f32_rows(s[0]) && t.ne == s[0].ne,
        Op::Swiglu | Op::Geglu => {
            n(2) && f32_rows(t)
                && f32_rows(s[0])
                && f32_rows(s[1])
                && t.ne == s[0].ne
                && t.ne == s[1].ne
        }
        Op::SoftMax { .. } => {
            (n(1) || n(2))
                && f32_rows(t)
                && f32_rows(s[0])
                && t.ne == s[0].ne
                && s.get(1).is_none_or(|m| {
                    matches!(m.dtype, F32 | F16)
                        && m.rows_contiguous()
                        && m.ne[0] == t.ne[0]
                        && m.ne[1] >= t.ne[1]
                        && m.ne[2] > 0
                        && m.ne[3] > 0
                        && t.ne[2].is_multiple_of(m.ne[2])
                        && t.ne[3].is_multiple_of(m.ne[3])
                })
        }
        Op::Rope(p) => {
            (n(2) || n(3))
                && f32_rows(t)
                && f32_rows(s[0])
                && t.ne == s[0].ne
                && s[1].dtype == I32
                && s[1].rows_contiguous()
                && s[1].ne[0] >= t.ne[2]
                && p.n_dims.is_multiple_of(2)
                && p.n_dims <= t.ne[0]
                // Frequency factors: the first n_dims / 2 values of a dense f32 row.
                && s.get(2).is_none_or(|f| f32_rows(f) && f.ne[0] >= p.n_dims / 2)
        }
        Op::MulMat { .. } => n(2) && matmul::supported(s[0], s[1], t),
        Op::Concat { dim } => {
            n(2) && dim < 4
                && s[0].dtype == t.dtype
                && s[1].dtype == t.dtype
                && !t.dtype.is_quantized()
                && (0..4).all(|i| {
                    if i == dim {
                        s[0].ne[i] + s[1].ne[i] == t.ne[i]
                    } else {
                        s[0].ne[i] == t.ne[i] && s[1].ne[i] == t.ne[i]
                    }
                })
        }
        Op::Argmax => {
            n(1) && f32_rows(s[0])
                && t.dtype == I32
                && t.rows_contiguous()
                && t.ne[0] == s[0].ne[1]
                && s[0].ne[2] == 1
                && s[0].ne[3] == 1
        }
        Op::None | Op::Reshape | Op::View { .. } | Op::Permute { .. } | Op::Transpose => true,
    }
}

/// Whether source `i` of a node may be its destination (exact alias only): the operands of
/// ggml's in-place ops, which each row reads before writing it. Not ROPE's frequency factors:
/// every row reads all of them.
pub(crate) fn inplace_capable(op: &Op, i: usize) -> bool {
    if matches!((op, i), (Op::Rope(_), 2)) {
        return false;
    }
    matches!(
        op.kind(),
        OpKind::Scale
            | OpKind::DiagMaskInf
            | OpKind::Add
            | OpKind::Sub
            | OpKind::Mul
            | OpKind::Div
            | OpKind::Silu
            | OpKind::Gelu
            | OpKind::Tanh
            | OpKind::Swiglu
            | OpKind::Geglu
            | OpKind::Rope
            | OpKind::RmsNorm
            | OpKind::Norm
            | OpKind::SoftMax
    )
}

/// Sources a node writes rather than reads (CPY's target, SET_ROWS's destination).
pub(crate) fn is_target_src(op: &Op, i: usize) -> bool {
    matches!((op, i), (Op::Cpy, 1) | (Op::SetRows, 0))
}

/// Work a node needs on a backend with features `f`: `(shared bytes, per-thread scratch in f32
/// elements)`.
pub(crate) fn work_size(ctx: &Context, t: &Tensor, f: CpuFeatures) -> Result<(usize, usize)> {
    let mut widest = t.ne[0];
    for &s in &t.src {
        widest = widest.max(ctx.get(s)?.ne[0]);
    }
    if matches!(t.op, Op::FlashAttnExt { .. }) {
        // Its tiled kernel also holds a tile of 64 scores.
        widest = widest.max(64);
    }
    let shared = match t.op {
        Op::MulMat { .. } => {
            let (a, b) = (ctx.get(t.src[0])?, ctx.get(t.src[1])?);
            matmul::shared_size(f, a, b)?
        }
        _ => 0,
    };
    // Up to four rows of the widest operand (sources copied out of the destination, converted
    // rows, ROPE's cos/sin cache, a packed group unpacked), plus slack to keep per-thread areas
    // on separate cache lines.
    let per_thread = widest.checked_mul(4).ok_or(Error::SizeOverflow)? + 16;
    Ok((shared, per_thread))
}

/// Run thread `tc.ith`'s share of `task`.
pub(crate) fn compute(task: &NodeTask, tc: &mut ThreadCtx<'_>) -> Result<()> {
    match task.op {
        Op::None | Op::Reshape | Op::View { .. } | Op::Permute { .. } | Op::Transpose => Ok(()),
        Op::Dup | Op::Cont | Op::Cpy => copy::dup(task, tc),
        Op::Concat { dim } => copy::concat(task, tc, dim),
        Op::GetRows => rows::get_rows(task, tc),
        Op::SetRows => rows::set_rows(task, tc),
        Op::Argmax => rows::argmax(task, tc),
        Op::Add | Op::Sub | Op::Mul | Op::Div => elementwise::binary(task, tc),
        Op::Scale { scale, bias } => elementwise::scale(task, tc, scale, bias),
        Op::Unary(u) => elementwise::unary(task, tc, u),
        Op::Swiglu => elementwise::swiglu(task, tc),
        Op::Geglu => elementwise::geglu(task, tc),
        Op::RmsNorm { eps } => norm::rms_norm(task, tc, eps),
        Op::Norm { eps } => norm::norm(task, tc, eps),
        Op::SoftMax { scale, max_bias } => softmax::soft_max(task, tc, scale, max_bias),
        Op::DiagMaskInf { n_past } => softmax::diag_mask_inf(task, tc, n_past),
        Op::Rope(p) => rope::rope(task, tc, &p),
        Op::MulMat { .. } => matmul::mul_mat(task, tc),
        Op::FlashAttnExt {
            scale,
            max_bias,
            softcap,
            mask,
            sinks,
        } => flash_attn::flash_attn_ext(
            task,
            tc,
            &flash_attn::FlashParams {
                scale,
                max_bias,
                softcap,
                mask,
                sinks,
            },
        ),
    }
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
