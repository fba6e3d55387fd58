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
/// The largest |logit difference| from a fixture: its 4-decimal rounding.
const TOLERANCE: f64 = 5.1e-5;

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
        let file = fixture["file"].as_str().expect("file");
        let model = dir.join(file);
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
        // The context the fixture was made under (`--n-ctx`; else 512, as the others).
        let n_ctx = fixture["n_ctx"].as_u64().unwrap_or(512).to_string();
        for case in fixture["cases"].as_array().expect("cases") {
            let prompt = case["prompt"].as_str().expect("prompt");
            let what = format!("{stem} {prompt:?} on {isa}");
            let got = logits_json(&model, isa, prompt, &["--greedy", &steps, "-c", &n_ctx]);
            let worst = greedy_worst(&got, case, &what);
            assert!(worst <= TOLERANCE, "{what}: {worst} from llama.cpp");
        }
        eprintln!("{stem} on {isa}: exact, {STEPS} greedy steps");
    }
}

/// The fixtures made under a context of at most the training one (Phi-3's file: 256, so
/// llama.cpp reads LongRoPE's short factors) hold other logits than the same file's fixture at
/// 512 (the long factors), by more than twice the tolerance somewhere: no one output passes
/// both, so passing both checks the choice of factors, not one set of them.
#[test]
fn short_context_fixtures_differ_from_the_long_ones() {
    let fixtures = fixtures();
    let short: Vec<_> = fixtures
        .iter()
        .filter(|(_, _, f)| f["n_ctx"].as_u64().is_some())
        .collect();
    assert!(
        short.iter().any(|(_, stem, _)| stem.starts_with("phi3")),
        "a short-context Phi-3 fixture"
    );
    for (isa, stem, fixture) in short {
        let file = fixture["file"].as_str().expect("file");
        let long = fixtures
            .iter()
            .find(|(i, s, f)| i == isa && s != stem && f["file"].as_str() == Some(file))
            .unwrap_or_else(|| panic!("{stem}: no fixture of {file} at the default context"));
        let tops = |f: &serde_json::Value| -> Vec<serde_json::Value> {
            let mut all = Vec::new();
            for case in f["cases"].as_array().expect("cases") {
                all.push(case["top10"].clone());
                for step in case["continuation"].as_array().expect("continuation") {
                    all.push(step["top10"].clone());
                }
            }
            all
        };
        let (a, b) = (tops(fixture), tops(&long.2));
        assert_eq!(a.len(), b.len(), "{stem}: the same prompts and steps");
        let mut widest = 0f64;
        for (x, y) in a.iter().zip(&b) {
            let pairs = |t: &serde_json::Value| -> Vec<(u64, f64)> {
                let t = t.as_array().expect("top10");
                t.iter()
                    .map(|e| (e[0].as_u64().expect("id"), e[1].as_f64().expect("logit")))
                    .collect()
            };
            let theirs = pairs(y);
            for (id, logit) in pairs(x) {
                if let Some(&(_, other)) = theirs.iter().find(|p| p.0 == id) {
                    widest = widest.max((logit - other).abs());
                }
            }
        }
        assert!(
            widest > 2.0 * TOLERANCE,
            "{stem} on {isa}: the contexts' logits differ by {widest} at most, too little to \
             tell the factors apart"
        );
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
