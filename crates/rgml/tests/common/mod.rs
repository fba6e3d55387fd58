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
