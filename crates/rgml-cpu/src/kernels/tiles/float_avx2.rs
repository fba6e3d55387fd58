//! AVX2 kernels for F32, F16 and BF16 weights under the AVX2 arithmetic: weight rows are read
//! in place and widened in registers (`vcvtph2ps` for F16, a 16-bit shift for BF16; both
//! exact), never decoded into scratch rows first.
//!
//! Two orders, each giving ggml's bits for every output:
//! - [`tile`]: llamafile's tinyBLAS (`tinyBLAS<8, __m256, ...>`, the path for two activation
//!   rows or more): one 8-lane accumulator per output, `fma` in steps of 8, then `hsum`. An
//!   `RM x RN` register tile (2 x 6 here; tinyBLAS runs 4 x 3) keeps every output's own
//!   accumulator, so the tile changes only how often rows are loaded and widened.
//! - [`vec_dot`]: `ggml_vec_dot_f16/bf16/f32` (one activation row, or shapes tinyBLAS
//!   declines), the order of [`super::vec_float`], prefetching the weight stream ahead.
//! - [`vec_dot16`]: the same `ggml_vec_dot_*` as the AVX-512 build computes it (16-lane
//!   accumulators, lanes summed in `_mm512_reduce_add_ps`'s order), for the AVX-512
//!   arithmetic on an AVX-512 CPU; the AVX-512 build's tinyBLAS tiles live in `matmul`
//!   (`f32_tile_avx512`).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use crate::kernels::dots::float::{leftovers_f32, leftovers_f64};
use crate::kernels::fp16::f16_bits_to_f32;
use crate::kernels::simd;
use crate::kernels::simd::x86::{hsum16, hsum8};
use crate::kernels::task;

/// Weight element types, as const parameters (`W`) so each kernel is compiled per type.
pub(crate) const F32: u8 = 0;
pub(crate) const F16: u8 = 1;
pub(crate) const BF16: u8 = 2;

/// Bytes per weight element of type `W`.
const fn elem_bytes(w: u8) -> usize {
    if w == F32 {
        4
    } else {
        2
    }
}

/// Eight weights from element `i` of the row at `p`, widened to f32 lanes.
///
/// # Safety
/// AVX2 and F16C; `p` holds elements `i..i + 8` of type `W`.
#[inline(always)]
unsafe fn load8<const W: u8>(p: *const u8, i: usize) -> __m256 {
    // SAFETY: the caller guarantees the 8 elements and the CPU features.
    unsafe {
        let q = p.add(i * elem_bytes(W));
        match W {
            F32 => _mm256_loadu_ps(q.cast()),
            F16 => _mm256_cvtph_ps(_mm_loadu_si128(q.cast())),
            _ => _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(
                _mm_loadu_si128(q.cast()),
            ))),
        }
    }
}

/// Elements `from..from + out.len()` of the row at `x` (type `W`), widened exactly to f32:
/// the leftovers past a `vec_dot`'s vector steps.
///
/// # Safety
/// `x` holds those elements.
#[inline(always)]
unsafe fn widen_tail<const W: u8>(x: *const u8, from: usize, out: &mut [f32]) {
    for (i, v) in out.iter_mut().enumerate() {
        // SAFETY: element `from + i` is inside the row (the caller's promise).
        let p = unsafe { x.add((from + i) * elem_bytes(W)) };
        // SAFETY: as above; unaligned reads of plain values.
        *v = unsafe {
            match W {
                F32 => p.cast::<f32>().read_unaligned(),
                F16 => f16_bits_to_f32(p.cast::<u16>().read_unaligned()),
                _ => half::bf16::from_bits(p.cast::<u16>().read_unaligned()).to_f32(),
            }
        };
    }
}

