use super::*;
use bytemuck::Zeroable;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Every quantized dtype (the block formats this module implements).
fn quantized() -> impl Iterator<Item = DType> {
    DType::ALL.into_iter().filter(|t| t.is_quantized())
}

/// ggml's test-quantize-fns `MAX_QUANTIZATION_TOTAL_ERROR` (and its `_2BITS` / `_3BITS` bounds
/// for Q2_K / Q3_K, `_FP4` for MXFP4, whose coarse power-of-two scales exceed 0.002 on uniform
/// data), which its quantizers meet on the cos signal.
fn max_total_error(dtype: DType) -> f32 {
    match dtype {
        DType::Q2_K => 0.0075,
        DType::Q3_K => 0.0040,
        DType::MXFP4 => 0.0030,
        _ => 0.002,
    }
}

/// test-quantize-fns' synthetic signal.
fn cos_data(offset: f32, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (0.1 + 2.0 * f64::from((i as f32 + offset).cos())) as f32)
        .collect()
}

/// test-quantize-fns' error measure: sqrt(sum of squared differences) / n (not a true RMSE).
fn total_error(a: &[f32], b: &[f32]) -> f32 {
    let sum: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| {
            let d = f64::from(x) - f64::from(y);
            d * d
        })
        .sum();
    (sum.sqrt() as f32) / a.len() as f32
}

fn round_trip(dtype: DType, x: &[f32]) -> Vec<f32> {
    let mut q = vec![0u8; dtype.row_bytes(x.len()).unwrap()];
    quantize_row(dtype, x, &mut q).unwrap();
    let mut y = vec![0.0f32; x.len()];
    dequantize_row(dtype, &q, &mut y).unwrap();
    y
}

fn uniform(rng: &mut StdRng, n: usize, a: f32) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-a..a)).collect()
}

/// Sum of 12 uniforms: cheap, deterministic and close enough to a gaussian.
fn gaussianish(rng: &mut StdRng, n: usize, sigma: f32) -> Vec<f32> {
    (0..n)
        .map(|_| ((0..12).map(|_| rng.gen::<f32>()).sum::<f32>() - 6.0) * sigma)
        .collect()
}

#[test]
fn cos_signal_error_within_ggml_bounds() {
    let x = cos_data(0.0, 32 * 128);
    for dtype in quantized() {
        let err = total_error(&x, &round_trip(dtype, &x));
        let max = max_total_error(dtype);
        assert!(err < max, "{dtype}: error {err} >= {max}");
    }
}

#[test]
fn random_data_error_within_ggml_bounds() {
    let mut rng = StdRng::seed_from_u64(7);
    let n = 32 * 128;
    let inputs = [
        uniform(&mut rng, n, 1.0),
        gaussianish(&mut rng, n, 0.5),
        uniform(&mut rng, n, 2.0).iter().map(|v| v + 0.5).collect(),
    ];
    for x in &inputs {
        for dtype in quantized() {
            let err = total_error(x, &round_trip(dtype, x));
            let max = max_total_error(dtype);
            assert!(err < max, "{dtype}: error {err} >= {max}");
        }
    }
}

#[test]
fn more_bits_means_less_error() {
    let mut rng = StdRng::seed_from_u64(11);
    let x = gaussianish(&mut rng, 256 * 8, 1.0);
    let err = |t| total_error(&x, &round_trip(t, &x));
    assert!(err(DType::Q5_K) < err(DType::Q4_K));
    assert!(err(DType::Q6_K) < err(DType::Q5_K));
    assert!(err(DType::Q8_K) < err(DType::Q6_K));
    assert!(err(DType::Q5_0) < err(DType::Q4_0));
    assert!(err(DType::Q8_0) < err(DType::Q5_0));
    assert!(err(DType::Q3_K) < err(DType::Q2_K));
    assert!(err(DType::Q4_K) < err(DType::Q3_K));
    assert!(err(DType::IQ4_XS) < err(DType::Q3_K));
    // The non-linear codebook fits bell-shaped data better than Q4_0's uniform grid.
    assert!(err(DType::IQ4_NL) < err(DType::Q4_0));
}

