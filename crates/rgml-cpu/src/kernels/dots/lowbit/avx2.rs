//! The low-bit dots with AVX2 intrinsics, in ggml's order where it matters (the float
//! operations; the integer lanes are exact whatever computes them).

use crate::kernels::blocks::lowbit::{iq4xs_scales, nibble_values_avx2, q3k_scales, NibbleBlock};
use crate::kernels::dots::run::RowRun;
use crate::kernels::simd::x86::{hsum8_avx2, load256, mul_add_i8};
use crate::kernels::simd::StreamPrefetch;
use rgml::quant::{BlockIQ4_XS, BlockQ2_K, BlockQ3_K, BlockQ8_0, BlockQ8_K};
use rgml::quant::{KVALUES_IQ4NL, QK_K};
use std::arch::x86_64::*;
use std::mem::size_of;

use crate::kernels::fp16;
use crate::kernels::fp16::f16_to_f32 as h2f;

/// The madd operand scaling bytes 0..16 of chunk `c` by scale `2c` and bytes 16..32 by
/// scale `2c + 1` of the 16 signed byte scales in `sc`: ggml's `get_scale_shuffle` and a sign
/// extension (a `set1` per scale from a general register costs several times more).
///
/// # Safety
/// AVX2.
#[inline(always)]
unsafe fn scale_pair(sc: __m128i, c: usize) -> __m256i {
    const ONES: i64 = 0x0101_0101_0101_0101;
    let pick = ONES * (2 * c as i64);
    // SAFETY: AVX2 as promised.
    unsafe { _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc, _mm_set_epi64x(pick + ONES, pick))) }
}

/// The 2-bit field `t` (bits `2t..2t + 2`) of every byte.
///
/// # Safety
/// AVX2.
#[inline(always)]
unsafe fn field2(bits: __m256i, t: i32) -> __m256i {
    // SAFETY: AVX2 as promised. The 16-bit shift moves no set bit across a byte that survives
    // the mask.
    unsafe {
        let shifted = _mm256_srl_epi16(bits, _mm_cvtsi32_si128(2 * t));
        _mm256_and_si256(shifted, _mm256_set1_epi8(3))
    }
}

/// `STREAM`: `x` is a weight row streamed from memory, prefetched ahead of the reads.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_q2_k<const STREAM: bool>(x: &[BlockQ2_K], y: &[BlockQ8_K]) -> f32 {
    let mut stream = StreamPrefetch::new(x.as_ptr().cast());
    let mut acc = _mm256_setzero_ps();
    for (bx, by) in x.iter().zip(y) {
        if STREAM {
            stream.step(std::ptr::from_ref(bx).cast());
        }
        let d = by.d * h2f(bx.d);
        let dmin = -by.d * h2f(bx.dmin);
        // SAFETY: AVX2, FMA (this function's features); loads inside the blocks (16 scale
        // bytes, 32 bsum bytes, 2 x 32 quant bytes, 8 x 32 activation bytes).
        unsafe {
            let packed = _mm_loadu_si128(bx.scales.as_ptr().cast());
            let sc = _mm_and_si128(packed, _mm_set1_epi8(0x0F));
            let mins8 = _mm_and_si128(_mm_srli_epi16::<4>(packed), _mm_set1_epi8(0x0F));
            let bsums = load256(by.bsums.as_ptr().cast());
            let prod = _mm256_madd_epi16(_mm256_cvtepi8_epi16(mins8), bsums);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(prod), acc);
            let mut sumi = _mm256_setzero_si256();
            for h in 0..2 {
                let bits = load256(bx.qs.as_ptr().add(32 * h));
                for t in 0..4 {
                    let c = 4 * h + t;
                    let yv = load256(by.qs.as_ptr().add(32 * c).cast());
                    let p = _mm256_maddubs_epi16(field2(bits, t as i32), yv);
                    let s = scale_pair(sc, c);
                    sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, s));
                }
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
    }
    hsum8_avx2(acc)
}

/// `STREAM`: `x` is a weight row streamed from memory, prefetched ahead of the reads.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_q3_k<const STREAM: bool>(x: &[BlockQ3_K], y: &[BlockQ8_K]) -> f32 {
    let mut stream = StreamPrefetch::new(x.as_ptr().cast());
    let mut acc = _mm256_setzero_ps();
    for (bx, by) in x.iter().zip(y) {
        if STREAM {
            stream.step(std::ptr::from_ref(bx).cast());
        }
        let d = by.d * h2f(bx.d);
        let sc = q3k_scales(bx);
        // SAFETY: AVX2, FMA (this function's features); loads inside the blocks and of the 16
        // local scales `sc`.
        unsafe {
            let sc = _mm_loadu_si128(sc.as_ptr().cast());
            let hbits = load256(bx.hmask.as_ptr());
            let four = _mm256_set1_epi8(4);
            let mut sumi = _mm256_setzero_si256();
            for h in 0..2 {
                let bits = load256(bx.qs.as_ptr().add(32 * h));
                for t in 0..4 {
                    let c = 4 * h + t;
                    let yv = load256(by.qs.as_ptr().add(32 * c).cast());
                    // Chunk c's third bits are bit c of the hmask bytes; a clear bit means -4.
                    let bit = _mm256_set1_epi8(1 << c);
                    let clear =
                        _mm256_cmpeq_epi8(_mm256_and_si256(hbits, bit), _mm256_setzero_si256());
                    let minus = _mm256_maddubs_epi16(_mm256_and_si256(clear, four), yv);
                    let plus = _mm256_maddubs_epi16(field2(bits, t as i32), yv);
                    let p = _mm256_sub_epi16(plus, minus);
                    let s = scale_pair(sc, c);
                    sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, s));
                }
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
    }
    hsum8_avx2(acc)
}

