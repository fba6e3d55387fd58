//! The real model shapes (`--shape`): the hyper-parameters of Llama 3.2 1B and 3B, Llama 3.1
//! 8B, Qwen2.5 7B, SmolLM2-135M, Qwen3-30B-A3B, gpt-oss-20b, Qwen3.5-35B-A3B and Gemma 4
//! 26B-A4B, under the keys llama.cpp's converter writes for each (the same [`Spec`] the tiny
//! architectures use), and each shape's default vocabulary file. This
//! module owns those numbers only; types, values and writing are elsewhere.
//!
//! These files exist to measure speed and memory at real sizes (benchmark machines without a
//! network make a multi-GB model in seconds); their weights are random, so their output is
//! noise.

use crate::arch::{
    gemma4_keys, qwen35_rope, Attention, DeltaNet, Experts, Ffn, Gemma4, Llama3Rope, Spec,
};
use rgml::DType;
use rgml_gguf::Value;
use std::fmt;
use std::str::FromStr;

/// A real model's shape that this crate writes with random weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Shape {
    /// Llama 3.2 1B (`llama`): 2048 wide, 16 blocks, tied embeddings, llama3 rope scaling.
    Llama1B,
    /// Llama 3.2 3B (`llama`): 3072 wide, 28 blocks, tied embeddings, llama3 rope scaling.
    Llama3B,
    /// Llama 3.1 8B (`llama`): 4096 wide, 32 blocks, a separate output, llama3 rope scaling.
    Llama8B,
    /// Qwen2.5 7B (`qwen2`): 3584 wide, 28 blocks, q/k/v biases, a separate output.
    Qwen7B,
    /// SmolLM2-135M (`llama`): 576 wide (not a whole number of K-quant blocks), 30 blocks.
    SmolLM2_135M,
    /// Qwen3-30B-A3B (`qwen3moe`): 2048 wide, 48 blocks, 128 experts of which 8 run per token.
    Qwen3Moe30BA3B,
    /// gpt-oss-20b (`gpt-oss`): 2880 wide, 24 blocks, 32 experts of which 4 run per token.
    GptOss20B,
    /// Qwen3.5-35B-A3B (`qwen35moe`): 2048 wide, 40 blocks (30 delta nets, 10 full
    /// attention), 256 experts of which 8 run per token, and a shared expert.
    Qwen35Moe35BA3B,
    /// Gemma 4 26B-A4B (`gemma4`): 2816 wide, 30 blocks (every sixth global), a dense FFN
    /// beside 128 experts of which 8 run per token.
    Gemma4_26BA4B,
}

impl Shape {
    /// Every shape, in a fixed order.
    pub const ALL: [Shape; 9] = [
        Shape::Llama1B,
        Shape::Llama3B,
        Shape::Llama8B,
        Shape::Qwen7B,
        Shape::SmolLM2_135M,
        Shape::Qwen3Moe30BA3B,
        Shape::GptOss20B,
        Shape::Qwen35Moe35BA3B,
        Shape::Gemma4_26BA4B,
    ];

