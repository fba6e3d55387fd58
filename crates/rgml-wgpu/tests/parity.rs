//! The GPU computes the ops of the LLaMA graph with ggml-cpu's arithmetic, bit for bit: each
//! node on the first wgpu device must equal the CPU backend's (AVX-512-build arithmetic, the
//! llama.cpp build our fixtures come from) exactly, on random data of the demo model's shapes.
//! Tiny differences matter: the demo model amplifies a one-ulp change in an activation that
//! flips one Q8 quant into logit differences of tenths, so only exact kernels give llama.cpp's
//! answers.
//!
//! Without an adapter the tests skip, unless `RGML_REQUIRE_GPU=1`.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rgml::alloc::alloc_ctx_tensors;
use rgml::backend::BackendParams;
use rgml::compare::compare_graph_backend;
use rgml::{Context, DType, DeviceRef, Graph, RopeMode, RopeParams, TensorId};
mod common;
use common::first_device as gpu;

/// The CPU backend mirrors the native ggml build of the CPU it runs on by default; the GPU
/// mirrors the AVX-512 build, so the CPU backend is opened with that arithmetic (which runs on
/// any CPU).
fn cpu_like_the_gpu() -> BackendParams {
    BackendParams::parse("isa=avx512").unwrap()
}

/// Activations of a transformer's scale: roughly normal, a few large.
fn values(rng: &mut StdRng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let x: f32 = rng.gen_range(-1.0..1.0) + rng.gen_range(-1.0..1.0);
            let big = if rng.gen_range(0..50) == 0 { 8.0 } else { 1.0 };
            x * scale * big
        })
        .collect()
}

struct Case {
    ctx: Context,
    rng: StdRng,
    leafs: Vec<(TensorId, Vec<u8>)>,
}

impl Case {
    fn new(seed: u64) -> Case {
        Case {
            ctx: Context::new(),
            rng: StdRng::seed_from_u64(seed),
            leafs: Vec::new(),
        }
    }

    /// A leaf of `dtype` holding random values (quantized or rounded to the type).
    fn leaf(&mut self, dtype: DType, dims: &[usize], scale: f32) -> TensorId {
        let id = self.ctx.new_tensor(dtype, dims).unwrap();
        let n: usize = dims.iter().product();
        let v = values(&mut self.rng, n, scale);
        let bytes = match dtype {
            DType::F32 => bytemuck::cast_slice(&v).to_vec(),
            DType::F16 => v
                .iter()
                .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
                .collect(),
            _ => {
                let mut out = vec![0u8; dtype.row_bytes(n).unwrap()];
                rgml::quant::quantize_row(dtype, &v, &mut out).unwrap();
                out
            }
        };
        self.leafs.push((id, bytes));
        id
    }

    fn index_leaf(&mut self, dims: &[usize], below: i32) -> TensorId {
        let id = self.ctx.new_tensor(DType::I32, dims).unwrap();
        let n: usize = dims.iter().product();
        let v: Vec<i32> = (0..n).map(|_| self.rng.gen_range(0..below)).collect();
        self.leafs.push((id, bytemuck::cast_slice(&v).to_vec()));
        id
    }

    /// Compute `outputs` node by node on the CPU and the GPU; every node must match exactly.
    fn check(mut self, outputs: &[TensorId]) {
        let Some(dev) = gpu() else {
            return;
        };
        let cpu: DeviceRef = rgml_cpu::CpuDevice::new("CPU");
        let _buf = alloc_ctx_tensors(&mut self.ctx, &cpu.buffer_type()).unwrap();
        for (id, bytes) in &self.leafs {
            self.ctx.tensor_set(*id, 0, bytes).unwrap();
        }
        let graph = Graph::build(&mut self.ctx, outputs).unwrap();
        let mut b_cpu = cpu.init_backend(&cpu_like_the_gpu()).unwrap();
        let mut b_gpu = dev.init_backend(&Default::default()).unwrap();
        let mut bad = Vec::new();
        compare_graph_backend(
            &self.ctx,
            &graph,
            b_cpu.as_mut(),
            b_gpu.as_mut(),
            0.0,
            &mut |c| {
                if c.max_abs != 0.0 || c.nonfinite_mismatch || c.nmse.is_nan() {
                    bad.push(format!(
                        "#{} {} {:?}: max_abs {:e}, nmse {:e}",
                        c.index, c.name, c.op, c.max_abs, c.nmse
                    ));
                }
                true
            },
        )
        .unwrap();
        assert!(bad.is_empty(), "not bit-exact:\n{}", bad.join("\n"));
    }
}

#[test]
fn quantized_mul_mat_is_exact() {
    for (seed, wtype) in [(1, DType::Q4_1), (2, DType::Q8_0), (3, DType::Q4_0)] {
        let mut c = Case::new(seed);
        let w = c.leaf(wtype, &[576, 96], 0.05);
        let x = c.leaf(DType::F32, &[576, 7], 1.0);
        let one = c.leaf(DType::F32, &[576, 1], 1.0);
        let y = c.ctx.mul_mat(w, x).unwrap();
        let z = c.ctx.mul_mat(w, one).unwrap();
        c.check(&[y, z]);
    }
}

