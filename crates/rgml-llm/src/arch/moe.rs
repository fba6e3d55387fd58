//! Mixture-of-experts FFNs, as llama.cpp's `build_moe_ffn` builds them (Mixtral's `llama`,
//! `qwen3moe`, `gpt-oss`): the expert hyper-parameters, and the routed FFN's graph.
//!
//! Per token: the router's logits (plus its bias), their softmax (or, gpt-oss, the logits
//! themselves), the `n_expert_used` best experts (ARGSORT, ggml's order of ties), their
//! probabilities (GET_ROWS; gpt-oss: the softmax of the chosen logits), renormalised over the
//! chosen ones where the family does, each chosen expert's gated FFN (MUL_MAT_ID, plus each
//! expert's biases with ADD_ID), and the experts' outputs weighted and added in slot order:
//! the same ops in the same order as llama.cpp, so the same roundings.

use super::blocks::Builder;
use super::keys::Keys;
use super::{ExpertWeights, Matrix, SharedExpert};
use crate::config::{ExpertGating, FfnActivation, ModelConfig, MoeConfig};
use crate::error::{LlmError, Result};
use rgml::TensorId;
use rgml_gguf::Value;

/// llama.cpp's `LLAMA_MAX_EXPERTS`.
const MAX_EXPERTS: usize = 1024;

/// gpt-oss's SwiGLU constants (llama.cpp's `LLM_FFN_SWIGLU_OAI_MOE`).
const SWIGLU_OAI_ALPHA: f32 = 1.702;
const SWIGLU_OAI_LIMIT: f32 = 7.0;

/// The smallest normal f16, 2⁻¹⁴ (llama.cpp writes 6.103515625e-5): the floor of the chosen
/// probabilities' sum before it divides them (llama.cpp's guard against a zero sum).
const MIN_WEIGHT_SUM: f32 = 1.0 / 16384.0;

/// How a family sizes its experts.
pub(super) enum ExpertWidth {
    /// As wide as the dense FFN (`feed_forward_length`: Mixtral).
    FeedForward,
    /// `expert_feed_forward_length`, else `feed_forward_length / expert_used_count`
    /// (`qwen3moe`).
    ExpertKey,
    /// `expert_feed_forward_length`, which the file must have (gpt-oss).
    ExpertKeyRequired,
}

/// A family's experts: how wide, whether every file has them, and how they are weighted.
pub(super) struct ExpertRules {
    pub(super) width: ExpertWidth,
    pub(super) required: bool,
    pub(super) norm_weights: bool,
    pub(super) gating: ExpertGating,
}

/// Mixtral's and Qwen3 MoE's: softmax gating, the chosen probabilities renormalised.
pub(super) const SOFTMAX_NORMED: ExpertRules = ExpertRules {
    width: ExpertWidth::FeedForward,
    required: false,
    norm_weights: true,
    gating: ExpertGating::Softmax,
};

/// Read the expert keys into `c.moe` (left `None` where `expert_count` is 0 or absent and
/// experts are optional).
pub(super) fn hparams(keys: &Keys<'_>, c: &mut ModelConfig, rules: ExpertRules) -> Result<()> {
    let n_expert = keys.usize_or("expert_count", 0)?;
    if n_expert == 0 {
        return match rules.required {
            true => Err(LlmError::BadConfig(format!(
                "{} must be positive for {}",
                keys.name("expert_count"),
                c.arch
            ))),
            false => Ok(()),
        };
    }
    let n_expert_used = used_count(keys, c.n_layer)?;
    if n_expert > MAX_EXPERTS || n_expert_used == 0 || n_expert_used > n_expert {
        return Err(LlmError::BadConfig(format!(
            "{n_expert_used} of {n_expert} experts per token (at most {MAX_EXPERTS} experts, \
             at least one used)"
        )));
    }
    let n_ff_exp = match rules.width {
        ExpertWidth::FeedForward => c.n_ff,
        ExpertWidth::ExpertKey => match keys.usize_or("expert_feed_forward_length", 0)? {
            0 => c.n_ff / n_expert_used,
            n => n,
        },
        ExpertWidth::ExpertKeyRequired => keys.usize("expert_feed_forward_length")?,
    };
    c.moe = Some(MoeConfig {
        n_expert,
        n_expert_used,
        n_ff_exp,
        norm_weights: rules.norm_weights,
        gating: rules.gating,
        n_ff_shexp: match keys.usize_or("expert_shared_feed_forward_length", 0)? {
            0 => c.n_ff,
            n => n,
        },
    });
    Ok(())
}

