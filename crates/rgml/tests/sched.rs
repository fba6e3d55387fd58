//! The scheduler over the core's test devices (`rgml::testing`): accelerators `A` and `B`
//! (each reading only its own memory) and the CPU device last. Results are compared with a
//! float64 reference on random data; where work ran is checked twice, by the scheduler's
//! report and by each device's log of the nodes it computed (a test backend refuses nodes it
//! does not support and memory it cannot use, so a wrong placement is an error, not a lucky
//! right answer). Expected splits are worked out by hand in the comments.

use rand::rngs::StdRng;
use rand::SeedableRng;
use rgml::alloc::TensorAllocator;
use rgml::backend::{Backend, Buffer, BufferUsage, Device, DeviceRef};
use rgml::sched::SplitInfo;
use rgml::testing::TestDevice;
use rgml::{
    Context, DType, Error, Graph, OpKind, SchedError, Scheduler, SchedulerOptions, TensorFlags,
    TensorId,
};
use std::sync::{Arc, Mutex};

mod common;
use common::{assert_close, mat_mul, random_from as random, silu};

/// Rows of the weights (and of the input).
const K: usize = 8;
/// Columns of the input (tokens).
const N: usize = 3;

fn backend(dev: &Arc<TestDevice>) -> Box<dyn Backend> {
    dev.init_backend(&Default::default()).unwrap()
}

fn options(n_copies: usize) -> SchedulerOptions {
    SchedulerOptions {
        n_copies,
        op_offload: false,
        ..Default::default()
    }
}

/// A scheduler over `devs` in that order (the CPU device last).
fn sched(devs: &[&Arc<TestDevice>], options: SchedulerOptions) -> Scheduler {
    Scheduler::new(devs.iter().map(|d| backend(d)).collect(), options).unwrap()
}

/// Place `id` alone in a buffer of `dev`'s memory with `usage`, and fill it with `values`.
fn place(
    ctx: &mut Context,
    dev: &Arc<TestDevice>,
    id: TensorId,
    usage: BufferUsage,
    values: &[f32],
) {
    let buf = Buffer::alloc(&dev.buffer_type(), ctx[id].nbytes()).unwrap();
    buf.set_usage(usage);
    TensorAllocator::new(buf).alloc(ctx, id).unwrap();
    ctx.tensor_set_f32(id, values).unwrap();
}

/// `x` (input `[K, N]`) → `h0 = w0·x` → `a0 = silu(h0)` → `h1 = w1·a0` → `a1 = silu(h1)` →
/// `out = rms_norm(a1) · 0.5`, with random weights `w0` on `d0` and `w1` on `d1`.
struct Net {
    ctx: Context,
    graph: Graph,
    w: [TensorId; 2],
    weights: [Vec<f32>; 2],
    x: TensorId,
    h0: TensorId,
    a0: TensorId,
    h1: TensorId,
    a1: TensorId,
    out: TensorId,
}

impl Net {
    fn new(d0: &Arc<TestDevice>, d1: &Arc<TestDevice>, seed: u64) -> Net {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut ctx = Context::new();
        let w0 = ctx.new_tensor(DType::F32, &[K, K]).unwrap();
        let w1 = ctx.new_tensor(DType::F32, &[K, K]).unwrap();
        ctx.set_name(w0, "w0").unwrap();
        ctx.set_name(w1, "w1").unwrap();
        let weights = [random(&mut rng, K * K), random(&mut rng, K * K)];
        place(&mut ctx, d0, w0, BufferUsage::Weights, &weights[0]);
        place(&mut ctx, d1, w1, BufferUsage::Weights, &weights[1]);
        let x = ctx.new_tensor(DType::F32, &[K, N]).unwrap();
        ctx.set_name(x, "x").unwrap();
        ctx.set_input(x).unwrap();
        let h0 = ctx.mul_mat(w0, x);
        let h0 = named(&mut ctx, h0, "h0");
        let a0 = ctx.silu(h0);
        let a0 = named(&mut ctx, a0, "a0");
        let h1 = ctx.mul_mat(w1, a0);
        let h1 = named(&mut ctx, h1, "h1");
        let a1 = ctx.silu(h1);
        let a1 = named(&mut ctx, a1, "a1");
        let norm = ctx.rms_norm(a1, 1e-5);
        let norm = named(&mut ctx, norm, "norm");
        let out = ctx.scale(norm, 0.5);
        let out = named(&mut ctx, out, "out");
        let graph = Graph::build(&mut ctx, &[out]).unwrap();
        assert_eq!(graph.nodes(), &[h0, a0, h1, a1, norm, out]);
        Net {
            ctx,
            graph,
            w: [w0, w1],
            weights,
            x,
            h0,
            a0,
            h1,
            a1,
            out,
        }
    }

