//! Model hyper-parameters read from GGUF metadata (`{arch}.*` keys).
//!
//! This module owns the mapping from GGUF keys to a [`ModelConfig`] and the checks that make
//! the numbers safe to build graphs from; it does not touch tensors.

use crate::error::{LlmError, Result};
use rgml::RopeMode;
use rgml_gguf::GgufFile;

/// Architectures that reuse the LLaMA graph.
const LLAMA_LIKE: &[&str] = &["llama", "qwen2", "mistral", "smollm"];

/// Hyper-parameters of a LLaMA-family model.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// `general.architecture`.
    pub arch: String,
    /// Transformer blocks.
    pub n_layer: usize,
    /// Embedding width.
    pub n_embd: usize,
    /// Feed-forward width.
    pub n_ff: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (grouped-query attention when below `n_head`).
    pub n_head_kv: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Rotated dimensions per head.
    pub n_rot: usize,
    /// Training context length.
    pub n_ctx_train: usize,
    /// Vocabulary size.
    pub n_vocab: usize,
    /// RMS norm epsilon.
    pub rms_eps: f32,
    /// RoPE θ base.
    pub rope_freq_base: f32,
    /// RoPE position scale (1 / linear scaling factor).
    pub rope_freq_scale: f32,
    /// Pair layout of RoPE: LLaMA GGUF files use `Normal`, Qwen2 `Neox`.
    pub rope_mode: RopeMode,
}

impl ModelConfig {
    /// Width of the key/value projections.
    pub fn n_embd_kv(&self) -> usize {
        self.head_dim * self.n_head_kv
    }

    /// Read and check the hyper-parameters.
    pub fn from_gguf(gguf: &GgufFile) -> Result<ModelConfig> {
        let arch = gguf.get_str("general.architecture")?.to_string();
        if !LLAMA_LIKE.contains(&arch.as_str()) {
            return Err(LlmError::UnsupportedModel(format!(
                "architecture '{arch}' (supported: {})",
                LLAMA_LIKE.join(", ")
            )));
        }
        let key = |k: &str| format!("{arch}.{k}");
        let usize_key = |k: &str| -> Result<usize> {
            let v = gguf.get_u64(&key(k))?;
            usize::try_from(v)
                .map_err(|_| LlmError::BadConfig(format!("{} = {v} is too large", key(k))))
        };
        let n_layer = usize_key("block_count")?;
        let n_embd = usize_key("embedding_length")?;
        let n_ff = usize_key("feed_forward_length")?;
        let n_head = usize_key("attention.head_count")?;
        let n_head_kv = match gguf.get(&key("attention.head_count_kv")) {
            Some(_) => usize_key("attention.head_count_kv")?,
            None => n_head,
        };
        let n_ctx_train = usize_key("context_length")?;
        let rms_eps = gguf.get_f32(&key("attention.layer_norm_rms_epsilon"))?;
        let rope_freq_base = match gguf.get(&key("rope.freq_base")) {
            Some(_) => gguf.get_f32(&key("rope.freq_base"))?,
            None => 10_000.0,
        };
        let rope_freq_scale = match gguf.get(&key("rope.scaling.factor")) {
            Some(_) => {
                let f = gguf.get_f32(&key("rope.scaling.factor"))?;
                if f > 0.0 {
                    1.0 / f
                } else {
                    1.0
                }
            }
            None => 1.0,
        };
        if n_head == 0 || n_embd == 0 || n_layer == 0 || n_head_kv == 0 || n_ff == 0 {
            return Err(LlmError::BadConfig(format!(
                "zero-sized model: {n_layer} layers, {n_embd} wide, {n_head}/{n_head_kv} heads, \
                 feed-forward {n_ff} wide"
            )));
        }
        if !n_embd.is_multiple_of(n_head) || !n_head.is_multiple_of(n_head_kv) {
            return Err(LlmError::BadConfig(format!(
                "{n_embd} wide with {n_head} heads and {n_head_kv} kv heads does not divide evenly"
            )));
        }
        let head_dim = n_embd / n_head;
        let n_rot = match gguf.get(&key("rope.dimension_count")) {
            Some(_) => usize_key("rope.dimension_count")?,
            None => head_dim,
        };
        if n_rot == 0 || n_rot > head_dim || !n_rot.is_multiple_of(2) {
            return Err(LlmError::BadConfig(format!(
                "rope.dimension_count {n_rot} must be even, positive and at most the head width \
                 {head_dim}"
            )));
        }
        let n_vocab = match gguf.get(&key("vocab_size")) {
            Some(_) => usize_key("vocab_size")?,
            None => gguf.get_array("tokenizer.ggml.tokens")?.len(),
        };
        if n_vocab == 0 {
            return Err(LlmError::BadConfig("an empty vocabulary".into()));
        }
        let rope_mode = if arch == "qwen2" {
            RopeMode::Neox
        } else {
            RopeMode::Normal
        };
        let sane =
            rms_eps > 0.0 && rms_eps < 1.0 && rope_freq_base > 0.0 && rope_freq_base.is_finite();
        if !sane {
            return Err(LlmError::BadConfig(format!(
                "rms epsilon {rms_eps} or rope base {rope_freq_base} out of range"
            )));
        }
        Ok(ModelConfig {
            arch,
            n_layer,
            n_embd,
            n_ff,
            n_head,
            n_head_kv,
            head_dim,
            n_rot,
            n_ctx_train,
            n_vocab,
            rms_eps,
            rope_freq_base,
            rope_freq_scale,
            rope_mode,
        })
    }
}
