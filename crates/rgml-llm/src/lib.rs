//! rgml-llm: the language-model layer of rgml. It turns GGUF metadata into a working tokenizer
//! ([`tokenizer`]); model graphs will live beside it.
#![warn(missing_docs)]

pub mod error;
pub mod tokenizer;

pub use error::{LlmError, Result};
