//! The architectures: per architecture, its hyper-parameters (from GGUF metadata), the tensors
//! of a block, and the graph of a block, built from the shared blocks of [`blocks`].
//!
//! This module owns reading a [`ModelConfig`] and resolving a block's weights by name, and
//! dispatches to one module per architecture ([`llama`], [`gemma3`]). Adding an architecture
//! is one such module and a line in each `match` here. Loading, sessions, the scheduler and
//! the tensor split are the same for every architecture.

pub(crate) mod blocks;
mod gemma3;
mod keys;
mod llama;
mod moe;
mod phi3;

use crate::config::{Arch, FfnActivation, ModelConfig};
use crate::error::{LlmError, Result};
use blocks::Builder;
use keys::Keys;
use rgml::TensorId;
use rgml_gguf::GgufFile;

/// The weights of one transformer block. Which of the optional ones a block has depends on
/// the architecture (see [`LayerParts`]).
#[derive(Clone, Debug)]
pub struct LayerWeights {
    /// RMS norm before attention.
    pub attn_norm: TensorId,
    /// The Q, K and V projections, separate or fused.
    pub qkv: QkvWeights,
    /// Attention output projection `[n_embd_q, n_embd]`.
    pub wo: TensorId,
    /// Query bias (Qwen2).
    pub bq: Option<TensorId>,
    /// Key bias (Qwen2).
    pub bk: Option<TensorId>,
    /// Value bias (Qwen2).
    pub bv: Option<TensorId>,
    /// RMS norm of each query head `[head_dim]` (QK-norm: Gemma 3).
    pub attn_q_norm: Option<TensorId>,
    /// RMS norm of each key head `[head_dim]`.
    pub attn_k_norm: Option<TensorId>,
    /// RMS norm of the attention output, before the residual (Gemma 3).
    pub attn_post_norm: Option<TensorId>,
    /// RMS norm before the feed-forward block.
    pub ffn_norm: TensorId,
    /// The feed-forward block's projections.
    pub ffn: FfnWeights,
    /// RMS norm of the FFN output, before the residual (Gemma 3).
    pub ffn_post_norm: Option<TensorId>,
}

/// A feed-forward block's projections: one gated FFN, or a mixture of experts.
#[derive(Clone, Debug)]
pub enum FfnWeights {
    /// One FFN for every token.
    Dense {
        /// Gate projection `[n_embd, n_ff]`; `None` where the up projection holds both
        /// (Phi-3).
        gate: Option<TensorId>,
        /// Up projection `[n_embd, n_ff]`, or gate and up fused `[n_embd, 2 * n_ff]` (the
        /// gate's rows first).
        up: TensorId,
        /// Down projection `[n_ff, n_embd]`.
        down: TensorId,
    },
    /// A router and `n_expert` FFNs stacked on dim 2.
    Experts(ExpertWeights),
}

/// The weights of a mixture-of-experts FFN (`ffn_*_exps`).
#[derive(Clone, Debug)]
pub struct ExpertWeights {
    /// The router `[n_embd, n_expert]`.
    pub gate_inp: TensorId,
    /// Gate projections `[n_embd, n_ff_exp, n_expert]`; `None`: the experts are not gated
    /// (SiLU of the up projection).
    pub gate: Option<TensorId>,
    /// Up projections `[n_embd, n_ff_exp, n_expert]`.
    pub up: TensorId,
    /// Down projections `[n_ff_exp, n_embd, n_expert]`.
    pub down: TensorId,
}

/// The attention's input projections.
#[derive(Clone, Debug)]
pub enum QkvWeights {
    /// Query `[n_embd, n_embd_q]`, key and value `[n_embd, n_embd_kv]`.
    Separate {
        /// Query projection.
        wq: TensorId,
        /// Key projection.
        wk: TensorId,
        /// Value projection.
        wv: TensorId,
    },
    /// One `[n_embd, n_embd_q + 2 * n_embd_kv]` projection: Q's rows, then K's, then V's.
    Fused(TensorId),
}

/// Whether an architecture's blocks have a part: a file with a part its architecture does not
/// have is refused (as llama.cpp refuses unused tensors), not silently run without it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Need {
    No,
    Optional,
    Required,
}

