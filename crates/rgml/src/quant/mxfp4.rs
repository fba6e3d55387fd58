//! MXFP4, the OCP microscaling 4-bit float format (ggml's `block_mxfp4`, type 39).
//!
//! A block holds 32 values as 4-bit E2M1 codes, two to a byte as in IQ4_NL (byte `j` of 16
//! holds value `j` in its low nibble and value `j + 16` in its high nibble), under one E8M0
//! scale `e`: a bare biased exponent, the power of two `2^(e - 127)`. ggml keeps the E2M1 values
//! doubled, as the integers of [`KVALUES_MXFP4`], and halves the scale to match
//! ([`e8m0_to_f32_half`]): value = `KVALUES_MXFP4[q] * 2^(e - 128)`, every product exact.
//!
//! The quantizer is ggml's `quantize_row_mxfp4_ref`, which `quantize_mxfp4` (llama-quantize's
//! entry point) runs whatever importance matrix it is given: the exponent is
//! `floorf(log2f(amax)) - 2 + 127` of the block's largest magnitude (0 for an all-zero block),
//! through glibc's `log2f`, which Rust's `f32::log2` calls too (a magnitude just below a power of
//! two may round up to it there, as in ggml), and each value takes the code whose scaled value
//! is nearest, the first of equals on ties. The exponent is converted to a byte as GCC's x86-64
//! code converts it ([`x86_f32_to_u8`]), so blocks whose magnitudes lie outside E8M0's range get
//! ggml's bytes too.

use super::QuantBlock;
use crate::dtype::DType;
use bytemuck::{Pod, Zeroable};

/// Elements per MXFP4 block.
pub const QK_MXFP4: usize = 32;

/// The E2M1 values doubled (ggml's `kvalues_mxfp4`): code `q` decodes to
/// `KVALUES_MXFP4[q] * e8m0_to_f32_half(e)`. Codes 0 and 8 are +0 and -0, both 0 here.
pub const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// MXFP4: `x = KVALUES_MXFP4[q] * 2^(e - 128)` for 32 values.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockMXFP4 {
    /// E8M0 scale exponent (biased by 127).
    pub e: u8,
    /// E2M1 codes, packed as described in the module docs.
    pub qs: [u8; QK_MXFP4 / 2],
}

const _: () = {
    assert!(std::mem::size_of::<BlockMXFP4>() == DType::MXFP4.block_bytes());
    assert!(QK_MXFP4 == DType::MXFP4.block_size());
};

/// Half the E8M0 scale `e`, `2^(e - 128)`, built from its bits as ggml's
/// `ggml_e8m0_to_fp32_half` does (subnormal for `e < 2`; `e = 255`, which ggml's row validation
/// rejects, gives `2^127`).
#[inline(always)]
pub const fn e8m0_to_f32_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        (e as u32 - 1) << 23
    };
    f32::from_bits(bits)
}

/// `(uint8_t) v` as GCC compiles it for x86-64: `cvttss2si` to a 32-bit integer (truncating
/// toward zero; `0x8000_0000` for NaN and values out of its range), then the low byte. Rust's
/// `as` saturates instead, which differs for infinities.
#[inline]
fn x86_f32_to_u8(v: f32) -> u8 {
    const LIMIT: f32 = 2_147_483_648.0; // 2^31
    let i = if v.is_nan() || v.abs() >= LIMIT {
        i32::MIN
    } else {
        v as i32
    };
    i as u8
}

/// The block's scale exponent for largest magnitude `amax`: ggml's
/// `amax > 0 ? (uint8_t) (floorf(log2f(amax)) - 2 + 127) : 0` (see the module docs).
fn shared_exponent(amax: f32) -> u8 {
    if amax > 0.0 {
        x86_f32_to_u8(amax.log2().floor() - 2.0 + 127.0)
    } else {
        0
    }
}

/// ggml's `best_index_mxfp4`: the code whose value times `d` is nearest `x`, the first of
/// equals on ties (and 0 when no distance compares, as for a NaN or an infinite `x`).
fn best_index_mxfp4(x: f32, d: f32) -> u8 {
    let err = |i: usize| (f32::from(KVALUES_MXFP4[i]) * d - x).abs();
    let mut best = 0;
    let mut best_err = err(0);
    for i in 1..KVALUES_MXFP4.len() {
        let e = err(i);
        if e < best_err {
            best = i;
            best_err = e;
        }
    }
    best as u8
}

