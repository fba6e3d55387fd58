//! The GGUF reader: parses and validates a whole file up front, then serves metadata, tensor
//! infos and zero-copy tensor bytes from the mapping.
//!
//! The file is untrusted. Every read goes through [`Cursor`], which checks bounds before it
//! slices; every count is bounded by the bytes left before anything is allocated for it; every
//! size is computed with checked arithmetic. After `open`/`from_bytes` succeed, every
//! [`TensorInfo`] lies inside the file, aligned, and disjoint from the others, so
//! [`GgufFile::tensor_data`] cannot fail.

use crate::error::{GgufError, Result};
use crate::file_guard::{FileStamp, GuardedRange};
use crate::value::{type_id, Value};
use rgml::backend::HostMemory;
use rgml::DType;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// The four bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of the data section and tensor offsets when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: usize = 32;
/// The metadata key that overrides [`DEFAULT_ALIGNMENT`].
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// Deepest array nesting the reader accepts (an array of arrays is depth 2). Real files use at
/// most 1; the limit keeps recursion (and the stack) bounded on hostile input.
pub const MAX_ARRAY_DEPTH: usize = 8;
/// Most dimensions a tensor may have (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;

/// Smallest possible encoding of one key-value pair: key length (8) + type (4) + a 1-byte value.
const MIN_KV_BYTES: usize = 8 + 4 + 1;
/// Smallest possible encoding of one tensor info: name length (8) + n_dims (4) + one dim (8) +
/// type (4) + offset (8).
const MIN_TENSOR_INFO_BYTES: usize = 8 + 4 + 8 + 4 + 8;
/// Most array elements (over all metadata arrays together) a file may hold. A [`Value`] takes
/// 32 bytes in memory while a `u8` element takes 1 in the file, so without a cap a hostile file
/// could make us allocate 32 times its size. Real files hold about a million (the tokenizer's
/// tokens, scores, types and merges); this leaves ample room.
pub const MAX_METADATA_ELEMENTS: usize = 1 << 24;
/// Vectors sized from file counts start at most this big and grow as elements actually parse,
/// so a count that passes the bound check still cannot make us reserve much up front.
const MAX_PREALLOC: usize = 4096;

/// Where one tensor is and what it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// The tensor's name.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Dimensions, innermost first; unused trailing dimensions are 1.
    pub ne: [usize; 4],
    /// How many dimensions the file declares (1 to 4).
    pub n_dims: usize,
    /// Byte offset of the data, relative to the data section ([`GgufFile::data_offset`]).
    pub offset: usize,
    /// Size of the data in bytes.
    pub size: usize,
}

impl TensorInfo {
    /// Number of elements.
    pub fn n_elements(&self) -> usize {
        // Exact for infos from a parsed file (validated to fit); saturating for hand-made ones.
        self.ne.iter().fold(1usize, |n, &d| n.saturating_mul(d))
    }
}

/// A read-only file mapping as [`HostMemory`], so CPU buffers can wrap the weights in place;
/// its range is listed for the SIGBUS handler while it lives (see [`crate::file_guard`]).
struct MmapMemory {
    // Declared first, so it is dropped (unlisted) before the mapping goes.
    _guard: GuardedRange,
    map: memmap2::Mmap,
}

impl HostMemory for MmapMemory {
    fn bytes(&self) -> &[u8] {
        &self.map
    }
}

/// A parsed, validated GGUF file (v2 or v3) over memory it shares with buffers that wrap it.
#[derive(Clone)]
pub struct GgufFile {
    memory: Arc<dyn HostMemory>,
    /// The file behind a mapping made by [`GgufFile::open`].
    stamp: Option<Arc<FileStamp>>,
    version: u32,
    alignment: usize,
    metadata: Vec<(String, Value)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    data_offset: usize,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("len", &self.memory.bytes().len())
            .field("version", &self.version)
            .field("alignment", &self.alignment)
            .field("n_kv", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .field("data_offset", &self.data_offset)
            .finish()
    }
}

