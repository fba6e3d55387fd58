//! MUL_MAT with BF16 weights on CPUs with AVX512_BF16 (used where the node's
//! [`CpuFeatures::bf16_products`] holds):
//! the activations in bf16 and the products with `vdpbf16ps`, as a native ggml-cpu build with
//! `__AVX512BF16__` computes them.
//!
//! This module owns that path's arithmetic: ggml's f32 -> bf16 rounding of the activations
//! (phase 1 writes bf16 rows into the work area, half the f32 rows' size), and phase 2's
//! products, in whichever of ggml's two orders ggml would use for the node's shape:
//!
//! - tinyBLAS (`llamafile_sgemm`, `tinyBLAS<32, __m512, __m512bh, ...>`) when the product has
//!   at least 2 activation columns (`n = ne11`), `k = ne00` is a multiple of 32 and `m = ne01`
//!   of 4 (otherwise tinyBLAS declines): one 16-lane accumulator per output,
//!   `acc = vdpbf16ps(acc, a[l..l + 32], b[l..l + 32])` for `l` in steps of 32, then
//!   `_mm512_reduce_add_ps`;
//! - `ggml_vec_dot_bf16` otherwise (every matrix-vector product): two accumulators over steps
//!   of 64 (`c1` the first 32 elements, `c2` the next 32), each reduced and added into an f64
//!   sum, then the remaining `k % 64` products (exact in f32) added one by one in f64, the sum
//!   rounded to f32.
//!
//! Each lane of `vdpbf16ps` adds the product of its odd pair of bf16 values, then of its even
//! pair, as two f32 FMAs with denormal inputs read as zero, denormal results flushed to zero
//! and round-to-nearest-even (the SDM's pseudo-code; the tests check the instruction against a
//! scalar transcription of it). Tiles (4 weight rows by 4 activation columns) only choose which
//! outputs are computed together: every output gets exactly its own operations, so the results
//! are ggml's bit for bit whatever the tiling, thread count or GQA broadcast.
//!
//! (The ggml described is the one `scripts/bench-vs-llamacpp.sh` builds, llama.cpp as vendored
//! by llama-cpp-python 0.3.36: `ggml_compute_forward_mul_mat` and `ggml_cpu_fp32_to_bf16` in
//! `ggml-cpu/ggml-cpu.c`, `llamafile_sgemm` in `ggml-cpu/llamafile/sgemm.cpp`,
//! `ggml_vec_dot_bf16` in `ggml-cpu/vec.cpp`, `GGML_FP32_TO_BF16` in `ggml-impl.h`.)

// The kernels exist on x86_64 only; elsewhere `products` reports that it cannot run (it is
// never chosen there: `bf16_products` is false).
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code, unused_imports))]

use crate::kernels::isa::CpuFeatures;
use crate::kernels::simd::x86;
use crate::kernels::simd::{prefetch_span, PREFETCH_AHEAD};
use crate::kernels::task;
use crate::kernels::task::Columns;
use crate::kernels::task::ThreadCtx;
use rgml::{Error, Result};

/// bf16 values per `vdpbf16ps` (tinyBLAS's `KN`).
const KN: usize = 32;

/// Weight rows per call of the `ggml_vec_dot_bf16`-order kernel.
pub(crate) const VEC_DOT_ROWS: usize = 8;

