//! The LLaMA graph of one micro-batch: what it depends on ([`GraphKey`]), its inputs and
//! outputs ([`BatchGraph`]), and how it is built on top of the model's weights and the KV cache.
//!
//! This module owns the graph's shape and llama.cpp's node names; it allocates and computes
//! nothing.

use super::kv_cache::KvCache;
use crate::error::Result;
use crate::model::{LayerWeights, Model};
use rgml::{Context, DType, Graph, RopeParams, TensorFlags, TensorId};

/// What a built graph depends on besides the weights and the cache: the graph is the same
/// for every micro-batch with the same key, wherever in the sequence it goes (the cache rows
/// written and the mask are inputs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct GraphKey {
    pub(super) n_tokens: usize,
    pub(super) n_kv: usize,
    pub(super) all_logits: bool,
}

/// The input tensors and the logits of one built graph.
pub(super) struct BatchGraph {
    pub(super) graph: Graph,
    pub(super) tokens: TensorId,
    pub(super) positions: TensorId,
    pub(super) mask: TensorId,
    pub(super) logits: TensorId,
    /// Intermediates named and kept for [`Session::set_capture`].
    pub(super) captured: Vec<TensorId>,
    /// Nodes to run on a given device (index into the model's devices) when split: the norms,
    /// which the scheduler would otherwise leave on the previous block's device, so that the
    /// hidden state would cross twice (llama.cpp pins them the same way).
    pub(super) pins: Vec<(TensorId, usize)>,
}

/// The LLaMA graph for a micro-batch of `key.n_tokens` tokens attending to `key.n_kv` cache
/// cells; where the batch goes in the sequence is only in its inputs (positions, mask).
pub(super) fn build_graph(
    ctx: &mut Context,
    model: &Model,
    kv: &KvCache,
    key: GraphKey,
    capture: bool,
) -> Result<BatchGraph> {
    let GraphKey {
        n_tokens: n,
        n_kv,
        all_logits,
    } = key;
    let (tokens, positions, mask) = inputs(ctx, n, n_kv)?;
    let c = &model.config;
    let mut rope = RopeParams::new(c.rope_mode, c.n_rot, c.rope_freq_base);
    rope.freq_scale = c.rope_freq_scale;
    rope.n_ctx_orig = c.n_ctx_train;
    let mut b = Builder {
        ctx,
        model,
        kv,
        n,
        n_kv,
        positions,
        mask,
        rope,
        kq_scale: 1.0 / (c.head_dim as f32).sqrt(),
        last_only: !all_logits && n > 1,
        capture,
        captured: Vec::new(),
        pins: Vec::new(),
        graph: Graph::new(),
    };
    let inp_embd = b.ctx.get_rows(model.tok_embd, tokens)?;
    let mut x = b.keep(inp_embd, "inp_embd".into())?;
    for (il, l) in model.layers.iter().enumerate() {
        x = b.layer(il, l, x)?;
    }
    let logits = b.output(x, all_logits)?;
    Ok(BatchGraph {
        graph: b.graph,
        tokens,
        positions,
        mask,
        logits,
        captured: b.captured,
        pins: b.pins,
    })
}

/// The graph's inputs for `n` tokens attending to `n_kv` cells: token ids, positions, mask.
fn inputs(ctx: &mut Context, n: usize, n_kv: usize) -> Result<(TensorId, TensorId, TensorId)> {
    let tokens = ctx.new_tensor(DType::I32, &[n])?;
    ctx.set_name(tokens, "inp_tokens")?;
    let positions = ctx.new_tensor(DType::I32, &[n])?;
    ctx.set_name(positions, "inp_pos")?;
    let mask = ctx.new_tensor(DType::F32, &[n_kv, n])?;
    ctx.set_name(mask, "kq_mask")?;
    for id in [tokens, positions, mask] {
        ctx.set_flags(id, TensorFlags::INPUT)?;
    }
    Ok((tokens, positions, mask))
}

/// What [`build_graph`]'s blocks share while they add their nodes.
struct Builder<'a> {
    ctx: &'a mut Context,
    model: &'a Model,
    kv: &'a KvCache,
    /// Tokens in the batch.
    n: usize,
    /// Cache cells attended to.
    n_kv: usize,
    positions: TensorId,
    mask: TensorId,
    rope: RopeParams,
    kq_scale: f32,
    /// Only the last position's logits are wanted (and the batch has several positions).
    last_only: bool,
    capture: bool,
    captured: Vec<TensorId>,
    pins: Vec<(TensorId, usize)>,
    graph: Graph,
}

