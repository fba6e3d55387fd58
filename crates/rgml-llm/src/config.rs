//! Model hyper-parameters: what a graph is built from.
//!
//! This module owns the [`ModelConfig`] type and the architecture names rgml runs ([`Arch`]);
//! reading them from GGUF metadata, and checking them, is each architecture's business
//! (`crate::arch`). It touches no tensors.

use rgml::RopeMode;

/// The architectures rgml builds graphs for (`general.architecture`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// LLaMA and the files that reuse its graph: `llama`, `mistral`, `smollm`.
    Llama,
    /// Qwen2 / Qwen2.5: LLaMA with q/k/v biases and NeoX RoPE.
    Qwen2,
    /// Qwen3: LLaMA with QK-norm (no biases), NeoX RoPE, heads as wide as `key_length`.
    Qwen3,
    /// Phi-3: LLaMA with Q/K/V fused in one projection and gate/up in another, NeoX RoPE.
    Phi3,
    /// Gemma 3: QK-norm, norms after attention and FFN, GELU, interleaved sliding-window layers.
    Gemma3,
    /// Qwen3 MoE (`qwen3moe`, Qwen3-30B-A3B): Qwen3's attention, a mixture of experts as
    /// every block's FFN.
    Qwen3Moe,
    /// gpt-oss (`gpt-oss`, llama.cpp's `LLM_ARCH_OPENAI_MOE`): attention with biases and
    /// per-head sinks, alternating sliding-window layers, YaRN, and experts with biases, a
    /// softmax over the chosen experts' logits and the clamped SwiGLU variant.
    GptOss,
    /// Qwen3.5 (`qwen35`): gated delta-net (linear attention) layers with a recurrent state,
    /// and every few layers full attention with a gated query, QK-norm and multi-section RoPE;
    /// dense SwiGLU FFNs.
    Qwen35,
    /// Qwen3.5 MoE (`qwen35moe`): Qwen3.5's layers with a mixture of experts and a gated
    /// shared expert as every block's FFN.
    Qwen35Moe,
    /// Gemma 4 (`gemma4`): Gemma 3's block with local and global layers of different head
    /// widths, unweighted-norm values (or the keys as values), proportional RoPE on the global
    /// layers, last layers that attend over earlier layers' KV caches, per-layer token
    /// embeddings, a scale on each block's output, and (MoE files) experts beside a dense FFN.
    Gemma4,
    /// BERT (`bert`): an encoder for embeddings. Learned absolute position embeddings and a
    /// token-type row added to the token embeddings, bidirectional attention, post-norm blocks
    /// of layer norms with biases, an ungated GELU FFN; no output head.
    Bert,
}

impl Arch {
    /// Every `general.architecture` value accepted, with its architecture.
    pub const NAMES: [(&'static str, Arch); 13] = [
        ("llama", Arch::Llama),
        ("mistral", Arch::Llama),
        ("smollm", Arch::Llama),
        ("qwen2", Arch::Qwen2),
        ("qwen3", Arch::Qwen3),
        ("phi3", Arch::Phi3),
        ("gemma3", Arch::Gemma3),
        ("qwen3moe", Arch::Qwen3Moe),
        ("gpt-oss", Arch::GptOss),
        ("qwen35", Arch::Qwen35),
        ("qwen35moe", Arch::Qwen35Moe),
        ("gemma4", Arch::Gemma4),
        ("bert", Arch::Bert),
    ];

    /// Whether the graph divides RoPE frequencies by `rope_freqs.weight` when the file has it
    /// (LLaMA: Llama 3.1's scaling; Gemma 4: its global layers' proportional RoPE; as
    /// llama.cpp).
    pub fn has_rope_freqs(self) -> bool {
        matches!(self, Arch::Llama | Arch::Gemma4)
    }

    /// Whether the graph takes LongRoPE's `rope_factors_long/short.weight` when the file has
    /// them (Phi-3, as llama.cpp).
    pub fn has_longrope_factors(self) -> bool {
        self == Arch::Phi3
    }

    /// Whether the model is an encoder: it computes embeddings only, with no output head.
    pub fn is_encoder(self) -> bool {
        self == Arch::Bert
    }

    /// Whether the output projection has a bias when the file has `output.bias` (Qwen2).
    pub fn has_output_bias(self) -> bool {
        self == Arch::Qwen2
    }

    /// The architecture a file's `general.architecture` names, if rgml runs it.
    pub fn from_name(name: &str) -> Option<Arch> {
        Self::NAMES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, a)| a)
    }
}

