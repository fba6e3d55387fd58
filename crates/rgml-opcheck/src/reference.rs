//! The float64 reference: an interpreter that evaluates a graph node by node with ggml's
//! semantics, independent of every backend's kernels.
//!
//! Memory is modelled per *root* tensor (a tensor that is not a view) as one f64 per element
//! slot, addressed through the tensor's byte strides exactly as a kernel would address bytes.
//! Views (RESHAPE, VIEW, PERMUTE, TRANSPOSE) are therefore free: reading a view walks its strides
//! over its root's slots, and ops that write into a view (CPY, SET_ROWS) write into the root.
//! Values written into a tensor are rounded to its dtype (f16, bf16, or the quantize/dequantize
//! round trip) so that the reference sees what a later op would read from real storage.
//!
//! This module owns the op semantics; it must not call any backend.

use crate::codec;
use rgml::op::{Op, RopeMode, RopeParams, UnaryOp};
use rgml::{Context, Error, Graph, Result, Tensor, TensorId};
use std::collections::HashMap;

fn err(msg: impl Into<String>) -> Error {
    Error::Backend {
        backend: "reference".into(),
        message: msg.into(),
    }
}

/// Element slots of root tensors.
#[derive(Clone, Debug, Default)]
pub struct Mem {
    roots: HashMap<TensorId, Vec<f64>>,
}

/// Number of element slots a root tensor spans.
fn n_slots(t: &Tensor) -> usize {
    t.nbytes() / t.dtype.block_bytes() * t.dtype.block_size()
}

/// Slot of element `i` of `t` (whose first element is `base` bytes into its root).
fn slot(t: &Tensor, base: usize, i: [usize; 4]) -> usize {
    let byte = base + t.offset_of(i);
    let bs = t.dtype.block_size();
    if bs == 1 {
        byte / t.dtype.block_bytes()
    } else {
        byte / t.dtype.block_bytes() * bs + i[0] % bs
    }
}

/// Linear index of `(i0, i1, i2, i3)` in a contiguous tensor of shape `ne`.
pub fn lin(ne: [usize; 4], i0: usize, i1: usize, i2: usize, i3: usize) -> usize {
    ((i3 * ne[2] + i2) * ne[1] + i1) * ne[0] + i0
}

impl Mem {
    /// Empty memory.
    pub fn new() -> Self {
        Self::default()
    }

    /// Set root `id`'s slots from the bytes it holds.
    pub fn load(&mut self, ctx: &Context, id: TensorId, bytes: &[u8]) -> Result<()> {
        let t = ctx.get(id)?;
        if t.view_src.is_some() {
            return Err(err(format!("{} is a view, not a root", t.display_name())));
        }
        self.roots.insert(id, codec::decode(t.dtype, bytes)?);
        Ok(())
    }

    /// The slots of root `id`, if known.
    pub fn root(&self, id: TensorId) -> Option<&[f64]> {
        self.roots.get(&id).map(Vec::as_slice)
    }

    fn locate<'a>(&self, ctx: &'a Context, id: TensorId) -> Result<(&'a Tensor, TensorId, usize)> {
        let t = ctx.get(id)?;
        Ok(match t.view_src {
            Some(r) => (t, r, t.view_offset),
            None => (t, id, 0),
        })
    }

    /// Every element of `id` in logical order (dim 0 fastest).
    pub fn read(&self, ctx: &Context, id: TensorId) -> Result<Vec<f64>> {
        let (t, root, base) = self.locate(ctx, id)?;
        let mem = self
            .roots
            .get(&root)
            .ok_or_else(|| err(format!("no values for the root of '{}'", t.display_name())))?;
        let ne = t.ne;
        let mut out = Vec::with_capacity(t.nelements());
        for i3 in 0..ne[3] {
            for i2 in 0..ne[2] {
                for i1 in 0..ne[1] {
                    for i0 in 0..ne[0] {
                        let s = slot(t, base, [i0, i1, i2, i3]);
                        out.push(*mem.get(s).ok_or_else(|| {
                            err(format!("read past the end of '{}'", t.display_name()))
                        })?);
                    }
                }
            }
        }
        Ok(out)
    }

    /// Store row `(i1, i2, i3)` of `id`, rounded to its dtype.
    fn write_row(
        &mut self,
        ctx: &Context,
        id: TensorId,
        i: [usize; 3],
        values: &mut [f64],
    ) -> Result<()> {
        let (t, root, base) = self.locate(ctx, id)?;
        codec::round_trip(t.dtype, values)?;
        let n = n_slots(&ctx[root]);
        let mem = self.roots.entry(root).or_insert_with(|| vec![f64::NAN; n]);
        for (i0, v) in values.iter().enumerate() {
            let s = slot(t, base, [i0, i[0], i[1], i[2]]);
            *mem.get_mut(s)
                .ok_or_else(|| err(format!("write past the end of '{}'", t.display_name())))? = *v;
        }
        Ok(())
    }

    /// Store all elements of `id` (logical order), rounded to its dtype.
    fn write(&mut self, ctx: &Context, id: TensorId, values: &[f64]) -> Result<()> {
        let ne = ctx.get(id)?.ne;
        if values.len() != ne.iter().product::<usize>() {
            return Err(err("value count does not match the tensor"));
        }
        let mut row = vec![0.0; ne[0]];
        for i3 in 0..ne[3] {
            for i2 in 0..ne[2] {
                for i1 in 0..ne[1] {
                    let at = lin(ne, 0, i1, i2, i3);
                    row.copy_from_slice(&values[at..at + ne[0]]);
                    self.write_row(ctx, id, [i1, i2, i3], &mut row)?;
                }
            }
        }
        Ok(())
    }
}