/// `out[r][c]` = tinyBLAS's dot of weight row `x[r]` (type `W`) and f32 row `y[c]`, `n`
/// elements each.
///
/// # Safety
/// AVX2, FMA and F16C; `n % 8 == 0`; each `x[r]` points to `n` elements of type `W`, each
/// `y[c]` to `n` f32 values.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn tile<const W: u8, const RM: usize, const RN: usize>(
    x: &[*const u8; RM],
    y: &[*const f32; RN],
    n: usize,
    out: &mut [[f32; RN]; RM],
) {
    let mut acc = [[_mm256_setzero_ps(); RN]; RM];
    // SAFETY: every load reads 8 elements at `k + 8 <= n` of a row of `n` (the caller's
    // promise), on a CPU with the enabled features.
    unsafe {
        for k in (0..n).step_by(8) {
            // Weight rows widened once per step; activation loads fold into the FMAs.
            let xv: [__m256; RM] = std::array::from_fn(|r| load8::<W>(x[r], k));
            for (c, &yc) in y.iter().enumerate() {
                let yv = _mm256_loadu_ps(yc.add(k));
                for (acc_r, xr) in acc.iter_mut().zip(&xv) {
                    acc_r[c] = _mm256_fmadd_ps(*xr, yv, acc_r[c]);
                }
            }
        }
        for (out_r, acc_r) in out.iter_mut().zip(&acc) {
            for (o, a) in out_r.iter_mut().zip(acc_r) {
                *o = hsum8(*a);
            }
        }
    }
}

/// `ggml_vec_dot_*` of weight row `x` (type `W`) and f32 row `y`, `n` elements each, as the
/// AVX2 build computes it (see [`super::vec_float`]); prefetches the weight row `ahead` bytes
/// past what it reads.
///
/// # Safety
/// AVX2, FMA and F16C; `x` points to `n` elements of type `W`, `y` to `n` f32 values.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn vec_dot<const W: u8>(
    x: *const u8,
    y: *const f32,
    n: usize,
    ahead: usize,
) -> f32 {
    let np = n - n % 32;
    let mut sum = [_mm256_setzero_ps(); 4];
    // SAFETY: loads read elements below `np <= n` of rows of `n` and the leftovers `np..n` of
    // both rows (the caller's promise); the prefetches are hints that never fault.
    unsafe {
        for k in (0..np).step_by(32) {
            let line = x.add(k * elem_bytes(W)).wrapping_add(ahead);
            simd::prefetch(line);
            if W == F32 {
                simd::prefetch(line.wrapping_add(64));
            }
            for (j, s) in sum.iter_mut().enumerate() {
                let xv = load8::<W>(x, k + 8 * j);
                *s = _mm256_fmadd_ps(xv, _mm256_loadu_ps(y.add(k + 8 * j)), *s);
            }
        }
        let folded = _mm256_add_ps(_mm256_add_ps(sum[0], sum[2]), _mm256_add_ps(sum[1], sum[3]));
        let s = if W == BF16 {
            hsum8(folded)
        } else {
            // `GGML_F32x8_REDUCE`: low half + high half, then `hadd` twice.
            let t = _mm_add_ps(
                _mm256_castps256_ps128(folded),
                _mm256_extractf128_ps::<1>(folded),
            );
            let t = _mm_hadd_ps(t, t);
            _mm_cvtss_f32(_mm_hadd_ps(t, t))
        };
        // The < 32 leftovers, widened (exactly) for the scalar tails.
        let mut xs = [0f32; 32];
        widen_tail::<W>(x, np, &mut xs[..n - np]);
        let ys = std::slice::from_raw_parts(y.add(np), n - np);
        if W == F32 {
            leftovers_f32(s, &xs[..n - np], ys, false)
        } else {
            leftovers_f64(f64::from(s), &xs[..n - np], ys)
        }
    }
}

