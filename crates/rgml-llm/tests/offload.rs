//! `Placement::Offload` (llama.cpp's `-ngl`) with `CPU0` standing in for the GPU (a device
//! that accepts only its own memory, so every crossing is a real copy): exact layer counts,
//! the output head offloaded first, the token embeddings on the CPU, the scheduler's splits,
//! the logits of one device; and a GPU too small for the offloaded weights.

mod common;

use rgml_llm::{EncodeOptions, LoadOptions, Logits, Model, Placement, Session, SessionOptions};
use std::sync::Arc;

/// Registers once, so the model's devices and its sessions' backends are the same instances.
fn register() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let reg = rgml_cpu::CpuRegistry::with_devices(["CPU", "CPU0"]);
        rgml::registry::register(Arc::new(reg));
    });
}

fn device(name: &str) -> rgml::DeviceRef {
    register();
    rgml::registry::device(name).expect("registered")
}

fn load(placement: Placement) -> rgml_llm::Result<Arc<Model>> {
    let options = LoadOptions {
        overrides: Vec::new(),
        placement: Some(placement),
        ..Default::default()
    };
    Model::load(common::demo_model_path(), options).map(Arc::new)
}

fn offload(n_gpu_layers: usize) -> Arc<Model> {
    load(Placement::Offload {
        gpu: device("CPU0"),
        cpu: device("CPU"),
        n_gpu_layers,
    })
    .expect("load offloaded")
}

fn session(model: &Arc<Model>) -> Session {
    let options = SessionOptions {
        n_ctx: 64,
        n_threads: Some(1),
        ..Default::default()
    };
    Session::new(model.clone(), &options).expect("session")
}

/// The last position's logits of a short prompt, then of one generation step.
fn logits(model: &Arc<Model>) -> (Session, Vec<f32>) {
    let tokens = model
        .tokenizer
        .encode("The capital of France is", EncodeOptions::prompt());
    let mut s = session(model);
    let mut out = s.eval(&tokens, Logits::Last).expect("prompt");
    out.extend(s.eval(&[42], Logits::Last).expect("step"));
    (s, out)
}

/// How many blocks the model has on its device 0.
fn blocks_on_first(model: &Model) -> usize {
    (0..model.config.n_layer)
        .filter(|&il| model.layer_device(il) == Some(0))
        .count()
}

#[test]
fn offload_places_exact_counts_with_the_head_first() {
    let reference = logits(&load(Placement::Single(device("CPU"))).unwrap()).1;
    let n_layer = 30;
    // (-ngl, blocks on CPU0): the output head is the first layer offloaded.
    for (n, want_blocks) in [(1, 0), (8, 7), (n_layer, n_layer - 1), (99, n_layer)] {
        let model = offload(n);
        assert_eq!(model.config.n_layer, n_layer);
        let names: Vec<&str> = model.devices().iter().map(|d| d.name()).collect();
        assert_eq!(names, ["CPU0", "CPU"], "-ngl {n}: the GPU, then the CPU");
        assert_eq!(blocks_on_first(&model), want_blocks, "-ngl {n}");
        assert!(
            (n_layer - want_blocks..n_layer).all(|il| model.layer_device(il) == Some(0)),
            "-ngl {n}: the last blocks are offloaded"
        );
        assert_eq!(model.output_device(), 0, "-ngl {n}: the head on CPU0");
        let (s, got) = logits(&model);
        // The CPU (the model's last device) is the scheduler's CPU: no third backend.
        assert_eq!(s.scheduler().n_backends(), 2);
        // The embedding lookup and the CPU's blocks, then CPU0's blocks and the head.
        let backends: Vec<usize> = s.scheduler().splits().iter().map(|sp| sp.backend).collect();
        assert_eq!(backends, [1, 0], "-ngl {n}: splits CPU, CPU0");
        let worst = reference
            .iter()
            .zip(&got)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(worst <= 1e-4, "-ngl {n}: logits {worst} from one device's");
    }
}

