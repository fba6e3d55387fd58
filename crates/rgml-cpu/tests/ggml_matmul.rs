//! MUL_MAT with quantized weights against the real ggml: the fixtures in
//! `tests/fixtures/ggml_matmul/` hold weights quantized by ggml, f32 activations, and the
//! products a native (`-march=native`, AVX2) ggml-cpu build computed for them with 1 and 2
//! threads (`scripts/ggml_ref/gen_matmul.sh`). Batches of 1, 2, 5, 8 and 19 activation rows
//! take every path ggml has: `vec_dot` pair by pair (1 row, and Q4_1/Q5_1/MXFP4 always),
//! llamafile's tinyBLAS_Q0 (Q4_0/Q5_0/Q8_0/IQ4_NL from 2 rows), and the tiled K-quant kernel
//! (Q2_K…Q6_K and IQ4_XS from 8 rows). rgml must give the same bits on every path, with 1 and 2 threads.
//!
//! The `isa=avx512` arithmetic is asserted equal too: for quantized weights ggml's AVX-512
//! builds run the same float operations (the `__AVX2__` `vec_dot` branches; tinyBLAS_Q0 on
//! `__m256` with the same `hsum`; the VNNI tiled kernel's epilogue `buf + result * d1`, which
//! GCC contracts into the AVX2 kernel's FMA), and only integer sums, exact either way, change
//! instructions (checked on an AVX-512 CPU: its build writes the same quantized fixtures).
//! Float and attention products differ in that build; `avx512/` holds its results for them.
//! See the fixtures' README.

mod fixture_reader;
use fixture_reader::Reader;
use rgml::alloc::alloc_ctx_tensors;
use rgml::{Backend, Context, DType, Graph};
use rgml_cpu::{CpuBackend, CpuDevice, CpuOptions, IsaChoice};
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ggml_matmul")
}

/// One weight matrix and ggml's products: `outputs[(batch, threads)]`, column-major `[b][n]`.
struct Case {
    dtype: DType,
    k: usize,
    n: usize,
    weights: Vec<u8>,
    outputs: Vec<(usize, usize, Vec<f32>)>,
}

fn ggml_dtype(id: usize) -> DType {
    match id {
        0 => DType::F32,
        1 => DType::F16,
        30 => DType::BF16,
        2 => DType::Q4_0,
        3 => DType::Q4_1,
        6 => DType::Q5_0,
        7 => DType::Q5_1,
        8 => DType::Q8_0,
        10 => DType::Q2_K,
        11 => DType::Q3_K,
        12 => DType::Q4_K,
        13 => DType::Q5_K,
        14 => DType::Q6_K,
        20 => DType::IQ4_NL,
        23 => DType::IQ4_XS,
        39 => DType::MXFP4,
        other => panic!("unexpected ggml type {other}"),
    }
}

fn read_case(path: &Path) -> Case {
    let bytes = std::fs::read(path).unwrap();
    let mut r = Reader::new(&bytes);
    assert_eq!(r.take(8), b"RGMLMM1\0", "{}", path.display());
    let dtype = ggml_dtype(r.u32());
    let (k, n, nbatch) = (r.u32(), r.u32(), r.u32());
    let batches: Vec<usize> = (0..nbatch).map(|_| r.u32()).collect();
    let wbytes = r.u32();
    let weights = r.take(wbytes).to_vec();
    let mut outputs = Vec::new();
    for &b in &batches {
        for threads in [1, 2] {
            outputs.push((b, threads, r.f32s(b * n)));
        }
    }
    assert!(r.done(), "trailing bytes in {}", path.display());
    Case {
        dtype,
        k,
        n,
        weights,
        outputs,
    }
}

/// The activations `[cols][k]` of the fixtures with row length `k`.
fn read_x(k: usize) -> (usize, Vec<f32>) {
    let bytes = std::fs::read(fixtures().join(format!("x_k{k}.bin"))).unwrap();
    let mut r = Reader::new(&bytes);
    assert_eq!(r.u32(), k);
    let cols = r.u32();
    (cols, r.f32s(cols * k))
}

