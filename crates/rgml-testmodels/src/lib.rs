//! Tiny random-weight GGUF models, one per architecture that rgml-llm verifies against
//! llama.cpp (Gemma 3, Qwen2, Qwen3, Llama 3.1, Phi-3, Mistral).
//!
//! A model is a few layers of 64 to 128 wide random weights (Q8_0 matrices, F32 norms and
//! biases, F16 or Q8_0 embeddings) under the hyper-parameter keys llama.cpp's converter writes
//! for the family, with the real vocabulary and every `tokenizer.*` key (chat template
//! included) copied from a file of that family. The bytes are deterministic: every value comes
//! from a SplitMix64 stream seeded by the tensor's name, so a model written twice, or on
//! another machine, has the same sha256, and llama.cpp's logits recorded once for it
//! (`scripts/gen_arch_fixtures.py`) stay valid.
//!
//! This crate owns only the files; running them is rgml-llm's job (and llama.cpp's).
//!
//! ```no_run
//! use rgml_testmodels::{write_random_model, Arch};
//! use std::path::Path;
//! let arch = Arch::Qwen3;
//! let written = write_random_model(arch, Path::new(arch.vocab_file()), Path::new("qwen3.gguf"))?;
//! println!("{} tensors, {} bytes", written.n_tensors, written.bytes);
//! # Ok::<(), rgml_testmodels::Error>(())
//! ```
#![warn(missing_docs)]

mod arch;
mod error;
mod rng;
mod tensors;

pub use arch::{Arch, Attention, Ffn, Llama3Rope, Spec, UnknownArch};
pub use error::{Error, Result};
pub use rng::SplitMix64;
pub use tensors::llama3_rope_factors;

use rgml_gguf::{GgufFile, GgufWriter, Value};
use std::path::{Path, PathBuf};

/// `general.file_type` of the files: llama.cpp's `LLAMA_FTYPE_MOSTLY_Q8_0`, the type of most
/// of their weights.
const FILE_TYPE_Q8_0: u32 = 7;

/// What [`write_random_model`] wrote.
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
    add_hyperparameters(&mut w, arch, &spec, n_vocab);
    for (key, value) in vocab.metadata() {
        if key.starts_with("tokenizer.") {
            w.add_metadata(key.clone(), value.clone());
        }
    }
    w.add_metadata("general.quantization_version", Value::U32(2));
    for t in tensors::plan(&spec, n_vocab) {
        w.add_tensor(&t.name, t.dtype, &t.ne, &t.bytes(arch.name())?)?;
    }
    Ok(w)
}

/// Write the random model of `arch`, with the tokenizer of the GGUF file `vocab` (usually
/// [`Arch::vocab_file`]), to `out`.
pub fn write_random_model(arch: Arch, vocab: &Path, out: &Path) -> Result<Written> {
    let vocab_file = GgufFile::open(vocab)?;
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

/// The `general.*` and `{arch}.*` keys.
fn add_hyperparameters(w: &mut GgufWriter, arch: Arch, spec: &Spec, n_vocab: usize) {
    let prefix = arch.gguf_arch();
    let u32_of = |n: usize| Value::U32(u32::try_from(n).unwrap_or(u32::MAX));
    w.add_metadata("general.architecture", Value::String(prefix.into()));
    w.add_metadata(
        "general.name",
        Value::String(format!("rgml random {}", arch.name())),
    );
    w.add_metadata("general.file_type", Value::U32(FILE_TYPE_Q8_0));
    let mut keys = vec![
        ("context_length", Value::U32(spec.n_ctx_train)),
        ("embedding_length", u32_of(spec.n_embd)),
        ("block_count", u32_of(spec.n_layer)),
        ("feed_forward_length", u32_of(spec.n_ff)),
        ("attention.head_count", u32_of(spec.n_head)),
        ("attention.head_count_kv", u32_of(spec.n_head_kv)),
        ("attention.layer_norm_rms_epsilon", Value::F32(spec.rms_eps)),
        ("rope.freq_base", Value::F32(spec.rope_freq_base)),
    ];
    if spec.vocab_size_key {
        keys.push(("vocab_size", u32_of(n_vocab)));
    }
    keys.extend(spec.keys.iter().cloned());
    for (key, value) in keys {
        w.add_metadata(format!("{prefix}.{key}"), value);
    }
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
    }

    #[test]
    fn a_file_without_tokens_is_an_error() {
        let empty = GgufFile::from_bytes(GgufWriter::new().to_bytes().unwrap()).unwrap();
        let err = random_model(Arch::Phi3, &empty, Path::new("empty.gguf")).unwrap_err();
        assert!(matches!(err, Error::NoVocabulary { .. }));
        assert!(err.to_string().contains("empty.gguf"), "{err}");
    }
}
