//! DUP / CONT / CPY (copies between any layouts and shapes with equal element counts,
//! converting dtypes), CONCAT and REPEAT.
//!
//! Element `k` of the destination in row-major logical order receives element `k` of the source
//! in the same order, as ggml's dup. Threads split destination rows; each destination row is
//! filled from one or more runs ("segments") of source rows.

use crate::kernels::blocks::activations::quantize_activations;
use crate::kernels::blocks::convert;
use crate::kernels::blocks::convert::{load_f32, row_to_f32, store_f32};
use crate::kernels::isa::CpuFeatures;
use crate::kernels::task::{bytes, bytes_mut, scratch_slice, NodeTask, TensorView, ThreadCtx};
use rgml::{DType, Result, Tensor};

/// Whether [`dup`] handles copying `src` into `dst`.
pub(crate) fn supported(src: &Tensor, dst: &Tensor) -> bool {
    use DType::*;
    let plain = |d: DType| matches!(d, F32 | F16 | BF16);
    let quant_dst = |d: DType| {
        matches!(
            d,
            Q4_0 | Q4_1
                | Q5_0
                | Q5_1
                | Q8_0
                | Q2_K
                | Q3_K
                | Q4_K
                | Q5_K
                | Q6_K
                | IQ4_NL
                | IQ4_XS
                | MXFP4
        )
    };
    if src.nelements() != dst.nelements() {
        return false;
    }
    if src.dtype == dst.dtype {
        return if src.dtype.is_quantized() {
            src.ne[0] == dst.ne[0] && src.rows_contiguous() && dst.rows_contiguous()
        } else {
            true
        };
    }
    let q = convert::quant_available();
    (plain(src.dtype) && plain(dst.dtype))
        || (q && plain(src.dtype) && quant_dst(dst.dtype) && dst.rows_contiguous())
        || (q && src.dtype.is_quantized() && dst.dtype == F32 && src.rows_contiguous())
}

/// Coordinates of logical element `e` of a tensor of shape `ne`.
fn coords(e: usize, ne: &[usize; 4]) -> [usize; 4] {
    let i0 = e % ne[0];
    let r = e / ne[0];
    [i0, r % ne[1], (r / ne[1]) % ne[2], r / (ne[1] * ne[2])]
}

/// Advance `j` by `n` elements along dim 0 and carry into the outer dims.
fn advance(j: &mut [usize; 4], n: usize, ne: &[usize; 4]) {
    j[0] += n;
    if j[0] >= ne[0] {
        j[0] = 0;
        j[1] += 1;
        if j[1] >= ne[1] {
            j[1] = 0;
            j[2] += 1;
            if j[2] >= ne[2] {
                j[2] = 0;
                j[3] += 1;
            }
        }
    }
}

/// DUP, CONT and CPY.
pub(crate) fn dup(task: &NodeTask, tc: &mut ThreadCtx<'_>) -> Result<()> {
    let (dst, src) = (&task.dst, task.src(0)?);
    let rows = tc.split(dst.nrows());
    if rows.is_empty() || dst.ne[0] == 0 {
        return Ok(());
    }
    if src.dtype == dst.dtype && !src.dtype.is_quantized() {
        return copy_same(src, dst, rows);
    }
    if src.dtype == dst.dtype {
        // Same quantized type, same ne0, dense rows: copy rows as bytes.
        let rb = dst.row_bytes();
        for r in rows {
            let (i1, i2, i3) = dst.row_index(r);
            let [_, j1, j2, j3] = coords(r * dst.ne[0], &src.ne);
            // SAFETY: both rows are in bounds and `rb` bytes long; the source does not overlap
            // the destination (checked by the backend for non-in-place ops).
            unsafe {
                std::ptr::copy_nonoverlapping(src.row(j1, j2, j3), dst.row(i1, i2, i3), rb);
            }
        }
        return Ok(());
    }
    convert_rows(task.features, src, dst, rows, tc.scratch)
}

