//! Graph comparison between two backends finds a planted wrong kernel at the right node:
//! [`rgml_cpu::testing::PerturbBackend`] scales one op's output, and
//! [`rgml::compare::compare_graph_backend`] must name exactly that node, with every node before
//! it matching exactly.

use rgml::alloc::alloc_ctx_tensors;
use rgml::compare::{compare_graph_backend, graph_copy, NodeComparison};
use rgml::{Backend, Context, DType, DeviceRef, Graph, OpKind, TensorId};
use rgml_cpu::testing::{PerturbBackend, PerturbDevice};
use rgml_cpu::{CpuBackend, CpuDevice};

struct Built {
    ctx: Context,
    graph: Graph,
    silu: TensorId,
    mm: TensorId,
}

/// a, b: leafs [8, 4] with data; nodes: add, mul, silu, reshape (view), scale, mul_mat, add.
fn build() -> Built {
    let mut ctx = Context::new();
    let a = ctx.new_tensor(DType::F32, &[8, 4]).unwrap();
    let b = ctx.new_tensor(DType::F32, &[8, 4]).unwrap();
    let w = ctx.new_tensor(DType::F32, &[8, 8]).unwrap();
    ctx.set_name(a, "a").unwrap();
    ctx.set_name(b, "b").unwrap();
    ctx.set_name(w, "w").unwrap();
    let cpu: DeviceRef = CpuDevice::new("CPU");
    let _leafs = alloc_ctx_tensors(&mut ctx, &cpu.buffer_type()).unwrap();
    let va: Vec<f32> = (0..32).map(|i| (i as f32 * 0.37).sin()).collect();
    let vb: Vec<f32> = (0..32).map(|i| (i as f32 * 0.11).cos()).collect();
    let vw: Vec<f32> = (0..64).map(|i| ((i * 7 % 13) as f32 - 6.0) / 8.0).collect();
    ctx.tensor_set_f32(a, &va).unwrap();
    ctx.tensor_set_f32(b, &vb).unwrap();
    ctx.tensor_set_f32(w, &vw).unwrap();

    let s = ctx.add(a, b).unwrap();
    ctx.set_name(s, "sum").unwrap();
    let m = ctx.mul(s, a).unwrap();
    ctx.set_name(m, "prod").unwrap();
    let silu = ctx.silu(m).unwrap();
    ctx.set_name(silu, "act").unwrap();
    let r = ctx.reshape(silu, &[8, 2, 2]).unwrap();
    ctx.set_name(r, "act_reshaped").unwrap();
    let r = ctx.reshape(r, &[8, 4]).unwrap();
    let sc = ctx.scale(r, 2.0).unwrap();
    ctx.set_name(sc, "scaled").unwrap();
    let mm = ctx.mul_mat(w, sc).unwrap();
    ctx.set_name(mm, "proj").unwrap();
    let out = ctx.add(mm, s).unwrap();
    ctx.set_name(out, "out").unwrap();
    let graph = Graph::build(&mut ctx, &[out]).unwrap();
    Built {
        ctx,
        graph,
        silu,
        mm,
    }
}

fn run(
    built: &Built,
    b1: &mut dyn Backend,
    b2: &mut dyn Backend,
) -> (rgml::compare::CompareReport, Vec<NodeComparison>) {
    let mut seen = Vec::new();
    let report = compare_graph_backend(&built.ctx, &built.graph, b1, b2, 1e-7, &mut |c| {
        seen.push(c.clone());
        true
    })
    .unwrap();
    (report, seen)
}

fn perturbed(op: OpKind) -> PerturbBackend {
    PerturbBackend::new(CpuBackend::new(1).unwrap(), op)
}

#[test]
fn clean_backends_do_not_diverge() {
    let built = build();
    let mut b1 = CpuBackend::with_device(CpuDevice::new("CPU0"), 1).unwrap();
    let mut b2 = CpuBackend::with_device(CpuDevice::new("CPU1"), 2).unwrap();
    let (report, seen) = run(&built, &mut b1, &mut b2);
    assert_eq!(report.n_nodes_compared, built.graph.n_nodes());
    assert_eq!(report.first_divergent, None);
    assert_eq!(report.n_divergent, 0);
    assert_eq!(seen.len(), built.graph.n_nodes());
    for (i, c) in seen.iter().enumerate() {
        assert_eq!(c.index, i);
        assert_eq!(c.id, built.graph.nodes()[i]);
        assert_eq!(c.nmse, 0.0, "{c:?}");
        assert!(!c.nonfinite_mismatch);
    }
}

