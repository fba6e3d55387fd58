//! Element types: the closed set of dtypes rgml knows, with ggml's block geometry.
//!
//! This module owns the *geometry* of each type (elements per block, bytes per block, ggml/GGUF
//! type id, names). The bit layout of the quantized blocks and their reference codecs live in
//! [`crate::quant`]; kernels live in the backends.

use std::fmt;

/// An element type. Quantized types store `block_size()` elements in `block_bytes()` bytes,
/// bit-compatible with ggml and GGUF files.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// IEEE 754 single precision.
    F32,
    /// IEEE 754 half precision.
    F16,
    /// bfloat16.
    BF16,
    /// 32-bit signed integer (row indices, positions).
    I32,
    /// 64-bit signed integer (row indices of SET_ROWS, as llama.cpp's KV cache writes them).
    I64,
    /// 4-bit, 32 per block, scale only.
    Q4_0,
    /// 4-bit, 32 per block, scale and minimum.
    Q4_1,
    /// 5-bit, 32 per block, scale only.
    Q5_0,
    /// 5-bit, 32 per block, scale and minimum.
    Q5_1,
    /// 8-bit, 32 per block, scale only.
    Q8_0,
    /// 8-bit, 32 per block, scale and scaled sum (activation type for Q4_1/Q5_1 dot products).
    Q8_1,
    /// 2-bit k-quant, 256 per super-block (16 sub-blocks with 4-bit scales and mins).
    Q2_K,
    /// 3-bit k-quant, 256 per super-block (16 sub-blocks with 6-bit scales).
    Q3_K,
    /// 4-bit k-quant, 256 per super-block.
    Q4_K,
    /// 5-bit k-quant, 256 per super-block.
    Q5_K,
    /// 6-bit k-quant, 256 per super-block.
    Q6_K,
    /// 8-bit k-quant, 256 per super-block (activation type for k-quant dot products).
    Q8_K,
    /// 4-bit non-linear (codebook) quant, 32 per block, scale only.
    IQ4_NL,
    /// 4-bit non-linear quant, 256 per super-block with 6-bit sub-block scales.
    IQ4_XS,
    /// OCP microscaling FP4: 32 E2M1 values per block under one E8M0 (power-of-two) scale.
    MXFP4,
}

