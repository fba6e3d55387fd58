//! [`Session::embed`]: a sequence's tokens evaluated in embeddings mode and pooled, mean
//! pooling as llama.cpp's graph computes it.

use super::{BatchToken, Session};
use crate::config::ModelConfig;
use crate::embed::{picked, Pooling};
use crate::error::{LlmError, MemoryUse, Result};
use rgml::{DType, Graph, TensorFlags};

/// An encoder's sequences (each encoded whole, from position 0) fit its learned position
/// embeddings (`n_ctx_train` of them).
pub(super) fn check_positions(c: &ModelConfig, batch: &[BatchToken], n_seq: usize) -> Result<()> {
    let mut counts = vec![0usize; n_seq];
    for t in batch {
        if let Some(n) = counts.get_mut(t.seq) {
            *n += 1;
        }
    }
    match counts.iter().find(|&&n| n > c.n_ctx_train) {
        Some(n) => Err(LlmError::BadInput(format!(
            "{n} tokens in one sequence: a {} model has {} positions",
            c.arch, c.n_ctx_train
        ))),
        None => Ok(()),
    }
}

impl Session {
    /// The pooled embedding of `tokens` (not normalised): they are evaluated as sequence 0
    /// from position 0, whatever it held (it is cleared first and holds them after). The
    /// session must compute embeddings ([`crate::SessionOptions::embeddings`]).
    ///
    /// A model with non-causal attention (an encoder) computes every token's row, as
    /// llama.cpp's encoder does, and pools them here; its tokens must fit one micro-batch.
    ///
    /// Errors: a session computing logits, no tokens, an encoder's input longer than
    /// [`Session::n_ubatch`] ([`LlmError::BadInput`]), and those of [`Session::decode_batch`].
    pub fn embed(&mut self, tokens: &[u32], pooling: Pooling) -> Result<Vec<f32>> {
        let mut all = self.embed_batch(&[tokens], pooling)?;
        all.pop()
            .ok_or_else(|| LlmError::BadInput("an embedding of no tokens".into()))
    }

    /// [`Session::embed`] of several inputs at once: input `i` is sequence `i` (each cleared
    /// first, from position 0), and they go through [`Session::decode_batch`] together, so
    /// inputs that fit one micro-batch share one graph. At most [`Session::n_seq`] inputs;
    /// each input's vector is the one it gets embedded alone (each sequence attends to its own
    /// cells; the products over the weights are per token, with the caveat
    /// [`Session::decode_batch`] states for a few weight types).
    ///
    /// Errors: as [`Session::embed`] for each input, and more inputs than sequences
    /// ([`LlmError::BadInput`]), all before anything is computed.
    pub fn embed_batch(&mut self, inputs: &[&[u32]], pooling: Pooling) -> Result<Vec<Vec<f32>>> {
        if !self.embeddings() {
            return Err(LlmError::BadInput(
                "embeddings from a session that computes logits".into(),
            ));
        }
        if inputs.len() > self.n_seq() {
            return Err(LlmError::BadInput(format!(
                "{} inputs to embed at once: the session holds {} sequences",
                inputs.len(),
                self.n_seq()
            )));
        }
        let all = !self.model().config.causal;
        for tokens in inputs {
            if tokens.is_empty() {
                return Err(LlmError::BadInput("an embedding of no tokens".into()));
            }
            if all && tokens.len() > self.n_ubatch() {
                return Err(LlmError::BadInput(format!(
                    "{} tokens to encode: a model with non-causal attention encodes its input \
                     in one micro-batch, at most {} tokens (--ubatch-size)",
                    tokens.len(),
                    self.n_ubatch()
                )));
            }
        }
        for seq in 0..inputs.len() {
            self.seq_rm(seq, 0..usize::MAX)?;
        }
        // Each input's rows: every token's for an encoder and for mean pooling, else the one
        // the pooling picks.
        let flagged = |i: usize, last: usize| match pooling {
            _ if all => true,
            Pooling::Mean => true,
            Pooling::Cls => i == 0,
            Pooling::Last => i == last,
        };
        let batch: Vec<BatchToken> = inputs
            .iter()
            .enumerate()
            .flat_map(|(seq, tokens)| {
                let last = tokens.len() - 1;
                tokens
                    .iter()
                    .enumerate()
                    .map(move |(i, &token)| BatchToken {
                        token,
                        seq,
                        logits: flagged(i, last),
                    })
            })
            .collect();
        let n_embd = self.model().config.n_embd;
        let rows = self.decode_batch(&batch)?.to_vec();
        let mut out = Vec::with_capacity(inputs.len());
        let mut at = 0;
        for tokens in inputs {
            let last = tokens.len() - 1;
            let n = (0..tokens.len()).filter(|&i| flagged(i, last)).count();
            let mine = &rows[at * n_embd..(at + n) * n_embd];
            at += n;
            out.push(match picked(mine, n_embd, pooling) {
                Some(row) => row,
                None => self.own_graph(|s| s.mean_pool(mine, n_embd))?,
            });
        }
        Ok(out)
    }

    /// The mean of `rows` (vectors of `n_embd`) as llama.cpp's `build_pooling` computes it:
    /// the rows transposed, times a column of `1 / n`, one MUL_MAT on the session's backends,
    /// so the sums follow the dot product ggml runs (a sum of the rows, then a division,
    /// rounds differently). A graph of the session's own ([`Session::own_graph`]).
    fn mean_pool(&mut self, rows: &[f32], n_embd: usize) -> Result<Vec<f32>> {
        let n = rows.len() / n_embd.max(1);
        let ctx = &mut self.ctx;
        let embd = ctx.new_tensor(DType::F32, &[n_embd, n])?;
        let mean = ctx.new_tensor(DType::F32, &[n, 1])?;
        for input in [embd, mean] {
            ctx.set_flags(input, TensorFlags::INPUT)?;
        }
        let by_dim = ctx.transpose(embd)?;
        let by_dim = ctx.cont(by_dim)?;
        let pooled = ctx.mul_mat(by_dim, mean)?;
        ctx.set_output(pooled)?;
        let mut graph = Graph::new();
        graph.expand(ctx, pooled)?;
        self.sched.reset();
        self.sched
            .alloc_graph(&mut self.ctx, &graph)
            .map_err(|e| LlmError::memory(e, MemoryUse::Compute))?;
        self.ctx.tensor_set_f32(embd, rows)?;
        // llama.cpp's `inp_mean`: each token's weight, `1 / n` in f32.
        let weight = 1.0 / n as f32;
        self.ctx.tensor_set_f32(mean, &vec![weight; n])?;
        self.sched.graph_compute(&mut self.ctx, &graph)?;
        Ok(self.ctx.tensor_get_f32(pooled)?)
    }
}
