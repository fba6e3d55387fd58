//! The demo model split over two devices (`CPU0`, `CPU1`, each accepting only its own buffer
//! type, so every crossing is a real copy) gives the logits of one device, with the expected
//! splits and copies.

mod common;

use rgml::registry::Registry;
use rgml_llm::{EncodeOptions, LoadOptions, Logits, Model, Placement, Session, SessionOptions};
use std::sync::Arc;

/// Registers once: the devices of a model and of its session's backends must be the same
/// instances (a device accepts only its own buffer type).
fn register() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let reg = rgml_cpu::CpuRegistry::with_devices(["CPU", "CPU0", "CPU1"]);
        assert_eq!(reg.devices().len(), 3);
        rgml::registry::register(Arc::new(reg));
    });
}

fn load(devices: &[&str], split: &[f32]) -> Arc<Model> {
    register();
    let devices = devices
        .iter()
        .map(|d| rgml::registry::device(d).unwrap())
        .collect();
    let options = LoadOptions {
        overrides: Vec::new(),
        placement: Some(Placement::Layers {
            devices,
            shares: split.to_vec(),
        }),
        ..Default::default()
    };
    Arc::new(Model::load(common::demo_model_path(), options).unwrap())
}

fn session(model: &Arc<Model>, n_ubatch: usize) -> Session {
    let options = SessionOptions {
        n_ctx: 64,
        n_ubatch,
        n_threads: Some(1),
        device_params: Vec::new(),
        ..Default::default()
    };
    Session::new(model.clone(), &options).unwrap()
}

const PROMPTS: [&str; 2] = [
    "The quick brown fox jumps over the lazy dog.",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n",
];

/// Logits of every position of each prompt (in micro-batches of `n_ubatch`), then of three
/// single-token steps.
fn all_logits(model: &Arc<Model>, n_ubatch: usize) -> Vec<Vec<f32>> {
    let mut out = Vec::new();
    for p in PROMPTS {
        let tokens = model.tokenizer.encode(p, EncodeOptions::prompt());
        let mut s = session(model, n_ubatch);
        out.push(s.eval(&tokens, Logits::All).unwrap());
        for t in [42, 7, 1000] {
            out.push(s.eval(&[t], Logits::Last).unwrap());
        }
    }
    out
}

fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| {
            assert_eq!(x.len(), y.len());
            x.iter().zip(y).map(|(p, q)| (p - q).abs())
        })
        .fold(0.0, f32::max)
}

#[test]
fn layer_split_matches_one_device() {
    let one = load(&["CPU"], &[]);
    assert_eq!(one.devices().len(), 1);
    let reference = all_logits(&one, 512);
    drop(one);
    for (split, n_first) in [(&[][..], 15), (&[3.0, 1.0][..], 23)] {
        let model = load(&["CPU0", "CPU1"], split);
        let on_first = (0..model.config.n_layer)
            .filter(|&il| model.layer_device(il) == Some(0))
            .count();
        assert_eq!(on_first, n_first, "blocks on CPU0 with split {split:?}");
        // Whole prompts, and micro-batches of 4 (pipelined through the input copies).
        for n_ubatch in [512, 4] {
            let got = all_logits(&model, n_ubatch);
            let d = max_diff(&reference, &got);
            eprintln!("split {split:?}, n_ubatch {n_ubatch}: max |diff| {d}");
            assert!(
                d <= 1e-4,
                "split {split:?} n_ubatch {n_ubatch}: max diff {d}"
            );
        }
    }
}