    /// The float64 reference of `out` and `a0` for input `x`.
    fn reference(&self, x: &[f32]) -> (Vec<f64>, Vec<f64>) {
        let x: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        let a0: Vec<f64> = mat_vec(&self.weights[0], &x)
            .into_iter()
            .map(silu)
            .collect();
        let a1: Vec<f64> = mat_vec(&self.weights[1], &a0)
            .into_iter()
            .map(silu)
            .collect();
        let out = a1
            .chunks(K)
            .flat_map(|row| {
                let ms = row.iter().map(|v| v * v).sum::<f64>() / K as f64;
                let inv = 1.0 / (ms + 1e-5).sqrt();
                row.iter().map(move |v| 0.5 * v * inv)
            })
            .collect();
        (out, a0)
    }
}

/// `id`, named `name`.
fn named(ctx: &mut Context, id: rgml::Result<TensorId>, name: &str) -> TensorId {
    let id = id.unwrap();
    ctx.set_name(id, name).unwrap();
    id
}

/// `w` (`[K, K]`, ggml layout: row `i` is `w[i*K..]`) times each column of `x` (`[K, N]`).
fn mat_vec(w: &[f32], x: &[f64]) -> Vec<f64> {
    mat_mul(w, K, x)
}

fn input(step: u64) -> Vec<f32> {
    random(&mut StdRng::seed_from_u64(100 + step), K * N)
}

/// Allocate, set the input of micro-batch `step`, compute, and check `out` against the
/// reference.
fn run_step(s: &mut Scheduler, n: &mut Net, step: u64) {
    s.alloc_graph(&mut n.ctx, &n.graph).unwrap();
    let x = input(step);
    n.ctx.tensor_set_f32(n.x, &x).unwrap();
    s.graph_compute(&mut n.ctx, &n.graph).unwrap();
    let got = n.ctx.tensor_get_f32(n.out).unwrap();
    assert_close(&got, &n.reference(&x).0, &format!("out of step {step}"));
}

struct Devs {
    a: Arc<TestDevice>,
    b: Arc<TestDevice>,
    cpu: Arc<TestDevice>,
}

impl Devs {
    fn new() -> Devs {
        Devs {
            a: TestDevice::accel("A"),
            b: TestDevice::accel("B"),
            cpu: TestDevice::cpu("CPU"),
        }
    }

    /// [A, B, CPU] as backends 0, 1, 2.
    fn sched(&self, n_copies: usize) -> Scheduler {
        sched(&[&self.a, &self.b, &self.cpu], options(n_copies))
    }

    /// What each device computed since the last call, [A, B, CPU].
    fn computed(&self) -> [Vec<String>; 3] {
        [
            self.a.take_computed(),
            self.b.take_computed(),
            self.cpu.take_computed(),
        ]
    }
}

fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn splits_follow_the_weights_and_copy_what_a_device_cannot_read() {
    let d = Devs::new();
    let mut n = Net::new(&d.a, &d.b, 1);
    let mut s = d.sched(1);
    run_step(&mut s, &mut n, 0);

    // h0 reads w0 (A's memory) → A; a0 follows by expansion; h1 reads w1 → B; the rest follow.
    // x is a graph input → the CPU (last).
    let b = |id| s.tensor_backend(id);
    assert_eq!(
        [b(n.x), b(n.h0), b(n.a0), b(n.h1), b(n.a1), b(n.out)],
        [Some(2), Some(0), Some(0), Some(1), Some(1), Some(1)]
    );
    // A cannot read the CPU's x, B cannot read A's a0: each is copied in.
    assert_eq!(
        s.splits(),
        vec![
            SplitInfo {
                backend: 0,
                nodes: vec![n.h0, n.a0],
                inputs: vec![n.x],
            },
            SplitInfo {
                backend: 1,
                nodes: n.graph.nodes()[2..].to_vec(),
                inputs: vec![n.a0],
            },
        ]
    );
    let st = s.copy_stats();
    let bytes = (K * N * 4) as u64;
    assert_eq!((st.count[2][0], st.bytes[2][0]), (1, bytes));
    assert_eq!((st.count[0][1], st.bytes[0][1]), (1, bytes));
    assert_eq!((st.total_count(), st.total_bytes()), (2, 2 * bytes));
    // The devices computed exactly what the scheduler says, in order.
    assert_eq!(
        d.computed(),
        [
            names(&["h0", "a0"]),
            names(&["h1", "a1", "norm", "out"]),
            vec![]
        ]
    );
    // Each node's storage is in its backend's compute memory.
    let memory = |id: TensorId| n.ctx[id].data.as_ref().unwrap().buffer.name().to_string();
    assert_eq!(
        [memory(n.h0), memory(n.out), memory(n.x)],
        ["A", "B", "CPU"]
    );
}