/// Sixteen weights from element `i` of the row at `p`, widened to f32 lanes.
///
/// # Safety
/// AVX-512 F and BW; `p` holds elements `i..i + 16` of type `W`.
#[inline(always)]
unsafe fn load16<const W: u8>(p: *const u8, i: usize) -> __m512 {
    // SAFETY: the caller guarantees the 16 elements and the CPU features.
    unsafe {
        let q = p.add(i * elem_bytes(W));
        match W {
            F32 => _mm512_loadu_ps(q.cast()),
            F16 => _mm512_cvtph_ps(_mm256_loadu_si256(q.cast())),
            _ => _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(
                _mm256_loadu_si256(q.cast()),
            ))),
        }
    }
}

/// [`vec_dot`] as the AVX-512 build computes it: `A` accumulators of 16 lanes (4 for F16 and
/// F32, folded `(0 + 2) + (1 + 3)` and reduced once; 2 for BF16 without AVX512_BF16, each
/// reduced and both added in f64), then the leftovers as that build adds them
/// ([`super::vec_float`]).
///
/// # Safety
/// AVX-512 F, BW, DQ and VL, AVX2, FMA and F16C; `x` points to `n` elements of type `W`, `y` to
/// `n` f32 values.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn vec_dot16<const W: u8>(
    x: *const u8,
    y: *const f32,
    n: usize,
    ahead: usize,
) -> f32 {
    let accs = if W == BF16 { 2 } else { 4 };
    let step = 16 * accs;
    let np = n - n % step;
    let mut sum = [_mm512_setzero_ps(); 4];
    // SAFETY: loads read elements below `np <= n` of rows of `n` and the leftovers `np..n` of
    // both rows (the caller's promise); the prefetches are hints that never fault.
    unsafe {
        for k in (0..np).step_by(step) {
            let line = x.add(k * elem_bytes(W)).wrapping_add(ahead);
            for b in (0..step * elem_bytes(W)).step_by(64) {
                simd::prefetch(line.wrapping_add(b));
            }
            for (j, s) in sum.iter_mut().enumerate().take(accs) {
                let xv = load16::<W>(x, k + 16 * j);
                *s = _mm512_fmadd_ps(xv, _mm512_loadu_ps(y.add(k + 16 * j)), *s);
            }
        }
        let mut xs = [0f32; 64];
        let xs = &mut xs[..n - np];
        widen_tail::<W>(x, np, xs);
        let ys = std::slice::from_raw_parts(y.add(np), n - np);
        if W == BF16 {
            let total = f64::from(hsum16(sum[0])) + f64::from(hsum16(sum[1]));
            return leftovers_f64(total, xs, ys);
        }
        let folded = _mm512_add_ps(_mm512_add_ps(sum[0], sum[2]), _mm512_add_ps(sum[1], sum[3]));
        let s = hsum16(folded);
        if W == F32 {
            leftovers_f32(s, xs, ys, true)
        } else {
            leftovers_f64(f64::from(s), xs, ys)
        }
    }
}

/// Columns per block of the tinyBLAS order: their f32 rows (up to 24 x 6 KiB) stay in L2
/// while every 4-row tile of the weight block passes over them.
const COL_BLOCK: usize = 24;

