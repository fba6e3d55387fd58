//! The model commands: `run`, `logits`, `perplexity`, `gguf-info`, and the model and device
//! flags they share with `bench` and `serve` ([`ModelArgs`]; where they put the model is the
//! `placement` module's, which reads these flags).

use crate::error::CliError;
use crate::gpu_layers::GpuLayers;
use clap::Args;
use rgml::DType;
use rgml_llm::chat::{ChatFormat, ChatFormatter, Message};
use rgml_llm::chat_template::ChatTemplate;
use rgml_llm::grammar::Grammar;
use rgml_llm::{
    Constraint, EncodeOptions, FlashAttn, Logits, Model, Sampler, SamplerParams, Session,
    SessionOptions, StopReason,
};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// Where the README's first command puts the demo model.
pub const DEFAULT_MODEL: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

/// Model and device flags shared by the model commands.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// GGUF model file.
    #[arg(short = 'm', long, default_value = DEFAULT_MODEL)]
    pub model: PathBuf,
    /// Compute threads, 1 to 256 (default: all cores).
    #[arg(short = 't', long, value_parser = parse_threads)]
    pub threads: Option<usize>,
    /// Devices from `rgml devices`, comma-separated (`CPU0,CPU1` splits the model over both;
    /// with `-ngl`, one GPU and the CPU: `Vulkan0,CPU`). Default: the first GPU with every
    /// layer (CPU drivers such as lavapipe are skipped), else `CPU`; with `--rpc` every remote
    /// device.
    #[arg(long)]
    pub device: Option<String>,
    /// Layers on the GPU, as llama.cpp counts them (also `-ngl`, `--gpu-layers`): N is the
    /// output head and the last N-1 blocks, the rest stays on the CPU; more than the block
    /// count (or `all`): every layer; 0: the CPU alone; `auto`: the default. The GPU is the
    /// first one `rgml devices` lists (with `--device`, the list's first non-CPU device).
    #[arg(long = "n-gpu-layers", alias = "gpu-layers", value_name = "N", value_parser = GpuLayers::parse)]
    pub n_gpu_layers: Option<GpuLayers>,
    /// Servers of ggml's RPC protocol (`rgml rpc-server`, llama.cpp's `ggml-rpc-server`) whose
    /// devices join the local ones: `HOST:PORT[,HOST:PORT..]`. Their devices are named
    /// `RPC0[HOST:PORT]`, ...; without `--device` the model is split by layers over all of them.
    #[arg(long)]
    pub rpc: Option<String>,
    /// How to split the model over several devices: `none` (first device only), `layer`
    /// (whole blocks per device, run by the scheduler) or `tensor` (every block's weights split
    /// over the devices, a meta device; at least two devices).
    #[arg(long, default_value = "layer", value_parser = ["none", "layer", "tensor"])]
    pub split_mode: String,
    /// Share per device, e.g. `3,1` (default: even): of the blocks with `--split-mode layer`,
    /// of every split weight (in whole heads and blocks) with `--split-mode tensor`.
    #[arg(long)]
    pub tensor_split: Option<String>,
    /// How `--split-mode tensor` joins the devices' work: `gather` (attention output and FFN
    /// down split by output rows, their inputs and outputs all-gathered: logits bit-identical
    /// to one device) or `reduce` (those two split on their contraction axis, partial sums
    /// all-reduced: half the joins, but rounding differs from one device).
    #[arg(long, default_value = "gather", value_parser = ["gather", "reduce"])]
    pub tensor_sync: String,
    /// Weights whose name matches PATTERN (a regex, anywhere in the name) go to DEVICE, as
    /// llama.cpp's flag (also `-ot`): `PATTERN=DEVICE[,PATTERN=DEVICE..]`, repeatable; the
    /// first match wins; e.g. `-ot 'ffn_.*_exps=CPU'`.
    #[arg(long = "override-tensor", value_name = "PATTERN=DEVICE")]
    pub override_tensor: Vec<String>,
    /// Every block's experts (`ffn_{up,down,gate}_exps`) in host memory, computed by the CPU
    /// (also `-cmoe`), the rest where the placement puts it: llama.cpp's flag.
    #[arg(long)]
    pub cpu_moe: bool,
    /// The experts of the first N blocks on the CPU (also `-ncmoe`): llama.cpp's flag.
    #[arg(long, value_name = "N")]
    pub n_cpu_moe: Option<usize>,
    /// Write a Chrome/Perfetto trace (splits and copies per backend; on a GPU each kernel,
    /// timed on the GPU: `scripts/trace-kernels.py` sums them) to this file.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// The recorder behind `--trace`, created with the session.
    #[arg(skip)]
    recorder: std::sync::OnceLock<std::sync::Arc<rgml::trace::Trace>>,
    /// Context length: the most tokens a sequence holds (prompt and generated; default 2048,
    /// for `bench` what it needs). Every command that evaluates the model is bound by it;
    /// sessions allocate what the command needs up to it.
    #[arg(short = 'c', long = "ctx-size", value_parser = parse_positive)]
    pub ctx: Option<usize>,
    /// Largest number of tokens per graph (prompt micro-batch).
    #[arg(long, default_value_t = 512, value_parser = parse_positive)]
    pub ubatch: usize,
    /// Flash attention, as llama.cpp's flag (also `-fa`): `on`, `off` or `auto` (on where
    /// every device holding the model's blocks computes it). The logits differ from `off` in
    /// rounding, as llama.cpp's do.
    #[arg(long = "flash-attn", value_name = "on|off|auto", default_value = "auto", value_parser = parse_flash_attn)]
    pub flash_attn: FlashAttn,
    /// The K cache's type, as llama.cpp's flag (also `-ctk`): f16, f32, q8_0 or q4_0.
    #[arg(long = "cache-type-k", value_name = "TYPE", default_value = "f16", value_parser = parse_cache_type)]
    pub cache_type_k: DType,
    /// The V cache's type (also `-ctv`): f16, f32, or q8_0 / q4_0 with flash attention.
    #[arg(long = "cache-type-v", value_name = "TYPE", default_value = "f16", value_parser = parse_cache_type)]
    pub cache_type_v: DType,
}

