//! `rgml compare` on the demo model: two clean CPU devices agree on every node; a planted wrong
//! kernel (the test-only `PerturbCPU` device, enabled by `RGML_TEST_PERTURB_OP`) is reported at
//! the first node of the perturbed op, and the command fails.

use std::path::PathBuf;
use std::process::{Command, Output};

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
fn planted_wrong_kernel_is_found_at_its_first_node() {
    let (out, stdout) = compare(&[("RGML_TEST_PERTURB_OP", "SWIGLU")], "CPU,PerturbCPU", &[]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a divergence exits with 1: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary = stdout.lines().last().unwrap_or_default();
    assert!(
        summary.contains("first divergent: #") && summary.contains(" ffn_swiglu-0 (SWIGLU) nmse="),
        "{summary}"
    );
    // Only the perturbed op diverges (the reference is copied back after every node): one
    // divergent line per layer, all SWIGLU.
    let divergent: Vec<&str> = stdout.lines().filter(|l| l.contains("DIVERGES")).collect();
    assert!(!divergent.is_empty());
    assert!(divergent.iter().all(|l| l.contains("SWIGLU")), "{stdout}");
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