#[test]
fn q8_1_sum_and_q8_k_bsums_match_quants() {
    let mut rng = StdRng::seed_from_u64(3);
    let x = uniform(&mut rng, 256 * 2, 3.0);
    let mut b1 = vec![BlockQ8_1::zeroed(); x.len() / 32];
    quantize_blocks(&x, &mut b1).unwrap();
    for b in &b1 {
        let sum: i32 = b.qs.iter().map(|&q| i32::from(q)).sum();
        // ggml scales the sum by the unrounded f32 scale, so compare loosely.
        let expect = sum as f32 * b.d.to_f32();
        assert!(
            (b.s.to_f32() - expect).abs() <= expect.abs() * 2e-3,
            "{b:?}"
        );
    }
    let mut bk = vec![BlockQ8_K::zeroed(); x.len() / 256];
    quantize_blocks(&x, &mut bk).unwrap();
    for b in &bk {
        for (j, &s) in b.bsums.iter().enumerate() {
            let sum: i32 = b.qs[16 * j..16 * j + 16]
                .iter()
                .map(|&q| i32::from(q))
                .sum();
            assert_eq!(i32::from(s), sum);
        }
        assert!(b.qs.iter().all(|&q| q > -128));
    }
}

#[test]
fn zero_input_gives_zero_blocks_and_output() {
    let x = vec![0.0f32; 512];
    for dtype in quantized() {
        let y = round_trip(dtype, &x);
        assert!(y.iter().all(|&v| v == 0.0), "{dtype}");
    }
}

#[test]
fn nearest_int_rounds_half_to_even() {
    assert_eq!(nearest_int(0.5), 0);
    assert_eq!(nearest_int(1.5), 2);
    assert_eq!(nearest_int(2.5), 2);
    assert_eq!(nearest_int(-0.5), 0);
    assert_eq!(nearest_int(-1.5), -2);
    assert_eq!(nearest_int(-2.4), -2);
    assert_eq!(nearest_int(12345.7), 12346);
}

#[test]
fn scale_min_k4_round_trips() {
    let ls: [u8; 8] = [0, 1, 17, 63, 32, 45, 5, 62];
    let lm: [u8; 8] = [63, 2, 0, 31, 60, 16, 48, 1];
    let packed = super::kquants::pack_scale_min_k4(&ls, &lm);
    for j in 0..8 {
        assert_eq!(scale_min_k4(j, &packed), (ls[j], lm[j]));
    }
}

#[test]
fn f32_f16_bf16_round_trips() {
    let mut rng = StdRng::seed_from_u64(5);
    let x = uniform(&mut rng, 1000, 100.0);
    assert_eq!(round_trip(DType::F32, &x), x);
    let h = round_trip(DType::F16, &x);
    let b = round_trip(DType::BF16, &x);
    for i in 0..x.len() {
        assert_eq!(h[i], f16::from_f32(x[i]).to_f32());
        assert_eq!(b[i], bf16::from_f32(x[i]).to_f32());
        assert!((h[i] - x[i]).abs() <= x[i].abs() * 1e-3);
        assert!((b[i] - x[i]).abs() <= x[i].abs() * 8e-3);
    }
    // Values already representable survive exactly.
    let exact = [0.0f32, -0.0, 1.0, -2.5, 0.15625, 1024.0];
    assert_eq!(round_trip(DType::F16, &exact), exact);
    assert_eq!(round_trip(DType::BF16, &exact), exact);
}

#[test]
fn unaligned_buffers_give_the_same_bytes() {
    let mut rng = StdRng::seed_from_u64(9);
    let x = uniform(&mut rng, 512, 4.0);
    for dtype in quantized().chain([DType::F32, DType::F16, DType::BF16]) {
        let len = dtype.row_bytes(x.len()).unwrap();
        let mut aligned = vec![0u64; len / 8 + 2];
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut aligned);
        quantize_row(dtype, &x, &mut bytes[..len]).unwrap();
        let reference = bytes[..len].to_vec();
        quantize_row(dtype, &x, &mut bytes[1..len + 1]).unwrap();
        assert_eq!(&bytes[1..len + 1], &reference[..], "{dtype}");
        let mut y_unaligned = vec![0.0f32; x.len()];
        dequantize_row(dtype, &bytes[1..len + 1], &mut y_unaligned).unwrap();
        let mut y = vec![0.0f32; x.len()];
        dequantize_row(dtype, &reference, &mut y).unwrap();
        assert_eq!(y, y_unaligned, "{dtype}");
    }
}

