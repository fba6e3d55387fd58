//! Token generation on a [`Session`]: the prompt-sample-evaluate loop that every caller would
//! otherwise write by hand (and where the easy mistakes are: forgetting to feed the prompt to
//! the sampler's repetition penalty, evaluating a token nobody will read).
//!
//! This module owns that loop only. It evaluates through [`Session::decode`] and reads
//! [`Session::logits`]; graphs and the KV cache stay in [`crate::session`], and the choice of a
//! token in [`crate::sampling`].
//!
//! # Stopping
//!
//! A [`Generation`] ends (returns `None`, and [`Generation::stop_reason`] says why):
//! - at an end-of-generation token ([`Tokenizer::is_eog`]: EOS, EOT, `<|im_end|>`, ...), which
//!   is neither yielded nor given to the sampler: [`StopReason::EndOfGeneration`];
//! - after `max_tokens` tokens: [`StopReason::MaxTokens`];
//! - when the context is full, so that the last yielded token cannot be evaluated and nothing
//!   can follow it: [`StopReason::ContextFull`]. This is a stop reason, not an error, because a
//!   context sized for the prompt plus the tokens wanted ends exactly this way;
//! - with a [`Constraint`] ([`Generation::constrained`]): after the token that completes the
//!   answer where nothing more may follow, or when no token may come:
//!   [`StopReason::Constraint`]. End-of-generation tokens come only where the answer is
//!   complete.
//!
//! A failed step (the computation itself failed, or a grammar too ambiguous to follow:
//! [`Constraint::too_ambiguous`]) is yielded once as `Some(Err(_))`; the iterator then ends
//! with no stop reason.
//!
//! [`Tokenizer::is_eog`]: crate::Tokenizer::is_eog

use crate::constraint::Constraint;
use crate::error::Result;
use crate::sampling::Sampler;
use crate::session::{Logits, Session};
use crate::tokenizer::TokenId;

/// Why a [`Generation`] ended (see the [module docs](self)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StopReason {
    /// The model chose this end-of-generation token. It was not yielded, not accepted by the
    /// sampler and not evaluated.
    EndOfGeneration(TokenId),
    /// `max_tokens` tokens were yielded.
    MaxTokens,
    /// The context is full: the last yielded token could not be evaluated.
    ContextFull,
    /// The constraint allows nothing more (its answer is complete), or no token at all.
    Constraint,
}

/// Tokens generated after a prompt, one per [`Iterator::next`]; made by [`Session::generate`].
///
/// Each step evaluates the previously yielded token, samples the next one from its logits and
/// accepts it into the sampler (for the repetition penalty). The evaluation is deferred to the
/// step that needs it, so stopping never costs a wasted one; this also means that, once the
/// generation ended, the last yielded token is not in the session's cache
/// ([`Session::n_past`] counts the prompt and every yielded token but the last). To continue
/// the sequence, evaluate that token first.
pub struct Generation<'a> {
    session: &'a mut Session,
    sampler: &'a mut Sampler,
    max_tokens: usize,
    n_generated: usize,
    /// The last yielded token, not evaluated yet.
    pending: Option<TokenId>,
    stop: Option<StopReason>,
    /// A step failed: the iterator is over, without a stop reason.
    failed: bool,
    /// What the answer must be, and the logits with the refused tokens masked.
    constraint: Option<Constraint>,
    masked: Vec<f32>,
}

impl Session {
    /// Generate up to `max_tokens` tokens after `prompt`, appended to the session's sequence.
    ///
    /// Evaluates the prompt now (its errors are this call's: those of [`Session::eval`]), then
    /// accepts the prompt tokens into `sampler`, so that a repetition penalty also sees them.
    /// The returned [`Generation`] yields the sampled tokens; see the
    /// [module docs](crate::generate) for how it stops. With [`SamplerParams::greedy`] it
    /// yields the greedy continuation.
    ///
    /// [`SamplerParams::greedy`]: crate::SamplerParams::greedy
    pub fn generate<'a>(
        &'a mut self,
        prompt: &[TokenId],
        sampler: &'a mut Sampler,
        max_tokens: usize,
    ) -> Result<Generation<'a>> {
        sampler.params().validate()?;
        self.decode(prompt, Logits::Last)?;
        for &t in prompt {
            sampler.accept(t);
        }
        Ok(Generation {
            session: self,
            sampler,
            max_tokens,
            n_generated: 0,
            pending: None,
            stop: None,
            failed: false,
            constraint: None,
            masked: Vec::new(),
        })
    }
}

impl Generation<'_> {
    /// Only tokens `constraint` allows are sampled, and the generation stops where it allows
    /// nothing more ([`StopReason::Constraint`]).
    pub fn constrained(mut self, constraint: Constraint) -> Self {
        self.constraint = Some(constraint);
        self
    }

    /// Why the generation ended; `None` while it goes on, and after a failed step.
    pub fn stop_reason(&self) -> Option<StopReason> {
        self.stop
    }

    /// Tokens yielded so far.
    pub fn n_generated(&self) -> usize {
        self.n_generated
    }

    /// The session generating (e.g. for [`Session::n_past`]).
    pub fn session(&self) -> &Session {
        self.session
    }

    /// A token the constraint allows (an end-of-generation token only where its answer is
    /// complete).
    fn sample_constrained(&mut self) -> Option<TokenId> {
        let constraint = self.constraint.as_mut()?;
        self.masked.clear();
        self.masked.extend_from_slice(self.session.logits());
        let tok = &self.session.model().tokenizer;
        constraint.sample(self.sampler, &mut self.masked, tok)
    }

    fn stop(&mut self, reason: StopReason) -> Option<Result<TokenId>> {
        self.stop = Some(reason);
        None
    }
}

impl Iterator for Generation<'_> {
    type Item = Result<TokenId>;

    fn next(&mut self) -> Option<Result<TokenId>> {
        if self.stop.is_some() || self.failed {
            return None;
        }
        if self.n_generated >= self.max_tokens {
            return self.stop(StopReason::MaxTokens);
        }
        if let Some(token) = self.pending {
            if self.session.n_past() >= self.session.n_ctx() {
                return self.stop(StopReason::ContextFull);
            }
            if let Err(e) = self.session.decode(&[token], Logits::Last) {
                self.failed = true;
                return Some(Err(e));
            }
            self.pending = None;
        }
        let token = match self.constraint.is_some() {
            false => self.sampler.sample(self.session.logits()),
            true => match self.sample_constrained() {
                Some(token) => token,
                None => {
                    let refusal = self.constraint.as_ref().and_then(Constraint::too_ambiguous);
                    if let Some(why) = refusal {
                        self.failed = true;
                        return Some(Err(crate::error::LlmError::BadInput(why)));
                    }
                    return self.stop(StopReason::Constraint);
                }
            },
        };
        let tok = &self.session.model().tokenizer;
        if tok.is_eog(token) {
            return self.stop(StopReason::EndOfGeneration(token));
        }
        if let Some(c) = &mut self.constraint {
            c.accept(token, tok);
            if c.finished() {
                // Yield the token that completes the answer; nothing follows it.
                self.stop = Some(StopReason::Constraint);
            }
        }
        self.sampler.accept(token);
        self.pending = Some(token);
        self.n_generated += 1;
        Some(Ok(token))
    }
}

impl std::iter::FusedIterator for Generation<'_> {}
