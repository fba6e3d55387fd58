//! Gemma 3 (`gemma3`): heads wider than `n_embd / n_head` (`attention.key_length`), QK-norm,
//! RMS norms after attention and after the FFN as well as before, a GeGLU FFN, embeddings
//! scaled by √n_embd, Q scaled before attention, interleaved local (sliding-window) and
//! global layers with their own RoPE bases, and optionally soft-capped logits.

use super::blocks::Builder;
use super::keys::Keys;
use super::swa;
use super::{LayerParts, LayerWeights, Need, FFN_NORM};
use crate::config::{FfnActivation, ModelConfig};
use crate::error::{LlmError, Result};
use rgml::{RopeMode, TensorId};

pub(super) const PARTS: LayerParts = LayerParts {
    qk_norm: Need::Required,
    post_norms: Need::Required,
    out_biases: Need::No,
    fused_gate_up: false,
    // llama.cpp's graph passes no FFN scales.
    ffn_scales: false,
    sinks: Need::No,
    expert_biases: Need::No,
    ffn_norm: FFN_NORM,
    shared_expert: Need::No,
    value_from_key: false,
    parallel_experts: false,
    out_scale: Need::No,
};

/// Without a pattern key, every sixth layer is global (llama.cpp's default for Gemma 3).
const DEFAULT_PATTERN: usize = 6;

/// RoPE base of the local layers unless `rope.freq_base_swa` says otherwise (llama.cpp's).
const DEFAULT_LOCAL_ROPE_BASE: f32 = 10_000.0;

pub(super) fn hparams(keys: &Keys<'_>, c: &mut ModelConfig) -> Result<()> {
    c.rope_mode = RopeMode::Neox;
    c.embd_scale = Some((c.n_embd as f32).sqrt());
    c.ffn_activation = FfnActivation::Gelu;
    // Gemma 3 27B scales by the head width of n_embd / n_head (gemma_pytorch's
    // `query_pre_attn_scalar`); llama.cpp tells it by its 62 layers.
    let scale_width = if c.n_layer == 62 {
        c.n_embd / c.n_head
    } else {
        c.head_dim
    };
    c.attn_scale = 1.0 / (scale_width as f32).sqrt();
    c.attn_scale_on_q = true;
    c.final_logit_softcap = final_logit_softcap(keys)?;
    let local = swa::LocalRope {
        base: DEFAULT_LOCAL_ROPE_BASE,
        scale: 1.0,
    };
    c.sliding_window = swa::sliding_window(keys, c, DEFAULT_PATTERN, local, false)?;
    Ok(())
}

/// `final_logit_softcapping`: 0 (or absent) means none, as llama.cpp reads it.
pub(super) fn final_logit_softcap(keys: &Keys<'_>) -> Result<Option<f32>> {
    match keys.f32_opt("final_logit_softcapping")? {
        Some(cap) if cap.is_finite() && cap > 0.0 => Ok(Some(cap)),
        Some(cap) if cap != 0.0 => Err(LlmError::BadConfig(format!(
            "{} = {cap} must be positive",
            keys.name("final_logit_softcapping")
        ))),
        _ => Ok(None),
    }
}

/// The attention half of a Gemma block on `x`: normed attention, normed again, plus `x`
/// (named `sum_name`, llama.cpp's name for it); with the FFN's post-norm weight, which the other
/// half needs.
pub(super) fn post_normed_attention(
    b: &mut Builder<'_>,
    il: usize,
    l: &LayerWeights,
    x: TensorId,
    sum_name: &str,
) -> Result<(TensorId, TensorId)> {
    let missing = |name: &str| LlmError::MissingTensor(format!("blk.{il}.{name}.weight"));
    let attn_post_norm = l
        .attn_post_norm
        .ok_or_else(|| missing("post_attention_norm"))?;
    let ffn_post_norm = l.ffn_post_norm.ok_or_else(|| missing("post_ffw_norm"))?;
    let (attn, x) = b.self_attention(il, l, x)?;
    let cur = b.norm(attn, attn_post_norm, il)?;
    let cur = b.keep(cur, format!("attn_post_norm-{il}"))?;
    let sum = b.ctx().add(cur, x)?;
    Ok((b.keep(sum, format!("{sum_name}-{il}"))?, ffn_post_norm))
}

/// Block `il`: normed attention, normed again before its residual; the same for the FFN.
pub(super) fn layer(
    b: &mut Builder<'_>,
    il: usize,
    l: &LayerWeights,
    x: TensorId,
) -> Result<TensorId> {
    let (sa_out, ffn_post_norm) = post_normed_attention(b, il, l, x, "sa_out")?;
    let cur = b.norm(sa_out, l.ffn_norm, il)?;
    let cur = b.keep(cur, format!("ffn_norm-{il}"))?;
    let ffn = super::ffn(b, il, l, cur)?;
    let cur = b.norm(ffn, ffn_post_norm, il)?;
    let cur = b.keep(cur, format!("ffn_post_norm-{il}"))?;
    let out = b.ctx().add(cur, sa_out)?;
    b.keep(out, format!("l_out-{il}"))
}
