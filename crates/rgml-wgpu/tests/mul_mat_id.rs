//! MUL_MAT_ID in the GPU's fast arithmetic, by both of its kernels: a decode's few tokens
//! (`mul_mv_id_fast`, a mat-vec per routed column) and a prompt's (`mm_id_lists` and
//! `mul_mm_id_fast`, tiles per expert over the columns routed to it). Each routed column
//! equals a float64 reference to f32 rounding, whichever kernel computes it and however
//! unevenly the experts are picked; a column whose id is no expert is NaN in both. Without an
//! adapter the test skips, unless `RGML_REQUIRE_GPU=1`.

use rgml::alloc::alloc_ctx_tensors;
use rgml::backend::BackendParams;
use rgml::{Context, DType, Graph};
mod common;
use common::first_device;

/// Values in [-1, 1] from a small linear congruential generator (reproducible, non-zero).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0 + 1e-3
        })
        .collect()
}

#[test]
fn routed_columns_equal_the_reference_in_both_kernels() {
    let Some(dev) = first_device() else {
        return;
    };
    let mut be = dev
        .init_backend(&BackendParams::parse("exact=0").unwrap())
        .unwrap();
    let (k, m, experts, used) = (96, 70, 5, 3);
    // 3 tokens: the mat-vec kernel; 45: the tiled one (expert 0 takes most columns, expert 4
    // none; -1 and 9 are no expert).
    for tokens in [3usize, 45] {
        let ids: Vec<i32> = (0..tokens * used)
            .map(|c| match (c % used, c / used) {
                (_, 1) if c % used == 2 => -1,
                (_, 2) if c % used == 0 => 9,
                (0, t) => (t % 2) as i32,
                (s, t) => ((s + t) % 4) as i32,
            })
            .collect();
        let mut ctx = Context::new();
        let w = ctx.new_tensor(DType::F32, &[k, m, experts]).unwrap();
        let b = ctx.new_tensor(DType::F32, &[k, used, tokens]).unwrap();
        let id = ctx.new_tensor(DType::I32, &[used, tokens]).unwrap();
        let out = ctx.mul_mat_id(w, b, id).unwrap();
        let graph = Graph::build(&mut ctx, &[out]).unwrap();
        let _buffer = alloc_ctx_tensors(&mut ctx, &be.default_buffer_type()).unwrap();
        let (wv, bv) = (values(k * m * experts, 1), values(k * used * tokens, 2));
        ctx.tensor_set_f32(w, &wv).unwrap();
        ctx.tensor_set_f32(b, &bv).unwrap();
        ctx.tensor_set_i32(id, &ids).unwrap();
        be.graph_compute(&ctx, &graph).unwrap();
        let got = ctx.tensor_get_f32(out).unwrap();
        for (c, &e) in ids.iter().enumerate() {
            let (s, t) = (c % used, c / used);
            for row in 0..m {
                let v = got[(t * used + s) * m + row];
                if !(0..experts as i32).contains(&e) {
                    assert!(
                        v.is_nan(),
                        "tokens {tokens}: column ({s}, {t}), id {e}: {v}"
                    );
                    continue;
                }
                let wr = &wv[(e as usize * m + row) * k..][..k];
                let br = &bv[(t * used + s) * k..][..k];
                let want: f64 = wr
                    .iter()
                    .zip(br)
                    .map(|(&x, &y)| f64::from(x) * f64::from(y))
                    .sum();
                assert!(
                    (f64::from(v) - want).abs() <= 1e-4 * (1.0 + want.abs()),
                    "tokens {tokens}: column ({s}, {t}) row {row}: {v} vs {want}"
                );
            }
        }
    }
}
