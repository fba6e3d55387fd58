//! Tokenizers built from GGUF metadata (`tokenizer.ggml.*`), reproducing llama.cpp's token ids.
//!
//! This module owns the vocabulary, the special-token handling shared by all tokenizer kinds
//! (splitting text at special tokens, BOS/EOS, end-of-generation ids) and decoding. The
//! algorithms live in submodules: [`pretokenize`] (the word splitters of byte-level BPE),
//! `bpe` (byte-level BPE, `gpt2`), `spm` (SentencePiece, `llama`) and [`Decoder`] (streaming
//! detokenization).
//!
//! ```no_run
//! # fn demo(tok: &rgml_llm::tokenizer::Tokenizer) -> rgml_llm::Result<()> {
//! use rgml_llm::tokenizer::EncodeOptions;
//! let ids = tok.encode("<|im_start|>user\nHi<|im_end|>\n", EncodeOptions::prompt());
//! let text = tok.decode(&ids, true)?;
//! # Ok(()) }
//! ```

mod bpe;
mod decode;
mod gguf;
pub mod pretokenize;
mod spm;
mod unicode;

use std::collections::HashMap;

pub use decode::Decoder;
pub use pretokenize::PreTokenizer;

use crate::error::{LlmError, Result};

/// A token id, an index into the vocabulary.
pub type TokenId = u32;

/// The type of a vocabulary entry (`tokenizer.ggml.token_type`, llama.cpp's values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TokenType {
    /// 0: no type given; treated like [`TokenType::Normal`].
    Undefined,
    /// 1: an ordinary piece of text.
    Normal,
    /// 2: the unknown token.
    Unknown,
    /// 3: a control token (BOS, `<|im_start|>`, ...): parsed from text only when asked to,
    /// rendered only when asked to.
    Control,
    /// 4: a user-defined token: always matched in text before tokenizing, always rendered.
    UserDefined,
    /// 5: an unused slot: never produced, rendered empty.
    Unused,
    /// 6: a byte-fallback token `<0xXX>` (SentencePiece).
    Byte,
}

impl TokenType {
    /// The type for a GGUF `token_type` value; values llama.cpp does not define read as
    /// [`TokenType::Undefined`].
    pub fn from_gguf(v: i64) -> TokenType {
        match v {
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Undefined,
        }
    }
}

/// The tokenizer algorithm (`tokenizer.ggml.model`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TokenizerKind {
    /// `gpt2`: byte-level BPE with merges and a pre-tokenizer.
    Bpe,
    /// `llama`: SentencePiece BPE with scores and byte fallback.
    Spm,
}

impl TokenizerKind {
    /// The kind for a `tokenizer.ggml.model` value.
    pub fn from_name(name: &str) -> Result<TokenizerKind> {
        match name {
            "gpt2" => Ok(TokenizerKind::Bpe),
            "llama" => Ok(TokenizerKind::Spm),
            other => Err(LlmError::Tokenizer(format!(
                "unsupported tokenizer model '{other}' (supported: gpt2, llama)"
            ))),
        }
    }
}

