//! The tensors of a random model: their names (llama.cpp's `llama-arch.cpp` names), shapes,
//! types and values. This module owns the plan of each [`Spec`] and the tiny models' value
//! ranges; it writes no metadata. Shape models take their names, shapes and kinds of values
//! (matrix, norm, bias, computed) from the same plan, and their types and values elsewhere
//! (`shaped`, `blocks`).
//!
//! The tiny models' ranges are chosen so that activations stay near unit scale and attention
//! is far from uniform (a uniform attention would hide position and mask errors): matrices
//! uniform in ±0.2, query and key projections ±0.25, embeddings and the output projection ±0.3
//! (logits then spread over a few units), norm weights 1 ± 0.1, biases ±0.1. Delta nets:
//! convolution taps ±0.5, time-step biases ±0.5, and decay rates `ssm_a` (llama.cpp's
//! `-exp(A_log)`) uniform in [-0.12, -0.01]: the state then keeps between about 0.1% and 60%
//! of itself over 64 tokens (llama.cpp's chunk), so a prompt's earlier chunks still move the
//! logits, as in trained models, whose memory is long.

use crate::arch::{Attention, DeltaNet, Experts, Ffn, Llama3Rope, Spec};
use crate::gemma4;
use crate::planned::{Fill, Planned, EMBEDDING, MATRIX, QUERY_KEY};
use rgml::DType;

const BIAS: f32 = 0.1;
/// Attention sinks: logits of the same order as the scores, so they take a real share.
const SINK: f32 = 1.5;
/// Delta-net convolution taps.
const CONV: f32 = 0.5;
/// Delta-net time-step biases (`ssm_dt.bias`, added before the softplus).
const DT_BIAS: f32 = 0.5;
/// The range of the delta-net decay rates `ssm_a`: negative, as `-exp(A_log)` always is,
/// drawn uniformly rather than through `exp` so the bytes do not depend on a libm.
const DECAY: (f32, f32) = (-0.12, -0.01);

/// Every tensor of a model of `spec` with `n_vocab` tokens, in file order: embeddings, rope
/// factors, the blocks (Gemma 4's: [`gemma4::tensors`], with its own rope factors and
/// per-layer embeddings first), the output norm and projection; a BERT encoder's tensors
/// ([`crate::bert::tensors`]) where the spec is one.
pub fn plan(spec: &Spec, n_vocab: usize) -> Vec<Planned> {
    if let Some(n_token_types) = spec.encoder {
        return crate::bert::tensors(spec, n_vocab, n_token_types);
    }
    let mut out = vec![Planned {
        dtype: spec.token_embd,
        ..Planned::matrix("token_embd.weight".into(), spec.n_embd, n_vocab, EMBEDDING)
    }];
    if let Some(rope) = &spec.llama3_rope {
        let factors = llama3_rope_factors(rope, spec.rope_freq_base, spec.head_dim);
        out.push(Planned::vector(
            "rope_freqs.weight".into(),
            factors.len(),
            Fill::Values(factors),
        ));
    }
    match &spec.gemma4 {
        Some(g) => out.extend(gemma4::tensors(spec, g, n_vocab)),
        None => {
            for il in 0..spec.n_layer {
                out.extend(block(spec, il));
            }
        }
    }
    out.push(Planned::vector(
        "output_norm.weight".into(),
        spec.n_embd,
        Fill::Norm,
    ));
    if !spec.tied_output {
        out.push(Planned::matrix(
            "output.weight".into(),
            spec.n_embd,
            n_vocab,
            EMBEDDING,
        ));
    }
    out
}

/// The tensors of block `il`.
fn block(spec: &Spec, il: usize) -> Vec<Planned> {
    let name = |what: &str, kind: &str| format!("blk.{il}.{what}.{kind}");
    let norm = |what: &str, n: usize| Planned::vector(name(what, "weight"), n, Fill::Norm);
    let mut out = vec![norm("attn_norm", spec.n_embd)];
    match spec.delta_net {
        Some(net) if net.is_recurrent(il) => out.extend(delta_net(spec.n_embd, &net, il)),
        _ => out.extend(attention(spec, il)),
    }
    if spec.post_norms {
        out.push(norm("post_attention_norm", spec.n_embd));
    }
    out.push(norm(spec.ffn_norm, spec.n_embd));
    out.extend(ffn(spec, il));
    if spec.post_norms {
        out.push(norm("post_ffw_norm", spec.n_embd));
    }
    out
}