#[test]
fn typed_and_byte_apis_agree() {
    let mut rng = StdRng::seed_from_u64(13);
    let x = gaussianish(&mut rng, 512, 1.0);
    let mut blocks = vec![BlockQ4_K::zeroed(); 2];
    quantize_blocks(&x, &mut blocks).unwrap();
    let mut bytes = vec![0u8; DType::Q4_K.row_bytes(512).unwrap()];
    quantize_row(DType::Q4_K, &x, &mut bytes).unwrap();
    assert_eq!(bytemuck::cast_slice::<BlockQ4_K, u8>(&blocks), &bytes[..]);
    let cast = cast_blocks::<BlockQ4_K>(&bytes).unwrap();
    assert_eq!(&cast[..], &blocks[..]);
    let mut y = vec![0.0f32; 512];
    dequantize_blocks(&blocks, &mut y).unwrap();
    let mut y2 = vec![0.0f32; 512];
    dequantize_row(DType::Q4_K, &bytes, &mut y2).unwrap();
    assert_eq!(y, y2);
}

#[test]
fn wrong_lengths_and_dtypes_are_errors() {
    let x = vec![1.0f32; 512];
    for dtype in quantized() {
        let n = dtype.block_size();
        let good = dtype.row_bytes(n).unwrap();
        let mut buf = vec![0u8; good + 1];
        // Not a whole block of input.
        assert!(quantize_row(dtype, &x[..n - 1], &mut buf[..good]).is_err());
        // Destination too long / too short.
        let xs = vec![1.0f32; n];
        assert!(quantize_row(dtype, &xs, &mut buf).is_err());
        assert!(quantize_row(dtype, &xs, &mut buf[..good - 1]).is_err());
        // Source bytes not matching the element count.
        let mut y = vec![0.0f32; n];
        assert!(dequantize_row(dtype, &buf, &mut y).is_err());
        assert!(dequantize_row(dtype, &buf[..good - 1], &mut y).is_err());
        assert!(dequantize_row(dtype, &buf[..good], &mut y[..n - 1]).is_err());
        assert!(dequantize_row(dtype, &buf[..good], &mut y).is_ok());
    }
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let mut buf = vec![0u8; 64 * 4 + 2];
        assert!(quantize_row(dtype, &x[..64], &mut buf).is_err());
        let mut y = vec![0.0f32; 63];
        assert!(dequantize_row(dtype, &buf, &mut y).is_err());
    }
    let mut buf = vec![0u8; 256];
    let mut y = vec![0.0f32; 64];
    assert!(matches!(
        quantize_row(DType::I32, &x[..64], &mut buf),
        Err(Error::UnsupportedConversion(DType::I32))
    ));
    assert!(dequantize_row(DType::I32, &buf, &mut y).is_err());
    let mut blocks = vec![BlockQ8_0::zeroed(); 3];
    assert!(quantize_blocks(&x[..64], &mut blocks).is_err());
    assert!(dequantize_blocks(&blocks, &mut y).is_err());
    assert!(cast_blocks::<BlockQ8_0>(&buf[..35]).is_err());
}

