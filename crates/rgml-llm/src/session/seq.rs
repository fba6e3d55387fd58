//! A session's sequences: their lengths, and removing, copying and shifting their positions
//! (llama.cpp's `llama_memory_seq_rm`, `_seq_cp`, `_seq_add`), so that a new request can keep
//! the common prefix a sequence already holds, or take another sequence's.
//!
//! This module owns those operations on the cell tables and the cache data they need: copying
//! a stream's K and V rows, and the K-shift graph that rotates moved keys by their distance.

use super::Session;
use crate::error::{LlmError, MemoryUse, Result};
use rgml::{DType, Graph, TensorFlags, TensorId};
use std::ops::Range;

/// A sequence's recurrent states after its first [`n_past`](SeqCheckpoint::n_past) positions
/// ([`Session::seq_checkpoint`]), in host memory.
#[derive(Clone)]
pub struct SeqCheckpoint {
    n_past: usize,
    /// Each recurrent state tensor's row of the sequence, in the session's order.
    rows: Vec<u8>,
}

impl SeqCheckpoint {
    /// The positions the states follow.
    pub fn n_past(&self) -> usize {
        self.n_past
    }

    /// Bytes held.
    pub fn size(&self) -> usize {
        self.rows.len()
    }
}

impl std::fmt::Debug for SeqCheckpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SeqCheckpoint")
            .field("n_past", &self.n_past)
            .field("bytes", &self.rows.len())
            .finish()
    }
}

impl Session {
    /// Sequences the session holds (its [`SessionOptions::n_seq`](super::SessionOptions)).
    pub fn n_seq(&self) -> usize {
        self.kv.n_seq
    }

    /// The position sequence `seq`'s next token goes to: one after its newest (0 when empty or
    /// when there is no such sequence).
    pub fn seq_len(&self, seq: usize) -> usize {
        self.kv.streams.get(seq).map_or(0, |s| s.global.next_pos())
    }

    /// Cells sequence `seq` holds in the global layers (its share of the context used).
    pub fn seq_cells_used(&self, seq: usize) -> usize {
        self.kv.streams.get(seq).map_or(0, |s| s.global.used())
    }

    fn check_seq(&self, seq: usize) -> Result<()> {
        match seq < self.kv.n_seq {
            true => Ok(()),
            false => Err(LlmError::BadInput(format!(
                "sequence {seq} of a session holding {}",
                self.kv.n_seq
            ))),
        }
    }

    /// Forget sequence `seq`'s positions in `range` (`0..usize::MAX`: all of them). Its next
    /// token goes after the newest position left.
    ///
    /// A model with recurrent layers (Qwen3.5) keeps one state per sequence, of all its
    /// positions: as in llama.cpp, its newest positions cannot be removed without the older
    /// ones (a range from a position after 0 through the newest is an error, and nothing
    /// changes); removing every position clears the state too.
    pub fn seq_rm(&mut self, seq: usize, range: Range<usize>) -> Result<()> {
        self.check_seq(seq)?;
        let next = self.seq_len(seq);
        let rolls_back = range.start > 0 && range.start < next && range.end >= next;
        if self.model.config.recurrent.is_some() && rolls_back {
            return Err(LlmError::BadInput(format!(
                "sequence {seq}: positions {}.. cannot be removed from a recurrent state of \
                 {next} positions (only all of them)",
                range.start
            )));
        }
        let stream = &mut self.kv.streams[seq];
        stream.global.remove(range.clone());
        if let Some(local) = &mut stream.local {
            local.remove(range);
        }
        Ok(())
    }

    /// Make `dst` hold `src`'s positions in `range`, with their keys and values, in the same
    /// cells; what `dst` held in those cells is forgotten. To start `dst` as a copy of a prefix
    /// of `src`: clear it (`seq_rm(dst, 0..usize::MAX)`), then copy `0..prefix_len`.
    ///
    /// With recurrent layers, `dst` takes `src`'s state, which holds all of `src`'s positions:
    /// a range that leaves out some of them is an error, and nothing changes.
    pub fn seq_cp(&mut self, src: usize, dst: usize, range: Range<usize>) -> Result<()> {
        self.check_seq(src)?;
        self.check_seq(dst)?;
        if src == dst {
            return Ok(());
        }
        let n_src = self.seq_len(src);
        let partial = range.start > 0 || range.end < n_src;
        if self.model.config.recurrent.is_some() && partial && n_src > 0 {
            return Err(LlmError::BadInput(format!(
                "sequence {src}'s recurrent state holds its {n_src} positions: it is copied \
                 whole or not at all (asked: {}..{})",
                range.start, range.end
            )));
        }
        // Queued micro-batches may still write the cache.
        self.sched.synchronize()?;
        let mut copied = Vec::new();
        let (from, to) = pick_two(&mut self.kv.streams, src, dst);
        to.global
            .copy_range(&from.global, range.clone(), &mut copied);
        let global = std::mem::take(&mut copied);
        let mut local = Vec::new();
        if let (Some(f), Some(t)) = (&from.local, &mut to.local) {
            t.copy_range(f, range, &mut local);
        }
        for il in 0..self.model.config.n_layer {
            if self.model.config.is_recurrent(il) {
                self.copy_states(il, src, dst)?;
                continue;
            }
            let (cells, per_stream) = match self.model.config.is_local(il) {
                true => (&local, self.kv.local_cells),
                false => (&global, self.kv.cells),
            };
            self.copy_cells(il, cells, per_stream, src, dst)?;
        }
        Ok(())
    }

