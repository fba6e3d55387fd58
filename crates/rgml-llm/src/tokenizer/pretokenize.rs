//! Pre-tokenizers of byte-level BPE: the splitting of raw text into words before merges, as
//! llama.cpp does it for each `tokenizer.ggml.pre` name.
//!
//! llama.cpp expresses each pre-tokenizer as a list of regexes applied in turn, each one
//! splitting every fragment the previous one left (matches and the gaps between them both
//! become fragments). The regexes are fixed per pre-tokenizer, so instead of a general regex
//! engine this module hand-writes each one as a `Stage`, the way llama.cpp's own
//! `unicode_regex_split_custom_*` functions do. That keeps lookahead (`\s+(?!\S)`) exact,
//! avoids a regex dependency, and reproduces llama.cpp's quirks (which are what the ids
//! depend on) rather than a regex engine's reading of the pattern.

use std::ops::Range;

use super::unicode::{flags, general_category, CpFlags};
use crate::error::{LlmError, Result};

/// A pre-tokenizer: which splitting rules a byte-level BPE vocabulary was trained with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PreTokenizer {
    /// llama.cpp's `default`: punctuation runs, then GPT-2's regex, then number runs, then
    /// ASCII digit triples.
    Default,
    /// GPT-2's regex `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
    /// (also gpt-2, phi-2, mpt, olmo, jais, jina-*, ...).
    Gpt2,
    /// Each number code point alone, then GPT-2's regex (smollm, starcoder, refact, command-r,
    /// codeshell, exaone, minerva-7b, mellum2).
    Starcoder,
    /// Llama 3's regex: case-insensitive contractions, an optional non-letter before letter
    /// runs, numbers in groups of up to 3, newline-aware whitespace (llama3, llama-bpe, ...).
    Llama3,
    /// Qwen 2's regex: like Llama 3's but with single-digit numbers (qwen2, stablelm2,
    /// hunyuan, ...).
    Qwen2,
    /// Qwen 3.5's regex: Qwen 2's with combining marks (`\p{M}`) in letter runs,
    /// `[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+`, and so out of the punctuation runs (qwen35).
    Qwen35,
    /// Falcon's: punctuation-and-backtick runs, GPT-2's regex, then ASCII digit triples.
    Falcon,
}

impl PreTokenizer {
    /// The pre-tokenizer for a `tokenizer.ggml.pre` value, using the names llama.cpp accepts
    /// for these splitters (plus `gpt2`, which older rgml files used for `gpt-2`). A missing
    /// value means [`PreTokenizer::Default`], as in llama.cpp; an unknown one is an error, as
    /// in llama.cpp, rather than a silent fallback, because the ids would quietly differ.
    pub fn from_name(name: &str) -> Result<PreTokenizer> {
        Ok(match name {
            "default" => PreTokenizer::Default,
            "gpt2" | "gpt-2" | "phi-2" | "mpt" | "olmo" | "jais" | "jina-es" | "jina-de"
            | "jina-v1-en" | "jina-v2-es" | "jina-v2-de" | "jina-v2-code" | "roberta-bpe"
            | "gigachat" | "trillion" | "granite-docling" | "a.x-4.0" | "mellum"
            | "modern-bert" | "exaone4" => PreTokenizer::Gpt2,
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone"
            | "minerva-7b" | "mellum2" => PreTokenizer::Starcoder,
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral"
            | "midm-2.0" | "lfm2" | "jina-v5-nano" => PreTokenizer::Llama3,
            "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "megrez" | "stablelm2"
            | "hunyuan" | "solar-open" => PreTokenizer::Qwen2,
            "qwen35" => PreTokenizer::Qwen35,
            "falcon" => PreTokenizer::Falcon,
            other => {
                return Err(LlmError::Tokenizer(format!(
                    "unsupported pre-tokenizer '{other}' (supported: default, gpt2, smollm, \
                     starcoder, refact, llama3, qwen2, qwen35, falcon and their llama.cpp \
                     aliases)"
                )))
            }
        })
    }

    /// Whether a word that is already a whole vocabulary token skips the merges (llama.cpp's
    /// `ignore_merges`, set for Llama 3).
    pub(crate) fn ignore_merges(self) -> bool {
        self == PreTokenizer::Llama3
    }