/// [`dot_nibble_pairs`] of each weight row of `run` over its first `2 * (nb / 2)` blocks and
/// the activation row, into `out[r]`: two row streams per pass share the activation loads
/// (`row_streams`).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; the run's `out.len()` rows hold `nb` blocks of `B`
/// each and `y` holds `nb` Q8_0 blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn matvec_nibble_pairs<B: NibbleBlock>(run: RowRun, out: &mut [f32]) {
    // SAFETY: the caller's promises, which `nibble_rows` needs for each pair and the last row.
    unsafe { row_streams!(nibble_rows, B, run, out) }
}

/// The paired part of `dot_nibble_q8_0` for `R` weight rows of `B` at `x` (`nb` blocks each,
/// the first `2 * (nb / 2)` used) and the Q8_0 row at `y`: per row, even blocks into one
/// accumulator, odd ones into another, added before the horizontal sum. Rows share the
/// activation loads. `STREAM`: each row is a prefetched stream (matrix-vector products).
///
/// # Safety
/// AVX2, FMA and F16C; `x[r]` and `y` hold `nb` blocks; `out` holds `R`.
#[inline(always)]
unsafe fn nibble_rows<B: NibbleBlock, const R: usize, const STREAM: bool>(
    nb: usize,
    x: [*const u8; R],
    y: *const u8,
    out: &mut [f32],
) {
    let (xb, yb) = (size_of::<B>(), size_of::<BlockQ8_0>());
    // SAFETY: the caller's features; blocks below `nb` of each row and of `y` (the caller's
    // promise): a Q8_0 block's f16 scale at offset 0 and quants at offset 2, a `B`'s scale at
    // offset 0 and indices at `B::QS`.
    unsafe {
        let mut streams: [StreamPrefetch; R] = std::array::from_fn(|r| StreamPrefetch::new(x[r]));
        // Even and odd blocks' accumulators as two arrays indexed by the row only (an index
        // that changes with the block kept them in memory, a store and a load per block).
        let mut even = [_mm256_setzero_ps(); R];
        let mut odd = [_mm256_setzero_ps(); R];
        // The blocks by pointers that step (no index arithmetic per block), each stream's
        // prefetch asked once per pair of blocks.
        let (mut px, mut py) = (x, y);
        for _ in 0..nb / 2 {
            if STREAM {
                for (stream, &p) in streams.iter_mut().zip(&px) {
                    stream.step(p.add(xb));
                }
            }
            nibble_block_rows::<B, R>(px, py, &mut even);
            nibble_block_rows::<B, R>(px.map(|p| p.add(xb)), py.add(yb), &mut odd);
            px = px.map(|p| p.add(2 * xb));
            py = py.add(2 * yb);
        }
        for ((o, e), d) in out.iter_mut().zip(&even).zip(&odd) {
            *o = hsum8_avx2(_mm256_add_ps(*e, *d));
        }
    }
}

/// Block `px[r]` of each of [`nibble_rows`]' rows against the Q8_0 block at `py`, added into
/// the rows' accumulators `acc`: `d_y * d_x` times the block's integer sum, one FMA.
///
/// # Safety
/// AVX2, FMA and F16C; the blocks at `px` and `py` are in bounds.
#[inline(always)]
unsafe fn nibble_block_rows<B: NibbleBlock, const R: usize>(
    px: [*const u8; R],
    py: *const u8,
    acc: &mut [__m256; R],
) {
    // SAFETY: the caller's features and bounds: a Q8_0 block's f16 scale at offset 0 and
    // quants at offset 2, a `B`'s scale at offset 0 and indices at `B::QS`.
    unsafe {
        let dy = fp16::h2f(py);
        let yv = load256(py.add(2));
        for (acc, &px) in acc.iter_mut().zip(&px) {
            let d = dy * B::scale_at(px);
            let v = nibble_values_avx2(&B::CODEBOOK, px.add(B::QS));
            let p = _mm256_madd_epi16(mul_add_i8(v, yv), _mm256_set1_epi16(1));
            *acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(p), *acc);
        }
    }
}

/// Activation rows [`nibble_cols`] takes at once: each weight block decoded once for them.
const NIBBLE_COLS: usize = 4;

