//! The wgpu stream on the first adapter: `n_cb` command buffers give the CPU's results,
//! asynchronous compute with events, asynchronous set / get / copy round trips, trace spans for
//! command buffers and copies (directly and through the scheduler), and the optional
//! concurrency plan. Without an adapter every test skips, unless `RGML_REQUIRE_GPU=1`.

use rgml::alloc::alloc_ctx_tensors;
use rgml::backend::{Backend, BackendParams};
use rgml::trace::{Trace, TraceArg};
use rgml::{Context, DType, Device, DeviceRef, Graph, Scheduler, SchedulerOptions, TensorId};
use std::sync::Arc;
mod common;
use common::first_device;

fn backend(dev: &DeviceRef, params: &str) -> Box<dyn Backend> {
    dev.init_backend(&BackendParams::parse(params).unwrap())
        .unwrap()
}

/// Non-zero pseudo-random values in [-1, 1] (xorshift, so runs are reproducible).
fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let v = ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0;
            if v == 0.0 {
                0.5
            } else {
                v
            }
        })
        .collect()
}

struct Small {
    ctx: Context,
    graph: Graph,
    x: TensorId,
    w: TensorId,
    out: TensorId,
}

/// A small graph with independent branches: a matmul, two activations of it, their sum, a
/// norm and a product (8 nodes).
fn small() -> Small {
    let mut ctx = Context::new();
    let c = &mut ctx;
    let x = c.new_tensor(DType::F32, &[64, 8]).unwrap();
    c.set_input(x).unwrap();
    let w = c.new_tensor(DType::F32, &[64, 32]).unwrap();
    let h = c.mul_mat(w, x).unwrap();
    let a = c.silu(h).unwrap();
    let b = c.scale(h, 0.5).unwrap();
    let g = c.gelu(h).unwrap();
    let s = c.add(a, b).unwrap();
    let s2 = c.mul(s, g).unwrap();
    let d = c.rms_norm(s2, 1e-5).unwrap();
    let out = c.mul(d, s).unwrap();
    let graph = Graph::build(&mut ctx, &[out]).unwrap();
    Small {
        ctx,
        graph,
        x,
        w,
        out,
    }
}

/// Compute [`small`] on `be` with every tensor in one buffer of its device.
fn run_small(be: &mut dyn Backend) -> Vec<f32> {
    let mut s = small();
    let _buffer = alloc_ctx_tensors(&mut s.ctx, &be.default_buffer_type()).unwrap();
    s.ctx.tensor_set_f32(s.x, &random(64 * 8, 1)).unwrap();
    s.ctx.tensor_set_f32(s.w, &random(64 * 32, 2)).unwrap();
    be.graph_compute(&s.ctx, &s.graph).unwrap();
    s.ctx.tensor_get_f32(s.out).unwrap()
}

fn cpu_backend() -> Box<dyn Backend> {
    let dev = rgml_cpu::CpuDevice::new("CPU");
    dev.init_backend(&Default::default()).unwrap()
}

/// The GPU's exact arithmetic mirrors the AVX-512 build, and the CPU at hand may run AVX2 (or
/// the GPU the fast arithmetic): the results agree to rounding, not bit for bit.
fn assert_close(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= 1e-3 * (1.0 + y.abs()),
            "{what}: element {i}: {x} vs {y}"
        );
    }
}

#[test]
fn n_cb_1_2_3_match_the_cpu() {
    let Some(dev) = first_device() else {
        return;
    };
    let expected = run_small(cpu_backend().as_mut());
    assert!(expected.iter().any(|&v| v != 0.0));
    for n_cb in [1, 2, 3, 20] {
        let mut be = backend(&dev, &format!("n_cb={n_cb}"));
        let got = run_small(be.as_mut());
        assert_close(&got, &expected, &format!("n_cb={n_cb}"));
    }
    assert!(dev
        .init_backend(&BackendParams::parse("n_cb=0").unwrap())
        .is_err());
    assert!(dev
        .init_backend(&BackendParams::parse("n_cb=x").unwrap())
        .is_err());
    assert!(dev
        .init_backend(&BackendParams::parse("bogus=1").unwrap())
        .is_err());
}

