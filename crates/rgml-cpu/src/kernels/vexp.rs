//! ggml-cpu's vectorised exp / SiLU / softmax-row arithmetic, reproduced bit for bit.
//!
//! We mirror the arithmetic of a native ggml-cpu build on the same CPU (see [`super::isa`]): the
//! AVX-512 build works in groups of 16 with the `__m512` `ggml_v_expf` ([`v_expf16`]), the AVX2
//! build in groups of 8 with the `__m256` one ([`v_expf`]); the rest of this paragraph describes
//! the AVX2 variant, and the AVX-512 one differs only in the group size and the exp.
//!
//! ggml's x86 AVX2 build computes `exp` in groups of 8 with `ggml_v_expf` (a polynomial
//! approximation "adapted from ARM optimized routines", max error ~1.5 ulp) and only the tail of
//! a row (`n % 8` elements) with libm `expf`. Models amplify the difference, so the kernels here
//! follow the same split: whole groups of 8 go through [`v_expf`] (a lane-exact scalar
//! transcription of the AVX2 code: every operation is elementwise, and `mul_add` is the fused
//! multiply-add the intrinsics use), the tail through `f32::exp` (glibc `expf`, as ggml).
//!
//! The hot loops are compiled a second time with AVX2+FMA enabled so `mul_add` becomes one
//! instruction; the arithmetic is the same either way. Which variant and which compiled form
//! run is decided by the [`CpuFeatures`] each call is handed.

use crate::kernels::isa::CpuFeatures;
#[cfg(test)]
use crate::kernels::isa::IsaChoice;
use crate::kernels::simd::{hsum16, hsum8};

// The constants are the hex-float literals of ggml's code, spelled as bit patterns.
const R: u32 = 0x4b40_0000; // 0x1.8p23
const LOG2E: u32 = 0x3fb8_aa3b; // 0x1.715476p+0
const LN2_HI: u32 = 0x3f31_7200; // 0x1.62e4p-1
const LN2_LO: u32 = 0x35bf_be8e; // 0x1.7f7d1cp-20
const P5: u32 = 0x3c07_2010; // 0x1.0e4020p-7
const P4: u32 = 0x3d2b_9f17; // 0x1.573e2ep-5
const P3: u32 = 0x3e2a_af33; // 0x1.555e66p-3
const P2: u32 = 0x3eff_fedb; // 0x1.fffdb6p-2
const P1: u32 = 0x3f7f_fff6; // 0x1.ffffecp-1

/// One lane of ggml's `ggml_v_expf` (AVX2 version).
#[inline(always)]
pub(crate) fn v_expf(x: f32) -> f32 {
    let f = f32::from_bits;
    let r = f(R);
    let z = x.mul_add(f(LOG2E), r);
    let n = z - r;
    // fnmadd(a, b, c) = c - a * b, fused.
    let b = (-n).mul_add(f(LN2_LO), (-n).mul_add(f(LN2_HI), x));
    let e = z.to_bits() << 23;
    let k = f(e.wrapping_add(1f32.to_bits()));
    let an = f32::from_bits(n.to_bits() & 0x7fff_ffff);
    let c = an > 126.0;
    let u = b * b;
    let j = f(P5)
        .mul_add(b, f(P4))
        .mul_add(u, f(P3).mul_add(b, f(P2)))
        .mul_add(u, f(P1) * b);
    if !c {
        return k.mul_add(j, k);
    }
    let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
    let s1 = f(g.wrapping_add(0x7f00_0000));
    let s2 = f(e.wrapping_sub(g));
    if an > 192.0 {
        s1 * s1
    } else {
        s2.mul_add(j, s2) * s1
    }
}

/// One lane of ggml's `ggml_v_expf` (AVX-512 version): the same reduction and polynomial, but
/// the `+ 1` folded into the last FMA and the result scaled by `2^n` with `vscalefps` (one
/// rounding, so exact in f64 and rounded once to f32); `|n| > 192` gives 0 or inf.
#[inline(always)]
pub(crate) fn v_expf16(x: f32) -> f32 {
    let f = f32::from_bits;
    let r = f(R);
    let z = x.mul_add(f(LOG2E), r);
    let n = z - r;
    let b = (-n).mul_add(f(LN2_LO), (-n).mul_add(f(LN2_HI), x));
    let u = b * b;
    let j = f(P5)
        .mul_add(b, f(P4))
        .mul_add(u, f(P3).mul_add(b, f(P2)))
        .mul_add(u, f(P1).mul_add(b, 1.0));
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    if n.is_nan() {
        return n;
    }
    // `j * 2^n` is exact in f64 (|n| <= 192), so the cast is vscalefps's single rounding.
    // 2^n is built from its exponent bits (a normal f64 for |n| <= 192): `powi` is a libm call.
    let pow2 = f64::from_bits(((n as i64 + 1023) as u64) << 52);
    (f64::from(j) * pow2) as f32
}

