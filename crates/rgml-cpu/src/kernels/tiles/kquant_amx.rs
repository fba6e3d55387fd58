//! The batched K-quant products of [`super::kquant`] (Q2_K…Q6_K and IQ4_XS weights by 8 or more
//! activation rows) on AMX tiles, with the same bits.
//!
//! ggml's tiled kernel computes, per output and 256-element super-block, two exact integers
//! (`s1`, the sub-block-scaled quant products, and `s2`, the mins' products with the activation
//! block sums) and then three float steps in block order. Exact integers can be computed any
//! way, so here the tile unit computes `s1` and only the float steps follow ggml's order:
//! - `s1` is the dot product of the activation quants with `v = (q - offset) * scale` per
//!   element (the `- 32` of Q6_K's and the `- 4` of Q3_K's quants folded in, which is what
//!   ggml's correction by the block sums computes), an integer of at most 14 bits, split into
//!   bytes `v = lo + 256 * hi` (`lo` unsigned, `hi` signed) so that the tile unit's int8
//!   products (`tdpbsud` for `lo`, `tdpbssd` for `hi`) give it with no per-sub-block pass;
//!   Q2_K's `v` fits `lo` alone;
//! - `s2` (Q2_K, Q4_K, Q5_K) comes from the Q8_K block sums with `vpdpwssd` on the vector
//!   units, which run beside the tile unit (Q4_K and Q5_K from the sums per 32, staged).
//!
//! A call takes up to four blocks of 16 weight rows, each decoded once into B tiles (a 16 x 16
//! transpose of 4-byte groups per 64 elements). The activation rows (signed Q8_K quants) are
//! staged per super-block and pair of 16-row activation tiles into 64-byte aligned A tiles
//! (Q8_K quants sit 4 bytes into their block, and tile loads of rows that straddle cache lines
//! are several times slower), and each stage serves all four weight blocks; each B tile loaded
//! serves two activation tiles. The float steps (`res = d0 * s1`, `res = fnmadd(dmin0, s2,
//! res)`, `acc = fma(res, d1, acc)`) run on 16 weight rows at once in AVX-512 registers, in
//! slices between the tile instructions of the next unit, as does the staging of the next
//! super-block: vector work placed between tile instructions overlaps them, placed after them
//! it does not.
//!
//! The integer sums fit in i32 (256 products of at most 14 and 8 bits), so the result equals
//! [`super::kquant::row`]'s bit for bit (tested below against it on random rows).

use super::kquant::{self, by_kind, Decoded, IQ4XS, Q2K, Q3K, Q4K, Q5K, Q6K, Q8K_BYTES};
use crate::kernels::isa::CpuFeatures;
use crate::kernels::simd::amx::{self, TileConfig};
use crate::kernels::simd::x86::transpose16x16_epi32;
use rgml::quant::QK_K;
use rgml::DType;
use std::arch::x86_64::*;

/// Weight rows per block (the 16 i32 columns of a tile).
pub(crate) const ROWS: usize = 16;

/// Blocks of weight rows per call: each activation tile staged serves all of them, so a call
/// reads the activations (from L2 or the other core's cache) once per 64 weight rows, not 16.
const BLOCKS: usize = 4;

/// Weight rows per call at most.
pub(crate) const CALL_ROWS: usize = BLOCKS * ROWS;

/// Activation rows per tile; tiles go in pairs.
const TOKENS: usize = 16;

/// Bytes of one plane of a decoded super-block: 4 B tiles of 64 elements by 16 rows.
const PLANE: usize = 4 * 1024;

/// The planes, in the order they sit in a decoded super-block and in the results.
const LO: usize = 0;
const HI: usize = 1;

/// Bytes of one decoded super-block of a 16-row block: 2 planes, the weights of the block sums
/// as `madd` pairs (8 x 16 i32), `d0` and `dmin0`.
const BLOCK_BYTES: usize = 2 * PLANE + 8 * 64 + 2 * 64;
const CORR: usize = 2 * PLANE;
const D0: usize = CORR + 8 * 64;
const DMIN: usize = D0 + 64;

