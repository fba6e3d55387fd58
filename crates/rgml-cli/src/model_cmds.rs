//! The model commands: `run`, `logits`, `perplexity`, `bench`, `gguf-info`.

use crate::error::CliError;
use clap::Args;
use rgml_llm::chat::{ChatFormat, Message};
use rgml_llm::{EncodeOptions, Logits, Model, Sampler, SamplerParams, Session, SessionOptions};
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
    /// Compute threads (default: all cores).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// Devices from `rgml devices`, comma-separated (`CPU0,CPU1` splits the model over both).
    #[arg(long, default_value = "CPU")]
    pub device: String,
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
    /// Write a Chrome/Perfetto trace (splits and copies per backend) to this file.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// The recorder behind `--trace`, created with the session.
    #[arg(skip)]
    recorder: std::sync::OnceLock<std::sync::Arc<rgml::trace::Trace>>,
    /// Context length.
    #[arg(short = 'c', long, default_value_t = 2048)]
    pub ctx_size: usize,
    /// Largest number of tokens per graph (prompt micro-batch).
    #[arg(long, default_value_t = 512)]
    pub ubatch: usize,
}

impl ModelArgs {
    fn load(&self) -> Result<Arc<Model>, CliError> {
        if !self.model.exists() {
            return Err(format!(
                "model file {} not found (run scripts/fetch-model.sh for the demo model)",
                self.model.display()
            )
            .into());
        }
        let mut names: Vec<&str> = self
            .device
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        if names.is_empty() {
            return Err("--device: no device named".into());
        }
        let tensor_parallel = match self.split_mode.as_str() {
            "tensor" if names.len() < 2 => {
                return Err("--split-mode tensor needs at least two devices in --device".into())
            }
            "tensor" => true,
            "none" => {
                names.truncate(1);
                false
            }
            _ => false,
        };
        let devices = names
            .iter()
            .map(|n| rgml::registry::device(n))
            .collect::<Result<Vec<_>, rgml::Error>>()?;
        let tensor_split = match &self.tensor_split {
            None => Vec::new(),
            Some(list) => list
                .split(',')
                .map(|v| {
                    v.trim()
                        .parse::<f32>()
                        .map_err(|e| format!("--tensor-split {list}: '{v}': {e}"))
                })
                .collect::<Result<Vec<_>, String>>()?,
        };
        if !tensor_split.is_empty() && tensor_split.len() != devices.len() {
            return Err(format!(
                "--tensor-split {}: {} values for {} devices",
                self.tensor_split.as_deref().unwrap_or_default(),
                tensor_split.len(),
                devices.len()
            )
            .into());
        }
        let placement = if tensor_parallel {
            rgml_llm::Placement::Tensor {
                devices,
                shares: tensor_split,
                sync: if self.tensor_sync == "reduce" {
                    rgml_llm::TensorSync::Reduce
                } else {
                    rgml_llm::TensorSync::Gather
                },
            }
        } else {
            rgml_llm::Placement::Layers {
                devices,
                shares: tensor_split,
            }
        };
        let mut bar = Progress::new("loading");
        let options = rgml_llm::LoadOptions {
            placement: Some(placement),
            progress: Some(&mut |done, total| bar.update(done, total)),
        };
        let model = Model::load(&self.model, options)?;
        bar.finish();
        Ok(Arc::new(model))
    }

    fn session(&self, model: &Arc<Model>, n_ctx: usize) -> Result<Session, CliError> {
        let options = SessionOptions {
            n_ctx,
            n_ubatch: self.ubatch,
            n_threads: self.threads,
            device_params: Vec::new(),
        };
        let mut session = Session::new(model.clone(), &options)?;
        if self.trace.is_some() {
            session.set_trace(self.recorder.get_or_init(Default::default).clone());
        }
        Ok(session)
    }