/// The attention tensors of block `il` after its input norm: projections, q/k norms, the
/// output projection with its bias, sinks.
fn attention(spec: &Spec, il: usize) -> Vec<Planned> {
    let name = |what: &str, kind: &str| format!("blk.{il}.{what}.{kind}");
    let norm = |what: &str, n: usize| Planned::vector(name(what, "weight"), n, Fill::Norm);
    let mut out = attention_projections(spec, il);
    if spec.qk_norm {
        out.push(norm("attn_q_norm", spec.head_dim));
        out.push(norm("attn_k_norm", spec.head_dim));
    }
    let n_q = spec.n_head * spec.head_dim;
    out.push(Planned::matrix(
        name("attn_output", "weight"),
        n_q,
        spec.n_embd,
        MATRIX,
    ));
    if spec.out_bias {
        let bias = Fill::Uniform(BIAS);
        out.push(Planned::vector(
            name("attn_output", "bias"),
            spec.n_embd,
            bias,
        ));
    }
    if spec.sinks {
        let sinks = Fill::Uniform(SINK);
        out.push(Planned::vector(
            name("attn_sinks", "weight"),
            spec.n_head,
            sinks,
        ));
    }
    out
}

/// The delta-net tensors of block `il` (llama.cpp's `load_block_trunk` of `qwen35`): the
/// fused q/k/v projection and the output gate's, the convolution, the time-step bias, decay,
/// the beta and alpha projections (one value per value head), the gated norm of each value
/// head and the output projection.
fn delta_net(n_embd: usize, net: &DeltaNet, il: usize) -> Vec<Planned> {
    let name = |what: &str| format!("blk.{il}.{what}");
    let (v_heads, value_dim) = (net.n_v_heads, net.value_dim());
    vec![
        Planned::matrix(name("attn_qkv.weight"), n_embd, net.conv_dim(), QUERY_KEY),
        Planned::matrix(name("attn_gate.weight"), n_embd, value_dim, MATRIX),
        Planned::float_matrix(
            name("ssm_conv1d.weight"),
            net.conv_kernel,
            net.conv_dim(),
            CONV,
        ),
        Planned::vector(name("ssm_dt.bias"), v_heads, Fill::Uniform(DT_BIAS)),
        // No `.weight`: llama.cpp's name for `-exp(A_log)` is bare.
        Planned::vector(name("ssm_a"), v_heads, Fill::Between(DECAY.0, DECAY.1)),
        Planned::matrix(name("ssm_beta.weight"), n_embd, v_heads, MATRIX),
        Planned::matrix(name("ssm_alpha.weight"), n_embd, v_heads, MATRIX),
        Planned::vector(name("ssm_norm.weight"), net.head_dim, Fill::Norm),
        Planned::matrix(name("ssm_out.weight"), value_dim, n_embd, MATRIX),
    ]
}

/// The feed-forward tensors of block `il` after its norm.
fn ffn(spec: &Spec, il: usize) -> Vec<Planned> {
    let name = |what: &str, kind: &str| format!("blk.{il}.{what}.{kind}");
    let (n_embd, n_ff) = (spec.n_embd, spec.n_ff);
    let mut out = Vec::new();
    match spec.ffn {
        Ffn::Gated => {
            out.push(Planned::matrix(
                name("ffn_gate", "weight"),
                n_embd,
                n_ff,
                MATRIX,
            ));
            out.push(Planned::matrix(
                name("ffn_up", "weight"),
                n_embd,
                n_ff,
                MATRIX,
            ));
        }
        Ffn::FusedGateUp => {
            out.push(Planned::matrix(
                name("ffn_up", "weight"),
                n_embd,
                2 * n_ff,
                MATRIX,
            ));
        }
        Ffn::Experts(x) => {
            out.extend(experts(spec, il, &x));
        }
    }
    if !matches!(spec.ffn, Ffn::Experts(_)) {
        out.push(Planned::matrix(
            name("ffn_down", "weight"),
            n_ff,
            n_embd,
            MATRIX,
        ));
    }
    out
}