/// The optional parts of an architecture's blocks.
struct LayerParts {
    /// q/k/v biases.
    biases: Need,
    /// Per-head q/k RMS norms.
    qk_norm: Need,
    /// Norms after attention and after the FFN.
    post_norms: Need,
    /// Q/K/V in one `attn_qkv` and gate/up in one `ffn_up` (instead of separate tensors).
    fused: bool,
}

fn parts(arch: Arch) -> LayerParts {
    match arch {
        Arch::Llama | Arch::Qwen2 => llama::PARTS,
        Arch::Qwen3 | Arch::Qwen3Moe => llama::QWEN3_PARTS,
        Arch::Phi3 => phi3::PARTS,
        Arch::Gemma3 => gemma3::PARTS,
    }
}

impl ModelConfig {
    /// Read and check the hyper-parameters of a GGUF file's architecture.
    pub fn from_gguf(gguf: &GgufFile) -> Result<ModelConfig> {
        let arch = gguf.get_str("general.architecture")?.to_string();
        let kind = Arch::from_name(&arch).ok_or_else(|| {
            let names: Vec<&str> = Arch::NAMES.iter().map(|(n, _)| *n).collect();
            LlmError::UnsupportedModel(format!(
                "architecture '{arch}' (supported: {})",
                names.join(", ")
            ))
        })?;
        let keys = Keys::new(gguf, &arch);
        let mut c = common(&keys, arch.clone(), kind)?;
        match kind {
            Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe => {
                llama::hparams(&keys, &mut c)?
            }
            Arch::Phi3 => phi3::hparams(&keys, &mut c)?,
            Arch::Gemma3 => gemma3::hparams(&keys, &mut c)?,
        }
        check(&c)?;
        Ok(c)
    }
}

/// The hyper-parameters every architecture reads the same way (defaults as llama.cpp's).
fn common(keys: &Keys<'_>, arch: String, kind: Arch) -> Result<ModelConfig> {
    let n_embd = keys.usize("embedding_length")?;
    let n_head = keys.usize("attention.head_count")?;
    let n_head_kv = keys.usize_or("attention.head_count_kv", n_head)?;
    if n_head == 0 || !n_embd.is_multiple_of(n_head) && !keys.has("attention.key_length") {
        return Err(LlmError::BadConfig(format!(
            "{n_embd} wide with {n_head} heads: no head width (and no {})",
            keys.name("attention.key_length")
        )));
    }
    let head_dim = keys.usize_or("attention.key_length", n_embd / n_head)?;
    let value_dim = keys.usize_or("attention.value_length", head_dim)?;
    if value_dim != head_dim {
        return Err(LlmError::UnsupportedModel(format!(
            "{} = {value_dim} differs from the key width {head_dim}",
            keys.name("attention.value_length")
        )));
    }
    let rope_freq_scale = match keys.f32_opt("rope.scaling.factor")? {
        Some(f) if f > 0.0 => 1.0 / f,
        _ => 1.0,
    };
    let n_vocab = match keys.has("vocab_size") {
        true => keys.usize("vocab_size")?,
        false => keys.gguf.get_array("tokenizer.ggml.tokens")?.len(),
    };
    Ok(ModelConfig {
        arch,
        kind,
        n_layer: keys.usize("block_count")?,
        n_embd,
        // Required where the FFN is dense: checked once the architecture has read its experts.
        n_ff: keys.usize_or("feed_forward_length", 0)?,
        n_head,
        n_head_kv,
        head_dim,
        n_rot: keys.usize_or("rope.dimension_count", head_dim)?,
        n_ctx_train: keys.usize("context_length")?,
        n_vocab,
        rms_eps: keys.f32("attention.layer_norm_rms_epsilon")?,
        rope_freq_base: keys.f32_opt("rope.freq_base")?.unwrap_or(10_000.0),
        rope_freq_scale,
        rope_mode: rgml::RopeMode::Normal,
        sliding_window: None,
        embd_scale: None,
        attn_scale: 1.0 / (head_dim as f32).sqrt(),
        attn_scale_on_q: false,
        ffn_activation: FfnActivation::Silu,
        final_logit_softcap: None,
        moe: None,
    })
}

