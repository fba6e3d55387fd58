//! MUL_MAT_ID against the real ggml: `tests/fixtures/ggml_mul_mat_id/<isa>/mul_mat_id.bin` holds
//! what ggml-cpu's native build for that instruction set computed (`scripts/ggml_ref/
//! gen_mul_mat_id.sh`) for 4 experts over 20 tokens, routed so that some experts get 8 or more
//! rows (ggml's tiled K-quant kernel) and some fewer (`vec_dot`), with src1 broadcast to the
//! slots and per slot, for F32, F16, Q4_0, Q8_0, Q4_K, Q6_K, IQ4_XS, MXFP4 and BF16 weights
//! (MXFP4 and BF16: `vec_dot` for every expert; the AVX-512 build's BF16 `vec_dot` is
//! `vdpbf16ps`, so its BF16 cases run only where the CPU has AVX512_BF16). The inputs are made here again from the fixture's seeds and
//! checked against its hash of them. rgml must give the same bits on 1 and 2 threads, on the
//! CPU's own instruction set and the other one forced where the CPU runs it.

mod fixture_reader;
mod ggml_inputs;
use fixture_reader::Reader;
use ggml_inputs::{encode, fnv1a, Values};
use rgml::alloc::alloc_ctx_tensors;
use rgml::{Backend, Context, DType, Device, Graph};
use rgml_cpu::{CpuBackend, CpuDevice, CpuFeatures, CpuOptions, IsaChoice};
use std::path::Path;

struct Case {
    dtype: DType,
    k: usize,
    n: usize,
    n_expert: usize,
    n_used: usize,
    n_b: usize,
    tokens: usize,
    seed: u64,
    input_hash: u64,
    out: Vec<f32>,
}

fn ggml_type(id: usize) -> DType {
    match id {
        0 => DType::F32,
        1 => DType::F16,
        2 => DType::Q4_0,
        8 => DType::Q8_0,
        12 => DType::Q4_K,
        14 => DType::Q6_K,
        23 => DType::IQ4_XS,
        30 => DType::BF16,
        39 => DType::MXFP4,
        other => panic!("unexpected ggml type {other}"),
    }
}

fn read_cases(isa: &str) -> Vec<Case> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/ggml_mul_mat_id")
        .join(isa)
        .join("mul_mat_id.bin");
    let bytes = std::fs::read(&path).unwrap();
    let mut r = Reader::new(&bytes);
    assert_eq!(r.take(8), b"RGMLMI1\0");
    let cases = (0..r.u32())
        .map(|_| {
            let dtype = ggml_type(r.u32());
            let [k, n, n_expert, n_used, n_b, tokens] = std::array::from_fn(|_| r.u32());
            let seed = r.u32() as u64;
            let input_hash = u64::from_le_bytes(r.take(8).try_into().unwrap());
            let out = r.f32s(n * n_used * tokens);
            Case {
                dtype,
                k,
                n,
                n_expert,
                n_used,
                n_b,
                tokens,
                seed,
                input_hash,
                out,
            }
        })
        .collect();
    assert!(r.done(), "trailing bytes in the fixture");
    cases
}

/// The routing of `mul_mat_id_ref.c`: experts 0..4 get 12, 3, 8 and 17 rows.
fn ids(tokens: usize) -> Vec<i32> {
    (0..tokens)
        .flat_map(|t| [if t < 12 { 0 } else { 2 }, if t % 7 == 0 { 1 } else { 3 }])
        .collect()
}

fn rgml_mul_mat_id(be: &mut CpuBackend, c: &Case, w: &[u8], b: &[f32], routes: &[i32]) -> Vec<f32> {
    let mut ctx = Context::new();
    let tw = ctx.new_tensor(c.dtype, &[c.k, c.n, c.n_expert]).unwrap();
    let tb = ctx.new_tensor(DType::F32, &[c.k, c.n_b, c.tokens]).unwrap();
    let ti = ctx.new_tensor(DType::I32, &[c.n_used, c.tokens]).unwrap();
    let y = ctx.mul_mat_id(tw, tb, ti).unwrap();
    alloc_ctx_tensors(&mut ctx, &CpuDevice::new("CPU").buffer_type()).unwrap();
    ctx.tensor_set(tw, 0, w).unwrap();
    ctx.tensor_set_f32(tb, b).unwrap();
    ctx.tensor_set(ti, 0, bytemuck::cast_slice(routes)).unwrap();
    let graph = Graph::build(&mut ctx, &[y]).unwrap();
    be.graph_compute(&ctx, &graph).unwrap();
    ctx.tensor_get_f32(y).unwrap()
}

