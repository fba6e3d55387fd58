//! A block's weights: what each architecture's block is made of, found by llama.cpp's tensor
//! names, and the shape each must have.
//!
//! As llama.cpp's loader, the parts every architecture may have are read the same way for all:
//! Q/K/V fused in one `attn_qkv` or separate, their biases, and a `.scale` per matrix (one
//! number, or one per expert: NVFP4 exports' second-level scales, multiplied into the
//! product). `.input_scale` tensors (activation scales of FP8/NVFP4 exports) are accepted and
//! never read, as llama.cpp loads and never reads them. What only some families have (QK-norm,
//! post-norms, output and FFN biases, fused gate/up) is each architecture's
//! [`LayerParts`]. A tensor no part claims makes the file refused (by the loader).

use super::{Arch, ModelConfig};
use crate::error::{LlmError, Result};
use rgml::TensorId;

/// A weight matrix with the optional bias added to its product and the optional scale that
/// multiplies it (`[1]`, or `[n_expert]` for experts).
#[derive(Clone, Copy, Debug)]
pub struct Matrix {
    /// The weights `[n_in, n_out]` (`[n_in, n_out, n_expert]` for experts).
    pub w: TensorId,
    /// `[n_out]`, added to the product.
    pub bias: Option<TensorId>,
    /// Multiplies the product (llama.cpp's `*_s`).
    pub scale: Option<TensorId>,
}

/// The weights of one transformer block. Which of the optional ones a block has depends on
/// the architecture (see [`LayerParts`]).
#[derive(Clone, Debug)]
pub struct LayerWeights {
    /// RMS norm before attention (or the delta net); in a post-norm encoder (BERT) the layer
    /// norm of the attention's output and its residual (`attn_output_norm`).
    pub attn_norm: TensorId,
    /// What mixes the positions: attention, or a gated delta net (hybrid models).
    pub mixer: Mixer,
    /// RMS norm of the attention output, before the residual (Gemma 3).
    pub attn_post_norm: Option<TensorId>,
    /// RMS norm before the feed-forward block (gpt-oss's and Qwen3.5's `post_attention_norm`);
    /// in a post-norm encoder the layer norm of the block's output (`layer_output_norm`).
    pub ffn_norm: TensorId,
    /// The biases of a post-norm encoder's two layer norms (`attn_norm`, `ffn_norm`), whose
    /// norms are layer norms rather than RMS norms.
    pub norm_biases: Option<[TensorId; 2]>,
    /// The feed-forward block's projections.
    pub ffn: FfnWeights,
    /// RMS norm of the FFN output, before the residual (Gemma 3).
    pub ffn_post_norm: Option<TensorId>,
    /// A mixture of experts beside the dense FFN (Gemma 4's MoE blocks).
    pub parallel_experts: Option<ParallelExperts>,
    /// The block's share of the token's per-layer embedding (Gemma 4).
    pub per_layer_input: Option<PerLayerInput>,
    /// One factor on the block's output `[1]` (`layer_output_scale`: Gemma 4).
    pub out_scale: Option<TensorId>,
    /// Tensors accepted and never read (`.input_scale`), with their shapes.
    pub unread: Vec<(TensorId, [usize; 4])>,
}

/// A mixture of experts that runs beside a block's dense FFN on the same input, each with
/// norms of its own, their outputs summed (llama.cpp's Gemma 4 MoE block; names in
/// parentheses).
#[derive(Clone, Debug)]
pub struct ParallelExperts {
    /// The experts; their router reads its own norm of the input (below).
    pub experts: ExpertWeights,
    /// Per-channel factor of the router's input `[n_embd]` (`ffn_gate_inp.scale`).
    pub router_scale: TensorId,
    /// RMS norm of the experts' input (`pre_ffw_norm_2`).
    pub pre_norm: TensorId,
    /// RMS norm of the dense FFN's output (`post_ffw_norm_1`).
    pub dense_post_norm: TensorId,
    /// RMS norm of the experts' output (`post_ffw_norm_2`).
    pub post_norm: TensorId,
}

/// Gemma 4's per-layer token embeddings: per token, a vector of `n_embd_per_layer` values for
/// each block, from its own table and from a projection of its embedding (llama.cpp's names in
/// parentheses).
#[derive(Clone, Copy, Debug)]
pub struct PerLayerEmbeddings {
    /// `[n_embd_per_layer * n_layer, n_vocab]` (`per_layer_token_embd`).
    pub tok_embd: TensorId,
    /// `[n_embd, n_embd_per_layer * n_layer]` (`per_layer_model_proj`).
    pub model_proj: TensorId,
    /// RMS norm of each block's projected part `[n_embd_per_layer]` (`per_layer_proj_norm`).
    pub proj_norm: TensorId,
}

