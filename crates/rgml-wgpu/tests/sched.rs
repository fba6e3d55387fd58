//! The scheduler with the GPU: a net whose weights live on the GPU, then the CPU, then the GPU
//! again runs as three splits with copies both ways, and its output equals the CPU alone's bit
//! for bit (the GPU kernels reproduce ggml-cpu's AVX-512 arithmetic; the CPU is asked for the
//! same), for several micro-batches and with pipeline copies (`n_copies = 2`).
//!
//! Without an adapter the test skips, unless `RGML_REQUIRE_GPU=1`.

use rgml::alloc::TensorAllocator;
use rgml::backend::{Backend, Buffer, BufferUsage, DeviceRef};
use rgml::{Context, DType, Graph, Scheduler, SchedulerOptions, TensorId};
use std::sync::Arc;
mod common;
use common::first_device as gpu;

fn backend(dev: &DeviceRef) -> Box<dyn Backend> {
    dev.init_backend(&Default::default()).unwrap()
}

const N: usize = 64;

/// Weights of `dtype` `[N, N]` in a weights buffer of `dev`, from a deterministic pattern.
fn weight(ctx: &mut Context, dev: &DeviceRef, dtype: DType, seed: f32) -> (TensorId, Arc<Buffer>) {
    let id = ctx.new_tensor(dtype, &[N, N]).unwrap();
    let buf = Buffer::alloc(&dev.buffer_type(), ctx[id].nbytes() + 256).unwrap();
    buf.set_usage(BufferUsage::Weights);
    let mut ta = TensorAllocator::new(buf.clone());
    ta.alloc(ctx, id).unwrap();
    let v: Vec<f32> = (0..N * N)
        .map(|i| ((i as f32 + 1.0) * 0.37 + seed).sin() * 0.2)
        .collect();
    let mut bytes = vec![0u8; dtype.row_bytes(N * N).unwrap()];
    rgml::quant::quantize_row(dtype, &v, &mut bytes).unwrap();
    ctx.tensor_set(id, 0, &bytes).unwrap();
    (id, buf)
}

struct Net {
    ctx: Context,
    graph: Graph,
    x: TensorId,
    h0: TensorId,
    h1: TensorId,
    h2: TensorId,
    out: TensorId,
    _weights: Vec<Arc<Buffer>>,
}

/// `x [N, 3]` → `h0 = w0·x` (Q4_1, on `d0`) → rms_norm → silu → `h1 = w1·a` (Q8_0, on `d1`) →
/// silu → `h2 = w2·b` (F32, on `d2`) → `out = h2 + x`.
fn net(d0: &DeviceRef, d1: &DeviceRef, d2: &DeviceRef) -> Net {
    let mut ctx = Context::new();
    let (w0, b0) = weight(&mut ctx, d0, DType::Q4_1, 0.1);
    let (w1, b1) = weight(&mut ctx, d1, DType::Q8_0, 0.5);
    let (w2, b2) = weight(&mut ctx, d2, DType::F32, 0.9);
    let x = ctx.new_tensor(DType::F32, &[N, 3]).unwrap();
    ctx.set_input(x).unwrap();
    let h0 = ctx.mul_mat(w0, x).unwrap();
    let n0 = ctx.rms_norm(h0, 1e-5).unwrap();
    let a = ctx.silu(n0).unwrap();
    let h1 = ctx.mul_mat(w1, a).unwrap();
    let b = ctx.silu(h1).unwrap();
    let h2 = ctx.mul_mat(w2, b).unwrap();
    let out = ctx.add(h2, x).unwrap();
    let graph = Graph::build(&mut ctx, &[out]).unwrap();
    Net {
        ctx,
        graph,
        x,
        h0,
        h1,
        h2,
        out,
        _weights: vec![b0, b1, b2],
    }
}

fn input(step: usize) -> Vec<f32> {
    (0..N * 3)
        .map(|i| ((i * 7 + step * 13) % 29) as f32 * 0.1 - 1.4)
        .collect()
}

fn run(sched: &mut Scheduler, n: &mut Net, steps: usize) -> Vec<Vec<u32>> {
    (0..steps)
        .map(|step| {
            sched.alloc_graph(&mut n.ctx, &n.graph).unwrap();
            n.ctx.tensor_set_f32(n.x, &input(step)).unwrap();
            sched.graph_compute(&mut n.ctx, &n.graph).unwrap();
            let out = n.ctx.tensor_get_f32(n.out).unwrap();
            out.iter().map(|v| v.to_bits()).collect()
        })
        .collect()
}

#[test]
fn gpu_cpu_gpu_splits_match_the_cpu_alone() {
    let Some(gpu) = gpu() else {
        return;
    };
    // The GPU kernels mirror ggml-cpu's AVX-512 build; so must the CPU (on any CPU).
    let options = rgml_cpu::CpuOptions {
        isa: Some(rgml_cpu::IsaChoice::Avx512),
        ..Default::default()
    };
    let cpu: DeviceRef = rgml_cpu::CpuDevice::with_options("CPU", &options);
    let mut reference_net = net(&cpu, &cpu, &cpu);
    let mut reference_sched = Scheduler::new(
        vec![backend(&cpu)],
        SchedulerOptions {
            op_offload: false,
            ..Default::default()
        },
    )
    .unwrap();
    let want = run(&mut reference_sched, &mut reference_net, 3);

    for n_copies in [1, 2] {
        let mut n = net(&gpu, &cpu, &gpu);
        let mut s = Scheduler::new(
            vec![backend(&gpu), backend(&cpu)],
            SchedulerOptions {
                n_copies,
                op_offload: false,
                ..Default::default()
            },
        )
        .unwrap();
        let got = run(&mut s, &mut n, 3);
        assert_eq!(s.tensor_backend(n.h0), Some(0), "h0 runs with its weights");
        assert_eq!(s.tensor_backend(n.h1), Some(1));
        assert_eq!(s.tensor_backend(n.h2), Some(0));
        assert_eq!(s.n_splits(), 3, "GPU, CPU, GPU");
        assert!(
            s.copy_stats().total_count() > 0,
            "activations cross between the devices"
        );
        assert_eq!(got, want, "n_copies = {n_copies}");
    }
}