impl QuantBlock for BlockMXFP4 {
    const DTYPE: DType = DType::MXFP4;
    type Values = [f32; QK_MXFP4];

    fn quantize(x: &[f32; QK_MXFP4]) -> Self {
        // NaNs never raise the maximum (`amax < NaN` is false), as in ggml.
        let amax = x
            .iter()
            .fold(0.0f32, |m, v| if m < v.abs() { v.abs() } else { m });
        let e = shared_exponent(amax);
        let d = e8m0_to_f32_half(e);
        let half = QK_MXFP4 / 2;
        BlockMXFP4 {
            e,
            qs: std::array::from_fn(|j| {
                best_index_mxfp4(x[j], d) | (best_index_mxfp4(x[j + half], d) << 4)
            }),
        }
    }

    fn dequantize(&self, y: &mut [f32; QK_MXFP4]) {
        let d = e8m0_to_f32_half(self.e);
        let (lo, hi) = y.split_at_mut(QK_MXFP4 / 2);
        for ((&q, a), b) in self.qs.iter().zip(lo).zip(hi) {
            *a = f32::from(KVALUES_MXFP4[usize::from(q & 0x0F)]) * d;
            *b = f32::from(KVALUES_MXFP4[usize::from(q >> 4)]) * d;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_scales_are_powers_of_two() {
        assert_eq!(e8m0_to_f32_half(0), 2f32.powi(-128));
        assert_eq!(e8m0_to_f32_half(1), 2f32.powi(-127));
        assert_eq!(e8m0_to_f32_half(2), 2f32.powi(-126));
        assert_eq!(e8m0_to_f32_half(127), 0.5);
        assert_eq!(e8m0_to_f32_half(128), 1.0);
        assert_eq!(e8m0_to_f32_half(255), 2f32.powi(127));
    }

    #[test]
    fn exponent_follows_ggml_at_the_edges() {
        assert_eq!(shared_exponent(0.0), 0);
        assert_eq!(shared_exponent(1.0), 125);
        assert_eq!(shared_exponent(4.0), 127);
        assert_eq!(shared_exponent(7.99), 127);
        // log2f(f32::MAX) rounds up to 128.
        assert_eq!(shared_exponent(f32::MAX), 253);
        // Below E8M0's range the truncated exponent wraps as GCC's code does: 2^-126 gives -1.
        assert_eq!(shared_exponent(f32::MIN_POSITIVE), 255);
        assert_eq!(shared_exponent(f32::INFINITY), 0);
        assert_eq!(x86_f32_to_u8(f32::NAN), 0);
        assert_eq!(x86_f32_to_u8(-24.0), 232);
    }

    #[test]
    fn ties_take_the_first_code() {
        // d = 1: 0.5 lies between codes 0 (0) and 1 (1); -0.5 between 0 and 9 (-1); 5 between
        // 4 (4) and 5 (6); 10 between 6 (8) and 7 (12).
        assert_eq!(best_index_mxfp4(0.5, 1.0), 0);
        assert_eq!(best_index_mxfp4(-0.5, 1.0), 0);
        assert_eq!(best_index_mxfp4(5.0, 1.0), 4);
        assert_eq!(best_index_mxfp4(-10.0, 1.0), 14);
        assert_eq!(best_index_mxfp4(100.0, 1.0), 7);
        assert_eq!(best_index_mxfp4(f32::NAN, 1.0), 0);
    }

    #[test]
    fn round_trip_is_exact_on_representable_values() {
        let d = e8m0_to_f32_half(120);
        // The largest magnitude, 12 d, gives back exponent 120.
        let x: [f32; QK_MXFP4] = std::array::from_fn(|j| f32::from(KVALUES_MXFP4[j % 16]) * d);
        let b = BlockMXFP4::quantize(&x);
        let mut y = [0f32; QK_MXFP4];
        b.dequantize(&mut y);
        assert_eq!(x, y);
    }
}
