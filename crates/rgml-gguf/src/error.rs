//! The GGUF error type. Every way a file (or a writer's caller) can be wrong is one variant that
//! says what and where: byte offset, key or tensor name. The reader never panics on file data;
//! it returns one of these.

use rgml::DType;
use std::path::PathBuf;

/// Result with [`GgufError`].
pub type Result<T, E = GgufError> = std::result::Result<T, E>;

/// What went wrong while reading or writing a GGUF file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// The file could not be opened, mapped or written.
    #[error("{}: {source}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The path is not a regular file (a directory, a device, ...).
    #[error("{}: not a regular file", .path.display())]
    NotAFile {
        /// The path.
        path: PathBuf,
    },
    /// A mapped file changed (truncated, extended or written to) after it was opened: its
    /// weights can no longer be trusted.
    #[error("{}: the file changed while in use (truncated or rewritten); load it again", .path.display())]
    FileChanged {
        /// The file.
        path: PathBuf,
    },
    /// Writing to a stream failed.
    #[error("write failed: {0}")]
    Write(#[from] std::io::Error),
    /// The file ends before something it declares.
    #[error("truncated file: {what} needs {needed} bytes at offset {offset}, file has {len}")]
    Truncated {
        /// What was being read.
        what: String,
        /// Where it starts.
        offset: usize,
        /// How many bytes it needs.
        needed: usize,
        /// File length.
        len: usize,
    },
    /// The first four bytes are not `GGUF`.
    #[error(
        "not a GGUF file: it starts with bytes {:02x} {:02x} {:02x} {:02x} ({:?}), not \"GGUF\"",
        .found[0], .found[1], .found[2], .found[3], String::from_utf8_lossy(.found)
    )]
    BadMagic {
        /// The bytes found.
        found: [u8; 4],
    },
    /// A GGUF version this reader does not support (v1 is obsolete; v2 and v3 are read).
    #[error("unsupported GGUF version {version}{}", if *.version == 1 { " (v1 is obsolete; convert the file with a current llama.cpp)" } else { " (supported: 2, 3)" })]
    UnsupportedVersion {
        /// The version in the header.
        version: u32,
    },
    /// A count (tensors, key-values, array elements) larger than the rest of the file could hold.
    #[error("{what} count {count} at offset {offset} is impossible: at most {max} fit in the remaining bytes")]
    CountTooLarge {
        /// What is counted.
        what: String,
        /// The declared count.
        count: u64,
        /// Where the count is.
        offset: usize,
        /// The most that the remaining bytes could hold.
        max: u64,
    },
    /// A string or array length larger than the remaining bytes.
    #[error(
        "{what}: length {len} at offset {offset} exceeds the {remaining} bytes left in the file"
    )]
    LengthTooLarge {
        /// What has the length.
        what: String,
        /// The declared length.
        len: u64,
        /// Where the length is.
        offset: usize,
        /// Bytes left after the length field.
        remaining: usize,
    },
    /// A string that is not UTF-8.
    #[error("{what}: invalid UTF-8 in string at offset {offset}")]
    InvalidUtf8 {
        /// Which string.
        what: String,
        /// Where its bytes start.
        offset: usize,
    },
    /// A metadata value type id outside the GGUF set.
    #[error("key '{key}': unknown value type {type_id} at offset {offset}")]
    UnknownValueType {
        /// The key being read.
        key: String,
        /// The type id found.
        type_id: u32,
        /// Where it is.
        offset: usize,
    },
    /// A boolean byte other than 0 or 1.
    #[error("key '{key}': invalid bool byte {value} at offset {offset}")]
    InvalidBool {
        /// The key being read.
        key: String,
        /// The byte found.
        value: u8,
        /// Where it is.
        offset: usize,
    },
    /// Arrays nested deeper than the reader allows.
    #[error("key '{key}': arrays nested deeper than {max} at offset {offset}")]
    NestingTooDeep {
        /// The key being read.
        key: String,
        /// The depth limit.
        max: usize,
        /// Where the too-deep array starts.
        offset: usize,
    },
    /// The same metadata key twice.
    #[error("duplicate metadata key '{key}' at offset {offset}")]
    DuplicateKey {
        /// The key.
        key: String,
        /// Where the second one is.
        offset: usize,
    },
    /// The same tensor name twice.
    #[error("duplicate tensor name '{name}'")]
    DuplicateTensor {
        /// The name.
        name: String,
    },
    /// `general.alignment` that is not a nonzero power of two (or not an integer).
    #[error("invalid general.alignment: {value}")]
    BadAlignment {
        /// The value, as text.
        value: String,
    },
    /// A tensor with 0 or more than 4 dimensions.
    #[error("tensor '{tensor}': {n_dims} dimensions (must be 1 to 4)")]
    BadDimCount {
        /// The tensor.
        tensor: String,
        /// The declared dimension count.
        n_dims: u32,
    },
    /// A tensor shape with a zero or too-large dimension, or whose size overflows.
    #[error("tensor '{tensor}': invalid shape {ne:?}: {reason}")]
    BadShape {
        /// The tensor.
        tensor: String,
        /// The declared dimensions.
        ne: Vec<u64>,
        /// What is wrong.
        reason: &'static str,
    },
    /// A ggml type id rgml does not know.
    #[error("tensor '{tensor}': unknown ggml type id {type_id}")]
    UnknownDType {
        /// The tensor.
        tensor: String,
        /// The id found.
        type_id: u32,
    },
    /// A first dimension that is not a whole number of the dtype's blocks.
    #[error("tensor '{tensor}': ne0 = {ne0} is not a multiple of {dtype}'s block size {block}")]
    BlockMisaligned {
        /// The tensor.
        tensor: String,
        /// Its dtype.
        dtype: DType,
        /// Its first dimension.
        ne0: usize,
        /// The dtype's block size.
        block: usize,
    },
    /// A tensor data offset that is not a multiple of the file's alignment.
    #[error(
        "tensor '{tensor}': data offset {offset} is not a multiple of the alignment {alignment}"
    )]
    MisalignedOffset {
        /// The tensor.
        tensor: String,
        /// Its offset relative to the data section.
        offset: u64,
        /// The file's alignment.
        alignment: usize,
    },
    /// Tensor data that reaches past the end of the file.
    #[error(
        "tensor '{tensor}': data [{offset}, +{size}) is outside the {data_len}-byte data section"
    )]
    DataOutOfBounds {
        /// The tensor.
        tensor: String,
        /// Its offset relative to the data section.
        offset: u64,
        /// Its size in bytes.
        size: usize,
        /// Bytes in the data section.
        data_len: usize,
    },
    /// Two tensors whose data ranges overlap.
    #[error("tensors '{first}' and '{second}' have overlapping data")]
    OverlappingTensors {
        /// The tensor that starts first.
        first: String,
        /// The tensor that starts inside it.
        second: String,
    },
    /// A metadata key the caller asked for is absent.
    #[error("missing metadata key '{key}'")]
    MissingKey {
        /// The key.
        key: String,
    },
    /// A metadata value of another type than the caller asked for.
    #[error("metadata key '{key}': expected {expected}, found {found}")]
    WrongType {
        /// The key.
        key: String,
        /// What was asked for.
        expected: &'static str,
        /// What the value is (see [`crate::Value::type_name`]).
        found: String,
    },
    /// The writer was given an array whose elements are not all of one type.
    #[error("metadata key '{key}': array elements of mixed types ({first} and {other})")]
    MixedArray {
        /// The key.
        key: String,
        /// The first element's type.
        first: &'static str,
        /// A different element type found later.
        other: &'static str,
    },
    /// The writer was given a tensor it cannot write.
    #[error("tensor '{tensor}': {reason}")]
    InvalidTensor {
        /// The tensor.
        tensor: String,
        /// What is wrong.
        reason: String,
    },
}

