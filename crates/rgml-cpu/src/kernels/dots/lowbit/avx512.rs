//! The codebook-nibble dots (IQ4_NL, MXFP4 · Q8_0) with AVX-512 VNNI: ggml's AVX2 arithmetic
//! two blocks per instruction.
//!
//! ggml's AVX2 `vec_dot` (which its AVX-512 builds run too) takes blocks in pairs: each block's
//! eight int32 lanes (lane `k` sums the products of bytes `4k..4k+4`) are converted and added
//! by one FMA into an accumulator of its own, even blocks into one and odd into the other.
//! Here a 512-bit register holds both: lanes 0-7 are the even block's and the even
//! accumulator, lanes 8-15 the odd one's, so the FMAs and the final horizontal sum are ggml's.
//! The lanes' integer sums come from one `vpdpbusd` of the codebook values' magnitudes and
//! the activations carrying their signs, which gives ggml's `maddubs`/`madd` sums exactly (no
//! product pair reaches `maddubs`' saturation: |value| <= 127 and |activation| <= 127).

use crate::kernels::blocks::lowbit::NibbleBlock;
use crate::kernels::dots::run::RowRun;
use crate::kernels::fp16;
use crate::kernels::simd::x86::hsum8_avx2;
use crate::kernels::simd::StreamPrefetch;
use rgml::quant::BlockQ8_0;
use std::arch::x86_64::*;
use std::mem::size_of;

/// The 32 codebook values of two blocks' index bytes at `pa` and `pb`: 128-bit lanes [a's low
/// nibbles, a's high nibbles, b's low, b's high] (ggml's byte order of each block).
///
/// # Safety
/// AVX-512 F and BW; 16 readable bytes at `pa` and at `pb`.
#[inline(always)]
unsafe fn pair_values(table: __m512i, pa: *const u8, pb: *const u8) -> __m512i {
    // SAFETY: as the caller promises; the loads are unaligned.
    unsafe {
        let a = _mm_loadu_si128(pa.cast());
        let b = _mm_loadu_si128(pb.cast());
        let ab = _mm512_castsi256_si512(_mm256_set_m128i(b, a));
        let aabb = _mm512_shuffle_i64x2::<0b01_01_00_00>(ab, ab);
        let shifts = _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0);
        let idx = _mm512_and_si512(_mm512_srlv_epi64(aabb, shifts), _mm512_set1_epi8(0x0f));
        _mm512_shuffle_epi8(table, idx)
    }
}

/// The paired part of the nibble dot for `R` weight rows of `B` at `x` (`nb` blocks each, the
/// first `2 * (nb / 2)` used) and the Q8_0 row at `y`, into `out` (see the module docs).
/// `STREAM`: each row is a prefetched stream (matrix-vector products).
///
/// # Safety
/// AVX-512 F, DQ, BW, VL and VNNI, with AVX2, FMA and F16C; `x[r]` and `y` hold `nb` blocks;
/// `out` holds `R`.
#[inline(always)]
unsafe fn nibble_rows<B: NibbleBlock, const R: usize, const STREAM: bool>(
    nb: usize,
    x: [*const u8; R],
    y: *const u8,
    out: &mut [f32],
) {
    let (xb, yb) = (size_of::<B>(), size_of::<BlockQ8_0>());
    // SAFETY: the caller's features; blocks i, i + 1 < nb of each row and of `y` (the caller's
    // promise): a Q8_0 block's f16 scale at offset 0 and quants at offset 2, a `B`'s scale at
    // offset 0 and indices at `B::QS`.
    unsafe {
        let table = _mm512_broadcast_i32x4(_mm_loadu_si128(B::CODEBOOK.as_ptr().cast()));
        let zero = _mm512_setzero_si512();
        let mut streams: [StreamPrefetch; R] = std::array::from_fn(|r| StreamPrefetch::new(x[r]));
        let mut acc = [_mm512_setzero_ps(); R];
        for i in (0..nb - nb % 2).step_by(2) {
            let (py0, py1) = (y.add(i * yb), y.add((i + 1) * yb));
            let (dy0, dy1) = (fp16::h2f(py0), fp16::h2f(py1));
            let ya = _mm256_loadu_si256(py0.add(2).cast());
            let yv = _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(ya),
                _mm256_loadu_si256(py1.add(2).cast()),
            );
            for ((acc, &xr), stream) in acc.iter_mut().zip(&x).zip(&mut streams) {
                let (px0, px1) = (xr.add(i * xb), xr.add((i + 1) * xb));
                if STREAM {
                    stream.step(px0);
                }
                let v = pair_values(table, px0.add(B::QS), px1.add(B::QS));
                let signed_y = _mm512_mask_sub_epi8(yv, _mm512_movepi8_mask(v), zero, yv);
                let p = _mm512_dpbusd_epi32(zero, _mm512_abs_epi8(v), signed_y);
                let d0 = _mm512_set1_ps(dy0 * B::scale_at(px0));
                let d = _mm512_insertf32x8::<1>(d0, _mm256_set1_ps(dy1 * B::scale_at(px1)));
                *acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(p), *acc);
            }
        }
        for (o, acc) in out.iter_mut().zip(&acc) {
            let (even, odd) = (
                _mm512_castps512_ps256(*acc),
                _mm512_extractf32x8_ps::<1>(*acc),
            );
            *o = hsum8_avx2(_mm256_add_ps(even, odd));
        }
    }
}