/// Phase 2 of MUL_MAT for F32/F16/BF16 weights under the AVX2 arithmetic on an AVX2 CPU, and
/// for the pair-by-pair products under the AVX-512 arithmetic on an AVX-512 CPU: as
/// `float_products` (the same blocks of weight rows, taken on demand, every activation column
/// broadcast onto a weight matrix), with the kernels above. `pairwise`: ggml's `vec_dot`
/// order (tinyBLAS declines the shape), else tinyBLAS's. `wide`: the AVX-512 build's `vec_dot`
/// ([`vec_dot16`]), only with `pairwise`.
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C, and with `wide` AVX-512 F, BW, DQ and VL; `a` is F32,
/// F16 or BF16 with dense rows; `b_row` gives dense f32 rows of `a.ne[0]` values (src1, or its
/// copy complete since phase 1); with `!pairwise`, `a.ne[0] % 8 == 0` and `!wide`.
pub(crate) unsafe fn products(
    dst: &task::TensorView,
    a: &task::TensorView,
    b_row: &dyn Fn(usize, usize, usize) -> *const u8,
    tc: &mut task::ThreadCtx<'_>,
    pairwise: bool,
    wide: bool,
) -> rgml::Result<()> {
    // SAFETY: forwarded from the caller.
    unsafe {
        match a.dtype {
            rgml::DType::F32 => run::<F32>(dst, a, b_row, tc, pairwise, wide),
            rgml::DType::F16 => run::<F16>(dst, a, b_row, tc, pairwise, wide),
            rgml::DType::BF16 => run::<BF16>(dst, a, b_row, tc, pairwise, wide),
            other => Err(rgml::Error::Backend {
                backend: "CPU".into(),
                message: format!("MUL_MAT: no float kernel for {other}"),
            }),
        }
    }
}

/// [`products`] for weights of type `W`.
///
/// # Safety
/// As [`products`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run<const W: u8>(
    dst: &task::TensorView,
    a: &task::TensorView,
    b_row: &dyn Fn(usize, usize, usize) -> *const u8,
    tc: &mut task::ThreadCtx<'_>,
    pairwise: bool,
    wide: bool,
) -> rgml::Result<()> {
    let (k, m) = (a.ne[0], a.ne[1]);
    let cols = task::Columns::new(dst, a);
    let weight_batches = a.ne[2] * a.ne[3];
    let group = if pairwise { 1 } else { 4 };
    // Blocks of whole 4-row tiles (tinyBLAS takes only `m % 4 == 0`).
    let blk = task::row_block(m, weight_batches, tc.nth, 4, group);
    let nblk = m.div_ceil(blk);
    let ahead = if cols.n == 1 { simd::PREFETCH_AHEAD } else { 0 };
    // Blocks on demand: a descheduled thread's share goes to the others.
    for unit in task::claimed(tc.claim, weight_batches * nblk) {
        let (i02, i03) = ((unit / nblk) % a.ne[2], unit / nblk / a.ne[2]);
        let i0 = (unit % nblk) * blk;
        let rows = i0..(i0 + blk).min(m);
        for c0 in (0..cols.n).step_by(COL_BLOCK) {
            let nc = (cols.n - c0).min(COL_BLOCK);
            let mut y = [std::ptr::null::<f32>(); COL_BLOCK];
            let mut out_rows = [std::ptr::null_mut::<f32>(); COL_BLOCK];
            for (j, (yj, oj)) in y.iter_mut().zip(&mut out_rows).enumerate().take(nc) {
                let (i11, i12, i13) = cols.at(c0 + j, i02, i03);
                *yj = b_row(i11, i12, i13).cast();
                *oj = dst.row(i11, i12, i13).cast();
            }
            let x = |i01: usize| a.row(i01, i02, i03).cast_const();
            // SAFETY: weight rows below `m` of batch (i02, i03) are dense and in bounds, the
            // `nc` column rows hold `k` f32 values each, and the outputs (i01, column) are in
            // bounds and written only by this thread (it owns the row block); the caller
            // promised the features (AVX-512 with `wide`) and `k % 8 == 0` for the tile.
            unsafe {
                if pairwise {
                    for (yj, oj) in y.iter().zip(&out_rows).take(nc) {
                        for i01 in rows.clone() {
                            let dot = if wide {
                                vec_dot16::<W>(x(i01), *yj, k, ahead)
                            } else {
                                vec_dot::<W>(x(i01), *yj, k, ahead)
                            };
                            oj.add(i01).write(dot);
                        }
                    }
                } else {
                    for r0 in rows.clone().step_by(TILE_ROWS) {
                        let xr: [*const u8; TILE_ROWS] = std::array::from_fn(|r| x(r0 + r));
                        tile_row::<W>(&xr, &y[..nc], &out_rows[..nc], r0, k);
                    }
                }
            }
        }
    }
    Ok(())
}