    /// The name on the command line (and in `general.name` and the random streams' seeds).
    pub fn name(self) -> &'static str {
        match self {
            Shape::Llama1B => "llama-1b",
            Shape::Llama3B => "llama-3b",
            Shape::Llama8B => "llama-8b",
            Shape::Qwen7B => "qwen-7b",
            Shape::SmolLM2_135M => "smollm2-135m",
            Shape::Qwen3Moe30BA3B => "qwen3moe-30b-a3b",
            Shape::GptOss20B => "gpt-oss-20b",
            Shape::Qwen35Moe35BA3B => "qwen35moe-35b-a3b",
            Shape::Gemma4_26BA4B => "gemma4-26b-a4b",
        }
    }

    /// `general.architecture` and the prefix of the model's keys.
    pub fn gguf_arch(self) -> &'static str {
        match self {
            Shape::Qwen7B => "qwen2",
            Shape::Qwen3Moe30BA3B => "qwen3moe",
            Shape::GptOss20B => "gpt-oss",
            Shape::Qwen35Moe35BA3B => "qwen35moe",
            Shape::Gemma4_26BA4B => "gemma4",
            _ => "llama",
        }
    }

    /// The file, relative to the workspace root, whose vocabulary and `tokenizer.*` keys the
    /// model copies unless another is given. SmolLM2 has no vocabulary-only file: the demo
    /// model (`scripts/fetch-model.sh`) is one. gpt-oss's o200k vocabulary (201088 tokens) is
    /// not vendored by llama.cpp: its shape takes Llama 3's (128256), so its output head is
    /// about two thirds of the real one. Qwen3.5's vendored vocabulary is Qwen2's (151936
    /// tokens, the real one has 248320), so its output head is about three fifths of the
    /// real one.
    pub fn vocab_file(self) -> &'static str {
        match self {
            Shape::Llama1B | Shape::Llama3B | Shape::Llama8B | Shape::GptOss20B => {
                "models/vocab/ggml-vocab-llama-bpe.gguf"
            }
            Shape::Qwen7B | Shape::Qwen3Moe30BA3B => "models/vocab/ggml-vocab-qwen2.gguf",
            Shape::SmolLM2_135M => "models/SmolLM2-135M-Instruct.Q4_1.gguf",
            Shape::Qwen35Moe35BA3B => "models/vocab/ggml-vocab-qwen35.gguf",
            // The real vocabulary (262144 tokens), with 26B-A4B's own keys beside it.
            Shape::Gemma4_26BA4B => "models/vocab/ggml-vocab-gemma-4.gguf",
        }
    }

    /// The hyper-parameters (the embedding's rows are the vocabulary's tokens; `token_embd`
    /// is unused: every type comes from the preset).
    pub fn spec(self) -> Spec {
        match self {
            Shape::Llama1B => llama32(2048, 16, 32, 64),
            Shape::Llama3B => llama32(3072, 28, 24, 128),
            Shape::Llama8B => llama31_8b(),
            Shape::Qwen7B => qwen25_7b(),
            Shape::SmolLM2_135M => smollm2_135m(),
            Shape::Qwen3Moe30BA3B => qwen3moe_30b_a3b(),
            Shape::GptOss20B => gpt_oss_20b(),
            Shape::Qwen35Moe35BA3B => qwen35moe_35b_a3b(),
            Shape::Gemma4_26BA4B => gemma4_26b_a4b(),
        }
    }

    /// [`Shape::spec`] with `n_expert` experts per block instead of the real count (of the
    /// same width, as many used per token): a smaller file with the same work per token, for
    /// machines that cannot hold the real one. `None` for a shape without experts, or a count
    /// below the experts used per token.
    pub fn spec_with_experts(self, n_expert: usize) -> Option<Spec> {
        let mut spec = self.spec();
        match &mut spec.ffn {
            Ffn::Experts(x) if n_expert >= x.n_expert_used => x.n_expert = n_expert,
            _ => return None,
        }
        Some(spec)
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not one of [`Shape::ALL`]'s.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownShape(pub String);

impl fmt::Display for UnknownShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown shape {:?} (one of: {})", self.0, Shape::names())
    }
}

impl std::error::Error for UnknownShape {}

impl Shape {
    /// The shape names, comma-separated, for usage messages.
    pub fn names() -> String {
        let names: Vec<&str> = Shape::ALL.iter().map(|s| s.name()).collect();
        names.join(", ")
    }
}

impl FromStr for Shape {
    type Err = UnknownShape;

    /// A [`Shape::name`], in any case.
    fn from_str(s: &str) -> Result<Shape, UnknownShape> {
        Shape::ALL
            .into_iter()
            .find(|shape| shape.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownShape(s.to_string()))
    }
}

/// Llama 3's rope scaling as Meta's configs give it, with `factor`.
fn llama3_rope(factor: f32) -> Llama3Rope {
    Llama3Rope {
        factor,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_context: 8192,
    }
}

/// What every shape shares: separate q/k/v projections without biases, a gated FFN, no q/k
/// norms, and (for the `llama` ones) the vocabulary size key.
#[allow(clippy::too_many_arguments)]
fn dense(
    n_embd: usize,
    n_layer: usize,
    n_head: usize,
    n_head_kv: usize,
    head_dim: usize,
    n_ff: usize,
    tied_output: bool,
) -> Spec {
    Spec {
        n_layer,
        n_embd,
        n_head,
        n_head_kv,
        head_dim,
        n_ff,
        n_ctx_train: 131_072,
        rms_eps: 1e-5,
        rope_freq_base: 500_000.0,
        attention: Attention::Separate { bias: false },
        qk_norm: false,
        query_gate: false,
        delta_net: None,
        post_norms: false,
        out_bias: false,
        sinks: false,
        ffn_norm: "ffn_norm",
        ffn: Ffn::Gated,
        tied_output,
        token_embd: DType::F16,
        llama3_rope: None,
        vocab_size_key: true,
        keys: vec![("rope.dimension_count", Value::U32(head_dim as u32))],
        gemma4: None,
        encoder: None,
    }
}

/// Llama 3.2 (1B, 3B): 8 key/value heads, n_ff 8192, tied embeddings, rope factor 32. Their
/// configs name `head_dim`, so the converter writes `key_length` and `value_length`.
fn llama32(n_embd: usize, n_layer: usize, n_head: usize, head_dim: usize) -> Spec {
    let width = Value::U32(head_dim as u32);
    Spec {
        llama3_rope: Some(llama3_rope(32.0)),
        keys: vec![
            ("attention.key_length", width.clone()),
            ("attention.value_length", width.clone()),
            ("rope.dimension_count", width),
        ],
        ..dense(n_embd, n_layer, n_head, 8, head_dim, 8192, true)
    }
}

