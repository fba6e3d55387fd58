//! `rgml quantize`: convert a GGUF model to another quantization preset, byte for byte what
//! llama.cpp's `llama-quantize` writes (see [`rgml_llm::quantize`]). This module owns the
//! command's arguments, their checks and the progress lines on stderr.

use crate::error::CliError;
use crate::model_cmds::parse_threads;
use crate::note;
use clap::Args;
use rgml_llm::quantize::{self, TensorDone};
use rgml_llm::{QuantPreset, QuantizeError, QuantizeOptions};
use std::path::PathBuf;

/// Arguments of `rgml quantize`.
#[derive(Args, Debug, Clone)]
#[command(after_help = preset_help())]
pub struct QuantizeArgs {
    /// Dequantize already-quantized tensors and quantize them again (quality drops).
    #[arg(long)]
    pub allow_requantize: bool,
    /// Worker threads, 1 to 256 (default: all cores); the output does not depend on it.
    #[arg(short = 't', long, value_parser = parse_threads)]
    pub threads: Option<usize>,
    /// No progress lines.
    #[arg(short = 'q', long)]
    pub quiet: bool,
    /// The model to quantize.
    pub input: PathBuf,
    /// The file to write (must not be the input).
    pub output: PathBuf,
    /// The quantization type (preset), as llama-quantize names it.
    #[arg(value_parser = parse_preset)]
    pub preset: QuantPreset,
}

/// The presets `parse_preset` accepts, for `--help`: each name with its aliases.
fn preset_help() -> String {
    let types: Vec<String> = QuantPreset::ALL
        .into_iter()
        .map(|p| {
            let aliases: Vec<&str> = p.aliases().collect();
            if aliases.is_empty() {
                p.name().to_string()
            } else {
                format!("{} ({})", p.name(), aliases.join(", "))
            }
        })
        .collect();
    format!(
        "Types: {} (any case, or the general.file_type number).",
        types.join(", ")
    )
}

fn parse_preset(value: &str) -> Result<QuantPreset, String> {
    QuantPreset::parse(value).map_err(|e| e.to_string())
}

/// Run the command; `Ok(true)` on success.
pub fn run(args: QuantizeArgs) -> Result<bool, CliError> {
    let options = QuantizeOptions {
        preset: args.preset,
        allow_requantize: args.allow_requantize,
        n_threads: args.threads.unwrap_or(0),
    };
    if !args.quiet {
        note!(
            "quantizing '{}' to '{}' as {}",
            args.input.display(),
            args.output.display(),
            args.preset
        );
    }
    let mut progress = |done: &TensorDone<'_>| {
        if !args.quiet {
            note!("{}", progress_line(done));
        }
    };
    let summary = quantize::quantize_file(&args.input, &args.output, &options, &mut progress)
        .map_err(|e| match e {
            QuantizeError::SameFile(_) => CliError::Usage(e.to_string()),
            e => CliError::Quantize(e),
        })?;
    if !args.quiet {
        note!(
            "model size {:.2} MiB -> {:.2} MiB; {} of {} tensors converted{}",
            mib(summary.bytes_in),
            mib(summary.bytes_out),
            summary.n_converted,
            summary.n_tensors,
            match summary.n_fallback {
                0 => String::new(),
                n => format!(", {n} with a fallback type (rows not a multiple of the block)"),
            }
        );
    }
    Ok(true)
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// One tensor's line, after llama-quantize's.
fn progress_line(done: &TensorDone<'_>) -> String {
    let t = done.plan;
    let width = done.count.to_string().len();
    let head = format!(
        "[{:>width$}/{}] {:<36} {:?} {:>6}",
        done.index + 1,
        done.count,
        t.name,
        t.ne,
        t.from.name()
    );
    if t.from == t.to {
        return format!("{head}, size = {:8.3} MiB", mib(done.bytes_in));
    }
    let fallback = match t.fallback {
        Some(f) => format!(" ({} does not fit the rows)", f.wanted),
        None => String::new(),
    };
    format!(
        "{head} -> {:>6}, size = {:8.3} MiB -> {:8.3} MiB{fallback}",
        t.to.name(),
        mib(done.bytes_in),
        mib(done.bytes_out)
    )
}
