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
    /// RMS norm before attention.
    pub attn_norm: TensorId,
    /// The Q, K and V projections, separate or fused.
    pub qkv: QkvWeights,
    /// Attention output projection `[n_embd_q, n_embd]` (a bias: LLaMA).
    pub wo: Matrix,
    /// RMS norm of each query head `[head_dim]` (QK-norm: Qwen3, Gemma 3).
    pub attn_q_norm: Option<TensorId>,
    /// RMS norm of each key head `[head_dim]`.
    pub attn_k_norm: Option<TensorId>,
    /// RMS norm of the attention output, before the residual (Gemma 3).
    pub attn_post_norm: Option<TensorId>,
    /// Per-head attention sinks `[n_head]` (gpt-oss): one more score in each softmax.
    pub attn_sinks: Option<TensorId>,
    /// RMS norm before the feed-forward block (gpt-oss's `post_attention_norm`).
    pub ffn_norm: TensorId,
    /// The feed-forward block's projections.
    pub ffn: FfnWeights,
    /// RMS norm of the FFN output, before the residual (Gemma 3).
    pub ffn_post_norm: Option<TensorId>,
    /// Tensors accepted and never read (`.input_scale`), with their shapes.
    pub unread: Vec<(TensorId, [usize; 4])>,
}

/// The attention's input projections.
#[derive(Clone, Debug)]
pub enum QkvWeights {
    /// Query `[n_embd, n_embd_q]`, key and value `[n_embd, n_embd_kv]`.
    Separate {
        /// Query projection.
        q: Matrix,
        /// Key projection.
        k: Matrix,
        /// Value projection.
        v: Matrix,
    },
    /// One `[n_embd, n_embd_q + 2 * n_embd_kv]` projection: Q's rows, then K's, then V's.
    Fused(Matrix),
}

/// A feed-forward block's projections: one gated FFN, or a mixture of experts.
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
}

/// The weights of a mixture-of-experts FFN (`ffn_*_exps`); their scales are per expert.
#[derive(Clone, Debug)]
pub struct ExpertWeights {
    /// The router `[n_embd, n_expert]`, with its bias `[n_expert]` (gpt-oss).
    pub gate_inp: Matrix,
    /// Gate projections `[n_embd, n_ff_exp, n_expert]`; `None`: the experts are not gated
    /// (SiLU of the up projection).
    pub gate: Option<Matrix>,
    /// Up projections `[n_embd, n_ff_exp, n_expert]`.
    pub up: Matrix,
    /// Down projections `[n_ff_exp, n_embd, n_expert]`.
    pub down: Matrix,
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
    let qkv = qkv_weights(&f)?;
    let mut ffn = ffn_weights(c, parts, &f)?;
    let mut unread = unread_scales(c, &f, &qkv, &ffn);
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
        };
        unread.extend(
            matrices
                .into_iter()
                .filter_map(|m| m.scale.take().map(|s| (s, [n, 1, 1, 1]))),
        );
    }
    // gpt-oss's pre-FFN norm has the post-attention norm's name.
    let attn_post_norm = match parts.ffn_norm {
        POST_ATTENTION_NORM => None,
        _ => f.part(parts.post_norms, &format!("{POST_ATTENTION_NORM}.weight"))?,
    };
    Ok(LayerWeights {
        attn_norm: f.required("attn_norm.weight")?,
        qkv,
        wo: f.matrix("attn_output", parts.out_biases)?,
        attn_q_norm: f.part(parts.qk_norm, "attn_q_norm.weight")?,
        attn_k_norm: f.part(parts.qk_norm, "attn_k_norm.weight")?,
        attn_post_norm,
        attn_sinks: f.part(parts.sinks, "attn_sinks.weight")?,
        ffn_norm: f.required(&format!("{}.weight", parts.ffn_norm))?,
        ffn,
        ffn_post_norm: f.part(parts.post_norms, "post_ffw_norm.weight")?,
        unread,
    })
}

/// Q/K/V as llama.cpp's `create_tensor_qkv` finds them: `attn_qkv` (with its bias) if the
/// file has it, else the separate projections with their biases.
fn qkv_weights(f: &Finder<'_>) -> Result<QkvWeights> {
    match f.optional_matrix("attn_qkv", Need::Optional)? {
        Some(fused) => {
            for separate in ["attn_q", "attn_k", "attn_v"] {
                f.part(Need::No, &format!("{separate}.weight"))?;
                f.part(Need::No, &format!("{separate}.bias"))?;
            }
            Ok(QkvWeights::Fused(fused))
        }
        None => Ok(QkvWeights::Separate {
            q: f.matrix("attn_q", Need::Optional)?,
            k: f.matrix("attn_k", Need::Optional)?,
            v: f.matrix("attn_v", Need::Optional)?,
        }),
    }
}

