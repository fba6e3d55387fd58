//! The batched K-quant products of [`super::kquant`] (Q2_K…Q6_K weights by 8 or more activation
//! rows) in AVX2 register tiles of 2 weight rows by 4 activation rows, with the same bits: the
//! kernel of CPUs without AVX-512 (`super::kquant_avx512` has the wider one).
//!
//! As there, both operands are in piece order ([`kquant::to_pieces`]: piece p holds elements
//! `4p..4p + 4` of every 16-element sub-block), so in the 32-byte half h of every piece, `maddubs`
//! lanes `2j, 2j + 1` hold products of sub-block `8h + j`. The products of one output are then
//! summed across pieces in i16 before one `madd` by the scales: all 4 pieces for quants below
//! 32 (8 products of at most 31 * 128 per lane), pairs of pieces for Q6_K's (at most 63 * 128).
//! That is 17 (19 for Q6_K) vector instructions per output and super-block instead of the
//! one-row kernel's 24 and its per-output reductions. The 8 outputs' lanes and their block-sum
//! products are summed by one tree, and the float steps run on the 8 outputs at once, in the
//! order of [`super::kquant`]'s module docs.

use super::kquant::{self, Decoded, Q2K, Q3K, Q4K, Q5K, Q6K, Q8K_BYTES};
use crate::kernels::isa::CpuFeatures;
use crate::kernels::simd::x86::hsum8x8_epi32;
use rgml::quant::QK_K;
use rgml::DType;
use std::arch::x86_64::*;

/// Weight rows per call.
pub(crate) const ROWS: usize = 2;

/// Activation rows per tile.
const TILE_COLS: usize = 4;

/// The most activation rows per call.
pub(crate) const COLS: usize = kquant::TILE_RUN;

/// Whether weights of `dtype` take these tiles with `rows` src1 rows on a CPU with `f`.
pub(crate) fn takes(f: CpuFeatures, dtype: DType, rows: usize) -> bool {
    f.has_avx2() && dtype != DType::IQ4_XS && kquant::takes(dtype, rows)
}

/// `out[c][r]` = the tiled product of weight row `x[r]` (`nb` blocks of `dtype`) and the Q8_K
/// activation row `y[c]`, for the `x.len()` (1..=2) rows and `y.len()` (1..=[`COLS`]) columns
/// (the other entries are overwritten with repeats).
///
/// # Safety
/// [`takes`] accepts `dtype` on this CPU; every `x[r]` points at `nb` readable blocks of
/// `dtype`, every `y[c]` at `nb` readable Q8_K blocks in piece order
/// ([`kquant::to_piece_order`]).
pub(crate) unsafe fn rows(
    dtype: DType,
    nb: usize,
    x: &[*const u8],
    y: &[*const u8],
    out: &mut [[f32; ROWS]; COLS],
) {
    let (Some(&last_x), Some(&last_y)) = (x.last(), y.last()) else {
        return;
    };
    // Short tiles repeat their last row or column.
    let xs: [*const u8; ROWS] = std::array::from_fn(|r| x.get(r).copied().unwrap_or(last_x));
    let ncols = y.len().min(COLS);
    let mut ys = [last_y; COLS];
    ys[..ncols].copy_from_slice(&y[..ncols]);
    let out = &mut out[..ncols.div_ceil(TILE_COLS) * TILE_COLS];
    macro_rules! go {
        ($k:ident) => {
            // SAFETY: `takes` checked the CPU (AVX2, FMA, F16C); the rows as promised by the
            // caller, padded with repeats of valid ones.
            unsafe { tiles::<$k>(nb, &xs, &ys, out) }
        };
    }
    match dtype {
        DType::Q4_K => go!(Q4K),
        DType::Q5_K => go!(Q5K),
        DType::Q6_K => go!(Q6K),
        DType::Q2_K => go!(Q2K),
        DType::Q3_K => go!(Q3K),
        _ => {}
    }
}

/// The two weight rows' blocks `b`, decoded and laid out for the tiles.
struct Strip {
    /// Scratch for one row's block in element order.
    w: Decoded,
    /// Each row's quants in piece order.
    q: [[u8; QK_K]; ROWS],
    /// Each row's scales for half h of a piece: lanes `2j, 2j + 1` hold sub-block `8h + j`'s.
    scales: [[[i16; 16]; 2]; ROWS],
    /// Each row's block-sum weights ([`Decoded::bsum_weights`]).
    bsum_weights: [[i16; 16]; ROWS],
    d0: [f32; ROWS],
    dmin0: [f32; ROWS],
}