/// What a block adds of the token's per-layer embedding (Gemma 4): its output, gated by the
/// GELU of `gate · out` times the block's slice of the embedding, projected back and normed.
#[derive(Clone, Copy, Debug)]
pub struct PerLayerInput {
    /// `[n_embd, n_embd_per_layer]` (`inp_gate`).
    pub gate: TensorId,
    /// `[n_embd_per_layer, n_embd]` (`proj`).
    pub proj: TensorId,
    /// `[n_embd]` (`post_norm`).
    pub post_norm: TensorId,
}

/// The part of a block that mixes positions.
// One per block, made once at load: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum Mixer {
    /// Self-attention over the KV cache.
    Attention(AttentionWeights),
    /// A gated delta net over its recurrent state (Qwen3.5's linear-attention layers).
    DeltaNet(DeltaNetWeights),
}

/// A self-attention's weights.
#[derive(Clone, Debug)]
pub struct AttentionWeights {
    /// The Q, K and V projections, separate or fused (Q twice as wide where the model gates
    /// the attention output: each head's query, then its gate).
    pub qkv: QkvWeights,
    /// Attention output projection `[n_embd_q, n_embd]` (a bias: LLaMA).
    pub wo: Matrix,
    /// RMS norm of each query head `[head_dim]` (QK-norm: Qwen3, Gemma 3).
    pub q_norm: Option<TensorId>,
    /// RMS norm of each key head `[head_dim]`.
    pub k_norm: Option<TensorId>,
    /// Per-head attention sinks `[n_head]` (gpt-oss): one more score in each softmax.
    pub sinks: Option<TensorId>,
}

/// A gated delta-net layer's weights (llama.cpp's names in parentheses).
#[derive(Clone, Debug)]
pub struct DeltaNetWeights {
    /// Queries, keys and values before the convolution `[n_embd, conv_channels]`
    /// (`attn_qkv`).
    pub qkv: Matrix,
    /// The output gate `z` `[n_embd, value_dim]` (`attn_gate`).
    pub gate: Matrix,
    /// One short causal kernel per channel `[d_conv, conv_channels]` (`ssm_conv1d`).
    pub conv: TensorId,
    /// Bias of the decay's softplus `[n_v_heads]` (`ssm_dt.bias`).
    pub dt_bias: TensorId,
    /// `-exp(A_log)` per value head `[n_v_heads]` (`ssm_a`).
    pub a: TensorId,
    /// The write strength's projection `[n_embd, n_v_heads]` (`ssm_beta`).
    pub beta: Matrix,
    /// The decay's projection `[n_embd, n_v_heads]` (`ssm_alpha`).
    pub alpha: Matrix,
    /// The gated RMS norm of each value head's output `[head_dim]` (`ssm_norm`).
    pub norm: TensorId,
    /// Output projection `[value_dim, n_embd]` (`ssm_out`).
    pub out: Matrix,
}

/// The attention's input projections.
#[derive(Clone, Debug)]
pub enum QkvWeights {
    /// Query `[n_embd, n_embd_q]`, key and value `[n_embd, n_embd_kv]`.
    Separate {
        /// Query projection.
        q: Matrix,
        /// Key projection (`None`: a layer that attends over an earlier layer's cache and
        /// has none).
        k: Option<Matrix>,
        /// Value projection (`None`: the keys' projection is the values' too, Gemma 4; or a
        /// layer without a cache of its own).
        v: Option<Matrix>,
    },
    /// One `[n_embd, n_embd_q + 2 * n_embd_kv]` projection: Q's rows, then K's, then V's.
    Fused(Matrix),
}

/// A feed-forward block's projections: one gated FFN, or a mixture of experts.
// One per block, made once at load: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum FfnWeights {
    /// One FFN for every token.
    Dense {
        /// Gate projection `[n_embd, n_ff]`; `None` where the up projection holds both
        /// (Phi-3).
        gate: Option<Matrix>,
        /// Up projection `[n_embd, n_ff]`, or gate and up fused `[n_embd, 2 * n_ff]` (the
        /// gate's rows first).
        up: Matrix,
        /// Down projection `[n_ff, n_embd]`.
        down: Matrix,
    },
    /// A router and `n_expert` FFNs stacked on dim 2.
    Experts(ExpertWeights),
    /// One FFN without a gate, `down(act(up(x)))` (BERT's GELU FFN, with biases).
    Ungated {
        /// Up projection `[n_embd, n_ff]`.
        up: Matrix,
        /// Down projection `[n_ff, n_embd]`.
        down: Matrix,
    },
}