impl GgufFile {
    /// Map the file at `path` read-only, parse and validate it.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let path = path.as_ref();
        let io_err = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io_err)?;
        let meta = file.metadata().map_err(io_err)?;
        if !meta.is_file() {
            return Err(GgufError::NotAFile {
                path: path.to_path_buf(),
            });
        }
        if meta.len() == 0 {
            // Mapping an empty file fails on some systems; an empty file is simply truncated.
            return Self::from_memory(Arc::new(Vec::new()));
        }
        // SAFETY: the mapping is read-only and private to this process. Another process may
        // still truncate or rewrite the file while it is mapped: `file_guard` turns that into
        // an error (the stamp, checked before each use) or, during a use, into an exit with a
        // message (the SIGBUS handler a program may install); we never write to it ourselves.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io_err)?;
        let memory = MmapMemory {
            _guard: GuardedRange::new(&map),
            map,
        };
        let stamp = FileStamp::new(path.to_path_buf(), file).map_err(io_err)?;
        let mut gguf = Self::from_memory(Arc::new(memory))?;
        gguf.stamp = Some(Arc::new(stamp));
        Ok(gguf)
    }

    /// The file behind a mapping made by [`GgufFile::open`], to check that it has not changed
    /// before its memory is used again ([`FileStamp::check`]); `None` for files in memory.
    pub fn file_stamp(&self) -> Option<&Arc<FileStamp>> {
        self.stamp.as_ref()
    }

    /// Parse and validate a GGUF file held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile> {
        Self::from_memory(Arc::new(bytes))
    }

    /// Parse and validate a GGUF file in any host memory (a mapping, a vector, ...).
    pub fn from_memory(memory: Arc<dyn HostMemory>) -> Result<GgufFile> {
        let parsed = parse(memory.bytes())?;
        Ok(GgufFile {
            memory,
            stamp: None,
            version: parsed.version,
            alignment: parsed.alignment,
            metadata: parsed.metadata,
            key_index: parsed.key_index,
            tensors: parsed.tensors,
            tensor_index: parsed.tensor_index,
            data_offset: parsed.data_offset,
        })
    }

    /// The GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Alignment of the data section and of tensor offsets.
    pub fn alignment(&self) -> usize {
        self.alignment
    }

    /// All key-value pairs, in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.key_index.get(key).map(|&i| &self.metadata[i].1)
    }

    fn require(&self, key: &str) -> Result<&Value> {
        self.get(key).ok_or_else(|| GgufError::MissingKey {
            key: key.to_string(),
        })
    }

    fn wrong_type(key: &str, expected: &'static str, v: &Value) -> GgufError {
        GgufError::WrongType {
            key: key.to_string(),
            expected,
            found: match v {
                // "integer" asked, negative integer found: say so rather than just "i32".
                Value::I8(_) | Value::I16(_) | Value::I32(_) | Value::I64(_) => {
                    format!("{} {}", v.type_name(), v)
                }
                _ => v.type_name().to_string(),
            },
        }
    }

    /// The string value of `key`; an error naming the key if it is missing or not a string.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| Self::wrong_type(key, "string", v))
    }

    /// The value of `key` as an unsigned integer (stored as any non-negative integer type).
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        let v = self.require(key)?;
        v.as_u64()
            .ok_or_else(|| Self::wrong_type(key, "non-negative integer", v))
    }

    /// The value of `key` as `f32` (stored as f32 or f64).
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        let v = self.require(key)?;
        v.as_f32().ok_or_else(|| Self::wrong_type(key, "float", v))
    }

    /// The elements of array `key`.
    pub fn get_array(&self, key: &str) -> Result<&[Value]> {
        let v = self.require(key)?;
        v.as_array()
            .ok_or_else(|| Self::wrong_type(key, "array", v))
    }

    /// All tensor infos, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor called `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The bytes of a tensor of this file, without copying. An info that does not describe a
    /// range of this file (e.g. one from another file) gives an empty slice rather than a panic.
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        let range = self
            .data_offset
            .checked_add(info.offset)
            .and_then(|start| Some(start..start.checked_add(info.size)?));
        range
            .and_then(|r| self.memory.bytes().get(r))
            .unwrap_or(&[])
    }

    /// Absolute file offset of the data section; tensor offsets are relative to it.
    pub fn data_offset(&self) -> usize {
        self.data_offset
    }

    /// The whole file's memory (the mapping, for `open`), for zero-copy CPU buffers: tensor
    /// `t` lives at `data_offset() + t.offset`.
    pub fn memory(&self) -> Arc<dyn HostMemory> {
        self.memory.clone()
    }

    /// File length in bytes.
    pub fn len(&self) -> usize {
        self.memory.bytes().len()
    }

    /// Whether the file is empty (never true for a parsed file; here for API completeness).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What [`parse`] extracts.
struct Parsed {
    version: u32,
    alignment: usize,
    metadata: Vec<(String, Value)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    data_offset: usize,
}

