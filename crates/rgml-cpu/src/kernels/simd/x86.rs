//! x86-64 SIMD primitives (AVX2, AVX-512): horizontal sums of registers in ggml's orders, the
//! widening of packed bits, and the signed int8 pair products. Every function is
//! `#[inline(always)]` and `unsafe`: the caller promises the instruction set and inlines the body
//! under its own target features.

use std::arch::x86_64::*;

/// Horizontal sum of 8 lanes in `hsum_float_8`'s order (as [`super::dot`]'s AVX2 dots).
///
/// # Safety
/// The CPU supports AVX (every build here inlines it).
#[inline(always)]
pub(crate) unsafe fn hsum8(v: __m256) -> f32 {
    // SAFETY: AVX, as the caller promises.
    unsafe {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }
}

/// [`hsum8`]'s order for four 8-lane sums at once: sum `r`'s lanes are `lo`'s `4r..4r + 4`
/// and `hi`'s (the repacked Q4 kernels' layout); `(l_j + l_{4+j})`, then `(s0 + s2, s1 + s3)`,
/// then their sum, in lane `4r` of the result.
///
/// # Safety
/// The CPU supports AVX-512 F (the callers inline this under their features).
#[inline(always)]
pub(crate) unsafe fn hsum8x4_ps(lo: __m512, hi: __m512) -> __m512 {
    // SAFETY: register operations only, under the caller's features.
    unsafe {
        let s = _mm512_add_ps(lo, hi);
        let s = _mm512_add_ps(s, _mm512_permute_ps::<0b01_00_11_10>(s));
        _mm512_add_ps(s, _mm512_movehdup_ps(s))
    }
}

/// The low and high 8 lanes of a 512-bit register.
///
/// # Safety
/// The CPU supports AVX-512 F and DQ.
#[inline(always)]
pub(crate) unsafe fn halves(v: __m512) -> [__m256; 2] {
    // SAFETY: AVX-512 F and DQ, as the caller promises.
    unsafe { [_mm512_castps512_ps256(v), _mm512_extractf32x8_ps::<1>(v)] }
}

/// The 16 bytes at `p` as 32 nibbles in element order: the low nibbles in bytes 0..16, the
/// high nibbles in bytes 16..32 (ggml's `bytes_from_nibbles_32`). One broadcast load and a
/// shift per 128-bit half (`vpsrlvd`), where shifting a copy and inserting it as the high half
/// costs a shuffle more: +20% for a Q4_0 matrix-vector product on a Zen 3.
///
/// # Safety
/// 16 readable bytes at `p`; the CPU supports AVX2.
#[inline(always)]
pub(crate) unsafe fn nibbles(p: *const u8) -> __m256i {
    // SAFETY: as the caller promises.
    unsafe {
        let both = _mm256_broadcastsi128_si256(_mm_loadu_si128(p.cast()));
        let shifted = _mm256_srlv_epi32(both, _mm256_set_epi32(4, 4, 4, 4, 0, 0, 0, 0));
        _mm256_and_si256(shifted, _mm256_set1_epi8(0x0F))
    }
}

/// `bytes_from_bits_32`: byte j is 0xFF where bit j of `qh` is set, else 0.
///
/// # Safety
/// The CPU supports AVX2.
#[inline(always)]
pub(crate) unsafe fn bits_to_bytes(qh: i32) -> __m256i {
    // SAFETY: AVX2, as the caller promises.
    unsafe {
        let spread = _mm256_shuffle_epi8(
            _mm256_set1_epi32(qh),
            _mm256_set_epi64x(
                0x0303_0303_0303_0303,
                0x0202_0202_0202_0202,
                0x0101_0101_0101_0101,
                0,
            ),
        );
        let bit = _mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe));
        _mm256_cmpeq_epi8(bit, _mm256_set1_epi64x(-1))
    }
}

