//! Tokenizers built from GGUF metadata (`tokenizer.ggml.*`), reproducing llama.cpp's token ids.
//!
//! This module owns the vocabulary, the special-token handling shared by all tokenizer kinds
//! (splitting text at special tokens, BOS/EOS) and decoding. The algorithms live in
//! submodules: `attr` (the token attributes llama.cpp derives, end-of-generation ids),
//! [`pretokenize`] (the word splitters of BPE), `bpe` (BPE with merges: byte-level, `gpt2`,
//! and over raw UTF-8, `gemma4`),
//! `spm` (SentencePiece, `llama`), `wpm` (WordPiece, `bert`) and [`Decoder`] (streaming
//! detokenization).
//!
//! ```no_run
//! # fn demo(tok: &rgml_llm::tokenizer::Tokenizer) -> rgml_llm::Result<()> {
//! use rgml_llm::tokenizer::EncodeOptions;
//! let ids = tok.encode("<|im_start|>user\nHi<|im_end|>\n", EncodeOptions::prompt());
//! let text = tok.decode(&ids, true)?;
//! # Ok(()) }
//! ```

mod attr;
mod bpe;
mod decode;
mod gguf;
pub mod pretokenize;
mod spm;
mod unicode;
mod wpm;

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

pub use attr::{FimIds, TokenAttr};
pub use decode::Decoder;
pub use pretokenize::PreTokenizer;

use crate::error::{LlmError, Result};
use crate::grammar::TokenTrie;

/// A token id, an index into the vocabulary.
pub type TokenId = u32;

/// The type of a vocabulary entry (`tokenizer.ggml.token_type`, llama.cpp's values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TokenType {
    /// 0: no type given; as in llama.cpp, such a token renders as nothing.
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
    /// `gemma4`: BPE with merges over raw UTF-8 (no byte-level mapping), spaces written `▁`,
    /// `<0xXX>` byte fallback, and always Gemma 4's pre-tokenizer (llama.cpp ignores the
    /// file's `tokenizer.ggml.pre` for it).
    Gemma4,
    /// `test`: llama.cpp's tokenizer of its random test models (`test-llama-archs`): text in
    /// chunks of 5 bytes, each hashed (`h = h * 31 + byte`) modulo the vocabulary size; tokens
    /// render as their id in hexadecimal.
    Test,
    /// `bert`: WordPiece (BERT's normaliser, greedy longest match per word); encoding with
    /// special tokens wraps the text in `[CLS]` (BOS) and `[SEP]`.
    Wpm,
}

