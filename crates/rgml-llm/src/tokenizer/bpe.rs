//! BPE with merges (`tokenizer.ggml.model = gpt2` or `gemma4`): pre-tokenized words are merged
//! pairwise by merge rank, lowest rank first. Byte-level vocabularies (`gpt2`) first map each
//! word byte by byte to GPT-2's printable chars; Gemma 4's merges raw UTF-8 with spaces
//! written `▁` and falls back to `<0xXX>` byte tokens.

use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use super::pretokenize::PreTokenizer;
use super::unicode::byte_to_char_table;
use super::Vocab;
use crate::error::{LlmError, Result};

/// The merge table and word splitter of a BPE vocabulary.
#[derive(Clone, Debug)]
pub(crate) struct BpeModel {
    /// Rank of the merge of two pieces, keyed by their piece ids (see [`BpeModel::piece_id`]).
    ranks: HashMap<(u32, u32), u32>,
    /// Ids for merge operands that are not vocabulary tokens (numbered from `n_vocab`), so
    /// that rank lookups never need to build strings.
    extra_pieces: HashMap<String, u32>,
    pub(crate) pre: PreTokenizer,
    byte_chars: [char; 256],
}

/// One symbol of a word being merged: a char range of the byte-encoded word, linked to its
/// neighbours (llama.cpp's `llm_symbol`).
#[derive(Clone, Copy)]
struct Sym {
    start: usize,
    end: usize,
    prev: Option<usize>,
    next: Option<usize>,
    piece: Option<u32>,
}

impl BpeModel {
    /// Builds the model from merges written `"left right"`, as in `tokenizer.ggml.merges`.
    /// Like llama.cpp, the split is at the first space after the first byte (so a merge of a
    /// literal space token parses), and the first of duplicate merges keeps its rank.
    pub(crate) fn new(vocab: &Vocab, merges: &[String], pre: PreTokenizer) -> Result<BpeModel> {
        let mut extra_pieces: HashMap<String, u32> = HashMap::new();
        let mut ranks = HashMap::with_capacity(merges.len());
        let n_vocab = u32::try_from(vocab.tokens.len())
            .map_err(|_| LlmError::Tokenizer("vocabulary too large".into()))?;
        let piece = |s: &str, extra: &mut HashMap<String, u32>| -> u32 {
            if let Some(&id) = vocab.token_to_id.get(s) {
                return id;
            }
            let next = n_vocab + extra.len() as u32;
            *extra.entry(s.to_owned()).or_insert(next)
        };
        for (rank, merge) in merges.iter().enumerate() {
            let split = merge
                .char_indices()
                .skip(1)
                .find(|&(_, c)| c == ' ')
                .map(|(i, _)| i);
            let Some(i) = split else {
                // llama.cpp keeps such a line as an empty pair that never matches.
                continue;
            };
            let (left, right) = (&merge[..i], &merge[i + 1..]);
            if left.is_empty() || right.is_empty() {
                continue;
            }
            let key = (
                piece(left, &mut extra_pieces),
                piece(right, &mut extra_pieces),
            );
            ranks.entry(key).or_insert(rank as u32);
        }
        Ok(BpeModel {
            ranks,
            extra_pieces,
            pre,
            byte_chars: byte_to_char_table(),
        })
    }

    fn piece_id(&self, vocab: &Vocab, s: &str) -> Option<u32> {
        vocab
            .token_to_id
            .get(s)
            .or_else(|| self.extra_pieces.get(s))
            .copied()
    }

    /// Tokenizes raw text (no special tokens in it any more) and appends the ids to `out`.
    pub(crate) fn encode(&self, vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
        // llama.cpp escapes the whole fragment before splitting it.
        let text = if self.pre.escapes_whitespace() {
            Cow::Owned(text.replace(' ', "▁"))
        } else {
            Cow::Borrowed(text)
        };
        let mut buf = String::new();
        let mut syms = Vec::new();
        let mut heap = BinaryHeap::new();
        for word in self.pre.split(&text) {
            let word = self.word_text(word, &mut buf);
            if let Some(id) = self.whole_word_token(vocab, word) {
                out.push(id);
                continue;
            }
            self.merge_word(vocab, word, &mut syms, &mut heap);
            self.emit_word(vocab, word, &syms, out);
        }
    }

    /// The word as the vocabulary spells it: byte-encoded into `buf`, or as it is.
    fn word_text<'a>(&self, word: &'a str, buf: &'a mut String) -> &'a str {
        if !self.pre.byte_encode() {
            return word;
        }
        buf.clear();
        buf.extend(word.bytes().map(|b| self.byte_chars[b as usize]));
        buf
    }

