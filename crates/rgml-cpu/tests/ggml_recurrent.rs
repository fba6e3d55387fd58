//! SSM_CONV and GATED_DELTA_NET against the real ggml: `tests/fixtures/ggml_recurrent/<isa>/
//! recurrent.bin` holds what ggml-cpu's build for that instruction set computed
//! (`scripts/ggml_ref/gen_recurrent.sh`, 2 threads) for SSM_CONV kernels of 1 to 24 taps and
//! GATED_DELTA_NET with scalar and vector gates, broadcast q/k heads and sequences, rows of 128
//! values and of sizes that leave `ggml_vec_dot_f32` leftovers, and 1 to 4 state snapshots.
//! The inputs are made here again from the fixture's seeds (and checked against its hash of
//! them). rgml must give the same bits on 1 and 3 threads, whichever instruction set the CPU
//! runs natively (the other one forced where the CPU can run it). Where ggml leaves snapshot
//! slots unwritten (more slots than tokens; the fixture holds a NaN pattern there) rgml writes
//! zeros.
//!
//! Both fixtures come from a Sapphire Rapids Xeon (the AVX-512 one from its native build).

mod fixture_reader;
mod ggml_inputs;
use fixture_reader::Reader;
use ggml_inputs::{fnv1a, Values};
use rgml::alloc::alloc_ctx_tensors;
use rgml::{Backend, Context, DType, Graph, TensorId};
use rgml_cpu::{CpuBackend, CpuDevice, CpuFeatures, CpuOptions, IsaChoice};
use std::path::Path;

/// The NaN pattern the generator fills the result with before ggml computes it.
const UNWRITTEN: u32 = 0x7fc0_dead;

#[derive(Clone, Copy, Debug)]
enum Shape {
    Conv {
        d_conv: usize,
        d_inner: usize,
        n_t: usize,
        n_s: usize,
    },
    Net {
        s_v: usize,
        h: usize,
        h_k: usize,
        n_tokens: usize,
        n_seqs: usize,
        b_k: usize,
        g0: usize,
        snapshots: usize,
    },
}

struct Case {
    shape: Shape,
    seed: u64,
    input_hash: u64,
    out: Vec<f32>,
}

fn read_cases(isa: &str) -> Vec<Case> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/ggml_recurrent")
        .join(isa)
        .join("recurrent.bin");
    let bytes = std::fs::read(&path).unwrap();
    let mut r = Reader::new(&bytes);
    assert_eq!(r.take(8), b"RGMLRC1\0");
    let n_cases = r.u32();
    let cases = (0..n_cases)
        .map(|_| {
            let (kind, seed) = (r.u32(), r.u32() as u64);
            let (shape, n_out) = match kind {
                0 => {
                    let [d_conv, d_inner, n_t, n_s] = std::array::from_fn(|_| r.u32());
                    let shape = Shape::Conv {
                        d_conv,
                        d_inner,
                        n_t,
                        n_s,
                    };
                    (shape, d_inner * n_t * n_s)
                }
                1 => {
                    let [s_v, h, h_k, n_tokens, n_seqs, b_k, g0, snapshots] =
                        std::array::from_fn(|_| r.u32());
                    let shape = Shape::Net {
                        s_v,
                        h,
                        h_k,
                        n_tokens,
                        n_seqs,
                        b_k,
                        g0,
                        snapshots,
                    };
                    (
                        shape,
                        s_v * h * (n_tokens * n_seqs + snapshots * s_v * n_seqs),
                    )
                }
                other => panic!("unexpected case kind {other}"),
            };
            let input_hash = u64::from_le_bytes(r.take(8).try_into().unwrap());
            let out = r.f32s(n_out);
            Case {
                shape,
                seed,
                input_hash,
                out,
            }
        })
        .collect();
    assert!(r.done(), "trailing bytes in the fixture");
    cases
}

/// A case's input tensors (shape and values), in source order.
fn inputs(case: &Case) -> Vec<([usize; 4], Vec<f32>)> {
    let seed = case.seed;
    let fill = |seed, ne: [usize; 4], scale| (ne, Values::fill(seed, ne.iter().product(), scale));
    let out = match case.shape {
        Shape::Conv {
            d_conv,
            d_inner,
            n_t,
            n_s,
        } => vec![
            fill(seed, [d_conv - 1 + n_t, d_inner, n_s, 1], 1.0),
            fill(seed + 1, [d_conv, d_inner, 1, 1], 0.5),
        ],
        Shape::Net {
            s_v,
            h,
            h_k,
            n_tokens,
            n_seqs,
            b_k,
            g0,
            ..
        } => {
            let k_scale = 0.5 / (s_v as f32).sqrt();
            vec![
                fill(seed, [s_v, h_k, n_tokens, b_k], 0.5),
                fill(seed + 1, [s_v, h_k, n_tokens, b_k], k_scale),
                fill(seed + 2, [s_v, h, n_tokens, n_seqs], 1.0),
                fill(seed + 3, [g0, h, n_tokens, n_seqs], 0.2),
                fill(seed + 4, [1, h, n_tokens, n_seqs], 0.25),
                fill(seed + 5, [s_v, s_v, h, n_seqs], 0.5),
            ]
        }
    };
    let hash = out.iter().fold(0xcbf29ce484222325, |h, (_, v)| {
        fnv1a(h, bytemuck::cast_slice(v))
    });
    assert_eq!(
        hash, case.input_hash,
        "the inputs differ from the generator's"
    );
    out
}

