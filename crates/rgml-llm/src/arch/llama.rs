//! LLaMA (`llama`, `mistral`, `smollm`; Mixtral: `llama` with experts), Qwen2 (`qwen2`: q/k/v
//! biases, NeoX RoPE), Qwen3 (`qwen3`: QK-norm instead of biases, NeoX RoPE) and Qwen3 MoE
//! (`qwen3moe`: Qwen3 with experts): pre-norm blocks of grouped-query attention and a SwiGLU
//! FFN, dense or a mixture of experts.

use super::blocks::Builder;
use super::keys::Keys;
use super::moe::{self, ExpertRules, ExpertWidth};
use super::{LayerParts, LayerWeights, Need, FFN_NORM};
use crate::config::{Arch, ModelConfig};
use crate::error::Result;
use rgml::{RopeMode, TensorId};

/// LLaMA: biases on the attention output and the FFN's matrices too (llama.cpp's `llama`).
pub(super) const PARTS: LayerParts = LayerParts {
    qk_norm: Need::No,
    post_norms: Need::No,
    out_biases: Need::Optional,
    fused_gate_up: false,
    ffn_scales: true,
    sinks: Need::No,
    expert_biases: Need::No,
    ffn_norm: FFN_NORM,
    shared_expert: Need::No,
    value_from_key: false,
    parallel_experts: false,
    out_scale: Need::No,
};

/// Qwen2: llama.cpp's graph passes no FFN scales.
pub(super) const QWEN2_PARTS: LayerParts = LayerParts {
    out_biases: Need::No,
    ffn_scales: false,
    ..PARTS
};

pub(super) const QWEN3_PARTS: LayerParts = LayerParts {
    qk_norm: Need::Required,
    ffn_scales: true,
    ..QWEN2_PARTS
};

/// LLaMA's hyper-parameters are the common ones, with experts where `expert_count` says
/// (Mixtral); Qwen rotates NeoX-style; Qwen3 MoE always has experts.
pub(super) fn hparams(keys: &Keys<'_>, c: &mut ModelConfig) -> Result<()> {
    if matches!(c.kind, Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe) {
        c.rope_mode = RopeMode::Neox;
    }
    match c.kind {
        Arch::Llama => moe::hparams(keys, c, moe::SOFTMAX_NORMED),
        Arch::Qwen3Moe => {
            let rules = ExpertRules {
                width: ExpertWidth::ExpertKey,
                required: true,
                ..moe::SOFTMAX_NORMED
            };
            moe::hparams(keys, c, rules)
        }
        _ => Ok(()),
    }
}

/// Block `il`: attention, then the FFN, each with its residual.
pub(super) fn layer(
    b: &mut Builder<'_>,
    il: usize,
    l: &LayerWeights,
    x: TensorId,
) -> Result<TensorId> {
    let attn = b.self_attention(il, l, x)?;
    super::residual_ffn(b, il, l, attn, ["ffn_inp", "ffn_norm"])
}
