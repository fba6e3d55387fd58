//! The engine's worker thread: the loop that gives queued requests to free slots, decodes one
//! batch of every busy slot's next tokens per step, and hands each row of logits to its slot.
//!
//! This module owns the step: admission (slot choice and prefix reuse), cancellation, the
//! batch, and the counters of [`State`].

use super::slot::{Next, Slot};
use super::{Job, PrefixReuse, Shared, State};
use crate::generator::{FinishReason, GenEvent};
use rgml_llm::session::BatchToken;
use rgml_llm::{Session, TokenId};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The window of the tokens/s gauge.
pub(crate) const RECENT: Duration = Duration::from_secs(10);

/// A prefix held by another slot is copied (rather than evaluated again) from this many tokens
/// more than the chosen slot holds.
const MIN_COPY: usize = 16;

/// Drop the steps older than [`RECENT`].
pub(crate) fn trim_recent(recent: &mut VecDeque<(Instant, usize)>, now: Instant) {
    while recent
        .front()
        .is_some_and(|&(t, _)| now.duration_since(t) > RECENT)
    {
        recent.pop_front();
    }
}

/// How the worker batches and reuses caches.
pub(crate) struct Policy {
    pub(crate) max_batch: usize,
    pub(crate) reuse: PrefixReuse,
    /// The session's micro-batch: prompts are evaluated in pieces of it.
    pub(crate) n_ubatch: usize,
    /// The model keeps a recurrent state per sequence (Qwen3.5): a slot's cache can only be
    /// kept whole, or cut back to one of its checkpoints.
    pub(crate) recurrent: bool,
    /// Checkpoints of a recurrent state each slot keeps ([`super::EngineOptions::ctx_checkpoints`]).
    pub(crate) checkpoints: usize,
    /// The special tokens the answers render: the tool-call format's control markers, which
    /// its parser reads (llama.cpp's preserved tokens).
    pub(crate) preserved: Vec<TokenId>,
}

impl Policy {
    /// How much of `prompt` `slot`'s cache may give (at least one prompt token is left to
    /// evaluate, for its logits); `own`: to the slot itself, which may go back to one of its
    /// checkpoints (a copy to another slot takes a recurrent state whole only).
    fn reusable(&self, slot: &Slot<'_>, prompt: &[TokenId], own: bool) -> usize {
        let n = common_prefix(&slot.cached, prompt).min(prompt.len().saturating_sub(1));
        if self.recurrent {
            // A recurrent state holds every position the slot has: it is kept when the prompt
            // extends all of them (a chat's next turn, as llama-server keeps it), else the
            // slot goes back to its newest checkpoint inside the common prefix, else the
            // prompt is evaluated afresh. Exact's micro-batch pieces cannot be honoured then.
            return match (n == slot.cached.len(), own) {
                (true, _) => n,
                (false, true) => slot.checkpoint_within(n).map_or(0, |c| c.n_past()),
                (false, false) => 0,
            };
        }
        match self.reuse {
            PrefixReuse::Exact => n.min(slot.aligned) / self.n_ubatch * self.n_ubatch,
            PrefixReuse::Any => n,
        }
    }
}

/// Run until shutdown once no request is left.
pub(crate) fn run(mut session: Session, shared: Arc<Shared>, policy: Policy) {
    let model = session.model().clone();
    let tok = &model.tokenizer;
    let n_ctx = session.n_ctx();
    let mut slots: Vec<Slot<'_>> = (0..session.n_seq()).map(Slot::new).collect();
    let mut batch: Vec<BatchToken> = Vec::new();
    let mut rows: Vec<usize> = Vec::new();
    let mut step = 0u64;
    loop {
        step += 1;
        let Some(starting) = admit(&shared, &mut slots, &policy) else {
            return;
        };
        let mut n_started = 0;
        for (slot, job) in starting {
            let at = Start { step, n_ctx };
            n_started += start(&mut session, &mut slots, slot, job, tok, at, &policy);
        }
        let n_cancelled = drop_cancelled(&mut session, &mut slots);
        let n_prompt = fill_batch(&slots, &policy, &mut batch, &mut rows);
        let t0 = Instant::now();
        let n_generated = n_started
            + match batch.is_empty() {
                true => 0,
                false => match session.decode_batch(&batch) {
                    Ok(logits) => {
                        let n = after_step(&mut slots, &batch, &rows, logits, tok, n_ctx);
                        take_checkpoints(&mut session, &mut slots, &policy);
                        n
                    }
                    Err(e) => fail_batch(&mut session, &mut slots, &e.to_string()),
                },
            };
        let mut state = shared.lock();
        count_step(&mut state, &slots, n_prompt, n_generated, n_cancelled, t0);
    }
}