/// The decoded rows in element order (16 rows of 256 bytes per plane), before the transpose
/// into tiles.
const NATURAL_BYTES: usize = 2 * ROWS * QK_K;
/// The i32 results of a pair of activation tiles (two planes each) for one super-block.
const RESULT_BYTES: usize = 2 * 2 * TOKENS * 64;

/// Whether weights of kind `K` need the `hi` plane (every `v` but Q2_K's exceeds a byte).
const fn has_hi(k: u8) -> bool {
    k != Q2K
}

/// Whether kind `K`'s mins apply to sub-blocks of 32 (Q4_K, Q5_K): `s2` then takes the
/// activation's sums per 32 (4 `madd` pairs), which the staging computes once per super-block
/// for every weight block, instead of the Q8_K sums per 16 (8 pairs).
const fn mins_per_32(k: u8) -> bool {
    k == Q4K || k == Q5K
}

/// The `madd` pairs of block sums `s2` takes.
const fn sum_pairs(k: u8) -> usize {
    if mins_per_32(k) {
        4
    } else {
        8
    }
}

/// The offset of kind `K`'s stored quants (see [`Decoded::q`]).
const fn offset(k: u8) -> i16 {
    match k {
        Q6K => 32,
        Q3K => 4,
        _ => 0,
    }
}

/// The activation quants of one super-block of a pair of activation tiles, staged for the
/// tile loads: tile t's chunk c at `(4 * t + c) * 1024`, its rows 64 bytes apart.
/// After them, each activation row's sums per 32 as 4 `madd` pairs (see [`mins_per_32`]).
const STAGE_BYTES: usize = 2 * 4 * TOKENS * 64 + SUMS_BYTES;
const SUMS: usize = 2 * 4 * TOKENS * 64;
const SUMS_BYTES: usize = 2 * TOKENS * 16;

/// Tile loads and stores run at their speed only on 64-byte aligned rows: a row that
/// straddles two cache lines makes `tileloadd` several times slower (measured: 1 KiB from L1
/// in about 4 ns aligned, 30 ns four bytes off). Q8_K quants sit 4 bytes into their block, so
/// the activations are copied into aligned stages; every scratch area starts on a line.
const LINE: usize = 64;

/// The float accumulators of a pair of activation tiles: 16 weight rows (one zmm) per
/// activation row and weight block. Kept in the scratch: the first super-block writes them,
/// so nothing is zeroed per pair.
const ACC_BYTES: usize = BLOCKS * 2 * TOKENS * 64;

/// Scratch bytes a call needs for weight rows of `nb` super-blocks.
pub(crate) fn scratch_bytes(nb: usize) -> usize {
    LINE + BLOCKS * nb * BLOCK_BYTES
        + NATURAL_BYTES
        + 2 * RESULT_BYTES
        + 2 * STAGE_BYTES
        + ACC_BYTES
}

/// Whether weights of `dtype` take the AMX path with `rows` src1 rows on a CPU with `f`.
pub(crate) fn takes(f: CpuFeatures, dtype: DType, rows: usize) -> bool {
    f.has_amx_int8() && f.has_avx512_vnni() && kquant::takes(dtype, rows)
}

/// Up to [`CALL_ROWS`] weight rows against `ntok` activation rows: `dst + n * dst_stride`
/// receives, as 4-byte floats at element offsets `0..mrows`, the tiled products of weight rows
/// `x0 + m * x_stride` (`nb` blocks of `dtype` each) with the Q8_K activation row
/// `y0 + n * y_stride`.
///
/// # Safety
/// [`takes`] accepted `dtype` on this CPU; `mrows` is 1..=[`CALL_ROWS`]; the weight and activation rows
/// are readable as described; the destination elements are writable and written by no one
/// else; `scratch` holds [`scratch_bytes`]`(nb)` bytes.
pub(crate) unsafe fn rows(
    dtype: DType,
    nb: usize,
    weights: (*const u8, usize, usize),
    activations: (*const u8, usize, usize),
    out: (*mut u8, usize),
    scratch: &mut [u8],
) {
    macro_rules! go {
        ($k:ident) => {
            // SAFETY: forwarded from the caller (AVX-512 F/BW/VL and AMX: `takes`).
            unsafe { rows_k::<$k>(nb, weights, activations, out, scratch) }
        };
    }
    by_kind!(dtype, go);
}

