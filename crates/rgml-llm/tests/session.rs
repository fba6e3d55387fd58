//! Inference-state properties on the demo model: batching changes the logits only as it does
//! in llama.cpp, the context limit is an error, bad token ids are errors.

mod common;

use rgml_llm::{EncodeOptions, FlashAttn, LlmError, Logits, Model, Session, SessionOptions};

/// Flash attention off, as llama.cpp measured the figures below.
fn options(n_ctx: usize, n_ubatch: usize) -> SessionOptions {
    SessionOptions {
        n_ctx,
        n_ubatch,
        n_threads: None,
        device_params: Vec::new(),
        flash_attn: FlashAttn::Off,
        ..Default::default()
    }
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
}

fn argmax(v: &[f32]) -> usize {
    (0..v.len()).fold(0, |best, i| if v[i] > v[best] { i } else { best })
}

/// Splitting a prompt into micro-batches changes the last logits exactly as it does in
/// llama.cpp. Over one activation row ggml multiplies F16 (the KV cache) in
/// `ggml_vec_dot_f16`'s order, over several in tinyBLAS's, so a piece of one token rounds its
/// attention differently, and the K/V it stores carry that into later positions. llama.cpp
/// 0.3.36's AVX2 build on this prompt (`scripts/gen_model_fixtures.py`'s loader, decoding in
/// pieces): the last logits move by at most 0.6177826 in single steps and 0.3769989 in pieces of
/// 3 (3, 3, 3, 1), and not at all in pieces of 2 or 4. rgml, with the AVX2 arithmetic, must
/// move them by exactly as much.
#[test]
fn micro_batches_and_single_steps_change_the_logits_as_in_llama_cpp() {
    let model = common::demo_model();
    let tokens = model.tokenizer.encode(
        "The quick brown fox jumps over the lazy dog.",
        EncodeOptions::default(),
    );
    assert_eq!(tokens.len(), 10);
    let isa = rgml::backend::BackendParams::parse("isa=avx2").unwrap();
    let opts = |n_ubatch: usize| SessionOptions {
        device_params: vec![(model.device().clone(), isa.clone())],
        ..options(64, n_ubatch)
    };
    let mut one = Session::new(model.clone(), &opts(512)).unwrap();
    let all = one.eval(&tokens, Logits::All).unwrap();
    let n_vocab = model.config.n_vocab;
    assert_eq!(all.len(), tokens.len() * n_vocab);
    let last = &all[(tokens.len() - 1) * n_vocab..];
    let batched = |n_ubatch: usize| {
        let mut s = Session::new(model.clone(), &opts(n_ubatch)).unwrap();
        s.eval(&tokens, Logits::Last).unwrap()
    };
    let mut stepped = Session::new(model.clone(), &opts(512)).unwrap();
    let mut last_stepped = Vec::new();
    for &t in &tokens {
        last_stepped = stepped.eval(&[t], Logits::Last).unwrap();
    }
    assert_eq!(stepped.n_past(), tokens.len());
    for (n_ubatch, llama_cpp) in [(2, 0.0), (4, 0.0), (3, 0.3769989)] {
        let moved = max_diff(last, &batched(n_ubatch));
        assert!(
            (moved - llama_cpp).abs() <= 1e-6,
            "pieces of {n_ubatch}: moved {moved}, llama.cpp {llama_cpp}"
        );
    }
    let moved = max_diff(last, &last_stepped);
    assert!(
        (moved - 0.6177826).abs() <= 1e-6,
        "single steps: moved {moved}"
    );
    assert_eq!(argmax(last), argmax(&last_stepped));
    // The logits are a real distribution over the vocabulary, not a constant.
    let spread = last.iter().copied().fold(f32::NEG_INFINITY, f32::max)
        - last.iter().copied().fold(f32::INFINITY, f32::min);
    assert!(spread > 5.0 && last.iter().all(|l| l.is_finite()));
}