/// Everything a [`Tokenizer`] is built from, as plain data: what `tokenizer.ggml.*` holds.
/// `Default` gives an empty byte-level BPE description to fill in.
#[derive(Clone, Debug)]
pub struct TokenizerParts {
    /// The algorithm.
    pub kind: TokenizerKind,
    /// The pre-tokenizer name (`tokenizer.ggml.pre`); `None` means llama.cpp's `default`.
    /// Only byte-level BPE uses it.
    pub pre: Option<String>,
    /// Token texts, indexed by id.
    pub tokens: Vec<String>,
    /// Token scores (SentencePiece merge priority); empty means all 0.
    pub scores: Vec<f32>,
    /// Token types; empty means all [`TokenType::Normal`].
    pub token_types: Vec<TokenType>,
    /// BPE merges, `"left right"`, highest priority first.
    pub merges: Vec<String>,
    /// Beginning-of-sequence id; SentencePiece defaults to 1.
    pub bos: Option<TokenId>,
    /// End-of-sequence id; SentencePiece defaults to 2.
    pub eos: Option<TokenId>,
    /// End-of-turn id, if the model has one.
    pub eot: Option<TokenId>,
    /// End-of-message id, if the model has one.
    pub eom: Option<TokenId>,
    /// Unknown-token id; SentencePiece defaults to 0.
    pub unk: Option<TokenId>,
    /// Padding id.
    pub pad: Option<TokenId>,
    /// Whether encoding with [`EncodeOptions::add_special`] prepends BOS; default true for
    /// SentencePiece and Llama 3's BPE, false for other BPE.
    pub add_bos: Option<bool>,
    /// Whether encoding with [`EncodeOptions::add_special`] appends EOS; default false.
    pub add_eos: Option<bool>,
    /// Whether SentencePiece prefixes text with a space; default true for SentencePiece.
    pub add_space_prefix: Option<bool>,
}

impl Default for TokenizerParts {
    fn default() -> Self {
        TokenizerParts {
            kind: TokenizerKind::Bpe,
            pre: None,
            tokens: Vec::new(),
            scores: Vec::new(),
            token_types: Vec::new(),
            merges: Vec::new(),
            bos: None,
            eos: None,
            eot: None,
            eom: None,
            unk: None,
            pad: None,
            add_bos: None,
            add_eos: None,
            add_space_prefix: None,
        }
    }
}

/// One vocabulary entry.
#[derive(Clone, Debug)]
pub(crate) struct TokenData {
    pub text: String,
    pub score: f32,
    pub ty: TokenType,
}

/// Token texts and the reverse lookup, shared by the algorithms.
#[derive(Clone, Debug)]
pub(crate) struct Vocab {
    pub tokens: Vec<TokenData>,
    pub token_to_id: HashMap<String, TokenId>,
    pub unk: Option<TokenId>,
}

impl Vocab {
    /// The token for one raw byte in SentencePiece: `<0xXX>`, else the byte as a one-char
    /// token, else UNK (llama.cpp's `byte_to_token`, which would throw instead of UNK).
    pub(crate) fn byte_token(&self, b: u8) -> Option<TokenId> {
        let hex = format!("<0x{b:02X}>");
        if let Some(&id) = self.token_to_id.get(&hex) {
            return Some(id);
        }
        let one = [b];
        std::str::from_utf8(&one)
            .ok()
            .and_then(|s| self.token_to_id.get(s).copied())
            .or(self.unk)
    }
}

#[derive(Clone, Debug)]
enum Model {
    Bpe(Box<bpe::BpeModel>),
    Spm,
}

/// A text fragment or an already-identified special token, while splitting at specials.
enum Fragment<'t> {
    Text(&'t str),
    Token(TokenId),
}

/// What a token renders to.
#[derive(Clone, Debug)]
struct Piece {
    bytes: Box<[u8]>,
    /// Control and unknown tokens render only when special tokens are asked for.
    special: bool,
}

/// Token texts llama.cpp treats as end-of-generation whatever their type.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
];

/// How [`Tokenizer::encode`] treats special tokens. The default (both off) tokenizes plain
/// text as it is; [`EncodeOptions::prompt`] is what a prompt for generation wants.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EncodeOptions {
    /// Add BOS/EOS as the vocabulary asks ([`Tokenizer::add_bos`], [`Tokenizer::add_eos`]).
    pub add_special: bool,
    /// Control tokens written in the text (e.g. `<|im_start|>`) become their ids; otherwise
    /// they are tokenized as plain text. User-defined tokens are always matched, as in
    /// llama.cpp.
    pub parse_special: bool,
}

