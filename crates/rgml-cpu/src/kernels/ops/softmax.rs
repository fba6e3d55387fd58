//! SOFT_MAX (scale, optional f32/f16 mask, ALiBi, attention sinks) and DIAG_MASK_INF, with
//! ggml's semantics.
//!
//! The mask row of source row `(i1, i2, i3)` is mask row `(i1, i2 mod m2, i3 mod m3)`; the ALiBi
//! slope of head `i2` follows ggml (`m0 = 2^(-max_bias / n_head_log2)`, `m1 = 2^(-max_bias / 2 /
//! n_head_log2)`).

use crate::kernels::blocks::convert::row_to_f32;
use crate::kernels::task;
use crate::kernels::task::{
    bytes, f32_row_for_write, f32_row_mut, NodeTask, TensorView, ThreadCtx,
};
use crate::kernels::vexp;
use rgml::{DType, Result};

/// SOFT_MAX: `softmax(src0 * scale + slope * mask)` per row; with `sinks`, head `i2`'s sink
/// (the last source) joins each row's maximum and sum as ggml's CPU adds it.
pub(crate) fn soft_max(
    task: &NodeTask,
    tc: &mut ThreadCtx<'_>,
    scale: f32,
    max_bias: f32,
    sinks: bool,
) -> Result<()> {
    let (dst, a) = (&task.dst, task.src(0)?);
    let n_src = task.src.iter().take_while(|s| s.is_some()).count();
    let mask = match n_src > 1 + usize::from(sinks) {
        true => Some(task.src(1)?),
        false => None,
    };
    let sinks = match sinks {
        true => Some(sink_values(task.src(n_src - 1)?, dst.ne[2])),
        false => None,
    };
    let ne0 = dst.ne[0];
    let n_head = dst.ne[2] as u32;
    let n_head_log2 = if n_head == 0 {
        1
    } else {
        1u32 << (31 - n_head.leading_zeros())
    };
    let m0 = 2f32.powf(-max_bias / n_head_log2 as f32);
    let m1 = 2f32.powf(-(max_bias / 2.0) / n_head_log2 as f32);
    for r in tc.split(dst.nrows()) {
        let (i1, i2, i3) = dst.row_index(r);
        let drow = dst.row(i1, i2, i3);
        let slope = if max_bias > 0.0 {
            let h = i2 as u32;
            if h < n_head_log2 {
                m0.powf((h + 1) as f32)
            } else {
                m1.powf((2 * (h - n_head_log2) + 1) as f32)
            }
        } else {
            1.0
        };
        let (sx, sm) = tc.scratch.split_at_mut(ne0.min(tc.scratch.len()));
        // SAFETY: dense F32 rows of in-bounds indices (mask rows too: the support table checks
        // `mask.ne1 >= ne1` and the modulo keeps dims 2, 3 in range); the destination row belongs
        // to this thread and an overlapping source row is copied to scratch first.
        unsafe {
            let x = f32_row_for_write(a.row(i1, i2, i3), ne0, drow, ne0 * 4, sx)?;
            let m = match mask {
                Some(m) => {
                    let mrow = m.row(i1, i2 % m.ne[2], i3 % m.ne[3]);
                    if m.dtype == DType::F32 {
                        Some(f32_row_for_write(mrow, ne0, drow, ne0 * 4, sm)?)
                    } else {
                        let buf = task::scratch_slice(sm, ne0)?;
                        row_to_f32(m.dtype, bytes(mrow, m.row_bytes()), buf)?;
                        Some(&*buf)
                    }
                }
                None => None,
            };
            let d = f32_row_mut(drow, ne0);
            match m {
                Some(m) => {
                    for ((d, &v), &mv) in d.iter_mut().zip(x).zip(m) {
                        *d = v * scale + slope * mv;
                    }
                }
                None => {
                    for (d, &v) in d.iter_mut().zip(x) {
                        *d = v * scale;
                    }
                }
            }
            let mut max = row_max(d);
            let sink = sinks.map(|s| s[i2]);
            if let Some(s) = sink {
                // ggml's MAX(max, sink).
                max = if max > s { max } else { s };
            }
            // ggml_vec_soft_max_f32, in place.
            let mut sum = if max == f32::NEG_INFINITY {
                d.fill(0.0);
                0.0
            } else {
                vexp::soft_max_row(task.features, d, max)
            };
            if let Some(s) = sink {
                sum += f64::from((s - max).exp());
            }
            let inv = if sum > 0.0 { (1.0 / sum) as f32 } else { 0.0 };
            for v in d.iter_mut() {
                *v *= inv;
            }
        }
    }
    Ok(())
}

/// The first `n` f32 values of the dense sinks vector `s`.
fn sink_values(s: &TensorView, n: usize) -> &[f32] {
    // SAFETY: the support table checks that the sinks are dense f32 with at least `n` values;
    // nothing writes a source while a node runs.
    unsafe { task::f32_row(s.ptr, n) }
}

/// The largest value of a row, as ggml's `ggml_vec_max_f32` (`MAX(max, x)`, a select) finds
/// it for rows without NaN. Sixteen running maxima, so it vectorizes: a maximum does not
/// depend on the order of comparison, where `f32::max`'s NaN rule keeps the loop scalar.
fn row_max(row: &[f32]) -> f32 {
    let select = |m: f32, v: f32| if m > v { m } else { v };
    let mut lanes = [f32::NEG_INFINITY; 16];
    let mut chunks = row.chunks_exact(16);
    for chunk in &mut chunks {
        for (m, &v) in lanes.iter_mut().zip(chunk) {
            *m = select(*m, v);
        }
    }
    let tail = chunks.remainder().iter().copied();
    lanes
        .into_iter()
        .chain(tail)
        .fold(f32::NEG_INFINITY, select)
}

/// DIAG_MASK_INF: element `(i0, i1)` of every matrix becomes -inf when `i0 > n_past + i1`.
pub(crate) fn diag_mask_inf(task: &NodeTask, tc: &mut ThreadCtx<'_>, n_past: usize) -> Result<()> {
    let (dst, a) = (&task.dst, task.src(0)?);
    let ne0 = dst.ne[0];
    for r in tc.split(dst.nrows()) {
        let (i1, i2, i3) = dst.row_index(r);
        let drow = dst.row(i1, i2, i3);
        // SAFETY: as in `soft_max`.
        unsafe {
            let x = f32_row_for_write(a.row(i1, i2, i3), ne0, drow, ne0 * 4, tc.scratch)?;
            let d = f32_row_mut(drow, ne0);
            let keep = n_past.saturating_add(i1).saturating_add(1).min(ne0);
            d[..keep].copy_from_slice(&x[..keep]);
            d[keep..].fill(f32::NEG_INFINITY);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::row_max;

    #[test]
    fn row_max_is_the_largest_value() {
        for n in [0, 1, 15, 16, 17, 33, 256, 1000] {
            let row: Vec<f32> = (0..n)
                .map(|i| {
                    if i % 7 == 3 {
                        f32::NEG_INFINITY
                    } else {
                        ((i * 7919 % 613) as f32 - 300.0) * 0.37
                    }
                })
                .collect();
            let want = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(row_max(&row).to_bits(), want.to_bits(), "n = {n}");
        }
        assert_eq!(row_max(&[f32::NEG_INFINITY; 20]), f32::NEG_INFINITY);
    }
}
