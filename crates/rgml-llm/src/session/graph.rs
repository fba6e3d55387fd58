//! The graph of one micro-batch: what it depends on ([`GraphKey`]), its inputs and outputs
//! ([`BatchGraph`]), and how it is assembled from the model's architecture (`crate::arch`) on
//! top of the weights and the KV cache.
//!
//! This module owns the graph's inputs and its reuse key; it allocates and computes nothing.

use super::kv_cache::KvCache;
use crate::arch::blocks::{BatchInputs, Builder, CacheView, GraphModel, GroupInputs, Outputs};
use crate::error::Result;
use crate::model::Model;
use rgml::{Context, DType, Graph, TensorFlags, TensorId};

/// What a built graph depends on besides the weights and the cache: the graph is the same
/// for every micro-batch with the same key, wherever in the sequences it goes (the cache rows
/// written and the masks are inputs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct GraphKey {
    pub(super) n_tokens: usize,
    /// The tokens of each sequence, in batch order.
    pub(super) groups: Vec<GroupKey>,
    pub(super) outputs: OutputKey,
    /// How many of the output rows each sequence has, in order (sequences without any left
    /// out): the output head computes each sequence's rows as they are computed alone.
    pub(super) out_groups: Vec<usize>,
}

/// One sequence's part of a micro-batch (see [`GroupInputs`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct GroupKey {
    pub(super) stream: usize,
    pub(super) n_tokens: usize,
    /// Cells of the stream the global layers attend to.
    pub(super) n_kv: usize,
    /// Cells the local layers attend to (0 without local layers).
    pub(super) n_kv_local: usize,
}

/// Which rows' logits a graph computes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum OutputKey {
    /// Every token's.
    All,
    /// The last token's.
    #[default]
    Last,
    /// This many rows, listed in an input.
    Rows(usize),
}

/// The input tensors and the logits of one built graph.
pub(super) struct BatchGraph {
    pub(super) graph: Graph,
    pub(super) tokens: TensorId,
    pub(super) positions: TensorId,
    pub(super) kv_rows: TensorId,
    pub(super) local_rows: Option<TensorId>,
    /// Per group, its mask and its local layers' mask.
    pub(super) masks: Vec<(TensorId, Option<TensorId>)>,
    /// The rows whose logits are computed, for [`OutputKey::Rows`].
    pub(super) out_ids: Option<TensorId>,
    /// The rotation matrices of quantized caches (see `kv_cache::rotations`): of K and V in
    /// the global layers, then in the local ones.
    pub(super) rotations: [Option<TensorId>; 4],
    pub(super) logits: TensorId,
    /// Intermediates named and kept for [`Session::set_capture`].
    pub(super) captured: Vec<TensorId>,
    /// Nodes to run on a given device (index into the model's devices) when split: the norms,
    /// which the scheduler would otherwise leave on the previous block's device, so that the
    /// hidden state would cross twice (llama.cpp pins them the same way).
    pub(super) pins: Vec<(TensorId, usize)>,
}

