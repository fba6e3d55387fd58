//! Mixture-of-experts and hybrid models (the `qwen3moe`, `qwen35` and `qwen35moe` random
//! models of `rgml-testmodels`) decoding several sequences in one batch: each sequence gets the
//! logits it gets decoded alone, bit for bit. ggml's CPU picks an expert's kernel by how many
//! rows are routed to it (its tiled K-quant kernel from 8), so a batch that mixed the
//! sequences' rows in one routing would change them; each sequence is routed on its own, and
//! runs of one-token steps as alone. A hybrid model's delta-net layers keep one recurrent
//! state per sequence, which its tokens alone update. Gemma 4 (`gemma4`, `gemma4moe`) routes
//! on its own norm of the block's input and adds per-layer embeddings; its last layers read
//! earlier layers' caches.

#[allow(dead_code)] // Only the root and the instruction sets are used here.
mod common;

use common::{root, runnable_isas};
use rgml_llm::session::BatchToken;
use rgml_llm::{EncodeOptions, Logits, Model, Session, SessionOptions, TokenId};
use rgml_testmodels::{write_random_model, Arch};
use std::path::PathBuf;
use std::sync::Arc;

/// Short prompts (fewer than 8 rows per expert) and long ones (more, for some experts).
const PROMPTS: [&str; 6] = [
    "Once upon a time, in a small village at the edge of a great forest, there lived an old \
     clockmaker who repaired every clock in the valley.",
    "Hello",
    "The capital of France is",
    "Shopping list: three apples, two loaves of bread, a jar of honey, fresh basil, olive oil, \
     sea salt and black pepper.",
    "def f(x): return x**2",
    "Water boils at",
];
/// Greedy steps after each prompt.
const STEPS: usize = 5;

fn model(arch: Arch) -> Arc<Model> {
    let vocab = root().join(arch.vocab_file());
    assert!(
        vocab.exists(),
        "{} not found: run scripts/fetch-vocab.sh",
        vocab.display()
    );
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("moe-batch");
    std::fs::create_dir_all(&dir).expect("create the model directory");
    let path = dir.join(format!("{}.gguf", arch.name()));
    write_random_model(arch, &vocab, &path).expect("write the random model");
    rgml_cpu::register();
    Arc::new(Model::load(&path, Default::default()).expect("load the model"))
}

fn options(model: &Model, isa: &str, n_seq: usize) -> SessionOptions {
    let params = rgml::backend::BackendParams::parse(&format!("isa={isa}")).expect("isa");
    SessionOptions {
        n_ctx: 128,
        n_ubatch: 512,
        n_threads: Some(2),
        n_seq,
        device_params: vec![(model.device().clone(), params)],
        ..Default::default()
    }
}

fn bits(logits: &[f32]) -> Vec<u32> {
    logits.iter().map(|l| l.to_bits()).collect()
}

fn argmax(logits: &[f32]) -> TokenId {
    let best = (0..logits.len()).fold(0, |b, i| if logits[i] > logits[b] { i } else { b });
    best as TokenId
}

/// One sequence alone: the prompt's last logits, then those of `STEPS` greedy steps.
fn alone(model: &Arc<Model>, prompt: &[TokenId], isa: &str) -> Vec<Vec<u32>> {
    let mut s = Session::new(model.clone(), &options(model, isa, 1)).expect("session");
    let mut logits = s.eval(prompt, Logits::Last).expect("prompt");
    let mut out = vec![bits(&logits)];
    for _ in 0..STEPS {
        logits = s.eval(&[argmax(&logits)], Logits::Last).expect("step");
        out.push(bits(&logits));
    }
    out
}

/// The sequences in one session, sequence `i` joining at step `start[i]` with its whole prompt
/// beside the others' generated tokens: what each one got, as [`alone`].
fn together(
    model: &Arc<Model>,
    prompts: &[Vec<TokenId>],
    start: &[usize],
    isa: &str,
) -> Vec<Vec<Vec<u32>>> {
    let n_vocab = model.config.n_vocab;
    let mut s = Session::new(model.clone(), &options(model, isa, prompts.len())).expect("session");
    let mut got: Vec<Vec<Vec<u32>>> = vec![Vec::new(); prompts.len()];
    let mut next: Vec<Option<TokenId>> = vec![None; prompts.len()];
    for step in 0.. {
        let (mut batch, mut who) = (Vec::new(), Vec::new());
        for (seq, prompt) in prompts.iter().enumerate() {
            if step == start[seq] {
                let last = prompt.len() - 1;
                batch.extend(prompt.iter().enumerate().map(|(i, &token)| BatchToken {
                    token,
                    seq,
                    logits: i == last,
                }));
                who.push(seq);
            } else if let (Some(token), false) = (next[seq], got[seq].len() > STEPS) {
                batch.push(BatchToken {
                    token,
                    seq,
                    logits: true,
                });
                who.push(seq);
            }
        }
        if batch.is_empty() {
            break;
        }
        let logits = s.decode_batch(&batch).expect("batch");
        for (row, &seq) in who.iter().enumerate() {
            let l = &logits[row * n_vocab..(row + 1) * n_vocab];
            got[seq].push(bits(l));
            next[seq] = Some(argmax(l));
        }
    }
    got
}

#[test]
fn moe_sequences_batched_give_their_logits_alone_on_each_isa() {
    batched_as_alone(Arch::Qwen3Moe);
}

#[test]
fn hybrid_sequences_batched_give_their_logits_alone_on_each_isa() {
    batched_as_alone(Arch::Qwen35);
    batched_as_alone(Arch::Qwen35Moe);
}

#[test]
fn gemma4_sequences_batched_give_their_logits_alone_on_each_isa() {
    batched_as_alone(Arch::Gemma4);
    batched_as_alone(Arch::Gemma4Moe);
}

fn batched_as_alone(arch: Arch) {
    let model = model(arch);
    let prompts: Vec<Vec<TokenId>> = PROMPTS
        .iter()
        .map(|p| model.tokenizer.encode(p, EncodeOptions::prompt()))
        .collect();
    for isa in runnable_isas() {
        let solo: Vec<_> = prompts.iter().map(|p| alone(&model, p, isa)).collect();
        for start in [[0, 0, 0, 0, 0, 0], [0, 1, 1, 2, 3, 3]] {
            let batched = together(&model, &prompts, &start, isa);
            for (seq, (b, a)) in batched.iter().zip(&solo).enumerate() {
                assert_eq!(b.len(), a.len());
                for (step, (x, y)) in b.iter().zip(a).enumerate() {
                    let diff = x.iter().zip(y).filter(|(x, y)| x != y).count();
                    assert_eq!(
                        diff, 0,
                        "{arch} on {isa}: sequence {seq} (joining at {}) step {step}: logits \
                         differ from alone",
                        start[seq]
                    );
                }
            }
        }
    }
}