/// `--cache-type-k/v`'s value: a type llama.cpp spells as there that rgml's attention computes
/// (any other type llama.cpp takes is refused by name).
pub(crate) fn parse_cache_type(value: &str) -> Result<DType, String> {
    let t = DType::from_name(value.trim()).map_err(|e| e.to_string())?;
    match rgml_llm::CACHE_TYPES.contains(&t) {
        true => Ok(t),
        false => Err(format!(
            "{t} caches are not supported (f32, f16, q8_0 or q4_0)"
        )),
    }
}

/// `--flash-attn`'s value: llama.cpp's `on|off|auto`, and llama-bench's `1|0`.
pub(crate) fn parse_flash_attn(value: &str) -> Result<FlashAttn, String> {
    match value.trim().to_ascii_lowercase().as_str() {
        "on" | "1" | "true" => Ok(FlashAttn::On),
        "off" | "0" | "false" => Ok(FlashAttn::Off),
        "auto" => Ok(FlashAttn::Auto),
        _ => Err("expected on, off or auto".into()),
    }
}

/// The context of commands run without `-c`.
pub const DEFAULT_CTX: usize = 2048;

/// The most compute threads `-t` accepts: beyond any core count these machines have, and low
/// enough that a typo (`-t 1000`) is an error rather than a 60× slowdown.
pub const MAX_THREADS: usize = 256;