/// The four f16 at `p` as f32 lanes 0..4, as one `vcvtph2ps` from memory. Where the result is
/// then spread over a 512-bit register, LLVM otherwise broadcasts the halves first and
/// converts all 16 lanes (a broadcast, a shuffle and a two-uop conversion, against one).
///
/// # Safety
/// Eight readable bytes at `p`; the CPU supports F16C.
#[inline]
#[target_feature(enable = "avx,f16c")]
pub(crate) unsafe fn cvtph4_ps(p: *const u8) -> __m128 {
    let out: __m128;
    // SAFETY: an 8-byte read the caller promises; the CPU has the instruction.
    unsafe {
        std::arch::asm!(
            "vcvtph2ps {out}, qword ptr [{p}]",
            out = lateout(xmm_reg) out,
            p = in(reg) p,
            options(pure, readonly, nostack, preserves_flags),
        );
    }
    out
}

/// `acc + sum of each i16 lane pair of a * b` into i32 lanes, as one `vpdpwssd`. LLVM splits
/// the intrinsic into `vpmaddwd` + `vpaddd` for CPUs it does not tune for, which on this
/// work's AVX-512 CPUs costs a second vector uop (the multiply-add units take both): inline
/// assembly keeps the one instruction.
///
/// # Safety
/// The CPU supports AVX-512 F and VNNI (callers compiled with those features inline this).
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
pub(crate) unsafe fn dpwssd_fused(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
    let mut acc = acc;
    // SAFETY: register operands only; the CPU has the instruction, as the caller promises.
    unsafe {
        std::arch::asm!(
            "vpdpwssd {acc}, {a}, {b}",
            acc = inout(zmm_reg) acc,
            a = in(zmm_reg) a,
            b = in(zmm_reg) b,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    acc
}

/// The horizontal sums of 16 registers, `[hsum16(a[0]), ..., hsum16(a[15])]`, each in
/// `hsum16`'s order (`_mm512_reduce_add_ps`: lane k + lane k+8, then k + k+4, then k + k+2,
/// then the last two): the same additions of the same operands, with the registers packed side
/// by side by shuffles between the levels.
///
/// # Safety
/// The CPU supports AVX-512F (the callers inline this under their AVX-512 features).
#[inline(always)]
pub(crate) unsafe fn hsum16x16(a: [__m512; 16]) -> [f32; 16] {
    // SAFETY: AVX-512F, as the caller promises.
    unsafe {
        // Level 1: two accumulators per register, quarters (a.lo8 as two 4s, b.lo8 as two 4s).
        let s1: [__m512; 8] = std::array::from_fn(|i| {
            let (x, y) = (a[2 * i], a[2 * i + 1]);
            _mm512_add_ps(
                _mm512_shuffle_f32x4::<0b01_00_01_00>(x, y),
                _mm512_shuffle_f32x4::<0b11_10_11_10>(x, y),
            )
        });
        // Level 2: quarter q of register m holds accumulator 4m + q's four partial sums.
        let s2: [__m512; 4] = std::array::from_fn(|m| {
            let (x, y) = (s1[2 * m], s1[2 * m + 1]);
            _mm512_add_ps(
                _mm512_shuffle_f32x4::<0b10_00_10_00>(x, y),
                _mm512_shuffle_f32x4::<0b11_01_11_01>(x, y),
            )
        });
        // Level 3: lanes 0..2 of quarter q: accumulator 8p + q; lanes 2..4: 8p + 4 + q.
        let s3: [__m512; 2] = std::array::from_fn(|p| {
            let (x, y) = (s2[2 * p], s2[2 * p + 1]);
            _mm512_add_ps(
                _mm512_shuffle_ps::<0b01_00_01_00>(x, y),
                _mm512_shuffle_ps::<0b11_10_11_10>(x, y),
            )
        });
        // Level 4: lane 4q + e holds accumulator 4e + q.
        let sums = _mm512_add_ps(
            _mm512_shuffle_ps::<0b10_00_10_00>(s3[0], s3[1]),
            _mm512_shuffle_ps::<0b11_01_11_01>(s3[0], s3[1]),
        );
        let mut w = [0f32; 16];
        _mm512_storeu_ps(w.as_mut_ptr(), sums);
        std::array::from_fn(|j| w[4 * (j % 4) + j / 4])
    }
}

/// The lane sums of 16 registers of i32: lane `4c + r` of the result is the sum of `a[4r + c]`
/// (a transposing tree: 15 adds and 30 shuffles instead of 16 separate reductions).
///
/// # Safety
/// AVX-512 F.
#[inline(always)]
pub(crate) unsafe fn hsum16x16_epi32(a: &[__m512i; 16]) -> __m512i {
    // SAFETY: AVX-512 F, as the caller promises.
    unsafe {
        // Register i: a[2i]'s and a[2i + 1]'s halves added (two 128-bit quarters each).
        let s1: [__m512i; 8] = std::array::from_fn(|i| {
            let (x, y) = (a[2 * i], a[2 * i + 1]);
            _mm512_add_epi32(
                _mm512_shuffle_i32x4::<0b01_00_01_00>(x, y),
                _mm512_shuffle_i32x4::<0b11_10_11_10>(x, y),
            )
        });
        // Quarter q of register m: a[4m + q]'s four partial sums.
        let s2: [__m512i; 4] = std::array::from_fn(|m| {
            let (x, y) = (s1[2 * m], s1[2 * m + 1]);
            _mm512_add_epi32(
                _mm512_shuffle_i32x4::<0b10_00_10_00>(x, y),
                _mm512_shuffle_i32x4::<0b11_01_11_01>(x, y),
            )
        });
        // Lanes 0..2 of quarter q of register p: a[8p + q]; lanes 2..4: a[8p + 4 + q].
        let s3: [__m512i; 2] = std::array::from_fn(|p| {
            let (x, y) = (s2[2 * p], s2[2 * p + 1]);
            _mm512_add_epi32(_mm512_unpacklo_epi64(x, y), _mm512_unpackhi_epi64(x, y))
        });
        // Lane 4q + e: a[4e + q].
        let (x, y) = (_mm512_castsi512_ps(s3[0]), _mm512_castsi512_ps(s3[1]));
        _mm512_add_epi32(
            _mm512_castps_si512(_mm512_shuffle_ps::<0b10_00_10_00>(x, y)),
            _mm512_castps_si512(_mm512_shuffle_ps::<0b11_01_11_01>(x, y)),
        )
    }
}

/// The lane sums of 8 registers that each hold two outputs, `[a, a, b, b]` in every 128-bit
/// lane (as the packing K-quant tiles make them): lane `4Q + 0, 1` of the result is register Q's a, b;
/// lane `4Q + 2, 3` register `4 + Q`'s.
///
/// # Safety
/// AVX-512 F.
#[inline(always)]
pub(crate) unsafe fn hsum8x2_epi32(a: &[__m512i; 8]) -> __m512i {
    // SAFETY: AVX-512 F, as the caller promises.
    unsafe {
        // Register i: a[2i]'s and a[2i + 1]'s 128-bit lanes added in pairs.
        let s1: [__m512i; 4] = std::array::from_fn(|i| {
            let (x, y) = (a[2 * i], a[2 * i + 1]);
            _mm512_add_epi32(
                _mm512_shuffle_i32x4::<0b01_00_01_00>(x, y),
                _mm512_shuffle_i32x4::<0b11_10_11_10>(x, y),
            )
        });
        // Quarter q of register k: a[4k + q]'s sums over its 128-bit lanes.
        let s2: [__m512i; 2] = std::array::from_fn(|k| {
            let (x, y) = (s1[2 * k], s1[2 * k + 1]);
            _mm512_add_epi32(
                _mm512_shuffle_i32x4::<0b10_00_10_00>(x, y),
                _mm512_shuffle_i32x4::<0b11_01_11_01>(x, y),
            )
        });
        let (x, y) = (_mm512_castsi512_ps(s2[0]), _mm512_castsi512_ps(s2[1]));
        _mm512_add_epi32(
            _mm512_castps_si512(_mm512_shuffle_ps::<0b10_00_10_00>(x, y)),
            _mm512_castps_si512(_mm512_shuffle_ps::<0b11_01_11_01>(x, y)),
        )
    }
}

/// Lane i of the result: the sum of `a[i]`'s 8 lanes (exact: i32).
///
/// # Safety
/// AVX2.
#[inline(always)]
pub(crate) unsafe fn hsum8x8_epi32(a: &[__m256i; 8]) -> __m256i {
    // SAFETY: AVX2, as the caller promises.
    unsafe {
        // Per 128-bit half: a[2i]'s two pair sums, then a[2i + 1]'s.
        let h1: [__m256i; 4] = std::array::from_fn(|i| _mm256_hadd_epi32(a[2 * i], a[2 * i + 1]));
        // Per 128-bit half: a[4k..4k + 4]'s half sums.
        let h2: [__m256i; 2] = std::array::from_fn(|k| _mm256_hadd_epi32(h1[2 * k], h1[2 * k + 1]));
        _mm256_add_epi32(
            _mm256_permute2x128_si256::<0x20>(h2[0], h2[1]),
            _mm256_permute2x128_si256::<0x31>(h2[0], h2[1]),
        )
    }
}

/// 16 i16 pair sums of signed `v` times signed `y` (`mul_add_epi8`: `|v|` times `y * sign(v)`;
/// no saturation: neither operand is -128, so a pair is at most 2 * 127 * 127).
///
/// # Safety
/// AVX2.
#[inline(always)]
pub(crate) unsafe fn mul_add_i8(v: __m256i, y: __m256i) -> __m256i {
    // SAFETY: AVX2 as promised.
    unsafe { _mm256_maddubs_epi16(_mm256_sign_epi8(v, v), _mm256_sign_epi8(y, v)) }
}

/// The 16 lanes summed in [`super::hsum16`]'s order (GCC's `_mm512_reduce_add_ps`): high 8 +
/// low 8, then as [`hsum8`].
///
/// # Safety
/// The CPU supports AVX-512 F and DQ.
#[inline(always)]
pub(crate) unsafe fn hsum16(v: __m512) -> f32 {
    // SAFETY: AVX-512 F and DQ (and so AVX), as the caller promises.
    unsafe {
        let [lo, hi] = halves(v);
        hsum8(_mm256_add_ps(lo, hi))
    }
}

/// [`hsum8`] for the pair dots' AVX2 functions, which call it without `unsafe` (their
/// `#[target_feature]` includes AVX2).
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn hsum8_avx2(v: __m256) -> f32 {
    // SAFETY: AVX2 (and so AVX) is enabled for this function.
    unsafe { hsum8(v) }
}

/// The 32 bytes at `p`, unaligned.
///
/// # Safety
/// 32 readable bytes at `p`; the CPU supports AVX.
#[inline(always)]
pub(crate) unsafe fn load256(p: *const u8) -> __m256i {
    // SAFETY: as the caller promises; loadu has no alignment requirement.
    unsafe { _mm256_loadu_si256(p.cast()) }
}

/// The 16 x 16 matrix of 32-bit elements in `rows` (row `i` in register `i`), transposed in
/// place: unpacks of dwords and qwords within 128-bit lanes, then a 4 x 4 transpose of the
/// lanes (64 shuffles).
///
/// # Safety
/// The CPU supports AVX-512 F.
#[inline(always)]
pub(crate) unsafe fn transpose16x16_epi32(rows: &mut [__m512i; 16]) {
    // SAFETY: AVX-512 F, as the caller promises.
    unsafe {
        let r = *rows;
        // a[2i], a[2i + 1]: rows 2i and 2i + 1 interleaved, low and high dword pairs per lane.
        let a: [__m512i; 16] = std::array::from_fn(|k| {
            let (x, y) = (r[k & !1], r[k | 1]);
            if k % 2 == 0 {
                _mm512_unpacklo_epi32(x, y)
            } else {
                _mm512_unpackhi_epi32(x, y)
            }
        });
        // b[4i + j]'s lane L: column 4L + j of rows 4i..4i + 4.
        let b: [__m512i; 16] = std::array::from_fn(|k| {
            let (i, j) = (k / 4, k % 4);
            let (x, y) = (a[4 * i + j / 2], a[4 * i + 2 + j / 2]);
            if j % 2 == 0 {
                _mm512_unpacklo_epi64(x, y)
            } else {
                _mm512_unpackhi_epi64(x, y)
            }
        });
        for j in 0..4 {
            let c0 = _mm512_shuffle_i32x4::<0b01_00_01_00>(b[j], b[4 + j]);
            let c1 = _mm512_shuffle_i32x4::<0b11_10_11_10>(b[j], b[4 + j]);
            let c2 = _mm512_shuffle_i32x4::<0b01_00_01_00>(b[8 + j], b[12 + j]);
            let c3 = _mm512_shuffle_i32x4::<0b11_10_11_10>(b[8 + j], b[12 + j]);
            rows[j] = _mm512_shuffle_i32x4::<0b10_00_10_00>(c0, c2);
            rows[4 + j] = _mm512_shuffle_i32x4::<0b11_01_11_01>(c0, c2);
            rows[8 + j] = _mm512_shuffle_i32x4::<0b10_00_10_00>(c1, c3);
            rows[12 + j] = _mm512_shuffle_i32x4::<0b11_01_11_01>(c1, c3);
        }
    }
}

/// Int8 multiply-adds per second of this thread with AVX-512 VNNI: `rounds` of 8 independent
/// 512-bit `vpdpbusd` (64 each). `None` without AVX-512 VNNI.
pub(crate) fn vnni_peak_macs(rounds: usize) -> Option<f64> {
    if !crate::kernels::isa::CpuFeatures::detect().has_avx512_vnni() {
        return None;
    }
    let start = std::time::Instant::now();
    // SAFETY: the CPU has AVX-512 F and VNNI (checked above).
    let sum = unsafe { vnni_rounds(rounds) };
    let secs = start.elapsed().as_secs_f64();
    std::hint::black_box(sum);
    Some((rounds * 8 * 64) as f64 / secs)
}

/// The loop of [`vnni_peak_macs`].
///
/// # Safety
/// The CPU has AVX-512 F and VNNI.
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn vnni_rounds(rounds: usize) -> i32 {
    let a = _mm512_set1_epi8(3);
    let b = std::hint::black_box(_mm512_set1_epi8(-2));
    let mut acc = [_mm512_setzero_si512(); 8];
    for _ in 0..rounds {
        for v in &mut acc {
            *v = _mm512_dpbusd_epi32(*v, a, b);
        }
    }
    let total = acc
        .iter()
        .fold(_mm512_setzero_si512(), |s, v| _mm512_add_epi32(s, *v));
    _mm512_reduce_add_epi32(total)
}

/// `dst.len()` f16 values at `src` widened into `dst` (exact): 8 at a time by `vcvtph2ps`,
/// the rest one by one.
///
/// # Safety
/// The CPU supports AVX and F16C; `src` points at `dst.len()` readable f16 values.
#[inline(always)]
pub(crate) unsafe fn widen_f16(src: *const u16, dst: &mut [f32]) {
    let n = dst.len();
    let mut i = 0;
    // SAFETY: 8 readable values at `src + i` and 8 writable at `dst[i..]` (`i + 8 <= n`); the
    // instructions, as the caller promises.
    unsafe {
        while i + 8 <= n {
            let h = _mm_loadu_si128(src.add(i).cast());
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
            i += 8;
        }
        for (j, d) in dst.iter_mut().enumerate().skip(i) {
            *d = crate::kernels::fp16::f16_bits_to_f32(src.add(j).read_unaligned());
        }
    }
}

/// ggml's `ggml_vec_dot_f16` of the AVX-512 build over the whole 64-value steps of `y`: the f16
/// row `x` widened in registers, four 16-lane accumulators by FMA, folded `(0 + 2) + (1 + 3)`
/// and summed as `_mm512_reduce_add_ps`. Returns the sum and the values taken.
///
/// # Safety
/// The CPU supports AVX-512 F and DQ, FMA and F16C; `x` points at `y.len()` readable f16 values.
#[inline(always)]
pub(crate) unsafe fn dot_f16_steps_avx512(x: *const u16, y: &[f32]) -> (f32, usize) {
    let np = y.len() - y.len() % 64;
    // SAFETY: each step reads 64 values at `x + i` and `y[i..]` (`i + 64 <= np <= y.len()`);
    // the instructions, as the caller promises.
    unsafe {
        let mut acc = [_mm512_setzero_ps(); 4];
        for i in (0..np).step_by(64) {
            for (j, a) in acc.iter_mut().enumerate() {
                let xv = _mm512_cvtph_ps(_mm256_loadu_si256(x.add(i + 16 * j).cast()));
                let yv = _mm512_loadu_ps(y.as_ptr().add(i + 16 * j));
                *a = _mm512_fmadd_ps(xv, yv, *a);
            }
        }
        let folded = _mm512_add_ps(_mm512_add_ps(acc[0], acc[2]), _mm512_add_ps(acc[1], acc[3]));
        (hsum16(folded), np)
    }
}

/// [`dot_f16_steps_avx512`] for the AVX2 build: 32-value steps, four 8-lane accumulators,
/// folded the same way and summed as `GGML_F32x8_REDUCE` (halves added, then `hadd` twice).
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C; `x` points at `y.len()` readable f16 values.
#[inline(always)]
pub(crate) unsafe fn dot_f16_steps_avx2(x: *const u16, y: &[f32]) -> (f32, usize) {
    let np = y.len() - y.len() % 32;
    // SAFETY: as the caller promises (`np <= y.len()` values of `x`); the instructions too.
    unsafe {
        let folded = f16_steps_folded_avx2(x, y, np);
        let t = _mm_add_ps(
            _mm256_castps256_ps128(folded),
            _mm256_extractf128_ps::<1>(folded),
        );
        let t = _mm_hadd_ps(t, t);
        (_mm_cvtss_f32(_mm_hadd_ps(t, t)), np)
    }
}

/// The 32-value steps of `x[..np]·y[..np]` in four 8-lane accumulators, folded as
/// `(0 + 2) + (1 + 3)`: [`dot_f16_steps_avx2`]'s vector before its horizontal sum.
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C; `x` points at `np <= y.len()` readable f16 values and
/// `np` is a multiple of 32.
#[inline(always)]
unsafe fn f16_steps_folded_avx2(x: *const u16, y: &[f32], np: usize) -> __m256 {
    // SAFETY: each step reads 32 values at `x + i` and `y[i..]` (`i + 32 <= np <= y.len()`);
    // the instructions, as the caller promises.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); 4];
        for i in (0..np).step_by(32) {
            for (j, a) in acc.iter_mut().enumerate() {
                let xv = _mm256_cvtph_ps(_mm_loadu_si128(x.add(i + 8 * j).cast()));
                let yv = _mm256_loadu_ps(y.as_ptr().add(i + 8 * j));
                *a = _mm256_fmadd_ps(xv, yv, *a);
            }
        }
        _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]))
    }
}