/// rgml's MUL_MAT of the case's weights by the first `b` activation rows.
fn rgml_mul_mat(be: &mut CpuBackend, case: &Case, x: &[f32], b: usize) -> Vec<f32> {
    product(be, case, x, b, false)
}

/// As [`rgml_mul_mat`], each row computed as alone when `rows_alone`.
fn product(be: &mut CpuBackend, case: &Case, x: &[f32], b: usize, rows_alone: bool) -> Vec<f32> {
    let mut ctx = Context::new();
    let w = ctx.new_tensor(case.dtype, &[case.k, case.n]).unwrap();
    let xt = ctx.new_tensor(DType::F32, &[case.k, b]).unwrap();
    let y = match rows_alone {
        true => ctx.mul_mat_rows_alone(w, xt).unwrap(),
        false => ctx.mul_mat(w, xt).unwrap(),
    };
    let graph = Graph::build(&mut ctx, &[y]).unwrap();
    alloc_ctx_tensors(&mut ctx, &be.default_buffer_type()).unwrap();
    ctx.tensor_set(w, 0, &case.weights).unwrap();
    ctx.tensor_set_f32(xt, &x[..b * case.k]).unwrap();
    be.graph_compute(&ctx, &graph).unwrap();
    ctx.tensor_get_f32(y).unwrap()
}

/// The fixture files whose names start with one of `prefixes`.
fn files(prefixes: &[&str]) -> Vec<PathBuf> {
    files_in(&fixtures(), prefixes)
}

/// The AVX-512 build's fixtures (only those whose bits differ from the AVX2 build's: float
/// weights and attention shapes), made on an AVX-512 CPU (`gen_matmul.sh --isa avx512`). BF16
/// weights are left out where the CPU lacks AVX512_BF16: that build's BF16 dots need it.
fn avx512_files(prefixes: &[&str]) -> Vec<PathBuf> {
    let bf16 = avx512_bf16();
    files_in(&fixtures().join("avx512"), prefixes)
        .into_iter()
        .filter(|p| bf16 || !p.to_string_lossy().contains("bf16_"))
        .collect()
}

/// The AVX-512 arithmetic runs BF16 weights through `vdpbf16ps` here (the CPU has it).
fn avx512_bf16() -> bool {
    device(IsaChoice::Avx512).features().bf16_products()
}

/// The CPU device with the arithmetic of `isa`.
fn device(isa: IsaChoice) -> Arc<CpuDevice> {
    let options = CpuOptions {
        isa: Some(isa),
        ..Default::default()
    };
    CpuDevice::with_options("CPU", &options)
}

/// A backend on `device` that runs every thread count asked for, even on a loaded machine.
fn backend(device: &Arc<CpuDevice>, threads: usize) -> CpuBackend {
    let mut be = CpuBackend::with_device(device.clone(), threads).unwrap();
    be.set_adaptive_threads(false);
    be
}

fn files_in(dir: &Path, prefixes: &[&str]) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| prefixes.iter().any(|p| n.starts_with(p)) && n.ends_with(".bin"))
        })
        .collect();
    paths.sort();
    paths
}

/// The quantized-weight cases.
fn cases() -> Vec<PathBuf> {
    files(&["q", "iq", "mxfp4"])
}

/// The mismatches of `got` against ggml's `want`, as text (none: empty).
fn mismatch(what: &str, got: &[f32], want: &[f32]) -> Option<String> {
    assert_eq!(got.len(), want.len(), "{what}");
    let bad = got
        .iter()
        .zip(want)
        .filter(|(g, w)| g.to_bits() != w.to_bits())
        .count();
    let first = got
        .iter()
        .zip(want)
        .enumerate()
        .find(|(_, (g, w))| g.to_bits() != w.to_bits())?;
    Some(format!(
        "{what}: {bad} of {} differ, e.g. {first:?}",
        want.len()
    ))
}