impl EncodeOptions {
    /// A prompt, as llama.cpp's tools tokenize one: BOS/EOS as the vocabulary asks, and
    /// control tokens in the text (a chat template's markers) parsed.
    pub const fn prompt() -> Self {
        EncodeOptions {
            add_special: true,
            parse_special: true,
        }
    }
}

/// A tokenizer: text to token ids and back, matching llama.cpp for the same GGUF metadata.
///
/// `Send + Sync`: a model's tokenizer is read by every session and thread at once.
#[derive(Clone, Debug)]
pub struct Tokenizer {
    kind: TokenizerKind,
    vocab: Vocab,
    model: Model,
    /// Tokens matched in raw text before tokenizing, longest text first.
    specials: Vec<TokenId>,
    pieces: Vec<Piece>,
    bos: Option<TokenId>,
    eos: Option<TokenId>,
    eot: Option<TokenId>,
    eom: Option<TokenId>,
    pad: Option<TokenId>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    eog: Vec<TokenId>,
}

impl Tokenizer {
    /// Builds a tokenizer from plain parts (used by [`Tokenizer::from_gguf`] and tests).
    pub fn from_parts(parts: TokenizerParts) -> Result<Tokenizer> {
        let n = check_lengths(&parts)?;
        let spm = parts.kind == TokenizerKind::Spm;
        let ids = SpecialIds::of(&parts, n)?;
        let vocab = build_vocab(parts.tokens, &parts.scores, &parts.token_types, ids.unk);
        let (model, add_bos_default) = match parts.kind {
            TokenizerKind::Bpe => {
                let pre = match parts.pre.as_deref() {
                    Some(name) => PreTokenizer::from_name(name)?,
                    None => PreTokenizer::Default,
                };
                let m = bpe::BpeModel::new(&vocab, &parts.merges, pre)?;
                (Model::Bpe(Box::new(m)), pre == PreTokenizer::Llama3)
            }
            TokenizerKind::Spm => (Model::Spm, true),
        };
        let specials = special_tokens(&vocab);
        let pieces = vocab.tokens.iter().map(|t| render(parts.kind, t)).collect();
        let eog = end_of_generation(&vocab, [ids.eos, ids.eot, ids.eom]);
        Ok(Tokenizer {
            kind: parts.kind,
            vocab,
            model,
            specials,
            pieces,
            bos: ids.bos,
            eos: ids.eos,
            eot: ids.eot,
            eom: ids.eom,
            pad: ids.pad,
            add_bos: parts.add_bos.unwrap_or(add_bos_default),
            add_eos: parts.add_eos.unwrap_or(false),
            add_space_prefix: parts.add_space_prefix.unwrap_or(spm),
            eog,
        })
    }

