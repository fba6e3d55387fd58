//! Quantization of matmul activations (src1) to the weights' vec-dot type, as ggml's CPU
//! backend does it at run time.
//!
//! This differs from the reference codecs in `rgml::quant` (which GGUF files and our fixtures
//! follow bit for bit) in two details of ggml-cpu's x86 `quantize_row_q8_0`/`q8_1`: the inverse
//! scale is `127 / amax` rather than `1 / (amax / 127)`, and values round half to even (the
//! SIMD rounding mode) rather than half away from zero. Both flip single quants by one step;
//! small as that is, the demo model amplifies it to logit differences of ~0.3, so matching
//! llama.cpp's answers needs the same arithmetic.
//!
//! Q8_K (the K-quants' activations) needs nothing of its own: x86 ggml-cpu's
//! `quantize_row_q8_K` is the reference `quantize_row_q8_K_ref` (in ggml-base, which is not
//! built with `-march=native`, so `nearest_int(iscale * x)` is not contracted into an FMA), and
//! the codec in `rgml::quant` follows it bit for bit.

use crate::kernels::blocks::convert;
use crate::kernels::isa::CpuFeatures;
use rgml::quant::{BlockQ8_0, BlockQ8_1, BlockQ8_K, QK8_0, QK_K};
use rgml::{DType, Result};

/// Quantize one row of activations to `dtype` (the vec-dot type of some weight type). The
/// result is the same on every path; `f` only picks the fastest the CPU has.
pub(crate) fn quantize_activations(
    f: CpuFeatures,
    dtype: DType,
    src: &[f32],
    dst: &mut [u8],
) -> Result<()> {
    #[cfg(target_arch = "x86_64")]
    if f.has_avx512() {
        // SAFETY: `f` says the CPU has AVX-512 F and BW.
        return unsafe { quantize_activations_avx512(dtype, src, dst) };
    }
    #[cfg(target_arch = "x86_64")]
    if f.has_avx2() {
        // SAFETY: `f` says the CPU has AVX2.
        return unsafe { quantize_activations_avx2(dtype, src, dst) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = f;
    quantize_row(dtype, src, dst, quantize_block)
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
    quantize_row(dtype, src, dst, quantize_block)
}

/// [`quantize_row`] with [`quantize_block_avx512`]: the same numbers, 16 lanes at a time
/// (the compiler does not vectorize the scalar block's max and rounding loops well).
///
/// # Safety
/// The CPU must support AVX-512 F and BW.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn quantize_activations_avx512(dtype: DType, src: &[f32], dst: &mut [u8]) -> Result<()> {
    if dtype == DType::Q8_K {
        let blocks: &mut [BlockQ8_K] = cast_blocks(dtype, src.len(), dst)?;
        for (b, x) in blocks.iter_mut().zip(src.chunks_exact(QK_K)) {
            // SAFETY: this function's caller guarantees AVX-512 F and BW; `x` is one block.
            *b = unsafe { quantize_q8k_avx512(x) };
        }
        return Ok(());
    }
    quantize_row(dtype, src, dst, |x, qs| {
        // SAFETY: this function's caller guarantees AVX-512 F and BW.
        unsafe { quantize_block_avx512(x, qs) }
    })
}

/// [`quantize_block`] with AVX-512: `vmaxps` of the absolute values (exact, in any order), the
/// same scale and inverse scale, `vcvtps2dq` (round half to even, the default rounding
/// mode, as `round_ties_even`), an exact integer sum.
///
/// # Safety
/// The CPU must support AVX-512 F and BW.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn quantize_block_avx512(x: &[f32], qs: &mut [i8; QK8_0]) -> (f32, i32) {
    use std::arch::x86_64::*;
    if x.len() < QK8_0 {
        return quantize_block(x, qs);
    }
    // SAFETY: `x` holds at least 32 floats (checked above); `qs` is 32 bytes, written as two
    // 16-byte halves.
    unsafe {
        let a = _mm512_loadu_ps(x.as_ptr());
        let b = _mm512_loadu_ps(x.as_ptr().add(16));
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
        let d = amax / 127.0;
        let id = _mm512_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
        let qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, id));
        let qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, id));
        let sum = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
        // |x * id| <= 127, so the narrowing truncation keeps every value.
        _mm_storeu_si128(qs.as_mut_ptr().cast(), _mm512_cvtepi32_epi8(qa));
        _mm_storeu_si128(qs.as_mut_ptr().add(16).cast(), _mm512_cvtepi32_epi8(qb));
        (d, sum)
    }
}

