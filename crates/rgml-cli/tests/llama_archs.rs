//! llama.cpp's own random models (its `tests/test-llama-archs` tool, `-o DIR -s SEED`) of every
//! architecture rgml runs, against llama.cpp's logits.
//!
//! The files carry what llama.cpp's loader accepts beyond what converters write: separate or
//! fused Q/K/V with biases on every architecture, output and FFN biases (LLaMA), a `.scale`
//! per matrix and per expert, `.input_scale` tensors, LongRoPE factors (Phi-3), an output bias
//! (Qwen2), a reranker head (Qwen3), integer sliding-window patterns (Gemma 3), and its `test`
//! tokenizer. `tests/fixtures/llama_archs/<isa>/<file>.json` holds, per file, the seed, its
//! sha256 and llama.cpp's top 10 logits after each prompt and after each of 32 greedy steps
//! (`scripts/gen_llama_archs_fixtures.py`). The test runs the tool named by
//! `RGML_TEST_LLAMA_ARCHS` (built by `scripts/llamacpp.sh test-llama-archs`, as
//! `scripts/test.sh` does), checks each file's bytes against its fixture and runs
//! `rgml logits --greedy 32` with each instruction set's arithmetic. The mixture-of-experts
//! and Qwen3.5 hybrid files also go through `rgml quantize` (MXFP4_MOE, K-quants, Q8_0),
//! which must write llama-quantize's bytes. Without the tool it skips, unless `RGML_REQUIRE_LLAMA_ARCHS=1` (set
//! in CI).

#[allow(dead_code)] // Not every helper is used here.
mod common;

use common::{greedy_worst, logits_json, root, runnable_isas, sha256_hex, skip_unless_required};
use std::path::{Path, PathBuf};
use std::process::Command;

/// llama.cpp's names of the architectures rgml runs (test-llama-archs' `-a` is a regex).
const ARCHS: &str = "^(llama|qwen2|qwen3|qwen3moe|phi3|gemma3|gpt-oss|qwen35|qwen35moe)$";
const STEPS: usize = 32;

/// The fixtures, by instruction set: `(isa, file stem, fixture)`.
fn fixtures() -> Vec<(String, String, serde_json::Value)> {
    let dir = root().join("crates/rgml-cli/tests/fixtures/llama_archs");
    let mut out = Vec::new();
    for isa_dir in std::fs::read_dir(&dir).expect("fixtures/llama_archs") {
        let isa_dir = isa_dir.expect("fixture directory").path();
        let isa = isa_dir
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        for f in std::fs::read_dir(&isa_dir).expect("isa directory") {
            let path = f.expect("fixture").path();
            let stem = path
                .file_stem()
                .expect("stem")
                .to_string_lossy()
                .into_owned();
            let text = std::fs::read_to_string(&path).expect("read fixture");
            out.push((
                isa.clone(),
                stem,
                serde_json::from_str(&text).expect("JSON"),
            ));
        }
    }
    out.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
    out
}

