//! The scheduler over real CPU devices: `CPU0` and `CPU1` (each reading only its own memory)
//! and the plain `CPU` device last. Expectations are worked out by hand in the comments.

use rgml::alloc::TensorAllocator;
use rgml::backend::{Backend, Buffer, BufferUsage, DeviceRef};
use rgml::sched::SplitInfo;
use rgml::{Context, DType, Error, Graph, Scheduler, SchedulerOptions, TensorFlags, TensorId};
use rgml_cpu::{CpuDevice, CpuRegistry};
use std::sync::{Arc, Mutex};

struct Devices {
    cpu0: DeviceRef,
    cpu1: DeviceRef,
    cpu: DeviceRef,
}

fn devices() -> Devices {
    let reg = CpuRegistry::with_devices(["CPU0", "CPU1", "CPU"]);
    let d = rgml::registry::Registry::devices(&reg);
    Devices {
        cpu0: d[0].clone(),
        cpu1: d[1].clone(),
        cpu: d[2].clone(),
    }
}

fn backend(dev: &DeviceRef) -> Box<dyn Backend> {
    dev.init_backend(&rgml::backend::BackendParams::parse("n_threads=2").unwrap())
        .unwrap()
}

/// [CPU0, CPU1, CPU] as backends 0, 1, 2.
fn sched3(d: &Devices, n_copies: usize) -> Scheduler {
    Scheduler::new(
        vec![backend(&d.cpu0), backend(&d.cpu1), backend(&d.cpu)],
        SchedulerOptions {
            n_copies,
            op_offload: false,
            ..Default::default()
        },
    )
    .unwrap()
}

/// Put `ids` in one weights buffer of `dev` and fill them with a deterministic pattern.
fn weights(ctx: &mut Context, dev: &DeviceRef, ids: &[TensorId], seed: f32) {
    let buf = Buffer::alloc(&dev.buffer_type(), 4096).unwrap();
    buf.set_usage(BufferUsage::Weights);
    let mut ta = TensorAllocator::new(buf);
    for (k, &id) in ids.iter().enumerate() {
        ta.alloc(ctx, id).unwrap();
        let n = ctx[id].nelements();
        let v: Vec<f32> = (0..n)
            .map(|i| ((i as f32 + 1.0) * 0.37 + seed + k as f32).sin())
            .collect();
        ctx.tensor_set_f32(id, &v).unwrap();
    }
}

/// The two-layer graph: `x` (input, 4) → `h0 = w0·x` → `a0 = silu` → `h1 = w1·a0` →
/// `a1 = silu` → `out = 2·a1`, with `w0` on device `d0` and `w1` on device `d1`.
struct Net {
    ctx: Context,
    graph: Graph,
    x: TensorId,
    h0: TensorId,
    a0: TensorId,
    h1: TensorId,
    a1: TensorId,
    out: TensorId,
}

fn net(d0: &DeviceRef, d1: &DeviceRef) -> Net {
    let mut ctx = Context::new();
    let w0 = ctx.new_tensor(DType::F32, &[4, 4]).unwrap();
    let w1 = ctx.new_tensor(DType::F32, &[4, 4]).unwrap();
    weights(&mut ctx, d0, &[w0], 0.1);
    weights(&mut ctx, d1, &[w1], 0.7);
    let x = ctx.new_tensor(DType::F32, &[4, 1]).unwrap();
    ctx.set_name(x, "x").unwrap();
    ctx.set_input(x).unwrap();
    let h0 = ctx.mul_mat(w0, x).unwrap();
    let a0 = ctx.silu(h0).unwrap();
    let h1 = ctx.mul_mat(w1, a0).unwrap();
    let a1 = ctx.silu(h1).unwrap();
    let out = ctx.scale(a1, 2.0).unwrap();
    let graph = Graph::build(&mut ctx, &[out]).unwrap();
    assert_eq!(graph.nodes(), &[h0, a0, h1, a1, out]);
    Net {
        ctx,
        graph,
        x,
        h0,
        a0,
        h1,
        a1,
        out,
    }
}

fn input(step: usize) -> Vec<f32> {
    (0..4)
        .map(|i| (i as f32 - 1.5) * 0.5 + step as f32 * 0.25)
        .collect()
}