fn check(isa: IsaChoice, fixture: &str) {
    let cases = read_cases(fixture);
    assert_eq!(cases.len(), 18);
    let device = CpuDevice::with_options(
        "CPU",
        &CpuOptions {
            isa: Some(isa),
            ..Default::default()
        },
    );
    // The native AVX-512 build multiplies BF16 with `vdpbf16ps`, which the fixture's CPU had.
    let bf16_runs = isa != IsaChoice::Avx512 || device.features().bf16_products();
    let mut failures = Vec::new();
    for c in cases.iter().filter(|c| bf16_runs || c.dtype != DType::BF16) {
        let w = encode(
            c.dtype,
            &Values::fill(c.seed, c.k * c.n * c.n_expert, 1.0),
            c.k,
        );
        let b = Values::fill(c.seed + 1, c.k * c.n_b * c.tokens, 1.0);
        let routes = ids(c.tokens);
        let h = fnv1a(
            fnv1a(fnv1a(0xcbf29ce484222325, &w), bytemuck::cast_slice(&b)),
            bytemuck::cast_slice(&routes),
        );
        assert_eq!(
            h, c.input_hash,
            "{} inputs differ from the fixture's",
            c.dtype
        );
        // The AVX2 arithmetic on an AVX-512 CPU also with the AVX-512 instructions dropped (the
        // kernels an AVX2-only CPU runs).
        let narrow = isa == IsaChoice::Avx2 && device.features().has_avx512();
        let runs = [(1, false), (2, false), (2, true)];
        for (threads, narrowed) in runs.into_iter().filter(|&(_, n)| !n || narrow) {
            let mut be = CpuBackend::with_device(device.clone(), threads).unwrap();
            be.set_adaptive_threads(false);
            if narrowed {
                be.set_features(be.features().without_avx512());
            }
            let got = rgml_mul_mat_id(&mut be, c, &w, &b, &routes);
            if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != c.out[i].to_bits()) {
                let bad = (0..got.len())
                    .filter(|&i| got[i].to_bits() != c.out[i].to_bits())
                    .count();
                failures.push(format!(
                    "{} (n_b {}, {threads} threads{}): {bad} of {} differ, e.g. [{i}] {} vs ggml {}",
                    c.dtype,
                    c.n_b,
                    if narrowed { ", AVX2 instructions" } else { "" },
                    got.len(),
                    got[i],
                    c.out[i]
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{isa}:\n{}", failures.join("\n"));
}

#[test]
fn mul_mat_id_is_ggml_bit_for_bit_avx2() {
    if CpuFeatures::detect().has_avx2() {
        check(IsaChoice::Avx2, "avx2");
    }
}

#[test]
fn mul_mat_id_is_ggml_bit_for_bit_avx512() {
    if CpuFeatures::detect().has_avx512() {
        check(IsaChoice::Avx512, "avx512");
    }
}

/// An expert id out of range (a router's output is data) is an error naming the op, not a
/// read out of bounds; negative ids too.
#[test]
fn expert_ids_out_of_range_are_errors() {
    for bad in [4, -1] {
        let mut ctx = Context::new();
        let w = ctx.new_tensor(DType::Q8_0, &[64, 8, 4]).unwrap();
        let b = ctx.new_tensor(DType::F32, &[64, 1, 3]).unwrap();
        let ids = ctx.new_tensor(DType::I32, &[2, 3]).unwrap();
        let y = ctx.mul_mat_id(w, b, ids).unwrap();
        alloc_ctx_tensors(&mut ctx, &CpuDevice::new("CPU").buffer_type()).unwrap();
        let wv = Values::fill(1, 64 * 8 * 4, 1.0);
        ctx.tensor_set(w, 0, &encode(DType::Q8_0, &wv, 64)).unwrap();
        ctx.tensor_set_f32(b, &Values::fill(2, 64 * 3, 1.0))
            .unwrap();
        ctx.tensor_set(ids, 0, bytemuck::cast_slice(&[0i32, 1, 2, bad, 3, 0]))
            .unwrap();
        let graph = Graph::build(&mut ctx, &[y]).unwrap();
        let mut be = CpuBackend::new(2).unwrap();
        let err = be.graph_compute(&ctx, &graph).unwrap_err().to_string();
        assert!(
            err.contains("MUL_MAT_ID") && err.contains("expert id"),
            "{err}"
        );
    }
}
