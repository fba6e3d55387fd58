//! Gemma 4 (`gemma4`), as llama.cpp's `src/models/gemma4.cpp` builds it: Gemma 3's block
//! (QK-norm, norms after attention and after the FFN, GeGLU, embeddings scaled by √n_embd) with
//! - local (sliding-window) and global layers of different head widths and rotated
//!   dimensions, the global ones with "proportional" RoPE (`rope_freqs.weight` holds 1 for the
//!   rotated pairs and 1e30 for the others) and no scaling of Q·K;
//! - values RMS-normed per head without a weight, and the keys' projection as values where a
//!   layer has no `attn_v`;
//! - the last `attention.shared_kv_layers` layers attending over the cache of the last earlier
//!   layer of their kind, with no K or V of their own;
//! - per-layer token embeddings: per token and block, a vector from a table plus a projection
//!   of the token's embedding, that gates what each block adds after its FFN;
//! - a factor on each block's output, and (MoE files) a mixture of experts beside the dense
//!   FFN, routed on its own norm of the block's input.
//!
//! The last block runs on every row: the output rows are picked after the final norm.

use super::blocks::Builder;
use super::keys::Keys;
use super::moe::{self, ExpertRules, ExpertWidth};
use super::swa::{self, LocalRope};
use super::{LayerParts, LayerWeights, Need, ParallelExperts, PerLayerEmbeddings, PerLayerInput};
use crate::config::{ExpertGating, FfnActivation, ModelConfig};
use crate::error::{LlmError, Result};
use rgml::{DType, RopeMode, TensorId};

/// Gemma 3's parts, with the FFN's scales passed on (llama.cpp's Gemma 4 graph does), values
/// that may be the keys, experts beside the dense FFN and an output scale.
pub(super) const PARTS: LayerParts = LayerParts {
    ffn_scales: true,
    value_from_key: true,
    parallel_experts: true,
    out_scale: Need::Optional,
    ..super::gemma3::PARTS
};

/// llama.cpp's defaults for the local layers' RoPE (`rope_freq_base_train_swa`, its scale).
const LOCAL_ROPE: LocalRope = LocalRope {
    base: 10_000.0,
    scale: 1.0,
};

/// The experts, where the file has them: softmax over every expert, the chosen ones'
/// probabilities renormalised, each `expert_feed_forward_length` wide.
const EXPERTS: ExpertRules = ExpertRules {
    width: ExpertWidth::ExpertKeyRequired,
    required: false,
    norm_weights: true,
    gating: ExpertGating::Softmax,
};

pub(super) fn hparams(keys: &Keys<'_>, c: &mut ModelConfig) -> Result<()> {
    c.rope_mode = RopeMode::Neox;
    c.embd_scale = Some((c.n_embd as f32).sqrt());
    c.ffn_activation = FfnActivation::Gelu;
    // Gemma 4 scales neither Q nor Q·K (llama.cpp's `f_attention_scale = 1`).
    c.attn_scale = 1.0;
    c.value_norm = true;
    c.output_rows_after_norm = true;
    c.final_logit_softcap = super::gemma3::final_logit_softcap(keys)?;
    let pattern = "attention.sliding_window_pattern";
    if !keys.has(pattern) {
        return Err(LlmError::BadConfig(format!(
            "{} is required for gemma4",
            keys.name(pattern)
        )));
    }
    let mut window = swa::sliding_window(keys, c, 0, LOCAL_ROPE, true)?;
    if let Some(w) = &mut window {
        w.rope_factors = false;
    }
    c.sliding_window = window;
    local_heads(keys, c)?;
    let shared = keys.usize_or("attention.shared_kv_layers", 0)?;
    c.n_layer_kv = c.n_layer.checked_sub(shared).ok_or_else(|| {
        LlmError::BadConfig(format!(
            "{} = {shared} exceeds the {} layers",
            keys.name("attention.shared_kv_layers"),
            c.n_layer
        ))
    })?;
    c.n_embd_per_layer = keys.usize("embedding_length_per_layer_input")?;
    moe::hparams(keys, c, EXPERTS)?;
    // Every block has a dense FFN, beside the experts too.
    if let Some(il) = (0..c.n_layer).find(|&il| c.n_ff_at(il) == 0) {
        return Err(LlmError::BadConfig(format!(
            "{} gives layer {il} no width",
            keys.name("feed_forward_length")
        )));
    }
    Ok(())
}

