//! The builders of the recurrent-layer ops (Mamba's and delta-net's): SSM_CONV and
//! GATED_DELTA_NET, with ggml's shape and type rules (`ggml_ssm_conv`,
//! `ggml_gated_delta_net`) and the ones its CPU kernels assume without checking (every head,
//! token and sequence a kernel reads exists), so a graph that builds never reads out of bounds.

use super::Context;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::op::{Op, OpKind};
use crate::tensor::{Tensor, TensorId};

fn mismatch(op: OpKind, lhs: &Tensor, rhs: &Tensor, reason: &'static str) -> Error {
    Error::ShapeMismatch {
        op,
        lhs: lhs.ne,
        rhs: rhs.ne,
        reason,
    }
}

fn invalid(op: OpKind, reason: impl Into<String>) -> Error {
    Error::InvalidArgument {
        op,
        reason: reason.into(),
    }
}

impl Context {
    /// The short causal convolution of Mamba and delta-net layers ([`Op::SsmConv`], ggml's
    /// `ggml_ssm_conv`): `sx` f32 `[d_conv - 1 + n_t, d_inner, n_s]` (each channel's window),
    /// `c` f32 `[d_conv, d_inner]` (one kernel per channel, `d_conv >= 1`). The result is f32
    /// `[d_inner, n_t, n_s]`.
    pub fn ssm_conv(&mut self, sx: TensorId, c: TensorId) -> Result<TensorId> {
        let kind = OpKind::SsmConv;
        self.expect_dtype(kind, sx, &[DType::F32], "sx must be f32")?;
        self.expect_dtype(kind, c, &[DType::F32], "the kernel must be f32")?;
        let (ts, tc) = (self.get(sx)?, self.get(c)?);
        if ts.ne[3] != 1 || tc.ne[2] != 1 || tc.ne[3] != 1 {
            return Err(mismatch(
                kind,
                ts,
                tc,
                "sx must be 3-D and the kernel a matrix",
            ));
        }
        let (d_conv, d_inner) = (tc.ne[0], tc.ne[1]);
        if d_conv == 0 {
            return Err(invalid(kind, "the kernel must have at least one tap"));
        }
        if ts.ne[1] != d_inner || ts.ne[0] + 1 < d_conv {
            return Err(mismatch(
                kind,
                ts,
                tc,
                "sx must be [d_conv - 1 + n_t, d_inner, n_s] for a [d_conv, d_inner] kernel",
            ));
        }
        let ne = [d_inner, ts.ne[0] + 1 - d_conv, ts.ne[2], 1];
        self.node(DType::F32, ne, Op::SsmConv, &[sx, c])
    }

