//! `-ngl N` (llama.cpp's `--n-gpu-layers`) and `bench -d`, through the command line: where the
//! layers go (the loader's report on stderr and the `--trace` of the run), the logits against
//! the CPU's, the default placement, the flag combinations refused by name, and the depth of
//! `bench`. The GPU tests run on the first GPU `rgml devices` lists (lavapipe in CI, named
//! with `--device`: a CPU driver is only used when named).

use std::process::{Command, Output};

mod common;
use common::{demo_model, gpu_device};

/// Blocks of the demo model.
const N_LAYER: usize = 30;

/// A short prompt: every run here stays small.
const PROMPT: &str = "The capital of France is";

fn rgml(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rgml"))
        .args(args)
        .arg("-m")
        .arg(demo_model())
        // The GPU's exact arithmetic (the default on lavapipe, asked for on GPUs) mirrors the
        // AVX-512 build's; the CPU does too under this ISA.
        .env("RGML_WGPU_EXACT", "1")
        .env("RGML_CPU_ISA", "avx512")
        .env("RGML_CPU_DEVICES", "2")
        .output()
        .expect("run rgml")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn ok(args: &[&str]) -> Output {
    let out = rgml(args);
    assert!(out.status.success(), "rgml {args:?}: {}", stderr(&out));
    out
}

/// `rgml logits --json` with `extra` flags and a `--trace`: the top-10 (id, logit), stderr, and
/// the trace's tracks (backend names) with the names of its events on each.
struct Run {
    top: Vec<(u64, f64)>,
    stderr: String,
    tracks: Vec<(String, Vec<String>)>,
}

fn logits(extra: &[&str]) -> Run {
    let trace = std::env::temp_dir().join(format!(
        "rgml-offload-{}-{}.json",
        std::process::id(),
        extra.join("_").replace(['/', ','], "-")
    ));
    let mut args = vec!["logits", "-fa", "off", "-p", PROMPT, "--json", "-t", "2"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--trace", trace.to_str().expect("UTF-8 path")]);
    let out = ok(&args);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON output");
    let top = common::top_pairs(&v);
    let text = std::fs::read_to_string(&trace).expect("trace written");
    let _ = std::fs::remove_file(&trace);
    Run {
        top,
        stderr: stderr(&out),
        tracks: tracks(&serde_json::from_str(&text).expect("trace JSON")),
    }
}

/// A Chrome trace's tracks: each thread's name and the names of its complete events.
fn tracks(trace: &serde_json::Value) -> Vec<(String, Vec<String>)> {
    let events = trace["traceEvents"].as_array().expect("traceEvents");
    let mut tracks: Vec<(u64, String, Vec<String>)> = events
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "thread_name")
        .map(|e| {
            let name = e["args"]["name"].as_str().unwrap_or_default().to_string();
            (e["tid"].as_u64().unwrap_or(0), name, Vec::new())
        })
        .collect();
    for e in events.iter().filter(|e| e["ph"] == "X") {
        if let Some(t) = tracks.iter_mut().find(|t| Some(t.0) == e["tid"].as_u64()) {
            t.2.push(e["name"].as_str().unwrap_or_default().to_string());
        }
    }
    tracks
        .into_iter()
        .map(|(_, name, events)| (name, events))
        .collect()
}

impl Run {
    /// The track of each split of the graph, in split order (`split 0`, `split 1`, ...).
    fn split_tracks(&self) -> Vec<&str> {
        let mut splits: Vec<(usize, &str)> = self
            .tracks
            .iter()
            .flat_map(|(name, events)| {
                events
                    .iter()
                    .filter_map(|e| e.strip_prefix("split ")?.parse().ok())
                    .map(move |i| (i, name.as_str()))
            })
            .collect();
        splits.sort();
        splits.dedup();
        splits.into_iter().map(|s| s.1).collect()
    }

    /// The largest top-10 logit difference from `other` (same ids in the same order).
    fn worst_difference(&self, other: &Run) -> f64 {
        let ids = |r: &Run| r.top.iter().map(|t| t.0).collect::<Vec<_>>();
        assert_eq!(ids(self), ids(other), "top-10 ids");
        self.top
            .iter()
            .zip(&other.top)
            .map(|(a, b)| (a.1 - b.1).abs())
            .fold(0.0, f64::max)
    }
}

#[test]
fn ngl_puts_exactly_the_last_layers_on_the_named_gpu() {
    let Some(gpu) = gpu_device() else { return };
    let cpu = logits(&["--device", "CPU"]);
    let devices = format!("CPU,{gpu}");
    // -ngl K: the output head and the last K - 1 blocks (llama.cpp counts the head as a layer
    // and offloads it first); 31 and more: all of them.
    for (k, blocks) in [(1, 0), (8, 7), (N_LAYER + 1, N_LAYER), (99, N_LAYER)] {
        let run = logits(&["--device", &devices, "-ngl", &k.to_string()]);
        let layers = (blocks + 1).min(N_LAYER + 1);
        let report = format!(
            "offloaded {layers}/{} layers to {gpu} (the output head and {blocks} of {N_LAYER} \
             blocks)",
            N_LAYER + 1
        );
        assert!(run.stderr.contains(&report), "-ngl {k}: {}", run.stderr);
        // The embedding lookup (and the first blocks) on the CPU, then one split on the GPU
        // with the last blocks and the head: the logits come from the GPU.
        assert_eq!(run.split_tracks(), ["CPU", gpu.as_str()], "-ngl {k}");
        if blocks < N_LAYER {
            // The hidden state crosses where the offloaded blocks begin, nowhere else.
            let boundary = format!("-{}", N_LAYER - blocks - 1);
            let gpu_events = &run.tracks.iter().find(|t| t.0 == gpu).expect("GPU track").1;
            let crossings: Vec<&String> = gpu_events
                .iter()
                .filter(|e| e.starts_with("copy ") && e.contains('-'))
                .filter(|e| e.starts_with("copy ffn_") || e.starts_with("copy l_out"))
                .collect();
            assert!(
                !crossings.is_empty() && crossings.iter().all(|e| e.ends_with(&boundary)),
                "-ngl {k}: hidden state copied as {crossings:?}"
            );
        }
        let worst = run.worst_difference(&cpu);
        eprintln!("-ngl {k} on {gpu}: largest top-10 difference from the CPU {worst:.2e}");
        assert!(worst <= 1e-3, "-ngl {k}: {worst}");
    }
}

#[test]
fn ngl_zero_keeps_everything_on_the_cpu() {
    let Some(gpu) = gpu_device() else { return };
    let cpu = logits(&["--device", "CPU"]);
    for devices in [format!("CPU,{gpu}"), format!("{gpu},CPU")] {
        let run = logits(&["--device", &devices, "-ngl", "0"]);
        assert!(!run.stderr.contains("offloaded"), "{}", run.stderr);
        let names: Vec<&str> = run.tracks.iter().map(|t| t.0.as_str()).collect();
        assert_eq!(names, ["CPU"], "--device {devices} -ngl 0");
        assert_eq!(
            run.top, cpu.top,
            "--device {devices} -ngl 0: the CPU's logits"
        );
    }
}

/// Whether every GPU `rgml devices` lists is a CPU driver (lavapipe): then the default is the
/// CPU.
fn only_cpu_drivers() -> bool {
    let out = Command::new(env!("CARGO_BIN_EXE_rgml"))
        .args(["devices", "--json"])
        .output()
        .expect("rgml devices");
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    list.as_array().expect("array").iter().all(|d| {
        d["type"] == "cpu"
            || d["description"]
                .as_str()
                .is_some_and(|s| s.contains("llvmpipe"))
    })
}

#[test]
fn without_a_gpu_the_default_and_ngl_run_on_the_cpu() {
    if !only_cpu_drivers() {
        eprintln!("a GPU is present: the default placement is the GPU's; skipping");
        return;
    }
    let cpu = logits(&["--device", "CPU"]);
    let default = logits(&[]);
    assert_eq!(default.split_tracks(), ["CPU"]);
    assert_eq!(default.top, cpu.top, "the default is the CPU, bit for bit");
    assert!(default.stderr.is_empty() || !default.stderr.contains("warning"));
    // A habit of `-ngl 99` still runs, on the CPU, with a warning naming the flag.
    let habit = logits(&["-ngl", "99"]);
    assert_eq!(habit.split_tracks(), ["CPU"]);
    assert_eq!(habit.top, cpu.top);
    assert!(
        habit.stderr.contains("warning: -ngl 99: no GPU found"),
        "{}",
        habit.stderr
    );
}

/// `rgml ARGS` fails with status 2 and a message holding each of `words`.
fn usage_error(args: &[&str], words: &[&str]) {
    let out = rgml(args);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "rgml {args:?}: {err}");
    for w in words {
        assert!(err.contains(w), "rgml {args:?}: '{w}' not in {err}");
    }
    assert!(
        out.stdout.is_empty(),
        "rgml {args:?} printed before the error"
    );
}

