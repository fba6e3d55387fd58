//! The architectures and the hyper-parameters of each one's random file. This module owns the
//! choice of every number in the files (sizes, rope bases, windows, weight types) and the keys
//! that llama.cpp's converter writes for the family; building tensors and writing bytes are
//! elsewhere.
//!
//! The sizes are tiny (64 to 256 wide, 2 to 8 layers) but keep what distinguishes each family
//! in real files: grouped-query attention, head widths that are not `n_embd / n_head`, q/k
//! norms, biases, fused projections, tied or separate output weights, rope variants, sliding
//! windows, shared experts, Qwen 3.5's gated delta nets between gated attention layers and
//! Gemma 4's layers of two head widths with shared caches and per-layer token embeddings.

use rgml::DType;
use rgml_gguf::Value;
use std::fmt;
use std::str::FromStr;

/// An architecture this crate writes a random model of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arch {
    /// Gemma 3 (`gemma3`): 4B-style (linear rope scaling on global layers), sliding windows.
    Gemma3,
    /// Qwen2 / Qwen2.5 (`qwen2`): q/k/v biases, tied embeddings.
    Qwen2,
    /// Qwen3 (`qwen3`): q/k norms, head width above `n_embd / n_head`.
    Qwen3,
    /// Llama 3.1+ (`llama`): GQA and the llama3 rope scaling as a `rope_freqs` tensor.
    Llama3,
    /// Phi-3 mini (`phi3`): fused QKV and gate+up projections.
    Phi3,
    /// Mistral 7B style (`llama`, as llama.cpp's converter names it): SentencePiece vocabulary.
    Mistral,
    /// Qwen3 MoE (`qwen3moe`, Qwen3-30B-A3B style): Qwen3's attention, 8 experts of which 3
    /// run per token, K-quant experts wide enough for ggml's tiled expert kernels.
    Qwen3Moe,
    /// Mixtral 8x7B style (`llama` with experts): 8 experts, 2 per token, as wide as
    /// `feed_forward_length`; the LLaMA SentencePiece vocabulary.
    Mixtral,
    /// gpt-oss-20b style (`gpt-oss`): biases everywhere, attention sinks, alternating
    /// sliding-window layers, YaRN, MXFP4 experts; the Llama 3 vocabulary (llama.cpp vendors
    /// no o200k one).
    GptOss,
    /// Qwen3.5 dense (`qwen35`, Qwen3.5-9B style): gated delta-net layers with every 4th
    /// layer gated full attention (partial interleaved M-RoPE), a dense FFN.
    Qwen35,
    /// Qwen3.5 MoE (`qwen35moe`, Qwen3.5-35B-A3B style): Qwen3.5's layers with routed experts
    /// and a sigmoid-gated shared expert.
    Qwen35Moe,
    /// Gemma 4 dense (`gemma4`, E2B style): local and global layers of different head widths,
    /// the last layers reading earlier layers' caches, per-layer token embeddings.
    Gemma4,
    /// Gemma 4 MoE (`gemma4`, 26B-A4B style): routed experts beside the dense FFN, global
    /// layers whose values are their keys.
    Gemma4Moe,
    /// BERT (`bert`, bge-small style): an encoder for embeddings with position and token-type
    /// embeddings, bidirectional attention, post-norm blocks and CLS pooling; the bge WordPiece
    /// vocabulary.
    Bert,
}

impl Arch {
    /// Every architecture, in a fixed order.
    pub const ALL: [Arch; 14] = [
        Arch::Gemma3,
        Arch::Qwen2,
        Arch::Qwen3,
        Arch::Llama3,
        Arch::Phi3,
        Arch::Mistral,
        Arch::Qwen3Moe,
        Arch::Mixtral,
        Arch::GptOss,
        Arch::Qwen35,
        Arch::Qwen35Moe,
        Arch::Gemma4,
        Arch::Gemma4Moe,
        Arch::Bert,
    ];

