//! Graph plans on the first wgpu device: one plan computes new input values (positions
//! included) exactly as the CPU does, a metadata change makes a plan stale, and ROPE's cos /
//! sin table, made on the GPU from the positions, is the CPU's bit for bit (libm's `cosf` /
//! `sinf` included) for random, large and negative positions, both pair layouts, YaRN and
//! frequency factors.
//!
//! Without an adapter the tests skip, unless `RGML_REQUIRE_GPU=1`.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rgml::alloc::alloc_ctx_tensors;
use rgml::backend::{Backend, BackendParams};
use rgml::{Context, DType, Device, DeviceRef, Error, Graph, RopeMode, RopeParams, TensorId};
use std::sync::Arc;
mod common;
use common::first_device;

/// The CPU backend with the arithmetic the GPU kernels mirror (ggml-cpu's AVX-512 build, which
/// runs on any CPU).
fn cpu_backend() -> Box<dyn Backend> {
    let dev = rgml_cpu::CpuDevice::new("CPU");
    dev.init_backend(&BackendParams::parse("isa=avx512").unwrap())
        .unwrap()
}

/// Whether the device computes ROPE's table with libm's arithmetic (it needs f64).
fn exact_rope(dev: &DeviceRef) -> bool {
    dev.downcast_ref::<rgml_wgpu::WgpuDevice>()
        .is_some_and(|d| d.has_shader_f64())
}

/// Non-zero values in [-2, 2].
fn values(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let v: f32 = rng.gen_range(-2.0..2.0);
            if v == 0.0 {
                1.0
            } else {
                v
            }
        })
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// A small attention-like block of ops the GPU computes as the CPU does: RMS norm, a
/// projection, ROPE (NeoX) at input positions, scores against a key weight, softmax, SwiGLU
/// (rows of 32: whole groups of 16 for SiLU's and softmax's vector paths).
struct Block {
    ctx: Context,
    graph: Graph,
    x: TensorId,
    w: TensorId,
    g: TensorId,
    k: TensorId,
    pos: TensorId,
    out: TensorId,
}

const D: usize = 64;
const HEADS: usize = 3;
const TOKENS: usize = 5;
const KEYS: usize = 32;

fn block() -> Block {
    let mut ctx = Context::new();
    let c = &mut ctx;
    let x = c.new_tensor(DType::F32, &[D, TOKENS]).unwrap();
    let w = c.new_tensor(DType::F32, &[D, D * HEADS]).unwrap();
    let g = c.new_tensor(DType::F32, &[D]).unwrap();
    let k = c.new_tensor(DType::F32, &[D, KEYS]).unwrap();
    let pos = c.new_tensor(DType::I32, &[TOKENS]).unwrap();
    for id in [x, pos] {
        c.set_input(id).unwrap();
    }
    let n = c.rms_norm(x, 1e-5).unwrap();
    let n = c.mul(n, g).unwrap();
    let q = c.mul_mat(w, n).unwrap();
    let q = c.reshape(q, &[D, HEADS, TOKENS]).unwrap();
    let r = c
        .rope(q, pos, RopeParams::new(RopeMode::Neox, D, 10000.0))
        .unwrap();
    let r = c.cont(r).unwrap();
    let flat = c.reshape(r, &[D, HEADS * TOKENS]).unwrap();
    let kq = c.mul_mat(k, flat).unwrap();
    let sm = c.soft_max_ext(kq, None, 0.125, 0.0).unwrap();
    let out = c.swiglu(kq, sm).unwrap();
    let graph = Graph::build(&mut ctx, &[out]).unwrap();
    Block {
        ctx,
        graph,
        x,
        w,
        g,
        k,
        pos,
        out,
    }
}

impl Block {
    /// Weights from `seed`; allocated in `be`'s memory.
    fn on(be: &dyn Backend, seed: u64) -> (Block, Option<Arc<rgml::Buffer>>) {
        let mut b = block();
        let buf = alloc_ctx_tensors(&mut b.ctx, &be.default_buffer_type()).unwrap();
        let mut rng = StdRng::seed_from_u64(seed);
        let w: Vec<f32> = values(&mut rng, D * D * HEADS)
            .iter()
            .map(|v| v * 0.1)
            .collect();
        b.ctx.tensor_set_f32(b.w, &w).unwrap();
        b.ctx.tensor_set_f32(b.g, &values(&mut rng, D)).unwrap();
        let k: Vec<f32> = values(&mut rng, D * KEYS).iter().map(|v| v * 0.1).collect();
        b.ctx.tensor_set_f32(b.k, &k).unwrap();
        (b, buf)
    }