pub(crate) fn parse_positive(value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

pub(crate) fn parse_threads(value: &str) -> Result<usize, String> {
    let n = parse_positive(value)?;
    if n > MAX_THREADS {
        return Err(format!("at most {MAX_THREADS}"));
    }
    Ok(n)
}

/// Bytes of text `perplexity` reads at most (an endless stream such as `/dev/zero` must not
/// be read forever); far above any evaluation set.
pub const MAX_TEXT_BYTES: u64 = 256 << 20;

/// The endpoints of an `--rpc` list, checked to look like `HOST:PORT`.
pub(crate) fn rpc_endpoints(list: &str) -> Result<Vec<&str>, CliError> {
    let endpoints: Vec<&str> = list
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if endpoints.is_empty() {
        return Err(CliError::usage("--rpc: no server named"));
    }
    for ep in &endpoints {
        let port_ok = ep
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        if !port_ok {
            return Err(CliError::usage(format!(
                "--rpc {list}: '{ep}' is not HOST:PORT"
            )));
        }
    }
    Ok(endpoints)
}

/// Connect to every server of an `--rpc` list and register its devices.
pub(crate) fn add_rpc_servers(list: &str) -> Result<(), CliError> {
    for ep in rpc_endpoints(list)? {
        rgml_rpc::add_server(ep)?;
    }
    Ok(())
}

impl ModelArgs {
    /// `-c`, or its default.
    pub(crate) fn ctx_size(&self) -> usize {
        self.ctx.unwrap_or(DEFAULT_CTX)
    }

    /// Checks that need no model: a writable `--trace` file (created now, so a bad path fails
    /// before the work, not after it), and a warning for more threads than cores.
    fn check(&self) -> Result<(), CliError> {
        if let Some(path) = &self.trace {
            std::fs::File::create(path)
                .map_err(|e| CliError::usage(format!("--trace {}: {e}", path.display())))?;
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        if let Some(t) = self.threads.filter(|&t| t > cores) {
            crate::note!(
                "warning: -t {t} is more threads than the {cores} cores: threads will wait on \
                 each other"
            );
        }
        Ok(())
    }

    pub(crate) fn load(&self) -> Result<Arc<Model>, CliError> {
        self.check()?;
        if !self.model.exists() {
            return Err(CliError::usage(format!(
                "model file {} not found (run scripts/fetch-model.sh for the demo model)",
                self.model.display()
            )));
        }
        let placement = self.placement()?;
        let offload = matches!(placement, rgml_llm::Placement::Offload { .. });
        let mut bar = Progress::new("loading");
        let options = rgml_llm::LoadOptions {
            placement: Some(placement),
            overrides: self.tensor_overrides()?,
            progress: Some(&mut |done, total| bar.update(done, total)),
        };
        let model = Model::load(&self.model, options)?;
        bar.finish();
        if offload {
            note_offload(&model);
        }
        note_overrides(&model);
        Ok(Arc::new(model))
    }

    pub(crate) fn session(&self, model: &Arc<Model>, n_ctx: usize) -> Result<Session, CliError> {
        self.session_for(model, n_ctx, 1)
    }

    /// A session of `n_seq` sequences of `n_ctx` positions each.
    pub(crate) fn session_for(
        &self,
        model: &Arc<Model>,
        n_ctx: usize,
        n_seq: usize,
    ) -> Result<Session, CliError> {
        self.session_with(model, &self.session_options(n_ctx, n_seq))
    }

    /// A session with `options` (made from [`Self::session_options`]), traced where asked.
    pub(crate) fn session_with(
        &self,
        model: &Arc<Model>,
        options: &SessionOptions,
    ) -> Result<Session, CliError> {
        let mut session = Session::new(model.clone(), options)?;
        if self.trace.is_some() {
            session.set_trace(self.recorder.get_or_init(Default::default).clone());
        }
        Ok(session)
    }

    /// The options of [`Self::session_for`]'s sessions.
    pub(crate) fn session_options(&self, n_ctx: usize, n_seq: usize) -> SessionOptions {
        SessionOptions {
            n_ctx,
            n_ubatch: self.ubatch,
            n_threads: self.threads,
            device_params: Vec::new(),
            n_seq,
            flash_attn: self.flash_attn,
            cache_type_k: self.cache_type_k,
            cache_type_v: self.cache_type_v,
            context_window: Some(self.ctx_size()),
            embeddings: false,
        }
    }

    /// End of a command: write the `--trace` file.
    pub(crate) fn finish(&self) -> Result<(), CliError> {
        if let (Some(path), Some(trace)) = (&self.trace, self.recorder.get()) {
            trace
                .write(path)
                .map_err(|e| format!("--trace {}: {e}", path.display()))?;
            crate::note!("trace written to {}", path.display());
        }
        Ok(())
    }
}

/// One line on stderr for a model loaded with [`Placement::Offload`](rgml_llm::Placement),
/// as llama.cpp reports it ("offloaded 31/31 layers to GPU"): how many layers, the output head
/// counted as one, went to which device (the model's first; none when it has one device).
fn note_offload(model: &Model) {
    let [gpu, _cpu] = model.devices() else {
        return;
    };
    let n_layer = model.config.n_layer;
    let blocks = (0..n_layer)
        .filter(|&il| model.layer_device(il) == Some(0))
        .count();
    crate::note!(
        "offloaded {}/{} layers to {} (the output head and {blocks} of {n_layer} blocks)",
        blocks + 1,
        n_layer + 1,
        gpu.name()
    );
}

/// What the tensor overrides moved, per device (as llama.cpp reports its buffer overrides),
/// and the weights left in host memory because their device cannot compute what reads them.
fn note_overrides(model: &Model) {
    for (i, device) in model.devices().iter().enumerate() {
        if let Some((n, mib, first)) = tensors_of_device(model.kept_on_host(), i) {
            crate::note!(
                "{n} tensors ({mib:.1} MiB) stay in host memory: {} does not compute the ops \
                 that read them (e.g. {first}), so the CPU does",
                device.name()
            );
        }
        if let Some((n, mib, _)) = tensors_of_device(model.overridden_tensors(), i) {
            crate::note!(
                "tensor overrides: {n} tensors ({mib:.1} MiB) on {}",
                device.name()
            );
        }
    }
}

/// Of `tensors` (name, device index, bytes), those of device `i`: how many, their MiB and the
/// first one's name; `None` if there are none.
fn tensors_of_device(tensors: &[(String, usize, usize)], i: usize) -> Option<(usize, f64, &str)> {
    let mine: Vec<_> = tensors.iter().filter(|(_, d, _)| *d == i).collect();
    let bytes: usize = mine.iter().map(|(_, _, b)| b).sum();
    let first = mine.first()?;
    Some((
        mine.len(),
        bytes as f64 / (1 << 20) as f64,
        first.0.as_str(),
    ))
}

/// A one-line progress bar on stderr when it is a terminal.
struct Progress {
    label: &'static str,
    tty: bool,
    last: usize,
}

impl Progress {
    fn new(label: &'static str) -> Self {
        use std::io::IsTerminal;
        Progress {
            label,
            tty: std::io::stderr().is_terminal(),
            last: usize::MAX,
        }
    }
    fn update(&mut self, done: usize, total: usize) {
        let pct = (done * 100).checked_div(total).unwrap_or(100);
        if self.tty && pct != self.last {
            self.last = pct;
            let filled = pct * 30 / 100;
            // Progress is best effort: a failed write to stderr is dropped.
            let _ = write!(
                std::io::stderr(),
                "\r{} [{}{}] {pct:3}%",
                self.label,
                "#".repeat(filled),
                " ".repeat(30 - filled)
            );
        }
    }
    fn finish(&mut self) {
        if self.tty {
            crate::note!();
        }
    }
}

/// The sampling flags `run` and `chat` share.
#[derive(Args, Debug)]
pub(crate) struct SamplingArgs {
    /// Temperature (0: greedy).
    #[arg(long, default_value_t = 0.8, allow_negative_numbers = true)]
    pub(crate) temp: f32,
    /// Random seed.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// Top-k (0: off).
    #[arg(long, default_value_t = 40)]
    pub(crate) top_k: usize,
    /// Top-p (1: off).
    #[arg(long, default_value_t = 0.95, allow_negative_numbers = true)]
    pub(crate) top_p: f32,
    /// Min-p (0: off).
    #[arg(long, default_value_t = 0.05, allow_negative_numbers = true)]
    pub(crate) min_p: f32,
    /// Repetition penalty (1: off).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub(crate) repeat_penalty: f32,
    /// Recent tokens the penalties look at (0: none).
    #[arg(long, default_value_t = 64)]
    pub(crate) repeat_last_n: usize,
    /// Frequency penalty: a recent token's logit less this times its count (0: off).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub(crate) frequency_penalty: f32,
    /// Presence penalty: a recent token's logit less this (0: off).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub(crate) presence_penalty: f32,
    /// Add a bias to a token's logit, as llama.cpp's `-l`: `ID+BIAS` or `ID-BIAS`
    /// (`ID-inf`: never that token); repeatable.
    #[arg(short = 'l', long = "logit-bias", value_parser = parse_logit_bias)]
    pub(crate) logit_bias: Vec<(u32, f32)>,
}

/// The chat-template flags `run --chat` and `chat` share.
#[derive(Args, Debug)]
pub(crate) struct ChatTemplateArgs {
    /// A Jinja chat template to use instead of the model's `tokenizer.chat_template`.
    #[arg(long)]
    pub(crate) chat_template_file: Option<std::path::PathBuf>,
    /// One of llama.cpp's 54 built-in chat formats by name (chatml, llama3, mistral-v7, ...)
    /// or a Jinja template's text, instead of the model's.
    #[arg(long)]
    pub(crate) chat_template: Option<String>,
    /// Run the model's `tokenizer.chat_template` as Jinja: the default, as in
    /// llama.cpp (accepted for its command lines).
    #[arg(long)]
    pub(crate) jinja: bool,
    /// Recognise the model's chat format from markers in its template instead of running the
    /// template as Jinja (llama.cpp's `--no-jinja`).
    #[arg(long, conflicts_with = "jinja")]
    pub(crate) no_jinja: bool,
    /// A system message first.
    #[arg(long)]
    pub(crate) system: Option<String>,
}

/// Flags of `rgml run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    /// Prompt (with `--chat`: the user's message).
    #[arg(short = 'p', long, default_value = "Once upon a time")]
    prompt: String,
    /// Tokens to generate.
    #[arg(short = 'n', long, default_value_t = 64)]
    n_predict: usize,
    #[command(flatten)]
    pub(crate) sampling: SamplingArgs,
    /// Apply the model's chat template to the prompt as a user message.
    #[arg(long)]
    chat: bool,
    #[command(flatten)]
    pub(crate) template: ChatTemplateArgs,
    /// Never end at an end-of-generation token (as llama.cpp's `--ignore-eos`: they get a
    /// logit bias of -inf), e.g. to time runs of equal length.
    #[arg(long)]
    ignore_eos: bool,
    /// A GBNF grammar (llama.cpp's) the output follows.
    #[arg(long, group = "constraint")]
    grammar: Option<String>,
    /// A file with a GBNF grammar the output follows.
    #[arg(long, group = "constraint")]
    grammar_file: Option<PathBuf>,
    /// A JSON schema the output is a valid document of.
    #[arg(short = 'j', long, group = "constraint")]
    json_schema: Option<String>,
    /// A file with a JSON schema the output is a valid document of.
    #[arg(long, group = "constraint")]
    json_schema_file: Option<PathBuf>,
}

/// The grammar of `--grammar`, `--grammar-file`, `--json-schema` or `--json-schema-file`
/// (one at most), compiled; errors name the flag.
fn run_grammar(args: &RunArgs) -> Result<Option<Grammar>, CliError> {
    // The flag and its text: a GBNF grammar, or a JSON schema (`json`).
    let (flag, text, json) = match (
        &args.grammar,
        &args.grammar_file,
        &args.json_schema,
        &args.json_schema_file,
    ) {
        (Some(g), ..) => ("--grammar", g.clone(), false),
        (_, Some(path), ..) => (
            "--grammar-file",
            read_flag_file("--grammar-file", path)?,
            false,
        ),
        (_, _, Some(s), _) => ("--json-schema", s.clone(), true),
        (.., Some(path)) => (
            "--json-schema-file",
            read_flag_file("--json-schema-file", path)?,
            true,
        ),
        _ => return Ok(None),
    };
    let grammar = match json {
        false => Grammar::from_gbnf(&text),
        true => {
            let schema: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| CliError::usage(format!("{flag}: not JSON: {e}")))?;
            Grammar::from_json_schema(&schema)
        }
    };
    grammar
        .map(Some)
        .map_err(|e| CliError::usage(format!("{flag}: {e}")))
}

