//! Constrained sampling: which tokens may come next in an answer that must be a sentence of a
//! [`Grammar`] (GBNF, a JSON schema's, any JSON object for OpenAI's `json_object`, a forced
//! tool call in the model's frame). The generation loops (the server's slots,
//! [`crate::Generation`]) ask a [`Constraint`] for each token.
//!
//! [`Constraint::sample`] checks the token the sampler picks from the plain logits first and
//! masks the whole vocabulary only when the constraint refuses it (llama.cpp does the same):
//! the token then comes from the same distribution as if every refused token had been masked
//! first (a draw from p kept when allowed, else drawn again from p restricted to the allowed
//! ones), and most tokens cost one check instead of a walk over the vocabulary.

use crate::grammar::{Grammar, Matcher, MAX_STACKS};
use crate::sampling::Sampler;
use crate::tokenizer::{TokenId, Tokenizer};
use std::sync::Arc;

/// The text a grammar reads for token `id`: its piece with control tokens' text rendered (as
/// llama.cpp's grammar reads its vocabulary), so that a grammar can name a format's control
/// markers (Mistral's `[TOOL_CALLS]`); [`Tokenizer::token_trie`] holds the same texts.
fn grammar_text(tok: &Tokenizer, id: TokenId) -> &[u8] {
    tok.token_to_piece(id, true).unwrap_or_default()
}

/// An answer's grammar and how far the answer is through it.
pub struct Constraint {
    matcher: Matcher,
}

impl Constraint {
    /// A sentence of `grammar`.
    pub fn grammar(grammar: Arc<Grammar>) -> Constraint {
        Constraint {
            matcher: Matcher::new(grammar),
        }
    }

    /// The answer may end here (an end-of-generation token may come).
    pub fn complete(&self) -> bool {
        self.matcher.complete()
    }

    /// Nothing more may be written: the answer ends now.
    pub fn finished(&self) -> bool {
        self.matcher.finished()
    }

    /// Why no token may come, where the grammar and not the text is to blame: following it
    /// here would take more than [`MAX_STACKS`] parse stacks (an ambiguous grammar). `None`
    /// otherwise.
    pub fn too_ambiguous(&self) -> Option<String> {
        self.matcher.overflowed().then(|| {
            format!(
                "the grammar is too ambiguous to follow: the next token would need more than {MAX_STACKS} parse stacks"
            )
        })
    }

    /// Takes the chosen token `id`; `false` (nothing changed) if it may not come.
    pub fn accept(&mut self, id: TokenId, tok: &Tokenizer) -> bool {
        self.matcher.push(grammar_text(tok, id))
    }

    /// Whether token `id` may come next (an end-of-generation token once complete).
    fn allows(&mut self, id: TokenId, tok: &Tokenizer) -> bool {
        match tok.is_eog(id) {
            true => self.complete(),
            false => (self.matcher).accepts(grammar_text(tok, id)),
        }
    }

    /// Masks in `logits` every token that may not come next; `false` when none may.
    fn mask(&mut self, logits: &mut [f32], tok: &Tokenizer) -> bool {
        let complete = self.complete();
        let mut allowed = vec![false; logits.len()];
        self.matcher.allowed_tokens(tok.token_trie(), |t| {
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
        logits.iter().any(|l| l.is_finite())
    }

    /// Samples a token the constraint allows from `logits` (masked in place when the first
    /// pick is refused; an end-of-generation token is allowed where the answer is complete).
    /// `None` when no token may come.
    pub fn sample(
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
