//! The GGUF writer: collects metadata and tensors in memory and writes a v3 file laid out as
//! ggml's writer does (header, key-values, tensor infos, zero padding to the alignment, then each
//! tensor's data followed by zero padding to the alignment). What the reader reads, this writes
//! back unchanged, so a file written by ggml and passed through reader and writer is
//! byte-identical (except empty arrays, whose element type [`Value`] does not keep: they are
//! written as arrays of `u8`).
//!
//! Files too big to hold in memory are streamed: [`GgufWriter::stream_to`] writes the header
//! for tensors declared up front ([`TensorDecl`]) and returns a [`TensorStream`] that takes
//! their bytes in order, piece by piece, padding between tensors as it goes.

use crate::error::{GgufError, Result};
use crate::reader::{
    align_up, GgufFile, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_ARRAY_DEPTH, MAX_DIMS,
};
use crate::value::{type_id, Value};
use rgml::DType;
use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::Path;

/// The GGUF version the writer produces.
pub const WRITE_VERSION: u32 = 3;

struct PendingTensor {
    name: String,
    dtype: DType,
    ne: Vec<usize>,
    data: Vec<u8>,
}

/// A tensor whose data is not given up front but streamed (see [`GgufWriter::stream_to`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorDecl {
    /// The tensor's name.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Dimensions, innermost first (1 to 4 of them), written as given.
    pub ne: Vec<usize>,
}

/// Builds a GGUF v3 file. Tensors are written in the order they were added.
#[derive(Default)]
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    /// Position of each key in `metadata`, and the tensors' names: hashed, so that copying a
    /// (possibly hostile) file with thousands of keys or tensors is not quadratic.
    key_index: HashMap<String, usize>,
    tensors: Vec<PendingTensor>,
    tensor_names: HashSet<String>,
}

impl std::fmt::Debug for GgufWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufWriter")
            .field("n_kv", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufWriter {
    /// An empty writer.
    pub fn new() -> GgufWriter {
        GgufWriter::default()
    }

    /// A writer holding a copy of all of `file`'s metadata and tensors, in file order.
    pub fn from_file(file: &GgufFile) -> Result<GgufWriter> {
        let mut w = GgufWriter::new();
        for (k, v) in file.metadata() {
            w.add_metadata(k.clone(), v.clone());
        }
        for t in file.tensors() {
            w.add_tensor(&t.name, t.dtype, &t.ne[..t.n_dims], file.tensor_data(t))?;
        }
        Ok(w)
    }

    /// Set `key` to `value`. A key set twice keeps its first position and its last value.
    /// Array element types are checked when the file is written.
    pub fn add_metadata(&mut self, key: impl Into<String>, value: Value) {
        let key = key.into();
        match self.key_index.get(&key) {
            Some(&i) => self.metadata[i].1 = value,
            None => {
                self.key_index.insert(key.clone(), self.metadata.len());
                self.metadata.push((key, value));
            }
        }
    }

    /// Add a tensor of `dtype` with dimensions `ne` (innermost first, 1 to 4 of them) whose
    /// bytes are `data`. The data is copied.
    pub fn add_tensor(
        &mut self,
        name: &str,
        dtype: DType,
        ne: &[usize],
        data: &[u8],
    ) -> Result<()> {
        if self.tensor_names.contains(name) {
            return Err(GgufError::DuplicateTensor {
                name: name.to_string(),
            });
        }
        let size = tensor_size(name, dtype, ne)?;
        if size != data.len() {
            return Err(GgufError::InvalidTensor {
                tensor: name.to_string(),
                reason: format!(
                    "{} bytes of data for a {dtype} tensor {ne:?} of {size} bytes",
                    data.len()
                ),
            });
        }
        self.tensor_names.insert(name.to_string());
        self.tensors.push(PendingTensor {
            name: name.to_string(),
            dtype,
            ne: ne.to_vec(),
            data: data.to_vec(),
        });
        Ok(())
    }

    /// The alignment the file will use: `general.alignment` if set (a nonzero power of two),
    /// else 32.
    pub fn alignment(&self) -> Result<usize> {
        match self.metadata.iter().find(|(k, _)| k == ALIGNMENT_KEY) {
            None => Ok(DEFAULT_ALIGNMENT),
            Some((_, v)) => v
                .as_u64()
                .filter(|a| a.is_power_of_two() && *a <= u64::from(u32::MAX))
                .and_then(|a| usize::try_from(a).ok())
                .ok_or_else(|| GgufError::BadAlignment {
                    value: format!("{} {v}", v.type_name()),
                }),
        }
    }

    /// Write the file to `out`.
    pub fn write_to(&self, out: &mut impl Write) -> Result<()> {
        self.stream_to(out, &[])?.finish().map(|_| ())
    }

    /// Start writing a file whose tensors are this writer's own (those added with
    /// [`GgufWriter::add_tensor`], whose data is written now) followed by `streamed`, whose data
    /// the caller then passes to the returned [`TensorStream`] in order. The header is written
    /// before this returns, so every declared tensor's type and shape must be final.
    pub fn stream_to<W: Write>(&self, out: W, streamed: &[TensorDecl]) -> Result<TensorStream<W>> {
        let alignment = self.alignment()?;
        for (k, v) in &self.metadata {
            check_value(k, v, 0)?;
        }
        let mut names = HashSet::new();
        let mut infos: Vec<(&str, DType, &[usize], usize)> = Vec::new();
        for t in &self.tensors {
            infos.push((&t.name, t.dtype, &t.ne, t.data.len()));
        }
        for d in streamed {
            if self.tensor_names.contains(&d.name) || !names.insert(d.name.as_str()) {
                return Err(GgufError::DuplicateTensor {
                    name: d.name.clone(),
                });
            }
            infos.push((
                &d.name,
                d.dtype,
                &d.ne,
                tensor_size(&d.name, d.dtype, &d.ne)?,
            ));
        }
        let mut w = Counting { inner: out, n: 0 };
        w.put(&GGUF_MAGIC)?;
        w.put(&WRITE_VERSION.to_le_bytes())?;
        w.put(&(infos.len() as u64).to_le_bytes())?;
        w.put(&(self.metadata.len() as u64).to_le_bytes())?;
        for (k, v) in &self.metadata {
            w.string(k)?;
            w.put(&v.type_id().to_le_bytes())?;
            w.value(v)?;
        }
        let mut offset = 0usize;
        for &(name, dtype, ne, size) in &infos {
            w.string(name)?;
            w.put(&(ne.len() as u32).to_le_bytes())?;
            for &d in ne {
                w.put(&(d as u64).to_le_bytes())?;
            }
            w.put(&dtype.ggml_id().to_le_bytes())?;
            w.put(&(offset as u64).to_le_bytes())?;
            offset = offset
                .checked_add(size)
                .and_then(|end| align_up(end, alignment))
                .ok_or_else(|| GgufError::InvalidTensor {
                    tensor: name.to_string(),
                    reason: "data section size overflows".into(),
                })?;
        }
        w.pad(alignment)?;
        for t in &self.tensors {
            w.put(&t.data)?;
            w.pad(alignment)?;
        }
        Ok(TensorStream {
            w,
            alignment,
            pending: streamed
                .iter()
                .zip(&infos[self.tensors.len()..])
                .map(|(d, info)| (d.name.clone(), info.3))
                .collect(),
            current: 0,
            written: 0,
        })
    }

    /// Write the file to `path` (created or truncated).
    pub fn write_file(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let io_err = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::create(path).map_err(io_err)?;
        let mut out = std::io::BufWriter::new(file);
        self.write_to(&mut out).map_err(|e| match e {
            GgufError::Write(source) => io_err(source),
            other => other,
        })?;
        out.flush().map_err(io_err)
    }

    /// The file as bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut v = Vec::new();
        self.write_to(&mut v)?;
        Ok(v)
    }
}