    fn stages(self) -> &'static [Stage] {
        match self {
            PreTokenizer::Default => &[
                Stage::Isolate(Class::DefaultPunct),
                Stage::Gpt2,
                Stage::Isolate(Class::NumberRun),
                Stage::AsciiDigitTriples,
            ],
            PreTokenizer::Gpt2 => &[Stage::Gpt2],
            PreTokenizer::Starcoder => &[Stage::Isolate(Class::EachNumber), Stage::Gpt2],
            PreTokenizer::Llama3 => &[Stage::Llama3(Llama3Rules {
                max_digits: 3,
                marks: false,
            })],
            PreTokenizer::Qwen2 => &[Stage::Llama3(Llama3Rules {
                max_digits: 1,
                marks: false,
            })],
            PreTokenizer::Qwen35 => &[Stage::Llama3(Llama3Rules {
                max_digits: 1,
                marks: true,
            })],
            PreTokenizer::Falcon => &[
                Stage::Isolate(Class::FalconPunct),
                Stage::Gpt2,
                Stage::AsciiDigitTriples,
            ],
        }
    }

    /// Splits `text` into words (sub-slices of `text`, in order, covering it exactly).
    pub fn split(self, text: &str) -> Vec<&str> {
        let cps: Vec<char> = text.chars().collect();
        let fl: Vec<CpFlags> = cps.iter().map(|&c| flags(c)).collect();
        let mut offsets = Vec::with_capacity(cps.len() + 1);
        offsets.extend(text.char_indices().map(|(i, _)| i));
        offsets.push(text.len());

        let mut frags: Vec<Range<usize>> = Vec::new();
        if !cps.is_empty() {
            frags.push(0..cps.len());
        }
        let mut next = Vec::with_capacity(cps.len() / 3 + 1);
        for stage in self.stages() {
            next.clear();
            for frag in &frags {
                stage.split(&cps, &fl, frag.clone(), &mut next);
            }
            std::mem::swap(&mut frags, &mut next);
        }
        frags
            .into_iter()
            .map(|r| &text[offsets[r.start]..offsets[r.end]])
            .collect()
    }
}

/// Whether llama.cpp tidies decoded text (`clean_spaces`: no space before `?!.,` and some
/// contractions) for the BPE vocabulary with pre-tokenizer `name`. It is set by name, not by
/// splitter: `qwen2` does not clean, `megrez` (the same splitter) does.
pub(crate) fn cleans_spaces(name: &str) -> bool {
    !matches!(
        name,
        "smollm"
            | "command-r"
            | "qwen2"
            | "qwen35"
            | "deepseek-r1-qwen"
            | "kormo"
            | "f2llmv2"
            | "hunyuan"
            | "solar-open"
            | "trillion"
            | "granite-docling"
    )
}

/// One regex of a pre-tokenizer, hand-written.
#[derive(Clone, Copy, Debug)]
enum Stage {
    /// GPT-2's regex, as llama.cpp's `unicode_regex_split_custom_gpt2`.
    Gpt2,
    /// Llama 3's regex family, as llama.cpp's `unicode_regex_split_custom_llama3`, `_qwen2`
    /// (single digits) and `_qwen35` (single digits, combining marks in letter runs).
    Llama3(Llama3Rules),
    /// A single character-class regex: matches and gaps each become fragments.
    Isolate(Class),
    /// `[0-9][0-9][0-9]`: leftmost non-overlapping triples of ASCII digits.
    AsciiDigitTriples,
}

/// Character classes of the simple regexes.
#[derive(Clone, Copy, Debug)]
enum Class {
    /// `\p{N}`: every number code point alone.
    EachNumber,
    /// `\p{N}+`.
    NumberRun,
    /// `[\p{P}\$\+<=>\^~\|]+`.
    DefaultPunct,
    /// ``[\p{P}\$\+<=>\^~\|`]+``.
    FalconPunct,
}

/// Punctuation as llama.cpp's collapsed-regex `\p{P}` sees it: for ASCII its fixed list
/// (which leaves out `$+<=>^`|` and backtick, they are symbols), else general category P*.
fn is_punct(c: char) -> bool {
    use unicode_general_category::GeneralCategory as Gc;
    if c.is_ascii() {
        return matches!(
            c,
            '!' | '"'
                | '#'
                | '%'..='*'
                | ','..='/'
                | ':'
                | ';'
                | '?'
                | '@'
                | '['..=']'
                | '_'
                | '{'
                | '}'
        );
    }
    // Non-ASCII whitespace collapses to a whitespace byte before the class is tested.
    !c.is_whitespace()
        && matches!(
            general_category(c),
            Gc::ConnectorPunctuation
                | Gc::DashPunctuation
                | Gc::OpenPunctuation
                | Gc::ClosePunctuation
                | Gc::InitialPunctuation
                | Gc::FinalPunctuation
                | Gc::OtherPunctuation
        )
}