/// The router and the experts of block `il`, in llama.cpp's converter's order, each followed
/// by its bias where the experts have them (`[n_out, n_expert]`; the router's `[n_expert]`).
fn experts(spec: &Spec, il: usize, x: &Experts) -> Vec<Planned> {
    let name = |what: &str| format!("blk.{il}.{what}.weight");
    let stacked = |what: &str, dtype: DType, n_in: usize, n_out: usize| Planned {
        dtype,
        ne: vec![n_in, n_out, x.n_expert],
        ..Planned::matrix(name(what), n_in, n_out, MATRIX)
    };
    let router = Planned {
        dtype: DType::F32,
        ..Planned::matrix(name("ffn_gate_inp"), spec.n_embd, x.n_expert, MATRIX)
    };
    let matrices = [
        router,
        stacked("ffn_gate_exps", x.gate_up, spec.n_embd, x.n_ff_exp),
        stacked("ffn_up_exps", x.gate_up, spec.n_embd, x.n_ff_exp),
        stacked("ffn_down_exps", x.down, x.n_ff_exp, spec.n_embd),
    ];
    let mut out = Vec::new();
    for m in matrices {
        let bias = x.biases.then(|| Planned {
            name: m.name.replace(".weight", ".bias"),
            dtype: DType::F32,
            ne: m.ne[1..].to_vec(),
            fill: Fill::Uniform(BIAS),
        });
        out.push(m);
        out.extend(bias);
    }
    if let Some(n_ff) = x.shared_ff {
        out.extend(shared_expert(spec.n_embd, n_ff, il));
    }
    out
}

/// The shared expert of block `il`, `n_ff` wide, and its gate: one F32 weight per input
/// dimension (a `[n_embd]` vector, as llama.cpp loads it), whose dot product with the input
/// goes through a sigmoid.
fn shared_expert(n_embd: usize, n_ff: usize, il: usize) -> Vec<Planned> {
    let name = |what: &str| format!("blk.{il}.{what}.weight");
    vec![
        Planned::vector(name("ffn_gate_inp_shexp"), n_embd, Fill::Uniform(MATRIX)),
        Planned::matrix(name("ffn_gate_shexp"), n_embd, n_ff, MATRIX),
        Planned::matrix(name("ffn_up_shexp"), n_embd, n_ff, MATRIX),
        Planned::matrix(name("ffn_down_shexp"), n_ff, n_embd, MATRIX),
    ]
}

/// Query, key and value projections of block `il`, with their biases if any. With a query
/// gate, `attn_q` has twice the query rows: each head's query, then its gate.
fn attention_projections(spec: &Spec, il: usize) -> Vec<Planned> {
    let n_q = spec.n_head * spec.head_dim * if spec.query_gate { 2 } else { 1 };
    let n_kv = spec.n_head_kv * spec.head_dim;
    let name = |what: &str, kind: &str| format!("blk.{il}.{what}.{kind}");
    match spec.attention {
        Attention::Fused => vec![Planned::matrix(
            name("attn_qkv", "weight"),
            spec.n_embd,
            n_q + 2 * n_kv,
            QUERY_KEY,
        )],
        Attention::Separate { bias } => {
            let mut out = Vec::new();
            for (what, n_out, amplitude) in [
                ("attn_q", n_q, QUERY_KEY),
                ("attn_k", n_kv, QUERY_KEY),
                ("attn_v", n_kv, MATRIX),
            ] {
                out.push(Planned::matrix(
                    name(what, "weight"),
                    spec.n_embd,
                    n_out,
                    amplitude,
                ));
                if bias {
                    out.push(Planned::vector(
                        name(what, "bias"),
                        n_out,
                        Fill::Uniform(BIAS),
                    ));
                }
            }
            out
        }
    }
}

