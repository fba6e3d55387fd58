//! The architectures: per architecture, its hyper-parameters (from GGUF metadata), the tensors
//! of a block, and the graph of a block, built from the shared blocks of [`blocks`].
//!
//! This module owns reading a [`ModelConfig`] and resolving a block's weights by name, and
//! dispatches to one module per architecture ([`llama`], [`phi3`], [`gemma3`], [`gpt_oss`],
//! [`qwen35`], [`gemma4`], [`bert`]). Adding an architecture
//! is one such module and a line in each `match` here. Loading, sessions, the scheduler and
//! the tensor split are the same for every architecture.

mod bert;
pub(crate) mod blocks;
mod gemma3;
mod gemma4;
mod gpt_oss;
mod keys;
mod llama;
mod moe;
mod phi3;
mod qwen35;
mod swa;
mod weights;

pub use bert::EncoderInput;
pub(crate) use weights::layer_shapes;
pub use weights::{
    AttentionWeights, DeltaNetWeights, ExpertWeights, FfnWeights, LayerWeights, Matrix, Mixer,
    ParallelExperts, PerLayerEmbeddings, PerLayerInput, QkvWeights, SharedExpert,
};
use weights::{LayerParts, Need, FFN_NORM, POST_ATTENTION_NORM};

use crate::config::{Arch, FfnActivation, LayerHeads, ModelConfig};
use crate::error::{LlmError, Result};
use blocks::Builder;
use keys::Keys;
use rgml::TensorId;
use rgml_gguf::GgufFile;

fn parts(arch: Arch) -> LayerParts {
    match arch {
        // BERT's blocks are found by their own loader (`weights::encoder_layer_weights`).
        Arch::Llama | Arch::Bert => llama::PARTS,
        Arch::Qwen2 => llama::QWEN2_PARTS,
        Arch::Qwen3 | Arch::Qwen3Moe => llama::QWEN3_PARTS,
        Arch::Phi3 => phi3::PARTS,
        Arch::Gemma3 => gemma3::PARTS,
        Arch::GptOss => gpt_oss::PARTS,
        Arch::Qwen35 | Arch::Qwen35Moe => qwen35::PARTS,
        Arch::Gemma4 => gemma4::PARTS,
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
            Arch::GptOss => gpt_oss::hparams(&keys, &mut c)?,
            Arch::Qwen35 | Arch::Qwen35Moe => qwen35::hparams(&keys, &mut c)?,
            Arch::Gemma4 => gemma4::hparams(&keys, &mut c)?,
            Arch::Bert => bert::hparams(&keys, &mut c)?,
        }
        check(&c)?;
        Ok(c)
    }
}

/// The hyper-parameters every architecture reads the same way (defaults as llama.cpp's).
fn common(keys: &Keys<'_>, arch: String, kind: Arch) -> Result<ModelConfig> {
    let n_embd = keys.usize("embedding_length")?;
    let n_layer = keys.usize("block_count")?;
    // One count, or one per layer (llama.cpp's `get_key_or_arr`): the model's is layer 0's.
    let n_head_layers = keys.usize_per_layer("attention.head_count", n_layer)?;
    let n_head = n_head_layers.first().copied().unwrap_or(0);
    let n_head_kv_layers = match keys.has("attention.head_count_kv") {
        true => keys.usize_per_layer("attention.head_count_kv", n_layer)?,
        false => n_head_layers.clone(),
    };
    let n_head_kv = n_head_kv_layers.first().copied().unwrap_or(0);
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
    let n_rot = keys.usize_or("rope.dimension_count", head_dim)?;
    let layer_heads = n_head_layers
        .iter()
        .zip(&n_head_kv_layers)
        .map(|(&n_head, &n_head_kv)| LayerHeads {
            n_head,
            n_head_kv,
            head_dim,
            n_rot,
        })
        .collect();
    let n_ff_layers = match keys.has("feed_forward_length") {
        true => keys.usize_per_layer("feed_forward_length", n_layer)?,
        // Required where the FFN is dense: checked once the architecture has read its experts.
        false => vec![0; n_layer],
    };
    let scaling = rope_scaling(keys)?;
    let rope_freq_scale = match keys.f32_opt("rope.scaling.factor")? {
        // llama.cpp never scales positions when the type says none.
        _ if scaling == RopeScaling::None => 1.0,
        Some(f) if f > 0.0 => 1.0 / f,
        _ => 1.0,
    };
    let rope_attn_factor = keys.f32_opt("rope.scaling.attn_factor")?.unwrap_or(1.0);
    if !(rope_attn_factor.is_finite() && rope_attn_factor > 0.0) {
        return Err(LlmError::BadConfig(format!(
            "{} = {rope_attn_factor} must be positive",
            keys.name("rope.scaling.attn_factor")
        )));
    }
    let rope_ext_factor = if scaling == RopeScaling::Yarn {
        1.0
    } else {
        0.0
    };
    let rope_attn_factor = match scaling {
        RopeScaling::Yarn => yarn_attn_factor(keys, rope_freq_scale)? * rope_attn_factor,
        _ => rope_attn_factor,
    };
    let n_ctx_train = keys.usize("context_length")?;
    let n_vocab = match keys.has("vocab_size") {
        true => keys.usize("vocab_size")?,
        false => keys.gguf.get_array("tokenizer.ggml.tokens")?.len(),
    };
    Ok(ModelConfig {
        arch,
        kind,
        n_layer,
        n_embd,
        n_ff: n_ff_layers.first().copied().unwrap_or(0),
        n_head,
        n_head_kv,
        head_dim,
        n_rot,
        n_ctx_train,
        n_ctx_orig: keys.usize_or("rope.scaling.original_context_length", n_ctx_train)?,
        n_vocab,
        rms_eps: match kind {
            Arch::Bert => keys.f32("attention.layer_norm_epsilon")?,
            _ => keys.f32("attention.layer_norm_rms_epsilon")?,
        },
        rope_freq_base: keys.f32_opt("rope.freq_base")?.unwrap_or(10_000.0),
        rope_freq_scale,
        rope_attn_factor,
        rope_ext_factor,
        rope_mode: rgml::RopeMode::Normal,
        sliding_window: None,
        embd_scale: None,
        attn_scale: 1.0 / (head_dim as f32).sqrt(),
        attn_scale_on_q: false,
        ffn_activation: FfnActivation::Silu,
        final_logit_softcap: None,
        moe: None,
        attn_output_gate: false,
        recurrent: None,
        output_rows_after_norm: false,
        n_layer_nextn: 0,
        pooling: crate::embed::Pooling::from_gguf(keys.usize_or("pooling_type", 0)? as u64),
        layer_heads: differing(layer_heads),
        layer_n_ff: differing(n_ff_layers),
        n_layer_kv: n_layer,
        value_norm: false,
        n_embd_per_layer: 0,
        causal: match keys.value("attention.causal") {
            None => true,
            Some(v) => v.as_bool().ok_or_else(|| {
                LlmError::BadConfig(format!("{} is not a bool", keys.name("attention.causal")))
            })?,
        },
        n_token_types: 0,
    })
}

