//! Reference arithmetic of the test backend, written to be read rather than to be fast: each
//! source is read element by element through its strides into a dense f32 array, the result is
//! computed with plain loops (sums in f64, rounded once), and written back through the node's
//! own strides (so CPY into a strided view of a larger tensor touches only its elements).
//!
//! This module owns which ops and dtypes the test backend computes ([`KERNELS`], [`dtypes_ok`])
//! and their arithmetic; it reaches tensor bytes only through `Context::tensor_get` / `set`.

use crate::context::Context;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::op::{Op, OpKind, UnaryOp};
use crate::tensor::{Tensor, TensorId, MAX_DIMS};

/// The ops the test backend computes (view ops need no kernel and are always accepted).
pub const KERNELS: [OpKind; 13] = [
    OpKind::Dup,
    OpKind::Cpy,
    OpKind::Cont,
    OpKind::GetRows,
    OpKind::Add,
    OpKind::Sub,
    OpKind::Mul,
    OpKind::Div,
    OpKind::Scale,
    OpKind::MulMat,
    OpKind::RmsNorm,
    OpKind::Silu,
    OpKind::Swiglu,
];

/// Whether the kernels handle node `t`'s dtypes: f32 everywhere, except GET_ROWS' i32 indices.
pub fn dtypes_ok(ctx: &Context, t: &Tensor) -> bool {
    let src_dtype = |i: usize| t.src.get(i).and_then(|&s| ctx.get(s).ok()).map(|s| s.dtype);
    let srcs_f32 = (0..t.src.len()).all(|i| src_dtype(i) == Some(DType::F32));
    match t.op {
        Op::GetRows => {
            t.dtype == DType::F32
                && src_dtype(0) == Some(DType::F32)
                && src_dtype(1) == Some(DType::I32)
        }
        _ => t.dtype == DType::F32 && srcs_f32,
    }
}

/// A tensor's values in logical order (index 0 fastest) with its shape.
struct Dense {
    ne: [usize; MAX_DIMS],
    v: Vec<f32>,
}

impl Dense {
    /// The value at `i`, or an error when `i` lies outside the shape.
    fn at(&self, i: [usize; MAX_DIMS]) -> Result<f32> {
        let inside = i.iter().zip(&self.ne).all(|(&x, &n)| x < n);
        let flat = i[0] + self.ne[0] * (i[1] + self.ne[1] * (i[2] + self.ne[2] * i[3]));
        inside
            .then(|| self.v.get(flat).copied())
            .flatten()
            .ok_or_else(|| invalid(OpKind::None, format!("index {i:?} outside {:?}", self.ne)))
    }
}

fn invalid(op: OpKind, reason: String) -> Error {
    Error::InvalidArgument { op, reason }
}

/// Every index of shape `ne` in logical order.
fn indices(ne: [usize; MAX_DIMS]) -> impl Iterator<Item = [usize; MAX_DIMS]> {
    let n: usize = ne.iter().product();
    (0..n).map(move |mut k| {
        let mut i = [0; MAX_DIMS];
        for (d, x) in i.iter_mut().enumerate() {
            *x = k % ne[d];
            k /= ne[d];
        }
        i
    })
}

/// The byte range of element `i` of 4-byte tensor `t` inside its `nbytes` span of `len` bytes.
fn element(t: &Tensor, i: [usize; MAX_DIMS], len: usize) -> Result<std::ops::Range<usize>> {
    let start = i
        .iter()
        .zip(&t.nb)
        .try_fold(0usize, |acc, (&x, &nb)| acc.checked_add(x.checked_mul(nb)?));
    start
        .and_then(|s| Some(s..s.checked_add(4)?))
        .filter(|r| r.end <= len)
        .ok_or_else(|| Error::OutOfBounds {
            what: format!("element {i:?} of '{}'", t.display_name()),
            offset: start.unwrap_or(usize::MAX),
            size: 4,
            limit: len,
        })
}