/// Every case, batch and thread count gives ggml's bits under the arithmetic `isa`; returns
/// the mismatches as text.
fn check(isa: IsaChoice) -> Vec<String> {
    check_files(isa, &cases(), 27)
}

/// `paths`' cases under the arithmetic `isa`, on 1 and 2 threads; the AVX2 arithmetic on an
/// AVX-512 CPU also with the AVX-512 instructions dropped (the kernels an AVX2-only CPU runs).
fn check_files(isa: IsaChoice, paths: &[PathBuf], expected_files: usize) -> Vec<String> {
    let device = device(isa);
    let mut failures = Vec::new();
    assert_eq!(paths.len(), expected_files, "fixture files");
    let narrow = isa == IsaChoice::Avx2 && device.features().has_avx512();
    let runs = [(1, false), (2, false), (2, true)];
    for (threads, narrowed) in runs.into_iter().filter(|&(_, n)| !n || narrow) {
        let mut be = backend(&device, threads);
        if narrowed {
            be.set_features(be.features().without_avx512());
        }
        for path in paths {
            let case = read_case(path);
            let (cols, x) = read_x(case.k);
            for (b, ggml_threads, want) in &case.outputs {
                assert!(*b <= cols);
                let got = rgml_mul_mat(&mut be, &case, &x, *b);
                let what = format!(
                    "{} k {} m {} batch {b} (ggml {ggml_threads} threads, rgml {threads}, {isa}{})",
                    case.dtype,
                    case.k,
                    case.n,
                    if narrowed { ", AVX2 instructions" } else { "" }
                );
                failures.extend(mismatch(&what, &got, want));
            }
        }
    }
    failures
}

