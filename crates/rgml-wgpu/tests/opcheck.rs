//! The conformance suite on the first wgpu device: every supported case must match the float64
//! reference. Without an adapter the test skips, unless `RGML_REQUIRE_GPU=1` (set by
//! `scripts/test.sh`, so CI never skips).

use rgml_opcheck::{run_tests, Outcome};
mod common;
use common::first_device;

#[test]
fn wgpu_passes_every_supported_case() {
    let unsupported = passes_every_supported_case("");
    // Ops whose every case the exact arithmetic computes as ggml-cpu does.
    let exact = [rgml::OpKind::Clamp, rgml::OpKind::AddId];
    let missing: Vec<&String> = unsupported
        .iter()
        .filter(|(op, _)| exact.contains(op))
        .map(|(_, name)| name)
        .collect();
    assert!(missing.is_empty(), "unsupported: {missing:?}");
}

/// The fast arithmetic on the same device (on lavapipe, whose default is exact), against the
/// same reference and thresholds; it adds MUL_MAT and MUL_MAT_ID of every weight type, a
/// mixture of experts' routing (ARGSORT, SUM_ROWS), the delta net's recurrent ops (SSM_CONV,
/// GATED_DELTA_NET) and the unary ops TANH, NEG, SIGMOID, EXP and SOFTPLUS, so more cases
/// run.
#[test]
fn wgpu_fast_arithmetic_passes_every_supported_case() {
    use rgml::OpKind;
    let unsupported = passes_every_supported_case("exact=0");
    // Every case of these ops runs, whatever its weight type (MXFP4 included) or layout.
    let claimed = [
        OpKind::MulMat,
        OpKind::MulMatId,
        OpKind::Argsort,
        OpKind::SumRows,
        OpKind::Clamp,
        OpKind::AddId,
        OpKind::SsmConv,
        OpKind::GatedDeltaNet,
        OpKind::Tanh,
        OpKind::Neg,
        OpKind::Sigmoid,
        OpKind::Exp,
        OpKind::Softplus,
    ];
    let mul_mats: Vec<&String> = unsupported
        .iter()
        .filter(|(op, _)| claimed.contains(op))
        .map(|(_, name)| name)
        .collect();
    assert!(mul_mats.is_empty(), "unsupported: {mul_mats:?}");
}

/// The block mat-vec's DP4A form (int8 activations, packed integer dots for Q4_0, Q8_0, Q4_K
/// and Q6_K; off by default) on every MUL_MAT case, in the fast arithmetic.
#[test]
fn wgpu_dp4a_mat_vec_passes_every_mul_mat_case() {
    passes_every_mul_mat_case(rgml_wgpu::WgpuOptions {
        exact: Some(false),
        mat_vec_dp4a: true,
        ..Default::default()
    });
}

/// The block mat-vec with teams of 32 invocations and 2 rows per team (not the defaults: each
/// team sums in its own tree in workgroup memory where subgroups are not 32 wide, and rows past
/// the end of a matrix in every team), and the gate/up/SwiGLU fusion off.
#[test]
fn wgpu_mat_vec_teams_of_32_pass_every_mul_mat_case() {
    passes_every_mul_mat_case(rgml_wgpu::WgpuOptions {
        exact: Some(false),
        mat_vec_team: Some(32),
        mat_vec_rows: Some(2),
        no_glu_fusion: true,
        ..Default::default()
    });
}

/// Every MUL_MAT case of the suite passes on the first device opened with `options`.
fn passes_every_mul_mat_case(options: rgml_wgpu::WgpuOptions) {
    let reg = rgml_wgpu::WgpuRegistry::with_options(options);
    let Some(dev) = rgml::registry::Registry::devices(&reg).into_iter().next() else {
        return;
    };
    let mut be = dev.init_backend(&Default::default()).unwrap();
    let mut failed = Vec::new();
    let s = run_tests(be.as_mut(), Some(rgml::OpKind::MulMat), &mut |r| {
        if let Outcome::Failed(why) = &r.outcome {
            failed.push(format!("{}: {why}", r.name));
        }
    })
    .unwrap();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    assert!(s.passed >= 100, "only {} MUL_MAT cases passed", s.passed);
}

/// Runs the suite on the first device's stream made with `params` and asserts that every case
/// it supports passes; returns the unsupported cases (op, name).
fn passes_every_supported_case(params: &str) -> Vec<(rgml::OpKind, String)> {
    let Some(dev) = first_device() else {
        return Vec::new();
    };
    let params = rgml::backend::BackendParams::parse(params).unwrap();
    let mut be = dev.init_backend(&params).unwrap();
    let mut failed = Vec::new();
    let mut unsupported = Vec::new();
    let s = run_tests(be.as_mut(), None, &mut |r| match &r.outcome {
        Outcome::Failed(why) => failed.push(format!("{}: {why}", r.name)),
        Outcome::Unsupported => unsupported.push((r.op, r.name.clone())),
        Outcome::Passed => {}
    })
    .unwrap();
    eprintln!(
        "{}: {} passed, {} failed, {} unsupported",
        dev.name(),
        s.passed,
        s.failed,
        s.unsupported
    );
    assert!(
        failed.is_empty(),
        "{} failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
    assert!(s.passed >= 50, "only {} cases passed", s.passed);
    unsupported
}

#[test]
fn wgpu_buffers_set_get_memset_copy() {
    let Some(dev) = first_device() else {
        return;
    };
    let bt = dev.buffer_type();
    assert!(!bt.is_host());
    assert!(bt.alignment() >= 4);
    let a = rgml::Buffer::alloc(&bt, 37).unwrap();
    let b = rgml::Buffer::alloc(&bt, 37).unwrap();
    let data: Vec<u8> = (0..37).collect();
    a.set(0, &data).unwrap();
    let mut out = vec![0u8; 37];
    a.get(0, &mut out).unwrap();
    assert_eq!(out, data);
    // Unaligned pieces.
    a.set(3, &[200, 201, 202]).unwrap();
    let mut piece = [0u8; 5];
    a.get(2, &mut piece).unwrap();
    assert_eq!(piece, [2, 200, 201, 202, 6]);
    a.memset(9, 7, 5).unwrap();
    let mut piece = [0u8; 7];
    a.get(8, &mut piece).unwrap();
    assert_eq!(piece, [8, 7, 7, 7, 7, 7, 14]);
    // Copy on the device (aligned) and through the host (unaligned).
    b.clear(0).unwrap();
    b.copy_from(4, &a, 8, 16).unwrap();
    b.copy_from(1, &a, 2, 2).unwrap();
    let mut all = vec![0u8; 37];
    b.get(0, &mut all).unwrap();
    a.get(0, &mut out).unwrap();
    assert_eq!(&all[4..20], &out[8..24]);
    assert_eq!(&all[1..3], &out[2..4]);
    assert_eq!(all[0], 0);
    assert_eq!(all[20..], vec![0u8; 17][..]);
    // Too large for one buffer: an error, not a panic.
    if bt.max_size() < usize::MAX {
        assert!(rgml::Buffer::alloc(&bt, bt.max_size() + 1).is_err());
    }
}
