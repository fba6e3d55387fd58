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
    /// A sampling setting outside its range (see [`SamplerParams::validate`]).
    ///
    /// [`SamplerParams::validate`]: crate::SamplerParams::validate
    #[error("sampling: {name} = {value} is out of range (must be {range})")]
    InvalidSampler {
        /// The setting.
        name: &'static str,
        /// Its value.
        value: f32,
        /// What it must be.
        range: &'static str,
    },
    /// Not enough memory for what a load or session asked for; nothing was taken.
    #[error("not enough memory for the {what}: {source}")]
    OutOfMemory {
        /// What the memory was for.
        what: MemoryUse,
        /// The device's refusal ([`rgml::Error::InsufficientMemory`] or
        /// [`rgml::Error::OutOfMemory`]).
        source: rgml::Error,
    },
    /// A computation gave NaN or infinite logits (e.g. weights that hold NaN). The batch was
    /// taken back: the sequence is as before the call.
    #[error(
        "the logits are not finite (NaN or infinity){}",
        match first { Some(t) => format!("; the first non-finite tensor is {t}"), None => String::new() }
    )]
    NonFinite {
        /// The first node of the graph whose values are not finite, with its op and sources,
        /// when a second, checked computation found it.
        first: Option<String>,
    },
}

/// What memory was asked for (see [`LlmError::OutOfMemory`]); a front end uses it to say
/// which setting to lower.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MemoryUse {
    /// Copies of the weights on a device.
    Weights,
    /// A session's KV cache (grows with the context length).
    KvCache,
    /// A graph's intermediate results (grow with the micro-batch and the context).
    Compute,
}

impl std::fmt::Display for MemoryUse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            MemoryUse::Weights => "weights",
            MemoryUse::KvCache => "KV cache",
            MemoryUse::Compute => "compute buffers",
        })
    }
}

impl LlmError {
    /// `error` as an [`LlmError::OutOfMemory`] for `what` when it is a refused allocation,
    /// else unchanged.
    pub(crate) fn memory(error: rgml::Error, what: MemoryUse) -> LlmError {
        match error {
            e @ (rgml::Error::InsufficientMemory { .. } | rgml::Error::OutOfMemory { .. }) => {
                LlmError::OutOfMemory { what, source: e }
            }
            e => LlmError::Core(e),
        }
    }
}
