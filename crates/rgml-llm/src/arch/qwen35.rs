//! Qwen3.5 (`qwen35`) and Qwen3.5 MoE (`qwen35moe`), as llama.cpp's `src/models/qwen35*.cpp`
//! build them: a hybrid of gated delta-net layers (linear attention over a recurrent state
//! per sequence) and, every few layers, full attention with a gated query, QK-norm and
//! interleaved multi-section RoPE; each block's FFN (normed by `post_attention_norm`) is a
//! SwiGLU, or a mixture of experts with a sigmoid-gated shared expert. The last block runs
//! on every row: the output rows are picked after the final norm.
//!
//! This module owns the hyper-parameters and the delta-net layer's graph, op for op as
//! llama.cpp's CPU path computes it (the fused GATED_DELTA_NET for prompts and steps alike).

use super::blocks::Builder;
use super::keys::Keys;
use super::moe::{self, ExpertRules, ExpertWidth};
use super::{DeltaNetWeights, LayerParts, LayerWeights, Mixer, Need, POST_ATTENTION_NORM};
use crate::config::{Arch, ModelConfig, RecurrentConfig};
use crate::error::{LlmError, Result};
use rgml::{DType, RopeMode, TensorId};

/// Qwen3.5's parts: QK-norm on the attention layers, the FFN's norm under the
/// post-attention norm's name, a shared expert beside the routed ones (MoE).
pub(super) const PARTS: LayerParts = LayerParts {
    qk_norm: Need::Required,
    post_norms: Need::No,
    out_biases: Need::No,
    fused_gate_up: false,
    ffn_scales: true,
    sinks: Need::No,
    expert_biases: Need::No,
    ffn_norm: POST_ATTENTION_NORM,
    shared_expert: Need::Optional,
    value_from_key: false,
    parallel_experts: false,
    out_scale: Need::No,
};

/// llama.cpp's default when the file names no recurrent layers: every fourth layer attends.
const DEFAULT_FULL_ATTENTION_INTERVAL: usize = 4;

pub(super) fn hparams(keys: &Keys<'_>, c: &mut ModelConfig) -> Result<()> {
    let sections = keys
        .usize_array("rope.dimension_sections", 4)?
        .ok_or_else(|| {
            LlmError::BadConfig(format!(
                "{} must be an array of 4 section sizes",
                keys.name("rope.dimension_sections")
            ))
        })?;
    let mut pairs = [0u32; 4];
    for (p, s) in pairs.iter_mut().zip(sections) {
        *p = u32::try_from(s).map_err(|_| LlmError::BadConfig(format!("rope section {s}")))?;
    }
    c.rope_mode = RopeMode::Imrope { sections: pairs };
    // Files of current converters end with a multi-token prediction block, counted in
    // `block_count`; the main pass never runs it.
    let nextn = keys.usize_or("nextn_predict_layers", 0)?;
    if nextn >= c.n_layer {
        return Err(LlmError::BadConfig(format!(
            "{} = {nextn} of {} blocks",
            keys.name("nextn_predict_layers"),
            c.n_layer
        )));
    }
    c.n_layer -= nextn;
    c.n_layer_nextn = nextn;
    c.attn_output_gate = true;
    c.output_rows_after_norm = true;
    c.recurrent = Some(recurrent(keys, c.n_layer)?);
    if c.kind == Arch::Qwen35Moe {
        let rules = ExpertRules {
            width: ExpertWidth::ExpertKey,
            required: true,
            ..moe::SOFTMAX_NORMED
        };
        moe::hparams(keys, c, rules)?;
    }
    Ok(())
}

/// The delta-net layers and their sizes (llama.cpp's `ssm.*` keys), checked so that the
/// graph's views stay inside their tensors.
fn recurrent(keys: &Keys<'_>, n_layer: usize) -> Result<RecurrentConfig> {
    let layers = match keys.layer_flags("attention.recurrent_layers", n_layer)? {
        Some(flags) => flags,
        None => {
            let interval =
                keys.usize_or("full_attention_interval", DEFAULT_FULL_ATTENTION_INTERVAL)?;
            if interval == 0 {
                return Err(LlmError::BadConfig(format!(
                    "{} must be positive",
                    keys.name("full_attention_interval")
                )));
            }
            (0..n_layer).map(|il| (il + 1) % interval != 0).collect()
        }
    };
    let r = RecurrentConfig {
        layers,
        d_conv: keys.usize("ssm.conv_kernel")?,
        head_dim: keys.usize("ssm.state_size")?,
        n_k_heads: keys.usize("ssm.group_count")?,
        n_v_heads: keys.usize("ssm.time_step_rank")?,
    };
    let d_inner = keys.usize("ssm.inner_size")?;
    let fits = r.d_conv > 0
        && r.head_dim > 0
        && r.n_k_heads > 0
        && r.n_v_heads.is_multiple_of(r.n_k_heads)
        && r.n_v_heads > 0
        && r.head_dim.checked_mul(r.n_v_heads) == Some(d_inner);
    if !fits {
        return Err(LlmError::BadConfig(format!(
            "delta net: kernel {}, heads of {} values, {} key heads, {} value heads and inner \
             size {d_inner} (the value heads must be a multiple of the key heads, and fill \
             the inner size)",
            r.d_conv, r.head_dim, r.n_k_heads, r.n_v_heads
        )));
    }
    Ok(r)
}