/// f32 -> bf16 as ggml rounds activations (`GGML_FP32_TO_BF16`, `ggml_cpu_fp32_to_bf16`): NaNs
/// keep their sign and top payload bits and become quiet; everything else (denormals included,
/// unlike `vcvtneps2bf16`, which flushes them) rounds to nearest even, overflowing to infinity.
#[inline(always)]
pub(crate) fn fp32_to_bf16(x: f32) -> u16 {
    let u = x.to_bits();
    if u & 0x7fff_ffff > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

/// One activation row into bf16 little-endian bytes (`dst` holds `2 * src.len()` bytes).
pub(crate) fn row_to_bf16(src: &[f32], dst: &mut [u8]) -> Result<()> {
    if dst.len() != 2 * src.len() {
        return Err(Error::LengthMismatch {
            what: "bf16 activation row bytes",
            expected: 2 * src.len(),
            actual: dst.len(),
        });
    }
    for (d, &v) in dst.chunks_exact_mut(2).zip(src) {
        d.copy_from_slice(&fp32_to_bf16(v).to_le_bytes());
    }
    Ok(())
}

/// Whether ggml computes a product of `m` weight rows of length `k` by `n` activation columns
/// (per batch) with tinyBLAS rather than `ggml_vec_dot_bf16` (see the module docs).
pub(crate) fn tinyblas_shape(m: usize, n: usize, k: usize) -> bool {
    n >= 2 && k.is_multiple_of(KN) && m.is_multiple_of(4)
}

/// Phase 2 for BF16 weights with bf16 activation rows in the work area (`b_row`): as
/// `float_products`, the weight rows of each batch are split into blocks between threads and
/// each block is multiplied by every activation column broadcast onto its weight matrix
/// (grouped-query attention's heads); in tinyBLAS's order by 4 x 4 tiles, in
/// `ggml_vec_dot_bf16`'s by 8 rows and one column.
///
/// Runs only where [`CpuFeatures::bf16_products`] holds (an error otherwise).
pub(crate) fn products(
    f: CpuFeatures,
    dst: &task::TensorView,
    a: &task::TensorView,
    b_row: &dyn Fn(usize, usize, usize) -> *const u8,
    path_rows: usize,
    tc: &mut ThreadCtx<'_>,
) -> Result<()> {
    #[cfg(target_arch = "x86_64")]
    if f.bf16_products() {
        let (k, m) = (a.ne[0], a.ne[1]);
        let cols = Columns::new(dst, a);
        let tinyblas = tinyblas_shape(m, path_rows, k);
        let weight_batches = a.ne[2] * a.ne[3];
        // Weight rows per kernel call: 4 by 4 columns (tinyBLAS), 8 by one column (vec_dot:
        // two accumulators per row, 16 registers).
        let group = if tinyblas { 4 } else { VEC_DOT_ROWS };
        // Blocks of whole row groups where the rows allow it (edge groups repeat a row).
        let blk = task::row_block(m, weight_batches, tc.nth, group, group);
        let nblk = m.div_ceil(blk);
        let row_bytes = a.row_bytes();
        // Blocks on demand: a descheduled thread's share goes to the others.
        for unit in task::claimed(tc.claim, weight_batches * nblk) {
            let (i02, i03) = ((unit / nblk) % a.ne[2], unit / nblk / a.ne[2]);
            let i0 = (unit % nblk) * blk;
            let rows = i0..(i0 + blk).min(m);
            // Columns outside, so that each group of columns is located once per block (its
            // broadcast indices cost divisions) while the block's weight rows stay in cache.
            let step = if tinyblas { 4 } else { 1 };
            for c0 in (0..cols.n).step_by(step) {
                let nc = (cols.n - c0).min(step);
                let at: [(usize, usize, usize); 4] =
                    std::array::from_fn(|j| cols.at(c0 + j.min(nc - 1), i02, i03));
                let y: [*const u8; 4] = at.map(|(i11, i12, i13)| b_row(i11, i12, i13));
                let dst_rows: [*mut u8; 4] = at.map(|(i11, i12, i13)| dst.row(i11, i12, i13));
                let store = |c: usize, i01: usize, v: f32| {
                    // SAFETY: the stores below write element i01 < m of a destination row of
                    // column group c0 (in bounds), of a row block this thread owns.
                    unsafe { dst_rows[c].wrapping_add(i01 * 4).cast::<f32>().write(v) }
                };
                for r0 in rows.clone().step_by(group) {
                    let nr = (rows.end - r0).min(group);
                    let x: [*const u8; VEC_DOT_ROWS] =
                        std::array::from_fn(|r| a.row(r0 + r.min(nr - 1), i02, i03).cast_const());
                    if cols.n == 1 {
                        // A matrix-vector product streams the weights: prefetch ahead as the
                        // quantized path does.
                        prefetch_span(x[0].wrapping_add(PREFETCH_AHEAD), nr * row_bytes);
                    }
                    if tinyblas {
                        // SAFETY: bf16_products() implies AVX512_BF16, F, BW and VL; each x[r] is
                        // a dense in-bounds weight row of k bf16 values and each y[c] a bf16 row
                        // of k values in the work area, complete since phase 1's barrier; k is a
                        // multiple of KN (tinyblas_shape).
                        let out = unsafe { tile_tinyblas(std::array::from_fn(|r| x[r]), y, k) };
                        for (r, row) in out.iter().enumerate().take(nr) {
                            for (c, &v) in row.iter().enumerate().take(nc) {
                                store(c, r0 + r, v);
                            }
                        }
                    } else {
                        // SAFETY: as above, for the first column (k any length).
                        let out = unsafe { rows_vec_dot(x, y[0], k) };
                        for (r, &v) in out.iter().enumerate().take(nr) {
                            store(0, r0 + r, v);
                        }
                    }
                }
            }
        }
        return Ok(());
    }
    let _ = (f, dst, a, b_row, tc);
    Err(Error::Backend {
        backend: "CPU".into(),
        message: "MUL_MAT: the BF16 dot-product kernels need AVX512_BF16".into(),
    })
}

/// `ggml_vec_dot_bf16` of each weight row `x[r]` with the bf16 activation row `y`, as a native
/// build with `__AVX512BF16__` computes it (MUL_MAT_ID's products, which ggml always computes
/// pair by pair). An error where [`CpuFeatures::bf16_products`] does not hold.
///
/// # Safety
/// Every `x[r]` and `y` points at `k` readable bf16 values.
pub(crate) unsafe fn vec_dot_rows(
    f: CpuFeatures,
    x: [*const u8; VEC_DOT_ROWS],
    y: *const u8,
    k: usize,
) -> Result<[f32; VEC_DOT_ROWS]> {
    #[cfg(target_arch = "x86_64")]
    if f.bf16_products() {
        // SAFETY: bf16_products() implies AVX512_BF16, F, BW and VL; the rows as the caller
        // promises.
        return Ok(unsafe { rows_vec_dot(x, y, k) });
    }
    let _ = (f, x, y, k);
    Err(Error::Backend {
        backend: "CPU".into(),
        message: "MUL_MAT_ID: the BF16 dot-product kernels need AVX512_BF16".into(),
    })
}

/// 32 bf16 values at `p` (element `l`) as a `vdpbf16ps` operand.
///
/// # Safety
/// 64 readable bytes at `p + 2 l`; the CPU supports AVX-512F.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn load_bh(p: *const u8, l: usize) -> std::arch::x86_64::__m512bh {
    use std::arch::x86_64::*;
    // SAFETY: as the caller promises; __m512i and __m512bh are both 64 bytes of plain data.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(p.add(2 * l).cast())) }
}