/// [`rows`] for weights of kind `K`, compiled for AVX-512 (with VNNI for the block sums).
///
/// # Safety
/// As [`rows`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
unsafe fn rows_k<const K: u8>(
    nb: usize,
    (x0, x_stride, mrows): (*const u8, usize, usize),
    (y0, y_stride, ntok): (*const u8, usize, usize),
    (dst, dst_stride): (*mut u8, usize),
    scratch: &mut [u8],
) {
    let skip = scratch.as_ptr().align_offset(LINE).min(LINE);
    let (tiles, rest) = scratch[skip..].split_at_mut(BLOCKS * nb * BLOCK_BYTES);
    let (natural, rest) = rest.split_at_mut(NATURAL_BYTES);
    let (result, rest) = rest.split_at_mut(2 * RESULT_BYTES);
    let (stage, accs) = rest.split_at_mut(2 * STAGE_BYTES);
    let blocks = mrows.div_ceil(ROWS);
    // SAFETY: the rows are readable (the caller's promise); the scratch areas have the sizes
    // `decode` and `tokens` need.
    unsafe {
        for (r, decoded) in tiles
            .chunks_exact_mut(nb * BLOCK_BYTES)
            .take(blocks)
            .enumerate()
        {
            let rows = ROWS.min(mrows - r * ROWS);
            decode::<K>(
                nb,
                x0.add(r * ROWS * x_stride),
                x_stride,
                rows,
                decoded,
                natural,
            );
        }
        let mut configured = (usize::MAX, usize::MAX);
        for n0 in (0..ntok).step_by(2 * TOKENS) {
            let nt0 = TOKENS.min(ntok - n0);
            let nt1 = TOKENS.min(ntok - n0 - nt0);
            if (nt0, nt1) != configured {
                let mut cfg = TileConfig::new();
                for (t, rows) in [(0, nt0), (1, nt0), (2, nt1), (3, nt1), (4, nt0), (5, nt1)] {
                    if rows > 0 {
                        cfg.set(t, rows as u8, 64);
                    }
                }
                cfg.set(6, 16, 64);
                cfg.set(7, 16, 64);
                cfg.load();
                configured = (nt0, nt1);
            }
            let y = y0.add(n0 * y_stride);
            let out = dst.add(n0 * dst_stride);
            tokens::<K>(
                nb,
                tiles,
                (y, y_stride, nt0, nt1),
                (out, dst_stride, mrows),
                (result, stage, accs),
            );
        }
        amx::release();
    }
}

