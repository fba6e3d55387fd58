//! SentencePiece BPE (`tokenizer.ggml.model = llama`), as llama.cpp's `llm_tokenizer_spm`:
//! spaces become `▁`, the text is split into UTF-8 chars, and adjacent symbols whose
//! concatenation is a vocabulary token are merged, highest token score first; pieces that end
//! up as no token are emitted through their merge history and finally as `<0xXX>` byte tokens.

use std::collections::{BinaryHeap, HashMap};

use super::Vocab;

/// A candidate merge, ordered by score (higher first), then leftmost.
#[derive(Clone, Copy)]
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == std::cmp::Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Bigram {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        // Max-heap: greater = popped first = higher score, then smaller `left`.
        self.score
            .total_cmp(&o.score)
            .then_with(|| o.left.cmp(&self.left))
    }
}

#[derive(Clone, Copy)]
struct Sym {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

struct Session<'v> {
    vocab: &'v Vocab,
    text: &'v str,
    syms: Vec<Sym>,
    heap: BinaryHeap<Bigram>,
    /// For each merged text, the two symbols it was last built from, to re-split pieces
    /// that are no token (llama.cpp's `rev_merge`).
    rev_merge: HashMap<&'v str, (usize, usize)>,
}

/// Tokenizes `text` (spaces already escaped to `▁`, prefix already added) into `out`.
pub(crate) fn encode(vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
    let mut s = Session {
        vocab,
        text,
        syms: Vec::new(),
        heap: BinaryHeap::new(),
        rev_merge: HashMap::new(),
    };
    let mut iter = text.char_indices().peekable();
    while let Some((start, _)) = iter.next() {
        let end = iter.peek().map_or(text.len(), |&(i, _)| i);
        let idx = s.syms.len();
        s.syms.push(Sym {
            start,
            len: end - start,
            prev: idx.checked_sub(1),
            next: None,
        });
        if idx > 0 {
            s.syms[idx - 1].next = Some(idx);
        }
    }
    for i in 1..s.syms.len() {
        s.try_add_bigram(Some(i - 1), Some(i));
    }
    while let Some(b) = s.heap.pop() {
        let (l, r) = (s.syms[b.left], s.syms[b.right]);
        // Skip entries made stale by an earlier merge.
        if l.len == 0 || r.len == 0 || l.len + r.len != b.size {
            continue;
        }
        s.syms[b.left].len += r.len;
        s.syms[b.right].len = 0;
        s.syms[b.left].next = r.next;
        if let Some(n) = r.next {
            s.syms[n].prev = Some(b.left);
        }
        s.try_add_bigram(l.prev, Some(b.left));
        s.try_add_bigram(Some(b.left), r.next);
    }
    let mut cur = if s.syms.is_empty() { None } else { Some(0) };
    while let Some(i) = cur {
        cur = s.syms[i].next;
        s.resegment(i, out, 0);
    }
}

impl<'v> Session<'v> {
    fn sym_text(&self, i: usize) -> &'v str {
        let s = self.syms[i];
        self.text.get(s.start..s.start + s.len).unwrap_or("")
    }

    fn try_add_bigram(&mut self, left: Option<usize>, right: Option<usize>) {
        let (Some(left), Some(right)) = (left, right) else {
            return;
        };
        let start = self.syms[left].start;
        let size = self.syms[left].len + self.syms[right].len;
        let Some(text) = self.text.get(start..start + size) else {
            return;
        };
        let Some(&id) = self.vocab.token_to_id.get(text) else {
            return;
        };
        let Some(tok) = self.vocab.tokens.get(id as usize) else {
            return;
        };
        self.heap.push(Bigram {
            score: tok.score,
            left,
            right,
            size,
        });
        self.rev_merge.insert(text, (left, right));
    }

    fn resegment(&self, i: usize, out: &mut Vec<u32>, depth: usize) {
        let text = self.sym_text(i);
        if text.is_empty() {
            return;
        }
        if let Some(&id) = self.vocab.token_to_id.get(text) {
            out.push(id);
            return;
        }
        // Merged symbols are always tokens, so the merge history is only a fallback; the depth
        // bound keeps an inconsistent vocabulary from recursing without end.
        match self.rev_merge.get(text).filter(|_| depth < 64) {
            Some(&(l, r)) => {
                self.resegment(l, out, depth + 1);
                self.resegment(r, out, depth + 1);
            }
            None => {
                for b in text.bytes() {
                    if let Some(id) = self.vocab.byte_token(b) {
                        out.push(id);
                    }
                }
            }
        }
    }
}
