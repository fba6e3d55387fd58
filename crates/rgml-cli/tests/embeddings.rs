//! `rgml embed` against llama.cpp's embeddings of the demo model
//! (`tests/fixtures/embeddings/<isa>.json`, `scripts/gen_embedding_fixtures.py`): per prompt
//! and pooling (last, mean, CLS), the tokens and the normalised pooled vector, under the
//! arithmetic of each instruction set this CPU runs, bit for bit: last and CLS pick one token's
//! final-normed hidden state, mean is llama.cpp's matrix product of the transposed states and
//! a column of `1 / n`.
//!
//! The same for a BERT encoder (`rgml-random-model --arch bert`, llama.cpp's bge vocabulary;
//! `tests/fixtures/embeddings/bert-<isa>.json`, `scripts/gen_embedding_fixtures.py --bert`):
//! WordPiece tokens, bidirectional attention and CLS or mean pooling, flash attention off and
//! on, as llama.cpp's encoder computes them.

#[allow(dead_code)] // Only the root, the demo model and the GPU's name are used here.
mod common;

use common::{demo_model, root, runnable_isas, sha256_hex};
use std::path::{Path, PathBuf};
use std::process::Command;

fn embed(isa: &str, prompt: &str, pooling: &str) -> serde_json::Value {
    embed_with(&demo_model(), isa, prompt, pooling, "off", None)
}

/// `rgml embed` of `prompt` by `model` under `isa`, with flash attention `fa`, on the CPU or
/// on `gpu` in its exact arithmetic.
fn embed_with(
    model: &Path,
    isa: &str,
    prompt: &str,
    pooling: &str,
    fa: &str,
    gpu: Option<&str>,
) -> serde_json::Value {
    let mut command = Command::new(env!("CARGO_BIN_EXE_rgml"));
    command
        .args([
            "embed",
            "-p",
            prompt,
            "--pooling",
            pooling,
            "-fa",
            fa,
            "-t",
            "2",
        ])
        .arg("-m")
        .arg(model)
        .env("RGML_CPU_ISA", isa);
    if let Some(gpu) = gpu {
        command.args(["--device", gpu]).env("RGML_WGPU_EXACT", "1");
    }
    let out = command.output().expect("run rgml embed");
    assert!(
        out.status.success(),
        "rgml embed failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON output")
}

/// The cases of the fixtures `<stem><isa>.json` made from `model` (checked by its sha256, for
/// every instruction set) that this CPU runs, with their instruction set.
fn runnable_cases(stem: &str, model: &Path) -> Vec<(&'static str, serde_json::Value)> {
    let model_sha = sha256_hex(&std::fs::read(model).expect("read the model"));
    let runnable = runnable_isas();
    let mut out = Vec::new();
    for isa in ["avx2", "avx512"] {
        let path = root().join(format!(
            "crates/rgml-cli/tests/fixtures/embeddings/{stem}{isa}.json"
        ));
        let text = std::fs::read_to_string(&path).expect("embedding fixture");
        let fixture: serde_json::Value = serde_json::from_str(&text).expect("fixture JSON");
        assert_eq!(fixture["sha256"].as_str(), Some(model_sha.as_str()));
        if runnable.contains(&isa) {
            let cases = fixture["cases"].as_array().expect("cases");
            out.extend(cases.iter().map(|case| (isa, case.clone())));
        }
    }
    out
}

#[test]
fn embeddings_are_llama_cpps() {
    for (isa, case) in runnable_cases("", &demo_model()) {
        let (prompt, pooling) = (
            case["prompt"].as_str().unwrap(),
            case["pooling"].as_str().unwrap(),
        );
        let got = embed(isa, prompt, pooling);
        assert_eq!(got["tokens"], case["tokens"], "{prompt:?} tokens");
        let worst = worst(&got, &case);
        assert_eq!(worst, 0.0, "{prompt:?} {pooling} on {isa}: from llama.cpp");
    }
}

/// The largest difference between two vectors of a case.
fn worst(got: &serde_json::Value, case: &serde_json::Value) -> f64 {
    let want: Vec<f64> = serde_json::from_value(case["embedding"].clone()).unwrap();
    let have: Vec<f64> = serde_json::from_value(got["embedding"].clone()).unwrap();
    assert_eq!(have.len(), want.len());
    have.iter()
        .zip(&want)
        .map(|(h, w)| (h - w).abs())
        .fold(0.0, f64::max)
}

/// The random BERT model, written afresh into the test's scratch directory as `name` (a file
/// per test: tests run at once, and one must not read the file while another writes it).
fn bert_model(name: &str) -> PathBuf {
    common::random_model_file(rgml_testmodels::Arch::Bert, "embeddings", name)
}

#[test]
fn bert_embeddings_are_llama_cpps() {
    assert_bert_cases(&bert_model("bert"), None);
}

/// The BERT encoder on the GPU in its exact arithmetic (the AVX-512 build's, whose fixture it
/// is held to; the CPU's share, if any, in that arithmetic too): the same vectors, bit for bit
/// (the layer norm's variance included).
#[test]
fn bert_embeddings_on_the_gpu_are_llama_cpps() {
    let Some(gpu) = common::gpu_device() else {
        return;
    };
    assert_bert_cases(&bert_model("bert-gpu"), Some(&gpu));
}

/// Every BERT fixture case this CPU runs (on `gpu`: the AVX-512 ones) gives llama.cpp's tokens
/// and vector exactly.
fn assert_bert_cases(model: &Path, gpu: Option<&str>) {
    for (isa, case) in runnable_cases("bert-", model) {
        if gpu.is_some() && isa != "avx512" {
            continue;
        }
        let prompt = case["prompt"].as_str().unwrap();
        let pooling = case["pooling"].as_str().unwrap();
        let fa = if case["fa"].as_bool().unwrap() {
            "on"
        } else {
            "off"
        };
        let got = embed_with(model, isa, prompt, pooling, fa, gpu);
        assert_eq!(got["tokens"], case["tokens"], "{prompt:?} tokens");
        let worst = worst(&got, &case);
        let on = gpu.unwrap_or(isa);
        assert_eq!(
            worst, 0.0,
            "{prompt:?} {pooling} -fa {fa} on {on}: from llama.cpp"
        );
    }
}

#[test]
fn unsupported_norms_are_refused_by_name() {
    let out = Command::new(env!("CARGO_BIN_EXE_rgml"))
        .args(["embed", "-p", "hi", "--embd-normalize", "1", "-m"])
        .arg(demo_model())
        .output()
        .expect("run rgml embed");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--embd-normalize 1"));
}
