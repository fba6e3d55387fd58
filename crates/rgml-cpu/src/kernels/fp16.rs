//! The f16 -> f32 conversion of the scalar block scales every quantized dot reads (`d`, `m`
//! of each block), by a table, as ggml-cpu's x86 build does (`ggml_table_f32_f16`).
//!
//! Why not F16C's `vcvtph2ps`: a scalar conversion through a vector register lets the compiler
//! merge the 16 loaded bits into whatever register it likes (`vpinsrw` into an accumulator),
//! which chains each block's conversion behind the previous block's FMA; and on Zen 1 the
//! instruction is slower than an L1 load. Measured on a Zen 1 matrix-vector product of Q8_0
//! weights from DRAM: 3.7 GB/s with F16C, 9 GB/s with the table (C loop: 7.3 and 9.0). The
//! table holds exact conversions, so results do not change.

/// Every f16 bit pattern's exact f32 value (256 KiB; a dot touches the few lines its scales
/// fall in).
static TABLE: [f32; 1 << 16] = table();

const fn table() -> [f32; 1 << 16] {
    let mut t = [0f32; 1 << 16];
    let mut i = 0;
    while i < t.len() {
        t[i] = half::f16::from_bits(i as u16).to_f32_const();
        i += 1;
    }
    t
}

/// The f16 with these bits, as f32 (exact).
#[inline(always)]
pub(crate) fn f16_bits_to_f32(bits: u16) -> f32 {
    TABLE[usize::from(bits)]
}

/// The f16 `h` as f32 (exact).
#[inline(always)]
pub(crate) fn f16_to_f32(h: half::f16) -> f32 {
    f16_bits_to_f32(h.to_bits())
}

/// The f16 at `p` as f32 (by [`super::fp16`]'s table).
///
/// # Safety
/// Two readable bytes at `p`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn h2f(p: *const u8) -> f32 {
    // SAFETY: as the caller promises.
    f16_bits_to_f32(unsafe { p.cast::<u16>().read_unaligned() })
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_bit_pattern_converts_as_half_does() {
        for bits in 0..=u16::MAX {
            let want = half::f16::from_bits(bits).to_f32();
            let got = super::f16_bits_to_f32(bits);
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{bits:#06x}: {got} vs {want}"
            );
        }
    }
}
