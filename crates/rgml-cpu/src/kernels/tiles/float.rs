//! 4 x 4 tiles of F32 and F16 products in llamafile tinyBLAS's order (each output bit for bit
//! [`dot_f32_tinyblas`] of its pair): AVX-512 register tiles that load each row once for four
//! partners, F16 rows widened in registers, and the portable pair-by-pair form elsewhere.

use crate::kernels::dots::float::dot_f32_tinyblas;
use crate::kernels::isa::CpuFeatures;
#[cfg(target_arch = "x86_64")]
use crate::kernels::simd::x86::hsum16x16;

/// `out[r][c] = dot_f32_tinyblas(x[r], y[c])` for 4 x 4 rows of one length, bit for bit: each pair
/// keeps its own `L`-lane accumulator through the same FMAs and horizontal sum; the tile only
/// loads each row once for four partners.
fn dot_f32_tile(f: CpuFeatures, x: &[&[f32]; 4], y: &[&[f32]; 4], out: &mut [[f32; 4]; 4]) {
    #[cfg(target_arch = "x86_64")]
    if f32_tile_avx512(f) {
        // SAFETY: `f32_tile_avx512(f)`: `f` says the CPU has AVX-512F, BW and VL.
        unsafe { dot_f32_tile_avx512(x, y, out) };
        return;
    }
    for (out_r, xr) in out.iter_mut().zip(x) {
        for (o, yc) in out_r.iter_mut().zip(y) {
            *o = dot_f32_tinyblas(f, xr, yc);
        }
    }
}

/// Whether [`dot_f32_tile`] and [`dot_f16_tile_avx512`] may use their AVX-512 form: the
/// AVX-512 arithmetic is selected and the CPU has AVX-512F, BW and VL (without them the pair
/// dots give the same bits).
pub(crate) fn f32_tile_avx512(f: CpuFeatures) -> bool {
    cfg!(target_arch = "x86_64") && f.wide() && f.has_avx512()
}

/// The 16-lane tile with AVX-512 intrinsics, for f32 rows (see [`tile_avx512`]).
///
/// # Safety
/// The CPU must support AVX-512F, BW and VL.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl")]
unsafe fn dot_f32_tile_avx512(x: &[&[f32]; 4], y: &[&[f32]; 4], out: &mut [[f32; 4]; 4]) {
    let n = x[0].len();
    if x.iter().chain(y).any(|r| r.len() != n) {
        return;
    }
    // SAFETY: four rows of `n` f32 values each, on a CPU with AVX-512F.
    unsafe { tile_avx512::<false>(x.map(|r| r.as_ptr().cast()), n, y, out) }
}

/// The same tile reading F16 weight rows directly: each 16 halves are widened in a register
/// (`vcvtph2ps`, exact), which is what decoding the row to f32 first would give, without the
/// decode pass (the KV cache's rows in attention).
///
/// # Safety
/// The CPU must support AVX-512F, BW and VL.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl")]
unsafe fn dot_f16_tile_avx512(x: &[&[u16]; 4], y: &[&[f32]; 4], out: &mut [[f32; 4]; 4]) {
    let n = x[0].len();
    if x.iter().any(|r| r.len() != n) || y.iter().any(|r| r.len() != n) {
        return;
    }
    // SAFETY: four rows of `n` f16 values each, on a CPU with AVX-512F, BW and VL.
    unsafe { tile_avx512::<true>(x.map(|r| r.as_ptr().cast()), n, y, out) }
}

/// 16 accumulators of 16 lanes in registers; the tail goes into lanes `0..n % 16` with a
/// masked FMA (the other lanes keep their value, as `dot_f32_generic` leaves them). Rows `x`
/// hold f32 values, or f16 values when `F16`.
///
/// # Safety
/// The CPU must support AVX-512F (and BW and VL when `F16`); each `x[r]` points to `n` values
/// and each `y[c]` has `n`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl")]
unsafe fn tile_avx512<const F16: bool>(
    x: [*const u8; 4],
    n: usize,
    y: &[&[f32]; 4],
    out: &mut [[f32; 4]; 4],
) {
    use std::arch::x86_64::*;
    let full = n - n % 16;
    let mut acc = [[_mm512_setzero_ps(); 4]; 4];
    // SAFETY: every load reads 16 values at `k0 < full <= n` of a row of length `n`, or (the
    // tail) only the lanes below `n - full` under the mask.
    unsafe {
        let load_x = |r: usize, k0: usize| -> __m512 {
            if F16 {
                _mm512_cvtph_ps(_mm256_loadu_si256(x[r].cast::<u16>().add(k0).cast()))
            } else {
                _mm512_loadu_ps(x[r].cast::<f32>().add(k0))
            }
        };
        let mut k0 = 0;
        while k0 < full {
            let xv: [__m512; 4] = std::array::from_fn(|r| load_x(r, k0));
            let yv: [__m512; 4] = std::array::from_fn(|c| _mm512_loadu_ps(y[c].as_ptr().add(k0)));
            for (acc_r, xr) in acc.iter_mut().zip(&xv) {
                for (a, yc) in acc_r.iter_mut().zip(&yv) {
                    *a = _mm512_fmadd_ps(*xr, *yc, *a);
                }
            }
            k0 += 16;
        }
        if full < n {
            let mask: __mmask16 = (1u16 << (n - full)) - 1;
            let xv: [__m512; 4] = std::array::from_fn(|r| {
                if F16 {
                    _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(
                        mask,
                        x[r].cast::<i16>().add(full).cast(),
                    ))
                } else {
                    _mm512_maskz_loadu_ps(mask, x[r].cast::<f32>().add(full))
                }
            });
            let yv: [__m512; 4] =
                std::array::from_fn(|c| _mm512_maskz_loadu_ps(mask, y[c].as_ptr().add(full)));
            for (acc_r, xr) in acc.iter_mut().zip(&xv) {
                for (a, yc) in acc_r.iter_mut().zip(&yv) {
                    *a = _mm512_mask3_fmadd_ps(*xr, *yc, *a, mask);
                }
            }
        }
        let sums = hsum16x16(std::array::from_fn(|j| acc[j / 4][j % 4]));
        for (j, v) in sums.into_iter().enumerate() {
            out[j / 4][j % 4] = v;
        }
    }
}