/// Per-layer values where they differ between layers, else `None`.
pub(super) fn differing<T: PartialEq>(per_layer: Vec<T>) -> Option<Vec<T>> {
    match per_layer.windows(2).all(|w| w[0] == w[1]) {
        true => None,
        false => Some(per_layer),
    }
}

/// `rope.scaling.type`, as llama.cpp reads it (absent: linear).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RopeScaling {
    None,
    /// Linear position scaling (`rope.scaling.factor`); also LongRoPE, whose per-frequency
    /// factors are tensors.
    Linear,
    Yarn,
}

fn rope_scaling(keys: &Keys<'_>) -> Result<RopeScaling> {
    let key = "rope.scaling.type";
    match keys.value(key).map(|v| v.as_str()) {
        None | Some(Some("linear" | "longrope")) => Ok(RopeScaling::Linear),
        Some(Some("none")) => Ok(RopeScaling::None),
        Some(Some("yarn")) => Ok(RopeScaling::Yarn),
        Some(Some(other)) => Err(LlmError::UnsupportedModel(format!(
            "{} = {other:?} (supported: none, linear, longrope, yarn)",
            keys.name(key)
        ))),
        Some(None) => Err(LlmError::BadConfig(format!(
            "{} is not a string",
            keys.name(key)
        ))),
    }
}

