//! Multi-section ROPE (ggml's `ggml_rope_multi`, modes MROPE and IMROPE) against the real
//! ggml: `tests/fixtures/ggml_rope_multi/<isa>/rope_multi.bin` holds what ggml-cpu's build for
//! that instruction set computed (`scripts/ggml_ref/gen_rope_multi.sh`, 2 threads) with
//! Qwen2-VL's, Qwen3-VL's and Qwen3.5's sections and sections that wrap around the rotated
//! pairs, four different positions per token (small, large, negative), with and without
//! frequency factors and YaRN, whole and partial rotation. The rows are made here again from
//! the fixture's seeds (and checked against its hash); positions and factors are stored. rgml
//! must give the same bits on 1 and 3 threads under both arithmetics. (The two builds gave the
//! same bytes: these modes rotate NeoX pairs, which neither build vectorizes.)

mod fixture_reader;
mod ggml_inputs;
use fixture_reader::Reader;
use ggml_inputs::{fnv1a, Values};
use rgml::alloc::alloc_ctx_tensors;
use rgml::{Backend, Context, DType, Graph, RopeMode, RopeParams};
use rgml_cpu::{CpuBackend, CpuDevice, CpuFeatures, CpuOptions, IsaChoice};
use std::path::Path;

/// One ggml ROPE: its inputs and output.
struct Case {
    ne: [usize; 3],
    params: RopeParams,
    x: Vec<f32>,
    pos: Vec<i32>,
    factors: Option<Vec<f32>>,
    out: Vec<f32>,
}

fn read_cases(isa: &str) -> Vec<Case> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/ggml_rope_multi")
        .join(isa)
        .join("rope_multi.bin");
    let bytes = std::fs::read(&path).unwrap();
    let mut r = Reader::new(&bytes);
    assert_eq!(r.take(8), b"RGMLRM1\0");
    let n_cases = r.u32();
    let cases = (0..n_cases)
        .map(|_| {
            let mode = r.u32();
            let ne = [r.u32(), r.u32(), r.u32()];
            let (n_dims, n_ctx_orig, n_ff) = (r.u32(), r.u32(), r.u32());
            let sections: [u32; 4] = std::array::from_fn(|_| r.u32() as u32);
            let mode = match mode {
                8 => RopeMode::Mrope { sections },
                40 => RopeMode::Imrope { sections },
                other => panic!("unexpected ggml rope mode {other}"),
            };
            let mut params = RopeParams::new(mode, n_dims, r.f32());
            params.n_ctx_orig = n_ctx_orig;
            params.freq_scale = r.f32();
            params.ext_factor = r.f32();
            params.attn_factor = r.f32();
            params.beta_fast = r.f32();
            params.beta_slow = r.f32();
            let seed = r.u32() as u64;
            let hash = u64::from_le_bytes(r.take(8).try_into().unwrap());
            let n = ne.iter().product();
            let x = Values::fill(seed, n, 1.0);
            assert_eq!(fnv1a(0xcbf29ce484222325, bytemuck::cast_slice(&x)), hash);
            let pos = r.i32s(4 * ne[2]);
            let factors = (n_ff > 0).then(|| r.f32s(n_ff));
            let out = r.f32s(n);
            Case {
                ne,
                params,
                x,
                pos,
                factors,
                out,
            }
        })
        .collect();
    assert!(r.done(), "trailing bytes in the fixture");
    cases
}

fn rgml_rope(be: &mut CpuBackend, case: &Case) -> Vec<f32> {
    let mut ctx = Context::new();
    let x = ctx.new_tensor(DType::F32, &case.ne).unwrap();
    let pos = ctx.new_tensor(DType::I32, &[case.pos.len()]).unwrap();
    let ff = case
        .factors
        .as_ref()
        .map(|f| ctx.new_tensor(DType::F32, &[f.len()]).unwrap());
    let y = ctx.rope_ext(x, pos, ff, case.params).unwrap();
    let graph = Graph::build(&mut ctx, &[y]).unwrap();
    alloc_ctx_tensors(&mut ctx, &be.default_buffer_type()).unwrap();
    ctx.tensor_set_f32(x, &case.x).unwrap();
    ctx.tensor_set_i32(pos, &case.pos).unwrap();
    if let (Some(ff), Some(f)) = (ff, &case.factors) {
        ctx.tensor_set_f32(ff, f).unwrap();
    }
    be.graph_compute(&ctx, &graph).unwrap();
    ctx.tensor_get_f32(y).unwrap()
}

fn check(isa: IsaChoice, fixture: &str) {
    let cases = read_cases(fixture);
    // Both modes of 7 configurations, 2 of them with factors.
    assert_eq!(cases.len(), 14);
    assert_eq!(cases.iter().filter(|c| c.factors.is_some()).count(), 4);
    let options = CpuOptions {
        isa: Some(isa),
        ..Default::default()
    };
    let device = CpuDevice::with_options("CPU", &options);
    let mut failures = Vec::new();
    for threads in [1, 3] {
        let mut be = CpuBackend::with_device(device.clone(), threads).unwrap();
        // Every thread count asked for runs, even on a loaded machine.
        be.set_adaptive_threads(false);
        for (k, case) in cases.iter().enumerate() {
            let got = rgml_rope(&mut be, case);
            let bad: Vec<usize> = (0..got.len())
                .filter(|&i| got[i].to_bits() != case.out[i].to_bits())
                .collect();
            if let Some(&i) = bad.first() {
                failures.push(format!(
                    "case {k} ({:?}, ne {:?}): {} of {} differ, e.g. [{i}] {} vs ggml {} ({isa}, {threads} threads)",
                    case.params,
                    case.ne,
                    bad.len(),
                    got.len(),
                    got[i],
                    case.out[i],
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn rope_multi_is_ggml_bit_for_bit_avx2() {
    if CpuFeatures::detect().has_avx2() {
        check(IsaChoice::Avx2, "avx2");
    }
}

#[test]
fn rope_multi_is_ggml_bit_for_bit_avx512() {
    if CpuFeatures::detect().has_avx512() {
        check(IsaChoice::Avx512, "avx512");
    }
}

/// The interleaving matters: the same rows, positions and sections in the other
/// multi-section mode give other values.
#[test]
fn sections_and_interleaving_change_the_rotation() {
    let cases = read_cases("avx2");
    let mut be = CpuBackend::with_device(CpuDevice::new("CPU"), 1).unwrap();
    for case in &cases {
        let sections = case.params.mode.sections().unwrap();
        let other = match case.params.mode {
            RopeMode::Mrope { .. } => RopeMode::Imrope { sections },
            _ => RopeMode::Mrope { sections },
        };
        let mut swapped = case.params;
        swapped.mode = other;
        let variant = Case {
            params: swapped,
            x: case.x.clone(),
            pos: case.pos.clone(),
            factors: case.factors.clone(),
            out: Vec::new(),
            ..*case
        };
        assert_ne!(rgml_rope(&mut be, &variant), case.out);
    }
}
