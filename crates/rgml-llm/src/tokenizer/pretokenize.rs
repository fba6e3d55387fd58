//! Pre-tokenizers of byte-level BPE: the splitting of raw text into words before merges, as
//! llama.cpp does it for each `tokenizer.ggml.pre` name.
//!
//! llama.cpp expresses each pre-tokenizer as a list of regexes applied in turn, each one
//! splitting every fragment the previous one left (matches and the gaps between them both
//! become fragments). The regexes are fixed per pre-tokenizer, so instead of a general regex
//! engine this module hand-writes each one as a `Stage`, the way llama.cpp's own
//! `unicode_regex_split_custom_*` functions do. That keeps lookahead (`\s+(?!\S)`) exact,
//! avoids a regex dependency, and reproduces llama.cpp's quirks (which are what the ids
//! depend on) rather than a regex engine's reading of the pattern. Where llama.cpp has no
//! custom function (GPT-4o's regex) it runs `std::regex` over a copy of the text with each
//! non-ASCII code point collapsed to one byte per category; the stage then follows that
//! engine's backtracking reading of llama.cpp's rewritten pattern on those categories.

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
    /// GPT-4o's regex (gpt-4o, llama4, kanana2, talkie, minimax-m2): letter runs split at
    /// case changes that keep a trailing contraction (`CamelCase` → `Camel` `Case`, `don't`
    /// whole), numbers in groups of up to 3, punctuation runs that take trailing newlines
    /// and slashes, newline-aware whitespace. As llama.cpp runs it, every non-ASCII letter
    /// counts as both upper- and lower-case and combining marks are not letters.
    Gpt4o,
    /// Gemma 4's (gemma4, granite-embed-multi-311m): runs of non-newlines and runs of
    /// newlines (`[^\n]+|[\n]+`), over raw UTF-8 with spaces written `▁`, SentencePiece
    /// style. The merges then run over whole lines; the split only keeps newlines, which
    /// llama.cpp's merge lookup rejects, out of merged pieces.
    Gemma4,
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
            "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => PreTokenizer::Gpt4o,
            "gemma4" | "granite-embed-multi-311m" => PreTokenizer::Gemma4,
            other => {
                return Err(LlmError::Tokenizer(format!(
                    "unsupported pre-tokenizer '{other}' (supported: default, gpt2, smollm, \
                     starcoder, refact, llama3, qwen2, qwen35, falcon, gpt-4o, gemma4 and \
                     their llama.cpp aliases)"
                )))
            }
        })
    }

    /// Whether a word that is already a whole vocabulary token skips the merges (llama.cpp's
    /// `ignore_merges`, set for Llama 3).
    pub(crate) fn ignore_merges(self) -> bool {
        self == PreTokenizer::Llama3
    }

    /// Whether words are byte-encoded to GPT-2's printable chars before merging (llama.cpp's
    /// `byte_encode`); Gemma 4's vocabulary holds raw UTF-8 instead.
    pub(crate) fn byte_encode(self) -> bool {
        self != PreTokenizer::Gemma4
    }

    /// Whether spaces are written `▁` before tokenizing and read back as spaces when
    /// decoding (llama.cpp's `escape_whitespaces`, set with Gemma 4's pre-tokenizer).
    pub(crate) fn escapes_whitespace(self) -> bool {
        self == PreTokenizer::Gemma4
    }

    /// Whether a word made only of newlines is one token when the vocabulary has it, merges
    /// or not (llama.cpp's fix for Gemma 4, whose merges do not build every newline run).
    pub(crate) fn whole_newline_runs(self) -> bool {
        self == PreTokenizer::Gemma4
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
            PreTokenizer::Gpt4o => &[Stage::Gpt4o],
            PreTokenizer::Gemma4 => &[Stage::NewlineRuns],
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
            | "gpt-4o"
            | "llama4"
            | "kanana2"
            | "talkie"
            | "minimax-m2"
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
    /// GPT-4o's regex, which llama.cpp runs through `std::regex` (see [`split_gpt4o`]).
    Gpt4o,
    /// A single character-class regex: matches and gaps each become fragments.
    Isolate(Class),
    /// `[0-9][0-9][0-9]`: leftmost non-overlapping triples of ASCII digits.
    AsciiDigitTriples,
    /// `[^\n]+|[\n]+`: the fragment cut wherever newline and non-newline meet.
    NewlineRuns,
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
            Stage::Gpt4o => split_gpt4o(cps, fl, frag, out),
            Stage::NewlineRuns => split_newline_runs(cps, frag, out),
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

        // `\s+(?!\S)|\s+`; the `+ 1` is unreachable for a present char (each is in some
        // class), kept as llama.cpp has it.
        pos = if f.whitespace {
            spaces_end(fl, pos, end)
        } else {
            pos + 1
        };
        emit(out, &mut prev, pos);
    }
}

/// The first position from `pos` (at most `end`) where `pred` fails: the end of a run.
#[inline]
fn run_end(pos: usize, end: usize, pred: impl Fn(usize) -> bool) -> usize {
    (pos..end).find(|&p| !pred(p)).unwrap_or(end)
}

