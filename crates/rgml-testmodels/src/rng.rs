//! The deterministic random numbers behind every weight: SplitMix64 streams seeded from the
//! tensor's name (tiny models) or from the tensor's name, the user's seed and the piece of
//! the tensor (shape models, whose pieces are made on several threads). This module owns the
//! seeding and the mapping from 64 random bits to floats and bytes; what they are used for is
//! the tensor plans' business.
//!
//! Each tensor has its own stream, so adding, removing or reordering tensors leaves the values
//! of the others unchanged, and the bytes of a file do not depend on anything but its plan
//! (and seed), not on threads (no external RNG crate whose algorithm might change between
//! versions).

/// SplitMix64 (Steele, Lea and Flood, 2014): a 64-bit state stepped by a Weyl constant and
/// scrambled; small, fast and good enough for test weights.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A stream for the tensor `name` of the model `model` (its [`crate::Arch`] name): the seed
    /// is the FNV-1a hash of `model/name`, so two files that share tensor names still differ.
    pub fn for_tensor(model: &str, name: &str) -> SplitMix64 {
        SplitMix64 {
            state: fnv1a(model.bytes().chain(*b"/").chain(name.bytes())),
        }
    }

    /// A stream for piece `chunk` of the tensor `name` of the model `model` under the user's
    /// `seed`: the FNV-1a hash of `model/name/` and the little-endian bytes of `seed` and
    /// `chunk`. Pieces of one tensor get their own streams, so they can be made on any
    /// thread, in any order, and give the same bytes.
    pub fn for_chunk(model: &str, name: &str, seed: u64, chunk: u64) -> SplitMix64 {
        let bytes = model.bytes().chain(*b"/").chain(name.bytes()).chain(*b"/");
        SplitMix64 {
            state: fnv1a(bytes.chain(seed.to_le_bytes()).chain(chunk.to_le_bytes())),
        }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Fill `out` with random bytes (each 8 from one [`SplitMix64::next_u64`], little-endian).
    pub fn fill_bytes(&mut self, out: &mut [u8]) {
        let mut words = out.chunks_exact_mut(8);
        for word in &mut words {
            word.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let tail = words.into_remainder();
        if !tail.is_empty() {
            let bytes = self.next_u64().to_le_bytes();
            tail.copy_from_slice(&bytes[..tail.len()]);
        }
    }

    /// A float uniform in `[-amplitude, amplitude)`. The top 24 bits make a float in [-1, 1)
    /// exactly (no rounding), so the only rounding is the final product, which IEEE 754 fixes:
    /// every platform gets the same values.
    pub fn symmetric(&mut self, amplitude: f32) -> f32 {
        let unit = (self.next_u64() >> 40) as f32 * (1.0 / (1u32 << 23) as f32) - 1.0;
        unit * amplitude
    }
}

/// The 64-bit FNV-1a hash of `bytes`.
fn fnv1a(bytes: impl IntoIterator<Item = u8>) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_matches_the_reference_sequence() {
        // The first outputs of the reference C implementation seeded with 0.
        let mut r = SplitMix64 { state: 0 };
        assert_eq!(r.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(r.next_u64(), 0x6e78_9e6a_a1b9_65f4);
        assert_eq!(r.next_u64(), 0x06c4_5d18_8009_454f);
    }

    #[test]
    fn streams_depend_on_model_and_tensor_name() {
        let first = |m: &str, n: &str| SplitMix64::for_tensor(m, n).next_u64();
        assert_eq!(
            first("qwen2", "output_norm.weight"),
            first("qwen2", "output_norm.weight")
        );
        assert_ne!(
            first("qwen2", "output_norm.weight"),
            first("qwen3", "output_norm.weight")
        );
        assert_ne!(
            first("qwen2", "blk.0.attn_q.weight"),
            first("qwen2", "blk.1.attn_q.weight")
        );
    }

    #[test]
    fn chunk_streams_depend_on_seed_and_chunk_and_fill_whole_buffers() {
        let first = |seed: u64, chunk: u64| {
            SplitMix64::for_chunk("llama-1b", "blk.0.attn_q.weight", seed, chunk).next_u64()
        };
        assert_eq!(first(7, 3), first(7, 3));
        assert_ne!(first(7, 3), first(8, 3));
        assert_ne!(first(7, 3), first(7, 4));
        let mut a = [0u8; 13];
        let mut r = SplitMix64::for_chunk("m", "t", 0, 0);
        r.fill_bytes(&mut a);
        let mut r2 = SplitMix64::for_chunk("m", "t", 0, 0);
        let (w0, w1) = (r2.next_u64().to_le_bytes(), r2.next_u64().to_le_bytes());
        assert_eq!(a[..8], w0);
        assert_eq!(a[8..], w1[..5]);
    }

    #[test]
    fn symmetric_values_stay_in_range_and_spread() {
        let mut r = SplitMix64::for_tensor("t", "x");
        let xs: Vec<f32> = (0..10_000).map(|_| r.symmetric(0.1)).collect();
        assert!(xs.iter().all(|x| (-0.1..0.1).contains(x)));
        let mean = xs.iter().sum::<f32>() / xs.len() as f32;
        assert!(mean.abs() < 0.005, "mean {mean}");
        assert!(xs.iter().any(|&x| x > 0.09) && xs.iter().any(|&x| x < -0.09));
    }
}