/// A bounds-checked little-endian reader over the file bytes. `pos <= buf.len()` always holds.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Array elements still allowed ([`MAX_METADATA_ELEMENTS`] at the start).
    elements_left: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// The next `n` bytes; `what` (built only on error) says what was being read.
    fn take(&mut self, n: usize, what: impl FnOnce() -> String) -> Result<&'a [u8]> {
        match self.pos.checked_add(n) {
            Some(end) if end <= self.buf.len() => {
                let s = &self.buf[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            _ => Err(GgufError::Truncated {
                what: what(),
                offset: self.pos,
                needed: n,
                len: self.buf.len(),
            }),
        }
    }

    fn array<const N: usize>(&mut self, what: impl FnOnce() -> String) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N, what)?);
        Ok(a)
    }

    fn u8(&mut self, what: impl FnOnce() -> String) -> Result<u8> {
        Ok(self.array::<1>(what)?[0])
    }
    fn u16(&mut self, what: impl FnOnce() -> String) -> Result<u16> {
        self.array(what).map(u16::from_le_bytes)
    }
    fn u32(&mut self, what: impl FnOnce() -> String) -> Result<u32> {
        self.array(what).map(u32::from_le_bytes)
    }
    fn u64(&mut self, what: impl FnOnce() -> String) -> Result<u64> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A GGUF string: u64 length, then that many UTF-8 bytes.
    fn string(&mut self, what: impl Fn() -> String) -> Result<String> {
        let len_at = self.pos;
        let len = self.u64(&what)?;
        let remaining = self.remaining();
        let n = usize::try_from(len)
            .ok()
            .filter(|&n| n <= remaining)
            .ok_or_else(|| GgufError::LengthTooLarge {
                what: what(),
                len,
                offset: len_at,
                remaining,
            })?;
        let at = self.pos;
        let bytes = self.take(n, &what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(GgufError::InvalidUtf8 {
                what: what(),
                offset: at,
            }),
        }
    }

    /// A count of items each at least `min_size` bytes long, checked against the bytes left.
    fn count(&mut self, min_size: usize, what: impl Fn() -> String) -> Result<usize> {
        let at = self.pos;
        let count = self.u64(&what)?;
        let max = self.remaining() / min_size;
        usize::try_from(count)
            .ok()
            .filter(|&c| c <= max)
            .ok_or_else(|| GgufError::CountTooLarge {
                what: what(),
                count,
                offset: at,
                max: max as u64,
            })
    }
}

/// Bytes the smallest value of GGUF type `t` takes (`None` for an unknown type).
fn min_value_bytes(t: u32) -> Option<usize> {
    Some(match t {
        type_id::U8 | type_id::I8 | type_id::BOOL => 1,
        type_id::U16 | type_id::I16 => 2,
        type_id::U32 | type_id::I32 | type_id::F32 => 4,
        type_id::U64 | type_id::I64 | type_id::F64 => 8,
        type_id::STRING => 8,
        type_id::ARRAY => 4 + 8,
        _ => return None,
    })
}

/// Read a value type id, rejecting unknown ones.
fn value_type(c: &mut Cursor<'_>, key: &str) -> Result<u32> {
    let at = c.pos;
    let t = c.u32(|| format!("value type of key '{key}'"))?;
    if min_value_bytes(t).is_none() {
        return Err(GgufError::UnknownValueType {
            key: key.to_string(),
            type_id: t,
            offset: at,
        });
    }
    Ok(t)
}