#[test]
fn offload_crosses_to_the_gpu_once() {
    let model = offload(8);
    let (s, _) = logits(&model);
    let st = s.scheduler().copy_stats();
    // The hidden state goes from the CPU (1) to CPU0 (0) once per graph, and nothing comes
    // back: the head computes the logits on CPU0.
    assert!(st.count[1][0] > 0, "copies into CPU0");
    assert_eq!(st.count[0][1], 0, "nothing copied back to the CPU");
}

#[test]
fn no_offloaded_layers_is_the_cpu_alone() {
    let model = offload(0);
    let names: Vec<&str> = model.devices().iter().map(|d| d.name()).collect();
    assert_eq!(names, ["CPU"]);
    assert_eq!(blocks_on_first(&model), model.config.n_layer);
    assert_eq!(model.output_device(), 0);
    assert_eq!(session(&model).scheduler().n_backends(), 1);
}

#[test]
fn offloading_to_the_cpu_itself_is_an_error() {
    let err = load(Placement::Offload {
        gpu: device("CPU"),
        cpu: device("CPU"),
        n_gpu_layers: 4,
    })
    .unwrap_err();
    assert!(err.to_string().contains("two devices"), "{err}");
}

#[test]
fn weights_beyond_the_gpus_free_memory_are_an_error_naming_the_sizes() {
    let free = 8 << 20;
    // It claims the quantized products, or the loader would keep their weights in host
    // memory (as a device that cannot compute them gets none).
    let small = rgml::testing::TestDevice::builder("SmallGPU")
        .memory(rgml::backend::DeviceMemory {
            free,
            total: 2 * free,
        })
        .any_dtype()
        .build();
    let load = |n_gpu_layers| {
        load(Placement::Offload {
            gpu: small.clone(),
            cpu: device("CPU"),
            n_gpu_layers,
        })
    };
    // The output head alone (the tied embeddings' copy, 20 MiB in Q4_1, and the norm) does not
    // fit 8 MiB: refused before anything is allocated, with both sizes.
    let err = load(1).unwrap_err();
    let rgml_llm::LlmError::OutOfMemory { what, source } = &err else {
        panic!("{err}");
    };
    assert_eq!(*what, rgml_llm::MemoryUse::Weights);
    let rgml::Error::InsufficientMemory { device, size, .. } = source else {
        panic!("{source}");
    };
    assert_eq!(device, "SmallGPU");
    assert!(*size > free, "{size}");
    let text = err.to_string();
    assert!(
        text.contains("weights") && text.contains("SmallGPU"),
        "{text}"
    );
    // Nothing offloaded: the small device is not touched.
    assert_eq!(load(0).expect("CPU alone").devices().len(), 1);
}

/// A device that cannot compute what reads a weight does not get it: the demo model's Q4_1
/// matrices of the offloaded blocks and head stay in host memory (the CPU computes their
/// products), reported per device (that the logits stay the CPU's is checked on a real GPU, in
/// `rgml-cli`'s `moe_placement`). A device that computes them takes them all.
#[test]
fn weights_a_device_cannot_compute_with_stay_in_host_memory() {
    let f32_only = rgml::testing::TestDevice::builder("F32GPU").build();
    let model = load(Placement::Offload {
        gpu: f32_only,
        cpu: device("CPU"),
        n_gpu_layers: 3,
    })
    .expect("load");
    let kept = model.kept_on_host();
    // Blocks 28 and 29 (7 matrices each) and the tied head's copy.
    assert_eq!(kept.len(), 15, "{kept:?}");
    for (name, device, bytes) in kept {
        assert_eq!(*device, 0, "{name}: kept from the GPU");
        assert!(*bytes > 0);
        let offloaded = name.starts_with("blk.28.") || name.starts_with("blk.29.");
        assert!(offloaded || name == "output.weight", "{name}");
    }
    let claims_all = rgml::testing::TestDevice::builder("AnyGPU")
        .any_dtype()
        .build();
    let model = load(Placement::Offload {
        gpu: claims_all,
        cpu: device("CPU"),
        n_gpu_layers: 3,
    })
    .expect("load");
    assert!(model.kept_on_host().is_empty());
}