/// The local layers' head width (`attention.key_length_swa`, which the values must share) and
/// rotated dimensions (`rope.dimension_count_swa`, else the global layers').
fn local_heads(keys: &Keys<'_>, c: &mut ModelConfig) -> Result<()> {
    let head_dim = keys.usize("attention.key_length_swa")?;
    let value_dim = keys.usize("attention.value_length_swa")?;
    if value_dim != head_dim {
        return Err(LlmError::UnsupportedModel(format!(
            "{} = {value_dim} differs from the local key width {head_dim}",
            keys.name("attention.value_length_swa")
        )));
    }
    let n_rot = keys.usize_or("rope.dimension_count_swa", c.n_rot)?;
    let heads = (0..c.n_layer)
        .map(|il| {
            let mut h = c.heads(il);
            if c.is_local(il) {
                h.head_dim = head_dim;
                h.n_rot = n_rot;
            }
            h
        })
        .collect();
    c.layer_heads = super::differing(heads);
    Ok(())
}

/// Block `il`: normed attention (normed again before its residual), the FFN (with experts
/// beside it in MoE blocks) the same, then the block's share of the per-layer embedding and
/// its output factor.
pub(super) fn layer(
    b: &mut Builder<'_>,
    il: usize,
    l: &LayerWeights,
    x: TensorId,
) -> Result<TensorId> {
    let (attn_out, ffn_post_norm) = super::gemma3::post_normed_attention(b, il, l, x, "attn_out")?;
    let ffn = match &l.parallel_experts {
        Some(p) => dense_and_experts(b, il, l, p, attn_out)?,
        None => {
            let cur = b.norm(attn_out, l.ffn_norm, il)?;
            let cur = b.keep(cur, format!("ffn_norm-{il}"))?;
            super::ffn(b, il, l, cur)?
        }
    };
    let cur = b.norm(ffn, ffn_post_norm, il)?;
    let cur = b.keep(cur, format!("ffn_post_norm-{il}"))?;
    let mut out = b.ctx().add(cur, attn_out)?;
    if let Some(p) = &l.per_layer_input {
        out = add_per_layer_input(b, il, p, out)?;
    }
    if let Some(scale) = l.out_scale {
        out = b.ctx().mul(out, scale)?;
        out = b.keep(out, format!("out_scaled-{il}"))?;
    }
    b.keep(out, format!("l_out-{il}"))
}

/// A MoE block's FFN on the attention block's output `x`: the dense FFN and the experts,
/// each normed before and after, summed. The router reads `x` RMS-normed, scaled by
/// `1/√n_embd` and by its per-channel factor.
fn dense_and_experts(
    b: &mut Builder<'_>,
    il: usize,
    l: &LayerWeights,
    p: &ParallelExperts,
    x: TensorId,
) -> Result<TensorId> {
    let cur = b.norm(x, l.ffn_norm, il)?;
    let cur = b.keep(cur, format!("ffn_norm_1-{il}"))?;
    let dense = super::ffn(b, il, l, cur)?;
    let dense = b.norm(dense, p.dense_post_norm, il)?;
    let dense = b.keep(dense, format!("ffn_mlp-{il}"))?;
    let experts_in = b.norm(x, p.pre_norm, il)?;
    let experts_in = b.keep(experts_in, format!("ffn_norm_2-{il}"))?;
    let c = b.config();
    let router_in = b.ctx().rms_norm(x, c.rms_eps)?;
    let router_in = b.ctx().scale(router_in, 1.0 / (c.n_embd as f32).sqrt())?;
    let router_in = b.ctx().mul(router_in, p.router_scale)?;
    let named = b.one_sequence();
    let rows = b.ctx()[experts_in].ne[1];
    let routed = b.by_sequence_at(experts_in, &mut |b, part, first, alone| {
        let n = b.ctx()[part].ne[1];
        let router_part = match n == rows {
            true => router_in,
            false => {
                let (ne0, nb1) = (b.ctx()[router_in].ne[0], b.ctx()[router_in].nb[1]);
                b.ctx().view(router_in, &[ne0, n], &[nb1], first * nb1)?
            }
        };
        let gate_inp = p.experts.gate_inp.w;
        let logits = moe::router_logits(b, il, gate_inp, router_part, alone, named)?;
        moe::routed(b, il, &p.experts, part, logits, alone, named)
    })?;
    let routed = b.norm(routed, p.post_norm, il)?;
    let routed = b.keep(routed, format!("ffn_moe-{il}"))?;
    let sum = b.ctx().add(dense, routed)?;
    b.keep(sum, format!("ffn_moe_combined-{il}"))
}