/// Llama 3.1 8B: 4096 wide, 32 blocks of 32 query and 8 key/value heads, n_ff 14336, a
/// separate output, rope factor 8.
fn llama31_8b() -> Spec {
    Spec {
        llama3_rope: Some(llama3_rope(8.0)),
        ..dense(4096, 32, 32, 8, 128, 14336, false)
    }
}

/// Qwen2.5 7B (Instruct): 3584 wide, 28 blocks of 28 query and 4 key/value heads, n_ff 18944,
/// q/k/v biases, a separate output, rope base 1e6, rms eps 1e-6, context 32768. The converter
/// writes no vocabulary size or rope dimension for `qwen2`.
fn qwen25_7b() -> Spec {
    Spec {
        n_ctx_train: 32_768,
        rms_eps: 1e-6,
        rope_freq_base: 1_000_000.0,
        attention: Attention::Separate { bias: true },
        vocab_size_key: false,
        keys: Vec::new(),
        ..dense(3584, 28, 28, 4, 128, 18944, false)
    }
}

/// SmolLM2-135M as its GGUF (the demo model) has it: 576 wide, 30 blocks of 9 query and 3
/// key/value heads of 64, n_ff 1536, tied embeddings, rope base 100000, context 8192.
fn smollm2_135m() -> Spec {
    Spec {
        n_ctx_train: 8192,
        rope_freq_base: 100_000.0,
        ..dense(576, 30, 9, 3, 64, 1536, true)
    }
}

/// Qwen3-30B-A3B as its GGUF has it: 2048 wide, 48 blocks of 32 query and 4 key/value heads
/// of 128 (4096-wide queries, `key_length`), q/k norms, a dense width (`feed_forward_length`
/// 6144) no tensor uses, 128 experts 768 wide of which 8 run per token (about 3.3 billion
/// parameters read per token of 30.5 billion), a separate output, rope base 1e6, rms eps 1e-6,
/// context 40960.
fn qwen3moe_30b_a3b() -> Spec {
    let width = Value::U32(128);
    Spec {
        n_ctx_train: 40_960,
        rms_eps: 1e-6,
        rope_freq_base: 1_000_000.0,
        qk_norm: true,
        ffn: Ffn::Experts(Experts {
            n_expert: 128,
            n_expert_used: 8,
            n_ff_exp: 768,
            width_key: true,
            // Unused: a shape's types come from its preset.
            gate_up: DType::Q8_0,
            down: DType::Q8_0,
            biases: false,
            shared_ff: None,
        }),
        vocab_size_key: false,
        keys: vec![
            ("attention.key_length", width.clone()),
            ("attention.value_length", width),
        ],
        ..dense(2048, 48, 32, 4, 128, 6144, false)
    }
}

/// gpt-oss-20b as its GGUF has it: 2880 wide, 24 blocks of 64 query and 8 key/value heads of
/// 64 (4096-wide queries, `key_length`), biases on q/k/v, the attention output and the
/// experts, a sink per head, local layers (window 128) alternating with global ones, NeoX RoPE
/// with YaRN (factor 32 over 4096, base 150000), 32 experts 2880 wide of which 4 run per token
/// (about 3.6 billion parameters read per token of 20.9 billion with the real vocabulary), a
/// separate output, rms eps 1e-5, context 131072.
fn gpt_oss_20b() -> Spec {
    let width = Value::U32(64);
    Spec {
        attention: Attention::Separate { bias: true },
        out_bias: true,
        sinks: true,
        ffn_norm: "post_attention_norm",
        ffn: Ffn::Experts(Experts {
            n_expert: 32,
            n_expert_used: 4,
            n_ff_exp: 2880,
            width_key: true,
            // Unused: a shape's types come from its preset.
            gate_up: DType::Q8_0,
            down: DType::Q8_0,
            biases: true,
            shared_ff: None,
        }),
        rope_freq_base: 150_000.0,
        vocab_size_key: false,
        keys: vec![
            ("attention.key_length", width.clone()),
            ("attention.value_length", width),
            ("attention.sliding_window", Value::U32(128)),
            ("rope.scaling.type", Value::String("yarn".into())),
            ("rope.scaling.factor", Value::F32(32.0)),
            ("rope.scaling.original_context_length", Value::U32(4096)),
        ],
        ..dense(2880, 24, 64, 8, 64, 2880, false)
    }
}