/// [`nibble_rows`] for one row (the blocks given: an even number).
///
/// # Safety
/// The CPU must support AVX-512 F, DQ, BW, VL and VNNI, AVX2, FMA and F16C.
#[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn dot_nibble_pairs<B: NibbleBlock>(x: &[B], y: &[BlockQ8_0]) -> f32 {
    let nb = x.len().min(y.len());
    let mut out = [0f32];
    // SAFETY: this function's features; `nb` blocks in each slice.
    unsafe { nibble_rows::<B, 1, false>(nb, [x.as_ptr().cast()], y.as_ptr().cast(), &mut out) };
    out[0]
}

/// [`dot_nibble_pairs`] of each weight row of `run` over its first `2 * (nb / 2)` blocks and
/// the activation row, into `out[r]`: two row streams per pass share the activation loads
/// (`row_streams`).
///
/// # Safety
/// As [`dot_nibble_pairs`]; the run's `out.len()` rows hold `nb` blocks of `B` each and `y`
/// holds `nb` Q8_0 blocks.
#[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn matvec_nibble_pairs<B: NibbleBlock>(run: RowRun, out: &mut [f32]) {
    // SAFETY: the caller's promises, which `nibble_rows` needs for each pair and the last row.
    unsafe { row_streams!(nibble_rows, B, run, out) }
}

/// Activation rows prepared for [`NibbleCols::row`]: per block pair and row, the two blocks'
/// 64 quants (one register) and their scales as the pair's lanes take them (`[d0; 8]`,
/// `[d1; 8]`), so many weight rows reuse them.
pub(crate) struct NibbleCols {
    quants: Vec<__m512i>,
    scales: Vec<__m512>,
    cols: usize,
    pairs: usize,
}

