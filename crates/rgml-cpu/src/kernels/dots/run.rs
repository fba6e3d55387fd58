//! The operands of a matrix-vector kernel: a run of weight rows against one activation row.

use bytemuck::Pod;
use std::borrow::Cow;

/// A matrix-vector kernel: `out[r] = dot(row r, y)` for the `out.len()` weight rows of the
/// run, each output bit for bit `vec_dot`'s.
///
/// # Safety
/// Each of the `out.len()` rows of the run holds `nb` readable blocks of the kernel's type;
/// `y` holds `nb` readable activation blocks.
pub(crate) type MatvecKernel = unsafe fn(RowRun, &mut [f32]);

/// The operands of a [`MatvecKernel`] but the outputs.
#[derive(Clone, Copy)]
pub(crate) struct RowRun {
    /// Blocks per row.
    pub nb: usize,
    /// The first weight row.
    pub x0: *const u8,
    /// Bytes from one weight row to the next.
    pub row_stride: usize,
    /// The activation row (blocks of the weight type's `vec_dot_type`).
    pub y: *const u8,
}

/// Borrows `bytes` as `T`s when aligned, copies them otherwise. Callers have checked that the
/// length is a whole number of `T`s.
pub(super) fn plain<T: Pod>(bytes: &[u8]) -> Cow<'_, [T]> {
    match bytemuck::try_cast_slice(bytes) {
        Ok(v) => Cow::Borrowed(v),
        Err(_) => Cow::Owned(
            bytes
                .chunks_exact(std::mem::size_of::<T>())
                .map(bytemuck::pod_read_unaligned)
                .collect(),
        ),
    }
}

/// `out[r] = dot(row r, y)` for each row of `run`, `dot` a pair dot over `run.nb` blocks: a
/// weight type's `vec_dot` as a [`MatvecKernel`], without [`super::vec_dot`]'s per-call length
/// checks and dispatch (4% of a decode step of a K-quant mixture-of-experts model). `dot`
/// prefetches the row as it reads it (a [`crate::kernels::simd::StreamPrefetch`]: a steady
/// stream, where a row's span prefetched before its dot bursts; see
/// [`crate::kernels::simd::STREAM_AHEAD`]). Rows not aligned for their blocks are read through
/// copies ([`plain`]).
///
/// # Safety
/// As [`MatvecKernel`], for rows of `B` blocks and an activation row of `Y` blocks; `dot` may
/// be called on this CPU.
#[inline(always)]
pub(crate) unsafe fn each_row<B: Pod, Y: Pod>(
    run: RowRun,
    out: &mut [f32],
    dot: impl Fn(&[B], &[Y]) -> f32,
) {
    let (xb, yb) = (run.nb * size_of::<B>(), run.nb * size_of::<Y>());
    // SAFETY: the caller's: `y` holds `nb` readable activation blocks.
    let y = plain::<Y>(unsafe { std::slice::from_raw_parts(run.y, yb) });
    for (r, o) in out.iter_mut().enumerate() {
        let row = run.x0.wrapping_add(r * run.row_stride);
        // SAFETY: row `r` of the run holds `nb` readable blocks (the caller's).
        let x = plain::<B>(unsafe { std::slice::from_raw_parts(row, xb) });
        *o = dot(&x, &y);
    }
}
