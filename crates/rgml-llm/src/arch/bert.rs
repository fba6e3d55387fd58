//! BERT (`bert`, llama.cpp's `llama_model_bert`): an encoder for embeddings (bge, MiniLM). The
//! input is the token embeddings plus the first token-type row plus learned absolute position
//! embeddings, layer-normed; each block is bidirectional attention (no RoPE; Q/K/V and output
//! biases), its residual, a layer norm, then an ungated GELU FFN with biases, its residual and
//! a layer norm (post-norm). There is no output head: the last block's rows are the
//! embeddings, pooled by the session.
//!
//! The attention reads the session's KV cache like a decoder's, with a mask that lets every
//! token of a sequence see every other (see [`crate::ModelConfig::causal`]); the session sizes
//! the attended cells and their type as llama.cpp's cache-less attention has them.

use super::blocks::{attention_weights, Builder};
use super::keys::Keys;
use super::{FfnWeights, LayerWeights, Matrix, QkvWeights};
use crate::config::{FfnActivation, ModelConfig};
use crate::error::{LlmError, Result};
use rgml::TensorId;

/// The input's extra embeddings and norm (llama.cpp's names in parentheses).
#[derive(Clone, Copy, Debug)]
pub struct EncoderInput {
    /// The token-type rows `[n_embd, n_token_types]` (`token_types`), of which the first is
    /// added to every token (llama.cpp gives every token type 0); absent in some files.
    pub type_embd: Option<TensorId>,
    /// The position embeddings `[n_embd, n_ctx_train]` (`position_embd`).
    pub pos_embd: TensorId,
    /// The layer norm of the summed embeddings, weight and bias `[n_embd]`
    /// (`token_embd_norm`).
    pub norm: [TensorId; 2],
}

/// BERT's hyper-parameters: layer norms (`attention.layer_norm_epsilon`, read by the common
/// ones), GELU, and the token-type count llama.cpp requires.
pub(super) fn hparams(keys: &Keys<'_>, c: &mut ModelConfig) -> Result<()> {
    c.ffn_activation = FfnActivation::Gelu;
    let key = "tokenizer.ggml.token_type_count";
    c.n_token_types = keys
        .gguf
        .get(key)
        .and_then(|v| v.as_u64())
        .and_then(|n| usize::try_from(n).ok())
        .unwrap_or(0);
    if c.n_token_types == 0 {
        return Err(LlmError::BadConfig(format!(
            "a bert model needs its token-type count ({key})"
        )));
    }
    Ok(())
}

/// The embeddings of the batch's tokens at their positions, layer-normed (`inp_norm`).
pub(super) fn embeddings(
    b: &mut Builder<'_>,
    input: &EncoderInput,
    embd: TensorId,
    positions: TensorId,
) -> Result<TensorId> {
    let mut x = embd;
    if let Some(types) = input.type_embd {
        let width = b.ctx()[types].ne[0];
        let row0 = b.ctx().view(types, &[width], &[], 0)?;
        x = b.ctx().add(x, row0)?;
    }
    let pos = b.ctx().get_rows(input.pos_embd, positions)?;
    x = b.ctx().add(pos, x)?;
    let x = b.keep(x, "inp_embd".into())?;
    let x = layer_norm(b, x, input.norm)?;
    b.keep(x, "inp_norm".into())
}

/// Block `il` on the hidden state `x`.
pub(super) fn layer(
    b: &mut Builder<'_>,
    il: usize,
    l: &LayerWeights,
    x: TensorId,
) -> Result<TensorId> {
    let a = attention_weights(l)?;
    let (q, k, v) = qkv(b, il, &a.qkv, x)?;
    b.store_kv(il, k, v)?;
    let attn = b.attention(il, a, q, None)?;
    let (attn, x) = b.cut_to_output(il, attn, x)?;
    let [attn_bias, out_bias] = l.norm_biases.ok_or_else(|| {
        LlmError::BadConfig(format!("bert block {il} without its layer-norm biases"))
    })?;
    let cur = b.ctx().add(attn, x)?;
    let cur = layer_norm(b, cur, [l.attn_norm, attn_bias])?;
    let ffn_inp = b.keep(cur, format!("ffn_inp-{il}"))?;
    let FfnWeights::Ungated { up, down } = &l.ffn else {
        return Err(LlmError::BadConfig(format!(
            "bert block {il} without its ungated FFN"
        )));
    };
    let ffn = gelu_ffn(b, il, up, down, ffn_inp)?;
    let cur = b.ctx().add(ffn, ffn_inp)?;
    let cur = layer_norm(b, cur, [l.ffn_norm, out_bias])?;
    b.keep(cur, format!("l_out-{il}"))
}

/// Q and K `[hd, heads, n]` and V `[n_embd_kv, n]` with their biases, no RoPE (llama.cpp's
/// `build_qkv`).
fn qkv(
    b: &mut Builder<'_>,
    il: usize,
    w: &QkvWeights,
    cur: TensorId,
) -> Result<(TensorId, TensorId, TensorId)> {
    let (h, n) = (b.config().heads(il), b.ctx()[cur].ne[1]);
    let (q, k, v) = match w {
        QkvWeights::Fused(wqkv) => {
            let (q, k, v) = b.fused_qkv(il, wqkv, cur)?;
            let (row, f32b) = (b.ctx()[q].nb[1], rgml::DType::F32.block_bytes());
            let q = b
                .ctx()
                .view(q, &[h.head_dim, h.n_head, n], &[h.head_dim * f32b, row], 0)?;
            (q, k, v)
        }
        QkvWeights::Separate {
            q,
            k: Some(k),
            v: Some(v),
        } => {
            let q = b.linear(q, cur)?;
            let k = b.linear(k, cur)?;
            let v = b.linear(v, cur)?;
            let q = b.ctx().reshape(q, &[h.head_dim, h.n_head, n])?;
            let k = b.ctx().reshape(k, &[h.head_dim, h.n_head_kv, n])?;
            (q, k, v)
        }
        QkvWeights::Separate { .. } => {
            return Err(LlmError::MissingTensor(format!("blk.{il}.attn_k.weight")))
        }
    };
    let q = b.keep(q, format!("Qcur-{il}"))?;
    let k = b.keep(k, format!("Kcur-{il}"))?;
    let v = b.keep(v, format!("Vcur-{il}"))?;
    Ok((q, k, v))
}

/// `down(gelu(up(cur)))` with their biases (llama.cpp's `build_ffn`, `LLM_FFN_GELU` in
/// sequence).
fn gelu_ffn(
    b: &mut Builder<'_>,
    il: usize,
    up: &Matrix,
    down: &Matrix,
    cur: TensorId,
) -> Result<TensorId> {
    let up = b.linear_ffn(up, cur)?;
    let up = b.keep(up, format!("ffn_up-{il}"))?;
    let act = b.ctx().gelu(up)?;
    let act = b.keep(act, format!("ffn_gelu-{il}"))?;
    let down = b.linear_ffn(down, act)?;
    b.keep(down, format!("ffn_out-{il}"))
}

/// Layer norm of `x`'s rows times the weight plus the bias (llama.cpp's `build_norm` with
/// `LLM_NORM`).
fn layer_norm(b: &mut Builder<'_>, x: TensorId, [w, bias]: [TensorId; 2]) -> Result<TensorId> {
    let eps = b.config().rms_eps;
    let cur = b.ctx().norm(x, eps)?;
    let cur = b.ctx().mul(cur, w)?;
    Ok(b.ctx().add(cur, bias)?)
}