/// The activation of a gated feed-forward block: `act(gate) * up`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FfnActivation {
    /// SiLU (SwiGLU).
    Silu,
    /// GELU, tanh approximation (GeGLU).
    Gelu,
    /// gpt-oss's clamped SwiGLU (ggml's SWIGLU_OAI with llama.cpp's α = 1.702, limit 7).
    SwigluOai,
}

/// How the router's logits become the chosen experts' weights (llama.cpp's
/// `llama_expert_gating_func_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertGating {
    /// Softmax over every expert, then the chosen ones' probabilities.
    Softmax,
    /// The chosen experts' logits, then their softmax (gpt-oss).
    SoftmaxWeight,
}

/// Sliding-window (local) attention on some layers: each position attends to the `window` last
/// positions (itself included), and those layers rotate with their own RoPE base and scale.
#[derive(Clone, Debug, PartialEq)]
pub struct SlidingWindow {
    /// Positions a local layer sees.
    pub window: usize,
    /// Per layer: whether it is local.
    pub layers: Vec<bool>,
    /// RoPE θ base of the local layers.
    pub rope_freq_base: f32,
    /// RoPE position scale of the local layers.
    pub rope_freq_scale: f32,
    /// Whether the local layers divide their RoPE frequencies by the model's factors
    /// (`rope_freqs.weight`, LongRoPE's) as the global ones do (Gemma 4's local layers do not).
    pub rope_factors: bool,
}

/// The attention shape of one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerHeads {
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_head_kv: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Rotated dimensions per head.
    pub n_rot: usize,
}

impl LayerHeads {
    /// Width of the key/value projections.
    pub fn n_embd_kv(&self) -> usize {
        self.head_dim * self.n_head_kv
    }

    /// Width of the query projection.
    pub fn n_embd_q(&self) -> usize {
        self.head_dim * self.n_head
    }
}

/// A mixture-of-experts FFN (llama.cpp's `build_moe_ffn` with softmax gating): a router
/// scores every expert per token, the `n_expert_used` best run, and their outputs are summed
/// weighted by their softmax probabilities (renormalised over the chosen ones where
/// `norm_weights`).
#[derive(Clone, Debug, PartialEq)]
pub struct MoeConfig {
    /// Experts per block (`expert_count`).
    pub n_expert: usize,
    /// Experts each token runs (`expert_used_count`).
    pub n_expert_used: usize,
    /// Hidden width of one expert (`expert_feed_forward_length`, else as the family says).
    pub n_ff_exp: usize,
    /// Divide the chosen experts' probabilities by their sum.
    pub norm_weights: bool,
    /// From router logits to expert weights.
    pub gating: ExpertGating,
    /// Hidden width of the shared expert, where the blocks have one
    /// (`expert_shared_feed_forward_length`, else the dense FFN's).
    pub n_ff_shexp: usize,
}

/// The gated delta-net layers of a hybrid model (llama.cpp's `ssm_*` hyper-parameters of
/// Qwen3.5): per sequence, each such layer keeps a convolution state (the last
/// `d_conv - 1` inputs of its short convolution) and a recurrent state (`n_v_heads` matrices of
/// `head_dim × head_dim`) instead of a KV cache.
#[derive(Clone, Debug, PartialEq)]
pub struct RecurrentConfig {
    /// Per layer: whether it is a delta-net layer (else full attention).
    pub layers: Vec<bool>,
    /// Taps of the short convolution (`ssm.conv_kernel`).
    pub d_conv: usize,
    /// Width of one key and value head (`ssm.state_size`).
    pub head_dim: usize,
    /// Key heads (`ssm.group_count`).
    pub n_k_heads: usize,
    /// Value heads (`ssm.time_step_rank`), a multiple of the key heads.
    pub n_v_heads: usize,
}

impl RecurrentConfig {
    /// Width of the keys (and of the queries): `head_dim × n_k_heads`.
    pub fn key_dim(&self) -> usize {
        self.head_dim * self.n_k_heads
    }

    /// Width of the values (`ssm.inner_size`): `head_dim × n_v_heads`.
    pub fn value_dim(&self) -> usize {
        self.head_dim * self.n_v_heads
    }

