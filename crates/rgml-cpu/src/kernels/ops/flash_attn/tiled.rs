//! ggml-cpu's tiled kernel (`ggml_compute_forward_flash_attn_ext_tiled`), which ggml runs for
//! batches of at least 64 queries with f16 or f32 K and V of one type.
//!
//! Its arithmetic is f32 throughout: cells in tiles of 64; each score a sequential FMA chain
//! over the dimensions from zero (ggml's `simd_gemm`), scaled, soft-capped and masked; each
//! tile's probabilities by ggml's vectorised `exp` ([`vexp::soft_max_row`], summed in f64 and
//! added to the row's f32 sum); the weighted V rows added to each dimension's accumulator by
//! one FMA per cell, in cell order. Every one of those chains is per output element, so the
//! kernel is free to vectorise across cells and dimensions, as here: a block of up to 64
//! queries of one head shares each tile of K (transposed, so 64 cells are one vector run per
//! dimension) and V (widened once).

use super::common::{add_sink, normalise, slope, widen, FlashParams, RowAt, Sources, TILE};
use crate::kernels::isa::CpuFeatures;
use crate::kernels::task::{self, scratch_slice, NodeTask, ThreadCtx};
use crate::kernels::vexp;
use rgml::{DType, Result};

/// Queries whose scores are computed together.
const SCORE_ROWS: usize = 4;

/// Queries whose values are added together.
const VALUE_ROWS: usize = 4;

/// f32 values of per-thread scratch the tiled kernel needs.
pub(super) fn scratch_floats(dk: usize, dv: usize) -> usize {
    // queries, K tile, V tile, scores, accumulators, max and sum per query, 16 K rows widened
    TILE * dk + dk * TILE + TILE * dv + TILE * TILE + TILE * dv + 2 * TILE + KT_CELLS * dk
}

/// One block's scratch (see [`scratch_floats`]).
struct Tiles<'a> {
    q: &'a mut [f32],
    k: &'a mut [f32],
    v: &'a mut [f32],
    scores: &'a mut [f32],
    acc: &'a mut [f32],
    max: &'a mut [f32],
    sum: &'a mut [f32],
    row: &'a mut [f32],
}

impl Tiles<'_> {
    fn of(scratch: &mut [f32], dk: usize, dv: usize) -> Result<Tiles<'_>> {
        let s = scratch_slice(scratch, scratch_floats(dk, dv))?;
        let (q, s) = s.split_at_mut(TILE * dk);
        let (k, s) = s.split_at_mut(dk * TILE);
        let (v, s) = s.split_at_mut(TILE * dv);
        let (scores, s) = s.split_at_mut(TILE * TILE);
        let (acc, s) = s.split_at_mut(TILE * dv);
        let (max, s) = s.split_at_mut(TILE);
        let (sum, row) = s.split_at_mut(TILE);
        Ok(Tiles {
            q,
            k,
            v,
            scores,
            acc,
            max,
            sum,
            row,
        })
    }
}

/// This thread's query rows, in blocks of up to 64 queries of one head.
#[inline(always)]
pub(super) fn tiled(task: &NodeTask, tc: &mut ThreadCtx<'_>, p: &FlashParams) -> Result<()> {
    let src = Sources::of(task, p)?;
    let (dk, dv, n_q) = (src.k.ne[0], src.v.ne[0], src.q.ne[1]);
    let mut t = Tiles::of(tc.scratch, dk, dv)?;
    let mine = task::split(src.rows(), tc.ith, tc.nth);
    let mut r = mine.start;
    while r < mine.end {
        let at = RowAt::of(r, src.q);
        let n_rows = TILE.min(mine.end - r).min(n_q - at.iq1);
        block(task.features, &src, p, at, n_rows, &mut t);
        for i in 0..n_rows {
            // SAFETY: row `(head iq2, query iq1 + i)` of the dense f32 destination, written by
            // this thread only (rows are split between threads).
            let out = unsafe { task::f32_row_mut(task.dst.row(at.iq2, at.iq1 + i, at.iq3), dv) };
            normalise(&t.acc[i * dv..(i + 1) * dv], t.sum[i], out);
        }
        r += n_rows;
    }
    Ok(())
}