#[test]
fn async_compute_with_events() {
    let Some(dev) = first_device() else {
        return;
    };
    let caps = dev.caps();
    assert!(caps.events && caps.async_io);
    let expected = run_small(cpu_backend().as_mut());
    let mut be = backend(&dev, "n_cb=2");
    let mut s = small();
    let _buffer = alloc_ctx_tensors(&mut s.ctx, &be.default_buffer_type()).unwrap();
    let as_bytes = |v: &[f32]| v.iter().flat_map(|f| f.to_le_bytes()).collect::<Vec<u8>>();
    be.set_tensor_async(&s.ctx, s.x, 0, &as_bytes(&random(64 * 8, 1)))
        .unwrap();
    be.set_tensor_async(&s.ctx, s.w, 0, &as_bytes(&random(64 * 32, 2)))
        .unwrap();
    let event = dev.event_new().unwrap();
    // Never recorded: reached at once.
    event.synchronize().unwrap();
    be.graph_compute_async(&s.ctx, &s.graph).unwrap();
    be.event_record(&event).unwrap();
    // Same device: a no-op for the stream.
    be.event_wait(&event).unwrap();
    event.synchronize().unwrap();
    // The event covered the compute: a plain read sees the result.
    assert_close(&s.ctx.tensor_get_f32(s.out).unwrap(), &expected, "async");
    be.synchronize().unwrap();

    // A second stream of the same device waits for the first one's event without blocking.
    let mut other = backend(&dev, "");
    be.graph_compute_async(&s.ctx, &s.graph).unwrap();
    be.event_record(&event).unwrap();
    other.event_wait(&event).unwrap();
    let mut out = vec![0u8; 32 * 8 * 4];
    other.get_tensor_async(&s.ctx, s.out, 0, &mut out).unwrap();
    be.synchronize().unwrap();
    let got: Vec<f32> = out
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_close(&got, &expected, "event between streams");

    // A CPU event cannot be recorded on the wgpu stream.
    let cpu_event = rgml_cpu::CpuDevice::new("CPU").event_new().unwrap();
    assert!(be.event_record(&cpu_event).is_err());
}