/// The text of the file a flag names (a usage error naming the flag otherwise).
fn read_flag_file(flag: &str, path: &std::path::Path) -> Result<String, CliError> {
    std::fs::read_to_string(path)
        .map_err(|e| CliError::usage(format!("{flag} {}: {e}", path.display())))
}

/// The sampling settings of the flags, checked (a usage error names the flag).
pub(crate) fn sampler_params(args: &SamplingArgs) -> Result<SamplerParams, CliError> {
    let params = SamplerParams {
        temp: args.temp,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repeat_penalty: args.repeat_penalty,
        repeat_last_n: args.repeat_last_n,
        frequency_penalty: args.frequency_penalty,
        presence_penalty: args.presence_penalty,
        logit_bias: args.logit_bias.clone(),
        seed: args.seed,
    };
    params.validate().map_err(|e| match e {
        rgml_llm::LlmError::InvalidSampler { name, value, range } => CliError::usage(format!(
            "--{} {value}: must be {range}",
            name.replace('_', "-")
        )),
        e => e.into(),
    })?;
    Ok(params)
}

/// `--logit-bias ID+BIAS` / `ID-BIAS` (llama.cpp's form; the bias may be `inf`).
fn parse_logit_bias(text: &str) -> Result<(u32, f32), String> {
    let bad =
        || format!("`{text}`: expected TOKEN_ID+BIAS or TOKEN_ID-BIAS, e.g. 15043+1 or 15043-inf");
    let at = text.find(['+', '-']).ok_or_else(bad)?;
    let id = text[..at].trim().parse::<u32>().map_err(|_| bad())?;
    let bias = text[at..].trim().parse::<f32>().map_err(|_| bad())?;
    Ok((id, bias))
}

