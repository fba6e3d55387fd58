//! FLASH_ATTN_EXT against the real ggml: `tests/fixtures/ggml_flash_attn/<isa>/fa.bin` holds
//! what ggml-cpu's native build for that instruction set computed (`scripts/ggml_ref/
//! gen_flash_attn.sh`) on 1, 2 and 3 threads, for cases that run each of its three kernels
//! (one row at a time, tiled, one query's cells split between threads) with f16, f32, q8_0
//! and q4_0 caches, masks with `-inf`, soft-capping, ALiBi and sinks. The inputs are made here
//! again from the fixture's seeds (and checked against its hash of them). rgml must give the
//! same bits on a backend of the same thread count, whichever instruction set the CPU runs
//! natively (the other one forced where the CPU can run it).
//!
//! The AVX-512 fixture comes from a CPU with AVX512-FP16 (a Sapphire Rapids Xeon), whose native
//! build accumulates f16 V rows in half precision for rows of 128 values or more (see
//! `CpuFeatures::f16_vectors`). On an AVX-512 CPU without it (AMD Zen 4/5) rgml mirrors the
//! build for that CPU, so those cases are left out there (the AVX2 fixture checks the f32 form
//! of that accumulation on every CPU).

mod fixture_reader;
mod ggml_inputs;
use fixture_reader::Reader;
use ggml_inputs::{encode, fnv1a, Values};
use half::f16;
use rgml::alloc::alloc_ctx_tensors;
use rgml::{Backend, Context, DType, Graph};
use rgml_cpu::{CpuBackend, CpuDevice, CpuFeatures, CpuOptions, IsaChoice};
use std::path::Path;

/// One ggml FLASH_ATTN_EXT and its outputs per thread count.
struct Case {
    k_type: DType,
    v_type: DType,
    dk: usize,
    dv: usize,
    n_q: usize,
    n_kv: usize,
    n_head: usize,
    n_head_kv: usize,
    first_pos: usize,
    used: usize,
    sinks: bool,
    scale: f32,
    max_bias: f32,
    softcap: f32,
    seed: u64,
    input_hash: u64,
    outputs: Vec<(usize, Vec<f32>)>,
}

fn ggml_type(id: usize) -> DType {
    match id {
        0 => DType::F32,
        1 => DType::F16,
        2 => DType::Q4_0,
        8 => DType::Q8_0,
        other => panic!("unexpected ggml type {other}"),
    }
}

fn read_cases(isa: &str) -> Vec<Case> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/ggml_flash_attn")
        .join(isa)
        .join("fa.bin");
    let bytes = std::fs::read(&path).unwrap();
    let mut r = Reader::new(&bytes);
    assert_eq!(r.take(8), b"RGMLFA2\0");
    let n_cases = r.u32();
    let cases = (0..n_cases)
        .map(|_| {
            let (k_type, v_type) = (ggml_type(r.u32()), ggml_type(r.u32()));
            let [dk, dv, n_q, n_kv, n_head, n_head_kv] = std::array::from_fn(|_| r.u32());
            let (first_pos, used, sinks) = (r.u32(), r.u32(), r.u32() != 0);
            let (scale, max_bias, softcap) = (r.f32(), r.f32(), r.f32());
            let seed = r.u32() as u64;
            let input_hash = u64::from_le_bytes(r.take(8).try_into().unwrap());
            let n_out = dv * n_head * n_q;
            let mut outputs: Vec<(usize, Vec<f32>)> = Vec::new();
            for _ in 0..r.u32() {
                let (threads, same) = (r.u32(), r.u32() != 0);
                let out = match same {
                    true => outputs.last().expect("a previous run").1.clone(),
                    false => r.f32s(n_out),
                };
                outputs.push((threads, out));
            }
            Case {
                k_type,
                v_type,
                dk,
                dv,
                n_q,
                n_kv,
                n_head,
                n_head_kv,
                first_pos,
                used,
                sinks,
                scale,
                max_bias,
                softcap,
                seed,
                input_hash,
                outputs,
            }
        })
        .collect();
    assert!(r.done(), "trailing bytes in the fixture");
    cases
}

/// A case's inputs: q, K bytes, V bytes, mask bits, sinks.
struct Inputs {
    q: Vec<f32>,
    k: Vec<u8>,
    v: Vec<u8>,
    mask: Option<Vec<u16>>,
    sinks: Option<Vec<f32>>,
}