    /// New inputs from `seed`: activations and positions (some large).
    fn set_inputs(&self, seed: u64) {
        let mut rng = StdRng::seed_from_u64(seed);
        self.ctx
            .tensor_set_f32(self.x, &values(&mut rng, D * TOKENS))
            .unwrap();
        let pos: Vec<i32> = (0..TOKENS).map(|_| rng.gen_range(0..200_000)).collect();
        self.ctx
            .tensor_set(self.pos, 0, bytemuck::cast_slice(&pos))
            .unwrap();
    }

    fn output(&self) -> Vec<f32> {
        self.ctx.tensor_get_f32(self.out).unwrap()
    }
}

/// The CPU's output for the inputs of `seed`.
fn on_the_cpu(seed: u64) -> Vec<f32> {
    let mut cpu = cpu_backend();
    let (b, _buf) = Block::on(cpu.as_ref(), 7);
    b.set_inputs(seed);
    cpu.graph_compute(&b.ctx, &b.graph).unwrap();
    b.output()
}

#[test]
fn one_plan_computes_new_inputs_as_the_cpu() {
    let Some(dev) = first_device() else {
        return;
    };
    let mut gpu = dev.init_backend(&Default::default()).unwrap();
    let (b, _buf) = Block::on(gpu.as_ref(), 7);
    let plan = gpu.graph_plan_create(&b.ctx, &b.graph).unwrap();
    let mut outputs = Vec::new();
    for seed in [1, 2, 3] {
        b.set_inputs(seed);
        gpu.graph_plan_compute_async(&b.ctx, &plan).unwrap();
        gpu.synchronize().unwrap();
        let got = b.output();
        let want = on_the_cpu(seed);
        assert!(got.iter().all(|v| v.is_finite()) && got.iter().any(|&v| v != 0.0));
        if exact_rope(&dev) {
            assert_eq!(bits(&got), bits(&want), "inputs {seed}: plan vs the CPU");
        } else {
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() <= 1e-3 * (1.0 + w.abs()), "inputs {seed}");
            }
        }
        // The stream's own path (its kept plans) gives the same.
        gpu.graph_compute(&b.ctx, &b.graph).unwrap();
        assert_eq!(
            bits(&b.output()),
            bits(&got),
            "inputs {seed}: graph_compute"
        );
        outputs.push(got);
    }
    assert_ne!(
        bits(&outputs[0]),
        bits(&outputs[1]),
        "new inputs, new output"
    );
}

#[test]
fn a_metadata_change_makes_a_plan_stale() {
    let Some(dev) = first_device() else {
        return;
    };
    let mut gpu = dev.init_backend(&Default::default()).unwrap();
    let (mut b, _buf) = Block::on(gpu.as_ref(), 7);
    b.set_inputs(4);
    let plan = gpu.graph_plan_create(&b.ctx, &b.graph).unwrap();
    gpu.graph_plan_compute_async(&b.ctx, &plan).unwrap();
    gpu.synchronize().unwrap();
    let before = b.output();
    // A new tensor advances the context's epoch: the plan no longer applies.
    b.ctx.new_tensor(DType::F32, &[4]).unwrap();
    let err = gpu.graph_plan_compute_async(&b.ctx, &plan).unwrap_err();
    assert!(matches!(err, Error::StalePlan { .. }), "{err}");
    // Another context (a clone has its own uid) is refused too.
    let other = b.ctx.clone();
    let err = gpu.graph_plan_compute_async(&other, &plan).unwrap_err();
    assert!(matches!(err, Error::StalePlan { .. }), "{err}");
    // The stream prepares anew and gives the same answer.
    gpu.graph_compute(&b.ctx, &b.graph).unwrap();
    assert_eq!(bits(&b.output()), bits(&before));
    // A plan of another backend's making is not this one's to compute (a graph of a view
    // alone, which the CPU plans whatever memory it is in).
    let view = b.ctx.reshape(b.x, &[D * TOKENS]).unwrap();
    let views = Graph::build(&mut b.ctx, &[view]).unwrap();
    let cpu_plan = cpu_backend().graph_plan_create(&b.ctx, &views).unwrap();
    let err = gpu.graph_plan_compute_async(&b.ctx, &cpu_plan).unwrap_err();
    assert!(matches!(err, Error::Unsupported { .. }), "{err}");
}

