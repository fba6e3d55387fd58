//! Row normalisations: RMS_NORM and NORM. Sums accumulate in f64 as ggml does.

use crate::kernels::task::{f32_row_for_write, f32_row_mut, NodeTask, ThreadCtx};
use rgml::Result;

/// Sum of `x` in f64, with independent partial sums so the loop vectorizes.
#[inline]
fn sum_f64(x: &[f32], f: impl Fn(f32) -> f64) -> f64 {
    let mut acc = [0f64; 4];
    let chunks = x.chunks_exact(4);
    let tail = chunks.remainder();
    for c in chunks {
        for k in 0..4 {
            acc[k] += f(c[k]);
        }
    }
    let mut s = acc[0] + acc[1] + acc[2] + acc[3];
    for &v in tail {
        s += f(v);
    }
    s
}

/// Run `f(src_row, dst_row)` over this thread's rows (F32, dense rows, same shape).
#[inline(always)]
fn rows(task: &NodeTask, tc: &mut ThreadCtx<'_>, f: impl Fn(&[f32], &mut [f32])) -> Result<()> {
    let (dst, a) = (&task.dst, task.src(0)?);
    let ne0 = dst.ne[0];
    for r in tc.split(dst.nrows()) {
        let (i1, i2, i3) = dst.row_index(r);
        let drow = dst.row(i1, i2, i3);
        // SAFETY: dense F32 rows of in-bounds indices; the destination row belongs to this
        // thread and an overlapping source row is copied to scratch first.
        unsafe {
            let x = f32_row_for_write(a.row(i1, i2, i3), ne0, drow, ne0 * 4, tc.scratch)?;
            f(x, f32_row_mut(drow, ne0));
        }
    }
    Ok(())
}

/// RMS_NORM: `x / sqrt(mean(x²) + eps)`.
pub(crate) fn rms_norm(task: &NodeTask, tc: &mut ThreadCtx<'_>, eps: f32) -> Result<()> {
    rows(task, tc, |x, d| {
        // As ggml: a sequential f64 sum of the f32 squares, the mean rounded to f32.
        let n = x.len().max(1) as f64;
        let mut sum = 0f64;
        for &v in x {
            sum += f64::from(v * v);
        }
        let mean = (sum / n) as f32;
        let s = 1.0 / (mean + eps).sqrt();
        for (d, &v) in d.iter_mut().zip(x) {
            *d = v * s;
        }
    })
}

/// NORM: `(x - mean) / sqrt(var + eps)`.
pub(crate) fn norm(task: &NodeTask, tc: &mut ThreadCtx<'_>, eps: f32) -> Result<()> {
    rows(task, tc, |x, d| {
        let n = x.len().max(1) as f64;
        let mean = (sum_f64(x, f64::from) / n) as f32;
        for (d, &v) in d.iter_mut().zip(x) {
            *d = v - mean;
        }
        let var = (sum_f64(d, |v| f64::from(v) * f64::from(v)) / n) as f32;
        let s = 1.0 / (var + eps).sqrt();
        for d in d.iter_mut() {
            *d *= s;
        }
    })
}
