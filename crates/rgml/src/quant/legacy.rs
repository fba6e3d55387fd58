//! The 32-element "legacy" formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and Q8_1.
//!
//! Element `j` of a block is in the low nibble of byte `j` for `j < 16` and in the high nibble of
//! byte `j - 16` otherwise; the 5-bit types keep bit 4 of element `j` in bit `j` of `qh`
//! (little-endian u32). Quantizers follow ggml's `quantize_row_*_ref` exactly, including its
//! truncating float-to-int casts; that is also what `quantize_q4_0` ... `quantize_q8_0` (the
//! functions llama-quantize calls) run when given no importance matrix.

use super::QuantBlock;
use crate::dtype::DType;
use bytemuck::{Pod, Zeroable};
use half::f16;

/// Elements per Q4_0 block.
pub const QK4_0: usize = 32;
/// Elements per Q4_1 block.
pub const QK4_1: usize = 32;
/// Elements per Q5_0 block.
pub const QK5_0: usize = 32;
/// Elements per Q5_1 block.
pub const QK5_1: usize = 32;
/// Elements per Q8_0 block.
pub const QK8_0: usize = 32;
/// Elements per Q8_1 block.
pub const QK8_1: usize = 32;

/// Q4_0: `x = d * (q - 8)`, q in 0..16.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ4_0 {
    /// Scale.
    pub d: f16,
    /// Nibbles: element j in the low nibble of byte j, element j + 16 in its high nibble.
    pub qs: [u8; QK4_0 / 2],
}

/// Q4_1: `x = d * q + m`, q in 0..16.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ4_1 {
    /// Scale.
    pub d: f16,
    /// Minimum (offset).
    pub m: f16,
    /// Nibbles, laid out as in [`BlockQ4_0`].
    pub qs: [u8; QK4_1 / 2],
}

/// Q5_0: `x = d * (q - 16)`, q in 0..32.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ5_0 {
    /// Scale.
    pub d: f16,
    /// Bit 4 of element j is bit j of this little-endian u32.
    pub qh: [u8; 4],
    /// Low nibbles, laid out as in [`BlockQ4_0`].
    pub qs: [u8; QK5_0 / 2],
}

/// Q5_1: `x = d * q + m`, q in 0..32.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ5_1 {
    /// Scale.
    pub d: f16,
    /// Minimum (offset).
    pub m: f16,
    /// Bit 4 of element j is bit j of this little-endian u32.
    pub qh: [u8; 4],
    /// Low nibbles, laid out as in [`BlockQ4_0`].
    pub qs: [u8; QK5_1 / 2],
}

/// Q8_0: `x = d * q`, q in -127..=127.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ8_0 {
    /// Scale.
    pub d: f16,
    /// Quants.
    pub qs: [i8; QK8_0],
}

/// Q8_1: `x = d * q`, plus `s = d * sum(q)` so that dot products with the `_1` types can apply
/// their offset without a second pass.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ8_1 {
    /// Scale.
    pub d: f16,
    /// `d * sum(qs)`.
    pub s: f16,
    /// Quants.
    pub qs: [i8; QK8_1],
}

const _: () = {
    use std::mem::size_of;
    assert!(size_of::<BlockQ4_0>() == DType::Q4_0.block_bytes());
    assert!(size_of::<BlockQ4_1>() == DType::Q4_1.block_bytes());
    assert!(size_of::<BlockQ5_0>() == DType::Q5_0.block_bytes());
    assert!(size_of::<BlockQ5_1>() == DType::Q5_1.block_bytes());
    assert!(size_of::<BlockQ8_0>() == DType::Q8_0.block_bytes());
    assert!(size_of::<BlockQ8_1>() == DType::Q8_1.block_bytes());
    assert!(QK4_0 == DType::Q4_0.block_size() && QK8_1 == DType::Q8_1.block_size());
};