/// ROPE of `[ne0, heads, n]` random rows at `positions` (with `factors` as frequency factors)
/// on the CPU and on `gpu`, twice through one GPU plan (the second time at other positions):
/// the outputs, CPU and GPU.
fn rope_both(
    gpu: &mut dyn Backend,
    ne0: usize,
    heads: usize,
    positions: [&[i32]; 2],
    rp: RopeParams,
    factors: Option<&[f32]>,
    seed: u64,
) -> Vec<(Vec<f32>, Vec<f32>)> {
    let n = positions[0].len();
    let build = |be: &dyn Backend| {
        let mut ctx = Context::new();
        let x = ctx.new_tensor(DType::F32, &[ne0, heads, n]).unwrap();
        let pos = ctx.new_tensor(DType::I32, &[n]).unwrap();
        let ff = factors.map(|f| ctx.new_tensor(DType::F32, &[f.len()]).unwrap());
        let r = ctx.rope_ext(x, pos, ff, rp).unwrap();
        let graph = Graph::build(&mut ctx, &[r]).unwrap();
        let buf = alloc_ctx_tensors(&mut ctx, &be.default_buffer_type()).unwrap();
        let mut rng = StdRng::seed_from_u64(seed);
        ctx.tensor_set_f32(x, &values(&mut rng, ne0 * heads * n))
            .unwrap();
        if let (Some(ff), Some(f)) = (ff, factors) {
            ctx.tensor_set_f32(ff, f).unwrap();
        }
        (ctx, graph, pos, r, buf)
    };
    let mut cpu = cpu_backend();
    let (c_ctx, c_graph, c_pos, c_r, _cb) = build(cpu.as_ref());
    let (g_ctx, g_graph, g_pos, g_r, _gb) = build(gpu);
    let plan = gpu.graph_plan_create(&g_ctx, &g_graph).unwrap();
    positions
        .iter()
        .map(|p| {
            let bytes: &[u8] = bytemuck::cast_slice(p);
            c_ctx.tensor_set(c_pos, 0, bytes).unwrap();
            g_ctx.tensor_set(g_pos, 0, bytes).unwrap();
            cpu.graph_compute(&c_ctx, &c_graph).unwrap();
            gpu.graph_plan_compute_async(&g_ctx, &plan).unwrap();
            gpu.synchronize().unwrap();
            (
                c_ctx.tensor_get_f32(c_r).unwrap(),
                g_ctx.tensor_get_f32(g_r).unwrap(),
            )
        })
        .collect()
}