/// A usage error unless every `--logit-bias` token is in the vocabulary of `n_vocab`.
pub(crate) fn check_logit_bias(bias: &[(u32, f32)], n_vocab: usize) -> Result<(), CliError> {
    match bias.iter().find(|(id, _)| *id as usize >= n_vocab) {
        Some((id, _)) => Err(CliError::usage(format!(
            "--logit-bias: token {id} is outside the vocabulary of {n_vocab}"
        ))),
        None => Ok(()),
    }
}

/// A usage error unless `n_tokens` fit in the context of `-c`.
pub(crate) fn check_context(what: &str, n_tokens: usize, ctx_size: usize) -> Result<(), CliError> {
    if n_tokens > ctx_size {
        return Err(CliError::usage(format!(
            "{what} needs {n_tokens} tokens, more than the context of {ctx_size} (-c); raise -c"
        )));
    }
    Ok(())
}

/// The chat format a user chose: a Jinja template's text, or a built-in format.
#[derive(Debug, Default)]
pub(crate) struct ChatChoice {
    /// `--chat-template-file`'s text, or `--chat-template` given as Jinja text.
    pub(crate) template: Option<String>,
    /// `--chat-template NAME` of a built-in format.
    pub(crate) format: Option<ChatFormat>,
}

impl ChatChoice {
    /// The formatter for `model` (`jinja`: its own template as Jinja).
    pub(crate) fn formatter(&self, model: &rgml_llm::Model, jinja: bool) -> ChatFormatter {
        match self.format {
            Some(format) => ChatFormatter::Markers(format),
            None => ChatFormatter::for_model(model, self.template.as_deref(), jinja),
        }
    }
}

/// `--chat-template NAME|TEMPLATE` and `--chat-template-file FILE` (one of them), as
/// llama.cpp takes them: a built-in format's name, or Jinja text (it holds `{{` or `{%`),
/// checked to compile (a template the user gives should not silently fall back to the marker
/// format). A name rgml has no format for is an error listing those it has.
pub(crate) fn chat_choice(
    value: Option<&str>,
    path: Option<&std::path::Path>,
) -> Result<ChatChoice, CliError> {
    let (text, what) = match (value, path) {
        (Some(_), Some(_)) => {
            return Err(CliError::usage(
                "--chat-template and --chat-template-file: give one of them",
            ))
        }
        (None, None) => return Ok(ChatChoice::default()),
        (Some(value), None) if !(value.contains("{{") || value.contains("{%")) => {
            let format = ChatFormat::from_name(value.trim()).ok_or_else(|| {
                let names: Vec<&str> = ChatFormat::NAMES.iter().map(|(n, _)| *n).collect();
                CliError::usage(format!(
                    "--chat-template {value}: not a built-in format ({}); give the template's \
                     Jinja text or --chat-template-file",
                    names.join(", ")
                ))
            })?;
            return Ok(ChatChoice {
                template: None,
                format: Some(format),
            });
        }
        (Some(value), None) => (value.to_string(), "--chat-template".to_string()),
        (None, Some(path)) => {
            let text = read_flag_file("--chat-template-file", path)?;
            (text, format!("--chat-template-file {}", path.display()))
        }
    };
    ChatTemplate::new(&text, "", "").map_err(|e| CliError::usage(format!("{what}: {e}")))?;
    Ok(ChatChoice {
        template: Some(text),
        format: None,
    })
}

