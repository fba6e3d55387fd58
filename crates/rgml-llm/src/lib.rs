//! LLaMA-family models on rgml: GGUF loading, the transformer graph, KV cache, tokenizer,
//! sampling and chat formatting.
#![warn(missing_docs)]

pub mod chat;
pub mod config;
pub mod error;
pub mod model;
pub mod sampling;
pub mod session;
pub mod tensor_split;
pub mod tokenizer;

pub use config::ModelConfig;
pub use error::{LlmError, Result};
pub use model::{LoadOptions, Model};
pub use sampling::{Sampler, SamplerParams};
pub use session::{Logits, Session, SessionOptions};
pub use tensor_split::TensorSync;
pub use tokenizer::Tokenizer;