/// Decode `mrows` weight rows (the rest of 16 as zeros) into the B tiles of every super-block.
///
/// # Safety
/// AVX-512 F/BW; the rows are readable; `tiles` holds `nb * BLOCK_BYTES` bytes, `natural`
/// `NATURAL_BYTES`.
#[inline(always)]
unsafe fn decode<const K: u8>(
    nb: usize,
    x0: *const u8,
    x_stride: usize,
    mrows: usize,
    tiles: &mut [u8],
    natural: &mut [u8],
) {
    // SAFETY: AVX-512 BW, as the caller promises.
    let (half_index, off) = unsafe {
        // Lane e of a 32-quant chunk takes madd scale lane e / 2.
        let half_index = _mm512_set_epi16(
            15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8, 7, 7, 6, 6, 5, 5, 4, 4, 3,
            3, 2, 2, 1, 1, 0, 0,
        );
        (half_index, _mm512_set1_epi16(offset(K)))
    };
    let at = |plane: usize, m: usize| (plane * ROWS + m) * QK_K;
    let mut w = Decoded::new();
    for b in 0..nb {
        let block = &mut tiles[b * BLOCK_BYTES..(b + 1) * BLOCK_BYTES];
        let mut corr = [[0i32; ROWS]; 8];
        let (mut d0, mut dmin) = ([0f32; ROWS], [0f32; ROWS]);
        for m in 0..ROWS {
            if m >= mrows {
                for plane in [LO, HI] {
                    natural[at(plane, m)..at(plane, m) + QK_K].fill(0);
                }
                continue;
            }
            // SAFETY: block `b` of row `m` is readable (the caller's promise).
            unsafe { w.load::<K>(x0.add(m * x_stride), b) };
            for (cc, scales) in w.scales.iter().enumerate() {
                // SAFETY: 32 quants and 16 scales inside `w`; 32 bytes stored in bounds of
                // `natural` (rows of 256).
                unsafe {
                    let q = _mm256_loadu_si256(w.q.as_ptr().add(32 * cc).cast());
                    let q = if K == IQ4XS {
                        _mm512_cvtepi8_epi16(q)
                    } else {
                        _mm512_cvtepu8_epi16(q)
                    };
                    let s = _mm512_castsi256_si512(_mm256_loadu_si256(scales.as_ptr().cast()));
                    let s = _mm512_permutexvar_epi16(half_index, s);
                    let v = _mm512_mullo_epi16(_mm512_sub_epi16(q, off), s);
                    let to = natural.as_mut_ptr().add(32 * cc);
                    _mm256_storeu_si256(to.add(at(LO, m)).cast(), _mm512_cvtepi16_epi8(v));
                    let hi = _mm512_cvtepi16_epi8(_mm512_srai_epi16::<8>(v));
                    _mm256_storeu_si256(to.add(at(HI, m)).cast(), hi);
                }
            }
            // Only `s2` needs the block sums' weights (Q6_K's and Q3_K's offsets are folded in).
            if kquant::has_min(K) {
                for (t, pair) in corr.iter_mut().take(sum_pairs(K)).enumerate() {
                    // Per 32: sub-blocks 2t and 2t + 1, whose mins stand twice in the weights.
                    let (a, c) = if mins_per_32(K) {
                        (w.bsum_weights[4 * t], w.bsum_weights[4 * t + 2])
                    } else {
                        (w.bsum_weights[2 * t], w.bsum_weights[2 * t + 1])
                    };
                    pair[m] = i32::from(a as u16) | (i32::from(c) << 16);
                }
            }
            d0[m] = w.d0;
            dmin[m] = w.dmin0;
        }
        for plane in [LO, HI] {
            if plane == HI && !has_hi(K) {
                continue;
            }
            for c in 0..4 {
                // SAFETY: AVX-512 F; 16 rows of 64 bytes read from `natural` and written to
                // `block`, in bounds.
                unsafe {
                    let src = natural.as_ptr().add(at(plane, 0) + 64 * c);
                    let mut rows: [__m512i; 16] =
                        std::array::from_fn(|m| _mm512_loadu_si512(src.add(m * QK_K).cast()));
                    transpose16x16_epi32(&mut rows);
                    let to = block.as_mut_ptr().add(plane * PLANE + c * 1024);
                    for (r, v) in rows.iter().enumerate() {
                        _mm512_storeu_si512(to.add(64 * r).cast(), *v);
                    }
                }
            }
        }
        block[CORR..D0].copy_from_slice(bytemuck::cast_slice(&corr));
        block[D0..DMIN].copy_from_slice(bytemuck::cast_slice(&d0));
        block[DMIN..BLOCK_BYTES].copy_from_slice(bytemuck::cast_slice(&dmin));
    }
}

