//! The graph of one micro-batch: what it depends on ([`GraphKey`]), its inputs and outputs
//! ([`BatchGraph`]), and how it is assembled from the model's architecture (`crate::arch`) on
//! top of the weights and the KV cache.
//!
//! This module owns the graph's inputs and its reuse key; it allocates and computes nothing.

use super::kv_cache::KvCache;
use crate::arch::blocks::{BatchInputs, Builder, CacheView, GraphModel, LocalInputs};
use crate::error::Result;
use crate::model::Model;
use rgml::{Context, DType, Graph, TensorFlags, TensorId};

/// What a built graph depends on besides the weights and the cache: the graph is the same
/// for every micro-batch with the same key, wherever in the sequence it goes (the cache rows
/// written and the masks are inputs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct GraphKey {
    pub(super) n_tokens: usize,
    pub(super) n_kv: usize,
    /// Cells the local layers attend to (0 without local layers).
    pub(super) n_kv_local: usize,
    pub(super) all_logits: bool,
}

/// The input tensors and the logits of one built graph.
pub(super) struct BatchGraph {
    pub(super) graph: Graph,
    pub(super) tokens: TensorId,
    pub(super) positions: TensorId,
    pub(super) mask: TensorId,
    /// The local layers' cells of the tokens and mask, where the model has local layers.
    pub(super) local: Option<(TensorId, TensorId)>,
    pub(super) logits: TensorId,
    /// Intermediates named and kept for [`Session::set_capture`].
    pub(super) captured: Vec<TensorId>,
    /// Nodes to run on a given device (index into the model's devices) when split: the norms,
    /// which the scheduler would otherwise leave on the previous block's device, so that the
    /// hidden state would cross twice (llama.cpp pins them the same way).
    pub(super) pins: Vec<(TensorId, usize)>,
}

/// The graph for a micro-batch of `key.n_tokens` tokens attending to `key.n_kv` cache
/// cells; where the batch goes in the sequence is only in its inputs (positions, masks).
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
        n_kv_local,
        all_logits,
    } = key;
    let (tokens, positions, mask) = inputs(ctx, n, n_kv)?;
    let local = match model.config.sliding_window {
        Some(_) => Some(local_inputs(ctx, n, n_kv_local)?),
        None => None,
    };
    let layer_devices: Vec<usize> = (0..model.layers.len())
        .map(|il| model.layer_device(il).unwrap_or(0))
        .collect();
    let graph_model = GraphModel {
        config: &model.config,
        tok_embd: model.tok_embd,
        output_norm: model.output_norm,
        output: model.output,
        rope_freqs: model.rope_freqs,
        layers: &model.layers,
        layer_devices: &layer_devices,
        n_devices: model.devices().len(),
    };
    let cache = CacheView {
        k: &kv.k,
        v: &kv.v,
        cells: kv.cells,
        local_cells: kv.local_cells,
    };
    let batch = BatchInputs {
        n,
        n_kv,
        positions,
        mask,
        local: local.as_ref().map(|&(cells, mask)| LocalInputs {
            n_kv: n_kv_local,
            cells,
            mask,
        }),
    };
    let mut b = Builder::new(ctx, graph_model, cache, batch, all_logits, capture);
    let mut x = crate::arch::embeddings(&mut b, tokens)?;
    for (il, l) in model.layers.iter().enumerate() {
        x = crate::arch::build_layer(&mut b, il, l, x)?;
    }
    let logits = b.output(x, all_logits)?;
    Ok(BatchGraph {
        graph: b.graph,
        tokens,
        positions,
        mask,
        local,
        logits,
        captured: b.captured,
        pins: b.pins,
    })
}

/// The graph's inputs for `n` tokens attending to `n_kv` cells: token ids, positions (also
/// the tokens' cells in the global layers' cache) and the causal mask.
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

/// The local layers' inputs: the tokens' cells in their cache and their mask over `n_kv`
/// cells.
fn local_inputs(ctx: &mut Context, n: usize, n_kv: usize) -> Result<(TensorId, TensorId)> {
    let cells = ctx.new_tensor(DType::I32, &[n])?;
    ctx.set_name(cells, "inp_k_idxs_swa")?;
    let mask = ctx.new_tensor(DType::F32, &[n_kv, n])?;
    ctx.set_name(mask, "kq_mask_swa")?;
    for id in [cells, mask] {
        ctx.set_flags(id, TensorFlags::INPUT)?;
    }
    Ok((cells, mask))
}
