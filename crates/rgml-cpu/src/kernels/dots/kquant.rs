//! The K-quant dot products (`q4_K·q8_K`, `q5_K·q8_K`, `q6_K·q8_K`) with the float arithmetic
//! of ggml's x86 `ggml_vec_dot_*_q8_K` (`arch/x86/quants.c`, the `__AVX2__` branches, which
//! AVX-512 builds run too), plus the per-block integer sums the tiled batch kernel
//! ([`super::ktiled`]) shares with them.
//!
//! Per super-block ggml keeps 8 lanes of exact i32 sums (lane `k` sums the products of bytes
//! `4k..4k + 4` of every 32-byte chunk, each scaled by its sub-block scale), converts them to
//! f32 and folds them into an 8-lane accumulator with one FMA by `d = y.d * x.d`; one
//! `hsum_float_8` at the end. The mins enter separately: Q4_K in 4 f32 lanes (`acc_m`, FMAs by
//! `dmin = -y.d * x.dmin`) summed as `(m0 + m2) + (m1 + m3)`, Q5_K in one f32 that GCC's
//! `-ffp-contract=fast` turns into a scalar FMA (seen in the native build's disassembly). The
//! portable functions compute the same lanes with plain integer code and the same float
//! operations (`f32::mul_add` where ggml fuses), so both paths give the same bits.

use crate::kernels::blocks::kquant::{q4k_quants, q5k_quants, q6k_quants, scales_mins};
use crate::kernels::dots::run;
use crate::kernels::isa::CpuFeatures;
use crate::kernels::simd::hsum8;
use rgml::quant::{BlockQ4_K, BlockQ5_K, BlockQ6_K, BlockQ8_K, QK_K};
use rgml::DType;

/// `sum_j m[j] * (bsums[2j] + bsums[2j + 1])` split as ggml's `_mm_madd_epi16` does it: lane
/// `i` holds sub-blocks `2i` and `2i + 1`.
#[inline(always)]
fn min_lanes(m: &[u8; 8], bsums: &[i16; 16]) -> [i32; 4] {
    let pair = |j: usize| i32::from(bsums[2 * j]) + i32::from(bsums[2 * j + 1]);
    std::array::from_fn(|i| {
        i32::from(m[2 * i]) * pair(2 * i) + i32::from(m[2 * i + 1]) * pair(2 * i + 1)
    })
}

/// ggml's 8 i32 lanes of a super-block: lane `k` = `sum_chunk scale(chunk, k) * sum_{b in
/// 4k..4k+4} q[32 chunk + b] * y[32 chunk + b]`, with `scale(chunk, k)` the sub-block scale of
/// those bytes (`SUB` = 32: one per chunk; 16: `sc[2 chunk]` for lanes 0..4, `sc[2 chunk + 1]`
/// for lanes 4..8). Exact integers.
#[inline(always)]
fn scaled_lanes<const SUB: usize>(q: &[u8; QK_K], y: &[i8; QK_K], sc: &[i32]) -> [i32; 8] {
    let mut lanes = [0i32; 8];
    for (chunk, (qc, yc)) in q.chunks_exact(32).zip(y.chunks_exact(32)).enumerate() {
        for (k, lane) in lanes.iter_mut().enumerate() {
            let s = if SUB == 32 {
                sc[chunk]
            } else {
                sc[2 * chunk + k / 4]
            };
            let mut p = 0i32;
            for b in 4 * k..4 * k + 4 {
                p += i32::from(qc[b]) * i32::from(yc[b]);
            }
            *lane += s * p;
        }
    }
    lanes
}

/// Q4_K weights · Q8_K activations, over the common number of super-blocks.
pub fn dot_q4_k_q8_k(f: CpuFeatures, x: &[BlockQ4_K], y: &[BlockQ8_K]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if f.has_avx2() {
        // SAFETY: `f` says the CPU has AVX2, FMA and F16C.
        return unsafe { avx2::dot_q4_k::<false>(x, y) };
    }
    let _ = f;
    let mut acc = [0f32; 8];
    let mut acc_m = [0f32; 4];
    let mut q = [0u8; QK_K];
    for (bx, by) in x.iter().zip(y) {
        let d = by.d * bx.d.to_f32_const();
        let dmin = -by.d * bx.dmin.to_f32_const();
        let (sc, m) = scales_mins(&bx.scales);
        for (a, p) in acc_m.iter_mut().zip(min_lanes(&m, &by.bsums)) {
            *a = dmin.mul_add(p as f32, *a);
        }
        q4k_quants(bx, &mut q);
        let lanes = scaled_lanes::<32>(&q, &by.qs, &sc.map(i32::from));
        for (a, l) in acc.iter_mut().zip(lanes) {
            *a = d.mul_add(l as f32, *a);
        }
    }
    hsum8(&acc) + ((acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3]))
}