impl DType {
    /// Every dtype, in declaration order.
    pub const ALL: [DType; 20] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::I64,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q8_1,
        DType::Q2_K,
        DType::Q3_K,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::Q8_K,
        DType::IQ4_NL,
        DType::IQ4_XS,
        DType::MXFP4,
    ];

    /// Elements per block (1 for plain types).
    pub const fn block_size(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 | DType::I32 | DType::I64 => 1,
            DType::Q4_0
            | DType::Q4_1
            | DType::Q5_0
            | DType::Q5_1
            | DType::Q8_0
            | DType::Q8_1
            | DType::IQ4_NL
            | DType::MXFP4 => 32,
            DType::Q2_K
            | DType::Q3_K
            | DType::Q4_K
            | DType::Q5_K
            | DType::Q6_K
            | DType::Q8_K
            | DType::IQ4_XS => 256,
        }
    }

    /// Bytes per block (bytes per element for plain types).
    pub const fn block_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::I64 => 8,
            DType::F16 | DType::BF16 => 2,
            DType::Q4_0 => 18,
            DType::Q4_1 => 20,
            DType::Q5_0 => 22,
            DType::Q5_1 => 24,
            DType::Q8_0 => 34,
            DType::Q8_1 => 36,
            DType::Q2_K => 84,
            DType::Q3_K => 110,
            DType::Q4_K => 144,
            DType::Q5_K => 176,
            DType::Q6_K => 210,
            DType::Q8_K => 292,
            DType::IQ4_NL => 18,
            DType::IQ4_XS => 136,
            DType::MXFP4 => 17,
        }
    }

    /// Whether the type is stored in blocks of several elements.
    pub const fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    /// Whether the type holds floating-point values (plain or quantized), i.e. not an integer.
    pub const fn is_float(self) -> bool {
        !matches!(self, DType::I32 | DType::I64)
    }

    /// ggml's lower-case type name (`"f32"`, `"q4_0"`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::Q4_0 => "q4_0",
            DType::Q4_1 => "q4_1",
            DType::Q5_0 => "q5_0",
            DType::Q5_1 => "q5_1",
            DType::Q8_0 => "q8_0",
            DType::Q8_1 => "q8_1",
            DType::Q2_K => "q2_K",
            DType::Q3_K => "q3_K",
            DType::Q4_K => "q4_K",
            DType::Q5_K => "q5_K",
            DType::Q6_K => "q6_K",
            DType::Q8_K => "q8_K",
            DType::IQ4_NL => "iq4_nl",
            DType::IQ4_XS => "iq4_xs",
            DType::MXFP4 => "mxfp4",
        }
    }

    /// Parse a ggml type name (case-insensitive).
    pub fn from_name(name: &str) -> Result<DType, DTypeError> {
        DType::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(name))
            .ok_or_else(|| DTypeError::Unknown(name.to_string()))
    }

    /// The numeric id ggml and GGUF use for this type.
    pub const fn ggml_id(self) -> u32 {
        match self {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::Q4_0 => 2,
            DType::Q4_1 => 3,
            DType::Q5_0 => 6,
            DType::Q5_1 => 7,
            DType::Q8_0 => 8,
            DType::Q8_1 => 9,
            DType::Q2_K => 10,
            DType::Q3_K => 11,
            DType::Q4_K => 12,
            DType::Q5_K => 13,
            DType::Q6_K => 14,
            DType::Q8_K => 15,
            DType::IQ4_NL => 20,
            DType::IQ4_XS => 23,
            DType::I32 => 26,
            DType::I64 => 27,
            DType::BF16 => 30,
            DType::MXFP4 => 39,
        }
    }

    /// The type with ggml/GGUF id `id`.
    pub fn from_ggml_id(id: u32) -> Result<DType, DTypeError> {
        DType::ALL
            .into_iter()
            .find(|t| t.ggml_id() == id)
            .ok_or_else(|| DTypeError::Unknown(format!("ggml type id {id}")))
    }

    /// Bytes taken by a row of `n` elements; an error if `n` is not a whole number of blocks.
    pub fn row_bytes(self, n: usize) -> Result<usize, DTypeError> {
        if !n.is_multiple_of(self.block_size()) {
            return Err(DTypeError::BlockMisaligned {
                dtype: self,
                n,
                block: self.block_size(),
            });
        }
        (n / self.block_size())
            .checked_mul(self.block_bytes())
            .ok_or(DTypeError::SizeOverflow)
    }

    /// The activation type that a dot product with this weight type quantizes its f32 operand to
    /// (ggml's `vec_dot_type`). Plain types return themselves.
    pub const fn vec_dot_type(self) -> DType {
        match self {
            DType::Q4_0 | DType::Q5_0 | DType::Q8_0 | DType::IQ4_NL | DType::MXFP4 => DType::Q8_0,
            DType::Q4_1 | DType::Q5_1 => DType::Q8_1,
            DType::Q2_K | DType::Q3_K | DType::Q4_K | DType::Q5_K | DType::Q6_K | DType::IQ4_XS => {
                DType::Q8_K
            }
            other => other,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_ids_round_trip() {
        for t in DType::ALL {
            assert_eq!(DType::from_name(t.name()).unwrap(), t);
            assert_eq!(DType::from_ggml_id(t.ggml_id()).unwrap(), t);
        }
        assert!(DType::from_name("q9_9").is_err());
        assert!(DType::from_ggml_id(999).is_err());
    }

    #[test]
    fn row_bytes_checks_blocks() {
        assert_eq!(DType::Q4_0.row_bytes(64).unwrap(), 36);
        assert_eq!(DType::Q6_K.row_bytes(512).unwrap(), 420);
        assert!(DType::Q4_0.row_bytes(33).is_err());
        assert_eq!(DType::F16.row_bytes(3).unwrap(), 6);
        assert_eq!(DType::Q2_K.row_bytes(512).unwrap(), 168);
        assert_eq!(DType::IQ4_NL.row_bytes(64).unwrap(), 36);
        assert!(DType::IQ4_XS.row_bytes(32).is_err());
        assert_eq!(DType::MXFP4.row_bytes(64).unwrap(), 34);
        assert!(DType::MXFP4.row_bytes(48).is_err());
    }

    #[test]
    fn low_bit_iq4_and_mxfp4_types_have_ggml_ids_and_names() {
        // ggml.h's enum ggml_type and ggml.c's type_traits names.
        let expect = [
            (DType::Q2_K, 10, "q2_K", 256, 84, DType::Q8_K),
            (DType::Q3_K, 11, "q3_K", 256, 110, DType::Q8_K),
            (DType::IQ4_NL, 20, "iq4_nl", 32, 18, DType::Q8_0),
            (DType::IQ4_XS, 23, "iq4_xs", 256, 136, DType::Q8_K),
            (DType::MXFP4, 39, "mxfp4", 32, 17, DType::Q8_0),
        ];
        for (t, id, name, bs, bb, dot) in expect {
            assert_eq!(DType::from_ggml_id(id).unwrap(), t);
            assert_eq!(t.name(), name);
            assert_eq!(DType::from_name(&name.to_uppercase()).unwrap(), t);
            assert_eq!((t.block_size(), t.block_bytes()), (bs, bb), "{t}");
            assert_eq!(t.vec_dot_type(), dot, "{t}");
            assert!(t.is_quantized() && t.is_float());
        }
    }
}

/// Why a dtype lookup or size computation failed. This module sits below [`crate::error`]
/// (errors carry dtypes), so it has its own error; [`crate::Error`] takes it in as its
/// variants of the same meaning (`UnknownDType`, `BlockMisaligned`, `SizeOverflow`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DTypeError {
    /// A name or id that names no dtype.
    #[error("unknown dtype {0}")]
    Unknown(String),
    /// A row length that is not a whole number of blocks.
    #[error("{n} elements of {dtype} are not a multiple of its block size {block}")]
    BlockMisaligned {
        /// The dtype.
        dtype: DType,
        /// The element count.
        n: usize,
        /// The dtype's block size.
        block: usize,
    },
    /// A size computation overflowed `usize`.
    #[error("size overflow")]
    SizeOverflow,
}
