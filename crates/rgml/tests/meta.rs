//! The meta device over the core's test devices (`rgml::testing`): matrix products split by
//! output rows (the result gathered on read), an FFN block whose down projection is split on
//! its contraction axis (partial sums all-reduced before the residual) or by output rows (its
//! split input all-gathered first), the same block under
//! the scheduler, and the all-reduce itself on 1 to 5 devices. Every result is compared with
//! a float64 reference on random data.

use rgml::alloc::{alloc_ctx_tensors, TensorAllocator};
use rgml::backend::{Backend, Buffer, BufferUsage, DeviceRef};
use rgml::meta::{AllReduce, MetaDevice, SplitState};
use rgml::testing::TestDevice;
use rgml::{Context, DType, Device, Graph, Scheduler, SchedulerOptions, TensorId};
use std::collections::HashMap;
use std::sync::Arc;

mod common;
use common::{assert_close, mat_mul, random, silu};

/// Hidden size (contraction axis of the up/gate projections).
const K: usize = 16;
/// FFN size.
const F: usize = 24;
/// Tokens.
const N: usize = 3;

fn devices(n: usize) -> Vec<Arc<TestDevice>> {
    (0..n).map(|d| TestDevice::accel(format!("D{d}"))).collect()
}

fn meta(devs: &[Arc<TestDevice>], states: &[(&str, SplitState)]) -> DeviceRef {
    let children: Vec<DeviceRef> = devs.iter().map(|d| d.clone() as DeviceRef).collect();
    let states: HashMap<String, SplitState> = states
        .iter()
        .map(|(name, s)| (name.to_string(), s.clone()))
        .collect();
    MetaDevice::new(children, Arc::new(states)).unwrap()
}

/// A graph with named random f32 weights and an input `x`.
struct Model {
    ctx: Context,
    graph: Graph,
    x: TensorId,
    out: TensorId,
    weights: Vec<(TensorId, Vec<f32>)>,
}

impl Model {
    fn weight(&mut self, name: &str, dims: &[usize], seed: u64) -> TensorId {
        let id = self.ctx.new_tensor(DType::F32, dims).unwrap();
        self.ctx.set_name(id, name).unwrap();
        self.weights.push((id, random(seed, dims.iter().product())));
        id
    }

    fn new(x_rows: usize) -> Model {
        let mut ctx = Context::new();
        let x = ctx.new_tensor(DType::F32, &[x_rows, N]).unwrap();
        ctx.set_name(x, "x").unwrap();
        ctx.set_input(x).unwrap();
        Model {
            ctx,
            graph: Graph::new(),
            x,
            out: x,
            weights: Vec::new(),
        }
    }

    fn finish(mut self, out: TensorId) -> Model {
        self.ctx.set_name(out, "out").unwrap();
        self.graph = Graph::build(&mut self.ctx, &[out]).unwrap();
        self.out = out;
        self
    }

    /// Every tensor in `device`'s memory, computed by one backend of it.
    fn run(mut self, device: &DeviceRef, x: &[f32]) -> Vec<f32> {
        let _buf = alloc_ctx_tensors(&mut self.ctx, &device.buffer_type()).unwrap();
        for (id, v) in &self.weights {
            self.ctx.tensor_set_f32(*id, v).unwrap();
        }
        self.ctx.tensor_set_f32(self.x, x).unwrap();
        let mut backend = device.init_backend(&Default::default()).unwrap();
        backend.graph_compute(&self.ctx, &self.graph).unwrap();
        self.ctx.tensor_get_f32(self.out).unwrap()
    }
}

/// `out = w·x` with `w` of `M` rows.
fn product() -> Model {
    let mut m = Model::new(K);
    let w = m.weight("w", &[K, 8], 1);
    let y = m.ctx.mul_mat(w, m.x).unwrap();
    m.finish(y)
}

#[test]
fn products_split_by_output_rows_match_the_reference() {
    let x = random(2, K * N);
    let want = {
        let m = product();
        let xs: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        mat_mul(&m.weights[0].1, K, &xs)
    };
    for rows in [vec![5, 3], vec![8, 0], vec![2, 3, 3], vec![4, 0, 4]] {
        let devs = devices(rows.len());
        let dev = meta(&devs, &[("w", SplitState::axis(1, rows.clone()))]);
        let got = product().run(&dev, &x);
        // Reading the output gathers every device's rows.
        assert_close(&got, &want, &format!("rows {rows:?}"));
        // Each device with rows computed its share; one without skipped the empty product.
        for (d, &r) in devs.iter().zip(&rows) {
            let computed = d.take_computed();
            let want_log: Vec<String> = if r > 0 { vec!["out".into()] } else { vec![] };
            assert_eq!(computed, want_log, "rows {rows:?}");
        }
    }
}

