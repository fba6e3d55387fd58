//! Dot products between a weight row and an activation row: ggml's `vec_dot` for each weight
//! type against its [`DType::vec_dot_type`] (q4_0·q8_0, q4_1·q8_1, q5_0·q8_0, q5_1·q8_1,
//! q8_0·q8_0, q2_K·q8_K … q6_K·q8_K, iq4_nl·q8_0, iq4_xs·q8_K, mxfp4·q8_0), plus f32·f32, f16·f32
//! and bf16·f32.
//!
//! The quantized dots compute exactly what ggml's x86 `ggml_vec_dot_*` kernels compute (their
//! AVX2 branches, which ggml's AVX-512 builds run as well): exact integer sums per block in
//! ggml's 8 lanes, the block scales applied with the same FMAs, the same horizontal sums. Each
//! has an AVX2 form and a portable one giving the same bits (the K-quants live in
//! [`kquant`], the low-bit types in [`lowbit`]). The typed `dot_*` functions let the matmul kernel skip the per-call
//! dispatch of [`vec_dot`]; they take the [`CpuFeatures`] the caller resolved (e.g.
//! [`CpuFeatures::detect`]) and use AVX2 where it says the CPU has AVX2, FMA and F16C.

pub(crate) mod float;
pub(crate) mod kquant;
pub(crate) mod lowbit;
pub(crate) mod run;

use crate::kernels::blocks::legacy::legacy_quants;
use crate::kernels::isa::CpuFeatures;
use crate::kernels::simd::hsum8;
use half::{bf16, f16};
use rgml::quant::{
    cast_blocks, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1, QuantBlock,
};
use rgml::{DType, Error, Result};
use run::plain;
use std::borrow::Cow;

/// Dot product of `n` elements: `x` in `xtype`'s bytes, `y` in `xtype.vec_dot_type()`'s bytes
/// (for F16/BF16 weights, `y` is f32 bytes). Returns an error for unsupported types or wrong
/// lengths. The byte slices need not be aligned.
pub fn vec_dot(f: CpuFeatures, xtype: DType, n: usize, x: &[u8], y: &[u8]) -> Result<f32> {
    let ytype = activation_type(xtype);
    check_len("vec_dot x bytes", xtype.row_bytes(n)?, x.len())?;
    check_len("vec_dot y bytes", ytype.row_bytes(n)?, y.len())?;
    Ok(match xtype {
        DType::F32 => dot_f32(&plain::<f32>(x), &plain::<f32>(y)),
        DType::F16 => dot_f16_f32(&plain::<f16>(x), &plain::<f32>(y)),
        DType::BF16 => dot_bf16_f32(&plain::<bf16>(x), &plain::<f32>(y)),
        DType::Q4_0 => dot_q4_0_q8_0(f, &blocks(x)?, &blocks(y)?),
        DType::Q4_1 => dot_q4_1_q8_1(f, &blocks(x)?, &blocks(y)?),
        DType::Q5_0 => dot_q5_0_q8_0(f, &blocks(x)?, &blocks(y)?),
        DType::Q5_1 => dot_q5_1_q8_1(f, &blocks(x)?, &blocks(y)?),
        DType::Q8_0 => dot_q8_0_q8_0(f, &blocks(x)?, &blocks(y)?),
        DType::Q4_K => dot_q4_k_q8_k(f, &blocks(x)?, &blocks(y)?),
        DType::Q5_K => dot_q5_k_q8_k(f, &blocks(x)?, &blocks(y)?),
        DType::Q6_K => dot_q6_k_q8_k(f, &blocks(x)?, &blocks(y)?),
        DType::Q2_K => dot_q2_k_q8_k(f, &blocks(x)?, &blocks(y)?),
        DType::Q3_K => dot_q3_k_q8_k(f, &blocks(x)?, &blocks(y)?),
        DType::IQ4_XS => dot_iq4_xs_q8_k(f, &blocks(x)?, &blocks(y)?),
        DType::IQ4_NL => dot_iq4_nl_q8_0(f, &blocks(x)?, &blocks(y)?),
        DType::MXFP4 => dot_mxfp4_q8_0(f, &blocks(x)?, &blocks(y)?),
        DType::I32 | DType::I64 | DType::Q8_1 | DType::Q8_K => {
            return Err(Error::UnsupportedConversion(xtype))
        }
    })
}