fn ffn_weights(c: &ModelConfig, parts: &LayerParts, f: &Finder<'_>) -> Result<FfnWeights> {
    if c.moe.is_some() {
        let biases = parts.expert_biases;
        // llama.cpp's router takes no scale.
        f.part(Need::No, "ffn_gate_inp.scale")?;
        return Ok(FfnWeights::Experts(ExpertWeights {
            gate_inp: f.matrix("ffn_gate_inp", biases)?,
            gate: f.optional_matrix("ffn_gate_exps", biases)?,
            up: f.matrix("ffn_up_exps", biases)?,
            down: f.matrix("ffn_down_exps", biases)?,
        }));
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

/// The `.input_scale` of each matrix the block has, where the file has one: `[1]`, or
/// `[n_expert]` for experts.
fn unread_scales(
    c: &ModelConfig,
    f: &Finder<'_>,
    qkv: &QkvWeights,
    ffn: &FfnWeights,
) -> Vec<(TensorId, [usize; 4])> {
    let mut bases: Vec<(&str, usize)> = match qkv {
        QkvWeights::Fused(_) => vec![("attn_qkv", 1)],
        QkvWeights::Separate { .. } => vec![("attn_q", 1), ("attn_k", 1), ("attn_v", 1)],
    };
    bases.push(("attn_output", 1));
    match ffn {
        FfnWeights::Dense { gate, .. } => {
            bases.extend(gate.map(|_| ("ffn_gate", 1)));
            bases.extend([("ffn_up", 1), ("ffn_down", 1)]);
        }
        FfnWeights::Experts(x) => {
            let n = c.moe.as_ref().map_or(1, |m| m.n_expert);
            bases.extend(x.gate.map(|_| ("ffn_gate_exps", n)));
            bases.extend([("ffn_up_exps", n), ("ffn_down_exps", n)]);
        }
    }
    bases
        .into_iter()
        .filter_map(|(base, n)| {
            (f.get)(&f.name(&format!("{base}.input_scale"))).map(|id| (id, [n, 1, 1, 1]))
        })
        .collect()
}

/// The shapes block weights must have, `(tensor, ne)`, and which of them must be f32 (norms,
/// scales and the unread input scales).
pub(crate) fn layer_shapes(c: &ModelConfig, l: &LayerWeights) -> Vec<(TensorId, [usize; 4], bool)> {
    let (e, q, kv, hd) = (c.n_embd, c.n_embd_q(), c.n_embd_kv(), c.head_dim);
    let mut out = vec![
        (l.attn_norm, [e, 1, 1, 1], true),
        (l.ffn_norm, [e, 1, 1, 1], true),
    ];
    match &l.qkv {
        QkvWeights::Separate {
            q: wq,
            k: wk,
            v: wv,
        } => {
            matrix_shapes(&mut out, wq, [e, q, 1, 1]);
            matrix_shapes(&mut out, wk, [e, kv, 1, 1]);
            matrix_shapes(&mut out, wv, [e, kv, 1, 1]);
        }
        QkvWeights::Fused(m) => matrix_shapes(&mut out, m, [e, q + 2 * kv, 1, 1]),
    }
    matrix_shapes(&mut out, &l.wo, [q, e, 1, 1]);
    ffn_shapes(c, &l.ffn, &mut out);
    let norms = [
        (l.attn_q_norm, hd),
        (l.attn_k_norm, hd),
        (l.attn_post_norm, e),
        (l.ffn_post_norm, e),
        (l.attn_sinks, c.n_head),
    ];
    out.extend(
        norms
            .into_iter()
            .filter_map(|(t, n)| t.map(|t| (t, [n, 1, 1, 1], true))),
    );
    out.extend(l.unread.iter().map(|&(t, ne)| (t, ne, true)));
    out
}

/// A matrix of shape `ne` (`[n_in, n_out, n_expert]`), its bias `[n_out, n_expert]` and its
/// scale (`[n_expert]`).
fn matrix_shapes(out: &mut Vec<(TensorId, [usize; 4], bool)>, m: &Matrix, ne: [usize; 4]) {
    out.push((m.w, ne, false));
    out.extend(m.bias.map(|b| (b, [ne[1], ne[2], 1, 1], false)));
    out.extend(m.scale.map(|s| (s, [ne[2], 1, 1, 1], true)));
}

fn ffn_shapes(c: &ModelConfig, ffn: &FfnWeights, out: &mut Vec<(TensorId, [usize; 4], bool)>) {
    let e = c.n_embd;
    match ffn {
        FfnWeights::Dense { gate, up, down } => {
            let ff = c.n_ff;
            let up_rows = if gate.is_some() { ff } else { 2 * ff };
            matrix_shapes(out, up, [e, up_rows, 1, 1]);
            matrix_shapes(out, down, [ff, e, 1, 1]);
            if let Some(g) = gate {
                matrix_shapes(out, g, [e, ff, 1, 1]);
            }
        }
        FfnWeights::Experts(x) => {
            let (n, ff) = c.moe.as_ref().map_or((0, 0), |m| (m.n_expert, m.n_ff_exp));
            matrix_shapes(out, &x.gate_inp, [e, n, 1, 1]);
            matrix_shapes(out, &x.up, [e, ff, n, 1]);
            matrix_shapes(out, &x.down, [ff, e, n, 1]);
            if let Some(g) = &x.gate {
                matrix_shapes(out, g, [e, ff, n, 1]);
            }
        }
    }
}