/// A pair of activation tiles (`nt0` and `nt1` rows; `nt1` may be 0) by the decoded weight
/// rows (`mrows`, in blocks of 16 `nb * BLOCK_BYTES` apart in `tiles`), every super-block in
/// order, into `out + n * out_stride` (the first `mrows` floats of each row).
///
/// # Safety
/// AVX-512 F/BW and the tiles configured for `nt0`/`nt1` rows; `tiles` decoded by [`decode`];
/// the activation rows readable (`nb` Q8_K blocks each); the outputs writable.
#[inline(always)]
unsafe fn tokens<const K: u8>(
    nb: usize,
    tiles: &[u8],
    (y, y_stride, nt0, nt1): (*const u8, usize, usize, usize),
    (out, out_stride, mrows): (*mut u8, usize, usize),
    (result, stage, accs): (&mut [u8], &mut [u8], &mut [u8]),
) {
    let nt = nt0 + nt1;
    let blocks = mrows.div_ceil(ROWS);
    let decoded = |r: usize, b: usize| tiles[(r * nb + b) * BLOCK_BYTES..].as_ptr();
    let accs = accs[..ACC_BYTES].as_mut_ptr();
    // Raw pointers from here on: a unit's float steps read the sums of a stage that the
    // staging ahead may be writing (other rows of it, in program order).
    let result = result[..2 * RESULT_BYTES].as_mut_ptr();
    let stage = stage[..2 * STAGE_BYTES].as_mut_ptr();
    let acc = |r: usize| accs.wrapping_add(r * 2 * TOKENS * 64);
    // Software pipelined over the units (super-block b, weight block r) in order: a unit's
    // products go to the tile unit, then the float steps of the unit before run on the vector
    // units meanwhile, from the other half of `result`. A super-block's activation quants are
    // staged once for all its weight blocks.
    let units = nb * blocks;
    for u in 0..=units {
        // The float steps of the unit before, run between this unit's tile products (blocks
        // of vector work between tile instructions overlap them; one block after all of them
        // measured no overlap at all).
        let before = (u > 0).then(|| {
            let (b, r) = ((u - 1) / blocks, (u - 1) % blocks);
            Epilogue {
                block: decoded(r, b),
                res: result
                    .wrapping_add(((u - 1) % 2) * RESULT_BYTES)
                    .cast_const(),
                q8: y.wrapping_add(b * Q8K_BYTES),
                q8_stride: y_stride,
                sums: stage
                    .wrapping_add((b % 2) * STAGE_BYTES + SUMS)
                    .cast_const(),
                acc: acc(r),
                nt,
                first: b == 0,
            }
        });
        if u < units {
            let (b, r) = (u / blocks, u % blocks);
            let res = result.wrapping_add((u % 2) * RESULT_BYTES);
            // Two stages in turn: super-block b's, and b + 1's, staged between the tile
            // products of b's last unit (after the float steps that read its sums before).
            let staged = stage.wrapping_add((b % 2) * STAGE_BYTES);
            let next = stage.wrapping_add(((b + 1) % 2) * STAGE_BYTES);
            let ahead = (r + 1 == blocks && b + 1 < nb)
                .then(|| (y.wrapping_add((b + 1) * Q8K_BYTES), next));
            // SAFETY: the tiles are configured (the caller's promise); A rows: the quants of
            // super-block `b` of each activation row, staged; B: the block's decoded planes;
            // results into this unit's half of `result`; the epilogue's operands as below;
            // the Q8_K blocks b and b + 1 of the `nt` rows are readable.
            unsafe {
                if u == 0 {
                    stage_quants::<K>(y, y_stride, 0..nt, staged);
                }
                let args = (staged.cast_const(), y_stride, nt, nt1 > 0);
                products::<K>(decoded(r, b), args, res, before, ahead);
            }
        } else if let Some(last) = before {
            // SAFETY: the decoded block and its results are in bounds; the Q8_K blocks of the
            // `nt` activation rows are readable, their sums per 32 staged; the block's
            // accumulators hold `nt` aligned zmm, written by super-block 0.
            unsafe { epilogue::<K>(&last, 0..nt) };
        }
    }
    for r in 0..blocks {
        let rows = ROWS.min(mrows - r * ROWS);
        let mask = if rows >= 16 {
            u16::MAX
        } else {
            (1u16 << rows) - 1
        };
        let acc = acc(r);
        for n in 0..nt {
            // SAFETY: the first `mrows` floats of output row `n` are writable (the caller's
            // promise); the mask stores block r's share of them; accumulator n is in bounds.
            unsafe {
                let to = out.add(n * out_stride + 4 * r * ROWS);
                _mm512_mask_storeu_ps(to.cast(), mask, _mm512_load_ps(acc.add(64 * n).cast()));
            }
        }
    }
}