/// YaRN's magnitude factor as llama.cpp's context computes it (`yarn_attn_factor`): the
/// `0.1 ln(s) + 1` correction (over that of `rope.scaling.yarn_log_multiplier` where the file
/// has one), divided by the correction ggml's ROPE applies itself.
fn yarn_attn_factor(keys: &Keys<'_>, freq_scale: f32) -> Result<f32> {
    let mscale = |scale: f32, m: f32| match scale <= 1.0 {
        true => 1.0,
        false => 0.1 * m * scale.ln() + 1.0,
    };
    let factor = 1.0 / freq_scale;
    let attn = match keys.f32_opt("rope.scaling.yarn_log_multiplier")? {
        Some(m) if m != 0.0 => mscale(factor, 1.0) / mscale(factor, m),
        _ => mscale(factor, 1.0),
    };
    Ok(attn * (1.0 / (1.0 + 0.1 * factor.ln())))
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
    for il in 0..n_layer {
        check_heads(c.heads(il), il)?;
    }
    if let Some(widths) = &c.layer_n_ff {
        if c.moe.is_none() && widths.contains(&0) {
            return Err(LlmError::BadConfig(format!(
                "a dense feed-forward block 0 wide (feed_forward_length {widths:?})"
            )));
        }
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
    check_shared_kv(c)
}

/// A layer's heads group evenly and rotate an even number of their dimensions.
fn check_heads(h: LayerHeads, il: usize) -> Result<()> {
    let LayerHeads {
        n_head,
        n_head_kv,
        head_dim,
        n_rot,
    } = h;
    if [n_head, n_head_kv, head_dim].contains(&0) || !n_head.is_multiple_of(n_head_kv) {
        return Err(LlmError::BadConfig(format!(
            "layer {il}: {n_head} heads and {n_head_kv} kv heads {head_dim} wide do not group \
             evenly"
        )));
    }
    if n_rot == 0 || n_rot > head_dim || !n_rot.is_multiple_of(2) {
        return Err(LlmError::BadConfig(format!(
            "layer {il}: {n_rot} rotated dimensions (rope.dimension_count) must be even, \
             positive and at most the head width {head_dim}"
        )));
    }
    Ok(())
}

/// Layers that attend over an earlier layer's cache find one of their kind and shape.
fn check_shared_kv(c: &ModelConfig) -> Result<()> {
    if c.n_layer_kv >= c.n_layer {
        return Ok(());
    }
    if c.n_layer_kv < 2 {
        return Err(LlmError::BadConfig(format!(
            "{} of {} layers share the KV cache of earlier ones: at least two must keep their own",
            c.n_layer - c.n_layer_kv,
            c.n_layer
        )));
    }
    for il in c.n_layer_kv..c.n_layer {
        let src = c.kv_layer(il);
        let (mine, theirs) = (c.heads(il), c.heads(src));
        let same = c.is_local(il) == c.is_local(src)
            && mine.head_dim == theirs.head_dim
            && mine.n_head_kv == theirs.n_head_kv
            && !c.is_recurrent(src);
        if !same {
            return Err(LlmError::BadConfig(format!(
                "layer {il} would attend over layer {src}'s KV cache, which is of another kind \
                 or shape"
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
    weights::layer_weights(c, &parts(c.kind), il, get)
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
        // gpt-oss's block is LLaMA's: its differences are in the parts and hyper-parameters.
        Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe | Arch::Phi3 | Arch::GptOss => {
            llama::layer(b, il, l, x)
        }
        Arch::Gemma3 => gemma3::layer(b, il, l, x),
        Arch::Qwen35 | Arch::Qwen35Moe => qwen35::layer(b, il, l, x),
        Arch::Gemma4 => gemma4::layer(b, il, l, x),
        Arch::Bert => bert::layer(b, il, l, x),
    }
}

/// The residual of the mixer's output `attn` onto `x`, then the FFN on its norm with its own
/// residual (a pre-norm block's second half): `ffn(norm(attn + x)) + (attn + x)`. `names` are
/// llama.cpp's for the sum and for the norm.
pub(crate) fn residual_ffn(
    b: &mut Builder<'_>,
    il: usize,
    l: &LayerWeights,
    (attn, x): (TensorId, TensorId),
    names: [&str; 2],
) -> Result<TensorId> {
    let x_attn = b.ctx().add(attn, x)?;
    let x_attn = b.keep(x_attn, format!("{}-{il}", names[0]))?;
    let cur = b.norm(x_attn, l.ffn_norm, il)?;
    let cur = b.keep(cur, format!("{}-{il}", names[1]))?;
    let ffn = ffn(b, il, l, cur)?;
    let out = b.ctx().add(ffn, x_attn)?;
    b.keep(out, format!("l_out-{il}"))
}

/// The FFN of block `il` on the normed `cur`: the gated FFN, or the mixture of experts (each
/// sequence's rows routed as alone, see [`Builder::by_sequence`]).
pub(crate) fn ffn(
    b: &mut Builder<'_>,
    il: usize,
    l: &LayerWeights,
    cur: TensorId,
) -> Result<TensorId> {
    match &l.ffn {
        FfnWeights::Dense { gate, up, down } => b.dense_ffn(il, gate.as_ref(), up, down, cur),
        FfnWeights::Ungated { .. } => Err(LlmError::BadConfig(format!(
            "block {il}: an ungated FFN outside a bert block"
        ))),
        FfnWeights::Experts(experts) => {
            let named = b.one_sequence();
            let routed = b.by_sequence(cur, &mut |b, part, alone| {
                moe::ffn(b, il, experts, part, alone, named)
            })?;
            match &experts.shared {
                Some(shared) => moe::add_shared_expert(b, il, shared, cur, routed),
                None => Ok(routed),
            }
        }
    }
}

/// The token embeddings of the batch, scaled where the architecture scales them; and the
/// per-layer inputs where the model has per-layer embeddings.
pub(crate) fn embeddings(b: &mut Builder<'_>, tokens: TensorId) -> Result<TensorId> {
    let tok_embd = b.model().tok_embd;
    let embd = b.ctx().get_rows(tok_embd, tokens)?;
    let embd = b.keep(embd, "inp_embd".into())?;
    let embd = match b.config().embd_scale {
        Some(s) => {
            let scaled = b.ctx().scale(embd, s)?;
            b.keep(scaled, "inp_scaled".into())?
        }
        None => embd,
    };
    if let Some(p) = b.model().per_layer_embd {
        b.per_layer_inputs = Some(gemma4::per_layer_inputs(b, p, tokens, embd)?);
    }
    match b.model().encoder {
        Some(input) => {
            let positions = b.positions();
            bert::embeddings(b, &input, embd, positions)
        }
        None => Ok(embd),
    }
}
