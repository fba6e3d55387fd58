//! WordPiece (`tokenizer.ggml.model = bert`), as llama.cpp's `llm_tokenizer_wpm`: BERT's
//! normaliser (accents stripped through the first code point of each character's NFD
//! decomposition, lower case), words split at whitespace and around punctuation, ASCII symbols
//! and CJK ideographs, then each word matched greedily, longest token first, with a phantom
//! `▁` before it. A word that cannot be matched whole becomes the unknown token.
//!
//! The vocabulary's texts are llama.cpp's conversion of BERT's: a word-initial piece carries
//! `▁`, a continuation (`##ing` in BERT's files) carries nothing.

use unicode_general_category::GeneralCategory as Gc;

use super::unicode::general_category;
use super::{TokenId, Vocab};

/// BERT's normaliser options (`tokenizer.ggml.normalizer.*`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Normalizer {
    /// Lower-case every character.
    pub lowercase: bool,
    /// Reduce each character to the first code point of its NFD form and drop marks.
    pub strip_accents: bool,
}

/// The WordPiece model: the normaliser and the longest token's length in bytes.
#[derive(Clone, Debug)]
pub(crate) struct WpmModel {
    normalizer: Normalizer,
    max_token_len: usize,
}

impl WpmModel {
    pub(crate) fn new(vocab: &Vocab, normalizer: Normalizer) -> WpmModel {
        let max_token_len = vocab.tokens.iter().map(|t| t.text.len()).max();
        WpmModel {
            normalizer,
            max_token_len: max_token_len.unwrap_or(0),
        }
    }

    /// Appends the ids of `text` (no special tokens) to `out`.
    pub(crate) fn encode(&self, vocab: &Vocab, text: &str, out: &mut Vec<TokenId>) {
        let mut word = String::new();
        for w in words(text, self.normalizer) {
            word.clear();
            word.push('▁');
            word.push_str(&w);
            let start = out.len();
            if !self.match_word(vocab, &word, out) {
                out.truncate(start);
            }
            if out.len() == start {
                out.extend(vocab.unk);
            }
        }
    }

    /// The longest tokens that make up `word`, left to right, appended to `out`; false (with
    /// some appended) where a position matches no token. As llama.cpp, candidate lengths are
    /// byte lengths: a cut inside a character matches nothing, the texts being valid UTF-8.
    fn match_word(&self, vocab: &Vocab, word: &str, out: &mut Vec<TokenId>) -> bool {
        let n = word.len();
        let mut i = 0;
        while i < n {
            let longest = n.min(i + self.max_token_len + 1);
            let found = (i + 1..=longest).rev().find_map(|j| {
                word.get(i..j)
                    .and_then(|piece| vocab.token_to_id.get(piece))
                    .map(|&id| (j, id))
            });
            match found {
                Some((j, id)) => {
                    out.push(id);
                    i = j;
                }
                None => return false,
            }
        }
        true
    }
}

/// The normalised words of `text` (llama.cpp's `preprocess`): whitespace ends a word; NUL,
/// U+FFFD and control characters are dropped (and marks, when accents are stripped);
/// punctuation, ASCII symbols and CJK ideographs are words of their own.
fn words(text: &str, normalizer: Normalizer) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    for c in text.chars() {
        let c = match normalizer.strip_accents {
            true => nfd_first(c),
            false => c,
        };
        if c.is_whitespace() {
            flush(&mut word, &mut words);
            continue;
        }
        let cat = general_category(c);
        let control = matches!(
            cat,
            Gc::Control | Gc::Format | Gc::PrivateUse | Gc::Surrogate
        );
        let mark = matches!(
            cat,
            Gc::NonspacingMark | Gc::SpacingMark | Gc::EnclosingMark
        );
        if c == '\0' || c == '\u{FFFD}' || control || (normalizer.strip_accents && mark) {
            continue;
        }
        let alone = is_punctuation(cat) || (c < '\x7F' && is_symbol(cat)) || is_chinese(c);
        let c = match normalizer.lowercase {
            true => lowercase(c),
            false => c,
        };
        if alone {
            flush(&mut word, &mut words);
            words.push(c.to_string());
        } else {
            word.push(c);
        }
    }
    flush(&mut word, &mut words);
    words
}

/// Ends the word being read, if it has begun.
fn flush(word: &mut String, words: &mut Vec<String>) {
    if !word.is_empty() {
        words.push(std::mem::take(word));
    }
}

/// The first code point of `c`'s canonical decomposition (llama.cpp's NFD table, which maps
/// each character to one code point: the base letter of an accented one).
fn nfd_first(c: char) -> char {
    let mut first = None;
    unicode_normalization::char::decompose_canonical(c, |d| {
        first.get_or_insert(d);
    });
    first.unwrap_or(c)
}

/// Unicode's simple lower-case mapping (llama.cpp's table): one code point, the first of the
/// full mapping (they differ only for U+0130, whose simple mapping is `i`).
fn lowercase(c: char) -> char {
    c.to_lowercase().next().unwrap_or(c)
}

fn is_punctuation(cat: Gc) -> bool {
    matches!(
        cat,
        Gc::ConnectorPunctuation
            | Gc::DashPunctuation
            | Gc::ClosePunctuation
            | Gc::FinalPunctuation
            | Gc::InitialPunctuation
            | Gc::OtherPunctuation
            | Gc::OpenPunctuation
    )
}

fn is_symbol(cat: Gc) -> bool {
    matches!(
        cat,
        Gc::CurrencySymbol | Gc::ModifierSymbol | Gc::MathSymbol | Gc::OtherSymbol
    )
}

/// CJK ideographs, as BERT's (and llama.cpp's) `is_chinese_char` lists them.
fn is_chinese(c: char) -> bool {
    matches!(
        c as u32,
        0x4E00..=0x9FFF
            | 0x3400..=0x4DBF
            | 0x20000..=0x2A6DF
            | 0x2A700..=0x2B73F
            | 0x2B740..=0x2B81F
            // 0x2B820 in Unicode; BERT's code (and so llama.cpp's) says 0x2B920.
            | 0x2B920..=0x2CEAF
            | 0xF900..=0xFAFF
            | 0x2F800..=0x2FA1F
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const BERT: Normalizer = Normalizer {
        lowercase: true,
        strip_accents: true,
    };

    #[test]
    fn words_split_at_spaces_and_around_punctuation_and_ideographs() {
        assert_eq!(
            words("  Héllo, WORLD!\tca$h 日本 x\u{0}y\u{200B}", BERT),
            ["hello", ",", "world", "!", "ca", "$", "h", "日", "本", "xy"]
        );
        // Without the normaliser the case and accents stay.
        assert_eq!(words("Héllo", Normalizer::default()), ["Héllo".to_string()]);
    }
}