/// Copy the 256 quants of the Q8_K blocks at `q8` of activation rows `rows` (`y_stride` apart)
/// into `stage` in the layout of [`STAGE_BYTES`], with their sums per 32 where kind `K`
/// takes them.
///
/// # Safety
/// AVX-512 F/BW; the rows' blocks are readable; `stage` is 64-byte aligned and holds
/// [`STAGE_BYTES`] writable bytes.
#[inline(always)]
unsafe fn stage_quants<const K: u8>(
    q8: *const u8,
    y_stride: usize,
    rows: std::ops::Range<usize>,
    stage: *mut u8,
) {
    for n in rows {
        let (t, row) = (n / TOKENS, n % TOKENS);
        let block = q8.wrapping_add(n * y_stride);
        for c in 0..4 {
            let at = ((4 * t + c) * TOKENS + row) * 64;
            // SAFETY: row `n`'s 256 quants are readable (the caller's promise); `at + 64` is
            // within the stage (n < 32).
            unsafe {
                let v = _mm512_loadu_si512(block.add(4 + 64 * c).cast());
                _mm512_store_si512(stage.add(at).cast(), v);
            }
        }
        if mins_per_32(K) {
            let at = SUMS + 16 * n;
            // SAFETY: the block's 16 sums (i16, after the scale and the quants) are readable;
            // 16 bytes stored within the stage. Each sum of 32 is at most 32 * 127, an i16.
            unsafe {
                let per16 = _mm256_loadu_si256(block.add(4 + QK_K).cast());
                let per32 = _mm256_madd_epi16(per16, _mm256_set1_epi16(1));
                let packed = _mm256_packs_epi32(per32, per32);
                let ordered = _mm256_permute4x64_epi64::<0b1000>(packed);
                _mm_storeu_si128(stage.add(at).cast(), _mm256_castsi256_si128(ordered));
            }
        }
    }
}

/// One super-block's products for the pair of activation tiles staged at `staged` (see
/// [`STAGE_BYTES`]), into the result tiles at `res`: tile t's plane p at
/// `res + (2 * t + p) * 1024`. After each 64-element chunk, a quarter of the activation rows
/// of `before` (the float steps of the unit before) and then of `ahead` (the next super-block's
/// Q8_K blocks, staged into the other stage).
///
/// # Safety
/// AVX-512 F/BW/VNNI; the tiles configured; `staged` holds the `nt` rows of both configured
/// tiles (the activation rows `y_stride` apart, as `ahead`'s); `block` a decoded super-block;
/// `res` holds `RESULT_BYTES` writable bytes; `before` as [`epilogue`] needs, its results not
/// at `res`; `ahead`'s blocks readable for the `nt` rows, its stage not `staged`.
#[inline(always)]
unsafe fn products<const K: u8>(
    block: *const u8,
    (staged, y_stride, nt, pair): (*const u8, usize, usize, bool),
    res: *mut u8,
    before: Option<Epilogue>,
    ahead: Option<(*const u8, *mut u8)>,
) {
    let second = staged.wrapping_add(4 * TOKENS * 64);
    // SAFETY: as the caller promises.
    unsafe {
        amx::zero::<0>();
        if has_hi(K) {
            amx::zero::<1>();
        }
        if pair {
            amx::zero::<2>();
            if has_hi(K) {
                amx::zero::<3>();
            }
        }
        for c in 0..4 {
            amx::load::<4>(staged.add(1024 * c), 64);
            if pair {
                amx::load::<5>(second.add(1024 * c), 64);
            }
            amx::load::<6>(block.add(LO * PLANE + c * 1024), 64);
            if has_hi(K) {
                amx::load::<7>(block.add(HI * PLANE + c * 1024), 64);
            }
            amx::dot_signed_unsigned::<0, 4, 6>();
            if pair {
                amx::dot_signed_unsigned::<2, 5, 6>();
            }
            if has_hi(K) {
                amx::dot_signed_signed::<1, 4, 7>();
                if pair {
                    amx::dot_signed_signed::<3, 5, 7>();
                }
            }
            if let Some(e) = &before {
                epilogue::<K>(e, c * e.nt / 4..(c + 1) * e.nt / 4);
            }
            if let Some((q8, next)) = ahead {
                stage_quants::<K>(q8, y_stride, c * nt / 4..(c + 1) * nt / 4, next);
            }
        }
        amx::store::<0>(res, 64);
        if has_hi(K) {
            amx::store::<1>(res.add(1024), 64);
        }
        if pair {
            amx::store::<2>(res.add(2048), 64);
            if has_hi(K) {
                amx::store::<3>(res.add(3072), 64);
            }
        }
    }
}

