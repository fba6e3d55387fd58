//! `rgml quantize` against llama.cpp's `llama-quantize`: the demo model quantized to each
//! preset must be the very bytes llama-quantize wrote (their sha256 are in
//! `tests/fixtures/quantize.json`, made by `scripts/gen_quantize_fixtures.sh`); and the
//! command's errors and exit statuses.

#[allow(dead_code)] // The GPU lookup and the logit comparison are not used here.
mod common;

use common::{demo_model, root, sha256_hex};
use rgml_llm::QuantPreset;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn rgml(args: &[&Path]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rgml"))
        .arg("quantize")
        .args(args)
        .output()
        .expect("run rgml")
}

/// A fresh directory for one test's outputs.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rgml-quantize-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

/// The presets checked by default (a few seconds each in the test profile on 2 cores), none of
/// those `tests/quant_logits.rs` already makes and checks by hash on x86 with AVX2 (Q4_0, Q5_0,
/// Q8_0, Q2_K, Q4_K_M, Q5_K_M, Q6_K, IQ4_XS, each with the logits that file gives). Together
/// they cover every code path: legacy, k-quant and IQ4 rules, the demo's fallbacks (Q2_K and
/// Q3_K -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, IQ4_XS -> IQ4_NL), float
/// conversion. All of the fixture's presets with `RGML_QUANTIZE_ALL=1`.
const DEFAULT: [&str; 6] = ["Q5_1", "F16", "Q3_K_S", "Q3_K_M", "IQ4_NL", "Q4_K_S"];

#[test]
fn demo_model_quantizes_to_llama_quantize_bytes() {
    let text = std::fs::read_to_string(root().join("crates/rgml-cli/tests/fixtures/quantize.json"))
        .expect("quantize.json");
    let fixture: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    let model = demo_model();
    let model_sha = sha256_hex(&std::fs::read(&model).expect("read model"));
    assert_eq!(
        fixture["model_sha256"].as_str(),
        Some(model_sha.as_str()),
        "not the fixture's model"
    );
    let outputs = fixture["outputs"].as_object().expect("outputs");
    // Every preset, so that RGML_QUANTIZE_ALL=1 checks them all.
    let mut in_fixture: Vec<&str> = outputs.keys().map(String::as_str).collect();
    in_fixture.sort_unstable();
    let mut presets: Vec<&str> = QuantPreset::ALL.iter().map(|p| p.name()).collect();
    presets.sort_unstable();
    assert_eq!(in_fixture, presets, "the fixture's presets");
    let all = std::env::var("RGML_QUANTIZE_ALL").is_ok_and(|v| v == "1");
    let dir = scratch("presets");
    for (preset, expected) in outputs {
        if !all && !DEFAULT.contains(&preset.as_str()) {
            continue;
        }
        let out = dir.join(format!("{preset}.gguf"));
        let run = Command::new(env!("CARGO_BIN_EXE_rgml"))
            .args(["quantize", "-q", "--allow-requantize", "-t", "2"])
            .args([model.as_os_str(), out.as_os_str()])
            .arg(preset)
            .output()
            .expect("run rgml");
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(run.status.success(), "{preset}: {stderr}");
        let bytes = std::fs::read(&out).expect("read output");
        std::fs::remove_file(&out).expect("remove output");
        assert_eq!(
            Some(bytes.len() as u64),
            expected["bytes"].as_u64(),
            "{preset}: size"
        );
        assert_eq!(
            Some(sha256_hex(&bytes).as_str()),
            expected["sha256"].as_str(),
            "{preset}: not llama-quantize's bytes"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn unknown_type_is_a_usage_error() {
    let dir = scratch("unknown");
    let out = rgml(&[&demo_model(), &dir.join("o.gguf"), Path::new("Q9_9")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("Q9_9") && stderr.contains("Q4_K_M"),
        "{stderr}"
    );
    assert!(!dir.join("o.gguf").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The refusal comes from the plan, before any file is created, so "no file" here holds
/// trivially; `failed_write_names_the_output_and_leaves_no_file` checks the cleanup.
#[test]
fn requantizing_needs_the_flag_and_leaves_no_file() {
    let dir = scratch("requant");
    let target = dir.join("o.gguf");
    let out = rgml(&[&demo_model(), &target, Path::new("Q8_0")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("requantizing from type q4_1 is disabled")
            && stderr.contains("--allow-requantize")
            && stderr.contains("tensor 'blk.0.attn_k.weight'"),
        "{stderr}"
    );
    let left: Vec<_> = std::fs::read_dir(&dir).expect("read dir").collect();
    assert!(left.is_empty(), "files left behind: {left:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A write that fails once the partial file exists: a file size limit of 200 KiB, with SIGXFSZ
/// ignored so that the write past it fails (EFBIG) instead of killing the process. The error
/// names the output, not the input, and neither the output nor its partial file is left.
#[cfg(target_os = "linux")]
#[test]
fn failed_write_names_the_output_and_leaves_no_file() {
    let dir = scratch("write-fails");
    let target = dir.join("o.gguf");
    let input = demo_model();
    let out = Command::new("bash")
        .arg("-c")
        .arg(r#"trap '' XFSZ; ulimit -f 200; exec "$0" "$@""#)
        .arg(env!("CARGO_BIN_EXE_rgml"))
        .args(["quantize", "-q", "--allow-requantize"])
        .args([input.as_os_str(), target.as_os_str()])
        .arg("Q4_0")
        .output()
        .expect("run rgml under bash");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&*target.to_string_lossy()) && stderr.contains("too large"),
        "the error must name the output: {stderr}"
    );
    assert!(
        !stderr.contains(&*input.to_string_lossy()),
        "the error must not blame the input: {stderr}"
    );
    assert!(!target.exists(), "output left behind");
    assert!(
        !dir.join("o.gguf.part").exists(),
        "partial file left behind"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn missing_input_is_a_runtime_error() {
    let dir = scratch("missing");
    let input = dir.join("absent.gguf");
    let out = rgml(&[&input, &dir.join("o.gguf"), Path::new("Q8_0")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("absent.gguf"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn output_must_not_be_the_input() {
    let dir = scratch("same");
    let copy = dir.join("m.gguf");
    std::fs::copy(demo_model(), &copy).expect("copy model");
    let before = std::fs::read(&copy).expect("read copy");
    // The same file under another spelling of its path.
    let other = dir.join(".").join("m.gguf");
    let out = rgml(&[
        &copy,
        &other,
        Path::new("Q8_0"),
        Path::new("--allow-requantize"),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("the output is the input"), "{stderr}");
    assert_eq!(
        std::fs::read(&copy).expect("read copy"),
        before,
        "input changed"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