impl NibbleCols {
    /// The first `2 * (nb / 2)` blocks of the Q8_0 rows at `ys`.
    ///
    /// # Safety
    /// AVX-512 F and DQ, AVX2 and F16C; each of `ys` holds `nb` Q8_0 blocks.
    #[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl,avx2,fma,f16c")]
    pub(crate) unsafe fn new(nb: usize, ys: &[*const u8]) -> NibbleCols {
        let (pairs, yb) = (nb / 2, size_of::<BlockQ8_0>());
        let mut quants = Vec::with_capacity(pairs * ys.len());
        let mut scales = Vec::with_capacity(pairs * ys.len());
        for p in 0..pairs {
            for &y in ys {
                // SAFETY: blocks 2p and 2p + 1 of the row (the caller's promise).
                unsafe {
                    let (py0, py1) = (y.add(2 * p * yb), y.add((2 * p + 1) * yb));
                    let lo = _mm256_loadu_si256(py0.add(2).cast());
                    let hi = _mm256_loadu_si256(py1.add(2).cast());
                    quants.push(_mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi));
                    let d0 = _mm512_set1_ps(fp16::h2f(py0));
                    scales.push(_mm512_insertf32x8::<1>(d0, _mm256_set1_ps(fp16::h2f(py1))));
                }
            }
        }
        NibbleCols {
            quants,
            scales,
            cols: ys.len(),
            pairs,
        }
    }

    /// The paired part of the nibble dot of the weight row of `B` at `x` with every prepared
    /// row, into `out` (one per row): each product the bits of [`dot_nibble_pairs`].
    ///
    /// # Safety
    /// The CPU features of [`dot_nibble_pairs`]; `x` holds `2 * pairs` blocks of `B`; `out`
    /// holds the prepared rows' count.
    #[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(crate) unsafe fn row<B: NibbleBlock>(&self, x: *const u8, out: &mut [f32]) {
        // Each weight block pair is decoded once per call of `cols`, so as many columns as
        // the registers hold share it (16 against 4: gpt-oss-20b's pp256 25.4 -> 28.9 tok/s).
        let mut first = 0;
        let mut rest = out;
        macro_rules! runs {
            ($c:literal) => {
                let mut chunks = rest.chunks_exact_mut($c);
                for o in &mut chunks {
                    // SAFETY: as the caller promises; columns `first..first + $c` exist.
                    unsafe { self.cols::<B, $c>(x, first, o) };
                    first += $c;
                }
                rest = chunks.into_remainder();
            };
        }
        runs!(16);
        runs!(8);
        runs!(4);
        runs!(1);
        let _ = (rest, first);
    }

    /// [`Self::row`] for the `C` prepared rows from `first`.
    ///
    /// # Safety
    /// As [`Self::row`]; `first + C <= cols`; `out` holds `C`.
    #[inline(always)]
    unsafe fn cols<B: NibbleBlock, const C: usize>(
        &self,
        x: *const u8,
        first: usize,
        out: &mut [f32],
    ) {
        let xb = size_of::<B>();
        // SAFETY: the caller's features and bounds; the prepared vectors hold `pairs * cols`
        // entries.
        unsafe {
            let table = _mm512_broadcast_i32x4(_mm_loadu_si128(B::CODEBOOK.as_ptr().cast()));
            let zero = _mm512_setzero_si512();
            let mut acc = [_mm512_setzero_ps(); C];
            for p in 0..self.pairs {
                let (px0, px1) = (x.add(2 * p * xb), x.add((2 * p + 1) * xb));
                let v = pair_values(table, px0.add(B::QS), px1.add(B::QS));
                let (negative, magnitude) = (_mm512_movepi8_mask(v), _mm512_abs_epi8(v));
                let dx0 = _mm512_set1_ps(B::scale_at(px0));
                let dx = _mm512_insertf32x8::<1>(dx0, _mm256_set1_ps(B::scale_at(px1)));
                let at = p * self.cols + first;
                for (c, acc) in acc.iter_mut().enumerate() {
                    let yv = *self.quants.get_unchecked(at + c);
                    let signed_y = _mm512_mask_sub_epi8(yv, negative, zero, yv);
                    let s = _mm512_dpbusd_epi32(zero, magnitude, signed_y);
                    // ggml's `fp16(y.d) * scale(x)`, lane by lane.
                    let d = _mm512_mul_ps(*self.scales.get_unchecked(at + c), dx);
                    *acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(s), *acc);
                }
            }
            for (o, acc) in out.iter_mut().zip(&acc) {
                let (even, odd) = (
                    _mm512_castps512_ps256(*acc),
                    _mm512_extractf32x8_ps::<1>(*acc),
                );
                *o = hsum8_avx2(_mm256_add_ps(even, odd));
            }
        }
    }
}
