//! Token attributes as llama.cpp derives them when it loads a vocabulary (`llama_token_attr`):
//! the GGUF token type as a flag, then the corrections llama.cpp makes by token text and model
//! name, because converted files often mark end-of-turn or fill-in-the-middle tokens as normal
//! text. The attributes decide which tokens are matched in raw text before tokenizing (and
//! whether only when special tokens are parsed), how a token renders, what whitespace a special
//! token swallows, and which tokens end generation.
//!
//! This module owns those rules and the token texts they name; it tokenizes nothing. Where
//! llama.cpp picks one token among several candidates by iterating its hash map (EOT, EOM and
//! fill-in-the-middle ids found by text), this module takes the first candidate of llama.cpp's
//! list that the vocabulary has, which is the same token whenever there is only one.

use std::collections::BTreeSet;
use std::fmt;
use std::ops::BitOr;

use super::{TokenId, TokenType, Vocab};

/// A set of llama.cpp's token attribute flags (`llama_token_attr`, same bit values).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct TokenAttr(u16);

impl TokenAttr {
    /// No flag: a token of undefined type, which renders as nothing.
    pub const UNDEFINED: TokenAttr = TokenAttr(0);
    /// The unknown token.
    pub const UNKNOWN: TokenAttr = TokenAttr(1);
    /// An unused slot.
    pub const UNUSED: TokenAttr = TokenAttr(2);
    /// Ordinary text.
    pub const NORMAL: TokenAttr = TokenAttr(4);
    /// A control token: matched in text and rendered only when special tokens are asked for.
    pub const CONTROL: TokenAttr = TokenAttr(8);
    /// A user-defined token: always matched in text before tokenizing, always rendered.
    pub const USER_DEFINED: TokenAttr = TokenAttr(16);
    /// A byte-fallback token `<0xXX>`.
    pub const BYTE: TokenAttr = TokenAttr(32);
    /// Normalized (unused by llama.cpp's tokenizers).
    pub const NORMALIZED: TokenAttr = TokenAttr(64);
    /// Matching the token in text swallows the whitespace before it.
    pub const LSTRIP: TokenAttr = TokenAttr(128);
    /// Matching the token in text swallows the whitespace after it.
    pub const RSTRIP: TokenAttr = TokenAttr(256);
    /// Single word (unused by llama.cpp's tokenizers).
    pub const SINGLE_WORD: TokenAttr = TokenAttr(512);

    const NAMES: [(TokenAttr, &'static str); 10] = [
        (TokenAttr::UNKNOWN, "UNKNOWN"),
        (TokenAttr::UNUSED, "UNUSED"),
        (TokenAttr::NORMAL, "NORMAL"),
        (TokenAttr::CONTROL, "CONTROL"),
        (TokenAttr::USER_DEFINED, "USER_DEFINED"),
        (TokenAttr::BYTE, "BYTE"),
        (TokenAttr::NORMALIZED, "NORMALIZED"),
        (TokenAttr::LSTRIP, "LSTRIP"),
        (TokenAttr::RSTRIP, "RSTRIP"),
        (TokenAttr::SINGLE_WORD, "SINGLE_WORD"),
    ];

    /// The flags as llama.cpp's integer value.
    pub const fn bits(self) -> u16 {
        self.0
    }

    /// Whether every flag of `other` is set.
    pub const fn contains(self, other: TokenAttr) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether any flag of `other` is set.
    pub const fn intersects(self, other: TokenAttr) -> bool {
        self.0 & other.0 != 0
    }

    /// Rendered only when special tokens are asked for (control and unknown tokens).
    pub(crate) const fn is_special(self) -> bool {
        self.intersects(TokenAttr(TokenAttr::CONTROL.0 | TokenAttr::UNKNOWN.0))
    }

    fn set(&mut self, other: TokenAttr, on: bool) {
        if on {
            self.0 |= other.0;
        } else {
            self.0 &= !other.0;
        }
    }
}

impl BitOr for TokenAttr {
    type Output = TokenAttr;
    fn bitor(self, o: TokenAttr) -> TokenAttr {
        TokenAttr(self.0 | o.0)
    }
}

impl From<TokenType> for TokenAttr {
    fn from(t: TokenType) -> TokenAttr {
        match t {
            TokenType::Undefined => TokenAttr::UNDEFINED,
            TokenType::Normal => TokenAttr::NORMAL,
            TokenType::Unknown => TokenAttr::UNKNOWN,
            TokenType::Control => TokenAttr::CONTROL,
            TokenType::UserDefined => TokenAttr::USER_DEFINED,
            TokenType::Unused => TokenAttr::UNUSED,
            TokenType::Byte => TokenAttr::BYTE,
        }
    }
}

impl fmt::Debug for TokenAttr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = TokenAttr::NAMES
            .iter()
            .filter(|(a, _)| self.contains(*a))
            .map(|(_, n)| *n)
            .collect();
        if names.is_empty() {
            write!(f, "TokenAttr(UNDEFINED)")
        } else {
            write!(f, "TokenAttr({})", names.join(" | "))
        }
    }
}