/// `expert_used_count`: one number, or one per layer (llama.cpp reads either); per-layer
/// counts that differ are refused by name.
fn used_count(keys: &Keys<'_>, n_layer: usize) -> Result<usize> {
    let key = "expert_used_count";
    let Some(Value::Array(items)) = keys.value(key) else {
        return keys.usize_or(key, 0);
    };
    let counts: Option<Vec<u64>> = items.iter().map(Value::as_u64).collect();
    let bad = |what: String| LlmError::BadConfig(format!("{}: {what}", keys.name(key)));
    let counts = counts.ok_or_else(|| bad("not an array of integers".into()))?;
    if counts.len() < n_layer {
        return Err(bad(format!(
            "{} entries for {n_layer} layers",
            counts.len()
        )));
    }
    match counts[..n_layer].iter().all(|&n| n == counts[0]) {
        true => usize::try_from(counts[0]).map_err(|_| bad(format!("{} too large", counts[0]))),
        false => Err(LlmError::UnsupportedModel(format!(
            "{} differs between layers",
            keys.name(key)
        ))),
    }
}

/// The routed FFN of block `il` on the normed rows `x` `[n_embd, n]`: `[n_embd, n]`.
/// `alone`: every expert product takes the arithmetic of a lone row (a run of one-token
/// sequences); `name`: keep llama.cpp's node names.
pub(super) fn ffn(
    b: &mut Builder<'_>,
    il: usize,
    w: &ExpertWeights,
    x: TensorId,
    alone: bool,
    name: bool,
) -> Result<TensorId> {
    let logits = router_logits(b, il, w.gate_inp.w, x, alone, name)?;
    routed(b, il, w, x, logits, alone, name)
}

/// The router `gate_inp`'s logits `[n_expert, n]` of the rows `input`.
pub(super) fn router_logits(
    b: &mut Builder<'_>,
    il: usize,
    gate_inp: TensorId,
    input: TensorId,
    alone: bool,
    name: bool,
) -> Result<TensorId> {
    let logits = match alone {
        true => b.ctx().mul_mat_rows_alone(gate_inp, input)?,
        false => b.ctx().mul_mat(gate_inp, input)?,
    };
    match name {
        true => b.keep(logits, format!("ffn_moe_logits-{il}")),
        false => Ok(logits),
    }
}

