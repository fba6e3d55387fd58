//! Sliding-window (local) attention layers as llama.cpp's loader reads them: the window, which
//! layers are local (`attention.sliding_window_pattern`: an array, or a period with the
//! family's default), and the local layers' RoPE base.

use super::keys::Keys;
use crate::config::{ModelConfig, SlidingWindow};
use crate::error::{LlmError, Result};

/// The local layers' RoPE base unless `rope.freq_base_swa` says otherwise, and their scale.
#[derive(Clone, Copy, Debug)]
pub(super) struct LocalRope {
    pub(super) base: f32,
    pub(super) scale: f32,
}

/// The model's local layers from `attention.sliding_window` (0 or absent: none, unless
/// `required`), with `default_period` where the file has no pattern.
pub(super) fn sliding_window(
    keys: &Keys<'_>,
    c: &ModelConfig,
    default_period: usize,
    rope: LocalRope,
    required: bool,
) -> Result<Option<SlidingWindow>> {
    let key = "attention.sliding_window";
    let window = match required {
        true => keys.usize(key)?,
        false => keys.usize_or(key, 0)?,
    };
    if window > c.n_ctx_train || (required && window == 0) {
        return Err(LlmError::BadConfig(format!(
            "{} = {window} must be positive and at most the context length {}",
            keys.name(key),
            c.n_ctx_train
        )));
    }
    if window == 0 {
        return Ok(None);
    }
    Ok(Some(SlidingWindow {
        window,
        layers: local_layers(keys, c.n_layer, default_period)?,
        rope_freq_base: keys.f32_opt("rope.freq_base_swa")?.unwrap_or(rope.base),
        rope_freq_scale: rope.scale,
        rope_factors: true,
    }))
}

/// Which layers are local: a per-layer array of booleans (or of 0/1 integers), or a period `p` (all but every
/// `p`-th layer local; 0: all local), from `attention.sliding_window_pattern`, else
/// `default_period`.
fn local_layers(keys: &Keys<'_>, n_layer: usize, default_period: usize) -> Result<Vec<bool>> {
    let key = "attention.sliding_window_pattern";
    if let Some(flags) = keys.layer_flags(key, n_layer)? {
        return Ok(flags);
    }
    let bad = |what: &str| LlmError::BadConfig(format!("{}: {what}", keys.name(key)));
    let period = match keys.value(key) {
        Some(v) => {
            let p = v.as_u64().ok_or_else(|| bad("an integer expected"))?;
            usize::try_from(p).map_err(|_| bad("too large"))?
        }
        None => default_period,
    };
    Ok((0..n_layer)
        .map(|il| period == 0 || il % period < period - 1)
        .collect())
}
