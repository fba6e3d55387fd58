//! MUL_MAT marked `hadamard` (ggml's `GGML_HINT_SRC0_IS_HADAMARD`, llama.cpp's rotation of
//! quantized KV caches): ggml-cpu's fast Walsh-Hadamard transform of each src1 row
//! (`ggml_compute_forward_fwht`), reading nothing of src0. Each row is widened and multiplied by
//! `1 / sqrt(n)`, then butterflies `(u + v, u - v)` of widths 1, 2, 4, ... `n / 2` run over it.
//! ggml's SIMD passes compute `u - v` as `u + v * -1` by FMA, which is the same number, so
//! the result does not depend on the vector width.

use crate::kernels::blocks::convert::row_to_f32;
use crate::kernels::task::{self, bytes, NodeTask, ThreadCtx};
use rgml::{DType, Result, Tensor};

/// Whether [`fwht`] takes the node: an `n × n` f32 src0 (`n` a power of two), f32 or f16 src1
/// rows of `n` values, a dense f32 destination of src1's shape.
pub(crate) fn supported(h: &Tensor, x: &Tensor, dst: &Tensor) -> bool {
    let n = h.ne[0];
    h.dtype == DType::F32
        && h.ne == [n, n, 1, 1]
        && n.is_power_of_two()
        && matches!(x.dtype, DType::F32 | DType::F16)
        && x.rows_contiguous()
        && x.ne[0] == n
        && dst.dtype == DType::F32
        && dst.rows_contiguous()
        && dst.ne == x.ne
}

/// This thread's rows, transformed.
pub(crate) fn fwht(task: &NodeTask, tc: &mut ThreadCtx<'_>) -> Result<()> {
    let (dst, x) = (&task.dst, task.src(1)?);
    let n = x.ne[0];
    for r in tc.split(x.nrows()) {
        let (i1, i2, i3) = x.row_index(r);
        // SAFETY: row `r` of the dense f32 destination, written by this thread only (rows are
        // split between threads); the source row is a dense, in-bounds row of `n` values that
        // does not overlap it (backend check).
        let (out, src) = unsafe {
            (
                task::f32_row_mut(dst.row(i1, i2, i3), n),
                bytes(x.row(i1, i2, i3), x.row_bytes()),
            )
        };
        row_to_f32(x.dtype, src, out)?;
        transform(out);
    }
    Ok(())
}

/// `row` times `1 / sqrt(n)`, then the butterflies of widths 1, 2, 4, ... (`n` a power of two).
fn transform(row: &mut [f32]) {
    let scale = 1.0 / (row.len() as f32).sqrt();
    row.iter_mut().for_each(|v| *v *= scale);
    let mut len = 1;
    while len < row.len() {
        for pair in row.chunks_exact_mut(2 * len) {
            let (lo, hi) = pair.split_at_mut(len);
            for (u, v) in lo.iter_mut().zip(hi.iter_mut()) {
                (*u, *v) = (*u + *v, *u - *v);
            }
        }
        len <<= 1;
    }
}

#[cfg(test)]
mod tests {
    /// The transform equals the product with the scaled Hadamard matrix llama.cpp builds
    /// (`ggml_gen_hadamard`), to f32 rounding, on random rows.
    #[test]
    fn transform_is_the_scaled_hadamard_product() {
        for n in [64usize, 128, 256] {
            let mut h = vec![0f64; n * n];
            h[0] = 1.0 / (n as f64).sqrt();
            let mut s = 1;
            while s < n {
                for i in 0..s {
                    for j in 0..s {
                        let v = h[i * n + j];
                        h[(i + s) * n + j] = v;
                        h[i * n + j + s] = v;
                        h[(i + s) * n + j + s] = -v;
                    }
                }
                s *= 2;
            }
            let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ n as u64;
            let x: Vec<f32> = (0..n)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    (state >> 40) as f32 / (1u32 << 24) as f32 - 0.5
                })
                .collect();
            let mut out = x.clone();
            super::transform(&mut out);
            for i in 0..n {
                let want: f64 = (0..n).map(|j| h[i * n + j] * f64::from(x[j])).sum();
                assert!((f64::from(out[i]) - want).abs() < 1e-5, "n {n} row {i}");
            }
        }
    }
}