/// The length of `'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]` (llama.cpp's
/// spelling of `(?i:'s|'t|'re|'ve|'m|'ll|'d)`) at `pos`, 0 where none starts there. Only
/// ASCII letters match, as in the regex.
fn contraction_len(cps: &[char], pos: usize, end: usize) -> usize {
    if pos + 1 >= end || cps[pos] != '\'' {
        return 0;
    }
    let n = cps[pos + 1].to_ascii_lowercase();
    if matches!(n, 's' | 't' | 'm' | 'd') {
        return 2;
    }
    if pos + 2 >= end {
        return 0;
    }
    match (n, cps[pos + 2].to_ascii_lowercase()) {
        ('r', 'e') | ('v', 'e') | ('l', 'l') => 3,
        _ => 0,
    }
}

/// The end of `\p{N}{1,max}` at `pos`, a number code point.
fn number_end(fl: &[CpFlags], pos: usize, end: usize, max: usize) -> usize {
    run_end(pos, end.min(pos + max), |p| fl[p].number)
}

/// The end of ` ?[^\s\p{L}\p{N}]+` followed by a run of `tail` code points at `pos`, or
/// `None` where it does not match; `other` tests the punctuation class of a position
/// before the fragment's end.
fn punct_end(
    cps: &[char],
    pos: usize,
    end: usize,
    other: impl Fn(usize) -> bool,
    tail: impl Fn(char) -> bool,
) -> Option<usize> {
    let start = pos + usize::from(cps[pos] == ' ' && pos + 1 < end && other(pos + 1));
    if !other(start) {
        return None;
    }
    let run = run_end(start, end, &other);
    Some(run_end(run, end, |p| tail(cps[p])))
}

/// The end of `\s+(?!\S)|\s+` at `pos`, a whitespace code point: a run followed by more
/// text gives its last code point to the next word (so " word" keeps its space).
fn spaces_end(fl: &[CpFlags], pos: usize, end: usize) -> usize {
    let run = run_end(pos, end, |p| fl[p].whitespace);
    if run - pos > 1 && run < end {
        run - 1
    } else {
        run
    }
}

