//! The crate's error type: what can go wrong while making a random model (reading the
//! vocabulary file, encoding a tensor, writing the file).

use std::fmt;
use std::path::PathBuf;

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a random model could not be made.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// Reading the vocabulary file or writing the model failed.
    Gguf(rgml_gguf::GgufError),
    /// A tensor's values could not be encoded in its type.
    Encode(rgml::Error),
    /// The vocabulary file has no usable `tokenizer.ggml.tokens`.
    NoVocabulary {
        /// The file.
        path: PathBuf,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Gguf(e) => write!(f, "{e}"),
            Error::Encode(e) => write!(f, "encoding a tensor: {e}"),
            Error::NoVocabulary { path } => write!(
                f,
                "{}: no tokenizer.ggml.tokens array to take the vocabulary from",
                path.display()
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Gguf(e) => Some(e),
            Error::Encode(e) => Some(e),
            Error::NoVocabulary { .. } => None,
        }
    }
}

impl From<rgml_gguf::GgufError> for Error {
    fn from(e: rgml_gguf::GgufError) -> Error {
        Error::Gguf(e)
    }
}

impl From<rgml::Error> for Error {
    fn from(e: rgml::Error) -> Error {
        Error::Encode(e)
    }
}

impl From<rgml::DTypeError> for Error {
    fn from(e: rgml::DTypeError) -> Error {
        Error::Encode(e.into())
    }
}