/// [`dot_nibble_pairs`] of the weight row at `x` (`nb` blocks of `B`, the first
/// `2 * (nb / 2)` used) with each Q8_0 row of `ys`, into `out` (one value per row of `ys`):
/// the rows [`NIBBLE_COLS`] at a time, each weight block decoded once for them.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `x` and each of `ys` hold `nb` blocks; `out` is as
/// long as `ys`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn nibble_cols_pairs<B: NibbleBlock>(
    nb: usize,
    x: *const u8,
    ys: &[*const u8],
    out: &mut [f32],
) {
    for (y, o) in ys.chunks(NIBBLE_COLS).zip(out.chunks_mut(NIBBLE_COLS)) {
        // SAFETY: the caller's promises, for these rows.
        unsafe {
            match *y {
                [a, b, c, d] => nibble_cols::<B, 4>(nb, x, [a, b, c, d], o),
                [a, b, c] => nibble_cols::<B, 3>(nb, x, [a, b, c], o),
                [a, b] => nibble_cols::<B, 2>(nb, x, [a, b], o),
                _ => nibble_cols::<B, 1>(nb, x, [y[0]], o),
            }
        }
    }
}

/// [`nibble_cols_pairs`] for `C` activation rows: per row, even blocks into one accumulator,
/// odd ones into another, added before the horizontal sum, as [`dot_nibble_pairs`] does.
///
/// # Safety
/// AVX2, FMA and F16C; `x` and each of `y` hold `nb` blocks; `out` holds `C`.
#[inline(always)]
unsafe fn nibble_cols<B: NibbleBlock, const C: usize>(
    nb: usize,
    x: *const u8,
    y: [*const u8; C],
    out: &mut [f32],
) {
    // SAFETY: the caller's features and bounds.
    unsafe {
        let mut even = [_mm256_setzero_ps(); C];
        let mut odd = [_mm256_setzero_ps(); C];
        for i in (0..nb - nb % 2).step_by(2) {
            nibble_block_cols::<B, C>(i, x, y, &mut even);
            nibble_block_cols::<B, C>(i + 1, x, y, &mut odd);
        }
        for ((o, e), d) in out.iter_mut().zip(&even).zip(&odd) {
            *o = hsum8_avx2(_mm256_add_ps(*e, *d));
        }
    }
}

/// Block `i` of the weight row at `x`, decoded once, against block `i` of each activation row
/// of `y`, added into their accumulators `acc` as [`nibble_block_rows`] adds one.
///
/// # Safety
/// AVX2, FMA and F16C; block `i` of `x` and of every row of `y` is in bounds.
#[inline(always)]
unsafe fn nibble_block_cols<B: NibbleBlock, const C: usize>(
    i: usize,
    x: *const u8,
    y: [*const u8; C],
    acc: &mut [__m256; C],
) {
    // SAFETY: the caller's features and bounds: a Q8_0 block's f16 scale at offset 0 and
    // quants at offset 2, a `B`'s scale at offset 0 and indices at `B::QS`.
    unsafe {
        let px = x.add(i * size_of::<B>());
        let dx = B::scale_at(px);
        let v = nibble_values_avx2(&B::CODEBOOK, px.add(B::QS));
        for (acc, &yr) in acc.iter_mut().zip(&y) {
            let py = yr.add(i * size_of::<BlockQ8_0>());
            let d = fp16::h2f(py) * dx;
            let p = _mm256_madd_epi16(mul_add_i8(v, load256(py.add(2))), _mm256_set1_epi16(1));
            *acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(p), *acc);
        }
    }
}

/// `STREAM`: `x` is a weight row streamed from memory, prefetched ahead of the reads.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_iq4_xs<const STREAM: bool>(x: &[BlockIQ4_XS], y: &[BlockQ8_K]) -> f32 {
    let mut stream = StreamPrefetch::new(x.as_ptr().cast());
    let mut acc = _mm256_setzero_ps();
    for (bx, by) in x.iter().zip(y) {
        if STREAM {
            stream.step(std::ptr::from_ref(bx).cast());
        }
        let sc = iq4xs_scales(bx);
        // SAFETY: AVX2, FMA (this function's features); loads inside the blocks (8 x 16
        // quant bytes, 8 x 32 activation bytes).
        unsafe {
            let mut sumi = _mm256_setzero_si256();
            for (ib, &s) in sc.iter().enumerate().take(QK_K / 32) {
                let v = nibble_values_avx2(&KVALUES_IQ4NL, bx.qs.as_ptr().add(16 * ib));
                let yv = load256(by.qs.as_ptr().add(32 * ib).cast());
                let p = _mm256_madd_epi16(mul_add_i8(v, yv), _mm256_set1_epi16(i16::from(s)));
                sumi = _mm256_add_epi32(sumi, p);
            }
            let d = _mm256_set1_ps(h2f(bx.d) * by.d);
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
        }
    }
    hsum8_avx2(acc)
}

/// [`nibble_rows`] for one row (the blocks given: an even number).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_nibble_pairs<B: NibbleBlock>(x: &[B], y: &[BlockQ8_0]) -> f32 {
    let nb = x.len().min(y.len());
    let mut out = [0f32];
    // SAFETY: AVX2, FMA and F16C (this function's features); `nb` blocks in each slice.
    unsafe { nibble_rows::<B, 1, false>(nb, [x.as_ptr().cast()], y.as_ptr().cast(), &mut out) };
    out[0]
}
