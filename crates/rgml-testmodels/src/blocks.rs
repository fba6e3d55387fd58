//! Random weights written straight as blocks of their storage type, for the shape models
//! (`--shape`): no f32 values and no quantizer, only random bytes with the scale fields set.
//! This module owns the value distribution of every shape-model tensor (weights with a
//! standard deviation of about [`WEIGHT_STD`], norms near 1, small biases); which tensors exist
//! and which type each has is decided elsewhere.
//!
//! A block is filled with random bytes, which makes every quant, every packed K-quant scale
//! and min, Q3_K's high bits and IQ4_XS's 6-bit scales uniform over their whole valid range
//! (every bit pattern of those fields is valid). Then the f16 super-block scales are
//! overwritten from a table of 256 values between 0.75 and 1.25 times the scale that gives
//! [`WEIGHT_STD`] for those uniform fields (indexed by the random byte the scale held), and
//! the offsets that would otherwise make every weight of a block positive (Q4_1/Q5_1's `m`,
//! the K-quants' `dmin`) are set to cancel the mean. Q8_0's quants avoid -128 (made -127),
//! which ggml's quantizer never writes. K-quant scales below f16's normal range (Q5_K's and
//! Q6_K's `d` are about 4e-5 and 1.5e-5) are stored as f16 subnormals, as in real files of
//! weights this small (llama-quantize gives Q6_K blocks of such weights a `d` near 2.5e-5).
//! MXFP4's scale is a power of two (an E8M0 exponent byte): its random byte picks one of the
//! two exponents around the scale that gives [`WEIGHT_STD`], in the proportion that gives it
//! exactly ([`mxfp4_exponents`]). Float matrices map each random 16-bit value to one of 65536
//! evenly spaced values in ±`WEIGHT_STD`·√3 (a uniform distribution of that deviation).
//!
//! With weights of deviation 0.02 a projection of width n scales a unit-RMS input to about
//! 0.02·√n (1.3 at 4096), so activations stay finite and far from f16's range through 32
//! blocks (the residual stream grows by about √(blocks) units, the logits stay within a few
//! units). This module's tests decode each type and check its deviation and mean.

use crate::rng::SplitMix64;
use half::{bf16, f16};
use rgml::quant::{
    BlockIQ4_NL, BlockIQ4_XS, BlockMXFP4, BlockQ2_K, BlockQ3_K, BlockQ4_0, BlockQ4_1, BlockQ4_K,
    BlockQ5_0, BlockQ5_1, BlockQ5_K, BlockQ6_K, BlockQ8_0, KVALUES_IQ4NL, KVALUES_MXFP4,
};
use rgml::DType;
use std::mem::offset_of;

/// The standard deviation of every weight matrix's values.
pub const WEIGHT_STD: f32 = 0.02;

/// Norm weights are 1 plus uniform noise in ±this.
pub const NORM_SPREAD: f32 = 0.02;

/// Biases are uniform in ±this.
pub const BIAS: f32 = 0.02;

/// How the scale fields of one block type are set after the block is filled with random bytes.
#[derive(Clone, Copy, Debug)]
struct Layout {
    /// Offset of the f16 scale `d`.
    d: usize,
    /// Offset and kind of the second f16 field, if any.
    second: Option<(usize, Second)>,
    /// Mean of the squared decoded value per unit of `d`, over the uniform random fields.
    unit_msq: f64,
}

/// The second f16 field of a block.
#[derive(Clone, Copy, Debug)]
enum Second {
    /// An additive offset `m = -ratio * d` (Q4_1, Q5_1), centring the quants.
    NegOffset(f64),
    /// A K-quant `dmin = ratio * d`, subtracted times each sub-block's min.
    Dmin(f64),
}

/// The mean of `x` and of `x²` for `x` uniform over the integers `lo..=hi`.
fn uniform(lo: i32, hi: i32) -> (f64, f64) {
    let n = f64::from(hi - lo + 1);
    let mean = f64::from(lo + hi) / 2.0;
    (mean, (n * n - 1.0) / 12.0 + mean * mean)
}

/// `E[x²]` per unit `d` for `x = d·sc·q − dmin·m` with `sc`, `m` uniform in `0..=s_max`, `q`
/// uniform in `0..=q_max`, and `dmin = d·E[q]` (so that `E[x] = 0`); returns it with the ratio.
fn k_mix(s_max: i32, q_max: i32) -> (f64, f64) {
    let (s_mean, s_msq) = uniform(0, s_max);
    let (q_mean, q_msq) = uniform(0, q_max);
    let msq = s_msq * q_msq - 2.0 * q_mean * s_mean * q_mean * s_mean + q_mean * q_mean * s_msq;
    (msq, q_mean)
}

