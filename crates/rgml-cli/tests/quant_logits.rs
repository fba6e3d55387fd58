//! Every weight type against llama.cpp's logits, bit for bit (up to the fixtures' rounding to 4
//! decimals), on each instruction set llama.cpp's fixtures exist for.
//!
//! `tests/fixtures/logits/<isa>/<file stem>.json` holds what llama.cpp's native build for that
//! instruction set computes (repacking off; `scripts/gen_model_fixtures.py`) for the demo model
//! as published (`SmolLM2-135M-Instruct.Q4_1`) and requantized by `llama-quantize` to other
//! types (`SmolLM2-135M-Instruct.<PRESET>`). Here the requantized files are made by
//! `rgml quantize` from the demo model, and must have the fixture's sha256 (the same bytes as
//! llama-quantize's), then `rgml logits` runs with `RGML_CPU_ISA=<isa>`: the CPU's own
//! instruction set and, where the CPU can run it, the other one forced.

#[allow(dead_code)] // The GPU lookup is not used here.
mod common;

use common::{root, runnable_isas};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

fn fixtures(isa: &str) -> Vec<(String, serde_json::Value)> {
    let dir = root()
        .join("crates/rgml-cli/tests/fixtures/logits")
        .join(isa);
    common::json_fixtures(&dir)
}

/// The largest |logit - llama.cpp's| over the fixture's top 10, after checking the tokens and
/// the top-10 order, with the environment `env` besides the instruction set.
fn worst_difference(
    model: &Path,
    isa: &str,
    env: &[(&str, &str)],
    case: &serde_json::Value,
) -> f64 {
    let prompt = case["prompt"].as_str().expect("prompt");
    let got = common::logits_json_with_env(model, isa, prompt, &[], env);
    common::top10_worst(&got, case, &format!("{prompt:?} on {isa} {env:?}"))
}

/// The settings each fixture runs under: the default; for the files whose prompts take the
/// K-quant tile kernels (K-quants, IQ4_XS), also without AMX on a CPU with it (so both the AMX
/// and the AVX-512 kernels are checked against llama.cpp there), and under the AVX2 arithmetic
/// on an AVX-512 CPU also with the AVX-512 instructions dropped (the AVX2 tiles an AVX2-only
/// CPU runs).
fn settings(stem: &str, isa: &str) -> Vec<Vec<(&'static str, &'static str)>> {
    let kquant = ["_K", "IQ4_XS"].iter().any(|t| stem.contains(t));
    let cpu = rgml_cpu::CpuFeatures::detect();
    let mut settings = vec![vec![]];
    if kquant && cpu.has_amx_int8() {
        settings.push(vec![("RGML_CPU_AMX", "0")]);
    }
    if kquant && isa == "avx2" && cpu.has_avx512() {
        settings.push(vec![("RGML_CPU_AVX512", "0")]);
    }
    settings
}

#[test]
fn every_weight_type_gives_llama_cpps_logits_on_each_instruction_set() {
    let mut checked = 0;
    // Each file is made once, though its fixtures may exist for several instruction sets (whose
    // hashes must then agree): stem -> (file, its sha256).
    let mut models: HashMap<String, (PathBuf, String)> = HashMap::new();
    for isa in runnable_isas() {
        for (stem, fixture) in fixtures(isa) {
            let sha = fixture["sha256"].as_str().expect("sha256");
            let (model, made_sha) = models
                .entry(stem.clone())
                .or_insert_with(|| (common::fixture_model(&stem, sha), sha.to_string()));
            assert_eq!(
                made_sha, sha,
                "{stem}: the fixtures of two instruction sets differ"
            );
            for env in settings(&stem, isa) {
                for case in fixture["cases"].as_array().expect("cases") {
                    let worst = worst_difference(model, isa, &env, case);
                    // 4-decimal rounding of the fixture, plus f32 spacing near |logit| 32.
                    assert!(
                        worst <= 5.1e-5,
                        "{stem} on {isa} {env:?}: {:?} is {worst} from llama.cpp",
                        case["prompt"]
                    );
                }
            }
            eprintln!("{stem} on {isa}: exact");
            checked += 1;
        }
    }
    if !runnable_isas().is_empty() {
        assert!(checked > 0, "no logits fixture was checked");
    }
}
