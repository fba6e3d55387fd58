//! Random-weight GGUF models, of two kinds.
//!
//! **Tiny models** ([`Arch`], `rgml-random-model --arch NAME`), one per architecture that
//! rgml-llm verifies against llama.cpp (Gemma 3, Qwen2, Qwen3, Llama 3.1, Phi-3, Mistral, the
//! mixtures of experts Qwen3 MoE, Mixtral and gpt-oss, the hybrids of delta nets and
//! attention Qwen3.5 and Qwen3.5 MoE, and Gemma 4 dense and MoE): a few layers of 64 to 256
//! wide random weights (Q8_0 matrices, experts in the types of real files, F32 norms, biases
//! and routers, F16 or Q8_0 embeddings) under the hyper-parameter keys llama.cpp's converter
//! writes for the family, with the real vocabulary and every `tokenizer.*` key (chat template
//! included) copied from a file of that family. The bytes are deterministic: every value comes from a SplitMix64
//! stream seeded by the tensor's name, so a model written twice, or on another machine, has
//! the same sha256, and llama.cpp's logits recorded once for it
//! (`scripts/gen_arch_fixtures.py`) stay valid.
//!
//! **Shape models** ([`Shape`], `rgml-random-model --shape NAME --type TYPE`): real models'
//! shapes (Llama 3.2 1B and 3B, Llama 3.1 8B, Qwen2.5 7B, SmolLM2-135M) in any
//! `llama-quantize` file type, for benchmarks at real sizes on machines that cannot download
//! the real weights. Each tensor has the type `llama-quantize` would give it under the preset
//! (the rules of `rgml quantize`, in rgml-llm), the file's metadata is what it would write,
//! and the weights are random blocks written straight in their type (no quantizer; a standard
//! deviation of about 0.02, so activations stay finite through every block). The data is made
//! on several threads and streamed to the file, so a multi-GB model takes seconds and little
//! memory; `seed` picks the values. The output is noise: these files measure speed and memory,
//! not quality.
//!
//! This crate owns only the files; running them is rgml-llm's job (and llama.cpp's).
//!
//! ```no_run
//! use rgml_testmodels::{write_random_model, write_shape_model, Arch, QuantPreset, Shape};
//! use std::path::Path;
//! let arch = Arch::Qwen3;
//! let written = write_random_model(arch, Path::new(arch.vocab_file()), Path::new("qwen3.gguf"))?;
//! println!("{} tensors, {} bytes", written.n_tensors, written.bytes);
//! let shape = Shape::Llama8B;
//! let vocab = Path::new(shape.vocab_file());
//! write_shape_model(shape, QuantPreset::Q4_K_M, 0, vocab, Path::new("llama-8b.gguf"))?;
//! # Ok::<(), rgml_testmodels::Error>(())
//! ```
#![warn(missing_docs)]

mod arch;
mod bert;
mod blocks;
mod error;
mod gemma4;
mod planned;
mod rng;
mod shape;
mod shaped;
mod stream;
mod tensors;

pub use arch::{
    Arch, Attention, DeltaNet, Experts, Ffn, Gemma4, Gemma4Layer, Llama3Rope, Spec, UnknownArch,
};
pub use blocks::WEIGHT_STD;
pub use error::{Error, Result};
pub use rgml_llm::quantize::QuantPreset;
pub use rng::SplitMix64;
pub use shape::{Shape, UnknownShape};
pub use shaped::{ShapedModel, ShapedTensor};
pub use tensors::llama3_rope_factors;

use rgml_gguf::{GgufFile, GgufWriter, Value};
use std::path::{Path, PathBuf};

/// `general.file_type` of the files: llama.cpp's `LLAMA_FTYPE_MOSTLY_Q8_0`, the type of most
/// of their weights.
const FILE_TYPE_Q8_0: u32 = 7;

/// What [`write_random_model`] or [`write_shape_model`] wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Written {
    /// Tokens in the vocabulary (rows of the embedding).
    pub n_vocab: usize,
    /// Tensors in the file.
    pub n_tensors: usize,
    /// Size of the file.
    pub bytes: u64,
}