/// The weights of a mixture-of-experts FFN (`ffn_*_exps`); their scales are per expert.
#[derive(Clone, Debug)]
pub struct ExpertWeights {
    /// The router `[n_embd, n_expert]`, with its bias `[n_expert]` (gpt-oss).
    pub gate_inp: Matrix,
    /// Gate projections `[n_embd, n_ff_exp, n_expert]`; `None`: the experts are not gated
    /// (SiLU of the up projection), or gate and up are fused in `up`.
    pub gate: Option<Matrix>,
    /// Up projections `[n_embd, n_ff_exp, n_expert]`, or with [`fused_gate_up`]
    /// (`ffn_gate_up_exps`) gate and up `[n_embd, 2 * n_ff_exp, n_expert]`, the gate's rows
    /// first.
    ///
    /// [`fused_gate_up`]: ExpertWeights::fused_gate_up
    pub up: Matrix,
    /// Whether `up` holds gate and up.
    pub fused_gate_up: bool,
    /// Down projections `[n_ff_exp, n_embd, n_expert]`.
    pub down: Matrix,
    /// The shared expert every token runs beside the routed ones (Qwen3.5 MoE).
    pub shared: Option<SharedExpert>,
}

/// A shared expert: a gated FFN whose output is scaled by the sigmoid of its own gate.
#[derive(Clone, Debug)]
pub struct SharedExpert {
    /// `[n_embd, n_ff_shexp]` (`ffn_gate_shexp`).
    pub gate: Matrix,
    /// `[n_embd, n_ff_shexp]` (`ffn_up_shexp`).
    pub up: Matrix,
    /// `[n_ff_shexp, n_embd]` (`ffn_down_shexp`).
    pub down: Matrix,
    /// One logit per token: `[n_embd]` (`ffn_gate_inp_shexp`).
    pub gate_inp: TensorId,
}

/// Whether an architecture's blocks have a part: a file with a part its architecture does not
/// have is refused (as llama.cpp refuses unused tensors), not silently run without it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Need {
    No,
    Optional,
    Required,
}

/// The parts only some architectures' blocks have.
pub(super) struct LayerParts {
    /// Per-head q/k RMS norms.
    pub(super) qk_norm: Need,
    /// Norms after attention and after the FFN.
    pub(super) post_norms: Need,
    /// Biases of the attention output and of the dense FFN's matrices (LLaMA).
    pub(super) out_biases: Need,
    /// Gate and up in one `ffn_up` (Phi-3) instead of `ffn_gate` and `ffn_up`.
    pub(super) fused_gate_up: bool,
    /// Whether the FFN's (or the experts') `.scale` tensors multiply its products. llama.cpp
    /// loads them for every architecture, but only some graphs pass them on (LLaMA, Qwen3,
    /// their MoE); elsewhere they are accepted and never read, so the logits stay llama.cpp's.
    pub(super) ffn_scales: bool,
    /// Per-head attention sinks (`attn_sinks`).
    pub(super) sinks: Need,
    /// Biases of the router and of the experts' matrices.
    pub(super) expert_biases: Need,
    /// The name of the norm before the FFN (gpt-oss: `post_attention_norm`).
    pub(super) ffn_norm: &'static str,
    /// A shared expert beside the routed ones (`ffn_*_shexp`, gated by `ffn_gate_inp_shexp`).
    pub(super) shared_expert: Need,
    /// Whether a layer without `attn_v` takes its keys' projection as values (Gemma 4).
    pub(super) value_from_key: bool,
    /// Whether a block with a router has experts beside a dense FFN ([`ParallelExperts`])
    /// rather than instead of one (Gemma 4; with the model's expert hyper-parameters).
    pub(super) parallel_experts: bool,
    /// The factor on each block's output (`layer_output_scale`).
    pub(super) out_scale: Need,
}

/// The usual name of the norm before the FFN.
pub(super) const FFN_NORM: &str = "ffn_norm";

/// The norm after attention (Gemma 3), which is gpt-oss's norm before the FFN.
pub(super) const POST_ATTENTION_NORM: &str = "post_attention_norm";

/// Finds block `il`'s tensors by name.
struct Finder<'a> {
    arch: Arch,
    il: usize,
    get: &'a dyn Fn(&str) -> Option<TensorId>,
}