#[test]
fn combinations_that_make_no_sense_are_refused_by_name() {
    fn with<'a>(extra: &[&'a str]) -> Vec<&'a str> {
        [&["logits", "-p", PROMPT][..], extra].concat()
    }
    usage_error(
        &with(&[
            "--device",
            "CPU0,CPU1",
            "--split-mode",
            "tensor",
            "-ngl",
            "4",
        ]),
        &["-ngl 4", "--split-mode tensor"],
    );
    usage_error(
        &with(&[
            "--device",
            "CPU0,CPU1",
            "--tensor-split",
            "1,1",
            "-ngl",
            "4",
        ]),
        &["-ngl 4", "--tensor-split 1,1"],
    );
    usage_error(
        &with(&["--device", "CPU", "-ngl", "8"]),
        &["-ngl 8", "--device CPU", "no GPU"],
    );
    usage_error(
        &with(&["--device", "CPU0,CPU1", "-ngl", "all"]),
        &["-ngl all", "--device CPU0,CPU1", "one GPU"],
    );
    usage_error(&with(&["-ngl", "half"]), &["half", "'all' or 'auto'"]);
    // The flag is the same on every model command, serve included.
    usage_error(
        &[
            "serve",
            "-ngl",
            "2",
            "--split-mode",
            "tensor",
            "--port",
            "0",
        ],
        &["-ngl 2", "--split-mode tensor"],
    );
    usage_error(
        &[
            "perplexity",
            "-f",
            "/dev/null",
            "--gpu-layers",
            "1",
            "--tensor-split",
            "1",
        ],
        &["-ngl 1", "--tensor-split 1"],
    );
}