    /// The recurrent state of sequence `seq` now, after its [`seq_len`](Session::seq_len)
    /// positions: what [`Session::seq_restore`] takes it back to (llama-server's context
    /// checkpoints). A chat's next turn often shares only part of what the sequence holds (a
    /// reasoning model's template drops the last answer's thinking), and a recurrent state
    /// cannot be cut back to a shorter prefix, so without a checkpoint the whole prompt is
    /// evaluated again.
    ///
    /// Errors: a sequence outside the session, a model without recurrent layers
    /// ([`LlmError::BadInput`]).
    pub fn seq_checkpoint(&mut self, seq: usize) -> Result<SeqCheckpoint> {
        self.check_seq(seq)?;
        if self.model.config.recurrent.is_none() {
            return Err(LlmError::BadInput(
                "a checkpoint of a model without recurrent layers".into(),
            ));
        }
        // Queued micro-batches may still write the states.
        self.sched.synchronize()?;
        let mut rows = Vec::new();
        for &t in self.kv.conv.iter().chain(&self.kv.ssm).flatten() {
            let row = self.ctx[t].nb[1];
            let at = rows.len();
            rows.resize(at + row, 0);
            self.ctx.tensor_get(t, seq * row, &mut rows[at..])?;
        }
        Ok(SeqCheckpoint {
            n_past: self.seq_len(seq),
            rows,
        })
    }

    /// Take sequence `seq` back to `checkpoint`, which [`Session::seq_checkpoint`] made of it
    /// when it held the first [`SeqCheckpoint::n_past`] of the positions it holds now: the
    /// newer positions are forgotten and the recurrent state is the checkpoint's, so the next
    /// token goes to position `n_past` with the logits it had then. (A checkpoint of another
    /// sequence, or of positions since removed, gives that state to these positions: the
    /// caller keeps checkpoints with the positions they were made of.)
    ///
    /// Errors: a checkpoint of more positions than `seq` holds, or of another model's state
    /// ([`LlmError::BadInput`]); nothing changes then.
    pub fn seq_restore(&mut self, seq: usize, checkpoint: &SeqCheckpoint) -> Result<()> {
        self.check_seq(seq)?;
        let next = self.seq_len(seq);
        let states: Vec<TensorId> = self
            .kv
            .conv
            .iter()
            .chain(&self.kv.ssm)
            .flatten()
            .copied()
            .collect();
        let bytes: usize = states.iter().map(|&t| self.ctx[t].nb[1]).sum();
        if checkpoint.n_past > next || checkpoint.rows.len() != bytes || states.is_empty() {
            return Err(LlmError::BadInput(format!(
                "sequence {seq} holds {next} positions and {bytes} bytes of state: a checkpoint \
                 of {} positions and {} bytes does not fit it",
                checkpoint.n_past,
                checkpoint.rows.len()
            )));
        }
        // Queued micro-batches may still read and write the states.
        self.sched.synchronize()?;
        let mut at = 0;
        for t in states {
            let row = self.ctx[t].nb[1];
            self.ctx
                .tensor_set(t, seq * row, &checkpoint.rows[at..at + row])?;
            at += row;
        }
        let stream = &mut self.kv.streams[seq];
        stream.global.remove(checkpoint.n_past..usize::MAX);
        if let Some(local) = &mut stream.local {
            local.remove(checkpoint.n_past..usize::MAX);
        }
        Ok(())
    }