/// Queries `at.iq1 .. at.iq1 + n_rows` of head `at.iq2` over every cell: unnormalised
/// accumulators and sums (sinks included) in `t`.
#[inline(always)]
fn block(
    f: CpuFeatures,
    src: &Sources<'_>,
    p: &FlashParams,
    at: RowAt,
    n_rows: usize,
    t: &mut Tiles<'_>,
) {
    let (q, k, v) = (src.q, src.k, src.v);
    let (dk, dv, n_kv) = (k.ne[0], v.ne[0], k.ne[1]);
    let slope = slope(p.max_bias, at.iq2 as u32, q.ne[2] as u32);
    let (ik2, ik3) = at.kv_head(q, k);
    let (iv2, iv3) = at.kv_head(q, v);
    for i in 0..n_rows {
        // SAFETY: a dense, in-bounds f32 row of `q` (the support check makes q's rows dense).
        unsafe {
            widen(
                f,
                DType::F32,
                q.row(at.iq1 + i, at.iq2, at.iq3),
                &mut t.q[i * dk..(i + 1) * dk],
            )
        };
    }
    t.acc[..n_rows * dv].iter_mut().for_each(|a| *a = 0.0);
    t.max[..n_rows]
        .iter_mut()
        .for_each(|m| *m = f32::NEG_INFINITY);
    t.sum[..n_rows].iter_mut().for_each(|s| *s = 0.0);
    for ic in (0..n_kv).step_by(TILE) {
        let n = TILE.min(n_kv - ic);
        if !load_mask(f, src, at, n_rows, ic, n, slope, t.scores) {
            continue;
        }
        load_k_tile(f, k, (ik2, ik3), ic, n, t.k, t.row);
        for c in 0..n {
            // SAFETY: cell `ic + c` of V head `iv2`: a dense, in-bounds row.
            unsafe {
                widen(
                    f,
                    v.dtype,
                    v.row(ic + c, iv2, iv3),
                    &mut t.v[c * dv..(c + 1) * dv],
                )
            };
        }
        if n < TILE {
            // The last tile's missing cells score 0 before their -inf mask (ggml's zero padding).
            for d in 0..dk {
                t.k[d * TILE + n..(d + 1) * TILE]
                    .iter_mut()
                    .for_each(|x| *x = 0.0);
            }
        }
        let mut i = 0;
        while i < n_rows {
            let (q, scores) = (&t.q[i * dk..], &mut t.scores[i * TILE..]);
            if i + SCORE_ROWS <= n_rows {
                score_rows::<SCORE_ROWS>(q, dk, t.k, p, scores);
                i += SCORE_ROWS;
            } else {
                score_rows::<1>(q, dk, t.k, p, scores);
                i += 1;
            }
        }
        // The rows this tile adds to (a row whose scores are all -inf is left as it is).
        let mut active = [0usize; TILE];
        let mut n_active = 0;
        for i in 0..n_rows {
            let scores: &mut [f32; TILE] = (&mut t.scores[i * TILE..(i + 1) * TILE])
                .try_into()
                .unwrap_or_else(|_| unreachable!("a tile row"));
            let tile_max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            if tile_max == f32::NEG_INFINITY {
                continue;
            }
            let acc = &mut t.acc[i * dv..(i + 1) * dv];
            if tile_max > t.max[i] {
                let ms = (t.max[i] - tile_max).exp();
                acc.iter_mut().for_each(|a| *a *= ms);
                t.sum[i] *= ms;
                t.max[i] = tile_max;
            }
            let tile_sum = vexp::soft_max_row(f, scores, t.max[i]);
            t.sum[i] = (f64::from(t.sum[i]) + tile_sum) as f32;
            active[n_active] = i;
            n_active += 1;
        }
        let mut groups = active[..n_active].chunks_exact(VALUE_ROWS);
        for g in &mut groups {
            let rows: [usize; VALUE_ROWS] = std::array::from_fn(|j| g[j]);
            add_values(rows, n, t.scores, &t.v[..n * dv], t.acc, dv);
        }
        for &i in groups.remainder() {
            add_values([i], n, t.scores, &t.v[..n * dv], t.acc, dv);
        }
    }
    if let Some(sinks) = src.sinks {
        for i in 0..n_rows {
            let acc = &mut t.acc[i * dv..(i + 1) * dv];
            add_sink(sinks, at.iq2, &mut t.max[i], &mut t.sum[i], acc);
        }
    }
}