    /// The token a word is taken as whole, skipping the merges: any word that is a token
    /// where the pre-tokenizer ignores merges, a run of newlines for Gemma 4.
    fn whole_word_token(&self, vocab: &Vocab, word: &str) -> Option<u32> {
        let whole = self.pre.ignore_merges()
            || (self.pre.whole_newline_runs() && word.bytes().all(|b| b == b'\n'));
        if whole {
            vocab.token_to_id.get(word).copied()
        } else {
            None
        }
    }

    /// The rank queue entry of the pair `left`,`right` if the pair has a merge. Ordered by
    /// rank, then leftmost, as llama.cpp's `llm_bigram_bpe`; it carries both pieces so a
    /// stale entry (one side merged since) can be recognised.
    fn bigram(&self, syms: &[Sym], left: usize, right: usize) -> Option<Reverse<Bigram>> {
        let (l, r) = (syms[left].piece?, syms[right].piece?);
        let rank = *self.ranks.get(&(l, r))?;
        Some(Reverse(Bigram {
            rank,
            left,
            right,
            l,
            r,
        }))
    }

    fn merge_word(
        &self,
        vocab: &Vocab,
        word: &str,
        syms: &mut Vec<Sym>,
        heap: &mut BinaryHeap<Reverse<Bigram>>,
    ) {
        syms.clear();
        heap.clear();
        let mut iter = word.char_indices().peekable();
        while let Some((start, _)) = iter.next() {
            let end = iter.peek().map_or(word.len(), |&(i, _)| i);
            let idx = syms.len();
            syms.push(Sym {
                start,
                end,
                prev: idx.checked_sub(1),
                next: None,
                piece: self.piece_id(vocab, &word[start..end]),
            });
            if idx > 0 {
                syms[idx - 1].next = Some(idx);
            }
        }
        for i in 1..syms.len() {
            if let Some(b) = self.bigram(syms, i - 1, i) {
                heap.push(b);
            }
        }
        while let Some(Reverse(b)) = heap.pop() {
            let (ls, rs) = (syms[b.left], syms[b.right]);
            // Skip entries made stale by an earlier merge of either side.
            if ls.end == ls.start
                || rs.end == rs.start
                || ls.next != Some(b.right)
                || ls.piece != Some(b.l)
                || rs.piece != Some(b.r)
            {
                continue;
            }
            let merged_end = rs.end;
            syms[b.left].end = merged_end;
            syms[b.left].next = rs.next;
            syms[b.left].piece = self.piece_id(vocab, &word[ls.start..merged_end]);
            syms[b.right].end = syms[b.right].start;
            if let Some(n) = rs.next {
                syms[n].prev = Some(b.left);
            }
            if let Some(p) = ls.prev {
                if let Some(nb) = self.bigram(syms, p, b.left) {
                    heap.push(nb);
                }
            }
            if let Some(n) = rs.next {
                if let Some(nb) = self.bigram(syms, b.left, n) {
                    heap.push(nb);
                }
            }
        }
    }

    fn emit_word(&self, vocab: &Vocab, word: &str, syms: &[Sym], out: &mut Vec<u32>) {
        let mut cur = if syms.is_empty() { None } else { Some(0) };
        while let Some(i) = cur {
            let s = syms[i];
            cur = s.next;
            let text = &word[s.start..s.end];
            if text.is_empty() {
                continue;
            }
            match vocab.token_to_id.get(text) {
                Some(&id) => out.push(id),
                None => {
                    // llama.cpp's fallback for a piece that is no token: each byte of it as
                    // its byte token, where one exists (others are dropped).
                    out.extend(text.bytes().filter_map(|b| self.byte_fallback(vocab, b)));
                }
            }
        }
    }

    /// The token of one byte of a piece that is no token: the one-byte text in byte-level
    /// vocabularies, the SentencePiece-style `<0xXX>` in raw UTF-8 ones (Gemma 4).
    fn byte_fallback(&self, vocab: &Vocab, b: u8) -> Option<u32> {
        if self.pre.byte_encode() {
            let one = [b];
            let s = std::str::from_utf8(&one).ok()?;
            vocab.token_to_id.get(s).copied()
        } else {
            vocab.token_to_id.get(&format!("<0x{b:02X}>")).copied()
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Bigram {
    rank: u32,
    left: usize,
    right: usize,
    l: u32,
    r: u32,
}