/// The matrix-vector kernel of Q4_K, Q5_K or Q6_K weights (`None` for other types), where the
/// CPU has AVX2: each row's product is [`dot_q4_k_q8_k`]'s (etc.) bit for bit.
pub(crate) fn matvec(f: CpuFeatures, dtype: DType) -> Option<run::MatvecKernel> {
    #[cfg(target_arch = "x86_64")]
    if f.has_avx2() {
        /// # Safety
        /// As [`run::MatvecKernel`], on a CPU with AVX2, FMA and F16C.
        unsafe fn q4_k(r: run::RowRun, out: &mut [f32]) {
            // SAFETY: forwarded; the CPU has what the dot needs.
            unsafe { run::each_row(r, out, |x, y| avx2::dot_q4_k::<true>(x, y)) }
        }
        /// # Safety
        /// As `q4_k`.
        unsafe fn q5_k(r: run::RowRun, out: &mut [f32]) {
            // SAFETY: forwarded; the CPU has what the dot needs.
            unsafe { run::each_row(r, out, |x, y| avx2::dot_q5_k::<true>(x, y)) }
        }
        /// # Safety
        /// As `q4_k`.
        unsafe fn q6_k(r: run::RowRun, out: &mut [f32]) {
            // SAFETY: forwarded; the CPU has what the dot needs.
            unsafe { run::each_row(r, out, |x, y| avx2::dot_q6_k::<true>(x, y)) }
        }
        return match dtype {
            DType::Q4_K => Some(q4_k),
            DType::Q5_K => Some(q5_k),
            DType::Q6_K => Some(q6_k),
            _ => None,
        };
    }
    let _ = (f, dtype);
    None
}

/// Q5_K weights · Q8_K activations, over the common number of super-blocks.
pub fn dot_q5_k_q8_k(f: CpuFeatures, x: &[BlockQ5_K], y: &[BlockQ8_K]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if f.has_avx2() {
        // SAFETY: `f` says the CPU has AVX2, FMA and F16C.
        return unsafe { avx2::dot_q5_k::<false>(x, y) };
    }
    let _ = f;
    let mut acc = [0f32; 8];
    let mut summs = 0f32;
    let mut q = [0u8; QK_K];
    for (bx, by) in x.iter().zip(y) {
        let d = by.d * bx.d.to_f32_const();
        let dmin = -by.d * bx.dmin.to_f32_const();
        let (sc, m) = scales_mins(&bx.scales);
        let mins: i32 = min_lanes(&m, &by.bsums).iter().sum();
        summs = dmin.mul_add(mins as f32, summs);
        q5k_quants(bx, &mut q);
        let lanes = scaled_lanes::<32>(&q, &by.qs, &sc.map(i32::from));
        for (a, l) in acc.iter_mut().zip(lanes) {
            *a = d.mul_add(l as f32, *a);
        }
    }
    hsum8(&acc) + summs
}

/// `32 * sum(bsums[j] * sc[j])` in ggml's lanes (`_mm256_madd_epi16` of the bsums and
/// scales: lane `k` holds sub-blocks `2k` and `2k + 1`): the `- 32` of Q6_K's quants.
#[inline(always)]
fn q6k_offset_lanes(sc: &[i8; 16], bsums: &[i16; 16]) -> [i32; 8] {
    std::array::from_fn(|k| {
        let p = |j: usize| i32::from(bsums[j]) * i32::from(sc[j]);
        (p(2 * k) + p(2 * k + 1)) << 5
    })
}