/// The checks that make the numbers safe to build graphs from.
fn check(c: &ModelConfig) -> Result<()> {
    let ModelConfig {
        n_layer,
        n_embd,
        n_ff,
        n_head,
        n_head_kv,
        head_dim,
        n_rot,
        n_vocab,
        rms_eps,
        rope_freq_base,
        ..
    } = *c;
    let ffn_width = c.moe.as_ref().map_or(n_ff, |m| m.n_ff_exp);
    if [n_head, n_embd, n_layer, n_head_kv, ffn_width, head_dim].contains(&0) {
        return Err(LlmError::BadConfig(format!(
            "zero-sized model: {n_layer} layers, {n_embd} wide, {n_head}/{n_head_kv} heads \
             {head_dim} wide, feed-forward {ffn_width} wide"
        )));
    }
    if !n_head.is_multiple_of(n_head_kv) {
        return Err(LlmError::BadConfig(format!(
            "{n_head} heads and {n_head_kv} kv heads do not group evenly"
        )));
    }
    if n_rot == 0 || n_rot > head_dim || !n_rot.is_multiple_of(2) {
        return Err(LlmError::BadConfig(format!(
            "rope.dimension_count {n_rot} must be even, positive and at most the head width \
             {head_dim}"
        )));
    }
    if n_vocab == 0 {
        return Err(LlmError::BadConfig("an empty vocabulary".into()));
    }
    let sane = rms_eps > 0.0 && rms_eps < 1.0 && rope_freq_base > 0.0 && rope_freq_base.is_finite();
    if !sane {
        return Err(LlmError::BadConfig(format!(
            "rms epsilon {rms_eps} or rope base {rope_freq_base} out of range"
        )));
    }
    if let Some(w) = &c.sliding_window {
        if w.window == 0 || w.layers.len() != n_layer {
            return Err(LlmError::BadConfig(format!(
                "a sliding window of {} positions over {} of {n_layer} layers",
                w.window,
                w.layers.len()
            )));
        }
        if !(w.rope_freq_base > 0.0 && w.rope_freq_base.is_finite()) {
            return Err(LlmError::BadConfig(format!(
                "local rope base {} out of range",
                w.rope_freq_base
            )));
        }
    }
    Ok(())
}

/// Block `il`'s weights, found by name with `get` (`None`: not in the file).
pub(crate) fn layer_weights(
    c: &ModelConfig,
    il: usize,
    get: &dyn Fn(&str) -> Option<TensorId>,
) -> Result<LayerWeights> {
    let arch = c.kind;
    let name = |s: &str| format!("blk.{il}.{s}");
    let required = |s: &str| get(&name(s)).ok_or_else(|| LlmError::MissingTensor(name(s)));
    let p = parts(arch);
    let part = |need: Need, s: &str| -> Result<Option<TensorId>> {
        match (need, get(&name(s))) {
            (Need::Required, None) => Err(LlmError::MissingTensor(name(s))),
            (Need::No, Some(_)) => Err(LlmError::BadTensor(format!(
                "'{}' is not part of a {arch:?} model",
                name(s)
            ))),
            (Need::No, None) => Ok(None),
            (_, found) => Ok(found),
        }
    };
    let qkv = if p.fused {
        for separate in ["attn_q.weight", "attn_k.weight", "attn_v.weight"] {
            part(Need::No, separate)?;
        }
        QkvWeights::Fused(required("attn_qkv.weight")?)
    } else {
        part(Need::No, "attn_qkv.weight")?;
        QkvWeights::Separate {
            wq: required("attn_q.weight")?,
            wk: required("attn_k.weight")?,
            wv: required("attn_v.weight")?,
        }
    };
    let ffn = match (&c.moe, p.fused) {
        (Some(_), _) => FfnWeights::Experts(ExpertWeights {
            gate_inp: required("ffn_gate_inp.weight")?,
            gate: get(&name("ffn_gate_exps.weight")),
            up: required("ffn_up_exps.weight")?,
            down: required("ffn_down_exps.weight")?,
        }),
        (None, true) => {
            part(Need::No, "ffn_gate.weight")?;
            FfnWeights::Dense {
                gate: None,
                up: required("ffn_up.weight")?,
                down: required("ffn_down.weight")?,
            }
        }
        (None, false) => FfnWeights::Dense {
            gate: Some(required("ffn_gate.weight")?),
            up: required("ffn_up.weight")?,
            down: required("ffn_down.weight")?,
        },
    };
    Ok(LayerWeights {
        attn_norm: required("attn_norm.weight")?,
        qkv,
        wo: required("attn_output.weight")?,
        bq: part(p.biases, "attn_q.bias")?,
        bk: part(p.biases, "attn_k.bias")?,
        bv: part(p.biases, "attn_v.bias")?,
        attn_q_norm: part(p.qk_norm, "attn_q_norm.weight")?,
        attn_k_norm: part(p.qk_norm, "attn_k_norm.weight")?,
        attn_post_norm: part(p.post_norms, "post_attention_norm.weight")?,
        ffn_norm: required("ffn_norm.weight")?,
        ffn,
        ffn_post_norm: part(p.post_norms, "post_ffw_norm.weight")?,
    })
}

