//! Several sequences in one session: a batch of tokens of several sequences is one graph per
//! micro-batch, each sequence attending to its own cache stream; a sequence decoded in a batch
//! gives the logits it gets decoded alone, bit for bit; its positions can be removed, copied to
//! another sequence and shifted.

mod common;

use common::argmax;

use rgml_llm::session::BatchToken;
use rgml_llm::{
    EncodeOptions, FlashAttn, LlmError, Logits, Model, Session, SessionOptions, TokenId,
};
use std::sync::Arc;

const PROMPTS: [&str; 4] = [
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time",
    "Paris is the capital of",
    "def fibonacci(n):\n    if n < 2:\n        return n",
];
/// Greedy steps after each prompt.
const STEPS: usize = 12;

fn options(n_seq: usize) -> SessionOptions {
    SessionOptions {
        n_ctx: 96,
        n_ubatch: 512,
        n_threads: Some(2),
        n_seq,
        ..Default::default()
    }
}

fn bits(logits: &[f32]) -> Vec<u32> {
    logits.iter().map(|l| l.to_bits()).collect()
}

fn tokens(model: &Model, prompt: &str) -> Vec<TokenId> {
    model.tokenizer.encode(prompt, EncodeOptions::prompt())
}

/// A sequence decoded alone: the prompt's last logits, then those of `STEPS` greedy steps.
fn alone(model: &Arc<Model>, prompt: &[TokenId], base: &SessionOptions) -> Vec<Vec<u32>> {
    let mut s = Session::new(model.clone(), base).unwrap();
    let mut logits = s.eval(prompt, Logits::Last).unwrap();
    let mut out = vec![bits(&logits)];
    for _ in 0..STEPS {
        logits = s.eval(&[argmax(&logits)], Logits::Last).unwrap();
        out.push(bits(&logits));
    }
    out
}