/// Decodes `bytes` of the low-bit and IQ4 types in float64, straight from ggml-common.h's
/// description of each block (field offsets read from the bytes, not the block structs), in
/// ggml's `dequantize_row_*` loop order.
fn decode_f64(dtype: DType, bytes: &[u8]) -> Vec<f64> {
    let h = |b: &[u8], o: usize| f64::from(f16::from_le_bytes([b[o], b[o + 1]]).to_f32());
    let kv = |i: u8| f64::from(KVALUES_IQ4NL[usize::from(i)]);
    let mut y = Vec::new();
    for b in bytes.chunks_exact(dtype.block_bytes()) {
        match dtype {
            DType::Q2_K => {
                // scales[16] qs[64] d dmin
                let (d, dmin) = (h(b, 80), h(b, 82));
                for n in 0..2 {
                    for shift in [0, 2, 4, 6] {
                        for half in 0..2 {
                            let sc = b[8 * n + shift + half];
                            for l in 0..16 {
                                let q = (b[16 + 32 * n + 16 * half + l] >> shift) & 3;
                                let v = d * f64::from(sc & 15) * f64::from(q);
                                y.push(v - dmin * f64::from(sc >> 4));
                            }
                        }
                    }
                }
            }
            DType::Q3_K => {
                // hmask[32] qs[64] scales[12] d; the scales unpacked as ggml does, through
                // four little-endian u32 words.
                let d = h(b, 108);
                let w = |i: usize| u32::from_le_bytes([b[96 + i], b[97 + i], b[98 + i], b[99 + i]]);
                let (a0, a1, t) = (w(0), w(4), w(8));
                let (k1, k2) = (0x0303_0303u32, 0x0f0f_0f0fu32);
                let aux = [
                    (a0 & k2) | ((t & k1) << 4),
                    (a1 & k2) | (((t >> 2) & k1) << 4),
                    ((a0 >> 4) & k2) | (((t >> 4) & k1) << 4),
                    ((a1 >> 4) & k2) | (((t >> 6) & k1) << 4),
                ];
                let sc: Vec<f64> = aux
                    .iter()
                    .flat_map(|a| a.to_le_bytes())
                    .map(|v| f64::from(i32::from(v as i8) - 32))
                    .collect();
                let mut m = 0;
                for n in 0..2 {
                    for shift in [0, 2, 4, 6] {
                        for half in 0..2 {
                            let s = 8 * n + shift + half;
                            for l in 16 * half..16 * half + 16 {
                                let q = i32::from((b[32 + 32 * n + l] >> shift) & 3);
                                let hi = b[l] >> m & 1 == 1;
                                y.push(d * sc[s] * f64::from(q - if hi { 0 } else { 4 }));
                            }
                        }
                        m += 1;
                    }
                }
            }
            DType::IQ4_NL => {
                let d = h(b, 0);
                let qs = &b[2..18];
                y.extend(qs.iter().map(|&q| d * kv(q & 15)));
                y.extend(qs.iter().map(|&q| d * kv(q >> 4)));
            }
            DType::IQ4_XS => {
                // d scales_h(u16) scales_l[4] qs[128]
                let d = h(b, 0);
                let sh = u16::from_le_bytes([b[2], b[3]]);
                for ib in 0..8 {
                    let lo = (b[4 + ib / 2] >> (4 * (ib % 2))) & 15;
                    let ls = i32::from(lo) | (i32::from((sh >> (2 * ib)) & 3) << 4);
                    let qs = &b[8 + 16 * ib..24 + 16 * ib];
                    let dl = d * f64::from(ls - 32);
                    y.extend(qs.iter().map(|&q| dl * kv(q & 15)));
                    y.extend(qs.iter().map(|&q| dl * kv(q >> 4)));
                }
            }
            DType::MXFP4 => {
                // e (E8M0: 2^(e - 127)) qs[16]; the codes are E2M1 values, doubled in the table
                let d = 2f64.powi(i32::from(b[0]) - 127) / 2.0;
                let fp4 = |i: u8| f64::from(KVALUES_MXFP4[usize::from(i)]);
                y.extend(b[1..17].iter().map(|&q| d * fp4(q & 15)));
                y.extend(b[1..17].iter().map(|&q| d * fp4(q >> 4)));
            }
            other => panic!("no float64 decoder for {other}"),
        }
    }
    y
}

const NEW_TYPES: [DType; 5] = [
    DType::Q2_K,
    DType::Q3_K,
    DType::IQ4_NL,
    DType::IQ4_XS,
    DType::MXFP4,
];

fn quantize(dtype: DType, x: &[f32]) -> Vec<u8> {
    let mut q = vec![0u8; dtype.row_bytes(x.len()).unwrap()];
    quantize_row(dtype, x, &mut q).unwrap();
    q
}

#[test]
fn low_bit_and_iq4_decode_matches_float64_reading_of_the_layout() {
    let mut rng = StdRng::seed_from_u64(17);
    let x = gaussianish(&mut rng, 256 * 6, 2.0);
    for dtype in NEW_TYPES {
        let q = quantize(dtype, &x);
        let mut y = vec![0.0f32; x.len()];
        dequantize_row(dtype, &q, &mut y).unwrap();
        let r = decode_f64(dtype, &q);
        assert_eq!(r.len(), y.len());
        let scale = r.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        for (i, (&a, &b)) in y.iter().zip(&r).enumerate() {
            // f32 rounds each of ggml's two or three products once.
            let tol = 4.0 * f64::from(f32::EPSILON) * (b.abs() + scale * 1e-3);
            assert!((f64::from(a) - b).abs() <= tol, "{dtype}[{i}]: {a} vs {b}");
        }
    }
}