/// K cells widened per transpose: one 16 x 16 block of f32 per 16 dimensions.
const KT_CELLS: usize = 16;

/// K cells `ic .. ic + n` of K head `head` widened into `kt` transposed (dimension `d`'s
/// cells at `kt[d * TILE..]`), 16 cells at a time through `rows` (16 rows of `dk`) and 16 x 16
/// register transposes where the CPU has AVX-512 (the copy is exact either way). Cells past
/// `n` are left to the caller.
#[inline(always)]
fn load_k_tile(
    f: CpuFeatures,
    k: &task::TensorView,
    (ik2, ik3): (usize, usize),
    ic: usize,
    n: usize,
    kt: &mut [f32],
    rows: &mut [f32],
) {
    let dk = k.ne[0];
    for c0 in (0..n).step_by(KT_CELLS) {
        let cells = KT_CELLS.min(n - c0);
        for c in 0..cells {
            // SAFETY: cell `ic + c0 + c < n_kv` of K head `ik2`: a dense, in-bounds row.
            unsafe {
                widen(
                    f,
                    k.dtype,
                    k.row(ic + c0 + c, ik2, ik3),
                    &mut rows[c * dk..(c + 1) * dk],
                )
            };
        }
        #[cfg(target_arch = "x86_64")]
        if f.has_avx512() && dk.is_multiple_of(16) {
            // SAFETY: the CPU has AVX-512 F (the features say so); `rows` holds 16 rows of
            // `dk` (the first `cells` widened), `kt` `dk` rows of `TILE >= c0 + 16`.
            unsafe { transpose_k_cells(&rows[..KT_CELLS * dk], dk, &mut kt[c0..]) };
            continue;
        }
        for c in 0..cells {
            for d in 0..dk {
                kt[d * TILE + c0 + c] = rows[c * dk + d];
            }
        }
    }
}

/// `rows` (16 rows of `dk`) transposed into `kt`: dimension `d`'s 16 values at
/// `kt[d * TILE..]`.
///
/// # Safety
/// The CPU supports AVX-512 F; `dk` is a multiple of 16; `kt` holds `(dk - 1) * TILE + 16`
/// floats.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn transpose_k_cells(rows: &[f32], dk: usize, kt: &mut [f32]) {
    use crate::kernels::simd::x86::transpose16x16_epi32;
    use std::arch::x86_64::*;
    assert!(rows.len() >= KT_CELLS * dk && kt.len() >= (dk - 1) * TILE + 16);
    for d0 in (0..dk).step_by(16) {
        // SAFETY: AVX-512 F; rows `c` hold `dk >= d0 + 16` floats, and dimension `d0 + d`'s 16
        // floats of `kt` are in bounds (both asserted above).
        unsafe {
            let mut block: [__m512i; 16] =
                std::array::from_fn(|c| _mm512_loadu_si512(rows.as_ptr().add(c * dk + d0).cast()));
            transpose16x16_epi32(&mut block);
            for (d, v) in block.iter().enumerate() {
                _mm512_storeu_si512(kt.as_mut_ptr().add((d0 + d) * TILE).cast(), *v);
            }
        }
    }
}

/// Each block row's mask over cells `ic .. ic + n` of the tile, times the slope, into the
/// first `n` scores of its row (0 without a mask) and `-inf` after them; false when every
/// one is `-inf` (ggml skips such a tile).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn load_mask(
    f: CpuFeatures,
    src: &Sources<'_>,
    at: RowAt,
    n_rows: usize,
    ic: usize,
    n: usize,
    slope: f32,
    scores: &mut [f32],
) -> bool {
    let mut any = false;
    for i in 0..n_rows {
        let row = &mut scores[i * TILE..(i + 1) * TILE];
        let mask_row = src.mask_row(RowAt {
            iq1: at.iq1 + i,
            ..at
        });
        match mask_row {
            Some(mr) => {
                // SAFETY: `ic + n <= n_kv <= mask.ne0` (the support check) f16 values of an
                // in-bounds row.
                unsafe { widen(f, DType::F16, mr.wrapping_add(2 * ic), &mut row[..n]) };
                // A slope of 1 (no ALiBi) changes no value, -inf and NaN included.
                if slope != 1.0 {
                    row[..n].iter_mut().for_each(|m| *m *= slope);
                }
            }
            None => row[..n].fill(0.0),
        }
        row[n..].fill(f32::NEG_INFINITY);
        // Without an early exit, so that the check is one vector pass (most rows of a causal
        // mask's tiles past the diagonal are all -inf).
        any |= row[..n]
            .iter()
            .fold(false, |a, &m| a | (m != f32::NEG_INFINITY));
    }
    any
}