/// Weight rows per register tile of the tinyBLAS order, and columns: 12 accumulators, 2 rows
/// widened per step (F16/BF16 conversions cost as much as FMAs on Zen), the activations read
/// by the FMAs from memory. (tinyBLAS itself runs 4 x 3; every output keeps its own
/// accumulator and operations either way.)
const TILE_ROWS: usize = 2;
const TILE_COLS: usize = 6;

/// `TILE_ROWS` weight rows from `r0` against every column of `y`, written to `out[c][r0 +
/// r]`, by `TILE_ROWS x TILE_COLS` tiles (the last one narrower).
///
/// # Safety
/// As [`tile`] for each column; `out[c]` has room for rows `r0..r0 + TILE_ROWS`, owned by the
/// caller.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_row<const W: u8>(
    x: &[*const u8; TILE_ROWS],
    y: &[*const f32],
    out: &[*mut f32],
    r0: usize,
    k: usize,
) {
    for (yc, oc) in y.chunks(TILE_COLS).zip(out.chunks(TILE_COLS)) {
        // SAFETY: forwarded from the caller.
        unsafe {
            match yc.len() {
                6 => narrow::<W, 6>(x, yc, oc, r0, k),
                5 => narrow::<W, 5>(x, yc, oc, r0, k),
                4 => narrow::<W, 4>(x, yc, oc, r0, k),
                3 => narrow::<W, 3>(x, yc, oc, r0, k),
                2 => narrow::<W, 2>(x, yc, oc, r0, k),
                _ => narrow::<W, 1>(x, yc, oc, r0, k),
            }
        }
    }
}