impl Class {
    fn matches(self, c: char, f: CpFlags) -> bool {
        match self {
            Class::EachNumber | Class::NumberRun => f.number && !f.whitespace,
            Class::DefaultPunct => {
                is_punct(c) || matches!(c, '$' | '+' | '<' | '=' | '>' | '^' | '~' | '|')
            }
            Class::FalconPunct => {
                is_punct(c) || matches!(c, '$' | '+' | '<' | '=' | '>' | '^' | '~' | '|' | '`')
            }
        }
    }

    fn single(self) -> bool {
        matches!(self, Class::EachNumber)
    }
}

/// Pushes `prev..to` if non-empty and moves `prev` on; the `_add_token` of llama.cpp.
#[inline]
fn emit(out: &mut Vec<Range<usize>>, prev: &mut usize, to: usize) {
    if to > *prev {
        out.push(*prev..to);
    }
    *prev = to;
}

impl Stage {
    fn split(self, cps: &[char], fl: &[CpFlags], frag: Range<usize>, out: &mut Vec<Range<usize>>) {
        match self {
            Stage::Gpt2 => split_gpt2(cps, fl, frag, out),
            Stage::Llama3(rules) => split_llama3(cps, fl, frag, out, rules),
            Stage::Isolate(class) => {
                let mut prev = frag.start;
                let mut pos = frag.start;
                while pos < frag.end {
                    if class.matches(cps[pos], fl[pos]) {
                        emit(out, &mut prev, pos);
                        pos += 1;
                        if !class.single() {
                            while pos < frag.end && class.matches(cps[pos], fl[pos]) {
                                pos += 1;
                            }
                        }
                        emit(out, &mut prev, pos);
                    } else {
                        pos += 1;
                    }
                }
                emit(out, &mut prev, frag.end);
            }
            Stage::AsciiDigitTriples => {
                let mut prev = frag.start;
                let mut pos = frag.start;
                while pos < frag.end {
                    if pos + 3 <= frag.end && cps[pos..pos + 3].iter().all(char::is_ascii_digit) {
                        emit(out, &mut prev, pos);
                        pos += 3;
                        emit(out, &mut prev, pos);
                    } else {
                        pos += 1;
                    }
                }
                emit(out, &mut prev, frag.end);
            }
        }
    }
}

/// GPT-2's regex over one fragment. Positions past the fragment read as "nothing", which is
/// how `(?!\S)` at the fragment's end and `?` prefixes at its edge come out right.
fn split_gpt2(cps: &[char], fl: &[CpFlags], frag: Range<usize>, out: &mut Vec<Range<usize>>) {
    let end = frag.end;
    let get = |p: usize| if p < end { fl[p] } else { CpFlags::NONE };
    let mut prev = frag.start;
    let mut pos = frag.start;
    while pos < end {
        let c = cps[pos];
        let f = fl[pos];

        // 's|'t|'re|'ve|'m|'ll|'d, case-sensitive.
        if c == '\'' && pos + 1 < end {
            let n = cps[pos + 1];
            if matches!(n, 's' | 't' | 'm' | 'd') {
                pos += 2;
                emit(out, &mut prev, pos);
                continue;
            }
            if pos + 2 < end && matches!((n, cps[pos + 2]), ('r', 'e') | ('v', 'e') | ('l', 'l')) {
                pos += 3;
                emit(out, &mut prev, pos);
                continue;
            }
        }

        // The optional leading space of the next three alternatives.
        let f2 = if c == ' ' { get(pos + 1) } else { f };
        let skip = usize::from(c == ' ');
        // ` ?\p{L}+`
        if f2.letter {
            pos += skip;
            while get(pos).letter {
                pos += 1;
            }
            emit(out, &mut prev, pos);
            continue;
        }
        // ` ?\p{N}+`
        if f2.number {
            pos += skip;
            while get(pos).number {
                pos += 1;
            }
            emit(out, &mut prev, pos);
            continue;
        }
        // ` ?[^\s\p{L}\p{N}]+`
        if f2.is_other() {
            pos += skip;
            while get(pos).is_other() {
                pos += 1;
            }
            emit(out, &mut prev, pos);
            continue;
        }

        let mut n_ws = 0;
        while get(pos + n_ws).whitespace {
            n_ws += 1;
        }
        // `\s+(?!\S)`: a whitespace run followed by more text gives its last char to the
        // next word (so " word" keeps its space).
        if n_ws > 1 && pos + n_ws < end {
            pos += n_ws - 1;
            emit(out, &mut prev, pos);
            continue;
        }
        // `\s+`
        if n_ws > 0 {
            pos += n_ws;
            emit(out, &mut prev, pos);
            continue;
        }
        // Unreachable for a present char (each is in some class); kept as llama.cpp has it.
        pos += 1;
        emit(out, &mut prev, pos);
    }
}