/// The matrix-vector kernel of weights of `dtype` for one activation row (`vec_dot`'s bits, as
/// ggml computes a generation step's products), where this CPU has one: IQ4_NL and MXFP4
/// ([`lowbit::nibble_matvec`]), the K-quants and IQ4_XS.
pub(crate) fn matvec(f: CpuFeatures, dtype: DType) -> Option<run::MatvecKernel> {
    #[cfg(target_arch = "x86_64")]
    if let Some(kernel) =
        lowbit::nibble_matvec(f, dtype).or_else(|| lowbit::kquant_matvec(f, dtype))
    {
        return Some(kernel);
    }
    kquant::matvec(f, dtype)
}

/// The type [`vec_dot`] expects its `y` operand in, for weight type `xtype`.
pub const fn activation_type(xtype: DType) -> DType {
    match xtype {
        DType::F16 | DType::BF16 => DType::F32,
        other => other.vec_dot_type(),
    }
}

fn check_len(what: &'static str, expected: usize, actual: usize) -> Result<()> {
    if expected == actual {
        Ok(())
    } else {
        Err(Error::LengthMismatch {
            what,
            expected,
            actual,
        })
    }
}

fn blocks<B: QuantBlock>(bytes: &[u8]) -> Result<Cow<'_, [B]>> {
    cast_blocks(bytes)
}

// Plain float dots keep 8 independent partial sums so the loop vectorises without reassociation
// permission; the order differs from a sequential sum, as it does in ggml's SIMD kernels.

/// `sum(x[i] * y[i])` over the common length.
pub fn dot_f32(x: &[f32], y: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (xc, yc) = (x.chunks_exact(8), y.chunks_exact(8));
    let (xr, yr) = (xc.remainder(), yc.remainder());
    for (a, b) in xc.zip(yc) {
        for l in 0..8 {
            acc[l] += a[l] * b[l];
        }
    }
    let tail: f32 = xr.iter().zip(yr).map(|(a, b)| a * b).sum();
    acc.iter().sum::<f32>() + tail
}

/// `sum(x[i] * y[i])` with f16 weights and f32 activations, over the common length.
pub fn dot_f16_f32(x: &[f16], y: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (xc, yc) = (x.chunks_exact(8), y.chunks_exact(8));
    let (xr, yr) = (xc.remainder(), yc.remainder());
    for (a, b) in xc.zip(yc) {
        for l in 0..8 {
            acc[l] += a[l].to_f32() * b[l];
        }
    }
    let tail: f32 = xr.iter().zip(yr).map(|(a, b)| a.to_f32() * b).sum();
    acc.iter().sum::<f32>() + tail
}

/// `sum(x[i] * y[i])` with bf16 weights and f32 activations, over the common length.
pub fn dot_bf16_f32(x: &[bf16], y: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (xc, yc) = (x.chunks_exact(8), y.chunks_exact(8));
    let (xr, yr) = (xc.remainder(), yc.remainder());
    for (a, b) in xc.zip(yc) {
        for l in 0..8 {
            // bf16 -> f32 is a shift; spelled out so the loop vectorises.
            acc[l] += f32::from_bits(u32::from(a[l].to_bits()) << 16) * b[l];
        }
    }
    let tail: f32 = xr.iter().zip(yr).map(|(a, b)| a.to_f32() * b).sum();
    acc.iter().sum::<f32>() + tail
}

// f16 scales go through `to_f32_const` (exact, branchy software conversion): `to_f32` re-checks
// CPU features on every call, which doubled the cost of the legacy dots in measurements.
//
// The legacy dots mirror ggml's x86 AVX2 kernels (`arch/x86/quants.c`; AVX-512 builds run the
// same branches, and llamafile's tinyBLAS_Q0 the same per-output operations for Q4_0, Q5_0 and
// Q8_0): per 32-quant block 8 lanes of exact i32 sums of 4 products (lane k: elements 4k..4k+4),
// converted to f32 and folded into an 8-lane accumulator with one FMA by `d_x * d_y`, then
// `hsum_float_8`; the `_1` types add `sum(m_x * s_y)`, accumulated with scalar FMAs (GCC
// contracts `summs += m * s`; the product of two f16 values is exact, so it is also a plain
// add). The portable forms below compute the same lanes with integer code.