/// The graph for the micro-batch of `key`; where the batch goes in its sequences is only in
/// its inputs (positions, cache rows, masks).
pub(super) fn build_graph(
    ctx: &mut Context,
    model: &Model,
    kv: &KvCache,
    key: &GraphKey,
    capture: bool,
    rope_factors: Option<TensorId>,
    embeddings: bool,
) -> Result<BatchGraph> {
    let n = key.n_tokens;
    let tokens = input(ctx, DType::I32, &[n], "inp_tokens")?;
    // Multi-section RoPE takes four positions per token (text: three times the position,
    // then 0), in four runs of `n`.
    let per_token = model.config.rope_mode.positions_per_token();
    let positions = input(ctx, DType::I32, &[n * per_token], "inp_pos")?;
    let kv_rows = input(ctx, DType::I32, &[n], "inp_k_idxs")?;
    let local = model.config.sliding_window.is_some();
    let local_rows = match local {
        true => Some(input(ctx, DType::I32, &[n], "inp_k_idxs_swa")?),
        false => None,
    };
    // Flash attention takes its masks in f16, as llama.cpp makes them then.
    let mask_type = match kv.flash_attn {
        true => DType::F16,
        false => DType::F32,
    };
    let (groups, masks) = group_inputs(ctx, key, local, mask_type)?;
    let row_groups: Vec<usize> = key.groups.iter().map(|g| g.n_tokens).collect();
    let (outputs, out_ids) = match key.outputs {
        OutputKey::All => (Outputs::All, None),
        OutputKey::Last => (Outputs::Last, None),
        OutputKey::Rows(n_out) => {
            let ids = input(ctx, DType::I32, &[n_out], "inp_out_ids")?;
            (Outputs::Rows(ids), Some(ids))
        }
    };
    let rot = |ctx: &mut Context, n: Option<usize>, name: &str| -> Result<Option<TensorId>> {
        n.map(|n| input(ctx, DType::F32, &[n, n], name)).transpose()
    };
    let k_rot = rot(ctx, kv.k_rot, "attn_inp_k_rot")?;
    let v_rot = rot(ctx, kv.v_rot, "attn_inp_v_rot")?;
    // The local layers' rotations: the global ones' where they are the same size.
    let local_rot =
        |ctx: &mut Context, n: Option<usize>, global: Option<TensorId>, name| match (n, global) {
            (Some(n), Some(g)) if ctx[g].ne[0] == n => Ok(Some(g)),
            _ => rot(ctx, n, name),
        };
    let local_k_rot = local_rot(ctx, kv.local_k_rot, k_rot, "attn_inp_k_rot_swa")?;
    let local_v_rot = local_rot(ctx, kv.local_v_rot, v_rot, "attn_inp_v_rot_swa")?;
    let layer_devices: Vec<usize> = (0..model.layers.len())
        .map(|il| model.layer_device(il).unwrap_or(0))
        .collect();
    let graph_model = GraphModel {
        config: &model.config,
        tok_embd: model.tok_embd,
        output_norm: model.output_norm,
        output: model.output,
        rope_freqs: rope_factors,
        output_bias: model.output_bias,
        per_layer_embd: model.per_layer_embd,
        encoder: model.encoder,
        layers: &model.layers,
        layer_devices: &layer_devices,
        output_device: model.output_device(),
    };
    let cache = CacheView {
        k: &kv.k,
        v: &kv.v,
        conv: &kv.conv,
        ssm: &kv.ssm,
        n_seq: kv.n_seq,
        cells: kv.cells,
        local_cells: kv.local_cells,
        flash_attn: kv.flash_attn,
    };
    let batch = BatchInputs {
        n,
        positions,
        kv_rows,
        local_rows,
        groups: &groups,
        row_groups: &row_groups,
        outputs,
        out_groups: &key.out_groups,
        k_rot,
        v_rot,
        local_k_rot,
        local_v_rot,
    };
    let mut b = Builder::new(ctx, graph_model, cache, batch, capture);
    let mut x = crate::arch::embeddings(&mut b, tokens)?;
    for (il, l) in model.layers.iter().enumerate() {
        x = crate::arch::build_layer(&mut b, il, l, x)?;
    }
    let logits = match embeddings {
        true => b.output_embeddings(x)?,
        false => b.output(x)?,
    };
    Ok(BatchGraph {
        graph: b.graph,
        tokens,
        positions,
        kv_rows,
        local_rows,
        masks,
        out_ids,
        rotations: [k_rot, v_rot, local_k_rot, local_v_rot],
        logits,
        captured: b.captured,
        pins: b.pins,
    })
}

/// The groups' inputs: a mask `[n_kv, n]` each, and the local layers' where there are some.
/// One group's masks keep llama.cpp's names.
#[allow(clippy::type_complexity)]
fn group_inputs(
    ctx: &mut Context,
    key: &GraphKey,
    local: bool,
    mask_type: DType,
) -> Result<(Vec<GroupInputs>, Vec<(TensorId, Option<TensorId>)>)> {
    let mut groups = Vec::with_capacity(key.groups.len());
    let mut masks = Vec::with_capacity(key.groups.len());
    let mut first = 0;
    for (i, g) in key.groups.iter().enumerate() {
        let suffix = match key.groups.len() {
            1 => String::new(),
            _ => format!("-s{i}"),
        };
        let mask = input(
            ctx,
            mask_type,
            &[g.n_kv, g.n_tokens],
            &format!("kq_mask{suffix}"),
        )?;
        let local_mask = match local {
            true => Some(input(
                ctx,
                mask_type,
                &[g.n_kv_local, g.n_tokens],
                &format!("kq_mask_swa{suffix}"),
            )?),
            false => None,
        };
        groups.push(GroupInputs {
            stream: g.stream,
            first,
            n: g.n_tokens,
            n_kv: g.n_kv,
            mask,
            n_kv_local: g.n_kv_local,
            local_mask,
        });
        masks.push((mask, local_mask));
        first += g.n_tokens;
    }
    Ok((groups, masks))
}

/// A new input tensor.
fn input(ctx: &mut Context, dtype: DType, ne: &[usize], name: &str) -> Result<TensorId> {
    let id = ctx.new_tensor(dtype, ne)?;
    ctx.set_name(id, name)?;
    ctx.set_flags(id, TensorFlags::INPUT)?;
    Ok(id)
}