/// `v` rounded to f16 and widened back (each lane to nearest even, as `vcvtps2ph` stores it).
///
/// # Safety
/// The CPU supports AVX and F16C.
#[inline(always)]
unsafe fn round_f16_ps(v: __m256) -> __m256 {
    // SAFETY: F16C, as the caller promises.
    unsafe { _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v)) }
}

/// [`dot_f16_steps_avx2`]'s sums for 8 rows against one `y`, lane `c` row `c`'s: each row's
/// four accumulators folded as there, then for all 8 rows at once the halves added and the
/// pairs `hadd`ed twice, the additions of `GGML_F32x8_REDUCE` in its order.
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C; every row points at `y.len()` readable f16 values.
#[inline(always)]
pub(crate) unsafe fn dot_f16_steps_avx2_x8(rows: &[*const u16; 8], y: &[f32]) -> ([f32; 8], usize) {
    let np = y.len() - y.len() % 32;
    // SAFETY: each step reads 32 values at `row + i` and `y[i..]` (`i + 32 <= np <= y.len()`);
    // the instructions, as the caller promises. (No closures here: a closure would not
    // inherit the caller's target features.)
    unsafe {
        let mut folded = [_mm256_setzero_ps(); 8];
        for (&row, out) in rows.iter().zip(folded.iter_mut()) {
            *out = f16_steps_folded_avx2(row, y, np);
        }
        // Rows `r` and `r + 4` side by side: each one's low half plus its high half.
        let mut halves = [_mm256_setzero_ps(); 4];
        for (r, h) in halves.iter_mut().enumerate() {
            let (a, b) = (folded[r], folded[r + 4]);
            *h = _mm256_add_ps(
                _mm256_permute2f128_ps::<0x20>(a, b),
                _mm256_permute2f128_ps::<0x31>(a, b),
            );
        }
        let pairs_01 = _mm256_hadd_ps(halves[0], halves[1]);
        let pairs_23 = _mm256_hadd_ps(halves[2], halves[3]);
        let mut out = [0f32; 8];
        _mm256_storeu_ps(out.as_mut_ptr(), _mm256_hadd_ps(pairs_01, pairs_23));
        (out, np)
    }
}