    /// The name used on the command line and for fixtures (`llama3`, not `llama`: Mistral's
    /// file is a `llama` too).
    pub fn name(self) -> &'static str {
        match self {
            Arch::Gemma3 => "gemma3",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Llama3 => "llama3",
            Arch::Phi3 => "phi3",
            Arch::Mistral => "mistral",
            Arch::Qwen3Moe => "qwen3moe",
            Arch::Mixtral => "mixtral",
            Arch::GptOss => "gpt-oss",
            Arch::Qwen35 => "qwen35",
            Arch::Qwen35Moe => "qwen35moe",
            Arch::Gemma4 => "gemma4",
            Arch::Gemma4Moe => "gemma4moe",
            Arch::Bert => "bert",
        }
    }

    /// `general.architecture` as llama.cpp expects it, and the prefix of the model's keys.
    pub fn gguf_arch(self) -> &'static str {
        match self {
            Arch::Gemma3 => "gemma3",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Llama3 | Arch::Mistral | Arch::Mixtral => "llama",
            Arch::Phi3 => "phi3",
            Arch::Qwen3Moe => "qwen3moe",
            Arch::GptOss => "gpt-oss",
            Arch::Qwen35 => "qwen35",
            Arch::Qwen35Moe => "qwen35moe",
            Arch::Gemma4 | Arch::Gemma4Moe => "gemma4",
            Arch::Bert => "bert",
        }
    }

    /// The file, relative to the workspace root, whose `tokenizer.*` keys the model copies
    /// (fetched by `scripts/fetch-model.sh` and `scripts/fetch-vocab.sh`).
    pub fn vocab_file(self) -> &'static str {
        match self {
            Arch::Gemma3 => "models/gemma-3-270m-q4_k_m.gguf",
            Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe => "models/vocab/ggml-vocab-qwen2.gguf",
            Arch::Llama3 | Arch::GptOss => "models/vocab/ggml-vocab-llama-bpe.gguf",
            Arch::Phi3 => "models/vocab/ggml-vocab-phi-3.gguf",
            Arch::Mistral | Arch::Mixtral => "models/vocab/ggml-vocab-llama-spm.gguf",
            // Qwen2's tokens and merges under Qwen 3.5's pre-tokenizer (llama.cpp's test file;
            // the real vocabulary has 248320 tokens).
            Arch::Qwen35 | Arch::Qwen35Moe => "models/vocab/ggml-vocab-qwen35.gguf",
            // The real 262144 tokens (the file's hyper-parameters are Gemma 4 26B-A4B's).
            Arch::Gemma4 | Arch::Gemma4Moe => "models/vocab/ggml-vocab-gemma-4.gguf",
            Arch::Bert => "models/vocab/ggml-vocab-bert-bge.gguf",
        }
    }

    /// The hyper-parameters of the architecture's file.
    pub fn spec(self) -> Spec {
        match self {
            Arch::Gemma3 => gemma3(),
            Arch::Qwen2 => qwen2(),
            Arch::Qwen3 => qwen3(),
            Arch::Llama3 => llama3(),
            Arch::Phi3 => phi3(),
            Arch::Mistral => mistral(),
            Arch::Qwen3Moe => qwen3moe(),
            Arch::Mixtral => mixtral(),
            Arch::GptOss => gpt_oss(),
            Arch::Qwen35 => qwen35(),
            Arch::Qwen35Moe => qwen35moe(),
            Arch::Gemma4 => gemma4(),
            Arch::Gemma4Moe => gemma4moe(),
            Arch::Bert => bert(),
        }
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not one of [`Arch::ALL`]'s.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownArch(pub String);

impl fmt::Display for UnknownArch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = Arch::ALL.iter().map(|a| a.name()).collect();
        write!(
            f,
            "unknown architecture {:?} (one of: {})",
            self.0,
            names.join(", ")
        )
    }
}

impl std::error::Error for UnknownArch {}

impl FromStr for Arch {
    type Err = UnknownArch;

    /// An [`Arch::name`]; `llama` is accepted for `llama3`.
    fn from_str(s: &str) -> Result<Arch, UnknownArch> {
        if s == "llama" {
            return Ok(Arch::Llama3);
        }
        Arch::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| UnknownArch(s.to_string()))
    }
}

/// How attention projects its input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attention {
    /// `attn_q`, `attn_k`, `attn_v`, with or without their biases.
    Separate {
        /// Whether `attn_{q,k,v}.bias` exist.
        bias: bool,
    },
    /// One `attn_qkv` whose rows are q, then k, then v.
    Fused,
}

/// How the feed-forward block is stored (both compute `down(act(gate) * up)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ffn {
    /// `ffn_gate` and `ffn_up`, `n_ff` rows each.
    Gated,
    /// One `ffn_up` of `2 * n_ff` rows: gate rows, then up rows.
    FusedGateUp,
    /// A router (`ffn_gate_inp`, F32 as llama-quantize leaves it) and experts stacked on dim
    /// 2 (`ffn_{gate,up,down}_exps`).
    Experts(Experts),
}

/// The experts of a mixture-of-experts FFN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Experts {
    /// `expert_count`.
    pub n_expert: usize,
    /// `expert_used_count`.
    pub n_expert_used: usize,
    /// Hidden width of one expert.
    pub n_ff_exp: usize,
    /// Whether the width is written as `expert_feed_forward_length` (else the experts are
    /// `feed_forward_length` wide, as Mixtral's).
    pub width_key: bool,
    /// Type of the gate and up experts.
    pub gate_up: DType,
    /// Type of the down experts.
    pub down: DType,
    /// Whether the router and the experts have biases (`ffn_*.bias`: gpt-oss).
    pub biases: bool,
    /// Width of the shared expert every token also runs, scaled by a sigmoid gate
    /// (`ffn_{gate,up,down}_shexp`, `ffn_gate_inp_shexp`; written as
    /// `expert_shared_feed_forward_length`): Qwen3.5 MoE. Q8_0, as the other matrices.
    pub shared_ff: Option<usize>,
}