/// Read one value of type `t` (already validated) for `key`, with arrays nested `depth` deep.
fn read_value(c: &mut Cursor<'_>, t: u32, key: &str, depth: usize) -> Result<Value> {
    let what = || format!("value of key '{key}'");
    Ok(match t {
        type_id::U8 => Value::U8(c.u8(what)?),
        type_id::I8 => Value::I8(i8::from_le_bytes(c.array(what)?)),
        type_id::U16 => Value::U16(c.u16(what)?),
        type_id::I16 => Value::I16(i16::from_le_bytes(c.array(what)?)),
        type_id::U32 => Value::U32(c.u32(what)?),
        type_id::I32 => Value::I32(i32::from_le_bytes(c.array(what)?)),
        type_id::U64 => Value::U64(c.u64(what)?),
        type_id::I64 => Value::I64(i64::from_le_bytes(c.array(what)?)),
        type_id::F32 => Value::F32(f32::from_le_bytes(c.array(what)?)),
        type_id::F64 => Value::F64(f64::from_le_bytes(c.array(what)?)),
        type_id::BOOL => {
            let at = c.pos;
            match c.u8(what)? {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                value => {
                    return Err(GgufError::InvalidBool {
                        key: key.to_string(),
                        value,
                        offset: at,
                    })
                }
            }
        }
        type_id::STRING => Value::String(c.string(what)?),
        type_id::ARRAY => {
            if depth >= MAX_ARRAY_DEPTH {
                return Err(GgufError::NestingTooDeep {
                    key: key.to_string(),
                    max: MAX_ARRAY_DEPTH,
                    offset: c.pos,
                });
            }
            let elem = value_type(c, key)?;
            // `value_type` accepted `elem`, so it has a size; 1 keeps this total anyway.
            let min = min_value_bytes(elem).unwrap_or(1);
            let at = c.pos;
            let n = c.count(min, || format!("array of key '{key}'"))?;
            c.elements_left =
                c.elements_left
                    .checked_sub(n)
                    .ok_or_else(|| GgufError::CountTooLarge {
                        what: format!("array of key '{key}' (over the metadata element limit)"),
                        count: n as u64,
                        offset: at,
                        max: c.elements_left as u64,
                    })?;
            if n == 0 {
                return Ok(Value::EmptyArray(elem));
            }
            let mut items = Vec::with_capacity(n.min(MAX_PREALLOC));
            for _ in 0..n {
                items.push(read_value(c, elem, key, depth + 1)?);
            }
            Value::Array(items)
        }
        type_id => {
            return Err(GgufError::UnknownValueType {
                key: key.to_string(),
                type_id,
                offset: c.pos,
            })
        }
    })
}

fn parse(buf: &[u8]) -> Result<Parsed> {
    let mut c = Cursor {
        buf,
        pos: 0,
        elements_left: MAX_METADATA_ELEMENTS,
    };
    let magic: [u8; 4] = c.array(|| "magic".into())?;
    if magic != GGUF_MAGIC {
        return Err(GgufError::BadMagic { found: magic });
    }
    let version = c.u32(|| "version".into())?;
    if !(2..=3).contains(&version) {
        return Err(GgufError::UnsupportedVersion { version });
    }
    let n_tensors = c.count(MIN_TENSOR_INFO_BYTES, || "tensor".into())?;
    let n_kv = c.count(MIN_KV_BYTES, || "key-value".into())?;

    let mut metadata = Vec::with_capacity(n_kv.min(MAX_PREALLOC));
    let mut key_index = HashMap::with_capacity(n_kv.min(MAX_PREALLOC));
    for i in 0..n_kv {
        let key_at = c.pos;
        let key = c.string(|| format!("key #{i}"))?;
        if key_index.contains_key(&key) {
            return Err(GgufError::DuplicateKey {
                key,
                offset: key_at,
            });
        }
        let t = value_type(&mut c, &key)?;
        let value = read_value(&mut c, t, &key, 0)?;
        key_index.insert(key.clone(), metadata.len());
        metadata.push((key, value));
    }

    let alignment = match key_index.get(ALIGNMENT_KEY).map(|&i| &metadata[i].1) {
        None => DEFAULT_ALIGNMENT,
        Some(v) => v
            .as_u64()
            .filter(|a| a.is_power_of_two() && *a <= u64::from(u32::MAX))
            .and_then(|a| usize::try_from(a).ok())
            .ok_or_else(|| GgufError::BadAlignment {
                value: format!("{} {v}", v.type_name()),
            })?,
    };

    let mut tensors = Vec::with_capacity(n_tensors.min(MAX_PREALLOC));
    let mut tensor_index = HashMap::with_capacity(n_tensors.min(MAX_PREALLOC));
    for i in 0..n_tensors {
        let name = c.string(|| format!("name of tensor #{i}"))?;
        let info = read_tensor_info(&mut c, name, alignment)?;
        if tensor_index.contains_key(&info.name) {
            return Err(GgufError::DuplicateTensor { name: info.name });
        }
        tensor_index.insert(info.name.clone(), tensors.len());
        tensors.push(info);
    }

    // The data section starts at the next multiple of the alignment. With no tensors it may lie
    // past the end of a file written without trailing padding; that is harmless.
    let data_offset = align_up(c.pos, alignment).ok_or_else(|| GgufError::Truncated {
        what: "data section".into(),
        offset: c.pos,
        needed: alignment,
        len: buf.len(),
    })?;
    let data_len = buf.len().saturating_sub(data_offset);
    for t in &tensors {
        if t.offset
            .checked_add(t.size)
            .is_none_or(|end| end > data_len)
        {
            return Err(GgufError::DataOutOfBounds {
                tensor: t.name.clone(),
                offset: t.offset as u64,
                size: t.size,
                data_len,
            });
        }
    }
    check_overlaps(&tensors)?;

    Ok(Parsed {
        version,
        alignment,
        metadata,
        key_index,
        tensors,
        tensor_index,
        data_offset,
    })
}