/// Block `il`: the delta net or attention, then the FFN, each with its residual.
pub(super) fn layer(
    b: &mut Builder<'_>,
    il: usize,
    l: &LayerWeights,
    x: TensorId,
) -> Result<TensorId> {
    let attn = match &l.mixer {
        Mixer::DeltaNet(d) => {
            let cur = b.norm(x, l.attn_norm, il)?;
            let cur = b.keep(cur, format!("attn_norm-{il}"))?;
            (delta_net(b, il, d, cur)?, x)
        }
        Mixer::Attention(_) => b.self_attention(il, l, x)?,
    };
    super::residual_ffn(b, il, l, attn, ["attn_residual", "attn_post_norm"])
}

/// The gated delta net of block `il` on the normed rows `cur` `[n_embd, n]`: `[n_embd, n]`.
/// The projections are per token; each sequence's tokens then go through its own
/// convolution state and recurrent state, which the graph updates in place.
fn delta_net(
    b: &mut Builder<'_>,
    il: usize,
    d: &DeltaNetWeights,
    cur: TensorId,
) -> Result<TensorId> {
    let c = b.config();
    let r = c
        .recurrent
        .as_ref()
        .ok_or_else(|| LlmError::BadConfig("a delta-net layer without its sizes".into()))?;
    let n = b.ctx()[cur].ne[1];
    let qkv = b.linear(&d.qkv, cur)?; // [conv_channels, n]
    let qkv = b.keep(qkv, format!("linear_attn_qkv_mixed-{il}"))?;
    let z = b.linear(&d.gate, cur)?; // [value_dim, n]
    let z = b.keep(z, format!("z-{il}"))?;
    let beta = b.linear(&d.beta, cur)?;
    let beta = b.ctx().reshape(beta, &[1, r.n_v_heads, n])?;
    let beta = b.ctx().sigmoid(beta)?;
    let beta = b.keep(beta, format!("beta_sigmoid-{il}"))?;
    let alpha = b.linear(&d.alpha, cur)?; // [n_v_heads, n]
    let alpha = b.ctx().add(alpha, d.dt_bias)?;
    let alpha = b.ctx().softplus(alpha)?;
    let gate = b.ctx().mul(alpha, d.a)?; // -exp(A_log) * softplus
    let gate = b.keep(gate, format!("gate-{il}"))?;
    let gate = b.ctx().reshape(gate, &[1, r.n_v_heads, n])?;
    let (conv_all, ssm_all) = b.recurrent_state(il)?;
    let mut out: Option<TensorId> = None;
    for g in b.groups() {
        let rows = |b: &mut Builder<'_>, t: TensorId| -> Result<TensorId> {
            let ne = b.ctx()[t].ne;
            let nb = b.ctx()[t].nb;
            Ok(b.ctx()
                .view(t, &[ne[0], ne[1], g.n], &[nb[1], nb[2]], g.first * nb[2])?)
        };
        let qkv_g = match b.groups().len() {
            1 => qkv,
            _ => {
                let nb1 = b.ctx()[qkv].nb[1];
                let ne0 = b.ctx()[qkv].ne[0];
                b.ctx().view(qkv, &[ne0, g.n], &[nb1], g.first * nb1)?
            }
        };
        let (gate_g, beta_g) = (rows(b, gate)?, rows(b, beta)?);
        let state = States {
            conv: conv_all,
            ssm: ssm_all,
            stream: g.stream,
        };
        let o = sequence(b, d, r, qkv_g, gate_g, beta_g, state)?;
        out = Some(b.append_rows(out, o)?);
    }
    let out = out.ok_or_else(|| LlmError::BadInput("an empty batch".into()))?;
    let out = b.ctx().reshape(out, &[r.head_dim, r.n_v_heads, n])?;
    // The gated RMS norm: norm(out) * ssm_norm * silu(z).
    let normed = b.row_norm(out, d.norm)?;
    let z = b.ctx().reshape(z, &[r.head_dim, r.n_v_heads, n])?;
    let z = b.ctx().silu(z)?;
    let gated = b.ctx().mul(normed, z)?;
    let gated = b.ctx().reshape(gated, &[r.value_dim(), n])?;
    let gated = b.keep(gated, format!("final_output-{il}"))?;
    let y = b.linear(&d.out, gated)?;
    b.keep(y, format!("linear_attn_out-{il}"))
}

