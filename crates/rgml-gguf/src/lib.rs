//! GGUF for rgml: a reader that maps a file, validates all of it up front and hands out tensor
//! bytes without copying, and a writer that produces files the reader (and ggml) read back.
//!
//! Files are untrusted input: a malformed or hostile file gives a [`GgufError`] that says what
//! and where, never a panic, an out-of-bounds read or an allocation larger than the file
//! justifies. Supported: GGUF v2 and v3, little-endian, every metadata value type including
//! nested arrays, `general.alignment`.
//!
//! ```
//! use rgml_gguf::{GgufFile, GgufWriter, Value};
//! let mut w = GgufWriter::new();
//! w.add_metadata("general.architecture", Value::String("llama".into()));
//! w.add_tensor("t", rgml::DType::F32, &[2], &[0u8; 8]).unwrap();
//! let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
//! assert_eq!(f.get_str("general.architecture").unwrap(), "llama");
//! assert_eq!(f.tensor_data(f.tensor("t").unwrap()).len(), 8);
//! ```
#![warn(missing_docs)]

mod error;
pub mod file_guard;
mod reader;
mod value;
mod writer;

pub use error::{GgufError, Result};
pub use file_guard::{install_sigbus_handler, FileStamp};
pub use reader::{
    GgufFile, TensorInfo, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_ARRAY_DEPTH, MAX_DIMS,
    MAX_METADATA_ELEMENTS,
};
pub use value::Value;
pub use writer::{GgufWriter, TensorDecl, TensorStream, WRITE_VERSION};
