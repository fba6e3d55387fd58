//! The batched K-quant products of [`super::kquant`] (Q2_K…Q6_K weights by 8 or more activation
//! rows) in AVX-512 register tiles of 4 weight rows by 4 activation rows, with the same bits.
//!
//! ggml's tiled kernel computes, per output and 256-element super-block, two exact integers
//! (`s1`, the sub-block-scaled quant products, and `s2`, the weighted activation block sums)
//! and then three float steps in block order ([`super::kquant`]'s module docs). Exact integers
//! can be computed in any order, so here:
//! - both operands are taken in piece order ([`kquant::to_pieces`]): each 64-byte piece holds
//!   4 elements of every 16-element sub-block, so a sub-block's products fall in the same
//!   lanes of every piece. The weights are reordered when decoded ([`to_pieces`], in
//!   registers), the activations by MUL_MAT's phase 1 ([`kquant::to_piece_order`]) or, for
//!   MUL_MAT_ID's routed rows, once per run of [`COLS`] rows ([`permute_activations`]);
//! - with VNNI, Q4_K, Q3_K and Q2_K weights (quants below 16) take `vpdpbusd`: 4 instructions
//!   per output give the 16 sub-block sums (each below 16 * 15 * 128, so i16), two outputs are
//!   packed into one register and one `madd` applies the scales: 5 instructions per output
//!   and block, and a tree over 8 registers ([`hsum8x2_epi32`]); Q5_K the same over 2 pieces
//!   at a time (8 * 31 * 128 fits i16): 6.5;
//! - Q6_K (and every type without VNNI) takes `maddubs` (unsigned quants by signed
//!   activations, pairs below 2 * 63 * 128, so never saturated) and `vpdpwssd` by the scales
//!   (`madd` and an add without VNNI) per piece: 8 per output and block, and a tree over 16
//!   registers ([`hsum16x16_epi32`]);
//! - the loads of a weight row's quants serve 4 activation rows and each activation load
//!   serves 4 weight rows; the result's lane `4c + r` is output (row r, column c), so a tile's
//!   16 outputs are stored as 4 columns of 4 rows;
//! - the block-sum products (`s2`, and the `- 32` / `- 4` corrections of Q6_K's and Q3_K's
//!   quants) come straight out in the same lanes: for each pair of the 16 block sums, one
//!   permute gathers every lane's block-sum pair beside the weight pairs, one `vpdpwssd` adds;
//! - the float steps run on the tile's 16 outputs at once, each lane with its own scales.
//!
//! IQ4_XS (signed codebook values: `maddubs` needs the sign trick, which AVX-512 has no
//! byte instruction for) keeps [`super::kquant::row`].
//!
//! About 2-3x [`super::kquant::row`]'s speed (`cargo bench -p rgml-cpu`, "K-quant kernel"
//! rows).

use super::kquant::{self, Decoded, Q2K, Q3K, Q4K, Q5K, Q6K, Q8K_BYTES};
use crate::kernels::isa::CpuFeatures;
use crate::kernels::simd::x86::{dpwssd_fused, hsum16x16_epi32, hsum8x2_epi32};
use rgml::quant::QK_K;
use rgml::DType;
use std::arch::x86_64::*;

/// Weight rows per tile (and per call).
pub(crate) const ROWS: usize = 4;

/// Activation rows per tile.
const TILE_COLS: usize = 4;

/// The most activation rows per call.
pub(crate) const COLS: usize = kquant::TILE_RUN;

/// Whether weights of `dtype` take these tiles with `rows` src1 rows on a CPU with `f`.
pub(crate) fn takes(f: CpuFeatures, dtype: DType, rows: usize) -> bool {
    f.has_avx512() && dtype != DType::IQ4_XS && kquant::takes(dtype, rows)
}