/// `rgml run`: stream a continuation of the prompt to stdout.
pub fn run(args: RunArgs) -> Result<bool, CliError> {
    let mut params = sampler_params(&args.sampling)?;
    let chat = chat_choice(
        args.template.chat_template.as_deref(),
        args.template.chat_template_file.as_deref(),
    )?;
    let grammar = run_grammar(&args)?;
    let model = args.model.load()?;
    check_logit_bias(&params.logit_bias, model.config.n_vocab)?;
    let tok = &model.tokenizer;
    if args.ignore_eos {
        let bans = tok.eog_ids().iter().map(|&id| (id, f32::NEG_INFINITY));
        params.logit_bias.extend(bans);
    }
    let prompt = if args.chat {
        let mut messages = Vec::new();
        if let Some(s) = &args.template.system {
            messages.push(Message::new("system", s));
        }
        messages.push(Message::new("user", &args.prompt));
        chat.formatter(&model, !args.template.no_jinja)
            .apply(&messages)
            .map_err(|e| CliError::Message(e.to_string()))?
    } else {
        args.prompt.clone()
    };
    let tokens = prompt_tokens(tok, &prompt)?;
    check_context("the prompt", tokens.len(), args.model.ctx_size())?;
    // What this run can use: the prompt and the tokens asked for, within -c.
    let n_ctx = tokens
        .len()
        .saturating_add(args.n_predict)
        .min(args.model.ctx_size());
    let mut session = args.model.session(&model, n_ctx)?;
    let mut sampler = Sampler::new(params);
    let mut out = std::io::stdout().lock();
    if !args.chat {
        write!(out, "{prompt}")?;
        out.flush()?;
    }
    // `generate` evaluates the prompt before it returns, so this times the prompt alone.
    let t0 = Instant::now();
    let mut generation = session.generate(&tokens, &mut sampler, args.n_predict)?;
    if let Some(grammar) = grammar {
        generation = generation.constrained(Constraint::grammar(Arc::new(grammar)));
    }
    let t_prompt = t0.elapsed();
    let mut decoder = tok.decoder(false);
    let t1 = Instant::now();
    let mut n_gen = 0;
    // It stops at an end-of-generation token, after -n tokens, or when the context is full.
    for next in &mut generation {
        let next = next?;
        let piece = decoder.push(next)?;
        write!(out, "{piece}")?;
        out.flush()?;
        n_gen += 1;
    }
    let stop = generation.stop_reason();
    let rest = decoder.finish();
    writeln!(out, "{rest}")?;
    let t_gen = t1.elapsed().as_secs_f64();
    if stop == Some(StopReason::ContextFull) {
        crate::note!(
            "generation stopped after {n_gen} of {} tokens: the context of {n_ctx} tokens (-c) \
             is full",
            args.n_predict
        );
    }
    crate::note!(
        "prompt: {} tokens in {:.1} ms ({:.1} tok/s); generated: {n_gen} tokens in {:.1} ms ({:.1} tok/s)",
        tokens.len(),
        t_prompt.as_secs_f64() * 1e3,
        tokens.len() as f64 / t_prompt.as_secs_f64(),
        t_gen * 1e3,
        n_gen as f64 / t_gen.max(1e-9),
    );
    args.model.finish()?;
    Ok(true)
}

/// Flags of `rgml logits`.
#[derive(Args, Debug)]
pub struct LogitsArgs {
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    /// Prompt (special tokens such as `<|im_start|>` are parsed).
    #[arg(short = 'p', long)]
    prompt: String,
    /// How many of the best next tokens to print.
    #[arg(long, default_value_t = 10)]
    top: usize,
    /// Print `{"tokens": [...], "top": [[id, logit], ...]}` (and `"continuation"`).
    #[arg(long)]
    json: bool,
    /// Then decode this many tokens one at a time, each the best of the step before, and
    /// print each step's best tokens too (the generation path's logits, greedy).
    #[arg(long, default_value_t = 0)]
    greedy: usize,
}

/// `prompt`'s tokens as the model commands read a prompt (special tokens added and parsed); an
/// empty prompt is a usage error.
pub(crate) fn prompt_tokens(tok: &rgml_llm::Tokenizer, prompt: &str) -> Result<Vec<u32>, CliError> {
    let tokens = tok.encode(prompt, EncodeOptions::prompt());
    match tokens.is_empty() {
        true => Err(CliError::usage("the prompt is empty")),
        false => Ok(tokens),
    }
}