/// Qwen3.5's linear-attention layers: a gated delta net (the `ssm.*` keys and `ssm_*`
/// tensors), with every `full_attention_interval`-th layer full attention instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaNet {
    /// `ssm.conv_kernel`: taps of the causal convolution over q, k and v.
    pub conv_kernel: usize,
    /// `ssm.state_size`: width of one key head and of one value head (llama.cpp takes both
    /// from this key).
    pub head_dim: usize,
    /// `ssm.group_count`: key (and query) heads.
    pub n_k_heads: usize,
    /// `ssm.time_step_rank`: value heads, a multiple of the key heads.
    pub n_v_heads: usize,
    /// `full_attention_interval`: layers `interval - 1`, `2 * interval - 1`, ... are full
    /// attention.
    pub full_attention_interval: usize,
    /// Whether `attention.recurrent_layers` (one bool per layer) is written too, as
    /// llama.cpp's converter does for configs with `layer_types`; llama.cpp prefers it to the
    /// interval. Files of older converters have the interval only.
    pub recurrent_layers_key: bool,
}

impl DeltaNet {
    /// Width of all key heads (and of all query heads).
    pub fn key_dim(self) -> usize {
        self.head_dim * self.n_k_heads
    }

    /// Width of all value heads: `ssm.inner_size`.
    pub fn value_dim(self) -> usize {
        self.head_dim * self.n_v_heads
    }

    /// Channels of the convolution (and rows of `attn_qkv`): q, k, then v.
    pub fn conv_dim(self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    /// Whether layer `il` is a delta-net layer (else full attention).
    pub fn is_recurrent(self, il: usize) -> bool {
        !(il + 1).is_multiple_of(self.full_attention_interval)
    }
}

/// Llama 3.1's rope scaling, which llama.cpp's converter writes as a `rope_freqs.weight`
/// tensor of per-frequency divisors (no `rope.scaling.*` keys).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Llama3Rope {
    /// `factor`: the divisor of the low frequencies.
    pub factor: f32,
    /// `low_freq_factor`.
    pub low_freq_factor: f32,
    /// `high_freq_factor`.
    pub high_freq_factor: f32,
    /// `original_max_position_embeddings`.
    pub original_context: u32,
}

/// Gemma 4's layers (llama.cpp's `gemma4`): local ones (a sliding window, narrow heads, every
/// pair rotated) and global ones (wide heads under "proportional" rope: a share of the pairs
/// rotated, the others held still by `rope_freqs.weight`), the last layers reading the caches
/// of earlier ones, per-layer token embeddings, and routed experts beside the dense FFN where
/// [`Spec::ffn`] has them (gate and up fused, as the converter writes Gemma 4's
/// `experts.gate_up_proj`). [`Spec::head_dim`] is the global layers' head width,
/// [`Spec::n_head_kv`] the local layers' key/value heads, [`Spec::n_ff`] the FFN width of the
/// layers with their own cache.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Gemma4 {
    /// Layers `global_every - 1`, `2 * global_every - 1`, ... are global, the others local
    /// (written as `attention.sliding_window_pattern`: one bool per layer, true for local).
    pub global_every: usize,
    /// `attention.key_length_swa` and `value_length_swa`: the local layers' head width.
    pub head_dim_local: usize,
    /// Key/value heads of the global layers; where they differ from the local layers',
    /// `attention.head_count_kv` is one value per layer (the converter's
    /// `num_global_key_value_heads`).
    pub n_head_kv_global: usize,
    /// Whether the global layers have no `attn_v` and use their keys as values (the
    /// converter's `attention_k_eq_v`, as in 26B-A4B).
    pub global_values_are_keys: bool,
    /// `attention.shared_kv_layers`: the last N layers have no keys and values of their own
    /// and read the cache of the last local or global layer before them (llama.cpp requires
    /// those two to be a local layer, then a global one). Their FFN is twice as wide
    /// (`use_double_wide_mlp`, as in E2B), so `feed_forward_length` is one value per layer.
    pub shared_kv_layers: usize,
    /// `embedding_length_per_layer_input`: the width of each layer's own token embedding
    /// (0: none, and no `per_layer_*`, `inp_gate`, `proj` or `post_norm` tensors).
    pub n_embd_per_layer: usize,
    /// The rotated share of a global head's pairs (the config's `partial_rotary_factor`).
    pub global_rotary_share: f32,
}

/// One layer of a Gemma 4 model, as [`Gemma4::layer`] derives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gemma4Layer {
    /// Sliding-window attention (else global).
    pub local: bool,
    /// Width of each head.
    pub head_dim: usize,
    /// Key/value heads.
    pub n_head_kv: usize,
    /// Whether the layer has `attn_k` and `attn_k_norm` (else it reads another layer's cache).
    pub own_kv: bool,
    /// Whether the layer's values are its keys (no `attn_v`).
    pub values_are_keys: bool,
    /// FFN width.
    pub n_ff: usize,
}

impl Gemma4 {
    /// Layer `il` of a model of `spec`.
    pub fn layer(&self, spec: &Spec, il: usize) -> Gemma4Layer {
        let local = !(il + 1).is_multiple_of(self.global_every);
        let own_kv = il + self.shared_kv_layers < spec.n_layer;
        Gemma4Layer {
            local,
            head_dim: if local {
                self.head_dim_local
            } else {
                spec.head_dim
            },
            n_head_kv: if local {
                spec.n_head_kv
            } else {
                self.n_head_kv_global
            },
            own_kv,
            values_are_keys: own_kv && !local && self.global_values_are_keys,
            n_ff: if own_kv { spec.n_ff } else { 2 * spec.n_ff },
        }
    }