/// Qwen3.5-35B-A3B as its config describes it: 2048 wide, 40 blocks of which every fourth is
/// full attention (16 query heads of 256 with their gates, 2 key/value heads, q/k norms, 64
/// rotated dimensions in sections `[11, 11, 10, 0]`, rope base 1e7) and the others gated
/// delta nets (16 key heads and 32 value heads of 128, a 4-tap convolution); 256 experts 512
/// wide of which 8 run per token beside a shared expert 512 wide (about 3 billion parameters
/// read per token of 35), a separate output, rms eps 1e-6, context 262144.
fn qwen35moe_35b_a3b() -> Spec {
    let width = Value::U32(256);
    let mut keys = vec![
        ("attention.key_length", width.clone()),
        ("attention.value_length", width),
    ];
    keys.extend(qwen35_rope(64, [11, 11, 10, 0]));
    Spec {
        n_ctx_train: 262_144,
        rms_eps: 1e-6,
        rope_freq_base: 10_000_000.0,
        qk_norm: true,
        query_gate: true,
        delta_net: Some(DeltaNet {
            conv_kernel: 4,
            head_dim: 128,
            n_k_heads: 16,
            n_v_heads: 32,
            full_attention_interval: 4,
            recurrent_layers_key: true,
        }),
        ffn_norm: "post_attention_norm",
        ffn: Ffn::Experts(Experts {
            n_expert: 256,
            n_expert_used: 8,
            n_ff_exp: 512,
            width_key: true,
            // Unused: a shape's types come from its preset.
            gate_up: DType::Q8_0,
            down: DType::Q8_0,
            biases: false,
            shared_ff: Some(512),
        }),
        vocab_size_key: false,
        keys,
        ..dense(2048, 40, 16, 2, 256, 512, false)
    }
}

/// Gemma 4 26B-A4B as its GGUF has it (`ggml-vocab-gemma-4.gguf` carries the real file's
/// keys): 2816 wide, 30 blocks of 16 query heads, every sixth block global (heads of 512, 2
/// key/value heads which are also the values, proportional RoPE on a quarter of the pairs,
/// base 1e6), the others local (heads of 256, 8 key/value heads, window 1024, base 10000); a
/// dense FFN 2112 wide beside 128 experts 704 wide of which 8 run per token; tied embeddings,
/// logits soft-capped at 30, rms eps 1e-6, context 262144.
fn gemma4_26b_a4b() -> Spec {
    let g = Gemma4 {
        global_every: 6,
        head_dim_local: 256,
        n_head_kv_global: 2,
        global_values_are_keys: true,
        shared_kv_layers: 0,
        n_embd_per_layer: 0,
        global_rotary_share: 0.25,
    };
    let spec = Spec {
        n_ctx_train: 262_144,
        rms_eps: 1e-6,
        rope_freq_base: 1_000_000.0,
        qk_norm: true,
        post_norms: true,
        ffn: Ffn::Experts(Experts {
            n_expert: 128,
            n_expert_used: 8,
            n_ff_exp: 704,
            width_key: true,
            // Unused: a shape's types come from its preset.
            gate_up: DType::Q8_0,
            down: DType::Q8_0,
            biases: false,
            shared_ff: None,
        }),
        vocab_size_key: false,
        ..dense(2816, 30, 16, 8, 512, 2112, true)
    };
    let mut keys = gemma4_keys(&spec, &g, 10_000.0, 30.0);
    for (k, v) in &mut keys {
        if *k == "attention.sliding_window" {
            *v = Value::U32(1024);
        }
    }
    Spec {
        keys,
        gemma4: Some(g),
        ..spec
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_list_the_shapes() {
        for shape in Shape::ALL {
            assert_eq!(shape.name().parse::<Shape>(), Ok(shape));
        }
        assert_eq!("LLAMA-8B".parse::<Shape>(), Ok(Shape::Llama8B));
        let err = "llama-70b".parse::<Shape>().unwrap_err().to_string();
        assert!(
            err.contains("llama-70b")
                && err.contains("llama-1b, llama-3b")
                && err.contains("smollm2-135m"),
            "{err}"
        );
    }

    #[test]
    fn heads_cover_the_width_and_divide_into_kv_groups() {
        for shape in Shape::ALL {
            let s = shape.spec();
            // Qwen3's queries are wider than the model (`key_length`).
            let wide = s.keys.iter().any(|(k, _)| *k == "attention.key_length");
            assert!(wide || s.n_head * s.head_dim == s.n_embd, "{shape}");
            assert_eq!(s.n_head % s.n_head_kv, 0, "{shape}");
            // gpt-oss's 2880 is whole 32-blocks only (its files are MXFP4 and Q8_0); Gemma 4
            // 26B-A4B's 2112 whole 64-blocks only (llama-quantize falls back for those rows).
            let block = match shape {
                Shape::GptOss20B => 32,
                Shape::Gemma4_26BA4B => 64,
                _ => 256,
            };
            assert_eq!(s.n_ff % block, 0, "{shape}");
        }
    }
}
