//! The inputs of the ggml reference fixtures (`scripts/ggml_ref/`), made again from their
//! seeds: the C generators' values, rows encoded as ggml-base stores them, and the hash the
//! fixtures keep of them.

#![allow(dead_code)] // Not every test uses every helper.

use rgml::DType;

/// The generator of `scripts/ggml_ref/`'s inputs (`flash_attn_ref.c`, `mul_mat_id_ref.c`): xorshift uniforms, sums of four, occasional outliers, in
/// plain f32 arithmetic.
pub struct Values(u64);

impl Values {
    pub fn new(seed: u64) -> Values {
        Values(seed.wrapping_mul(0x9E3779B97F4A7C15) | 1)
    }

    pub fn uniform(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f64 / (1u64 << 24) as f64) as f32
    }

    pub fn value(&mut self) -> f32 {
        let mut s = 0f32;
        for _ in 0..4 {
            s += self.uniform();
        }
        let scale = if self.uniform() < 0.05 { 4.0 } else { 1.0 };
        (s - 2.0) * scale + 0.01
    }

    pub fn fill(seed: u64, n: usize, scale: f32) -> Vec<f32> {
        let mut g = Values::new(seed);
        (0..n).map(|_| g.value() * scale).collect()
    }
}

/// Rows of `dtype` as ggml-base stores them (f16 rounding, reference quantizers).
pub fn encode(dtype: DType, values: &[f32], row: usize) -> Vec<u8> {
    let row_bytes = dtype.row_bytes(row).unwrap();
    let mut out = vec![0u8; values.len() / row * row_bytes];
    for (src, dst) in values.chunks(row).zip(out.chunks_mut(row_bytes)) {
        rgml::quant::quantize_row(dtype, src, dst).unwrap();
    }
    out
}

pub fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h = (h ^ u64::from(b)).wrapping_mul(0x100000001b3);
    }
    h
}