    /// Tokenizes `text`, with special tokens as `options` say (see [`EncodeOptions`]).
    ///
    /// Never fails: every string has a tokenization (bytes without a token are dropped, as
    /// llama.cpp drops them, which a consistent vocabulary never needs).
    pub fn encode(&self, text: &str, options: EncodeOptions) -> Vec<TokenId> {
        let EncodeOptions {
            add_special,
            parse_special,
        } = options;
        let frags = self.split_specials(text, parse_special);
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.extend(self.bos);
        }
        match &self.model {
            Model::Bpe(m) => {
                for f in &frags {
                    match *f {
                        Fragment::Text(t) => m.encode(&self.vocab, t, &mut out),
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
            Model::Spm => {
                // A text fragment gets the space prefix at the start and after a special token.
                let mut prev_special = true;
                let mut buf = String::new();
                for f in &frags {
                    match *f {
                        Fragment::Text(t) => {
                            buf.clear();
                            if self.add_space_prefix && prev_special {
                                buf.push('▁');
                            }
                            for c in t.chars() {
                                buf.push(if c == ' ' { '▁' } else { c });
                            }
                            spm::encode(&self.vocab, &buf, &mut out);
                            prev_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                    }
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        out
    }

    /// Splits `text` at special tokens, longest first, as llama.cpp's
    /// `tokenizer_st_partition`: each special token is searched for in every text fragment
    /// the longer ones left.
    fn split_specials<'t>(&self, text: &'t str, parse_special: bool) -> Vec<Fragment<'t>> {
        let mut frags = Vec::new();
        if text.is_empty() {
            return frags;
        }
        frags.push(Fragment::Text(text));
        for &id in &self.specials {
            let tok = &self.vocab.tokens[id as usize];
            if !parse_special && tok.ty != TokenType::UserDefined {
                continue;
            }
            let needle = tok.text.as_str();
            if !frags
                .iter()
                .any(|f| matches!(f, Fragment::Text(t) if t.contains(needle)))
            {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len() + 2);
            for f in frags {
                match f {
                    Fragment::Text(t) => {
                        let mut rest = t;
                        while let Some(i) = rest.find(needle) {
                            if i > 0 {
                                next.push(Fragment::Text(&rest[..i]));
                            }
                            next.push(Fragment::Token(id));
                            rest = &rest[i + needle.len()..];
                        }
                        if !rest.is_empty() {
                            next.push(Fragment::Text(rest));
                        }
                    }
                    tok @ Fragment::Token(_) => next.push(tok),
                }
            }
            frags = next;
        }
        frags
    }

    /// The bytes token `id` renders to; control and unknown tokens render empty unless
    /// `special`. Errors on an id outside the vocabulary.
    pub fn token_to_piece(&self, id: TokenId, special: bool) -> Result<&[u8]> {
        let p = self.pieces.get(id as usize).ok_or(LlmError::InvalidToken {
            id,
            n_vocab: self.pieces.len(),
        })?;
        Ok(if p.special && !special { &[] } else { &p.bytes })
    }

    /// The piece of the token at position `index` of a decoded sequence: SentencePiece with a
    /// space prefix drops the first token's leading space, as llama.cpp's detokenizer does.
    fn piece_at(&self, index: usize, id: TokenId, special: bool) -> Result<&[u8]> {
        let p = self.token_to_piece(id, special)?;
        Ok(match p {
            [b' ', rest @ ..] if index == 0 && self.strips_first_space() => rest,
            _ => p,
        })
    }

    fn strips_first_space(&self) -> bool {
        self.kind == TokenizerKind::Spm && self.add_space_prefix
    }

    /// The raw bytes of a token sequence (not necessarily valid UTF-8 when cut mid-char).
    pub fn decode_bytes(&self, ids: &[TokenId], special: bool) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(ids.len() * 4);
        for (i, &id) in ids.iter().enumerate() {
            out.extend_from_slice(self.piece_at(i, id, special)?);
        }
        Ok(out)
    }

    /// Decodes a token sequence to text; invalid UTF-8 (e.g. a sequence cut inside a
    /// character) becomes U+FFFD. `special`: render control tokens such as `<|im_end|>`.
    pub fn decode(&self, ids: &[TokenId], special: bool) -> Result<String> {
        let bytes = self.decode_bytes(ids, special)?;
        Ok(match String::from_utf8(bytes) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        })
    }

    /// A streaming decoder: feed it ids one at a time and print what it returns.
    pub fn decoder(&self, special: bool) -> Decoder<'_> {
        Decoder::new(self, special)
    }

    /// The algorithm.
    pub fn kind(&self) -> TokenizerKind {
        self.kind
    }

    /// The pre-tokenizer, for byte-level BPE.
    pub fn pre_tokenizer(&self) -> Option<PreTokenizer> {
        match &self.model {
            Model::Bpe(m) => Some(m.pre),
            Model::Spm => None,
        }
    }

    /// Number of tokens in the vocabulary.
    pub fn n_vocab(&self) -> usize {
        self.vocab.tokens.len()
    }

    /// The stored text of token `id` (byte-level BPE tokens in GPT-2's char mapping).
    pub fn token_text(&self, id: TokenId) -> Option<&str> {
        self.vocab.tokens.get(id as usize).map(|t| t.text.as_str())
    }

    /// The type of token `id`.
    pub fn token_type(&self, id: TokenId) -> Option<TokenType> {
        self.vocab.tokens.get(id as usize).map(|t| t.ty)
    }

    /// The score of token `id` (0 where the vocabulary has none).
    pub fn token_score(&self, id: TokenId) -> Option<f32> {
        self.vocab.tokens.get(id as usize).map(|t| t.score)
    }

    /// The id of the token whose stored text is exactly `text`.
    pub fn token_id(&self, text: &str) -> Option<TokenId> {
        self.vocab.token_to_id.get(text).copied()
    }

    /// Beginning-of-sequence id.
    pub fn bos(&self) -> Option<TokenId> {
        self.bos
    }

    /// End-of-sequence id.
    pub fn eos(&self) -> Option<TokenId> {
        self.eos
    }

    /// End-of-turn id.
    pub fn eot(&self) -> Option<TokenId> {
        self.eot
    }

    /// End-of-message id.
    pub fn eom(&self) -> Option<TokenId> {
        self.eom
    }

    /// Unknown-token id.
    pub fn unk(&self) -> Option<TokenId> {
        self.vocab.unk
    }

    /// Padding id.
    pub fn pad(&self) -> Option<TokenId> {
        self.pad
    }

    /// Whether encoding with `add_special` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether encoding with `add_special` appends EOS.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// The end-of-generation ids: EOS, EOT, EOM and the tokens llama.cpp recognises by text
    /// (`<|im_end|>`, `<|eot_id|>`, `<|endoftext|>`, ...), sorted.
    pub fn eog_ids(&self) -> &[TokenId] {
        &self.eog
    }

    /// Whether generation should stop at `id`.
    pub fn is_eog(&self, id: TokenId) -> bool {
        self.eog.binary_search(&id).is_ok()
    }
}

/// The vocabulary size of `parts`, checked: not empty, ids fit in a `u32`, and scores and
/// token types either absent or one per token.
fn check_lengths(parts: &TokenizerParts) -> Result<usize> {
    let n = parts.tokens.len();
    if n == 0 {
        return Err(LlmError::Tokenizer("empty vocabulary".into()));
    }
    if u32::try_from(n).is_err() {
        return Err(LlmError::Tokenizer(format!(
            "vocabulary of {n} tokens is too large"
        )));
    }
    for (what, len) in [
        ("scores", parts.scores.len()),
        ("token types", parts.token_types.len()),
    ] {
        if len != 0 && len != n {
            return Err(LlmError::Tokenizer(format!(
                "{len} {what} for a vocabulary of {n} tokens"
            )));
        }
    }
    Ok(n)
}

/// The special token ids of a vocabulary, each checked against its size.
struct SpecialIds {
    bos: Option<TokenId>,
    eos: Option<TokenId>,
    unk: Option<TokenId>,
    eot: Option<TokenId>,
    eom: Option<TokenId>,
    pad: Option<TokenId>,
}

impl SpecialIds {
    /// The ids `parts` names for a vocabulary of `n` tokens, with llama.cpp's defaults for
    /// SentencePiece.
    fn of(parts: &TokenizerParts, n: usize) -> Result<SpecialIds> {
        let check = |what: &str, id: Option<TokenId>| -> Result<Option<TokenId>> {
            match id {
                Some(id) if id as usize >= n => Err(LlmError::Tokenizer(format!(
                    "{what} token id {id} is out of range for a vocabulary of {n} tokens"
                ))),
                _ => Ok(id),
            }
        };
        let spm = parts.kind == TokenizerKind::Spm;
        // llama.cpp's defaults for SentencePiece vocabularies that do not name these ids.
        let default_if_spm = |v: TokenId| {
            if spm && (v as usize) < n {
                Some(v)
            } else {
                None
            }
        };
        Ok(SpecialIds {
            bos: check("BOS", parts.bos.or_else(|| default_if_spm(1)))?,
            eos: check("EOS", parts.eos.or_else(|| default_if_spm(2)))?,
            unk: check("UNK", parts.unk.or_else(|| default_if_spm(0)))?,
            eot: check("EOT", parts.eot)?,
            eom: check("EOM", parts.eom)?,
            pad: check("PAD", parts.pad)?,
        })
    }
}

/// The vocabulary of `texts`, with their scores and types (0 and normal where absent).
fn build_vocab(
    texts: Vec<String>,
    scores: &[f32],
    token_types: &[TokenType],
    unk: Option<TokenId>,
) -> Vocab {
    let tokens: Vec<TokenData> = texts
        .into_iter()
        .enumerate()
        .map(|(i, text)| TokenData {
            text,
            score: scores.get(i).copied().unwrap_or(0.0),
            ty: token_types.get(i).copied().unwrap_or(TokenType::Normal),
        })
        .collect();
    let mut token_to_id = HashMap::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        // As in llama.cpp, a duplicated text maps to its last id.
        token_to_id.insert(t.text.clone(), i as TokenId);
    }
    Vocab {
        tokens,
        token_to_id,
        unk,
    }
}