/// The sequences decoded together, sequence `i` joining at step `start[i]` (its whole prompt in
/// that step's batch, beside the others' generated tokens): what each one got, as [`alone`].
fn together(
    model: &Arc<Model>,
    prompts: &[Vec<TokenId>],
    start: &[usize],
    base: &SessionOptions,
) -> Vec<Vec<Vec<u32>>> {
    let n_vocab = model.config.n_vocab;
    let options = SessionOptions {
        n_seq: prompts.len(),
        ..base.clone()
    };
    let mut s = Session::new(model.clone(), &options).unwrap();
    let mut got: Vec<Vec<Vec<u32>>> = vec![Vec::new(); prompts.len()];
    let mut next: Vec<Option<TokenId>> = vec![None; prompts.len()];
    for step in 0.. {
        let mut batch = Vec::new();
        let mut who = Vec::new();
        for (seq, prompt) in prompts.iter().enumerate() {
            let done = got[seq].len() > STEPS;
            if step == start[seq] {
                let last = prompt.len() - 1;
                batch.extend(prompt.iter().enumerate().map(|(i, &token)| BatchToken {
                    token,
                    seq,
                    logits: i == last,
                }));
                who.push(seq);
            } else if let (Some(token), false) = (next[seq], done) {
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
        let logits = s.decode_batch(&batch).unwrap();
        assert_eq!(logits.len(), who.len() * n_vocab);
        for (row, &seq) in who.iter().enumerate() {
            let l = &logits[row * n_vocab..(row + 1) * n_vocab];
            got[seq].push(bits(l));
            next[seq] = Some(argmax(l));
        }
    }
    got
}

/// `options(1)`, with the arithmetic of ggml's build for `isa` forced on the model's CPU
/// device (`None`: this CPU's own).
fn isa_options(model: &Arc<Model>, isa: Option<&str>) -> SessionOptions {
    let mut base = options(1);
    if let Some(isa) = isa {
        let params = rgml::backend::BackendParams::parse(&format!("isa={isa}")).unwrap();
        base.device_params = vec![(model.device().clone(), params)];
    }
    base
}

fn check_batched_equals_alone(
    model: &Arc<Model>,
    prompts: &[&str],
    starts: &[&[usize]],
    isa: Option<&str>,
) {
    let base = isa_options(model, isa);
    let prompts: Vec<Vec<TokenId>> = prompts.iter().map(|p| tokens(model, p)).collect();
    let solo: Vec<Vec<Vec<u32>>> = prompts.iter().map(|p| alone(model, p, &base)).collect();
    for start in starts {
        let batched = together(model, &prompts, start, &base);
        for (seq, (b, a)) in batched.iter().zip(&solo).enumerate() {
            assert_eq!(b.len(), a.len());
            for (step, (x, y)) in b.iter().zip(a).enumerate() {
                let diff = x.iter().zip(y).filter(|(x, y)| x != y).count();
                assert!(
                    diff == 0,
                    "sequence {seq} (joining at {}) step {step}: {diff} logits differ from alone",
                    start[seq]
                );
            }
        }
    }
}

/// All at once; then joining one after another while the others generate.
#[test]
fn sequences_batched_give_their_logits_alone() {
    let starts: [&[usize]; 2] = [&[0, 0, 0, 0], &[0, 1, 3, 4]];
    check_batched_equals_alone(&common::demo_model(), &PROMPTS, &starts, None);
}

/// The same with the arithmetic of the other instruction sets' builds forced (this CPU's own
/// is the test above): the kernels' choice by row count differs between builds.
#[test]
fn sequences_batched_give_their_logits_alone_on_each_isa() {
    let model = common::demo_model();
    for isa in ["avx2", "avx512"] {
        check_batched_equals_alone(&model, &PROMPTS, &[&[0, 1, 3, 4]], Some(isa));
    }
}

/// Nine prompts, short (under ggml's 8-row line for K-quants) and long.
const MANY: [&str; 9] = [
    PROMPTS[0],
    "Once upon a time, in a land far away, there",
    "Paris is the capital of France, and Berlin is the capital of",
    PROMPTS[3],
    "Hello",
    PROMPTS[1],
    "The sum of two and two is",
    PROMPTS[2],
    "Water boils at a temperature of one hundred degrees",
];

/// Gemma 3: local (sliding-window) layers with their own cells per sequence, and Q4_K/Q6_K
/// weights, whose ggml arithmetic changes at 8 rows (tiled; Q5_0/Q8_0 take tinyBLAS from 2,
/// with `vec_dot`'s bits): nine sequences joining at different steps put up to 8 other
/// sequences' tokens beside each one's, in mixes of prompts and generation steps.
#[test]
fn sliding_window_k_quant_sequences_batched_give_their_logits_alone() {
    let starts: [&[usize]; 2] = [&[0, 0, 0, 0, 0, 0, 0, 0, 0], &[0, 0, 0, 1, 1, 2, 3, 3, 5]];
    check_batched_equals_alone(&common::gemma_model(), &MANY, &starts, None);
}

/// The same on forced AVX2 and AVX-512 arithmetic (tinyBLAS's lanes differ).
#[test]
fn k_quant_sequences_batched_give_their_logits_alone_on_each_isa() {
    let model = common::gemma_model();
    for isa in ["avx2", "avx512"] {
        let starts: [&[usize]; 1] = [&[0, 0, 1, 1, 2, 3, 3, 4, 6]];
        check_batched_equals_alone(&model, &MANY, &starts, Some(isa));
    }
}

#[test]
fn a_batch_in_any_order_gives_each_token_its_row() {
    let model = common::demo_model();
    let (a, b) = (tokens(&model, PROMPTS[0]), tokens(&model, PROMPTS[1]));
    let n_vocab = model.config.n_vocab;
    // Interleaved: a's and b's tokens alternate; every token's logits asked.
    let mut batch = Vec::new();
    for i in 0..a.len().max(b.len()) {
        for (seq, p) in [(1, &b), (0, &a)] {
            if let Some(&token) = p.get(i) {
                batch.push(BatchToken {
                    token,
                    seq,
                    logits: true,
                });
            }
        }
    }
    let mut s = Session::new(model.clone(), &options(2)).unwrap();
    let mixed = s.decode_batch(&batch).unwrap().to_vec();
    assert_eq!(mixed.len(), batch.len() * n_vocab);
    assert_eq!((s.seq_len(0), s.seq_len(1)), (a.len(), b.len()));
    for (seq, p) in [(0, &a), (1, &b)] {
        let mut one = Session::new(model.clone(), &options(1)).unwrap();
        let all = one.eval(p, Logits::All).unwrap();
        let rows: Vec<usize> = (0..batch.len()).filter(|&i| batch[i].seq == seq).collect();
        for (i, &row) in rows.iter().enumerate() {
            let got = &mixed[row * n_vocab..(row + 1) * n_vocab];
            let want = &all[i * n_vocab..(i + 1) * n_vocab];
            // Every token's logits: products of as many rows as alone, so exact.
            assert_eq!(bits(got), bits(want), "sequence {seq} token {i}");
        }
    }
}

#[test]
fn a_sequence_cut_back_continues_as_one_never_longer() {
    let model = common::demo_model();
    let (p, x, y) = (
        tokens(&model, PROMPTS[0]),
        tokens(&model, " And then"),
        tokens(&model, " Meanwhile, the cat"),
    );
    // Without flash attention: with it, ggml's kernel for 64 queries or more rounds differently
    // from its kernel for fewer, so a continuation decoded on its own differs from the same
    // tokens in a longer fresh batch (as in llama.cpp).
    let no_fa = |n_seq| SessionOptions {
        flash_attn: FlashAttn::Off,
        ..options(n_seq)
    };
    let fresh = {
        let mut s = Session::new(model.clone(), &no_fa(1)).unwrap();
        s.eval(&[p.clone(), y.clone()].concat(), Logits::Last)
            .unwrap()
    };
    let mut s = Session::new(model.clone(), &no_fa(2)).unwrap();
    s.eval(&[p.clone(), x].concat(), Logits::Last).unwrap();
    s.seq_rm(0, p.len()..usize::MAX).unwrap();
    assert_eq!(s.seq_len(0), p.len());
    let again = s.eval(&y, Logits::Last).unwrap();
    assert_eq!(bits(&again), bits(&fresh));

    // Another sequence takes the prefix: copied, then continued.
    s.seq_cp(0, 1, 0..p.len()).unwrap();
    assert_eq!(s.seq_len(1), p.len());
    let last = y.len() - 1;
    let batch: Vec<BatchToken> = y
        .iter()
        .enumerate()
        .map(|(i, &token)| BatchToken {
            token,
            seq: 1,
            logits: i == last,
        })
        .collect();
    let copied = s.decode_batch(&batch).unwrap();
    assert_eq!(bits(copied), bits(&fresh));
}

/// Layer 3's cached keys, as f32, as the next graph would read them.
fn cached_keys(s: &mut Session) -> Vec<f32> {
    let (ctx, _) = s.prompt_graph(&[1]).unwrap();
    let id = ctx.find("cache_k_l3").unwrap();
    let mut raw = vec![0u8; ctx[id].nbytes()];
    ctx.tensor_get(id, 0, &mut raw).unwrap();
    raw.chunks(2)
        .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
        .collect()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// RoPE makes attention depend on distances only: a whole sequence moved forward (its keys
/// rotated by the shift) continues as it would have unmoved, up to rounding; moved back, its
/// keys are what they were, up to the f16 rounding of the rotated ones.
#[test]
fn a_shifted_sequence_continues_as_unshifted() {
    let model = common::demo_model();
    let (p, y) = (tokens(&model, PROMPTS[2]), tokens(&model, " the"));
    let fresh = {
        let mut s = Session::new(model.clone(), &options(1)).unwrap();
        s.eval(&[p.clone(), y.clone()].concat(), Logits::Last)
            .unwrap()
    };
    let mut s = Session::new(model.clone(), &options(1)).unwrap();
    s.eval(&p, Logits::Last).unwrap();
    let n = p.len() * model.config.n_embd_kv();
    let keys = cached_keys(&mut s)[..n].to_vec();
    s.seq_shift(0, 0..usize::MAX, 40).unwrap();
    assert_eq!(s.seq_len(0), p.len() + 40);
    let rotated = cached_keys(&mut s)[..n].to_vec();
    assert!(max_diff(&rotated, &keys) > 0.5, "the keys were rotated");
    let shifted = s.eval(&y, Logits::Last).unwrap();
    // Re-rounded keys move the attention scores a little: close, the same best token.
    let shifted_diff = max_diff(&shifted, &fresh);
    assert!(shifted_diff < 2.0, "{shifted_diff}");
    assert_eq!(argmax(&shifted), argmax(&fresh));
    // Cut back to the prompt and moved back: the keys within one f16 step (|k| < 16).
    s.seq_rm(0, p.len() + 40..usize::MAX).unwrap();
    s.seq_shift(0, 40..usize::MAX, -40).unwrap();
    assert_eq!(s.seq_len(0), p.len());
    let back = cached_keys(&mut s)[..n].to_vec();
    assert!(keys.iter().all(|k| k.abs() < 16.0));
    assert!(
        max_diff(&back, &keys) <= 2.0 * 2f32.powi(-7),
        "{}",
        max_diff(&back, &keys)
    );
}

/// A quantized K cache shifts as llama.cpp shifts it: dequantized, its Walsh-Hadamard rotation
/// undone, rotated by RoPE, rotated again and quantized back. Moved forward and back, the
/// sequence continues as it would have unmoved, up to the rounding of the re-quantized keys.
#[test]
fn a_quantized_k_cache_shifts() {
    let model = common::demo_model();
    let (p, y) = (tokens(&model, PROMPTS[2]), tokens(&model, " the"));
    for k_type in [rgml::DType::Q8_0, rgml::DType::Q4_0] {
        let opts = SessionOptions {
            cache_type_k: k_type,
            flash_attn: FlashAttn::On,
            ..options(1)
        };
        let fresh = {
            let mut s = Session::new(model.clone(), &opts).unwrap();
            s.eval(&[p.clone(), y.clone()].concat(), Logits::Last)
                .unwrap()
        };
        let mut s = Session::new(model.clone(), &opts).unwrap();
        s.eval(&p, Logits::Last).unwrap();
        s.seq_shift(0, 0..usize::MAX, 40).unwrap();
        assert_eq!(s.seq_len(0), p.len() + 40);
        let shifted = s.eval(&y, Logits::Last).unwrap();
        let diff = max_diff(&shifted, &fresh);
        assert!(diff < 2.0, "{k_type}: moved forward, logits off by {diff}");
        assert_eq!(argmax(&shifted), argmax(&fresh), "{k_type}");
        s.seq_rm(0, p.len() + 40..usize::MAX).unwrap();
        s.seq_shift(0, 40..usize::MAX, -40).unwrap();
        assert_eq!(s.seq_len(0), p.len());
        let back = s.eval(&y, Logits::Last).unwrap();
        let diff = max_diff(&back, &fresh);
        assert!(diff < 2.0, "{k_type}: moved back, logits off by {diff}");
        assert_eq!(argmax(&back), argmax(&fresh), "{k_type}");
    }
}

#[test]
fn bad_batches_are_errors_that_change_nothing() {
    let model = common::demo_model();
    let mut s = Session::new(model.clone(), &options(2)).unwrap();
    let p = tokens(&model, PROMPTS[1]);
    s.eval(&p, Logits::Last).unwrap();
    let tok = |token, seq| BatchToken {
        token,
        seq,
        logits: true,
    };
    let n_vocab = model.config.n_vocab as TokenId;
    assert!(matches!(
        s.decode_batch(&[tok(1, 0), tok(1, 2)]),
        Err(LlmError::BadInput(_))
    ));
    assert!(matches!(
        s.decode_batch(&[tok(1, 1), tok(n_vocab, 0)]),
        Err(LlmError::InvalidToken { .. })
    ));
    assert!(matches!(s.decode_batch(&[]), Err(LlmError::BadInput(_))));
    let too_many = vec![tok(1, 1); 97];
    assert!(matches!(
        s.decode_batch(&too_many),
        Err(LlmError::ContextFull { .. })
    ));
    assert!(s.seq_rm(2, 0..1).is_err());
    assert!(s.seq_cp(0, 5, 0..1).is_err());
    assert_eq!((s.seq_len(0), s.seq_len(1)), (p.len(), 0));
    // Each sequence has its own context: sequence 1 takes the rest of its own.
    let fill = vec![tok(1, 1); 96];
    assert_eq!(s.decode_batch(&fill).unwrap().len(), 96 * n_vocab as usize);
}
