//! `rgml compare` on the demo model: two clean CPU devices agree on every node; bad device
//! lists are usage errors. (That a planted wrong kernel is reported at the first node of the
//! perturbed op is tested in `rgml-llm`'s `tests/compare.rs`, against the test-only
//! `PerturbCPU` backend, which the binary does not have.)

use std::path::PathBuf;
use std::process::{Command, Output};

mod common;
use common::gpu_device;

fn model() -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.exists(),
        "demo model not found at {}: run scripts/fetch-model.sh first",
        path.display()
    );
    path.display().to_string()
}

fn compare(env: &[(&str, &str)], devices: &str, extra: &[&str]) -> (Output, String) {
    let model = model();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rgml"));
    cmd.args([
        "compare", "-m", &model, "-p", "Hello", "--device", devices, "-t", "2",
    ])
    .args(extra);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run rgml");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    (out, stdout)
}

#[test]
fn two_cpu_devices_agree() {
    let (out, stdout) = compare(&[("RGML_CPU_DEVICES", "2")], "CPU0,CPU1", &["-v"]);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary = stdout.lines().last().unwrap_or_default();
    assert!(
        summary.starts_with("compared ") && summary.contains("first divergent: none"),
        "{summary}"
    );
    // -v prints one line per node, with llama.cpp's names.
    assert!(stdout.lines().count() > 100, "{stdout}");
    assert!(stdout.contains("ffn_swiglu-0"), "{stdout}");
}

#[test]
fn bad_device_lists_are_errors() {
    let (out, _) = compare(&[], "CPU", &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("exactly two devices"));
    let (out, _) = compare(&[], "CPU,NoSuchDevice", &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown device"));
}

/// The default tolerance shows real divergence: the GPU mirrors ggml's AVX-512 arithmetic, so
/// against the CPU computing as the AVX-512 build no node differs, and against the AVX2 build's
/// arithmetic (rounding differences only, NMSE far below the old default of 1e-5) nodes do.
#[test]
fn the_default_tolerance_shows_rounding_differences_from_the_gpu() {
    let Some(gpu) = gpu_device() else { return };
    let devices = format!("CPU,{gpu}");
    let (out, stdout) = compare(&[("RGML_CPU_ISA", "avx512")], &devices, &[]);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("first divergent: none"), "{stdout}");
    let (out, stdout) = compare(&[("RGML_CPU_ISA", "avx2")], &devices, &[]);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("DIVERGES"), "{stdout}");
    // The same run with the old default hides them.
    let (out, stdout) = compare(&[("RGML_CPU_ISA", "avx2")], &devices, &["--tol", "1e-5"]);
    assert!(out.status.success(), "{stdout}");
}
