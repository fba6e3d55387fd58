//! The batched K-quant products of [`super::kquant`] (Q2_K…Q6_K and IQ4_XS weights by 8 or more
//! activation rows) on AMX tiles, with the same bits.
//!
//! ggml's tiled kernel computes, per output and 256-element super-block, two exact integers
//! (`s1`, the sub-block-scaled quant products, and `s2`, the mins' products with the activation
//! sums) and then three float steps in block order. Exact integers can be computed any way, so
//! here the tile unit computes both and only the float steps follow ggml's order. Both are
//! dot products of the 256 activation quants with per-element weight values:
//! - `s1`: `v = (q - offset) * scale` (the `- 32` of Q6_K's and the `- 4` of Q3_K's quants
//!   folded in, which is what ggml's correction by the block sums computes), an integer of at
//!   most 14 bits, split into bytes `v = lo + 256 * hi` (`lo` unsigned, `hi` signed) so that
//!   the tile unit's int8 products (`tdpbsud` for `lo`, `tdpbssd` for `hi`) give it without a
//!   per-sub-block pass; Q2_K's `v` fits `lo`;
//! - `s2` (Q2_K, Q4_K, Q5_K): each element's sub-block min, a third plane.
//!
//! The activation rows (signed Q8_K quants) are the A tile as they lie in the work area, 16
//! rows `wrow` bytes apart. A block of 16 weight rows is decoded once per call into B tiles (a
//! 16 x 16 transpose of 4-byte groups per 64 elements) that serve every tile of 16 activation
//! rows. The float steps (`res = d0 * s1`, `res = fnmadd(dmin0, s2, res)`, `acc = fma(res, d1,
//! acc)`) run on 16 weight rows at once in AVX-512 registers.
//!
//! The integer sums fit in i32 (256 products of at most 14 and 8 bits), so the result equals
//! [`super::kquant::row`]'s bit for bit (tested below against it on random rows).

use super::kquant::{self, Decoded, IQ4XS, Q2K, Q3K, Q4K, Q5K, Q6K, Q8K_BYTES};
use crate::kernels::isa::CpuFeatures;
use crate::kernels::simd::amx::{self, TileConfig};
use crate::kernels::simd::x86::transpose16x16_epi32;
use rgml::quant::QK_K;
use rgml::DType;
use std::arch::x86_64::*;

/// Weight rows per call (the 16 i32 columns of a tile).
pub(crate) const ROWS: usize = 16;

/// Activation rows per tile.
const TOKENS: usize = 16;

/// Bytes of one plane of a decoded super-block: 4 B tiles of 64 elements by 16 rows.
const PLANE: usize = 4 * 1024;

/// The planes, in the order they sit in a decoded super-block and in the results.
const LO: usize = 0;
const HI: usize = 1;
const MIN: usize = 2;

/// Bytes of one decoded super-block of a 16-row block: 3 planes, then `d0` and `dmin0`.
const BLOCK_BYTES: usize = 3 * PLANE + 2 * 64;
const D0: usize = 3 * PLANE;
const DMIN: usize = D0 + 64;

/// The decoded rows in element order (16 rows of 256 bytes per plane), before the transpose
/// into tiles, and the i32 result tiles of the planes.
const NATURAL_BYTES: usize = 3 * ROWS * QK_K;
const RESULT_BYTES: usize = 3 * TOKENS * 64;

/// Whether weights of kind `K` need the `hi` plane (every `v` but Q2_K's exceeds a byte).
const fn has_hi(k: u8) -> bool {
    k != Q2K
}

/// The offset of kind `K`'s stored quants (see [`Decoded::q`]).
const fn offset(k: u8) -> i16 {
    match k {
        Q6K => 32,
        Q3K => 4,
        _ => 0,
    }
}

/// Scratch bytes a call needs for weight rows of `nb` super-blocks.
pub(crate) fn scratch_bytes(nb: usize) -> usize {
    nb * BLOCK_BYTES + NATURAL_BYTES + RESULT_BYTES
}

/// Whether weights of `dtype` take the AMX path with `rows` src1 rows on a CPU with `f`.
pub(crate) fn takes(f: CpuFeatures, dtype: DType, rows: usize) -> bool {
    f.has_amx_int8() && kquant::takes(dtype, rows)
}