#[test]
fn planted_silu_error_is_found_at_its_node() {
    let built = build();
    let index = built
        .graph
        .nodes()
        .iter()
        .position(|&n| n == built.silu)
        .unwrap();
    let mut b1 = CpuBackend::new(1).unwrap();
    let mut b2 = perturbed(OpKind::Silu);
    let (report, seen) = run(&built, &mut b1, &mut b2);
    let first = report.first_divergent.expect("a divergent node");
    assert_eq!(first.index, index);
    assert_eq!(first.name, "act");
    assert_eq!(first.op, OpKind::Silu);
    assert!(first.nmse > 1e-5, "{first:?}");
    assert!(first.max_abs > 0.0);
    for c in &seen[..index] {
        assert_eq!(c.nmse, 0.0, "node before the planted error: {c:?}");
        assert_eq!(c.max_abs, 0.0);
    }
    // The reference value is copied into backend 2 after each node: nothing after diverges,
    // including the views of the perturbed node.
    for c in &seen[index + 1..] {
        assert_eq!(c.nmse, 0.0, "node after the planted error: {c:?}");
    }
    assert_eq!(report.n_divergent, 1);
    assert_eq!(report.n_nodes_compared, built.graph.n_nodes());
}

#[test]
fn planted_mul_mat_error_is_found_and_callback_can_stop() {
    let built = build();
    let index = built
        .graph
        .nodes()
        .iter()
        .position(|&n| n == built.mm)
        .unwrap();
    let mut b1 = CpuBackend::new(1).unwrap();
    let mut b2 = perturbed(OpKind::MulMat);
    let mut calls = 0;
    let report =
        compare_graph_backend(&built.ctx, &built.graph, &mut b1, &mut b2, 1e-7, &mut |c| {
            calls += 1;
            !c.diverges(1e-7)
        })
        .unwrap();
    let first = report.first_divergent.expect("a divergent node");
    assert_eq!((first.index, first.name.as_str()), (index, "proj"));
    assert_eq!(first.op, OpKind::MulMat);
    assert_eq!(
        calls,
        index + 1,
        "the callback's false stops the comparison"
    );
    assert_eq!(report.n_nodes_compared, index + 1);
}

#[test]
fn perturbing_device_backend_diverges() {
    // The registry-facing device gives the same perturbing backend (as `rgml compare` uses it).
    let built = build();
    let dev = PerturbDevice::new(OpKind::Silu);
    let mut b2 = rgml::Device::init_backend(dev.as_ref(), &Default::default()).unwrap();
    assert_eq!(b2.device().name(), "PerturbCPU");
    let mut b1 = CpuBackend::new(1).unwrap();
    let (report, _) = run(&built, &mut b1, b2.as_mut());
    assert_eq!(report.first_divergent.map(|c| c.op), Some(OpKind::Silu));
}

#[test]
fn graph_copy_copies_leaf_bytes_into_new_storage() {
    let built = build();
    let cpu1: DeviceRef = CpuDevice::new("CPU1");
    let copy = graph_copy(&built.ctx, &built.graph, &cpu1.buffer_type()).unwrap();
    assert_eq!(copy.graph.n_nodes(), built.graph.n_nodes());
    for &leaf in built.graph.leafs() {
        let dst = copy.map[&leaf];
        assert_eq!(
            copy.ctx.tensor_bytes(dst).unwrap(),
            built.ctx.tensor_bytes(leaf).unwrap()
        );
        let data = copy.ctx[dst].data.as_ref().unwrap();
        assert_eq!(data.buffer.buffer_type().name(), "CPU1");
    }
    for &node in copy.graph.nodes() {
        assert!(copy.ctx[node].data.is_some(), "every node has storage");
    }
}

/// A CPU backend that claims not to support SILU.
struct NoSilu(CpuBackend);

impl Backend for NoSilu {
    fn name(&self) -> &str {
        "NoSilu"
    }
    fn device(&self) -> DeviceRef {
        self.0.device()
    }
    fn graph_compute_async(&mut self, ctx: &Context, graph: &Graph) -> rgml::Result<()> {
        self.0.graph_compute(ctx, graph)
    }
    fn supports_op(&self, ctx: &Context, id: TensorId) -> bool {
        ctx[id].op.kind() != OpKind::Silu && self.0.supports_op(ctx, id)
    }
}

#[test]
fn unsupported_node_is_an_error_naming_it() {
    let built = build();
    let mut b1 = CpuBackend::new(1).unwrap();
    let mut b2 = NoSilu(CpuBackend::new(1).unwrap());
    let err = compare_graph_backend(
        &built.ctx,
        &built.graph,
        &mut b1,
        &mut b2,
        1e-7,
        &mut |_| true,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("NoSilu") && err.contains("'act'") && err.contains("SILU"),
        "{err}"
    );
}
