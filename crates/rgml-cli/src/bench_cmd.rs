//! `rgml bench`: prompt and generation speed, measured as llama-bench measures them.
//!
//! This module owns the measurement: the tests (pp: one batch of P tokens; tg: N single-token
//! steps), the depth they start from (`-d`: tokens already in the KV cache, filled before the
//! timing and not counted), the warm-up and repetitions, and the table or JSON printed.
//!
//! llama-bench (`tools/llama-bench/llama-bench.cpp`) clears the cache before every repetition,
//! fills the depth with a prompt of random tokens the first time and restores that state
//! (`llama_state_seq_set_data`) the next times, then times the test alone. Here the depth is
//! filled once per depth and a repetition cuts the cache back to it (`seq_rm`): the same
//! cells, the same bytes. A model with sliding-window layers refills it instead, since its
//! local cache forgets positions that leave the window while a test runs; so does a model with
//! recurrent layers (Qwen3.5), whose state cannot be cut back.

use crate::error::CliError;
use crate::model_cmds::{check_context, parse_positive, ModelArgs};
use clap::Args;
use rgml::backend::DeviceType;
use rgml_llm::{Logits, Model, Session};
use std::io::Write;
use std::time::{Duration, Instant};

/// Flags of `rgml bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    /// Prompt tokens per pp test.
    #[arg(short = 'p', long, default_value_t = 512)]
    n_prompt: usize,
    /// Generated tokens per tg test.
    #[arg(short = 'n', long, default_value_t = 128)]
    n_gen: usize,
    /// Tokens already in the KV cache when each test starts (llama-bench's `-d`), filled
    /// before the timing; a comma list (`0,4096`) measures at each depth.
    #[arg(
        short = 'd',
        long = "n-depth",
        value_delimiter = ',',
        default_value = "0"
    )]
    depth: Vec<usize>,
    /// Repetitions.
    #[arg(short = 'r', long, default_value_t = 5, value_parser = parse_positive)]
    reps: usize,
    /// Print JSON (one line per depth).
    #[arg(long)]
    json: bool,
}

/// The tokens/s of one test's repetitions.
struct Speeds {
    mean: f64,
    sd: f64,
}

impl Speeds {
    fn of(samples: &[f64]) -> Speeds {
        if samples.is_empty() {
            return Speeds { mean: 0.0, sd: 0.0 };
        }
        let n = samples.len() as f64;
        let mean = samples.iter().sum::<f64>() / n;
        let var = samples.iter().map(|x| (x - mean).powi(2)).sum::<f64>()
            / samples.len().max(2).saturating_sub(1) as f64;
        Speeds {
            mean,
            sd: var.sqrt(),
        }
    }
}

/// `rgml bench`: pp and tg at each depth, each after a warm-up run, averaged over `-r`
/// repetitions.
pub fn bench(args: BenchArgs) -> Result<bool, CliError> {
    if args.n_prompt == 0 && args.n_gen == 0 {
        return Err(CliError::usage("-p 0 -n 0: nothing to measure"));
    }
    let n_ctx = context_needed(&args)?;
    let model = args.model.load()?;
    let session = args.model.session_for(&model, n_ctx, 1)?;
    let mut bencher = Bencher::new(session);
    let mut rows = Vec::new();
    for &depth in &args.depth {
        bencher.set_depth(depth)?;
        let pp = match args.n_prompt {
            0 => Speeds::of(&[]),
            n => Speeds::of(&bencher.measure(Test::Prompt(n), args.reps)?),
        };
        let tg = match args.n_gen {
            0 => Speeds::of(&[]),
            n => Speeds::of(&bencher.measure(Test::Gen(n), args.reps)?),
        };
        rows.push((depth, pp, tg));
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        for (depth, pp, tg) in &rows {
            writeln!(out, "{}", json_line(&args, &model, *depth, pp, tg))?;
        }
    } else {
        print_table(&mut out, &args, &model, &rows)?;
    }
    args.model.finish()?;
    Ok(true)
}

/// The context a session needs: every test starts from the deepest depth at most, and pp and
/// tg are separate tests (as llama-bench sizes its contexts: depth + P, depth + N). Without
/// `-c` that is allocated; a smaller `-c` is a usage error naming it.
fn context_needed(args: &BenchArgs) -> Result<usize, CliError> {
    let depth = args.depth.iter().copied().max().unwrap_or(0);
    let need = depth.saturating_add(args.n_prompt.max(args.n_gen));
    if let Some(ctx) = args.model.ctx {
        let what = match depth {
            0 => "bench".to_string(),
            d => format!("bench at depth {d} (-d)"),
        };
        check_context(&what, need, ctx)?;
    }
    Ok(need)
}

/// One timed test.
#[derive(Clone, Copy, Debug)]
enum Test {
    /// One batch of this many prompt tokens.
    Prompt(usize),
    /// This many single-token steps.
    Gen(usize),
}

impl Test {
    fn n_tokens(self) -> usize {
        match self {
            Test::Prompt(n) | Test::Gen(n) => n,
        }
    }
}