#[test]
fn rope_on_the_gpu_is_the_cpus_bit_for_bit() {
    let Some(dev) = first_device() else {
        return;
    };
    let exact = exact_rope(&dev);
    let mut gpu = dev.init_backend(&Default::default()).unwrap();
    let mut rng = StdRng::seed_from_u64(11);
    let mut yarn = RopeParams::new(RopeMode::Normal, 64, 500000.0);
    yarn.n_ctx_orig = 4096;
    yarn.freq_scale = 0.25;
    yarn.ext_factor = 1.0;
    yarn.attn_factor = 1.1;
    let mut scaled = RopeParams::new(RopeMode::Neox, 32, 1e6);
    scaled.freq_scale = 0.5;
    let mut yarn_neox = yarn;
    yarn_neox.mode = RopeMode::Neox;
    // Frequency factors as Llama 3's (1 to 8), 3 more than the 32 pairs read.
    let factors: Vec<f32> = (0..35).map(|_| rng.gen_range(1.0..8.0)).collect();
    let ff = Some(&factors[..]);
    let cases = [
        (64, RopeParams::new(RopeMode::Normal, 64, 10000.0), None),
        (64, RopeParams::new(RopeMode::Neox, 64, 100000.0), None),
        // Part of each row rotates, the rest passes through.
        (80, RopeParams::new(RopeMode::Neox, 48, 10000.0), None),
        (80, RopeParams::new(RopeMode::Normal, 48, 10000.0), None),
        (64, yarn, None),
        (48, scaled, None),
        (64, RopeParams::new(RopeMode::Normal, 64, 500000.0), ff),
        (80, RopeParams::new(RopeMode::Neox, 64, 500000.0), ff),
        (64, yarn, ff),
        (64, yarn_neox, ff),
        // Pair counts that are not multiples of 4: ggml's vectorized normal-mode loop rounds
        // the last pairs' products.
        (18, RopeParams::new(RopeMode::Normal, 14, 10000.0), ff),
        (10, RopeParams::new(RopeMode::Normal, 10, 10000.0), None),
        (6, RopeParams::new(RopeMode::Normal, 2, 10000.0), None),
        (18, RopeParams::new(RopeMode::Neox, 14, 10000.0), ff),
    ];
    for (k, (ne0, rp, ff)) in cases.into_iter().enumerate() {
        // Small, large (past 2^24, where positions round to f32) and negative positions.
        let a: Vec<i32> = (0..9)
            .map(|i| match i {
                0 => 0,
                1 => 1,
                2 => rng.gen_range(100_000..1 << 20),
                3 => rng.gen_range(1 << 24..i32::MAX),
                4 => -rng.gen_range(1..1 << 20),
                _ => rng.gen_range(0..4096),
            })
            .collect();
        let b: Vec<i32> = (0..9).map(|_| rng.gen_range(-1 << 30..1 << 30)).collect();
        let runs = rope_both(gpu.as_mut(), ne0, 3, [&a, &b], rp, ff, k as u64);
        for (run, (cpu, got)) in runs.iter().enumerate() {
            assert!(cpu.iter().any(|&v| v != 0.0));
            if exact {
                assert_eq!(bits(got), bits(cpu), "case {k} ({rp:?}), positions {run}");
            } else {
                for (g, c) in got.iter().zip(cpu) {
                    assert!((g - c).abs() <= 1e-3 * (1.0 + c.abs()), "case {k}");
                }
            }
        }
        assert_ne!(
            bits(&runs[0].1),
            bits(&runs[1].1),
            "new positions, new output"
        );
    }
}

/// ROPEs at the same positions with other frequency factors, or none, each get their own
/// table, and a node that rewrites the factors between two ROPEs reading them makes the second
/// fill its table again.
#[test]
fn rope_tables_follow_the_frequency_factors() {
    let Some(dev) = first_device() else {
        return;
    };
    let exact = exact_rope(&dev);
    let mut gpu = dev.init_backend(&Default::default()).unwrap();
    let (ne0, n) = (16, 5);
    let rp = RopeParams::new(RopeMode::Neox, ne0, 10000.0);
    let build = |be: &dyn Backend| {
        let mut ctx = Context::new();
        let x = ctx.new_tensor(DType::F32, &[ne0, 2, n]).unwrap();
        let pos = ctx.new_tensor(DType::I32, &[n]).unwrap();
        let f1 = ctx.new_tensor(DType::F32, &[ne0 / 2]).unwrap();
        let f2 = ctx.new_tensor(DType::F32, &[ne0 / 2]).unwrap();
        let r0 = ctx.rope(x, pos, rp).unwrap();
        let r1 = ctx.rope_ext(x, pos, Some(f1), rp).unwrap();
        let r2 = ctx.rope_ext(x, pos, Some(f2), rp).unwrap();
        let doubled = ctx.scale(f2, 2.0).unwrap();
        let r3 = ctx.rope_ext(x, pos, Some(f2), rp).unwrap();
        // Outputs are ordered as given: r2, then f2 doubled in place, then r3 reads f2 again.
        let graph = Graph::build(&mut ctx, &[r0, r1, r2, doubled, r3]).unwrap();
        let buf = alloc_ctx_tensors(&mut ctx, &be.default_buffer_type()).unwrap();
        let f2_data = ctx[f2].data.clone();
        ctx.get_mut(doubled).unwrap().data = f2_data;
        let mut rng = StdRng::seed_from_u64(5);
        ctx.tensor_set_f32(x, &values(&mut rng, ne0 * 2 * n))
            .unwrap();
        ctx.tensor_set_i32(pos, &[0, 7, 300, 4095, 12]).unwrap();
        ctx.tensor_set_f32(f1, &[1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 8.0, 8.0])
            .unwrap();
        ctx.tensor_set_f32(f2, &[1.5, 1.5, 1.5, 3.0, 3.0, 6.0, 6.0, 7.5])
            .unwrap();
        (ctx, graph, [r0, r1, r2, r3], buf)
    };
    let mut cpu = cpu_backend();
    let (c_ctx, c_graph, c_outs, _cb) = build(cpu.as_ref());
    let (g_ctx, g_graph, g_outs, _gb) = build(gpu.as_ref());
    cpu.graph_compute(&c_ctx, &c_graph).unwrap();
    gpu.graph_compute(&g_ctx, &g_graph).unwrap();
    let mut seen = Vec::new();
    for (k, (&c, &g)) in c_outs.iter().zip(&g_outs).enumerate() {
        let want = c_ctx.tensor_get_f32(c).unwrap();
        let got = g_ctx.tensor_get_f32(g).unwrap();
        if exact {
            assert_eq!(bits(&got), bits(&want), "rope {k}");
        } else {
            for (x, y) in got.iter().zip(&want) {
                assert!((x - y).abs() <= 1e-3 * (1.0 + y.abs()), "rope {k}");
            }
        }
        assert!(
            !seen.contains(&bits(&want)),
            "rope {k} repeats an earlier one"
        );
        seen.push(bits(&want));
    }
}