impl Finder<'_> {
    fn name(&self, s: &str) -> String {
        format!("blk.{}.{s}", self.il)
    }

    fn required(&self, s: &str) -> Result<TensorId> {
        (self.get)(&self.name(s)).ok_or_else(|| LlmError::MissingTensor(self.name(s)))
    }

    fn part(&self, need: Need, s: &str) -> Result<Option<TensorId>> {
        match (need, (self.get)(&self.name(s))) {
            (Need::Required, None) => Err(LlmError::MissingTensor(self.name(s))),
            (Need::No, Some(_)) => Err(LlmError::BadTensor(format!(
                "'{}' is not part of a {:?} model",
                self.name(s),
                self.arch
            ))),
            (Need::No, None) => Ok(None),
            (_, found) => Ok(found),
        }
    }

    /// `{base}.weight` with its scale, and its bias where `bias` allows one.
    fn matrix(&self, base: &str, bias: Need) -> Result<Matrix> {
        Ok(Matrix {
            w: self.required(&format!("{base}.weight"))?,
            bias: self.part(bias, &format!("{base}.bias"))?,
            scale: self.part(Need::Optional, &format!("{base}.scale"))?,
        })
    }

    /// [`Finder::matrix`] where the weight may be absent.
    fn optional_matrix(&self, base: &str, bias: Need) -> Result<Option<Matrix>> {
        match (self.get)(&self.name(&format!("{base}.weight"))) {
            Some(_) => self.matrix(base, bias).map(Some),
            None => Ok(None),
        }
    }
}

/// Block `il`'s weights, found by name with `get` (`None`: not in the file).
pub(crate) fn layer_weights(
    c: &ModelConfig,
    parts: &LayerParts,
    il: usize,
    get: &dyn Fn(&str) -> Option<TensorId>,
) -> Result<LayerWeights> {
    let f = Finder {
        arch: c.kind,
        il,
        get,
    };
    if c.kind == Arch::Bert {
        return encoder_layer_weights(&f);
    }
    // A layer that attends over an earlier layer's cache may lack its own K and V.
    let own_kv = c.kv_layer(il) == il;
    let kv_need = |need: Need| match (own_kv, need) {
        (false, Need::Required) => Need::Optional,
        _ => need,
    };
    let mixer = match c.is_recurrent(il) {
        true => Mixer::DeltaNet(delta_net_weights(&f)?),
        false => Mixer::Attention(AttentionWeights {
            qkv: qkv_weights(&f, parts, own_kv)?,
            wo: f.matrix("attn_output", parts.out_biases)?,
            q_norm: f.part(parts.qk_norm, "attn_q_norm.weight")?,
            k_norm: f.part(kv_need(parts.qk_norm), "attn_k_norm.weight")?,
            sinks: f.part(parts.sinks, "attn_sinks.weight")?,
        }),
    };
    let parallel_experts = match parts.parallel_experts && c.moe.is_some() {
        true => parallel_expert_weights(parts, &f)?,
        false => None,
    };
    let mut ffn = ffn_weights(c, parts, &f)?;
    let beside = parallel_experts.as_ref().map(|p| &p.experts);
    let mut unread = unread_scales(c, &f, &mixer, &ffn, beside);
    if !parts.ffn_scales {
        let n_expert = c.moe.as_ref().map_or(1, |m| m.n_expert);
        let (matrices, n): (Vec<&mut Matrix>, usize) = match &mut ffn {
            FfnWeights::Dense { gate, up, down } => {
                (gate.iter_mut().chain([up, down]).collect(), 1)
            }
            FfnWeights::Experts(x) => {
                let ExpertWeights { gate, up, down, .. } = x;
                (gate.iter_mut().chain([up, down]).collect(), n_expert)
            }
            FfnWeights::Ungated { up, down } => (vec![up, down], 1),
        };
        unread.extend(
            matrices
                .into_iter()
                .filter_map(|m| m.scale.take().map(|s| (s, [n, 1, 1, 1]))),
        );
    }
    // gpt-oss's and Qwen3.5's pre-FFN norm has the post-attention norm's name.
    let attn_post_norm = match parts.ffn_norm {
        POST_ATTENTION_NORM => None,
        _ => f.part(parts.post_norms, &format!("{POST_ATTENTION_NORM}.weight"))?,
    };
    Ok(LayerWeights {
        attn_norm: f.required("attn_norm.weight")?,
        mixer,
        attn_post_norm,
        ffn_norm: f.required(&format!("{}.weight", parts.ffn_norm))?,
        ffn,
        ffn_post_norm: f.part(parts.post_norms, "post_ffw_norm.weight")?,
        norm_biases: None,
        parallel_experts,
        per_layer_input: per_layer_input(c, &f)?,
        out_scale: f.part(parts.out_scale, "layer_output_scale.weight")?,
        unread,
    })
}

