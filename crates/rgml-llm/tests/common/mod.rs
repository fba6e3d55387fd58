//! What the demo-model tests share: where the model is, and loading it on the CPU.

use rgml_llm::Model;
use std::path::PathBuf;
use std::sync::Arc;

/// The demo model's path; fails the test with the fetch command when it is missing.
pub fn demo_model_path() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.exists(),
        "demo model not found at {}: run scripts/fetch-model.sh first",
        path.display()
    );
    path
}

/// The demo model, with the CPU backend registered and default load options, shared as
/// sessions take it.
#[allow(dead_code)] // Not every test binary that includes this module loads the whole model.
pub fn demo_model() -> Arc<Model> {
    rgml_cpu::register();
    Arc::new(Model::load(demo_model_path(), Default::default()).expect("load the demo model"))
}

/// Gemma 3 270M (local sliding-window layers), loaded like [`demo_model`].
#[allow(dead_code)]
pub fn gemma_model() -> Arc<Model> {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/gemma-3-270m-q4_k_m.gguf");
    assert!(
        path.exists(),
        "Gemma 3 270M not found at {}: run scripts/fetch-model.sh first",
        path.display()
    );
    rgml_cpu::register();
    Arc::new(Model::load(path, Default::default()).expect("load Gemma 3 270M"))
}

/// The most likely token, the lowest id among equals (as the greedy sampler picks).
#[allow(dead_code)]
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}
