//! Gemma 3 (`gemma3`): heads wider than `n_embd / n_head` (`attention.key_length`), QK-norm,
//! RMS norms after attention and after the FFN as well as before, a GeGLU FFN, embeddings
//! scaled by √n_embd, Q scaled before attention, interleaved local (sliding-window) and
//! global layers with their own RoPE bases, and optionally soft-capped logits.

use super::blocks::Builder;
use super::keys::Keys;
use super::{LayerParts, LayerWeights, Need};
use crate::config::{FfnActivation, ModelConfig, SlidingWindow};
use crate::error::{LlmError, Result};
use rgml::{RopeMode, TensorId};
use rgml_gguf::Value;

pub(super) const PARTS: LayerParts = LayerParts {
    qk_norm: Need::Required,
    post_norms: Need::Required,
    out_biases: Need::No,
    fused_gate_up: false,
    // llama.cpp's graph passes no FFN scales.
    ffn_scales: false,
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
    // 0 (or absent) means none, as llama.cpp reads it.
    match keys.f32_opt("final_logit_softcapping")? {
        Some(cap) if cap.is_finite() && cap > 0.0 => c.final_logit_softcap = Some(cap),
        Some(cap) if cap != 0.0 => {
            return Err(LlmError::BadConfig(format!(
                "{} = {cap} must be positive",
                keys.name("final_logit_softcapping")
            )))
        }
        _ => {}
    }
    let window = keys.usize_or("attention.sliding_window", 0)?;
    if window > c.n_ctx_train {
        return Err(LlmError::BadConfig(format!(
            "{} = {window} is larger than the context length {}",
            keys.name("attention.sliding_window"),
            c.n_ctx_train
        )));
    }
    if window > 0 {
        c.sliding_window = Some(SlidingWindow {
            window,
            layers: local_layers(keys, c.n_layer)?,
            rope_freq_base: keys
                .f32_opt("rope.freq_base_swa")?
                .unwrap_or(DEFAULT_LOCAL_ROPE_BASE),
            rope_freq_scale: 1.0,
        });
    }
    Ok(())
}

/// Which layers are local: a per-layer array of booleans (or of 0/1 integers), or a period `p` (all but every
/// `p`-th layer local; 0: all local), from `attention.sliding_window_pattern`.
fn local_layers(keys: &Keys<'_>, n_layer: usize) -> Result<Vec<bool>> {
    let key = "attention.sliding_window_pattern";
    let bad = |what: &str| LlmError::BadConfig(format!("{}: {what}", keys.name(key)));
    let period = match keys.value(key) {
        Some(Value::Array(items)) => {
            if items.len() < n_layer {
                return Err(bad(&format!(
                    "{} entries for {n_layer} layers",
                    items.len()
                )));
            }
            return items
                .iter()
                .take(n_layer)
                .map(|v| match (v, v.as_i64()) {
                    (Value::Bool(b), _) => Ok(*b),
                    // llama.cpp reads u32/i32 arrays too (llama_model_saver writes u32).
                    (Value::U32(_) | Value::I32(_), Some(n)) => Ok(n != 0),
                    _ => Err(bad("an array of booleans or 32-bit integers expected")),
                })
                .collect();
        }
        Some(v) => {
            let p = v.as_u64().ok_or_else(|| bad("an integer expected"))?;
            usize::try_from(p).map_err(|_| bad("too large"))?
        }
        None => DEFAULT_PATTERN,
    };
    Ok((0..n_layer)
        .map(|il| period == 0 || il % period < period - 1)
        .collect())
}

/// Block `il`: normed attention, normed again before its residual; the same for the FFN.
pub(super) fn layer(
    b: &mut Builder<'_>,
    il: usize,
    l: &LayerWeights,
    x: TensorId,
) -> Result<TensorId> {
    let missing = |name: &str| LlmError::MissingTensor(format!("blk.{il}.{name}.weight"));
    let attn_post_norm = l
        .attn_post_norm
        .ok_or_else(|| missing("post_attention_norm"))?;
    let ffn_post_norm = l.ffn_post_norm.ok_or_else(|| missing("post_ffw_norm"))?;
    let (attn, x) = b.self_attention(il, l, x)?;
    let cur = b.norm(attn, attn_post_norm, il)?;
    let cur = b.keep(cur, format!("attn_post_norm-{il}"))?;
    let sa_out = b.ctx().add(cur, x)?;
    let sa_out = b.keep(sa_out, format!("sa_out-{il}"))?;
    let cur = b.norm(sa_out, l.ffn_norm, il)?;
    let cur = b.keep(cur, format!("ffn_norm-{il}"))?;
    let ffn = super::ffn(b, il, l, cur)?;
    let cur = b.norm(ffn, ffn_post_norm, il)?;
    let cur = b.keep(cur, format!("ffn_post_norm-{il}"))?;
    let out = b.ctx().add(cur, sa_out)?;
    b.keep(out, format!("l_out-{il}"))
}
