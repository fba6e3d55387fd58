//! AVX512-FP16 half-precision vector arithmetic, for the kernels that mirror a native ggml build
//! on a CPU with it (`__AVX512FP16__` makes ggml's `vec_mad_f16` and `vec_scale_f16` compute in
//! f16, 32 lanes per register). Written as inline assembly: Rust's intrinsics for these
//! instructions are not stable. Each lane is one IEEE half-precision operation, rounded once
//! to nearest even.

use std::arch::asm;

/// Lanes of one 512-bit register of f16.
pub(crate) const LANES: usize = 32;

/// `y[i] = y[i] + x[i] * w` in f16 with one rounding (`vfmadd231ph`), for `y.len()` elements, a
/// multiple of [`LANES`] (`y` and `x` hold f16 bit patterns; `w` is an f16 bit pattern).
///
/// # Safety
/// The CPU supports AVX512-FP16, F and BW; `x` points at `y.len()` readable f16 values.
#[target_feature(enable = "avx512fp16,avx512f,avx512bw")]
pub(crate) unsafe fn fma(y: &mut [u16], x: *const u16, w: u16) {
    debug_assert!(y.len().is_multiple_of(LANES));
    for (i, lanes) in y.chunks_exact_mut(LANES).enumerate() {
        // SAFETY: 32 f16 values at `lanes` (a chunk of `y`) and at `x + 32 i` (readable, as the
        // caller promises); the CPU has the instructions, as the caller promises.
        unsafe {
            asm!(
                "vpbroadcastw {wv}, {w:e}",
                "vmovdqu16 {a}, [{x}]",
                "vmovdqu16 {b}, [{y}]",
                "vfmadd231ph {b}, {a}, {wv}",
                "vmovdqu16 [{y}], {b}",
                x = in(reg) x.add(i * LANES),
                y = in(reg) lanes.as_mut_ptr(),
                w = in(reg) u32::from(w),
                wv = out(zmm_reg) _,
                a = out(zmm_reg) _,
                b = out(zmm_reg) _,
                options(nostack, preserves_flags),
            );
        }
    }
}

/// `y[i] = y[i] * w` in f16 with one rounding (`vmulph`), for `y.len()` elements, a multiple of
/// [`LANES`].
///
/// # Safety
/// The CPU supports AVX512-FP16, F and BW.
#[target_feature(enable = "avx512fp16,avx512f,avx512bw")]
pub(crate) unsafe fn mul(y: &mut [u16], w: u16) {
    debug_assert!(y.len().is_multiple_of(LANES));
    for lanes in y.chunks_exact_mut(LANES) {
        // SAFETY: 32 f16 values at `lanes`; the CPU has the instructions, as the caller
        // promises.
        unsafe {
            asm!(
                "vpbroadcastw {wv}, {w:e}",
                "vmovdqu16 {b}, [{y}]",
                "vmulph {b}, {b}, {wv}",
                "vmovdqu16 [{y}], {b}",
                y = in(reg) lanes.as_mut_ptr(),
                w = in(reg) u32::from(w),
                wv = out(zmm_reg) _,
                b = out(zmm_reg) _,
                options(nostack, preserves_flags),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use half::f16;

    /// The instructions against exact arithmetic rounded once (the products of two f16 are
    /// exact in f64, and so are these sums), on random values.
    #[test]
    fn half_precision_ops_round_once() {
        if !std::arch::is_x86_feature_detected!("avx512fp16") {
            return;
        }
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            f16::from_f32(((state >> 40) as f32 / (1u32 << 24) as f32 - 0.5) * 8.0)
        };
        let x: Vec<f16> = (0..256).map(|_| next()).collect();
        let y0: Vec<f16> = (0..256).map(|_| next()).collect();
        let w = f16::from_f32(0.3172);
        let mut y: Vec<u16> = y0.iter().map(|h| h.to_bits()).collect();
        let xb: Vec<u16> = x.iter().map(|h| h.to_bits()).collect();
        // SAFETY: the CPU has AVX512-FP16 (checked above; it implies F and BW); `xb` holds 256.
        unsafe { super::fma(&mut y, xb.as_ptr(), w.to_bits()) };
        for i in 0..256 {
            let exact = x[i].to_f64().mul_add(w.to_f64(), y0[i].to_f64());
            assert_eq!(y[i], f16::from_f64(exact).to_bits(), "fma lane {i}");
        }
        let mut z = y.clone();
        // SAFETY: as above.
        unsafe { super::mul(&mut z, w.to_bits()) };
        for i in 0..256 {
            let exact = f16::from_bits(y[i]).to_f64() * w.to_f64();
            assert_eq!(z[i], f16::from_f64(exact).to_bits(), "mul lane {i}");
        }
    }
}