/// The tool's files for `seed`, written into the scratch directory `<test>-<seed>` (tests
/// running at once must not rewrite each other's files).
fn saved_models(tool: &Path, seed: u64, test: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{test}-{seed}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the model directory");
    let out = Command::new(tool)
        .args(["-a", ARCHS, "-s", &seed.to_string(), "-o"])
        .arg(&dir)
        .output()
        .expect("run test-llama-archs");
    assert!(
        out.status.success(),
        "test-llama-archs failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

#[test]
fn llama_cpps_own_random_models_give_its_logits() {
    let Some(tool) = std::env::var_os("RGML_TEST_LLAMA_ARCHS") else {
        skip_unless_required(
            "RGML_REQUIRE_LLAMA_ARCHS",
            "RGML_TEST_LLAMA_ARCHS names no test-llama-archs (scripts/llamacpp.sh builds it)",
        );
        return;
    };
    let fixtures = fixtures();
    assert!(fixtures.len() >= 7, "fixtures for every architecture");
    let runnable = runnable_isas();
    let mut dirs = std::collections::HashMap::new();
    for (isa, stem, fixture) in &fixtures {
        let seed = fixture["seed"].as_u64().expect("seed");
        let dir = dirs
            .entry(seed)
            .or_insert_with(|| saved_models(Path::new(&tool), seed, "llama-archs"));
        let model = dir.join(format!("{stem}.gguf"));
        let bytes = std::fs::read(&model).unwrap_or_else(|e| panic!("{}: {e}", model.display()));
        assert_eq!(
            fixture["sha256"].as_str(),
            Some(sha256_hex(&bytes).as_str()),
            "{stem}: test-llama-archs -s {seed} must write the bytes the {isa} fixture was made from"
        );
        if !runnable.contains(&isa.as_str()) {
            continue;
        }
        let steps = STEPS.to_string();
        for case in fixture["cases"].as_array().expect("cases") {
            let prompt = case["prompt"].as_str().expect("prompt");
            let what = format!("{stem} {prompt:?} on {isa}");
            let got = logits_json(&model, isa, prompt, &["--greedy", &steps]);
            let worst = greedy_worst(&got, case, &what);
            // 4-decimal rounding of the fixture.
            assert!(worst <= 5.1e-5, "{what}: {worst} from llama.cpp");
        }
        eprintln!("{stem} on {isa}: exact, {STEPS} greedy steps");
    }
}

/// `rgml quantize` on the tool's mixture-of-experts files writes the bytes llama-quantize
/// wrote (`tests/fixtures/quantize_llama_archs.json`, made by
/// `scripts/gen_quantize_llama_archs_fixtures.sh`): MXFP4_MOE's MXFP4 experts, and the
/// K-quant presets' expert rules.
#[test]
fn llama_cpps_moe_files_quantize_to_llama_quantize_bytes() {
    let Some(tool) = std::env::var_os("RGML_TEST_LLAMA_ARCHS") else {
        skip_unless_required(
            "RGML_REQUIRE_LLAMA_ARCHS",
            "RGML_TEST_LLAMA_ARCHS names no test-llama-archs (scripts/llamacpp.sh builds it)",
        );
        return;
    };
    let path = root().join("crates/rgml-cli/tests/fixtures/quantize_llama_archs.json");
    let text = std::fs::read_to_string(&path).expect("read the quantize fixture");
    let fixture: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let seed = fixture["seed"].as_u64().expect("seed");
    let dir = saved_models(Path::new(&tool), seed, "llama-archs-quantize");
    let files = fixture["files"].as_object().expect("files");
    assert!(files.contains_key("gpt-oss-moe"), "an MXFP4 file");
    for (stem, file) in files {
        let source = dir.join(format!("{stem}.gguf"));
        let bytes = std::fs::read(&source).expect("read the tool's file");
        assert_eq!(
            file["sha256"].as_str(),
            Some(sha256_hex(&bytes).as_str()),
            "{stem}"
        );
        for (preset, want) in file["outputs"].as_object().expect("outputs") {
            let out = dir.join(format!("{stem}.{preset}.gguf"));
            let run = Command::new(env!("CARGO_BIN_EXE_rgml"))
                .arg("quantize")
                .args([&source, &out])
                .arg(preset)
                .output()
                .expect("run rgml quantize");
            assert!(
                run.status.success(),
                "rgml quantize {stem} {preset}: {}",
                String::from_utf8_lossy(&run.stderr)
            );
            let got = sha256_hex(&std::fs::read(&out).expect("read the output"));
            assert_eq!(
                Some(got.as_str()),
                want["sha256"].as_str(),
                "{stem} as {preset}: not llama-quantize's bytes"
            );
            eprintln!("{stem} as {preset}: llama-quantize's bytes");
        }
    }
}