/// The mean of the squared IQ4 codebook values.
fn iq4_msq() -> f64 {
    let sum: f64 = KVALUES_IQ4NL.iter().map(|&k| f64::from(k).powi(2)).sum();
    sum / KVALUES_IQ4NL.len() as f64
}

/// MXFP4's exponent bytes by random byte: of the two powers of two `lo` and `2·lo` around the
/// scale `d` that gives [`WEIGHT_STD`] for uniform codes, `2·lo` for the share `p` of the 256
/// entries with `p·(2·lo)² + (1 − p)·lo² = d²`, so the mean squared value is `WEIGHT_STD²`
/// (the stored exponent of a half scale `h` is `log2(h) + 128`).
fn mxfp4_exponents() -> Box<[u8; 256]> {
    let msq = KVALUES_MXFP4
        .iter()
        .map(|&k| f64::from(k).powi(2))
        .sum::<f64>()
        / 16.0;
    let d2 = f64::from(WEIGHT_STD).powi(2) / msq;
    let lo = d2.sqrt().log2().floor();
    let share = (d2 / 4f64.powf(lo) - 1.0) / 3.0;
    let high = (256.0 * share).round() as usize;
    let e = |log2: f64| (log2 + 128.0) as u8;
    Box::new(std::array::from_fn(|i| {
        if i < high {
            e(lo + 1.0)
        } else {
            e(lo)
        }
    }))
}

/// The layout of a quantized `dtype`; `None` for float and unsupported types.
fn layout(dtype: DType) -> Option<Layout> {
    let plain = |d: usize, unit_msq: f64| Layout {
        d,
        second: None,
        unit_msq,
    };
    let with = |d: usize, second: usize, kind: Second, unit_msq: f64| Layout {
        d,
        second: Some((second, kind)),
        unit_msq,
    };
    Some(match dtype {
        DType::Q4_0 => plain(offset_of!(BlockQ4_0, d), uniform(-8, 7).1),
        DType::Q4_1 => {
            let (mean, msq) = uniform(0, 15);
            let m = offset_of!(BlockQ4_1, m);
            with(
                offset_of!(BlockQ4_1, d),
                m,
                Second::NegOffset(mean),
                msq - mean * mean,
            )
        }
        DType::Q5_0 => plain(offset_of!(BlockQ5_0, d), uniform(-16, 15).1),
        DType::Q5_1 => {
            let (mean, msq) = uniform(0, 31);
            let m = offset_of!(BlockQ5_1, m);
            with(
                offset_of!(BlockQ5_1, d),
                m,
                Second::NegOffset(mean),
                msq - mean * mean,
            )
        }
        DType::Q8_0 => plain(offset_of!(BlockQ8_0, d), uniform(-127, 127).1),
        DType::Q2_K => {
            let (msq, ratio) = k_mix(15, 3);
            let dmin = offset_of!(BlockQ2_K, dmin);
            with(offset_of!(BlockQ2_K, d), dmin, Second::Dmin(ratio), msq)
        }
        DType::Q3_K => plain(
            offset_of!(BlockQ3_K, d),
            uniform(-32, 31).1 * uniform(-4, 3).1,
        ),
        DType::Q4_K => {
            let (msq, ratio) = k_mix(63, 15);
            let dmin = offset_of!(BlockQ4_K, dmin);
            with(offset_of!(BlockQ4_K, d), dmin, Second::Dmin(ratio), msq)
        }
        DType::Q5_K => {
            let (msq, ratio) = k_mix(63, 31);
            let dmin = offset_of!(BlockQ5_K, dmin);
            with(offset_of!(BlockQ5_K, d), dmin, Second::Dmin(ratio), msq)
        }
        DType::Q6_K => plain(
            offset_of!(BlockQ6_K, d),
            uniform(-128, 127).1 * uniform(-32, 31).1,
        ),
        DType::IQ4_NL => plain(offset_of!(BlockIQ4_NL, d), iq4_msq()),
        DType::IQ4_XS => plain(offset_of!(BlockIQ4_XS, d), uniform(-32, 31).1 * iq4_msq()),
        _ => return None,
    })
}

/// The scale of the i-th of 256 table entries, relative to the nominal scale: 0.75 to 1.25.
fn scale_factor(i: usize) -> f64 {
    0.75 + 0.5 * (i as f64 + 0.5) / 256.0
}

/// Makes random weight blocks of one type (see the module docs).
#[derive(Clone, Debug)]
pub struct BlockFiller {
    dtype: DType,
    kind: Kind,
}