/// Under the lock: forget cancelled queued requests; at shutdown, fail the queued ones and end
/// the running ones; hand queued requests to free slots. Waits while there is nothing to do;
/// `None` when the worker should end.
fn admit(shared: &Shared, slots: &mut [Slot<'_>], policy: &Policy) -> Option<Vec<(usize, Job)>> {
    let mut state = shared.lock();
    loop {
        let before = state.queue.len();
        state.queue.retain(|job| !job.is_cancelled());
        state.stats.requests_cancelled += (before - state.queue.len()) as u64;
        if state.shutdown {
            for job in state.queue.drain(..) {
                let _ = job
                    .events
                    .send(GenEvent::Failed("the server is shutting down".into()));
            }
            for slot in slots.iter_mut() {
                if let Some(mut run) = slot.run.take() {
                    run.finish(FinishReason::Shutdown);
                }
            }
            state.stats.requests_finished = state.stats.requests_total;
            state.stats.slots_busy = 0;
            state.stats.queue_len = 0;
            return None;
        }
        let mut starting = Vec::new();
        let mut free = slots.iter().filter(|s| s.run.is_none()).count();
        while free > 0 {
            let Some(job) = state.queue.pop_front() else {
                break;
            };
            starting.push(job);
            free -= 1;
        }
        state.stats.queue_len = state.queue.len();
        let busy = slots.iter().any(|s| s.run.is_some());
        if !starting.is_empty() || busy {
            return Some(assign(slots, starting, policy));
        }
        state = shared.wake.wait(state).unwrap_or_else(|e| e.into_inner());
    }
}

/// A free slot for each job: one whose cache holds all of its prompt with its logits, else
/// the one whose cache gives the most of it, else the one used least recently.
fn assign(slots: &[Slot<'_>], jobs: Vec<Job>, policy: &Policy) -> Vec<(usize, Job)> {
    let mut taken = vec![false; slots.len()];
    let mut out = Vec::with_capacity(jobs.len());
    for job in jobs {
        let best = slots
            .iter()
            .enumerate()
            .filter(|(i, s)| s.run.is_none() && !taken[*i])
            .max_by_key(|(_, s)| {
                let whole = s.holds_whole(&job.prompt);
                (
                    whole,
                    policy.reusable(s, &job.prompt, true),
                    u64::MAX - s.last_used,
                )
            })
            .map(|(i, _)| i);
        if let Some(i) = best {
            taken[i] = true;
            out.push((i, job));
        }
    }
    out
}

fn common_prefix(a: &[TokenId], b: &[TokenId]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// When a request starts: the worker's step, and the context of a sequence.
struct Start {
    step: u64,
    n_ctx: usize,
}

/// Start `job` in slot `i`: keep what its cache may give (or copy more from another slot),
/// forget the rest. A prompt the cache holds whole, with its logits (its own, or copied from
/// another slot), is not evaluated again: its first token is sampled now. Returns the tokens
/// generated (0 or 1).
fn start<'t>(
    session: &mut Session,
    slots: &mut [Slot<'t>],
    i: usize,
    job: Job,
    tok: &'t rgml_llm::Tokenizer,
    at: Start,
    policy: &Policy,
) -> usize {
    let (seq, n) = (slots[i].seq, job.prompt.len());
    let whole = slots[i].holds_whole(&job.prompt) || copy_whole(session, slots, i, &job.prompt);
    let mut keep = match whole {
        true => n,
        false => reuse_prefix(session, slots, i, &job.prompt, policy),
    };
    if cut_back(session, &slots[i], keep).is_err() {
        keep = 0;
        let _ = session.seq_rm(seq, 0..usize::MAX);
    }
    let slot = &mut slots[i];
    slot.truncate(keep);
    slot.last_used = at.step;
    // Whole still unless the cut failed (`truncate` then forgot the logits).
    let from_logits = slot.holds_whole(&job.prompt);
    slot.start(job, keep, tok, policy.preserved.clone());
    match from_logits {
        true => first_from_logits(slot, tok, n < at.n_ctx),
        false => 0,
    }
}

/// Cut slot `slot`'s sequence to its first `keep` tokens: forget the rest, or, where a
/// recurrent state holds more than `keep` positions, go back to the checkpoint made after
/// `keep` (an error without one: the caller then clears the sequence).
fn cut_back(session: &mut Session, slot: &Slot<'_>, keep: usize) -> rgml_llm::Result<()> {
    if keep == 0 || keep >= slot.cached.len() {
        return session.seq_rm(slot.seq, keep..usize::MAX);
    }
    match slot.checkpoint_within(keep).filter(|c| c.n_past() == keep) {
        Some(checkpoint) => session.seq_restore(slot.seq, checkpoint),
        None => session.seq_rm(slot.seq, keep..usize::MAX),
    }
}

/// After a step: a recurrent state checkpoint of each slot whose prompt the step completed.
fn take_checkpoints(session: &mut Session, slots: &mut [Slot<'_>], policy: &Policy) {
    for slot in slots.iter_mut().filter(|s| s.checkpoint_due) {
        slot.checkpoint_due = false;
        if !policy.recurrent || policy.checkpoints == 0 {
            continue;
        }
        // A failed read leaves the slot without this checkpoint: it only costs a later prompt
        // its reuse.
        if let Ok(checkpoint) = session.seq_checkpoint(slot.seq) {
            slot.add_checkpoint(checkpoint, policy.checkpoints);
        }
    }
}

/// How much of `prompt` slot `i` keeps: what its cache may give, or a longer prefix copied
/// from another slot.
fn reuse_prefix(
    session: &mut Session,
    slots: &mut [Slot<'_>],
    i: usize,
    prompt: &[TokenId],
    policy: &Policy,
) -> usize {
    let keep = policy.reusable(&slots[i], prompt, true);
    let donor = slots
        .iter()
        .enumerate()
        .filter(|&(j, _)| j != i)
        .map(|(j, s)| (j, policy.reusable(s, prompt, false)))
        .max_by_key(|&(_, n)| n);
    match donor.filter(|&(_, n)| n >= keep + MIN_COPY) {
        Some((j, n)) if copy_prefix(session, slots, j, i, n) => n,
        Some(_) => 0,
        None => keep,
    }
}

/// Replace slot `i`'s cache with the first `n` tokens of slot `j`'s (an aligned prefix),
/// copying their cells; whether that worked (slot `i` holds nothing otherwise).
fn copy_prefix(
    session: &mut Session,
    slots: &mut [Slot<'_>],
    j: usize,
    i: usize,
    n: usize,
) -> bool {
    let (src, dst) = (slots[j].seq, slots[i].seq);
    let copied = session
        .seq_rm(dst, 0..usize::MAX)
        .and_then(|()| session.seq_cp(src, dst, 0..n))
        .is_ok();
    let prefix = match copied {
        true => slots[j].cached[..n].to_vec(),
        false => Vec::new(),
    };
    let slot = &mut slots[i];
    slot.forget_checkpoints();
    slot.aligned = prefix.len();
    slot.cached = prefix;
    slot.logits_at = 0;
    copied
}

/// Copy `prompt`'s cells and logits into slot `i` from another slot (busy or not) that holds
/// the whole prompt with its logits; whether one did (the copied rows are the same bytes, so
/// the request starts as from its own cache).
fn copy_whole(session: &mut Session, slots: &mut [Slot<'_>], i: usize, prompt: &[TokenId]) -> bool {
    let Some(j) = (0..slots.len()).find(|&j| j != i && slots[j].holds_whole(prompt)) else {
        return false;
    };
    if !copy_prefix(session, slots, j, i, prompt.len()) {
        return false;
    }
    let logits = slots[j].prompt_logits.clone();
    let slot = &mut slots[i];
    slot.prompt_logits = logits;
    slot.logits_at = prompt.len();
    true
}

/// The first token of the request `slot` just started, sampled from the kept logits of its
/// whole prompt; returns the tokens generated.
fn first_from_logits(slot: &mut Slot<'_>, tok: &rgml_llm::Tokenizer, room: bool) -> usize {
    let Slot {
        run, prompt_logits, ..
    } = slot;
    let Some(r) = run else { return 0 };
    let next = r.on_logits(prompt_logits, tok, room);
    let generated = r.n_generated;
    if let Next::Finished = next {
        *run = None;
    }
    generated
}

/// End the requests whose clients went away; their slots are free from this step on.
fn drop_cancelled(session: &mut Session, slots: &mut [Slot<'_>]) -> usize {
    let mut n = 0;
    for slot in slots.iter_mut() {
        if slot.run.as_ref().is_some_and(|r| r.job.is_cancelled()) {
            let run = slot.run.take();
            // A token sampled but not evaluated is not in the cache; the cache is kept.
            drop(run);
            let _ = session.seq_rm(slot.seq, slot.cached.len()..usize::MAX);
            n += 1;
        }
    }
    n
}

/// The step's batch: each generating slot's pending token, then pieces of prompts (up to the
/// next multiple of the micro-batch, as a fresh evaluation cuts them): one piece while slots
/// generate, else pieces while the batch has fewer than `max_batch` tokens. `rows` gets the slot of each token whose
/// logits are asked, in batch order. Returns the prompt tokens in the batch.
fn fill_batch(
    slots: &[Slot<'_>],
    policy: &Policy,
    batch: &mut Vec<BatchToken>,
    rows: &mut Vec<usize>,
) -> usize {
    batch.clear();
    rows.clear();
    for (i, slot) in slots.iter().enumerate() {
        if let Some(token) = slot.run.as_ref().and_then(|r| r.pending) {
            batch.push(BatchToken {
                token,
                seq: slot.seq,
                logits: true,
            });
            rows.push(i);
        }
    }
    let n_generating = batch.len();
    let mut n_prompt = 0;
    for (i, slot) in slots.iter().enumerate() {
        let Some(run) = slot.run.as_ref().filter(|r| r.pending.is_none()) else {
            continue;
        };
        let left = run.prompt_left();
        // While slots generate, one prompt piece per step: a step's time is every running
        // stream's gap between two tokens, so prompts take turns rather than pile up.
        let full = batch.len() >= policy.max_batch || n_generating > 0;
        if left.is_empty() || (n_prompt > 0 && full) {
            continue;
        }
        let to_boundary = policy.n_ubatch - run.n_prompt_done % policy.n_ubatch;
        let take = left.len().min(to_boundary);
        let done = take == left.len();
        for (k, &token) in left[..take].iter().enumerate() {
            batch.push(BatchToken {
                token,
                seq: slot.seq,
                logits: done && k + 1 == take,
            });
        }
        if done {
            rows.push(i);
        }
        n_prompt += take;
    }
    n_prompt
}

/// Hand each row of logits to its slot; returns the tokens generated.
fn after_step(
    slots: &mut [Slot<'_>],
    batch: &[BatchToken],
    rows: &[usize],
    logits: &[f32],
    tok: &rgml_llm::Tokenizer,
    n_ctx: usize,
) -> usize {
    // The batch's tokens are now in the caches.
    for t in batch {
        // Slot `i` runs sequence `i`.
        if let Some(slot) = slots.get_mut(t.seq) {
            slot.cached.push(t.token);
            if let Some(run) = &mut slot.run {
                match run.pending {
                    Some(_) => run.pending = None,
                    None => {
                        run.n_prompt_done += 1;
                        slot.checkpoint_due = run.n_prompt_done == run.job.prompt.len();
                        // The prompt so far was evaluated in pieces from position 0.
                        if slot.aligned + 1 == slot.cached.len() {
                            slot.aligned += 1;
                        }
                    }
                }
            }
        }
    }
    let n_vocab = logits.len() / rows.len().max(1);
    let mut n_generated = 0;
    for (row, &i) in rows.iter().enumerate() {
        let slot = &mut slots[i];
        let row_logits = &logits[row * n_vocab..(row + 1) * n_vocab];
        // A prompt's last row: kept for a request with the same prompt.
        slot.keep_prompt_logits(row_logits);
        let room = slot.cached.len() < n_ctx;
        let Some(run) = &mut slot.run else { continue };
        let before = run.n_generated;
        let next = run.on_logits(row_logits, tok, room);
        n_generated += run.n_generated - before;
        if let Next::Finished = next {
            slot.run = None;
        }
    }
    n_generated
}

/// A failed step: its requests fail, and their sequences are forgotten (a failed
/// micro-batch may have left part of them in the cache).
fn fail_batch(session: &mut Session, slots: &mut [Slot<'_>], why: &str) -> usize {
    for slot in slots.iter_mut() {
        if let Some(run) = slot.run.take() {
            let _ = run.job.events.send(GenEvent::Failed(why.to_string()));
            let _ = session.seq_rm(slot.seq, 0..usize::MAX);
            slot.truncate(0);
        }
    }
    0
}

/// Count the step into the stats.
fn count_step(
    state: &mut State,
    slots: &[Slot<'_>],
    n_prompt: usize,
    n_generated: usize,
    n_cancelled: usize,
    t0: Instant,
) {
    let now = Instant::now();
    let secs = now.duration_since(t0).as_secs_f64();
    let stats = &mut state.stats;
    stats.prompt_tokens_total += n_prompt as u64;
    stats.generated_tokens_total += n_generated as u64;
    match n_prompt > 0 {
        true => stats.prompt_seconds_total += secs,
        false => stats.generation_seconds_total += secs,
    }
    stats.requests_cancelled += n_cancelled as u64;
    let busy = slots.iter().filter(|s| s.run.is_some()).count();
    stats.requests_finished = stats.requests_total - (busy + state.queue.len()) as u64;
    stats.slots_busy = busy;
    stats.queue_len = state.queue.len();
    if n_generated > 0 {
        state.recent.push_back((now, n_generated));
    }
    trim_recent(&mut state.recent, now);
}