/// `out[r][c]`: tinyBLAS's output for weight row `x[r]` and activation row `y[c]`.
///
/// # Safety
/// The CPU supports AVX512_BF16, F, BW and VL; every row holds `k` bf16 values, `k` a multiple
/// of [`KN`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn tile_tinyblas(x: [*const u8; 4], y: [*const u8; 4], k: usize) -> [[f32; 4]; 4] {
    use std::arch::x86_64::*;
    let mut acc = [[_mm512_setzero_ps(); 4]; 4];
    let mut l = 0;
    // SAFETY: every load reads KN values at l + KN <= k of a row of k values.
    unsafe {
        while l + KN <= k {
            let xv: [__m512bh; 4] = std::array::from_fn(|r| load_bh(x[r], l));
            let yv: [__m512bh; 4] = std::array::from_fn(|c| load_bh(y[c], l));
            for (acc_r, &xr) in acc.iter_mut().zip(&xv) {
                for (a, &yc) in acc_r.iter_mut().zip(&yv) {
                    *a = _mm512_dpbf16_ps(*a, xr, yc);
                }
            }
            l += KN;
        }
        let sums = x86::hsum16x16(std::array::from_fn(|j| acc[j / 4][j % 4]));
        std::array::from_fn(|r| std::array::from_fn(|c| sums[4 * r + c]))
    }
}