/// A BERT block (llama.cpp's `bert` loader): Q/K/V (fused or separate) and the output
/// projection with optional biases, the post-norms with their biases, and an ungated FFN with
/// optional biases. No scales: llama.cpp's graph passes none on.
fn encoder_layer_weights(f: &Finder<'_>) -> Result<LayerWeights> {
    let plain = |base: &str| -> Result<Matrix> {
        f.part(Need::No, &format!("{base}.scale"))?;
        f.matrix(base, Need::Optional)
    };
    let qkv = match f.optional_matrix("attn_qkv", Need::Optional)? {
        Some(fused) => QkvWeights::Fused(fused),
        None => QkvWeights::Separate {
            q: plain("attn_q")?,
            k: Some(plain("attn_k")?),
            v: Some(plain("attn_v")?),
        },
    };
    let norm = |base: &str| -> Result<[TensorId; 2]> {
        Ok([
            f.required(&format!("{base}.weight"))?,
            f.required(&format!("{base}.bias"))?,
        ])
    };
    let [attn_norm, attn_bias] = norm("attn_output_norm")?;
    let [out_norm, out_bias] = norm("layer_output_norm")?;
    Ok(LayerWeights {
        attn_norm,
        mixer: Mixer::Attention(AttentionWeights {
            qkv,
            wo: plain("attn_output")?,
            q_norm: None,
            k_norm: None,
            sinks: None,
        }),
        attn_post_norm: None,
        ffn_norm: out_norm,
        norm_biases: Some([attn_bias, out_bias]),
        ffn: FfnWeights::Ungated {
            up: plain("ffn_up")?,
            down: plain("ffn_down")?,
        },
        ffn_post_norm: None,
        parallel_experts: None,
        per_layer_input: None,
        out_scale: None,
        unread: Vec::new(),
    })
}

/// A Gemma 4 block's experts beside its dense FFN, where it has a router.
fn parallel_expert_weights(parts: &LayerParts, f: &Finder<'_>) -> Result<Option<ParallelExperts>> {
    if f.part(Need::Optional, "ffn_gate_inp.weight")?.is_none() {
        // A dense block (llama.cpp tells them by the router); stray expert tensors are
        // refused as unused.
        return Ok(None);
    }
    let mut experts = routed_experts(parts, f)?;
    // The router's `.scale` is a factor on its input here, not on its product.
    experts.gate_inp.scale = None;
    Ok(Some(ParallelExperts {
        experts,
        router_scale: f.required("ffn_gate_inp.scale")?,
        pre_norm: f.required("pre_ffw_norm_2.weight")?,
        dense_post_norm: f.required("post_ffw_norm_1.weight")?,
        post_norm: f.required("post_ffw_norm_2.weight")?,
    }))
}

/// The block's per-layer input where the model has per-layer embeddings.
fn per_layer_input(c: &ModelConfig, f: &Finder<'_>) -> Result<Option<PerLayerInput>> {
    let need = match c.n_embd_per_layer > 0 {
        true => Need::Required,
        false => Need::No,
    };
    let gate = f.part(need, "inp_gate.weight")?;
    let proj = f.part(need, "proj.weight")?;
    let post_norm = f.part(need, "post_norm.weight")?;
    Ok(gate
        .zip(proj)
        .zip(post_norm)
        .map(|((gate, proj), post_norm)| PerLayerInput {
            gate,
            proj,
            post_norm,
        }))
}

/// A delta-net layer's tensors (llama.cpp's `qwen35` loader): the projections take their
/// `.scale` as llama.cpp's graph does, and no biases.
fn delta_net_weights(f: &Finder<'_>) -> Result<DeltaNetWeights> {
    for attention in ["attn_q", "attn_k", "attn_v", "attn_output"] {
        f.part(Need::No, &format!("{attention}.weight"))?;
    }
    Ok(DeltaNetWeights {
        qkv: f.matrix("attn_qkv", Need::No)?,
        gate: f.matrix("attn_gate", Need::No)?,
        conv: f.required("ssm_conv1d.weight")?,
        dt_bias: f.required("ssm_dt.bias")?,
        a: f.required("ssm_a")?,
        beta: f.matrix("ssm_beta", Need::No)?,
        alpha: f.matrix("ssm_alpha", Need::No)?,
        norm: f.required("ssm_norm.weight")?,
        out: f.matrix("ssm_out", Need::No)?,
    })
}

