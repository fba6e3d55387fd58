//! The tensors of a random BERT encoder (llama.cpp's `bert` loader and names): token,
//! token-type and position embeddings with their layer norm, then per block Q/K/V and the
//! attention output with biases, the attention-output layer norm, an ungated FFN with biases
//! and the block-output layer norm. No output norm or head: the last block's rows are the
//! embeddings.

use crate::arch::Spec;
use crate::planned::{Fill, Planned, EMBEDDING, MATRIX, QUERY_KEY};

/// Biases, as the decoder blocks' (`tensors`).
const BIAS: f32 = 0.1;

/// Every tensor of `spec`'s encoder with `n_vocab` tokens and `n_token_types` token types,
/// in llama.cpp's converter's order.
pub(crate) fn tensors(spec: &Spec, n_vocab: usize, n_token_types: usize) -> Vec<Planned> {
    let n_embd = spec.n_embd;
    let norm = |base: &str| {
        [
            Planned::vector(format!("{base}.weight"), n_embd, Fill::Norm),
            Planned::vector(format!("{base}.bias"), n_embd, Fill::Uniform(BIAS)),
        ]
    };
    let mut out = vec![
        Planned {
            dtype: spec.token_embd,
            ..Planned::matrix("token_embd.weight".into(), n_embd, n_vocab, EMBEDDING)
        },
        Planned::float_matrix(
            "token_types.weight".into(),
            n_embd,
            n_token_types,
            EMBEDDING,
        ),
        Planned::float_matrix(
            "position_embd.weight".into(),
            n_embd,
            spec.n_ctx_train as usize,
            EMBEDDING,
        ),
    ];
    out.extend(norm("token_embd_norm"));
    for il in 0..spec.n_layer {
        let blk = |what: &str| format!("blk.{il}.{what}");
        // A matrix and its bias.
        let linear = |what: &str, n_in: usize, n_out: usize, amplitude: f32| {
            [
                Planned::matrix(blk(&format!("{what}.weight")), n_in, n_out, amplitude),
                Planned::vector(blk(&format!("{what}.bias")), n_out, Fill::Uniform(BIAS)),
            ]
        };
        let n_attn = spec.n_head * spec.head_dim;
        out.extend(linear("attn_q", n_embd, n_attn, QUERY_KEY));
        out.extend(linear("attn_k", n_embd, n_attn, QUERY_KEY));
        out.extend(linear("attn_v", n_embd, n_attn, MATRIX));
        out.extend(linear("attn_output", n_attn, n_embd, MATRIX));
        out.extend(norm(&blk("attn_output_norm")));
        out.extend(linear("ffn_up", n_embd, spec.n_ff, MATRIX));
        out.extend(linear("ffn_down", spec.n_ff, n_embd, MATRIX));
        out.extend(norm(&blk("layer_output_norm")));
    }
    out
}