    /// Copy recurrent layer `il`'s states from stream `src` to stream `dst`.
    fn copy_states(&mut self, il: usize, src: usize, dst: usize) -> Result<()> {
        let states = [self.kv.conv[il], self.kv.ssm[il]];
        let mut buf = Vec::new();
        for t in states.into_iter().flatten() {
            let row = self.ctx[t].nb[1];
            buf.resize(row, 0);
            self.ctx.tensor_get(t, src * row, &mut buf)?;
            self.ctx.tensor_set(t, dst * row, &buf)?;
        }
        Ok(())
    }

    /// Copy layer `il`'s K and V of `cells` from stream `src` to stream `dst`.
    fn copy_cells(
        &mut self,
        il: usize,
        cells: &[usize],
        per_stream: usize,
        src: usize,
        dst: usize,
    ) -> Result<()> {
        let n_embd_kv = self.model.config.heads(il).n_embd_kv();
        let (Some(k), Some(v)) = (self.kv.k[il], self.kv.v[il]) else {
            return Ok(());
        };
        let cell_bytes = |t: rgml::TensorId| {
            self.ctx[t]
                .dtype
                .row_bytes(n_embd_kv)
                .map_err(|e| LlmError::BadConfig(format!("KV cache: {e}")))
        };
        let (k_row, v_row) = (cell_bytes(k)?, cell_bytes(v)?);
        let mut buf = Vec::new();
        for run in runs(cells) {
            // K (and V with flash attention): one row per cell, so a run of cells is one span.
            let mut copy_rows = |t: rgml::TensorId, row: usize| -> Result<()> {
                buf.resize(run.len() * row, 0);
                self.ctx
                    .tensor_get(t, (src * per_stream + run.start) * row, &mut buf)?;
                self.ctx
                    .tensor_set(t, (dst * per_stream + run.start) * row, &buf)?;
                Ok(())
            };
            copy_rows(k, k_row)?;
            if self.kv.flash_attn {
                copy_rows(v, v_row)?;
                continue;
            }
            // V transposed (f16 or f32): each dimension's row holds every stream's cells, a run
            // is one span of it.
            let es = self.ctx[v].dtype.block_bytes();
            let dim_row = per_stream * self.kv.n_seq * es;
            buf.resize(run.len() * es, 0);
            for d in 0..n_embd_kv {
                let at = |stream: usize| d * dim_row + (stream * per_stream + run.start) * es;
                self.ctx.tensor_get(v, at(src), &mut buf)?;
                self.ctx.tensor_set(v, at(dst), &buf)?;
            }
        }
        Ok(())
    }

    /// Move sequence `seq`'s positions in `range` by `delta` (those that would fall below 0 are
    /// forgotten), and rotate their cached keys by the same distance (llama.cpp's K-shift):
    /// e.g. after removing `a..b`, `seq_shift(seq, b..usize::MAX, a - b)` closes the gap. As in
    /// llama.cpp, the rotated keys are close to, not exactly, those the new positions would
    /// have been given. A quantized K cache is dequantized, its Walsh-Hadamard rotation undone,
    /// rotated by RoPE, rotated again and quantized back, as llama.cpp does it.
    pub fn seq_shift(&mut self, seq: usize, range: Range<usize>, delta: isize) -> Result<()> {
        self.check_seq(seq)?;
        if delta == 0 {
            return Ok(());
        }
        let stream = &mut self.kv.streams[seq];
        let mut moved = Vec::new();
        stream.global.shift(range.clone(), delta, &mut moved);
        let global = shift_of(&moved, stream.global.size());
        let local = match &mut stream.local {
            Some(local) => {
                local.shift(range, delta, &mut moved);
                Some(shift_of(&moved, local.size()))
            }
            None => None,
        };
        self.k_shift(seq, &global, local.as_deref())
    }

    /// Rotate stream `seq`'s keys by `global` (per cell of a global layer) and `local`.
    fn k_shift(&mut self, seq: usize, global: &[i32], local: Option<&[i32]>) -> Result<()> {
        self.own_graph(|s| s.k_shift_graph(seq, global, local))
    }