/// The divisors of each rope frequency that llama.cpp's converter computes for a Llama 3.1
/// `rope_scaling` (`LlamaModel.generate_extra_tensors`): 1 for wavelengths shorter than
/// `original_context / high_freq_factor`, `factor` for those longer than `original_context /
/// low_freq_factor`, a smooth blend between. Computed in f64 and stored as f32.
pub fn llama3_rope_factors(rope: &Llama3Rope, base: f32, head_dim: usize) -> Vec<f32> {
    let old_context = f64::from(rope.original_context);
    let (low, high) = (
        f64::from(rope.low_freq_factor),
        f64::from(rope.high_freq_factor),
    );
    let factor = f64::from(rope.factor);
    (0..head_dim / 2)
        .map(|i| {
            let freq = 1.0 / f64::from(base).powf((2 * i) as f64 / head_dim as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            let divisor = if wavelen < old_context / high {
                1.0
            } else if wavelen > old_context / low {
                factor
            } else {
                let smooth = (old_context / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            };
            divisor as f32
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::Arch;

    #[test]
    fn llama3_factors_blend_from_one_to_the_factor() {
        let spec = Arch::Llama3.spec();
        let rope = spec.llama3_rope.expect("llama3 rope");
        let f = llama3_rope_factors(&rope, spec.rope_freq_base, spec.head_dim);
        assert_eq!(f.len(), 8);
        assert_eq!(f[0], 1.0, "the fastest frequency is kept");
        assert!(f[1] > 1.0 && f[1] < 8.0, "a blended frequency: {}", f[1]);
        assert!(f[2..].iter().all(|&x| x == 8.0), "{f:?}");
    }

    #[test]
    fn plans_hold_each_family_s_tensors() {
        let names = |arch: Arch| -> Vec<String> {
            plan(&arch.spec(), 1000)
                .into_iter()
                .map(|t| t.name)
                .collect()
        };
        let has = |arch: Arch, n: &str| names(arch).iter().any(|x| x == n);
        assert!(has(Arch::Qwen2, "blk.1.attn_k.bias") && !has(Arch::Qwen2, "output.weight"));
        assert!(
            has(Arch::Qwen3, "blk.2.attn_q_norm.weight") && !has(Arch::Qwen3, "blk.0.attn_q.bias")
        );
        assert!(
            has(Arch::Phi3, "blk.0.attn_qkv.weight") && !has(Arch::Phi3, "blk.0.ffn_gate.weight")
        );
        assert!(has(Arch::Gemma3, "blk.7.post_ffw_norm.weight"));
        assert!(has(Arch::Llama3, "rope_freqs.weight") && !has(Arch::Mistral, "rope_freqs.weight"));
        let phi3 = plan(&Arch::Phi3.spec(), 1000);
        let qkv = phi3
            .iter()
            .find(|t| t.name == "blk.0.attn_qkv.weight")
            .expect("qkv");
        assert_eq!(qkv.ne, [64, 64 + 2 * 64]);
        let up = phi3
            .iter()
            .find(|t| t.name == "blk.0.ffn_up.weight")
            .expect("up");
        assert_eq!(up.ne, [64, 256]);
    }

    fn find<'a>(p: &'a [Planned], name: &str) -> &'a Planned {
        p.iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("{name}"))
    }

    #[test]
    fn every_quantized_row_is_a_whole_number_of_blocks() {
        for arch in Arch::ALL {
            for t in plan(&arch.spec(), 1000) {
                let block = t.dtype.block_size();
                assert_eq!(t.ne[0] % block, 0, "{arch} {}: {:?}", t.name, t.ne);
            }
        }
    }

    /// Layers 3 and 7 are gated attention, the others delta nets with llama.cpp's shapes.
    #[test]
    fn qwen35_blocks_are_delta_nets_but_every_fourth() {
        let p = plan(&Arch::Qwen35.spec(), 1000);
        let ne = |name: &str| find(&p, name).ne.clone();
        let has = |name: &str| p.iter().any(|t| t.name == name);
        // q, k (2 heads of 32 each) and v (4 heads of 32): 256 channels.
        assert_eq!(ne("blk.0.attn_qkv.weight"), [64, 256]);
        assert_eq!(ne("blk.0.attn_gate.weight"), [64, 128]);
        assert_eq!(ne("blk.0.ssm_conv1d.weight"), [4, 256]);
        assert_eq!(find(&p, "blk.0.ssm_conv1d.weight").dtype, DType::F32);
        assert_eq!(ne("blk.6.ssm_a"), [4]);
        assert_eq!(ne("blk.6.ssm_alpha.weight"), [64, 4]);
        assert_eq!(ne("blk.6.ssm_norm.weight"), [32]);
        assert_eq!(ne("blk.6.ssm_out.weight"), [128, 64]);
        for il in [3, 7] {
            // 4 heads of 64, each query followed by its gate.
            assert_eq!(ne(&format!("blk.{il}.attn_q.weight")), [64, 512]);
            assert_eq!(ne(&format!("blk.{il}.attn_output.weight")), [256, 64]);
            assert!(has(&format!("blk.{il}.attn_k_norm.weight")));
            assert!(!has(&format!("blk.{il}.ssm_a")));
        }
        assert!(!has("blk.2.attn_q.weight") && has("blk.2.post_attention_norm.weight"));
        assert!(has("blk.2.ffn_gate.weight") && has("output.weight"));
    }

    #[test]
    fn qwen35moe_has_a_gated_shared_expert_and_negative_decays() {
        let p = plan(&Arch::Qwen35Moe.spec(), 1000);
        let gate = find(&p, "blk.0.ffn_gate_inp_shexp.weight");
        assert_eq!((gate.dtype, &gate.ne[..]), (DType::F32, &[128][..]));
        assert_eq!(find(&p, "blk.0.ffn_up_shexp.weight").ne, [128, 192]);
        assert_eq!(find(&p, "blk.0.ffn_down_shexp.weight").ne, [192, 128]);
        assert_eq!(find(&p, "blk.7.ffn_gate_exps.weight").ne, [128, 128, 8]);
        // 2 key heads and 6 value heads of 64.
        assert_eq!(find(&p, "blk.0.attn_qkv.weight").ne, [128, 640]);
        assert_eq!(find(&p, "blk.3.attn_q.weight").ne, [128, 1024]);
        let a = find(&p, "blk.1.ssm_a").values("qwen35moe");
        assert_eq!(a.len(), 6);
        assert!(a.iter().all(|&x| (DECAY.0..DECAY.1).contains(&x)), "{a:?}");
    }

    #[test]
    fn values_are_reproducible_and_norms_sit_near_one() {
        let spec = Arch::Gemma3.spec();
        let p = plan(&spec, 64);
        let norm = p
            .iter()
            .find(|t| t.name == "blk.0.attn_q_norm.weight")
            .expect("q norm");
        let bytes = norm.bytes("gemma3").unwrap();
        assert_eq!(bytes, norm.bytes("gemma3").unwrap());
        assert_ne!(bytes, norm.bytes("qwen3").unwrap());
        let values: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        assert_eq!(values.len(), 32);
        assert!(values.iter().all(|v| (0.9..1.1).contains(v)), "{values:?}");
        let q = p
            .iter()
            .find(|t| t.name == "blk.0.attn_q.weight")
            .expect("q");
        assert_eq!(q.bytes("gemma3").unwrap().len(), 64 * 128 / 32 * 34);
    }
}

/// Gemma 4's tensors (`gemma4`), in the whole plan.
#[cfg(test)]
mod gemma4_tests {
    use super::plan;
    use crate::arch::Arch;
    use crate::planned::Planned;
    use rgml::DType;

    fn find<'a>(p: &'a [Planned], name: &str) -> &'a Planned {
        p.iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("{name}"))
    }

    fn has(p: &[Planned], name: &str) -> bool {
        p.iter().any(|t| t.name == name)
    }

    /// Layers 0-3 have their own keys and values; 4-7 read layer 2's or 3's and have only
    /// their queries, twice as wide an FFN, and the per-layer input.
    #[test]
    fn dense_shared_layers_have_no_keys_or_values() {
        let p = plan(&Arch::Gemma4.spec(), 1000);
        for il in 0..4 {
            for what in ["attn_k", "attn_v", "attn_k_norm"] {
                assert!(has(&p, &format!("blk.{il}.{what}.weight")), "{il} {what}");
            }
        }
        for il in 4..8 {
            for what in ["attn_k", "attn_v", "attn_k_norm"] {
                assert!(!has(&p, &format!("blk.{il}.{what}.weight")), "{il} {what}");
            }
            assert_eq!(find(&p, &format!("blk.{il}.ffn_up.weight")).ne, [128, 384]);
            assert_eq!(
                find(&p, &format!("blk.{il}.ffn_down.weight")).ne,
                [384, 128]
            );
        }
        assert_eq!(find(&p, "blk.2.attn_q.weight").ne, [128, 128]);
        assert_eq!(find(&p, "blk.2.attn_k.weight").ne, [128, 64]);
        assert_eq!(find(&p, "blk.3.attn_k.weight").ne, [128, 128]);
        assert_eq!(find(&p, "blk.7.attn_q.weight").ne, [128, 256]);
        assert_eq!(find(&p, "blk.7.attn_output.weight").ne, [256, 128]);
        assert_eq!(find(&p, "blk.6.attn_q_norm.weight").ne, [32]);
        assert_eq!(find(&p, "blk.1.ffn_gate.weight").ne, [128, 192]);
        assert!(!has(&p, "output.weight") && !has(&p, "blk.0.ffn_gate_inp.weight"));
    }

    /// 64^-1/4 = 0.354 and 32^-1/4 = 0.420, each ± 10%.
    #[test]
    fn head_norms_sit_near_the_fourth_root_of_the_inverse_width() {
        let p = plan(&Arch::Gemma4.spec(), 1000);
        for (name, centre) in [
            ("blk.3.attn_q_norm.weight", 0.353_553_4),
            ("blk.3.attn_k_norm.weight", 0.353_553_4),
            ("blk.2.attn_k_norm.weight", 0.420_448_2),
        ] {
            let v = find(&p, name).values("gemma4");
            let (low, high) = (centre * 0.9, centre * 1.1);
            assert!(v.iter().all(|x| (low..high).contains(x)), "{name}: {v:?}");
        }
    }

    #[test]
    fn dense_per_layer_embeddings_have_llama_cpp_s_shapes() {
        let p = plan(&Arch::Gemma4.spec(), 1000);
        let table = find(&p, "per_layer_token_embd.weight");
        assert_eq!(
            (table.dtype, &table.ne[..]),
            (DType::Q8_0, &[128, 1000][..])
        );
        assert_eq!(find(&p, "per_layer_model_proj.weight").ne, [128, 128]);
        assert_eq!(find(&p, "per_layer_proj_norm.weight").ne, [16]);
        assert_eq!(find(&p, "blk.5.inp_gate.weight").ne, [128, 16]);
        let proj = find(&p, "blk.5.proj.weight");
        assert_eq!((proj.dtype, &proj.ne[..]), (DType::F16, &[16, 128][..]));
        assert_eq!(find(&p, "blk.5.post_norm.weight").ne, [128]);
        assert_eq!(find(&p, "rope_freqs.weight").ne, [32]);
        for il in 0..8 {
            let scale = find(&p, &format!("blk.{il}.layer_output_scale.weight"));
            let v = scale.values("gemma4");
            assert_eq!(v.len(), 1);
            assert!((0.3..0.6).contains(&v[0]), "{v:?}");
        }
    }

    /// Global layers (2, 5) use their keys as values; every layer has the router with its
    /// input scale, fused gate/up experts, down experts with their output scales, and the
    /// norms around both FFNs; no per-layer embeddings.
    #[test]
    fn moe_blocks_have_experts_beside_the_dense_ffn() {
        let p = plan(&Arch::Gemma4Moe.spec(), 1000);
        assert!(has(&p, "blk.1.attn_v.weight") && !has(&p, "blk.2.attn_v.weight"));
        assert_eq!(find(&p, "blk.2.attn_k.weight").ne, [256, 64]);
        assert_eq!(find(&p, "blk.1.attn_k.weight").ne, [256, 64]);
        assert_eq!(find(&p, "blk.5.attn_q.weight").ne, [256, 256]);
        for il in 0..6 {
            let t = |what: &str| find(&p, &format!("blk.{il}.{what}"));
            let router = t("ffn_gate_inp.weight");
            assert_eq!((router.dtype, &router.ne[..]), (DType::F32, &[256, 8][..]));
            assert_eq!(t("ffn_gate_inp.scale").ne, [256]);
            let gate_up = t("ffn_gate_up_exps.weight");
            assert_eq!(
                (gate_up.dtype, &gate_up.ne[..]),
                (DType::Q4_K, &[256, 256, 8][..])
            );
            let down = t("ffn_down_exps.weight");
            assert_eq!(
                (down.dtype, &down.ne[..]),
                (DType::Q8_0, &[128, 256, 8][..])
            );
            assert_eq!(t("ffn_down_exps.scale").ne, [8]);
            assert_eq!(t("ffn_up.weight").ne, [256, 256]);
            for norm in [
                "pre_ffw_norm_2",
                "post_ffw_norm_1",
                "post_ffw_norm_2",
                "post_ffw_norm",
            ] {
                assert_eq!(t(&format!("{norm}.weight")).ne, [256], "{norm}");
            }
            assert!(!has(&p, &format!("blk.{il}.ffn_gate_exps.weight")));
            assert!(!has(&p, &format!("blk.{il}.inp_gate.weight")));
        }
        assert!(!has(&p, "per_layer_token_embd.weight") && has(&p, "rope_freqs.weight"));
        let scale = find(&p, "blk.0.ffn_gate_inp.scale").values("gemma4moe");
        assert!(scale.iter().all(|x| (8.0..24.0).contains(x)), "{scale:?}");
    }
}