/// Fill-in-the-middle token ids (prefix, suffix, middle, padding, repository, file separator).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FimIds {
    /// Prefix (`<|fim_prefix|>`, `<PRE>`, ...).
    pub pre: Option<TokenId>,
    /// Suffix.
    pub suf: Option<TokenId>,
    /// Middle.
    pub mid: Option<TokenId>,
    /// Padding; ends generation.
    pub pad: Option<TokenId>,
    /// Repository name; ends generation.
    pub rep: Option<TokenId>,
    /// File separator; ends generation.
    pub sep: Option<TokenId>,
}

/// Texts llama.cpp recognises as end-of-generation tokens whatever their type; each such
/// token becomes a control token.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// Candidate texts of the end-of-turn token, when the file names none.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];

const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];

/// gpt-oss markers llama.cpp always renders (it makes them user-defined).
const ALWAYS_RENDERED: &[&str] = &["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"];

/// The special ids a vocabulary names or llama.cpp finds by text.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct NamedIds {
    pub eos: Option<TokenId>,
    pub eot: Option<TokenId>,
    pub eom: Option<TokenId>,
    pub fim: FimIds,
}

/// What [`derive`] finds besides the attributes.
pub(crate) struct Derived {
    /// EOT, EOM and FIM ids, the given ones or those found by text.
    pub named: NamedIds,
    /// End-of-generation ids, sorted.
    pub eog: Vec<TokenId>,
}

impl Vocab {
    fn id_of(&self, text: &str) -> Option<TokenId> {
        self.token_to_id.get(text).copied()
    }

    fn add_attr(&mut self, id: TokenId, a: TokenAttr) {
        if let Some(t) = self.tokens.get_mut(id as usize) {
            t.attr.set(a, true);
        }
    }

    fn set_attr(&mut self, id: TokenId, a: TokenAttr) {
        if let Some(t) = self.tokens.get_mut(id as usize) {
            t.attr = a;
        }
    }

    /// `given`, else the first of `texts` the vocabulary has, made a control token as llama.cpp
    /// makes the token it finds.
    fn find_by_text(&mut self, given: Option<TokenId>, texts: &[&str]) -> Option<TokenId> {
        if given.is_some() {
            return given;
        }
        let id = texts.iter().find_map(|t| self.id_of(t))?;
        self.add_attr(id, TokenAttr::CONTROL);
        Some(id)
    }
}

/// Applies llama.cpp's load-time corrections to `vocab`'s attributes, in llama.cpp's order,
/// and returns the special ids found by text and the end-of-generation set.
pub(crate) fn derive(vocab: &mut Vocab, given: NamedIds) -> Derived {
    let named = find_named(vocab, given);
    mark_unused(vocab);
    let mut eog = BTreeSet::new();
    eog.extend(
        [named.fim.pad, named.fim.rep, named.fim.sep]
            .into_iter()
            .flatten(),
    );
    for text in EOG_TEXTS {
        if let Some(id) = vocab.id_of(text) {
            eog.insert(id);
            vocab.add_attr(id, TokenAttr::CONTROL);
        }
    }
    for text in ALWAYS_RENDERED {
        if let Some(id) = vocab.id_of(text) {
            vocab.set_attr(id, TokenAttr::USER_DEFINED);
        }
    }
    eog.extend([named.eos, named.eot, named.eom].into_iter().flatten());
    drop_end_for_harmony(vocab, &mut eog);
    drop_normal_end_of_sentence(vocab, &mut eog);
    Derived {
        named,
        eog: eog.into_iter().collect(),
    }
}

fn find_named(vocab: &mut Vocab, given: NamedIds) -> NamedIds {
    let g = given.fim;
    NamedIds {
        eos: given.eos,
        eot: vocab.find_by_text(given.eot, EOT_TEXTS),
        eom: vocab.find_by_text(given.eom, &["<|eom_id|>"]),
        fim: FimIds {
            pre: vocab.find_by_text(g.pre, FIM_PRE_TEXTS),
            suf: vocab.find_by_text(g.suf, FIM_SUF_TEXTS),
            mid: vocab.find_by_text(g.mid, FIM_MID_TEXTS),
            pad: vocab.find_by_text(g.pad, FIM_PAD_TEXTS),
            rep: vocab.find_by_text(g.rep, FIM_REP_TEXTS),
            sep: vocab.find_by_text(g.sep, FIM_SEP_TEXTS),
        },
    }
}

