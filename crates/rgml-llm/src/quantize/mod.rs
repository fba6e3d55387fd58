//! Quantizing a GGUF model to another preset, writing the same bytes as llama.cpp's
//! `llama-quantize` (without an importance matrix).
//!
//! This module owns the conversion pipeline: the plan (each tensor's new type, from
//! [`rules`]), the output's metadata (the input's keys in order, then
//! `general.quantization_version` and `general.file_type` last, split keys dropped), the tensor
//! order (llama.cpp's loader order, see [`rules::llama_order`]) and the streaming conversion
//! (dequantize each row to f32, quantize with ggml's reference codecs in [`rgml::quant`],
//! rows in parallel). Each row is converted on its own, so the bytes do not depend on the
//! thread count. Memory stays small: the input is mapped, and only a slab of output rows
//! (at most [`SLAB_BYTES`]) plus one f32 row per thread is held at a time.
//!
//! Known differences, both outside ordinary files: an input whose `general.alignment` is not 32
//! keeps that alignment (llama.cpp pads to 32 regardless and so writes a file whose data does
//! not sit where its header says); and an empty metadata array is written as an array of `u8`
//! (the reader's [`Value`] does not keep an empty array's element type; llama.cpp keeps it).

mod preset;
pub mod rules;

pub use preset::QuantPreset;
pub use rules::{Fallback, ModelTraits, TypeChoice, TypeChooser};

use rgml::DType;
use rgml_gguf::{GgufError, GgufFile, GgufWriter, TensorDecl, TensorStream, Value};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// ggml's `GGML_QNT_VERSION`, written to `general.quantization_version`.
pub const QUANTIZATION_VERSION: u32 = 2;

/// The most output bytes converted before they are written.
pub const SLAB_BYTES: usize = 64 << 20;

/// Keys llama.cpp drops from a quantized file (it writes one file, not shards).
const SPLIT_KEYS: [&str; 3] = ["split.no", "split.count", "split.tensors.count"];

/// Why quantizing failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QuantizeError {
    /// A preset name that is not one of [`QuantPreset::ALL`] (or their aliases and numbers).
    #[error("unknown quantization type '{0}' (known: {names})", names = QuantPreset::names())]
    UnknownPreset(String),
    /// The tensor is already quantized and re-quantizing was not allowed.
    #[error("requantizing from type {from} is disabled (allow it with --allow-requantize; quality drops)")]
    RequantizeDisabled {
        /// The tensor's type in the input.
        from: DType,
    },
    /// A tensor whose type cannot be converted to float.
    #[error("cannot convert a {from} tensor to {to}")]
    CannotConvert {
        /// The tensor's type in the input.
        from: DType,
        /// The type it was to become.
        to: DType,
    },
    /// Metadata the type rules need is missing or invalid.
    #[error("bad model: {0}")]
    BadModel(String),
    /// The output would overwrite the input.
    #[error("{}: the output is the input file", .0.display())]
    SameFile(PathBuf),
    /// Something went wrong with one tensor.
    #[error("tensor '{tensor}': {source}")]
    Tensor {
        /// The tensor's name.
        tensor: String,
        /// What.
        source: Box<QuantizeError>,
    },
    /// A conversion the core refused.
    #[error(transparent)]
    Core(#[from] rgml::Error),
    /// The input could not be read as GGUF (the reader's format errors do not name the file,
    /// so this does).
    #[error("{}: {source}", .path.display())]
    Input {
        /// The input file.
        path: PathBuf,
        /// Why.
        source: GgufError,
    },
    /// A GGUF error that names its file itself (the input could not be opened), or one that is
    /// about no file (an output header the writer refused).
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// A conversion thread panicked (a bug, not a property of the file).
    #[error("a conversion thread panicked")]
    WorkerPanicked,
    /// A file operation failed.
    #[error("{}: {source}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

impl QuantizeError {
    fn on(tensor: &str, e: impl Into<QuantizeError>) -> QuantizeError {
        QuantizeError::Tensor {
            tensor: tensor.to_string(),
            source: Box::new(e.into()),
        }
    }
}

/// How to quantize.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuantizeOptions {
    /// The preset.
    pub preset: QuantPreset,
    /// Whether already-quantized tensors may be dequantized and quantized again
    /// (`--allow-requantize`); without it such a tensor is an error.
    pub allow_requantize: bool,
    /// Worker threads; 0 for one per available core. The output does not depend on it.
    pub n_threads: usize,
}