/// The per-layer inputs of the micro-batch `[n_embd_per_layer, n, n_layer]` (llama.cpp's
/// `build_inp_per_layer` and `project_per_layer_inputs`): each token's rows of the table
/// scaled by `√n_embd_per_layer`, plus the projection of its scaled embedding `embd`
/// (scaled by `1/√n_embd`, RMS-normed per block with its weight), times `1/√2`.
pub(super) fn per_layer_inputs(
    b: &mut Builder<'_>,
    p: PerLayerEmbeddings,
    tokens: TensorId,
    embd: TensorId,
) -> Result<TensorId> {
    let c = b.config();
    let (pl, n_layer, n) = (c.n_embd_per_layer, c.n_layer, b.ctx()[tokens].ne[0]);
    let (embd_scale, proj_scale) = ((pl as f32).sqrt(), 1.0 / (c.n_embd as f32).sqrt());
    let table = b.ctx().get_rows(p.tok_embd, tokens)?;
    let table = b.ctx().reshape(table, &[pl, n_layer, n])?;
    let table = b.ctx().scale(table, embd_scale)?;
    let table = b.keep(table, "inp_per_layer_selected".into())?;
    let proj = b.project(p.model_proj, embd)?;
    let proj = b.ctx().scale(proj, proj_scale)?;
    let proj = b.ctx().reshape(proj, &[pl, n_layer, n])?;
    let proj = b.row_norm(proj, p.proj_norm)?;
    let proj = b.keep(proj, "per_layer_proj".into())?;
    let sum = b.ctx().add(proj, table)?;
    let sum = b.ctx().scale(sum, 1.0 / 2f32.sqrt())?;
    let sum = b.keep(sum, "inp_per_layer".into())?;
    let by_layer = b.ctx().permute(sum, [0, 2, 1, 3])?;
    Ok(b.ctx().cont(by_layer)?)
}

/// `cur` plus what block `il` takes of the per-layer inputs: `proj(gelu(gate · cur) ×
/// input)`, RMS-normed with its weight.
fn add_per_layer_input(
    b: &mut Builder<'_>,
    il: usize,
    p: &PerLayerInput,
    cur: TensorId,
) -> Result<TensorId> {
    let all = b
        .per_layer_inputs
        .ok_or_else(|| LlmError::BadConfig("per-layer weights without per-layer inputs".into()))?;
    let (pl, n) = (b.ctx()[all].ne[0], b.ctx()[all].ne[1]);
    let row = DType::F32.block_bytes() * pl;
    let mine = b.ctx().view(all, &[pl, n], &[row], il * row * n)?;
    let gated = b.project(p.gate, cur)?;
    let gated = b.ctx().gelu(gated)?;
    let gated = b.ctx().mul(gated, mine)?;
    let out = b.project(p.proj, gated)?;
    let out = b.norm(out, p.post_norm, il)?;
    let out = b.keep(out, format!("per_layer_embd_out-{il}"))?;
    Ok(b.ctx().add(cur, out)?)
}
