//! The engine on a hybrid model (the `qwen35` random model of `rgml-testmodels`: gated
//! delta-net layers with a recurrent state per sequence beside full-attention layers): eight
//! requests decoded together in eight slots give their solo greedy output, a conversation
//! that extends what a slot holds continues from its state (under either reuse policy), and a
//! prompt that shares only part of it goes back to the state checkpointed after an earlier
//! prompt (or, without checkpoints, is evaluated afresh: a recurrent state cannot be cut
//! back), with the same output.

use rgml_llm::{EncodeOptions, Model, Sampler, SamplerParams, Session, SessionOptions, TokenId};
use rgml_serve::engine::{Engine, EngineOptions, PrefixReuse};
use rgml_serve::generator::{FinishReason, GenEvent, Usage};
use rgml_serve::{GenRequest, Generator, Prompt, Submission};
use rgml_testmodels::{write_random_model, Arch};
use std::path::PathBuf;
use std::sync::Arc;

const N_CTX: usize = 256;

/// The random model, written as `<name>.gguf` (tests running at once must not rewrite each
/// other's file).
fn model(name: &str) -> Arc<Model> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let vocab = root.join(Arch::Qwen35.vocab_file());
    assert!(vocab.exists(), "run scripts/fetch-vocab.sh first");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("serve-hybrid");
    std::fs::create_dir_all(&dir).expect("create the model directory");
    let path = dir.join(format!("{name}.gguf"));
    write_random_model(Arch::Qwen35, &vocab, &path).expect("write the random model");
    rgml_cpu::register();
    Arc::new(Model::load(&path, Default::default()).expect("load the model"))
}

fn options(n_seq: usize) -> SessionOptions {
    SessionOptions {
        n_ctx: N_CTX,
        n_threads: Some(2),
        n_seq,
        ..Default::default()
    }
}

fn engine(model: &Arc<Model>, n_slots: usize, reuse: PrefixReuse, checkpoints: usize) -> Engine {
    let session = Session::new(model.clone(), &options(n_slots)).expect("session");
    let options = EngineOptions {
        model_id: "qwen35".into(),
        prefix_reuse: reuse,
        ctx_checkpoints: checkpoints,
        ..Default::default()
    };
    Engine::start(session, options).expect("engine")
}

fn greedy(tokens: &[TokenId], max_tokens: usize) -> GenRequest {
    GenRequest {
        prompt: Prompt::Tokens(tokens.to_vec()),
        sampling: SamplerParams::greedy(),
        max_tokens: Some(max_tokens),
        stop: Vec::new(),
        n_probs: None,
        ignore_eos: false,
        format: Default::default(),
    }
}

/// The greedy continuation of `tokens` in a session of its own.
fn solo(model: &Arc<Model>, tokens: &[TokenId], max_tokens: usize) -> Vec<TokenId> {
    let mut s = Session::new(model.clone(), &options(1)).expect("session");
    let mut sampler = Sampler::new(SamplerParams::greedy());
    let generated = s
        .generate(tokens, &mut sampler, max_tokens)
        .expect("generate");
    generated.map(|t| t.expect("token")).collect()
}

/// The token ids of a submission, its finish reason and usage.
fn collect(mut sub: Submission) -> (Vec<TokenId>, FinishReason, Usage) {
    let mut ids = Vec::new();
    while let Some(ev) = sub.events.blocking_recv() {
        match ev {
            GenEvent::Token(t) => ids.push(t.id),
            GenEvent::Done { reason, usage, .. } => return (ids, reason, usage),
            GenEvent::Failed(why) => panic!("failed: {why}"),
        }
    }
    panic!("the events ended without Done");
}

const PROMPTS: [&str; 8] = [
    "Once upon a time",
    "The capital of France is",
    "def add(a, b):",
    "The quick brown fox",
    "In 1492, Columbus",
    "Water boils at",
    "My favourite colour is",
    "Rust is a programming language that",
];

#[test]
fn eight_requests_together_give_their_solo_output() {
    let model = model("eight");
    let e = engine(&model, 8, PrefixReuse::Exact, 8);
    let prompts: Vec<Vec<TokenId>> = PROMPTS
        .iter()
        .map(|p| model.tokenizer.encode(p, EncodeOptions::prompt()))
        .collect();
    let subs: Vec<Submission> = prompts
        .iter()
        .map(|p| e.submit(greedy(p, 16)).expect("submit"))
        .collect();
    for (p, sub) in prompts.iter().zip(subs) {
        let (ids, reason, _) = collect(sub);
        let want = solo(&model, p, 16);
        let full = want.len() == 16;
        assert_eq!(
            reason,
            [FinishReason::Stop, FinishReason::Length][usize::from(full)]
        );
        assert_eq!(ids, want, "prompt {p:?}");
    }
}

#[test]
fn a_conversation_continues_from_its_state_and_a_partial_match_from_a_checkpoint() {
    let model = model("conversation");
    for (reuse, checkpoints) in [
        (PrefixReuse::Exact, 8),
        (PrefixReuse::Any, 8),
        (PrefixReuse::Exact, 0),
    ] {
        conversation(&model, reuse, checkpoints);
    }
}

fn conversation(model: &Arc<Model>, reuse: PrefixReuse, checkpoints: usize) {
    let e = engine(model, 1, reuse, checkpoints);
    let first = model
        .tokenizer
        .encode("The quick brown fox", EncodeOptions::prompt());
    let (ids, _, usage) = collect(e.submit(greedy(&first, 8)).expect("submit"));
    assert_eq!(usage.cached_tokens, 0);
    // The slot holds the prompt and the generated tokens but the last (sampled, never
    // evaluated): a prompt extending exactly those continues from the state.
    let mut next = first.clone();
    next.extend_from_slice(&ids);
    next.extend(model.tokenizer.encode(" jumps", EncodeOptions::default()));
    let (got, _, usage) = collect(e.submit(greedy(&next, 8)).expect("submit"));
    assert_eq!(usage.cached_tokens, first.len() + ids.len() - 1);
    assert_eq!(got, solo(model, &next, 8), "{reuse:?}");
    // Sharing only the first prompt: the state holds more, so the slot goes back to the
    // checkpoint made after that prompt (without checkpoints, everything is evaluated again).
    let mut other = first.clone();
    other.extend(model.tokenizer.encode(" sleeps", EncodeOptions::default()));
    // Then the same prompt again: back to the checkpoint made after it, then from its kept
    // logits.
    let want = solo(model, &other, 8);
    for kept_with_checkpoints in [first.len(), other.len()] {
        let (got, _, usage) = collect(e.submit(greedy(&other, 8)).expect("submit"));
        let kept = if checkpoints > 0 {
            kept_with_checkpoints
        } else {
            0
        };
        let what = format!("{reuse:?}, {checkpoints} checkpoints");
        assert_eq!(usage.cached_tokens, kept, "{what}");
        assert_eq!(got, want, "{what}");
    }
}