#[derive(Clone, Debug)]
enum Kind {
    /// F16 or BF16 elements: `table[i]` holds the little-endian bytes of value i.
    Half(Box<[[u8; 2]; 1 << 16]>),
    /// F32 elements, likewise.
    Single(Box<[[u8; 4]; 1 << 16]>),
    /// Quantized blocks: the layout and the bytes of the 256 `d` values and their partners.
    Blocks {
        block_bytes: usize,
        layout: Layout,
        d: Box<[[u8; 2]; 256]>,
        second: Box<[[u8; 2]; 256]>,
    },
    /// MXFP4 blocks: the 256 exponent bytes ([`mxfp4_exponents`]).
    Mxfp4(Box<[u8; 256]>),
}

impl BlockFiller {
    /// A filler for `dtype`, a weight type of llama-quantize's presets (F32, F16, BF16, Q4_0,
    /// Q4_1, Q5_0, Q5_1, Q8_0, Q2_K...Q6_K, IQ4_NL, IQ4_XS) or MXFP4; `None` for any other type.
    pub fn new(dtype: DType) -> Option<BlockFiller> {
        let kind = match dtype {
            DType::MXFP4 => Kind::Mxfp4(mxfp4_exponents()),
            DType::F32 => Kind::Single(float_table(|v| (v as f32).to_le_bytes())),
            DType::F16 => Kind::Half(float_table(|v| f16::from_f64(v).to_le_bytes())),
            DType::BF16 => Kind::Half(float_table(|v| bf16::from_f64(v).to_le_bytes())),
            _ => {
                let layout = layout(dtype)?;
                let mean_factor_sq = (0..256).map(|i| scale_factor(i).powi(2)).sum::<f64>() / 256.0;
                let nominal = f64::from(WEIGHT_STD) / (layout.unit_msq * mean_factor_sq).sqrt();
                let mut d = Box::new([[0u8; 2]; 256]);
                let mut second = Box::new([[0u8; 2]; 256]);
                for i in 0..256 {
                    // The stored d, not the exact one, so that m cancels the mean exactly.
                    let di = f16::from_f64(nominal * scale_factor(i));
                    d[i] = di.to_le_bytes();
                    let partner = match layout.second {
                        Some((_, Second::NegOffset(r))) => -r * di.to_f64(),
                        Some((_, Second::Dmin(r))) => r * di.to_f64(),
                        None => 0.0,
                    };
                    second[i] = f16::from_f64(partner).to_le_bytes();
                }
                Kind::Blocks {
                    block_bytes: dtype.block_bytes(),
                    layout,
                    d,
                    second,
                }
            }
        };
        Some(BlockFiller { dtype, kind })
    }

    /// Fill `out`, a whole number of blocks (elements for float types), from `rng`.
    /// A trailing partial block is left random.
    pub fn fill(&self, rng: &mut SplitMix64, out: &mut [u8]) {
        match &self.kind {
            Kind::Half(table) => fill_floats(rng, table, out),
            Kind::Single(table) => fill_floats(rng, table, out),
            Kind::Mxfp4(e) => {
                rng.fill_bytes(out);
                let at = offset_of!(BlockMXFP4, e);
                for block in out.chunks_exact_mut(std::mem::size_of::<BlockMXFP4>()) {
                    block[at] = e[usize::from(block[at])];
                }
            }
            Kind::Blocks {
                block_bytes,
                layout,
                d,
                second,
            } => {
                rng.fill_bytes(out);
                for block in out.chunks_exact_mut(*block_bytes) {
                    let i = usize::from(block[layout.d]);
                    block[layout.d..layout.d + 2].copy_from_slice(&d[i]);
                    if let Some((at, _)) = layout.second {
                        block[at..at + 2].copy_from_slice(&second[i]);
                    }
                    if self.dtype == DType::Q8_0 {
                        let qs = &mut block[offset_of!(BlockQ8_0, qs)..];
                        for q in qs {
                            // -128 becomes -127; branch-free, so the loop vectorizes.
                            *q += u8::from(*q == 0x80);
                        }
                    }
                }
            }
        }
    }
}

/// The 65536 values of a float matrix, evenly spaced in ±`WEIGHT_STD`·√3, each as the
/// little-endian bytes `encode` makes of it.
fn float_table<const W: usize>(encode: impl Fn(f64) -> [u8; W]) -> Box<[[u8; W]; 1 << 16]> {
    let amplitude = f64::from(WEIGHT_STD) * 3f64.sqrt();
    let mut table = Box::new([[0u8; W]; 1 << 16]);
    for (i, bytes) in table.iter_mut().enumerate() {
        *bytes = encode(amplitude * ((2 * i + 1) as f64 / 65536.0 - 1.0));
    }
    table
}