/// Read the rest of a tensor info (after its name) and validate shape, type and offset.
fn read_tensor_info(c: &mut Cursor<'_>, name: String, alignment: usize) -> Result<TensorInfo> {
    let what = || format!("info of tensor '{name}'");
    let n_dims_raw = c.u32(what)?;
    let n_dims = n_dims_raw as usize;
    if n_dims == 0 || n_dims > MAX_DIMS {
        return Err(GgufError::BadDimCount {
            tensor: name,
            n_dims: n_dims_raw,
        });
    }
    let mut raw = [1u64; MAX_DIMS];
    for d in raw.iter_mut().take(n_dims) {
        *d = c.u64(what)?;
    }
    let type_id = c.u32(what)?;
    let offset = c.u64(what)?;

    let bad_shape = |name: String, reason| GgufError::BadShape {
        tensor: name,
        ne: raw[..n_dims].to_vec(),
        reason,
    };
    // ggml stores dims as int64: anything above i64::MAX is negative there.
    if raw.contains(&0) {
        return Err(bad_shape(name, "zero dimension"));
    }
    let mut ne = [1usize; MAX_DIMS];
    let mut n_elements: u64 = 1;
    for (d, &r) in ne.iter_mut().zip(&raw) {
        n_elements = match n_elements.checked_mul(r) {
            Some(n) if n <= i64::MAX as u64 => n,
            _ => return Err(bad_shape(name, "element count overflows int64")),
        };
        *d = match usize::try_from(r) {
            Ok(v) => v,
            Err(_) => return Err(bad_shape(name, "dimension does not fit in usize")),
        };
    }
    if usize::try_from(n_elements).is_err() {
        return Err(bad_shape(name, "element count does not fit in usize"));
    }
    let Ok(dtype) = DType::from_ggml_id(type_id) else {
        return Err(GgufError::UnknownDType {
            tensor: name,
            type_id,
        });
    };
    if !ne[0].is_multiple_of(dtype.block_size()) {
        return Err(GgufError::BlockMisaligned {
            tensor: name,
            dtype,
            ne0: ne[0],
            block: dtype.block_size(),
        });
    }
    let size = dtype.row_bytes(ne[0]).ok().and_then(|row| {
        row.checked_mul(ne[1])?
            .checked_mul(ne[2])?
            .checked_mul(ne[3])
    });
    let Some(size) = size else {
        return Err(bad_shape(name, "byte size overflows usize"));
    };
    // A u64 is compared before conversion so a huge offset is reported as misaligned or out of
    // bounds with its real value, not truncated.
    if !offset.is_multiple_of(alignment as u64) {
        return Err(GgufError::MisalignedOffset {
            tensor: name,
            offset,
            alignment,
        });
    }
    let Ok(offset_usize) = usize::try_from(offset) else {
        return Err(GgufError::DataOutOfBounds {
            tensor: name,
            offset,
            size,
            data_len: c.buf.len(),
        });
    };
    Ok(TensorInfo {
        name,
        dtype,
        ne,
        n_dims,
        offset: offset_usize,
        size,
    })
}

/// Reject tensors whose byte ranges intersect (all sizes are nonzero here).
fn check_overlaps(tensors: &[TensorInfo]) -> Result<()> {
    let mut order: Vec<&TensorInfo> = tensors.iter().collect();
    order.sort_by_key(|t| t.offset);
    for pair in order.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        // Both ranges were bounds-checked, so the sum cannot overflow.
        if a.offset.saturating_add(a.size) > b.offset {
            return Err(GgufError::OverlappingTensors {
                first: a.name.clone(),
                second: b.name.clone(),
            });
        }
    }
    Ok(())
}

/// `x` rounded up to a multiple of `align` (a power of two), or `None` on overflow.
pub(crate) fn align_up(x: usize, align: usize) -> Option<usize> {
    let mask = align.checked_sub(1)?;
    Some(x.checked_add(mask)? & !mask)
}