fn rgml_op(be: &mut CpuBackend, case: &Case, inputs: &[([usize; 4], Vec<f32>)]) -> Vec<f32> {
    let mut ctx = Context::new();
    let ids: Vec<TensorId> = inputs
        .iter()
        .map(|(ne, _)| ctx.new_tensor(DType::F32, ne).unwrap())
        .collect();
    let y = match (case.shape, ids.as_slice()) {
        (Shape::Conv { .. }, &[sx, c]) => ctx.ssm_conv(sx, c),
        (Shape::Net { snapshots, .. }, &[q, k, v, g, beta, s]) => {
            ctx.gated_delta_net(q, k, v, g, beta, s, snapshots)
        }
        _ => unreachable!("inputs() gives each shape its sources"),
    }
    .unwrap();
    let graph = Graph::build(&mut ctx, &[y]).unwrap();
    alloc_ctx_tensors(&mut ctx, &be.default_buffer_type()).unwrap();
    for (&id, (_, values)) in ids.iter().zip(inputs) {
        ctx.tensor_set_f32(id, values).unwrap();
    }
    // Garbage where rgml must write zeros.
    let n = ctx[y].nelements();
    ctx.tensor_set_f32(y, &vec![f32::from_bits(UNWRITTEN); n])
        .unwrap();
    be.graph_compute(&ctx, &graph).unwrap();
    ctx.tensor_get_f32(y).unwrap()
}

fn check(isa: IsaChoice, fixture: &str) {
    let cases = read_cases(fixture);
    assert_eq!(cases.len(), 17);
    let device = CpuDevice::with_options(
        "CPU",
        &CpuOptions {
            isa: Some(isa),
            ..Default::default()
        },
    );
    let mut failures = Vec::new();
    for threads in [1, 3] {
        let mut be = CpuBackend::with_device(device.clone(), threads).unwrap();
        // Every thread count asked for runs, even on a loaded machine.
        be.set_adaptive_threads(false);
        for (n, case) in cases.iter().enumerate() {
            let got = rgml_op(&mut be, case, &inputs(case));
            let want = |i: usize| match case.out[i].to_bits() {
                UNWRITTEN => 0f32.to_bits(),
                bits => bits,
            };
            let bad: Vec<usize> = (0..got.len())
                .filter(|&i| got[i].to_bits() != want(i))
                .collect();
            if let Some(&i) = bad.first() {
                failures.push(format!(
                    "case {n} ({:?}, {threads} threads): {} of {} differ, e.g. [{i}] {} vs ggml {}",
                    case.shape,
                    bad.len(),
                    got.len(),
                    got[i],
                    f32::from_bits(want(i)),
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{isa}:\n{}", failures.join("\n"));
    // ggml left slots unwritten in the fixture (and rgml wrote zeros there), and the data is
    // not constant.
    assert!(cases
        .iter()
        .any(|c| c.out.iter().any(|v| v.to_bits() == UNWRITTEN)));
    for case in &cases {
        assert!(case.out.iter().any(|&v| v != case.out[0] && v.is_finite()));
    }
}

#[test]
fn recurrent_ops_are_ggml_bit_for_bit_avx2() {
    if CpuFeatures::detect().has_avx2() {
        check(IsaChoice::Avx2, "avx2");
    }
}

#[test]
fn recurrent_ops_are_ggml_bit_for_bit_avx512() {
    if CpuFeatures::detect().has_avx512() {
        check(IsaChoice::Avx512, "avx512");
    }
}

/// The two builds' fixtures differ (the instruction set shows in the bits), so each one checks
/// its own arithmetic.
#[test]
fn the_fixtures_of_the_two_builds_differ() {
    let (a, b) = (read_cases("avx2"), read_cases("avx512"));
    assert!(a.iter().zip(&b).any(|(x, y)| x
        .out
        .iter()
        .zip(&y.out)
        .any(|(p, q)| p.to_bits() != q.to_bits())));
}