/// `rgml logits`: the prompt's tokens and the best next tokens with their logits; with
/// `--greedy N`, the same after each of N greedy single-token steps.
pub fn logits(args: LogitsArgs) -> Result<bool, CliError> {
    let model = args.model.load()?;
    let tokens = prompt_tokens(&model.tokenizer, &args.prompt)?;
    let n_total = tokens.len().saturating_add(args.greedy);
    check_context(
        "the prompt and the greedy steps",
        n_total,
        args.model.ctx_size(),
    )?;
    let mut session = args.model.session(&model, n_total)?;
    let top = best(&session.eval(&tokens, Logits::Last)?, args.top);
    let mut steps: Vec<(u32, Vec<(usize, f32)>)> = Vec::with_capacity(args.greedy);
    for _ in 0..args.greedy {
        let prev = steps.last().map_or(&top, |(_, t)| t);
        let token = prev.first().map_or(0, |&(i, _)| i as u32);
        let step_top = best(&session.eval(&[token], Logits::Last)?, args.top);
        steps.push((token, step_top));
    }
    let mut out = std::io::stdout().lock();
    let pairs = |top: &[(usize, f32)]| -> Vec<serde_json::Value> {
        top.iter()
            .map(|&(i, l)| serde_json::json!([i, l]))
            .collect()
    };
    if args.json {
        let mut v = serde_json::json!({ "tokens": tokens, "top": pairs(&top) });
        if args.greedy > 0 {
            v["continuation"] = steps
                .iter()
                .map(|(token, top)| serde_json::json!({ "token": token, "top": pairs(top) }))
                .collect();
        }
        writeln!(out, "{v}")?;
    } else {
        writeln!(out, "tokens: {tokens:?}")?;
        print_top(&mut out, &model, &top)?;
        for (token, top) in &steps {
            let piece = model.tokenizer.token_text(*token).unwrap_or_default();
            writeln!(out, "after {token} {piece:?}:")?;
            print_top(&mut out, &model, top)?;
        }
    }
    args.model.finish()?;
    Ok(true)
}

/// The `n` largest logits with their token ids, largest first (ties: the lower id first).
fn best(logits: &[f32], n: usize) -> Vec<(usize, f32)> {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    order.iter().take(n).map(|&i| (i, logits[i])).collect()
}

fn print_top(
    out: &mut impl Write,
    model: &rgml_llm::Model,
    top: &[(usize, f32)],
) -> Result<(), CliError> {
    for &(i, l) in top {
        let piece = model.tokenizer.token_text(i as u32).unwrap_or_default();
        writeln!(out, "{i:>8} {l:>10.4}  {piece:?}")?;
    }
    Ok(())
}

/// Flags of `rgml perplexity`.
#[derive(Args, Debug)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    /// Text file to score.
    #[arg(short = 'f', long)]
    file: PathBuf,
    /// Score at most this many chunks, the first ones of the text (llama-perplexity's
    /// `--chunks`; default: every whole chunk).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    chunks: Option<u64>,
}

/// `rgml perplexity`, as llama-perplexity computes it: chunks of `-c` tokens, each evaluated
/// from an empty cache, the second half of each chunk scored.
pub fn perplexity(args: PerplexityArgs) -> Result<bool, CliError> {
    let n_ctx = args.model.ctx_size();
    // Each chunk scores its tokens from n_ctx/2 to n_ctx-2 against their successors.
    if n_ctx < 3 {
        return Err(CliError::usage(
            "-c must be at least 3 for perplexity (the second half of each chunk is scored)",
        ));
    }
    let text = read_text(&args.file)?;
    let model = args.model.load()?;
    let tokens = model.tokenizer.encode(
        &text,
        EncodeOptions {
            add_special: true,
            parse_special: false,
        },
    );
    let whole_chunks = tokens.len() / n_ctx;
    let n_chunks = args.chunks.map_or(whole_chunks, |c| {
        whole_chunks.min(usize::try_from(c).unwrap_or(usize::MAX))
    });
    if n_chunks == 0 {
        return Err(format!(
            "{} tokens are fewer than one chunk of {n_ctx}",
            tokens.len()
        )
        .into());
    }
    let mut session = args.model.session(&model, n_ctx)?;
    let n_vocab = model.config.n_vocab;
    let first = n_ctx / 2;
    let (mut nll, mut count) = (0f64, 0usize);
    let t0 = Instant::now();
    crate::note!("{} tokens, {n_chunks} chunks of {n_ctx}", tokens.len());
    let mut out = std::io::stdout().lock();
    for chunk in 0..n_chunks {
        let toks = &tokens[chunk * n_ctx..(chunk + 1) * n_ctx];
        session.reset();
        let logits = session.eval(toks, Logits::All)?;
        for j in first..n_ctx - 1 {
            let row = &logits[j * n_vocab..(j + 1) * n_vocab];
            nll -= log_softmax_at(row, toks[j + 1] as usize);
            count += 1;
        }
        write!(out, "[{}]{:.4} ", chunk + 1, (nll / count as f64).exp())?;
        out.flush()?;
    }
    writeln!(out)?;
    writeln!(out, "PPL = {:.4}", (nll / count as f64).exp())?;
    crate::note!("{:.2} s", t0.elapsed().as_secs_f64());
    args.model.finish()?;
    Ok(true)
}