    fn k_shift_graph(&mut self, seq: usize, global: &[i32], local: Option<&[i32]>) -> Result<()> {
        let c = &self.model.config;
        let k_type = (self.kv.k.iter().flatten().next()).map_or(DType::F16, |&k| self.ctx[k].dtype);
        let row_bytes = |n: usize| k_type.row_bytes(n).map_err(rgml::Error::from);
        let mut graph = Graph::new();
        let mut inputs: Vec<(TensorId, &[i32])> = Vec::new();
        // The rotations of a quantized K cache (see `kv_cache::rotations`): one input per
        // size.
        let mut rots: Vec<TensorId> = Vec::new();
        for il in 0..c.n_layer {
            // Recurrent layers keep no positions to rotate.
            let Some(k_cache) = self.kv.k[il] else {
                continue;
            };
            let (shift, cells) = match (local, c.is_local(il)) {
                (Some(l), true) => (l, self.kv.local_cells),
                _ => (global, self.kv.cells),
            };
            if shift.iter().all(|&d| d == 0) {
                continue;
            }
            let h = c.heads(il);
            let (hd, n_head_kv) = (h.head_dim, h.n_head_kv);
            let (head_bytes, row) = (row_bytes(hd)?, row_bytes(h.n_embd_kv())?);
            let pos = self.ctx.new_tensor(DType::I32, &[cells])?;
            self.ctx.set_flags(pos, TensorFlags::INPUT)?;
            inputs.push((pos, shift));
            let k = self.ctx.view(
                k_cache,
                &[hd, n_head_kv, cells],
                &[head_bytes, row],
                seq * cells * row,
            )?;
            let k_rot = match c.is_local(il) && local.is_some() {
                true => self.kv.local_k_rot,
                false => self.kv.k_rot,
            };
            let rot = match k_rot {
                Some(n) => Some(rotation_input(&mut self.ctx, &mut rots, n)?),
                None => None,
            };
            let k32 = self.ctx.new_tensor(DType::F32, &[hd, n_head_kv, cells])?;
            let mut k32 = self.ctx.cpy(k, k32)?;
            if let Some(rot) = rot {
                k32 = crate::arch::blocks::hadamard(&mut self.ctx, rot, k32)?;
            }
            let rope = crate::arch::blocks::rope_params(c, il);
            let factors = crate::arch::blocks::layer_rope_factors(c, il, self.rope_factors);
            let mut rotated = self.ctx.rope_ext(k32, pos, factors, rope)?;
            if let Some(rot) = rot {
                rotated = crate::arch::blocks::hadamard(&mut self.ctx, rot, rotated)?;
            }
            let back = self.ctx.cpy(rotated, k)?;
            graph.expand(&self.ctx, back)?;
        }
        if inputs.is_empty() {
            return Ok(());
        }
        self.sched.reset();
        self.sched
            .alloc_graph(&mut self.ctx, &graph)
            .map_err(|e| LlmError::memory(e, MemoryUse::Compute))?;
        for (pos, shift) in inputs {
            self.ctx.tensor_set_i32(pos, shift)?;
        }
        for rot in rots {
            let n = self.ctx[rot].ne[0];
            let matrix = self
                .staging
                .rotations
                .entry(n)
                .or_insert_with(|| super::kv_cache::hadamard_matrix(n));
            self.ctx.tensor_set_f32(rot, matrix)?;
        }
        self.sched.graph_compute(&mut self.ctx, &graph)?;
        Ok(())
    }
}

/// The `n × n` rotation input among `rots`, added there if new.
fn rotation_input(ctx: &mut rgml::Context, rots: &mut Vec<TensorId>, n: usize) -> Result<TensorId> {
    if let Some(&rot) = rots.iter().find(|&&r| ctx[r].ne[0] == n) {
        return Ok(rot);
    }
    let rot = ctx.new_tensor(DType::F32, &[n, n])?;
    ctx.set_flags(rot, TensorFlags::INPUT)?;
    rots.push(rot);
    Ok(rot)
}

/// Per cell of a table of `size`, the distance it moved (0: not moved).
fn shift_of(moved: &[(usize, isize)], size: usize) -> Vec<i32> {
    let mut shift = vec![0i32; size];
    for &(cell, delta) in moved {
        shift[cell] = delta.clamp(i32::MIN as isize, i32::MAX as isize) as i32;
    }
    shift
}

/// Runs of consecutive cells in the ascending `cells`.
fn runs(cells: &[usize]) -> Vec<Range<usize>> {
    let mut out: Vec<Range<usize>> = Vec::new();
    for &c in cells {
        match out.last_mut() {
            Some(r) if r.end == c => r.end += 1,
            _ => out.push(c..c + 1),
        }
    }
    out
}

/// `&streams[a]` and `&mut streams[b]` (`a != b`).
fn pick_two<T>(streams: &mut [T], a: usize, b: usize) -> (&T, &mut T) {
    if a < b {
        let (lo, hi) = streams.split_at_mut(b);
        (&lo[a], &mut hi[0])
    } else {
        let (lo, hi) = streams.split_at_mut(a);
        (&hi[0], &mut lo[b])
    }
}
