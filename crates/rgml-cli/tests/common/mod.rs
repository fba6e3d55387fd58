//! Test support shared by the CLI's integration tests.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The demo model's file stem: `models/<DEMO_STEM>.gguf`.
#[allow(dead_code)] // Not every test binary that shares this module uses the demo model.
pub const DEMO_STEM: &str = "SmolLM2-135M-Instruct.Q4_1";

/// The workspace root.
#[allow(dead_code)]
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The demo model's path; fails the test, saying how to fetch it, if it is not there.
#[allow(dead_code)]
pub fn demo_model() -> PathBuf {
    let path = root().join(format!("models/{DEMO_STEM}.gguf"));
    assert!(
        path.exists(),
        "demo model not found at {}: run scripts/fetch-model.sh first",
        path.display()
    );
    path
}

/// Gemma 3 270M's path (`scripts/fetch-model.sh` fetches it); fails the test, saying so, if it
/// is not there.
#[allow(dead_code)]
pub fn gemma_model() -> PathBuf {
    let path = root().join("models/gemma-3-270m-q4_k_m.gguf");
    assert!(
        path.exists(),
        "Gemma 3 270M not found at {}: run scripts/fetch-model.sh first",
        path.display()
    );
    path
}

/// The sha256 of `bytes`, in lowercase hex (as the fixtures hold it).
#[allow(dead_code)]
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The instruction sets whose arithmetic rgml can run here, as `RGML_CPU_ISA` names them:
/// AVX-512's is emulated exactly on any x86 CPU with AVX2, AVX2's needs AVX2, FMA and F16C.
#[allow(dead_code)] // Only the logits tests choose instruction sets.
pub fn runnable_isas() -> Vec<&'static str> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx2") && has!("fma") && has!("f16c") {
            return vec!["avx2", "avx512"];
        }
    }
    Vec::new()
}

/// Why [`fp16_fixture_left_out`] leaves a fixture out.
#[allow(dead_code)]
pub const FP16_LEFT_OUT: &str =
    "left out, the fixture's build had AVX512-FP16 and this CPU has not";

/// Whether a fixture made for `isa` with flash attention `fa`, a V cache of type `ctv` and V
/// rows of `v_head()` values (asked only when the rest holds) holds arithmetic this CPU cannot mirror, so the test leaves it out.
/// The AVX-512 fixtures come from Intel Xeons with AVX512-FP16, whose native build accumulates
/// f16 V rows of 128 values or more in half precision when flash attention attends a few
/// queries (rgml's `CpuFeatures::f16_vectors`, which needs the instructions). Without them rgml
/// mirrors the build for this CPU (an AVX-512 AMD CPU's, or, with the AVX-512 arithmetic forced
/// on an AVX2 CPU, the same f32 accumulation), which no fixture holds; the AVX2 fixtures check
/// that f32 form on every CPU. `rgml-cpu`'s `ggml_flash_attn` test leaves out the same cases.
#[allow(dead_code)]
pub fn fp16_fixture_left_out(
    isa: &str,
    fa: &str,
    ctv: &str,
    v_head: impl FnOnce() -> usize,
) -> bool {
    isa == "avx512" && fa == "on" && ctv == "f16" && !cpu_has_avx512_fp16() && v_head() >= 128
}

/// Whether this CPU has AVX512-FP16 (with F and BW, which rgml's half-precision path needs).
fn cpu_has_avx512_fp16() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        has!("avx512fp16") && has!("avx512f") && has!("avx512bw")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The V head width of the GGUF model at `path` (`attention.value_length`, else the embedding
/// width over the head count), read with `rgml-gguf`.
#[allow(dead_code)]
pub fn v_head_dim(path: &Path) -> usize {
    let file = rgml_gguf::GgufFile::open(path).expect("open the model");
    let arch = file
        .get("general.architecture")
        .and_then(|v| v.as_str())
        .expect("general.architecture");
    let key = |k: &str| {
        file.get(&format!("{arch}.{k}"))
            .and_then(|v| v.as_u64())
            .map(|v| v as usize)
    };
    key("attention.value_length")
        .or_else(|| Some(key("embedding_length")? / key("attention.head_count")?))
        .unwrap_or_else(|| panic!("no head width in {}", path.display()))
}

/// The name of the GPU device `rgml devices` lists (`Vulkan0`, `Metal0`, ...), if any. Without
/// one the GPU tests skip, unless `RGML_REQUIRE_GPU=1` (set by `scripts/test.sh`, so CI never
/// skips).
pub fn gpu_device() -> Option<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_rgml"))
        .arg("devices")
        .output()
        .expect("run rgml devices");
    assert!(out.status.success(), "rgml devices failed");
    let name = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(|w| w.trim_end_matches(':'))
        .find(|w| ["Vulkan0", "Metal0", "DX120"].contains(w))
        .map(str::to_string);
    if name.is_none() {
        skip_unless_required("RGML_REQUIRE_GPU", "`rgml devices` lists no GPU");
    }
    name
}

