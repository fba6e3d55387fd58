//! ggml-cpu's lookup tables, which every backend mirroring its arithmetic reads: GELU's f16
//! table (`ggml_table_gelu_f16`, used where ggml-cpu is built with `GGML_GELU_FP16`, its
//! default).
//!
//! This module owns the tables' values; how a kernel indexes them is the backend's business.

use std::sync::OnceLock;

/// GELU's tanh approximation constants (as ggml).
const GELU_COEF_A: f32 = 0.044715;
const SQRT_2_OVER_PI: f32 = 0.797_884_6;

/// GELU, tanh approximation, in f32 (what ggml's table is made of). `1 + a*x*x` is one fused
/// multiply-add, as GCC contracts ggml's expression in a native build on any CPU with FMA
/// (checked against that build's table, see the tests).
#[inline]
pub fn gelu_f32(x: f32) -> f32 {
    let inner = (GELU_COEF_A * x).mul_add(x, 1.0);
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * inner).tanh())
}

/// [`gelu_f32`] of every f16 value (indexed by its bits), rounded to f16: ggml's
/// `ggml_table_gelu_f16`. ggml-cpu's GELU of `x` in (-10, 10) is the entry of `x` rounded to
/// f16.
pub fn gelu_f16_table() -> &'static [u16] {
    static TABLE: OnceLock<Box<[u16]>> = OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|bits| {
                let y = gelu_f32(half::f16::from_bits(bits).to_f32());
                // ggml's table holds quiet NaNs without payload (of the sign x86 arithmetic
                // gives); half would keep payloads.
                if y.is_nan() {
                    (u16::from(y.is_sign_negative()) << 15) | 0x7e00
                } else {
                    half::f16::from_f32(y).to_bits()
                }
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    /// The hash `scripts/ggml_ref/gelu_table.c` prints for a native ggml-cpu build (FNV-1a 64
    /// of the table's entries as little-endian u16).
    const GGML_GELU_TABLE_FNV1A: u64 = 0xab04_4edb_a0ed_200c;

    #[test]
    fn gelu_table_equals_ggml() {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &v in super::gelu_f16_table() {
            for byte in v.to_le_bytes() {
                h = (h ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
            }
        }
        assert_eq!(h, GGML_GELU_TABLE_FNV1A);
    }
}