impl Builder<'_> {
    /// Names `id` like llama.cpp and, when capturing, keeps it.
    fn keep(&mut self, id: TensorId, name: String) -> Result<TensorId> {
        // Named always, so an eval callback can pick nodes by name.
        self.ctx.set_name(id, name)?;
        if self.capture && self.ctx[id].is_contiguous() {
            self.ctx.set_output(id)?;
            self.captured.push(id);
        }
        Ok(id)
    }

    /// RMS norm of `x` times `weight`, the norm pinned to device `dev`.
    fn norm(&mut self, x: TensorId, weight: TensorId, dev: usize) -> Result<TensorId> {
        let cur = self.ctx.rms_norm(x, self.model.config.rms_eps)?;
        self.pins.push((cur, dev));
        Ok(self.ctx.mul(cur, weight)?)
    }

    /// Block `il`: attention, then the FFN, each with its residual; returns the block's output.
    fn layer(&mut self, il: usize, l: &LayerWeights, x: TensorId) -> Result<TensorId> {
        let dev = self.model.layer_device(il).unwrap_or(0);
        let cur = self.norm(x, l.attn_norm, dev)?;
        let cur = self.keep(cur, format!("attn_norm-{il}"))?;
        let (q, k, v) = self.qkv(il, l, cur)?;
        self.store_kv(il, k, v)?;
        let mut attn = self.attention(il, l, q)?;
        let mut x = x;
        if self.last_only && il + 1 == self.model.layers.len() {
            // As llama.cpp (`inp_out_ids`): the last block's FFN runs on the output position
            // only. Not only faster: F16/BF16/F32 weights by one activation row take ggml's
            // `vec_dot` order, not tinyBLAS's, so this gives llama.cpp's logits bit for bit.
            attn = self.last_row(attn)?;
            x = self.last_row(x)?;
        }
        let x_attn = self.ctx.add(attn, x)?;
        let x_attn = self.keep(x_attn, format!("ffn_inp-{il}"))?;
        self.ffn(il, l, x_attn, dev)
    }

    /// The last position's row `[n_embd, 1]` of the `[n_embd, n]` tensor `x` (a view).
    fn last_row(&mut self, x: TensorId) -> Result<TensorId> {
        let (ne0, nrows, row) = (self.ctx[x].ne[0], self.ctx[x].ne[1], self.ctx[x].nb[1]);
        Ok(self.ctx.view(x, &[ne0, 1], &[row], (nrows - 1) * row)?)
    }

    /// Q, K and V of the normed input `cur`, Q and K roped (`[hd, heads, n]`), V flat.
    fn qkv(
        &mut self,
        il: usize,
        l: &LayerWeights,
        cur: TensorId,
    ) -> Result<(TensorId, TensorId, TensorId)> {
        let c = &self.model.config;
        let (hd, n) = (c.head_dim, self.n);
        let mut q = self.ctx.mul_mat(l.wq, cur)?;
        let mut k = self.ctx.mul_mat(l.wk, cur)?;
        let mut v = self.ctx.mul_mat(l.wv, cur)?;
        if let Some(b) = l.bq {
            q = self.ctx.add(q, b)?;
        }
        if let Some(b) = l.bk {
            k = self.ctx.add(k, b)?;
        }
        if let Some(b) = l.bv {
            v = self.ctx.add(v, b)?;
        }
        let q = self.ctx.reshape(q, &[hd, c.n_head, n])?;
        let q = self.ctx.rope(q, self.positions, self.rope)?;
        let q = self.keep(q, format!("Qcur-{il}"))?;
        let k = self.ctx.reshape(k, &[hd, c.n_head_kv, n])?;
        let k = self.ctx.rope(k, self.positions, self.rope)?;
        let k = self.keep(k, format!("Kcur-{il}"))?;
        Ok((q, k, v))
    }

    /// Store this batch's K and V in layer `il`'s cache, at the rows the positions name
    /// (SET_ROWS, as llama.cpp stores them): the graph then does not depend on where the batch
    /// goes, so decoding reuses one graph for many tokens (see `Session::eval_ubatch`).
    fn store_kv(&mut self, il: usize, k: TensorId, v: TensorId) -> Result<()> {
        let (n, n_embd_kv) = (self.n, self.model.config.n_embd_kv());
        let (cells, f16) = (self.kv.cells, DType::F16.block_bytes());
        let k_flat = self.ctx.reshape(k, &[n_embd_kv, n])?;
        let k_store = self.ctx.set_rows(self.kv.k[il], k_flat, self.positions)?;
        // V is stored transposed: its "rows" are single elements, one per position, in a
        // `[1, cells, n_embd_kv]` view of the cache, and the batch's values are the matching
        // `[1, n, n_embd_kv]` view of `v`.
        let v_cells = self.ctx.view(
            self.kv.v[il],
            &[1, cells, n_embd_kv],
            &[f16, cells * f16],
            0,
        )?;
        let f32b = DType::F32.block_bytes();
        let v_rows = self
            .ctx
            .view(v, &[1, n, n_embd_kv], &[n_embd_kv * f32b, f32b], 0)?;
        let v_store = self.ctx.set_rows(v_cells, v_rows, self.positions)?;

        // The stores enter the graph before anything that reads the cache, so they run first
        // (as in llama.cpp: the order of expansion is the order of execution).
        self.graph.expand(self.ctx, k_store)?;
        self.graph.expand(self.ctx, v_store)?;
        Ok(())
    }

    /// Attention of the roped `q` over every cached position of layer `il`, through the
    /// output projection.
    fn attention(&mut self, il: usize, l: &LayerWeights, q: TensorId) -> Result<TensorId> {
        let c = &self.model.config;
        let (hd, n_embd_kv) = (c.head_dim, c.n_embd_kv());
        let (cells, f16) = (self.kv.cells, DType::F16.block_bytes());
        let k_all = self.ctx.view(
            self.kv.k[il],
            &[hd, c.n_head_kv, self.n_kv],
            &[hd * f16, n_embd_kv * f16],
            0,
        )?;
        let k_all = self.ctx.permute(k_all, [0, 2, 1, 3])?; // [hd, n_kv, n_head_kv]
        let q = self.ctx.permute(q, [0, 2, 1, 3])?; // [hd, n, n_head]
        let kq = self.ctx.mul_mat(k_all, q)?; // [n_kv, n, n_head]
        let kq = self.keep(kq, format!("kq-{il}"))?;
        let kq = self
            .ctx
            .soft_max_ext(kq, Some(self.mask), self.kq_scale, 0.0)?;
        let kq = self.keep(kq, format!("kq_soft_max-{il}"))?;
        let v_all = self.ctx.view(
            self.kv.v[il],
            &[self.n_kv, hd, c.n_head_kv],
            &[cells * f16, cells * f16 * hd],
            0,
        )?;
        let kqv = self.ctx.mul_mat(v_all, kq)?; // [hd, n, n_head]
        let kqv = self.ctx.permute(kqv, [0, 2, 1, 3])?; // [hd, n_head, n]
        let attn = self.ctx.cont_shape(kqv, &[c.n_embd, self.n])?;
        let attn = self.keep(attn, format!("kqv_out-{il}"))?;
        let attn = self.ctx.mul_mat(l.wo, attn)?;
        self.keep(attn, format!("attn_out-{il}"))
    }

    /// The FFN of layer `il` on `x_attn` (SwiGLU), with its residual: the block's output.
    fn ffn(
        &mut self,
        il: usize,
        l: &LayerWeights,
        x_attn: TensorId,
        dev: usize,
    ) -> Result<TensorId> {
        let cur = self.norm(x_attn, l.ffn_norm, dev)?;
        let cur = self.keep(cur, format!("ffn_norm-{il}"))?;
        let gate = self.ctx.mul_mat(l.ffn_gate, cur)?;
        let up = self.ctx.mul_mat(l.ffn_up, cur)?;
        let gate = self.keep(gate, format!("ffn_gate-{il}"))?;
        let up = self.keep(up, format!("ffn_up-{il}"))?;
        let act = self.ctx.swiglu(gate, up)?;
        let act = self.keep(act, format!("ffn_swiglu-{il}"))?;
        let down = self.ctx.mul_mat(l.ffn_down, act)?;
        let down = self.keep(down, format!("ffn_out-{il}"))?;
        let x = self.ctx.add(down, x_attn)?;
        self.keep(x, format!("l_out-{il}"))
    }

    /// The output head on the last block's `x`: the logits of every position, or of the last
    /// only unless `all_logits`; expanded into the graph.
    fn output(&mut self, mut x: TensorId, all_logits: bool) -> Result<TensorId> {
        if !all_logits && self.ctx[x].ne[1] > 1 {
            // Only the last position's logits are needed: skip the output projection for the
            // rest (the last block has already done so unless the model has no blocks).
            x = self.last_row(x)?;
        }
        let cur = self.ctx.rms_norm(x, self.model.config.rms_eps)?;
        self.pins.push((cur, self.model.devices().len() - 1));
        let cur = self.ctx.mul(cur, self.model.output_norm)?;
        let cur = self.keep(cur, "result_norm".into())?;
        let logits = self.ctx.mul_mat(self.model.output, cur)?;
        self.ctx.set_name(logits, "logits")?;
        self.ctx.set_output(logits)?;
        self.graph.expand(self.ctx, logits)?;
        Ok(logits)
    }
}