    /// The gated delta rule ([`Op::GatedDeltaNet`], ggml's `ggml_gated_delta_net`): `q`, `k`
    /// f32 `[S_v, H_k, n_tokens, B_k]` with `B_k` dividing `n_seqs`, `v` f32 `[S_v, H,
    /// n_tokens, n_seqs]`, `g` f32 `[1 or S_v, H, n_tokens, n_seqs]`, `beta` f32 `[1, H,
    /// n_tokens, n_seqs]`, `state` f32 `[S_v, S_v, H, n_seqs]`; rows of `q`, `k`, `v` dense,
    /// `g`, `beta` and `state` contiguous; `snapshots >= 1` states kept. The result is f32
    /// `[S_v·H, n_tokens·n_seqs + snapshots·S_v·n_seqs]`.
    #[allow(clippy::too_many_arguments)]
    pub fn gated_delta_net(
        &mut self,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        g: TensorId,
        beta: TensorId,
        state: TensorId,
        snapshots: usize,
    ) -> Result<TensorId> {
        let kind = OpKind::GatedDeltaNet;
        for (t, which) in [
            (q, "q must be f32"),
            (k, "k must be f32"),
            (v, "v must be f32"),
            (g, "g must be f32"),
            (beta, "beta must be f32"),
            (state, "the state must be f32"),
        ] {
            self.expect_dtype(kind, t, &[DType::F32], which)?;
        }
        if snapshots == 0 {
            return Err(invalid(kind, "at least one state snapshot (K >= 1)"));
        }
        let tv = self.get(v)?;
        let [s_v, h, n_tokens, n_seqs] = tv.ne;
        if s_v == 0 {
            return Err(invalid(kind, "v's rows must not be empty"));
        }
        check_qk(tv, self.get(q)?)?;
        check_qk(tv, self.get(k)?)?;
        check_gates(tv, self.get(g)?, self.get(beta)?)?;
        let ts = self.get(state)?;
        if ts.ne != [s_v, s_v, h, n_seqs] {
            return Err(mismatch(
                kind,
                tv,
                ts,
                "the state must be [S_v, S_v, H, n_seqs]",
            ));
        }
        if !ts.is_contiguous() {
            return Err(Error::NotContiguous(ts.display_name().to_string()));
        }
        let rows = snapshots
            .checked_mul(s_v)
            .and_then(|r| r.checked_mul(n_seqs))
            .and_then(|r| r.checked_add(n_tokens.checked_mul(n_seqs)?))
            .ok_or(Error::SizeOverflow)?;
        let ne = [s_v.checked_mul(h).ok_or(Error::SizeOverflow)?, rows, 1, 1];
        let op = Op::GatedDeltaNet { snapshots };
        self.node(DType::F32, ne, op, &[q, k, v, g, beta, state])
    }
}

/// `q` or `k` of a delta net over `v`: `[S_v, H_k >= 1, n_tokens, B_k]`, `B_k` dividing
/// `v`'s sequences, rows dense.
fn check_qk(tv: &Tensor, t: &Tensor) -> Result<()> {
    let fits = t.ne[0] == tv.ne[0]
        && t.ne[1] > 0
        && t.ne[2] == tv.ne[2]
        && t.ne[3] > 0
        && tv.ne[3].is_multiple_of(t.ne[3]);
    if !fits {
        return Err(mismatch(
            OpKind::GatedDeltaNet,
            tv,
            t,
            "q and k must be [S_v, H_k, n_tokens, B_k] with B_k dividing v's sequences",
        ));
    }
    if !t.rows_contiguous() {
        return Err(Error::NotContiguous(t.display_name().to_string()));
    }
    Ok(())
}