#[test]
fn ops_a_device_refuses_run_elsewhere() {
    // A cannot run SILU: a0 cannot follow h0 down to A, so it is taken by B when B's
    // assignment expands up from h1. A then runs only h0, whose result B copies in.
    let d = Devs {
        a: TestDevice::builder("A").without(OpKind::Silu).build(),
        ..Devs::new()
    };
    let mut n = Net::new(&d.a, &d.b, 2);
    let mut s = d.sched(1);
    run_step(&mut s, &mut n, 0);
    let summary: Vec<(usize, Vec<TensorId>, Vec<TensorId>)> = s
        .splits()
        .into_iter()
        .map(|s| (s.backend, s.nodes, s.inputs))
        .collect();
    assert_eq!(
        summary,
        vec![
            (0, vec![n.h0], vec![n.x]),
            (1, n.graph.nodes()[1..].to_vec(), vec![n.h0]),
        ]
    );
    let [a, b, cpu] = d.computed();
    assert_eq!(a, names(&["h0"]));
    assert_eq!(b, names(&["a0", "h1", "a1", "norm", "out"]));
    assert!(cpu.is_empty());

    // An op no device runs is the scheduler's typed error, naming the node.
    let mut ctx = Context::new();
    let x = ctx.new_tensor(DType::F32, &[K]).unwrap();
    let y = ctx.norm(x, 1e-5).unwrap();
    ctx.set_name(y, "y").unwrap();
    let g = Graph::build(&mut ctx, &[y]).unwrap();
    let err = d.sched(1).alloc_graph(&mut ctx, &g).unwrap_err();
    assert!(
        matches!(
            &err,
            Error::Sched(SchedError::NoBackendSupports { node, op: OpKind::Norm }) if node == "y"
        ),
        "{err}"
    );
}

#[test]
fn overrides_by_device_win_until_reset() {
    let d = Devs::new();
    let mut n = Net::new(&d.a, &d.b, 3);
    let mut s = d.sched(1);
    let cpu: DeviceRef = d.cpu.clone();
    s.set_tensor_device(n.a0, cpu.as_ref()).unwrap();
    run_step(&mut s, &mut n, 0);
    // [h0] on A (x copied in); [a0] on the CPU, which cannot read A's memory (h0 copied in);
    // [h1 ..] on B, which cannot read the CPU's a0 (copied in).
    let summary: Vec<(usize, usize, Vec<TensorId>)> = s
        .splits()
        .iter()
        .map(|s| (s.backend, s.nodes.len(), s.inputs.clone()))
        .collect();
    assert_eq!(
        summary,
        vec![(0, 1, vec![n.x]), (2, 1, vec![n.h0]), (1, 4, vec![n.a0])]
    );
    assert_eq!(d.computed()[2], names(&["a0"]));
    assert_eq!(s.copy_stats().total_count(), 3);

    // A device no backend runs on is refused by name.
    let elsewhere = TestDevice::accel("Z");
    assert!(matches!(
        s.set_tensor_device(n.a0, elsewhere.as_ref()),
        Err(Error::Sched(SchedError::NoBackendOnDevice(name))) if name == "Z"
    ));
    // Overrides hold until reset; then the passes decide again (a0 back on A).
    s.reset();
    assert_eq!(s.tensor_backend(n.a0), None);
    run_step(&mut s, &mut n, 1);
    assert_eq!(s.tensor_backend(n.a0), Some(0));
    assert_eq!(d.computed()[2], Vec::<String>::new());
}