#[test]
fn limits_are_errors_not_panics() {
    let model = common::demo_model();
    let mut s = Session::new(model.clone(), &options(4, 512)).unwrap();
    assert!(matches!(
        s.eval(&[], Logits::Last),
        Err(LlmError::BadInput(_))
    ));
    assert!(matches!(
        s.eval(&[1, 2, 3, 4, 5], Logits::Last),
        Err(LlmError::ContextFull { .. })
    ));
    assert!(matches!(
        s.eval(&[u32::MAX], Logits::Last),
        Err(LlmError::InvalidToken { id: u32::MAX, .. })
    ));
    assert_eq!(s.n_past(), 0, "failed calls leave the sequence as it was");
    s.eval(&[1, 2, 3, 4], Logits::Last).unwrap();
    assert!(matches!(
        s.eval(&[5], Logits::Last),
        Err(LlmError::ContextFull { .. })
    ));
    s.reset();
    s.eval(&[5], Logits::Last).unwrap();
    assert!(Session::new(model.clone(), &options(0, 1)).is_err());
    // A device's own parameters are checked by its backend.
    let cpu = model.device().clone();
    let bad = rgml::backend::BackendParams::parse("isa=bogus").unwrap();
    assert!(Session::new(
        model.clone(),
        &SessionOptions {
            device_params: vec![(cpu, bad)],
            ..options(8, 8)
        }
    )
    .is_err());
}

#[test]
fn missing_and_malformed_files_are_errors() {
    rgml_cpu::register();
    let missing = Model::load("/nonexistent/model.gguf", Default::default())
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert_eq!(
        missing.matches("/nonexistent/model.gguf").count(),
        1,
        "the path once: {missing}"
    );
    let dir = std::env::temp_dir().join(format!("rgml-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.gguf");
    std::fs::write(&bad, b"GGUF\x03\x00\x00\x00garbage").unwrap();
    let err = Model::load(&bad, Default::default()).expect_err("an error");
    assert!(err.to_string().contains("bad.gguf"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// The eval callback observes nodes by llama.cpp's names on any session (here one device), sees
/// the values capture keeps, and stops the evaluation when it returns false.
#[test]
fn eval_callback_observes_named_nodes_and_can_stop() {
    use std::sync::{Arc, Mutex};
    let model = common::demo_model();
    let tokens = model
        .tokenizer
        .encode("The quick brown fox", rgml_llm::EncodeOptions::default());
    let mut captured = Session::new(model.clone(), &options(64, 512)).unwrap();
    captured.set_capture(true);
    let want_logits = captured.eval(&tokens, Logits::Last).unwrap();
    let want = captured
        .captured()
        .iter()
        .find(|c| c.name == "attn_norm-0")
        .map(|c| c.data.clone())
        .expect("capture keeps attn_norm-0");

    type Seen = Vec<(String, Vec<f32>)>;
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let mut s = Session::new(model.clone(), &options(64, 512)).unwrap();
    let sink = seen.clone();
    s.set_eval_callback(Box::new(move |ctx, id, ask| {
        let name = &ctx[id].name;
        if ask {
            return name == "attn_norm-0" || name == "logits";
        }
        let values = ctx.tensor_get_f32(id).unwrap_or_default();
        sink.lock().unwrap().push((name.clone(), values));
        true
    }));
    let logits = s.eval(&tokens, Logits::Last).unwrap();
    assert_eq!(logits, want_logits, "observing changes nothing");
    let seen = seen.lock().unwrap().clone();
    let names: Vec<&str> = seen.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["attn_norm-0", "logits"]);
    assert_eq!(seen[0].1, want, "the callback sees what capture keeps");

    let mut stopped = Session::new(model.clone(), &options(64, 512)).unwrap();
    stopped.set_eval_callback(Box::new(|ctx, id, ask| {
        ask || ctx[id].name != "attn_norm-1"
    }));
    assert!(matches!(
        stopped.eval(&tokens, Logits::Last),
        Err(LlmError::Core(rgml::Error::Aborted))
    ));
    stopped.clear_eval_callback();
}
