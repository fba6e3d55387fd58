//! `rgml embed` against llama.cpp's embeddings of the demo model
//! (`tests/fixtures/embeddings/<isa>.json`, `scripts/gen_embedding_fixtures.py`): per prompt
//! and pooling (last, mean, CLS), the tokens and the normalised pooled vector, under the
//! arithmetic of each instruction set this CPU runs. Last and CLS pick one token's final-normed
//! hidden state, which equals llama.cpp's bit for bit; mean sums them in another order than
//! llama.cpp's matrix product, so it gets an f32 rounding's room.

#[allow(dead_code)] // Only the root and the demo model are used here.
mod common;

use common::{demo_model, root, runnable_isas, sha256_hex};
use std::process::Command;

fn embed(isa: &str, prompt: &str, pooling: &str) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_rgml"))
        .args([
            "embed",
            "-p",
            prompt,
            "--pooling",
            pooling,
            "-fa",
            "off",
            "-t",
            "2",
        ])
        .arg("-m")
        .arg(demo_model())
        .env("RGML_CPU_ISA", isa)
        .output()
        .expect("run rgml embed");
    assert!(
        out.status.success(),
        "rgml embed failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON output")
}

#[test]
fn embeddings_are_llama_cpps() {
    let model_sha = sha256_hex(&std::fs::read(demo_model()).expect("read the demo model"));
    let runnable = runnable_isas();
    for isa in ["avx2", "avx512"] {
        let path = root().join(format!(
            "crates/rgml-cli/tests/fixtures/embeddings/{isa}.json"
        ));
        let text = std::fs::read_to_string(&path).expect("embedding fixture");
        let fixture: serde_json::Value = serde_json::from_str(&text).expect("fixture JSON");
        assert_eq!(fixture["sha256"].as_str(), Some(model_sha.as_str()));
        if !runnable.contains(&isa) {
            continue;
        }
        for case in fixture["cases"].as_array().expect("cases") {
            let (prompt, pooling) = (
                case["prompt"].as_str().unwrap(),
                case["pooling"].as_str().unwrap(),
            );
            let got = embed(isa, prompt, pooling);
            assert_eq!(got["tokens"], case["tokens"], "{prompt:?} tokens");
            let want: Vec<f64> = serde_json::from_value(case["embedding"].clone()).unwrap();
            let have: Vec<f64> = serde_json::from_value(got["embedding"].clone()).unwrap();
            assert_eq!(have.len(), want.len());
            let room = if pooling == "mean" { 2e-7 } else { 0.0 };
            let worst = have
                .iter()
                .zip(&want)
                .map(|(h, w)| (h - w).abs())
                .fold(0.0, f64::max);
            assert!(
                worst <= room,
                "{prompt:?} {pooling} on {isa}: {worst} from llama.cpp"
            );
        }
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