/// The shapes block weights must have, `(tensor, ne)`, and which of them are norms.
pub(crate) fn layer_shapes(c: &ModelConfig, l: &LayerWeights) -> Vec<(TensorId, [usize; 4], bool)> {
    let (e, q, kv, hd) = (c.n_embd, c.n_embd_q(), c.n_embd_kv(), c.head_dim);
    let mut out = vec![
        (l.attn_norm, [e, 1, 1, 1], true),
        (l.wo, [q, e, 1, 1], false),
        (l.ffn_norm, [e, 1, 1, 1], true),
    ];
    match l.qkv {
        QkvWeights::Separate { wq, wk, wv } => out.extend([
            (wq, [e, q, 1, 1], false),
            (wk, [e, kv, 1, 1], false),
            (wv, [e, kv, 1, 1], false),
        ]),
        QkvWeights::Fused(wqkv) => out.push((wqkv, [e, q + 2 * kv, 1, 1], false)),
    }
    out.extend(ffn_shapes(c, &l.ffn));
    let optional = [
        (l.bq, q, false),
        (l.bk, kv, false),
        (l.bv, kv, false),
        (l.attn_q_norm, hd, true),
        (l.attn_k_norm, hd, true),
        (l.attn_post_norm, e, true),
        (l.ffn_post_norm, e, true),
    ];
    out.extend(
        optional
            .into_iter()
            .filter_map(|(t, n, norm)| t.map(|t| (t, [n, 1, 1, 1], norm))),
    );
    out
}

/// The shapes of an FFN's weights (none of them norms).
fn ffn_shapes(c: &ModelConfig, ffn: &FfnWeights) -> Vec<(TensorId, [usize; 4], bool)> {
    let (e, ff) = (c.n_embd, c.n_ff);
    match ffn {
        FfnWeights::Dense { gate, up, down } => {
            let up_rows = if gate.is_some() { ff } else { 2 * ff };
            let mut out = vec![
                (*up, [e, up_rows, 1, 1], false),
                (*down, [ff, e, 1, 1], false),
            ];
            out.extend(gate.map(|g| (g, [e, ff, 1, 1], false)));
            out
        }
        FfnWeights::Experts(x) => {
            let (n_exp, ff) = c.moe.as_ref().map_or((0, 0), |m| (m.n_expert, m.n_ff_exp));
            let mut out = vec![
                (x.gate_inp, [e, n_exp, 1, 1], false),
                (x.up, [e, ff, n_exp, 1], false),
                (x.down, [ff, e, n_exp, 1], false),
            ];
            out.extend(x.gate.map(|g| (g, [e, ff, n_exp, 1], false)));
            out
        }
    }
}

/// Add block `il`'s nodes on the hidden state `x`; returns the block's output.
pub(crate) fn build_layer(
    b: &mut Builder<'_>,
    il: usize,
    l: &LayerWeights,
    x: TensorId,
) -> Result<TensorId> {
    match b.config().kind {
        // Phi-3's fused projections are the shared blocks' business: LLaMA's block.
        Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe | Arch::Phi3 => {
            llama::layer(b, il, l, x)
        }
        Arch::Gemma3 => gemma3::layer(b, il, l, x),
    }
}

/// The token embeddings of the batch, scaled where the architecture scales them.
pub(crate) fn embeddings(b: &mut Builder<'_>, tokens: TensorId) -> Result<TensorId> {
    let tok_embd = b.model().tok_embd;
    let embd = b.ctx().get_rows(tok_embd, tokens)?;
    let embd = b.keep(embd, "inp_embd".into())?;
    match b.config().embd_scale {
        Some(s) => {
            let scaled = b.ctx().scale(embd, s)?;
            b.keep(scaled, "inp_scaled".into())
        }
        None => Ok(embd),
    }
}
