//! The operands of a matrix-vector kernel: a run of weight rows against one activation row.

use crate::kernels::simd::{prefetch_span, PREFETCH_AHEAD};
use bytemuck::Pod;

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

/// `out[r] = dot(row r, y)` for each row of `run`, `dot` a pair dot over `run.nb` blocks: a
/// weight type's `vec_dot` as a [`MatvecKernel`], without [`super::vec_dot`]'s per-call length
/// checks and dispatch (4% of a decode step of a K-quant mixture-of-experts model). Each row is
/// first prefetched [`PREFETCH_AHEAD`] bytes on, as the pairwise loop does (the hardware
/// prefetcher alone does not keep DRAM busy). Rows or an activation row not aligned for their
/// blocks are read through copies.
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
    let aligned = |p: *const u8, align: usize| (p as usize).is_multiple_of(align);
    let direct = aligned(run.x0, align_of::<B>())
        && run.row_stride.is_multiple_of(align_of::<B>())
        && aligned(run.y, align_of::<Y>());
    // SAFETY: the caller's: `y` holds `nb` readable activation blocks.
    let y_bytes = unsafe { std::slice::from_raw_parts(run.y, yb) };
    let y: std::borrow::Cow<'_, [Y]> = match direct {
        // SAFETY: aligned for `Y` (checked), `nb` blocks of plain data.
        true => std::borrow::Cow::Borrowed(unsafe {
            std::slice::from_raw_parts(run.y.cast::<Y>(), run.nb)
        }),
        false => y_bytes
            .chunks_exact(size_of::<Y>())
            .map(bytemuck::pod_read_unaligned)
            .collect(),
    };
    for (r, o) in out.iter_mut().enumerate() {
        let row = run.x0.wrapping_add(r * run.row_stride);
        prefetch_span(row.wrapping_add(PREFETCH_AHEAD), xb);
        *o = if direct {
            // SAFETY: row `r` holds `nb` readable blocks (the caller), aligned for `B`.
            dot(
                unsafe { std::slice::from_raw_parts(row.cast::<B>(), run.nb) },
                &y,
            )
        } else {
            // SAFETY: as above, read unaligned.
            let bytes = unsafe { std::slice::from_raw_parts(row, xb) };
            let x: Vec<B> = bytes
                .chunks_exact(size_of::<B>())
                .map(bytemuck::pod_read_unaligned)
                .collect();
            dot(&x, &y)
        };
    }
}