    /// Channels of the short convolution: queries, keys and values.
    pub fn conv_channels(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    /// Floats of one sequence's convolution state (llama.cpp's `n_embd_r`).
    pub fn conv_state_len(&self) -> usize {
        (self.d_conv - 1) * self.conv_channels()
    }

    /// Floats of one sequence's recurrent state (llama.cpp's `n_embd_s`).
    pub fn ssm_state_len(&self) -> usize {
        self.head_dim * self.head_dim * self.n_v_heads
    }
}

/// Hyper-parameters of a model.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// `general.architecture`.
    pub arch: String,
    /// The graph family [`arch`](Self::arch) names.
    pub kind: Arch,
    /// Transformer blocks.
    pub n_layer: usize,
    /// Embedding width.
    pub n_embd: usize,
    /// Feed-forward width of a dense FFN (0 where a mixture-of-experts model has none).
    pub n_ff: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (grouped-query attention when below `n_head`).
    pub n_head_kv: usize,
    /// Width of one head (`attention.key_length`, else `n_embd / n_head`).
    pub head_dim: usize,
    /// Rotated dimensions per head.
    pub n_rot: usize,
    /// Training context length.
    pub n_ctx_train: usize,
    /// The context the model was trained for before any RoPE scaling
    /// (`rope.scaling.original_context_length`, else `n_ctx_train`): LongRoPE's long factors
    /// apply beyond it.
    pub n_ctx_orig: usize,
    /// Vocabulary size.
    pub n_vocab: usize,
    /// RMS norm epsilon.
    pub rms_eps: f32,
    /// RoPE θ base (of the global layers where some are local).
    pub rope_freq_base: f32,
    /// RoPE position scale (1 / linear scaling factor).
    pub rope_freq_scale: f32,
    /// RoPE's magnitude factor on the rotated values: `rope.scaling.attn_factor` (LongRoPE
    /// files set it) times, with YaRN, llama.cpp's magnitude correction.
    pub rope_attn_factor: f32,
    /// YaRN's extrapolation mix (1 with `rope.scaling.type = yarn`, else 0: llama.cpp's
    /// default `yarn_ext_factor`).
    pub rope_ext_factor: f32,
    /// Pair layout of RoPE: LLaMA GGUF files use `Normal`, Qwen and Gemma `Neox`.
    pub rope_mode: RopeMode,
    /// Local attention layers, if any.
    pub sliding_window: Option<SlidingWindow>,
    /// Factor on the token embeddings (Gemma: √n_embd).
    pub embd_scale: Option<f32>,
    /// Factor on Q·K before the softmax.
    pub attn_scale: f32,
    /// Apply [`attn_scale`](Self::attn_scale) to Q before the product (Gemma), not to the
    /// product: the same in exact arithmetic, a different rounding.
    pub attn_scale_on_q: bool,
    /// Activation of the gated FFN.
    pub ffn_activation: FfnActivation,
    /// Soft-capping of the logits: `cap * tanh(logits / cap)`.
    pub final_logit_softcap: Option<f32>,
    /// The blocks' FFN is a mixture of experts.
    pub moe: Option<MoeConfig>,
    /// The query projection also gives a gate per query value (twice as wide, each head's
    /// query then its gate), and the attention output is multiplied by its sigmoid before
    /// the output projection (Qwen3.5).
    pub attn_output_gate: bool,
    /// The delta-net layers of a hybrid model.
    pub recurrent: Option<RecurrentConfig>,
    /// Blocks after the last one that only multi-token prediction (speculative drafting)
    /// reads (`nextn_predict_layers`, counted in `block_count`): their tensors are accepted
    /// and never read, as llama.cpp skips them unless asked to load them.
    pub n_layer_nextn: usize,
    /// How the file says its embeddings pool (`{arch}.pooling_type`; `None`: not said, or
    /// none/rank).
    pub pooling: Option<crate::embed::Pooling>,
    /// The last block runs on every row and the output rows are picked after the final norm
    /// (Qwen3.5, Gemma 4, as llama.cpp's graphs do), instead of before the last block's FFN.
    pub output_rows_after_norm: bool,
    /// Per layer, its attention's shape, where the layers differ (`attention.head_count(_kv)`
    /// arrays, Gemma 4's local head width); `None`: every layer has the model's.
    pub layer_heads: Option<Vec<LayerHeads>>,
    /// Per layer, its dense FFN's width, where the layers differ (a `feed_forward_length`
    /// array: Gemma 4's double-wide FFNs).
    pub layer_n_ff: Option<Vec<usize>>,
    /// The layers from this one on keep no KV cache and attend over an earlier layer's (Gemma
    /// 4's `attention.shared_kv_layers`, see [`ModelConfig::kv_layer`]); `n_layer` where every
    /// attention layer keeps its own.
    pub n_layer_kv: usize,
    /// Values are RMS-normed per head, without a weight, before they are cached (Gemma 4).
    pub value_norm: bool,
    /// Width of each token's per-layer embedding (Gemma 4's
    /// `embedding_length_per_layer_input`); 0: none.
    pub n_embd_per_layer: usize,
    /// Whether a token attends to earlier positions only (`attention.causal`, as llama.cpp
    /// true unless the file says otherwise). Without it (BERT) every token of a sequence sees
    /// every other, so a sequence is encoded in one micro-batch.
    pub causal: bool,
    /// Rows of the token-type embeddings (`tokenizer.ggml.token_type_count`, BERT); 0: none.
    pub n_token_types: usize,
}