#[test]
fn low_bit_and_iq4_quantizers_commute_with_power_of_two_scaling() {
    // A block scaled by 2^k (exact in f16 over this range) quantizes to the same codes with
    // its scales multiplied by 2^k: the algorithms are scale-invariant up to f16 rounding,
    // and powers of two make that rounding exact.
    let mut rng = StdRng::seed_from_u64(19);
    let x = gaussianish(&mut rng, 256 * 4, 1.0);
    let x4: Vec<f32> = x.iter().map(|v| v * 4.0).collect();
    for dtype in NEW_TYPES {
        let (y, y4) = (round_trip(dtype, &x), round_trip(dtype, &x4));
        for (i, (&a, &b)) in y.iter().zip(&y4).enumerate() {
            assert_eq!(a * 4.0, b, "{dtype}[{i}]");
        }
    }
}

#[test]
fn low_bit_and_iq4_error_bounded_by_block_range() {
    // Per element, in float64: no decoded value strays further from its input than the
    // block's value range times the type's coarseness (a quarter for 2 bits, an eighth for 3,
    // a tenth for the 16-level codebooks); shifted and skewed data included.
    let mut rng = StdRng::seed_from_u64(23);
    let inputs = [
        gaussianish(&mut rng, 256 * 8, 1.0),
        uniform(&mut rng, 256 * 8, 5.0)
            .iter()
            .map(|v| v + 3.0)
            .collect(),
        uniform(&mut rng, 256 * 8, 1.0)
            .iter()
            .map(|v| v * v * v)
            .collect::<Vec<f32>>(),
    ];
    for x in &inputs {
        for (dtype, frac) in [
            (DType::Q2_K, 0.25),
            (DType::Q3_K, 0.125),
            (DType::IQ4_NL, 0.1),
            (DType::IQ4_XS, 0.1),
            // Magnitudes in [8d, 16d) against a largest code of 12d.
            (DType::MXFP4, 0.125),
        ] {
            let y = round_trip(dtype, x);
            for (xb, yb) in x
                .chunks(dtype.block_size())
                .zip(y.chunks(dtype.block_size()))
            {
                let amax = xb.iter().fold(0.0f64, |m, v| m.max(f64::from(v.abs())));
                for (&a, &b) in xb.iter().zip(yb) {
                    let d = (f64::from(a) - f64::from(b)).abs();
                    assert!(d <= frac * 2.0 * amax, "{dtype}: {a} -> {b} (amax {amax})");
                }
            }
        }
    }
}

#[test]
fn iq4_codebook_search_picks_the_nearest_value() {
    let kv: Vec<f32> = KVALUES_IQ4NL.iter().map(|&v| f32::from(v)).collect();
    assert!(kv.windows(2).all(|w| w[0] < w[1]));
    let mut rng = StdRng::seed_from_u64(29);
    for _ in 0..2000 {
        let x: f32 = rng.gen_range(-140.0..140.0);
        let i = usize::from(best_index_iq4nl(x));
        let best = kv.iter().fold(f32::MAX, |m, &v| m.min((v - x).abs()));
        assert_eq!((kv[i] - x).abs(), best, "{x}");
    }
    // Ties go to the upper value, as in ggml's bisection: -10 and 1 are 11 apart.
    assert_eq!(best_index_iq4nl(-4.5), 8);
    assert_eq!(best_index_iq4nl(-1000.0), 0);
    assert_eq!(best_index_iq4nl(1000.0), 15);
}

#[test]
fn quantizing_row_by_row_equals_one_row() {
    let mut rng = StdRng::seed_from_u64(31);
    let x = gaussianish(&mut rng, 256 * 6, 1.5);
    for dtype in quantized() {
        let whole = quantize(dtype, &x);
        let rb = dtype.row_bytes(512).unwrap();
        let parts: Vec<u8> = x.chunks(512).flat_map(|r| quantize(dtype, r)).collect();
        assert_eq!(parts.len(), whole.len());
        assert_eq!(&parts[..rb], &whole[..rb], "{dtype}");
        assert_eq!(parts, whole, "{dtype}");
    }
}

#[test]
fn non_finite_input_does_not_panic() {
    // ggml gives meaningless bytes for NaN/inf input; rgml must give bytes (not a panic) too.
    let mut rng = StdRng::seed_from_u64(37);
    let mut x = gaussianish(&mut rng, 512, 1.0);
    x[3] = f32::NAN;
    x[300] = f32::INFINITY;
    x[301] = f32::NEG_INFINITY;
    x[400] = f32::MAX;
    for dtype in quantized() {
        let y = round_trip(dtype, &x);
        assert_eq!(y.len(), x.len(), "{dtype}");
    }
}