/// A test's optional peer is missing (`why`): skip with a message, unless the variable
/// `require` is `1` (set by `scripts/test.sh`, so CI never skips), which fails the test.
#[allow(dead_code)]
pub fn skip_unless_required(require: &str, why: &str) {
    let required = std::env::var(require).is_ok_and(|v| v == "1");
    assert!(!required, "{require}=1 but {why}");
    eprintln!("{why}: skipping");
}

/// `rgml logits --json` output `got` against a llama.cpp fixture case (`tokens`, `top10`):
/// asserts the tokens and the top-10 ids in order, and returns the largest |logit difference|
/// (NaN if a logit is missing). `what` names the run in failure messages.
#[allow(dead_code)] // Not every test binary that shares this module compares logits.
pub fn top10_worst(got: &serde_json::Value, case: &serde_json::Value, what: &str) -> f64 {
    assert_eq!(got["tokens"], case["tokens"], "tokens of {what}");
    let want = case["top10"].as_array().expect("top10");
    let have = got["top"].as_array().expect("top");
    let ids = |v: &[serde_json::Value]| v.iter().map(|e| e[0].as_u64()).collect::<Vec<_>>();
    assert_eq!(ids(have), ids(want), "top-10 ids of {what}");
    have.iter()
        .zip(want)
        .map(|(h, w)| (h[1].as_f64().unwrap_or(f64::NAN) - w[1].as_f64().unwrap_or(0.0)).abs())
        // NaN (a logit that is not a number) wins, so it fails the caller's bound.
        .fold(
            0.0,
            |worst, d| if d.is_nan() || d > worst { d } else { worst },
        )
}

/// [`top10_worst`] of `got` (`rgml logits --json --greedy N`) against `case`, after the prompt
/// and after each of its greedy steps (`case["continuation"]`: each step's token and top 10),
/// whose tokens must be the same: the largest |logit difference| over all of them.
#[allow(dead_code)] // Not every test binary that shares this module compares greedy steps.
pub fn greedy_worst(got: &serde_json::Value, case: &serde_json::Value, what: &str) -> f64 {
    let mut worst = top10_worst(got, case, what);
    let steps = case["continuation"].as_array().expect("continuation");
    let have = got["continuation"].as_array().expect("rgml's continuation");
    assert_eq!(have.len(), steps.len(), "{what}: greedy steps");
    for (i, (h, w)) in have.iter().zip(steps).enumerate() {
        assert_eq!(h["token"], w["token"], "{what}: greedy step {i}'s token");
        let h = serde_json::json!({ "tokens": got["tokens"], "top": h["top"] });
        let w = serde_json::json!({ "tokens": case["tokens"], "top10": w["top10"] });
        let d = top10_worst(&h, &w, &format!("{what}, step {i}"));
        // NaN (a logit that is not a number) wins, so it fails the caller's bound.
        worst = if d.is_nan() || d > worst { d } else { worst };
    }
    worst
}

/// The `top` list of `rgml logits --json` output as (id, logit) pairs (NaN for a logit that is
/// not a number).
#[allow(dead_code)] // Not every test binary that shares this module reads logits.
pub fn top_pairs(logits: &serde_json::Value) -> Vec<(u64, f64)> {
    logits["top"]
        .as_array()
        .expect("top")
        .iter()
        .map(|e| {
            (
                e[0].as_u64().unwrap_or(0),
                e[1].as_f64().unwrap_or(f64::NAN),
            )
        })
        .collect()
}