/// `out[c][r]` = the tiled product of weight row `x[r]` (`nb` blocks of `dtype`) and the Q8_K
/// activation row `y[c]`, for the `x.len()` (1..=4) rows and `y.len()` (1..=[`COLS`]) columns
/// (the other entries are overwritten with repeats).
///
/// # Safety
/// [`takes`] accepts `dtype` on this CPU; every `x[r]` points at `nb` readable blocks of
/// `dtype`, every `y[c]` at `nb` readable Q8_K blocks in piece order (MUL_MAT's phase 1,
/// [`kquant::to_piece_order`], or [`permute_activations`]).
pub(crate) unsafe fn rows(
    f: CpuFeatures,
    dtype: DType,
    nb: usize,
    x: &[*const u8],
    y: &[*const u8],
    out: &mut [[f32; ROWS]; COLS],
) {
    // SAFETY: as promised by the caller; VNNI only where the CPU has it.
    unsafe { rows_on(f.has_avx512_vnni(), dtype, nb, x, y, out) }
}

/// [`rows`], with `vpdpwssd` or without (the tests run both).
///
/// # Safety
/// As [`rows`], and the CPU has AVX-512 VNNI if `vnni`.
unsafe fn rows_on(
    vnni: bool,
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
    // A whole run is used as it is; a shorter one is padded (a copy per call of a full run
    // cost 3% of a prompt).
    let padded;
    let ys: &[*const u8; COLS] = match <&[*const u8; COLS]>::try_from(y) {
        Ok(whole) => whole,
        Err(_) => {
            let mut p = [last_y; COLS];
            p[..ncols].copy_from_slice(&y[..ncols]);
            padded = p;
            &padded
        }
    };
    let out = &mut out[..ncols.div_ceil(TILE_COLS) * TILE_COLS];
    macro_rules! go {
        ($k:ident) => {
            // SAFETY: the caller checked the CPU (AVX-512 F/BW/DQ/VL, VNNI if `vnni`); the
            // rows as promised by the caller, padded with repeats of valid ones.
            unsafe {
                if vnni {
                    tiles_vnni::<$k>(nb, &xs, ys, out)
                } else {
                    tiles_bw::<$k>(nb, &xs, ys, out)
                }
            }
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

/// [`tiles`] with `vpdpwssd`.
///
/// # Safety
/// As [`tiles`], on a CPU with AVX-512 F/BW/DQ/VL and VNNI.
#[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tiles_vnni<const K: u8>(
    nb: usize,
    x: &[*const u8; ROWS],
    y: &[*const u8; COLS],
    out: &mut [[f32; ROWS]],
) {
    // SAFETY: as promised by the caller.
    unsafe { tiles::<K, true>(nb, x, y, out) }
}

/// [`tiles`] with `madd` and an add.
///
/// # Safety
/// As [`tiles`], on a CPU with AVX-512 F/BW/DQ/VL.
#[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn tiles_bw<const K: u8>(
    nb: usize,
    x: &[*const u8; ROWS],
    y: &[*const u8; COLS],
    out: &mut [[f32; ROWS]],
) {
    // SAFETY: as promised by the caller.
    unsafe { tiles::<K, false>(nb, x, y, out) }
}

/// `acc + sum of each lane pair of a * b` (i16 pairs into i32 lanes).
///
/// # Safety
/// AVX-512 BW, and VNNI if `VNNI`.
#[inline(always)]
unsafe fn madd_add<const VNNI: bool>(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
    // SAFETY: the features as promised by the caller.
    unsafe {
        if VNNI {
            dpwssd_fused(acc, a, b)
        } else {
            _mm512_add_epi32(acc, _mm512_madd_epi16(a, b))
        }
    }
}

/// Whether kind `K` takes the packing path (with VNNI): `vpdpbusd` sums per sub-block that fit
/// i16, packed two outputs per register before the scales' `madd`: of all 4 pieces (16
/// products) for quants below 16 (16 * 15 * 128), of 2 pieces at a time for Q5_K's below 32
/// (8 * 31 * 128).
const fn packs(k: u8) -> bool {
    matches!(k, Q4K | Q3K | Q2K | Q5K)
}

/// i16 lane `l` of a packing path's scales: 128-bit lane `i = l / 8` takes the scales of
/// sub-blocks `4i..4i + 4`, twice (one output's then the other's, as `vpackssdw` lays them).
const PACK_SCALES: [i16; 32] = {
    let mut idx = [0i16; 32];
    let mut l = 0;
    while l < 32 {
        idx[l] = (4 * (l / 8) + l % 4) as i16;
        l += 1;
    }
    idx
};

/// i16 lane `l` of the other path's scales: `maddubs` lanes `2j, 2j + 1` are sub-block j's.
const PAIR_SCALES: [i16; 32] = {
    let mut idx = [0i16; 32];
    let mut l = 0;
    while l < 32 {
        idx[l] = (l / 2) as i16;
        l += 1;
    }
    idx
};

/// The four weight rows' blocks `b`, decoded and laid out for the tiles.
struct Strip {
    /// Scratch for one row's block in element order.
    w: Decoded,
    /// Each row's quants in piece order ([`to_pieces`]).
    q: [[u8; QK_K]; ROWS],
    /// Each row's sub-block scales as the path's `madd` takes them ([`PACK_SCALES`],
    /// [`PAIR_SCALES`]).
    scales: [__m512i; ROWS],
    /// Pair k of the block-sum weights in every lane: lane `4c + r` holds row r's weights
    /// `2k, 2k + 1` (see [`corr`]).
    bsum_pairs: [__m512i; 8],
    d0: [f32; ROWS],
    dmin0: [f32; ROWS],
}

impl Strip {
    /// Block `b` of the rows at `x`, decoded; scales for the packing path if `pack`.
    ///
    /// # Safety
    /// AVX-512 F/BW; block `b` of every row is readable.
    #[inline(always)]
    unsafe fn load<const K: u8>(&mut self, x: &[*const u8; ROWS], b: usize, pack: bool) {
        let mut weights = [0i16; 16 * ROWS];
        let layout = if pack { &PACK_SCALES } else { &PAIR_SCALES };
        // SAFETY: AVX-512 F/BW; block `b` of each row, as the caller promises; 256 quants, 16
        // scales and 128 bytes of weights read inside their arrays.
        unsafe {
            let layout = _mm512_loadu_si512(layout.as_ptr().cast());
            for (r, &row) in x.iter().enumerate() {
                self.w.load::<K>(row, b);
                to_pieces(self.w.q.as_ptr(), self.q[r].as_mut_ptr());
                weights[16 * r..16 * r + 16].copy_from_slice(&self.w.bsum_weights);
                self.d0[r] = self.w.d0;
                self.dmin0[r] = self.w.dmin0;
                let sub16 = _mm256_loadu_si256(self.w.sub16.as_ptr().cast());
                self.scales[r] = _mm512_permutexvar_epi16(layout, _mm512_castsi256_si512(sub16));
            }
            let w01 = _mm512_loadu_si512(weights.as_ptr().cast());
            let w23 = _mm512_loadu_si512(weights.as_ptr().add(32).cast());
            // Dword 8r + k of the weights (row r's pair k).
            let row8 = _mm512_setr_epi32(0, 8, 16, 24, 0, 8, 16, 24, 0, 8, 16, 24, 0, 8, 16, 24);
            for (k, pair) in (0..).zip(self.bsum_pairs.iter_mut()) {
                let index = _mm512_add_epi32(row8, _mm512_set1_epi32(k));
                *pair = _mm512_permutex2var_epi32(w01, index, w23);
            }
        }
    }
}

/// 256 bytes in element order to piece order ([`kquant::to_pieces`], in registers). All 256
/// bytes are loaded before any is stored, so `dst` may be `src`.
///
/// # Safety
/// AVX-512 F; 256 readable bytes at `src`, 256 writable at `dst`.
#[inline(always)]
unsafe fn to_pieces(src: *const u8, dst: *mut u8) {
    // SAFETY: as the caller promises.
    unsafe {
        let z: [__m512i; 4] = std::array::from_fn(|i| _mm512_loadu_si512(src.add(64 * i).cast()));
        // Lane j of piece p: group 4j + p, from z[0..2] (j < 8) or z[2..4] (j >= 8).
        let base = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
        for p in 0..4 {
            let index = _mm512_add_epi32(base, _mm512_set1_epi32(p as i32));
            let lo = _mm512_permutex2var_epi32(z[0], index, z[1]);
            let hi = _mm512_permutex2var_epi32(z[2], index, z[3]);
            _mm512_storeu_si512(
                dst.add(64 * p).cast(),
                _mm512_mask_blend_epi32(0xFF00, lo, hi),
            );
        }
    }
}

/// Copies of the Q8_K activation rows `y` in piece order in `scratch`
/// ([`kquant::gather_pieces`], each block reordered in registers): what [`rows`] multiplies.
///
/// # Safety
/// The CPU has AVX-512 F; every `y[c]` points at `nb` readable Q8_K blocks.
pub(crate) unsafe fn permute_activations(
    nb: usize,
    y: &[*const u8],
    scratch: &mut [u8],
) -> Option<[*const u8; COLS]> {
    // SAFETY: as the caller promises; `permute_block` gets a readable block and one of
    // scratch.
    unsafe { kquant::gather_pieces(nb, y, scratch, |src, dst| permute_block(src, dst)) }
}

/// One Q8_K block copied from `src` to `dst` with its quants in piece order (`dst` may be
/// `src`: every byte is read before it is written).
///
/// # Safety
/// AVX-512 F; a readable Q8_K block at `src`, a writable one at `dst`.
#[target_feature(enable = "avx512f")]
unsafe fn permute_block(src: *const u8, dst: *mut u8) {
    // SAFETY: as promised by the caller: `d` at 0, the quants at 4, the block sums at 260.
    unsafe {
        dst.cast::<f32>()
            .write_unaligned(src.cast::<f32>().read_unaligned());
        to_pieces(src.add(4), dst.add(4));
        let bsums = _mm256_loadu_si256(src.add(4 + QK_K).cast());
        _mm256_storeu_si256(dst.add(4 + QK_K).cast(), bsums);
    }
}

/// Tile after tile of 4 activation rows (columns `4t..4t + 4`), every weight block decoded once
/// for all of them; `out[c][r]` receives output (r, c) (the tile's lane `4c + r`).
///
/// # Safety
/// AVX-512 F/BW/DQ/VL, and VNNI if `VNNI`; `x` as [`rows`] promises, `y` rows from
/// [`permute_activations`] or MUL_MAT's phase 1, `out` whole tiles of at most [`COLS`]
/// columns.
#[inline(always)]
unsafe fn tiles<const K: u8, const VNNI: bool>(
    nb: usize,
    x: &[*const u8; ROWS],
    y: &[*const u8; COLS],
    out: &mut [[f32; ROWS]],
) {
    // SAFETY: AVX-512 F (the caller's promise).
    let zero = unsafe { _mm512_setzero_si512() };
    let mut s = Strip {
        w: Decoded::new(),
        q: [[0; QK_K]; ROWS],
        scales: [zero; ROWS],
        bsum_pairs: [zero; 8],
        d0: [0.0; ROWS],
        dmin0: [0.0; ROWS],
    };
    // SAFETY: AVX-512 F (the caller's promise).
    let mut sums = [unsafe { _mm512_setzero_ps() }; COLS / TILE_COLS];
    let sums = &mut sums[..out.len() / TILE_COLS];
    for b in 0..nb {
        // SAFETY: AVX-512 F/BW; block `b < nb` of every weight row.
        unsafe { s.load::<K>(x, b, VNNI && packs(K)) };
        for (t, sum) in sums.iter_mut().enumerate() {
            let cols: [*const u8; TILE_COLS] =
                std::array::from_fn(|c| y[TILE_COLS * t + c].wrapping_add(b * Q8K_BYTES));
            // SAFETY: the features as promised; block `b` of 4 activation rows.
            unsafe { *sum = tile_block::<K, VNNI>(&s, &cols, *sum) };
        }
    }
    for (tile, sum) in out.chunks_exact_mut(TILE_COLS).zip(sums.iter()) {
        // SAFETY: AVX-512 F; 4 columns of 4 floats at `tile`.
        unsafe { _mm512_storeu_ps(tile.as_flattened_mut().as_mut_ptr(), *sum) };
    }
}

/// One tile's super-block: its integer sums, then the float steps into `acc` (lane `4c + r`).
///
/// # Safety
/// AVX-512 F/BW/DQ/VL, and VNNI if `VNNI`; every `cols[c]` points at a readable Q8_K block in
/// piece order.
#[inline(always)]
unsafe fn tile_block<const K: u8, const VNNI: bool>(
    s: &Strip,
    cols: &[*const u8; TILE_COLS],
    acc: __m512,
) -> __m512 {
    // SAFETY: the features as promised; the loads stay inside the strip and the Q8_K blocks.
    unsafe {
        let dot = if VNNI && K == Q5K {
            dot_packed::<2>(s, cols)
        } else if VNNI && packs(K) {
            dot_packed::<4>(s, cols)
        } else {
            dot_pairs::<VNNI>(s, cols)
        };
        let corr = corr::<VNNI>(s, cols);
        let (s1, s2) = match K {
            Q6K => (_mm512_sub_epi32(dot, _mm512_slli_epi32::<5>(corr)), corr),
            Q3K => (_mm512_sub_epi32(dot, _mm512_slli_epi32::<2>(corr)), corr),
            _ => (dot, corr),
        };
        let d0 = _mm512_broadcast_f32x4(_mm_loadu_ps(s.d0.as_ptr()));
        let d1: [f32; TILE_COLS] = std::array::from_fn(|c| cols[c].cast::<f32>().read_unaligned());
        let by_col = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
        let d1 = _mm512_permutexvar_ps(by_col, _mm512_castps128_ps512(_mm_loadu_ps(d1.as_ptr())));
        let mut res = _mm512_mul_ps(d0, _mm512_cvtepi32_ps(s1));
        if kquant::has_min(K) {
            let dmin = _mm512_broadcast_f32x4(_mm_loadu_ps(s.dmin0.as_ptr()));
            res = _mm512_fnmadd_ps(dmin, _mm512_cvtepi32_ps(s2), res);
        }
        _mm512_fmadd_ps(res, d1, acc)
    }
}

/// The scaled quant products of the tile (lane `4c + r`), the packing path: per output and
/// sub-block j, `vpdpbusd` over `PIECES` pieces (4, or 2 at a time for Q5_K's larger quants)
/// sums their products in lane j; two outputs of a row are packed to i16 side by side and
/// `madd` by the row's scales; a tree sums the lanes.
///
/// # Safety
/// AVX-512 F/BW and VNNI; every `cols[c]` points at a readable Q8_K block in piece order.
#[inline(always)]
unsafe fn dot_packed<const PIECES: usize>(s: &Strip, cols: &[*const u8; TILE_COLS]) -> __m512i {
    // Lane 4c + r of the result: the lane of output (r, c) in `hsum8x2_epi32`'s result.
    const ORDER: [i32; 16] = [0, 8, 2, 10, 1, 9, 3, 11, 4, 12, 6, 14, 5, 13, 7, 15];
    // SAFETY: the features as promised; 64-byte steps through 256 quants of the strip and of
    // each Q8_K block (qs at 4..260).
    unsafe {
        // Register 2r + h: outputs (r, 2h) and (r, 2h + 1).
        let mut scaled = [_mm512_setzero_si512(); 8];
        for first in (0..QK_K / 64).step_by(PIECES) {
            // ints[4c + r]: output (r, c)'s sub-block sums over these pieces.
            let mut ints = [_mm512_setzero_si512(); 16];
            for p in first..first + PIECES {
                let q: [__m512i; ROWS] =
                    std::array::from_fn(|r| _mm512_loadu_si512(s.q[r].as_ptr().add(64 * p).cast()));
                for (c, &col) in cols.iter().enumerate() {
                    let yv = _mm512_loadu_si512(col.add(4 + 64 * p).cast());
                    for r in 0..ROWS {
                        ints[4 * c + r] = _mm512_dpbusd_epi32(ints[4 * c + r], q[r], yv);
                    }
                }
            }
            for (m, sum) in scaled.iter_mut().enumerate() {
                let (r, h) = (m / 2, m % 2);
                let packed = _mm512_packs_epi32(ints[8 * h + r], ints[8 * h + 4 + r]);
                let part = _mm512_madd_epi16(packed, s.scales[r]);
                *sum = if first == 0 {
                    part
                } else {
                    _mm512_add_epi32(*sum, part)
                };
            }
        }
        _mm512_permutexvar_epi32(
            _mm512_loadu_si512(ORDER.as_ptr().cast()),
            hsum8x2_epi32(&scaled),
        )
    }
}

/// The scaled quant products of the tile (lane `4c + r`), the other path: per output and
/// piece, `maddubs` then `vpdpwssd` by the row's scales (`madd` and an add without VNNI) into
/// one accumulator; a tree sums the lanes.
///
/// # Safety
/// AVX-512 F/BW, and VNNI if `VNNI`; every `cols[c]` points at a readable Q8_K block in piece
/// order.
#[inline(always)]
unsafe fn dot_pairs<const VNNI: bool>(s: &Strip, cols: &[*const u8; TILE_COLS]) -> __m512i {
    // SAFETY: the features as promised; as in `dot_packed`.
    unsafe {
        // ints[4r + c]: output (r, c)'s 16 partial sums.
        let mut ints = [_mm512_setzero_si512(); 16];
        for p in 0..QK_K / 64 {
            let q: [__m512i; ROWS] =
                std::array::from_fn(|r| _mm512_loadu_si512(s.q[r].as_ptr().add(64 * p).cast()));
            for (c, &col) in cols.iter().enumerate() {
                let yv = _mm512_loadu_si512(col.add(4 + 64 * p).cast());
                for r in 0..ROWS {
                    let pairs = _mm512_maddubs_epi16(q[r], yv);
                    ints[4 * r + c] = madd_add::<VNNI>(ints[4 * r + c], pairs, s.scales[r]);
                }
            }
        }
        hsum16x16_epi32(&ints)
    }
}

/// Lane `4c + r`: the weighted block sums `sum_j bsum_weights[r][j] * bsums[c][j]` of weight
/// row r and activation column c (the 16 i16 block sums at 260 in a Q8_K block): per pair k of
/// the sums, one permute puts column c's pair in its lanes beside the strip's weight pairs.
///
/// # Safety
/// AVX-512 F/BW, and VNNI if `VNNI`; every `cols[c]` points at a readable Q8_K block.
#[inline(always)]
unsafe fn corr<const VNNI: bool>(s: &Strip, cols: &[*const u8; TILE_COLS]) -> __m512i {
    // Dword 8c + k of the block sums (column c's pair k), k = 0 (add k for the others).
    const COL8: [i32; 16] = [0, 0, 0, 0, 8, 8, 8, 8, 16, 16, 16, 16, 24, 24, 24, 24];
    // SAFETY: the features as promised; 32 bytes of block sums at 260 in each Q8_K block.
    unsafe {
        let bsums = |c: usize| _mm256_loadu_si256(cols[c].add(4 + QK_K).cast());
        let bs01 = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(bsums(0)), bsums(1));
        let bs23 = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(bsums(2)), bsums(3));
        let col8 = _mm512_loadu_si512(COL8.as_ptr().cast());
        let mut sum = _mm512_setzero_si512();
        for (k, &pair) in (0..).zip(&s.bsum_pairs) {
            let index = _mm512_add_epi32(col8, _mm512_set1_epi32(k));
            let bk = _mm512_permutex2var_epi32(bs01, index, bs23);
            sum = madd_add::<VNNI>(sum, pair, bk);
        }
        sum
    }
}