impl QuantizeOptions {
    /// The preset with llama-quantize's defaults: no requantizing, all cores.
    pub fn new(preset: QuantPreset) -> QuantizeOptions {
        QuantizeOptions {
            preset,
            allow_requantize: false,
            n_threads: 0,
        }
    }
}

/// One tensor of the output, as planned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorPlan {
    /// The tensor's name.
    pub name: String,
    /// Its index in the input's tensors ([`GgufFile::tensors`]).
    pub input_index: usize,
    /// Its dimensions as written (trailing dimensions of 1 dropped, as ggml writes them).
    pub ne: Vec<usize>,
    /// Its type in the input.
    pub from: DType,
    /// Its type in the output (the same as `from`: copied unchanged).
    pub to: DType,
    /// Set when the rules' type did not fit the rows.
    pub fallback: Option<Fallback>,
}

/// What [`plan`] decided for every tensor, in output order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuantizePlan {
    /// The tensors, in the order they are written.
    pub tensors: Vec<TensorPlan>,
}

/// Decide every tensor's type for `options`, and check that each conversion can be made,
/// before anything is written.
pub fn plan(file: &GgufFile, options: &QuantizeOptions) -> Result<QuantizePlan, QuantizeError> {
    let traits = ModelTraits::from_gguf(file)?;
    let mut infos: Vec<_> = file.tensors().iter().enumerate().collect();
    infos.sort_by(|(_, a), (_, b)| rules::llama_order(&a.name, &b.name));
    let mut chooser =
        TypeChooser::new(&traits, options.preset, infos.iter().map(|(_, t)| &*t.name));
    let mut tensors = Vec::with_capacity(infos.len());
    for (input_index, info) in infos {
        let ne = info.ne[..rules::n_dims(&info.ne)].to_vec();
        let choice = chooser
            .choose(&info.name, &ne)
            .map_err(|e| QuantizeError::on(&info.name, e))?;
        let to = match choice.target {
            None => info.dtype,
            Some(to) if to == info.dtype => to,
            Some(to) => {
                check_convertible(info.dtype, to, options.allow_requantize)
                    .map_err(|e| QuantizeError::on(&info.name, e))?;
                to
            }
        };
        tensors.push(TensorPlan {
            name: info.name.clone(),
            input_index,
            ne,
            from: info.dtype,
            to,
            fallback: choice.fallback,
        });
    }
    Ok(QuantizePlan { tensors })
}

fn check_convertible(from: DType, to: DType, allow_requantize: bool) -> Result<(), QuantizeError> {
    if !from.is_float() || matches!(from, DType::Q8_1 | DType::Q8_K) {
        return Err(QuantizeError::CannotConvert { from, to });
    }
    if from.is_quantized() && !allow_requantize {
        return Err(QuantizeError::RequantizeDisabled { from });
    }
    Ok(())
}

/// The output's metadata: the input's keys in their order, split keys dropped, and the
/// quantization version and file type set last (ggml's setters move a key they replace to the
/// end).
pub fn output_metadata(file: &GgufFile, preset: QuantPreset) -> GgufWriter {
    let version_key = "general.quantization_version";
    let file_type_key = "general.file_type";
    let mut w = GgufWriter::new();
    for (k, v) in file.metadata() {
        if k != version_key && k != file_type_key && !SPLIT_KEYS.contains(&k.as_str()) {
            w.add_metadata(k.clone(), v.clone());
        }
    }
    w.add_metadata(version_key, Value::U32(QUANTIZATION_VERSION));
    w.add_metadata(file_type_key, Value::U32(preset.file_type()));
    w
}

/// One tensor written, for progress reports.
#[derive(Clone, Debug)]
pub struct TensorDone<'a> {
    /// 0-based position in the output.
    pub index: usize,
    /// Number of tensors.
    pub count: usize,
    /// The plan for this tensor.
    pub plan: &'a TensorPlan,
    /// Bytes in the input.
    pub bytes_in: usize,
    /// Bytes in the output.
    pub bytes_out: usize,
}