/// `rgml logits --json --top 10 -t 2 -p PROMPT -m MODEL EXTRA..` under the CPU arithmetic of
/// `isa`, with the devices CPU0 and CPU1 registered beside CPU (for `--device` splits); the
/// parsed output. Flash attention is off unless `extra` sets `-fa`: llama.cpp's fixtures were
/// recorded with it off, except those of `fixtures/flash`. Fails the test if rgml fails.
#[allow(dead_code)] // Not every test binary that shares this module runs logits.
pub fn logits_json(
    model: &std::path::Path,
    isa: &str,
    prompt: &str,
    extra: &[&str],
) -> serde_json::Value {
    logits_json_with_env(model, isa, prompt, extra, &[])
}

/// As [`logits_json`], with more environment variables set (e.g. `RGML_CPU_AMX=0`).
#[allow(dead_code)]
pub fn logits_json_with_env(
    model: &std::path::Path,
    isa: &str,
    prompt: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> serde_json::Value {
    let fa_off: &[&str] = match extra.contains(&"-fa") {
        true => &[],
        false => &["-fa", "off"],
    };
    let out = Command::new(env!("CARGO_BIN_EXE_rgml"))
        .args(["logits", "-p", prompt, "--top", "10", "--json", "-t", "2"])
        .args(fa_off)
        .args(extra)
        .arg("-m")
        .arg(model)
        .env("RGML_CPU_ISA", isa)
        .env("RGML_CPU_DEVICES", "2")
        .envs(env.iter().copied())
        .output()
        .expect("run rgml logits");
    assert!(
        out.status.success(),
        "rgml logits failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON output")
}

/// The file a fixture describes: the demo model, Gemma 3 270M (`gemma-3-270m-q4_k_m`), or the
/// demo model requantized by
/// `rgml quantize` to the preset named by the stem's suffix, made afresh on every run (it is
/// the only byte check of those presets against llama-quantize's, so a file left by an earlier
/// build must not stand in for it).
#[allow(dead_code)]
pub fn fixture_model(stem: &str, sha256: &str) -> PathBuf {
    if stem == DEMO_STEM {
        return demo_model();
    }
    if stem == "gemma-3-270m-q4_k_m" {
        return gemma_model();
    }
    let preset = stem.rsplit('.').next().expect("stem has a preset suffix");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("quantized");
    std::fs::create_dir_all(&dir).expect("create the quantized model directory");
    let path = dir.join(format!("{stem}.gguf"));
    let _ = std::fs::remove_file(&path);
    let out = Command::new(env!("CARGO_BIN_EXE_rgml"))
        .arg("quantize")
        .arg("--allow-requantize")
        .arg(demo_model())
        .arg(&path)
        .arg(preset)
        .output()
        .expect("run rgml quantize");
    assert!(
        out.status.success(),
        "rgml quantize to {preset} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        sha256_hex(&std::fs::read(&path).expect("read model")),
        sha256,
        "rgml quantize to {preset} must write llama-quantize's bytes"
    );
    path
}

/// The JSON fixtures of directory `dir` (none if it does not exist), by file stem, sorted.
#[allow(dead_code)]
pub fn json_fixtures(dir: &std::path::Path) -> Vec<(String, serde_json::Value)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<(String, serde_json::Value)> = entries
        .map(|e| e.expect("fixture entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .map(|p| {
            let stem = p.file_stem().expect("stem").to_string_lossy().into_owned();
            let text = std::fs::read_to_string(&p).expect("read fixture");
            (stem, serde_json::from_str(&text).expect("fixture JSON"))
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// The random model of `arch` (`rgml-testmodels`), written afresh as `<dir>/<name>.gguf` in the
/// test's scratch directory (tests running at once must not rewrite each other's files).
#[allow(dead_code)]
pub fn random_model_file(arch: rgml_testmodels::Arch, dir: &str, name: &str) -> PathBuf {
    let vocab = root().join(arch.vocab_file());
    assert!(
        vocab.exists(),
        "vocabulary {} not found: run scripts/fetch-model.sh and scripts/fetch-vocab.sh first",
        vocab.display()
    );
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(dir);
    std::fs::create_dir_all(&dir).expect("create the model directory");
    let path = dir.join(format!("{name}.gguf"));
    rgml_testmodels::write_random_model(arch, &vocab, &path).expect("write the random model");
    path
}
