//! Row normalisations: RMS_NORM and NORM, in ggml-cpu's arithmetic (sums accumulated in f64
//! in its order, per instruction set where its loops are vectorized).

use crate::kernels::isa::Isa;
use crate::kernels::simd::{hsum16, hsum8};
use crate::kernels::task::{f32_row_for_write, f32_row_mut, NodeTask, ThreadCtx};
use rgml::Result;

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

/// NORM: `(x - mean) / sqrt(var + eps)`, as ggml's `ggml_compute_forward_norm_f32`: the mean
/// from a sequential f64 sum rounded to f32, the variance from `ggml_vec_cvar_f32`.
pub(crate) fn norm(task: &NodeTask, tc: &mut ThreadCtx<'_>, eps: f32) -> Result<()> {
    let isa = task.features.isa();
    rows(task, tc, |x, d| {
        let n = x.len().max(1);
        let sum = x.iter().fold(0f64, |s, &v| s + f64::from(v)) as f32;
        let mean = sum / n as f32;
        let var = centred_variance(isa, x, mean, d) as f32;
        let s = 1.0 / (var + eps).sqrt();
        for d in d.iter_mut() {
            *d *= s;
        }
    })
}

/// `ggml_vec_cvar_f32`: `d = x - mean` and the mean of its squares, in f64 over the squares
/// summed in f32 per vector of the build (16 lanes reduced as `_mm512_reduce_add_ps`, or 8 as
/// its AVX2 `hsum`), the leftovers one by one.
fn centred_variance(isa: Isa, x: &[f32], mean: f32, d: &mut [f32]) -> f64 {
    for (d, &v) in d.iter_mut().zip(x) {
        *d = v - mean;
    }
    let lanes = match isa {
        Isa::Avx512 => 16,
        Isa::Avx2 => 8,
    };
    let chunks = d.chunks_exact(lanes);
    let tail = chunks.remainder();
    let mut sum = 0f64;
    let mut sq = [0f32; 16];
    for c in chunks {
        for (s, v) in sq.iter_mut().zip(c) {
            *s = v * v;
        }
        let part = match isa {
            Isa::Avx512 => hsum16(&sq),
            Isa::Avx2 => sq.first_chunk::<8>().map_or(0.0, hsum8),
        };
        sum += f64::from(part);
    }
    for &v in tail {
        sum += f64::from(v * v);
    }
    sum / x.len().max(1) as f64
}