/// What a finished run did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuantizeSummary {
    /// Tensors written.
    pub n_tensors: usize,
    /// Tensors converted to another type (the rest were copied).
    pub n_converted: usize,
    /// Tensors that needed a fallback type.
    pub n_fallback: usize,
    /// Tensor data bytes read.
    pub bytes_in: usize,
    /// Tensor data bytes written.
    pub bytes_out: usize,
}

/// Quantize the model at `input` into a new file at `output` (written beside it under a
/// temporary name, then renamed, so a failed run leaves no partial file). `progress` is told
/// about each tensor once it is written.
pub fn quantize_file(
    input: &Path,
    output: &Path,
    options: &QuantizeOptions,
    progress: &mut dyn FnMut(&TensorDone<'_>),
) -> Result<QuantizeSummary, QuantizeError> {
    refuse_same_file(input, output)?;
    let file = GgufFile::open(input).map_err(|e| match e {
        // These name the file already.
        e @ (GgufError::Io { .. } | GgufError::NotAFile { .. }) => QuantizeError::Gguf(e),
        source => QuantizeError::Input {
            path: input.to_path_buf(),
            source,
        },
    })?;
    let plan = plan(&file, options)?;
    let header = output_metadata(&file, options.preset);
    let part = part_path(output);
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| QuantizeError::Io { path, source }
    };
    let sink = std::fs::File::create(&part).map_err(io_err(&part))?;
    let result = write_tensors(
        &file,
        &plan,
        &header,
        BufWriter::new(sink),
        &part,
        options,
        progress,
    );
    let summary = match result {
        Ok(summary) => summary,
        Err(e) => {
            // The partial file is useless; failing to delete it changes nothing for the user.
            let _ = std::fs::remove_file(&part);
            return Err(e);
        }
    };
    std::fs::rename(&part, output).map_err(io_err(output))?;
    Ok(summary)
}

