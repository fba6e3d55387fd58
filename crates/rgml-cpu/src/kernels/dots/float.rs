//! ggml's `ggml_vec_dot_f16`, `ggml_vec_dot_bf16` and `ggml_vec_dot_f32`: the dot products a
//! native ggml-cpu build runs for F16, BF16 and F32 weights pair by pair, where llamafile's
//! tinyBLAS ([`crate::kernels::dots::float::dot_f32_tinyblas`]'s order) declines: one activation row (generation
//! steps, the last block's FFN and the output projection), a row length that is not a multiple
//! of the vector width, or a weight row count that is not a multiple of 4.
//!
//! Their order: `A` accumulators of `L` lanes take consecutive `L`-element slices of each
//! `A·L`-element step by FMA (GCC contracts the BF16 kernel's `add(mul)` so, checked in the
//! AVX2 build's disassembly). Then, by flavour:
//! - F16 and F32 (`A = 4`, `L` = 8 on AVX2, 16 on AVX-512): folded `(0 + 2) + (1 + 3)`, lanes
//!   summed with the build's `GGML_F32_VEC_REDUCE` (AVX2: halves, then `hadd` twice; AVX-512:
//!   `_mm512_reduce_add_ps`);
//! - BF16 on AVX2 (`A = 4`, `L = 8`): the same fold, lanes summed as `hsum` (halves, then
//!   `movehl`, `movehdup`); on AVX-512 without AVX512_BF16 (`A = 2`, `L = 16`): each
//!   accumulator reduced on its own and both added in f64.
//!
//! The `n % (A·L)` leftover products: F16 and BF16 add them one by one in f64 and round the
//! total to f32 once; F32 keeps an f32 sum, into which GCC's code for the AVX2 build adds
//! groups of four rounded products one by one and the last `< 4` by scalar FMA (all of them by
//! FMA when there are at most 3), and the AVX-512 build groups of eight and the last `< 8`
//! ([`leftovers_f32`]; the K = 544 cases of `tests/ggml_matmul.rs` leave 32, which both orders
//! sum alike; GATED_DELTA_NET's rows of 20 and 37 in `tests/ggml_recurrent.rs` tell them apart,
//! against a Sapphire Rapids native build).

use crate::kernels::isa::CpuFeatures;
use crate::kernels::simd;
use crate::kernels::simd::{hsum16, hsum8};

/// Which of ggml's float `vec_dot` kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Flavor {
    F16,
    Bf16,
    F32,
}

/// The `flavor` kernel of the build `f` mirrors on `x` and `y` (f16/bf16 values widened to
/// f32 for those flavours), of equal length.
pub(crate) fn vec_dot(f: super::CpuFeatures, flavor: Flavor, x: &[f32], y: &[f32]) -> f32 {
    let wide = f.wide();
    #[cfg(target_arch = "x86_64")]
    if f.has_avx2() {
        // SAFETY: `f` says the CPU has AVX2 and FMA.
        return unsafe { vec_dot_avx2(flavor, x, y, wide) };
    }
    portable(flavor, x, y, wide)
}

/// ggml's `ggml_vec_dot_f16` of the f16 row at `x`, read in place, and `y` (f16 values
/// widened to f32), as the build `f` mirrors computes it: flash attention's `k·q` per cell
/// without a pass that widens each K row first. The caller inlines it under its own target
/// features.
///
/// # Safety
/// `x` must point at `y.len()` readable f16 values.
#[inline(always)]
pub(crate) unsafe fn vec_dot_f16_in_place(f: CpuFeatures, x: *const u16, y: &[f32]) -> f32 {
    let wide = f.wide();
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: the features say the CPU has the instructions; `x` holds `y.len()` values
        // (the caller's promise).
        let steps = unsafe {
            match (wide, f.has_avx512(), f.has_avx2()) {
                (true, true, _) => Some(simd::x86::dot_f16_steps_avx512(x, y)),
                (false, _, true) => Some(simd::x86::dot_f16_steps_avx2(x, y)),
                _ => None,
            }
        };
        if let Some((sum, np)) = steps {
            // SAFETY: `x` holds `y.len()` values (the caller's promise).
            return unsafe { f16_leftovers(sum, np, x, y) };
        }
    }
    // SAFETY: as the caller promises.
    let x: Vec<f32> = (0..y.len())
        .map(|i| crate::kernels::fp16::f16_bits_to_f32(unsafe { x.add(i).read_unaligned() }))
        .collect();
    portable(Flavor::F16, &x, y, wide)
}