/// ROPE of rows (1, 0) with two dims is the table itself: (cos θ, sin θ) with θ =
/// freq_scale · pos. Many angles of every size (the fast reduction below 120, the fixed-point
/// one above, tiny ones) must be libm's `cosf` / `sinf` bit for bit.
#[test]
fn rope_cos_sin_are_libm_bit_for_bit() {
    let Some(dev) = first_device() else {
        return;
    };
    if !exact_rope(&dev) {
        eprintln!("no f64 on this device: its ROPE table uses the device's cos / sin");
        return;
    }
    let mut gpu = dev.init_backend(&Default::default()).unwrap();
    let mut rng = StdRng::seed_from_u64(12);
    const N: usize = 1 << 16;
    use std::f32::consts::{FRAC_PI_2, FRAC_PI_4};
    // Steps near π/4 and π/2 put angles near the reductions' boundaries and cos / sin zeros.
    for freq_scale in [1.0f32, 0.001, FRAC_PI_4, FRAC_PI_2, 1e-5, 3.3] {
        let mut rp = RopeParams::new(RopeMode::Normal, 2, 10000.0);
        rp.freq_scale = freq_scale;
        let mut ctx = Context::new();
        let x = ctx.new_tensor(DType::F32, &[2, 1, N]).unwrap();
        let pos = ctx.new_tensor(DType::I32, &[N]).unwrap();
        let r = ctx.rope(x, pos, rp).unwrap();
        let graph = Graph::build(&mut ctx, &[r]).unwrap();
        let _buf = alloc_ctx_tensors(&mut ctx, &gpu.default_buffer_type()).unwrap();
        let ones: Vec<f32> = (0..N).flat_map(|_| [1.0, 0.0]).collect();
        ctx.tensor_set_f32(x, &ones).unwrap();
        let positions: Vec<i32> = (0..N)
            .map(|i| match i % 4 {
                0 => i as i32 - (N / 2) as i32,
                1 => rng.gen_range(-200..200),
                2 => rng.gen_range(-100_000..100_000),
                _ => rng.gen(),
            })
            .collect();
        ctx.tensor_set(pos, 0, bytemuck::cast_slice(&positions))
            .unwrap();
        gpu.graph_compute(&ctx, &graph).unwrap();
        let got = ctx.tensor_get_f32(r).unwrap();
        let mut bad = Vec::new();
        for (i, &p) in positions.iter().enumerate() {
            let theta = freq_scale * p as f32;
            let want = [theta.cos(), theta.sin()];
            if got[2 * i].to_bits() != want[0].to_bits()
                || got[2 * i + 1].to_bits() != want[1].to_bits()
            {
                bad.push(format!(
                    "θ {theta:e}: ({}, {}) vs libm ({}, {})",
                    got[2 * i],
                    got[2 * i + 1],
                    want[0],
                    want[1]
                ));
            }
        }
        assert!(
            bad.is_empty(),
            "freq_scale {freq_scale}: {} of {N} differ:\n{}",
            bad.len(),
            bad[..bad.len().min(10)].join("\n")
        );
    }
}
