//! Graph comparison on the demo model's prompt graph (what `rgml compare` runs) finds a planted
//! wrong kernel at the right node: against rgml-cpu's test-only `PerturbCPU` backend (cargo
//! feature `testing`), which scales every SWIGLU output by 1.01, the first divergent node is
//! the first layer's `ffn_swiglu-0`, and only SWIGLU nodes diverge (the reference is copied
//! back after every node).

mod common;

use rgml::compare::compare_graph_backend;
use rgml::{Device, OpKind};
use rgml_cpu::testing::PerturbDevice;
use rgml_cpu::CpuDevice;
use rgml_llm::{EncodeOptions, Session, SessionOptions};

#[test]
fn planted_wrong_kernel_is_found_at_its_first_node() {
    let model = common::demo_model();
    let tokens = model.tokenizer.encode("Hello", EncodeOptions::prompt());
    assert!(!tokens.is_empty());
    let mut session = Session::new(
        model.clone(),
        &SessionOptions {
            n_ctx: tokens.len(),
            n_ubatch: tokens.len(),
            n_threads: Some(2),
            device_params: Vec::new(),
            ..Default::default()
        },
    )
    .unwrap();
    let (ctx, graph) = session.prompt_graph(&tokens).unwrap();

    let params = rgml::backend::BackendParams::parse("n_threads=2").unwrap();
    let mut reference = CpuDevice::new("CPU").init_backend(&params).unwrap();
    let mut perturbed = PerturbDevice::new(OpKind::Swiglu)
        .init_backend(&params)
        .unwrap();
    // `rgml compare`'s default tolerance.
    let tol = 1e-5;
    let mut divergent_ops = Vec::new();
    let report = compare_graph_backend(
        ctx,
        &graph,
        reference.as_mut(),
        perturbed.as_mut(),
        tol,
        &mut |c| {
            if c.diverges(tol) {
                divergent_ops.push((c.name.clone(), c.op));
            }
            true
        },
    )
    .unwrap();

    let first = report.first_divergent.expect("the perturbed op diverges");
    assert_eq!(
        (first.name.as_str(), first.op),
        ("ffn_swiglu-0", OpKind::Swiglu)
    );
    assert!(first.nmse > tol);
    // One divergent node per layer, all SWIGLU.
    assert_eq!(report.n_divergent, model.config.n_layer);
    assert_eq!(divergent_ops.len(), report.n_divergent);
    assert!(
        divergent_ops.iter().all(|(_, op)| *op == OpKind::Swiglu),
        "{divergent_ops:?}"
    );
}