/// The random model of `arch` whose tokenizer is `vocab`'s, ready to write. `vocab_path` names
/// the vocabulary in errors.
pub fn random_model(arch: Arch, vocab: &GgufFile, vocab_path: &Path) -> Result<GgufWriter> {
    let n_vocab = vocabulary_size(vocab, vocab_path)?;
    let spec = arch.spec();
    let mut w = GgufWriter::new();
    let name = format!("rgml random {}", arch.name());
    let file_type = Some(FILE_TYPE_Q8_0);
    add_hyperparameters(&mut w, arch.gguf_arch(), &name, &spec, n_vocab, file_type);
    copy_tokenizer(&mut w, vocab);
    w.add_metadata("general.quantization_version", Value::U32(2));
    for t in tensors::plan(&spec, n_vocab) {
        w.add_tensor(&t.name, t.dtype, &t.ne, &t.bytes(arch.name())?)?;
    }
    Ok(w)
}

/// Write the random model of `arch`, with the tokenizer of the GGUF file `vocab` (usually
/// [`Arch::vocab_file`]), to `out`.
pub fn write_random_model(arch: Arch, vocab: &Path, out: &Path) -> Result<Written> {
    let vocab_file = open_vocabulary(vocab)?;
    let w = random_model(arch, &vocab_file, vocab)?;
    w.write_file(out)?;
    let bytes = std::fs::metadata(out)
        .map_err(|source| rgml_gguf::GgufError::Io {
            path: PathBuf::from(out),
            source,
        })?
        .len();
    let n_vocab = vocabulary_size(&vocab_file, vocab)?;
    Ok(Written {
        n_vocab,
        n_tensors: tensors::plan(&arch.spec(), n_vocab).len(),
        bytes,
    })
}

/// Write the model of `shape` under `preset` with the random values of `seed` and the
/// tokenizer of the GGUF file `vocab` (usually [`Shape::vocab_file`]; any GGUF file with a
/// `tokenizer.ggml.tokens` array) to `out`, on every core. See [`ShapedModel`].
pub fn write_shape_model(
    shape: Shape,
    preset: QuantPreset,
    seed: u64,
    vocab: &Path,
    out: &Path,
) -> Result<Written> {
    write_shape_spec(shape, &shape.spec(), preset, seed, vocab, out)
}

/// [`write_shape_model`] with the shape's hyper-parameters replaced by `spec` (e.g.
/// [`Shape::spec_with_experts`]); the shape still names the file and seeds its values.
pub fn write_shape_spec(
    shape: Shape,
    spec: &Spec,
    preset: QuantPreset,
    seed: u64,
    vocab: &Path,
    out: &Path,
) -> Result<Written> {
    let vocab_file = open_vocabulary(vocab)?;
    // Renaming over the vocabulary would keep the mapping valid but lose the file.
    if let (Ok(a), Ok(b)) = (vocab.canonicalize(), out.canonicalize()) {
        if a == b {
            return Err(Error::SameFile {
                path: out.to_path_buf(),
            });
        }
    }
    let (name, arch) = (shape.name(), shape.gguf_arch());
    ShapedModel::from_spec(name, arch, spec, preset, seed, &vocab_file, vocab)?.write(out, 0)
}

/// The GGUF file at `path`, with errors that name it.
fn open_vocabulary(path: &Path) -> Result<GgufFile> {
    GgufFile::open(path).map_err(|e| match e {
        // These name the file already.
        e @ (rgml_gguf::GgufError::Io { .. } | rgml_gguf::GgufError::NotAFile { .. }) => {
            Error::Gguf(e)
        }
        source => Error::Vocabulary {
            path: path.to_path_buf(),
            source,
        },
    })
}

/// The number of tokens of `vocab`, whose path is `path`.
fn vocabulary_size(vocab: &GgufFile, path: &Path) -> Result<usize> {
    vocab
        .get("tokenizer.ggml.tokens")
        .and_then(Value::as_array)
        .map(<[Value]>::len)
        .filter(|&n| n > 0)
        .ok_or_else(|| Error::NoVocabulary {
            path: path.to_path_buf(),
        })
}

/// Copy every `tokenizer.*` key of `vocab`, in its order.
fn copy_tokenizer(w: &mut GgufWriter, vocab: &GgufFile) {
    for (key, value) in vocab.metadata() {
        if key.starts_with("tokenizer.") {
            w.add_metadata(key.clone(), value.clone());
        }
    }
}