/// The text of `path`, read with a size limit ([`MAX_TEXT_BYTES`]).
fn read_text(path: &PathBuf) -> Result<String, CliError> {
    use std::io::Read;
    let io = |e: std::io::Error| CliError::Message(format!("{}: {e}", path.display()));
    let file = std::fs::File::open(path).map_err(io)?;
    let mut bytes = Vec::new();
    file.take(MAX_TEXT_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > MAX_TEXT_BYTES {
        return Err(CliError::Message(format!(
            "{}: longer than {} MiB, the most perplexity reads",
            path.display(),
            MAX_TEXT_BYTES >> 20
        )));
    }
    String::from_utf8(bytes)
        .map_err(|e| CliError::Message(format!("{}: not UTF-8 text: {e}", path.display())))
}

fn log_softmax_at(row: &[f32], i: usize) -> f64 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = row.iter().map(|&l| (l as f64 - max).exp()).sum();
    row[i] as f64 - max - sum.ln()
}

/// `rgml gguf-info`: a GGUF file's metadata and tensors.
pub fn gguf_info(path: &PathBuf) -> Result<bool, CliError> {
    let gguf = rgml_gguf::GgufFile::open(path).map_err(|e| match e {
        // These name the file already.
        e @ (rgml_gguf::GgufError::Io { .. } | rgml_gguf::GgufError::NotAFile { .. }) => {
            CliError::from(e)
        }
        e => CliError::Message(format!("{}: {e}", path.display())),
    })?;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "GGUF v{}, alignment {}, data at {}",
        gguf.version(),
        gguf.alignment(),
        gguf.data_offset()
    )?;
    writeln!(out, "{} metadata entries:", gguf.metadata().len())?;
    for (k, v) in gguf.metadata() {
        writeln!(out, "  {k} = {}", short_value(v))?;
    }
    writeln!(out, "{} tensors:", gguf.tensors().len())?;
    for t in gguf.tensors() {
        writeln!(
            out,
            "  {:<32} {:<6} {:?} {} bytes at {}",
            t.name,
            t.dtype.name(),
            &t.ne[..t.n_dims.max(1)],
            t.size,
            t.offset
        )?;
    }
    Ok(true)
}

fn short_value(v: &rgml_gguf::Value) -> String {
    use rgml_gguf::Value;
    match v {
        Value::String(s) => {
            let s: String = s.chars().take(60).collect();
            format!("{s:?}{}", if s.len() < 60 { "" } else { "…" })
        }
        Value::Array(items) => {
            let head: Vec<String> = items.iter().take(5).map(short_value).collect();
            format!(
                "[{}{}] ({} items)",
                head.join(", "),
                if items.len() > 5 { ", …" } else { "" },
                items.len()
            )
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::{chat_choice, parse_logit_bias};
    use rgml_llm::chat::ChatFormat;

    #[test]
    fn chat_template_takes_a_name_or_jinja_text() {
        let llama3 = chat_choice(Some("llama3"), None).unwrap();
        assert_eq!(
            (llama3.format, llama3.template),
            (Some(ChatFormat::Llama3), None)
        );
        let text = "{% for m in messages %}{{ m.content }}{% endfor %}";
        let jinja = chat_choice(Some(text), None).unwrap();
        assert_eq!(
            (jinja.format, jinja.template.as_deref()),
            (None, Some(text))
        );
        let mistral = chat_choice(Some("mistral-v7"), None).unwrap();
        assert_eq!(mistral.format, Some(ChatFormat::MistralV7));
        let e = chat_choice(Some("mistral-v99"), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("chatml, llama2, llama2-sys"), "{e}");
        assert!(e.contains("solar-open"), "{e}");
        let e = chat_choice(Some("{{ unclosed"), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--chat-template"), "{e}");
        let both = chat_choice(Some("chatml"), Some(std::path::Path::new("x.jinja")));
        assert!(both.is_err());
        assert!(chat_choice(None, None).unwrap().template.is_none());
    }

    #[test]
    fn logit_bias_flags_read_as_llama_cpp_writes_them() {
        assert_eq!(parse_logit_bias("15043+1"), Ok((15043, 1.0)));
        assert_eq!(parse_logit_bias("7-0.5"), Ok((7, -0.5)));
        assert_eq!(parse_logit_bias("2-inf"), Ok((2, f32::NEG_INFINITY)));
        for bad in ["15043", "+1", "x+1", "3+", "3+abc", "-3+1"] {
            let e = parse_logit_bias(bad).unwrap_err();
            assert!(e.contains("TOKEN_ID+BIAS"), "{bad}: {e}");
        }
    }
}