/// Evaluate every node of `graph` into `mem` (which must hold the leafs' values).
pub fn eval(ctx: &Context, graph: &Graph, mem: &mut Mem) -> Result<()> {
    for &id in graph.nodes() {
        eval_node(ctx, id, mem)?;
    }
    Ok(())
}

fn src(t: &Tensor, i: usize) -> Result<TensorId> {
    t.src
        .get(i)
        .copied()
        .ok_or_else(|| err(format!("'{}' lacks source {i}", t.display_name())))
}

fn index(v: f64, n: usize, what: &str) -> Result<usize> {
    if v >= 0.0 && (v as usize) < n {
        Ok(v as usize)
    } else {
        Err(err(format!("{what} {v} out of range 0..{n}")))
    }
}

/// The shape of source `i` of `t`.
fn src_ne(ctx: &Context, t: &Tensor, i: usize) -> Result<[usize; 4]> {
    Ok(ctx.get(src(t, i)?)?.ne)
}

/// The values of source `i` of `t` and its shape.
fn read_src(ctx: &Context, t: &Tensor, mem: &Mem, i: usize) -> Result<(Vec<f64>, [usize; 4])> {
    Ok((mem.read(ctx, src(t, i)?)?, src_ne(ctx, t, i)?))
}

/// Evaluate one node.
pub fn eval_node(ctx: &Context, id: TensorId, mem: &mut Mem) -> Result<()> {
    let t = ctx.get(id)?;
    let n = t.nelements();
    let out: Vec<f64> = match t.op {
        Op::None | Op::Reshape | Op::View { .. } | Op::Permute { .. } | Op::Transpose => {
            return Ok(())
        }
        Op::Dup | Op::Cont | Op::Cpy => {
            // Element k of the source (logical order) goes to element k of the destination.
            let a = mem.read(ctx, src(t, 0)?)?;
            if a.len() != n {
                return Err(err("copy between different element counts"));
            }
            a
        }
        Op::GetRows => get_rows(ctx, t, mem)?,
        Op::SetRows => return set_rows(ctx, id, t, mem),
        Op::Add | Op::Sub | Op::Mul | Op::Div => binary(ctx, t, mem)?,
        Op::Scale { scale, bias } => mem
            .read(ctx, src(t, 0)?)?
            .into_iter()
            .map(|x| x * scale as f64 + bias as f64)
            .collect(),
        Op::MulMat { .. } => mul_mat(ctx, t, mem)?,
        Op::MulMatId { .. } => mul_mat_id(ctx, t, mem)?,
        Op::AddId => add_id(ctx, t, mem)?,
        Op::RmsNorm { eps } | Op::Norm { eps } => {
            let rms = matches!(t.op, Op::RmsNorm { .. });
            norm(mem.read(ctx, src(t, 0)?)?, t.ne, rms, eps)
        }
        Op::Rope(p) => {
            let mut x = mem.read(ctx, src(t, 0)?)?;
            let pos = mem.read(ctx, src(t, 1)?)?;
            if pos.len() < t.ne[2] * p.mode.positions_per_token() {
                return Err(err("ROPE with too few positions"));
            }
            let freq_factors = match t.src.get(2) {
                Some(&f) => {
                    let f = mem.read(ctx, f)?;
                    if f.len() < p.n_dims / 2 {
                        return Err(err("ROPE with fewer than n_dims / 2 frequency factors"));
                    }
                    Some(f)
                }
                None => None,
            };
            rope(&mut x, t.ne, &pos, freq_factors.as_deref(), &p);
            x
        }
        Op::SoftMax {
            scale,
            max_bias,
            sinks,
        } => {
            let x = mem.read(ctx, src(t, 0)?)?;
            let mask = match t.src.len() > 1 + usize::from(sinks) {
                true => Some((mem.read(ctx, src(t, 1)?)?, ctx.get(src(t, 1)?)?.ne)),
                false => None,
            };
            let sinks = match sinks {
                true => Some(mem.read(ctx, src(t, t.src.len() - 1)?)?),
                false => None,
            };
            let p = SoftMaxParams {
                scale: scale as f64,
                max_bias: max_bias as f64,
            };
            soft_max(&x, t.ne, mask.as_ref(), sinks.as_deref(), p)
        }
        Op::DiagMaskInf { n_past } => diag_mask_inf(mem.read(ctx, src(t, 0)?)?, t.ne, n_past),
        Op::Unary(UnaryOp::Silu) => mem.read(ctx, src(t, 0)?)?.into_iter().map(silu).collect(),
        Op::Unary(UnaryOp::Gelu) => mem.read(ctx, src(t, 0)?)?.into_iter().map(gelu).collect(),
        Op::Unary(UnaryOp::Tanh) => mem
            .read(ctx, src(t, 0)?)?
            .into_iter()
            .map(f64::tanh)
            .collect(),
        Op::Unary(UnaryOp::Neg) => mem.read(ctx, src(t, 0)?)?.into_iter().map(|x| -x).collect(),
        Op::Unary(UnaryOp::Sigmoid) => mem
            .read(ctx, src(t, 0)?)?
            .into_iter()
            .map(|x| 1.0 / (1.0 + (-x).exp()))
            .collect(),
        Op::Unary(UnaryOp::Exp) => mem
            .read(ctx, src(t, 0)?)?
            .into_iter()
            .map(f64::exp)
            .collect(),
        Op::Unary(UnaryOp::Softplus) => mem
            .read(ctx, src(t, 0)?)?
            .into_iter()
            .map(|x| if x > 20.0 { x } else { x.exp().ln_1p() })
            .collect(),
        Op::SwigluOai { alpha, limit } => {
            let a = mem.read(ctx, src(t, 0)?)?;
            let b = mem.read(ctx, src(t, 1)?)?;
            let (alpha, limit) = (f64::from(alpha), f64::from(limit));
            a.iter()
                .zip(&b)
                .map(|(&g, &u)| {
                    let x = g.min(limit);
                    x / (1.0 + (-alpha * x).exp()) * (u.clamp(-limit, limit) + 1.0)
                })
                .collect()
        }
        Op::Swiglu => {
            let a = mem.read(ctx, src(t, 0)?)?;
            let b = mem.read(ctx, src(t, 1)?)?;
            a.iter().zip(&b).map(|(x, y)| silu(*x) * y).collect()
        }
        Op::Geglu => {
            let a = mem.read(ctx, src(t, 0)?)?;
            let b = mem.read(ctx, src(t, 1)?)?;
            a.iter().zip(&b).map(|(x, y)| gelu(*x) * y).collect()
        }
        Op::Repeat => repeat(ctx, t, mem)?,
        Op::Concat { dim } => concat(ctx, t, mem, dim)?,
        Op::Argmax => argmax(ctx, t, mem)?,
        Op::Argsort { descending } => argsort(ctx, t, mem, descending)?,
        Op::SumRows => {
            let (a, ane) = read_src(ctx, t, mem, 0)?;
            a.chunks_exact(ane[0].max(1))
                .map(|r| r.iter().sum())
                .collect()
        }
        Op::Clamp { min, max } => mem
            .read(ctx, src(t, 0)?)?
            .into_iter()
            .map(|x| x.clamp(min as f64, max as f64))
            .collect(),
        Op::FlashAttnExt {
            scale,
            max_bias,
            softcap,
            mask,
            sinks,
        } => flash_attn(ctx, t, mem, [scale, max_bias, softcap], mask, sinks)?,
        Op::SsmConv => ssm_conv(ctx, t, mem)?,
        Op::GatedDeltaNet { snapshots } => gated_delta_net(ctx, t, mem, snapshots)?,
    };
    mem.write(ctx, id, &out)
}