/// x `[K, N]` → up, gate (`F` rows) → swiglu → down (`K` rows) → + x → rms_norm.
fn ffn() -> Model {
    let mut m = Model::new(K);
    let up = m.weight("up", &[K, F], 3);
    let gate = m.weight("gate", &[K, F], 4);
    let down = m.weight("down", &[F, K], 5);
    let u = m.ctx.mul_mat(up, m.x).unwrap();
    let g = m.ctx.mul_mat(gate, m.x).unwrap();
    let h = m.ctx.swiglu(g, u).unwrap();
    let y = m.ctx.mul_mat(down, h).unwrap();
    let r = m.ctx.add(y, m.x).unwrap();
    let out = m.ctx.rms_norm(r, 1e-5).unwrap();
    m.finish(out)
}

fn ffn_reference(x: &[f32]) -> Vec<f64> {
    let m = ffn();
    let w = |i: usize| &m.weights[i].1;
    let xs: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    let u = mat_mul(w(0), K, &xs);
    let g = mat_mul(w(1), K, &xs);
    let h: Vec<f64> = g.iter().zip(&u).map(|(&g, &u)| silu(g) * u).collect();
    let y = mat_mul(w(2), F, &h);
    let r: Vec<f64> = y.iter().zip(&xs).map(|(y, x)| y + x).collect();
    r.chunks(K)
        .flat_map(|row| {
            let ms = row.iter().map(|v| v * v).sum::<f64>() / K as f64;
            let inv = 1.0 / (ms + 1e-5).sqrt();
            row.iter().map(move |v| v * inv)
        })
        .collect()
}

/// FFN rows split as `rows`: up and gate by output rows, down by its contraction axis.
fn ffn_states(rows: &[usize]) -> Vec<(&'static str, SplitState)> {
    vec![
        ("up", SplitState::axis(1, rows.to_vec())),
        ("gate", SplitState::axis(1, rows.to_vec())),
        ("down", SplitState::axis(0, rows.to_vec())),
    ]
}

#[test]
fn contraction_splits_are_all_reduced_before_the_residual() {
    let x = random(6, K * N);
    let want = ffn_reference(&x);
    for rows in [vec![16, 8], vec![8, 16], vec![8, 8, 8], vec![16, 0, 8]] {
        let devs = devices(rows.len());
        let got = ffn().run(&meta(&devs, &ffn_states(&rows)), &x);
        assert_close(&got, &want, &format!("rows {rows:?}"));
        // The partial sums were joined by the devices' own ADDs (the all-reduce: one exchange
        // on 2 devices; a fold, an exchange and a broadcast on 3), and every device ran the
        // norm on the whole sums.
        let mut adds = 0;
        for d in &devs {
            let log = d.take_computed();
            adds += log.iter().filter(|n| n.starts_with("allreduce")).count();
            assert_eq!(log.last().map(String::as_str), Some("out"), "{log:?}");
        }
        let want_adds = if rows.len() == 2 { 2 } else { 3 };
        assert_eq!(adds, want_adds, "rows {rows:?}");
    }
}

#[test]
fn split_activations_are_gathered_for_products_split_by_output_rows() {
    // down split by its output rows needs the whole activation h, which is split like up and
    // gate: h is all-gathered first, and no partial sums arise.
    let x = random(8, K * N);
    let want = ffn_reference(&x);
    for (rows, out_rows) in [(vec![16, 8], vec![4, 12]), (vec![8, 0, 16], vec![8, 8, 0])] {
        let devs = devices(rows.len());
        let states = [
            ("up", SplitState::axis(1, rows.clone())),
            ("gate", SplitState::axis(1, rows.clone())),
            ("down", SplitState::axis(1, out_rows.clone())),
        ];
        let got = ffn().run(&meta(&devs, &states), &x);
        assert_close(
            &got,
            &want,
            &format!("rows {rows:?}, out rows {out_rows:?}"),
        );
        for d in &devs {
            let log = d.take_computed();
            assert!(!log.iter().any(|n| n.starts_with("allreduce")), "{log:?}");
        }
    }
}

