//! The deterministic random numbers behind every weight: SplitMix64 streams seeded from the
//! tensor's name. This module owns the seeding and the mapping from 64 random bits to a float;
//! what the floats are used for is the tensor plan's business.
//!
//! Each tensor has its own stream, so adding, removing or reordering tensors leaves the values
//! of the others unchanged, and the bytes of a file do not depend on anything but its
//! architecture's plan (no external RNG crate whose algorithm might change between versions).

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
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in model.bytes().chain(*b"/").chain(name.bytes()) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        SplitMix64 { state: hash }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A float uniform in `[-amplitude, amplitude)`. The top 24 bits make a float in [-1, 1)
    /// exactly (no rounding), so the only rounding is the final product, which IEEE 754 fixes:
    /// every platform gets the same values.
    pub fn symmetric(&mut self, amplitude: f32) -> f32 {
        let unit = (self.next_u64() >> 40) as f32 * (1.0 / (1u32 << 23) as f32) - 1.0;
        unit * amplitude
    }
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
    fn symmetric_values_stay_in_range_and_spread() {
        let mut r = SplitMix64::for_tensor("t", "x");
        let xs: Vec<f32> = (0..10_000).map(|_| r.symmetric(0.1)).collect();
        assert!(xs.iter().all(|x| (-0.1..0.1).contains(x)));
        let mean = xs.iter().sum::<f32>() / xs.len() as f32;
        assert!(mean.abs() < 0.005, "mean {mean}");
        assert!(xs.iter().any(|&x| x > 0.09) && xs.iter().any(|&x| x < -0.09));
    }
}