/// GET_ROWS: the rows of source 0 that source 1 names.
fn get_rows(ctx: &Context, t: &Tensor, mem: &Mem) -> Result<Vec<f64>> {
    let ne = t.ne;
    let (a, ane) = read_src(ctx, t, mem, 0)?;
    let (r, rne) = read_src(ctx, t, mem, 1)?;
    let mut out = vec![0.0; t.nelements()];
    for i12 in 0..rne[2] {
        for i11 in 0..rne[1] {
            for i10 in 0..rne[0] {
                let row = index(r[lin(rne, i10, i11, i12, 0)], ane[1], "row index")?;
                for i0 in 0..ne[0] {
                    out[lin(ne, i0, i10, i11, i12)] = a[lin(ane, i0, row, i11, i12)];
                }
            }
        }
    }
    Ok(out)
}

/// SET_ROWS: source 1's rows written into node `id` at the rows source 2 names.
fn set_rows(ctx: &Context, id: TensorId, t: &Tensor, mem: &mut Mem) -> Result<()> {
    let ne = t.ne;
    let (v, vne) = read_src(ctx, t, mem, 1)?;
    let (r, rne) = read_src(ctx, t, mem, 2)?;
    // Only the rows written are rounded again: untouched rows keep their exact bytes.
    for i3 in 0..vne[3] {
        for i2 in 0..vne[2] {
            for i in 0..vne[1] {
                let row = index(
                    r[lin(rne, i, i2 % rne[1], i3 % rne[2], 0)],
                    ne[1],
                    "row index",
                )?;
                let at = lin(vne, 0, i, i2, i3);
                let mut vals = v[at..at + vne[0]].to_vec();
                mem.write_row(ctx, id, [row, i2, i3], &mut vals)?;
            }
        }
    }
    Ok(())
}

/// ADD, SUB, MUL, DIV, with source 1 broadcast over source 0.
fn binary(ctx: &Context, t: &Tensor, mem: &Mem) -> Result<Vec<f64>> {
    let ne = t.ne;
    let a = mem.read(ctx, src(t, 0)?)?;
    let (b, bne) = read_src(ctx, t, mem, 1)?;
    let f = |x: f64, y: f64| match t.op {
        Op::Add => x + y,
        Op::Sub => x - y,
        Op::Mul => x * y,
        _ => x / y,
    };
    let mut out = vec![0.0; t.nelements()];
    for i3 in 0..ne[3] {
        for i2 in 0..ne[2] {
            for i1 in 0..ne[1] {
                for i0 in 0..ne[0] {
                    let k = lin(ne, i0, i1, i2, i3);
                    let j = lin(bne, i0 % bne[0], i1 % bne[1], i2 % bne[2], i3 % bne[3]);
                    out[k] = f(a[k], b[j]);
                }
            }
        }
    }
    Ok(out)
}

/// MUL_MAT, with ggml's broadcast of source 0 over dims 2 and 3.
fn mul_mat(ctx: &Context, t: &Tensor, mem: &Mem) -> Result<Vec<f64>> {
    let ne = t.ne;
    let (a, ane) = read_src(ctx, t, mem, 0)?;
    let (b, bne) = read_src(ctx, t, mem, 1)?;
    let (r2, r3) = (bne[2] / ane[2], bne[3] / ane[3]);
    let k = ane[0];
    let mut out = vec![0.0; t.nelements()];
    for i3 in 0..ne[3] {
        for i2 in 0..ne[2] {
            for j in 0..ne[1] {
                let bj = &b[lin(bne, 0, j, i2, i3)..][..k];
                for i in 0..ne[0] {
                    let ai = &a[lin(ane, 0, i, i2 / r2, i3 / r3)..][..k];
                    out[lin(ne, i, j, i2, i3)] = ai.iter().zip(bj).map(|(x, y)| x * y).sum();
                }
            }
        }
    }
    Ok(out)
}

