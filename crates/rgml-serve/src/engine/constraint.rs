//! What a request's answer must be, as its slot samples it: a JSON object between fixed texts
//! ([`FramedJson`]: `json_object`, forced tool calls) or a grammar ([`Matcher`]: GBNF,
//! JSON schemas). This module owns which tokens may come next and when the answer must end.
//!
//! Sampling checks the token the sampler picks from the plain logits first and masks the
//! whole vocabulary only when the grammar refuses it (llama.cpp does the same): the token then
//! comes from the same distribution as if every refused token had been masked first (a draw
//! from p kept when allowed, else drawn again from p restricted to the allowed ones), and most
//! tokens cost one check instead of a walk over the vocabulary.

use crate::generator::OutputFormat;
use rgml_llm::grammar::{Matcher, TokenTrie};
use rgml_llm::json_prefix::FramedJson;
use rgml_llm::{Sampler, TokenId, Tokenizer};
use std::cell::OnceCell;

/// A request's constraint and its progress.
pub(crate) enum Constraint<'t> {
    Json(FramedJson),
    Grammar {
        matcher: Matcher,
        trie: &'t TokenTrie,
    },
}

/// The vocabulary's texts as a trie, built at the first grammar request of a worker.
pub(crate) fn token_trie<'t>(cell: &'t OnceCell<TokenTrie>, tok: &Tokenizer) -> &'t TokenTrie {
    cell.get_or_init(|| {
        let pieces = (0..tok.n_vocab() as TokenId)
            .filter(|&id| !tok.is_eog(id))
            .filter_map(|id| Some((id, tok.token_to_piece(id, false).ok()?)));
        TokenTrie::new(pieces)
    })
}

impl<'t> Constraint<'t> {
    /// The constraint of `format` (`None`: any text).
    pub(crate) fn new(
        format: &OutputFormat,
        trie: &'t OnceCell<TokenTrie>,
        tok: &Tokenizer,
    ) -> Option<Constraint<'t>> {
        Some(match format {
            OutputFormat::Text => return None,
            OutputFormat::JsonObject => Constraint::Json(FramedJson::new("", "")),
            OutputFormat::ToolCall { prefixes, suffix } => {
                Constraint::Json(FramedJson::one_of(prefixes, suffix))
            }
            OutputFormat::Grammar(grammar) => Constraint::Grammar {
                matcher: Matcher::new(grammar.clone()),
                trie: token_trie(trie, tok),
            },
        })
    }

    /// The answer may end here.
    pub(crate) fn complete(&self) -> bool {
        match self {
            Constraint::Json(json) => json.complete(),
            Constraint::Grammar { matcher, .. } => matcher.complete(),
        }
    }

    /// Nothing more may be written: the answer ends now.
    pub(crate) fn finished(&self) -> bool {
        match self {
            Constraint::Json(json) => json.complete(),
            Constraint::Grammar { matcher, .. } => matcher.finished(),
        }
    }

    /// Takes the text `piece` of the chosen token.
    pub(crate) fn push(&mut self, piece: &[u8]) -> bool {
        match self {
            Constraint::Json(json) => json.push(piece),
            Constraint::Grammar { matcher, .. } => matcher.push(piece),
        }
    }

    /// Whether token `id` may come next (an end-of-generation token once complete).
    fn allows(&mut self, id: TokenId, tok: &Tokenizer) -> bool {
        if tok.is_eog(id) {
            return self.complete();
        }
        let piece = tok.token_to_piece(id, false).unwrap_or_default();
        match self {
            Constraint::Json(json) => json.accepts(piece),
            Constraint::Grammar { matcher, .. } => matcher.accepts(piece),
        }
    }

    /// Masks in `logits` every token that may not come next; `false` when none may.
    fn mask(&mut self, logits: &mut [f32], tok: &Tokenizer) -> bool {
        let complete = self.complete();
        match self {
            Constraint::Json(json) => {
                for (id, l) in logits.iter_mut().enumerate() {
                    let id = id as TokenId;
                    let ok = match tok.is_eog(id) {
                        true => complete,
                        false => json.accepts(tok.token_to_piece(id, false).unwrap_or_default()),
                    };
                    if !ok {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
            Constraint::Grammar { matcher, trie } => {
                let mut allowed = vec![false; logits.len()];
                matcher.allowed_tokens(trie, |t| {
                    if let Some(a) = allowed.get_mut(t as usize) {
                        *a = true;
                    }
                });
                for &eog in tok.eog_ids() {
                    if let Some(a) = allowed.get_mut(eog as usize) {
                        *a = complete;
                    }
                }
                for (l, ok) in logits.iter_mut().zip(allowed) {
                    if !ok {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
        }
        logits.iter().any(|l| l.is_finite())
    }

    /// Samples a token the constraint allows from `logits` (masked in place when the first
    /// pick is refused); `None` when none is allowed.
    pub(crate) fn sample(
        &mut self,
        sampler: &mut Sampler,
        logits: &mut [f32],
        tok: &Tokenizer,
    ) -> Option<TokenId> {
        let first = sampler.sample(logits);
        let finite = logits.get(first as usize).is_some_and(|l| l.is_finite());
        if finite && self.allows(first, tok) {
            return Some(first);
        }
        match self.mask(logits, tok) {
            true => Some(sampler.sample(logits)),
            false => None,
        }
    }
}