/// Fill `out` with elements of `W` bytes from `table`, four per random `u64` (16 bits each).
/// A trailing partial element is left zero.
fn fill_floats<const W: usize>(rng: &mut SplitMix64, table: &[[u8; W]; 1 << 16], out: &mut [u8]) {
    let mut four = |x: &mut [u8]| {
        let r = rng.next_u64();
        for (k, e) in x.chunks_exact_mut(W).enumerate() {
            // A u16 index: always inside the 65536 entries, so no bounds check is needed.
            e.copy_from_slice(&table[usize::from((r >> (16 * k)) as u16)]);
        }
    };
    let mut groups = out.chunks_exact_mut(4 * W);
    for x in &mut groups {
        four(x);
    }
    let rest = groups.into_remainder();
    rest.fill(0);
    four(rest);
}

/// `n` norm weights: 1 plus uniform noise in ±[`NORM_SPREAD`].
pub fn norm_values(rng: &mut SplitMix64, n: usize) -> Vec<f32> {
    (0..n).map(|_| 1.0 + rng.symmetric(NORM_SPREAD)).collect()
}

/// `n` biases, uniform in ±[`BIAS`].
pub fn bias_values(rng: &mut SplitMix64, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.symmetric(BIAS)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The types [`BlockFiller::new`] accepts: the weight types of llama-quantize's presets
    /// and MXFP4.
    const FILLABLE: [DType; 16] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q2_K,
        DType::Q3_K,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::IQ4_NL,
        DType::IQ4_XS,
        DType::MXFP4,
    ];

    /// Decode 64 random blocks' worth of a 256-wide row set of `dtype`.
    fn decoded(dtype: DType, seed: u64) -> Vec<f32> {
        let filler = BlockFiller::new(dtype).expect("fillable");
        let n = 256 * 64;
        let mut bytes = vec![0u8; dtype.row_bytes(n).unwrap()];
        filler.fill(&mut SplitMix64::for_chunk("t", "w", seed, 0), &mut bytes);
        let mut values = vec![0f32; n];
        rgml::quant::dequantize_row(dtype, &bytes, &mut values).unwrap();
        values
    }

    #[test]
    fn every_type_decodes_to_finite_values_of_the_intended_deviation() {
        for dtype in FILLABLE {
            let v = decoded(dtype, 1);
            assert!(v.iter().all(|x| x.is_finite()), "{dtype}");
            let n = v.len() as f64;
            let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
            let std = (v
                .iter()
                .map(|&x| (f64::from(x) - mean).powi(2))
                .sum::<f64>()
                / n)
                .sqrt();
            assert!((0.017..0.023).contains(&std), "{dtype}: std {std}");
            assert!(mean.abs() < 0.003, "{dtype}: mean {mean}");
            let distinct: std::collections::HashSet<u32> = v.iter().map(|x| x.to_bits()).collect();
            // MXFP4's values are ±{0, 1, 2, 3, 4, 6, 8, 12} times 2^-9 or 2^-8: 19 in all.
            let least = if dtype == DType::MXFP4 { 18 } else { 100 };
            assert!(
                distinct.len() > least,
                "{dtype}: {} distinct values",
                distinct.len()
            );
        }
    }

    #[test]
    fn the_same_stream_gives_the_same_blocks_and_another_differs() {
        for dtype in [DType::Q4_K, DType::F16, DType::IQ4_XS, DType::MXFP4] {
            assert_eq!(decoded(dtype, 5), decoded(dtype, 5), "{dtype}");
            assert_ne!(decoded(dtype, 5), decoded(dtype, 6), "{dtype}");
        }
    }

    #[test]
    fn q8_0_quants_stay_in_the_quantizer_s_range() {
        let filler = BlockFiller::new(DType::Q8_0).unwrap();
        let mut bytes = vec![0u8; 34 * 4096];
        filler.fill(&mut SplitMix64::for_chunk("t", "q8", 0, 0), &mut bytes);
        for block in bytes.chunks_exact(34) {
            assert!(block[2..].iter().all(|&q| q != 0x80));
        }
    }

    /// MXFP4's exponents are the two powers of two around the nominal scale, 2^-9 and 2^-8
    /// (E8M0 bytes 119 and 120), so every value is a code times 2^-9 or 2^-8.
    #[test]
    fn mxfp4_exponents_bracket_the_nominal_scale() {
        let e = mxfp4_exponents();
        assert!(e.iter().all(|&b| b == 119 || b == 120), "{e:?}");
        assert!(e.contains(&119) && e.contains(&120));
    }

    #[test]
    fn types_without_a_filler_are_refused() {
        assert!(BlockFiller::new(DType::Q8_K).is_none());
        assert!(BlockFiller::new(DType::Q8_1).is_none());
    }

    #[test]
    fn norms_and_biases_stay_small() {
        let mut rng = SplitMix64::for_chunk("t", "n", 0, 0);
        assert!(norm_values(&mut rng, 1000)
            .iter()
            .all(|x| (0.98..1.02).contains(x)));
        assert!(bias_values(&mut rng, 1000).iter().all(|x| x.abs() < 0.02));
    }
}