/// One lane of ggml's `ggml_v_silu`: `x / (1 + v_expf(-x))`.
#[inline(always)]
pub(crate) fn v_silu(x: f32) -> f32 {
    x / (1.0 + v_expf(0.0 - x))
}

/// One lane of ggml's AVX-512 `ggml_v_silu`.
#[inline(always)]
pub(crate) fn v_silu16(x: f32) -> f32 {
    x / (1.0 + v_expf16(0.0 - x))
}

/// ggml's scalar `ggml_silu_f32`, used for row tails.
#[inline(always)]
pub(crate) fn silu_f32(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `ggml_vec_soft_max_f32` in place, as a build with `L`-lane vectors runs it: `y[i] =
/// exp(y[i] - max)` in groups of `L` through `exp` (the build's `ggml_v_expf`), each group's
/// lane sum (`hsum`, the build's horizontal add) added in f64, the tail through `expf`.
/// Returns the sum.
#[inline(always)]
fn soft_max_row_lanes<const L: usize>(
    y: &mut [f32],
    max: f32,
    exp: impl Fn(f32) -> f32,
    hsum: impl Fn(&[f32; L]) -> f32,
) -> f64 {
    let mut sum = 0f64;
    let mut groups = y.chunks_exact_mut(L);
    for group in &mut groups {
        let mut v = [0f32; L];
        for (out, &x) in v.iter_mut().zip(group.iter()) {
            *out = exp(x - max);
        }
        group.copy_from_slice(&v);
        sum += f64::from(hsum(&v));
    }
    for y in groups.into_remainder() {
        let v = (*y - max).exp();
        sum += f64::from(v);
        *y = v;
    }
    sum
}

/// `ggml_vec_swiglu_f32` (`y = silu(x) * g`) and, with `g = None`, `ggml_vec_silu_f32`, as a
/// build with `L`-lane vectors runs them: whole groups of `L` through `silu` (the build's
/// `ggml_v_silu`), the tail through `ggml_silu_f32`.
#[inline(always)]
fn silu_row_lanes<const L: usize>(
    y: &mut [f32],
    x: &[f32],
    g: Option<&[f32]>,
    silu: impl Fn(f32) -> f32,
) {
    let n = y.len().min(x.len());
    let full = n - n % L;
    for i in 0..n {
        let s = if i < full { silu(x[i]) } else { silu_f32(x[i]) };
        y[i] = match g {
            Some(g) => s * g[i],
            None => s,
        };
    }
}

#[inline(always)]
fn soft_max_row_impl16(y: &mut [f32], max: f32) -> f64 {
    soft_max_row_lanes::<16>(y, max, v_expf16, hsum16)
}

#[inline(always)]
fn silu_row_impl16(y: &mut [f32], x: &[f32], g: Option<&[f32]>) {
    silu_row_lanes::<16>(y, x, g, v_silu16)
}

#[inline(always)]
fn soft_max_row_impl(y: &mut [f32], max: f32) -> f64 {
    soft_max_row_lanes::<8>(y, max, v_expf, hsum8)
}

#[inline(always)]
fn silu_row_impl(y: &mut [f32], x: &[f32], g: Option<&[f32]>) {
    silu_row_lanes::<8>(y, x, g, v_silu)
}

/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn soft_max_row_fma(y: &mut [f32], max: f32, wide: bool) -> f64 {
    if wide {
        soft_max_row_impl16(y, max)
    } else {
        soft_max_row_impl(y, max)
    }
}

/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn silu_row_fma(y: &mut [f32], x: &[f32], g: Option<&[f32]>, wide: bool) {
    if wide {
        silu_row_impl16(y, x, g)
    } else {
        silu_row_impl(y, x, g)
    }
}

/// The AVX-512 build's loops with its own instructions: the same operations as
/// [`v_expf16`] / [`v_silu16`] / [`hsum16`], lane for lane, but 16 lanes per instruction instead
/// of a scalar transcription per lane (which the compiler cannot vectorize: `vscalefps` has no
/// scalar spelling, so [`v_expf16`] goes through f64). Used where the CPU has AVX-512
/// ([`CpuFeatures::has_avx512`]); the AVX-512 variant itself may be forced on a CPU without
/// it, which then takes the lane-by-lane transcription.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{silu_f32, LN2_HI, LN2_LO, LOG2E, P1, P2, P3, P4, P5, R};
    use std::arch::x86_64::*;

    /// ggml's `__m512` `ggml_v_expf`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn expf(x: __m512) -> __m512 {
        let set = _mm512_set1_ps;
        let f = f32::from_bits;
        let r = set(f(R));
        let z = _mm512_fmadd_ps(x, set(f(LOG2E)), r);
        let n = _mm512_sub_ps(z, r);
        let b = _mm512_fnmadd_ps(n, set(f(LN2_LO)), _mm512_fnmadd_ps(n, set(f(LN2_HI)), x));
        let big = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(_mm512_abs_ps(n), set(192.0));
        let u = _mm512_mul_ps(b, b);
        let j = _mm512_fmadd_ps(
            _mm512_fmadd_ps(
                _mm512_fmadd_ps(set(f(P5)), b, set(f(P4))),
                u,
                _mm512_fmadd_ps(set(f(P3)), b, set(f(P2))),
            ),
            u,
            _mm512_fmadd_ps(set(f(P1)), b, set(1.0)),
        );
        let res = _mm512_scalef_ps(j, n);
        if big == 0 {
            return res;
        }
        let zero = _mm512_setzero_ps();
        let overflow = _mm512_mask_blend_ps(
            _mm512_cmp_ps_mask::<_CMP_LE_OQ>(n, zero),
            set(f32::INFINITY),
            zero,
        );
        _mm512_mask_blend_ps(big, res, overflow)
    }

    /// [`super::soft_max_row`] for the AVX-512 variant.
    #[target_feature(enable = "avx512f,avx512dq")]
    pub(super) fn soft_max_row(y: &mut [f32], max: f32) -> f64 {
        let mut sum = 0f64;
        let mut groups = y.chunks_exact_mut(16);
        let m = _mm512_set1_ps(max);
        for group in &mut groups {
            // SAFETY: `group` is 16 floats, read and written through its own pointer.
            unsafe {
                let v = expf(_mm512_sub_ps(_mm512_loadu_ps(group.as_ptr()), m));
                _mm512_storeu_ps(group.as_mut_ptr(), v);
                sum += f64::from(crate::kernels::simd::x86::hsum16(v));
            }
        }
        for y in groups.into_remainder() {
            let v = (*y - max).exp();
            sum += f64::from(v);
            *y = v;
        }
        sum
    }

    /// [`super::silu_row`] for the AVX-512 variant: ggml's `ggml_v_silu`, `x / (1 + exp(0 - x))`,
    /// times `g` for SwiGLU.
    #[target_feature(enable = "avx512f,avx512dq")]
    pub(super) fn silu_row(y: &mut [f32], x: &[f32], g: Option<&[f32]>) {
        let n = y.len().min(x.len()).min(g.map_or(usize::MAX, <[f32]>::len));
        let full = n - n % 16;
        let one = _mm512_set1_ps(1.0);
        for i in (0..full).step_by(16) {
            // SAFETY: `i + 16 <= n`, within `x`, `y` and `g`; `y` is written through its own
            // exclusive borrow.
            unsafe {
                let v = _mm512_loadu_ps(x.as_ptr().add(i));
                let e = expf(_mm512_sub_ps(_mm512_setzero_ps(), v));
                let mut s = _mm512_div_ps(v, _mm512_add_ps(one, e));
                if let Some(g) = g {
                    s = _mm512_mul_ps(s, _mm512_loadu_ps(g.as_ptr().add(i)));
                }
                _mm512_storeu_ps(y.as_mut_ptr().add(i), s);
            }
        }
        for i in full..n {
            let s = silu_f32(x[i]);
            y[i] = match g {
                Some(g) => s * g[i],
                None => s,
            };
        }
    }
}

