//! Reading a [`Tokenizer`] from GGUF metadata (`tokenizer.ggml.*`), with llama.cpp's key
//! names and its leniency: optional keys may be absent, and a special-token id outside the
//! vocabulary is ignored (llama.cpp warns and keeps its default).

use rgml_gguf::{GgufFile, Value};

use super::{FimIds, TokenType, Tokenizer, TokenizerKind, TokenizerParts};
use crate::error::{LlmError, Result};

const KEY_MODEL: &str = "tokenizer.ggml.model";
const KEY_PRE: &str = "tokenizer.ggml.pre";
const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
const KEY_SCORES: &str = "tokenizer.ggml.scores";
const KEY_TYPES: &str = "tokenizer.ggml.token_type";
const KEY_MERGES: &str = "tokenizer.ggml.merges";

fn bad(key: &str, what: &str) -> LlmError {
    LlmError::Tokenizer(format!("metadata key {key}: {what}"))
}

/// An optional array key, each element converted by `f`.
fn opt_array<T>(
    file: &GgufFile,
    key: &str,
    what: &str,
    f: impl Fn(&Value) -> Option<T>,
) -> Result<Vec<T>> {
    match file.get(key) {
        None => Ok(Vec::new()),
        Some(v) => v
            .as_array()
            .ok_or_else(|| bad(key, "not an array"))?
            .iter()
            .enumerate()
            .map(|(i, e)| f(e).ok_or_else(|| bad(key, &format!("element {i} is not {what}"))))
            .collect(),
    }
}

/// An optional string key (a value of another type reads as absent, as llama.cpp's
/// optional `get_key` of `general.*` would fail it).
fn opt_string(file: &GgufFile, key: &str) -> Option<String> {
    file.get(key)?.as_str().map(str::to_owned)
}

fn opt_bool(file: &GgufFile, key: &str) -> Result<Option<bool>> {
    file.get(key)
        .map(|v| v.as_bool().ok_or_else(|| bad(key, "not a bool")))
        .transpose()
}

/// A special-token id key; absent, malformed-width or out-of-range ids read as absent.
fn opt_id(file: &GgufFile, key: &str, n_vocab: usize) -> Option<u32> {
    let id = file.get(key)?.as_u64()?;
    u32::try_from(id).ok().filter(|&id| (id as usize) < n_vocab)
}

impl Tokenizer {
    /// Builds the tokenizer a GGUF file describes. Supports `tokenizer.ggml.model` `gpt2`
    /// (byte-level BPE, with the pre-tokenizers of [`super::PreTokenizer::from_name`]),
    /// `gemma4` (BPE over raw UTF-8), `llama` (SentencePiece) and `bert` (WordPiece).
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer> {
        let kind = TokenizerKind::from_name(file.get_str(KEY_MODEL)?)?;
        let pre = match file.get(KEY_PRE) {
            None => None,
            Some(v) => Some(
                v.as_str()
                    .ok_or_else(|| bad(KEY_PRE, "not a string"))?
                    .to_owned(),
            ),
        };
        let tokens: Vec<String> = file
            .get_array(KEY_TOKENS)?
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| bad(KEY_TOKENS, &format!("element {i} is not a string")))
            })
            .collect::<Result<_>>()?;
        let n = tokens.len();
        let scores = opt_array(file, KEY_SCORES, "a float", Value::as_f32)?;
        let token_types = opt_array(file, KEY_TYPES, "an integer", |v| {
            v.as_i64().map(TokenType::from_gguf)
        })?;
        let merges = opt_array(file, KEY_MERGES, "a string", |v| {
            v.as_str().map(str::to_owned)
        })?;
        if matches!(kind, TokenizerKind::Bpe | TokenizerKind::Gemma4) && merges.is_empty() {
            return Err(bad(
                KEY_MERGES,
                "missing or empty, a gpt2 or gemma4 tokenizer needs merges",
            ));
        }
        let id = |name: &str| opt_id(file, &format!("tokenizer.ggml.{name}_token_id"), n);
        // The deprecated `prefix`/`suffix`/`middle` keys come later in llama.cpp's reading,
        // so they win.
        let fim = FimIds {
            pre: id("prefix").or_else(|| id("fim_pre")),
            suf: id("suffix").or_else(|| id("fim_suf")),
            mid: id("middle").or_else(|| id("fim_mid")),
            pad: id("fim_pad"),
            rep: id("fim_rep"),
            sep: id("fim_sep"),
        };
        Tokenizer::from_parts(TokenizerParts {
            kind,
            pre,
            tokens,
            scores,
            token_types,
            merges,
            bos: id("bos"),
            eos: id("eos"),
            eot: id("eot"),
            eom: id("eom"),
            unk: id("unknown"),
            pad: id("padding"),
            // llama.cpp's key keeps its misspelling.
            sep: id("seperator"),
            lowercase: opt_bool(file, "tokenizer.ggml.normalizer.lowercase")?,
            strip_accents: opt_bool(file, "tokenizer.ggml.normalizer.strip_accents")?,
            add_bos: opt_bool(file, "tokenizer.ggml.add_bos_token")?,
            add_eos: opt_bool(file, "tokenizer.ggml.add_eos_token")?,
            add_space_prefix: opt_bool(file, "tokenizer.ggml.add_space_prefix")?,
            fim,
            name: opt_string(file, "general.name"),
            architecture: opt_string(file, "general.architecture"),
        })
    }
}