#[test]
fn async_set_get_copy_round_trips() {
    let Some(dev) = first_device() else {
        return;
    };
    let mut be = backend(&dev, "");
    let mut src_be = backend(&dev, "");
    let mut ctx = Context::new();
    let a = ctx.new_tensor(DType::F32, &[100]).unwrap();
    let b = ctx.new_tensor(DType::F32, &[100]).unwrap();
    let small = ctx.new_tensor(DType::F32, &[10]).unwrap();
    let _buffer = alloc_ctx_tensors(&mut ctx, &be.default_buffer_type()).unwrap();
    let data: Vec<u8> = random(100, 7)
        .iter()
        .flat_map(|f| f.to_le_bytes())
        .collect();
    assert!(data.iter().any(|&x| x != 0));

    be.set_tensor_async(&ctx, a, 0, &data).unwrap();
    let mut out = vec![0u8; 400];
    be.get_tensor_async(&ctx, a, 0, &mut out).unwrap();
    assert_eq!(out, data);

    // Queued copy on the device, read back through the other stream of the device.
    be.set_tensor_async(&ctx, b, 0, &[0u8; 400]).unwrap();
    assert!(be.cpy_tensor_async(src_be.as_mut(), &ctx, a, b).unwrap());
    let mut out = vec![0u8; 400];
    be.get_tensor_async(&ctx, b, 0, &mut out).unwrap();
    assert_eq!(out, data);

    // Partial and unaligned writes (the latter fall back to a blocking write).
    be.set_tensor_async(&ctx, b, 8, &[1, 2, 3, 4, 5, 6, 7, 8])
        .unwrap();
    be.set_tensor_async(&ctx, b, 21, &[9, 9, 9]).unwrap();
    let mut piece = [0u8; 20];
    be.get_tensor_async(&ctx, b, 6, &mut piece).unwrap();
    assert_eq!(&piece[..2], &data[6..8]);
    assert_eq!(&piece[2..10], &[1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(&piece[10..15], &data[16..21]);
    assert_eq!(&piece[15..18], &[9, 9, 9]);
    assert_eq!(&piece[18..], &data[24..26]);
    // Out of bounds: an error, not a panic.
    assert!(be.set_tensor_async(&ctx, small, 36, &[0; 8]).is_err());
    // Different sizes: not copied here.
    assert!(!be
        .cpy_tensor_async(src_be.as_mut(), &ctx, a, small)
        .unwrap());
    // A tensor in host memory: not copied here either.
    let mut host = Context::new();
    let h = host.new_tensor(DType::F32, &[100]).unwrap();
    let hb = host.new_tensor(DType::F32, &[100]).unwrap();
    let cpu = rgml_cpu::CpuDevice::new("CPU");
    let _hbuf = alloc_ctx_tensors(&mut host, &cpu.buffer_type()).unwrap();
    assert!(!be.cpy_tensor_async(src_be.as_mut(), &host, h, hb).unwrap());
    be.synchronize().unwrap();
}

#[test]
fn trace_has_command_buffer_and_copy_spans() {
    let Some(dev) = first_device() else {
        return;
    };
    let trace = Arc::new(Trace::new());
    let mut be = backend(&dev, "n_cb=3");
    be.set_trace(Some((trace.clone(), trace.track("Vulkan0"))));
    let mut s = small();
    let _buffer = alloc_ctx_tensors(&mut s.ctx, &be.default_buffer_type()).unwrap();
    let bytes: Vec<u8> = random(64 * 8, 1)
        .iter()
        .flat_map(|f| f.to_le_bytes())
        .collect();
    be.set_tensor_async(&s.ctx, s.x, 0, &bytes).unwrap();
    be.graph_compute(&s.ctx, &s.graph).unwrap();
    let spans = trace.spans();
    let cbs: Vec<_> = spans
        .iter()
        .filter(|s| s.category == "command_buffer")
        .collect();
    assert_eq!(cbs.len(), 3, "{spans:?}");
    let dispatches: u64 = cbs
        .iter()
        .map(|s| match s.args.iter().find(|(k, _)| k == "dispatches") {
            Some((_, TraceArg::Int(n))) => *n,
            _ => 0,
        })
        .sum();
    assert_eq!(dispatches, s.graph.n_nodes() as u64);
    assert!(cbs[0].name.starts_with("cb 0 nodes 0.."));
    // Each dispatch timed on the GPU, where the adapter can: in order, not overlapping.
    let kernels: Vec<_> = spans.iter().filter(|s| s.category == "kernel").collect();
    let timed = dev
        .downcast_ref::<rgml_wgpu::WgpuDevice>()
        .is_some_and(|d| d.times_kernels());
    if timed {
        assert_eq!(kernels.len() as u64, dispatches, "{kernels:?}");
        assert!(kernels
            .iter()
            .all(|k| k.track == trace.track("Vulkan0 kernels")));
        assert!(kernels
            .iter()
            .all(|k| k.name.contains(' ') && k.duration_us >= 0.0));
        for w in kernels.windows(2) {
            assert!(
                w[1].start_us + 1e-3 >= w[0].start_us + w[0].duration_us,
                "{w:?}"
            );
        }
    } else {
        assert!(kernels.is_empty(), "{kernels:?}");
    }
    let copy = spans
        .iter()
        .find(|s| s.category == "copy")
        .expect("a copy span");
    assert!(copy
        .args
        .contains(&("bytes".to_string(), TraceArg::Int(64 * 8 * 4))));
    be.set_trace(None);
    be.graph_compute(&s.ctx, &s.graph).unwrap();
    assert_eq!(
        trace.spans().len(),
        spans.len(),
        "no spans after set_trace(None)"
    );
}

/// Through the scheduler (wgpu first, CPU last): its trace shows the GPU's command buffers,
/// and with the concurrency plan the results are unchanged.
#[test]
fn scheduler_trace_and_concurrency_plan() {
    let Some(dev) = first_device() else {
        return;
    };
    let expected = run_small(cpu_backend().as_mut());
    for params in ["n_cb=2", "n_cb=2,concurrency=1"] {
        let mut s = small();
        let cpu = rgml_cpu::CpuDevice::new("CPU");
        let _weights = {
            // The weight lives in host memory; the input comes from the caller.
            let buf = rgml::Buffer::alloc(&cpu.buffer_type(), 64 * 32 * 4 + 64).unwrap();
            let mut talloc = rgml::alloc::TensorAllocator::new(buf.clone());
            talloc.alloc(&mut s.ctx, s.w).unwrap();
            buf
        };
        s.ctx.tensor_set_f32(s.w, &random(64 * 32, 2)).unwrap();
        let backends = vec![backend(&dev, params), cpu_backend()];
        let mut sched = Scheduler::new(
            backends,
            SchedulerOptions {
                op_offload: true,
                ..Default::default()
            },
        )
        .unwrap();
        let trace = Arc::new(Trace::new());
        sched.set_trace(trace.clone());
        // Put every node on the GPU.
        for &n in s.graph.nodes() {
            sched.set_tensor_backend(n, 0).unwrap();
        }
        sched.alloc_graph(&mut s.ctx, &s.graph).unwrap();
        if params.contains("concurrency=1") {
            // The allocator got the GPU's levels: nodes of one level never share memory.
            let plan = rgml::alloc::Concurrency::from_dependencies(&s.ctx, &s.graph).unwrap();
            assert!(
                plan.n_groups() < s.graph.n_nodes(),
                "some nodes share a level"
            );
            let range = |id: TensorId| {
                let d = s.ctx[id].data.as_ref().unwrap();
                (d.buffer.id(), d.offset, d.offset + s.ctx[id].nbytes())
            };
            for g in plan.groups() {
                for a in g.clone() {
                    for b in g.clone().filter(|&b| b != a) {
                        let (x, y) = (range(s.graph.nodes()[a]), range(s.graph.nodes()[b]));
                        assert!(
                            x.0 != y.0 || x.2 <= y.1 || y.2 <= x.1,
                            "nodes {a} and {b} of one level overlap"
                        );
                    }
                }
            }
        }
        s.ctx.tensor_set_f32(s.x, &random(64 * 8, 1)).unwrap();
        sched.graph_compute(&mut s.ctx, &s.graph).unwrap();
        assert_close(&s.ctx.tensor_get_f32(s.out).unwrap(), &expected, params);
        let cbs = trace
            .spans()
            .into_iter()
            .filter(|s| s.category == "command_buffer")
            .count();
        assert!(cbs >= 2, "{params}: {cbs} command-buffer spans");
    }
}

/// Timing of a 300-node graph for several `n_cb`, with heavy (matmul) and light (64-element)
/// nodes (run with `--ignored --nocapture`; `RGML_WGPU_ENCODE_THREADS=1` encodes on threads).
#[test]
#[ignore]
fn bench_n_cb() {
    let Some(dev) = first_device() else {
        return;
    };
    for (label, n) in [("heavy", 256), ("light", 8)] {
        for round in 0..2 {
            for n_cb in [1, 2, 4, 8] {
                let mut be = backend(&dev, &format!("n_cb={n_cb}"));
                let mut ctx = Context::new();
                let x = ctx.new_tensor(DType::F32, &[n, 16]).unwrap();
                let w = ctx.new_tensor(DType::F32, &[n, n]).unwrap();
                let mut h = x;
                for _ in 0..100 {
                    let m = ctx.mul_mat(w, h).unwrap();
                    let s = ctx.silu(m).unwrap();
                    h = ctx.add(s, h).unwrap();
                }
                let graph = Graph::build(&mut ctx, &[h]).unwrap();
                let _b = alloc_ctx_tensors(&mut ctx, &be.default_buffer_type()).unwrap();
                ctx.tensor_set_f32(x, &random(n * 16, 1)).unwrap();
                ctx.tensor_set_f32(w, &random(n * n, 2)).unwrap();
                be.graph_compute(&ctx, &graph).unwrap();
                let t = std::time::Instant::now();
                let reps = 20;
                for _ in 0..reps {
                    be.graph_compute(&ctx, &graph).unwrap();
                }
                eprintln!(
                    "{label} round {round} n_cb={n_cb}: {} nodes, {:.2} ms per graph",
                    graph.n_nodes(),
                    t.elapsed().as_secs_f64() * 1e3 / reps as f64
                );
            }
        }
    }
}