/// `rgml bench --json` lines, with `extra` flags.
fn bench(extra: &[&str]) -> Vec<serde_json::Value> {
    let mut args = vec![
        "bench", "-p", "8", "-n", "2", "-r", "1", "-t", "2", "--json",
    ];
    args.extend_from_slice(extra);
    let out = ok(&args);
    String::from_utf8(out.stdout)
        .expect("UTF-8")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

#[test]
fn bench_measures_at_each_depth_with_the_context_it_needs() {
    let lines = bench(&["-d", "0,40"]);
    let depths: Vec<u64> = lines
        .iter()
        .map(|v| v["depth"].as_u64().unwrap_or(9))
        .collect();
    assert_eq!(depths, [0, 40]);
    for v in &lines {
        assert!(v["pp_tok_s"].as_f64().is_some_and(|x| x > 0.0), "{v}");
        assert!(v["tg_tok_s"].as_f64().is_some_and(|x| x > 0.0), "{v}");
        assert_eq!(v["device"], "CPU");
        assert_eq!(v["n_gpu_layers"], 0);
    }
    assert_eq!(bench(&["-ngl", "0", "--n-depth", "16"])[0]["depth"], 16);
    // A -c below depth + the longer test is refused, naming both.
    usage_error(
        &["bench", "-d", "100", "-p", "8", "-n", "2", "-c", "107"],
        &["depth 100", "108 tokens", "-c"],
    );
    usage_error(&["bench", "-d", "x"], &["--n-depth"]);
}
