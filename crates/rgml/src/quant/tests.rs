use super::*;
use bytemuck::Zeroable;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Every quantized dtype (the block formats this module implements).
fn quantized() -> impl Iterator<Item = DType> {
    DType::ALL.into_iter().filter(|t| t.is_quantized())
}

/// ggml's test-quantize-fns `MAX_QUANTIZATION_TOTAL_ERROR`; every type here uses it (the 2/3-bit
/// and ternary bounds are for types rgml does not have).
const MAX_QUANTIZATION_TOTAL_ERROR: f32 = 0.002;

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
        assert!(
            err < MAX_QUANTIZATION_TOTAL_ERROR,
            "{dtype}: error {err} >= {MAX_QUANTIZATION_TOTAL_ERROR}"
        );
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
            assert!(
                err < MAX_QUANTIZATION_TOTAL_ERROR,
                "{dtype}: error {err} >= {MAX_QUANTIZATION_TOTAL_ERROR}"
            );
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
