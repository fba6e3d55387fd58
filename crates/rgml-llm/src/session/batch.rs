//! Batches of several sequences: checking a batch, cutting it into micro-batches, and planning
//! one micro-batch: where each token goes in its sequence's cache stream, the graph key, and
//! the inputs (token ids, positions, cache rows, masks, output rows).
//!
//! This module owns [`BatchToken`] and [`UbatchPlan`]; planning changes no cache state: the
//! cells a micro-batch leaves behind are kept in the plan until the session commits them.

use super::graph::{GraphKey, GroupKey, OutputKey};
use super::kv_cache::{KvCache, StreamCells};
use crate::error::{LlmError, Result};
use crate::tokenizer::TokenId;

/// One token of a batch: the next token of sequence `seq`, and whether its logits are wanted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchToken {
    /// The token.
    pub token: TokenId,
    /// Its sequence (below the session's [`n_seq`](super::SessionOptions::n_seq)); it goes at
    /// the position after the sequence's newest one.
    pub seq: usize,
    /// Return the logits after this token.
    pub logits: bool,
}

/// One planned micro-batch: its graph key, its inputs, and what its streams' cells hold after
/// it. The memory is reused from one micro-batch to the next (decoding allocates nothing).
#[derive(Default)]
pub(super) struct UbatchPlan {
    pub(super) key: GraphKey,
    pub(super) tokens: Vec<i32>,
    pub(super) positions: Vec<i32>,
    pub(super) kv_rows: Vec<i32>,
    pub(super) local_rows: Vec<i32>,
    /// Each group's global mask, then each group's local mask, one after the other.
    pub(super) masks: Vec<f32>,
    pub(super) local_masks: Vec<f32>,
    /// Rows (in the micro-batch) whose logits are computed, for [`OutputKey::Rows`].
    pub(super) out_ids: Vec<i32>,
    /// Per stream, its cells after the micro-batch (for the streams in `touched`).
    pub(super) after: Vec<StreamCells>,
    pub(super) touched: Vec<usize>,
    /// Scratch: a group's cells.
    cells: Vec<i32>,
    /// The plan describes the micro-batch being evaluated (not yet committed).
    pub(super) ready: bool,
}

impl UbatchPlan {
    /// Plan `ubatch` (its tokens grouped by sequence, each group in order) on the cache `kv`.
    /// Errors when a stream has no room; nothing is changed then.
    pub(super) fn plan(&mut self, kv: &KvCache, ubatch: &[BatchToken]) -> Result<()> {
        self.ready = false;
        self.clear();
        if self.after.len() != kv.streams.len() {
            self.after = kv.streams.clone();
        }
        let mut start = 0;
        while start < ubatch.len() {
            let seq = ubatch[start].seq;
            let n = ubatch[start..].iter().take_while(|t| t.seq == seq).count();
            self.plan_group(kv, seq, &ubatch[start..start + n])?;
            start += n;
        }
        self.key.n_tokens = ubatch.len();
        self.key.outputs = outputs(ubatch, &mut self.out_ids);
        output_groups(ubatch, self.key.outputs, &mut self.key.out_groups);
        self.ready = true;
        Ok(())
    }

    fn clear(&mut self) {
        for v in [
            &mut self.tokens,
            &mut self.positions,
            &mut self.kv_rows,
            &mut self.local_rows,
            &mut self.out_ids,
        ] {
            v.clear();
        }
        self.masks.clear();
        self.local_masks.clear();
        self.touched.clear();
        self.key.groups.clear();
        self.key.out_groups.clear();
    }

    /// Place the `group`'s tokens (all of sequence `seq`) after the sequence's newest position.
    fn plan_group(&mut self, kv: &KvCache, seq: usize, group: &[BatchToken]) -> Result<()> {
        let n = group.len();
        if self.touched.contains(&seq) {
            return Err(LlmError::BadInput(format!(
                "sequence {seq}'s tokens are not consecutive in the micro-batch"
            )));
        }
        self.touched.push(seq);
        let after = &mut self.after[seq];
        after.copy_from(&kv.streams[seq]);
        let first = after.global.next_pos();
        if !kv.causal && first != 0 {
            return Err(LlmError::BadInput(format!(
                "sequence {seq} holds {first} positions: a model with non-causal attention \
                 encodes a sequence in one micro-batch, from empty"
            )));
        }
        after.global.place(first, n, &mut self.cells)?;
        let base = |cells: usize| seq * cells;
        self.kv_rows
            .extend(self.cells.iter().map(|&c| c + base(kv.cells) as i32));
        let n_kv = kv.attended(after.global.used_max_p1(), kv.cells);
        let at = self.masks.len();
        self.masks.resize(at + n_kv * n, f32::NEG_INFINITY);
        after
            .global
            .mask_rows(n_kv, first, kv.causal, &mut self.masks[at..]);
        let mut n_kv_local = 0;
        if let Some(local) = &mut after.local {
            local.place(first, n, &mut self.cells)?;
            self.local_rows
                .extend(self.cells.iter().map(|&c| c + base(kv.local_cells) as i32));
            n_kv_local = kv.attended(local.used_max_p1(), kv.local_cells);
            let at = self.local_masks.len();
            self.local_masks
                .resize(at + n_kv_local * n, f32::NEG_INFINITY);
            local.mask_rows(n_kv_local, first, kv.causal, &mut self.local_masks[at..]);
        }
        self.tokens.extend(group.iter().map(|t| t.token as i32));
        self.positions.extend((first..first + n).map(|p| p as i32));
        self.key.groups.push(GroupKey {
            stream: seq,
            n_tokens: n,
            n_kv,
            n_kv_local,
        });
        Ok(())
    }
}