/// One sequence's recurrent states: row `stream` of a layer's convolution and delta-net
/// state tensors.
struct States {
    conv: TensorId,
    ssm: TensorId,
    stream: usize,
}

/// One sequence's tokens through the short convolution and the delta rule, reading and
/// updating its states: `qkv` `[conv_channels, n]`, `gate` and `beta` `[1, n_v_heads, n]`;
/// returns the delta net's output `[value_dim, n]`.
fn sequence(
    b: &mut Builder<'_>,
    d: &DeltaNetWeights,
    r: &RecurrentConfig,
    qkv: TensorId,
    gate: TensorId,
    beta: TensorId,
    s: States,
) -> Result<TensorId> {
    let (channels, n) = (r.conv_channels(), b.ctx()[qkv].ne[1]);
    let f32b = DType::F32.block_bytes();
    let taps = r.d_conv - 1;
    // The convolution's window: the state's last inputs, then this micro-batch's.
    let conv_row = r.conv_state_len() * f32b;
    let conv_state = b.ctx().view(
        s.conv,
        &[taps, channels, 1],
        &[taps * f32b, conv_row],
        s.stream * conv_row,
    )?;
    let qkv_t = b.ctx().transpose(qkv)?; // [n, channels]
    let window = b.ctx().concat(conv_state, qkv_t, 0)?; // [taps + n, channels, 1]
                                                        // The window's last `taps` inputs are the next state.
    let (wne, wnb) = (b.ctx()[window].ne, b.ctx()[window].nb);
    let last = b
        .ctx()
        .view(window, &[taps, channels, 1], &[wnb[1], wnb[2]], n * f32b)?;
    let store = b.ctx().cpy(last, conv_state)?;
    b.expand(store)?;
    debug_assert_eq!(wne[0], taps + n);
    let conv = b.ctx().ssm_conv(window, d.conv)?; // [channels, n, 1]
    let conv = b.ctx().silu(conv)?;
    let hd = r.head_dim;
    let row = channels * f32b;
    let view = |b: &mut Builder<'_>, heads: usize, at: usize| -> Result<TensorId> {
        Ok(b.ctx()
            .view(conv, &[hd, heads, n, 1], &[hd * f32b, row, row * n], at)?)
    };
    let q = view(b, r.n_k_heads, 0)?;
    let k = view(b, r.n_k_heads, r.key_dim() * f32b)?;
    let v = view(b, r.n_v_heads, 2 * r.key_dim() * f32b)?;
    let eps = b.config().rms_eps;
    let q = l2_norm(b, q, eps)?;
    let k = l2_norm(b, k, eps)?;
    let ssm_row = r.ssm_state_len() * f32b;
    let state = b.ctx().view(
        s.ssm,
        &[hd, hd, r.n_v_heads, 1],
        &[hd * f32b, hd * hd * f32b, ssm_row],
        s.stream * ssm_row,
    )?;
    let gate = b.ctx().reshape(gate, &[1, r.n_v_heads, n, 1])?;
    let beta = b.ctx().reshape(beta, &[1, r.n_v_heads, n, 1])?;
    let result = b.ctx().gated_delta_net(q, k, v, gate, beta, state, 1)?;
    let out_len = r.value_dim() * n;
    let output = b
        .ctx()
        .view(result, &[r.value_dim(), n], &[r.value_dim() * f32b], 0)?;
    let new_state = b
        .ctx()
        .view(result, &[r.ssm_state_len()], &[], out_len * f32b)?;
    let state_row = b
        .ctx()
        .view(s.ssm, &[r.ssm_state_len()], &[], s.stream * ssm_row)?;
    let store = b.ctx().cpy(new_state, state_row)?;
    b.expand(store)?;
    Ok(output)
}

/// llama.cpp's `build_gdn_l2_norm`: each row divided by its L2 norm, as an RMS norm with
/// `eps / n` scaled by `1 / √n` (two roundings, as there).
fn l2_norm(b: &mut Builder<'_>, x: TensorId, eps: f32) -> Result<TensorId> {
    let n = b.ctx()[x].ne[0] as f32;
    let normed = b.ctx().rms_norm(x, eps / n)?;
    Ok(b.ctx().scale(normed, 1.0 / n.sqrt())?)
}