/// [`vec_dot_f16_in_place`] of 8 f16 rows against one `y`: on the AVX2 build the 8 sums
/// reduced together ([`simd::x86::dot_f16_steps_avx2_x8`], the same additions per row),
/// otherwise one row at a time.
///
/// # Safety
/// Every row must point at `y.len()` readable f16 values.
#[inline(always)]
pub(crate) unsafe fn vec_dot_f16_in_place_x8(
    f: CpuFeatures,
    rows: &[*const u16; 8],
    y: &[f32],
) -> [f32; 8] {
    #[cfg(target_arch = "x86_64")]
    if !f.wide() && f.has_avx2() {
        // SAFETY: the features say the CPU has AVX2, FMA and F16C; each row holds `y.len()`
        // values (the caller's promise).
        let (sums, np) = unsafe { simd::x86::dot_f16_steps_avx2_x8(rows, y) };
        let mut out = [0f32; 8];
        for ((o, &sum), &row) in out.iter_mut().zip(&sums).zip(rows) {
            // SAFETY: each row holds `y.len()` values (the caller's promise).
            *o = unsafe { f16_leftovers(sum, np, row, y) };
        }
        return out;
    }
    let mut out = [0f32; 8];
    for (o, &row) in out.iter_mut().zip(rows) {
        // SAFETY: as the caller promises.
        *o = unsafe { vec_dot_f16_in_place(f, row, y) };
    }
    out
}

/// A vector sum over `x[..np]·y[..np]` plus the products past `np`, added in f64 as ggml's
/// `ggml_vec_dot_f16` adds its leftovers.
///
/// # Safety
/// `x` must point at `y.len()` readable f16 values.
#[inline(always)]
unsafe fn f16_leftovers(sum: f32, np: usize, x: *const u16, y: &[f32]) -> f32 {
    let mut total = f64::from(sum);
    for (i, &b) in y.iter().enumerate().skip(np) {
        // SAFETY: element `i < y.len()` of the row.
        let a = crate::kernels::fp16::f16_bits_to_f32(unsafe { x.add(i).read_unaligned() });
        total += f64::from(a * b);
    }
    total as f32
}

/// [`portable`] compiled with AVX2 and FMA, so the lane loops become vector FMAs.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn vec_dot_avx2(flavor: Flavor, x: &[f32], y: &[f32], wide: bool) -> f32 {
    portable(flavor, x, y, wide)
}

#[inline(always)]
fn portable(flavor: Flavor, x: &[f32], y: &[f32], wide: bool) -> f32 {
    match (flavor, wide) {
        (Flavor::Bf16, true) => {
            let (acc, np) = accumulate::<16, 2>(x, y);
            let s =
                f64::from(reduce::<16>(&acc[0], false)) + f64::from(reduce::<16>(&acc[1], false));
            leftovers_f64(s, &x[np..], &y[np..])
        }
        (_, true) => finish::<16>(flavor, x, y),
        (_, false) => finish::<8>(flavor, x, y),
    }
}

/// The four-accumulator kernels.
#[inline(always)]
fn finish<const L: usize>(flavor: Flavor, x: &[f32], y: &[f32]) -> f32 {
    let (sum, np) = accumulate::<L, 4>(x, y);
    // `(0 + 2) + (1 + 3)`, lane by lane.
    let folded: [f32; L] =
        std::array::from_fn(|l| (sum[0][l] + sum[2][l]) + (sum[1][l] + sum[3][l]));
    let s = reduce::<L>(&folded, flavor != Flavor::Bf16);
    match flavor {
        Flavor::F32 => leftovers_f32(s, &x[np..], &y[np..], L == 16),
        _ => leftovers_f64(f64::from(s), &x[np..], &y[np..]),
    }
}