/// Q/K/V as llama.cpp's `create_tensor_qkv` finds them: `attn_qkv` (with its bias) if the
/// file has it, else the separate projections with their biases. Without `own_kv` (a layer
/// that attends over an earlier layer's cache) K and V may be absent; V may be with
/// [`LayerParts::value_from_key`].
fn qkv_weights(f: &Finder<'_>, parts: &LayerParts, own_kv: bool) -> Result<QkvWeights> {
    match f.optional_matrix("attn_qkv", Need::Optional)? {
        Some(fused) => {
            for separate in ["attn_q", "attn_k", "attn_v"] {
                f.part(Need::No, &format!("{separate}.weight"))?;
                f.part(Need::No, &format!("{separate}.bias"))?;
            }
            Ok(QkvWeights::Fused(fused))
        }
        None => {
            let k = match own_kv {
                true => Some(f.matrix("attn_k", Need::Optional)?),
                false => f.optional_matrix("attn_k", Need::Optional)?,
            };
            let v = match own_kv && !parts.value_from_key {
                true => Some(f.matrix("attn_v", Need::Optional)?),
                false => f.optional_matrix("attn_v", Need::Optional)?,
            };
            Ok(QkvWeights::Separate {
                q: f.matrix("attn_q", Need::Optional)?,
                k,
                v,
            })
        }
    }
}

fn ffn_weights(c: &ModelConfig, parts: &LayerParts, f: &Finder<'_>) -> Result<FfnWeights> {
    if c.moe.is_some() && !parts.parallel_experts {
        return expert_weights(parts, f).map(FfnWeights::Experts);
    }
    let gate = match parts.fused_gate_up {
        true => {
            f.part(Need::No, "ffn_gate.weight")?;
            None
        }
        false => Some(f.matrix("ffn_gate", parts.out_biases)?),
    };
    Ok(FfnWeights::Dense {
        gate,
        up: f.matrix("ffn_up", parts.out_biases)?,
        down: f.matrix("ffn_down", parts.out_biases)?,
    })
}

/// The experts of a block whose FFN they are (as llama.cpp's `create_tensor_moe` finds them).
fn expert_weights(parts: &LayerParts, f: &Finder<'_>) -> Result<ExpertWeights> {
    // llama.cpp's router takes no scale (but Gemma 4's, see [`ParallelExperts`]).
    f.part(Need::No, "ffn_gate_inp.scale")?;
    routed_experts(parts, f)
}

/// The router and the experts (gate and up separate, or fused in `ffn_gate_up_exps`, which
/// takes no scale) and the shared expert.
fn routed_experts(parts: &LayerParts, f: &Finder<'_>) -> Result<ExpertWeights> {
    let biases = parts.expert_biases;
    let fused = f.optional_matrix("ffn_gate_up_exps", Need::No)?;
    let (gate, up, fused_gate_up) = match fused {
        Some(mut both) => {
            for separate in ["ffn_gate_exps", "ffn_up_exps"] {
                f.part(Need::No, &format!("{separate}.weight"))?;
            }
            f.part(Need::No, "ffn_gate_up_exps.scale")?;
            both.scale = None;
            (None, both, true)
        }
        None => (
            f.optional_matrix("ffn_gate_exps", biases)?,
            f.matrix("ffn_up_exps", biases)?,
            false,
        ),
    };
    let shared = match f.part(parts.shared_expert, "ffn_gate_inp_shexp.weight")? {
        Some(gate_inp) => Some(SharedExpert {
            gate: f.matrix("ffn_gate_shexp", Need::No)?,
            up: f.matrix("ffn_up_shexp", Need::No)?,
            down: f.matrix("ffn_down_shexp", Need::No)?,
            gate_inp,
        }),
        None => {
            f.part(Need::No, "ffn_up_shexp.weight")?;
            None
        }
    };
    Ok(ExpertWeights {
        gate_inp: f.matrix("ffn_gate_inp", biases)?,
        gate,
        up,
        fused_gate_up,
        down: f.matrix("ffn_down_exps", biases)?,
        shared,
    })
}