/// The float steps of one unit (a super-block of one weight block) for the activation rows
/// of a tile pair: `s1` from the result tiles, `s2` from the Q8_K block sums (per 32 from
/// `sums`, staged, where [`mins_per_32`]), into the block's accumulators.
#[derive(Clone, Copy)]
struct Epilogue {
    /// The decoded super-block.
    block: *const u8,
    /// Its result tiles.
    res: *const u8,
    /// The Q8_K block of the first activation row; the others `q8_stride` apart.
    q8: *const u8,
    q8_stride: usize,
    /// The rows' staged sums per 32.
    sums: *const u8,
    /// `nt` 64-byte aligned accumulators of 16 floats.
    acc: *mut u8,
    nt: usize,
    /// The first super-block: the products start from zero, as the mirrored sum does (the
    /// accumulators are written, not read).
    first: bool,
}

/// [`Epilogue`]'s steps for activation rows `rows`.
///
/// # Safety
/// AVX-512 F/BW/VNNI; `e`'s pointers as documented there, `rows` within `0..e.nt`.
#[inline(always)]
unsafe fn epilogue<const K: u8>(e: &Epilogue, rows: std::ops::Range<usize>) {
    let Epilogue {
        block,
        res,
        q8,
        q8_stride,
        sums,
        acc,
        first,
        ..
    } = *e;
    // SAFETY: as the caller promises.
    unsafe {
        let d0 = _mm512_loadu_ps(block.add(D0).cast());
        let dmin = _mm512_loadu_ps(block.add(DMIN).cast());
        let weights: [__m512i; 8] =
            std::array::from_fn(|t| _mm512_loadu_si512(block.add(CORR + 64 * t).cast()));
        for n in rows {
            let row = q8.add(n * q8_stride);
            let tile = res.add((n / TOKENS) * 2048 + (n % TOKENS) * 64);
            let mut s1 = _mm512_loadu_si512(tile.cast());
            if has_hi(K) {
                let hi = _mm512_loadu_si512(tile.add(1024).cast());
                s1 = _mm512_add_epi32(s1, _mm512_slli_epi32::<8>(hi));
            }
            let mut r = _mm512_mul_ps(d0, _mm512_cvtepi32_ps(s1));
            if kquant::has_min(K) {
                let pairs = if mins_per_32(K) {
                    sums.add(16 * n)
                } else {
                    row.add(4 + QK_K)
                };
                let mut s2 = _mm512_setzero_si512();
                for (t, wt) in weights.iter().take(sum_pairs(K)).enumerate() {
                    let pair = _mm512_set1_epi32(pairs.add(4 * t).cast::<i32>().read_unaligned());
                    s2 = _mm512_dpwssd_epi32(s2, pair, *wt);
                }
                r = _mm512_fnmadd_ps(dmin, _mm512_cvtepi32_ps(s2), r);
            }
            let d1 = _mm512_set1_ps(row.cast::<f32>().read_unaligned());
            let a = acc.add(64 * n).cast::<f32>();
            let before = if first {
                _mm512_setzero_ps()
            } else {
                _mm512_load_ps(a)
            };
            _mm512_store_ps(a, _mm512_fmadd_ps(r, d1, before));
        }
    }
}