/// Validate a tensor's shape for `dtype` and return its data size in bytes.
fn tensor_size(name: &str, dtype: DType, ne: &[usize]) -> Result<usize> {
    let invalid = |reason: String| GgufError::InvalidTensor {
        tensor: name.to_string(),
        reason,
    };
    if ne.is_empty() || ne.len() > MAX_DIMS {
        return Err(invalid(format!(
            "{} dimensions (must be 1 to {MAX_DIMS})",
            ne.len()
        )));
    }
    if ne.contains(&0) {
        return Err(invalid(format!("zero dimension in {ne:?}")));
    }
    let n_elements = ne.iter().try_fold(1u64, |acc, &d| {
        acc.checked_mul(d as u64).filter(|&n| n <= i64::MAX as u64)
    });
    if n_elements.is_none() {
        return Err(invalid(format!("shape {ne:?} overflows int64")));
    }
    if !ne[0].is_multiple_of(dtype.block_size()) {
        return Err(GgufError::BlockMisaligned {
            tensor: name.to_string(),
            dtype,
            ne0: ne[0],
            block: dtype.block_size(),
        });
    }
    dtype
        .row_bytes(ne[0])
        .ok()
        .and_then(|row| ne[1..].iter().try_fold(row, |acc, &d| acc.checked_mul(d)))
        .ok_or_else(|| invalid(format!("byte size of {ne:?} overflows")))
}

/// The data section of a file being streamed (see [`GgufWriter::stream_to`]): takes the
/// declared tensors' bytes in declaration order, in pieces of any size, and pads each tensor to
/// the alignment once its last byte is in.
pub struct TensorStream<W: Write> {
    w: Counting<W>,
    alignment: usize,
    /// Each streamed tensor's name and byte size, in order.
    pending: Vec<(String, usize)>,
    /// Index in `pending` of the tensor receiving bytes.
    current: usize,
    /// Bytes of the current tensor written so far.
    written: usize,
}

impl<W: Write> std::fmt::Debug for TensorStream<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorStream")
            .field("current", &self.current_tensor())
            .field("written", &self.written)
            .finish()
    }
}

