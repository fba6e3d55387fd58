//! Row gathers and scatters (GET_ROWS, SET_ROWS) and one value per row (ARGMAX, SUM_ROWS).

use crate::kernels::blocks::activations::quantize_activations;
use crate::kernels::blocks::convert::row_to_f32;
use crate::kernels::task;
use crate::kernels::task::{bytes, bytes_mut, f32_row, NodeTask, TensorView, ThreadCtx};
use crate::kernels::tiles::repack;
use rgml::{DType, Error, Result};

/// Read element `(i0, i1, i2)` of the I32 or I64 index tensor `idx`.
fn index_at(idx: &TensorView, i0: usize, i1: usize, i2: usize) -> i64 {
    let p = idx.row(i1, i2, 0).wrapping_add(i0 * idx.nb[0]);
    // SAFETY: the callers pass in-bounds indices of the index tensor, whose dtype (I32 or I64,
    // checked by `supports`) gives the element's width.
    unsafe {
        if idx.dtype == DType::I64 {
            p.cast::<i64>().read_unaligned()
        } else {
            i64::from(p.cast::<i32>().read_unaligned())
        }
    }
}

fn bad_index(op: &str, index: i64, rows: usize) -> Error {
    Error::OutOfBounds {
        what: format!("{op} row index"),
        offset: usize::try_from(index.max(0)).unwrap_or(usize::MAX),
        size: 1,
        limit: rows,
    }
}

/// GET_ROWS: destination row `(i1, i2, i3)` is source row `(idx[i1, i2, i3], i2, i3)`,
/// decoded to f32 (or copied for I32).
pub(crate) fn get_rows(task: &NodeTask, tc: &mut ThreadCtx<'_>) -> Result<()> {
    let (dst, src, idx) = (&task.dst, task.src(0)?, task.src(1)?);
    for r in tc.split(dst.nrows()) {
        let (i1, i2, i3) = dst.row_index(r);
        let k = index_at(idx, i1, i2, i3);
        let row = usize::try_from(k)
            .ok()
            .filter(|&k| k < src.ne[1])
            .ok_or_else(|| bad_index("GET_ROWS", k, src.ne[1]))?;
        let drow = dst.row(i1, i2, i3);
        if src.packed {
            // A packed weight (the token embeddings tied to the output projection): the row
            // comes out of its group of interleaved rows.
            let g = repack::GROUP_ROWS;
            let group_start = src.row(row / g * g, i2, i3);
            let rb = src.row_bytes();
            let tmp = task::scratch_slice(tc.scratch, rb.div_ceil(4))?;
            // 4 * ceil(rb / 4) >= rb bytes.
            let plain = &mut bytemuck::cast_slice_mut::<f32, u8>(tmp)[..rb];
            // SAFETY: the group is dense and in bounds (`row` < ne1, a multiple of the group
            // size), read-only during this node; the destination row belongs to this thread.
            unsafe {
                let group = bytes(group_start, g * rb);
                repack::unpack_row(src.dtype, src.ne[0], group, row % g, plain)?;
                row_to_f32(src.dtype, plain, task::f32_row_mut(drow, dst.ne[0]))?;
            }
            continue;
        }
        let srow = src.row(row, i2, i3);
        // SAFETY: both rows are dense and in bounds (index checked above); the destination row
        // belongs to this thread and GET_ROWS never runs in place.
        unsafe {
            let s = bytes(srow, src.row_bytes());
            if dst.dtype == DType::I32 {
                bytes_mut(drow, dst.row_bytes()).copy_from_slice(s);
            } else {
                row_to_f32(src.dtype, s, task::f32_row_mut(drow, dst.ne[0]))?;
            }
        }
    }
    Ok(())
}

/// SET_ROWS: source row `(i1, i2, i3)` (f32) is encoded into destination row
/// `(idx[i1, i2 mod k2, i3 mod k3], i2, i3)`.
///
/// Destination rows are owned by thread `row mod nth`, so repeated indices are written by one
/// thread, in source order (the last one wins), never concurrently.
pub(crate) fn set_rows(task: &NodeTask, tc: &mut ThreadCtx<'_>) -> Result<()> {
    let (dst, src, idx) = (&task.dst, task.src(1)?, task.src(2)?);
    let n = src.ne[0];
    for i3 in 0..src.ne[3] {
        for i2 in 0..src.ne[2] {
            for i1 in 0..src.ne[1] {
                let k = index_at(idx, i1, i2 % idx.ne[1], i3 % idx.ne[2]);
                let row = usize::try_from(k)
                    .ok()
                    .filter(|&k| k < dst.ne[1])
                    .ok_or_else(|| bad_index("SET_ROWS", k, dst.ne[1]))?;
                if row % tc.nth != tc.ith {
                    continue;
                }
                // SAFETY: in-bounds dense rows (index checked above); this thread owns every
                // write to destination row `row` (see above), and the source does not overlap
                // the destination (backend check).
                unsafe {
                    let s = f32_row(src.row(i1, i2, i3), n);
                    // ggml-cpu's `from_float` of the type (its own Q8_0 quantizer: a KV cache
                    // of Q8_0 holds what llama.cpp's holds).
                    quantize_activations(
                        task.features,
                        dst.dtype,
                        s,
                        bytes_mut(dst.row(row, i2, i3), dst.row_bytes()),
                    )?;
                }
            }
        }
    }
    Ok(())
}

/// SUM_ROWS: each row summed in f64 in element order, rounded to f32 once
/// (`ggml_vec_sum_f32`).
pub(crate) fn sum_rows(task: &NodeTask, tc: &mut ThreadCtx<'_>) -> Result<()> {
    let (dst, src) = (&task.dst, task.src(0)?);
    let (ne1, ne2) = (src.ne[1], src.ne[2]);
    for r in tc.split(ne1 * ne2 * src.ne[3]) {
        let (i1, i2, i3) = (r % ne1, (r / ne1) % ne2, r / (ne1 * ne2));
        // SAFETY: a dense, in-bounds f32 row of the source (the support check).
        let x = unsafe { f32_row(src.row(i1, i2, i3), src.ne[0]) };
        let sum = x.iter().fold(0f64, |s, &v| s + f64::from(v)) as f32;
        // SAFETY: element 0 of row (i1, i2, i3) of the f32 destination, written by this thread
        // only (rows are split between threads).
        unsafe { dst.row(i1, i2, i3).cast::<f32>().write_unaligned(sum) };
    }
    Ok(())
}

/// ARGMAX: index of the first largest value of each row of an f32 matrix.
pub(crate) fn argmax(task: &NodeTask, tc: &mut ThreadCtx<'_>) -> Result<()> {
    let (dst, src) = (&task.dst, task.src(0)?);
    for i1 in tc.split(src.ne[1]) {
        // SAFETY: a dense, in-bounds f32 row of the source.
        let x = unsafe { f32_row(src.row(i1, 0, 0), src.ne[0]) };
        let mut best = 0usize;
        let mut max = f32::NEG_INFINITY;
        for (i, &v) in x.iter().enumerate() {
            if v > max {
                max = v;
                best = i;
            }
        }
        let v = i32::try_from(best).unwrap_or(i32::MAX);
        // SAFETY: element `i1` of the I32 destination vector (`dst.ne0 == src.ne1`), written by
        // this thread only.
        unsafe {
            dst.ptr
                .wrapping_add(i1 * dst.nb[0])
                .cast::<i32>()
                .write_unaligned(v)
        };
    }
    Ok(())
}