/// For each row of `rows` in order, with its weights `(ms, vs)`: `acc = f16(acc * ms)` where
/// `ms != 1` ([`scale_f16_rounded`]: times 1 it would change no f16 value), then
/// `acc = f16(row * vs + acc)` ([`mad_f16_rounded`]); each element's operations those two
/// functions do, with 64 values of the accumulator at a time held in registers.
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C; every row points at `acc.len()` readable f16 values.
#[inline(always)]
pub(crate) unsafe fn mad_f16_rounded_rows(
    acc: &mut [f32],
    rows: &[*const u16],
    weights: &[(f32, f32)],
) {
    let n = acc.len();
    let mut i = 0;
    // SAFETY: `acc[i..i + 64]` is in bounds (`i + 64 <= n`), and so is each row's stretch
    // there (the caller's promise); the instructions, as the caller promises. (No closures:
    // they would not inherit the caller's target features.)
    unsafe {
        while i + 64 <= n {
            let mut a = [_mm256_setzero_ps(); 8];
            for (j, a) in a.iter_mut().enumerate() {
                *a = _mm256_loadu_ps(acc.as_ptr().add(i + 8 * j));
            }
            for (&row, &(ms, vs)) in rows.iter().zip(weights) {
                if ms != 1.0 {
                    let m = _mm256_set1_ps(ms);
                    for a in a.iter_mut() {
                        *a = round_f16_ps(_mm256_mul_ps(*a, m));
                    }
                }
                let w = _mm256_set1_ps(vs);
                for (j, a) in a.iter_mut().enumerate() {
                    let x = _mm256_cvtph_ps(_mm_loadu_si128(row.add(i + 8 * j).cast()));
                    *a = round_f16_ps(_mm256_fmadd_ps(x, w, *a));
                }
            }
            for (j, a) in a.iter().enumerate() {
                _mm256_storeu_ps(acc.as_mut_ptr().add(i + 8 * j), *a);
            }
            i += 64;
        }
    }
    for (row, &(ms, vs)) in rows.iter().zip(weights) {
        if ms != 1.0 {
            // SAFETY: the instructions, as the caller promises.
            unsafe { scale_f16_rounded(&mut acc[i..], ms) };
        }
        // SAFETY: the row holds `n` values (the caller's promise), so `n - i` from `i`.
        unsafe { mad_f16_rounded(&mut acc[i..], row.add(i), vs) };
    }
}