/// `ggml_vec_dot_bf16` of each weight row `x[r]` with the activation row `y`.
///
/// # Safety
/// The CPU supports AVX512_BF16, F, BW and VL; every row holds `k` bf16 values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn rows_vec_dot(
    x: [*const u8; VEC_DOT_ROWS],
    y: *const u8,
    k: usize,
) -> [f32; VEC_DOT_ROWS] {
    use std::arch::x86_64::*;
    let mut c1 = [_mm512_setzero_ps(); VEC_DOT_ROWS];
    let mut c2 = [_mm512_setzero_ps(); VEC_DOT_ROWS];
    let mut i = 0;
    // SAFETY: every load reads KN values at i + 2 KN <= k of a row of k values; the tail reads
    // single values below k.
    unsafe {
        while i + 2 * KN <= k {
            let (y1, y2) = (load_bh(y, i), load_bh(y, i + KN));
            for r in 0..VEC_DOT_ROWS {
                c1[r] = _mm512_dpbf16_ps(c1[r], load_bh(x[r], i), y1);
                c2[r] = _mm512_dpbf16_ps(c2[r], load_bh(x[r], i + KN), y2);
            }
            i += 2 * KN;
        }
        let sums = x86::hsum16x16(std::array::from_fn(|j| {
            if j < VEC_DOT_ROWS {
                c1[j]
            } else {
                c2[j - VEC_DOT_ROWS]
            }
        }));
        let value = |p: *const u8, j: usize| {
            f32::from_bits(u32::from(p.add(2 * j).cast::<u16>().read_unaligned()) << 16)
        };
        std::array::from_fn(|r| {
            let mut s = 0f64;
            s += f64::from(sums[r]);
            s += f64::from(sums[VEC_DOT_ROWS + r]);
            for j in i..k {
                s += f64::from(value(x[r], j) * value(y, j));
            }
            s as f32
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// bf16 bits as f32.
    fn f(h: u16) -> f32 {
        f32::from_bits(u32::from(h) << 16)
    }

    /// Denormals read (or written) as zero of the same sign.
    fn daz(v: f32) -> f32 {
        if v.is_subnormal() {
            0f32.copysign(v)
        } else {
            v
        }
    }

    /// One lane of `vdpbf16ps` as the SDM writes it: the odd pair's FMA, then the even pair's,
    /// each with denormal inputs as zero, denormal results flushed, round to nearest even (the
    /// products of two bf16 values are exact in f32, so `mul_add` is that FMA).
    fn dp_lane(acc: f32, a: [u16; 2], b: [u16; 2]) -> f32 {
        let acc = daz(daz(f(a[1])).mul_add(daz(f(b[1])), daz(acc)));
        daz(daz(f(a[0])).mul_add(daz(f(b[0])), acc))
    }

    /// tinyBLAS's output, scalar.
    fn emu_tinyblas(x: &[u16], y: &[u16]) -> f32 {
        let mut acc = [0f32; 16];
        for (xs, ys) in x.chunks_exact(KN).zip(y.chunks_exact(KN)) {
            for (i, a) in acc.iter_mut().enumerate() {
                *a = dp_lane(*a, [xs[2 * i], xs[2 * i + 1]], [ys[2 * i], ys[2 * i + 1]]);
            }
        }
        crate::kernels::simd::hsum16(&acc)
    }

    /// `ggml_vec_dot_bf16` with `__AVX512BF16__`, scalar.
    fn emu_vec_dot(x: &[u16], y: &[u16]) -> f32 {
        let n = x.len() - x.len() % (2 * KN);
        let (mut c1, mut c2) = ([0f32; 16], [0f32; 16]);
        for (xs, ys) in x[..n].chunks_exact(2 * KN).zip(y.chunks_exact(2 * KN)) {
            for (c, off) in [(&mut c1, 0), (&mut c2, KN)] {
                for (i, a) in c.iter_mut().enumerate() {
                    let j = off + 2 * i;
                    *a = dp_lane(*a, [xs[j], xs[j + 1]], [ys[j], ys[j + 1]]);
                }
            }
        }
        let mut s = 0f64;
        s += f64::from(crate::kernels::simd::hsum16(&c1));
        s += f64::from(crate::kernels::simd::hsum16(&c2));
        for (&a, &b) in x[n..].iter().zip(&y[n..]) {
            s += f64::from(f(a) * f(b));
        }
        s as f32
    }

    /// Random bf16 values: mostly moderate, some denormal, tiny (products underflow), huge
    /// (sums overflow to infinity), zero.
    fn values(rng: &mut StdRng, n: usize) -> Vec<u16> {
        (0..n)
            .map(|_| {
                let sign = if rng.gen_bool(0.5) { 0x8000 } else { 0 };
                let mant: u16 = rng.gen_range(0..0x80);
                let exp: u16 = match rng.gen_range(0..100) {
                    0..3 => 0,
                    3..6 => rng.gen_range(1..8),
                    6..8 => rng.gen_range(250..255),
                    8..9 => return sign,
                    _ => rng.gen_range(110..140),
                };
                sign | (exp << 7) | mant
            })
            .collect()
    }

    fn bytes(v: &[u16]) -> Vec<u8> {
        v.iter().flat_map(|h| h.to_le_bytes()).collect()
    }

    /// The instruction itself against the scalar transcription of its pseudo-code.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn vdpbf16ps_matches_the_scalar_lanes() {
        if !CpuFeatures::detect().has_avx512_bf16() {
            return;
        }
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
        fn dp(acc: &[f32; 16], a: &[u8], b: &[u8]) -> [f32; 16] {
            use std::arch::x86_64::*;
            let mut o = [0f32; 16];
            // SAFETY: 16 f32 values at `acc` and `o`, 64 bytes at `a` and `b` (asserted).
            unsafe {
                assert!(a.len() == 64 && b.len() == 64);
                let r = _mm512_dpbf16_ps(
                    _mm512_loadu_ps(acc.as_ptr()),
                    load_bh(a.as_ptr(), 0),
                    load_bh(b.as_ptr(), 0),
                );
                _mm512_storeu_ps(o.as_mut_ptr(), r);
            }
            o
        }
        let mut rng = StdRng::seed_from_u64(21);
        for _ in 0..20_000 {
            let (a, b) = (values(&mut rng, KN), values(&mut rng, KN));
            let acc: [f32; 16] = std::array::from_fn(|_| match rng.gen_range(0..4) {
                0 => 0.0,
                1 => f32::from_bits(rng.gen::<u32>() & 0x807f_ffff),
                _ => f32::from_bits(
                    (rng.gen::<u32>() & 0x807f_ffff) | (rng.gen_range(1u32..254) << 23),
                ),
            });
            // SAFETY: has_avx512_bf16() checked the features.
            let got = unsafe { dp(&acc, &bytes(&a), &bytes(&b)) };
            for (i, g) in got.iter().enumerate() {
                let want = dp_lane(acc[i], [a[2 * i], a[2 * i + 1]], [b[2 * i], b[2 * i + 1]]);
                assert_eq!(g.to_bits(), want.to_bits(), "lane {i}");
            }
        }
    }

    /// Both kernels give the scalar transcriptions' bits, for lengths with and without tails.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn kernels_match_the_scalar_transcriptions() {
        if !CpuFeatures::detect().has_avx512_bf16() {
            return;
        }
        let mut rng = StdRng::seed_from_u64(22);
        for k in [0, 1, 31, 32, 63, 64, 65, 96, 100, 128, 576, 1000, 1056] {
            for _ in 0..20 {
                let rows: Vec<Vec<u16>> = (0..12).map(|_| values(&mut rng, k)).collect();
                let raw: Vec<Vec<u8>> = rows.iter().map(|r| bytes(r)).collect();
                let x: [*const u8; 8] = std::array::from_fn(|r| raw[r].as_ptr());
                let y: [*const u8; 4] = std::array::from_fn(|c| raw[8 + c].as_ptr());
                // SAFETY: has_avx512_bf16() checked the features; 12 rows of k values.
                let v = unsafe { rows_vec_dot(x, y[0], k) };
                for r in 0..8 {
                    let want = emu_vec_dot(&rows[r], &rows[8]);
                    assert_eq!(v[r].to_bits(), want.to_bits(), "vec_dot k {k} row {r}");
                }
                if k.is_multiple_of(KN) {
                    // SAFETY: as above, k a multiple of KN.
                    let t = unsafe { tile_tinyblas(std::array::from_fn(|r| x[r]), y, k) };
                    for r in 0..4 {
                        for c in 0..4 {
                            let want = emu_tinyblas(&rows[r], &rows[8 + c]);
                            assert_eq!(t[r][c].to_bits(), want.to_bits(), "k {k} ({r}, {c})");
                        }
                    }
                }
            }
        }
    }

    /// ggml's rounding is `half`'s (which the F32 path's rounding through BF16 uses), for every
    /// class of input.
    #[test]
    fn rounding_is_ggml_round_to_nearest_even() {
        let mut rng = StdRng::seed_from_u64(23);
        let specials = [
            0u32,
            0x8000_0000,
            0x0000_0001,
            0x0000_8000,
            0x0001_8000,
            0x7f7f_ffff,
            0x7f80_0000,
            0xff80_0000,
            0x7f80_0001,
            0xffc0_0000,
            0x3f80_8000,
            0x3f81_8000,
            0x3f80_8001,
        ];
        let bits = specials
            .into_iter()
            .chain((0..200_000).map(|_| rng.gen::<u32>()));
        for u in bits {
            let v = f32::from_bits(u);
            assert_eq!(fp32_to_bf16(v), half::bf16::from_f32(v).to_bits(), "{u:#x}");
        }
        // Ties to even, denormals kept, overflow to infinity, NaNs quiet.
        assert_eq!(fp32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(fp32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(fp32_to_bf16(f32::from_bits(0x0001_8000)), 0x0002);
        assert_eq!(fp32_to_bf16(f32::MAX), 0x7f80);
        assert_eq!(fp32_to_bf16(f32::from_bits(0x7f80_0001)), 0x7fc0);
        let mut out = [0u8; 4];
        assert!(row_to_bf16(&[1.0, -2.0], &mut out).is_ok());
        assert_eq!(out, [0x80, 0x3f, 0x00, 0xc0]);
        assert!(row_to_bf16(&[1.0], &mut out).is_err());
    }

    /// MUL_MAT through the backend, for shapes that take each of ggml's orders (tinyBLAS;
    /// `vec_dot` for one column, for k % 32 != 0, for m % 4 != 0), broadcast batches and a
    /// strided src1: within f32 rounding of the f64 product of the operands as ggml rounds
    /// them, and, on the `vdpbf16ps` path, bit for bit the scalar transcription of ggml's order.
    /// Four weights share src1 (BF16, BF16, F16, BF16): the second product reuses the first's
    /// bf16 rows, the last must convert src1 again after the F16 product's f32 rows.
    #[test]
    fn mul_mat_through_the_backend() {
        use crate::{CpuBackend, CpuDevice};
        use rgml::{Backend, Context, DType, Device, Graph};
        // The backends below run with the detected features (`CpuBackend::new`).
        let exact = CpuFeatures::detect().bf16_products();
        let mut rng = StdRng::seed_from_u64(24);
        // (k, m, n, weight batches, activation batches, strided src1)
        let shapes = [
            (64, 8, 5, [2, 1], [4, 2], false),
            (128, 12, 9, [1, 1], [1, 1], true),
            (1056, 4, 2, [1, 1], [1, 1], false),
            (100, 7, 1, [2, 1], [4, 1], false),
            (4096, 16, 1, [1, 1], [1, 1], false),
            (40, 9, 5, [1, 1], [1, 1], false),
            (96, 6, 3, [1, 1], [2, 1], true),
        ];
        for (k, m, n, wb, ab, strided) in shapes {
            for nth in [1, 3] {
                let mut ctx = Context::new();
                let weights = [
                    (DType::BF16, m),
                    (DType::BF16, m + 4),
                    (DType::F16, 5),
                    (DType::BF16, m),
                ];
                let ws: Vec<_> = weights
                    .iter()
                    .map(|&(t, rows)| ctx.new_tensor(t, &[k, rows, wb[0], wb[1]]).unwrap())
                    .collect();
                let (b, bsrc) = if strided {
                    let t = ctx.new_tensor(DType::F32, &[n, k, ab[0], ab[1]]).unwrap();
                    (ctx.transpose(t).unwrap(), t)
                } else {
                    let t = ctx.new_tensor(DType::F32, &[k, n, ab[0], ab[1]]).unwrap();
                    (t, t)
                };
                let outs: Vec<_> = ws.iter().map(|&w| ctx.mul_mat(w, b).unwrap()).collect();
                let buft = CpuDevice::new("CPU").buffer_type();
                rgml::alloc::alloc_ctx_tensors(&mut ctx, &buft).unwrap();
                // Weights as bits of their type, and the rounding of activations to it.
                let round = |t: DType, v: f32| match t {
                    DType::BF16 => fp32_to_bf16(v),
                    _ => half::f16::from_f32(v).to_bits(),
                };
                let value = |t: DType, h: u16| match t {
                    DType::BF16 => f(h),
                    _ => half::f16::from_bits(h).to_f32(),
                };
                let wvals: Vec<Vec<u16>> = weights
                    .iter()
                    .map(|&(t, rows)| {
                        (0..k * rows * wb[0] * wb[1])
                            .map(|_| round(t, rng.gen_range(-1.0..1.0)))
                            .collect()
                    })
                    .collect();
                let vsrc: Vec<f32> = (0..k * n * ab[0] * ab[1])
                    .map(|_| rng.gen_range(-2.0..2.0))
                    .collect();
                for (&w, v) in ws.iter().zip(&wvals) {
                    ctx.tensor_set(w, 0, &bytes(v)).unwrap();
                }
                ctx.tensor_set(bsrc, 0, bytemuck::cast_slice(&vsrc))
                    .unwrap();
                let g = Graph::build(&mut ctx, &outs).unwrap();
                CpuBackend::new(nth)
                    .unwrap()
                    .graph_compute(&ctx, &g)
                    .unwrap();
                let (r2, r3) = (ab[0] / wb[0], ab[1] / wb[1]);
                for ((&(t, m), wa), &o) in weights.iter().zip(&wvals).zip(&outs) {
                    let got: Vec<f32> = ctx
                        .tensor_bytes(o)
                        .unwrap()
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect();
                    // Activation (i, j, batch) rounded to the weight type as ggml does.
                    let act = |i: usize, j: usize, batch: usize| {
                        let idx = if strided {
                            j + n * (i + k * batch)
                        } else {
                            i + k * (j + n * batch)
                        };
                        round(t, vsrc[idx])
                    };
                    for b3 in 0..ab[1] {
                        for b2 in 0..ab[0] {
                            let batch = b2 + ab[0] * b3;
                            let wbatch = b2 / r2 + wb[0] * (b3 / r3);
                            for j in 0..n {
                                let y: Vec<u16> = (0..k).map(|i| act(i, j, batch)).collect();
                                for r in 0..m {
                                    let x = &wa[k * (r + m * wbatch)..][..k];
                                    let v = got[r + m * (j + n * batch)];
                                    let (want, mag) =
                                        x.iter().zip(&y).fold((0f64, 0f64), |(s, a), (&p, &q)| {
                                            let pq =
                                                f64::from(value(t, p)) * f64::from(value(t, q));
                                            (s + pq, a + pq.abs())
                                        });
                                    let err = (f64::from(v) - want).abs();
                                    let what = format!("{t} k {k} m {m} n {n} ({r}, {j}, {batch})");
                                    assert!(err <= 1e-6 * mag, "{what}: {v} vs {want}");
                                    if exact && t == DType::BF16 {
                                        let e = if tinyblas_shape(m, n, k) {
                                            emu_tinyblas(x, &y)
                                        } else {
                                            emu_vec_dot(x, &y)
                                        };
                                        assert_eq!(v.to_bits(), e.to_bits(), "{what}");
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn tinyblas_takes_what_ggml_gives_it() {
        assert!(tinyblas_shape(8, 2, 64));
        assert!(!tinyblas_shape(8, 1, 64));
        assert!(!tinyblas_shape(8, 2, 48));
        assert!(!tinyblas_shape(6, 2, 64));
        assert!(tinyblas_shape(4, 256, 0));
    }
}