impl<W: Write> TensorStream<W> {
    /// The name of the tensor the next bytes go to; `None` once every tensor is complete.
    pub fn current_tensor(&self) -> Option<&str> {
        self.pending.get(self.current).map(|(n, _)| n.as_str())
    }

    /// Append `bytes` to the data of the current tensor. A piece must not run past the end of
    /// the tensor it starts in (each tensor gets its own calls).
    pub fn write_data(&mut self, bytes: &[u8]) -> Result<()> {
        let Some((name, size)) = self.pending.get(self.current) else {
            return Err(GgufError::InvalidTensor {
                tensor: "(none)".into(),
                reason: format!("{} bytes written after the last tensor", bytes.len()),
            });
        };
        let left = size - self.written;
        if bytes.len() > left {
            return Err(GgufError::InvalidTensor {
                tensor: name.clone(),
                reason: format!(
                    "{} bytes written where {left} of its {size} bytes were left",
                    bytes.len()
                ),
            });
        }
        self.w.put(bytes)?;
        self.written += bytes.len();
        if self.written == *size {
            self.w.pad(self.alignment)?;
            self.current += 1;
            self.written = 0;
        }
        Ok(())
    }

    /// Check that every declared tensor got all its bytes, flush, and return the sink.
    pub fn finish(mut self) -> Result<W> {
        if let Some((name, size)) = self.pending.get(self.current) {
            return Err(GgufError::InvalidTensor {
                tensor: name.clone(),
                reason: format!("only {} of its {size} bytes were written", self.written),
            });
        }
        self.w.inner.flush()?;
        Ok(self.w.inner)
    }
}

/// Arrays must be homogeneous (GGUF stores one element type per array) and nest at most
/// [`MAX_ARRAY_DEPTH`] deep, so that what we write our reader reads.
fn check_value(key: &str, v: &Value, depth: usize) -> Result<()> {
    if let Value::EmptyArray(elem) = *v {
        return match elem <= type_id::F64 {
            true => Ok(()),
            false => Err(GgufError::UnknownValueType {
                key: key.to_string(),
                type_id: elem,
                offset: 0,
            }),
        };
    }
    let Value::Array(items) = v else {
        return Ok(());
    };
    if depth >= MAX_ARRAY_DEPTH {
        return Err(GgufError::NestingTooDeep {
            key: key.to_string(),
            max: MAX_ARRAY_DEPTH,
            offset: 0,
        });
    }
    if let Some(first) = items.first() {
        if let Some(other) = items.iter().find(|x| x.type_id() != first.type_id()) {
            return Err(GgufError::MixedArray {
                key: key.to_string(),
                first: first.type_name(),
                other: other.type_name(),
            });
        }
    }
    items
        .iter()
        .try_for_each(|x| check_value(key, x, depth + 1))
}

/// A writer that counts bytes, for the padding.
struct Counting<W: Write> {
    inner: W,
    n: usize,
}

impl<W: Write> Counting<W> {
    fn put(&mut self, bytes: &[u8]) -> Result<()> {
        self.inner.write_all(bytes)?;
        self.n += bytes.len();
        Ok(())
    }

    fn pad(&mut self, alignment: usize) -> Result<()> {
        let target = align_up(self.n, alignment).unwrap_or(self.n);
        const ZEROS: [u8; 64] = [0; 64];
        while self.n < target {
            let k = (target - self.n).min(ZEROS.len());
            self.put(&ZEROS[..k])?;
        }
        Ok(())
    }

    fn string(&mut self, s: &str) -> Result<()> {
        self.put(&(s.len() as u64).to_le_bytes())?;
        self.put(s.as_bytes())
    }

    fn value(&mut self, v: &Value) -> Result<()> {
        match v {
            Value::U8(x) => self.put(&x.to_le_bytes()),
            Value::I8(x) => self.put(&x.to_le_bytes()),
            Value::U16(x) => self.put(&x.to_le_bytes()),
            Value::I16(x) => self.put(&x.to_le_bytes()),
            Value::U32(x) => self.put(&x.to_le_bytes()),
            Value::I32(x) => self.put(&x.to_le_bytes()),
            Value::U64(x) => self.put(&x.to_le_bytes()),
            Value::I64(x) => self.put(&x.to_le_bytes()),
            Value::F32(x) => self.put(&x.to_le_bytes()),
            Value::F64(x) => self.put(&x.to_le_bytes()),
            Value::Bool(x) => self.put(&[u8::from(*x)]),
            Value::String(s) => self.string(s),
            Value::Array(items) => {
                let elem = items.first().map_or(type_id::U8, Value::type_id);
                self.put(&elem.to_le_bytes())?;
                self.put(&(items.len() as u64).to_le_bytes())?;
                items.iter().try_for_each(|x| self.value(x))
            }
            Value::EmptyArray(elem) => {
                self.put(&elem.to_le_bytes())?;
                self.put(&0u64.to_le_bytes())
            }
        }
    }
}