/// The `general.*` and `{prefix}.*` keys of a model of `spec` called `name`, architecture
/// `prefix`. `general.file_type` is written here when given; a caller that passes `None`
/// writes it last, as `llama-quantize` does.
fn add_hyperparameters(
    w: &mut GgufWriter,
    prefix: &str,
    name: &str,
    spec: &Spec,
    n_vocab: usize,
    file_type: Option<u32>,
) {
    let u32_of = |n: usize| Value::U32(u32::try_from(n).unwrap_or(u32::MAX));
    w.add_metadata("general.architecture", Value::String(prefix.into()));
    w.add_metadata("general.name", Value::String(name.into()));
    if let Some(file_type) = file_type {
        w.add_metadata("general.file_type", Value::U32(file_type));
    }
    let mut keys = vec![
        ("context_length", Value::U32(spec.n_ctx_train)),
        ("embedding_length", u32_of(spec.n_embd)),
        ("block_count", u32_of(spec.n_layer)),
        ("feed_forward_length", u32_of(spec.n_ff)),
        ("attention.head_count", u32_of(spec.n_head)),
        ("attention.head_count_kv", u32_of(spec.n_head_kv)),
    ];
    // An encoder has layer norms (its epsilon among its own keys) and no RoPE.
    if spec.encoder.is_none() {
        keys.extend([
            ("attention.layer_norm_rms_epsilon", Value::F32(spec.rms_eps)),
            ("rope.freq_base", Value::F32(spec.rope_freq_base)),
        ]);
    }
    if spec.vocab_size_key {
        keys.push(("vocab_size", u32_of(n_vocab)));
    }
    if let arch::Ffn::Experts(x) = spec.ffn {
        keys.extend([
            ("expert_count", u32_of(x.n_expert)),
            ("expert_used_count", u32_of(x.n_expert_used)),
        ]);
        if x.width_key {
            keys.push(("expert_feed_forward_length", u32_of(x.n_ff_exp)));
        }
        if let Some(n_ff) = x.shared_ff {
            keys.push(("expert_shared_feed_forward_length", u32_of(n_ff)));
        }
    }
    for (key, value) in spec.keys.iter().cloned() {
        // Written again: the new value in the old place, as llama.cpp's converter does.
        match keys.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => keys.push((key, value)),
        }
    }
    if let Some(net) = spec.delta_net {
        keys.extend(delta_net_keys(&net, spec.n_layer));
    }
    for (key, value) in keys {
        w.add_metadata(format!("{prefix}.{key}"), value);
    }
}