/// The gates of a delta net over `v`: `g` `[1 or S_v, H, n_tokens, n_seqs]` and `beta`
/// `[1, H, n_tokens, n_seqs]`, both contiguous.
fn check_gates(tv: &Tensor, g: &Tensor, beta: &Tensor) -> Result<()> {
    let [s_v, h, n_tokens, n_seqs] = tv.ne;
    let kind = OpKind::GatedDeltaNet;
    if (g.ne[0] != 1 && g.ne[0] != s_v) || g.ne[1..] != [h, n_tokens, n_seqs] {
        return Err(mismatch(
            kind,
            tv,
            g,
            "g must be [1 or S_v, H, n_tokens, n_seqs]",
        ));
    }
    if beta.ne != [1, h, n_tokens, n_seqs] {
        return Err(mismatch(
            kind,
            tv,
            beta,
            "beta must be [1, H, n_tokens, n_seqs]",
        ));
    }
    for t in [g, beta] {
        if !t.is_contiguous() {
            return Err(Error::NotContiguous(t.display_name().to_string()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::{Context, DType, Error, Op, OpKind, RopeMode, RopeParams};

    #[test]
    fn ssm_conv_shapes_and_refusals() {
        let mut ctx = Context::new();
        let sx = ctx.new_tensor(DType::F32, &[3 + 5, 12, 2]).unwrap();
        let c = ctx.new_tensor(DType::F32, &[4, 12]).unwrap();
        let y = ctx.ssm_conv(sx, c).unwrap();
        assert_eq!(ctx[y].ne, [12, 5, 2, 1]);
        assert_eq!(ctx[y].op, Op::SsmConv);
        let short = ctx.new_tensor(DType::F32, &[2, 12, 2]).unwrap();
        let other = ctx.new_tensor(DType::F32, &[4, 11]).unwrap();
        let half = ctx.new_tensor(DType::F16, &[4, 12]).unwrap();
        let none = ctx.new_tensor(DType::F32, &[0, 12]).unwrap();
        for (a, b) in [(short, c), (sx, other), (sx, half), (sx, none)] {
            let e = ctx.ssm_conv(a, b).unwrap_err();
            assert!(matches!(
                e,
                Error::ShapeMismatch {
                    op: OpKind::SsmConv,
                    ..
                } | Error::UnsupportedDType {
                    op: OpKind::SsmConv,
                    ..
                } | Error::InvalidArgument {
                    op: OpKind::SsmConv,
                    ..
                }
            ));
        }
    }

    #[test]
    fn gated_delta_net_shapes_and_refusals() {
        let mut ctx = Context::new();
        let (s_v, h, t, b) = (8, 4, 3, 2);
        let mut f32s = |ne: &[usize]| ctx.new_tensor(DType::F32, ne).unwrap();
        let q = f32s(&[s_v, 2, t, b]);
        let k = f32s(&[s_v, 2, t, 1]);
        let v = f32s(&[s_v, h, t, b]);
        let g = f32s(&[1, h, t, b]);
        let gv = f32s(&[s_v, h, t, b]);
        let beta = f32s(&[1, h, t, b]);
        let s = f32s(&[s_v, s_v, h, b]);
        let bad_q = f32s(&[s_v, 2, t + 1, b]);
        let bad_g = f32s(&[2, h, t, b]);
        let odd_k = f32s(&[s_v, 2, t, 3]);
        let y = ctx.gated_delta_net(q, k, v, g, beta, s, 3).unwrap();
        assert_eq!(ctx[y].ne, [s_v * h, t * b + 3 * s_v * b, 1, 1]);
        assert_eq!(ctx[y].op, Op::GatedDeltaNet { snapshots: 3 });
        assert_eq!(ctx[y].src.len(), 6);
        assert!(ctx.gated_delta_net(q, k, v, gv, beta, s, 1).is_ok());
        for (q, k, g, snapshots) in [
            (bad_q, k, g, 1),
            (q, odd_k, g, 1),
            (q, k, bad_g, 1),
            (q, k, g, 0),
        ] {
            assert!(ctx.gated_delta_net(q, k, v, g, beta, s, snapshots).is_err());
        }
        // beta and the state in each other's place.
        assert!(ctx.gated_delta_net(q, k, v, g, s, beta, 1).is_err());
    }

    #[test]
    fn rope_multi_takes_four_positions_and_ggmls_sections() {
        let mut ctx = Context::new();
        let x = ctx.new_tensor(DType::F32, &[16, 2, 3]).unwrap();
        let pos4 = ctx.new_tensor(DType::I32, &[12]).unwrap();
        let pos1 = ctx.new_tensor(DType::I32, &[3]).unwrap();
        let p = |sections| RopeParams::new(RopeMode::Imrope { sections }, 16, 10000.0);
        assert!(ctx.rope(x, pos4, p([3, 3, 2, 0])).is_ok());
        assert!(ctx.rope(x, pos1, p([3, 3, 2, 0])).is_err());
        // All of the first three 0, or more pairs than the row has values.
        assert!(ctx.rope(x, pos4, p([0, 0, 0, 4])).is_err());
        assert!(ctx.rope(x, pos4, p([9, 4, 4, 0])).is_err());
        let text = RopeParams::new(RopeMode::Neox, 16, 10000.0);
        assert!(ctx.rope(x, pos4, text).is_err());
        assert!(ctx.rope(x, pos1, text).is_ok());
    }
}
