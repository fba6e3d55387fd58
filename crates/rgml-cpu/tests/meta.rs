//! The meta device over 2 and 3 CPU devices computes a transformer-like block (FFN with
//! row-split up / gate, contraction-split down giving partial sums, a residual that needs them
//! reduced, an RMS norm) and gets the single device's answer, with even, uneven and empty
//! slices; directly and through the scheduler; and grouped-query attention with its views.
//! With the projections split by output rows instead (their split inputs and outputs
//! all-gathered), the answer is the single device's bit for bit.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rgml::alloc::alloc_ctx_tensors;
use rgml::meta::{MetaDevice, SplitState};
use rgml::{Context, DType, DeviceRef, Graph, Scheduler, SchedulerOptions, TensorId};
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

/// FFN rows split as `rows`, and `down` split by its output rows as `out_rows` (gathers).
fn gather_states(rows: Vec<usize>, out_rows: Vec<usize>) -> Arc<HashMap<String, SplitState>> {
    let mut s = HashMap::new();
    s.insert("up".to_string(), SplitState::axis(1, rows.clone()));
    s.insert("gate".to_string(), SplitState::axis(1, rows));
    s.insert("down".to_string(), SplitState::axis(1, out_rows));
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
fn gathered_projections_are_bit_exact() {
    let cpu: DeviceRef = CpuDevice::new("CPU");
    let want = run(&cpu, 5);
    let reg = CpuRegistry::with_devices(["CPU0", "CPU1", "CPU2"]);
    let devs = rgml::registry::Registry::devices(&reg);
    for (n, rows, out_rows) in [
        (2, vec![64, 32], vec![32, 32]),
        (2, vec![32, 64], vec![48, 16]),
        (3, vec![32, 32, 32], vec![16, 32, 16]),
        (3, vec![64, 0, 32], vec![0, 32, 32]),
    ] {
        let meta: DeviceRef =
            MetaDevice::new(devs[..n].to_vec(), gather_states(rows, out_rows)).unwrap();
        assert_eq!(run(&meta, 5), want, "{}", meta.name());
    }
}

#[test]
fn meta_device_runs_under_the_scheduler() {
    let cpu: DeviceRef = CpuDevice::new("CPU");
    let want = run(&cpu, 2);
    let reg = CpuRegistry::with_devices(["CPU0", "CPU1"]);
    let devs = rgml::registry::Registry::devices(&reg);
    for source in [
        states(vec![32, 64]),
        gather_states(vec![32, 64], vec![48, 16]),
    ] {
        let meta: DeviceRef = MetaDevice::new(devs.clone(), source).unwrap();
        let got = run_scheduled(&meta);
        close(&got, &want);
    }
}

/// Block 2 with its weights in `meta`'s memory and the activations placed by a scheduler.
fn run_scheduled(meta: &DeviceRef) -> Vec<f32> {
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
    let mut s = Scheduler::new(
        backends,
        SchedulerOptions {
            op_offload: false,
            ..Default::default()
        },
    )
    .unwrap();
    s.alloc_graph(&mut b.ctx, &b.graph).unwrap();
    b.ctx.tensor_set_f32(b.x, &input()).unwrap();
    s.graph_compute(&mut b.ctx, &b.graph).unwrap();
    b.ctx.tensor_get_f32(b.out).unwrap()
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

/// Grouped-query attention over `T` tokens with heads split over 2 devices: reshapes, ROPE,
/// permutes, a broadcast K·Q, masked soft-max, V transposed with `cont`, the output projection
/// split on its contraction axis (partial) and the residual (reduced first).
fn attention(seed: u64) -> Block {
    const E: usize = 64; // 4 query heads of 16, 2 KV heads
    const HD: usize = 16;
    const T: usize = 5;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut ctx = Context::new();
    let mut weights = Vec::new();
    let mut weight = |ctx: &mut Context, name: &str, dims: &[usize], v: Option<Vec<f32>>| {
        let id = ctx.new_tensor(DType::F32, dims).unwrap();
        ctx.set_name(id, name).unwrap();
        let n: usize = dims.iter().product();
        let v = v.unwrap_or_else(|| (0..n).map(|_| rng.gen_range(-0.3..0.3)).collect());
        weights.push((id, v.iter().flat_map(|x| x.to_le_bytes()).collect()));
        id
    };
    let wq = weight(&mut ctx, "wq", &[E, E], None);
    let wk = weight(&mut ctx, "wk", &[E, 2 * HD], None);
    let wv = weight(&mut ctx, "wv", &[E, 2 * HD], None);
    let wo = weight(&mut ctx, "wo", &[E, E], None);
    let mask: Vec<f32> = (0..T * T)
        .map(|i| {
            if i % T > i / T {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    let kq_mask = weight(&mut ctx, "mask", &[T, T], Some(mask));
    let pos = ctx.new_tensor(DType::I32, &[T]).unwrap();
    weights.push((pos, (0..T as i32).flat_map(|p| p.to_le_bytes()).collect()));
    let x = ctx.new_tensor(DType::F32, &[E, T]).unwrap();
    ctx.set_input(x).unwrap();
    let q = ctx.mul_mat(wq, x).unwrap();
    let q = ctx.reshape(q, &[HD, 4, T]).unwrap();
    let rp = rgml::RopeParams::new(rgml::RopeMode::Neox, HD, 10000.0);
    let q = ctx.rope(q, pos, rp).unwrap();
    let k = ctx.mul_mat(wk, x).unwrap();
    let k = ctx.reshape(k, &[HD, 2, T]).unwrap();
    let k = ctx.rope(k, pos, rp).unwrap();
    let v = ctx.mul_mat(wv, x).unwrap();
    let v = ctx.reshape(v, &[HD, 2, T]).unwrap();
    let q = ctx.permute(q, [0, 2, 1, 3]).unwrap(); // [HD, T, 4]
    let k = ctx.permute(k, [0, 2, 1, 3]).unwrap(); // [HD, T, 2]
    let k = ctx.cont(k).unwrap();
    let kq = ctx.mul_mat(k, q).unwrap(); // [T, T, 4]
    let kq = ctx.soft_max_ext(kq, Some(kq_mask), 0.25, 0.0).unwrap();
    let vt = ctx.permute(v, [1, 2, 0, 3]).unwrap(); // [T, HD, 2]
    let vt = ctx.cont(vt).unwrap();
    let kqv = ctx.mul_mat(vt, kq).unwrap(); // [HD, T, 4]
    let kqv = ctx.permute(kqv, [0, 2, 1, 3]).unwrap(); // [HD, 4, T]
    let merged = ctx.cont_shape(kqv, &[E, T]).unwrap();
    let o = ctx.mul_mat(wo, merged).unwrap();
    let out = ctx.add(o, x).unwrap();
    let graph = Graph::build(&mut ctx, &[out]).unwrap();
    Block {
        ctx,
        graph,
        x,
        out,
        weights,
    }
}

#[test]
fn meta_attention_matches_one_device() {
    let inputs: Vec<f32> = (0..64 * 5)
        .map(|i| ((i * 29) % 31) as f32 * 0.07 - 1.0)
        .collect();
    let run_on = |device: &DeviceRef| {
        let mut b = attention(4);
        let _buf = alloc_ctx_tensors(&mut b.ctx, &device.buffer_type()).unwrap();
        for (id, bytes) in &b.weights {
            b.ctx.tensor_set(*id, 0, bytes).unwrap();
        }
        b.ctx.tensor_set_f32(b.x, &inputs).unwrap();
        let mut backend = device.init_backend(&Default::default()).unwrap();
        backend.graph_compute(&b.ctx, &b.graph).unwrap();
        b.ctx.tensor_get_f32(b.out).unwrap()
    };
    let cpu: DeviceRef = CpuDevice::new("CPU");
    let want = run_on(&cpu);
    let reg = CpuRegistry::with_devices(["CPU0", "CPU1"]);
    let devs = rgml::registry::Registry::devices(&reg);
    for kv_heads in [[1, 1], [2, 0]] {
        let q_rows = kv_heads.map(|h| h * 32).to_vec();
        let kv_rows = kv_heads.map(|h| h * 16).to_vec();
        let mut s = HashMap::new();
        s.insert("wq".to_string(), SplitState::axis(1, q_rows.clone()));
        s.insert("wk".to_string(), SplitState::axis(1, kv_rows.clone()));
        s.insert("wv".to_string(), SplitState::axis(1, kv_rows));
        s.insert("wo".to_string(), SplitState::axis(0, q_rows));
        let meta: DeviceRef = MetaDevice::new(devs.clone(), Arc::new(s.clone())).unwrap();
        close(&run_on(&meta), &want);
        // The output projection by output rows: its input (the merged heads) and its output
        // are gathered, and every product is whole: bit for bit.
        s.insert("wo".to_string(), SplitState::axis(1, vec![40, 24]));
        let meta: DeviceRef = MetaDevice::new(devs.clone(), Arc::new(s)).unwrap();
        assert_eq!(run_on(&meta), want, "kv heads {kv_heads:?}");
    }
}
