//! The `rgml` command line: devices, op conformance, and the model commands (run, logits,
//! perplexity, bench, serve, gguf-info, quantize). Backends are registered here, so the binary
//! links only what it uses, with the options the environment asks for ([`env_options`]).

use clap::{CommandFactory, Parser, Subcommand};
use error::CliError;
use std::io::Write;
use std::process::ExitCode;

mod bench_cmd;
mod chat_cmd;
mod compare_cmd;
mod embed_cmd;
mod env_options;
mod error;
mod gpu_layers;
mod llama_flags;
mod model_cmds;
mod output;
mod placement;
mod quantize_cmd;
mod rpc_server_cmd;
mod serve_cmd;
mod test_ops;

#[derive(Parser)]
#[command(
    name = "rgml",
    version,
    about = "A multi-backend tensor runtime",
    after_help = "Environment: RGML_CPU_ISA=avx2|avx512|avx512-nobf16 (the ggml build whose \
                  arithmetic the CPU mirrors), RGML_CPU_REPACK=0|1 (repacked weights), \
                  RGML_CPU_AMX=0|1 (AMX tiles where the CPU has them; same bits), \
                  RGML_CPU_AVX512=0|1 (AVX-512 instructions where the CPU has them; 0: what \
                  an AVX2-only CPU runs, same bits), \
                  RGML_CPU_DEVICES=N (devices CPU0..CPU{N-1} beside CPU, N <= 64), \
                  RGML_WGPU_SOFT_FMA=0|1 (integer FMA emulation on GPUs), \
                  RGML_WGPU_EXACT=0|1 (GPU arithmetic: fast, or the CPU's bits; default exact \
                  on CPU drivers such as lavapipe, fast on GPUs), RGML_WGPU_COOPMAT=0|1 \
                  (prompts on a GPU's cooperative matrices where it has them; default 1), \
                  RGML_WGPU_MV_ROWS=0|1|2|4 (weight rows per team of the GPU's block \
                  mat-vec; 0: the older kernel; for measuring), RGML_WGPU_MV_TEAM=32|128 \
                  (invocations per row of the block mat-vec; for measuring), \
                  RGML_WGPU_FUSE_GLU=0|1 (gate, up and SwiGLU as one GPU mat-vec; default 1; \
                  for measuring), RGML_WGPU_MV_DP4A=0|1 (int8 \
                  activations and packed integer dots in the GPU's mat-vec; default 0; for \
                  measuring), RGML_WGPU_N_CB=N (command \
                  buffers per graph on GPUs, 1..64; default 8; for measuring)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List the devices of every registered backend.
    Devices {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Also list the devices of these servers of ggml's RPC protocol: `HOST:PORT[,..]`.
        #[arg(long)]
        rpc: Option<String>,
    },
    /// Check every op against a float64 reference on one or all backends.
    TestOps {
        /// Backend (device name from `rgml devices`); default: all.
        #[arg(short = 'b', long)]
        backend: Option<String>,
        /// Only cases of this op (e.g. MUL_MAT).
        #[arg(short = 'o', long)]
        op: Option<String>,
        /// test: compare with the reference; support: print the op × backend table; perf: time
        /// cases; perf-model: time MUL_MAT at an 8B Llama's shapes (mat-vec and 512 columns).
        #[arg(long, default_value = "test", value_parser = ["test", "support", "perf", "perf-model"])]
        mode: String,
    },
    /// Generate text from a prompt, streaming tokens to stdout.
    Run(model_cmds::RunArgs),
    /// Talk with a model in the terminal: its chat template, the conversation's history,
    /// streamed replies (`/reset`, `/exit`; Ctrl-C stops a reply).
    Chat(chat_cmd::ChatArgs),
    /// Serve this machine's devices over ggml's RPC protocol (to llama.cpp's `--rpc` or rgml's).
    RpcServer(rpc_server_cmd::RpcServerArgs),
    /// Serve a model over an OpenAI-compatible HTTP API (`/v1/chat/completions`, `/v1/completions`,
    /// a chat page at `/`), decoding several requests together.
    Serve(serve_cmd::ServeArgs),
    /// Print the prompt's tokens and the best next tokens with their logits.
    Logits(model_cmds::LogitsArgs),
    /// A prompt's pooled embedding, as llama-embedding computes it.
    Embed(embed_cmd::EmbedArgs),
    /// Perplexity of a text file, computed as llama-perplexity does.
    Perplexity(model_cmds::PerplexityArgs),
    /// Prompt and generation speed, measured as llama-bench does.
    Bench(bench_cmd::BenchArgs),
    /// Run the model's prompt graph on two devices node by node; report the first divergent node.
    Compare(compare_cmd::CompareArgs),
    /// Convert a GGUF model to another quantization type, writing the same bytes as
    /// llama.cpp's llama-quantize.
    Quantize(quantize_cmd::QuantizeArgs),
    /// Print a GGUF file's metadata and tensors.
    GgufInfo {
        /// The GGUF file.
        model: std::path::PathBuf,
    },
}

/// Mesa's Vulkan drivers print "XDG_RUNTIME_DIR is invalid or not set" on stderr each time
/// adapters are probed without it (e.g. in CI or over ssh). Give them a private directory so
/// every command's output stays clean; an existing setting is left alone.
fn ensure_runtime_dir() {
    if std::env::var_os("XDG_RUNTIME_DIR").is_some() {
        return;
    }
    let dir = std::env::temp_dir().join("rgml-xdg-runtime");
    let mut builder = std::fs::DirBuilder::new();
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    if builder.create(&dir).is_ok() || dir.is_dir() {
        // Still single-threaded here: no other thread reads the environment concurrently.
        std::env::set_var("XDG_RUNTIME_DIR", &dir);
    }
}