/// The output bits of `net` computed by `sched` for micro-batches `0..steps`.
fn run_steps(sched: &mut Scheduler, n: &mut Net, steps: usize) -> Vec<Vec<u32>> {
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

/// The same net with every weight in plain CPU memory, on one CPU backend.
fn reference(steps: usize) -> Vec<Vec<u32>> {
    let d = devices();
    let mut n = net(&d.cpu, &d.cpu);
    let mut s = Scheduler::new(
        vec![backend(&d.cpu)],
        SchedulerOptions {
            op_offload: false,
            ..Default::default()
        },
    )
    .unwrap();
    let r = run_steps(&mut s, &mut n, steps);
    assert_eq!(s.n_splits(), 1);
    assert_eq!(s.copy_stats().total_count(), 0);
    r
}

#[test]
fn assignment_follows_weights_with_hand_worked_splits_and_copies() {
    let d = devices();
    let mut n = net(&d.cpu0, &d.cpu1);
    let mut s = sched3(&d, 1);
    let got = run_steps(&mut s, &mut n, 1);

    // h0 reads w0 (CPU0) → 0; a0 follows by expansion; h1 reads w1 (CPU1) → 1; a1, out follow.
    // x is a graph input → the CPU backend (2).
    let b = |id| s.tensor_backend(id);
    assert_eq!(
        [b(n.x), b(n.h0), b(n.a0), b(n.h1), b(n.a1), b(n.out)],
        [Some(2), Some(0), Some(0), Some(1), Some(1), Some(1)]
    );
    // Split 0 on CPU0 copies x in (CPU0 cannot read CPU memory); split 1 on CPU1 copies a0.
    assert_eq!(
        s.splits(),
        vec![
            SplitInfo {
                backend: 0,
                nodes: vec![n.h0, n.a0],
                inputs: vec![n.x]
            },
            SplitInfo {
                backend: 1,
                nodes: vec![n.h1, n.a1, n.out],
                inputs: vec![n.a0]
            },
        ]
    );
    assert_eq!(s.n_splits(), 2);
    let st = s.copy_stats();
    assert_eq!(st.count[2][0], 1);
    assert_eq!(st.bytes[2][0], 16);
    assert_eq!(st.count[0][1], 1);
    assert_eq!(st.bytes[0][1], 16);
    assert_eq!((st.total_count(), st.total_bytes()), (2, 32));

    // Each node's storage is in its backend's compute buffer.
    let buft_of = |id: TensorId| {
        n.ctx[id]
            .data
            .as_ref()
            .unwrap()
            .buffer
            .buffer_type()
            .name()
            .to_string()
    };
    assert_eq!(buft_of(n.h0), "CPU0");
    assert_eq!(buft_of(n.out), "CPU1");
    assert_eq!(buft_of(n.x), "CPU");

    assert_eq!(got, reference(1), "bit for bit equal to one backend");
}

#[test]
fn views_follow_their_sources() {
    let d = devices();
    let mut ctx = Context::new();
    let w0 = ctx.new_tensor(DType::F32, &[4, 4]).unwrap();
    let y = ctx.new_tensor(DType::F32, &[2, 2]).unwrap();
    weights(&mut ctx, &d.cpu0, &[w0], 0.3);
    weights(&mut ctx, &d.cpu1, &[y], 0.9);
    let x = ctx.new_tensor(DType::F32, &[4, 1]).unwrap();
    ctx.set_input(x).unwrap();
    let h0 = ctx.mul_mat(w0, x).unwrap();
    let r = ctx.reshape(h0, &[2, 2]).unwrap();
    let o = ctx.add(r, y).unwrap();
    let graph = Graph::build(&mut ctx, &[o]).unwrap();
    let mut s = sched3(&d, 1);
    s.alloc_graph(&mut ctx, &graph).unwrap();
    ctx.tensor_set_f32(x, &[1.0, -2.0, 0.5, 3.0]).unwrap();
    s.graph_compute(&mut ctx, &graph).unwrap();
    // r is a view of h0 (CPU0) and stays there although its reader o runs on CPU1 (y's home),
    // so the view is what gets copied.
    assert_eq!(s.tensor_backend(h0), Some(0));
    assert_eq!(s.tensor_backend(r), Some(0));
    assert_eq!(s.tensor_backend(o), Some(1));
    let splits = s.splits();
    assert_eq!(splits.len(), 2);
    assert_eq!(splits[0].nodes, vec![h0, r]);
    assert_eq!(splits[1].inputs, vec![r]);
    assert_eq!(s.copy_stats().bytes[0][1], 16);
    assert_eq!(s.copy_stats().total_count(), 2);

    let w = ctx.tensor_get_f32(w0).unwrap();
    let yv = ctx.tensor_get_f32(y).unwrap();
    let xv = [1.0f32, -2.0, 0.5, 3.0];
    let got = ctx.tensor_get_f32(o).unwrap();
    for i in 0..4 {
        let dot: f32 = (0..4).map(|k| w[i * 4 + k] * xv[k]).sum();
        assert!(
            (got[i] - (dot + yv[i])).abs() < 1e-5,
            "{i}: {} vs {}",
            got[i],
            dot + yv[i]
        );
    }
}

#[test]
fn overrides_win() {
    let d = devices();
    let mut n = net(&d.cpu0, &d.cpu1);
    let mut s = sched3(&d, 1);
    s.set_tensor_backend(n.a0, 2).unwrap();
    let got = run_steps(&mut s, &mut n, 1);
    assert_eq!(s.tensor_backend(n.a0), Some(2));
    // [h0] on CPU0 (x copied in); [a0] on CPU, which reads CPU0 memory directly (no copy);
    // [h1 a1 out] on CPU1, which needs a0 copied from CPU memory.
    let splits = s.splits();
    let summary: Vec<(usize, usize, Vec<TensorId>)> = splits
        .iter()
        .map(|s| (s.backend, s.nodes.len(), s.inputs.clone()))
        .collect();
    assert_eq!(
        summary,
        vec![(0, 1, vec![n.x]), (2, 1, vec![]), (1, 3, vec![n.a0])]
    );
    let st = s.copy_stats();
    assert_eq!(
        (st.count[2][0], st.count[2][1], st.total_count()),
        (1, 1, 2)
    );
    assert_eq!(st.total_bytes(), 32);
    assert_eq!(got, reference(1));
    // Overrides last until reset.
    s.reset();
    assert_eq!(s.tensor_backend(n.a0), None);
    assert!(s.set_tensor_backend(n.a0, 3).is_err());
}

#[test]
fn n_copies_one_to_four_give_identical_results() {
    let want = reference(5);
    let d = devices();
    for n_copies in 1..=4 {
        let mut n = net(&d.cpu0, &d.cpu1);
        let mut s = sched3(&d, n_copies);
        assert_eq!(s.n_copies(), n_copies);
        let mut used = Vec::new();
        let mut got = Vec::new();
        for step in 0..5 {
            s.alloc_graph(&mut n.ctx, &n.graph).unwrap();
            used.push(s.cur_copy());
            n.ctx.tensor_set_f32(n.x, &input(step)).unwrap();
            s.graph_compute(&mut n.ctx, &n.graph).unwrap();
            let out = n.ctx.tensor_get_f32(n.out).unwrap();
            got.push(out.iter().map(|v| v.to_bits()).collect::<Vec<u32>>());
        }
        assert_eq!(got, want, "n_copies = {n_copies}");
        // Copies rotate on every allocation.
        assert_eq!(
            used,
            (0..5).map(|i| i % n_copies).collect::<Vec<_>>(),
            "n_copies = {n_copies}"
        );
        // Two copies per micro-batch, whatever the pipeline depth.
        assert_eq!(s.copy_stats().total_count(), 10);
        assert_eq!(s.copy_stats().total_bytes(), 160);
    }
}

#[test]
fn eval_callback_sees_every_node_once_and_can_stop() {
    let d = devices();
    let mut n = net(&d.cpu0, &d.cpu1);
    let mut s = sched3(&d, 2);
    let seen: Arc<Mutex<Vec<(TensorId, bool)>>> = Arc::default();
    let log = seen.clone();
    let a0 = n.a0;
    let observed: Arc<Mutex<Vec<f32>>> = Arc::default();
    let obs = observed.clone();
    s.set_eval_callback(Box::new(move |ctx, id, ask| {
        log.lock().unwrap().push((id, ask));
        if !ask && id == a0 {
            *obs.lock().unwrap() = ctx.tensor_get_f32(id).unwrap();
        }
        // Observe a0 and out only.
        !ask || id == a0 || ctx[id].flags.contains(TensorFlags::OUTPUT)
    }));
    let got = run_steps(&mut s, &mut n, 1);
    assert_eq!(got, reference(1));
    let seen = seen.lock().unwrap().clone();
    let asks: Vec<TensorId> = seen.iter().filter(|e| e.1).map(|e| e.0).collect();
    assert_eq!(
        asks,
        n.graph.nodes(),
        "every node asked about exactly once, in order"
    );
    let looks: Vec<TensorId> = seen.iter().filter(|e| !e.1).map(|e| e.0).collect();
    assert_eq!(looks, vec![n.a0, n.out]);
    // What the callback read for a0 is silu(w0·x), as computed.
    assert_eq!(observed.lock().unwrap().len(), 4);

    // Stop after a0: nothing later is asked about, and compute reports the abort.
    let mut n = net(&d.cpu0, &d.cpu1);
    let mut s = sched3(&d, 1);
    let seen: Arc<Mutex<Vec<TensorId>>> = Arc::default();
    let log = seen.clone();
    let a0 = n.a0;
    s.set_eval_callback(Box::new(move |_, id, ask| {
        if ask {
            log.lock().unwrap().push(id);
            true
        } else {
            id != a0
        }
    }));
    s.alloc_graph(&mut n.ctx, &n.graph).unwrap();
    n.ctx.tensor_set_f32(n.x, &input(0)).unwrap();
    let err = s.graph_compute(&mut n.ctx, &n.graph).unwrap_err();
    assert!(matches!(err, Error::Aborted), "{err}");
    assert_eq!(*seen.lock().unwrap(), vec![n.h0, n.a0]);
    let _ = (n.h1, n.a1);
}

#[test]
fn unsupported_node_is_an_error() {
    let d = devices();
    let mut ctx = Context::new();
    let a = ctx.new_tensor(DType::I32, &[4]).unwrap();
    let b = ctx.new_tensor(DType::I32, &[4]).unwrap();
    // The builders refuse I32 arithmetic; a hand-made node slips past them to the scheduler.
    let mut t = rgml::Tensor::new(DType::I32, [4, 1, 1, 1]).unwrap();
    t.op = rgml::Op::Add;
    t.src = vec![a, b];
    let c = ctx.push(t).unwrap();
    assert!(
        rgml_cpu::check_supported(&ctx, c).is_err(),
        "the test needs an op the CPU cannot run"
    );
    let graph = Graph::build(&mut ctx, &[c]).unwrap();
    let mut s = sched3(&d, 1);
    let err = s.alloc_graph(&mut ctx, &graph).unwrap_err();
    assert!(matches!(err, Error::Sched(_)), "{err}");
    let err = s.graph_compute(&mut ctx, &graph).unwrap_err();
    assert!(matches!(err, Error::Sched(_)), "{err}");
}

#[test]
fn constructor_and_misuse_errors() {
    let d = devices();
    assert!(Scheduler::new(
        vec![],
        SchedulerOptions {
            op_offload: false,
            ..Default::default()
        }
    )
    .is_err());
    assert!(Scheduler::new(
        vec![backend(&d.cpu)],
        SchedulerOptions {
            n_copies: 0,
            op_offload: false,
            ..Default::default()
        }
    )
    .is_err());
    // A buffer type per backend, and one the backend can use.
    assert!(Scheduler::new(
        vec![backend(&d.cpu)],
        SchedulerOptions {
            buffer_types: Some(vec![]),
            op_offload: false,
            ..Default::default()
        }
    )
    .is_err());
    assert!(Scheduler::new(
        vec![backend(&d.cpu0), backend(&d.cpu)],
        SchedulerOptions {
            buffer_types: Some(vec![d.cpu1.buffer_type(), d.cpu.buffer_type()]),
            op_offload: false,
            ..Default::default()
        }
    )
    .is_err());
    let many: Vec<Box<dyn Backend>> = (0..17).map(|_| backend(&d.cpu)).collect();
    assert!(Scheduler::new(
        many,
        SchedulerOptions {
            op_offload: false,
            ..Default::default()
        }
    )
    .is_err());
    // A graph larger than the scheduler was made for.
    let mut n = net(&d.cpu0, &d.cpu1);
    let mut s = Scheduler::new(
        vec![backend(&d.cpu0), backend(&d.cpu1), backend(&d.cpu)],
        SchedulerOptions {
            max_graph_size: Some(3),
            op_offload: false,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(matches!(
        s.alloc_graph(&mut n.ctx, &n.graph),
        Err(Error::Sched(_))
    ));
    // Pre-allocated memory no backend can use for the op: a CPU1 weight read by a CPU0-only
    // scheduler.
    let mut n = net(&d.cpu0, &d.cpu1);
    let mut s = Scheduler::new(
        vec![backend(&d.cpu0), backend(&d.cpu0)],
        SchedulerOptions {
            op_offload: false,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(s.alloc_graph(&mut n.ctx, &n.graph).is_err());
    let _ = CpuDevice::new("unused");
}

#[test]
fn graph_can_be_scheduled_again_and_reserve_sizes_buffers() {
    let d = devices();
    let mut n = net(&d.cpu0, &d.cpu1);
    let mut s = sched3(&d, 1);
    s.reserve(&n.ctx, &n.graph).unwrap();
    assert!(s.buffer_size(0) > 0 && s.buffer_size(1) > 0 && s.buffer_size(2) > 0);
    assert_eq!(s.n_splits(), 0, "reserve forgets the assignment");
    let want = reference(3);
    assert_eq!(run_steps(&mut s, &mut n, 3), want);
    // The same scheduler on a fresh net (a different graph) gives the same results.
    let mut n2 = net(&d.cpu0, &d.cpu1);
    s.reset();
    assert_eq!(run_steps(&mut s, &mut n2, 3), want);
    assert_eq!(s.copy_stats().total_count(), 12);
}

#[test]
fn input_copies_are_shared_by_later_splits_on_the_same_backend() {
    let d = devices();
    for n_copies in [1, 3] {
        let mut ctx = Context::new();
        let w0 = ctx.new_tensor(DType::F32, &[4, 4]).unwrap();
        let w2 = ctx.new_tensor(DType::F32, &[4, 4]).unwrap();
        let w1 = ctx.new_tensor(DType::F32, &[4, 4]).unwrap();
        weights(&mut ctx, &d.cpu0, &[w0, w2], 0.2);
        weights(&mut ctx, &d.cpu1, &[w1], 0.5);
        let x = ctx.new_tensor(DType::F32, &[4, 1]).unwrap();
        ctx.set_input(x).unwrap();
        let h0 = ctx.mul_mat(w0, x).unwrap();
        let h1 = ctx.mul_mat(w1, h0).unwrap();
        let h2 = ctx.mul_mat(w2, h1).unwrap();
        let o = ctx.add(h2, x).unwrap();
        let graph = Graph::build(&mut ctx, &[o]).unwrap();
        let mut s = sched3(&d, n_copies);
        s.alloc_graph(&mut ctx, &graph).unwrap();
        let xv = [0.5f32, -1.0, 2.0, 0.25];
        ctx.tensor_set_f32(x, &xv).unwrap();
        s.graph_compute(&mut ctx, &graph).unwrap();
        // [h0] on CPU0 copies x; [h1] on CPU1 copies h0; [h2 o] on CPU0 copies h1 and reuses
        // the copy of x made for the first split.
        let summary: Vec<(usize, Vec<TensorId>, Vec<TensorId>)> = s
            .splits()
            .into_iter()
            .map(|s| (s.backend, s.nodes, s.inputs))
            .collect();
        assert_eq!(
            summary,
            vec![
                (0, vec![h0], vec![x]),
                (1, vec![h1], vec![h0]),
                (0, vec![h2, o], vec![h1]),
            ]
        );
        assert_eq!(s.copy_stats().total_count(), 3);
        assert_eq!(s.copy_stats().total_bytes(), 48);
        let mv = |w: TensorId, v: &[f32]| -> Vec<f32> {
            let w = ctx.tensor_get_f32(w).unwrap();
            (0..4)
                .map(|i| (0..4).map(|k| w[i * 4 + k] * v[k]).sum())
                .collect()
        };
        let e0 = mv(w0, &xv);
        let e1 = mv(w1, &e0);
        let e2 = mv(w2, &e1);
        let got = ctx.tensor_get_f32(o).unwrap();
        for i in 0..4 {
            let want = e2[i] + xv[i];
            assert!((got[i] - want).abs() < 1e-4, "{i}: {} vs {want}", got[i]);
        }
    }
}

/// A backend of `dev` in the given mode (`async=1` or `async=0`).
fn backend_mode(dev: &DeviceRef, asynchronous: bool) -> Box<dyn Backend> {
    let p = format!("n_threads=2,async={}", u8::from(asynchronous));
    dev.init_backend(&rgml::backend::BackendParams::parse(&p).unwrap())
        .unwrap()
}

#[test]
fn pipelined_async_micro_batches_match_the_sync_path_bit_for_bit() {
    // Each step writes its output into row `step` of a persistent `results` tensor on CPU1
    // (as a session writes its KV cache); the steps are only queued, and read once at the end.
    let want = reference(5);
    let d = devices();
    for asynchronous in [false, true] {
        for n_copies in 1..=4 {
            let mut n = net(&d.cpu0, &d.cpu1);
            let results = n.ctx.new_tensor(DType::F32, &[4, 5]).unwrap();
            let buf = Buffer::alloc(&d.cpu1.buffer_type(), 4096).unwrap();
            TensorAllocator::new(buf)
                .alloc(&mut n.ctx, results)
                .unwrap();
            n.ctx.tensor_set_f32(results, &[0.0; 20]).unwrap();
            let backends = vec![
                backend_mode(&d.cpu0, asynchronous),
                backend_mode(&d.cpu1, asynchronous),
                backend(&d.cpu),
            ];
            let mut s = Scheduler::new(
                backends,
                SchedulerOptions {
                    n_copies,
                    op_offload: false,
                    ..Default::default()
                },
            )
            .unwrap();
            for step in 0..5 {
                let row = n.ctx.view(results, &[4], &[], step * 16).unwrap();
                let c = n.ctx.cpy(n.out, row).unwrap();
                let g = Graph::build(&mut n.ctx, &[c]).unwrap();
                s.alloc_graph(&mut n.ctx, &g).unwrap();
                n.ctx.tensor_set_f32(n.x, &input(step)).unwrap();
                s.graph_compute_async(&mut n.ctx, &g).unwrap();
            }
            s.synchronize().unwrap();
            let all = n.ctx.tensor_get_f32(results).unwrap();
            let got: Vec<Vec<u32>> = all
                .chunks(4)
                .map(|r| r.iter().map(|v| v.to_bits()).collect())
                .collect();
            assert_eq!(got, want, "async {asynchronous}, n_copies {n_copies}");
        }
    }
}

/// A slow graph on `a`'s memory: `y = w^k · x` with `k` square products.
fn chain(ctx: &mut Context, dev: &DeviceRef, k: usize) -> (TensorId, TensorId, Graph) {
    let w = ctx.new_tensor(DType::F32, &[64, 64]).unwrap();
    let x = ctx.new_tensor(DType::F32, &[64, 64]).unwrap();
    let mut y = x;
    for _ in 0..k {
        y = ctx.mul_mat(w, y).unwrap();
        y = ctx.scale(y, 1.0 / 8.0).unwrap();
    }
    let g = Graph::build(ctx, &[y]).unwrap();
    let buf = Buffer::alloc(&dev.buffer_type(), 64 * 64 * 4 * (2 * k + 4)).unwrap();
    let mut ta = TensorAllocator::new(buf);
    for id in [w, x].into_iter().chain(g.nodes().iter().copied()) {
        ta.alloc(ctx, id).unwrap();
    }
    let v: Vec<f32> = (0..64 * 64).map(|i| ((i as f32) * 0.13).sin()).collect();
    ctx.tensor_set_f32(w, &v).unwrap();
    ctx.tensor_set_f32(x, &v).unwrap();
    (x, y, g)
}

#[test]
fn events_order_work_across_async_backends() {
    let d = devices();
    let mut ctx = Context::new();
    // A first runs a slow graph on other memory, then `y`; so B, if it did not wait, would
    // read `y` (reset to NaN each round) before A wrote it.
    let (_, _, slow) = chain(&mut ctx, &d.cpu0, 60);
    let (_, y, ga) = chain(&mut ctx, &d.cpu0, 2);
    // B (CPU1) reads A's output in place: z = 2·y.
    let z = ctx.scale(y, 2.0).unwrap();
    let buf = Buffer::alloc(&d.cpu1.buffer_type(), 64 * 64 * 4).unwrap();
    TensorAllocator::new(buf).alloc(&mut ctx, z).unwrap();
    let gb = Graph::from_nodes(vec![z]);

    let mut a = backend_mode(&d.cpu0, true);
    let mut b = backend_mode(&d.cpu1, true);
    let event = d.cpu0.event_new().unwrap();
    // Never recorded: reached.
    event.synchronize().unwrap();
    for round in 0..3 {
        ctx.tensor_set_f32(y, &vec![f32::NAN; 64 * 64]).unwrap();
        ctx.tensor_set_f32(z, &vec![f32::NAN; 64 * 64]).unwrap();
        a.graph_compute_async(&ctx, &slow).unwrap();
        a.graph_compute_async(&ctx, &ga).unwrap();
        a.event_record(&event).unwrap();
        b.event_wait(&event).unwrap();
        b.graph_compute_async(&ctx, &gb).unwrap();
        // Waiting for B alone is enough: B's queue waited for A's event.
        b.synchronize().unwrap();
        let want: Vec<u32> = ctx
            .tensor_get_f32(y)
            .unwrap()
            .iter()
            .map(|v| (v * 2.0).to_bits())
            .collect();
        let got: Vec<u32> = ctx
            .tensor_get_f32(z)
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect();
        assert!(got.iter().all(|v| !f32::from_bits(*v).is_nan()));
        assert_eq!(got, want, "round {round}");
        event.synchronize().unwrap();
        a.synchronize().unwrap();
    }
    // The same sequence on synchronous backends gives the same bits.
    let zs = ctx.tensor_get_f32(z).unwrap();
    let (mut a, mut b) = (backend_mode(&d.cpu0, false), backend_mode(&d.cpu1, false));
    a.graph_compute(&ctx, &slow).unwrap();
    a.graph_compute(&ctx, &ga).unwrap();
    a.event_record(&event).unwrap();
    b.event_wait(&event).unwrap();
    b.graph_compute(&ctx, &gb).unwrap();
    let again = ctx.tensor_get_f32(z).unwrap();
    assert!(zs
        .iter()
        .zip(&again)
        .all(|(p, q)| p.to_bits() == q.to_bits()));
}

#[test]
fn errors_inside_async_work_surface_at_synchronize() {
    let d = devices();
    let mut ctx = Context::new();
    let w = ctx.new_tensor(DType::F32, &[4, 3]).unwrap();
    let idx = ctx.new_tensor(DType::I32, &[2]).unwrap();
    let rows = ctx.get_rows(w, idx).unwrap();
    let out = ctx.scale(rows, 2.0).unwrap();
    let g = Graph::build(&mut ctx, &[out]).unwrap();
    let buf = Buffer::alloc(&d.cpu0.buffer_type(), 4096).unwrap();
    let mut ta = TensorAllocator::new(buf);
    for id in [w, idx, rows, out] {
        ta.alloc(&mut ctx, id).unwrap();
    }
    ctx.tensor_set_f32(w, &(0..12).map(|i| i as f32).collect::<Vec<_>>())
        .unwrap();
    let mut b = backend_mode(&d.cpu0, true);

    // A bad index is only found while the kernel runs: queued fine, reported at synchronize.
    ctx.tensor_set_i32(idx, &[1, 3]).unwrap();
    b.graph_compute_async(&ctx, &g).unwrap();
    // Work queued after the error is skipped; the first error is the one reported.
    b.graph_compute_async(&ctx, &g).unwrap();
    let err = b.synchronize().unwrap_err();
    assert!(matches!(err, Error::OutOfBounds { .. }), "{err}");
    // Reported once; the backend works again afterwards.
    b.synchronize().unwrap();
    ctx.tensor_set_i32(idx, &[2, 0]).unwrap();
    b.graph_compute_async(&ctx, &g).unwrap();
    b.synchronize().unwrap();
    assert_eq!(
        ctx.tensor_get_f32(out).unwrap(),
        vec![16.0, 18.0, 20.0, 22.0, 0.0, 2.0, 4.0, 6.0]
    );
    // The blocking call reports its own error directly.
    ctx.tensor_set_i32(idx, &[-1, 0]).unwrap();
    assert!(b.graph_compute(&ctx, &g).is_err());
    b.synchronize().unwrap();

    // Errors found while checking the graph are reported at once, before anything is queued.
    let lost = ctx.new_tensor(DType::F32, &[4]).unwrap();
    let bad = ctx.scale(lost, 1.0).unwrap();
    let err = b
        .graph_compute_async(&ctx, &Graph::from_nodes(vec![bad]))
        .unwrap_err();
    assert!(matches!(err, Error::NoStorage(_)), "{err}");

    // Unknown values of the `async` parameter are errors.
    let p = rgml::backend::BackendParams::parse("async=maybe").unwrap();
    assert!(d.cpu0.init_backend(&p).is_err());
}

#[test]
fn queued_writes_stay_behind_queued_work() {
    let d = devices();
    let mut ctx = Context::new();
    let (_, _, slow) = chain(&mut ctx, &d.cpu0, 60);
    let (x, y, g) = chain(&mut ctx, &d.cpu0, 2);
    let bits = |v: Vec<f32>| v.iter().map(|f| f.to_bits()).collect::<Vec<u32>>();
    backend_mode(&d.cpu0, false)
        .graph_compute(&ctx, &g)
        .unwrap();
    let want = bits(ctx.tensor_get_f32(y).unwrap());
    ctx.tensor_set_f32(y, &vec![f32::NAN; 64 * 64]).unwrap();

    let mut a = backend_mode(&d.cpu0, true);
    a.graph_compute_async(&ctx, &slow).unwrap();
    a.graph_compute_async(&ctx, &g).unwrap();
    // Queued behind `g`, which still has to read the old `x`.
    let zeros = vec![0u8; 64 * 64 * 4];
    a.set_tensor_async(&ctx, x, 0, &zeros).unwrap();
    a.synchronize().unwrap();
    assert_eq!(bits(ctx.tensor_get_f32(y).unwrap()), want);
    assert_eq!(ctx.tensor_bytes(x).unwrap(), zeros);
    // Writes past the tensor are errors at once.
    assert!(matches!(
        a.set_tensor_async(&ctx, x, 1, &zeros),
        Err(Error::OutOfBounds { .. })
    ));

    // A copy between async backends is queued on the destination too.
    let z = ctx.new_tensor(DType::F32, &[64, 64]).unwrap();
    let buf = Buffer::alloc(&d.cpu1.buffer_type(), 64 * 64 * 4).unwrap();
    TensorAllocator::new(buf).alloc(&mut ctx, z).unwrap();
    let mut b = backend_mode(&d.cpu1, true);
    a.graph_compute_async(&ctx, &g).unwrap();
    assert!(b.cpy_tensor_async(a.as_mut(), &ctx, y, z).unwrap());
    b.synchronize().unwrap();
    assert_eq!(ctx.tensor_bytes(z).unwrap(), ctx.tensor_bytes(y).unwrap());
    // Synchronous backends leave copies to the caller.
    let mut s = backend_mode(&d.cpu1, false);
    assert!(!s.cpy_tensor_async(a.as_mut(), &ctx, y, z).unwrap());
}

/// The scheduler reuses its split plan for a graph only while the caller's tensors are
/// unchanged: a weight moved to another buffer (a metadata change) is read where it is now.
#[test]
fn moved_tensors_are_read_where_they_are_now() {
    let d = devices();
    let mut ctx = Context::new();
    let w = ctx.new_tensor(DType::F32, &[4, 2]).unwrap();
    weights(&mut ctx, &d.cpu, &[w], 0.3);
    let y = ctx.scale(w, 2.0).unwrap();
    let graph = Graph::build(&mut ctx, &[y]).unwrap();
    let mut s = Scheduler::new(
        vec![backend(&d.cpu)],
        SchedulerOptions {
            op_offload: false,
            ..Default::default()
        },
    )
    .unwrap();
    s.graph_compute(&mut ctx, &graph).unwrap();
    let twice = |v: Vec<f32>| v.iter().map(|x| 2.0 * x).collect::<Vec<_>>();
    assert_eq!(
        ctx.tensor_get_f32(y).unwrap(),
        twice(ctx.tensor_get_f32(w).unwrap())
    );
    s.graph_compute(&mut ctx, &graph).unwrap();

    ctx.get_mut(w).unwrap().data = None;
    weights(&mut ctx, &d.cpu, &[w], 1.9);
    let moved = ctx.tensor_get_f32(w).unwrap();
    s.graph_compute(&mut ctx, &graph).unwrap();
    assert_eq!(ctx.tensor_get_f32(y).unwrap(), twice(moved));
}

/// An override may name the device instead of a backend index.
#[test]
fn overrides_by_device() {
    let d = devices();
    let mut n = net(&d.cpu0, &d.cpu1);
    let mut s = sched3(&d, 1);
    s.set_tensor_device(n.a0, d.cpu.as_ref()).unwrap();
    let got = run_steps(&mut s, &mut n, 1);
    assert_eq!(s.tensor_backend(n.a0), Some(2));
    assert_eq!(got, reference(1));
    let elsewhere = CpuDevice::new("CPU7");
    assert!(matches!(
        s.set_tensor_device(n.a0, elsewhere.as_ref()),
        Err(Error::Sched(rgml::SchedError::NoBackendOnDevice(name))) if name == "CPU7"
    ));
}
