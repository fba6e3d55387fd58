use super::*;
use crate::kernels::dots::run;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rgml::quant::{cast_blocks, dequantize_row, q3_k_scale, quantize_row, QuantBlock};
use rgml::DType;

/// Random values with occasional outliers, quantized to `dtype`.
fn row(rng: &mut StdRng, dtype: DType, n: usize) -> Vec<u8> {
    let v: Vec<f32> = (0..n)
        .map(|_| rng.gen_range(-1.0f32..1.0) * if rng.gen_bool(0.03) { 9.0 } else { 1.0 })
        .collect();
    let mut b = vec![0u8; dtype.row_bytes(n).unwrap()];
    quantize_row(dtype, &v, &mut b).unwrap();
    b
}

fn blocks<B: QuantBlock>(b: &[u8]) -> Vec<B> {
    cast_blocks::<B>(b).unwrap().into_owned()
}

/// The f64 dot of the dequantized rows and the sum of the products' magnitudes.
fn reference(xt: DType, x: &[u8], yt: DType, y: &[u8], n: usize) -> (f64, f64) {
    let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
    dequantize_row(xt, x, &mut a).unwrap();
    dequantize_row(yt, y, &mut b).unwrap();
    a.iter().zip(&b).fold((0.0, 0.0), |(s, m), (&p, &q)| {
        let t = f64::from(p) * f64::from(q);
        (s + t, m + t.abs())
    })
}

/// Each dot, SIMD and portable, gives the same bits, within f32 rounding of the f64 product
/// of the dequantized operands (odd block counts included).
#[test]
fn simd_portable_and_f64_reference_agree() {
    let f = CpuFeatures::detect();
    let slow = f.without_simd();
    let mut rng = StdRng::seed_from_u64(11);
    for (xt, n) in [
        (DType::Q2_K, 3 * QK_K),
        (DType::Q3_K, 3 * QK_K),
        (DType::IQ4_XS, 3 * QK_K),
        (DType::IQ4_NL, 7 * 32),
        (DType::IQ4_NL, 8 * 32),
        (DType::IQ4_NL, 32),
        (DType::MXFP4, 7 * 32),
        (DType::MXFP4, 8 * 32),
        (DType::MXFP4, 32),
    ] {
        let yt = xt.vec_dot_type();
        for trial in 0..20 {
            let (xb, yb) = (row(&mut rng, xt, n), row(&mut rng, yt, n));
            let dot = |f: CpuFeatures| match xt {
                DType::Q2_K => dot_q2_k_q8_k(f, &blocks(&xb), &blocks(&yb)),
                DType::Q3_K => dot_q3_k_q8_k(f, &blocks(&xb), &blocks(&yb)),
                DType::IQ4_XS => dot_iq4_xs_q8_k(f, &blocks(&xb), &blocks(&yb)),
                DType::MXFP4 => dot_mxfp4_q8_0(f, &blocks(&xb), &blocks(&yb)),
                _ => dot_iq4_nl_q8_0(f, &blocks(&xb), &blocks(&yb)),
            };
            let (fast, portable) = (dot(f), dot(slow));
            // The AVX-512 (VNNI) and AVX2 forms and the portable one agree bit for bit.
            for got in [fast, dot(f.avx2_only())] {
                assert_eq!(
                    got.to_bits(),
                    portable.to_bits(),
                    "{xt} n={n} trial {trial}"
                );
            }
            let (exact, mag) = reference(xt, &xb, yt, &yb, n);
            let err = (f64::from(fast) - exact).abs() / mag;
            assert!(err < 1e-5, "{xt} n={n}: {fast} vs {exact} ({err})");
        }
    }
}

/// The tinyBLAS form differs from `vec_dot`'s (one accumulator, not two) but is as accurate.
#[test]
fn iq4_nl_tinyblas_form_is_accurate() {
    let mut rng = StdRng::seed_from_u64(12);
    let n = 9 * 32;
    for _ in 0..20 {
        let (xb, yb) = (
            row(&mut rng, DType::IQ4_NL, n),
            row(&mut rng, DType::Q8_0, n),
        );
        let got = dot_iq4_nl_tinyblas(&blocks(&xb), &blocks(&yb));
        let (exact, mag) = reference(DType::IQ4_NL, &xb, DType::Q8_0, &yb, n);
        assert!((f64::from(got) - exact).abs() / mag < 1e-5);
    }
}

