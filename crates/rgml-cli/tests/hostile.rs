//! Hostile invocations of the `rgml` binary (issue 15), one test per kind of input: each ends
//! with a clear error and the documented exit status (2 usage, 1 runtime, 141 closed pipe),
//! never a panic, a signal, a hang or a silent success. `scripts/hostile.sh` runs the same
//! inputs against the release binary and prints them as a table.

use rgml_gguf::{GgufFile, GgufWriter, Value};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn model() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.exists(),
        "demo model missing: run scripts/fetch-model.sh"
    );
    path
}

fn rgml() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rgml"));
    // The native arithmetic, whatever the caller's environment forces.
    cmd.env_remove("RGML_CPU_ISA");
    cmd
}

/// Run with `args` (the demo model first when `with_model`), wait at most `limit`.
fn run_limited(args: &[&str], with_model: bool, limit: Duration) -> Output {
    let mut cmd = rgml();
    if let Some((sub, rest)) = args.split_first() {
        cmd.arg(sub);
        if with_model {
            cmd.arg("-m").arg(model()).args(["-t", "1"]);
        }
        cmd.args(rest);
    }
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rgml");
    wait_limited(child, limit)
}

fn wait_limited(mut child: Child, limit: Duration) -> Output {
    let start = Instant::now();
    loop {
        if child.try_wait().expect("wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "timed out after {limit:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn with_model(args: &[&str]) -> Output {
    run_limited(args, true, Duration::from_secs(120))
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Exit `code` with an error message containing every one of `words`, and no panic.
#[track_caller]
fn expect_error(out: &Output, code: i32, words: &[&str]) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(code), "{err}");
    assert!(err.starts_with("error: "), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    for w in words {
        assert!(err.contains(w), "'{w}' missing from: {err}");
    }
}

/// A temporary file path, unique to this process and `name`.
fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("rgml-hostile-{}-{name}", std::process::id()))
}

/// The demo model rewritten: metadata `overrides`, and tensor bytes through `bytes`.
fn variant(name: &str, overrides: &[(&str, Value)], bytes: impl Fn(&[u8]) -> Vec<u8>) -> PathBuf {
    let file = GgufFile::open(model()).expect("demo model");
    let mut w = GgufWriter::new();
    for (k, v) in file.metadata() {
        w.add_metadata(k.clone(), v.clone());
    }
    for (k, v) in overrides {
        w.add_metadata(*k, v.clone());
    }
    for t in file.tensors() {
        let data = bytes(file.tensor_data(t));
        w.add_tensor(&t.name, t.dtype, &t.ne[..t.n_dims], &data)
            .expect("tensor");
    }
    let path = temp_path(name);
    w.write_file(&path).expect("write variant");
    path
}

#[test]
fn a_closed_output_pipe_ends_quietly_with_141() {
    let m = model();
    let m = m.to_str().expect("UTF-8 path");
    for args in [
        vec!["gguf-info", m],
        vec!["logits", "-m", m, "-t", "1", "-p", "Hello"],
        vec!["test-ops", "-b", "CPU", "-o", "ADD"],
        vec!["devices"],
    ] {
        let mut child = rgml()
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        // The reader goes away before the first line: every write fails with EPIPE.
        drop(child.stdout.take());
        let out = wait_limited(child, Duration::from_secs(120));
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(141), "{args:?}: {err}");
        assert!(
            !err.contains("panicked") && !err.contains("error"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn a_full_disk_is_an_error() {
    let full = Path::new("/dev/full");
    if !full.exists() {
        return;
    }
    let m = model();
    let m = m.to_str().expect("UTF-8 path");
    for args in [
        vec!["gguf-info", m],
        vec!["devices"],
        vec!["logits", "-m", m, "-t", "1", "-p", "Hello"],
        vec!["bench", "-m", m, "-t", "1", "-p", "8", "-n", "2", "-r", "1"],
    ] {
        let out = rgml()
            .args(&args)
            .stdout(std::fs::File::create(full).expect("/dev/full"))
            .output()
            .expect("run");
        expect_error(&out, 1, &["writing the output", "No space left"]);
    }
}

#[test]
fn a_context_beyond_memory_is_refused_before_it_is_taken() {
    // 10^8 positions of this model's cache are 2.3 TB: more than any machine has free.
    let start = Instant::now();
    let out = with_model(&["run", "-c", "100000000", "-n", "100000000", "-p", "Hi"]);
    expect_error(&out, 1, &["KV cache", "free", "-c"]);
    assert!(out.stdout.is_empty(), "nothing is printed before the error");
    assert!(start.elapsed() < Duration::from_secs(60));
}

#[test]
fn perplexity_reads_endless_input_with_a_limit_and_needs_a_scored_half() {
    let out = with_model(&["perplexity", "-f", "/dev/zero"]);
    expect_error(&out, 1, &["/dev/zero", "MiB"]);
    let text = temp_path("ppl.txt");
    std::fs::write(
        &text,
        "The quick brown fox jumps over the lazy dog. ".repeat(20),
    )
    .unwrap();
    let out = with_model(&["perplexity", "-c", "2", "-f", text.to_str().unwrap()]);
    expect_error(&out, 2, &["-c", "at least 3"]);
    std::fs::remove_file(text).unwrap();
}

#[test]
fn generation_past_the_context_stops_and_says_so() {
    for n in ["18446744073709551615", "1000000"] {
        let out = with_model(&["run", "-c", "32", "-n", n, "--temp", "0", "-p", "Once"]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(0), "{err}");
        assert!(
            err.contains("generation stopped after") && err.contains("context of 32"),
            "{err}"
        );
        assert!(err.contains("generated: 32 tokens"), "{err}");
    }
}

#[test]
fn the_context_flag_is_checked_by_every_command() {
    let long = "one two three four five six seven eight nine ten";
    let out = with_model(&["run", "-c", "0", "-p", long]);
    expect_error(&out, 2, &["ctx-size", "at least 1"]);
    for args in [
        vec!["run", "-c", "3", "-p", long],
        vec!["logits", "-c", "3", "-p", long],
        vec!["bench", "-c", "100", "-p", "512", "-n", "1"],
    ] {
        let out = with_model(&args);
        expect_error(&out, 2, &["more than the context", "-c"]);
        assert!(
            out.stdout.is_empty(),
            "{args:?}: nothing printed before the error"
        );
    }
}

#[test]
fn sampling_settings_out_of_range_are_usage_errors() {
    for (flag, value) in [
        ("--temp", "NaN"),
        ("--temp", "-1"),
        ("--top-p", "0"),
        ("--top-p", "1.5"),
        ("--min-p", "2"),
        ("--repeat-penalty", "0"),
        ("--repeat-penalty", "NaN"),
        ("--repeat-penalty", "-1"),
    ] {
        let out = with_model(&["run", flag, value]);
        expect_error(&out, 2, &[flag, "must be"]);
    }
}

#[test]
fn thread_counts_are_bounded_and_warned_about() {
    for t in ["0", "1000"] {
        let out = run_limited(&["bench", "-t", t], false, Duration::from_secs(60));
        expect_error(&out, 2, &["threads"]);
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let more = (cores + 1).to_string();
    let out = run_limited(
        &[
            "logits",
            "-m",
            model().to_str().unwrap(),
            "-t",
            &more,
            "-p",
            "Hi",
        ],
        false,
        Duration::from_secs(120),
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("warning: -t") && err.contains("cores"),
        "{err}"
    );
}

#[test]
fn weights_that_are_nan_stop_generation_with_an_error_naming_the_tensor() {
    let nan = variant("nan.gguf", &[], |b| vec![0xFF; b.len()]);
    let path = nan.to_str().unwrap();
    for args in [
        vec!["run", "-m", path, "-t", "1", "-n", "4", "-p", "Hi"],
        vec!["logits", "-m", path, "-t", "1", "-p", "Hi"],
    ] {
        let out = run_limited(&args, false, Duration::from_secs(120));
        expect_error(
            &out,
            1,
            &["not finite", "first non-finite tensor", "inp_embd"],
        );
    }
    std::fs::remove_file(nan).unwrap();
}

#[test]
fn hyper_parameters_are_checked_before_any_output() {
    let cases = [
        (
            "rope0.gguf",
            ("llama.rope.dimension_count", Value::U32(0)),
            "rope.dimension_count",
        ),
        (
            "blocks29.gguf",
            ("llama.block_count", Value::U32(29)),
            "beyond the block count",
        ),
    ];
    for (name, over, words) in cases {
        let path = variant(name, &[over], |b| b.to_vec());
        let out = run_limited(
            &[
                "run",
                "-m",
                path.to_str().unwrap(),
                "-t",
                "1",
                "-p",
                "Hello",
            ],
            false,
            Duration::from_secs(120),
        );
        expect_error(&out, 1, &[words]);
        assert!(out.stdout.is_empty(), "{name}: the prompt was echoed first");
        std::fs::remove_file(path).unwrap();
    }
}

/// Start a long greedy run on a copy of the model, wait until it has printed some text, then
/// `change` the file; the run must end with status 1 and an error.
fn change_during_run(name: &str, change: impl FnOnce(&Path)) {
    let copy = temp_path(name);
    std::fs::copy(model(), &copy).expect("copy model");
    let mut child = rgml()
        .args([
            "run",
            "-m",
            copy.to_str().unwrap(),
            "-t",
            "1",
            "-n",
            "100000",
        ])
        .args(["-c", "4096", "--temp", "0", "-p", "Once upon a time"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut first = Vec::new();
    // The prompt is echoed at once; a few generated bytes follow.
    while first.len() < 40 {
        let buf = stdout.fill_buf().expect("read");
        assert!(!buf.is_empty(), "rgml ended before generating");
        first.extend_from_slice(buf);
        let n = buf.len();
        stdout.consume(n);
    }
    change(&copy);
    let reader = std::thread::spawn(move || {
        let mut rest = Vec::new();
        let _ = stdout.read_to_end(&mut rest);
    });
    let out = wait_limited(child, Duration::from_secs(120));
    let _ = reader.join();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{name}: {err}");
    assert!(
        err.contains("truncated or rewritten") || err.contains("changed while in use"),
        "{name}: {err}"
    );
    std::fs::remove_file(copy).unwrap();
}

#[test]
fn a_model_file_truncated_during_a_run_is_an_error_not_a_signal() {
    change_during_run("truncated.gguf", |path| {
        let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        file.set_len(4096).unwrap();
    });
}

#[test]
fn a_model_file_rewritten_in_place_during_a_run_is_an_error() {
    change_during_run("rewritten.gguf", |path| {
        use std::io::{Seek, SeekFrom, Write};
        let mut file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        let len = file.metadata().unwrap().len();
        file.seek(SeekFrom::Start(len / 2)).unwrap();
        file.write_all(&vec![0x5A; 1 << 20]).unwrap();
    });
}

#[test]
fn bad_paths_and_files_are_named_once() {
    let dir = std::env::temp_dir();
    let dir = dir.to_str().unwrap();
    for args in [vec!["run", "-m", dir], vec!["gguf-info", dir]] {
        let out = run_limited(&args, false, Duration::from_secs(60));
        expect_error(&out, 1, &["not a regular file"]);
        assert_eq!(stderr(&out).matches(dir).count(), 1, "{}", stderr(&out));
    }
    let text = temp_path("not.gguf");
    std::fs::write(&text, "# not a model\n").unwrap();
    let out = run_limited(
        &["gguf-info", text.to_str().unwrap()],
        false,
        Duration::from_secs(60),
    );
    expect_error(&out, 1, &["not a GGUF file", "\"# no\""]);
    std::fs::remove_file(text).unwrap();
}

#[test]
fn a_bad_trace_path_fails_before_the_run() {
    let out = with_model(&["run", "-n", "1000", "--trace", "/no/such/dir/x.json"]);
    expect_error(&out, 2, &["--trace", "/no/such/dir/x.json"]);
    assert!(out.stdout.is_empty(), "the run started before the error");
}

#[cfg(target_os = "linux")]
#[test]
fn a_cpu_only_command_does_not_start_the_gpu_driver() {
    let mut child = rgml()
        .args(["run", "-m", model().to_str().unwrap(), "-t", "1"])
        .args([
            "--device", "CPU", "-n", "100000", "-c", "4096", "--temp", "0",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = Vec::new();
    // The model is loaded and generating once text comes.
    let _ = stdout.fill_buf();
    line.extend_from_slice(stdout.buffer());
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", child.id())).unwrap_or_default();
    let _ = child.kill();
    let _ = child.wait();
    assert!(!line.is_empty(), "no output");
    assert!(!maps.is_empty());
    assert!(
        !maps.contains("libvulkan") && !maps.contains("lvp_icd") && !maps.contains("libvulkan_"),
        "a Vulkan driver was loaded by a CPU-only run"
    );
}

#[cfg(target_os = "linux")]
#[test]
fn a_large_context_is_reserved_not_touched() {
    // 200k positions: a 4.3 GB cache. Where it fits, generation starts at once and the process
    // stays small (the cache is neither cleared nor zeroed page by page up front).
    let mut child = rgml()
        .args(["run", "-m", model().to_str().unwrap(), "-t", "1"])
        .args(["-c", "200000", "-n", "100000", "--temp", "0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let started = stdout.fill_buf().map(|b| !b.is_empty()).unwrap_or(false);
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id()));
    let _ = child.kill();
    let out = child.wait_with_output().expect("output");
    if !started {
        // Not enough free memory here: then it must be the KV cache error.
        expect_error(&out, 1, &["KV cache", "-c"]);
        return;
    }
    let status = status.unwrap_or_default();
    let hwm_kib: usize = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .expect("VmHWM");
    assert!(
        hwm_kib < 1 << 20,
        "peak resident {hwm_kib} KiB with a 4.3 GB cache"
    );
}