#[test]
fn pipelined_copies_rotate_and_give_the_same_results() {
    for events in [false, true] {
        for n_copies in 1..=3 {
            let dev = |name: &str| {
                let b = TestDevice::builder(name);
                if events {
                    b.events().build()
                } else {
                    b.build()
                }
            };
            let d = Devs {
                a: dev("A"),
                b: dev("B"),
                cpu: TestDevice::cpu("CPU"),
            };
            let mut n = Net::new(&d.a, &d.b, 4);
            let mut s = d.sched(n_copies);
            let mut used = Vec::new();
            for step in 0..5 {
                run_step(&mut s, &mut n, step);
                used.push(s.cur_copy());
            }
            let what = format!("events {events}, n_copies {n_copies}");
            assert_eq!(
                used,
                (0..5).map(|i| i % n_copies).collect::<Vec<_>>(),
                "{what}"
            );
            // Two copies per micro-batch, whatever the pipeline depth.
            assert_eq!(s.copy_stats().total_count(), 10, "{what}");
            // Each split with inputs records its event after it runs, where there are events.
            let recorded = (d.a.events_recorded(), d.b.events_recorded());
            let want = if events { (5, 5) } else { (0, 0) };
            assert_eq!(recorded, want, "{what}");
        }
    }
}

#[test]
fn the_plan_is_reused_while_the_context_is_unchanged() {
    let d = Devs::new();
    let mut n = Net::new(&d.a, &d.b, 5);
    // The input in CPU memory of the caller's own, so its storage never moves.
    n.ctx.get_mut(n.x).unwrap().flags = TensorFlags::empty();
    let x = input(0);
    place(&mut n.ctx, &d.cpu, n.x, BufferUsage::Any, &x);
    let mut s = d.sched(2);
    s.alloc_graph(&mut n.ctx, &n.graph).unwrap();
    let check = |n: &Net, what: &str| {
        let got = n.ctx.tensor_get_f32(n.out).unwrap();
        assert_close(&got, &n.reference(&x).0, what);
    };

    // Computing the allocated graph again reuses its plan: the copy index stays.
    for _ in 0..2 {
        s.graph_compute(&mut n.ctx, &n.graph).unwrap();
        assert_eq!(s.cur_copy(), 0);
        check(&n, "same graph");
    }
    // New values are not new metadata: the plan still applies and reads them.
    n.weights[0] = random(&mut StdRng::seed_from_u64(6), K * K);
    n.ctx.tensor_set_f32(n.w[0], &n.weights[0]).unwrap();
    s.graph_compute(&mut n.ctx, &n.graph).unwrap();
    assert_eq!(s.cur_copy(), 0);
    check(&n, "new weight values");
    assert_eq!(
        d.computed()[0],
        names(&["h0", "a0", "h0", "a0", "h0", "a0"])
    );

    // w0 moved to B's memory (a metadata change): the scheduler plans again (the next copy)
    // and h0 now runs on B; a stale plan would run it on A, which cannot read B's memory.
    n.ctx.get_mut(n.w[0]).unwrap().data = None;
    place(
        &mut n.ctx,
        &d.b,
        n.w[0],
        BufferUsage::Weights,
        &n.weights[0],
    );
    s.graph_compute(&mut n.ctx, &n.graph).unwrap();
    assert_eq!(s.cur_copy(), 1);
    assert_eq!(s.tensor_backend(n.h0), Some(1));
    assert_eq!(s.n_splits(), 1);
    check(&n, "moved weight");
    let [a, b, _] = d.computed();
    assert!(a.is_empty(), "{a:?}");
    assert_eq!(b.len(), 6);
}