/// The routed FFN of block `il` on the rows `x` `[n_embd, n]` given the router's `logits`
/// `[n_expert, n]` (before its bias): `[n_embd, n]`.
pub(super) fn routed(
    b: &mut Builder<'_>,
    il: usize,
    w: &ExpertWeights,
    x: TensorId,
    mut logits: TensorId,
    alone: bool,
    name: bool,
) -> Result<TensorId> {
    let c: &ModelConfig = b.config();
    let moe = c
        .moe
        .as_ref()
        .ok_or_else(|| LlmError::BadConfig("expert weights without expert counts".into()))?;
    let (n_embd, n, k) = (c.n_embd, b.ctx()[x].ne[1], moe.n_expert_used);
    let keep = |b: &mut Builder<'_>, t: TensorId, what: &str| match name {
        true => b.keep(t, format!("{what}-{il}")),
        false => Ok(t),
    };
    if let Some(bias) = w.gate_inp.bias {
        logits = b.ctx().add(logits, bias)?;
        logits = keep(b, logits, "ffn_moe_logits_biased")?;
    }
    let probs = match moe.gating {
        ExpertGating::Softmax => b.ctx().soft_max(logits)?, // [n_expert, n]
        ExpertGating::SoftmaxWeight => logits,
    };
    let probs = keep(b, probs, "ffn_moe_probs")?;
    let selected = b.ctx().argsort_top_k(probs, k)?; // [k, n]
    let selected = keep(b, selected, "ffn_moe_topk")?;
    let probs = b.ctx().reshape(probs, &[1, moe.n_expert, n])?;
    let mut weights = b.ctx().get_rows(probs, selected)?; // [1, k, n]
    weights = keep(b, weights, "ffn_moe_weights")?;
    if moe.gating == ExpertGating::SoftmaxWeight {
        let flat = b.ctx().reshape(weights, &[k, n])?;
        let soft = b.ctx().soft_max(flat)?;
        let soft = keep(b, soft, "ffn_moe_weights_softmax")?;
        weights = b.ctx().reshape(soft, &[1, k, n])?;
    }
    if moe.norm_weights {
        let flat = b.ctx().reshape(weights, &[k, n])?;
        let sum = b.ctx().sum_rows(flat)?; // [1, n]
        let sum = b.ctx().clamp(sum, MIN_WEIGHT_SUM, f32::INFINITY)?;
        let normed = b.ctx().div(flat, sum)?;
        let normed = keep(b, normed, "ffn_moe_weights_norm")?;
        weights = b.ctx().reshape(normed, &[1, k, n])?;
    }
    // Expanded here, as llama.cpp does: the graph's order is its order.
    b.expand(weights)?;
    let rows = b.ctx().reshape(x, &[n_embd, 1, n])?;
    // Each chosen expert's product, times its scale, plus its bias.
    let experts = |b: &mut Builder<'_>, m: &Matrix, input: TensorId| -> Result<TensorId> {
        let mut y = match alone {
            true => b.ctx().mul_mat_id_rows_alone(m.w, input, selected)?,
            false => b.ctx().mul_mat_id(m.w, input, selected)?,
        };
        if let Some(scale) = m.scale {
            y = expert_scales(b, y, scale, selected)?;
        }
        if let Some(bias) = m.bias {
            y = b.ctx().add_id(y, bias, selected)?;
        }
        Ok(y)
    };
    let up = experts(b, &w.up, rows)?; // [n_ff_exp, k, n] (twice as wide fused)
    let (gate, up) = match (w.fused_gate_up, &w.gate) {
        (true, _) => {
            let both = keep(b, up, "ffn_moe_gate_up")?;
            let (gate, up) = split_gate_up(b, both)?;
            (Some(gate), up)
        }
        (false, Some(gate)) => {
            let up = keep(b, up, "ffn_moe_up")?;
            let gate = experts(b, gate, rows)?;
            (Some(keep(b, gate, "ffn_moe_gate")?), up)
        }
        (false, None) => (None, keep(b, up, "ffn_moe_up")?),
    };
    let act = match (gate, c.ffn_activation) {
        (Some(gate), FfnActivation::Silu) => {
            let act = b.ctx().swiglu(gate, up)?;
            keep(b, act, "ffn_moe_swiglu")?
        }
        (Some(gate), FfnActivation::Gelu) => {
            let act = b.ctx().geglu(gate, up)?;
            keep(b, act, "ffn_moe_geglu")?
        }
        (Some(gate), FfnActivation::SwigluOai) => {
            let act = b
                .ctx()
                .swiglu_oai(gate, up, SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT)?;
            keep(b, act, "ffn_moe_swiglu_oai")?
        }
        (None, FfnActivation::Silu) => {
            let act = b.ctx().silu(up)?;
            keep(b, act, "ffn_moe_silu")?
        }
        (None, FfnActivation::Gelu) => {
            let act = b.ctx().gelu(up)?;
            keep(b, act, "ffn_moe_gelu")?
        }
        (None, FfnActivation::SwigluOai) => {
            return Err(LlmError::BadConfig(
                "gpt-oss's SwiGLU needs the experts' gate projections".into(),
            ))
        }
    };
    let down = experts(b, &w.down, act)?; // [n_embd, k, n]
    let down = keep(b, down, "ffn_moe_down")?;
    let weighted = b.ctx().mul(down, weights)?;
    let weighted = keep(b, weighted, "ffn_moe_weighted")?;
    b.expand(weighted)?;
    sum_slots(b, weighted, k)
}