/// `acc[i] = f16(x[i] * w + acc[i])` with one FMA per element, rounded to f16 (ggml's
/// `vec_mad_f16` without half-precision arithmetic); `x` holds `acc.len()` f16 values and
/// `acc` f16 values widened.
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C; `x` points at `acc.len()` readable f16 values.
#[inline(always)]
pub(crate) unsafe fn mad_f16_rounded(acc: &mut [f32], x: *const u16, w: f32) {
    let n = acc.len();
    let mut i = 0;
    // SAFETY: as in `widen_f16`; FMA and F16C as the caller promises.
    unsafe {
        let wv = _mm256_set1_ps(w);
        while i + 8 <= n {
            let xv = _mm256_cvtph_ps(_mm_loadu_si128(x.add(i).cast()));
            let a = _mm256_loadu_ps(acc.as_ptr().add(i));
            let t = _mm256_fmadd_ps(xv, wv, a);
            let r = round_f16_ps(t);
            _mm256_storeu_ps(acc.as_mut_ptr().add(i), r);
            i += 8;
        }
        for (j, a) in acc.iter_mut().enumerate().skip(i) {
            let xv = crate::kernels::fp16::f16_bits_to_f32(x.add(j).read_unaligned());
            *a = half::f16::from_f32(xv.mul_add(w, *a)).to_f32();
        }
    }
}