#[test]
fn eval_callback_sees_every_node_once_and_can_stop() {
    let d = Devs::new();
    let mut n = Net::new(&d.a, &d.b, 7);
    let mut s = d.sched(2);
    let seen: Arc<Mutex<Vec<(TensorId, bool)>>> = Arc::default();
    let observed: Arc<Mutex<Vec<f32>>> = Arc::default();
    let (log, obs, a0) = (seen.clone(), observed.clone(), n.a0);
    s.set_eval_callback(Box::new(move |ctx, id, ask| {
        log.lock().unwrap().push((id, ask));
        if !ask && id == a0 {
            *obs.lock().unwrap() = ctx.tensor_get_f32(id).unwrap();
        }
        // Observe a0 and the output only.
        !ask || id == a0 || ctx[id].flags.contains(TensorFlags::OUTPUT)
    }));
    run_step(&mut s, &mut n, 0);
    let seen = seen.lock().unwrap().clone();
    let asks: Vec<TensorId> = seen.iter().filter(|e| e.1).map(|e| e.0).collect();
    assert_eq!(
        asks,
        n.graph.nodes(),
        "every node asked about once, in order"
    );
    let looks: Vec<TensorId> = seen.iter().filter(|e| !e.1).map(|e| e.0).collect();
    assert_eq!(looks, vec![n.a0, n.out]);
    // What the callback read for a0 is a0 as computed, mid-graph.
    let want_a0 = n.reference(&input(0)).1;
    assert_close(
        &observed.lock().unwrap(),
        &want_a0,
        "a0 seen by the callback",
    );

    // Stop after a0: nothing later is asked about or computed, and compute reports the abort.
    let mut n = Net::new(&d.a, &d.b, 8);
    let mut s = d.sched(1);
    let asked: Arc<Mutex<Vec<TensorId>>> = Arc::default();
    let (log, a0) = (asked.clone(), n.a0);
    s.set_eval_callback(Box::new(move |_, id, ask| {
        if ask {
            log.lock().unwrap().push(id);
        }
        ask || id != a0
    }));
    d.computed();
    s.alloc_graph(&mut n.ctx, &n.graph).unwrap();
    n.ctx.tensor_set_f32(n.x, &input(0)).unwrap();
    let err = s.graph_compute(&mut n.ctx, &n.graph).unwrap_err();
    assert!(matches!(err, Error::Aborted), "{err}");
    assert_eq!(*asked.lock().unwrap(), vec![n.h0, n.a0]);
    assert_eq!(d.computed(), [names(&["h0", "a0"]), vec![], vec![]]);
    let _ = (n.h1, n.a1);
}

#[test]
fn reserve_sizes_the_compute_buffers_and_forgets_the_assignment() {
    let d = Devs::new();
    let mut n = Net::new(&d.a, &d.b, 10);
    let mut s = d.sched(1);
    s.reserve(&n.ctx, &n.graph).unwrap();
    assert!((0..3).all(|i| s.buffer_size(i) > 0));
    assert_eq!(s.n_splits(), 0);
    for step in 0..3 {
        run_step(&mut s, &mut n, step);
    }
    assert_eq!(d.computed()[0].len(), 6);
    // Another graph on the same scheduler.
    let mut other = Net::new(&d.a, &d.b, 11);
    s.reset();
    run_step(&mut s, &mut other, 0);
}

#[test]
fn constructor_errors_are_typed() {
    let d = Devs::new();
    let err = |r: rgml::Result<Scheduler>| match r {
        Err(Error::Sched(e)) => e,
        Err(other) => panic!("not a scheduler error: {other}"),
        Ok(_) => panic!("accepted"),
    };
    assert!(matches!(
        err(Scheduler::new(vec![backend(&d.a), backend(&d.b)], options(1))),
        SchedError::LastBackendNotCpu(name) if name == "B"
    ));
    assert!(matches!(
        err(Scheduler::new(vec![backend(&d.cpu)], options(0))),
        SchedError::NoCopies
    ));
    // A's backend cannot use B's memory.
    assert!(matches!(
        err(Scheduler::new(
            vec![backend(&d.a), backend(&d.cpu)],
            SchedulerOptions {
                buffer_types: Some(vec![d.b.buffer_type(), d.cpu.buffer_type()]),
                ..options(1)
            }
        )),
        SchedError::BufferTypeUnusable { .. }
    ));
    // A weight in B's memory read by a scheduler without B: no backend can use it.
    let mut n = Net::new(&d.a, &d.b, 12);
    let mut s = sched(&[&d.a, &d.cpu], options(1));
    assert!(matches!(
        s.alloc_graph(&mut n.ctx, &n.graph),
        Err(Error::Sched(SchedError::MemoryUnusable { .. }))
    ));
}
