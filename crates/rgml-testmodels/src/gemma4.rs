//! The tensors of Gemma 4's layers, as llama.cpp's `gemma4` loader (`load_arch_tensors`) names
//! and shapes them and its converter (`Gemma4Model`) writes them: the rope factors of the
//! global layers, the per-layer token embeddings and their projection, and each block. This
//! module owns those names and shapes and the value ranges of the tensors only Gemma 4 has;
//! the token embedding, the output and the common ranges are `tensors`'s, the layer structure
//! ([`Gemma4::layer`]) `arch`'s.
//!
//! Every norm of a block is RMS-normalized input times its weight, with no `1 +` (the
//! converter's `norm_shift` is 0), so norm weights are near 1 as everywhere else, but for the
//! q and k norms: Gemma 4 does not scale its scores, so those are near `head_dim^-1/4`, which
//! spreads the scores as much as the other models' (a trained model's norms learn the same).
//! q, k and v are normalized per head, so their projections' amplitudes do not matter. The
//! ranges of what is new: the router sees the layer input's norm divided by √n_embd and multiplied by
//! `ffn_gate_inp.scale`, so that scale is uniform in [8, 24] (about √256, the model's width):
//! router logits then spread over a few units, and the choice of experts does not hang on
//! rounding. Each expert's output scale (`ffn_down_exps.scale`) is uniform in [0.5, 1.5], and
//! each layer's output scale (`layer_output_scale`, which multiplies the whole residual stream)
//! in [0.3, 0.6]: positive and far from 1, so a reader that skips them is caught, and small
//! enough that the token's own embedding (scaled by √n_embd on the way in) fades from the
//! residual stream. Near 1 it would stay, and the tied output would give the last token the
//! largest logit: greedy decoding would repeat it, and continuations would test little.

use crate::arch::{Experts, Ffn, Gemma4, Spec};
use crate::planned::{Fill, Planned, EMBEDDING, MATRIX, NORM_SPREAD, QUERY_KEY};
use rgml::DType;

/// The range of `ffn_gate_inp.scale`.
const ROUTER_SCALE: (f32, f32) = (8.0, 24.0);
/// The range of the per-expert output scales.
const OUTPUT_SCALE: (f32, f32) = (0.5, 1.5);
/// The range of the per-layer output scales (see the module docs).
const LAYER_SCALE: (f32, f32) = (0.3, 0.6);

/// The tensors of a Gemma 4 model of `spec` and `g` with `n_vocab` tokens between the token
/// embedding and the output norm: rope factors, per-layer embeddings where there are any, and
/// the blocks.
pub(crate) fn tensors(spec: &Spec, g: &Gemma4, n_vocab: usize) -> Vec<Planned> {
    let factors = g.rope_factors(spec.head_dim);
    let mut out = vec![Planned::vector(
        "rope_freqs.weight".into(),
        factors.len(),
        Fill::Values(factors),
    )];
    if g.n_embd_per_layer > 0 {
        out.extend(per_layer_embeddings(spec, g.n_embd_per_layer, n_vocab));
    }
    for il in 0..spec.n_layer {
        out.extend(block(spec, g, il));
    }
    out
}

/// The table of every layer's token embeddings, `n_embd_per_layer` values per layer and token
/// (of `token_embd`'s type, as llama-quantize gives it), the projection of the input embedding
/// to as many values and the norm of each layer's share of them.
fn per_layer_embeddings(spec: &Spec, n_embd_per_layer: usize, n_vocab: usize) -> [Planned; 3] {
    let width = n_embd_per_layer * spec.n_layer;
    [
        Planned {
            dtype: spec.token_embd,
            ..Planned::matrix(
                "per_layer_token_embd.weight".into(),
                width,
                n_vocab,
                EMBEDDING,
            )
        },
        Planned::matrix(
            "per_layer_model_proj.weight".into(),
            spec.n_embd,
            width,
            MATRIX,
        ),
        Planned::vector(
            "per_layer_proj_norm.weight".into(),
            n_embd_per_layer,
            Fill::Norm,
        ),
    ]
}