/// `acc[i] = f16(acc[i] * w)` (ggml's `vec_scale_f16` without half-precision arithmetic).
///
/// # Safety
/// The CPU supports AVX and F16C.
#[inline(always)]
pub(crate) unsafe fn scale_f16_rounded(acc: &mut [f32], w: f32) {
    let n = acc.len();
    let mut i = 0;
    // SAFETY: 8 values at `acc[i..]` (`i + 8 <= n`); the instructions, as the caller promises.
    unsafe {
        let wv = _mm256_set1_ps(w);
        while i + 8 <= n {
            let t = _mm256_mul_ps(_mm256_loadu_ps(acc.as_ptr().add(i)), wv);
            let r = round_f16_ps(t);
            _mm256_storeu_ps(acc.as_mut_ptr().add(i), r);
            i += 8;
        }
    }
    for a in acc.iter_mut().skip(i) {
        *a = half::f16::from_f32(*a * w).to_f32();
    }
}

/// `y[i] = fma(x[i], a, y[i])` for every `i` of the shorter slice, 8 lanes at a time: each
/// element rounded once, as the scalar `mul_add` (and ggml's `ggml_vec_mad_f32`) computes it.
#[target_feature(enable = "avx2,fma")]
pub(crate) fn fma_axpy_avx2(y: &mut [f32], x: &[f32], a: f32) {
    let n = y.len().min(x.len());
    let (y8, x8) = (y[..n].chunks_exact_mut(8), x[..n].chunks_exact(8));
    let va = _mm256_set1_ps(a);
    for (yc, xc) in y8.zip(x8) {
        // SAFETY: each chunk holds 8 floats; AVX2 and FMA are enabled for this function.
        unsafe {
            let v = _mm256_fmadd_ps(
                _mm256_loadu_ps(xc.as_ptr()),
                va,
                _mm256_loadu_ps(yc.as_ptr()),
            );
            _mm256_storeu_ps(yc.as_mut_ptr(), v);
        }
    }
    let done = n - n % 8;
    for (yy, &xx) in y[done..n].iter_mut().zip(&x[done..n]) {
        *yy = xx.mul_add(a, *yy);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `f16(v)` as f32.
    fn f16_round(v: f32) -> f32 {
        half::f16::from_f32(v).to_f32()
    }

    #[test]
    fn accumulating_f16_rows_in_registers_rounds_as_each_step_alone() {
        if !crate::kernels::isa::CpuFeatures::detect().has_avx2() {
            return;
        }
        let mut seed = 0x9e37_79b9_u32;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed as f32 / u32::MAX as f32 * 4.0 - 2.0
        };
        for n in [8, 40, 64, 80, 128, 136, 256] {
            let start: Vec<f32> = (0..n).map(|_| f16_round(next())).collect();
            let rows: Vec<Vec<u16>> = (0..11)
                .map(|_| {
                    (0..n)
                        .map(|_| half::f16::from_f32(next()).to_bits())
                        .collect()
                })
                .collect();
            // New maxima (ms < 1, vs = 1), exactly 0 (the first cell), and plain cells.
            let weights: Vec<(f32, f32)> = (0..11)
                .map(|c| match c % 4 {
                    0 if c == 0 => (0.0, 1.0),
                    0 => (next().abs() / 2.0, 1.0),
                    _ => (1.0, next().abs() / 2.0),
                })
                .collect();
            let ptrs: Vec<*const u16> = rows.iter().map(|r| r.as_ptr()).collect();
            let mut got = start.clone();
            // SAFETY: AVX2, FMA and F16C (checked); every row holds `n` values.
            unsafe { mad_f16_rounded_rows(&mut got, &ptrs, &weights) };
            let mut want = start;
            for (row, &(ms, vs)) in rows.iter().zip(&weights) {
                for (a, &x) in want.iter_mut().zip(row) {
                    if ms != 1.0 {
                        *a = f16_round(*a * ms);
                    }
                    *a = f16_round(half::f16::from_bits(x).to_f32().mul_add(vs, *a));
                }
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "n = {n}");
        }
    }

    #[test]
    fn transpose16x16_moves_every_element() {
        if !crate::kernels::isa::CpuFeatures::detect().has_avx512() {
            return;
        }
        let m: Vec<i32> = (0..256).map(|i| i * 7919 + 13).collect();
        let mut out = [0i32; 256];
        // SAFETY: AVX-512 F (checked); 16 rows of 16 i32 read and written in bounds.
        unsafe {
            let mut rows: [__m512i; 16] =
                std::array::from_fn(|i| _mm512_loadu_si512(m.as_ptr().add(16 * i).cast()));
            transpose16x16_epi32(&mut rows);
            for (i, r) in rows.iter().enumerate() {
                _mm512_storeu_si512(out.as_mut_ptr().add(16 * i).cast(), *r);
            }
        }
        for i in 0..16 {
            for j in 0..16 {
                assert_eq!(out[16 * i + j], m[16 * j + i], "({i}, {j})");
            }
        }
    }
}
