//! The crate's error type: what can go wrong while making a random model (reading the
//! vocabulary file, choosing or encoding a tensor's type, writing the file).

use rgml::DType;
use rgml_llm::QuantizeError;
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
    /// The vocabulary file could not be read as GGUF (the reader's format errors do not name
    /// the file, so this does).
    Vocabulary {
        /// The file.
        path: PathBuf,
        /// Why.
        source: rgml_gguf::GgufError,
    },
    /// The vocabulary file has no usable `tokenizer.ggml.tokens`.
    NoVocabulary {
        /// The file.
        path: PathBuf,
    },
    /// llama-quantize's type rules refused the model (a shape model's metadata is wrong).
    Types(QuantizeError),
    /// A tensor was given a type this crate cannot make random blocks of.
    UnsupportedType {
        /// The tensor.
        tensor: String,
        /// Its type.
        dtype: DType,
    },
    /// Creating, writing or renaming a file failed.
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The output would replace the vocabulary file it is made from.
    SameFile {
        /// The file.
        path: PathBuf,
    },
    /// A thread making tensor data panicked (a bug, not a property of the input).
    WorkerPanicked,
    /// The data planned for a tensor does not match its size (a bug, not a property of the
    /// input).
    Layout(String),
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
            Error::Vocabulary { path, source } => write!(f, "{}: {source}", path.display()),
            Error::Types(e) => write!(f, "choosing tensor types: {e}"),
            Error::UnsupportedType { tensor, dtype } => {
                write!(f, "tensor '{tensor}': cannot make random {dtype} data")
            }
            Error::Io { path, source } => write!(f, "{}: {source}", path.display()),
            Error::SameFile { path } => write!(
                f,
                "{}: the output is the vocabulary file it is made from",
                path.display()
            ),
            Error::WorkerPanicked => f.write_str("a thread making tensor data panicked"),
            Error::Layout(what) => write!(f, "file layout: {what}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Gguf(e) => Some(e),
            Error::Encode(e) => Some(e),
            Error::Types(e) => Some(e),
            Error::Vocabulary { source, .. } => Some(source),
            Error::Io { source, .. } => Some(source),
            Error::NoVocabulary { .. }
            | Error::UnsupportedType { .. }
            | Error::SameFile { .. }
            | Error::WorkerPanicked
            | Error::Layout(_) => None,
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

impl From<QuantizeError> for Error {
    fn from(e: QuantizeError) -> Error {
        Error::Types(e)
    }
}