/// The tokens matched in raw text before tokenizing (control, user-defined and unknown
/// tokens with a text), longest text first.
fn special_tokens(vocab: &Vocab) -> Vec<TokenId> {
    let mut specials: Vec<TokenId> = (0..vocab.tokens.len() as TokenId)
        .filter(|&id| {
            let t = &vocab.tokens[id as usize];
            !t.text.is_empty()
                && matches!(
                    t.ty,
                    TokenType::Control | TokenType::UserDefined | TokenType::Unknown
                )
        })
        .collect();
    // Longest first so that a special token containing another wins; ties by id keep
    // the order deterministic.
    specials.sort_by_key(|&id| (std::cmp::Reverse(vocab.tokens[id as usize].text.len()), id));
    specials
}

/// The end-of-generation ids: `named` (EOS, EOT, EOM) and the tokens of [`EOG_TEXTS`],
/// sorted, without repeats.
fn end_of_generation(vocab: &Vocab, named: [Option<TokenId>; 3]) -> Vec<TokenId> {
    let mut eog: Vec<TokenId> = named.into_iter().flatten().collect();
    eog.extend(
        EOG_TEXTS
            .iter()
            .filter_map(|t| vocab.token_to_id.get(*t).copied()),
    );
    eog.sort_unstable();
    eog.dedup();
    eog
}

