//! Embeddings: a sequence's hidden states pooled into one vector (llama.cpp's
//! `--embeddings`, llama-server's `/v1/embeddings`).
//!
//! This module owns the pooling types (`{arch}.pooling_type`, llama.cpp's `--pooling`), picking
//! the CLS or last row of the final-normed hidden states a session in embeddings mode computes
//! ([`crate::SessionOptions::embeddings`], [`crate::Session::embed`], which computes the mean
//! itself), and llama.cpp's
//! Euclidean normalisation (`common_embd_normalize` with `embd_normalize = 2`,
//! llama-server's default).

/// How a sequence's per-token hidden states become one vector (llama.cpp's
/// `LLAMA_POOLING_TYPE_*` but `NONE` and `RANK`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// The average over the sequence's tokens.
    Mean,
    /// The first token's (BERT's `[CLS]`).
    Cls,
    /// The last token's (a decoder model's default here: the one that saw every token).
    Last,
}

impl Pooling {
    /// The names `--pooling` takes.
    pub const NAMES: [&'static str; 3] = ["mean", "cls", "last"];

    /// The pooling named `name` (one of [`Pooling::NAMES`]).
    pub fn from_name(name: &str) -> Option<Pooling> {
        match name {
            "mean" => Some(Pooling::Mean),
            "cls" => Some(Pooling::Cls),
            "last" => Some(Pooling::Last),
            _ => None,
        }
    }

    /// The pooling of a GGUF's `{arch}.pooling_type` value: 1 mean, 2 CLS, 3 last; `None` for
    /// 0 (none: per-token vectors) and 4 (rank: a reranker's score), which pool nothing.
    pub fn from_gguf(value: u64) -> Option<Pooling> {
        match value {
            1 => Some(Pooling::Mean),
            2 => Some(Pooling::Cls),
            3 => Some(Pooling::Last),
            _ => None,
        }
    }

    /// The name of this pooling.
    pub fn name(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
        }
    }
}

/// The vector of a pooling that picks one token's among `rows` (vectors of `n_embd`, in token
/// order): CLS the first, last the last; `None` for mean, which [`crate::Session::embed`]
/// computes as llama.cpp's graph does (a product on the model's backends).
pub(crate) fn picked(rows: &[f32], n_embd: usize, pooling: Pooling) -> Option<Vec<f32>> {
    let n = rows.len() / n_embd.max(1);
    match pooling {
        Pooling::Cls => Some(rows[..n_embd.min(rows.len())].to_vec()),
        Pooling::Last => Some(rows[(n.saturating_sub(1)) * n_embd..n * n_embd].to_vec()),
        Pooling::Mean => None,
    }
}

/// Scale `v` to length 1 (a zero vector stays zero), as llama.cpp's `common_embd_normalize`
/// with `embd_normalize = 2`: the squares summed in f64, each value times the f32 inverse.
pub fn normalize(v: &mut [f32]) {
    let sum: f64 = v.iter().map(|&x| f64::from(x * x)).sum();
    let norm = sum.sqrt();
    let inv = if norm > 0.0 { (1.0 / norm) as f32 } else { 0.0 };
    v.iter_mut().for_each(|x| *x *= inv);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooling_picks_rows_and_normalizes() {
        let rows = [1.0, 2.0, 3.0, 4.0, 5.0, 9.0];
        assert_eq!(picked(&rows, 2, Pooling::Cls), Some(vec![1.0, 2.0]));
        assert_eq!(picked(&rows, 2, Pooling::Last), Some(vec![5.0, 9.0]));
        assert_eq!(picked(&rows, 2, Pooling::Mean), None);
        let mut v = vec![3.0, 4.0];
        normalize(&mut v);
        assert!((v[0] - 0.6).abs() < 1e-7 && (v[1] - 0.8).abs() < 1e-7);
        let mut zero = vec![0.0; 3];
        normalize(&mut zero);
        assert_eq!(zero, [0.0; 3]);
        assert_eq!(Pooling::from_gguf(2), Some(Pooling::Cls));
        assert_eq!(Pooling::from_gguf(0), None);
        assert_eq!(Pooling::from_name("last"), Some(Pooling::Last));
    }
}
