//! A slot: one sequence of the session, what its cache holds, and the request it runs (the
//! prompt still to evaluate, the sampler, the streaming detokenizer, stop strings, the token
//! counts).
//!
//! This module owns turning one row of logits into the request's next event: the sampled
//! token, its log-probabilities, its text (held back while it could be the start of a stop
//! string) and the end of the request.

use super::Job;
use crate::generator::{
    FinishReason, GenEvent, Logprobs, OutputFormat, TokenLogprob, TokenOut, Usage,
};
use rgml_llm::grammar::Grammar;
use rgml_llm::session::SeqCheckpoint;
use rgml_llm::tokenizer::Decoder;
use rgml_llm::{Constraint, Sampler, TokenId, Tokenizer};

/// One sequence of the session.
pub(crate) struct Slot<'t> {
    /// Its sequence in the session.
    pub(crate) seq: usize,
    /// The tokens its cache holds, in order (evaluated ones only).
    pub(crate) cached: Vec<TokenId>,
    /// How many of them are a prompt evaluated in micro-batch pieces from position 0 (what
    /// [`super::PrefixReuse::Exact`] may reuse).
    pub(crate) aligned: usize,
    /// The logits after the last token of the prompt its cache begins with, where that prompt
    /// was evaluated in pieces from position 0 (`aligned`): a request with the same prompt
    /// starts from them, evaluating nothing, with the bits a fresh evaluation gives.
    pub(crate) prompt_logits: Vec<f32>,
    /// How many cached tokens `prompt_logits` follow (0: none held).
    pub(crate) logits_at: usize,
    /// The request it runs.
    pub(crate) run: Option<Running<'t>>,
    /// When it last ran a request (the worker's step count), to reuse the least recent.
    pub(crate) last_used: u64,
    /// Recurrent-state checkpoints of its sequence, oldest first, each of a prefix of
    /// `cached` ([`super::EngineOptions::ctx_checkpoints`]).
    checkpoints: Vec<SeqCheckpoint>,
    /// The last step completed its request's prompt: a checkpoint is due.
    pub(crate) checkpoint_due: bool,
}

/// A request running in a slot.
pub(crate) struct Running<'t> {
    pub(crate) job: Job,
    /// Prompt tokens evaluated or found in the cache.
    pub(crate) n_prompt_done: usize,
    /// Prompt tokens found in the cache.
    pub(crate) n_cached: usize,
    sampler: Sampler,
    decoder: Decoder<'t>,
    /// Generated text so far, and how much of it was sent.
    text: String,
    sent: usize,
    pub(crate) n_generated: usize,
    /// Most tokens to generate (the context may end it sooner).
    max_tokens: usize,
    /// The last sampled token, to evaluate next.
    pub(crate) pending: Option<TokenId>,
    /// Scratch: the logits with end-of-generation tokens masked (`ignore_eos`), and tokens
    /// that break the answer's format.
    masked: Vec<f32>,
    /// What the answer must be (JSON, a forced tool call, a grammar) and how far it is.
    constraint: Option<Constraint>,
}

/// What the slot does after a row of logits.
pub(crate) enum Next {
    /// Evaluate the pending token next step.
    Continue,
    /// The request ended (its `Done` was sent).
    Finished,
}