impl TokenizerKind {
    /// The kind for a `tokenizer.ggml.model` value.
    pub fn from_name(name: &str) -> Result<TokenizerKind> {
        match name {
            "gpt2" => Ok(TokenizerKind::Bpe),
            "llama" => Ok(TokenizerKind::Spm),
            "gemma4" => Ok(TokenizerKind::Gemma4),
            "test" => Ok(TokenizerKind::Test),
            "bert" => Ok(TokenizerKind::Wpm),
            other => Err(LlmError::Tokenizer(format!(
                "unsupported tokenizer model '{other}' (supported: gpt2, llama, gemma4, test, \
                 bert)"
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
    /// Only byte-level BPE uses it (`gemma4` always has Gemma 4's).
    pub pre: Option<String>,
    /// Token texts, indexed by id.
    pub tokens: Vec<String>,
    /// Token scores (SentencePiece merge priority); empty means all 0.
    pub scores: Vec<f32>,
    /// Token types; empty means all [`TokenType::Normal`].
    pub token_types: Vec<TokenType>,
    /// BPE merges, `"left right"`, highest priority first.
    pub merges: Vec<String>,
    /// Beginning-of-sequence id; SentencePiece defaults to 1, byte-level BPE to 11 (as in
    /// llama.cpp).
    pub bos: Option<TokenId>,
    /// End-of-sequence id; SentencePiece defaults to 2, byte-level BPE to 11.
    pub eos: Option<TokenId>,
    /// End-of-turn id, if the model has one.
    pub eot: Option<TokenId>,
    /// End-of-message id, if the model has one.
    pub eom: Option<TokenId>,
    /// Unknown-token id; SentencePiece defaults to 0.
    pub unk: Option<TokenId>,
    /// Padding id; WordPiece defaults to 0.
    pub pad: Option<TokenId>,
    /// Separator id (`[SEP]`, which WordPiece appends); WordPiece defaults to 102.
    pub sep: Option<TokenId>,
    /// BERT's normaliser (`tokenizer.ggml.normalizer.lowercase`, default true, and
    /// `.strip_accents`, defaulting to the former), for WordPiece.
    pub lowercase: Option<bool>,
    /// See [`TokenizerParts::lowercase`].
    pub strip_accents: Option<bool>,
    /// Whether encoding with [`EncodeOptions::add_special`] prepends BOS; default true for
    /// SentencePiece and Llama 3's BPE, false for other BPE.
    pub add_bos: Option<bool>,
    /// Whether encoding with [`EncodeOptions::add_special`] appends EOS; default false.
    pub add_eos: Option<bool>,
    /// Whether SentencePiece prefixes text with a space, and decoding drops the first
    /// token's leading space; default true for SentencePiece, false for BPE.
    pub add_space_prefix: Option<bool>,
    /// Fill-in-the-middle ids the file names (`tokenizer.ggml.fim_*_token_id`); the others
    /// are found by text, as llama.cpp finds them.
    pub fim: FimIds,
    /// The model's name (`general.name`): llama.cpp gives Phi-3's special tokens their
    /// whitespace stripping by it.
    pub name: Option<String>,
    /// The model's architecture (`general.architecture`), for the same per-model rules.
    pub architecture: Option<String>,
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
            sep: None,
            lowercase: None,
            strip_accents: None,
            add_bos: None,
            add_eos: None,
            add_space_prefix: None,
            fim: FimIds::default(),
            name: None,
            architecture: None,
        }
    }
}

/// One vocabulary entry.
#[derive(Clone, Debug)]
pub(crate) struct TokenData {
    pub text: String,
    pub score: f32,
    pub ty: TokenType,
    /// What llama.cpp makes of `ty` (see [`TokenAttr`]); the tokenizer goes by this.
    pub attr: TokenAttr,
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
    Test,
    Wpm(wpm::WpmModel),
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

/// How [`Tokenizer::encode`] treats special tokens. The default (both off) tokenizes plain
/// text as it is; [`EncodeOptions::prompt`] is what a prompt for generation wants.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EncodeOptions {
    /// Add BOS/EOS as the vocabulary asks ([`Tokenizer::add_bos`], [`Tokenizer::add_eos`]).
    pub add_special: bool,
    /// Control tokens written in the text (e.g. `<|im_start|>`) become their ids; otherwise
    /// they are tokenized as plain text. User-defined tokens are always matched, as in
    /// llama.cpp (unless llama.cpp also made them control tokens, see [`TokenAttr`]).
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
    sep: Option<TokenId>,
    fim: FimIds,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    /// Whether decoding tidies spaces before punctuation (llama.cpp's `clean_spaces`).
    clean_spaces: bool,
    eog: Vec<TokenId>,
    /// Every token's text as a byte trie, for grammar-constrained sampling (built on first
    /// use).
    token_trie: OnceLock<Arc<TokenTrie>>,
}

impl Tokenizer {
    /// Builds a tokenizer from plain parts (used by [`Tokenizer::from_gguf`] and tests).
    pub fn from_parts(mut parts: TokenizerParts) -> Result<Tokenizer> {
        let n = check_lengths(&parts)?;
        let ids = SpecialIds::of(&parts, n)?;
        let tokens = std::mem::take(&mut parts.tokens);
        let mut vocab = build_vocab(tokens, &parts.scores, &parts.token_types, ids.unk);
        let lowercase = parts.lowercase.unwrap_or(true);
        let normalizer = wpm::Normalizer {
            lowercase,
            strip_accents: parts.strip_accents.unwrap_or(lowercase),
        };
        let algo = Algorithm::new(&parts, &vocab, normalizer)?;
        let given = attr::NamedIds {
            eos: ids.eos,
            eot: ids.eot,
            eom: ids.eom,
            fim: parts.fim,
        };
        let derived = attr::derive(&mut vocab, given);
        let specials = special_tokens(&vocab);
        let pieces = vocab
            .tokens
            .iter()
            .enumerate()
            .map(|(id, t)| render(algo.rendering, id, t))
            .collect();
        // llama.cpp sets the strip flags after its special-token list and pieces are built;
        // they change neither.
        let names = attr::ModelNames {
            name: parts.name.as_deref(),
            architecture: parts.architecture.as_deref(),
            pre: parts.pre.as_deref(),
        };
        attr::apply_strip_rules(&mut vocab, &specials, names);
        let named = derived.named;
        Ok(Tokenizer {
            kind: parts.kind,
            vocab,
            model: algo.model,
            specials,
            pieces,
            bos: ids.bos,
            eos: ids.eos,
            eot: named.eot,
            eom: named.eom,
            pad: ids.pad,
            sep: ids.sep,
            fim: named.fim,
            add_bos: parts.add_bos.unwrap_or(algo.add_bos) || algo.forces_bos,
            add_eos: parts.add_eos.unwrap_or(false),
            add_space_prefix: parts
                .add_space_prefix
                .unwrap_or(parts.kind == TokenizerKind::Spm),
            clean_spaces: algo.clean_spaces,
            eog: derived.eog,
            token_trie: OnceLock::new(),
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
            Model::Test => {
                for f in &frags {
                    match *f {
                        Fragment::Text(t) => test_hash_chunks(t, self.pieces.len(), &mut out),
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
            Model::Wpm(m) => {
                for f in &frags {
                    match *f {
                        Fragment::Text(t) => m.encode(&self.vocab, t, &mut out),
                        Fragment::Token(id) => out.push(id),
                    }
                }
                // llama.cpp closes a WordPiece text with SEP, never EOS.
                if add_special {
                    out.extend(self.sep);
                }
                return out;
            }
        }
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        out
    }

    /// Splits `text` at special tokens, longest first, as llama.cpp's
    /// `tokenizer_st_partition`: each special token is searched for in every text fragment
    /// the longer ones left. Control and unknown tokens are matched only if `parse_special`.
    fn split_specials<'t>(&self, text: &'t str, parse_special: bool) -> Vec<Fragment<'t>> {
        let mut frags = Vec::new();
        if text.is_empty() {
            return frags;
        }
        frags.push(Fragment::Text(text));
        for &id in &self.specials {
            let tok = &self.vocab.tokens[id as usize];
            if !parse_special && tok.attr.is_special() {
                continue;
            }
            let needle = tok.text.as_str();
            if frags
                .iter()
                .any(|f| matches!(f, Fragment::Text(t) if t.contains(needle)))
            {
                frags = split_at(frags, needle, id, tok.attr);
            }
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

    /// The piece of the token at position `index` of a decoded sequence: with a space prefix
    /// the first token's leading space is dropped, as llama.cpp's detokenizer does.
    fn piece_at(&self, index: usize, id: TokenId, special: bool) -> Result<&[u8]> {
        let p = self.token_to_piece(id, special)?;
        Ok(match p {
            [b' ', rest @ ..] if index == 0 && self.add_space_prefix => rest,
            _ => p,
        })
    }

    /// The bytes of a token sequence, as llama.cpp's `llama_detokenize` (BOS and EOS kept)
    /// gives them: the pieces, then, for the BPE vocabularies llama.cpp cleans, spaces
    /// before `?!.,` and in some contractions removed (see [`Decoder`] for pieces as they
    /// stream). Not necessarily valid UTF-8 when cut inside a character.
    pub fn decode_bytes(&self, ids: &[TokenId], special: bool) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(ids.len() * 4);
        for (i, &id) in ids.iter().enumerate() {
            out.extend_from_slice(self.piece_at(i, id, special)?);
        }
        Ok(if self.clean_spaces {
            decode::clean_spaces(&out)
        } else {
            out
        })
    }

    /// Decodes a token sequence to text, as [`Tokenizer::decode_bytes`]; invalid UTF-8 (e.g.
    /// a sequence cut inside a character) becomes U+FFFD. `special`: render control tokens
    /// such as `<|im_end|>`.
    pub fn decode(&self, ids: &[TokenId], special: bool) -> Result<String> {
        let bytes = self.decode_bytes(ids, special)?;
        Ok(match String::from_utf8(bytes) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        })
    }

    /// A streaming decoder: feed it ids one at a time and print what it returns.
    pub fn decoder(&self, special: bool) -> Decoder<'_> {
        Decoder::new(self, special, Vec::new())
    }

    /// A streaming decoder that renders the special tokens of `preserved` (and no others): a
    /// format's control markers that its parser must see (see
    /// [`crate::tool_calls::ToolCallFormat::markers`]).
    pub fn decoder_preserving(&self, preserved: Vec<TokenId>) -> Decoder<'_> {
        Decoder::new(self, false, preserved)
    }

    /// The ids of the special tokens (control, unknown) whose texts are among `texts`: the
    /// markers a decoder must preserve; texts that are not special tokens render anyway.
    pub fn special_ids(&self, texts: &[&str]) -> Vec<TokenId> {
        texts
            .iter()
            .filter_map(|t| self.token_id(t))
            .filter(|&id| self.token_attr(id).is_some_and(|a| a.is_special()))
            .collect()
    }

    /// The algorithm.
    pub fn kind(&self) -> TokenizerKind {
        self.kind
    }

    /// The pre-tokenizer, for byte-level BPE.
    pub fn pre_tokenizer(&self) -> Option<PreTokenizer> {
        match &self.model {
            Model::Bpe(m) => Some(m.pre),
            Model::Spm | Model::Test | Model::Wpm(_) => None,
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

    /// The type of token `id`, as the file gives it.
    pub fn token_type(&self, id: TokenId) -> Option<TokenType> {
        self.vocab.tokens.get(id as usize).map(|t| t.ty)
    }

    /// The attributes of token `id`, as llama.cpp derives them from its type, its text and
    /// the model (see [`TokenAttr`]).
    pub fn token_attr(&self, id: TokenId) -> Option<TokenAttr> {
        self.vocab.tokens.get(id as usize).map(|t| t.attr)
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

    /// End-of-turn id: the file's, else found by text as llama.cpp finds it (`<|eot_id|>`,
    /// `<|im_end|>`, `<end_of_turn>`, ...; the first of its list the vocabulary has).
    pub fn eot(&self) -> Option<TokenId> {
        self.eot
    }

    /// End-of-message id: the file's, else `<|eom_id|>` if the vocabulary has it.
    pub fn eom(&self) -> Option<TokenId> {
        self.eom
    }

    /// Fill-in-the-middle ids: the file's, else found by text as llama.cpp finds them.
    pub fn fim(&self) -> FimIds {
        self.fim
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

    /// The end-of-generation ids, sorted: EOS, EOT, EOM, the FIM padding, repository and
    /// file-separator tokens, and the tokens llama.cpp recognises by text (`<|im_end|>`,
    /// `<|eot_id|>`, `<|endoftext|>`, `</s>`, ...).
    pub fn eog_ids(&self) -> &[TokenId] {
        &self.eog
    }

    /// The texts of every token but the end-of-generation ones (as [`Tokenizer::token_to_piece`]
    /// writes them with special tokens, as llama.cpp's grammar reads them), as a byte trie for
    /// grammar-constrained sampling; built at the first call.
    pub fn token_trie(&self) -> &TokenTrie {
        self.token_trie.get_or_init(|| {
            let pieces = (0..self.n_vocab() as TokenId)
                .filter(|&id| !self.is_eog(id))
                .filter_map(|id| Some((id, self.token_to_piece(id, true).ok()?)));
            Arc::new(TokenTrie::new(pieces))
        })
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
    sep: Option<TokenId>,
}

impl SpecialIds {
    /// The ids `parts` names for a vocabulary of `n` tokens, with llama.cpp's defaults for
    /// those it does not name (where they are in range).
    fn of(parts: &TokenizerParts, n: usize) -> Result<SpecialIds> {
        let check = |what: &str, id: Option<TokenId>| -> Result<Option<TokenId>> {
            match id {
                Some(id) if id as usize >= n => Err(LlmError::Tokenizer(format!(
                    "{what} token id {id} is out of range for a vocabulary of {n} tokens"
                ))),
                _ => Ok(id),
            }
        };
        // llama.cpp's defaults: SentencePiece's BOS 1, EOS 2 and UNK 0; byte-level BPE's
        // BOS and EOS 11 (GPT-2's, whatever the vocabulary), no UNK; Gemma 4's none;
        // WordPiece's BERT ids: [CLS] 101 as BOS, [UNK] 100, [SEP] 102, [PAD] 0.
        let (bos, eos, unk) = match parts.kind {
            TokenizerKind::Spm => (Some(1), Some(2), Some(0)),
            TokenizerKind::Bpe => (Some(11), Some(11), None),
            TokenizerKind::Wpm => (Some(101), None, Some(100)),
            TokenizerKind::Gemma4 | TokenizerKind::Test => (None, None, None),
        };
        let (sep, pad) = match parts.kind {
            TokenizerKind::Wpm => (Some(102), Some(0)),
            _ => (None, None),
        };
        let default = |v: Option<TokenId>| v.filter(|&v| (v as usize) < n);
        Ok(SpecialIds {
            bos: check("BOS", parts.bos.or_else(|| default(bos)))?,
            eos: check("EOS", parts.eos.or_else(|| default(eos)))?,
            unk: check("UNK", parts.unk.or_else(|| default(unk)))?,
            eot: check("EOT", parts.eot)?,
            eom: check("EOM", parts.eom)?,
            pad: check("PAD", parts.pad.or_else(|| default(pad)))?,
            sep: check("SEP", parts.sep.or_else(|| default(sep)))?,
        })
    }
}

/// The algorithm-specific part of a tokenizer and the defaults that follow from it.
struct Algorithm {
    model: Model,
    /// Whether BOS is added when the file does not say.
    add_bos: bool,
    /// Whether BOS is added even where the file says not to (llama.cpp overrides Gemma 4's
    /// `add_bos_token = false`, its models need BOS).
    forces_bos: bool,
    /// llama.cpp's `clean_spaces`, set per pre-tokenizer name.
    clean_spaces: bool,
    /// How normal tokens' texts become bytes.
    rendering: Rendering,
}

/// How a normal token's text becomes bytes (see [`render`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Rendering {
    /// Byte-level BPE: GPT-2's chars back to bytes.
    ByteLevel,
    /// SentencePiece, Gemma 4's BPE and WordPiece: the text with `▁` read as a space.
    Spaces,
    /// The `test` tokenizer: the id in hexadecimal, whatever the token.
    Hex,
}

impl Algorithm {
    fn new(
        parts: &TokenizerParts,
        vocab: &Vocab,
        normalizer: wpm::Normalizer,
    ) -> Result<Algorithm> {
        let (pre, merges) = (parts.pre.as_deref(), &parts.merges);
        Ok(match parts.kind {
            // An absent or empty name is llama.cpp's `default` (it warns).
            TokenizerKind::Bpe => Self::bpe(
                pre.filter(|p| !p.is_empty()).unwrap_or("default"),
                vocab,
                merges,
            )?,
            TokenizerKind::Gemma4 => Self::bpe("gemma4", vocab, merges)?,
            TokenizerKind::Spm => Algorithm {
                model: Model::Spm,
                add_bos: true,
                forces_bos: false,
                clean_spaces: false,
                rendering: Rendering::Spaces,
            },
            TokenizerKind::Test => Algorithm {
                model: Model::Test,
                add_bos: false,
                forces_bos: false,
                clean_spaces: false,
                rendering: Rendering::Hex,
            },
            // llama.cpp adds [CLS] to a WordPiece text whatever the file says.
            TokenizerKind::Wpm => Algorithm {
                model: Model::Wpm(wpm::WpmModel::new(vocab, normalizer)),
                add_bos: true,
                forces_bos: true,
                clean_spaces: true,
                rendering: Rendering::Spaces,
            },
        })
    }

    /// BPE with merges under the pre-tokenizer `name`, which also settles the rest.
    fn bpe(name: &str, vocab: &Vocab, merges: &[String]) -> Result<Algorithm> {
        let pre = PreTokenizer::from_name(name)?;
        Ok(Algorithm {
            model: Model::Bpe(Box::new(bpe::BpeModel::new(vocab, merges, pre)?)),
            add_bos: pre == PreTokenizer::Llama3,
            forces_bos: pre == PreTokenizer::Gemma4,
            clean_spaces: pretokenize::cleans_spaces(name),
            rendering: if pre.escapes_whitespace() {
                Rendering::Spaces
            } else {
                Rendering::ByteLevel
            },
        })
    }
}

/// The vocabulary of `texts`, with their scores and types (0 and normal where absent). An
/// empty text becomes `[EMPTY_<id>]`, as llama.cpp names it.
fn build_vocab(
    texts: Vec<String>,
    scores: &[f32],
    token_types: &[TokenType],
    unk: Option<TokenId>,
) -> Vocab {
    let tokens: Vec<TokenData> = texts
        .into_iter()
        .enumerate()
        .map(|(i, text)| {
            let ty = token_types.get(i).copied().unwrap_or(TokenType::Normal);
            TokenData {
                text: if text.is_empty() {
                    format!("[EMPTY_{i}]")
                } else {
                    text
                },
                score: scores.get(i).copied().unwrap_or(0.0),
                ty,
                attr: TokenAttr::from(ty),
            }
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
/// tokens), longest text first.
fn special_tokens(vocab: &Vocab) -> Vec<TokenId> {
    let matched = TokenAttr::CONTROL | TokenAttr::USER_DEFINED | TokenAttr::UNKNOWN;
    let mut specials: Vec<TokenId> = (0..vocab.tokens.len() as TokenId)
        .filter(|&id| vocab.tokens[id as usize].attr.intersects(matched))
        .collect();
    // Longest first so that a special token containing another wins; ties by id keep
    // the order deterministic (llama.cpp's sort leaves it unspecified).
    specials.sort_by_key(|&id| (std::cmp::Reverse(vocab.tokens[id as usize].text.len()), id));
    specials
}

/// Splits the text fragments of `frags` at every occurrence of the special token `id`
/// (text `needle`, not empty), swallowing the whitespace its strip flags ask for.
fn split_at<'t>(
    frags: Vec<Fragment<'t>>,
    needle: &str,
    id: TokenId,
    attr: TokenAttr,
) -> Vec<Fragment<'t>> {
    // llama.cpp strips with C's isspace on bytes: ASCII whitespace only.
    let is_space = |c: char| matches!(c, ' ' | '\t' | '\n' | '\x0B' | '\x0C' | '\r');
    let mut next = Vec::with_capacity(frags.len() + 2);
    for f in frags {
        let Fragment::Text(mut rest) = f else {
            next.push(f);
            continue;
        };
        while let Some(i) = rest.find(needle) {
            let mut left = &rest[..i];
            if attr.contains(TokenAttr::LSTRIP) {
                left = left.trim_end_matches(is_space);
            }
            if !left.is_empty() {
                next.push(Fragment::Text(left));
            }
            next.push(Fragment::Token(id));
            rest = &rest[i + needle.len()..];
            if attr.contains(TokenAttr::RSTRIP) {
                rest = rest.trim_start_matches(is_space);
            }
        }
        if !rest.is_empty() {
            next.push(Fragment::Text(rest));
        }
    }
    next
}

/// What a token renders to, per llama.cpp's `token_to_piece`: control, unknown and
/// user-defined tokens their text as it is, normal ones their text decoded, byte tokens their
/// byte, anything else (undefined or unused) nothing.
fn render(rendering: Rendering, id: usize, t: &TokenData) -> Piece {
    let text = t.text.as_str();
    let a = t.attr;
    let bytes = if rendering == Rendering::Hex {
        // Whatever the token's text and type.
        format!("{id:x}").into_bytes()
    } else if a.intersects(TokenAttr::CONTROL | TokenAttr::UNKNOWN | TokenAttr::USER_DEFINED) {
        text.as_bytes().to_vec()
    } else if a.contains(TokenAttr::NORMAL) {
        match rendering {
            Rendering::ByteLevel => decode_byte_level(text),
            Rendering::Spaces => text.replace('▁', " ").into_bytes(),
            Rendering::Hex => Vec::new(),
        }
    } else if a.contains(TokenAttr::BYTE) {
        vec![byte_value(text)]
    } else {
        Vec::new()
    };
    Piece {
        bytes: bytes.into_boxed_slice(),
        special: a.is_special(),
    }
}

/// The `test` tokenizer's ids of `text` (see [`TokenizerKind::Test`]), appended to `out`.
fn test_hash_chunks(text: &str, n_vocab: usize, out: &mut Vec<TokenId>) {
    const CHUNK: usize = 5;
    let n_vocab = n_vocab.max(1) as u64;
    for chunk in text.as_bytes().chunks(CHUNK) {
        let hash = chunk
            .iter()
            .fold(0u64, |h, &b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
        // Below n_vocab, which fits a TokenId (checked when the vocabulary was built).
        out.push((hash % n_vocab) as TokenId);
    }
}

/// The byte of a byte token `<0xXX>`. llama.cpp reads the two characters after `<0x` with
/// `strtol`, so a malformed text gives the value of its leading hex digits there, or 0.
fn byte_value(text: &str) -> u8 {
    let digits = text.as_bytes().get(3..).unwrap_or_default();
    digits
        .iter()
        .take(2)
        .map_while(|&b| char::from(b).to_digit(16))
        .fold(0u8, |acc, d| acc * 16 + d as u8)
}

/// Byte-level BPE text back to raw bytes. A char outside GPT-2's table (a vocabulary that was
/// not fully byte-encoded) becomes llama.cpp's marker for it: `[UNK_BYTE_0x` and the char's
/// UTF-8 in hex, then (as llama.cpp writes it) the whole token text and `]`.
fn decode_byte_level(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        match unicode::char_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                let mut buf = [0u8; 4];
                let hex: String = c
                    .encode_utf8(&mut buf)
                    .bytes()
                    .map(|b| format!("{b:02x}"))
                    .collect();
                out.extend_from_slice(format!("[UNK_BYTE_0x{hex}{text}]").as_bytes());
            }
        }
    }
    out
}
