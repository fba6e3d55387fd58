//! Quantization of matmul activations (src1) to the weights' vec-dot type, as ggml's CPU
//! backend does it at run time.
//!
//! This differs from the reference codecs in `rgml::quant` (which GGUF files and our fixtures
//! follow bit for bit) in two details of ggml-cpu's x86 `quantize_row_q8_0`/`q8_1`: the inverse
//! scale is `127 / amax` rather than `1 / (amax / 127)`, and values round half to even (the
//! SIMD rounding mode) rather than half away from zero. Both flip single quants by one step;
//! small as that is, the demo model amplifies it to logit differences of ~0.3, so matching
//! llama.cpp's answers needs the same arithmetic.

use rgml::quant::{BlockQ8_0, BlockQ8_1, QK8_0};
use rgml::{DType, Result};

/// Quantize one row of activations to `dtype` (the vec-dot type of some weight type).
pub(crate) fn quantize_activations(dtype: DType, src: &[f32], dst: &mut [u8]) -> Result<()> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was detected at run time.
        return unsafe { quantize_activations_avx2(dtype, src, dst) };
    }
    quantize_row(dtype, src, dst)
}

/// [`quantize_row`] compiled for AVX2: the rounding becomes `vroundps` instead of a libm call
/// per element, and the block loops vectorize. Max, product and round-half-even are exact
/// per element, so the result is the same.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_activations_avx2(dtype: DType, src: &[f32], dst: &mut [u8]) -> Result<()> {
    quantize_row(dtype, src, dst)
}

#[inline(always)]
fn quantize_row(dtype: DType, src: &[f32], dst: &mut [u8]) -> Result<()> {
    match dtype {
        DType::Q8_0 => {
            let blocks: &mut [BlockQ8_0] = cast_blocks(dtype, src.len(), dst)?;
            for (b, x) in blocks.iter_mut().zip(src.chunks_exact(QK8_0)) {
                let (d, _) = quantize_block(x, &mut b.qs);
                b.d = half::f16::from_f32(d);
            }
            Ok(())
        }
        DType::Q8_1 => {
            let blocks: &mut [BlockQ8_1] = cast_blocks(dtype, src.len(), dst)?;
            for (b, x) in blocks.iter_mut().zip(src.chunks_exact(QK8_0)) {
                let (d, sum) = quantize_block(x, &mut b.qs);
                b.d = half::f16::from_f32(d);
                b.s = half::f16::from_f32(d * sum as f32);
            }
            Ok(())
        }
        other => super::convert::row_from_f32(other, src, dst),
    }
}

/// One block: scale `amax / 127`, quants `round_half_even(x * 127 / amax)`; returns the f32
/// scale and the sum of the quants.
#[inline(always)]
fn quantize_block(x: &[f32], qs: &mut [i8; QK8_0]) -> (f32, i32) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut sum = 0i32;
    for (q, &v) in qs.iter_mut().zip(x) {
        // |v * id| <= 127 by construction, so the cast cannot saturate.
        let r = (v * id).round_ties_even() as i32;
        *q = r as i8;
        sum += r;
    }
    (d, sum)
}

fn cast_blocks<T: bytemuck::Pod>(dtype: DType, n: usize, dst: &mut [u8]) -> Result<&mut [T]> {
    let need = dtype.row_bytes(n)?;
    let len = dst.len();
    let dst = dst
        .get_mut(..need)
        .ok_or_else(|| rgml::Error::OutOfBounds {
            what: format!("{dtype} activation row"),
            offset: 0,
            size: need,
            limit: len,
        })?;
    bytemuck::try_cast_slice_mut(dst).map_err(|e| rgml::Error::Backend {
        backend: "CPU".into(),
        message: format!("{dtype} activation row is misaligned: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_to_the_reference_codec_and_rounds_ties_to_even() {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 61) as f32 - 30.0) * 0.173)
            .collect();
        for dtype in [DType::Q8_0, DType::Q8_1] {
            let mut ours = vec![0u8; dtype.row_bytes(64).unwrap()];
            quantize_activations(dtype, &x, &mut ours).unwrap();
            let mut back = vec![0f32; 64];
            rgml::quant::dequantize_row(dtype, &ours, &mut back).unwrap();
            let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (a, b) in x.iter().zip(&back) {
                assert!((a - b).abs() <= amax / 127.0 * 0.51 + 1e-3, "{a} vs {b}");
            }
        }
        // 127 * 0.5 / 127 = 0.5 exactly: a tie that rounds to 0 (even), where roundf gives 1.
        let mut tie = [0f32; 32];
        tie[0] = 127.0;
        tie[1] = 0.5;
        tie[2] = 1.5;
        let mut q = vec![0u8; 34];
        quantize_activations(DType::Q8_0, &tie, &mut q).unwrap();
        assert_eq!(&q[2..5], &[127, 0, 2]);
    }
}