impl<'t> Slot<'t> {
    pub(crate) fn new(seq: usize) -> Slot<'t> {
        Slot {
            seq,
            cached: Vec::new(),
            aligned: 0,
            prompt_logits: Vec::new(),
            logits_at: 0,
            run: None,
            last_used: 0,
            checkpoints: Vec::new(),
            checkpoint_due: false,
        }
    }

    /// The newest checkpoint of at most `n` positions.
    pub(crate) fn checkpoint_within(&self, n: usize) -> Option<&SeqCheckpoint> {
        self.checkpoints.iter().rev().find(|c| c.n_past() <= n)
    }

    /// Keep `checkpoint` (of the whole cache now), and at most `max` in all: the oldest go.
    pub(crate) fn add_checkpoint(&mut self, checkpoint: SeqCheckpoint, max: usize) {
        self.checkpoints
            .retain(|c| c.n_past() < checkpoint.n_past());
        self.checkpoints.push(checkpoint);
        let extra = self.checkpoints.len().saturating_sub(max);
        self.checkpoints.drain(..extra);
    }

    /// Its cache was replaced by another slot's: its checkpoints are of other positions.
    pub(crate) fn forget_checkpoints(&mut self) {
        self.checkpoints.clear();
    }

    /// Whether the cache holds all of `prompt`, evaluated as a fresh prompt, with the logits
    /// after it.
    pub(crate) fn holds_whole(&self, prompt: &[TokenId]) -> bool {
        let n = prompt.len();
        n > 0
            && self.logits_at == n
            && self.aligned >= n
            && self.cached.get(..n).is_some_and(|c| c == prompt)
    }

    /// Keep `logits`, which follow the whole cache, where the cache is one aligned prompt.
    pub(crate) fn keep_prompt_logits(&mut self, logits: &[f32]) {
        if self.aligned == self.cached.len() {
            self.prompt_logits.clear();
            self.prompt_logits.extend_from_slice(logits);
            self.logits_at = self.cached.len();
        }
    }

    /// The cache was cut to `n` tokens: the prompt logits are kept only while their prompt
    /// is.
    pub(crate) fn truncate(&mut self, n: usize) {
        self.cached.truncate(n);
        self.checkpoints.retain(|c| c.n_past() <= n);
        self.aligned = self.aligned.min(n);
        if self.logits_at > n.min(self.aligned) {
            self.logits_at = 0;
        }
    }

    /// Start `job`, whose first `n_cached` prompt tokens the cache holds already.
    /// `preserved`: the special tokens its text renders (see `worker::Policy::preserved`).
    pub(crate) fn start(
        &mut self,
        job: Job,
        n_cached: usize,
        tok: &'t Tokenizer,
        preserved: Vec<TokenId>,
    ) {
        let mut sampler = Sampler::new(job.request.sampling.clone());
        // As `Session::generate`: the repetition penalty sees the prompt.
        for &t in &job.prompt {
            sampler.accept(t);
        }
        let max_tokens = job.request.max_tokens.unwrap_or(usize::MAX);
        let constraint = constraint(&job.request.format);
        self.run = Some(Running {
            job,
            n_prompt_done: n_cached,
            n_cached,
            sampler,
            decoder: tok.decoder_preserving(preserved),
            text: String::new(),
            sent: 0,
            n_generated: 0,
            max_tokens,
            pending: None,
            masked: Vec::new(),
            constraint,
        });
    }
}