/// MUL_MAT_ID: column `(slot, t)` is expert `ids[slot, t]`'s matrix times src1 row
/// `(slot % n_b, t)`.
fn mul_mat_id(ctx: &Context, t: &Tensor, mem: &Mem) -> Result<Vec<f64>> {
    let ne = t.ne;
    let (a, ane) = read_src(ctx, t, mem, 0)?;
    let (b, bne) = read_src(ctx, t, mem, 1)?;
    let (ids, idne) = read_src(ctx, t, mem, 2)?;
    let k = ane[0];
    let mut out = vec![0.0; t.nelements()];
    for tok in 0..ne[2] {
        for slot in 0..ne[1] {
            let e = ids[lin(idne, slot, tok, 0, 0)];
            if !(0.0..ane[2] as f64).contains(&e) {
                return Err(err("MUL_MAT_ID with an expert id out of range"));
            }
            let bj = &b[lin(bne, 0, slot % bne[1], tok, 0)..][..k];
            for i in 0..ne[0] {
                let ai = &a[lin(ane, 0, i, e as usize, 0)..][..k];
                out[lin(ne, i, slot, tok, 0)] = ai.iter().zip(bj).map(|(x, y)| x * y).sum();
            }
        }
    }
    Ok(out)
}

fn add_id(ctx: &Context, t: &Tensor, mem: &Mem) -> Result<Vec<f64>> {
    let ne = t.ne;
    let (a, ane) = read_src(ctx, t, mem, 0)?;
    let (b, bne) = read_src(ctx, t, mem, 1)?;
    let (ids, idne) = read_src(ctx, t, mem, 2)?;
    let mut out = a.clone();
    for tok in 0..ne[2] {
        for slot in 0..ne[1] {
            let row = index(ids[lin(idne, slot, tok, 0, 0)], bne[1], "ADD_ID row id")?;
            for i in 0..ne[0] {
                out[lin(ane, i, slot, tok, 0)] += b[lin(bne, i, row, 0, 0)];
            }
        }
    }
    Ok(out)
}

/// SSM_CONV: output `(i, t, s)` is channel `i`'s window `sx[t.., i, s]` dotted with its
/// kernel `c[.., i]`.
fn ssm_conv(ctx: &Context, t: &Tensor, mem: &Mem) -> Result<Vec<f64>> {
    let (sx, sne) = read_src(ctx, t, mem, 0)?;
    let (c, cne) = read_src(ctx, t, mem, 1)?;
    let ne = t.ne;
    let mut out = vec![0.0; t.nelements()];
    for s in 0..ne[2] {
        for tok in 0..ne[1] {
            for i in 0..ne[0] {
                out[lin(ne, i, tok, s, 0)] = (0..cne[0])
                    .map(|j| sx[lin(sne, tok + j, i, s, 0)] * c[lin(cne, j, i, 0, 0)])
                    .sum();
            }
        }
    }
    Ok(out)
}

/// GATED_DELTA_NET (see [`Op::GatedDeltaNet`]): per head and sequence, the state `S` (stored
/// transposed: `st[j][i] = S[i][j]`) decays by `exp(g)`, takes the delta rule's update and
/// gives `o = Sᵀq / sqrt(S_v)`; the outputs, then the snapshots (zeros where no token left
/// one).
fn gated_delta_net(ctx: &Context, t: &Tensor, mem: &Mem, snapshots: usize) -> Result<Vec<f64>> {
    let src: Vec<(Vec<f64>, [usize; 4])> = (0..6)
        .map(|i| read_src(ctx, t, mem, i))
        .collect::<Result<_>>()?;
    let [(q, qne), (k, kne), (v, vne), (g, gne), (beta, _), (s0, _)] = &src[..] else {
        return Err(err("GATED_DELTA_NET needs six sources"));
    };
    let [n, h, n_tokens, n_seqs] = *vne;
    let mut out = vec![0.0; t.nelements()];
    let outputs = n * h * n_tokens * n_seqs;
    let scale = 1.0 / (n as f64).sqrt();
    for seq in 0..n_seqs {
        for head in 0..h {
            let base = (seq * h + head) * n * n;
            let mut st = s0[base..base + n * n].to_vec();
            for tok in 0..n_tokens {
                let qk = |x: &[f64], ne: &[usize; 4], i: usize| {
                    x[lin(*ne, i, head % ne[1], tok, seq / (n_seqs / ne[3]))]
                };
                let gate = |i: usize| g[lin(*gne, i % gne[0], head, tok, seq)].exp();
                let b = beta[lin([1, h, n_tokens, n_seqs], 0, head, tok, seq)];
                for (j, row) in st.chunks_exact_mut(n).enumerate() {
                    // Column j of S: row i of S scales by gate(i).
                    row.iter_mut().enumerate().for_each(|(i, x)| *x *= gate(i));
                    let sk: f64 = (0..n).map(|i| row[i] * qk(k, kne, i)).sum();
                    let d = (v[lin(*vne, j, head, tok, seq)] - sk) * b;
                    row.iter_mut()
                        .enumerate()
                        .for_each(|(i, x)| *x += qk(k, kne, i) * d);
                    let o: f64 = (0..n).map(|i| row[i] * qk(q, qne, i)).sum();
                    out[(seq * n_tokens + tok) * h * n + head * n + j] = o * scale;
                }
                let slot = n_tokens - 1 - tok;
                if slot < snapshots {
                    let at = outputs + slot * n * n * h * n_seqs + base;
                    out[at..at + n * n].copy_from_slice(&st);
                }
            }
            if n_tokens == 0 && snapshots == 1 {
                out[outputs + base..outputs + base + n * n].copy_from_slice(&st);
            }
        }
    }
    Ok(out)
}