/// Same non-block dtype: copy element bytes, exactly (no f32 round trip).
fn copy_same(src: &TensorView, dst: &TensorView, rows: std::ops::Range<usize>) -> Result<()> {
    let es = dst.dtype.block_bytes();
    let ne0 = dst.ne[0];
    let mut j = coords(rows.start * ne0, &src.ne);
    for r in rows {
        let (i1, i2, i3) = dst.row_index(r);
        let drow = dst.row(i1, i2, i3);
        let mut k = 0;
        while k < ne0 {
            let seg = (ne0 - k).min(src.ne[0] - j[0]);
            let s = src.row(j[1], j[2], j[3]).wrapping_add(j[0] * src.nb[0]);
            let d = drow.wrapping_add(k * dst.nb[0]);
            // SAFETY: `seg` elements from in-bounds positions of both tensors (the segment ends
            // within the current source and destination rows); source and destination do not
            // overlap (backend check), and this thread owns the destination row.
            unsafe {
                if src.nb[0] == es && dst.nb[0] == es {
                    std::ptr::copy_nonoverlapping(s, d, seg * es);
                } else {
                    for t in 0..seg {
                        std::ptr::copy_nonoverlapping(
                            s.add(t * src.nb[0]),
                            d.add(t * dst.nb[0]),
                            es,
                        );
                    }
                }
            }
            k += seg;
            advance(&mut j, seg, &src.ne);
        }
    }
    Ok(())
}

/// Different dtypes: gather each destination row as f32, then encode it.
fn convert_rows(
    features: CpuFeatures,
    src: &TensorView,
    dst: &TensorView,
    rows: std::ops::Range<usize>,
    scratch: &mut [f32],
) -> Result<()> {
    let ne0 = dst.ne[0];
    let (buf, rest) = scratch.split_at_mut(ne0.min(scratch.len()));
    let buf = scratch_slice(buf, ne0)?;
    let src_row_buf = if src.dtype.is_quantized() {
        Some(scratch_slice(rest, src.ne[0])?)
    } else {
        None
    };
    let mut src_row_buf = src_row_buf;
    let mut decoded: Option<(usize, usize, usize)> = None;
    let mut j = coords(rows.start * ne0, &src.ne);
    let src_dense = src.rows_contiguous();
    let ses = src.dtype.block_bytes();
    for r in rows {
        let (i1, i2, i3) = dst.row_index(r);
        let mut k = 0;
        while k < ne0 {
            let seg = (ne0 - k).min(src.ne[0] - j[0]);
            let srow = src.row(j[1], j[2], j[3]);
            let out = &mut buf[k..k + seg];
            if let Some(sbuf) = src_row_buf.as_deref_mut() {
                if decoded != Some((j[1], j[2], j[3])) {
                    // SAFETY: a dense, in-bounds source row of `row_bytes` bytes, not written
                    // by anyone during this node.
                    row_to_f32(src.dtype, unsafe { bytes(srow, src.row_bytes()) }, sbuf)?;
                    decoded = Some((j[1], j[2], j[3]));
                }
                out.copy_from_slice(&sbuf[j[0]..j[0] + seg]);
            } else if src_dense {
                // SAFETY: `seg` dense elements inside the current source row.
                let b = unsafe { bytes(srow.wrapping_add(j[0] * ses), seg * ses) };
                row_to_f32(src.dtype, b, out)?;
            } else {
                for (t, o) in out.iter_mut().enumerate() {
                    // SAFETY: element `j0 + t` of the current source row (in bounds: the
                    // segment ends within the row).
                    *o = unsafe { load_f32(src.dtype, srow.wrapping_add((j[0] + t) * src.nb[0])) };
                }
            }
            k += seg;
            advance(&mut j, seg, &src.ne);
        }
        let drow = dst.row(i1, i2, i3);
        if dst.rows_contiguous() {
            // SAFETY: this thread's dense destination row, in bounds, overlapping no source.
            // (ggml-cpu's `from_float` of the type, as ggml's copy encodes rows.)
            quantize_activations(features, dst.dtype, buf, unsafe {
                bytes_mut(drow, dst.row_bytes())
            })?;
        } else {
            for (t, &v) in buf.iter().enumerate() {
                // SAFETY: element `t` of this thread's destination row (plain dtype: the
                // support table only allows strided rows for F32/F16/BF16).
                unsafe { store_f32(dst.dtype, drow.wrapping_add(t * dst.nb[0]), v) };
            }
        }
    }
    Ok(())
}

