//! Several sessions on one model: computations only read the weights, so they hold them shared
//! and run at the same time, each giving exactly the logits of a session alone.

mod common;

use rgml_llm::{EncodeOptions, Logits, Model, Session, SessionOptions};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

const PROMPT: &str = "The quick brown fox jumps over the lazy dog.";
/// Decoding steps after the prompt.
const STEPS: usize = 6;

fn options() -> SessionOptions {
    SessionOptions {
        n_ctx: 64,
        n_ubatch: 512,
        n_threads: Some(1),
        device_params: Vec::new(),
        ..Default::default()
    }
}

/// The prompt's last logits, then those of `STEPS` greedy steps, bit for bit (as `u32`s).
fn run(model: &Arc<Model>) -> Vec<Vec<u32>> {
    let tokens = model.tokenizer.encode(PROMPT, EncodeOptions::default());
    let mut session = Session::new(model.clone(), &options()).expect("a session");
    let mut out = Vec::new();
    let mut logits = session.eval(&tokens, Logits::Last).expect("the prompt");
    for _ in 0..STEPS {
        out.push(logits.iter().map(|l| l.to_bits()).collect::<Vec<_>>());
        let next = logits
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map(|(i, _)| i as u32)
            .expect("a vocabulary");
        logits = session.eval(&[next], Logits::Last).expect("a step");
    }
    out.push(logits.iter().map(|l| l.to_bits()).collect());
    out
}

/// A session computes while another holder keeps shared access to every weight buffer, as a
/// second session's compute does: if computing took the weights exclusively, it would wait
/// for ever here.
#[test]
fn a_session_computes_while_the_weights_are_held_shared() {
    let model = common::demo_model();
    let alone = run(&model);
    let guards: Vec<_> = model
        .weight_buffers()
        .iter()
        .filter_map(|b| b.host_read())
        .collect();
    assert!(
        !guards.is_empty(),
        "the demo model's weights are host memory"
    );
    std::thread::scope(|scope| {
        let (tx, rx) = mpsc::channel();
        let model = &model;
        scope.spawn(move || tx.send(run(model)));
        // Generous: the whole run takes well under a second when it is not blocked.
        let shared = rx.recv_timeout(Duration::from_secs(300));
        drop(guards);
        let shared = shared.expect("the session waited for exclusive access to the weights");
        assert!(shared == alone, "logits differ from the session alone");
    });
}

/// Two sessions on two threads, on one model at once: each gets the logits of a session alone,
/// bit for bit.
#[test]
fn two_sessions_on_two_threads_give_the_single_session_logits() {
    let model = common::demo_model();
    let alone = run(&model);
    let (a, b) = std::thread::scope(|scope| {
        let first = scope.spawn(|| run(&model));
        let second = scope.spawn(|| run(&model));
        (first.join(), second.join())
    });
    let (a, b) = (a.expect("first session"), b.expect("second session"));
    assert!(a == alone, "the first session's logits differ");
    assert!(b == alone, "the second session's logits differ");
}
