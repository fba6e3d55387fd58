//! Metadata values: the GGUF value types and typed accessors. This module owns the mapping
//! between [`Value`] variants and GGUF's numeric type ids; parsing and writing live in the reader
//! and writer.

/// A GGUF metadata value. The variant is the type stored in the file, so a value read and
/// written again keeps its exact type.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `uint8`.
    U8(u8),
    /// `int8`.
    I8(i8),
    /// `uint16`.
    U16(u16),
    /// `int16`.
    I16(i16),
    /// `uint32`.
    U32(u32),
    /// `int32`.
    I32(i32),
    /// `uint64`.
    U64(u64),
    /// `int64`.
    I64(i64),
    /// `float32`.
    F32(f32),
    /// `float64`.
    F64(f64),
    /// `bool` (one byte, 0 or 1).
    Bool(bool),
    /// A UTF-8 string.
    String(String),
    /// An array whose elements all have one type; arrays may nest.
    Array(Vec<Value>),
    /// An empty array, with the GGUF type id its file declares for the elements (ggml keeps
    /// it, so a file rewritten with one keeps its bytes; 8 is `string`).
    EmptyArray(u32),
}

/// GGUF value type ids (`gguf_type` in ggml).
pub(crate) mod type_id {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

impl Value {
    /// The value as an unsigned integer, if it is an integer of any width that is non-negative.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a signed integer, if it is an integer of any width that fits in `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => i64::try_from(v).ok(),
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::I64(v) => Some(v),
            _ => None,
        }
    }

    /// The value as `f32`, if it is a float (`f64` is rounded).
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            Value::F32(v) => Some(v),
            Value::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    /// The value as a bool, if it is one.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// The value as a string slice, if it is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The elements, if the value is an array.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            Value::EmptyArray(_) => Some(&[]),
            _ => None,
        }
    }

    /// GGUF's name for the value's type (`"u32"`, `"string"`, `"array"`, ...).
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F32(_) => "f32",
            Value::F64(_) => "f64",
            Value::Bool(_) => "bool",
            Value::String(_) => "string",
            Value::Array(_) | Value::EmptyArray(_) => "array",
        }
    }

    /// The GGUF type id of the value.
    pub(crate) fn type_id(&self) -> u32 {
        match self {
            Value::U8(_) => type_id::U8,
            Value::I8(_) => type_id::I8,
            Value::U16(_) => type_id::U16,
            Value::I16(_) => type_id::I16,
            Value::U32(_) => type_id::U32,
            Value::I32(_) => type_id::I32,
            Value::U64(_) => type_id::U64,
            Value::I64(_) => type_id::I64,
            Value::F32(_) => type_id::F32,
            Value::F64(_) => type_id::F64,
            Value::Bool(_) => type_id::BOOL,
            Value::String(_) => type_id::STRING,
            Value::Array(_) | Value::EmptyArray(_) => type_id::ARRAY,
        }
    }
}

/// Human-readable rendering (arrays longer than 8 elements are abbreviated), for tools such as
/// `rgml gguf-info`.
impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::U8(v) => write!(f, "{v}"),
            Value::I8(v) => write!(f, "{v}"),
            Value::U16(v) => write!(f, "{v}"),
            Value::I16(v) => write!(f, "{v}"),
            Value::U32(v) => write!(f, "{v}"),
            Value::I32(v) => write!(f, "{v}"),
            Value::U64(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            Value::F32(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::String(s) => write!(f, "{s:?}"),
            Value::Array(a) => {
                f.write_str("[")?;
                for (i, v) in a.iter().take(8).enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{v}")?;
                }
                if a.len() > 8 {
                    write!(f, ", ... ({} elements)", a.len())?;
                }
                f.write_str("]")
            }
            Value::EmptyArray(_) => f.write_str("[]"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_accessors_convert_across_widths() {
        assert_eq!(Value::I8(5).as_u64(), Some(5));
        assert_eq!(Value::I32(-1).as_u64(), None);
        assert_eq!(Value::U64(u64::MAX).as_i64(), None);
        assert_eq!(Value::I16(-3).as_i64(), Some(-3));
        assert_eq!(Value::F32(1.0).as_u64(), None);
        assert_eq!(Value::F64(0.5).as_f32(), Some(0.5));
        assert_eq!(Value::U8(1).as_bool(), None);
        assert_eq!(Value::String("a".into()).as_str(), Some("a"));
        assert_eq!(
            Value::Array(vec![Value::U8(1)]).as_array().map(|a| a.len()),
            Some(1)
        );
        assert_eq!(Value::Bool(true).type_name(), "bool");
    }

    #[test]
    fn display_abbreviates_long_arrays() {
        let v = Value::Array((0..10).map(Value::U32).collect());
        assert_eq!(v.to_string(), "[0, 1, 2, 3, 4, 5, 6, 7, ... (10 elements)]");
    }
}