/// One 4 x 4 tile of float products in tinyBLAS's order: F16 rows widened in registers
/// (`direct_f16`, AVX-512) or decoded rows.
pub(crate) fn float_tile(
    f: CpuFeatures,
    direct_f16: bool,
    xs: &[&[f32]; 4],
    halves: &[&[u16]; 4],
    ys: &[&[f32]; 4],
    out: &mut [[f32; 4]; 4],
) {
    #[cfg(target_arch = "x86_64")]
    if direct_f16 {
        // SAFETY: `direct_f16` implies `f32_tile_avx512(f)` (AVX-512F, BW, VL).
        unsafe { dot_f16_tile_avx512(halves, ys, out) };
        return;
    }
    let _ = (direct_f16, halves);
    dot_f32_tile(f, xs, ys, out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// The F16 tile gives each pair's `dot_f32_tinyblas` of the decoded row bit for bit.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn f16_tiles_equal_the_pair_dots_of_decoded_rows() {
        let f = CpuFeatures::resolve(Some(crate::kernels::isa::IsaChoice::Avx512));
        if !f32_tile_avx512(f) {
            return;
        }
        let mut rng = StdRng::seed_from_u64(12);
        for n in [7, 16, 64, 70, 256, 261] {
            let halves: Vec<Vec<u16>> = (0..4)
                .map(|_| {
                    (0..n)
                        .map(|_| half::f16::from_f32(rng.gen_range(-2.0..2.0)).to_bits())
                        .collect()
                })
                .collect();
            let decoded: Vec<Vec<f32>> = halves
                .iter()
                .map(|r| {
                    r.iter()
                        .map(|&h| half::f16::from_bits(h).to_f32())
                        .collect()
                })
                .collect();
            let cols: Vec<Vec<f32>> = (0..4)
                .map(|_| (0..n).map(|_| rng.gen_range(-2.0..2.0)).collect())
                .collect();
            let x: [&[u16]; 4] = std::array::from_fn(|r| halves[r].as_slice());
            let y: [&[f32]; 4] = std::array::from_fn(|c| cols[c].as_slice());
            let mut out = [[f32::NAN; 4]; 4];
            // SAFETY: f32_tile_avx512(f) checked AVX-512F, BW and VL.
            unsafe { dot_f16_tile_avx512(&x, &y, &mut out) };
            for r in 0..4 {
                for c in 0..4 {
                    let want = dot_f32_tinyblas(f, &decoded[r], y[c]);
                    assert_eq!(out[r][c].to_bits(), want.to_bits(), "n {n} ({r}, {c})");
                }
            }
        }
    }

    /// The 4 x 4 tile gives each pair's `dot_f32_tinyblas` bit for bit, with and without a tail, for
    /// both arithmetic variants.
    #[test]
    fn f32_tiles_equal_the_pair_dots() {
        use crate::kernels::isa::IsaChoice;
        let mut rng = StdRng::seed_from_u64(11);
        for n in [7, 16, 64, 70, 256, 261] {
            let rows: Vec<Vec<f32>> = (0..8)
                .map(|_| (0..n).map(|_| rng.gen_range(-2.0..2.0)).collect())
                .collect();
            let x: [&[f32]; 4] = std::array::from_fn(|r| rows[r].as_slice());
            let y: [&[f32]; 4] = std::array::from_fn(|c| rows[4 + c].as_slice());
            for f in [IsaChoice::Avx2, IsaChoice::Avx512].map(|c| CpuFeatures::resolve(Some(c))) {
                let mut out = [[f32::NAN; 4]; 4];
                dot_f32_tile(f, &x, &y, &mut out);
                for r in 0..4 {
                    for c in 0..4 {
                        let want = dot_f32_tinyblas(f, x[r], y[c]);
                        assert_eq!(out[r][c].to_bits(), want.to_bits(), "n {n} ({r}, {c})");
                    }
                }
            }
        }
    }
}
