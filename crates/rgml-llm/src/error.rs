//! The model crate's error type.

/// Result with [`LlmError`].
pub type Result<T, E = LlmError> = std::result::Result<T, E>;

/// What can go wrong loading or running a model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LlmError {
    /// A failure in the tensor runtime (shapes, buffers, backends).
    #[error(transparent)]
    Core(#[from] rgml::Error),
    /// A malformed or unreadable GGUF file.
    #[error(transparent)]
    Gguf(#[from] rgml_gguf::GgufError),
    /// Loading a file failed.
    #[error("{path}: {source}")]
    Load {
        /// The file.
        path: String,
        /// Why.
        source: Box<LlmError>,
    },
    /// A model this crate cannot run.
    #[error("unsupported model: {0}")]
    UnsupportedModel(String),
    /// Hyper-parameters that make no sense.
    #[error("bad model configuration: {0}")]
    BadConfig(String),
    /// A weight the architecture needs is absent.
    #[error("missing tensor '{0}'")]
    MissingTensor(String),
    /// A weight with the wrong shape or dtype.
    #[error("bad tensor: {0}")]
    BadTensor(String),
    /// Tokenizer metadata or input it cannot handle.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A token id outside the vocabulary, given to a session ([`crate::Session::eval`],
    /// [`crate::Session::generate`], ...) or to the tokenizer's decode.
    #[error("token id {id} is out of range for a vocabulary of {n_vocab} tokens")]
    InvalidToken {
        /// The offending id.
        id: u32,
        /// The vocabulary size.
        n_vocab: usize,
    },
    /// Input the model cannot take that has no variant of its own (an empty batch, ...).
    #[error("bad input: {0}")]
    BadInput(String),
    /// The tokens would not fit in the rest of the session's context (its KV cache).
    #[error("context full: {needed} tokens needed, the context holds {n_ctx}")]
    ContextFull {
        /// Context length.
        n_ctx: usize,
        /// Tokens the request needs.
        needed: usize,
    },
}
