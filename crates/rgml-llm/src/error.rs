//! The error type of rgml-llm: what a tokenizer (and later a model) can reject in its input.

/// Result with [`LlmError`].
pub type Result<T, E = LlmError> = std::result::Result<T, E>;

/// What went wrong while building or using a tokenizer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LlmError {
    /// Tokenizer metadata that is missing, inconsistent or of a kind rgml does not support.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The GGUF file could not be read, or lacks a required key.
    #[error(transparent)]
    Gguf(#[from] rgml_gguf::GgufError),
    /// A token id outside the vocabulary (e.g. passed to decode).
    #[error("token id {id} is out of range for a vocabulary of {n_vocab} tokens")]
    InvalidToken {
        /// The offending id.
        id: u32,
        /// The vocabulary size.
        n_vocab: usize,
    },
}
