//! [`Session::embed`]: a sequence's tokens evaluated in embeddings mode and pooled.

use super::{BatchToken, Session};
use crate::config::ModelConfig;
use crate::embed::{pool, Pooling};
use crate::error::{LlmError, Result};

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
        if !self.embeddings() {
            return Err(LlmError::BadInput(
                "embeddings from a session that computes logits".into(),
            ));
        }
        if tokens.is_empty() {
            return Err(LlmError::BadInput("an embedding of no tokens".into()));
        }
        let all = !self.model().config.causal;
        if all && tokens.len() > self.n_ubatch() {
            return Err(LlmError::BadInput(format!(
                "{} tokens to encode: a model with non-causal attention encodes its input in one \
                 micro-batch, at most {} tokens (--ubatch-size)",
                tokens.len(),
                self.n_ubatch()
            )));
        }
        self.seq_rm(0, 0..usize::MAX)?;
        let last = tokens.len() - 1;
        let batch: Vec<BatchToken> = tokens
            .iter()
            .enumerate()
            .map(|(i, &token)| BatchToken {
                token,
                seq: 0,
                logits: match pooling {
                    _ if all => true,
                    Pooling::Mean => true,
                    Pooling::Cls => i == 0,
                    Pooling::Last => i == last,
                },
            })
            .collect();
        let n_embd = self.model().config.n_embd;
        let rows = self.decode_batch(&batch)?;
        Ok(pool(rows, n_embd, pooling))
    }
}