/// `A` accumulators of `L` lanes over the whole `A·L`-element steps; returns them and the
/// number of elements taken.
#[inline(always)]
pub(super) fn accumulate<const L: usize, const A: usize>(
    x: &[f32],
    y: &[f32],
) -> ([[f32; L]; A], usize) {
    let n = x.len().min(y.len());
    let step = A * L;
    let np = n - n % step;
    let mut sum = [[0f32; L]; A];
    for (xs, ys) in x[..np].chunks_exact(step).zip(y[..np].chunks_exact(step)) {
        for (j, acc) in sum.iter_mut().enumerate() {
            let (xj, yj) = (&xs[j * L..(j + 1) * L], &ys[j * L..(j + 1) * L]);
            for l in 0..L {
                acc[l] = xj[l].mul_add(yj[l], acc[l]);
            }
        }
    }
    (sum, np)
}

/// F16/BF16 leftovers: each f32 product added in f64, the total rounded once.
#[inline(always)]
pub(crate) fn leftovers_f64(mut total: f64, x: &[f32], y: &[f32]) -> f32 {
    for (a, b) in x.iter().zip(y) {
        total += f64::from(a * b);
    }
    total as f32
}

/// `sum + Σ x[i]·y[i]` as GCC compiles a scalar loop `sumf += x[i]*y[i]` that it vectorizes
/// without reassociating (`ggml_vec_dot_f32`'s F32 leftovers, SSM_CONV's sums): vectors of
/// rounded products added one by one in order, then the last `n % g` (all of them when `n <
/// g`) by scalar FMA, where `g` is the narrowest vector of GCC's code: 4 in the AVX2 builds (8
/// lanes, then 4), 8 in the AVX-512 (`wide`) build (16 lanes, then 8). Read from both builds'
/// code and checked against their outputs (`tests/ggml_recurrent.rs`: rows of 20 and 37 values
/// tell the two apart).
#[inline(always)]
pub(crate) fn leftovers_f32(mut sum: f32, x: &[f32], y: &[f32], wide: bool) -> f32 {
    let n = x.len().min(y.len());
    let g = if wide { 8 } else { 4 };
    let grouped = if n < g { 0 } else { n - n % g };
    for (a, b) in x[..grouped].iter().zip(&y[..grouped]) {
        sum += a * b;
    }
    for (a, b) in x[grouped..n].iter().zip(&y[grouped..n]) {
        sum = a.mul_add(*b, sum);
    }
    sum
}

/// The build's horizontal sum of one accumulator: `hadd` (`GGML_F32x8_REDUCE`'s two `hadd`s)
/// or `hsum`'s `movehl`/`movehdup` for 8 lanes; `_mm512_reduce_add_ps` for 16.
#[inline(always)]
pub(super) fn reduce<const L: usize>(v: &[f32; L], hadd: bool) -> f32 {
    if let Ok(v) = <&[f32; 16]>::try_from(v.as_slice()) {
        return hsum16(v);
    }
    if let (Ok(v), false) = (<&[f32; 8]>::try_from(v.as_slice()), hadd) {
        return hsum8(v);
    }
    // `GGML_F32x8_REDUCE`: low half + high half, then `hadd` twice.
    let t: [f32; 4] = std::array::from_fn(|k| v[k] + v[k + 4]);
    (t[0] + t[1]) + (t[2] + t[3])
}