/// A line on stderr. Diagnostics have nowhere else to go, so a failed write is dropped rather
/// than a panic (as `eprintln!` would panic).
#[macro_export]
macro_rules! note {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// Register the CPU backend always, the servers of `--rpc`, and the GPU backend only when the
/// command may use a GPU (asked once the CPU and remote devices are known): probing GPU adapters starts a
/// driver (tens of MB, a tenth of a second), which a CPU-only command does without.
fn register_backends(command: &Command) -> Result<(), CliError> {
    let options = env_options::from_env().map_err(CliError::Usage)?;
    rgml_cpu::register_with(&options.cpu)?;
    if let Some(list) = command.rpc() {
        model_cmds::add_rpc_servers(list)?;
    }
    if command.may_use_gpu() {
        // GPUs through wgpu (Vulkan / Metal / DX12); no adapter gives no devices.
        ensure_runtime_dir();
        rgml_wgpu::register_with(options.wgpu);
    }
    Ok(())
}

/// Whether any of the comma-separated device `names` is not a device registered so far.
fn names_unknown_device(names: &str) -> bool {
    names
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .any(|n| rgml::registry::device(n).is_err())
}

impl Command {
    /// Whether the command may use a device other than the CPU and remote ones (see
    /// [`register_backends`]): a model command without `--device` may (its default is the
    /// first GPU), unless `-ngl 0`, `--rpc` or a split flag keeps it off local GPUs.
    fn may_use_gpu(&self) -> bool {
        match self {
            Command::Devices { .. } => true,
            Command::TestOps { backend, .. } => backend.as_deref().is_none_or(names_unknown_device),
            Command::Run(a) => a.model.may_use_local_gpu(),
            Command::Chat(a) => a.model.may_use_local_gpu(),
            Command::Logits(a) => a.model.may_use_local_gpu(),
            Command::Embed(a) => a.model.may_use_local_gpu(),
            Command::Perplexity(a) => a.model.may_use_local_gpu(),
            Command::Bench(a) => a.model.may_use_local_gpu(),
            Command::Serve(a) => a.model.may_use_local_gpu(),
            Command::Compare(a) => names_unknown_device(&a.device),
            Command::RpcServer(a) => a.device.as_deref().is_none_or(names_unknown_device),
            Command::GgufInfo { .. } | Command::Quantize(_) => false,
        }
    }

    /// The `--rpc` list of the command, if it has one.
    fn rpc(&self) -> Option<&str> {
        match self {
            Command::Devices { rpc, .. } => rpc.as_deref(),
            Command::Run(a) => a.model.rpc.as_deref(),
            Command::Chat(a) => a.model.rpc.as_deref(),
            Command::Logits(a) => a.model.rpc.as_deref(),
            Command::Embed(a) => a.model.rpc.as_deref(),
            Command::Perplexity(a) => a.model.rpc.as_deref(),
            Command::Bench(a) => a.model.rpc.as_deref(),
            Command::Serve(a) => a.model.rpc.as_deref(),
            _ => None,
        }
    }

    fn run(self) -> Result<bool, CliError> {
        match self {
            Command::Devices { json, .. } => devices(json).map(|()| true),
            Command::TestOps { backend, op, mode } => {
                test_ops::run(backend.as_deref(), op.as_deref(), &mode)
            }
            Command::Run(args) => model_cmds::run(args),
            Command::Chat(args) => chat_cmd::run(args),
            Command::RpcServer(args) => rpc_server_cmd::run(args),
            Command::Serve(args) => serve_cmd::run(args),
            Command::Logits(args) => model_cmds::logits(args),
            Command::Embed(args) => embed_cmd::run(args),
            Command::Perplexity(args) => model_cmds::perplexity(args),
            Command::Bench(args) => bench_cmd::bench(args),
            Command::Compare(args) => compare_cmd::run(args),
            Command::GgufInfo { model } => model_cmds::gguf_info(&model),
            Command::Quantize(args) => quantize_cmd::run(args),
        }
    }
}

fn devices(json: bool) -> Result<(), CliError> {
    let devices = rgml::registry::devices();
    let mut out = std::io::stdout().lock();
    if json {
        let list: Vec<serde_json::Value> = devices
            .iter()
            .map(|d| {
                let mem = d.memory();
                serde_json::json!({
                    "name": d.name(),
                    "description": d.description(),
                    "type": d.device_type().name(),
                    "memory_free": mem.free,
                    "memory_total": mem.total,
                    "buffer_type": d.buffer_type().name(),
                })
            })
            .collect();
        let text = serde_json::to_string_pretty(&list).map_err(|e| e.to_string())?;
        writeln!(out, "{text}")?;
        return Ok(());
    }
    writeln!(out, "{} device(s):", devices.len())?;
    for d in &devices {
        let mem = d.memory();
        writeln!(
            out,
            "  {:<10} {:<6} {:>8} MiB free / {:>8} MiB  {}",
            d.name(),
            d.device_type().name(),
            mem.free >> 20,
            mem.total >> 20,
            d.description()
        )?;
    }
    Ok(())
}

fn main() -> ExitCode {
    // A model file truncated while mapped: an error and status 1, not death by SIGBUS.
    if let Err(e) = rgml_gguf::install_sigbus_handler() {
        note!("warning: cannot install the SIGBUS handler: {e}");
    }
    let cli = Cli::parse_from(llama_flags::rewrite(
        std::env::args_os().collect(),
        &Cli::command(),
    ));
    let result = register_backends(&cli.command).and_then(|()| cli.command.run());
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) if e.is_broken_pipe() => ExitCode::from(e.exit_code()),
        Err(e) => {
            // The error with its causes, each on its own line.
            note!("{}", error::report(&e));
            ExitCode::from(e.exit_code())
        }
    }
}