/// Which rows of `ubatch` give logits: all, the last alone, or a list (into `out_ids`).
fn outputs(ubatch: &[BatchToken], out_ids: &mut Vec<i32>) -> OutputKey {
    let n_out = ubatch.iter().filter(|t| t.logits).count();
    let last_only = ubatch.last().is_some_and(|t| t.logits) && n_out == 1;
    if n_out == ubatch.len() {
        OutputKey::All
    } else if last_only || n_out == 0 {
        // Without outputs (a prompt's micro-batch before the last), the last row's logits
        // are computed and not read: the graph is the one the last micro-batch reuses.
        OutputKey::Last
    } else {
        out_ids.extend(
            ubatch
                .iter()
                .enumerate()
                .filter(|(_, t)| t.logits)
                .map(|(i, _)| i as i32),
        );
        OutputKey::Rows(n_out)
    }
}

/// How many output rows each sequence of `ubatch` (grouped by sequence) has, in order, into
/// `out_groups` (sequences without outputs left out; [`OutputKey::Last`] is one row).
fn output_groups(ubatch: &[BatchToken], outputs: OutputKey, out_groups: &mut Vec<usize>) {
    out_groups.clear();
    if outputs == OutputKey::Last {
        out_groups.push(1);
        return;
    }
    let mut start = 0;
    while start < ubatch.len() {
        let seq = ubatch[start].seq;
        let group = ubatch[start..].iter().take_while(|t| t.seq == seq);
        let (n, n_out) = group.fold((0, 0), |(n, o), t| (n + 1, o + usize::from(t.logits)));
        if n_out > 0 {
            out_groups.push(n_out);
        }
        start += n;
    }
}

/// Check a batch before anything is computed: tokens in the vocabulary, sequences that exist,
/// room in every sequence's context. `counts` is scratch (tokens per sequence).
pub(super) fn check_batch(
    kv: &KvCache,
    batch: &[BatchToken],
    n_vocab: usize,
    counts: &mut Vec<usize>,
) -> Result<()> {
    if batch.is_empty() {
        return Err(LlmError::BadInput("no tokens to evaluate".into()));
    }
    counts.clear();
    counts.resize(kv.n_seq, 0);
    for t in batch {
        if t.token as usize >= n_vocab {
            return Err(LlmError::InvalidToken {
                id: t.token,
                n_vocab,
            });
        }
        let count = counts.get_mut(t.seq).ok_or_else(|| {
            LlmError::BadInput(format!(
                "sequence {} of a session holding {}",
                t.seq, kv.n_seq
            ))
        })?;
        *count += 1;
    }
    for (seq, &n) in counts.iter().enumerate().filter(|(_, &n)| n > 0) {
        let used = kv.streams[seq].global.used();
        if used + n > kv.n_ctx {
            return Err(LlmError::ContextFull {
                n_ctx: kv.n_ctx,
                needed: used + n,
            });
        }
    }
    Ok(())
}

/// `batch`'s indices grouped by sequence (in the order sequences first appear, each one's
/// tokens in batch order), into `order`; `first_seen` is scratch. The sequences must exist
/// (see [`check_batch`]).
pub(super) fn group_order(
    batch: &[BatchToken],
    n_seq: usize,
    first_seen: &mut Vec<usize>,
    order: &mut Vec<usize>,
) {
    first_seen.clear();
    first_seen.resize(n_seq, usize::MAX);
    for (i, t) in batch.iter().enumerate() {
        if first_seen[t.seq] == usize::MAX {
            first_seen[t.seq] = i;
        }
    }
    order.clear();
    order.extend(0..batch.len());
    // Unique keys, so the unstable sort (which allocates nothing) keeps batch order within a
    // sequence.
    order.sort_unstable_by_key(|&i| (first_seen[batch[i].seq], i));
}

/// The next micro-batch of `batch` from `order[start..]` (its indices grouped by sequence),
/// into `picked` (batch indices); returns where the one after starts. A sequence's tokens are
/// cut into pieces of `n_ubatch` from its first token in the batch; pieces go whole, one per
/// sequence, while they fit in `n_ubatch` tokens.
pub(super) fn next_ubatch(
    batch: &[BatchToken],
    order: &[usize],
    start: usize,
    n_ubatch: usize,
    picked: &mut Vec<usize>,
) -> usize {
    picked.clear();
    let mut at = start;
    while at < order.len() {
        let seq = batch[order[at]].seq;
        // Where this sequence's tokens begin in `order`, and how far its piece goes.
        let group_start = order[..at]
            .iter()
            .rposition(|&k| batch[k].seq != seq)
            .map_or(0, |i| i + 1);
        let group_end = at
            + order[at..]
                .iter()
                .take_while(|&&k| batch[k].seq == seq)
                .count();
        let piece_end = group_end.min(at + n_ubatch - (at - group_start) % n_ubatch);
        let len = piece_end - at;
        let seen = picked.iter().any(|&k| batch[k].seq == seq);
        if !picked.is_empty() && (picked.len() + len > n_ubatch || seen) {
            break;
        }
        picked.extend_from_slice(&order[at..piece_end]);
        at = piece_end;
    }
    at
}