/// One Q8_K block as [`rgml::quant::QuantBlock::quantize`] makes it (ggml's
/// `quantize_row_q8_K_ref`), 16 lanes at a time: the element of largest magnitude (the first
/// of equals) sets `iscale = -127 / max`, quants are `nearest_int(iscale * x)` (`vcvtps2dq`
/// rounds half to even as the float trick does, for these magnitudes) capped at 127, and each
/// 16 quants' sum is exact. A block with NaN goes to the portable code, whose comparisons
/// skip NaN as ggml's do.
///
/// # Safety
/// The CPU must support AVX-512 F and BW; `x` holds `QK_K` floats.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn quantize_q8k_avx512(x: &[f32]) -> BlockQ8_K {
    use rgml::quant::QuantBlock;
    use std::arch::x86_64::*;
    let portable = |x: &[f32]| {
        let mut block = [0f32; QK_K];
        block.copy_from_slice(&x[..QK_K]);
        BlockQ8_K::quantize(&block)
    };
    // SAFETY: `x` holds 256 floats, read 16 at a time; AVX-512 F/BW as the caller promises.
    unsafe {
        let v: [__m512; 16] = std::array::from_fn(|j| _mm512_loadu_ps(x.as_ptr().add(16 * j)));
        let nan = v
            .iter()
            .any(|&w| _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(w, w) != 0);
        if nan {
            return portable(x);
        }
        let amax = _mm512_reduce_max_ps(v.iter().fold(_mm512_setzero_ps(), |m, &w| {
            _mm512_max_ps(m, _mm512_abs_ps(w))
        }));
        if amax == 0.0 {
            return <BlockQ8_K as bytemuck::Zeroable>::zeroed();
        }
        let first = x.iter().position(|w| w.abs() == amax).unwrap_or(0);
        let iscale = -127.0 / x[first];
        let scale = _mm512_set1_ps(iscale);
        let cap = _mm512_set1_epi32(127);
        let mut block = <BlockQ8_K as bytemuck::Zeroable>::zeroed();
        for (j, &w) in v.iter().enumerate() {
            let q = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(scale, w)), cap);
            _mm_storeu_si128(
                block.qs.as_mut_ptr().add(16 * j).cast(),
                _mm512_cvtepi32_epi8(q),
            );
            block.bsums[j] = _mm512_reduce_add_epi32(q) as i16;
        }
        block.d = 1.0 / iscale;
        block
    }
}

/// Quantize a row block by block with `block` (one of the block quantizers here, which all
/// give the same numbers).
#[inline(always)]
fn quantize_row(
    dtype: DType,
    src: &[f32],
    dst: &mut [u8],
    block: impl Fn(&[f32], &mut [i8; QK8_0]) -> (f32, i32),
) -> Result<()> {
    match dtype {
        DType::Q8_0 => {
            let blocks: &mut [BlockQ8_0] = cast_blocks(dtype, src.len(), dst)?;
            for (b, x) in blocks.iter_mut().zip(src.chunks_exact(QK8_0)) {
                let (d, _) = block(x, &mut b.qs);
                b.d = half::f16::from_f32(d);
            }
            Ok(())
        }
        DType::Q8_1 => {
            let blocks: &mut [BlockQ8_1] = cast_blocks(dtype, src.len(), dst)?;
            for (b, x) in blocks.iter_mut().zip(src.chunks_exact(QK8_0)) {
                let (d, sum) = block(x, &mut b.qs);
                b.d = half::f16::from_f32(d);
                b.s = half::f16::from_f32(d * sum as f32);
            }
            Ok(())
        }
        other => convert::row_from_f32(other, src, dst),
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

    /// Every build's quantizer gives the portable one's bytes, on random rows with ties, zeros
    /// and an all-zero block.
    #[test]
    fn every_build_gives_the_same_bytes() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 24) as f32 * 8.0 - 4.0
        };
        let mut x: Vec<f32> = (0..32 * 40).map(|_| next()).collect();
        x[32..64].fill(0.0);
        x[64] = 127.0;
        x[65] = 0.5;
        x[66] = -2.5;
        x[300] = -3.75;
        x[301] = 3.75; // equal magnitudes: the first sets the sign of the scale
        x[310] = -3.75;
        for dtype in [DType::Q8_0, DType::Q8_1, DType::Q8_K] {
            if dtype == DType::Q8_K {
                // NaN (the 32-value quantizers do not promise anything for it).
                x[512 + 7] = f32::NAN;
            }
            let size = dtype.row_bytes(x.len()).unwrap();
            let mut portable = vec![0u8; size];
            // (Q8_K: the reference codec, `convert::row_from_f32`; NaN compared by bits.)
            quantize_row(dtype, &x, &mut portable, quantize_block).unwrap();
            let mut dispatched = vec![0u8; size];
            quantize_activations(CpuFeatures::detect(), dtype, &x, &mut dispatched).unwrap();
            assert_eq!(portable, dispatched, "{dtype}");
            #[cfg(target_arch = "x86_64")]
            if CpuFeatures::detect().has_avx512() {
                let mut wide = vec![0u8; size];
                // SAFETY: checked just above.
                unsafe { quantize_activations_avx512(dtype, &x, &mut wide) }.unwrap();
                assert_eq!(portable, wide, "{dtype}");
            }
        }
    }

    #[test]
    fn close_to_the_reference_codec_and_rounds_ties_to_even() {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 61) as f32 - 30.0) * 0.173)
            .collect();
        for dtype in [DType::Q8_0, DType::Q8_1] {
            let mut ours = vec![0u8; dtype.row_bytes(64).unwrap()];
            quantize_activations(CpuFeatures::detect(), dtype, &x, &mut ours).unwrap();
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
        quantize_activations(CpuFeatures::detect(), DType::Q8_0, &tie, &mut q).unwrap();
        assert_eq!(&q[2..5], &[127, 0, 2]);
    }
}