/// Q6_K weights · Q8_K activations, over the common number of super-blocks.
pub fn dot_q6_k_q8_k(f: CpuFeatures, x: &[BlockQ6_K], y: &[BlockQ8_K]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if f.has_avx2() {
        // SAFETY: `f` says the CPU has AVX2, FMA and F16C.
        return unsafe { avx2::dot_q6_k::<false>(x, y) };
    }
    let _ = f;
    let mut acc = [0f32; 8];
    let mut q = [0u8; QK_K];
    for (bx, by) in x.iter().zip(y) {
        let d = by.d * bx.d.to_f32_const();
        q6k_quants(bx, &mut q);
        let lanes = scaled_lanes::<16>(&q, &by.qs, &bx.scales.map(i32::from));
        let offset = q6k_offset_lanes(&bx.scales, &by.bsums);
        for ((a, l), o) in acc.iter_mut().zip(lanes).zip(offset) {
            *a = d.mul_add((l - o) as f32, *a);
        }
    }
    hsum8(&acc)
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    //! The dots with AVX2 intrinsics, in ggml's instruction order where it matters (the float
    //! operations; the integer lanes are exact whatever computes them).

    use super::{BlockQ4_K, BlockQ5_K, BlockQ6_K, BlockQ8_K};
    use crate::kernels::blocks::kquant::scales_mins;
    use std::arch::x86_64::*;

    use crate::kernels::fp16::f16_to_f32 as h2f;
    use crate::kernels::simd::x86::{hsum8_avx2, load256};
    use crate::kernels::simd::StreamPrefetch;

    /// `_mm256_madd_epi16(maddubs(q, y), scales)`: 8 lanes of scaled 4-byte sums.
    #[inline(always)]
    fn mul_scale(q: __m256i, y: __m256i, scales: __m256i) -> __m256i {
        // SAFETY: AVX2; every caller is compiled with AVX2 enabled. maddubs cannot saturate:
        // quants are below 64 and |y| <= 127, so a pair sums to at most 2 * 63 * 127.
        unsafe { _mm256_madd_epi16(_mm256_maddubs_epi16(q, y), scales) }
    }

    /// The 8 integer lanes of a Q4_K (`HIGH` = false) or Q5_K super-block: quants times
    /// activations, each 32-quant sub-block scaled by its scale.
    ///
    /// # Safety
    /// AVX2.
    #[inline(always)]
    unsafe fn q45k_lanes<const HIGH: bool>(
        qs: &[u8; 128],
        qh: &[u8; 32],
        y: &[i8; 256],
        sc: &[u8; 8],
    ) -> __m256i {
        // SAFETY: AVX2 as promised; loads inside `qs` (4 x 32), `qh` (32) and `y` (8 x 32).
        unsafe {
            let m4 = _mm256_set1_epi8(0x0F);
            let hbits = load256(qh.as_ptr());
            // Q4_K: the 8 scales as i16 in both halves, broadcast per sub-block by a byte
            // shuffle (cheaper than a `set1` from a general register each). Q5_K keeps the
            // `set1`s: with its high bits live, the shuffle indices cost registers (measured
            // slower with `cargo bench -p rgml-cpu`).
            let sc16 = _mm_cvtepu8_epi16(_mm_loadl_epi64(sc.as_ptr().cast()));
            let sc16 = _mm256_broadcastsi128_si256(sc16);
            let scale = |k: usize| {
                if HIGH {
                    return _mm256_set1_epi16(i16::from(sc[k]));
                }
                let k = k as i16;
                _mm256_shuffle_epi8(sc16, _mm256_set1_epi16(((2 * k + 1) << 8) | (2 * k)))
            };
            let mut sumi = _mm256_setzero_si256();
            for j in 0..4 {
                let bits = load256(qs.as_ptr().add(32 * j));
                let mut lo = _mm256_and_si256(bits, m4);
                let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4);
                if HIGH {
                    // Bit 2j of each qh byte is quant 64j + b's fifth bit, bit 2j + 1 that of
                    // quant 64j + 32 + b.
                    let shift = _mm_cvtsi32_si128(2 * j as i32);
                    let h = _mm256_srl_epi16(hbits, shift);
                    let one = _mm256_set1_epi8(1);
                    lo = _mm256_or_si256(lo, _mm256_slli_epi16::<4>(_mm256_and_si256(h, one)));
                    let h1 = _mm256_and_si256(_mm256_srli_epi16::<1>(h), one);
                    hi = _mm256_or_si256(hi, _mm256_slli_epi16::<4>(h1));
                }
                let y0 = load256(y.as_ptr().add(64 * j).cast());
                let y1 = load256(y.as_ptr().add(64 * j + 32).cast());
                let (s0, s1) = (scale(2 * j), scale(2 * j + 1));
                let p = _mm256_add_epi32(mul_scale(lo, y0, s0), mul_scale(hi, y1, s1));
                sumi = _mm256_add_epi32(sumi, p);
            }
            sumi
        }
    }

    /// The mins' products in 4 i32 lanes (see `min_lanes`).
    ///
    /// # Safety
    /// AVX2.
    #[inline(always)]
    unsafe fn min_lanes(m: &[u8; 8], bsums: &[i16; 16]) -> __m128i {
        // SAFETY: AVX2 as promised; 32 bytes of `bsums`, 8 of `m`.
        unsafe {
            let b = load256(bsums.as_ptr().cast());
            let pairs = _mm_hadd_epi16(_mm256_castsi256_si128(b), _mm256_extracti128_si256::<1>(b));
            let mins = _mm_cvtepu8_epi16(_mm_loadl_epi64(m.as_ptr().cast()));
            _mm_madd_epi16(mins, pairs)
        }
    }

    /// `STREAM`: `x` is a weight row streamed from memory, prefetched ahead of the reads
    /// (matrix-vector products).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn dot_q4_k<const STREAM: bool>(x: &[BlockQ4_K], y: &[BlockQ8_K]) -> f32 {
        let mut stream = StreamPrefetch::new(x.as_ptr().cast());
        let mut acc = _mm256_setzero_ps();
        let mut acc_m = _mm_setzero_ps();
        let no_high = [0u8; 32];
        for (bx, by) in x.iter().zip(y) {
            if STREAM {
                stream.step(std::ptr::from_ref(bx).cast());
            }
            let d = by.d * h2f(bx.d);
            let dmin = -by.d * h2f(bx.dmin);
            let (sc, m) = scales_mins(&bx.scales);
            // SAFETY: AVX2, FMA (this function's features).
            unsafe {
                let prod = _mm_cvtepi32_ps(min_lanes(&m, &by.bsums));
                acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), prod, acc_m);
                let sumi = q45k_lanes::<false>(&bx.qs, &no_high, &by.qs, &sc);
                acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
            }
        }
        let acc_m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
        let acc_m = _mm_add_ss(acc_m, _mm_movehdup_ps(acc_m));
        hsum8_avx2(acc) + _mm_cvtss_f32(acc_m)
    }

    /// `STREAM`: `x` is a weight row streamed from memory, prefetched ahead of the reads
    /// (matrix-vector products).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn dot_q5_k<const STREAM: bool>(x: &[BlockQ5_K], y: &[BlockQ8_K]) -> f32 {
        let mut stream = StreamPrefetch::new(x.as_ptr().cast());
        let mut acc = _mm256_setzero_ps();
        let mut summs = 0f32;
        for (bx, by) in x.iter().zip(y) {
            if STREAM {
                stream.step(std::ptr::from_ref(bx).cast());
            }
            let d = by.d * h2f(bx.d);
            let dmin = -by.d * h2f(bx.dmin);
            let (sc, m) = scales_mins(&bx.scales);
            // SAFETY: AVX2, FMA (this function's features).
            unsafe {
                let p = min_lanes(&m, &by.bsums);
                let p = _mm_add_epi32(p, _mm_unpackhi_epi64(p, p));
                let mins = _mm_cvtsi128_si32(_mm_add_epi32(p, _mm_srli_epi64::<32>(p)));
                summs = dmin.mul_add(mins as f32, summs);
                let sumi = q45k_lanes::<true>(&bx.qs, &bx.qh, &by.qs, &sc);
                acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
            }
        }
        hsum8_avx2(acc) + summs
    }

    /// The 8 integer lanes of a Q6_K super-block, `- 32` included.
    ///
    /// # Safety
    /// AVX2.
    #[inline(always)]
    pub(crate) unsafe fn q6k_lanes(x: &BlockQ6_K, y: &[i8; 256]) -> __m256i {
        // SAFETY: AVX2 as promised; loads inside `x.ql` (4 x 32), `x.qh` (2 x 32),
        // `x.scales` (16), `y.qs` (8 x 32).
        unsafe {
            let (m3, m15) = (_mm256_set1_epi8(3), _mm256_set1_epi8(15));
            let scales = _mm_loadu_si128(x.scales.as_ptr().cast());
            let mut sumi = _mm256_setzero_si256();
            for j in 0..2 {
                let b1 = load256(x.ql.as_ptr().add(64 * j));
                let b2 = load256(x.ql.as_ptr().add(64 * j + 32));
                let bh = load256(x.qh.as_ptr().add(32 * j));
                let h = [
                    _mm256_slli_epi16::<4>(_mm256_and_si256(bh, m3)),
                    _mm256_slli_epi16::<2>(_mm256_and_si256(bh, _mm256_set1_epi8(12))),
                    _mm256_and_si256(bh, _mm256_set1_epi8(48)),
                    _mm256_srli_epi16::<2>(_mm256_and_si256(bh, _mm256_set1_epi8(-64))),
                ];
                let lo = [
                    _mm256_and_si256(b1, m15),
                    _mm256_and_si256(b2, m15),
                    _mm256_and_si256(_mm256_srli_epi16::<4>(b1), m15),
                    _mm256_and_si256(_mm256_srli_epi16::<4>(b2), m15),
                ];
                for t in 0..4 {
                    let q = _mm256_or_si256(lo[t], h[t]);
                    let c = 4 * j + t;
                    let yv = load256(y.as_ptr().add(32 * c).cast());
                    // Scales 2c (bytes 0..16) and 2c + 1 (bytes 16..32), as i16: ggml's
                    // `get_scale_shuffle` then a sign extension.
                    let pick = 0x0101_0101_0101_0101i64 * (2 * c as i64);
                    let pick = _mm_set_epi64x(pick + 0x0101_0101_0101_0101, pick);
                    let s = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, pick));
                    sumi = _mm256_add_epi32(sumi, mul_scale(q, yv, s));
                }
            }
            sumi
        }
    }

    /// `q6k_offset_lanes` with AVX2.
    ///
    /// # Safety
    /// AVX2.
    #[inline(always)]
    pub(crate) unsafe fn q6k_offset(x: &BlockQ6_K, y: &BlockQ8_K) -> __m256i {
        // SAFETY: AVX2 as promised; 16 scale bytes, 32 bsum bytes.
        unsafe {
            let scales = _mm256_cvtepi8_epi16(_mm_loadu_si128(x.scales.as_ptr().cast()));
            let bsums = load256(y.bsums.as_ptr().cast());
            _mm256_slli_epi32::<5>(_mm256_madd_epi16(bsums, scales))
        }
    }

    /// `STREAM`: `x` is a weight row streamed from memory, prefetched ahead of the reads
    /// (matrix-vector products).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn dot_q6_k<const STREAM: bool>(x: &[BlockQ6_K], y: &[BlockQ8_K]) -> f32 {
        let mut stream = StreamPrefetch::new(x.as_ptr().cast());
        let mut acc = _mm256_setzero_ps();
        for (bx, by) in x.iter().zip(y) {
            if STREAM {
                stream.step(std::ptr::from_ref(bx).cast());
            }
            let d = by.d * h2f(bx.d);
            // SAFETY: AVX2, FMA (this function's features).
            unsafe {
                let sumi = _mm256_sub_epi32(q6k_lanes(bx, &by.qs), q6k_offset(bx, by));
                acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
            }
        }
        hsum8_avx2(acc)
    }
}

#[cfg(test)]
mod tests {
    use crate::kernels::blocks::kquant::scales_mins;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use rgml::quant::scale_min_k4;

    /// The word-wise unpacking equals `scale_min_k4` byte by byte on random scale bytes.
    #[test]
    fn scales_mins_equal_scale_min_k4() {
        let mut rng = StdRng::seed_from_u64(3);
        for _ in 0..10_000 {
            let q: [u8; 12] = std::array::from_fn(|_| rng.gen());
            let (sc, m) = scales_mins(&q);
            for j in 0..8 {
                assert_eq!((sc[j], m[j]), scale_min_k4(j, &q), "{q:?} {j}");
            }
        }
    }
}