/// One block of up to 16 weight rows against `ntok` activation rows: `dst + n * dst_stride`
/// receives, as 4-byte floats at element offsets `0..mrows`, the tiled products of weight rows
/// `x0 + m * x_stride` (`nb` blocks of `dtype` each) with the Q8_K activation row
/// `y0 + n * y_stride`.
///
/// # Safety
/// [`takes`] accepted `dtype` on this CPU; `mrows` is 1..=16; the weight and activation rows
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
    match dtype {
        DType::Q4_K => go!(Q4K),
        DType::Q5_K => go!(Q5K),
        DType::Q6_K => go!(Q6K),
        DType::Q2_K => go!(Q2K),
        DType::Q3_K => go!(Q3K),
        DType::IQ4_XS => go!(IQ4XS),
        _ => {}
    }
}

/// [`rows`] for weights of kind `K`, compiled for AVX-512.
///
/// # Safety
/// As [`rows`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn rows_k<const K: u8>(
    nb: usize,
    (x0, x_stride, mrows): (*const u8, usize, usize),
    (y0, y_stride, ntok): (*const u8, usize, usize),
    (dst, dst_stride): (*mut u8, usize),
    scratch: &mut [u8],
) {
    let (tiles, rest) = scratch.split_at_mut(nb * BLOCK_BYTES);
    let (natural, result) = rest.split_at_mut(NATURAL_BYTES);
    // SAFETY: the rows are readable (the caller's promise); the scratch areas have the sizes
    // `decode` and `tokens` need.
    unsafe {
        decode::<K>(nb, x0, x_stride, mrows, tiles, natural);
        let mut configured = usize::MAX;
        for n0 in (0..ntok).step_by(TOKENS) {
            let nt = TOKENS.min(ntok - n0);
            if nt != configured {
                let mut cfg = TileConfig::new();
                for t in 0..5 {
                    cfg.set(t, nt as u8, 64);
                }
                for t in 5..8 {
                    cfg.set(t, 16, 64);
                }
                cfg.load();
                configured = nt;
            }
            let y = y0.add(n0 * y_stride);
            let out = dst.add(n0 * dst_stride);
            tokens::<K>(
                nb,
                tiles,
                (y, y_stride, nt),
                (out, dst_stride, mrows),
                result,
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
        let (mut d0, mut dmin) = ([0f32; ROWS], [0f32; ROWS]);
        for m in 0..ROWS {
            if m >= mrows {
                for plane in [LO, HI, MIN] {
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
            if kquant::has_min(K) {
                let row = &mut natural[at(MIN, m)..at(MIN, m) + QK_K];
                for (group, &wt) in row.chunks_exact_mut(16).zip(&w.bsum_weights) {
                    group.fill(wt as u8);
                }
            }
            d0[m] = w.d0;
            dmin[m] = w.dmin0;
        }
        for plane in [LO, HI, MIN] {
            if (plane == HI && !has_hi(K)) || (plane == MIN && !kquant::has_min(K)) {
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
        block[D0..DMIN].copy_from_slice(bytemuck::cast_slice(&d0));
        block[DMIN..BLOCK_BYTES].copy_from_slice(bytemuck::cast_slice(&dmin));
    }
}

/// One tile of `nt` activation rows by the decoded 16 weight rows, every super-block in
/// order, into `out + n * out_stride` (the first `mrows` floats of each row).
///
/// # Safety
/// AVX-512 F/BW and the tiles configured for `nt` rows; `tiles` decoded by [`decode`]; the
/// activation rows readable (`nb` Q8_K blocks each); the outputs writable.
#[inline(always)]
unsafe fn tokens<const K: u8>(
    nb: usize,
    tiles: &[u8],
    (y, y_stride, nt): (*const u8, usize, usize),
    (out, out_stride, mrows): (*mut u8, usize, usize),
    result: &mut [u8],
) {
    // SAFETY: AVX-512 F, as the caller promises.
    let mut acc = [unsafe { _mm512_setzero_ps() }; TOKENS];
    for b in 0..nb {
        let block = tiles[b * BLOCK_BYTES..].as_ptr();
        let res = result.as_mut_ptr();
        // SAFETY: the tiles are configured (the caller's promise); A rows: 64 quants of
        // super-block `b` of each activation row; B: the block's decoded planes; results into
        // `result` (a plane's 16 rows of 64 bytes each).
        unsafe {
            amx::zero::<0>();
            if has_hi(K) {
                amx::zero::<1>();
            }
            if kquant::has_min(K) {
                amx::zero::<2>();
            }
            let qs = y.add(b * Q8K_BYTES + 4);
            // A alternates between tiles 3 and 4 and each plane has its own B tile, so the
            // loads for the next products need not wait for the last ones.
            chunk::<K, 3>(qs, y_stride, block, 0);
            chunk::<K, 4>(qs, y_stride, block, 1);
            chunk::<K, 3>(qs, y_stride, block, 2);
            chunk::<K, 4>(qs, y_stride, block, 3);
            amx::store::<0>(res, 64);
            if has_hi(K) {
                amx::store::<1>(res.add(HI * TOKENS * 64), 64);
            }
            if kquant::has_min(K) {
                amx::store::<2>(res.add(MIN * TOKENS * 64), 64);
            }
        }
        // SAFETY: the decoded block's scales and the results are in bounds; the Q8_K blocks
        // `b` of the `nt` activation rows are readable.
        unsafe { epilogue::<K>(block, res, y.add(b * Q8K_BYTES), y_stride, &mut acc[..nt]) };
    }
    let mask = if mrows >= 16 {
        u16::MAX
    } else {
        (1u16 << mrows) - 1
    };
    for (n, a) in acc[..nt].iter().enumerate() {
        // SAFETY: the first `mrows` floats of output row `n` are writable (the caller's
        // promise); the mask stores exactly those.
        unsafe { _mm512_mask_storeu_ps(out.add(n * out_stride).cast(), mask, *a) };
    }
}

/// The products of chunk `c` (64 elements) of a super-block: activations into tile `A`, each
/// plane's B tile (5, 6, 7) and its accumulator (0, 1, 2).
///
/// # Safety
/// The tiles configured; the activation rows' 64 quants at `qs + 64 * c` readable, `y_stride`
/// apart; `block` a decoded super-block.
#[inline(always)]
unsafe fn chunk<const K: u8, const A: u8>(
    qs: *const u8,
    y_stride: usize,
    block: *const u8,
    c: usize,
) {
    // SAFETY: as the caller promises.
    unsafe {
        amx::load::<A>(qs.add(64 * c), y_stride);
        amx::load::<5>(block.add(LO * PLANE + c * 1024), 64);
        if has_hi(K) {
            amx::load::<6>(block.add(HI * PLANE + c * 1024), 64);
        }
        if kquant::has_min(K) {
            amx::load::<7>(block.add(MIN * PLANE + c * 1024), 64);
        }
        amx::dot_signed_unsigned::<0, A, 5>();
        if has_hi(K) {
            amx::dot_signed_signed::<1, A, 6>();
        }
        if kquant::has_min(K) {
            amx::dot_signed_unsigned::<2, A, 7>();
        }
    }
}

/// The float steps of one super-block for every activation row of the tile, from the planes'
/// result tiles.
///
/// # Safety
/// AVX-512 F/BW; `block` a decoded super-block, `res` its result tiles of `acc.len()` rows,
/// `q8` the Q8_K block of the first activation row (the others `q8_stride` apart).
#[inline(always)]
unsafe fn epilogue<const K: u8>(
    block: *const u8,
    res: *const u8,
    q8: *const u8,
    q8_stride: usize,
    acc: &mut [__m512],
) {
    // SAFETY: as the caller promises.
    unsafe {
        let d0 = _mm512_loadu_ps(block.add(D0).cast());
        let dmin = _mm512_loadu_ps(block.add(DMIN).cast());
        for (n, a) in acc.iter_mut().enumerate() {
            let plane = |p: usize| _mm512_loadu_si512(res.add(p * TOKENS * 64 + 64 * n).cast());
            let mut s1 = plane(LO);
            if has_hi(K) {
                s1 = _mm512_add_epi32(s1, _mm512_slli_epi32::<8>(plane(HI)));
            }
            let mut r = _mm512_mul_ps(d0, _mm512_cvtepi32_ps(s1));
            if kquant::has_min(K) {
                r = _mm512_fnmadd_ps(dmin, _mm512_cvtepi32_ps(plane(MIN)), r);
            }
            let d1 = _mm512_set1_ps(q8.add(n * q8_stride).cast::<f32>().read_unaligned());
            *a = _mm512_fmadd_ps(r, d1, *a);
        }
    }
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

    /// Every K-quant type, full and partial tiles of weight rows and activation rows: the AMX
    /// outputs equal the AVX2 tiled kernel's bit for bit.
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
            for (k, mrows, ntok) in [(256, 16, 16), (512, 11, 37), (768, 16, 8), (256, 1, 20)] {
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