    /// `rope_freqs.weight` of global heads `head_dim` wide, as the converter computes it for
    /// "proportional" rope: divisor 1 for the rotated pairs, 1e30 (no rotation) for the others.
    /// ggml's NeoX rope rotates the first pairs only, so the unrotated ones come last.
    pub fn rope_factors(&self, head_dim: usize) -> Vec<f32> {
        let rotated = (head_dim as f32 * self.global_rotary_share / 2.0) as usize;
        (0..head_dim / 2)
            .map(|i| if i < rotated { 1.0 } else { 1e30 })
            .collect()
    }
}

/// Everything that decides a file's contents besides the vocabulary and the random values.
#[derive(Clone, Debug, PartialEq)]
pub struct Spec {
    /// Transformer blocks.
    pub n_layer: usize,
    /// Embedding width.
    pub n_embd: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_head_kv: usize,
    /// Width of one head (`attention.key_length` where it differs from `n_embd / n_head`).
    pub head_dim: usize,
    /// Feed-forward width.
    pub n_ff: usize,
    /// `context_length`.
    pub n_ctx_train: u32,
    /// `attention.layer_norm_rms_epsilon`.
    pub rms_eps: f32,
    /// `rope.freq_base` (Gemma 3: of the global layers).
    pub rope_freq_base: f32,
    /// Attention projections.
    pub attention: Attention,
    /// Whether `attn_q_norm` and `attn_k_norm` (one weight per head dimension) exist.
    pub qk_norm: bool,
    /// Whether `attn_q` gives each head's query followed by as many gate values (Qwen3.5:
    /// `2 * n_head * head_dim` rows, the output scaled by their sigmoid).
    pub query_gate: bool,
    /// Qwen3.5's delta-net layers, which replace attention in all but every
    /// `full_attention_interval`-th layer.
    pub delta_net: Option<DeltaNet>,
    /// Whether Gemma's `post_attention_norm` and `post_ffw_norm` exist.
    pub post_norms: bool,
    /// Whether `attn_output.bias` exists.
    pub out_bias: bool,
    /// Whether `attn_sinks.weight` (one per query head) exists.
    pub sinks: bool,
    /// The name of the norm before the FFN (gpt-oss: `post_attention_norm`).
    pub ffn_norm: &'static str,
    /// Feed-forward projections.
    pub ffn: Ffn,
    /// Whether the output projection is the token embedding (no `output.weight`).
    pub tied_output: bool,
    /// Type of `token_embd.weight` in the tiny models, whose other matrices are Q8_0 and norms
    /// and biases F32. (Shape models take every type from their preset instead.)
    pub token_embd: DType,
    /// Llama 3.1 rope scaling, written as `rope_freqs.weight`.
    pub llama3_rope: Option<Llama3Rope>,
    /// Whether `{arch}.vocab_size` is written (llama.cpp's converter does for `llama`).
    pub vocab_size_key: bool,
    /// Further `{arch}.*` keys, without the prefix, in the order written; one that repeats a
    /// common key (`feed_forward_length`) replaces its value in its place, as a second write
    /// does in llama.cpp's converter.
    pub keys: Vec<(&'static str, Value)>,
    /// Gemma 4's layers, whose tensors replace the blocks the fields above describe.
    pub gemma4: Option<Gemma4>,
    /// A BERT encoder's token-type count: its tensors (`bert`) replace the blocks and output
    /// the fields above describe, and its keys replace the RMS epsilon and rope base.
    pub encoder: Option<usize>,
}

/// The fields most files share: 64 wide, 4 query and 2 key/value heads of 16, Q8_0 embeddings.
fn base() -> Spec {
    Spec {
        n_layer: 2,
        n_embd: 64,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 16,
        n_ff: 128,
        n_ctx_train: 32768,
        rms_eps: 1e-6,
        rope_freq_base: 1_000_000.0,
        attention: Attention::Separate { bias: false },
        qk_norm: false,
        query_gate: false,
        delta_net: None,
        post_norms: false,
        out_bias: false,
        sinks: false,
        ffn_norm: "ffn_norm",
        ffn: Ffn::Gated,
        tied_output: false,
        token_embd: DType::Q8_0,
        llama3_rope: None,
        vocab_size_key: false,
        keys: Vec::new(),
        gemma4: None,
        encoder: None,
    }
}

fn head_width_keys(head_dim: usize) -> [(&'static str, Value); 2] {
    let w = Value::U32(head_dim as u32);
    [
        ("attention.key_length", w.clone()),
        ("attention.value_length", w),
    ]
}

/// Gemma 3 as converted from a 4B-style config: 8 layers so that llama.cpp's default pattern
/// (every 6th layer global) gives local layers 0-4 and 6-7 around the global layer 5; a window
/// of 8 tokens; one key/value head 32 wide (128-wide queries in a 64-wide model); linear rope
/// scaling by 8, which llama.cpp applies to the global layers only; a local rope base that is
/// not llama.cpp's default (10000), so a reader that ignores the key is caught; and the final
/// logits soft-capped at 4 (Gemma 2's mechanism, which llama.cpp's Gemma 3 graph honours too),
/// low enough to reshape logits of this model's size.
fn gemma3() -> Spec {
    let mut keys = head_width_keys(32).to_vec();
    keys.extend([
        ("attention.sliding_window", Value::U32(8)),
        ("rope.freq_base_swa", Value::F32(20_000.0)),
        ("rope.scaling.type", Value::String("linear".into())),
        ("rope.scaling.factor", Value::F32(8.0)),
        ("final_logit_softcapping", Value::F32(4.0)),
    ]);
    Spec {
        n_layer: 8,
        n_head_kv: 1,
        head_dim: 32,
        qk_norm: true,
        post_norms: true,
        tied_output: true,
        keys,
        ..base()
    }
}

/// Qwen2.5-0.5B style: biases on q, k and v, tied F16 embeddings.
fn qwen2() -> Spec {
    Spec {
        attention: Attention::Separate { bias: true },
        tied_output: true,
        token_embd: DType::F16,
        ..base()
    }
}

/// Qwen3 style: q/k norms, heads 32 wide (`key_length`; 128-wide queries), a separate output.
fn qwen3() -> Spec {
    Spec {
        n_layer: 3,
        head_dim: 32,
        n_ctx_train: 40960,
        qk_norm: true,
        keys: head_width_keys(32).to_vec(),
        ..base()
    }
}

/// Llama 3.1 style: rope base 500000 and the llama3 frequency scaling, with an original
/// context of 64 (not 8192) so that the scaling changes most frequencies of a 16-wide head;
/// F16 embeddings and a separate Q8_0 output.
fn llama3() -> Spec {
    Spec {
        n_ff: 224,
        n_ctx_train: 131072,
        rms_eps: 1e-5,
        rope_freq_base: 500_000.0,
        token_embd: DType::F16,
        llama3_rope: Some(Llama3Rope {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_context: 64,
        }),
        vocab_size_key: true,
        keys: vec![("rope.dimension_count", Value::U32(16))],
        ..base()
    }
}

/// Phi-3 mini 4k style: fused projections, as many key/value heads as query heads, rope base
/// 10000, and the sliding window of 2047 that the converter writes (llama.cpp ignores it for
/// `phi3`, with a warning).
fn phi3() -> Spec {
    Spec {
        n_head_kv: 4,
        n_ctx_train: 4096,
        rms_eps: 1e-5,
        rope_freq_base: 10_000.0,
        attention: Attention::Fused,
        ffn: Ffn::FusedGateUp,
        keys: vec![
            ("rope.scaling.original_context_length", Value::U32(4096)),
            ("rope.dimension_count", Value::U32(16)),
            ("attention.sliding_window", Value::U32(2047)),
        ],
        ..base()
    }
}

/// Mistral 7B v0.2 style, as llama.cpp's converter writes it (architecture `llama`): 128 wide,
/// 8 query heads sharing 2 key/value heads, rope base 1e6, the LLaMA SentencePiece vocabulary.
fn mistral() -> Spec {
    Spec {
        n_layer: 3,
        n_embd: 128,
        n_head: 8,
        n_ff: 448,
        rms_eps: 1e-5,
        vocab_size_key: true,
        keys: vec![("rope.dimension_count", Value::U32(16))],
        ..base()
    }
}

/// Qwen3-30B-A3B style: q/k norms, heads 128 wide (512-wide queries in a 256-wide model), a
/// dense width (`feed_forward_length`) the graph must not use, 8 experts 256 wide of which 3
/// run per token, Q4_K gate/up and Q6_K down experts (as in a Q4_K_M file), tied embeddings.
/// A 40-token prompt routes more than 8 rows to some experts, where ggml's CPU switches to its
/// tiled K-quant kernel.
fn qwen3moe() -> Spec {
    Spec {
        n_layer: 3,
        n_embd: 256,
        head_dim: 128,
        n_ff: 768,
        n_ctx_train: 40960,
        qk_norm: true,
        ffn: Ffn::Experts(Experts {
            n_expert: 8,
            n_expert_used: 3,
            n_ff_exp: 256,
            width_key: true,
            gate_up: DType::Q4_K,
            down: DType::Q6_K,
            biases: false,
            shared_ff: None,
        }),
        tied_output: true,
        keys: head_width_keys(128).to_vec(),
        ..base()
    }
}

/// Mixtral style, as llama.cpp's converter writes it (architecture `llama`): 128 wide, 8 query
/// heads sharing 2 key/value heads, 8 experts 256 wide (`feed_forward_length`) of which 2 run
/// per token, Q4_0 gate/up and Q8_0 down experts, rope base 1e6.
fn mixtral() -> Spec {
    Spec {
        n_layer: 3,
        n_embd: 128,
        n_head: 8,
        n_ff: 256,
        rms_eps: 1e-5,
        ffn: Ffn::Experts(Experts {
            n_expert: 8,
            n_expert_used: 2,
            n_ff_exp: 256,
            width_key: false,
            gate_up: DType::Q4_0,
            down: DType::Q8_0,
            biases: false,
            shared_ff: None,
        }),
        vocab_size_key: true,
        keys: vec![("rope.dimension_count", Value::U32(16))],
        ..base()
    }
}

/// gpt-oss-20b style: 128 wide, 8 query heads of 64 sharing 2 key/value heads (512-wide
/// queries, `key_length`), q/k/v and output biases, one sink per head, 4 layers alternating
/// local (window 8) and global, NeoX RoPE with YaRN (factor 32 over an original context of
/// 4096, base 150000), 8 MXFP4 experts 128 wide with biases of which 4 run per token, a
/// separate output.
fn gpt_oss() -> Spec {
    let mut keys = head_width_keys(64).to_vec();
    keys.extend([
        ("attention.sliding_window", Value::U32(8)),
        ("rope.scaling.type", Value::String("yarn".into())),
        ("rope.scaling.factor", Value::F32(32.0)),
        ("rope.scaling.original_context_length", Value::U32(4096)),
    ]);
    Spec {
        n_layer: 4,
        n_embd: 128,
        n_head: 8,
        head_dim: 64,
        n_ff: 128,
        n_ctx_train: 131_072,
        rms_eps: 1e-5,
        rope_freq_base: 150_000.0,
        attention: Attention::Separate { bias: true },
        out_bias: true,
        sinks: true,
        ffn_norm: "post_attention_norm",
        ffn: Ffn::Experts(Experts {
            n_expert: 8,
            n_expert_used: 4,
            n_ff_exp: 128,
            width_key: true,
            gate_up: DType::MXFP4,
            down: DType::MXFP4,
            biases: true,
            shared_ff: None,
        }),
        keys,
        ..base()
    }
}

/// Qwen3.5's rope: `rope.dimension_count` rotated dimensions of each head (a quarter, as the
/// real models' 64 of 256) whose frequency pairs are split into interleaved M-RoPE sections
/// as `[11, 11, 10, 0]` splits the real models' 32 pairs.
pub(crate) fn qwen35_rope(n_rot: u32, sections: [i32; 4]) -> [(&'static str, Value); 2] {
    let sections = sections.iter().map(|&s| Value::I32(s)).collect();
    [
        ("rope.dimension_count", Value::U32(n_rot)),
        ("rope.dimension_sections", Value::Array(sections)),
    ]
}

/// What both Qwen3.5 test models share: 8 layers of heads `head_dim` wide with their gates
/// and q/k norms, `n_rot` rotated dimensions in `sections`, the delta nets `delta_net`, the
/// FFN after `post_attention_norm`, rope base 1e7, context 262144.
fn qwen35_family(head_dim: usize, n_rot: u32, sections: [i32; 4], delta_net: DeltaNet) -> Spec {
    let mut keys = head_width_keys(head_dim).to_vec();
    keys.extend(qwen35_rope(n_rot, sections));
    Spec {
        n_layer: 8,
        head_dim,
        n_ctx_train: 262_144,
        rope_freq_base: 10_000_000.0,
        qk_norm: true,
        query_gate: true,
        delta_net: Some(delta_net),
        ffn_norm: "post_attention_norm",
        keys,
        ..base()
    }
}

/// Qwen3.5-9B style, 64 wide: 8 layers of which 3 and 7 are full attention (4 query heads of
/// 64 with their gates, 2 key/value heads, q/k norms, 16 rotated dimensions in sections
/// `[3, 3, 2, 0]`) and the others delta nets (2 key heads and 4 value heads of 32, a 4-tap
/// convolution; the file lists the recurrent layers besides the interval), a dense FFN
/// after `post_attention_norm`, a separate output, rope base 1e7.
fn qwen35() -> Spec {
    let delta_net = DeltaNet {
        conv_kernel: 4,
        head_dim: 32,
        n_k_heads: 2,
        n_v_heads: 4,
        full_attention_interval: 4,
        recurrent_layers_key: true,
    };
    qwen35_family(64, 16, [3, 3, 2, 0], delta_net)
}

/// Qwen3.5-35B-A3B style, 128 wide: 8 layers of which 3 and 7 are full attention (4 query
/// heads of 128 with their gates sharing one key/value head, q/k norms, 32 rotated
/// dimensions in sections `[6, 5, 5, 0]`) and the others delta nets (2 key heads and 6
/// value heads of 64, three value heads per key head as in Qwen3.5-27B; the interval only,
/// as older converters write it); 8 experts 128 wide of which 2 run per token and a shared
/// expert 192 wide behind its sigmoid gate, all Q8_0 (a Q8_0 file); a dense width
/// (`feed_forward_length`) no tensor uses; tied embeddings.
fn qwen35moe() -> Spec {
    let delta_net = DeltaNet {
        conv_kernel: 4,
        head_dim: 64,
        n_k_heads: 2,
        n_v_heads: 6,
        full_attention_interval: 4,
        recurrent_layers_key: false,
    };
    Spec {
        n_embd: 128,
        n_head_kv: 1,
        n_ff: 512,
        ffn: Ffn::Experts(Experts {
            n_expert: 8,
            n_expert_used: 2,
            n_ff_exp: 128,
            width_key: true,
            gate_up: DType::Q8_0,
            down: DType::Q8_0,
            biases: false,
            shared_ff: Some(192),
        }),
        tied_output: true,
        ..qwen35_family(128, 32, [6, 5, 5, 0], delta_net)
    }
}

/// The `gemma4.*` keys of `spec` beyond the common ones, in the order of llama.cpp's converter
/// (`Gemma4Model.set_gguf_parameters` after Gemma 3's): the local rope base, the global head
/// width, the soft cap and the window, the layer structure, the local head width, the
/// per-layer FFN widths and key/value heads where they vary (in place of the scalars, as
/// the converter writes them again; arrays of i32, as it writes Python ints), and the rotated
/// widths: the whole global head (`rope_freqs` holds its unrotated pairs) and local head.
pub(crate) fn gemma4_keys(
    spec: &Spec,
    g: &Gemma4,
    rope_base_local: f32,
    softcap: f32,
) -> Vec<(&'static str, Value)> {
    let u32_of = |n: usize| Value::U32(n as u32);
    let layers: Vec<Gemma4Layer> = (0..spec.n_layer).map(|il| g.layer(spec, il)).collect();
    let per_layer = |f: fn(&Gemma4Layer) -> usize| {
        Value::Array(layers.iter().map(|l| Value::I32(f(l) as i32)).collect())
    };
    let mut keys = vec![
        ("rope.freq_base_swa", Value::F32(rope_base_local)),
        ("attention.key_length", u32_of(spec.head_dim)),
        ("attention.value_length", u32_of(spec.head_dim)),
        ("final_logit_softcapping", Value::F32(softcap)),
        ("attention.sliding_window", Value::U32(GEMMA4_WINDOW)),
        ("attention.shared_kv_layers", u32_of(g.shared_kv_layers)),
        (
            "embedding_length_per_layer_input",
            u32_of(g.n_embd_per_layer),
        ),
        (
            "attention.sliding_window_pattern",
            Value::Array(layers.iter().map(|l| Value::Bool(l.local)).collect()),
        ),
        ("attention.key_length_swa", u32_of(g.head_dim_local)),
        ("attention.value_length_swa", u32_of(g.head_dim_local)),
    ];
    if g.shared_kv_layers > 0 {
        keys.push(("feed_forward_length", per_layer(|l| l.n_ff)));
    }
    if g.n_head_kv_global != spec.n_head_kv {
        keys.push(("attention.head_count_kv", per_layer(|l| l.n_head_kv)));
    }
    keys.extend([
        ("rope.dimension_count", u32_of(spec.head_dim)),
        ("rope.dimension_count_swa", u32_of(g.head_dim_local)),
    ]);
    keys
}

/// The sliding window of both Gemma 4 models: 8 tokens, so that most prompts outgrow it.
const GEMMA4_WINDOW: u32 = 8;

/// Gemma 4 E2B style, 128 wide: 8 layers of which 3 and 7 are global (4 query heads of 64
/// sharing 2 key/value heads, a quarter of the pairs rotated, rope base 1e6) and the others
/// local (heads of 32, base 10000, a window of 8); layers 4-7 read the caches of layers 2
/// (local) and 3 (global) and have FFNs 384 wide instead of 192; per-layer token embeddings
/// 16 wide (their table Q8_0 as `token_embd`: 8 layers of 16 make whole blocks; the
/// 16-wide rows of `proj` are F16, llama-quantize's fallback); every layer's output scaled;
/// tied embeddings; the logits soft-capped at 10 (real models: 30), low enough to reshape the
/// largest logits of this model.
fn gemma4() -> Spec {
    let g = Gemma4 {
        global_every: 4,
        head_dim_local: 32,
        n_head_kv_global: 2,
        global_values_are_keys: false,
        shared_kv_layers: 4,
        n_embd_per_layer: 16,
        global_rotary_share: 0.25,
    };
    let spec = Spec {
        n_layer: 8,
        n_embd: 128,
        head_dim: 64,
        n_ff: 192,
        n_ctx_train: 131_072,
        qk_norm: true,
        post_norms: true,
        tied_output: true,
        ..base()
    };
    Spec {
        keys: gemma4_keys(&spec, &g, 10_000.0, 10.0),
        gemma4: Some(g),
        ..spec
    }
}

/// bge-small style BERT: 3 blocks 64 wide of 4 heads of 16 (no grouping), an FFN 128 wide,
/// 512 positions, layer norms with BERT's epsilon 1e-12, F16 token embeddings and Q8_0
/// matrices, two token types (the bge vocabulary's count); not causal, CLS pooling.
fn bert() -> Spec {
    Spec {
        n_layer: 3,
        n_head_kv: 4,
        n_ctx_train: 512,
        rms_eps: 1e-12,
        attention: Attention::Separate { bias: true },
        out_bias: true,
        token_embd: DType::F16,
        keys: vec![
            ("attention.layer_norm_epsilon", Value::F32(1e-12)),
            ("attention.causal", Value::Bool(false)),
            ("pooling_type", Value::U32(2)),
        ],
        encoder: Some(2),
        ..base()
    }
}

/// Gemma 4 26B-A4B style, 256 wide: 6 layers of which 2 and 5 are global (4 query heads of 64
/// sharing one key/value head, which is also the value: no `attn_v`) and the others local
/// (heads of 32, 2 key/value heads); the dense FFN (256 wide) beside 8 experts 128 wide of
/// which 2 run per token, routed from the scaled norm of the layer's input, each expert's
/// output scaled; Q4_K gate/up experts and Q8_0 down experts (a Q4_K_M file's fallback for
/// rows of 128, as the real model's 704), a Q8_0 tied embedding (Q6_K, as in real Q4_K_M
/// files, takes ggml's reference quantizer seconds at this size); a local rope base of 20000
/// rather than the real 10000, so a reader that ignores the key is caught; the logits
/// soft-capped at 30, as in the real models (the largest, near 13, lose about 1), so this
/// file and `gemma4`'s test two caps.
fn gemma4moe() -> Spec {
    let g = Gemma4 {
        global_every: 3,
        head_dim_local: 32,
        n_head_kv_global: 1,
        global_values_are_keys: true,
        shared_kv_layers: 0,
        n_embd_per_layer: 0,
        global_rotary_share: 0.25,
    };
    let spec = Spec {
        n_layer: 6,
        n_embd: 256,
        head_dim: 64,
        n_ff: 256,
        n_ctx_train: 262_144,
        qk_norm: true,
        post_norms: true,
        ffn: Ffn::Experts(Experts {
            n_expert: 8,
            n_expert_used: 2,
            n_ff_exp: 128,
            width_key: true,
            gate_up: DType::Q4_K,
            down: DType::Q8_0,
            biases: false,
            shared_ff: None,
        }),
        tied_output: true,
        ..base()
    };
    Spec {
        keys: gemma4_keys(&spec, &g, 20_000.0, 30.0),
        gemma4: Some(g),
        ..spec
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_errors() {
        for arch in Arch::ALL {
            assert_eq!(arch.name().parse::<Arch>(), Ok(arch));
        }
        assert_eq!("llama".parse::<Arch>(), Ok(Arch::Llama3));
        let err = "gpt5".parse::<Arch>().unwrap_err();
        assert!(err.to_string().contains("gemma3, qwen2"), "{err}");
    }

    #[test]
    fn every_matrix_row_is_a_whole_number_of_q8_0_blocks() {
        for arch in Arch::ALL {
            let s = arch.spec();
            for width in [s.n_embd, s.n_ff, s.n_head * s.head_dim] {
                assert_eq!(width % 32, 0, "{arch}: {width}");
            }
            assert_eq!(s.n_head % s.n_head_kv, 0, "{arch}");
        }
    }

    fn gemma4_layers(arch: Arch) -> (Spec, Vec<Gemma4Layer>) {
        let spec = arch.spec();
        let g = spec.gemma4.expect("gemma4");
        let layers = (0..spec.n_layer).map(|il| g.layer(&spec, il)).collect();
        (spec, layers)
    }

    /// llama.cpp's cache reuse: a shared layer reads layer `n_kv - 2` if it is local, else
    /// `n_kv - 1`, so those must be a local layer and a global one.
    #[test]
    fn gemma4_shared_layers_read_a_local_then_a_global_cache() {
        for arch in [Arch::Gemma4, Arch::Gemma4Moe] {
            let (spec, layers) = gemma4_layers(arch);
            let n_kv = layers.iter().filter(|l| l.own_kv).count();
            assert!(layers[..n_kv].iter().all(|l| l.own_kv), "{arch}");
            let shared = spec.n_layer - n_kv;
            if shared > 0 {
                assert!(layers[n_kv - 2].local && !layers[n_kv - 1].local, "{arch}");
                assert!(layers[n_kv..].iter().any(|l| l.local), "{arch}");
                assert!(layers[n_kv..].iter().any(|l| !l.local), "{arch}");
            }
        }
    }

    #[test]
    fn gemma4_layers_have_their_type_s_widths() {
        let (_, layers) = gemma4_layers(Arch::Gemma4);
        let local: Vec<bool> = layers.iter().map(|l| l.local).collect();
        assert_eq!(local, [true, true, true, false, true, true, true, false]);
        let n_ff: Vec<usize> = layers.iter().map(|l| l.n_ff).collect();
        assert_eq!(n_ff, [192, 192, 192, 192, 384, 384, 384, 384]);
        assert_eq!((layers[2].head_dim, layers[3].head_dim), (32, 64));
        assert!(layers
            .iter()
            .all(|l| l.n_head_kv == 2 && !l.values_are_keys));

        let (_, layers) = gemma4_layers(Arch::Gemma4Moe);
        let kv: Vec<usize> = layers.iter().map(|l| l.n_head_kv).collect();
        assert_eq!(kv, [2, 2, 1, 2, 2, 1]);
        let k_is_v: Vec<bool> = layers.iter().map(|l| l.values_are_keys).collect();
        assert_eq!(k_is_v, [false, false, true, false, false, true]);
        assert!(layers.iter().all(|l| l.own_kv && l.n_ff == 256));
    }

    /// The converter's "proportional" rope: a quarter of the 32 pairs of a 64-wide head
    /// rotated, the rest divided by 1e30.
    #[test]
    fn gemma4_rope_factors_hold_three_quarters_of_the_pairs_still() {
        let g = Arch::Gemma4.spec().gemma4.expect("gemma4");
        let f = g.rope_factors(64);
        assert_eq!(f.len(), 32);
        assert!(f[..8].iter().all(|&x| x == 1.0), "{f:?}");
        assert!(f[8..].iter().all(|&x| x == 1e30), "{f:?}");
    }
}
