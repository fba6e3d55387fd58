//! Phi-3 (`phi3`): LLaMA-style blocks whose Q, K and V come from one fused projection
//! (`attn_qkv`) and whose gate and up projections are one (`ffn_up`, gate rows first), with
//! NeoX RoPE and Q scaled before attention. Its `sliding_window` key is ignored, as llama.cpp
//! ignores it (every layer attends globally).

use super::blocks::Builder;
use super::keys::Keys;
use super::{LayerParts, LayerWeights, Need};
use crate::config::ModelConfig;
use crate::error::Result;
use rgml::{RopeMode, TensorId};

pub(super) const PARTS: LayerParts = LayerParts {
    biases: Need::No,
    qk_norm: Need::No,
    post_norms: Need::No,
    fused: true,
};

pub(super) fn hparams(_keys: &Keys<'_>, c: &mut ModelConfig) -> Result<()> {
    c.rope_mode = RopeMode::Neox;
    c.attn_scale_on_q = true;
    Ok(())
}

/// Block `il`: as LLaMA's (the fused projections are the shared blocks' business).
pub(super) fn layer(
    b: &mut Builder<'_>,
    il: usize,
    l: &LayerWeights,
    x: TensorId,
) -> Result<TensorId> {
    super::llama::layer(b, il, l, x)
}