/// `y[i] = exp(y[i] - max)` in place, returning the f64 sum, exactly as the ggml build `f`
/// mirrors.
pub(crate) fn soft_max_row(f: CpuFeatures, y: &mut [f32], max: f32) -> f64 {
    let wide = f.wide();
    #[cfg(target_arch = "x86_64")]
    if wide && f.has_avx512() {
        // SAFETY: `f` says the CPU has AVX-512 F and DQ.
        return unsafe { avx512::soft_max_row(y, max) };
    }
    #[cfg(target_arch = "x86_64")]
    if f.has_avx2() {
        // SAFETY: `f` says the CPU has AVX2 and FMA.
        return unsafe { soft_max_row_fma(y, max, wide) };
    }
    if wide {
        soft_max_row_impl16(y, max)
    } else {
        soft_max_row_impl(y, max)
    }
}

/// `y[i] = silu(x[i]) * g[i]` (or `silu(x[i])` without `g`), exactly as the ggml build `f`
/// mirrors.
pub(crate) fn silu_row(f: CpuFeatures, y: &mut [f32], x: &[f32], g: Option<&[f32]>) {
    let wide = f.wide();
    #[cfg(target_arch = "x86_64")]
    if wide && f.has_avx512() {
        // SAFETY: `f` says the CPU has AVX-512 F and DQ.
        return unsafe { avx512::silu_row(y, x, g) };
    }
    #[cfg(target_arch = "x86_64")]
    if f.has_avx2() {
        // SAFETY: `f` says the CPU has AVX2 and FMA.
        return unsafe { silu_row_fma(y, x, g, wide) };
    }
    if wide {
        silu_row_impl16(y, x, g)
    } else {
        silu_row_impl(y, x, g)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v_expf_is_close_to_exp() {
        // Normal results only: ggml's approximation loses precision in the subnormal range.
        let mut x = -87.0f32;
        while x < 88.0 {
            let (a, b) = (v_expf(x), x.exp());
            assert!(((a - b) / b).abs() < 4e-7, "{x}: {a} vs {b}");
            x += 0.0137;
        }
        assert_eq!(v_expf(f32::NEG_INFINITY), 0.0);
        assert_eq!(v_expf(-200.0), 0.0);
        assert_eq!(v_expf(0.0), 1.0);
        let mut x = -87.0f32;
        while x < 88.0 {
            let (a, b) = (v_expf16(x), x.exp());
            assert!(((a - b) / b).abs() < 4e-7, "{x}: {a} vs {b}");
            x += 0.0137;
        }
        assert_eq!(v_expf16(f32::NEG_INFINITY), 0.0);
        assert_eq!(v_expf16(f32::INFINITY), f32::INFINITY);
        assert_eq!(v_expf16(-200.0), 0.0);
        assert_eq!(v_expf16(0.0), 1.0);
        assert!(v_expf16(f32::NAN).is_nan());
    }

    #[test]
    fn hsum16_order() {
        let mut v = [0f32; 16];
        v[0] = 1.0;
        v[8] = 1e8;
        v[1] = -1e8;
        // (v0 + v8) first, then the rest: 1 is lost in 1e8 before -1e8 cancels it.
        assert_eq!(hsum16(&v), 0.0);
        v[1] = 0.0;
        v[9] = -1e8;
        assert_eq!(hsum16(&v), -1e8 + 1e8);
    }

    /// ggml's `__m512` `ggml_v_expf`, transcribed with the intrinsics.
    ///
    /// # Safety
    /// The CPU must support AVX-512 F and DQ.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512dq")]
    unsafe fn ggml_v_expf_m512(x: &[f32; 16]) -> [f32; 16] {
        use std::arch::x86_64::*;
        let set = _mm512_set1_ps;
        // SAFETY: `x` is 16 readable floats.
        let x = unsafe { _mm512_loadu_ps(x.as_ptr()) };
        let r = set(f32::from_bits(R));
        let z = _mm512_fmadd_ps(x, set(f32::from_bits(LOG2E)), r);
        let n = _mm512_sub_ps(z, r);
        let b = _mm512_fnmadd_ps(
            n,
            set(f32::from_bits(LN2_LO)),
            _mm512_fnmadd_ps(n, set(f32::from_bits(LN2_HI)), x),
        );
        let d = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(_mm512_abs_ps(n), set(192.0));
        let u = _mm512_mul_ps(b, b);
        let j = _mm512_fmadd_ps(
            _mm512_fmadd_ps(
                _mm512_fmadd_ps(set(f32::from_bits(P5)), b, set(f32::from_bits(P4))),
                u,
                _mm512_fmadd_ps(set(f32::from_bits(P3)), b, set(f32::from_bits(P2))),
            ),
            u,
            _mm512_fmadd_ps(set(f32::from_bits(P1)), b, set(1.0)),
        );
        let res = _mm512_scalef_ps(j, n);
        let out = if _mm512_kortestz(d, d) != 0 {
            res
        } else {
            let zero = _mm512_setzero_ps();
            let alt = _mm512_mask_blend_ps(
                _mm512_cmp_ps_mask::<_CMP_LE_OQ>(n, zero),
                set(f32::INFINITY),
                zero,
            );
            _mm512_mask_blend_ps(d, res, alt)
        };
        let mut o = [0f32; 16];
        // SAFETY: `o` has room for 16 floats.
        unsafe { _mm512_storeu_ps(o.as_mut_ptr(), out) };
        o
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn v_expf16_matches_the_avx512_code() {
        if !CpuFeatures::detect().has_avx512() {
            return;
        }
        let mut xs: Vec<f32> = (0..400_000).map(|i| -110.0 + i as f32 * 0.000_5).collect();
        xs.extend((0..4000).map(|i| -104.0 + i as f32 * 0.0047)); // subnormal results
        xs.extend([
            0.0,
            -0.0,
            88.7,
            88.8,
            89.0,
            200.0,
            -200.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ]);
        xs.extend((0..20_000u32).map(|i| f32::from_bits(0x3000_0000 + i * 40_000)));
        while !xs.len().is_multiple_of(16) {
            xs.push(1.0);
        }
        for c in xs.chunks_exact(16) {
            let c: &[f32; 16] = c.try_into().unwrap();
            // SAFETY: AVX-512 F and DQ were detected just above.
            let want = unsafe { ggml_v_expf_m512(c) };
            for (x, w) in c.iter().zip(want) {
                assert_eq!(v_expf16(*x).to_bits(), w.to_bits(), "x = {x:e}");
            }
        }
    }

    /// The AVX-512 loops give the lane-by-lane transcription's bits, tails included.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_rows_equal_the_transcription() {
        if !CpuFeatures::detect().has_avx512() {
            return;
        }
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 24) as f32
        };
        for n in [1, 15, 16, 17, 64, 250, 1536] {
            let mut x: Vec<f32> = (0..n).map(|_| next() * 40.0 - 20.0).collect();
            // Past exp's range both ways (the blend of 0 and inf), and a subnormal result.
            for (v, extreme) in x
                .iter_mut()
                .step_by(5)
                .zip([150.0, -150.0, 95.0, -100.0, -88.0])
            {
                *v = extreme;
            }
            let g: Vec<f32> = (0..n).map(|_| next() * 4.0 - 2.0).collect();
            for gate in [None, Some(g.as_slice())] {
                let (mut fast, mut lanes) = (vec![0f32; n], vec![0f32; n]);
                // SAFETY: checked just above.
                unsafe { avx512::silu_row(&mut fast, &x, gate) };
                silu_row_impl16(&mut lanes, &x, gate);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&fast), bits(&lanes), "silu, n = {n}");
            }
            let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let (mut fast, mut lanes) = (x.clone(), x.clone());
            // SAFETY: checked just above.
            let sum_fast = unsafe { avx512::soft_max_row(&mut fast, max) };
            let sum_lanes = soft_max_row_impl16(&mut lanes, max);
            assert_eq!(
                sum_fast.to_bits(),
                sum_lanes.to_bits(),
                "softmax sum, n = {n}"
            );
            assert!(fast
                .iter()
                .zip(&lanes)
                .all(|(a, b)| a.to_bits() == b.to_bits()));
        }
    }

    #[test]
    fn silu_row_matches_definition() {
        let x: Vec<f32> = (0..21).map(|i| i as f32 * 0.7 - 7.0).collect();
        let mut y = vec![0f32; x.len()];
        for f in [IsaChoice::Avx2, IsaChoice::Avx512].map(|c| CpuFeatures::resolve(Some(c))) {
            silu_row(f, &mut y, &x, None);
            for (a, &v) in y.iter().zip(&x) {
                let want = f64::from(v) / (1.0 + (-f64::from(v)).exp());
                assert!((f64::from(*a) - want).abs() < 1e-5 * want.abs().max(1.0));
            }
        }
    }
}