/// The word-wise Q3_K scale unpacking equals `q3_k_scale` on random scale bytes.
#[test]
fn q3k_scales_equal_q3_k_scale() {
    let mut rng = StdRng::seed_from_u64(5);
    let mut b = vec![0u8; DType::Q3_K.row_bytes(QK_K).unwrap()];
    for _ in 0..10_000 {
        rng.fill(&mut b[..]);
        let x: BlockQ3_K = blocks::<BlockQ3_K>(&b)[0];
        let want: [i8; 16] = std::array::from_fn(|j| q3_k_scale(j, &x.scales) as i8 - 32);
        assert_eq!(q3k_scales(&x), want, "{:?}", x.scales);
    }
}

/// Random MXFP4 blocks straight from bytes (every code, exponents over a wide range, the
/// subnormal half scales of `e < 2` included): the SIMD and portable dots give the same bits,
/// within f32 rounding of the f64 product.
#[test]
fn mxfp4_dot_on_raw_blocks() {
    let f = CpuFeatures::detect();
    let mut rng = StdRng::seed_from_u64(39);
    for nb in [1, 2, 5, 16, 33] {
        let n = nb * 32;
        for trial in 0..20 {
            let x: Vec<BlockMXFP4> = (0..nb)
                .map(|i| BlockMXFP4 {
                    e: if i == 0 && trial % 2 == 0 {
                        rng.gen_range(0..2)
                    } else {
                        rng.gen_range(90..170)
                    },
                    qs: rng.gen(),
                })
                .collect();
            let yb = row(&mut rng, DType::Q8_0, n);
            let y = blocks::<BlockQ8_0>(&yb);
            let (fast, portable) = (
                dot_mxfp4_q8_0(f, &x, &y),
                dot_mxfp4_q8_0(f.without_simd(), &x, &y),
            );
            assert_eq!(fast.to_bits(), portable.to_bits(), "nb {nb} trial {trial}");
            let (exact, mag) =
                reference(DType::MXFP4, bytemuck::cast_slice(&x), DType::Q8_0, &yb, n);
            assert!(
                (f64::from(fast) - exact).abs() <= 1e-5 * mag,
                "{fast} vs {exact}"
            );
        }
    }
}

/// The IQ4_NL and MXFP4 matrix-vector kernels give each row `vec_dot`'s bits, for odd and
/// even block counts and row counts, with gaps between the rows.
#[cfg(target_arch = "x86_64")]
#[test]
fn nibble_matvec_equals_the_pair_dots() {
    // This CPU's kernels (AVX-512 VNNI where it has it) and the AVX2 ones.
    let detected = CpuFeatures::detect();
    for (f, dtype) in [detected, detected.avx2_only()]
        .into_iter()
        .flat_map(|f| [(f, DType::IQ4_NL), (f, DType::MXFP4)])
    {
        let Some(kernel) = nibble_matvec(f, dtype) else {
            eprintln!("skipped: no AVX2 on this CPU");
            return;
        };
        let mut rng = StdRng::seed_from_u64(12);
        for nb in [1, 2, 7, 18, 48] {
            let n = nb * 32;
            let row_bytes = dtype.row_bytes(n).unwrap();
            let stride = row_bytes + 6;
            for rows in [1, 2, 3, 5] {
                let mut x = vec![0u8; rows * stride];
                for r in 0..rows {
                    x[r * stride..r * stride + row_bytes].copy_from_slice(&row(&mut rng, dtype, n));
                }
                let y = row(&mut rng, DType::Q8_0, n);
                let run = run::RowRun {
                    nb,
                    x0: x.as_ptr(),
                    row_stride: stride,
                    y: y.as_ptr(),
                };
                let mut out = vec![f32::NAN; rows];
                // SAFETY: `rows` rows of `nb` blocks of `dtype` `stride` apart, `nb` Q8_0
                // blocks.
                unsafe { kernel(run, &mut out) };
                for (r, got) in out.iter().enumerate() {
                    let xr = &x[r * stride..r * stride + row_bytes];
                    let want = match dtype {
                        DType::MXFP4 => dot_mxfp4_q8_0(f, &blocks(xr), &blocks(&y)),
                        _ => dot_iq4_nl_q8_0(f, &blocks(xr), &blocks(&y)),
                    };
                    let at = format!("{dtype} nb {nb} rows {rows} row {r}");
                    assert_eq!(got.to_bits(), want.to_bits(), "{at}");
                }
            }
        }
    }
    assert!(nibble_matvec(detected, DType::Q4_0).is_none());
}