    /// End of a command: write the `--trace` file.
    fn finish(&self) -> Result<(), CliError> {
        if let (Some(path), Some(trace)) = (&self.trace, self.recorder.get()) {
            trace
                .write(path)
                .map_err(|e| format!("--trace {}: {e}", path.display()))?;
            eprintln!("trace written to {}", path.display());
        }
        Ok(())
    }
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
            eprint!(
                "\r{} [{}{}] {pct:3}%",
                self.label,
                "#".repeat(filled),
                " ".repeat(30 - filled)
            );
        }
    }
    fn finish(&mut self) {
        if self.tty {
            eprintln!();
        }
    }
}

/// Flags of `rgml run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt (with `--chat`: the user's message).
    #[arg(short = 'p', long, default_value = "Once upon a time")]
    prompt: String,
    /// Tokens to generate.
    #[arg(short = 'n', long, default_value_t = 64)]
    n_predict: usize,
    /// Temperature (0: greedy).
    #[arg(long, default_value_t = 0.8)]
    temp: f32,
    /// Random seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Top-k (0: off).
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    /// Top-p (1: off).
    #[arg(long, default_value_t = 0.95)]
    top_p: f32,
    /// Min-p (0: off).
    #[arg(long, default_value_t = 0.05)]
    min_p: f32,
    /// Repetition penalty (1: off).
    #[arg(long, default_value_t = 1.0)]
    repeat_penalty: f32,
    /// Apply the model's chat template to the prompt as a user message.
    #[arg(long)]
    chat: bool,
    /// System message for `--chat`.
    #[arg(long)]
    system: Option<String>,
}

/// `rgml run`: stream a continuation of the prompt to stdout.
pub fn run(args: RunArgs) -> Result<bool, CliError> {
    let model = args.model.load()?;
    let tok = &model.tokenizer;
    let prompt = if args.chat {
        let mut messages = Vec::new();
        if let Some(s) = &args.system {
            messages.push(Message::new("system", s));
        }
        messages.push(Message::new("user", &args.prompt));
        ChatFormat::detect(model.chat_template()).apply(&messages)
    } else {
        args.prompt.clone()
    };
    let tokens = tok.encode(&prompt, EncodeOptions::prompt());
    if tokens.is_empty() {
        return Err("the prompt is empty".into());
    }
    let n_ctx = (tokens.len() + args.n_predict)
        .min(args.model.ctx_size)
        .max(tokens.len());
    let mut session = args.model.session(&model, n_ctx)?;
    let mut sampler = Sampler::new(SamplerParams {
        temp: args.temp,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repeat_penalty: args.repeat_penalty,
        seed: args.seed,
        ..Default::default()
    });
    let mut out = std::io::stdout().lock();
    if !args.chat {
        write!(out, "{prompt}")?;
        out.flush()?;
    }
    // `generate` evaluates the prompt before it returns, so this times the prompt alone.
    let t0 = Instant::now();
    let generation = session.generate(&tokens, &mut sampler, args.n_predict)?;
    let t_prompt = t0.elapsed();
    let mut decoder = tok.decoder(false);
    let t1 = Instant::now();
    let mut n_gen = 0;
    // It stops at an end-of-generation token, after -n tokens, or when the context is full.
    for next in generation {
        let next = next?;
        let piece = decoder.push(next)?;
        write!(out, "{piece}")?;
        out.flush()?;
        n_gen += 1;
    }
    let rest = decoder.finish();
    writeln!(out, "{rest}")?;
    let t_gen = t1.elapsed().as_secs_f64();
    eprintln!(
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
    model: ModelArgs,
    /// Prompt (special tokens such as `<|im_start|>` are parsed).
    #[arg(short = 'p', long)]
    prompt: String,
    /// How many of the best next tokens to print.
    #[arg(long, default_value_t = 10)]
    top: usize,
    /// Print `{"tokens": [...], "top": [[id, logit], ...]}`.
    #[arg(long)]
    json: bool,
}

/// `rgml logits`: the prompt's tokens and the best next tokens with their logits.
pub fn logits(args: LogitsArgs) -> Result<bool, CliError> {
    let model = args.model.load()?;
    let tokens = model
        .tokenizer
        .encode(&args.prompt, EncodeOptions::prompt());
    if tokens.is_empty() {
        return Err("the prompt is empty".into());
    }
    let mut session = args.model.session(&model, tokens.len())?;
    let logits = session.eval(&tokens, Logits::Last)?;
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    let top: Vec<(usize, f32)> = order
        .iter()
        .take(args.top)
        .map(|&i| (i, logits[i]))
        .collect();
    if args.json {
        let v = serde_json::json!({
            "tokens": tokens,
            "top": top.iter().map(|&(i, l)| serde_json::json!([i, l])).collect::<Vec<_>>(),
        });
        println!("{v}");
    } else {
        println!("tokens: {tokens:?}");
        for (i, l) in top {
            let piece = model.tokenizer.token_text(i as u32).unwrap_or_default();
            println!("{i:>8} {l:>10.4}  {piece:?}");
        }
    }
    args.model.finish()?;
    Ok(true)
}

/// Flags of `rgml perplexity`.
#[derive(Args, Debug)]
pub struct PerplexityArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Text file to score.
    #[arg(short = 'f', long)]
    file: PathBuf,
}