#[test]
fn the_meta_device_runs_under_the_scheduler() {
    let x = random(7, K * N);
    let want = ffn_reference(&x);
    let devs = devices(2);
    let dev = meta(&devs, &ffn_states(&[8, 16]));
    let cpu = TestDevice::cpu("CPU");
    let mut m = ffn();
    // Weights in meta memory; activations placed by the scheduler.
    let buf = Buffer::alloc(&dev.buffer_type(), 64 * 1024).unwrap();
    buf.set_usage(BufferUsage::Weights);
    let mut ta = TensorAllocator::new(buf);
    for (id, v) in &m.weights {
        ta.alloc(&mut m.ctx, *id).unwrap();
        m.ctx.tensor_set_f32(*id, v).unwrap();
    }
    let backends: Vec<Box<dyn Backend>> = vec![
        dev.init_backend(&Default::default()).unwrap(),
        cpu.init_backend(&Default::default()).unwrap(),
    ];
    let mut s = Scheduler::new(
        backends,
        SchedulerOptions {
            op_offload: false,
            ..Default::default()
        },
    )
    .unwrap();
    s.alloc_graph(&mut m.ctx, &m.graph).unwrap();
    m.ctx.tensor_set_f32(m.x, &x).unwrap();
    s.graph_compute(&mut m.ctx, &m.graph).unwrap();
    assert_close(&m.ctx.tensor_get_f32(m.out).unwrap(), &want, "scheduled");
    // One split on the meta backend, with the CPU's input copied in.
    let splits = s.splits();
    assert_eq!(splits.len(), 1);
    assert_eq!(
        (splits[0].backend, splits[0].inputs.clone()),
        (0, vec![m.x])
    );
    assert!(cpu.take_computed().is_empty());
}

/// All-reduce `n` random tensors of shape `dims`, one in each device's own memory, twice
/// (the plan is reused); each time every device must hold the float64 sum, with the same bits.
/// With `events`, copies are queued on the streams and ordered by events; without, they are
/// blocking copies through host memory.
fn check_all_reduce(n: usize, dims: &[usize], events: bool, seed: u64) {
    let devs: Vec<Arc<TestDevice>> = (0..n)
        .map(|d| {
            let b = TestDevice::builder(format!("D{d}"));
            if events {
                b.events().queued_copies().build()
            } else {
                b.build()
            }
        })
        .collect();
    let mut be: Vec<Box<dyn Backend>> = devs
        .iter()
        .map(|d| d.init_backend(&Default::default()).unwrap())
        .collect();
    let mut ctx = Context::new();
    let mut ids = Vec::new();
    for dev in &devs {
        ids.push(ctx.new_tensor(DType::F32, dims).unwrap());
        alloc_ctx_tensors(&mut ctx, &dev.buffer_type()).unwrap();
    }
    let mut ar = AllReduce::new(&mut be, dims).unwrap();
    let len: usize = dims.iter().product();
    for round in 0..2 {
        let inputs: Vec<Vec<f32>> = (0..n as u64)
            .map(|d| random(seed * 100 + round * 10 + d, len))
            .collect();
        for (id, v) in ids.iter().zip(&inputs) {
            ctx.tensor_set_f32(*id, v).unwrap();
        }
        ar.run(&mut be, &ctx, &ids).unwrap();
        for b in &mut be {
            b.synchronize().unwrap();
        }
        let want: Vec<f64> = (0..len)
            .map(|i| inputs.iter().map(|v| v[i] as f64).sum())
            .collect();
        let first = ctx.tensor_get_f32(ids[0]).unwrap();
        assert_close(&first, &want, &format!("n {n}, round {round}"));
        for id in &ids[1..] {
            let other = ctx.tensor_get_f32(*id).unwrap();
            let same = first
                .iter()
                .zip(&other)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "n {n}: a device's sum differs from device 0's");
        }
    }
    if events && n > 1 {
        assert!(devs.iter().all(|d| d.events_recorded() > 0));
    }
}

#[test]
fn all_reduce_sums_on_1_to_5_devices() {
    for events in [false, true] {
        for n in 1..=5 {
            check_all_reduce(n, &[37], events, n as u64);
            check_all_reduce(n, &[5, 3, 2], events, 10 + n as u64);
        }
    }
}