/// f32 dot product in tinyBLAS's order for the build `f` mirrors (see [`super::isa`]); uses
/// AVX2+FMA code generation when the CPU has it.
#[inline]
pub(crate) fn dot_f32_tinyblas(f: CpuFeatures, x: &[f32], y: &[f32]) -> f32 {
    let wide = f.wide();
    #[cfg(target_arch = "x86_64")]
    {
        if f.has_avx2() {
            // SAFETY: `f` says the CPU has AVX2 and FMA.
            return unsafe { dot_f32_avx2(x, y, wide) };
        }
    }
    if wide {
        dot_f32_generic::<16>(x, y, f32::mul_add)
    } else {
        dot_f32_generic::<8>(x, y, f32::mul_add)
    }
}

/// The same loop compiled for AVX2+FMA (no hand-written intrinsics: the target features let the
/// compiler use 8-wide registers and fused multiply-adds).
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_f32_avx2(x: &[f32], y: &[f32], wide: bool) -> f32 {
    if wide {
        dot_f32_generic::<16>(x, y, f32::mul_add)
    } else {
        dot_f32_generic::<8>(x, y, f32::mul_add)
    }
}

/// Dot product as llamafile's tinyBLAS computes each output of an F32/F16 matmul (llama.cpp's
/// path for attention): one `L`-lane accumulator (8 on AVX2, `tinyBLAS<8, __m256, ...>`; 16 on
/// AVX-512, `tinyBLAS<16, __m512, ...>`), `acc = fma(a, b, acc)` for `k` in steps of `L`, then
/// `hsum` (the AVX `hsum`, or `_mm512_reduce_add_ps`). A tail of `k % L` elements goes into
/// lanes `0..k % L`, which is what tinyBLAS computes on llama.cpp's zero-padded KV cache.
#[inline(always)]
fn dot_f32_generic<const L: usize>(
    x: &[f32],
    y: &[f32],
    fma: impl Fn(f32, f32, f32) -> f32,
) -> f32 {
    let mut acc = [0f32; L];
    let (xc, yc) = (x.chunks_exact(L), y.chunks_exact(L));
    let (xt, yt) = (xc.remainder(), yc.remainder());
    for (a, b) in xc.zip(yc) {
        for k in 0..L {
            acc[k] = fma(a[k], b[k], acc[k]);
        }
    }
    for (k, (a, b)) in xt.iter().zip(yt).enumerate() {
        acc[k] = fma(*a, *b, acc[k]);
    }
    if L == 16 {
        let mut w = [0f32; 16];
        w.copy_from_slice(&acc[..16]);
        simd::hsum16(&w)
    } else {
        let mut w = [0f32; 8];
        w.copy_from_slice(&acc[..8]);
        simd::hsum8(&w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::isa::CpuFeatures;
    use half::f16;
    use rand::{rngs::StdRng, Rng, SeedableRng};

    fn values(rng: &mut StdRng, flavor: Flavor, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                let v = rng.gen_range(-2.0f32..2.0);
                match flavor {
                    Flavor::F16 => f16::from_f32(v).to_f32(),
                    Flavor::Bf16 => half::bf16::from_f32(v).to_f32(),
                    Flavor::F32 => v,
                }
            })
            .collect()
    }

    /// The lane sum written out from the build's instructions.
    fn lane_sum(v: &[f32], hadd: bool) -> f32 {
        if v.len() == 16 {
            let h: Vec<f32> = (0..8).map(|k| v[k + 8] + v[k]).collect();
            let q: Vec<f32> = (0..4).map(|k| h[k + 4] + h[k]).collect();
            (q[0] + q[2]) + (q[1] + q[3])
        } else {
            let q: Vec<f32> = (0..4).map(|k| v[k + 4] + v[k]).collect();
            if hadd {
                (q[0] + q[1]) + (q[2] + q[3])
            } else {
                (q[0] + q[2]) + (q[1] + q[3])
            }
        }
    }

    /// The definition written out element by element, independently of the kernels.
    fn by_definition(flavor: Flavor, wide: bool, x: &[f32], y: &[f32]) -> f32 {
        let l = if wide { 16 } else { 8 };
        let accs = if wide && flavor == Flavor::Bf16 { 2 } else { 4 };
        let np = x.len() - x.len() % (accs * l);
        let mut acc = vec![vec![0f32; l]; accs];
        for i in 0..np {
            let (j, lane) = ((i % (accs * l)) / l, i % l);
            acc[j][lane] = x[i].mul_add(y[i], acc[j][lane]);
        }
        if accs == 2 {
            let mut total =
                f64::from(lane_sum(&acc[0], false)) + f64::from(lane_sum(&acc[1], false));
            for i in np..x.len() {
                total += f64::from(x[i] * y[i]);
            }
            return total as f32;
        }
        let folded: Vec<f32> = (0..l)
            .map(|k| (acc[0][k] + acc[2][k]) + (acc[1][k] + acc[3][k]))
            .collect();
        let s = lane_sum(&folded, flavor != Flavor::Bf16);
        if flavor == Flavor::F32 {
            let rest = x.len() - np;
            let mut sum = s;
            for i in np..x.len() {
                let fused = rest <= 3 || i >= np + rest - rest % 4;
                sum = if fused {
                    x[i].mul_add(y[i], sum)
                } else {
                    sum + x[i] * y[i]
                };
            }
            return sum;
        }
        let mut total = f64::from(s);
        for i in np..x.len() {
            total += f64::from(x[i] * y[i]);
        }
        total as f32
    }

    #[test]
    fn eight_f16_rows_at_once_equal_eight_dots() {
        let mut rng = StdRng::seed_from_u64(17);
        for isa in ["avx2", "avx512"] {
            let f = CpuFeatures::resolve(Some(isa.parse().unwrap()));
            for n in [8, 32, 40, 64, 100, 128, 256] {
                let y = values(&mut rng, Flavor::F16, n);
                let rows: Vec<Vec<u16>> = (0..8)
                    .map(|_| {
                        let r = values(&mut rng, Flavor::F16, n);
                        r.iter().map(|&v| f16::from_f32(v).to_bits()).collect()
                    })
                    .collect();
                let ptrs: [*const u16; 8] = std::array::from_fn(|r| rows[r].as_ptr());
                // SAFETY: every row holds `n` f16 values.
                let got = unsafe { vec_dot_f16_in_place_x8(f, &ptrs, &y) };
                for (r, row) in rows.iter().enumerate() {
                    let x: Vec<f32> = row.iter().map(|&b| f16::from_bits(b).to_f32()).collect();
                    let want = by_definition(Flavor::F16, f.wide(), &x, &y);
                    assert_eq!(got[r].to_bits(), want.to_bits(), "{isa} n={n} row {r}");
                }
            }
        }
    }

    #[test]
    fn follows_ggml_order_and_stays_near_the_f64_dot() {
        let mut rng = StdRng::seed_from_u64(16);
        for isa in ["avx2", "avx512"] {
            let f = CpuFeatures::resolve(Some(isa.parse().unwrap()));
            for flavor in [Flavor::F16, Flavor::Bf16, Flavor::F32] {
                for n in [1, 3, 31, 37, 64, 100, 576, 1000, 1536] {
                    let (x, y) = (values(&mut rng, flavor, n), values(&mut rng, flavor, n));
                    let got = vec_dot(f, flavor, &x, &y);
                    let want = by_definition(flavor, f.wide(), &x, &y);
                    assert_eq!(got.to_bits(), want.to_bits(), "{isa} {flavor:?} n={n}");
                    assert_eq!(
                        portable(flavor, &x, &y, f.wide()).to_bits(),
                        want.to_bits(),
                        "{isa} {flavor:?} n={n} portable"
                    );
                    let exact: f64 = x
                        .iter()
                        .zip(&y)
                        .map(|(a, b)| f64::from(*a) * f64::from(*b))
                        .sum();
                    let scale: f64 = x
                        .iter()
                        .zip(&y)
                        .map(|(a, b)| f64::from((a * b).abs()))
                        .sum();
                    assert!(
                        (f64::from(got) - exact).abs() <= 1e-5 * scale.max(1.0),
                        "{isa} {flavor:?} n={n}"
                    );
                }
            }
        }
    }
}