#[test]
fn two_devices_give_one_split_per_device_and_copies_across() {
    let model = load(&["CPU0", "CPU1"], &[]);
    let mut s = session(&model, 512);
    let tokens = model.tokenizer.encode(
        PROMPTS[0],
        EncodeOptions {
            add_special: true,
            parse_special: false,
        },
    );
    s.eval(&tokens, Logits::Last).unwrap();
    let sched = s.scheduler();
    assert_eq!(sched.n_copies(), rgml_llm::session::N_COPIES_SPLIT);
    // Backends: CPU0, CPU1, CPU (last). The token embedding lookup runs on the CPU (host
    // memory), then the blocks of CPU0, then those of CPU1 with the output.
    let backends: Vec<usize> = sched.splits().iter().map(|sp| sp.backend).collect();
    assert_eq!(backends, [2, 0, 1], "splits: CPU, CPU0, CPU1");
    let st = sched.copy_stats();
    let (n_embd, n) = (model.config.n_embd as u64, tokens.len() as u64);
    // The hidden state crosses each device boundary once (f32).
    assert_eq!(
        st.count[2][0], 4,
        "embeddings, positions, cache rows, mask into CPU0"
    );
    assert_eq!(st.count[0][1], 1, "the hidden state from CPU0 to CPU1");
    assert_eq!(st.bytes[0][1], n_embd * n * 4);
    assert_eq!(
        st.count[2][1], 3,
        "positions, cache rows and mask into CPU1"
    );
    assert_eq!(st.count[1][0] + st.count[0][2] + st.count[1][2], 0);
}

#[test]
fn bad_splits_are_errors() {
    register();
    let devices = || {
        ["CPU0", "CPU1"]
            .iter()
            .map(|d| rgml::registry::device(d).unwrap())
            .collect()
    };
    for split in [vec![1.0], vec![0.0, 0.0], vec![f32::NAN, 1.0]] {
        let options = LoadOptions {
            overrides: Vec::new(),
            placement: Some(Placement::Layers {
                devices: devices(),
                shares: split.clone(),
            }),
            ..Default::default()
        };
        assert!(
            Model::load(common::demo_model_path(), options).is_err(),
            "{split:?}"
        );
    }
    // Sessions take their devices from the model (no device names to get wrong): default
    // options on a split model open its two devices and the CPU.
    let model = load(&["CPU0", "CPU1"], &[]);
    let s = Session::new(model.clone(), &SessionOptions::default()).unwrap();
    assert_eq!(s.scheduler().n_backends(), 3);
}

/// Logits of a long prompt in micro-batches of `n_ubatch` (the last ones, then every position
/// in a fresh session), with backend parameters `params`.
fn long_prompt_logits(model: &Arc<Model>, n_ubatch: usize, params: &str) -> Vec<Vec<f32>> {
    let text =
        "The scheduler keeps several micro-batches in flight across the devices. ".repeat(12);
    let tokens = model.tokenizer.encode(&text, EncodeOptions::prompt());
    assert!(tokens.len() >= 100, "{} tokens", tokens.len());
    let params = rgml::backend::BackendParams::parse(params).unwrap();
    let options = SessionOptions {
        n_ctx: 256,
        n_ubatch,
        n_threads: Some(1),
        // The same parameters for every device, the CPU (last) included.
        device_params: model
            .devices()
            .iter()
            .cloned()
            .chain(rgml::registry::device("CPU").ok())
            .map(|d| (d, params.clone()))
            .collect(),
        ..Default::default()
    };
    let mut out = Vec::new();
    for which in [Logits::Last, Logits::All] {
        let mut s = Session::new(model.clone(), &options).unwrap();
        out.push(s.eval(&tokens, which).unwrap());
        out.push(s.eval(&[42], Logits::Last).unwrap());
    }
    out
}

#[test]
fn pipelined_async_prompt_equals_sync_and_one_device() {
    let one = load(&["CPU"], &[]);
    let reference = long_prompt_logits(&one, 16, "");
    drop(one);
    let model = load(&["CPU0", "CPU1"], &[]);
    // CPU0 and CPU1 run asynchronously by default: micro-batches whose logits are not read
    // are queued, several in flight across the two devices.
    let pipelined = long_prompt_logits(&model, 16, "");
    let sync = long_prompt_logits(&model, 16, "async=0");
    assert!(
        pipelined
            .iter()
            .flatten()
            .zip(sync.iter().flatten())
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "asynchronous and synchronous runs differ"
    );
    let d = max_diff(&reference, &pipelined);
    eprintln!("long prompt, n_ubatch 16, CPU0+CPU1 vs CPU: max |diff| {d}");
    assert_eq!(d, 0.0, "split over two devices differs from one device");
}