/// What a token renders to, per llama.cpp's `token_to_piece`.
fn render(kind: TokenizerKind, t: &TokenData) -> Piece {
    let text = t.text.as_str();
    let (bytes, special): (Vec<u8>, bool) = match t.ty {
        TokenType::Control | TokenType::Unknown => (text.as_bytes().to_vec(), true),
        TokenType::UserDefined => (text.as_bytes().to_vec(), false),
        TokenType::Unused => (Vec::new(), false),
        TokenType::Byte if kind == TokenizerKind::Spm => (
            parse_byte_token(text).map_or_else(|| text.as_bytes().to_vec(), |b| vec![b]),
            false,
        ),
        _ => match kind {
            TokenizerKind::Bpe => (decode_byte_level(text), false),
            TokenizerKind::Spm => (text.replace('▁', " ").into_bytes(), false),
        },
    };
    Piece {
        bytes: bytes.into_boxed_slice(),
        special,
    }
}

/// `<0xXX>` to its byte.
fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// Byte-level BPE text back to raw bytes. A char outside GPT-2's table (a vocabulary that was
/// not fully byte-encoded) passes through as its own UTF-8, where llama.cpp would print a
/// `[UNK_BYTE_..]` marker.
fn decode_byte_level(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        match unicode::char_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    out
}