impl GgufError {
    /// A short stable name for the variant (`"truncated"`, `"bad_magic"`, ...), used by the
    /// hostile-file corpus to say which error each file must produce.
    pub fn kind(&self) -> &'static str {
        match self {
            GgufError::Io { .. } => "io",
            GgufError::Write(_) => "write",
            GgufError::NotAFile { .. } => "not_a_file",
            GgufError::FileChanged { .. } => "file_changed",
            GgufError::Truncated { .. } => "truncated",
            GgufError::BadMagic { .. } => "bad_magic",
            GgufError::UnsupportedVersion { .. } => "unsupported_version",
            GgufError::CountTooLarge { .. } => "count_too_large",
            GgufError::LengthTooLarge { .. } => "length_too_large",
            GgufError::InvalidUtf8 { .. } => "invalid_utf8",
            GgufError::UnknownValueType { .. } => "unknown_value_type",
            GgufError::InvalidBool { .. } => "invalid_bool",
            GgufError::NestingTooDeep { .. } => "nesting_too_deep",
            GgufError::DuplicateKey { .. } => "duplicate_key",
            GgufError::DuplicateTensor { .. } => "duplicate_tensor",
            GgufError::BadAlignment { .. } => "bad_alignment",
            GgufError::BadDimCount { .. } => "bad_dim_count",
            GgufError::BadShape { .. } => "bad_shape",
            GgufError::UnknownDType { .. } => "unknown_dtype",
            GgufError::BlockMisaligned { .. } => "block_misaligned",
            GgufError::MisalignedOffset { .. } => "misaligned_offset",
            GgufError::DataOutOfBounds { .. } => "data_out_of_bounds",
            GgufError::OverlappingTensors { .. } => "overlapping_tensors",
            GgufError::MissingKey { .. } => "missing_key",
            GgufError::WrongType { .. } => "wrong_type",
            GgufError::MixedArray { .. } => "mixed_array",
            GgufError::InvalidTensor { .. } => "invalid_tensor",
        }
    }
}
