//! The meta device over 2 and 3 CPU devices computes a transformer-like block (FFN with
//! row-split up / gate, contraction-split down giving partial sums, a residual that needs them
//! reduced, an RMS norm) and gets the single device's answer, with even, uneven and empty
//! slices; directly and through the scheduler.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rgml::alloc::alloc_ctx_tensors;
use rgml::meta::{MetaDevice, SplitState};
use rgml::{Context, DType, DeviceRef, Graph, Scheduler, TensorId};
use rgml_cpu::{CpuDevice, CpuRegistry};
use std::collections::HashMap;
use std::sync::Arc;

const K: usize = 64;
const F: usize = 96;

struct Block {
    ctx: Context,
    graph: Graph,
    x: TensorId,
    out: TensorId,
    weights: Vec<(TensorId, Vec<u8>)>,
}

/// x [K, 3] → up, gate (F rows) → swiglu → down (K rows, Q8_0) → + x → rms_norm.
fn block(seed: u64) -> Block {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut ctx = Context::new();
    let mut weights = Vec::new();
    let mut weight = |ctx: &mut Context, name: &str, dtype: DType, dims: &[usize]| {
        let id = ctx.new_tensor(dtype, dims).unwrap();
        ctx.set_name(id, name).unwrap();
        let n: usize = dims.iter().product();
        let v: Vec<f32> = (0..n).map(|_| rng.gen_range(-0.3..0.3)).collect();
        let mut bytes = vec![0u8; dtype.row_bytes(n).unwrap()];
        rgml::quant::quantize_row(dtype, &v, &mut bytes).unwrap();
        weights.push((id, bytes));
        id
    };
    let up = weight(&mut ctx, "up", DType::F32, &[K, F]);
    let gate = weight(&mut ctx, "gate", DType::F16, &[K, F]);
    let down = weight(&mut ctx, "down", DType::Q8_0, &[F, K]);
    let x = ctx.new_tensor(DType::F32, &[K, 3]).unwrap();
    ctx.set_name(x, "x").unwrap();
    ctx.set_input(x).unwrap();
    let u = ctx.mul_mat(up, x).unwrap();
    let g = ctx.mul_mat(gate, x).unwrap();
    let h = ctx.swiglu(g, u).unwrap();
    let y = ctx.mul_mat(down, h).unwrap();
    let r = ctx.add(y, x).unwrap();
    let out = ctx.rms_norm(r, 1e-5).unwrap();
    let graph = Graph::build(&mut ctx, &[out]).unwrap();
    Block {
        ctx,
        graph,
        x,
        out,
        weights,
    }
}

fn input() -> Vec<f32> {
    (0..K * 3)
        .map(|i| ((i * 37) % 23) as f32 * 0.1 - 1.1)
        .collect()
}

/// The block on `device` (weights and activations in its buffer type), run directly.
fn run(device: &DeviceRef, seed: u64) -> Vec<f32> {
    let mut b = block(seed);
    let _buf = alloc_ctx_tensors(&mut b.ctx, &device.buffer_type()).unwrap();
    for (id, bytes) in &b.weights {
        b.ctx.tensor_set(*id, 0, bytes).unwrap();
    }
    b.ctx.tensor_set_f32(b.x, &input()).unwrap();
    let mut backend = device.init_backend(&Default::default()).unwrap();
    backend.graph_compute(&b.ctx, &b.graph).unwrap();
    b.ctx.tensor_get_f32(b.out).unwrap()
}

fn states(rows: Vec<usize>) -> Arc<HashMap<String, SplitState>> {
    let mut s = HashMap::new();
    s.insert("up".to_string(), SplitState::axis(1, rows.clone()));
    s.insert("gate".to_string(), SplitState::axis(1, rows.clone()));
    s.insert("down".to_string(), SplitState::axis(0, rows));
    Arc::new(s)
}

fn close(a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= 1e-4 * (1.0 + y.abs()), "{x} vs {y}");
    }
}

#[test]
fn meta_device_matches_one_device() {
    let cpu: DeviceRef = CpuDevice::new("CPU");
    let want = run(&cpu, 1);
    let reg = CpuRegistry::with_devices(["CPU0", "CPU1", "CPU2"]);
    let devs = rgml::registry::Registry::devices(&reg);
    for (n, rows) in [
        (2, vec![64, 32]),
        (2, vec![32, 64]),
        (3, vec![32, 32, 32]),
        (3, vec![64, 0, 32]),
    ] {
        let meta: DeviceRef = MetaDevice::new(devs[..n].to_vec(), states(rows.clone())).unwrap();
        assert!(meta.name().starts_with("Meta(CPU0,CPU1"));
        let got = run(&meta, 1);
        close(&got, &want);
    }
}

#[test]
fn meta_device_runs_under_the_scheduler() {
    let cpu: DeviceRef = CpuDevice::new("CPU");
    let want = run(&cpu, 2);
    let reg = CpuRegistry::with_devices(["CPU0", "CPU1"]);
    let devs = rgml::registry::Registry::devices(&reg);
    let meta: DeviceRef = MetaDevice::new(devs, states(vec![32, 64])).unwrap();
    let mut b = block(2);
    // Weights in meta memory; activations placed by the scheduler.
    let mut wctx_ids = Vec::new();
    for (id, _) in &b.weights {
        wctx_ids.push(*id);
    }
    let buf = rgml::backend::Buffer::alloc(&meta.buffer_type(), 64 * 1024).unwrap();
    buf.set_usage(rgml::backend::BufferUsage::Weights);
    let mut ta = rgml::alloc::TensorAllocator::new(buf);
    for &id in &wctx_ids {
        ta.alloc(&mut b.ctx, id).unwrap();
    }
    for (id, bytes) in &b.weights {
        b.ctx.tensor_set(*id, 0, bytes).unwrap();
    }
    let backends = vec![meta.init_backend(&Default::default()).unwrap()];
    let mut s = Scheduler::new(backends, None, 64, 1, false).unwrap();
    s.alloc_graph(&mut b.ctx, &b.graph).unwrap();
    b.ctx.tensor_set_f32(b.x, &input()).unwrap();
    s.graph_compute(&mut b.ctx, &b.graph).unwrap();
    close(&b.ctx.tensor_get_f32(b.out).unwrap(), &want);
}

#[test]
fn bad_meta_devices_are_errors() {
    assert!(MetaDevice::new(vec![], states(vec![])).is_err());
    let reg = CpuRegistry::with_devices(["CPU0", "CPU1"]);
    let devs = rgml::registry::Registry::devices(&reg);
    // Splits for three devices on two: refused when the weights are placed.
    let meta: DeviceRef = MetaDevice::new(devs, states(vec![32, 32, 32])).unwrap();
    let mut b = block(3);
    assert!(alloc_ctx_tensors(&mut b.ctx, &meta.buffer_type()).is_err());
}