/// Deterministic pseudo-random tokens (xorshift), like llama-bench's random prompts.
struct Tokens {
    state: u64,
    n_vocab: u64,
}

impl Tokens {
    fn next(&mut self) -> u32 {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        (self.state % self.n_vocab) as u32
    }

    fn take(&mut self, n: usize) -> Vec<u32> {
        (0..n).map(|_| self.next()).collect()
    }
}

/// A session whose cache holds the depth's tokens when each test starts.
struct Bencher {
    session: Session,
    /// The tokens of the depth, in the cache before every test.
    depth: Vec<u32>,
    /// Whether cutting the cache back to the depth restores it (no sliding-window or
    /// recurrent layers).
    cut_back: bool,
    tokens: Tokens,
}

impl Bencher {
    fn new(session: Session) -> Bencher {
        let config = &session.model().config;
        Bencher {
            cut_back: config.sliding_window.is_none() && config.recurrent.is_none(),
            tokens: Tokens {
                state: 0x9E37_79B9_7F4A_7C15,
                n_vocab: config.n_vocab.max(1) as u64,
            },
            depth: Vec::new(),
            session,
        }
    }

    /// Fill the cache with `depth` tokens (not timed): the state the next tests start from.
    fn set_depth(&mut self, depth: usize) -> Result<(), CliError> {
        self.depth = self.tokens.take(depth);
        self.session.reset();
        self.fill_depth()
    }

    fn fill_depth(&mut self) -> Result<(), CliError> {
        if !self.depth.is_empty() {
            self.session.decode(&self.depth, Logits::Last)?;
        }
        Ok(())
    }

    /// Back to holding exactly the depth's tokens.
    fn restore(&mut self) -> Result<(), CliError> {
        let depth = self.depth.len();
        if self.session.n_past() == depth {
            return Ok(());
        }
        if self.cut_back {
            self.session.seq_rm(0, depth..usize::MAX)?;
            return Ok(());
        }
        self.session.reset();
        self.fill_depth()
    }

    /// Run `test` from the depth; its time (the restore before it is not timed).
    fn time(&mut self, test: Test, prompt: &[u32]) -> Result<Duration, CliError> {
        self.restore()?;
        let t = Instant::now();
        match test {
            Test::Prompt(_) => {
                self.session.decode(prompt, Logits::Last)?;
            }
            Test::Gen(n) => {
                for _ in 0..n {
                    let token = self.tokens.next();
                    self.session.decode(&[token], Logits::Last)?;
                }
            }
        }
        Ok(t.elapsed())
    }

    /// Tokens/s of `reps` runs of `test`, after one warm-up run (not counted).
    fn measure(&mut self, test: Test, reps: usize) -> Result<Vec<f64>, CliError> {
        let prompt = match test {
            Test::Prompt(n) => self.tokens.take(n),
            Test::Gen(_) => Vec::new(),
        };
        self.time(test, &prompt)?;
        (0..reps)
            .map(|_| {
                let t = self.time(test, &prompt)?;
                Ok(test.n_tokens() as f64 / t.as_secs_f64().max(1e-9))
            })
            .collect()
    }
}

/// The devices holding the model, comma-separated.
fn devices_used(model: &Model) -> String {
    let names: Vec<&str> = model.devices().iter().map(|d| d.name()).collect();
    names.join(",")
}

/// Layers on devices other than CPUs, counted as llama.cpp's `n_gpu_layers` (the output head
/// is one).
fn gpu_layers(model: &Model) -> usize {
    let off_cpu = |dev: Option<usize>| {
        dev.and_then(|i| model.devices().get(i))
            .is_some_and(|d| d.device_type() != DeviceType::Cpu)
    };
    let blocks = (0..model.config.n_layer)
        .filter(|&il| off_cpu(model.layer_device(il)))
        .count();
    blocks + usize::from(off_cpu(Some(model.output_device())))
}

fn threads(args: &BenchArgs) -> usize {
    args.model
        .threads
        .unwrap_or_else(rgml_cpu::default_n_threads)
}

fn json_line(
    args: &BenchArgs,
    model: &Model,
    depth: usize,
    pp: &Speeds,
    tg: &Speeds,
) -> serde_json::Value {
    serde_json::json!({
        "model": args.model.model.display().to_string(),
        "model_type": model.file_type(),
        "model_size": model.size_bytes(),
        "n_params": model.n_params(),
        "device": devices_used(model),
        "n_gpu_layers": gpu_layers(model),
        "threads": threads(args),
        "n_prompt": args.n_prompt,
        "n_gen": args.n_gen,
        "depth": depth,
        "reps": args.reps,
        "pp_tok_s": pp.mean,
        "pp_tok_s_sd": pp.sd,
        "tg_tok_s": tg.mean,
        "tg_tok_s_sd": tg.sd,
    })
}