/// `NQ` consecutive queries' scores over the tile (query `j`'s `dk` values at `q[j * dk..]`, its
/// scores at `scores[j * TILE..]`, with the mask already there): `k·q` as one FMA chain per
/// cell (`kt` is the K tile transposed, zeros past the last cell), scaled, soft-capped, plus
/// the mask. Several queries share each loaded K value and keep more chains in flight.
#[inline(always)]
fn score_rows<const NQ: usize>(
    q: &[f32],
    dk: usize,
    kt: &[f32],
    p: &FlashParams,
    scores: &mut [f32],
) {
    let qs: [&[f32]; NQ] = std::array::from_fn(|j| &q[j * dk..(j + 1) * dk]);
    let mut dots = [[0f32; TILE]; NQ];
    for (d, kd) in kt.chunks_exact(TILE).take(dk).enumerate() {
        let kd: &[f32; TILE] = kd
            .try_into()
            .unwrap_or_else(|_| unreachable!("a K tile row"));
        for j in 0..NQ {
            let qd = qs[j][d];
            for c in 0..TILE {
                dots[j][c] = qd.mul_add(kd[c], dots[j][c]);
            }
        }
    }
    let scale = p.score_scale();
    for (dots, row) in dots.iter().zip(scores.chunks_exact_mut(TILE)) {
        for (s, &dot) in row.iter_mut().zip(dots) {
            let mut x = dot * scale;
            if p.softcap != 0.0 {
                x = x.tanh() * p.softcap;
            }
            *s += x;
        }
    }
}

/// For each block row `i` of `rows`: `acc_i += w_i[c] * v[c]` for each of the `n` cells `c`
/// in order, one FMA per element (ggml's `simd_gemm` of the probabilities, `scores` row `i`,
/// and the V tile), 32 dimensions at a time so they stay in registers; several rows share each
/// loaded V value and keep more chains in flight.
#[inline(always)]
fn add_values<const NQ: usize>(
    rows: [usize; NQ],
    n: usize,
    scores: &[f32],
    v: &[f32],
    acc: &mut [f32],
    dv: usize,
) {
    for at in (0..dv).step_by(32) {
        if at + 32 <= dv {
            let w: [&[f32; TILE]; NQ] = std::array::from_fn(|j| {
                scores[rows[j] * TILE..(rows[j] + 1) * TILE]
                    .try_into()
                    .unwrap_or_else(|_| unreachable!("a tile row"))
            });
            let mut regs: [[f32; 32]; NQ] = std::array::from_fn(|j| {
                acc[rows[j] * dv + at..rows[j] * dv + at + 32]
                    .try_into()
                    .unwrap_or_else(|_| unreachable!("32 values"))
            });
            for c in 0..n {
                let row: &[f32; 32] = v[c * dv + at..c * dv + at + 32]
                    .try_into()
                    .unwrap_or_else(|_| unreachable!("32 values"));
                for j in 0..NQ {
                    let wc = w[j][c];
                    for k in 0..32 {
                        regs[j][k] = wc.mul_add(row[k], regs[j][k]);
                    }
                }
            }
            for (r, &i) in regs.iter().zip(&rows) {
                acc[i * dv + at..i * dv + at + 32].copy_from_slice(r);
            }
        } else {
            for &i in &rows {
                let part = &mut acc[i * dv + at..(i + 1) * dv];
                for c in 0..n {
                    let wc = scores[i * TILE + c];
                    for (a, &x) in part.iter_mut().zip(&v[c * dv + at..]) {
                        *a = wc.mul_add(x, *a);
                    }
                }
            }
        }
    }
}