#[test]
fn float_mul_mat_is_exact() {
    let mut c = Case::new(4);
    // Attention's shapes: K [64, n_kv, heads_kv] against Q [64, n_tokens, heads] (broadcast).
    let k = c.leaf(DType::F16, &[64, 37, 3], 1.0);
    let q = c.leaf(DType::F32, &[64, 7, 9], 1.0);
    let kq = c.ctx.mul_mat(k, q).unwrap();
    let a = c.leaf(DType::F32, &[64, 20], 1.0);
    let b = c.leaf(DType::F32, &[64, 3], 1.0);
    let ab = c.ctx.mul_mat(a, b).unwrap();
    // One column (generation): the matrix-vector kernel.
    let q1 = c.leaf(DType::F32, &[64, 1, 9], 1.0);
    let kq1 = c.ctx.mul_mat(k, q1).unwrap();
    let b1 = c.leaf(DType::F32, &[64, 1], 1.0);
    let ab1 = c.ctx.mul_mat(a, b1).unwrap();
    c.check(&[kq, ab, kq1, ab1]);
}

#[test]
fn norm_rope_softmax_swiglu_are_exact() {
    let mut c = Case::new(5);
    let x = c.leaf(DType::F32, &[576, 7], 1.0);
    let g = c.leaf(DType::F32, &[576], 1.0);
    let n = c.ctx.rms_norm(x, 1e-5).unwrap();
    let n = c.ctx.mul(n, g).unwrap();
    let h = c.leaf(DType::F32, &[64, 9, 7], 1.0);
    let pos = c.index_leaf(&[7], 500);
    let r = c
        .ctx
        .rope(h, pos, RopeParams::new(RopeMode::Neox, 64, 100000.0))
        .unwrap();
    let s = c.leaf(DType::F32, &[32, 7, 9], 3.0);
    let mask = c.leaf(DType::F16, &[32, 7], 1.0);
    let sm = c.ctx.soft_max_ext(s, Some(mask), 0.125, 0.0).unwrap();
    let a = c.leaf(DType::F32, &[1536, 7], 2.0);
    let b = c.leaf(DType::F32, &[1536, 7], 2.0);
    let sw = c.ctx.swiglu(a, b).unwrap();
    let si = c.ctx.silu(a).unwrap();
    c.check(&[n, r, sm, sw, si]);
}

/// NORM (BERT's layer norm), rows of a multiple of 16 and with a tail, large and small values:
/// the mean's f64 sum, the variance's groups of 16 and tail as ggml-cpu's AVX-512 build. (With
/// the squares written `v * v`, lavapipe fused them into `hsum16`'s additions: one row in 40
/// of `big` had its scale an ulp off.)
#[test]
fn layer_norm_is_exact() {
    let mut c = Case::new(7);
    let x = c.leaf(DType::F32, &[384, 5], 1.0);
    let tail = c.leaf(DType::F32, &[45, 6, 2], 1.0);
    let big = c.leaf(DType::F32, &[48, 40], 30.0);
    let bt = c.ctx.norm(big, 1e-5).unwrap();
    let one = c.leaf(DType::F32, &[7, 1], 0.01);
    let g = c.leaf(DType::F32, &[384], 1.0);
    let n = c.ctx.norm(x, 1e-12).unwrap();
    let n = c.ctx.mul(n, g).unwrap();
    let t = c.ctx.norm(tail, 1e-5).unwrap();
    let o = c.ctx.norm(one, 1e-5).unwrap();
    c.check(&[n, t, o, bt]);
}

/// Rows whose length is not a multiple of 16: ggml-cpu's AVX-512 loops leave a row's last
/// `ne0 % 16` elements to libm's `expf`, so the GPU computes glibc's `expf` there. Found on
/// Qwen3.5-MoE's router: SOFT_MAX over 2 experts (all tail) for one token, a generation step.
#[test]
fn softmax_and_silu_row_tails_are_exact() {
    let mut c = Case::new(6);
    // The router of a generation step, then many such rows, then rows whose exp(x - max)
    // spans a wide range (down to underflow).
    let router = c.leaf(DType::F32, &[2, 1], 1.0);
    let routers = c.leaf(DType::F32, &[2, 300], 1.0);
    let wide = c.leaf(DType::F32, &[37, 40, 3], 12.0);
    let sm = [router, routers, wide].map(|x| c.ctx.soft_max(x).unwrap());
    // Gate and up as the halves of fused experts' rows (strided views), 45 wide: 2 groups of
    // 16 and a tail of 13.
    let both = c.leaf(DType::F32, &[90, 2, 7], 4.0);
    let nb = c.ctx[both].nb;
    let gate = c.ctx.view(both, &[45, 2, 7], &[nb[1], nb[2]], 0).unwrap();
    let up = c
        .ctx
        .view(both, &[45, 2, 7], &[nb[1], nb[2]], 45 * 4)
        .unwrap();
    let sw = c.ctx.swiglu(gate, up).unwrap();
    let x = c.leaf(DType::F32, &[45, 50], 8.0);
    let si = c.ctx.silu(x).unwrap();
    c.check(&[sm[0], sm[1], sm[2], sw, si]);
}