/// llama-bench's markdown table: a row per test, `pp512 @ d4096` for a test at a depth.
fn print_table(
    out: &mut impl Write,
    args: &BenchArgs,
    model: &Model,
    rows: &[(usize, Speeds, Speeds)],
) -> Result<(), CliError> {
    writeln!(
        out,
        "| model | size | params | device | threads | test | t/s |"
    )?;
    writeln!(out, "| --- | ---: | ---: | --- | ---: | --- | ---: |")?;
    let size = format!("{:.2} MiB", model.size_bytes() as f64 / (1 << 20) as f64);
    let params = format!("{:.2} M", model.n_params() as f64 / 1e6);
    let name = format!("{} {}", model.config.arch, model.file_type());
    let front = format!(
        "| {name} | {size} | {params} | {} | {} |",
        devices_used(model),
        threads(args)
    );
    for (depth, pp, tg) in rows {
        let at = match depth {
            0 => String::new(),
            d => format!(" @ d{d}"),
        };
        for (test, n, speed) in [("pp", args.n_prompt, pp), ("tg", args.n_gen, tg)] {
            if n > 0 {
                let (mean, sd) = (speed.mean, speed.sd);
                writeln!(out, "{front} {test}{n}{at} | {mean:.2} ± {sd:.2} |")?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn parse(args: &[&str]) -> Result<BenchArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied())).map(|c| c.bench)
    }

    #[test]
    fn depth_is_one_value_or_a_list() {
        assert_eq!(parse(&[]).unwrap().depth, [0]);
        assert_eq!(parse(&["-d", "4096"]).unwrap().depth, [4096]);
        assert_eq!(
            parse(&["--n-depth", "0,512,4096"]).unwrap().depth,
            [0, 512, 4096]
        );
        for bad in ["-1", "x", "1,,2", "1.5"] {
            assert!(parse(&["-d", bad]).is_err(), "-d {bad}");
        }
    }

    #[test]
    fn the_context_covers_the_depth_and_the_longer_test() {
        let need = |args: &[&str]| context_needed(&parse(args).unwrap());
        assert_eq!(need(&["-p", "512", "-n", "128"]).unwrap(), 512);
        assert_eq!(
            need(&["-d", "4096", "-p", "512", "-n", "128"]).unwrap(),
            4608
        );
        // Without -c the context is what the bench needs, beyond the default 2048.
        assert_eq!(
            need(&["-d", "0,3000", "-p", "8", "-n", "16"]).unwrap(),
            3016
        );
        assert_eq!(need(&["-d", "100", "-c", "612", "-p", "512"]).unwrap(), 612);
        let e = need(&["-d", "100", "-c", "611", "-p", "512"]).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("depth 100") && msg.contains("-c"), "{msg}");
        assert_eq!(e.exit_code(), 2);
    }

    /// The demo model on the CPU, in a session of `n_ctx` positions.
    fn demo_session(n_ctx: usize) -> Session {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(crate::model_cmds::DEFAULT_MODEL);
        assert!(path.exists(), "run scripts/fetch-model.sh first");
        rgml_cpu::register();
        let model = Model::load(path, Default::default()).expect("load the demo model");
        let options = rgml_llm::SessionOptions {
            n_ctx,
            n_ubatch: 16,
            n_threads: Some(1),
            ..Default::default()
        };
        Session::new(std::sync::Arc::new(model), &options).expect("session")
    }

    #[test]
    fn every_test_starts_with_the_depth_in_the_cache() {
        let mut bencher = Bencher::new(demo_session(64));
        assert!(
            bencher.cut_back,
            "the demo model has no sliding-window layers"
        );
        for cut_back in [true, false] {
            bencher.cut_back = cut_back;
            // 40 tokens: three micro-batches of 16, filled before any test.
            bencher.set_depth(40).unwrap();
            assert_eq!(bencher.session.n_past(), 40);
            let depth = bencher.depth.clone();
            for test in [Test::Prompt(5), Test::Gen(3), Test::Prompt(5)] {
                let prompt = bencher.tokens.take(test.n_tokens());
                bencher.time(test, &prompt).unwrap();
                // The test's tokens went after the depth, not after an earlier test's.
                assert_eq!(bencher.session.n_past(), 40 + test.n_tokens(), "{test:?}");
                assert_eq!(bencher.depth, depth);
            }
            // A test from the restored depth computes what it computes after a fresh fill.
            let prompt = bencher.tokens.take(4);
            bencher.time(Test::Prompt(4), &prompt).unwrap();
            let after_restore = bencher.session.logits().to_vec();
            bencher.session.reset();
            bencher.session.decode(&depth, Logits::Last).unwrap();
            let fresh = bencher.session.decode(&prompt, Logits::Last).unwrap();
            assert_eq!(after_restore, fresh, "cut back: {cut_back}");
        }
        // Warm-up and repetitions: `reps` speeds, and the depth still there.
        assert_eq!(bencher.measure(Test::Gen(2), 2).unwrap().len(), 2);
        bencher.restore().unwrap();
        assert_eq!(bencher.session.n_past(), 40);
    }
}
