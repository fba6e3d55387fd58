//! NEG, SIGMOID, EXP, SOFTPLUS and SWIGLU_OAI against the real ggml, bit for bit:
//! `tests/fixtures/ggml_activations/activations.bin` holds inputs and what ggml-cpu computed
//! from them (`scripts/ggml_ref/gen_activations.sh`), over ranges that reach softplus's
//! cut-over at 20, the saturation of sigmoid and exp, and SwiGLU-OAI's clamps. ADD_ID (one f32
//! add per element) is checked on rows made here, with its out-of-range ids.

mod fixture_reader;
use fixture_reader::Reader;
use rgml::alloc::alloc_ctx_tensors;
use rgml::{Backend, Context, DType, Device, Graph};
use rgml_cpu::{CpuBackend, CpuDevice};
use std::path::Path;

struct Case {
    op: usize,
    a: Vec<f32>,
    b: Vec<f32>,
    out: Vec<f32>,
}

fn read_cases() -> Vec<Case> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/ggml_activations/activations.bin");
    let bytes = std::fs::read(&path).unwrap();
    let mut r = Reader::new(&bytes);
    assert_eq!(r.take(8), b"RGMLAC1\0");
    let cases = (0..r.u32())
        .map(|_| {
            let (op, n) = (r.u32(), r.u32());
            Case {
                op,
                a: r.f32s(n),
                b: r.f32s(n),
                out: r.f32s(n),
            }
        })
        .collect();
    assert!(r.done(), "trailing bytes in the fixture");
    cases
}

fn rgml_op(be: &mut CpuBackend, case: &Case) -> Vec<f32> {
    let n = case.a.len();
    let mut ctx = Context::new();
    let a = ctx.new_tensor(DType::F32, &[n]).unwrap();
    let b = ctx.new_tensor(DType::F32, &[n]).unwrap();
    let y = match case.op {
        0 => ctx.neg(a),
        1 => ctx.sigmoid(a),
        2 => ctx.exp(a),
        3 => ctx.softplus(a),
        _ => ctx.swiglu_oai(a, b, 1.702, 7.0),
    }
    .unwrap();
    alloc_ctx_tensors(&mut ctx, &CpuDevice::new("CPU").buffer_type()).unwrap();
    ctx.tensor_set_f32(a, &case.a).unwrap();
    ctx.tensor_set_f32(b, &case.b).unwrap();
    let graph = Graph::build(&mut ctx, &[y]).unwrap();
    be.graph_compute(&ctx, &graph).unwrap();
    ctx.tensor_get_f32(y).unwrap()
}

#[test]
fn activations_are_ggml_bit_for_bit() {
    let cases = read_cases();
    assert_eq!(cases.len(), 10);
    let mut be = CpuBackend::new(2).unwrap();
    for (i, case) in cases.iter().enumerate() {
        let got = rgml_op(&mut be, case);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let differ = bits(&got)
            .iter()
            .zip(bits(&case.out))
            .filter(|(g, w)| *g != w)
            .count();
        assert_eq!(
            differ, 0,
            "case {i} (op {}): {differ} values differ",
            case.op
        );
        // Not all-zero or constant data.
        assert!(case.out.iter().any(|&v| v != case.out[0]), "case {i}");
    }
}

/// ADD_ID adds row `ids[slot, token]` of the biases to each row (`ggml_vec_add_f32`: one f32
/// add, so exact), and a row id out of range (a router's output is data) is an error naming
/// the op, not a read out of bounds.
#[test]
fn add_id_adds_the_chosen_rows_and_refuses_bad_ids() {
    let run = |ids: [i32; 6]| {
        let mut ctx = Context::new();
        let a = ctx.new_tensor(DType::F32, &[5, 2, 3]).unwrap();
        let b = ctx.new_tensor(DType::F32, &[5, 4]).unwrap();
        let id = ctx.new_tensor(DType::I32, &[2, 3]).unwrap();
        let y = ctx.add_id(a, b, id).unwrap();
        alloc_ctx_tensors(&mut ctx, &CpuDevice::new("CPU").buffer_type()).unwrap();
        let av: Vec<f32> = (0..30).map(|i| i as f32 * 0.37 - 4.0).collect();
        let bv: Vec<f32> = (0..20).map(|i| i as f32 * 1.13 + 0.5).collect();
        ctx.tensor_set_f32(a, &av).unwrap();
        ctx.tensor_set_f32(b, &bv).unwrap();
        ctx.tensor_set(id, 0, bytemuck::cast_slice(&ids)).unwrap();
        let graph = Graph::build(&mut ctx, &[y]).unwrap();
        let mut be = CpuBackend::new(2).unwrap();
        be.graph_compute(&ctx, &graph)
            .map(|_| {
                let got = ctx.tensor_get_f32(y).unwrap();
                (got, av, bv)
            })
            .map_err(|e| e.to_string())
    };
    let ids = [3, 0, 1, 1, 2, 3];
    let (got, av, bv) = run(ids).unwrap();
    for (row, &r) in ids.iter().enumerate() {
        for i in 0..5 {
            let want = av[row * 5 + i] + bv[r as usize * 5 + i];
            assert_eq!(got[row * 5 + i].to_bits(), want.to_bits(), "row {row}, {i}");
        }
    }
    for bad in [4, -1] {
        let err = run([0, 1, bad, 1, 2, 3]).unwrap_err();
        assert!(err.contains("ADD_ID") && err.contains("row id"), "{err}");
    }
}