/// Control tokens whose text says "unused" are unused slots. Like llama.cpp, which walks its
/// text-to-id map, only the id a text maps to is considered.
fn mark_unused(vocab: &mut Vocab) {
    let ids: Vec<TokenId> = (0..vocab.tokens.len() as TokenId)
        .filter(|&id| {
            let t = &vocab.tokens[id as usize];
            t.attr.contains(TokenAttr::CONTROL)
                && t.text.contains("unused")
                && vocab.id_of(&t.text) == Some(id)
        })
        .collect();
    for id in ids {
        vocab.add_attr(id, TokenAttr::UNUSED);
    }
}

fn eog_text(vocab: &Vocab, eog: &BTreeSet<TokenId>, text: &str) -> Option<TokenId> {
    eog.iter().copied().find(|&id| {
        vocab
            .tokens
            .get(id as usize)
            .is_some_and(|t| t.text == text)
    })
}

/// gpt-oss (and solar-open): `<|end|>` ends a message, not generation, when `<|return|>` and
/// `<|call|>` (or `<|calls|>` and `<|flush|>`) are end-of-generation tokens.
fn drop_end_for_harmony(vocab: &mut Vocab, eog: &mut BTreeSet<TokenId>) {
    let has = |t: &str| eog_text(vocab, eog, t).is_some();
    let has_call = has("<|call|>") || has("<|calls|>");
    let harmony = has_call && (has("<|return|>") || has("<|flush|>"));
    if let Some(end) = eog_text(vocab, eog, "<|end|>").filter(|_| harmony) {
        eog.remove(&end);
        vocab.set_attr(end, TokenAttr::USER_DEFINED);
    }
}

/// Gemma 4 and PLaMo-2 have an ordinary `</s>`, recognised by their own end markers.
fn drop_normal_end_of_sentence(vocab: &mut Vocab, eog: &mut BTreeSet<TokenId>) {
    let marker = ["<|tool_response>", "<|plamo:eos|>"]
        .iter()
        .any(|t| eog_text(vocab, eog, t).is_some());
    if let Some(s) = eog_text(vocab, eog, "</s>").filter(|_| marker) {
        eog.remove(&s);
        vocab.set_attr(s, TokenAttr::NORMAL);
    }
}

/// The names llama.cpp sets per-token strip flags by.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ModelNames<'a> {
    /// `general.name`.
    pub name: Option<&'a str>,
    /// `general.architecture`.
    pub architecture: Option<&'a str>,
    /// `tokenizer.ggml.pre`.
    pub pre: Option<&'a str>,
}

