//! `-fa on` against llama.cpp's logits with flash attention on, bit for bit (up to the
//! fixtures' rounding), on each instruction set llama.cpp's fixtures exist for.
//!
//! `tests/fixtures/flash/<isa>/<file stem>.json` holds what llama.cpp's native build for that
//! instruction set computes with `flash_attn_type` enabled (repacking off;
//! `scripts/gen_model_fixtures.py --flash-attn on --n-ctx 1024 --lengths 70,513,600`, Gemma's
//! with its prompts and `--add-special`) for the demo model, two requantizations of it (F16,
//! Q4_K_M) and Gemma 3 270M (head size 256, sliding-window layers). The prompts run each of
//! ggml's flash-attention kernels: short ones a query row at a time, 70 tokens the tiled
//! kernel, 513 tokens a micro-batch of 512 and then one token alone over 768 cells (the cells
//! split between the threads, as in generation at that depth), 600 tokens a second, tiled
//! micro-batch over the first's cells.
//!
//! `tests/fixtures/kv/<isa>/<file stem>.ctk-<K>.ctv-<V>.fa-<on|off>.json` holds the same for
//! quantized caches (`--cache-type-k/v`, `--lengths 70,513`): llama.cpp rotates Q and K (and V)
//! by a Walsh-Hadamard matrix where the cache is quantized, stores the rows in its CPU
//! quantizers' bytes and attends with quantized dots, with flash attention and without it
//! (quantized K only).

#[allow(dead_code)] // The GPU lookup is not used here.
mod common;

use common::{root, runnable_isas, sha256_hex};

fn fixtures(set: &str, isa: &str) -> Vec<(String, serde_json::Value)> {
    let dir = root()
        .join("crates/rgml-cli/tests/fixtures")
        .join(set)
        .join(isa);
    common::json_fixtures(&dir)
}

/// Every case of fixture set `set` on every instruction set rgml runs here, with the flags the
/// fixture records; returns how many were checked.
fn check_set(set: &str) -> usize {
    let mut checked = 0;
    for isa in runnable_isas() {
        for (name, fixture) in fixtures(set, isa) {
            let field = |key: &str| fixture[key].as_str().unwrap_or("f16").to_string();
            let (fa, ctk, ctv) = (
                field("flash_attn"),
                field("cache_type_k"),
                field("cache_type_v"),
            );
            let file = fixture["file"].as_str().expect("file");
            let stem = file.strip_suffix(".gguf").expect("a GGUF file name");
            let sha = fixture["sha256"].as_str().expect("sha256");
            let model = common::fixture_model(stem, sha);
            assert_eq!(
                sha256_hex(&std::fs::read(&model).expect("read model")),
                sha,
                "{name}: the fixture is for another file"
            );
            if common::fp16_fixture_left_out(isa, &fa, &ctv, || common::v_head_dim(&model)) {
                eprintln!("{name} on {isa}: {}", common::FP16_LEFT_OUT);
                continue;
            }
            let extra = ["-fa", &fa, "-ctk", &ctk, "-ctv", &ctv, "-c", "1024"];
            for case in fixture["cases"].as_array().expect("cases") {
                let prompt = case["prompt"].as_str().expect("prompt");
                let got = common::logits_json(&model, isa, prompt, &extra);
                let what = format!("{name} {prompt:.30?} on {isa}");
                let worst = common::top10_worst(&got, case, &what);
                // 4-decimal rounding of the fixture, plus f32 spacing at |logits| < 128.
                assert!(worst <= 6e-5, "{what}: {worst} from llama.cpp");
                checked += 1;
            }
        }
    }
    checked
}

#[test]
fn flash_attention_gives_llama_cpps_logits_on_each_instruction_set() {
    for isa in runnable_isas() {
        for (name, fixture) in fixtures("flash", isa) {
            assert_eq!(
                fixture["flash_attn"], "on",
                "{name}: not a flash-attention fixture"
            );
        }
    }
    let checked = check_set("flash");
    if !runnable_isas().is_empty() {
        assert!(checked >= 41, "only {checked} cases were checked");
    }
}

#[test]
fn quantized_caches_give_llama_cpps_logits_on_each_instruction_set() {
    let checked = check_set("kv");
    if !runnable_isas().is_empty() {
        assert!(checked >= 51, "only {checked} cases were checked");
    }
}

/// The fixtures tell flash attention from the product-softmax-product path: `-fa off` misses
/// them (so the check above cannot pass by chance).
#[test]
fn flash_attention_changes_the_logits() {
    let Some(isa) = runnable_isas().first().copied() else {
        return;
    };
    let (stem, fixture) = fixtures("flash", isa)
        .into_iter()
        .find(|(s, _)| s == common::DEMO_STEM)
        .expect("the demo model's fixture");
    let model = common::fixture_model(&stem, fixture["sha256"].as_str().expect("sha256"));
    let case = fixture["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .find(|c| c["tokens"].as_array().is_some_and(|t| t.len() == 513))
        .expect("the 513-token case");
    let prompt = case["prompt"].as_str().expect("prompt");
    let got = common::logits_json(&model, isa, prompt, &["-fa", "off", "-c", "1024"]);
    let off = common::top_pairs(&got);
    let best = &case["top10"][0];
    let (id, on) = (
        best[0].as_u64().expect("id"),
        best[1].as_f64().expect("logit"),
    );
    let off = off.iter().find(|p| p.0 == id).map(|p| p.1);
    assert!(
        off.is_none_or(|off| (off - on).abs() > 1e-3),
        "{off:?} vs {on}"
    );
}

/// Cache types rgml does not compute, and a quantized V without flash attention (which
/// llama.cpp refuses too), are errors naming the flag, before any output.
#[test]
fn cache_types_that_do_not_work_are_refused_by_name() {
    let model = common::demo_model();
    for (flags, needle) in [
        (&["-ctv", "q8_0", "-fa", "off"][..], "--cache-type-v q8_0"),
        (&["-ctk", "q5_1"][..], "q5_1"),
        (&["-ctk", "bogus"][..], "bogus"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_rgml"))
            .args(["logits", "-p", "Hi", "-t", "1"])
            .args(flags)
            .arg("-m")
            .arg(&model)
            .output()
            .expect("run rgml");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && out.stdout.is_empty(), "{flags:?}");
        assert!(err.contains(needle), "{flags:?}: {err}");
    }
}