/// RMS_NORM (`rms`) or NORM of the rows of `x` (shape `ne`), in place.
fn norm(mut x: Vec<f64>, ne: [usize; 4], rms: bool, eps: f32) -> Vec<f64> {
    for row in x.chunks_exact_mut(ne[0]) {
        let len = row.len() as f64;
        let mean = if rms {
            0.0
        } else {
            row.iter().sum::<f64>() / len
        };
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / len;
        let s = 1.0 / (var + eps as f64).sqrt();
        row.iter_mut().for_each(|v| *v = (*v - mean) * s);
    }
    x
}

/// DIAG_MASK_INF of `x` (shape `ne`): -inf after column `n_past + row`, in place.
fn diag_mask_inf(mut x: Vec<f64>, ne: [usize; 4], n_past: usize) -> Vec<f64> {
    for (r, row) in x.chunks_exact_mut(ne[0]).enumerate() {
        let j = r % ne[1];
        for (i, v) in row.iter_mut().enumerate() {
            if i > n_past + j {
                *v = f64::NEG_INFINITY;
            }
        }
    }
    x
}

/// CONCAT of sources 0 and 1 along `dim`.
fn concat(ctx: &Context, t: &Tensor, mem: &Mem, dim: usize) -> Result<Vec<f64>> {
    let ne = t.ne;
    let (a, ane) = read_src(ctx, t, mem, 0)?;
    let (b, bne) = read_src(ctx, t, mem, 1)?;
    let mut out = vec![0.0; t.nelements()];
    for i3 in 0..ne[3] {
        for i2 in 0..ne[2] {
            for i1 in 0..ne[1] {
                for i0 in 0..ne[0] {
                    let mut i = [i0, i1, i2, i3];
                    let v = if i[dim] < ane[dim] {
                        a[lin(ane, i[0], i[1], i[2], i[3])]
                    } else {
                        i[dim] -= ane[dim];
                        b[lin(bne, i[0], i[1], i[2], i[3])]
                    };
                    out[lin(ne, i0, i1, i2, i3)] = v;
                }
            }
        }
    }
    Ok(out)
}

/// REPEAT: element `i` of the node is source 0's element `i % ne` in every dim.
fn repeat(ctx: &Context, t: &Tensor, mem: &Mem) -> Result<Vec<f64>> {
    let ne = t.ne;
    let (a, ane) = read_src(ctx, t, mem, 0)?;
    if t.nelements() > 0 && (0..4).any(|i| ane[i] == 0 || !ne[i].is_multiple_of(ane[i])) {
        return Err(err(
            "REPEAT to a shape that is not a multiple of its source's",
        ));
    }
    let mut out = vec![0.0; t.nelements()];
    for i3 in 0..ne[3] {
        for i2 in 0..ne[2] {
            for i1 in 0..ne[1] {
                for i0 in 0..ne[0] {
                    out[lin(ne, i0, i1, i2, i3)] =
                        a[lin(ane, i0 % ane[0], i1 % ane[1], i2 % ane[2], i3 % ane[3])];
                }
            }
        }
    }
    Ok(out)
}

/// ARGMAX of every row of source 0.
fn argmax(ctx: &Context, t: &Tensor, mem: &Mem) -> Result<Vec<f64>> {
    let (a, ane) = read_src(ctx, t, mem, 0)?;
    Ok(a.chunks_exact(ane[0].max(1))
        .map(|row| {
            // The first index of the maximum, as ggml's `v > max` scan yields.
            let mut best = 0;
            for (i, v) in row.iter().enumerate() {
                if *v > row[best] {
                    best = i;
                }
            }
            best as f64
        })
        .collect())
}

/// Each row's indices in value order (equal values by index: the cases have none, since
/// ggml's own order of ties is its sort algorithm's, which the CPU backend's tests check).
fn argsort(ctx: &Context, t: &Tensor, mem: &Mem, descending: bool) -> Result<Vec<f64>> {
    let (a, ane) = read_src(ctx, t, mem, 0)?;
    let mut out = Vec::with_capacity(a.len());
    for row in a.chunks_exact(ane[0].max(1)) {
        let mut idx: Vec<usize> = (0..row.len()).collect();
        idx.sort_by(|&x, &y| match descending {
            true => row[y].total_cmp(&row[x]),
            false => row[x].total_cmp(&row[y]),
        });
        out.extend(idx.into_iter().map(|i| i as f64));
    }
    Ok(out)
}

/// `x * sigmoid(x)`.
pub fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

/// ggml's GELU: the tanh approximation with its constants.
pub fn gelu(x: f64) -> f64 {
    const GELU_COEF_A: f64 = 0.044715;
    const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)).tanh())
}