/// The `.input_scale` of each matrix the block has, where the file has one: `[1]`, or
/// `[n_expert]` for experts.
fn unread_scales(
    c: &ModelConfig,
    f: &Finder<'_>,
    mixer: &Mixer,
    ffn: &FfnWeights,
    parallel_experts: Option<&ExpertWeights>,
) -> Vec<(TensorId, [usize; 4])> {
    let n = c.moe.as_ref().map_or(1, |m| m.n_expert);
    let mut bases: Vec<(&str, usize)> = match mixer {
        Mixer::Attention(a) => match a.qkv {
            QkvWeights::Fused(_) => vec![("attn_qkv", 1), ("attn_output", 1)],
            QkvWeights::Separate { .. } => vec![
                ("attn_q", 1),
                ("attn_k", 1),
                ("attn_v", 1),
                ("attn_output", 1),
            ],
        },
        Mixer::DeltaNet(_) => ["attn_qkv", "attn_gate", "ssm_alpha", "ssm_beta", "ssm_out"]
            .map(|b| (b, 1))
            .to_vec(),
    };
    match ffn {
        FfnWeights::Dense { gate, .. } => {
            bases.extend(gate.map(|_| ("ffn_gate", 1)));
            bases.extend([("ffn_up", 1), ("ffn_down", 1)]);
        }
        FfnWeights::Experts(x) => bases.extend(expert_bases(x, n)),
        FfnWeights::Ungated { .. } => bases.extend([("ffn_up", 1), ("ffn_down", 1)]),
    }
    bases.extend(parallel_experts.map_or(Vec::new(), |x| expert_bases(x, n)));
    bases
        .into_iter()
        .filter_map(|(base, n)| {
            (f.get)(&f.name(&format!("{base}.input_scale"))).map(|id| (id, [n, 1, 1, 1]))
        })
        .collect()
}

/// The matrices of experts, each with its count (`n` experts, or one shared).
fn expert_bases(x: &ExpertWeights, n: usize) -> Vec<(&'static str, usize)> {
    let mut bases = Vec::new();
    bases.extend(x.gate.map(|_| ("ffn_gate_exps", n)));
    match x.fused_gate_up {
        true => bases.push(("ffn_gate_up_exps", n)),
        false => bases.push(("ffn_up_exps", n)),
    }
    bases.push(("ffn_down_exps", n));
    if x.shared.is_some() {
        bases.extend([
            ("ffn_gate_shexp", 1),
            ("ffn_up_shexp", 1),
            ("ffn_down_shexp", 1),
        ]);
    }
    bases
}

/// The shapes block `il`'s weights must have, `(tensor, ne)`, and which of them must be f32
/// (norms, scales and the unread input scales).
pub(crate) fn layer_shapes(
    c: &ModelConfig,
    il: usize,
    l: &LayerWeights,
) -> Vec<(TensorId, [usize; 4], bool)> {
    let e = c.n_embd;
    let mut out = vec![
        (l.attn_norm, [e, 1, 1, 1], true),
        (l.ffn_norm, [e, 1, 1, 1], true),
    ];
    match &l.mixer {
        Mixer::Attention(a) => attention_shapes(c, il, a, &mut out),
        Mixer::DeltaNet(d) => delta_net_shapes(c, d, &mut out),
    }
    ffn_shapes(c, c.n_ff_at(il), &l.ffn, &mut out);
    if let Some(p) = &l.parallel_experts {
        experts_shapes(c, &p.experts, &mut out);
        let norms = [p.router_scale, p.pre_norm, p.dense_post_norm, p.post_norm];
        out.extend(norms.map(|t| (t, [e, 1, 1, 1], true)));
    }
    if let Some(p) = &l.per_layer_input {
        let pl = c.n_embd_per_layer;
        out.extend([
            (p.gate, [e, pl, 1, 1], false),
            (p.proj, [pl, e, 1, 1], false),
            (p.post_norm, [e, 1, 1, 1], true),
        ]);
    }
    let biases = l.norm_biases.into_iter().flatten().map(Some);
    let norms = [
        (l.attn_post_norm, e),
        (l.ffn_post_norm, e),
        (l.out_scale, 1),
    ]
    .into_iter()
    .chain(biases.map(|b| (b, e)));
    out.extend(
        norms
            .into_iter()
            .filter_map(|(t, n)| t.map(|t| (t, [n, 1, 1, 1], true))),
    );
    out.extend(l.unread.iter().map(|&(t, ne)| (t, ne, true)));
    out
}

