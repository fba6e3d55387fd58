//! The LLaMA graph of one micro-batch: what it depends on ([`GraphKey`]), its inputs and
//! outputs ([`BatchGraph`]), and how it is built on top of the model's weights and the KV cache.
//!
//! This module owns the graph's shape and llama.cpp's node names; it allocates and computes
//! nothing.

use super::kv_cache::KvCache;
use crate::error::Result;
use crate::model::Model;
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
    let mut captured = Vec::new();
    let mut pins = Vec::new();
    // Names `id` like llama.cpp and, when capturing, keeps it.
    let mut keep = |ctx: &mut Context, id: TensorId, name: String| -> Result<TensorId> {
        // Named always, so an eval callback can pick nodes by name.
        ctx.set_name(id, name)?;
        if capture && ctx[id].is_contiguous() {
            ctx.set_output(id)?;
            captured.push(id);
        }
        Ok(id)
    };
    let c = &model.config;
    let (hd, n_embd_kv) = (c.head_dim, c.n_embd_kv());
    let f16 = DType::F16.block_bytes();

    let tokens = ctx.new_tensor(DType::I32, &[n])?;
    ctx.set_name(tokens, "inp_tokens")?;
    let positions = ctx.new_tensor(DType::I32, &[n])?;
    ctx.set_name(positions, "inp_pos")?;
    let mask = ctx.new_tensor(DType::F32, &[n_kv, n])?;
    ctx.set_name(mask, "kq_mask")?;
    for id in [tokens, positions, mask] {
        ctx.set_flags(id, TensorFlags::INPUT)?;
    }

    let mut rope = RopeParams::new(c.rope_mode, c.n_rot, c.rope_freq_base);
    rope.freq_scale = c.rope_freq_scale;
    rope.n_ctx_orig = c.n_ctx_train;
    let kq_scale = 1.0 / (hd as f32).sqrt();

    let mut graph = Graph::new();
    let inp_embd = ctx.get_rows(model.tok_embd, tokens)?;
    let mut x = keep(ctx, inp_embd, "inp_embd".into())?;
    for (il, l) in model.layers.iter().enumerate() {
        let dev = model.layer_device(il).unwrap_or(0);
        let cur = ctx.rms_norm(x, c.rms_eps)?;
        pins.push((cur, dev));
        let cur = ctx.mul(cur, l.attn_norm)?;
        let cur = keep(ctx, cur, format!("attn_norm-{il}"))?;

        let mut q = ctx.mul_mat(l.wq, cur)?;
        let mut k = ctx.mul_mat(l.wk, cur)?;
        let mut v = ctx.mul_mat(l.wv, cur)?;
        if let Some(b) = l.bq {
            q = ctx.add(q, b)?;
        }
        if let Some(b) = l.bk {
            k = ctx.add(k, b)?;
        }
        if let Some(b) = l.bv {
            v = ctx.add(v, b)?;
        }
        let q = ctx.reshape(q, &[hd, c.n_head, n])?;
        let q = ctx.rope(q, positions, rope)?;
        let q = keep(ctx, q, format!("Qcur-{il}"))?;
        let k = ctx.reshape(k, &[hd, c.n_head_kv, n])?;
        let k = ctx.rope(k, positions, rope)?;
        let k = keep(ctx, k, format!("Kcur-{il}"))?;

        // Store this batch's K and V in the cache, at the rows the positions name (SET_ROWS,
        // as llama.cpp stores them): the graph then does not depend on where the batch goes,
        // so decoding reuses one graph for many tokens (see `Session::eval_ubatch`).
        let k_flat = ctx.reshape(k, &[n_embd_kv, n])?;
        let k_store = ctx.set_rows(kv.k[il], k_flat, positions)?;
        // V is stored transposed: its "rows" are single elements, one per position, in a
        // `[1, cells, n_embd_kv]` view of the cache, and the batch's values are the matching
        // `[1, n, n_embd_kv]` view of `v`.
        let v_cells = ctx.view(
            kv.v[il],
            &[1, kv.cells, n_embd_kv],
            &[f16, kv.cells * f16],
            0,
        )?;
        let f32b = DType::F32.block_bytes();
        let v_rows = ctx.view(v, &[1, n, n_embd_kv], &[n_embd_kv * f32b, f32b], 0)?;
        let v_store = ctx.set_rows(v_cells, v_rows, positions)?;

        // The stores enter the graph before anything that reads the cache, so they run first
        // (as in llama.cpp: the order of expansion is the order of execution).
        graph.expand(ctx, k_store)?;
        graph.expand(ctx, v_store)?;

        // Attention over every cached position.
        let k_all = ctx.view(
            kv.k[il],
            &[hd, c.n_head_kv, n_kv],
            &[hd * f16, n_embd_kv * f16],
            0,
        )?;
        let k_all = ctx.permute(k_all, [0, 2, 1, 3])?; // [hd, n_kv, n_head_kv]
        let q = ctx.permute(q, [0, 2, 1, 3])?; // [hd, n, n_head]
        let kq = ctx.mul_mat(k_all, q)?; // [n_kv, n, n_head]
        let kq = keep(ctx, kq, format!("kq-{il}"))?;
        let kq = ctx.soft_max_ext(kq, Some(mask), kq_scale, 0.0)?;
        let kq = keep(ctx, kq, format!("kq_soft_max-{il}"))?;
        let v_all = ctx.view(
            kv.v[il],
            &[n_kv, hd, c.n_head_kv],
            &[kv.cells * f16, kv.cells * f16 * hd],
            0,
        )?;
        let kqv = ctx.mul_mat(v_all, kq)?; // [hd, n, n_head]
        let kqv = ctx.permute(kqv, [0, 2, 1, 3])?; // [hd, n_head, n]
        let attn = ctx.cont_shape(kqv, &[c.n_embd, n])?;
        let attn = keep(ctx, attn, format!("kqv_out-{il}"))?;
        let attn = ctx.mul_mat(l.wo, attn)?;
        let attn = keep(ctx, attn, format!("attn_out-{il}"))?;
        let x_attn = ctx.add(attn, x)?;
        let x_attn = keep(ctx, x_attn, format!("ffn_inp-{il}"))?;

        let cur = ctx.rms_norm(x_attn, c.rms_eps)?;
        pins.push((cur, dev));
        let cur = ctx.mul(cur, l.ffn_norm)?;
        let cur = keep(ctx, cur, format!("ffn_norm-{il}"))?;
        let gate = ctx.mul_mat(l.ffn_gate, cur)?;
        let up = ctx.mul_mat(l.ffn_up, cur)?;
        let gate = keep(ctx, gate, format!("ffn_gate-{il}"))?;
        let up = keep(ctx, up, format!("ffn_up-{il}"))?;
        let act = ctx.swiglu(gate, up)?;
        let act = keep(ctx, act, format!("ffn_swiglu-{il}"))?;
        let down = ctx.mul_mat(l.ffn_down, act)?;
        let down = keep(ctx, down, format!("ffn_out-{il}"))?;
        x = ctx.add(down, x_attn)?;
        x = keep(ctx, x, format!("l_out-{il}"))?;
    }
    if !all_logits && n > 1 {
        // Only the last position's logits are needed: skip the output projection for the rest.
        let row = ctx[x].nb[1];
        x = ctx.view(x, &[c.n_embd, 1], &[row], (n - 1) * row)?;
    }
    let cur = ctx.rms_norm(x, c.rms_eps)?;
    pins.push((cur, model.devices().len() - 1));
    let cur = ctx.mul(cur, model.output_norm)?;
    let cur = keep(ctx, cur, "result_norm".into())?;
    let logits = ctx.mul_mat(model.output, cur)?;
    ctx.set_name(logits, "logits")?;
    ctx.set_output(logits)?;
    graph.expand(ctx, logits)?;
    Ok(BatchGraph {
        graph,
        tokens,
        positions,
        mask,
        logits,
        captured,
        pins,
    })
}