/// CONCAT along `dim` (same non-block dtype for all three tensors).
pub(crate) fn concat(task: &NodeTask, tc: &mut ThreadCtx<'_>, dim: usize) -> Result<()> {
    let (dst, a, b) = (&task.dst, task.src(0)?, task.src(1)?);
    let es = dst.dtype.block_bytes();
    let ne0 = dst.ne[0];
    let copy_run = |from: &TensorView, i: [usize; 4], d: *mut u8, n: usize| {
        let s = from.row(i[1], i[2], i[3]).wrapping_add(i[0] * from.nb[0]);
        // SAFETY: `n` elements from in-bounds positions of the source row and this thread's
        // destination row; concat sources never overlap its (fresh) destination.
        unsafe {
            if from.nb[0] == es && dst.nb[0] == es {
                std::ptr::copy_nonoverlapping(s, d, n * es);
            } else {
                for t in 0..n {
                    std::ptr::copy_nonoverlapping(s.add(t * from.nb[0]), d.add(t * dst.nb[0]), es);
                }
            }
        }
    };
    for r in tc.split(dst.nrows()) {
        let (i1, i2, i3) = dst.row_index(r);
        let drow = dst.row(i1, i2, i3);
        if dim == 0 {
            let n0 = a.ne[0];
            copy_run(a, [0, i1, i2, i3], drow, n0);
            copy_run(
                b,
                [0, i1, i2, i3],
                drow.wrapping_add(n0 * dst.nb[0]),
                ne0 - n0,
            );
        } else {
            let mut i = [0, i1, i2, i3];
            if i[dim] < a.ne[dim] {
                copy_run(a, i, drow, ne0);
            } else {
                i[dim] -= a.ne[dim];
                copy_run(b, i, drow, ne0);
            }
        }
    }
    Ok(())
}

/// Whether [`repeat`] handles tiling `src` into `dst`: ggml-cpu's `ggml_compute_forward_repeat`
/// (same dtype, f32, f16, bf16 or i32; dense rows on both sides, which ggml asserts; any outer
/// strides; every dim of `dst` a multiple of `src`'s, an empty `src` only into an empty `dst`).
pub(crate) fn repeat_supported(src: &Tensor, dst: &Tensor) -> bool {
    use DType::*;
    let tiles = if src.nelements() == 0 {
        dst.nelements() == 0
    } else {
        (0..4).all(|i| dst.ne[i].is_multiple_of(src.ne[i]))
    };
    matches!(src.dtype, F32 | F16 | BF16 | I32)
        && dst.dtype == src.dtype
        && src.rows_contiguous()
        && dst.rows_contiguous()
        && tiles
}

/// REPEAT: destination row `(i1, i2, i3)` is source row `(i1 % ne01, i2 % ne02, i3 % ne03)`
/// repeated `ne0 / ne00` times, as bytes (ggml copies the elements, so every value, NaNs
/// included, is kept exactly). Threads split destination rows.
pub(crate) fn repeat(task: &NodeTask, tc: &mut ThreadCtx<'_>) -> Result<()> {
    let (dst, src) = (&task.dst, task.src(0)?);
    let rows = tc.split(dst.nrows());
    // An empty source tiles only an empty destination (the support check): nothing to write.
    if rows.is_empty() || src.ne.contains(&0) {
        return Ok(());
    }
    let run = src.row_bytes();
    let tiles = dst.ne[0] / src.ne[0];
    for r in rows {
        let (i1, i2, i3) = dst.row_index(r);
        let s = src.row(i1 % src.ne[1], i2 % src.ne[2], i3 % src.ne[3]);
        let d = dst.row(i1, i2, i3);
        for k in 0..tiles {
            // SAFETY: source row `(i1 % ne01, ..)` is in bounds and dense (`run` bytes); tile
            // `k` of this thread's dense destination row ends within it (`tiles * run` bytes
            // is at most the row's size); the backend refuses a source that overlaps the
            // destination (REPEAT has no in-place form).
            unsafe { std::ptr::copy_nonoverlapping(s, d.add(k * run), run) };
        }
    }
    Ok(())
}