/// `rgml perplexity`, as llama-perplexity computes it: chunks of `-c` tokens, each evaluated
/// from an empty cache, the second half of each chunk scored.
pub fn perplexity(args: PerplexityArgs) -> Result<bool, CliError> {
    let text =
        std::fs::read_to_string(&args.file).map_err(|e| format!("{}: {e}", args.file.display()))?;
    let model = args.model.load()?;
    let tokens = model.tokenizer.encode(
        &text,
        EncodeOptions {
            add_special: true,
            parse_special: false,
        },
    );
    let n_ctx = args.model.ctx_size;
    if n_ctx < 2 {
        return Err("-c must be at least 2".into());
    }
    let n_chunks = tokens.len() / n_ctx;
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
    eprintln!("{} tokens, {n_chunks} chunks of {n_ctx}", tokens.len());
    for chunk in 0..n_chunks {
        let toks = &tokens[chunk * n_ctx..(chunk + 1) * n_ctx];
        session.reset();
        let logits = session.eval(toks, Logits::All)?;
        for j in first..n_ctx - 1 {
            let row = &logits[j * n_vocab..(j + 1) * n_vocab];
            nll -= log_softmax_at(row, toks[j + 1] as usize);
            count += 1;
        }
        print!("[{}]{:.4} ", chunk + 1, (nll / count as f64).exp());
        std::io::stdout().flush()?;
    }
    println!();
    println!("PPL = {:.4}", (nll / count as f64).exp());
    eprintln!("{:.2} s", t0.elapsed().as_secs_f64());
    args.model.finish()?;
    Ok(true)
}

fn log_softmax_at(row: &[f32], i: usize) -> f64 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = row.iter().map(|&l| (l as f64 - max).exp()).sum();
    row[i] as f64 - max - sum.ln()
}

/// Flags of `rgml bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt tokens per pp test.
    #[arg(short = 'p', long, default_value_t = 512)]
    n_prompt: usize,
    /// Generated tokens per tg test.
    #[arg(short = 'n', long, default_value_t = 128)]
    n_gen: usize,
    /// Repetitions.
    #[arg(short = 'r', long, default_value_t = 5)]
    reps: usize,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// `rgml bench`, as llama-bench measures: pp = one batch of P tokens from an empty cache, tg = N