/// What varies within Llama 3's regex family.
#[derive(Clone, Copy, Debug)]
struct Llama3Rules {
    /// The longest number run one word takes (`\p{N}{1,max}`).
    max_digits: usize,
    /// Whether combining marks count with letters (`[\p{L}\p{M}]` for `\p{L}`, and
    /// `[^\s\p{L}\p{M}\p{N}]` for the punctuation runs): Qwen 3.5.
    marks: bool,
}

impl Llama3Rules {
    /// Whether `f` is part of a letter run.
    #[inline]
    fn word(self, f: CpFlags) -> bool {
        f.letter || (self.marks && f.mark)
    }

    /// Whether `f` is part of a punctuation run (`[^\s\p{L}\p{N}]`, marks excluded too
    /// when they join letters).
    #[inline]
    fn other(self, f: CpFlags) -> bool {
        f.is_other() && !(self.marks && f.mark)
    }
}

/// Llama 3's regex family over one fragment:
/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
/// (with `\p{M}` beside `\p{L}` where `rules.marks`).
fn split_llama3(
    cps: &[char],
    fl: &[CpFlags],
    frag: Range<usize>,
    out: &mut Vec<Range<usize>>,
    rules: Llama3Rules,
) {
    let end = frag.end;
    let get = |p: usize| if p < end { fl[p] } else { CpFlags::NONE };
    let is_rn = |p: usize| p < end && matches!(cps[p], '\r' | '\n');
    let mut prev = frag.start;
    let mut pos = frag.start;
    while pos < end {
        let c = cps[pos];
        let f = get(pos);

        // Contractions, case-insensitive (only ASCII letters can lower-case into them).
        if c == '\'' && pos + 1 < end {
            let n = cps[pos + 1].to_ascii_lowercase();
            if matches!(n, 's' | 't' | 'm' | 'd') {
                pos += 2;
                emit(out, &mut prev, pos);
                continue;
            }
            if pos + 2 < end {
                let nn = cps[pos + 2].to_ascii_lowercase();
                if matches!((n, nn), ('r', 'e') | ('v', 'e') | ('l', 'l')) {
                    pos += 3;
                    emit(out, &mut prev, pos);
                    continue;
                }
            }
        }

        // `[^\r\n\p{L}\p{N}]?\p{L}+`
        if !(c == '\r' || c == '\n' || f.number) && (rules.word(f) || rules.word(get(pos + 1))) {
            pos += 1;
            while rules.word(get(pos)) {
                pos += 1;
            }
            emit(out, &mut prev, pos);
            continue;
        }

        // `\p{N}{1,max}`
        if f.number {
            let mut ini = pos;
            while get(pos).number {
                pos += 1;
                if pos - ini >= rules.max_digits {
                    emit(out, &mut prev, pos);
                    ini = pos;
                }
            }
            emit(out, &mut prev, pos);
            continue;
        }

        // ` ?[^\s\p{L}\p{N}]+[\r\n]*`. As in llama.cpp, the test is on the current char's
        // presence, so a space that ends the fragment is taken here, alone.
        let f2 = if c == ' ' { get(pos + 1) } else { f };
        if !(f2.whitespace || rules.word(f2) || f2.number) && f.present {
            pos += usize::from(c == ' ');
            while rules.other(get(pos)) {
                pos += 1;
            }
            while is_rn(pos) {
                pos += 1;
            }
            emit(out, &mut prev, pos);
            continue;
        }

        let mut n_ws = 0;
        let mut last_rn_end = None;
        while get(pos + n_ws).whitespace {
            if is_rn(pos + n_ws) {
                last_rn_end = Some(pos + n_ws + 1);
            }
            n_ws += 1;
        }
        // `\s*[\r\n]+`
        if let Some(e) = last_rn_end {
            pos = e;
            emit(out, &mut prev, pos);
            continue;
        }
        // `\s+(?!\S)`
        if n_ws > 1 && pos + n_ws < end {
            pos += n_ws - 1;
            emit(out, &mut prev, pos);
            continue;
        }
        // `\s+`
        if n_ws > 0 {
            pos += n_ws;
            emit(out, &mut prev, pos);
            continue;
        }
        pos += 1;
        emit(out, &mut prev, pos);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(p: PreTokenizer, s: &str) -> Vec<&str> {
        p.split(s)
    }

    #[test]
    fn gpt2_basic() {
        assert_eq!(
            split(PreTokenizer::Gpt2, "Hello, world! It's  2024\n\n ok"),
            vec!["Hello", ",", " world", "!", " It", "'s", " ", " 2024", "\n\n", " ok"]
        );
        assert_eq!(split(PreTokenizer::Gpt2, "a   "), vec!["a", "   "]);
        assert_eq!(split(PreTokenizer::Gpt2, ""), Vec::<&str>::new());
    }

    #[test]
    fn unassigned_code_points_are_other() {
        // llama.cpp flags unassigned code points UNDEFINED (non-zero), so they join
        // `[^\s\p{L}\p{N}]` runs as in a regex engine, swallowing the apostrophe here.
        assert_eq!(
            split(PreTokenizer::Gpt2, "\u{E430A}'ll"),
            vec!["\u{E430A}'", "ll"]
        );
        assert_eq!(
            split(PreTokenizer::Llama3, " \u{0378}x"),
            vec![" \u{0378}", "x"]
        );
    }

    #[test]
    fn starcoder_isolates_digits() {
        assert_eq!(
            split(PreTokenizer::Starcoder, "x 123ab"),
            vec!["x", " ", "1", "2", "3", "ab"]
        );
    }

    #[test]
    fn llama3_groups() {
        assert_eq!(
            split(PreTokenizer::Llama3, "I'M 12345 .\n\n  hi"),
            vec!["I", "'M", " ", "123", "45", " .\n\n", " ", " hi"]
        );
        assert_eq!(split(PreTokenizer::Qwen2, "12a"), vec!["1", "2", "a"]);
    }

    #[test]
    fn qwen35_keeps_combining_marks_with_letters() {
        // "e" + U+0301: Qwen 2 splits the mark off into a punctuation run, Qwen 3.5 keeps it.
        let text = "cafe\u{301} x\u{301}\u{301}! \u{301}12";
        assert_eq!(
            split(PreTokenizer::Qwen2, text),
            vec![
                "cafe",
                "\u{301}",
                " x",
                "\u{301}\u{301}!",
                " \u{301}",
                "1",
                "2"
            ]
        );
        assert_eq!(
            split(PreTokenizer::Qwen35, text),
            vec!["cafe\u{301}", " x\u{301}\u{301}", "!", " \u{301}", "1", "2"]
        );
        // A mark alone, or leading a run, starts a word as a letter would.
        assert_eq!(
            split(PreTokenizer::Qwen35, "\u{301}ab .\u{301}"),
            vec!["\u{301}ab", " .", "\u{301}"]
        );
        assert_eq!(
            PreTokenizer::from_name("qwen35").ok(),
            Some(PreTokenizer::Qwen35)
        );
        assert!(!cleans_spaces("qwen35"));
    }

    #[test]
    fn default_stages() {
        assert_eq!(
            split(PreTokenizer::Default, "a+b 12345"),
            vec!["a", "+", "b", " ", "123", "45"]
        );
    }

    #[test]
    fn clean_spaces_follows_the_name() {
        // The same splitter, cleaned or not depending on the name, as in llama.cpp.
        assert!(cleans_spaces("llama-bpe") && cleans_spaces("default"));
        assert!(!cleans_spaces("qwen2") && cleans_spaces("megrez"));
        assert!(!cleans_spaces("smollm") && cleans_spaces("starcoder"));
    }

    #[test]
    fn unknown_name_is_error() {
        assert!(PreTokenizer::from_name("nope").is_err());
        assert_eq!(
            PreTokenizer::from_name("smollm").ok(),
            Some(PreTokenizer::Starcoder)
        );
    }
}