/// The portable MXFP4 and IQ4_NL dots, with no SIMD at all, give ggml's own one-row products
/// (its AVX2 build's `vec_dot`: `tests/fixtures/ggml_matmul/`, an odd block count included),
/// as the SIMD forms do in `tests/ggml_matmul.rs`.
#[test]
fn portable_nibble_dots_equal_ggml() {
    use crate::kernels::blocks::activations::quantize_activations;
    let f = CpuFeatures::detect().without_simd();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ggml_matmul");
    let word = |b: &[u8], i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    for (name, k) in [("mxfp4", 544), ("mxfp4", 768), ("iq4_nl", 544)] {
        // The layout of `scripts/ggml_ref/matmul_ref.c`; the first outputs are batch 1's.
        let file = std::fs::read(dir.join(format!("{name}_k{k}.bin"))).unwrap();
        let dtype = DType::from_ggml_id(word(&file, 8)).unwrap();
        let (n, nbatch) = (word(&file, 16) as usize, word(&file, 20) as usize);
        assert_eq!((word(&file, 12), word(&file, 24)), (k as u32, 1));
        let at = 24 + 4 * nbatch;
        let (weights, rest) = file[at + 4..].split_at(word(&file, at) as usize);
        let x = std::fs::read(dir.join(format!("x_k{k}.bin"))).unwrap();
        let x: Vec<f32> = (0..k)
            .map(|i| f32::from_bits(word(&x, 8 + 4 * i)))
            .collect();
        let mut y = vec![0u8; DType::Q8_0.row_bytes(k).unwrap()];
        quantize_activations(f, DType::Q8_0, &x, &mut y).unwrap();
        let rb = dtype.row_bytes(k).unwrap();
        for (r, row) in weights.chunks_exact(rb).enumerate().take(n) {
            let got = crate::kernels::dots::vec_dot(f, dtype, k, row, &y).unwrap();
            assert_eq!(got.to_bits(), word(rest, 4 * r), "{name} k {k} row {r}");
        }
    }
}

/// A tile of prepared activation rows gives each weight row's `vec_dot` bits against each of
/// them, for odd and even block counts and any number of rows (runs of 16, 8, 4 and 1), with
/// this CPU's kernels (AVX-512 VNNI where it has it) and the AVX2 ones.
#[cfg(target_arch = "x86_64")]
#[test]
fn nibble_tile_equals_the_dots() {
    let detected = CpuFeatures::detect();
    for f in [detected, detected.avx2_only()] {
        nibble_tile_equals_the_dots_with(f);
    }
    // SAFETY: no rows are read.
    assert!(unsafe { NibbleTile::new(detected, DType::Q4_0, 1, &[]) }.is_none());
}

#[cfg(target_arch = "x86_64")]
fn nibble_tile_equals_the_dots_with(f: CpuFeatures) {
    let mut rng = StdRng::seed_from_u64(13);
    for dtype in [DType::IQ4_NL, DType::MXFP4] {
        for nb in [1, 2, 7, 18] {
            let n = nb * 32;
            for cols in [1, 3, 4, 9, 16, 29] {
                let ys: Vec<Vec<u8>> = (0..cols).map(|_| row(&mut rng, DType::Q8_0, n)).collect();
                let ptrs: Vec<*const u8> = ys.iter().map(|y| y.as_ptr()).collect();
                // SAFETY: each row holds `nb` Q8_0 blocks and outlives the tile.
                let Some(tile) = (unsafe { NibbleTile::new(f, dtype, nb, &ptrs) }) else {
                    eprintln!("skipped: no AVX2 on this CPU");
                    return;
                };
                let x = row(&mut rng, dtype, n);
                let mut out = vec![f32::NAN; cols];
                // SAFETY: `x` holds `nb` blocks of `dtype`; one output per row.
                unsafe { tile.row(x.as_ptr(), &mut out) };
                for (c, got) in out.iter().enumerate() {
                    let want = match dtype {
                        DType::MXFP4 => dot_mxfp4_q8_0(f, &blocks(&x), &blocks(&ys[c])),
                        _ => dot_iq4_nl_q8_0(f, &blocks(&x), &blocks(&ys[c])),
                    };
                    let at = format!("{dtype} nb {nb} cols {cols} col {c}");
                    assert_eq!(got.to_bits(), want.to_bits(), "{at}");
                }
            }
        }
    }
}