fn attention_shapes(
    c: &ModelConfig,
    il: usize,
    a: &AttentionWeights,
    out: &mut Vec<(TensorId, [usize; 4], bool)>,
) {
    let h = c.heads(il);
    let (e, q, kv, hd) = (c.n_embd, h.n_embd_q(), h.n_embd_kv(), h.head_dim);
    // A gated query projection gives each head's query and its gate.
    let q_rows = if c.attn_output_gate { 2 * q } else { q };
    match &a.qkv {
        QkvWeights::Separate {
            q: wq,
            k: wk,
            v: wv,
        } => {
            matrix_shapes(out, wq, [e, q_rows, 1, 1]);
            for m in [wk, wv].into_iter().flatten() {
                matrix_shapes(out, m, [e, kv, 1, 1]);
            }
        }
        QkvWeights::Fused(m) => matrix_shapes(out, m, [e, q_rows + 2 * kv, 1, 1]),
    }
    matrix_shapes(out, &a.wo, [q, e, 1, 1]);
    let norms = [(a.q_norm, hd), (a.k_norm, hd), (a.sinks, h.n_head)];
    out.extend(
        norms
            .into_iter()
            .filter_map(|(t, n)| t.map(|t| (t, [n, 1, 1, 1], true))),
    );
}

/// A delta-net layer's shapes; the convolution kernel, the decay's bias and `A` are f32, as
/// llama.cpp's CPU kernels read them.
fn delta_net_shapes(
    c: &ModelConfig,
    d: &DeltaNetWeights,
    out: &mut Vec<(TensorId, [usize; 4], bool)>,
) {
    let Some(r) = &c.recurrent else {
        return;
    };
    let (e, heads) = (c.n_embd, r.n_v_heads);
    matrix_shapes(out, &d.qkv, [e, r.conv_channels(), 1, 1]);
    matrix_shapes(out, &d.gate, [e, r.value_dim(), 1, 1]);
    matrix_shapes(out, &d.beta, [e, heads, 1, 1]);
    matrix_shapes(out, &d.alpha, [e, heads, 1, 1]);
    matrix_shapes(out, &d.out, [r.value_dim(), e, 1, 1]);
    out.extend([
        (d.conv, [r.d_conv, r.conv_channels(), 1, 1], true),
        (d.dt_bias, [heads, 1, 1, 1], true),
        (d.a, [heads, 1, 1, 1], true),
        (d.norm, [r.head_dim, 1, 1, 1], true),
    ]);
}

/// A matrix of shape `ne` (`[n_in, n_out, n_expert]`), its bias `[n_out, n_expert]` and its
/// scale (`[n_expert]`).
fn matrix_shapes(out: &mut Vec<(TensorId, [usize; 4], bool)>, m: &Matrix, ne: [usize; 4]) {
    out.push((m.w, ne, false));
    out.extend(m.bias.map(|b| (b, [ne[1], ne[2], 1, 1], false)));
    out.extend(m.scale.map(|s| (s, [ne[2], 1, 1, 1], true)));
}

/// A dense FFN `ff` wide, or the experts.
fn ffn_shapes(
    c: &ModelConfig,
    ff: usize,
    ffn: &FfnWeights,
    out: &mut Vec<(TensorId, [usize; 4], bool)>,
) {
    let e = c.n_embd;
    match ffn {
        FfnWeights::Dense { gate, up, down } => {
            let up_rows = if gate.is_some() { ff } else { 2 * ff };
            matrix_shapes(out, up, [e, up_rows, 1, 1]);
            matrix_shapes(out, down, [ff, e, 1, 1]);
            if let Some(g) = gate {
                matrix_shapes(out, g, [e, ff, 1, 1]);
            }
        }
        FfnWeights::Experts(x) => experts_shapes(c, x, out),
        FfnWeights::Ungated { up, down } => {
            matrix_shapes(out, up, [e, ff, 1, 1]);
            matrix_shapes(out, down, [ff, e, 1, 1]);
        }
    }
}

fn experts_shapes(c: &ModelConfig, x: &ExpertWeights, out: &mut Vec<(TensorId, [usize; 4], bool)>) {
    let e = c.n_embd;
    let (n, ff) = c.moe.as_ref().map_or((0, 0), |m| (m.n_expert, m.n_ff_exp));
    let up_rows = if x.fused_gate_up { 2 * ff } else { ff };
    matrix_shapes(out, &x.gate_inp, [e, n, 1, 1]);
    matrix_shapes(out, &x.up, [e, up_rows, n, 1]);
    matrix_shapes(out, &x.down, [ff, e, n, 1]);
    if let Some(g) = &x.gate {
        matrix_shapes(out, g, [e, ff, n, 1]);
    }
    if let Some(s) = &x.shared {
        let ff_shexp = c.moe.as_ref().map_or(0, |m| m.n_ff_shexp);
        matrix_shapes(out, &s.gate, [e, ff_shexp, 1, 1]);
        matrix_shapes(out, &s.up, [e, ff_shexp, 1, 1]);
        matrix_shapes(out, &s.down, [ff_shexp, e, 1, 1]);
        out.push((s.gate_inp, [e, 1, 1, 1], false));
    }
}
