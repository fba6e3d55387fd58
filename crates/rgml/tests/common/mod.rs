//! Test support shared by the core crate's integration tests: a Vec-backed host buffer type
//! (`rgml::testing`), so the core crate needs no backend to test its allocators, and random
//! test data.

#![allow(dead_code)] // each test crate uses its own part

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rgml::testing::VecBufferType;
use rgml::BufferTypeRef;

/// A host buffer type named `name` (alignment 32) whose buffers hold at most `max_size` bytes.
pub fn vec_buffer_type(name: &str, max_size: usize) -> BufferTypeRef {
    VecBufferType::new(name).with_max_size(max_size).shared()
}

/// Uniform values in ±1, none near zero (so a missing term always shows).
pub fn random_from(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let v: f32 = rng.gen_range(-1.0..1.0);
            if v.abs() < 0.05 {
                0.5
            } else {
                v
            }
        })
        .collect()
}

/// [`random_from`] a generator seeded with `seed`.
pub fn random(seed: u64, n: usize) -> Vec<f32> {
    random_from(&mut StdRng::seed_from_u64(seed), n)
}

/// `w` (`m` rows of `k`, ggml layout: row `i` is `w[i*k..]`) times each `k`-column of `x`, in
/// float64.
pub fn mat_mul(w: &[f32], k: usize, x: &[f64]) -> Vec<f64> {
    let m = w.len() / k;
    x.chunks(k)
        .flat_map(|col| {
            (0..m).map(move |i| (0..k).map(|p| w[i * k + p] as f64 * col[p]).sum::<f64>())
        })
        .collect()
}

/// SiLU in float64.
pub fn silu(v: f64) -> f64 {
    v / (1.0 + (-v).exp())
}

/// `got` equals the float64 `want` within f32 rounding of a few operations.
pub fn assert_close(got: &[f32], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g as f64 - w).abs() <= 1e-5 * (1.0 + w.abs()),
            "{what}[{i}]: {g} vs {w}"
        );
    }
}