impl Running<'_> {
    /// Prompt tokens still to evaluate.
    pub(crate) fn prompt_left(&self) -> &[TokenId] {
        &self.job.prompt[self.n_prompt_done..]
    }

    pub(crate) fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self.job.prompt.len(),
            cached_tokens: self.n_cached,
            completion_tokens: self.n_generated,
        }
    }

    /// Sample the next token from `logits`, send it, and say whether the request goes on.
    /// `room`: whether the context has a cell for the token after this one.
    pub(crate) fn on_logits(&mut self, logits: &[f32], tok: &Tokenizer, room: bool) -> Next {
        let norm = self.job.request.n_probs.map(|_| LogNorm::of(logits));
        let top = match (self.job.request.n_probs, norm) {
            (Some(n), Some(norm)) => Some(top_logprobs(logits, n, norm, tok)),
            _ => None,
        };
        let Some(token) = self.pick(logits, tok) else {
            if let Some(why) = self.constraint.as_ref().and_then(|c| c.too_ambiguous()) {
                let _ = self.job.events.send(GenEvent::Failed(why));
                return Next::Finished;
            }
            return self.finish(FinishReason::Stop);
        };
        if tok.is_eog(token) {
            // llama-server counts the end-of-generation token among the completion's.
            self.n_generated += 1;
            return self.finish(FinishReason::Stop);
        }
        // Where the answer's format allows nothing more, it ends with this token.
        let format_done = self
            .constraint
            .as_mut()
            .is_some_and(|c| c.accept(token, tok) && c.finished());
        self.sampler.accept(token);
        self.n_generated += 1;
        let logprobs = top.zip(norm).map(|(top, norm)| Logprobs {
            chosen: token_logprob(token, logits, norm, tok),
            top,
        });
        let piece = self.decoder.push(token).unwrap_or_default();
        self.text.push_str(&piece);
        if let Some(at) = self.stop_at() {
            self.text.truncate(at);
            self.send_token(token, logprobs);
            return self.end(FinishReason::Stop);
        }
        self.send_token(token, logprobs);
        if self.n_generated >= self.max_tokens || !room {
            return self.finish(FinishReason::Length);
        }
        if format_done {
            // The format leaves only an end-of-generation token: llama-server samples it next
            // and counts it; it is counted here without the decoding step.
            self.n_generated += 1;
            return self.finish(FinishReason::Stop);
        }
        self.pending = Some(token);
        Next::Continue
    }

    /// The next token: sampled from `logits` with end-of-generation tokens masked under
    /// `ignore_eos` (llama.cpp's logit bias of -inf), and only among the tokens the
    /// constraint allows (an end-of-generation token only where its answer is complete).
    /// `None`: no token may come.
    fn pick(&mut self, logits: &[f32], tok: &Tokenizer) -> Option<TokenId> {
        if !self.job.request.ignore_eos && self.constraint.is_none() {
            return Some(self.sampler.sample(logits));
        }
        self.masked.clear();
        self.masked.extend_from_slice(logits);
        if self.job.request.ignore_eos {
            for &eog in tok.eog_ids() {
                if let Some(l) = self.masked.get_mut(eog as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        match &mut self.constraint {
            Some(c) => c.sample(&mut self.sampler, &mut self.masked, tok),
            None => Some(self.sampler.sample(&self.masked)),
        }
    }

    /// Send the token with the text that is safe to show: all but a suffix that could begin
    /// a stop string.
    fn send_token(&mut self, id: TokenId, logprobs: Option<Logprobs>) {
        let hold = self.held_back();
        let end = self.text.len() - hold;
        let text = self.text[self.sent..end].to_string();
        self.sent = end;
        let _ = self
            .job
            .events
            .send(GenEvent::Token(TokenOut { id, text, logprobs }));
    }

    /// End the request: the rest of the text (a held-back suffix and the detokenizer's last
    /// bytes, cut at a stop string they complete) and the reason.
    pub(crate) fn finish(&mut self, reason: FinishReason) -> Next {
        let rest = self.decoder.finish();
        self.text.push_str(&rest);
        match self.stop_at() {
            Some(at) => {
                self.text.truncate(at);
                self.end(FinishReason::Stop)
            }
            None => self.end(reason),
        }
    }

    /// Send what is left of the text (nothing more comes) and the reason.
    fn end(&mut self, reason: FinishReason) -> Next {
        let text = self.text.get(self.sent..).unwrap_or_default().to_string();
        self.sent = self.text.len();
        let _ = self.job.events.send(GenEvent::Done {
            text,
            reason,
            usage: self.usage(),
        });
        Next::Finished
    }

    /// Where the first stop string begins in the text, if one is there (searched from a little
    /// before what was sent, as a stop string can straddle tokens).
    fn stop_at(&self) -> Option<usize> {
        let stops = &self.job.request.stop;
        let longest = stops.iter().map(String::len).max()?;
        let mut from = self.sent.saturating_sub(longest);
        while !self.text.is_char_boundary(from) {
            from -= 1;
        }
        stops
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| self.text[from..].find(s.as_str()).map(|i| from + i))
            .min()
    }

    /// Bytes at the end of the text that are the beginning of a stop string.
    fn held_back(&self) -> usize {
        let text = &self.text[self.sent..];
        self.job
            .request
            .stop
            .iter()
            .flat_map(|s| {
                (1..=s.len().min(text.len()))
                    .rev()
                    .find(|&n| s.is_char_boundary(n) && text.ends_with(&s[..n]))
            })
            .max()
            .unwrap_or(0)
    }
}

/// What turns a logit into a log-probability under the softmax of a row: its largest logit and
/// the log of the sum of `exp(logit - max)`.
#[derive(Clone, Copy)]
struct LogNorm {
    max: f32,
    ln_sum: f64,
}

impl LogNorm {
    fn of(logits: &[f32]) -> LogNorm {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
        LogNorm {
            max,
            ln_sum: sum.ln(),
        }
    }
}

/// The `n` most likely tokens under the softmax of the raw `logits`, best first.
fn top_logprobs(logits: &[f32], n: usize, norm: LogNorm, tok: &Tokenizer) -> Vec<TokenLogprob> {
    let n = n.min(logits.len());
    if n == 0 {
        return Vec::new();
    }
    let mut best: Vec<usize> = (0..logits.len()).collect();
    best.select_nth_unstable_by(n - 1, |&a, &b| logits[b].total_cmp(&logits[a]));
    best.truncate(n);
    best.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    best.into_iter()
        .map(|id| token_logprob(id as TokenId, logits, norm, tok))
        .collect()
}

/// `id`'s log-probability under the softmax of `logits`.
fn token_logprob(id: TokenId, logits: &[f32], norm: LogNorm, tok: &Tokenizer) -> TokenLogprob {
    let logit = logits
        .get(id as usize)
        .copied()
        .unwrap_or(f32::NEG_INFINITY);
    let bytes = tok
        .token_to_piece(id, false)
        .map(<[u8]>::to_vec)
        .unwrap_or_default();
    TokenLogprob {
        id,
        text: String::from_utf8_lossy(&bytes).into_owned(),
        bytes,
        logprob: (f64::from(logit - norm.max) - norm.ln_sum) as f32,
    }
}

/// The constraint of `format` (`None`: any text).
fn constraint(format: &OutputFormat) -> Option<Constraint> {
    Some(match format {
        OutputFormat::Text => return None,
        OutputFormat::JsonObject => Constraint::grammar(Grammar::json_object()),
        OutputFormat::Grammar(grammar) => Constraint::grammar(grammar.clone()),
        // Resolved at submission (`OutputFormat::after_prompt`); a prompt that did not open
        // the reasoning otherwise.
        OutputFormat::JsonAnswer { fresh, .. } => Constraint::grammar(fresh.clone()),
    })
}