impl ModelConfig {
    /// Width of the key/value projections (of the global layers where layers differ).
    pub fn n_embd_kv(&self) -> usize {
        self.head_dim * self.n_head_kv
    }

    /// Width of the query projection (and of the attention output's input).
    pub fn n_embd_q(&self) -> usize {
        self.head_dim * self.n_head
    }

    /// Layer `il`'s attention shape.
    pub fn heads(&self, il: usize) -> LayerHeads {
        match self.layer_heads.as_ref().and_then(|h| h.get(il)) {
            Some(&h) => h,
            None => LayerHeads {
                n_head: self.n_head,
                n_head_kv: self.n_head_kv,
                head_dim: self.head_dim,
                n_rot: self.n_rot,
            },
        }
    }

    /// Layer `il`'s dense FFN width.
    pub fn n_ff_at(&self, il: usize) -> usize {
        self.layer_n_ff
            .as_ref()
            .and_then(|f| f.get(il).copied())
            .unwrap_or(self.n_ff)
    }

    /// The layer whose KV cache layer `il` attends over: itself, or for a layer past
    /// [`n_layer_kv`](Self::n_layer_kv) the last layer with a cache of its kind (llama.cpp's
    /// reuse for Gemma 3n and 4: the layer before the last for a local layer, the last for a
    /// global one).
    pub fn kv_layer(&self, il: usize) -> usize {
        match il < self.n_layer_kv {
            true => il,
            false if self.is_local(il) => self.n_layer_kv.saturating_sub(2),
            false => self.n_layer_kv.saturating_sub(1),
        }
    }

    /// Whether every layer attends with the same shape and FFN width (what a tensor split
    /// and one rotation for the whole cache assume).
    pub fn uniform_layers(&self) -> bool {
        self.layer_heads.is_none() && self.layer_n_ff.is_none()
    }

    /// Whether Q/K/V come from one projection (`attn_qkv`) and gate/up from one (`ffn_up`).
    pub fn fused_projections(&self) -> bool {
        self.kind == Arch::Phi3
    }

    /// Whether layer `il` is a recurrent (delta-net) layer, without a KV cache.
    pub fn is_recurrent(&self, il: usize) -> bool {
        self.recurrent
            .as_ref()
            .is_some_and(|r| r.layers.get(il).copied().unwrap_or(false))
    }

    /// Whether layer `il` attends through a sliding window.
    pub fn is_local(&self, il: usize) -> bool {
        self.sliding_window
            .as_ref()
            .is_some_and(|w| w.layers.get(il).copied().unwrap_or(false))
    }
}

/// SmolLM2-135M's configuration, for tests to start from.
#[cfg(test)]
pub(crate) fn smollm_config() -> ModelConfig {
    ModelConfig {
        arch: "llama".into(),
        kind: crate::config::Arch::Llama,
        n_layer: 30,
        n_embd: 576,
        n_ff: 1536,
        n_head: 9,
        n_head_kv: 3,
        head_dim: 64,
        n_rot: 64,
        n_ctx_train: 8192,
        n_ctx_orig: 8192,
        n_vocab: 49152,
        rms_eps: 1e-5,
        rope_freq_base: 100000.0,
        rope_freq_scale: 1.0,
        rope_attn_factor: 1.0,
        rope_ext_factor: 0.0,
        rope_mode: rgml::RopeMode::Normal,
        sliding_window: None,
        embd_scale: None,
        attn_scale: 0.125,
        attn_scale_on_q: false,
        ffn_activation: crate::config::FfnActivation::Silu,
        final_logit_softcap: None,
        moe: None,
        attn_output_gate: false,
        recurrent: None,
        output_rows_after_norm: false,
        n_layer_nextn: 0,
        pooling: None,
        layer_heads: None,
        layer_n_ff: None,
        n_layer_kv: 30,
        value_norm: false,
        n_embd_per_layer: 0,
        causal: true,
        n_token_types: 0,
    }
}
