//! [`Session::embed`]: a sequence's tokens evaluated in embeddings mode and pooled.

use super::{BatchToken, Session};
use crate::embed::{pool, Pooling};
use crate::error::{LlmError, Result};

impl Session {
    /// The pooled embedding of `tokens` (not normalised): they are evaluated as sequence 0
    /// from position 0, whatever it held (it is cleared first and holds them after). The
    /// session must compute embeddings ([`crate::SessionOptions::embeddings`]).
    ///
    /// Errors: a session computing logits, no tokens ([`LlmError::BadInput`]), and those of
    /// [`Session::decode_batch`].
    pub fn embed(&mut self, tokens: &[u32], pooling: Pooling) -> Result<Vec<f32>> {
        if !self.embeddings() {
            return Err(LlmError::BadInput(
                "embeddings from a session that computes logits".into(),
            ));
        }
        if tokens.is_empty() {
            return Err(LlmError::BadInput("an embedding of no tokens".into()));
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
