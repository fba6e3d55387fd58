//! The CPU backend reuses the job it prepared for a graph only while nothing it was built from
//! changed: cached runs give the first run's bits, new input values give new results, and
//! re-placed tensors, another context, changed op parameters or shapes, or another node list
//! make it prepare again (checked against a fresh backend, which has no cached job).

mod common;

use common::Net;
use rgml::{Backend, Context, DType, Graph, Op, TensorId};
use rgml_cpu::{CpuBackend, CpuDevice};

fn backend(threads: usize, asynchronous: bool) -> CpuBackend {
    CpuBackend::with_mode(CpuDevice::new("CPU"), threads, asynchronous).unwrap()
}

/// Every (threads, asynchronous) combination tested.
const MODES: [(usize, bool); 4] = [(1, false), (2, false), (1, true), (2, true)];

/// Zero the outputs, compute with `be`, and return them; then check a fresh backend computes
/// the same bits.
fn compute_checked(
    be: &mut CpuBackend,
    ctx: &Context,
    graph: &Graph,
    outs: &[TensorId],
) -> Vec<Vec<u8>> {
    let zero = |ctx: &Context| {
        for &o in outs {
            let n = ctx[o].nbytes();
            ctx.tensor_memset(o, 0, 0, n).unwrap();
        }
    };
    let read = |ctx: &Context| -> Vec<Vec<u8>> {
        outs.iter().map(|&o| ctx.tensor_bytes(o).unwrap()).collect()
    };
    zero(ctx);
    be.graph_compute(ctx, graph).unwrap();
    let got = read(ctx);
    zero(ctx);
    backend(1, false).graph_compute(ctx, graph).unwrap();
    assert_eq!(got, read(ctx), "cached backend differs from a fresh one");
    got
}

#[test]
fn cached_runs_repeat_the_bits_and_follow_new_inputs() {
    for (threads, asynchronous) in MODES {
        let net = Net::new(0);
        let mut be = backend(threads, asynchronous);
        let first = compute_checked(&mut be, &net.ctx, &net.graph, &net.outs);
        for _ in 0..3 {
            be.graph_compute(&net.ctx, &net.graph).unwrap();
            assert_eq!(net.outputs(), first);
        }
        // New input values: the cached job must still run every node.
        common::set(&net.ctx, net.x, 77);
        let second = compute_checked(&mut be, &net.ctx, &net.graph, &net.outs);
        assert_ne!(second, first);
        net.fill(1);
        assert_eq!(
            compute_checked(&mut be, &net.ctx, &net.graph, &net.outs),
            first
        );
    }
}

#[test]
fn re_placed_tensors_rebuild_the_job() {
    for (threads, asynchronous) in MODES {
        // Tensors from byte 256 of their buffer, then from byte 0 of the same buffer.
        let mut net = Net::new(256);
        let mut be = backend(threads, asynchronous);
        let first = compute_checked(&mut be, &net.ctx, &net.graph, &net.outs);
        let buf = net.ctx[net.x].data.as_ref().unwrap().buffer.clone();
        common::place(&mut net.ctx, &buf, 0);
        net.fill(1);
        assert_eq!(
            compute_checked(&mut be, &net.ctx, &net.graph, &net.outs),
            first
        );
        // In a new buffer.
        let other = common::buffer(common::bytes_needed(&net.ctx, 128));
        common::place(&mut net.ctx, &other, 128);
        net.fill(1);
        assert_eq!(
            compute_checked(&mut be, &net.ctx, &net.graph, &net.outs),
            first
        );
        // Another context with the same tensor ids, in its own buffer.
        let twin = Net::new(0);
        assert_eq!(
            compute_checked(&mut be, &twin.ctx, &twin.graph, &twin.outs),
            first
        );
        // And back to the first context: its job again.
        assert_eq!(
            compute_checked(&mut be, &net.ctx, &net.graph, &net.outs),
            first
        );
    }
}

#[test]
fn changed_op_parameters_rebuild_the_job() {
    for (threads, asynchronous) in MODES {
        let mut net = Net::new(0);
        let mut be = backend(threads, asynchronous);
        let first = compute_checked(&mut be, &net.ctx, &net.graph, &net.outs);
        net.ctx.get_mut(net.softmax).unwrap().op = Op::SoftMax {
            scale: 0.5,
            max_bias: 0.0,
            sinks: false,
        };
        let second = compute_checked(&mut be, &net.ctx, &net.graph, &net.outs);
        assert_ne!(second[0], first[0]);
    }
}

/// `x * scale + bias` with scale +0.0, then -0.0: equal as floats, different results.
#[test]
fn a_parameter_that_differs_only_in_its_sign_bit_rebuilds_the_job() {
    for (threads, asynchronous) in MODES {
        let mut ctx = Context::new();
        let x = ctx.new_tensor(DType::F32, &[16, 2]).unwrap();
        let y = ctx.scale_bias(x, 0.0, -0.0).unwrap();
        let graph = Graph::build(&mut ctx, &[y]).unwrap();
        let buf = common::buffer(common::bytes_needed(&ctx, 0));
        common::place(&mut ctx, &buf, 0);
        common::set(&ctx, x, 5);
        let mut be = backend(threads, asynchronous);
        let plus = compute_checked(&mut be, &ctx, &graph, &[y]);
        ctx.get_mut(y).unwrap().op = Op::Scale {
            scale: -0.0,
            bias: -0.0,
        };
        let minus = compute_checked(&mut be, &ctx, &graph, &[y]);
        assert_ne!(
            plus, minus,
            "the sign of zero should differ for positive inputs"
        );
    }
}