/// The `ssm.*` and layer-pattern keys of a delta net in a model of `n_layer` blocks, in the
/// order llama.cpp's converter writes them.
fn delta_net_keys(net: &DeltaNet, n_layer: usize) -> Vec<(&'static str, Value)> {
    let u32_of = |n: usize| Value::U32(u32::try_from(n).unwrap_or(u32::MAX));
    let mut keys = vec![
        ("ssm.conv_kernel", u32_of(net.conv_kernel)),
        ("ssm.state_size", u32_of(net.head_dim)),
        ("ssm.group_count", u32_of(net.n_k_heads)),
        ("ssm.time_step_rank", u32_of(net.n_v_heads)),
        ("ssm.inner_size", u32_of(net.value_dim())),
    ];
    if net.recurrent_layers_key {
        let layers = (0..n_layer).map(|il| Value::Bool(net.is_recurrent(il)));
        keys.push(("attention.recurrent_layers", Value::Array(layers.collect())));
    }
    keys.push((
        "full_attention_interval",
        u32_of(net.full_attention_interval),
    ));
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A vocabulary file of `n` tokens with a chat template and a key that must not be copied.
    fn vocab(n: usize) -> GgufFile {
        let mut w = GgufWriter::new();
        w.add_metadata("general.name", Value::String("a vocabulary".into()));
        w.add_metadata("tokenizer.ggml.model", Value::String("llama".into()));
        let tokens = (0..n).map(|i| Value::String(format!("t{i}"))).collect();
        w.add_metadata("tokenizer.ggml.tokens", Value::Array(tokens));
        w.add_metadata("tokenizer.chat_template", Value::String("{{ x }}".into()));
        GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
    }

    fn model(arch: Arch, n_vocab: usize) -> GgufFile {
        let w = random_model(arch, &vocab(n_vocab), Path::new("vocab.gguf")).unwrap();
        GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
    }

    #[test]
    fn gemma3_has_its_keys_the_vocabulary_and_tied_embeddings() {
        let m = model(Arch::Gemma3, 96);
        assert_eq!(m.get_str("general.architecture").unwrap(), "gemma3");
        assert_eq!(m.get_str("general.name").unwrap(), "rgml random gemma3");
        assert_eq!(m.get_u64("gemma3.attention.key_length").unwrap(), 32);
        assert_eq!(m.get_u64("gemma3.attention.sliding_window").unwrap(), 8);
        assert_eq!(m.get_f32("gemma3.rope.freq_base_swa").unwrap(), 20_000.0);
        assert_eq!(m.get_str("tokenizer.chat_template").unwrap(), "{{ x }}");
        assert_eq!(m.get_array("tokenizer.ggml.tokens").unwrap().len(), 96);
        let embd = m.tensor("token_embd.weight").unwrap();
        assert_eq!(
            (embd.dtype, &embd.ne[..2]),
            (rgml::DType::Q8_0, &[64, 96][..])
        );
        assert!(m.tensor("output.weight").is_none());
        assert_eq!(m.tensors().len(), 2 + 8 * 13);
    }

    #[test]
    fn qwen35_files_have_their_delta_net_and_rope_keys() {
        let m = model(Arch::Qwen35, 64);
        let u = |k: &str| m.get_u64(&format!("qwen35.{k}")).unwrap();
        assert_eq!(m.get_str("general.architecture").unwrap(), "qwen35");
        assert_eq!(
            [
                u("ssm.conv_kernel"),
                u("ssm.state_size"),
                u("ssm.group_count"),
                u("ssm.time_step_rank"),
                u("ssm.inner_size"),
                u("full_attention_interval"),
                u("rope.dimension_count"),
                u("attention.key_length"),
            ],
            [4, 32, 2, 4, 128, 4, 16, 64]
        );
        let recurrent = m.get_array("qwen35.attention.recurrent_layers").unwrap();
        let want: Vec<Value> = [true, true, true, false, true, true, true, false]
            .into_iter()
            .map(Value::Bool)
            .collect();
        assert_eq!(recurrent, &want[..]);
        let sections = m.get_array("qwen35.rope.dimension_sections").unwrap();
        let want: Vec<Value> = [3, 3, 2, 0].into_iter().map(Value::I32).collect();
        assert_eq!(sections, &want[..]);
        assert!(m.tensor("output.weight").is_some());

        let m = model(Arch::Qwen35Moe, 64);
        let u = |k: &str| m.get_u64(&format!("qwen35moe.{k}")).unwrap();
        assert_eq!(u("expert_shared_feed_forward_length"), 192);
        assert_eq!((u("ssm.group_count"), u("ssm.time_step_rank")), (2, 6));
        assert!(m.get("qwen35moe.attention.recurrent_layers").is_none());
        assert!(m.tensor("output.weight").is_none());
    }

    /// The converter's keys: per-layer widths as i32 arrays in place of the scalars, the
    /// window pattern as bools, the per-layer embedding width even where it is 0.
    #[test]
    fn gemma4_files_have_the_converter_s_keys() {
        let m = model(Arch::Gemma4, 64);
        let u = |k: &str| m.get_u64(&format!("gemma4.{k}")).unwrap();
        let ints = |v: &[i32]| -> Vec<Value> { v.iter().map(|&x| Value::I32(x)).collect() };
        assert_eq!(m.get_str("general.architecture").unwrap(), "gemma4");
        assert_eq!(
            [
                u("block_count"),
                u("attention.head_count_kv"),
                u("attention.key_length"),
                u("attention.key_length_swa"),
                u("attention.value_length_swa"),
                u("rope.dimension_count"),
                u("rope.dimension_count_swa"),
                u("attention.sliding_window"),
                u("attention.shared_kv_layers"),
                u("embedding_length_per_layer_input"),
            ],
            [8, 2, 64, 32, 32, 64, 32, 8, 4, 16]
        );
        assert_eq!(m.get_f32("gemma4.rope.freq_base_swa").unwrap(), 10_000.0);
        assert_eq!(m.get_f32("gemma4.final_logit_softcapping").unwrap(), 10.0);
        let ff = m.get_array("gemma4.feed_forward_length").unwrap();
        assert_eq!(ff, &ints(&[192, 192, 192, 192, 384, 384, 384, 384])[..]);
        let keys: Vec<&str> = m.metadata().iter().map(|(k, _)| k.as_str()).collect();
        let at = |k: &str| keys.iter().position(|x| *x == k).unwrap();
        assert_eq!(
            at("gemma4.feed_forward_length"),
            at("gemma4.block_count") + 1
        );
        let pattern = m
            .get_array("gemma4.attention.sliding_window_pattern")
            .unwrap();
        let want: Vec<Value> = [true, true, true, false, true, true, true, false]
            .into_iter()
            .map(Value::Bool)
            .collect();
        assert_eq!(pattern, &want[..]);
        assert!(m.tensor("output.weight").is_none());
        assert!(m.tensor("blk.4.attn_k.weight").is_none());

        let m = model(Arch::Gemma4Moe, 64);
        let u = |k: &str| m.get_u64(&format!("gemma4.{k}")).unwrap();
        assert_eq!(m.get_str("general.architecture").unwrap(), "gemma4");
        assert_eq!(m.get_str("general.name").unwrap(), "rgml random gemma4moe");
        assert_eq!(
            [
                u("feed_forward_length"),
                u("expert_count"),
                u("expert_used_count"),
                u("expert_feed_forward_length"),
                u("attention.shared_kv_layers"),
                u("embedding_length_per_layer_input"),
            ],
            [256, 8, 2, 128, 0, 0]
        );
        let kv = m.get_array("gemma4.attention.head_count_kv").unwrap();
        assert_eq!(kv, &ints(&[2, 2, 1, 2, 2, 1])[..]);
        assert_eq!(m.get_f32("gemma4.rope.freq_base_swa").unwrap(), 20_000.0);
        assert_eq!(m.get_f32("gemma4.final_logit_softcapping").unwrap(), 30.0);
        assert!(m.tensor("blk.2.attn_v.weight").is_none());
        assert!(m.tensor("blk.0.ffn_gate_up_exps.weight").is_some());
    }

    #[test]
    fn llama_files_name_their_vocabulary_size() {
        for arch in [Arch::Llama3, Arch::Mistral] {
            let m = model(arch, 64);
            assert_eq!(m.get_str("general.architecture").unwrap(), "llama");
            assert_eq!(m.get_u64("llama.vocab_size").unwrap(), 64);
            assert_eq!(m.tensor("output.weight").unwrap().ne[1], 64);
        }
    }

    #[test]
    fn the_bytes_are_the_same_every_time_and_differ_between_architectures() {
        let bytes = |arch: Arch| {
            random_model(arch, &vocab(32), Path::new("v"))
                .unwrap()
                .to_bytes()
                .unwrap()
        };
        assert_eq!(bytes(Arch::Qwen2), bytes(Arch::Qwen2));
        assert_ne!(bytes(Arch::Qwen2), bytes(Arch::Qwen3));
        // Gemma 4's two files share an architecture name but not their values.
        assert_eq!(bytes(Arch::Gemma4), bytes(Arch::Gemma4));
        assert_eq!(bytes(Arch::Gemma4Moe), bytes(Arch::Gemma4Moe));
        assert_ne!(bytes(Arch::Gemma4), bytes(Arch::Gemma4Moe));
    }

    #[test]
    fn shape_models_refuse_to_replace_their_vocabulary_and_name_a_bad_one() {
        let dir = std::env::temp_dir().join(format!("rgml-testmodels-lib-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("vocab.gguf");
        std::fs::write(&path, GgufWriter::new().to_bytes().unwrap()).unwrap();
        let err =
            write_shape_model(Shape::Llama1B, QuantPreset::Q8_0, 0, &path, &path).unwrap_err();
        assert!(matches!(err, Error::SameFile { .. }), "{err}");
        let text = dir.join("text.gguf");
        std::fs::write(&text, "not a model").unwrap();
        let err = write_shape_model(Shape::Llama1B, QuantPreset::Q8_0, 0, &text, &dir.join("o"))
            .unwrap_err();
        assert!(err.to_string().contains("text.gguf"), "{err}");
        let err = write_shape_model(Shape::Llama1B, QuantPreset::Q8_0, 0, &path, &dir.join("o"))
            .unwrap_err();
        assert!(matches!(err, Error::NoVocabulary { .. }), "{err}");
        assert!(!dir.join("o").exists() && !dir.join("o.part").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_file_without_tokens_is_an_error() {
        let empty = GgufFile::from_bytes(GgufWriter::new().to_bytes().unwrap()).unwrap();
        let err = random_model(Arch::Phi3, &empty, Path::new("empty.gguf")).unwrap_err();
        assert!(matches!(err, Error::NoVocabulary { .. }));
        assert!(err.to_string().contains("empty.gguf"), "{err}");
    }
}