/// The tensors of block `il`: attention (keys and values only where the layer has its own
/// cache, values only where they are not the keys), the dense FFN of the layer's width, the
/// experts, the per-layer input and the output scale.
fn block(spec: &Spec, g: &Gemma4, il: usize) -> Vec<Planned> {
    let layer = g.layer(spec, il);
    let name = |what: &str| format!("blk.{il}.{what}.weight");
    let norm = |what: &str, n: usize| Planned::vector(name(what), n, Fill::Norm);
    let matrix = |what: &str, n_in: usize, n_out: usize, amplitude: f32| {
        Planned::matrix(name(what), n_in, n_out, amplitude)
    };
    let (n_embd, head_dim) = (spec.n_embd, layer.head_dim);
    let (n_q, n_kv) = (spec.n_head * head_dim, layer.n_head_kv * head_dim);
    let mut out = vec![
        norm("attn_norm", n_embd),
        matrix("attn_q", n_embd, n_q, QUERY_KEY),
    ];
    if layer.own_kv {
        out.push(matrix("attn_k", n_embd, n_kv, QUERY_KEY));
        if !layer.values_are_keys {
            out.push(matrix("attn_v", n_embd, n_kv, MATRIX));
        }
    }
    let head_norm = |what: &str| Planned::vector(name(what), head_dim, head_norm_fill(head_dim));
    out.push(head_norm("attn_q_norm"));
    if layer.own_kv {
        out.push(head_norm("attn_k_norm"));
    }
    out.extend([
        matrix("attn_output", n_q, n_embd, MATRIX),
        norm("post_attention_norm", n_embd),
        norm("ffn_norm", n_embd),
        matrix("ffn_gate", n_embd, layer.n_ff, MATRIX),
        matrix("ffn_up", n_embd, layer.n_ff, MATRIX),
        matrix("ffn_down", layer.n_ff, n_embd, MATRIX),
    ]);
    if let Ffn::Experts(x) = &spec.ffn {
        out.extend(experts(n_embd, x, il));
    }
    out.push(norm("post_ffw_norm", n_embd));
    if g.n_embd_per_layer > 0 {
        out.extend(per_layer_input(n_embd, g.n_embd_per_layer, il));
    }
    out.push(Planned::vector(
        name("layer_output_scale"),
        1,
        Fill::Between(LAYER_SCALE.0, LAYER_SCALE.1),
    ));
    out
}

/// The weights of a q or k norm of heads `head_dim` wide: 1 ± [`NORM_SPREAD`] times
/// `head_dim^-1/4`, so that the scores (unscaled in Gemma 4) spread as `q·k/√head_dim` of
/// unit-RMS heads does. (Computed with square roots, which IEEE 754 rounds exactly, not
/// `powf`, so the bytes do not depend on a libm.)
fn head_norm_fill(head_dim: usize) -> Fill {
    let w = 1.0 / (head_dim as f32).sqrt().sqrt();
    Fill::Between(w * (1.0 - NORM_SPREAD), w * (1.0 + NORM_SPREAD))
}

/// The experts of block `il` and what surrounds them: the router (F32, as llama-quantize
/// leaves it) with the scale of its input, the norm before the experts, gate and up fused
/// (gate rows first), down with each expert's output scale, and the norms after the dense
/// FFN and after the experts, whose sum `post_ffw_norm` normalizes.
fn experts(n_embd: usize, x: &Experts, il: usize) -> Vec<Planned> {
    let name = |what: &str, kind: &str| format!("blk.{il}.{what}.{kind}");
    let norm = |what: &str| Planned::vector(name(what, "weight"), n_embd, Fill::Norm);
    let stacked = |what: &str, dtype: DType, n_in: usize, n_out: usize| Planned {
        dtype,
        ne: vec![n_in, n_out, x.n_expert],
        ..Planned::matrix(name(what, "weight"), n_in, n_out, MATRIX)
    };
    let scale = |what: &str, n: usize, (low, high): (f32, f32)| {
        Planned::vector(name(what, "scale"), n, Fill::Between(low, high))
    };
    vec![
        Planned {
            dtype: DType::F32,
            ..Planned::matrix(name("ffn_gate_inp", "weight"), n_embd, x.n_expert, MATRIX)
        },
        scale("ffn_gate_inp", n_embd, ROUTER_SCALE),
        norm("pre_ffw_norm_2"),
        stacked("ffn_gate_up_exps", x.gate_up, n_embd, 2 * x.n_ff_exp),
        stacked("ffn_down_exps", x.down, x.n_ff_exp, n_embd),
        scale("ffn_down_exps", x.n_expert, OUTPUT_SCALE),
        norm("post_ffw_norm_1"),
        norm("post_ffw_norm_2"),
    ]
}

/// The per-layer input of block `il`: the gate from the layer's output to `n_embd_per_layer`
/// values (which multiply the layer's share of the per-layer embeddings), the projection back
/// and its norm. The projection's rows are `n_embd_per_layer` wide: Q8_0 where that is whole
/// blocks, else F16 (llama-quantize's fallback).
fn per_layer_input(n_embd: usize, n_embd_per_layer: usize, il: usize) -> [Planned; 3] {
    let name = |what: &str| format!("blk.{il}.{what}.weight");
    let proj_type = if n_embd_per_layer.is_multiple_of(DType::Q8_0.block_size()) {
        DType::Q8_0
    } else {
        DType::F16
    };
    [
        Planned::matrix(name("inp_gate"), n_embd, n_embd_per_layer, MATRIX),
        Planned {
            dtype: proj_type,
            ..Planned::matrix(name("proj"), n_embd_per_layer, n_embd, MATRIX)
        },
        Planned::vector(name("post_norm"), n_embd, Fill::Norm),
    ]
}