/// llama.cpp's per-model whitespace stripping around special tokens (`specials`: the tokens
/// matched in raw text). Phi-3's special tokens swallow the whitespace after them; some BERT
/// variants' mask token swallows the whitespace before it.
pub(crate) fn apply_strip_rules(vocab: &mut Vocab, specials: &[TokenId], names: ModelNames<'_>) {
    let has =
        |s: Option<&str>, subs: &[&str]| s.is_some_and(|s| subs.iter().any(|x| s.contains(x)));
    let name = names.name.map(str::to_ascii_lowercase);
    let name = name.as_deref();
    let lstrip = |vocab: &mut Vocab, text: &str| {
        if let Some(id) = vocab.id_of(text) {
            vocab.add_attr(id, TokenAttr::LSTRIP);
        }
    };
    if has(names.pre, &["jina-v2-de", "jina-v2-es", "jina-v2-code"])
        || has(names.architecture, &["nomic-bert-moe", "jina-bert-v3"])
    {
        lstrip(vocab, "<mask>");
    } else if has(name, &["phi-3", "phi3"]) {
        for &id in specials {
            vocab.add_attr(id, TokenAttr::RSTRIP);
        }
        for (text, on) in [
            ("</s>", true),
            ("<unk>", false),
            ("<s>", false),
            ("<|endoftext|>", false),
        ] {
            if let Some(id) = vocab.id_of(text) {
                if let Some(t) = vocab.tokens.get_mut(id as usize) {
                    t.attr.set(TokenAttr::RSTRIP, on);
                }
            }
        }
    } else if has(name, &["modern-bert"]) {
        lstrip(vocab, "[MASK]");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::{EncodeOptions, Tokenizer, TokenizerKind, TokenizerParts};

    /// A SentencePiece tokenizer over `tokens` (no scores, so no merges matter).
    fn spm(tokens: &[(&str, TokenType)], name: Option<&str>) -> Tokenizer {
        let parts = TokenizerParts {
            kind: TokenizerKind::Spm,
            tokens: tokens.iter().map(|(t, _)| (*t).to_owned()).collect(),
            token_types: tokens.iter().map(|(_, ty)| *ty).collect(),
            name: name.map(str::to_owned),
            ..TokenizerParts::default()
        };
        match Tokenizer::from_parts(parts) {
            Ok(t) => t,
            Err(e) => panic!("{e}"),
        }
    }

    const PARSE: EncodeOptions = EncodeOptions {
        add_special: false,
        parse_special: true,
    };

    fn vocab() -> Vec<(&'static str, TokenType)> {
        vec![
            ("<unk>", TokenType::Unknown),      // 0
            ("<s>", TokenType::Control),        // 1
            ("</s>", TokenType::UserDefined),   // 2
            ("<|end|>", TokenType::Control),    // 3
            ("▁", TokenType::Normal),           // 4
            ("a", TokenType::Normal),           // 5
            ("<0x0A>", TokenType::Byte),        // 6
            ("<unused0>", TokenType::Control),  // 7
            ("", TokenType::Normal),            // 8
            ("odd", TokenType::Undefined),      // 9
            ("<|return|>", TokenType::Control), // 10
            ("<|call|>", TokenType::Control),   // 11
        ]
    }

    #[test]
    fn end_of_generation_texts_become_control() {
        let tok = spm(&vocab(), None);
        // `</s>` is user-defined in the file but an end-of-generation text: llama.cpp makes it
        // control too, so it is matched only when parsing specials and renders only on demand.
        assert_eq!(
            tok.token_attr(2),
            Some(TokenAttr::USER_DEFINED | TokenAttr::CONTROL)
        );
        assert!(tok.is_eog(2));
        assert_eq!(tok.encode("</s>", PARSE), vec![2]);
        assert!(!tok.encode("</s>", EncodeOptions::default()).contains(&2));
        assert_eq!(tok.decode(&[5, 2, 5], false).ok().as_deref(), Some("aa"));
        assert_eq!(tok.decode(&[5, 2, 5], true).ok().as_deref(), Some("a</s>a"));
    }

    #[test]
    fn harmony_end_is_no_end_of_generation() {
        let tok = spm(&vocab(), None);
        // With <|return|> and <|call|> present, <|end|> ends a message only (gpt-oss).
        assert!(tok.is_eog(10) && tok.is_eog(11) && !tok.is_eog(3));
        assert_eq!(tok.token_attr(3), Some(TokenAttr::USER_DEFINED));
        let mut v = vocab();
        v.truncate(10);
        let tok = spm(&v, None);
        assert!(tok.is_eog(3));
        assert_eq!(tok.eot(), Some(3));
    }

    #[test]
    fn unused_empty_and_undefined_tokens() {
        let tok = spm(&vocab(), None);
        assert_eq!(
            tok.token_attr(7),
            Some(TokenAttr::CONTROL | TokenAttr::UNUSED)
        );
        assert_eq!(tok.token_text(8), Some("[EMPTY_8]"));
        // An undefined type renders as nothing, special or not.
        assert_eq!(tok.token_to_piece(9, true).ok(), Some(&[][..]));
        assert_eq!(tok.token_to_piece(6, false).ok(), Some(&b"\n"[..]));
    }

    #[test]
    fn phi3_special_tokens_swallow_following_whitespace() {
        let plain = spm(&vocab(), None);
        let phi3 = spm(&vocab(), Some("Phi3"));
        let text = "<|end|>\n a<s> a";
        // Without the rule the newline and spaces stay (each after a special gets "▁").
        assert_eq!(plain.encode(text, PARSE), vec![3, 4, 6, 4, 5, 1, 4, 4, 5]);
        // Phi-3: whitespace after <|end|> goes; <s> keeps it (llama.cpp exempts it).
        assert_eq!(phi3.encode(text, PARSE), vec![3, 4, 5, 1, 4, 4, 5]);
        assert!(phi3
            .token_attr(3)
            .is_some_and(|a| a.contains(TokenAttr::RSTRIP)));
        assert!(phi3
            .token_attr(1)
            .is_some_and(|a| !a.contains(TokenAttr::RSTRIP)));
        assert!(phi3
            .token_attr(2)
            .is_some_and(|a| a.contains(TokenAttr::RSTRIP)));
    }

    #[test]
    fn flags_and_debug() {
        let a = TokenAttr::CONTROL | TokenAttr::UNUSED;
        assert_eq!(a.bits(), 10);
        assert!(a.contains(TokenAttr::CONTROL) && !a.contains(TokenAttr::NORMAL));
        assert!(a.is_special() && !TokenAttr::USER_DEFINED.is_special());
        assert_eq!(format!("{a:?}"), "TokenAttr(UNUSED | CONTROL)");
        assert_eq!(
            format!("{:?}", TokenAttr::UNDEFINED),
            "TokenAttr(UNDEFINED)"
        );
        assert_eq!(TokenAttr::from(TokenType::Byte), TokenAttr::BYTE);
    }
}