/// ggml's `ggml_rope_yarn_corr_dim`: the dimension whose wavelength fits `n_rot` rotations
/// into the original context.
fn yarn_corr_dim(n_dims: f64, n_ctx_orig: f64, n_rot: f64, base: f64) -> f64 {
    n_dims * (n_ctx_orig / (n_rot * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln())
}

/// Rotation angle scale and magnitude for pair index `i0` (even) at position `pos` with
/// frequency factor `ff` (1 without factors), following ggml's `rope_yarn` after
/// `ggml_rope_cache_init` (the factor divides the angle before the YaRN ramp and its magnitude
/// correction).
fn rope_cos_sin(p: &RopeParams, pos: f64, i0: usize, ff: f64, corr: [f64; 2]) -> (f64, f64) {
    let n_dims = p.n_dims as f64;
    let theta_scale = (p.freq_base as f64).powf(-2.0 / n_dims);
    let theta_extrap = pos * theta_scale.powi((i0 / 2) as i32) / ff;
    let freq_scale = p.freq_scale as f64;
    let theta_interp = freq_scale * theta_extrap;
    let mut theta = theta_interp;
    let mut mscale = p.attn_factor as f64;
    let ext = p.ext_factor as f64;
    if ext != 0.0 {
        let y = ((i0 / 2) as f64 - corr[0]) / (corr[1] - corr[0]).max(0.001);
        let ramp_mix = (1.0 - y.clamp(0.0, 1.0)) * ext;
        theta = theta_interp * (1.0 - ramp_mix) + theta_extrap * ramp_mix;
        mscale *= 1.0 + 0.1 * (1.0 / freq_scale).ln();
    }
    (theta.cos() * mscale, theta.sin() * mscale)
}

/// Rotary embedding of `x` (shape `ne`, positions per `ne[2]`, four per `ne[2]` in the
/// multi-section modes) in place; pair `k`'s angle is divided by `freq_factors[k]` when given
/// (at least `n_dims / 2` values).
pub fn rope(
    x: &mut [f64],
    ne: [usize; 4],
    pos: &[f64],
    freq_factors: Option<&[f64]>,
    p: &RopeParams,
) {
    let n_dims = p.n_dims;
    let nd = n_dims as f64;
    let base = p.freq_base as f64;
    let nco = p.n_ctx_orig as f64;
    let start = yarn_corr_dim(nd, nco, p.beta_fast as f64, base).floor();
    let end = yarn_corr_dim(nd, nco, p.beta_slow as f64, base).ceil();
    let corr = [start.max(0.0), end.min(nd - 1.0)];
    for i3 in 0..ne[3] {
        for i2 in 0..ne[2] {
            for i1 in 0..ne[1] {
                let row = &mut x[lin(ne, 0, i1, i2, i3)..][..ne[0]];
                for i0 in (0..n_dims).step_by(2) {
                    let ff = freq_factors.map_or(1.0, |f| f[i0 / 2]);
                    // The multi-section modes' positions: `pos[i2 + j·ne2]` for position j.
                    let ps = pos[i2 + p.mode.position_of_pair(i0 / 2) * ne[2]];
                    let (c, s) = rope_cos_sin(p, ps, i0, ff, corr);
                    let (a, b) = match p.mode {
                        RopeMode::Normal => (i0, i0 + 1),
                        RopeMode::Neox | RopeMode::Mrope { .. } | RopeMode::Imrope { .. } => {
                            (i0 / 2, i0 / 2 + n_dims / 2)
                        }
                    };
                    let (x0, x1) = (row[a], row[b]);
                    row[a] = x0 * c - x1 * s;
                    row[b] = x0 * s + x1 * c;
                }
            }
        }
    }
}

/// FLASH_ATTN_EXT: for each query and head, `softmax(softcap(scale · k·q) + slope · mask)`
/// (with the head's sink as one more score that weighs no V row) times `v`, written at
/// `(head, query)`.
fn flash_attn(
    ctx: &Context,
    t: &Tensor,
    mem: &Mem,
    [scale, max_bias, softcap]: [f32; 3],
    has_mask: bool,
    has_sinks: bool,
) -> Result<Vec<f64>> {
    let (q, qne) = read_src(ctx, t, mem, 0)?;
    let (k, kne) = read_src(ctx, t, mem, 1)?;
    let (v, vne) = read_src(ctx, t, mem, 2)?;
    let mask = if has_mask {
        Some(read_src(ctx, t, mem, 3)?)
    } else {
        None
    };
    let sinks = if has_sinks {
        Some(mem.read(ctx, src(t, 3 + usize::from(has_mask))?)?)
    } else {
        None
    };
    let (dk, nq, nh, n3) = (qne[0], qne[1], qne[2], qne[3]);
    let (dv, nkv) = (vne[0], kne[1]);
    let (scale, max_bias, softcap) = (scale as f64, max_bias as f64, softcap as f64);
    let n_head_log2 = 1u32 << (nh as u32).max(1).ilog2();
    let m0 = 2f64.powf(-max_bias / n_head_log2 as f64);
    let m1 = 2f64.powf(-(max_bias / 2.0) / n_head_log2 as f64);
    let mut out = vec![0.0; t.nelements()];
    for i3 in 0..n3 {
        for h in 0..nh {
            let hu = h as u32;
            let slope = match max_bias > 0.0 {
                false => 1.0,
                true if hu < n_head_log2 => m0.powi(hu as i32 + 1),
                true => m1.powi(2 * (hu - n_head_log2) as i32 + 1),
            };
            let (hk, hv) = (h / (nh / kne[2]), h / (nh / vne[2]));
            for iq in 0..nq {
                let mut scores = Vec::with_capacity(nkv);
                for c in 0..nkv {
                    let m = mask.as_ref().map_or(0.0, |(m, mne)| {
                        slope * m[lin(*mne, c, iq, h % mne[2], i3 % mne[3])]
                    });
                    let dot: f64 = (0..dk)
                        .map(|d| k[lin(kne, d, c, hk, i3)] * q[lin(qne, d, iq, h, i3)])
                        .sum();
                    let mut s = dot * scale;
                    if softcap != 0.0 {
                        s = softcap * (s / softcap).tanh();
                    }
                    scores.push(s + m);
                }
                let sink = sinks.as_ref().map(|sk| sk[h]);
                let max = scores
                    .iter()
                    .copied()
                    .chain(sink)
                    .fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let total: f64 =
                    weights.iter().sum::<f64>() + sink.map_or(0.0, |s| (s - max).exp());
                for d in 0..dv {
                    let acc: f64 = (0..nkv)
                        .filter(|&c| weights[c] > 0.0)
                        .map(|c| weights[c] * v[lin(vne, d, c, hv, i3)])
                        .sum();
                    out[lin(t.ne, d, h, iq, i3)] = if total > 0.0 { acc / total } else { 0.0 };
                }
            }
        }
    }
    Ok(out)
}

/// SOFT_MAX's scalar parameters.
#[derive(Clone, Copy, Debug)]
pub struct SoftMaxParams {
    /// Multiplier of `x`.
    pub scale: f64,
    /// ALiBi maximum bias (0 disables).
    pub max_bias: f64,
}

/// Row-wise softmax of `x * scale + slope * mask` (mask rows indexed by `i1`, broadcast over
/// dims 2 and 3 by modulo; ALiBi slope per head `i2` when `max_bias > 0`), with head `i2`'s
/// sink as one more score of each row that weighs no output.
pub fn soft_max(
    x: &[f64],
    ne: [usize; 4],
    mask: Option<&(Vec<f64>, [usize; 4])>,
    sinks: Option<&[f64]>,
    p: SoftMaxParams,
) -> Vec<f64> {
    let SoftMaxParams { scale, max_bias } = p;
    let n_head = ne[2] as u32;
    let n_head_log2 = 1u32 << n_head.max(1).ilog2();
    let m0 = 2f64.powf(-max_bias / n_head_log2 as f64);
    let m1 = 2f64.powf(-(max_bias / 2.0) / n_head_log2 as f64);
    let mut out = vec![0.0; x.len()];
    for i3 in 0..ne[3] {
        for i2 in 0..ne[2] {
            let h = i2 as u32;
            let slope = if max_bias > 0.0 {
                if h < n_head_log2 {
                    m0.powi(h as i32 + 1)
                } else {
                    m1.powi(2 * (h - n_head_log2) as i32 + 1)
                }
            } else {
                1.0
            };
            for i1 in 0..ne[1] {
                let at = lin(ne, 0, i1, i2, i3);
                let w: Vec<f64> = (0..ne[0])
                    .map(|i0| {
                        let m = mask.map_or(0.0, |(m, mne)| {
                            slope * m[lin(*mne, i0, i1, i2 % mne[2], i3 % mne[3])]
                        });
                        x[at + i0] * scale + m
                    })
                    .collect();
                let sink = sinks.map(|s| s[i2]);
                let max = w
                    .iter()
                    .copied()
                    .chain(sink)
                    .fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = w.iter().map(|v| (v - max).exp()).collect();
                let sum: f64 = e.iter().sum::<f64>() + sink.map_or(0.0, |s| (s - max).exp());
                for (o, v) in out[at..at + ne[0]].iter_mut().zip(&e) {
                    *o = v / sum;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rgml::DType;

    fn graph_of(ctx: &mut Context, out: TensorId) -> Graph {
        Graph::build(ctx, &[out]).unwrap()
    }

    fn load_f32(ctx: &Context, mem: &mut Mem, id: TensorId, v: &[f32]) {
        let bytes = codec::encode(ctx[id].dtype, v).unwrap();
        mem.load(ctx, id, &bytes).unwrap();
    }

    #[test]
    fn mul_mat_2x2_by_hand() {
        let mut ctx = Context::new();
        // a is [k=2, m=2]: rows (1, 2) and (3, 4); b is [k=2, n=2]: columns (5, 6) and (7, 8).
        let a = ctx.new_tensor(DType::F32, &[2, 2]).unwrap();
        let b = ctx.new_tensor(DType::F32, &[2, 2]).unwrap();
        let c = ctx.mul_mat(a, b).unwrap();
        let g = graph_of(&mut ctx, c);
        let mut mem = Mem::new();
        load_f32(&ctx, &mut mem, a, &[1., 2., 3., 4.]);
        load_f32(&ctx, &mut mem, b, &[5., 6., 7., 8.]);
        eval(&ctx, &g, &mut mem).unwrap();
        // c[i, j] = a_row_i · b_col_j, stored with i fastest.
        assert_eq!(mem.read(&ctx, c).unwrap(), vec![17., 39., 23., 53.]);
    }

    #[test]
    fn rope_at_position_zero_is_identity() {
        let x0: Vec<f64> = (0..16).map(|i| i as f64 * 0.25 - 1.0).collect();
        for mode in [RopeMode::Normal, RopeMode::Neox] {
            let mut x = x0.clone();
            let p = RopeParams::new(mode, 8, 10000.0);
            rope(&mut x, [8, 2, 1, 1], &[0.0], None, &p);
            assert_eq!(x, x0);
            // Position 1 rotates the first pair by exactly one radian.
            let mut y = x0.clone();
            rope(&mut y, [8, 2, 1, 1], &[1.0], None, &p);
            let (a, b) = if mode == RopeMode::Normal {
                (0, 1)
            } else {
                (0, 4)
            };
            let (c, s) = (1f64.cos(), 1f64.sin());
            assert!((y[a] - (x0[a] * c - x0[b] * s)).abs() < 1e-12);
            assert!((y[b] - (x0[a] * s + x0[b] * c)).abs() < 1e-12);
        }
    }

    #[test]
    fn rope_frequency_factors_divide_the_angle() {
        let x0: Vec<f64> = (0..16).map(|i| i as f64 * 0.25 - 1.0).collect();
        for mode in [RopeMode::Normal, RopeMode::Neox] {
            let p = RopeParams::new(mode, 8, 10000.0);
            // A factor f on every pair is the rotation at position pos / f.
            let mut y = x0.clone();
            rope(&mut y, [8, 2, 1, 1], &[6.0], Some(&[2.0; 4]), &p);
            let mut z = x0.clone();
            rope(&mut z, [8, 2, 1, 1], &[3.0], None, &p);
            for (a, b) in y.iter().zip(&z) {
                assert!((a - b).abs() < 1e-12, "{a} vs {b}");
            }
            // Factors of 1 change nothing; only the first n_dims / 2 factors are read.
            let mut u = x0.clone();
            rope(
                &mut u,
                [8, 2, 1, 1],
                &[6.0],
                Some(&[1.0, 1.0, 1.0, 1.0, 9.0]),
                &p,
            );
            let mut v = x0.clone();
            rope(&mut v, [8, 2, 1, 1], &[6.0], None, &p);
            assert_eq!(u, v);
        }
    }

    #[test]
    fn softmax_rows_sum_to_one_and_alibi_slopes() {
        let x: Vec<f64> = (0..24).map(|i| (i as f64 * 0.7).sin()).collect();
        let p = |scale, max_bias| SoftMaxParams { scale, max_bias };
        let y = soft_max(&x, [6, 2, 2, 1], None, None, p(0.5, 0.0));
        for row in y.chunks(6) {
            assert!((row.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        }
        // A mask of -inf hides a column; ALiBi scales the mask per head (head 0: 2^-max_bias).
        let mut m = vec![0.0; 12];
        m[5] = f64::NEG_INFINITY;
        m[6] = 1.0;
        let mask = (m, [6, 2, 1, 1]);
        let y = soft_max(&[0.0; 12], [6, 2, 1, 1], Some(&mask), None, p(1.0, 8.0));
        assert_eq!(y[5], 0.0);
        let w = 2f64.powf(-8.0);
        let expect = w.exp() / (w.exp() + 5.0);
        assert!((y[6] - expect).abs() < 1e-12, "{} vs {expect}", y[6]);
        // A sink of ln 6 over six zero scores takes half of each row's weight.
        let y = soft_max(
            &[0.0; 6],
            [6, 1, 1, 1],
            None,
            Some(&[6f64.ln()]),
            p(1.0, 0.0),
        );
        assert!(y.iter().all(|v| (v - 1.0 / 12.0).abs() < 1e-12), "{y:?}");
    }

    #[test]
    fn gelu_and_silu_values() {
        assert_eq!(silu(0.0), 0.0);
        assert!((silu(1.0) - 0.731_058_578_630_004_9).abs() < 1e-12);
        assert!((gelu(1.0) - 0.841_191_990_607_477_6).abs() < 1e-9);
        assert!(gelu(-10.0).abs() < 1e-12);
    }

    #[test]
    fn ssm_conv_and_delta_net_by_hand() {
        let mut ctx = Context::new();
        // Two channels, kernels of two taps, two tokens.
        let sx = ctx.new_tensor(DType::F32, &[3, 2, 1]).unwrap();
        let c = ctx.new_tensor(DType::F32, &[2, 2]).unwrap();
        let y = ctx.ssm_conv(sx, c).unwrap();
        let g = graph_of(&mut ctx, y);
        let mut mem = Mem::new();
        load_f32(&ctx, &mut mem, sx, &[1., 2., 3., 4., 5., 6.]);
        load_f32(&ctx, &mut mem, c, &[10., 1., 100., 2.]);
        eval(&ctx, &g, &mut mem).unwrap();
        // (token, channel): 1·10 + 2·1, 4·100 + 5·2, 2·10 + 3·1, 5·100 + 6·2.
        assert_eq!(mem.read(&ctx, y).unwrap(), vec![12., 410., 23., 512.]);

        // One head of one value, one token, two snapshots: S = s0·e^g, d = (v - S·k)·beta,
        // S += k·d, o = S·q; the second snapshot (no token left it) is 0.
        let mut ctx = Context::new();
        let ids: Vec<TensorId> = [[1usize, 1, 1, 1]; 6]
            .iter()
            .map(|ne| ctx.new_tensor(DType::F32, ne).unwrap())
            .collect();
        let y = ctx
            .gated_delta_net(ids[0], ids[1], ids[2], ids[3], ids[4], ids[5], 2)
            .unwrap();
        let g = graph_of(&mut ctx, y);
        let mut mem = Mem::new();
        let (q, k, v, gate, beta, s0) = (3.0, 2.0, 5.0, 0.0, 0.5, 1.5);
        for (&id, x) in ids.iter().zip([q, k, v, gate, beta, s0]) {
            load_f32(&ctx, &mut mem, id, &[x as f32]);
        }
        eval(&ctx, &g, &mut mem).unwrap();
        let s = s0 + k * (v - s0 * k) * beta;
        assert_eq!(mem.read(&ctx, y).unwrap(), vec![s * q, s, 0.0]);
    }

    #[test]
    fn views_read_through_their_root() {
        let mut ctx = Context::new();
        let a = ctx.new_tensor(DType::F32, &[3, 2]).unwrap();
        let t = ctx.transpose(a).unwrap();
        let c = ctx.cont(t).unwrap();
        let g = graph_of(&mut ctx, c);
        let mut mem = Mem::new();
        load_f32(&ctx, &mut mem, a, &[1., 2., 3., 4., 5., 6.]);
        eval(&ctx, &g, &mut mem).unwrap();
        assert_eq!(mem.read(&ctx, c).unwrap(), vec![1., 4., 2., 5., 3., 6.]);
    }

    #[test]
    fn diag_mask_and_argmax() {
        let mut ctx = Context::new();
        let a = ctx.new_tensor(DType::F32, &[3, 2]).unwrap();
        let d = ctx.diag_mask_inf(a, 0).unwrap();
        let m = ctx.argmax(a).unwrap();
        let g = graph_of(&mut ctx, d);
        let mut mem = Mem::new();
        load_f32(&ctx, &mut mem, a, &[1., 9., 3., 4., 2., 7.]);
        eval(&ctx, &g, &mut mem).unwrap();
        let inf = f64::NEG_INFINITY;
        assert_eq!(mem.read(&ctx, d).unwrap(), vec![1., inf, inf, 4., 2., inf]);
        eval_node(&ctx, m, &mut mem).unwrap();
        assert_eq!(mem.read(&ctx, m).unwrap(), vec![1., 2.]);
    }
}