impl Strip {
    /// Block `b` of the rows at `x`, decoded.
    ///
    /// # Safety
    /// Block `b` of every row is readable.
    #[inline(always)]
    unsafe fn load<const K: u8>(&mut self, x: &[*const u8; ROWS], b: usize) {
        for (r, &row) in x.iter().enumerate() {
            // SAFETY: block `b` of weight row `r`, as the caller promises.
            unsafe { self.w.load::<K>(row, b) };
            kquant::to_pieces(&self.w.q, &mut self.q[r]);
            for (h, half) in self.scales[r].iter_mut().enumerate() {
                for (l, lane) in half.iter_mut().enumerate() {
                    *lane = self.w.sub16[8 * h + l / 2];
                }
            }
            self.bsum_weights[r] = self.w.bsum_weights;
            self.d0[r] = self.w.d0;
            self.dmin0[r] = self.w.dmin0;
        }
    }
}

/// Tile after tile of 4 activation rows (columns `4t..4t + 4`), every weight block decoded once
/// for all of them; `out[c][r]` receives output (r, c) (the tile's lane `2c + r`).
///
/// # Safety
/// AVX2, FMA and F16C; `x` as [`rows`] promises, `y` rows in piece order, `out` whole tiles of
/// at most [`COLS`] columns.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tiles<const K: u8>(
    nb: usize,
    x: &[*const u8; ROWS],
    y: &[*const u8; COLS],
    out: &mut [[f32; ROWS]],
) {
    let mut s = Strip {
        w: Decoded::new(),
        q: [[0; QK_K]; ROWS],
        scales: [[[0; 16]; 2]; ROWS],
        bsum_weights: [[0; 16]; ROWS],
        d0: [0.0; ROWS],
        dmin0: [0.0; ROWS],
    };
    let mut sums = [_mm256_setzero_ps(); COLS / TILE_COLS];
    let sums = &mut sums[..out.len() / TILE_COLS];
    for b in 0..nb {
        // SAFETY: block `b < nb` of every weight row.
        unsafe { s.load::<K>(x, b) };
        for (t, sum) in sums.iter_mut().enumerate() {
            let cols: [*const u8; TILE_COLS] =
                std::array::from_fn(|c| y[TILE_COLS * t + c].wrapping_add(b * Q8K_BYTES));
            // SAFETY: AVX2/FMA (this function's features); block `b` of 4 activation rows.
            unsafe { *sum = tile_block::<K>(&s, &cols, *sum) };
        }
    }
    for (tile, sum) in out.chunks_exact_mut(TILE_COLS).zip(sums.iter()) {
        // SAFETY: AVX; 4 columns of 2 floats at `tile`.
        unsafe { _mm256_storeu_ps(tile.as_flattened_mut().as_mut_ptr(), *sum) };
    }
}

