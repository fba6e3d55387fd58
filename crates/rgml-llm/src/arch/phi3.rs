//! Phi-3 (`phi3`): LLaMA-style blocks whose Q, K and V come from one fused projection
//! (`attn_qkv`, or separate ones as any architecture may have) and whose gate and up
//! projections are one (`ffn_up`, gate rows first), with
//! NeoX RoPE and Q scaled before attention. Its `sliding_window` key is ignored, as llama.cpp
//! ignores it (every layer attends globally). Its block is LLaMA's (`llama::layer`): the fused
//! projections are the shared blocks' business.

use super::keys::Keys;
use super::{LayerParts, Need, FFN_NORM};
use crate::config::ModelConfig;
use crate::error::Result;
use rgml::RopeMode;

pub(super) const PARTS: LayerParts = LayerParts {
    qk_norm: Need::No,
    post_norms: Need::No,
    out_biases: Need::No,
    fused_gate_up: true,
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

pub(super) fn hparams(_keys: &Keys<'_>, c: &mut ModelConfig) -> Result<()> {
    c.rope_mode = RopeMode::Neox;
    c.attn_scale_on_q = true;
    Ok(())
}
