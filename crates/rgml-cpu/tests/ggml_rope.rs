//! ROPE against the real ggml: `tests/fixtures/ggml_rope/rope.bin` holds random rows,
//! positions (0, 1, large, past 2^24, negative), frequency factors (Llama 3's `rope_freqs`,
//! random in [1, 8)) and what a native ggml-cpu build's `ggml_rope_ext` computed from them
//! (`scripts/ggml_ref/gen_rope.sh`): normal and NeoX layouts, with and without factors (exactly
//! `n_dims / 2` of them and more), with and without YaRN, whole and partial rotation. rgml must
//! give the same bits with 1 and 3 threads.
//!
//! The machine that made the fixture has no AVX-512, so they are the AVX2 build's results.
//! ggml's AVX-512 build computes the same angles and tables (scalar f32 code, libm's `cosf` /
//! `sinf`) and rotates NeoX pairs the same way; only Normal-mode rows whose pair count is not a
//! multiple of 4 end differently: GCC's vectorized loop leaves `n_pairs % 4` pairs to unfused
//! code there, `n_pairs % 2` in the AVX2 builds (see `fused_pairs` in `kernels/rope.rs`). Under
//! `isa=avx512` those pairs may differ by rounding; every other value must be the same bits.

mod fixture_reader;
use fixture_reader::Reader;
use rgml::alloc::alloc_ctx_tensors;
use rgml::{Backend, Context, DType, Graph, RopeMode, RopeParams};
use rgml_cpu::{CpuBackend, CpuDevice, CpuOptions, IsaChoice};
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

fn read_cases() -> Vec<Case> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ggml_rope/rope.bin");
    let bytes = std::fs::read(&path).unwrap();
    let mut r = Reader::new(&bytes);
    assert_eq!(r.take(8), b"RGMLRP1\0");
    let n_cases = r.u32();
    let cases = (0..n_cases)
        .map(|_| {
            let mode = match r.u32() {
                0 => RopeMode::Normal,
                2 => RopeMode::Neox,
                other => panic!("unexpected ggml rope mode {other}"),
            };
            let ne = [r.u32(), r.u32(), r.u32()];
            let (n_dims, n_ctx_orig, n_ff) = (r.u32(), r.u32(), r.u32());
            let mut params = RopeParams::new(mode, n_dims, r.f32());
            params.n_ctx_orig = n_ctx_orig;
            params.freq_scale = r.f32();
            params.ext_factor = r.f32();
            params.attn_factor = r.f32();
            params.beta_fast = r.f32();
            params.beta_slow = r.f32();
            let n = ne.iter().product();
            let x = r.f32s(n);
            let pos = r.i32s(ne[2]);
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
    let pos = ctx.new_tensor(DType::I32, &[case.ne[2]]).unwrap();
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

/// Whether element `i` of a case's output is rotated by a pair that ggml's AVX2 build fuses
/// and its AVX-512 build does not (Normal mode only).
fn rounded_differently_by_avx512(case: &Case, i: usize) -> bool {
    let n_pairs = case.params.n_dims / 2;
    let pair = i % case.ne[0] / 2;
    case.params.mode == RopeMode::Normal
        && pair < n_pairs
        && pair >= n_pairs - n_pairs % 4
        && pair < n_pairs - n_pairs % 2
}

fn check(isa: IsaChoice) {
    let cases = read_cases();
    // Both layouts of 8 configurations with factors and 2 without.
    assert_eq!(cases.len(), 20);
    assert_eq!(cases.iter().filter(|c| c.factors.is_some()).count(), 16);
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
                .filter(|&i| {
                    if isa != IsaChoice::Avx2 && rounded_differently_by_avx512(case, i) {
                        // One rounding of each product apart (values are at most 2 · 2).
                        (got[i] - case.out[i]).abs() > 1e-6
                    } else {
                        got[i].to_bits() != case.out[i].to_bits()
                    }
                })
                .collect();
            if let Some(&i) = bad.first() {
                failures.push(format!(
                    "case {k} ({:?}, ne {:?}, factors {}): {} of {} differ, e.g. [{i}] {} vs ggml {} ({isa}, {threads} threads)",
                    case.params,
                    case.ne,
                    case.factors.as_ref().map_or(0, Vec::len),
                    bad.len(),
                    got.len(),
                    got[i],
                    case.out[i],
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The fixture has rows where the two builds round differently.
    assert!(cases
        .iter()
        .any(|c| (0..c.out.len()).any(|i| rounded_differently_by_avx512(c, i))));
}

#[test]
fn rope_is_ggml_bit_for_bit_avx2() {
    check(IsaChoice::Avx2);
}

#[test]
fn rope_is_ggml_bit_for_bit_avx512() {
    check(IsaChoice::Avx512);
}

/// The factors matter: ggml's outputs with factors are not those without.
#[test]
fn fixture_factors_change_the_rotation() {
    let cases = read_cases();
    let mut be = CpuBackend::with_device(CpuDevice::new("CPU"), 1).unwrap();
    for case in cases.iter().filter(|c| c.factors.is_some()) {
        let plain = Case {
            factors: None,
            x: case.x.clone(),
            pos: case.pos.clone(),
            out: Vec::new(),
            ..*case
        };
        assert_ne!(rgml_rope(&mut be, &plain), case.out);
    }
}