/// The value of largest magnitude, keeping its sign; the first one wins ties, as in ggml.
pub(super) fn signed_absmax(x: &[f32]) -> f32 {
    let mut amax = 0.0f32;
    let mut max = 0.0f32;
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

fn min_max(x: &[f32]) -> (f32, f32) {
    let mut min = f32::MAX;
    let mut max = -f32::MAX;
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

fn inverse(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

/// Packs 5-bit quants into low nibbles and the high-bit word.
fn pack5(q: &[u8; 32]) -> ([u8; 4], [u8; 16]) {
    let mut qs = [0u8; 16];
    let mut qh = 0u32;
    for j in 0..16 {
        qs[j] = (q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4);
        qh |= u32::from((q[j] >> 4) & 1) << j;
        qh |= u32::from((q[j + 16] >> 4) & 1) << (j + 16);
    }
    (qh.to_le_bytes(), qs)
}

/// Unpacks 5-bit quants (0..32) from low nibbles and the high-bit word.
fn unpack5(qh: [u8; 4], qs: &[u8; 16]) -> [u8; 32] {
    let qh = u32::from_le_bytes(qh);
    let mut q = [0u8; 32];
    for j in 0..16 {
        q[j] = (qs[j] & 0x0F) | ((((qh >> j) & 1) as u8) << 4);
        q[j + 16] = (qs[j] >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
    }
    q
}

impl QuantBlock for BlockQ4_0 {
    const DTYPE: DType = DType::Q4_0;
    type Values = [f32; QK4_0];

    fn quantize(x: &[f32; 32]) -> Self {
        let d = signed_absmax(x) / -8.0;
        let id = inverse(d);
        let mut qs = [0u8; 16];
        for j in 0..16 {
            // ggml truncates toward zero via an (int8_t) cast after adding 8.5, then caps at 15.
            let q0 = ((x[j] * id + 8.5) as i8).min(15) as u8;
            let q1 = ((x[j + 16] * id + 8.5) as i8).min(15) as u8;
            qs[j] = q0 | (q1 << 4);
        }
        BlockQ4_0 {
            d: f16::from_f32(d),
            qs,
        }
    }

    fn dequantize(&self, y: &mut [f32; 32]) {
        let d = self.d.to_f32();
        for j in 0..16 {
            y[j] = (i32::from(self.qs[j] & 0x0F) - 8) as f32 * d;
            y[j + 16] = (i32::from(self.qs[j] >> 4) - 8) as f32 * d;
        }
    }
}

impl QuantBlock for BlockQ4_1 {
    const DTYPE: DType = DType::Q4_1;
    type Values = [f32; QK4_1];

    fn quantize(x: &[f32; 32]) -> Self {
        let (min, max) = min_max(x);
        let d = (max - min) / 15.0;
        let id = inverse(d);
        let mut qs = [0u8; 16];
        for j in 0..16 {
            let q0 = (((x[j] - min) * id + 0.5) as i8).min(15) as u8;
            let q1 = (((x[j + 16] - min) * id + 0.5) as i8).min(15) as u8;
            qs[j] = q0 | (q1 << 4);
        }
        BlockQ4_1 {
            d: f16::from_f32(d),
            m: f16::from_f32(min),
            qs,
        }
    }

    fn dequantize(&self, y: &mut [f32; 32]) {
        let d = self.d.to_f32();
        let m = self.m.to_f32();
        for j in 0..16 {
            y[j] = f32::from(self.qs[j] & 0x0F) * d + m;
            y[j + 16] = f32::from(self.qs[j] >> 4) * d + m;
        }
    }
}

impl QuantBlock for BlockQ5_0 {
    const DTYPE: DType = DType::Q5_0;
    type Values = [f32; QK5_0];

    fn quantize(x: &[f32; 32]) -> Self {
        let d = signed_absmax(x) / -16.0;
        let id = inverse(d);
        let mut q = [0u8; 32];
        for (q, &v) in q.iter_mut().zip(x) {
            *q = ((v * id + 16.5) as i8).min(31) as u8;
        }
        let (qh, qs) = pack5(&q);
        BlockQ5_0 {
            d: f16::from_f32(d),
            qh,
            qs,
        }
    }

    fn dequantize(&self, y: &mut [f32; 32]) {
        let d = self.d.to_f32();
        let q = unpack5(self.qh, &self.qs);
        for (y, &q) in y.iter_mut().zip(&q) {
            *y = (i32::from(q) - 16) as f32 * d;
        }
    }
}

impl QuantBlock for BlockQ5_1 {
    const DTYPE: DType = DType::Q5_1;
    type Values = [f32; QK5_1];

    fn quantize(x: &[f32; 32]) -> Self {
        let (min, max) = min_max(x);
        let d = (max - min) / 31.0;
        let id = inverse(d);
        let mut q = [0u8; 32];
        for (q, &v) in q.iter_mut().zip(x) {
            // ggml casts straight to uint8_t here (no cap); the value cannot exceed 31.5.
            *q = ((v - min) * id + 0.5) as u8;
        }
        let (qh, qs) = pack5(&q);
        BlockQ5_1 {
            d: f16::from_f32(d),
            m: f16::from_f32(min),
            qh,
            qs,
        }
    }

    fn dequantize(&self, y: &mut [f32; 32]) {
        let d = self.d.to_f32();
        let m = self.m.to_f32();
        let q = unpack5(self.qh, &self.qs);
        for (y, &q) in y.iter_mut().zip(&q) {
            *y = f32::from(q) * d + m;
        }
    }
}

/// Shared by Q8_0 and Q8_1: scale and round-half-away-from-zero quants.
fn quantize_q8(x: &[f32; 32]) -> (f32, [i8; 32]) {
    let amax = x
        .iter()
        .fold(0.0f32, |a, v| if a > v.abs() { a } else { v.abs() });
    let d = amax / 127.0;
    let id = inverse(d);
    let mut qs = [0i8; 32];
    for (q, &v) in qs.iter_mut().zip(x) {
        // f32::round is C's roundf (halves away from zero).
        *q = (v * id).round() as i8;
    }
    (d, qs)
}

impl QuantBlock for BlockQ8_0 {
    const DTYPE: DType = DType::Q8_0;
    type Values = [f32; QK8_0];

    fn quantize(x: &[f32; 32]) -> Self {
        let (d, qs) = quantize_q8(x);
        BlockQ8_0 {
            d: f16::from_f32(d),
            qs,
        }
    }

    fn dequantize(&self, y: &mut [f32; 32]) {
        let d = self.d.to_f32();
        for (y, &q) in y.iter_mut().zip(&self.qs) {
            *y = f32::from(q) * d;
        }
    }
}

impl QuantBlock for BlockQ8_1 {
    const DTYPE: DType = DType::Q8_1;
    type Values = [f32; QK8_1];

    fn quantize(x: &[f32; 32]) -> Self {
        let (d, qs) = quantize_q8(x);
        let sum: i32 = qs.iter().map(|&q| i32::from(q)).sum();
        BlockQ8_1 {
            d: f16::from_f32(d),
            s: f16::from_f32(sum as f32 * d),
            qs,
        }
    }

    fn dequantize(&self, y: &mut [f32; 32]) {
        let d = self.d.to_f32();
        for (y, &q) in y.iter_mut().zip(&self.qs) {
            *y = f32::from(q) * d;
        }
    }
}