/// `output` must not name the input (whether or not through another path).
fn refuse_same_file(input: &Path, output: &Path) -> Result<(), QuantizeError> {
    let same = match (input.canonicalize(), output.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if same {
        return Err(QuantizeError::SameFile(output.to_path_buf()));
    }
    Ok(())
}

fn part_path(output: &Path) -> PathBuf {
    let mut name = output.file_name().unwrap_or_default().to_os_string();
    name.push(".part");
    output.with_file_name(name)
}

/// Write the header and every planned tensor of `file` (the file `plan` was made from) to
/// `sink`, the file at `sink_path`. The writer's I/O errors name no file: they are reported
/// against `sink_path`, not the input.
fn write_tensors<W: Write>(
    file: &GgufFile,
    plan: &QuantizePlan,
    header: &GgufWriter,
    sink: W,
    sink_path: &Path,
    options: &QuantizeOptions,
    progress: &mut dyn FnMut(&TensorDone<'_>),
) -> Result<QuantizeSummary, QuantizeError> {
    let out_err = |e| match e {
        GgufError::Write(source) => QuantizeError::Io {
            path: sink_path.to_path_buf(),
            source,
        },
        e => QuantizeError::Gguf(e),
    };
    let decls: Vec<TensorDecl> = plan
        .tensors
        .iter()
        .map(|t| TensorDecl {
            name: t.name.clone(),
            dtype: t.to,
            ne: t.ne.clone(),
        })
        .collect();
    let mut stream = header.stream_to(sink, &decls).map_err(out_err)?;
    let threads = match options.n_threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let mut summary = QuantizeSummary {
        n_tensors: plan.tensors.len(),
        ..QuantizeSummary::default()
    };
    // One slab for every converted tensor: each would otherwise allocate (and zero) its own.
    let mut slab = Vec::new();
    for (index, t) in plan.tensors.iter().enumerate() {
        // The plan was made from this file, so its indices are in range.
        let data = file.tensor_data(&file.tensors()[t.input_index]);
        let bytes_out = if t.from == t.to {
            stream.write_data(data).map_err(out_err)?;
            data.len()
        } else {
            summary.n_converted += 1;
            convert_tensor(t, data, threads, &mut slab, &mut stream, &out_err).map_err(|e| {
                match e {
                    // The output's errors are not the tensor's.
                    e @ QuantizeError::Io { .. } => e,
                    e => QuantizeError::on(&t.name, e),
                }
            })?
        };
        summary.n_fallback += usize::from(t.fallback.is_some());
        summary.bytes_in += data.len();
        summary.bytes_out += bytes_out;
        progress(&TensorDone {
            index,
            count: plan.tensors.len(),
            plan: t,
            bytes_in: data.len(),
            bytes_out,
        });
    }
    stream.finish().map_err(out_err)?;
    Ok(summary)
}

/// The row layout of one conversion.
#[derive(Clone, Copy)]
struct Rows {
    from: DType,
    to: DType,
    /// Elements per row.
    n: usize,
    /// Bytes per input row.
    bytes_in: usize,
    /// Bytes per output row.
    bytes_out: usize,
}

/// Convert one tensor's rows from `t.from` to `t.to`, a slab of rows at a time (in `slab`,
/// resized as needed), and stream them out through `out_err`'s error mapping. Returns the bytes
/// written.
fn convert_tensor<W: Write>(
    t: &TensorPlan,
    data: &[u8],
    threads: usize,
    slab: &mut Vec<u8>,
    stream: &mut TensorStream<W>,
    out_err: &dyn Fn(GgufError) -> QuantizeError,
) -> Result<usize, QuantizeError> {
    let n = t.ne.first().copied().unwrap_or(1);
    let n_rows: usize = t.ne.iter().skip(1).product();
    let rows = Rows {
        from: t.from,
        to: t.to,
        n,
        bytes_in: t.from.row_bytes(n).map_err(rgml::Error::from)?,
        bytes_out: t.to.row_bytes(n).map_err(rgml::Error::from)?,
    };
    if Some(data.len()) != rows.bytes_in.checked_mul(n_rows) {
        return Err(QuantizeError::BadModel(format!(
            "{} bytes of data for {n_rows} rows of {} bytes",
            data.len(),
            rows.bytes_in
        )));
    }
    let slab_rows = (SLAB_BYTES / rows.bytes_out.max(1)).clamp(1, n_rows.max(1));
    // Every byte of a slab is overwritten before it is written out, so what an earlier tensor
    // left in it does not matter.
    slab.resize(slab_rows * rows.bytes_out, 0);
    let mut written = 0;
    for first in (0..n_rows).step_by(slab_rows) {
        let count = slab_rows.min(n_rows - first);
        let src = &data[first * rows.bytes_in..(first + count) * rows.bytes_in];
        let dst = &mut slab[..count * rows.bytes_out];
        convert_rows(rows, src, dst, threads)?;
        stream.write_data(dst).map_err(out_err)?;
        written += dst.len();
    }
    Ok(written)
}

/// Below this many elements a slab is converted on the calling thread: spawning costs more.
const MIN_PARALLEL_ELEMENTS: usize = 1 << 16;

/// Convert whole rows `src` into `dst`, split among `threads` threads in contiguous runs of
/// rows. Each row goes through its own f32 buffer, so the result is the same for any split.
fn convert_rows(
    rows: Rows,
    src: &[u8],
    dst: &mut [u8],
    threads: usize,
) -> Result<(), QuantizeError> {
    let run = move |src: &[u8], dst: &mut [u8]| -> Result<(), QuantizeError> {
        let mut f32_row = vec![0f32; rows.n];
        for (s, d) in src
            .chunks_exact(rows.bytes_in)
            .zip(dst.chunks_exact_mut(rows.bytes_out))
        {
            rgml::quant::dequantize_row(rows.from, s, &mut f32_row)?;
            rgml::quant::quantize_row(rows.to, &f32_row, d)?;
        }
        Ok(())
    };
    let n_rows = dst.len() / rows.bytes_out.max(1);
    let threads = threads.clamp(1, n_rows.max(1));
    if threads == 1 || n_rows.saturating_mul(rows.n) < MIN_PARALLEL_ELEMENTS {
        return run(src, dst);
    }
    let per_thread = n_rows.div_ceil(threads);
    std::thread::scope(|scope| {
        let workers: Vec<_> = src
            .chunks(per_thread * rows.bytes_in)
            .zip(dst.chunks_mut(per_thread * rows.bytes_out))
            .map(|(s, d)| scope.spawn(move || run(s, d)))
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().unwrap_or(Err(QuantizeError::WorkerPanicked)))
    })
}

#[cfg(test)]
mod tests;
