//! A hybrid model's recurrent states (the `qwen35` random model of `rgml-testmodels`) under
//! the sequence operations a server uses, with llama.cpp's rules for recurrent memory: a
//! cleared sequence starts again from zero states, a sequence's newest positions cannot be
//! removed alone (the error changes nothing), a copy takes the whole state, a checkpoint takes
//! a sequence back to the positions it was made of, and `rgml bench` at a depth refills it.

#[allow(dead_code)] // Only the root is used here.
mod common;

use common::root;
use rgml_llm::session::BatchToken;
use rgml_llm::{EncodeOptions, Logits, Model, Session, SessionOptions, TokenId};
use rgml_testmodels::{write_random_model, Arch};
use std::path::PathBuf;
use std::sync::Arc;

/// The random model, written as `<name>.gguf` (tests running at once must not rewrite each
/// other's file).
fn model(name: &str) -> Arc<Model> {
    let arch = Arch::Qwen35;
    let vocab = root().join(arch.vocab_file());
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("hybrid-state");
    std::fs::create_dir_all(&dir).expect("create the model directory");
    let path = dir.join(format!("{name}.gguf"));
    write_random_model(arch, &vocab, &path).expect("write the random model");
    rgml_cpu::register();
    Arc::new(Model::load(&path, Default::default()).expect("load the model"))
}

fn session(model: &Arc<Model>, n_seq: usize) -> Session {
    let options = SessionOptions {
        n_ctx: 256,
        n_threads: Some(2),
        n_seq,
        ..Default::default()
    };
    Session::new(model.clone(), &options).expect("session")
}

fn prompt(model: &Model, text: &str) -> Vec<TokenId> {
    model.tokenizer.encode(text, EncodeOptions::prompt())
}

fn bits(logits: &[f32]) -> Vec<u32> {
    logits.iter().map(|l| l.to_bits()).collect()
}

/// Sequence `seq`'s tokens, each with its logits.
fn tokens(tokens: &[TokenId], seq: usize) -> Vec<BatchToken> {
    tokens
        .iter()
        .map(|&token| BatchToken {
            token,
            seq,
            logits: true,
        })
        .collect()
}

#[test]
fn a_cleared_sequence_starts_again_from_zero_states() {
    let model = model("cleared");
    let (a, b) = (
        prompt(&model, "Once upon a time"),
        prompt(&model, "Hello, world"),
    );
    let mut s = session(&model, 1);
    let first = bits(&s.eval(&a, Logits::Last).expect("prompt"));
    s.eval(&b, Logits::Last).expect("more tokens");
    s.seq_rm(0, 0..usize::MAX).expect("clear");
    assert_eq!(s.seq_len(0), 0);
    assert_eq!(bits(&s.eval(&a, Logits::Last).expect("again")), first);
    s.reset();
    assert_eq!(bits(&s.eval(&a, Logits::Last).expect("after reset")), first);
}

#[test]
fn the_newest_positions_cannot_be_removed_alone() {
    let model = model("newest");
    let (a, b) = (
        prompt(&model, "The capital of France is"),
        prompt(&model, " Paris"),
    );
    let mut tried = session(&model, 1);
    let mut plain = session(&model, 1);
    tried.eval(&a, Logits::Last).expect("prompt");
    plain.eval(&a, Logits::Last).expect("prompt");
    let n = tried.seq_len(0);
    for start in [1, n - 1] {
        let e = tried.seq_rm(0, start..usize::MAX).unwrap_err();
        assert!(e.to_string().contains("recurrent state"), "{e}");
        assert_eq!(tried.seq_len(0), n, "a refused removal changes nothing");
    }
    // Removing nothing is fine.
    tried.seq_rm(0, n..usize::MAX).expect("nothing to remove");
    let want = bits(&plain.eval(&b, Logits::Last).expect("continue"));
    assert_eq!(bits(&tried.eval(&b, Logits::Last).expect("continue")), want);
}

#[test]
fn a_copied_sequence_continues_as_its_source() {
    let model = model("copied");
    let (a, b) = (
        prompt(&model, "Shopping list: apples,"),
        prompt(&model, " pears"),
    );
    let mut s = session(&model, 2);
    s.eval(&a, Logits::Last).expect("prompt");
    let n = s.seq_len(0);
    let e = s.seq_cp(0, 1, 0..n - 1).unwrap_err();
    assert!(e.to_string().contains("recurrent state"), "{e}");
    assert_eq!(s.seq_len(1), 0, "a refused copy changes nothing");
    s.seq_cp(0, 1, 0..usize::MAX).expect("whole copy");
    assert_eq!(s.seq_len(1), n);
    let n_vocab = model.config.n_vocab;
    let mut batch = tokens(&b, 0);
    batch.extend(tokens(&b, 1));
    let logits = s.decode_batch(&batch).expect("both");
    let per_seq = b.len() * n_vocab;
    assert_eq!(bits(&logits[..per_seq]), bits(&logits[per_seq..]));
}

/// `rgml bench` at a depth refills it before each test (the state cannot be cut back).
#[test]
fn bench_at_a_depth_runs_on_a_hybrid_model() {
    let arch = Arch::Qwen35;
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("hybrid-state");
    std::fs::create_dir_all(&dir).expect("create the model directory");
    let path = dir.join("bench.gguf");
    write_random_model(arch, &root().join(arch.vocab_file()), &path).expect("write the model");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rgml"))
        .args([
            "bench", "-p", "8", "-n", "4", "-d", "0,16", "-r", "1", "-t", "2", "-m",
        ])
        .arg(&path)
        .output()
        .expect("run rgml bench");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(table.contains("tg4 @ d16"), "{table}");
}

/// A checkpoint made after a prompt takes the sequence back there, however much followed: the
/// next tokens get the logits they get after that prompt alone. One that does not fit (more
/// positions than the sequence holds) is refused and changes nothing.
#[test]
fn a_checkpoint_takes_a_sequence_back_to_its_positions() {
    let model = model("checkpoint");
    let (a, b, c) = (
        prompt(&model, "Once upon a time"),
        prompt(&model, " there was"),
        prompt(&model, " a dragon"),
    );
    let mut plain = session(&model, 1);
    plain.eval(&a, Logits::Last).expect("prompt");
    let want = bits(&plain.eval(&c, Logits::All).expect("other continuation"));
    let mut s = session(&model, 1);
    s.eval(&a, Logits::Last).expect("prompt");
    let checkpoint = s.seq_checkpoint(0).expect("checkpoint");
    assert_eq!(checkpoint.n_past(), a.len());
    assert!(checkpoint.size() > 0);
    s.eval(&b, Logits::Last).expect("continuation");
    s.seq_restore(0, &checkpoint).expect("restore");
    assert_eq!(s.seq_len(0), a.len());
    assert_eq!(bits(&s.eval(&c, Logits::All).expect("after restore")), want);
    // A checkpoint of more positions than the sequence holds now.
    let longer = s.seq_checkpoint(0).expect("checkpoint");
    s.seq_rm(0, 0..usize::MAX).expect("clear");
    let e = s.seq_restore(0, &longer).unwrap_err();
    assert!(e.to_string().contains("does not fit"), "{e}");
    assert_eq!(s.seq_len(0), 0, "a refused restore changes nothing");
}