/// single-token steps from an empty cache, each after a warm-up run, averaged over repetitions.
pub fn bench(args: BenchArgs) -> Result<bool, CliError> {
    let model = args.model.load()?;
    let n_ctx = args.n_prompt.max(args.n_gen).max(1);
    let mut session = args.model.session(&model, n_ctx)?;
    let n_vocab = model.config.n_vocab as u64;
    // Deterministic pseudo-random tokens, like llama-bench's random prompt.
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next_token = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n_vocab) as u32
    };
    let reps = args.reps.max(1);
    let mut pp = Vec::new();
    let mut tg = Vec::new();
    if args.n_prompt > 0 {
        let prompt: Vec<u32> = (0..args.n_prompt).map(|_| next_token()).collect();
        for rep in 0..=reps {
            session.reset();
            let t = Instant::now();
            session.decode(&prompt, Logits::Last)?;
            if rep > 0 {
                pp.push(args.n_prompt as f64 / t.elapsed().as_secs_f64());
            }
        }
    }
    if args.n_gen > 0 {
        for rep in 0..=reps {
            session.reset();
            let t = Instant::now();
            for _ in 0..args.n_gen {
                session.decode(&[next_token()], Logits::Last)?;
            }
            if rep > 0 {
                tg.push(args.n_gen as f64 / t.elapsed().as_secs_f64());
            }
        }
    }
    let stats = |v: &[f64]| -> (f64, f64) {
        if v.is_empty() {
            return (0.0, 0.0);
        }
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>()
            / v.len().max(2).saturating_sub(1) as f64;
        (mean, var.sqrt())
    };
    let (pp_mean, pp_sd) = stats(&pp);
    let (tg_mean, tg_sd) = stats(&tg);
    let threads = args
        .model
        .threads
        .unwrap_or_else(rgml_cpu::default_n_threads);
    if args.json {
        let v = serde_json::json!({
            "model": args.model.model.display().to_string(),
            "model_type": model.file_type(),
            "model_size": model.size_bytes(),
            "n_params": model.n_params(),
            "device": args.model.device,
            "threads": threads,
            "n_prompt": args.n_prompt,
            "n_gen": args.n_gen,
            "reps": reps,
            "pp_tok_s": pp_mean,
            "pp_tok_s_sd": pp_sd,
            "tg_tok_s": tg_mean,
            "tg_tok_s_sd": tg_sd,
        });
        println!("{v}");
    } else {
        println!("| model | size | params | device | threads | test | t/s |");
        println!("| --- | ---: | ---: | --- | ---: | --- | ---: |");
        let size = format!("{:.2} MiB", model.size_bytes() as f64 / (1 << 20) as f64);
        let params = format!("{:.2} M", model.n_params() as f64 / 1e6);
        let name = format!("{} {}", model.config.arch, model.file_type());
        if args.n_prompt > 0 {
            println!("| {name} | {size} | {params} | {} | {threads} | pp{} | {pp_mean:.2} ± {pp_sd:.2} |", args.model.device, args.n_prompt);
        }
        if args.n_gen > 0 {
            println!("| {name} | {size} | {params} | {} | {threads} | tg{} | {tg_mean:.2} ± {tg_sd:.2} |", args.model.device, args.n_gen);
        }
    }
    args.model.finish()?;
    Ok(true)
}

/// `rgml gguf-info`: a GGUF file's metadata and tensors.
pub fn gguf_info(path: &PathBuf) -> Result<bool, CliError> {
    let gguf = rgml_gguf::GgufFile::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    println!(
        "GGUF v{}, alignment {}, data at {}",
        gguf.version(),
        gguf.alignment(),
        gguf.data_offset()
    );
    println!("{} metadata entries:", gguf.metadata().len());
    for (k, v) in gguf.metadata() {
        println!("  {k} = {}", short_value(v));
    }
    println!("{} tensors:", gguf.tensors().len());
    for t in gguf.tensors() {
        println!(
            "  {:<32} {:<6} {:?} {} bytes at {}",
            t.name,
            t.dtype.name(),
            &t.ne[..t.n_dims.max(1)],
            t.size,
            t.offset
        );
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