/// The end of `\s*[\r\n]+|\s+(?!\S)|\s+` at `pos`, a whitespace code point: through the
/// run's last newline where it has one, else as [`spaces_end`].
fn whitespace_end(cps: &[char], fl: &[CpFlags], pos: usize, end: usize) -> usize {
    let run = run_end(pos, end, |p| fl[p].whitespace);
    match (pos..run).rev().find(|&p| matches!(cps[p], '\r' | '\n')) {
        Some(newline) => newline + 1,
        None => spaces_end(fl, pos, end),
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
    let mut prev = frag.start;
    let mut pos = frag.start;
    while pos < end {
        pos = llama3_word_end(cps, fl, pos, end, rules);
        emit(out, &mut prev, pos);
    }
}

/// The end of the word of Llama 3's regex family that starts at `pos`.
fn llama3_word_end(cps: &[char], fl: &[CpFlags], pos: usize, end: usize, r: Llama3Rules) -> usize {
    let (c, f) = (cps[pos], fl[pos]);
    let contraction = contraction_len(cps, pos, end);
    if contraction > 0 {
        return pos + contraction;
    }
    // `[^\r\n\p{L}\p{N}]?\p{L}+`
    let next_is_word = pos + 1 < end && r.word(fl[pos + 1]);
    if !(c == '\r' || c == '\n' || f.number) && (r.word(f) || next_is_word) {
        return run_end(pos + 1, end, |p| r.word(fl[p]));
    }
    if f.number {
        return number_end(fl, pos, end, r.max_digits);
    }
    // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
    let other = |p: usize| r.other(fl[p]);
    if let Some(e) = punct_end(cps, pos, end, other, |c| matches!(c, '\r' | '\n')) {
        return e;
    }
    if f.whitespace {
        return whitespace_end(cps, fl, pos, end);
    }
    // Unreachable for a present char, as in llama.cpp.
    pos + 1
}

/// GPT-4o's regex over one fragment, as llama.cpp runs it. The regex of its tokenizer.json,
/// `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`,
/// is rewritten there with `(?=[\p{L}])([^a-z])` for the upper-case class and
/// `(?=[\p{L}])([^A-Z])` for the lower-case one, and `std::regex` runs it over the text with
/// every non-ASCII code point collapsed to one byte per category. So the ids depend on
/// that reading, not the textbook one: a non-ASCII letter is in both case classes (`CAFÉS`
/// gives `CAFÉ` `S`, `aÉb` stays whole), and combining marks, left out of the rewrite, are
/// punctuation. Each word is the regex's leftmost-first (backtracking) match.
fn split_gpt4o(cps: &[char], fl: &[CpFlags], frag: Range<usize>, out: &mut Vec<Range<usize>>) {
    let end = frag.end;
    let mut prev = frag.start;
    let mut pos = frag.start;
    while pos < end {
        pos = gpt4o_word_end(cps, fl, pos, end);
        emit(out, &mut prev, pos);
    }
}

/// The end of GPT-4o's word that starts at `pos`, trying the regex's alternatives in order.
fn gpt4o_word_end(cps: &[char], fl: &[CpFlags], pos: usize, end: usize) -> usize {
    let (c, f) = (cps[pos], fl[pos]);
    // `[^\r\n\p{L}\p{N}]?`: taken whenever it matches, since without it the letters would
    // have to start on this non-letter.
    let prefix = !(f.letter || f.number || c == '\r' || c == '\n');
    if let Some(e) = cased_run_end(cps, fl, pos + usize::from(prefix), end) {
        return e + contraction_len(cps, e, end);
    }
    if f.number {
        return number_end(fl, pos, end, 3);
    }
    // ` ?[^\s\p{L}\p{N}]+[\r\n/]*`
    let other = |p: usize| fl[p].is_other();
    if let Some(e) = punct_end(cps, pos, end, other, |c| matches!(c, '\r' | '\n' | '/')) {
        return e;
    }
    if f.whitespace {
        return whitespace_end(cps, fl, pos, end);
    }
    // Unreachable for a present char: each is in some class.
    pos + 1
}

/// The end of GPT-4o's letters at `q`, `U*L+` or else `U+L*` (`U`: a letter but not ASCII
/// lower-case, `L`: a letter but not ASCII upper-case), or `None` where neither matches.
/// As a backtracking engine does, the greedy `U*` gives letters back until `L+` can start.
fn cased_run_end(cps: &[char], fl: &[CpFlags], q: usize, end: usize) -> Option<usize> {
    let upper = |p: usize| fl[p].letter && !cps[p].is_ascii_lowercase();
    let lower = |p: usize| fl[p].letter && !cps[p].is_ascii_uppercase();
    let caps = run_end(q, end, upper);
    match (q..=caps).rev().find(|&p| p < end && lower(p)) {
        Some(first_lower) => Some(run_end(first_lower, end, lower)),
        // `U+L*`: the letter after the capitals, if any, is no `L` (else `U*L+` matched).
        None => (caps > q).then_some(caps),
    }
}

/// `[^\n]+|[\n]+` over `frag`: maximal runs of newlines and of everything else.
fn split_newline_runs(cps: &[char], frag: Range<usize>, out: &mut Vec<Range<usize>>) {
    let mut prev = frag.start;
    for pos in frag.start + 1..frag.end {
        if (cps[pos] == '\n') != (cps[pos - 1] == '\n') {
            emit(out, &mut prev, pos);
        }
    }
    emit(out, &mut prev, frag.end);
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
    fn gemma4_splits_newline_runs_only() {
        assert_eq!(
            split(PreTokenizer::Gemma4, "a b\n\nc\r\n\nd e"),
            vec!["a b", "\n\n", "c\r", "\n\n", "d e"]
        );
        assert_eq!(split(PreTokenizer::Gemma4, "\n"), vec!["\n"]);
        assert_eq!(
            PreTokenizer::from_name("gemma4").ok(),
            Some(PreTokenizer::Gemma4)
        );
        assert!(!PreTokenizer::Gemma4.byte_encode());
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
    fn gpt4o_splits_as_llama_cpp() {
        // Expected words from llama.cpp's unicode_regex_split with the GPT4O regex.
        let g = PreTokenizer::Gpt4o;
        // Contractions join their word in either case; alone, the apostrophe is punctuation.
        assert_eq!(
            split(g, "IT'S He'll don't 'll x'LL"),
            vec!["IT'S", " He'll", " don't", " '", "ll", " x'LL"]
        );
        // Case changes split; a non-ASCII letter is both cases, so the capitals before a
        // lower-case letter stay with it (`É` `COLE`) and one ends an all-caps run (`CAFÉ`
        // `S`), while `aÉb` stays whole.
        assert_eq!(
            split(g, "CamelCase iPhone ÉCOLE CAFÉS aÉb"),
            vec!["Camel", "Case", " i", "Phone", " É", "COLE", " CAFÉ", "S", " aÉb"]
        );
        // Punctuation takes newlines and slashes after it; whitespace as in Llama 3's.
        assert_eq!(
            split(g, "end./\n/x  \r\n b\t\tc  "),
            vec!["end", "./\n/", "x", "  \r\n", " b", "\t", "\tc", "  "]
        );
        // Combining marks are no letters; numbers go in threes.
        assert_eq!(
            split(
                g,
                "cafe\u{301} \u{301}ab 12345 \u{663}\u{664}\u{665}\u{666}"
            ),
            vec![
                "cafe",
                "\u{301}",
                " \u{301}",
                "ab",
                " ",
                "123",
                "45",
                " ",
                "\u{663}\u{664}\u{665}",
                "\u{666}"
            ]
        );
        assert_eq!(PreTokenizer::from_name("gpt-4o").ok(), Some(g));
        assert!(!cleans_spaces("gpt-4o") && !g.ignore_merges());
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