/// The values of 4-byte tensor `id` in logical order, whatever its strides.
fn read_raw(ctx: &Context, id: TensorId) -> Result<(Vec<[u8; 4]>, [usize; MAX_DIMS])> {
    let t = ctx.get(id)?;
    if t.dtype.block_bytes() != 4 || t.dtype.block_size() != 1 {
        return Err(Error::UnsupportedDType {
            op: t.op.kind(),
            dtype: t.dtype,
            reason: "the test backend reads f32 and i32 only",
        });
    }
    let bytes = ctx.tensor_bytes(id)?;
    let values = indices(t.ne)
        .map(|i| {
            let r = element(t, i, bytes.len())?;
            let mut v = [0u8; 4];
            v.copy_from_slice(&bytes[r]);
            Ok(v)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((values, t.ne))
}

fn read_f32(ctx: &Context, id: TensorId) -> Result<Dense> {
    let (raw, ne) = read_raw(ctx, id)?;
    Ok(Dense {
        ne,
        v: raw.into_iter().map(f32::from_le_bytes).collect(),
    })
}

fn read_i32(ctx: &Context, id: TensorId) -> Result<Vec<i32>> {
    Ok(read_raw(ctx, id)?
        .0
        .into_iter()
        .map(i32::from_le_bytes)
        .collect())
}

/// Write `values` (logical order) into tensor `id` through its strides, leaving the bytes
/// between its elements as they were.
fn write_f32(ctx: &Context, id: TensorId, values: &[f32]) -> Result<()> {
    let t = ctx.get(id)?;
    if values.len() != t.nelements() {
        return Err(Error::LengthMismatch {
            what: "test backend result",
            expected: t.nelements(),
            actual: values.len(),
        });
    }
    let mut bytes = ctx.tensor_bytes(id)?;
    for (i, v) in indices(t.ne).zip(values) {
        let r = element(t, i, bytes.len())?;
        bytes[r].copy_from_slice(&v.to_le_bytes());
    }
    ctx.tensor_set(id, 0, &bytes)
}

/// Source `i` of node `t`.
fn src(t: &Tensor, i: usize) -> Result<TensorId> {
    t.src.get(i).copied().ok_or_else(|| {
        invalid(
            t.op.kind(),
            format!("'{}' has no source {i}", t.display_name()),
        )
    })
}

/// Compute node `id` of `ctx` (not a view op) and store its result.
pub fn compute(ctx: &Context, id: TensorId) -> Result<()> {
    let t = ctx.get(id)?;
    let a = || read_f32(ctx, src(t, 0)?);
    let b = || read_f32(ctx, src(t, 1)?);
    let out = match t.op {
        // Logical order is kept; CPY writes through the destination view's strides.
        Op::Dup | Op::Cont | Op::Cpy => a()?.v,
        Op::Add | Op::Sub | Op::Mul | Op::Div => binary(t.op.kind(), &a()?, &b()?)?,
        Op::Scale { scale, bias } => a()?.v.iter().map(|x| x * scale + bias).collect(),
        Op::Unary(UnaryOp::Silu) => a()?.v.iter().map(|&x| silu(x)).collect(),
        Op::Swiglu => {
            let (g, u) = (a()?, b()?);
            g.v.iter().zip(&u.v).map(|(&g, &u)| silu(g) * u).collect()
        }
        Op::RmsNorm { eps } => rms_norm(&a()?, eps),
        Op::MulMat { .. } => mul_mat(&a()?, &b()?, t.ne)?,
        Op::GetRows => get_rows(&a()?, &read_i32(ctx, src(t, 1)?)?, t.ne)?,
        _ => {
            return Err(invalid(
                t.op.kind(),
                "the test backend has no kernel for it".into(),
            ))
        }
    };
    write_f32(ctx, id, &out)
}

fn silu(x: f32) -> f32 {
    (x as f64 / (1.0 + (-x as f64).exp())) as f32
}

/// `a op b` with `b` broadcast (repeated) along every dim.
fn binary(op: OpKind, a: &Dense, b: &Dense) -> Result<Vec<f32>> {
    indices(a.ne)
        .map(|i| {
            let mut j = [0; MAX_DIMS];
            for d in 0..MAX_DIMS {
                j[d] = i[d]
                    .checked_rem(b.ne[d])
                    .ok_or_else(|| invalid(op, "an empty src1 cannot broadcast".into()))?;
            }
            let (x, y) = (a.at(i)?, b.at(j)?);
            Ok(match op {
                OpKind::Add => x + y,
                OpKind::Sub => x - y,
                OpKind::Mul => x * y,
                _ => x / y,
            })
        })
        .collect()
}

/// Each row divided by the root of its mean square (plus `eps`).
fn rms_norm(a: &Dense, eps: f32) -> Vec<f32> {
    let n = a.ne[0];
    a.v.chunks(n.max(1))
        .flat_map(|row| {
            let mean = row.iter().map(|&x| x as f64 * x as f64).sum::<f64>() / n as f64;
            let inv = 1.0 / (mean + eps as f64).sqrt();
            row.iter().map(move |&x| (x as f64 * inv) as f32)
        })
        .collect()
}

/// ggml's product: `out[m, n, i2, i3] = sum_k a[k, m, i2 / r2, i3 / r3] * b[k, n, i2, i3]`,
/// where `a`'s dims 2 and 3 repeat `r2`, `r3` times over `b`'s.
fn mul_mat(a: &Dense, b: &Dense, ne: [usize; MAX_DIMS]) -> Result<Vec<f32>> {
    let ratio = |d: usize| {
        // At least 1: the builder makes b's dim a multiple of a's, and `at` checks the rest.
        b.ne[d]
            .checked_div(a.ne[d])
            .map(|r| r.max(1))
            .ok_or_else(|| invalid(OpKind::MulMat, format!("{:?} by {:?}", a.ne, b.ne)))
    };
    let (r2, r3) = (ratio(2)?, ratio(3)?);
    indices(ne)
        .map(|[m, n, i2, i3]| {
            let mut sum = 0f64;
            for k in 0..a.ne[0] {
                sum += a.at([k, m, i2 / r2, i3 / r3])? as f64 * b.at([k, n, i2, i3])? as f64;
            }
            Ok(sum as f32)
        })
        .collect()
}

/// `out[e, r, i2, i3] = a[e, rows[r, i2, i3], i2, i3]`.
fn get_rows(a: &Dense, rows: &[i32], ne: [usize; MAX_DIMS]) -> Result<Vec<f32>> {
    indices(ne)
        .map(|[e, r, i2, i3]| {
            let k = r + ne[1] * (i2 + ne[2] * i3);
            let row = rows
                .get(k)
                .and_then(|&x| usize::try_from(x).ok())
                .filter(|&x| x < a.ne[1])
                .ok_or_else(|| {
                    invalid(
                        OpKind::GetRows,
                        format!("row index {:?} outside {} rows", rows.get(k), a.ne[1]),
                    )
                })?;
            a.at([e, row, i2, i3])
        })
        .collect()
}