/// Fewer rows: the rows no longer in the tensors must stay untouched.
#[test]
fn changed_shapes_rebuild_the_job() {
    for (threads, asynchronous) in MODES {
        let mut ctx = Context::new();
        let x = ctx.new_tensor(DType::F32, &[16, 4]).unwrap();
        let y = ctx.scale(x, 2.0).unwrap();
        let graph = Graph::build(&mut ctx, &[y]).unwrap();
        let buf = common::buffer(common::bytes_needed(&ctx, 0));
        common::place(&mut ctx, &buf, 0);
        common::set(&ctx, x, 9);
        let mut be = backend(threads, asynchronous);
        compute_checked(&mut be, &ctx, &graph, &[y]);
        let sentinel = vec![0xA5u8; ctx[y].nbytes()];
        ctx.tensor_set(y, 0, &sentinel).unwrap();
        // Only `ne` changes (strides of dims 2 and 3 do not matter with one row of them).
        for id in [x, y] {
            ctx.get_mut(id).unwrap().ne[1] = 2;
        }
        be.graph_compute(&ctx, &graph).unwrap();
        let raw = |id: TensorId| {
            let d = ctx[id].data.as_ref().unwrap();
            let mut b = vec![0u8; 4 * 16 * 4];
            d.buffer.get(d.offset, &mut b).unwrap();
            b
        };
        let f32s = |b: &[u8]| -> Vec<f32> {
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        };
        let (xs, ys) = (f32s(&raw(x)), raw(y));
        let (head, tail) = ys.split_at(2 * 16 * 4);
        for (a, b) in xs.iter().zip(f32s(head)) {
            assert_eq!(b, 2.0 * a);
        }
        assert_eq!(
            tail,
            &sentinel[..tail.len()],
            "rows beyond the new shape were written"
        );
    }
}

/// Two graphs in turn (the full one and a prefix of it) each get their own job, and a graph
/// that lost its last node does not run it.
#[test]
fn graphs_in_turn_keep_their_own_jobs() {
    for (threads, asynchronous) in MODES {
        let net = Net::new(0);
        let mut be = backend(threads, asynchronous);
        let full = compute_checked(&mut be, &net.ctx, &net.graph, &net.outs);
        let n = net.graph.n_nodes();
        let last = net.graph.nodes()[n - 1];
        let prefix = net.graph.view(0..n - 1);
        for _ in 0..3 {
            let bytes = net.ctx[last].nbytes();
            net.ctx.tensor_memset(last, 0, 0, bytes).unwrap();
            be.graph_compute(&net.ctx, &prefix).unwrap();
            assert!(net.ctx.tensor_bytes(last).unwrap().iter().all(|&b| b == 0));
            assert_eq!(
                compute_checked(&mut be, &net.ctx, &net.graph, &net.outs),
                full
            );
        }
    }
}

/// A node that reads another node than before (same shapes, same node list) rebuilds.
#[test]
fn a_node_reading_another_node_rebuilds_the_job() {
    for (threads, asynchronous) in MODES {
        let mut ctx = Context::new();
        let x = ctx.new_tensor(DType::F32, &[16, 2]).unwrap();
        let a = ctx.scale(x, 2.0).unwrap();
        let b = ctx.scale(x, 3.0).unwrap();
        let c = ctx.add(a, x).unwrap();
        let graph = Graph::build(&mut ctx, &[b, c]).unwrap();
        let buf = common::buffer(common::bytes_needed(&ctx, 0));
        common::place(&mut ctx, &buf, 0);
        common::set(&ctx, x, 3);
        let mut be = backend(threads, asynchronous);
        compute_checked(&mut be, &ctx, &graph, &[c]);
        ctx.get_mut(c).unwrap().src[0] = b;
        compute_checked(&mut be, &ctx, &graph, &[c]);
        let xs = ctx.tensor_get_f32(x).unwrap();
        for (x, c) in xs.iter().zip(ctx.tensor_get_f32(c).unwrap()) {
            assert_eq!(c, 3.0 * x + x);
        }
    }
}

#[test]
fn explicit_plans_compute_the_graph_and_go_stale_when_metadata_changes() {
    for (threads, asynchronous) in MODES {
        let mut net = Net::new(0);
        let mut be = backend(threads, asynchronous);
        let first = compute_checked(&mut be, &net.ctx, &net.graph, &net.outs);
        let plan = be.graph_plan_create(&net.ctx, &net.graph).unwrap();
        assert!(plan.is_for(&net.ctx, &net.graph));
        for o in &net.outs {
            let n = net.ctx[*o].nbytes();
            net.ctx.tensor_memset(*o, 0, 0, n).unwrap();
        }
        be.graph_plan_compute_async(&net.ctx, &plan).unwrap();
        be.synchronize().unwrap();
        assert_eq!(net.outputs(), first);
        // New values are not metadata: the plan stays current and reads them.
        common::set(&net.ctx, net.x, 77);
        assert!(plan.is_current(&net.ctx));
        // A copy of the context is another context.
        let copy = net.ctx.clone();
        assert!(matches!(
            be.graph_plan_compute_async(&copy, &plan),
            Err(rgml::Error::StalePlan { .. })
        ));
        // Any mutable access to a tensor makes the plan stale.
        net.ctx.get_mut(net.softmax).unwrap().name = "renamed".into();
        assert!(!plan.is_current(&net.ctx));
        assert!(matches!(
            be.graph_plan_compute_async(&net.ctx, &plan),
            Err(rgml::Error::StalePlan { .. })
        ));
    }
}