/// One tile's super-block: its integer sums, then the float steps into `acc` (lane `2c + r`).
///
/// # Safety
/// AVX2 and FMA; every `cols[c]` points at a readable Q8_K block in piece order.
#[inline(always)]
unsafe fn tile_block<const K: u8>(s: &Strip, cols: &[*const u8; TILE_COLS], acc: __m256) -> __m256 {
    // SAFETY: AVX2/FMA as promised; the loads stay inside the strip and the Q8_K blocks (qs at
    // 4..260, block sums at 260..292).
    unsafe {
        // ints[2c + r] and corr[2c + r]: output (r, c)'s partial sums.
        let mut ints = [_mm256_setzero_si256(); 2 * TILE_COLS];
        for h in 0..2 {
            let scales: [__m256i; ROWS] =
                std::array::from_fn(|r| _mm256_loadu_si256(s.scales[r][h].as_ptr().cast()));
            for (c, &col) in cols.iter().enumerate() {
                let y: [__m256i; 4] = std::array::from_fn(|p| {
                    _mm256_loadu_si256(col.add(4 + 64 * p + 32 * h).cast())
                });
                for r in 0..ROWS {
                    let q =
                        |p: usize| _mm256_loadu_si256(s.q[r].as_ptr().add(64 * p + 32 * h).cast());
                    let pair = |p: usize| _mm256_maddubs_epi16(q(p), y[p]);
                    let (lo, hi) = (
                        _mm256_add_epi16(pair(0), pair(1)),
                        _mm256_add_epi16(pair(2), pair(3)),
                    );
                    let scaled = if K == Q6K {
                        _mm256_add_epi32(
                            _mm256_madd_epi16(lo, scales[r]),
                            _mm256_madd_epi16(hi, scales[r]),
                        )
                    } else {
                        _mm256_madd_epi16(_mm256_add_epi16(lo, hi), scales[r])
                    };
                    ints[2 * c + r] = _mm256_add_epi32(ints[2 * c + r], scaled);
                }
            }
        }
        let corr: [__m256i; 2 * TILE_COLS] = std::array::from_fn(|i| {
            let (c, r) = (i / 2, i % 2);
            let bsums = _mm256_loadu_si256(cols[c].add(4 + QK_K).cast());
            _mm256_madd_epi16(bsums, _mm256_loadu_si256(s.bsum_weights[r].as_ptr().cast()))
        });
        let (dot, corr) = (hsum8x8_epi32(&ints), hsum8x8_epi32(&corr));
        let (s1, s2) = match K {
            Q6K => (_mm256_sub_epi32(dot, _mm256_slli_epi32::<5>(corr)), corr),
            Q3K => (_mm256_sub_epi32(dot, _mm256_slli_epi32::<2>(corr)), corr),
            _ => (dot, corr),
        };
        // Lane 2c + r: row r's scales, column c's.
        let by_row =
            |v: &[f32; ROWS]| _mm256_castpd_ps(_mm256_broadcast_sd(&*v.as_ptr().cast::<f64>()));
        let d1: [f32; TILE_COLS] = std::array::from_fn(|c| cols[c].cast::<f32>().read_unaligned());
        let by_col = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
        let d1 =
            _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(d1.as_ptr())), by_col);
        let mut res = _mm256_mul_ps(by_row(&s.d0), _mm256_cvtepi32_ps(s1));
        if kquant::has_min(K) {
            res = _mm256_fnmadd_ps(by_row(&s.dmin0), _mm256_cvtepi32_ps(s2), res);
        }
        _mm256_fmadd_ps(res, d1, acc)
    }
}

/// Multiply-adds per second of these tiles alone, 1 thread (on an AVX-512 CPU too, where
/// MUL_MAT takes the wider tiles): K 2048 by 256 weight rows by `ntok` activation rows, in the
/// loops MUL_MAT runs (`None` where they do not run).
pub(crate) fn bench_macs(dtype: DType, ntok: usize) -> Option<f64> {
    if !takes(CpuFeatures::detect(), dtype, kquant::MIN_ROWS) {
        return None;
    }
    let (nrows, nb) = (256, 2048 / QK_K);
    let (x, mut y, xrow, yrow) = kquant::bench_operands(dtype, nrows, ntok)?;
    for row in y.chunks_exact_mut(yrow) {
        kquant::to_piece_order(row).ok()?;
    }
    let mut out = [[0f32; ROWS]; COLS];
    let best = kquant::best_of_7(|| {
        for c0 in (0..ntok).step_by(COLS) {
            let cols: Vec<*const u8> = (c0..(c0 + COLS).min(ntok))
                .map(|c| y[c * yrow..].as_ptr())
                .collect();
            for r0 in (0..nrows).step_by(ROWS) {
                let x2: [*const u8; ROWS] = std::array::from_fn(|r| x[(r0 + r) * xrow..].as_ptr());
                // SAFETY: `takes` checked the CPU and type; 2 weight rows and up to 128 Q8_K
                // rows in piece order of `nb` blocks each.
                unsafe { rows(dtype, nb, &x2, &cols, &mut out) };
                std::hint::black_box(&out);
            }
        }
    });
    Some((2048 * ntok * nrows) as f64 / best)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Full and short tiles: [`kquant::row`]'s outputs bit for bit.
    #[test]
    fn tiles_equal_the_row_kernel() {
        if !CpuFeatures::detect().has_avx2() {
            eprintln!("no AVX2 here: the AVX2 K-quant tiles are not run");
            return;
        }
        let shapes = [(2, 23), (1, 8), (2, 5), (1, 1)];
        kquant::assert_tiles_equal_row("AVX2", 12, &shapes, |dtype, nb, x, y, out| {
            // SAFETY: the CPU has AVX2 (checked above); rows of `nb` blocks of their types,
            // the activations in piece order.
            unsafe { rows(dtype, nb, x, y, out) }
        });
    }
}