/// ggml's 8 lanes of a block product: lane k = `sum(x[e] * y[e])` over e in 4k..4k + 4.
#[inline(always)]
fn lane_sums(x: &[i8; 32], y: &[i8; 32]) -> [i32; 8] {
    std::array::from_fn(|k| {
        (4 * k..4 * k + 4)
            .map(|e| i32::from(x[e]) * i32::from(y[e]))
            .sum()
    })
}

/// `acc[k] = fma(d, lanes[k], acc[k])`.
#[inline(always)]
fn fma_lanes(acc: &mut [f32; 8], d: f32, lanes: [i32; 8]) {
    for (a, l) in acc.iter_mut().zip(lanes) {
        *a = d.mul_add(l as f32, *a);
    }
}

/// Q4_0 weights · Q8_0 activations, over the common number of blocks.
pub fn dot_q4_0_q8_0(f: CpuFeatures, x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if f.has_avx2() {
        // SAFETY: `f` says the CPU has AVX2, FMA and F16C.
        return unsafe { avx2::dot_q4_0_q8_0(x, y) };
    }
    dot_q4_0_q8_0_scalar(x, y)
}

fn dot_q4_0_q8_0_scalar(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 {
    let mut acc = [0f32; 8];
    for (bx, by) in x.iter().zip(y) {
        let d = bx.d.to_f32_const() * by.d.to_f32_const();
        fma_lanes(
            &mut acc,
            d,
            lane_sums(&legacy_quants(&bx.qs, None, 8), &by.qs),
        );
    }
    hsum8(&acc)
}

/// Q4_1 weights · Q8_1 activations, over the common number of blocks.
pub fn dot_q4_1_q8_1(f: CpuFeatures, x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if f.has_avx2() {
        // SAFETY: `f` says the CPU has AVX2, FMA and F16C.
        return unsafe { avx2::dot_q4_1_q8_1(x, y) };
    }
    dot_q4_1_q8_1_scalar(x, y)
}

fn dot_q4_1_q8_1_scalar(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
    let mut acc = [0f32; 8];
    let mut summs = 0f32;
    for (bx, by) in x.iter().zip(y) {
        summs = bx.m.to_f32_const().mul_add(by.s.to_f32_const(), summs);
        let d = bx.d.to_f32_const() * by.d.to_f32_const();
        fma_lanes(
            &mut acc,
            d,
            lane_sums(&legacy_quants(&bx.qs, None, 0), &by.qs),
        );
    }
    hsum8(&acc) + summs
}

/// Q5_0 weights · Q8_0 activations, over the common number of blocks.
pub fn dot_q5_0_q8_0(f: CpuFeatures, x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if f.has_avx2() {
        // SAFETY: `f` says the CPU has AVX2, FMA and F16C.
        return unsafe { avx2::dot_q5_0_q8_0(x, y) };
    }
    dot_q5_0_q8_0_scalar(x, y)
}

fn dot_q5_0_q8_0_scalar(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 {
    let mut acc = [0f32; 8];
    for (bx, by) in x.iter().zip(y) {
        let d = bx.d.to_f32_const() * by.d.to_f32_const();
        let q = legacy_quants(&bx.qs, Some(bx.qh), 16);
        fma_lanes(&mut acc, d, lane_sums(&q, &by.qs));
    }
    hsum8(&acc)
}

/// Q5_1 weights · Q8_1 activations, over the common number of blocks.
pub fn dot_q5_1_q8_1(f: CpuFeatures, x: &[BlockQ5_1], y: &[BlockQ8_1]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if f.has_avx2() {
        // SAFETY: `f` says the CPU has AVX2, FMA and F16C.
        return unsafe { avx2::dot_q5_1_q8_1(x, y) };
    }
    dot_q5_1_q8_1_scalar(x, y)
}

fn dot_q5_1_q8_1_scalar(x: &[BlockQ5_1], y: &[BlockQ8_1]) -> f32 {
    let mut acc = [0f32; 8];
    let mut summs = 0f32;
    for (bx, by) in x.iter().zip(y) {
        summs = bx.m.to_f32_const().mul_add(by.s.to_f32_const(), summs);
        let d = bx.d.to_f32_const() * by.d.to_f32_const();
        let q = legacy_quants(&bx.qs, Some(bx.qh), 0);
        fma_lanes(&mut acc, d, lane_sums(&q, &by.qs));
    }
    hsum8(&acc) + summs
}

/// Q8_0 weights · Q8_0 activations, over the common number of blocks.
pub fn dot_q8_0_q8_0(f: CpuFeatures, x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if f.has_avx2() {
        // SAFETY: `f` says the CPU has AVX2, FMA and F16C.
        return unsafe { avx2::dot_q8_0_q8_0(x, y) };
    }
    dot_q8_0_q8_0_scalar(x, y)
}

fn dot_q8_0_q8_0_scalar(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    let mut acc = [0f32; 8];
    for (bx, by) in x.iter().zip(y) {
        let d = bx.d.to_f32_const() * by.d.to_f32_const();
        fma_lanes(&mut acc, d, lane_sums(&bx.qs, &by.qs));
    }
    hsum8(&acc)
}

pub use crate::kernels::dots::kquant::{dot_q4_k_q8_k, dot_q5_k_q8_k, dot_q6_k_q8_k};
pub use crate::kernels::dots::lowbit::{
    dot_iq4_nl_q8_0, dot_iq4_xs_q8_k, dot_mxfp4_q8_0, dot_q2_k_q8_k, dot_q3_k_q8_k,
};

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! The legacy dots with AVX2 intrinsics, ggml's `__AVX2__` kernels operation for operation
    //! (the portable forms above give the same bits).

    use super::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1};
    use std::arch::x86_64::*;

    use crate::kernels::fp16::f16_to_f32 as h2f;
    use crate::kernels::simd::x86::{hsum8_avx2, load256};

    /// 32 bytes from a 32-byte array.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn load32(a: &[i8; 32]) -> __m256i {
        // SAFETY: `a` is exactly 32 readable bytes, and AVX2 is enabled here.
        unsafe { load256(a.as_ptr().cast()) }
    }

    /// The 16 nibble bytes of a 4-bit block unpacked into 32 bytes in element order
    /// (low nibbles = elements 0..16, high nibbles = elements 16..32).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn unpack_nibbles(qs: &[u8; 16]) -> __m256i {
        // SAFETY: `qs` is exactly 16 readable bytes, and AVX2 is enabled here.
        unsafe { crate::kernels::simd::x86::nibbles(qs.as_ptr()) }
    }

    /// Sum of unsigned-byte x signed-byte products, as 8 i32 lanes converted to f32.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn mul_sum_us8(ux: __m256i, sy: __m256i) -> __m256 {
        // maddubs saturates at i16; |15 * 127 * 2| and |8 * 128 * 2| stay far below that.
        let dot16 = _mm256_maddubs_epi16(ux, sy);
        let dot32 = _mm256_madd_epi16(dot16, _mm256_set1_epi16(1));
        _mm256_cvtepi32_ps(dot32)
    }

    /// Sum of signed-byte x signed-byte products via sign transfer (maddubs needs one unsigned
    /// operand), as 8 i32 lanes converted to f32. Like ggml's AVX2 code this assumes quants in
    /// -127..=127 (what every quantizer produces): a -128 would overflow the sign flip.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn mul_sum_i8(x: __m256i, y: __m256i) -> __m256 {
        let ax = _mm256_sign_epi8(x, x);
        let sy = _mm256_sign_epi8(y, x);
        mul_sum_us8(ax, sy)
    }

    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_q4_0_q8_0(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 {
        let mut acc = _mm256_setzero_ps();
        for (bx, by) in x.iter().zip(y) {
            let d = _mm256_set1_ps(h2f(bx.d) * h2f(by.d));
            // q - 8 in -8..8, then a signed x signed product.
            let qx = _mm256_sub_epi8(unpack_nibbles(&bx.qs), _mm256_set1_epi8(8));
            let p = mul_sum_i8(qx, load32(&by.qs));
            acc = _mm256_fmadd_ps(d, p, acc);
        }
        hsum8_avx2(acc)
    }

    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_q4_1_q8_1(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
        let mut acc = _mm256_setzero_ps();
        let mut summs = 0.0f32;
        for (bx, by) in x.iter().zip(y) {
            summs = h2f(bx.m).mul_add(h2f(by.s), summs);
            let d = _mm256_set1_ps(h2f(bx.d) * h2f(by.d));
            let p = mul_sum_us8(unpack_nibbles(&bx.qs), load32(&by.qs));
            acc = _mm256_fmadd_ps(d, p, acc);
        }
        hsum8_avx2(acc) + summs
    }

    /// `bytes_from_bits_32` of a Q5 block's high bits ([`crate::kernels::tiled`]'s).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn bits_to_bytes(qh: [u8; 4]) -> __m256i {
        // SAFETY: this function's target features include AVX2.
        unsafe { crate::kernels::simd::x86::bits_to_bytes(i32::from_le_bytes(qh)) }
    }

    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_q5_0_q8_0(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 {
        let mut acc = _mm256_setzero_ps();
        for (bx, by) in x.iter().zip(y) {
            let d = _mm256_set1_ps(h2f(bx.d) * h2f(by.d));
            // 0xF0 where the fifth bit is clear: the nibble minus 16 as a signed byte.
            let high = _mm256_andnot_si256(bits_to_bytes(bx.qh), _mm256_set1_epi8(-16));
            let qx = _mm256_or_si256(unpack_nibbles(&bx.qs), high);
            let p = mul_sum_i8(qx, load32(&by.qs));
            acc = _mm256_fmadd_ps(d, p, acc);
        }
        hsum8_avx2(acc)
    }

    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_q5_1_q8_1(x: &[BlockQ5_1], y: &[BlockQ8_1]) -> f32 {
        let mut acc = _mm256_setzero_ps();
        let mut summs = 0.0f32;
        for (bx, by) in x.iter().zip(y) {
            summs = h2f(bx.m).mul_add(h2f(by.s), summs);
            let high = _mm256_and_si256(bits_to_bytes(bx.qh), _mm256_set1_epi8(0x10));
            let qx = _mm256_or_si256(unpack_nibbles(&bx.qs), high);
            let p = mul_sum_us8(qx, load32(&by.qs));
            acc = _mm256_fmadd_ps(p, _mm256_set1_ps(h2f(bx.d) * h2f(by.d)), acc);
        }
        hsum8_avx2(acc) + summs
    }

    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_q8_0_q8_0(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
        let mut acc = _mm256_setzero_ps();
        for (bx, by) in x.iter().zip(y) {
            let d = _mm256_set1_ps(h2f(bx.d) * h2f(by.d));
            let p = mul_sum_i8(load32(&bx.qs), load32(&by.qs));
            acc = _mm256_fmadd_ps(d, p, acc);
        }
        hsum8_avx2(acc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use rgml::quant::{dequantize_row, quantize_row, BlockQ4_K, BlockQ6_K, BlockQ8_K};

    const WEIGHT_TYPES: [DType; 12] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::MXFP4,
    ];

    fn encode(t: DType, x: &[f32]) -> Vec<u8> {
        let mut b = vec![0u8; t.row_bytes(x.len()).unwrap()];
        quantize_row(t, x, &mut b).unwrap();
        b
    }

    fn decode(t: DType, b: &[u8], n: usize) -> Vec<f32> {
        let mut y = vec![0.0f32; n];
        dequantize_row(t, b, &mut y).unwrap();
        y
    }

    fn gaussianish(rng: &mut StdRng, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                let scale = if rng.gen_bool(0.05) { 10.0 } else { 1.0 };
                ((0..4).map(|_| rng.gen::<f32>()).sum::<f32>() - 2.0) * scale + 0.01
            })
            .collect()
    }

    /// f64 dot of the dequantized operands, and the sum of the magnitudes of its terms. For the
    /// `_1` types the min term uses the activation's stored `s = d * sum(q)` (an f16), as the
    /// format defines it, instead of the exact sum of the dequantized activations.
    fn reference_dot(xt: DType, xb: &[u8], yb: &[u8], n: usize) -> (f64, f64) {
        let yt = activation_type(xt);
        let with_min = matches!(xt, DType::Q4_1 | DType::Q5_1);
        let mut xb = xb.to_vec();
        let mut min_term = 0.0f64;
        if with_min {
            let (xs, ys) = (xt.block_bytes(), yt.block_bytes());
            for (bx, by) in xb.chunks_exact_mut(xs).zip(yb.chunks_exact(ys)) {
                let m = f16::from_le_bytes([bx[2], bx[3]]).to_f64();
                let s = f16::from_le_bytes([by[2], by[3]]).to_f64();
                min_term += m * s;
                bx[2..4].fill(0);
            }
        }
        let (xd, yd) = (decode(xt, &xb, n), decode(yt, yb, n));
        let terms = xd
            .iter()
            .zip(&yd)
            .map(|(&p, &q)| f64::from(p) * f64::from(q));
        let dot: f64 = terms.clone().sum::<f64>() + min_term;
        let magnitude: f64 = terms.map(f64::abs).sum::<f64>() + min_term.abs();
        (dot, magnitude)
    }

    /// Each dot equals the f64 dot of the dequantized operands up to f32 rounding: the integer
    /// block sums are exact, only the scale products and the accumulation round.
    #[test]
    fn dots_match_dequantized_reference() {
        let mut rng = StdRng::seed_from_u64(42);
        for n in [256, 1024, 4096] {
            let a = gaussianish(&mut rng, n);
            let b = gaussianish(&mut rng, n);
            for xt in WEIGHT_TYPES {
                let yt = activation_type(xt);
                let (xb, yb) = (encode(xt, &a), encode(yt, &b));
                let (reference, magnitude) = reference_dot(xt, &xb, &yb, n);
                let got = vec_dot(CpuFeatures::detect(), xt, n, &xb, &yb).unwrap();
                let err = (f64::from(got) - reference).abs() / magnitude;
                assert!(
                    err < 2e-6,
                    "{xt} n={n}: got {got}, reference {reference}, rel err {err}"
                );
            }
        }
    }

    /// ggml test-quantize-fns: |dot(quantized) - dot(f32)| / n below MAX_DOT_PRODUCT_ERROR.
    #[test]
    fn dot_error_within_ggml_bound() {
        let n = 32 * 128;
        let data = |offset: f32| -> Vec<f32> {
            (0..n)
                .map(|i| (0.1 + 2.0 * f64::from((i as f32 + offset).cos())) as f32)
                .collect()
        };
        let (a, b) = (data(0.0), data(1.0));
        let exact: f64 = a.iter().zip(&b).map(|(&p, &q)| f64::from(p * q)).sum();
        for xt in WEIGHT_TYPES {
            let got = vec_dot(
                CpuFeatures::detect(),
                xt,
                n,
                &encode(xt, &a),
                &encode(activation_type(xt), &b),
            )
            .unwrap();
            let err = (f64::from(got) - exact).abs() / n as f64;
            assert!(err < 0.02, "{xt}: {err}");
        }
    }

    fn blocks_of<B: QuantBlock>(bytes: &[u8]) -> Vec<B> {
        cast_blocks::<B>(bytes).unwrap().into_owned()
    }

    /// The portable dots give the SIMD dots' bits (both mirror ggml's AVX2 arithmetic), for
    /// every quantized type, on rows with outliers and varied block scales.
    #[test]
    fn scalar_and_simd_paths_agree() {
        let simd = CpuFeatures::detect();
        let portable = simd.without_simd();
        let mut rng = StdRng::seed_from_u64(1);
        for n in [256 * 3, 256 * 9] {
            for xt in WEIGHT_TYPES.into_iter().filter(|t| t.is_quantized()) {
                for _ in 0..4 {
                    let (a, b) = (gaussianish(&mut rng, n), gaussianish(&mut rng, n));
                    let (xb, yb) = (encode(xt, &a), encode(activation_type(xt), &b));
                    let fast = vec_dot(simd, xt, n, &xb, &yb).unwrap();
                    let slow = vec_dot(portable, xt, n, &xb, &yb).unwrap();
                    assert_eq!(
                        fast.to_bits(),
                        slow.to_bits(),
                        "{xt} n={n}: {fast} vs {slow}"
                    );
                }
            }
        }
    }

    /// Timing check for the SIMD paths: `cargo test --release -p rgml-cpu -- --ignored
    /// --nocapture bench_`.
    #[test]
    #[ignore]
    fn bench_simd_vs_scalar() {
        use std::hint::black_box;
        use std::time::Instant;
        let mut rng = StdRng::seed_from_u64(3);
        let n = 4096;
        let (a, b) = (gaussianish(&mut rng, n), gaussianish(&mut rng, n));
        let q4_0: Vec<BlockQ4_0> = blocks_of(&encode(DType::Q4_0, &a));
        let q4_1: Vec<BlockQ4_1> = blocks_of(&encode(DType::Q4_1, &a));
        let q8_0a: Vec<BlockQ8_0> = blocks_of(&encode(DType::Q8_0, &a));
        let q8_0: Vec<BlockQ8_0> = blocks_of(&encode(DType::Q8_0, &b));
        let q8_1: Vec<BlockQ8_1> = blocks_of(&encode(DType::Q8_1, &b));
        let time = |name: &str, f: &dyn Fn() -> f32| {
            let iters = 20_000;
            let t = Instant::now();
            for _ in 0..iters {
                black_box(f());
            }
            let ns = t.elapsed().as_nanos() as f64 / iters as f64;
            println!("{name:24} {ns:9.1} ns per {n}-element dot");
        };
        let f = CpuFeatures::detect();
        time("q4_0 dispatch", &|| {
            dot_q4_0_q8_0(f, black_box(&q4_0), &q8_0)
        });
        time("q4_0 scalar", &|| {
            dot_q4_0_q8_0_scalar(black_box(&q4_0), &q8_0)
        });
        time("q4_1 dispatch", &|| {
            dot_q4_1_q8_1(f, black_box(&q4_1), &q8_1)
        });
        time("q4_1 scalar", &|| {
            dot_q4_1_q8_1_scalar(black_box(&q4_1), &q8_1)
        });
        time("q8_0 dispatch", &|| {
            dot_q8_0_q8_0(f, black_box(&q8_0a), &q8_0)
        });
        time("q8_0 scalar", &|| {
            dot_q8_0_q8_0_scalar(black_box(&q8_0a), &q8_0)
        });
        let q5_0: Vec<BlockQ5_0> = blocks_of(&encode(DType::Q5_0, &a));
        let q4k: Vec<BlockQ4_K> = blocks_of(&encode(DType::Q4_K, &a));
        let q6k: Vec<BlockQ6_K> = blocks_of(&encode(DType::Q6_K, &a));
        let q8k: Vec<BlockQ8_K> = blocks_of(&encode(DType::Q8_K, &b));
        time("q5_0 scalar", &|| {
            dot_q5_0_q8_0_scalar(black_box(&q5_0), &q8_0)
        });
        time("q4_K", &|| dot_q4_k_q8_k(f, black_box(&q4k), &q8k));
        time("q6_K", &|| dot_q6_k_q8_k(f, black_box(&q6k), &q8k));
        time("f32", &|| dot_f32(black_box(&a), &b));
    }

    /// Each type's matrix-vector kernel (where this CPU has one) gives every row `vec_dot`'s
    /// bits: the streamed K-quant dots prefetch as they read and compute nothing else.
    #[test]
    fn matvec_kernels_equal_vec_dot() {
        let f = CpuFeatures::detect();
        let mut rng = StdRng::seed_from_u64(9);
        for xt in WEIGHT_TYPES {
            let Some(kernel) = matvec(f, xt) else {
                continue;
            };
            let n = 2 * 256;
            let rows = 5;
            let x: Vec<Vec<u8>> = (0..rows)
                .map(|_| encode(xt, &gaussianish(&mut rng, n)))
                .collect();
            let y = encode(activation_type(xt), &gaussianish(&mut rng, n));
            let dense = x.concat();
            let run = run::RowRun {
                nb: n / xt.block_size(),
                x0: dense.as_ptr(),
                row_stride: x[0].len(),
                y: y.as_ptr(),
            };
            let mut out = vec![f32::NAN; rows];
            // SAFETY: the kernel is this CPU's for `xt`; `rows` dense rows of `nb` blocks, `y`
            // one activation row of `nb` blocks.
            unsafe { kernel(run, &mut out) };
            for (r, got) in out.iter().enumerate() {
                let want = vec_dot(f, xt, n, &x[r], &y).unwrap();
                assert_eq!(got.to_bits(), want.to_bits(), "{xt} row {r}");
            }
        }
    }

    #[test]
    fn unaligned_bytes_give_the_same_result() {
        let mut rng = StdRng::seed_from_u64(2);
        let n = 512;
        let (a, b) = (gaussianish(&mut rng, n), gaussianish(&mut rng, n));
        for xt in WEIGHT_TYPES {
            let (xb, yb) = (encode(xt, &a), encode(activation_type(xt), &b));
            let mut xs = vec![0u8; xb.len() + 1];
            xs[1..].copy_from_slice(&xb);
            let mut ys = vec![0u8; yb.len() + 3];
            ys[3..].copy_from_slice(&yb);
            let aligned = vec_dot(CpuFeatures::detect(), xt, n, &xb, &yb).unwrap();
            let shifted = vec_dot(CpuFeatures::detect(), xt, n, &xs[1..], &ys[3..]).unwrap();
            assert_eq!(aligned.to_bits(), shifted.to_bits(), "{xt}");
        }
    }

    #[test]
    fn plain_dots_handle_tails() {
        for n in [0usize, 1, 7, 8, 9, 31, 33] {
            let x: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 1.0).collect();
            let y: Vec<f32> = (0..n).map(|i| 2.0 - i as f32 * 0.25).collect();
            let exact: f32 = x.iter().zip(&y).map(|(a, b)| a * b).sum();
            let h: Vec<f16> = x.iter().map(|&v| f16::from_f32(v)).collect();
            let bh: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
            // Inputs are exact in all three formats and products/sums are small integers/4.
            assert_eq!(dot_f32(&x, &y), exact);
            assert_eq!(dot_f16_f32(&h, &y), exact);
            assert_eq!(dot_bf16_f32(&bh, &y), exact);
        }
    }

    #[test]
    fn errors_on_bad_types_and_lengths() {
        let a = vec![0.5f32; 256];
        let xb = encode(DType::Q4_0, &a);
        let yb = encode(DType::Q8_0, &a);
        assert!(vec_dot(CpuFeatures::detect(), DType::Q4_0, 256, &xb, &yb).is_ok());
        assert!(vec_dot(CpuFeatures::detect(), DType::Q4_0, 255, &xb, &yb).is_err());
        assert!(vec_dot(CpuFeatures::detect(), DType::Q4_0, 256, &xb[1..], &yb).is_err());
        assert!(vec_dot(
            CpuFeatures::detect(),
            DType::Q4_0,
            256,
            &xb,
            &yb[..yb.len() - 1]
        )
        .is_err());
        assert!(vec_dot(CpuFeatures::detect(), DType::Q4_0, 224, &xb, &yb).is_err());
        for t in [DType::I32, DType::Q8_1, DType::Q8_K] {
            let x = vec![0u8; t.row_bytes(256).unwrap()];
            let y = vec![0u8; activation_type(t).row_bytes(256).unwrap()];
            assert!(
                vec_dot(CpuFeatures::detect(), t, 256, &x, &y).is_err(),
                "{t}"
            );
        }
        let f = encode(DType::F32, &a);
        assert!(vec_dot(
            CpuFeatures::detect(),
            DType::F16,
            256,
            &encode(DType::F16, &a),
            &f
        )
        .is_ok());
        assert!(vec_dot(CpuFeatures::detect(), DType::F16, 256, &f, &f).is_err());
    }
}