/// Multiply-adds per second of [`rows`] on one thread, for `cargo bench -p rgml-cpu`: 256
/// weight rows of `dtype` and K = 2048 by `ntok` activation rows, the best of 7 passes (`None`
/// without AMX or for a type the kernel does not take).
pub(crate) fn bench_macs(dtype: DType, ntok: usize) -> Option<f64> {
    if !takes(CpuFeatures::detect(), dtype, kquant::MIN_ROWS) {
        return None;
    }
    let (k, mrows_total) = (2048usize, 256usize);
    let nb = k / QK_K;
    let (x, y, xrow, yrow) = kquant::bench_operands(dtype, mrows_total, ntok)?;
    let mut out = vec![0u8; ntok * mrows_total * 4];
    let mut scratch = vec![0u8; scratch_bytes(nb)];
    let best = kquant::best_of_7(|| {
        for r0 in (0..mrows_total).step_by(CALL_ROWS) {
            // SAFETY: `takes` checked the CPU and type; 64 weight rows of `nb` blocks from
            // `r0`, `ntok` Q8_K rows, the outputs and the scratch have the sizes promised.
            unsafe {
                rows(
                    dtype,
                    nb,
                    (x[r0 * xrow..].as_ptr(), xrow, CALL_ROWS),
                    (y.as_ptr(), yrow, ntok),
                    (out[r0 * 4..].as_mut_ptr(), mrows_total * 4),
                    &mut scratch,
                )
            };
        }
    });
    Some((k * ntok * mrows_total) as f64 / best)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn values(rng: &mut StdRng, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| rng.gen_range(-1.0f32..1.0) * if rng.gen_bool(0.03) { 9.0 } else { 1.0 })
            .collect()
    }

    /// Every K-quant type, full and partial tiles of weight rows and activation rows, one to
    /// four weight blocks per call: the AMX outputs equal the AVX2 tiled kernel's bit for bit.
    #[test]
    fn amx_tiles_equal_the_tiled_kernel() {
        let f = CpuFeatures::detect();
        if !f.has_amx_int8() {
            eprintln!("no AMX-INT8 here: the AMX kernel is not run");
            return;
        }
        let mut rng = StdRng::seed_from_u64(31);
        let types = [
            DType::Q4_K,
            DType::Q5_K,
            DType::Q6_K,
            DType::Q2_K,
            DType::Q3_K,
            DType::IQ4_XS,
        ];
        for dtype in types {
            for (k, mrows, ntok) in [
                (256, 16, 16),
                (512, 11, 37),
                (768, 16, 8),
                (256, 1, 20),
                (256, 16, 64),
                (512, 64, 33),
                (256, 37, 48),
                (512, 50, 5),
            ] {
                let nb = k / QK_K;
                let xrow = dtype.row_bytes(k).unwrap();
                let mut x = vec![0u8; xrow * mrows];
                for r in x.chunks_exact_mut(xrow) {
                    rgml::quant::quantize_row(dtype, &values(&mut rng, k), r).unwrap();
                }
                let yrow = DType::Q8_K.row_bytes(k).unwrap();
                let mut y = vec![0u8; yrow * ntok];
                for r in y.chunks_exact_mut(yrow) {
                    rgml::quant::quantize_row(DType::Q8_K, &values(&mut rng, k), r).unwrap();
                }
                let stride = 4 * (mrows + 3);
                let mut got = vec![0u8; stride * ntok];
                let mut scratch = vec![0u8; scratch_bytes(nb)];
                // SAFETY: AMX checked; the rows, outputs and scratch have the sizes promised.
                unsafe {
                    rows(
                        dtype,
                        nb,
                        (x.as_ptr(), xrow, mrows),
                        (y.as_ptr(), yrow, ntok),
                        (got.as_mut_ptr(), stride),
                        &mut scratch,
                    )
                };
                let ys: Vec<*const u8> = (0..ntok).map(|n| y[n * yrow..].as_ptr()).collect();
                let mut want = vec![0f32; ntok];
                for m in 0..mrows {
                    // SAFETY: row `m` and every activation row hold `nb` blocks.
                    unsafe { kquant::row(f, dtype, nb, x[m * xrow..].as_ptr(), &ys, &mut want) };
                    for (n, w) in want.iter().enumerate() {
                        let at = n * stride + 4 * m;
                        let g = f32::from_le_bytes(got[at..at + 4].try_into().unwrap());
                        assert_eq!(g.to_bits(), w.to_bits(), "{dtype} k {k} row {m} token {n}");
                    }
                }
            }
        }
    }
}