#[test]
fn quantized_products_equal_ggml_avx2_bit_for_bit() {
    let failures = check(IsaChoice::Avx2);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn quantized_products_equal_ggml_under_the_avx512_arithmetic() {
    let failures = check(IsaChoice::Avx512);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `mul_mat_rows_alone` (a batch of independent sequences' rows): every column of a product
/// of 19 rows is the bits of that row's product alone, on every path (the tiled K-quant and
/// tinyBLAS paths the row count would otherwise take: see [`fixtures_distinguish_the_paths`]),
/// and column 0 is ggml's own one-row product (AVX2's, which made the fixtures).
#[test]
fn rows_alone_give_each_row_its_one_row_product() {
    for isa in [IsaChoice::Avx2, IsaChoice::Avx512] {
        let mut be = backend(&device(isa), 2);
        for path in files(&["q", "iq", "mxfp4", "f16", "f32", "bf16"]) {
            let case = read_case(&path);
            let (cols, x) = read_x(case.k);
            let b = cols.min(19);
            let batched = product(&mut be, &case, &x, b, true);
            let what = |c: usize| {
                format!(
                    "{} k {} m {} column {c} of {b} ({isa})",
                    case.dtype, case.k, case.n
                )
            };
            for c in 0..b {
                let alone = product(&mut be, &case, &x[c * case.k..], 1, false);
                let got = &batched[c * case.n..(c + 1) * case.n];
                if let Some(m) = mismatch(&what(c), got, &alone) {
                    panic!("{m}");
                }
            }
            let (_, _, ggml_one) = case
                .outputs
                .iter()
                .find(|(bb, t, _)| *bb == 1 && *t == 1)
                .unwrap();
            // The fixtures are the AVX2 build's (float weights take another order on AVX-512).
            let ggml_isa = isa == IsaChoice::Avx2;
            if let Some(m) = mismatch(&what(0), &batched[..case.n], ggml_one).filter(|_| ggml_isa) {
                panic!("{m}");
            }
        }
    }
}

/// The fixtures can tell the paths apart: for the K-quants and IQ4_XS, ggml's tiled kernel (8
/// and 19 rows) rounds differently from its `vec_dot` (1, 2 and 5 rows) on some outputs, and
/// for IQ4_NL and for float weights of 8 rows tinyBLAS (2 rows and more) from `vec_dot` (1 row),
/// so a product taking the wrong path fails the tests above. MXFP4 has `vec_dot` only.
#[test]
fn fixtures_distinguish_the_paths() {
    use DType::*;
    for path in files(&["q", "iq", "mxfp4", "f16", "f32", "bf16"]) {
        let case = read_case(&path);
        let column0 = |b: usize| {
            let (_, _, v) = case
                .outputs
                .iter()
                .find(|(bb, t, _)| *bb == b && *t == 1)
                .unwrap();
            v[..case.n]
                .iter()
                .map(|f| f.to_bits())
                .collect::<Vec<u32>>()
        };
        match case.dtype {
            Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | IQ4_XS => {
                assert_eq!(column0(1), column0(5), "{}: vec_dot columns", case.dtype);
                assert_ne!(column0(1), column0(8), "{}: tiled vs vec_dot", case.dtype);
            }
            MXFP4 => {
                for b in [2, 5, 8, 19] {
                    assert_eq!(column0(1), column0(b), "{}: vec_dot columns", case.dtype);
                }
            }
            IQ4_NL => {
                assert_eq!(column0(2), column0(5), "{}: tinyBLAS columns", case.dtype);
                assert_ne!(
                    column0(1),
                    column0(2),
                    "{}: tinyBLAS vs vec_dot",
                    case.dtype
                );
            }
            // Float weights: 8 rows take tinyBLAS from 2 activation rows, 6 rows never.
            F32 | F16 | BF16 if case.n == 8 => {
                assert_ne!(
                    column0(1),
                    column0(2),
                    "{}: tinyBLAS vs vec_dot",
                    case.dtype
                );
            }
            F32 | F16 | BF16 => {
                assert_eq!(column0(1), column0(2), "{}: vec_dot columns", case.dtype);
            }
            _ => {}
        }
    }
}

/// F32, F16 and BF16 weights of K = 576, 1536 and 544 (leftovers past the vector steps) with
/// 8 rows (tinyBLAS from 2 activation rows) and 6 rows (tinyBLAS declines: `ggml_vec_dot_f32/f16/bf16` pair by pair), 1..19 activation
/// rows: the AVX2 build's bits. (The AVX-512 arithmetic of float weights is another order, 16
/// lanes: the next test.)
#[test]
fn float_products_equal_ggml_avx2_bit_for_bit() {
    let failures = check_files(IsaChoice::Avx2, &files(&["f16", "f32", "bf16"]), 18);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The same float cases against ggml's AVX-512 build (16-lane `vec_dot`, tinyBLAS on
/// `__m512`, `vdpbf16ps` for BF16), under the AVX-512 arithmetic: natively on an AVX-512 CPU,
/// emulated on others.
#[test]
fn float_products_equal_ggml_avx512_bit_for_bit() {
    let expected = if avx512_bf16() { 18 } else { 12 };
    let failures = check_files(
        IsaChoice::Avx512,
        &avx512_files(&["f16", "f32", "bf16"]),
        expected,
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// An attention-shaped case: weights `[k, m, ne02]`, activations `[k, cols, ne12]` and ggml's
/// outputs `[ne12][b][m]` for the first `b` columns of every head.
struct AttnCase {
    dtype: DType,
    dims: [usize; 4],
    /// The activations are a permuted view of `[k, ne12, b]` (llama.cpp's Q).
    permuted: bool,
    weights: Vec<u8>,
    cols: usize,
    x: Vec<f32>,
    outputs: Vec<(usize, usize, Vec<f32>)>,
}

fn read_attn_case(path: &Path) -> AttnCase {
    let bytes = std::fs::read(path).unwrap();
    let mut r = Reader::new(&bytes);
    assert_eq!(r.take(8), b"RGMLMM2\0", "{}", path.display());
    let dtype = ggml_dtype(r.u32());
    let dims = [r.u32(), r.u32(), r.u32(), r.u32()];
    let [k, m, _, ne12] = dims;
    let permuted = r.u32() != 0;
    let nbatch = r.u32();
    let batches: Vec<usize> = (0..nbatch).map(|_| r.u32()).collect();
    let wbytes = r.u32();
    let weights = r.take(wbytes).to_vec();
    let cols = r.u32();
    let x = r.f32s(ne12 * cols * k);
    let mut outputs = Vec::new();
    for &b in &batches {
        for threads in [1, 2] {
            outputs.push((b, threads, r.f32s(ne12 * b * m)));
        }
    }
    assert!(r.done(), "trailing bytes in {}", path.display());
    AttnCase {
        dtype,
        dims,
        permuted,
        weights,
        cols,
        x,
        outputs,
    }
}

/// rgml's MUL_MAT of an attention case's weights by the first `b` columns of every head.
fn rgml_attn(be: &mut CpuBackend, case: &AttnCase, b: usize) -> Vec<f32> {
    let [k, m, ne02, ne12] = case.dims;
    let mut ctx = Context::new();
    let w = ctx.new_tensor(case.dtype, &[k, m, ne02]).unwrap();
    let (xt, data) = if case.permuted {
        let q = ctx.new_tensor(DType::F32, &[k, ne12, b]).unwrap();
        let mut data = Vec::with_capacity(k * ne12 * b);
        for t in 0..b {
            for h in 0..ne12 {
                let at = (h * case.cols + t) * k;
                data.extend_from_slice(&case.x[at..at + k]);
            }
        }
        (q, data)
    } else {
        let xt = ctx.new_tensor(DType::F32, &[k, b, ne12]).unwrap();
        let mut data = Vec::with_capacity(k * ne12 * b);
        for h in 0..ne12 {
            let at = h * case.cols * k;
            data.extend_from_slice(&case.x[at..at + b * k]);
        }
        (xt, data)
    };
    let src1 = if case.permuted {
        ctx.permute(xt, [0, 2, 1, 3]).unwrap()
    } else {
        xt
    };
    let y = ctx.mul_mat(w, src1).unwrap();
    let graph = Graph::build(&mut ctx, &[y]).unwrap();
    alloc_ctx_tensors(&mut ctx, &be.default_buffer_type()).unwrap();
    ctx.tensor_set(w, 0, &case.weights).unwrap();
    ctx.tensor_set_f32(xt, &data).unwrap();
    be.graph_compute(&ctx, &graph).unwrap();
    ctx.tensor_get_f32(y).unwrap()
}

/// K*Q and V*KQ shapes (F16 cache rows, grouped-query broadcast of 9 heads onto 3, a permuted
/// Q): with n_kv rows/columns tinyBLAS takes (40, 128) and declines (37), 1, 2 and 5 tokens.
#[test]
fn attention_products_equal_ggml_avx2_bit_for_bit() {
    check_attention(IsaChoice::Avx2, &files(&["attn_"]));
}

/// The same attention shapes against ggml's AVX-512 build.
#[test]
fn attention_products_equal_ggml_avx512_bit_for_bit() {
    check_attention(IsaChoice::Avx512, &avx512_files(&["attn_"]));
}

fn check_attention(isa: IsaChoice, paths: &[PathBuf]) {
    let device = device(isa);
    assert_eq!(paths.len(), 4, "fixture files");
    let mut failures = Vec::new();
    for threads in [1, 2] {
        let mut be = backend(&device, threads);
        for path in paths {
            let case = read_attn_case(path);
            for (b, ggml_threads, want) in &case.outputs {
                let got = rgml_attn(&mut be, &case, *b);
                let what = format!(
                    "{} {:?} batch {b} (ggml {ggml_threads} threads, rgml {threads}, {isa})",
                    path.file_name().unwrap().to_string_lossy(),
                    case.dims
                );
                failures.extend(mismatch(&what, &got, want));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
