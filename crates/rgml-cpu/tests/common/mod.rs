//! A small decode-like graph shared by the job-cache and no-allocation tests: RMS_NORM, MUL,
//! MUL_MAT (Q8_0, F32 and F16 weights), ROPE, SET_ROWS into an F16 cache, SOFT_MAX with a
//! mask, GET_ROWS of Q4_0 rows and ADD, on deterministic non-zero data.

#![allow(dead_code)]

use rgml::alloc::align_up;
use rgml::backend::Buffer;
use rgml::quant::quantize_row;
use rgml::{Context, DType, Device, Graph, RopeMode, RopeParams, TensorId};
use rgml_cpu::CpuDevice;
use std::sync::Arc;

pub struct Net {
    pub ctx: Context,
    pub graph: Graph,
    /// Leaf tensors (weights and inputs), filled by [`Net::fill`].
    pub leaves: Vec<TensorId>,
    /// The activations input.
    pub x: TensorId,
    /// The graph's outputs (softmax probabilities, the embedding sum).
    pub outs: [TensorId; 2],
    /// The SOFT_MAX node.
    pub softmax: TensorId,
}

/// Deterministic values in [-1, 1], none near zero.
pub fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let v = (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
            if v.abs() < 0.01 {
                0.5
            } else {
                v
            }
        })
        .collect()
}

/// Fill `id` (F32/F16/quantized rows, or small distinct I32 values) from `seed`.
pub fn set(ctx: &Context, id: TensorId, seed: u64) {
    let t = &ctx[id];
    if t.dtype == DType::I32 {
        let n = t.nelements();
        // Distinct (SET_ROWS must not write one row twice) and small (row indices).
        let v: Vec<i32> = (0..n).map(|i| i as i32 + (seed % 3) as i32).collect();
        ctx.tensor_set_i32(id, &v).unwrap();
        return;
    }
    let (k, rows) = (t.ne[0], t.nelements() / t.ne[0]);
    let v = values(k * rows, seed);
    let row_bytes = t.dtype.row_bytes(k).unwrap();
    let mut bytes = vec![0u8; row_bytes * rows];
    for (src, dst) in v.chunks_exact(k).zip(bytes.chunks_exact_mut(row_bytes)) {
        quantize_row(t.dtype, src, dst).unwrap();
    }
    ctx.tensor_set(id, 0, &bytes).unwrap();
}

/// Bytes a placement of `ctx`'s tensors needs after `shift`.
pub fn bytes_needed(ctx: &Context, shift: usize) -> usize {
    let bt = CpuDevice::new("CPU").buffer_type();
    let mut end = shift;
    for id in ctx.ids() {
        if ctx[id].view_src.is_none() {
            end = align_up(end, bt.alignment()) + bt.alloc_size(&ctx[id]);
        }
    }
    end
}

/// A CPU buffer of `size` bytes.
pub fn buffer(size: usize) -> Arc<Buffer> {
    Buffer::alloc(&CpuDevice::new("CPU").buffer_type(), size).unwrap()
}

/// Place every tensor of `ctx` in `buffer`, one after another from byte `shift` (views at
/// their sources).
pub fn place(ctx: &mut Context, buffer: &Arc<Buffer>, shift: usize) {
    let ids: Vec<TensorId> = ctx.ids().collect();
    let mut offset = shift;
    for &id in &ids {
        if ctx[id].view_src.is_none() {
            offset = align_up(offset, buffer.alignment());
            let size = buffer.alloc_size(&ctx[id]);
            ctx.set_data(id, buffer.clone(), offset).unwrap();
            offset += size;
        }
    }
    for &id in &ids {
        if ctx[id].view_src.is_some() {
            ctx.init_view(id).unwrap();
        }
    }
}

impl Net {
    /// The graph, its tensors placed in a new buffer from byte `shift`, leaves filled.
    pub fn new(shift: usize) -> Net {
        use DType::*;
        let mut ctx = Context::new();
        let leaf =
            |ctx: &mut Context, dtype: DType, dims: &[usize]| ctx.new_tensor(dtype, dims).unwrap();
        let x = leaf(&mut ctx, F32, &[64, 2]);
        let w_norm = leaf(&mut ctx, F32, &[64]);
        let wq = leaf(&mut ctx, Q8_0, &[64, 64]);
        let wk = leaf(&mut ctx, F32, &[64, 64]);
        let kcache = leaf(&mut ctx, F16, &[64, 8]);
        let kidx = leaf(&mut ctx, I32, &[2]);
        let pos = leaf(&mut ctx, I32, &[2]);
        let mask = leaf(&mut ctx, F32, &[8, 2]);
        let emb = leaf(&mut ctx, Q4_0, &[64, 10]);
        let ids = leaf(&mut ctx, I32, &[2]);
        let leaves = vec![x, w_norm, wq, wk, kcache, kidx, pos, mask, emb, ids];

        let rope = RopeParams::new(RopeMode::Normal, 16, 10000.0);
        let n = ctx.rms_norm(x, 1e-5).unwrap();
        let n = ctx.mul(n, w_norm).unwrap();
        let q = ctx.mul_mat(wq, n).unwrap();
        let k = ctx.mul_mat(wk, n).unwrap();
        let q = ctx.reshape(q, &[16, 4, 2]).unwrap();
        let q = ctx.rope(q, pos, rope).unwrap();
        let q = ctx.reshape(q, &[64, 2]).unwrap();
        let k = ctx.reshape(k, &[16, 4, 2]).unwrap();
        let k = ctx.rope(k, pos, rope).unwrap();
        let k = ctx.reshape(k, &[64, 2]).unwrap();
        let kc = ctx.set_rows(kcache, k, kidx).unwrap();
        let scores = ctx.mul_mat(kc, q).unwrap();
        let softmax = ctx.soft_max_ext(scores, Some(mask), 0.125, 0.0).unwrap();
        let e = ctx.get_rows(emb, ids).unwrap();
        let sum = ctx.add(e, n).unwrap();
        let graph = Graph::build(&mut ctx, &[softmax, sum]).unwrap();

        let buf = buffer(bytes_needed(&ctx, shift));
        place(&mut ctx, &buf, shift);
        let net = Net {
            ctx,
            graph,
            leaves,
            x,
            outs: [softmax, sum],
            softmax,
        };
        net.fill(1);
        net
    }

    /// Fill the leaves with values of `seed`.
    pub fn fill(&self, seed: u64) {
        for (i, &id) in self.leaves.iter().enumerate() {
            set(&self.ctx, id, seed * 100 + i as u64);
        }
    }

    /// The outputs' bytes.
    pub fn outputs(&self) -> Vec<Vec<u8>> {
        self.outs
            .iter()
            .map(|&o| self.ctx.tensor_bytes(o).unwrap())
            .collect()
    }
}
