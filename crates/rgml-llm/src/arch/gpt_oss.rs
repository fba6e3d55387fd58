//! gpt-oss (`gpt-oss`, llama.cpp's `LLM_ARCH_OPENAI_MOE`): LLaMA's pre-norm block with biases
//! on Q/K/V and the attention output, one sink per head in every attention softmax, local
//! (sliding-window) layers alternating with global ones, NeoX RoPE (YaRN in the released
//! files), and a mixture of experts with biases everywhere, a softmax over the chosen
//! experts' logits and the clamped SwiGLU. The norm before the FFN is named
//! `post_attention_norm`.

use super::keys::Keys;
use super::moe::{self, ExpertRules, ExpertWidth};
use super::swa::{self, LocalRope};
use super::{LayerParts, Need, POST_ATTENTION_NORM};
use crate::config::{ExpertGating, FfnActivation, ModelConfig};
use crate::error::Result;
use rgml::RopeMode;

pub(super) const PARTS: LayerParts = LayerParts {
    qk_norm: Need::No,
    post_norms: Need::No,
    out_biases: Need::Required,
    fused_gate_up: false,
    ffn_scales: false,
    sinks: Need::Required,
    expert_biases: Need::Required,
    ffn_norm: POST_ATTENTION_NORM,
    shared_expert: Need::No,
    value_from_key: false,
    parallel_experts: false,
    out_scale: Need::No,
};

/// Every other layer is local unless the file says otherwise (llama.cpp's default).
const DEFAULT_PATTERN: usize = 2;

pub(super) fn hparams(keys: &Keys<'_>, c: &mut ModelConfig) -> Result<()> {
    c.rope_mode = RopeMode::Neox;
    c.ffn_activation = FfnActivation::SwigluOai;
    c.attn_scale = 1.0 / (c.n_rot as f32).sqrt();
    let rules = ExpertRules {
        width: ExpertWidth::ExpertKeyRequired,
        required: true,
        norm_weights: false,
        gating: ExpertGating::SoftmaxWeight,
    };
    moe::hparams(keys, c, rules)?;
    // The local layers rotate as the global ones unless `rope.freq_base_swa` says otherwise.
    let local = LocalRope {
        base: c.rope_freq_base,
        scale: c.rope_freq_scale,
    };
    c.sliding_window = swa::sliding_window(keys, c, DEFAULT_PATTERN, local, true)?;
    Ok(())
}