/// Multiply-adds per second of these tiles alone, 1 thread: K 2048 by 256 weight rows by
/// `ntok` activation rows, in the loops MUL_MAT runs (`None` where they do not run).
pub(crate) fn bench_macs(dtype: DType, ntok: usize) -> Option<f64> {
    let f = CpuFeatures::detect();
    if !takes(f, dtype, kquant::MIN_ROWS) {
        return None;
    }
    let (nrows, nb) = (256, 2048 / QK_K);
    let (x, y, xrow, yrow) = kquant::bench_operands(dtype, nrows, ntok)?;
    let mut out = [[0f32; ROWS]; COLS];
    let mut scratch = vec![0u8; kquant::run_scratch_bytes(nb)];
    let mut ok = true;
    let best = kquant::best_of_7(|| {
        for c0 in (0..ntok).step_by(COLS) {
            let cols: Vec<*const u8> = (c0..(c0 + COLS).min(ntok))
                .map(|c| y[c * yrow..].as_ptr())
                .collect();
            // SAFETY: AVX-512 (`takes`); Q8_K rows of `nb` blocks.
            let Some(cols) = (unsafe { permute_activations(nb, &cols, &mut scratch) }) else {
                ok = false;
                return;
            };
            let ncols = (ntok - c0).min(COLS);
            for r0 in (0..nrows).step_by(ROWS) {
                let x4: [*const u8; ROWS] = std::array::from_fn(|r| x[(r0 + r) * xrow..].as_ptr());
                // SAFETY: `takes` checked the CPU and type; 4 weight rows and up to 64
                // permuted Q8_K rows of `nb` blocks each.
                unsafe { rows(f, dtype, nb, &x4, &cols[..ncols], &mut out) };
                std::hint::black_box(&out);
            }
        }
    });
    ok.then(|| (2048 * ntok * nrows) as f64 / best)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// Full and short tiles, with and without VNNI: [`kquant::row`]'s outputs bit for bit.
    #[test]
    fn tiles_equal_the_row_kernel() {
        let f = CpuFeatures::detect();
        if !f.has_avx512() {
            eprintln!("no AVX-512 here: the AVX-512 K-quant tiles are not run");
            return;
        }
        let shapes = [(4, 23), (3, 8), (1, 5), (2, 16), (4, 1)];
        for vnni in [true, false] {
            let vnni = vnni && f.has_avx512_vnni();
            let what = if vnni { "AVX-512 VNNI" } else { "AVX-512" };
            kquant::assert_tiles_equal_row(what, 11, &shapes, |dtype, nb, x, y, out| {
                // SAFETY: the CPU has AVX-512 (checked above) and VNNI where asked for; rows
                // of `nb` blocks of their types, the activations in piece order.
                unsafe { rows_on(vnni, dtype, nb, x, y, out) }
            });
        }
    }

    /// MUL_MAT_ID's reordered copies hold the bytes MUL_MAT's phase 1 makes, padded with the
    /// run's last row.
    #[test]
    fn permuted_runs_equal_the_phase_one_order() {
        if !CpuFeatures::detect().has_avx512() {
            return;
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(13);
        let nb = 2;
        let a = kquant::random_rows(&mut rng, DType::Q8_K, nb * QK_K, 5);
        let y: Vec<*const u8> = a.iter().map(|r| r.as_ptr()).collect();
        let mut scratch = vec![0u8; kquant::run_scratch_bytes(nb)];
        // SAFETY: AVX-512 (checked above); rows of `nb` Q8_K blocks.
        let run = unsafe { permute_activations(nb, &y, &mut scratch) }.expect("scratch");
        for (c, &got) in run.iter().enumerate() {
            let mut want = a[c.min(a.len() - 1)].clone();
            kquant::to_piece_order(&mut want).unwrap();
            // SAFETY: each run row points at `nb` blocks of scratch.
            let got = unsafe { std::slice::from_raw_parts(got, want.len()) };
            assert_eq!(got, &want[..], "row {c}");
        }
        let mut small = vec![0u8; kquant::run_scratch_bytes(nb) - 1];
        // SAFETY: as above.
        assert!(unsafe { permute_activations(nb, &y, &mut small) }.is_none());
    }
}