fn inputs(c: &Case) -> Inputs {
    let seed = c.seed;
    let q = Values::fill(seed, c.dk * c.n_q * c.n_head, 0.5);
    let k = encode(
        c.k_type,
        &Values::fill(seed + 1, c.dk * c.n_kv * c.n_head_kv, 1.0),
        c.dk,
    );
    let v = encode(
        c.v_type,
        &Values::fill(seed + 2, c.dv * c.n_kv * c.n_head_kv, 1.0),
        c.dv,
    );
    let sinks = c.sinks.then(|| Values::fill(seed + 3, c.n_head, 2.0));
    let mask: Option<Vec<u16>> = (c.used > 0).then(|| {
        let (zero, minus_inf) = (f16::ZERO.to_bits(), f16::NEG_INFINITY.to_bits());
        (0..c.n_q)
            .flat_map(|i| {
                (0..c.n_kv).map(move |j| match j < c.used && j <= c.first_pos + i {
                    true => zero,
                    false => minus_inf,
                })
            })
            .collect()
    });
    let mut h = fnv1a(0xcbf29ce484222325, bytemuck::cast_slice(&q));
    h = fnv1a(fnv1a(h, &k), &v);
    if let Some(m) = &mask {
        h = fnv1a(h, bytemuck::cast_slice(m));
    }
    if let Some(s) = &sinks {
        h = fnv1a(h, bytemuck::cast_slice(s));
    }
    assert_eq!(h, c.input_hash, "the inputs differ from the generator's");
    Inputs {
        q,
        k,
        v,
        mask,
        sinks,
    }
}

fn rgml_flash_attn(be: &mut CpuBackend, c: &Case, x: &Inputs) -> Vec<f32> {
    let mut ctx = Context::new();
    let q = ctx
        .new_tensor(DType::F32, &[c.dk, c.n_q, c.n_head])
        .unwrap();
    let k = ctx
        .new_tensor(c.k_type, &[c.dk, c.n_kv, c.n_head_kv])
        .unwrap();
    let v = ctx
        .new_tensor(c.v_type, &[c.dv, c.n_kv, c.n_head_kv])
        .unwrap();
    let mask = x
        .mask
        .as_ref()
        .map(|_| ctx.new_tensor(DType::F16, &[c.n_kv, c.n_q]).unwrap());
    let sinks = x
        .sinks
        .as_ref()
        .map(|_| ctx.new_tensor(DType::F32, &[c.n_head]).unwrap());
    let y = ctx
        .flash_attn_ext(q, k, v, mask, sinks, c.scale, c.max_bias, c.softcap)
        .unwrap();
    let graph = Graph::build(&mut ctx, &[y]).unwrap();
    alloc_ctx_tensors(&mut ctx, &be.default_buffer_type()).unwrap();
    ctx.tensor_set_f32(q, &x.q).unwrap();
    ctx.tensor_set(k, 0, &x.k).unwrap();
    ctx.tensor_set(v, 0, &x.v).unwrap();
    if let (Some(m), Some(bits)) = (mask, &x.mask) {
        ctx.tensor_set(m, 0, bytemuck::cast_slice(bits)).unwrap();
    }
    if let (Some(s), Some(values)) = (sinks, &x.sinks) {
        ctx.tensor_set_f32(s, values).unwrap();
    }
    be.graph_compute(&ctx, &graph).unwrap();
    ctx.tensor_get_f32(y).unwrap()
}

fn check(isa: IsaChoice, fixture: &str) {
    let cases = read_cases(fixture);
    assert_eq!(cases.len(), 15);
    let device = CpuDevice::with_options(
        "CPU",
        &CpuOptions {
            isa: Some(isa),
            ..Default::default()
        },
    );
    let features = CpuFeatures::resolve(Some(isa));
    let fp16_fixture = fixture == "avx512";
    let mut failures = Vec::new();
    for (n, case) in cases.iter().enumerate() {
        let f16_accumulator = case.v_type == DType::F16 && case.n_q < 64 && case.dv >= 128;
        if f16_accumulator && fp16_fixture && !features.f16_vectors() {
            eprintln!(
                "case {n}: left out, the fixture's build had AVX512-FP16 and this CPU has not"
            );
            continue;
        }
        let x = inputs(case);
        for (threads, want) in &case.outputs {
            let mut be = CpuBackend::with_device(device.clone(), *threads).unwrap();
            // Every thread count asked for runs, even on a loaded machine.
            be.set_adaptive_threads(false);
            let got = rgml_flash_attn(&mut be, case, &x);
            let bad = (0..got.len())
                .filter(|&i| got[i].to_bits() != want[i].to_bits())
                .count();
            if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
                failures.push(format!(
                    "case {n} ({:?}/{:?}, {} queries, {} cells, {threads} threads): {bad} of {} differ, e.g. [{i}] {} vs ggml {}",
                    case.k_type, case.v_type, case.n_q, case.n_kv, got.len(), got[i], want[i]
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{isa}:\n{}", failures.join("\n"));
    // The split of cells between threads shows in the fixture: its rounding differs by thread
    // count, so the check above compares each.
    assert!(cases
        .iter()
        .any(|c| c.outputs.windows(2).any(|w| w[0].1 != w[1].1)));
}

#[test]
fn flash_attn_is_ggml_bit_for_bit_avx2() {
    if CpuFeatures::detect().has_avx2() {
        check(IsaChoice::Avx2, "avx2");
    }
}

#[test]
fn flash_attn_is_ggml_bit_for_bit_avx512() {
    if CpuFeatures::detect().has_avx512() {
        check(IsaChoice::Avx512, "avx512");
    }
}
