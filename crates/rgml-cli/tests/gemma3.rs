//! Gemma 3 270M (Q4_K_M, `models/gemma-3-270m-q4_k_m.gguf`, fetched by `scripts/fetch-model.sh`)
//! against llama.cpp: tokens and logits, bit for bit up to the fixtures' rounding, for prompts in
//! many scripts, code, emoji, chat turns, and one longer than the model's 512-position sliding
//! window (so local and global layers see different cells).
//!
//! `tests/fixtures/gemma3/<isa>/gemma-3-270m-q4_k_m.json` holds what llama.cpp's native build
//! for that instruction set computes for `tests/fixtures/gemma3/prompts.json` (BOS added,
//! special tokens parsed, 1024 cells, micro-batches of 512; `scripts/gen_model_fixtures.py
//! --prompts ... --add-special --n-ctx 1024`).

#[allow(dead_code)]
mod common;

use common::{gemma_model, logits_json, root, runnable_isas, sha256_hex};
use std::process::Command;

/// The fixture of `set` (`""` or `long`) for `isa`, if recorded.
fn fixture(set: &str, isa: &str) -> Option<serde_json::Value> {
    let path = root()
        .join("crates/rgml-cli/tests/fixtures/gemma3")
        .join(set)
        .join(isa)
        .join("gemma-3-270m-q4_k_m.json");
    let text = std::fs::read_to_string(path).ok()?;
    Some(serde_json::from_str(&text).expect("fixture JSON"))
}

/// Every case of fixture `set` (recorded with a context of `n_ctx`), on every instruction set
/// rgml runs here: tokens and top-10 logits equal llama.cpp's up to the fixture's rounding.
fn check_logits(set: &str, n_ctx: usize) {
    let model = gemma_model();
    let mut checked = 0;
    for isa in runnable_isas() {
        let Some(fixture) = fixture(set, isa) else {
            continue;
        };
        assert_eq!(
            sha256_hex(&std::fs::read(&model).expect("read model")),
            fixture["sha256"].as_str().expect("sha256"),
            "the fixture is for another file"
        );
        for case in fixture["cases"].as_array().expect("cases") {
            let prompt = case["prompt"].as_str().expect("prompt");
            let got = logits_json(&model, isa, prompt, &["-c", &n_ctx.to_string()]);
            let what = format!("{set} {prompt:.40?} on {isa}");
            let worst = common::top10_worst(&got, case, &what);
            // 4-decimal rounding of the fixture, plus f32 spacing at Gemma's |logits| (< 128).
            assert!(worst <= 6e-5, "{what}: {worst} from llama.cpp");
        }
        checked += 1;
    }
    if !runnable_isas().is_empty() {
        assert!(checked > 0, "no Gemma 3 {set} fixture was checked");
    }
}

#[test]
fn gemma3_gives_llama_cpps_tokens_and_logits() {
    check_logits("", 1024);
}

/// A 2,127-token prompt (five micro-batches of 512) in a context of 4,096: the local layers'
/// cache of 1,024 cells (window 512 and a micro-batch) wraps around twice, its cells reused as
/// llama.cpp's tools reuse them (`swa_full` off), and the logits still equal llama.cpp's.
#[test]
fn gemma3_long_prompt_wraps_the_local_cache_and_equals_llama_cpp() {
    check_logits("long", 4096);
}

/// The local layers' KV memory is their window plus a micro-batch, whatever the context.
#[test]
fn gemma3_local_layers_hold_only_their_window() {
    rgml_cpu::register();
    let model = rgml_llm::Model::load(gemma_model(), Default::default()).expect("load Gemma 3");
    let model = std::sync::Arc::new(model);
    let options = rgml_llm::SessionOptions {
        n_ctx: 8192,
        ..Default::default()
    };
    let session = rgml_llm::Session::new(model.clone(), &options).expect("session");
    let cells = session.kv_cells();
    let local: Vec<usize> = (0..cells.len())
        .filter(|&il| model.config.is_local(il))
        .collect();
    // Gemma 3: five local layers, then a global one.
    assert_eq!(local.len(), 15);
    for (il, &n) in cells.iter().enumerate() {
        let want = if local.contains(&il) { 1024 } else { 8192 };
        assert_eq!(n, want, "cells of layer {il}");
    }
}

/// `rgml run --temp 0` (and `--chat`, Gemma's turns: the file has no template) continues each
/// prompt with llama.cpp's greedy text (`tests/fixtures/gemma3/<isa>/greedy*.json`, made by
/// `scripts/gen_greedy_fixtures.py`, the chat prompts wrapped by llama.cpp's `gemma` template).
#[test]
fn gemma3_greedy_text_and_chat_equal_llama_cpps() {
    let model = gemma_model();
    let mut checked = 0;
    for isa in runnable_isas() {
        for (file, chat) in [("greedy.json", false), ("greedy-chat.json", true)] {
            let path = root()
                .join("crates/rgml-cli/tests/fixtures/gemma3")
                .join(isa)
                .join(file);
            let Ok(text) = std::fs::read_to_string(path) else {
                continue;
            };
            let fixture: serde_json::Value = serde_json::from_str(&text).expect("fixture JSON");
            let n = fixture["n_predict"]
                .as_u64()
                .expect("n_predict")
                .to_string();
            for case in fixture["cases"].as_array().expect("cases") {
                let prompt = case["prompt"].as_str().expect("prompt");
                let mut cmd = Command::new(env!("CARGO_BIN_EXE_rgml"));
                // Flash attention off, as llama.cpp made the fixture.
                cmd.args([
                    "run", "-fa", "off", "-p", prompt, "-n", &n, "--temp", "0", "-t", "2",
                ])
                .arg("-m")
                .arg(&model)
                .env("RGML_CPU_ISA", isa);
                if chat {
                    cmd.arg("--chat");
                }
                let out = cmd.output().expect("run rgml");
                assert!(
                    out.status.success(),
                    "{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                let text = String::from_utf8_lossy(&out.stdout);
                // Plain runs echo the prompt first; chat runs print the answer only.
                let text = if chat {
                    &text[..]
                } else {
                    text.strip_prefix(prompt)
                        .expect("the prompt is echoed first")
                };
                let want = case["greedy_text"].as_str().expect("greedy_text");
                assert_eq!(
                    text.trim_end_matches('\n'),
                    want.trim_end_matches('\n'),
                    "greedy text of {prompt:?} (chat: {chat}) on {isa}"
                );
            }
            checked += 1;
        }
    }
    if !runnable_isas().is_empty() {
        assert!(checked > 0, "no Gemma 3 greedy fixture was checked");
    }
}
