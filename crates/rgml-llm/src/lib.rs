//! LLaMA-family models on rgml: GGUF loading, the transformer graph, KV cache, tokenizer,
//! sampling, generation and chat formatting; and [`quantize`], llama-quantize's conversion of a
//! model file to another quantization preset.
//!
//! A program loads a [`Model`] once, shares it with [`Arc`](std::sync::Arc), and runs one
//! [`Session`] (KV cache and backends) per sequence; [`Session::generate`] is the generation
//! loop (prompt, sampling, stop at end-of-generation, `max_tokens` or the context end). This
//! sketch is the one in the repository's README (a test keeps the two the same):
//!
//! ```no_run
//! use rgml_llm::{EncodeOptions, Model, Sampler, SamplerParams, Session, SessionOptions};
//! use std::sync::Arc;
//!
//! fn greedy(path: &std::path::Path, prompt: &str) -> rgml_llm::Result<String> {
//!     rgml_cpu::register(); // the backends this program links
//!     let model = Arc::new(Model::load(path, Default::default())?);
//!     let mut session = Session::new(model.clone(), &SessionOptions::default())?;
//!     let prompt = model.tokenizer.encode(prompt, EncodeOptions::prompt());
//!     let mut sampler = Sampler::new(SamplerParams::greedy());
//!     let mut pieces = model.tokenizer.decoder(false); // streaming detokenizer
//!     let mut text = String::new();
//!     for token in session.generate(&prompt, &mut sampler, 32)? {
//!         text += &pieces.push(token?)?;
//!     }
//!     text += &pieces.finish();
//!     Ok(text)
//! }
//! ```
//!
//! # Threads
//!
//! - [`Model`]: `Send + Sync`, read-only after loading; share it with `Arc<Model>`. Sessions
//!   on one model compute at the same time (they only read the weights).
//! - [`Session`]: `Send`, not `Sync`: it can be stored anywhere (no lifetime) and moved to
//!   another thread, and one thread at a time drives it.
//! - [`Tokenizer`]: `Send + Sync` (part of the model).
//! - [`Sampler`]: `Send`, one per sequence.
//!
//! `tests/api.rs` asserts these bounds at compile time.
#![warn(missing_docs)]

mod arch;
pub mod chat;
pub mod chat_template;
pub mod config;
pub mod constraint;
pub mod embed;
pub mod error;
pub mod generate;
pub mod grammar;
pub mod harmony;
pub mod json_answer;
mod markers;
mod message;
pub mod model;
pub mod quantize;
pub mod reasoning;
pub mod sampling;
pub mod session;
pub mod tensor_split;
pub mod tokenizer;
pub mod tool_calls;

pub use config::{
    Arch, FfnActivation, LayerHeads, ModelConfig, MoeConfig, RecurrentConfig, SlidingWindow,
};
pub use constraint::Constraint;
pub use error::{LlmError, MemoryUse, Result};
pub use generate::{Generation, StopReason};
pub use model::{LoadOptions, Model, Placement, TensorOverride};
pub use quantize::{QuantPreset, QuantizeError, QuantizeOptions};
pub use sampling::{Sampler, SamplerParams};
pub use session::{flash_attn_probe, FlashAttn, Logits, Session, SessionOptions, CACHE_TYPES};
pub use tensor_split::TensorSync;
pub use tokenizer::{EncodeOptions, TokenId, Tokenizer};