/// One `TILE_ROWS x RN` tile of [`tile_row`].
///
/// # Safety
/// As [`tile_row`], with `y` and `out` of `RN` columns.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn narrow<const W: u8, const RN: usize>(
    x: &[*const u8; TILE_ROWS],
    y: &[*const f32],
    out: &[*mut f32],
    r0: usize,
    k: usize,
) {
    let mut o = [[0f32; RN]; TILE_ROWS];
    // SAFETY: forwarded from the caller.
    unsafe {
        tile::<W, TILE_ROWS, RN>(x, &std::array::from_fn(|c| y[c]), k, &mut o);
        for (c, dst) in out.iter().enumerate() {
            for (r, row) in o.iter().enumerate() {
                dst.add(r0 + r).write(row[c]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::dots::float::{self as vec_float, Flavor};
    use crate::kernels::isa::CpuFeatures;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// Random rows stored as `w` and their exact f32 values.
    fn rows(rng: &mut StdRng, w: u8, count: usize, n: usize) -> (Vec<Vec<u8>>, Vec<Vec<f32>>) {
        (0..count)
            .map(|_| {
                let v: Vec<f32> = (0..n).map(|_| rng.gen_range(-3.0f32..3.0)).collect();
                match w {
                    F32 => (bytemuck::cast_slice(&v).to_vec(), v),
                    F16 => {
                        let h: Vec<half::f16> = v.iter().map(|&x| half::f16::from_f32(x)).collect();
                        let back = h.iter().map(|x| x.to_f32()).collect();
                        (bytemuck::cast_slice(&h).to_vec(), back)
                    }
                    _ => {
                        let h: Vec<half::bf16> =
                            v.iter().map(|&x| half::bf16::from_f32(x)).collect();
                        let back = h.iter().map(|x| x.to_f32()).collect();
                        (bytemuck::cast_slice(&h).to_vec(), back)
                    }
                }
            })
            .unzip()
    }

    fn check<const W: u8>(f: CpuFeatures, flavor: Flavor) {
        let mut rng = StdRng::seed_from_u64(40 + u64::from(W));
        for n in [8, 64, 96, 576, 1000, 1536, 1, 37, 100] {
            let (xb, xf) = rows(&mut rng, W, 4, n);
            let (_, yf) = rows(&mut rng, F32, 3, n);
            let xp: [*const u8; 4] = std::array::from_fn(|r| xb[r].as_ptr());
            let yp: [*const f32; 3] = std::array::from_fn(|c| yf[c].as_ptr());
            for r in 0..4 {
                for c in 0..3 {
                    // SAFETY: AVX2, FMA, F16C checked; rows of `n` elements.
                    let got = unsafe { vec_dot::<W>(xp[r], yp[c], n, 4096) };
                    let want = vec_float::vec_dot(f, flavor, &xf[r], &yf[c]);
                    assert_eq!(got.to_bits(), want.to_bits(), "vec_dot {flavor:?} n {n}");
                    let exact: f64 = xf[r]
                        .iter()
                        .zip(&yf[c])
                        .map(|(a, b)| f64::from(*a) * f64::from(*b))
                        .sum();
                    assert!((f64::from(got) - exact).abs() <= 1e-4 * (n as f64).sqrt() * 9.0);
                }
            }
            if n % 8 != 0 {
                continue;
            }
            let mut out = [[f32::NAN; 3]; 4];
            // SAFETY: as above, and `n % 8 == 0`.
            unsafe { tile::<W, 4, 3>(&xp, &yp, n, &mut out) };
            for r in 0..4 {
                for c in 0..3 {
                    let want = crate::kernels::dots::float::dot_f32_tinyblas(f, &xf[r], &yf[c]);
                    assert_eq!(out[r][c].to_bits(), want.to_bits(), "tile {flavor:?} n {n}");
                }
            }
        }
    }

    /// Both kernels give the portable definitions' bits ([`vec_float`] and tinyBLAS's
    /// `dot_f32_tinyblas`), and stay near the f64 dot.
    #[test]
    fn kernels_equal_the_portable_orders() {
        let f = CpuFeatures::resolve(Some(crate::IsaChoice::Avx2));
        if !f.has_avx2() {
            eprintln!("skipped: no AVX2 on this CPU");
            return;
        }
        check::<F32>(f, Flavor::F32);
        check::<F16>(f, Flavor::F16);
        check::<BF16>(f, Flavor::Bf16);
    }

    /// The AVX-512 build's `vec_dot` ([`vec_dot16`]) gives [`vec_float`]'s 16-lane bits.
    fn check16<const W: u8>(f: CpuFeatures, flavor: Flavor) {
        let mut rng = StdRng::seed_from_u64(60 + u64::from(W));
        for n in [1, 15, 16, 31, 32, 63, 64, 100, 576, 1000, 1536] {
            let (xb, xf) = rows(&mut rng, W, 3, n);
            let (_, yf) = rows(&mut rng, F32, 2, n);
            for (xb, xf) in xb.iter().zip(&xf) {
                for y in &yf {
                    // SAFETY: AVX-512 F/BW/DQ/VL, AVX2, FMA, F16C checked; rows of `n`.
                    let got = unsafe { vec_dot16::<W>(xb.as_ptr(), y.as_ptr(), n, 4096) };
                    let want = vec_float::vec_dot(f, flavor, xf, y);
                    assert_eq!(got.to_bits(), want.to_bits(), "vec_dot16 {flavor:?} n {n}");
                }
            }
        }
    }

    #[test]
    fn wide_vec_dot_equals_the_portable_order() {
        let f = CpuFeatures::resolve(Some(crate::IsaChoice::Avx512));
        if !(f.has_avx512() && f.wide()) {
            eprintln!("skipped: no AVX-512 on this CPU");
            return;
        }
        check16::<F32>(f, Flavor::F32);
        check16::<F16>(f, Flavor::F16);
        check16::<BF16>(f, Flavor::Bf16);
    }
}