/// The gate's and the up projection's halves `[n_ff_exp, k, n]` of fused experts' rows
/// `[2 n_ff_exp, k, n]` (views, as llama.cpp's merged path).
fn split_gate_up(b: &mut Builder<'_>, both: TensorId) -> Result<(TensorId, TensorId)> {
    let (ne, nb) = (b.ctx()[both].ne, b.ctx()[both].nb);
    let ff = ne[0] / 2;
    let gate = b
        .ctx()
        .view(both, &[ff, ne[1], ne[2]], &[nb[1], nb[2]], 0)?;
    let up = b
        .ctx()
        .view(both, &[ff, ne[1], ne[2]], &[nb[1], nb[2]], ff * nb[0])?;
    Ok((gate, up))
}

/// The shared expert of block `il` added to the routed experts' output `routed`, as
/// llama.cpp's Qwen3.5 MoE adds it: its gated FFN on the normed `cur`, times the sigmoid of
/// its own one-logit gate, then added.
pub(super) fn add_shared_expert(
    b: &mut Builder<'_>,
    il: usize,
    shared: &SharedExpert,
    cur: TensorId,
    routed: TensorId,
) -> Result<TensorId> {
    let ffn = b.dense_ffn(il, Some(&shared.gate), &shared.up, &shared.down, cur)?;
    let ffn = b.keep(ffn, format!("ffn_shexp-{il}"))?;
    let gate = b.linear(
        &Matrix {
            w: shared.gate_inp,
            bias: None,
            scale: None,
        },
        cur,
    )?;
    let gate = b.ctx().sigmoid(gate)?;
    let gate = b.keep(gate, format!("shared_expert_gate_sigmoid-{il}"))?;
    let gated = b.ctx().mul(ffn, gate)?;
    let gated = b.keep(gated, format!("ffn_shexp_gated-{il}"))?;
    let out = b.ctx().add(routed, gated)?;
    b.keep(out, format!("ffn_out-{il}"))
}

/// `y` `[rows, k, n]` times each slot's expert's scale (`scales` `[n_expert]`), as llama.cpp's
/// `build_lora_mm_id` multiplies them: the scales picked by `selected` `[k, n]` into `[1, k,
/// n]`, then one MUL.
fn expert_scales(
    b: &mut Builder<'_>,
    y: TensorId,
    scales: TensorId,
    selected: TensorId,
) -> Result<TensorId> {
    let (k, n) = (b.ctx()[selected].ne[0], b.ctx()[selected].ne[1]);
    let n_expert = b.ctx()[scales].ne[0];
    let table = b.ctx().reshape(scales, &[1, n_expert])?;
    let ids = b.ctx().cont_shape(selected, &[k * n])?;
    let picked = b.ctx().get_rows(table, ids)?; // [1, k * n]
    let picked = b.ctx().reshape(picked, &[1, k, n])?;
    Ok(b.ctx().mul(y, picked)?)
}

/// The sum over the `k` slots of `experts` `[n_embd, k, n]`, added in slot order as llama.cpp
/// adds its views: `[n_embd, n]`, dense.
fn sum_slots(b: &mut Builder<'_>, experts: TensorId, k: usize) -> Result<TensorId> {
    let (ne, nb) = (b.ctx()[experts].ne, b.ctx()[experts].nb);
    let mut slots = Vec::with_capacity(k);
    for slot in 0..k {
        let view = b
            .ctx()
            .view(experts, &[ne[0], ne[2]], &[nb[2]], slot * nb[1])?;
        b.expand(view)?;
        slots.push(view);
    }
    let mut out = slots[0];
    for &slot in &slots[1..] {
        out = b.ctx().add(out, slot)?;
        b.expand(out)?;
    }
    if k == 1 {
        out = b.ctx().cont(out)?;
    }
    Ok(out)
}
