//! ARGSORT against the real ggml: `tests/fixtures/ggml_argsort/argsort.bin` holds rows and the
//! indices ggml-cpu's argsort gave them (`scripts/ggml_ref/gen_argsort.sh`). Most rows are
//! drawn from a few distinct values, so the order of equal values (that of libstdc++'s
//! `std::sort`, which is not stable) is what is checked; the lengths cover the insertion sort
//! alone (up to 16) and the introsort above it.

mod fixture_reader;
use fixture_reader::Reader;
use rgml::alloc::alloc_ctx_tensors;
use rgml::{Backend, Context, DType, Device, Graph};
use rgml_cpu::{CpuBackend, CpuDevice};
use std::path::Path;

struct Case {
    n: usize,
    rows: usize,
    descending: bool,
    values: Vec<f32>,
    indices: Vec<i32>,
}

fn read_cases() -> Vec<Case> {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ggml_argsort/argsort.bin");
    let bytes = std::fs::read(&path).unwrap();
    let mut r = Reader::new(&bytes);
    assert_eq!(r.take(8), b"RGMLAS1\0");
    let cases = (0..r.u32())
        .map(|_| {
            let (n, rows, descending) = (r.u32(), r.u32(), r.u32() != 0);
            let values = r.f32s(n * rows);
            let indices = r.i32s(n * rows);
            Case {
                n,
                rows,
                descending,
                values,
                indices,
            }
        })
        .collect();
    assert!(r.done(), "trailing bytes in the fixture");
    cases
}

fn rgml_argsort(be: &mut CpuBackend, case: &Case) -> Vec<i32> {
    let mut ctx = Context::new();
    let x = ctx.new_tensor(DType::F32, &[case.n, case.rows]).unwrap();
    let y = ctx.argsort(x, case.descending).unwrap();
    alloc_ctx_tensors(&mut ctx, &CpuDevice::new("CPU").buffer_type()).unwrap();
    ctx.tensor_set_f32(x, &case.values).unwrap();
    let graph = Graph::build(&mut ctx, &[y]).unwrap();
    be.graph_compute(&ctx, &graph).unwrap();
    let mut raw = vec![0u8; 4 * case.n * case.rows];
    ctx.tensor_get(y, 0, &mut raw).unwrap();
    raw.chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn argsort_orders_ties_as_ggml() {
    let cases = read_cases();
    assert_eq!(cases.len(), 32);
    let mut with_ties = 0;
    for threads in [1, 3] {
        let mut be = CpuBackend::new(threads).unwrap();
        for (i, case) in cases.iter().enumerate() {
            let got = rgml_argsort(&mut be, case);
            assert_eq!(
                got, case.indices,
                "case {i}: {} rows of {}, descending {}, {threads} threads",
                case.rows, case.n, case.descending
            );
            let row = &case.values[..case.n];
            with_ties += usize::from(
                row.iter()
                    .any(|v| row.iter().filter(|w| *w == v).count() > 1),
            );
        }
    }
    // The fixture tests what it is for: rows with equal values whose order is not by index.
    assert!(with_ties > 20);
    assert!(cases.iter().any(|c| {
        c.indices[..c.n]
            .windows(2)
            .any(|w| c.values[w[0] as usize] == c.values[w[1] as usize] && w[0] > w[1])
    }));
}
