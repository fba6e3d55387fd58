//! Elementwise kernels: ADD/SUB/MUL/DIV with ggml broadcasting, SCALE, SILU, GELU, SWIGLU,
//! GEGLU.
//!
//! Threads split destination rows. Inner loops run over contiguous slices so they vectorize.

use crate::kernels::blocks::convert::{row_from_f32, row_to_f32};
use crate::kernels::fp16;
use crate::kernels::task::{
    bytes, bytes_mut, f32_row_for_write, f32_row_mut, scratch_slice, NodeTask, ThreadCtx,
};
use crate::kernels::vexp;
use rgml::{DType, Op, Result, UnaryOp};

/// GELU as ggml-cpu computes it (`GGML_GELU_FP16`): 0 at or below -10, `x` at or above 10,
/// elsewhere the table's value at `x` rounded to f16. Not the f32 formula: ggml's results differ
/// from it by up to an f16 rounding, and models must match ggml's.
#[inline(always)]
fn gelu_with(table: &[u16], x: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        let bits = half::f16::from_f32(x).to_bits();
        fp16::f16_bits_to_f32(table[usize::from(bits)])
    }
}

/// Apply `f` to `d[i] = f(a[i], b[i mod b.len()])`; `b.len()` divides `d.len()`.
#[inline(always)]
fn broadcast_apply(d: &mut [f32], a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32 + Copy) {
    let nb = b.len();
    if nb == 0 {
        return;
    }
    for (dc, ac) in d.chunks_exact_mut(nb).zip(a.chunks_exact(nb)) {
        for ((d, &x), &y) in dc.iter_mut().zip(ac).zip(b) {
            *d = f(x, y);
        }
    }
}

fn apply_binop(op: &Op, d: &mut [f32], a: &[f32], b: &[f32]) {
    match op {
        Op::Add => broadcast_apply(d, a, b, |x, y| x + y),
        Op::Sub => broadcast_apply(d, a, b, |x, y| x - y),
        Op::Mul => broadcast_apply(d, a, b, |x, y| x * y),
        _ => broadcast_apply(d, a, b, |x, y| x / y),
    }
}

/// ADD, SUB, MUL, DIV: `dst = src0 op src1`, src1 repeated to src0's shape (modulo indexing).
pub(crate) fn binary(task: &NodeTask, tc: &mut ThreadCtx<'_>) -> Result<()> {
    let (dst, a, b) = (&task.dst, task.src(0)?, task.src(1)?);
    let ne0 = dst.ne[0];
    let ne10 = b.ne[0];
    let all_f32 = dst.dtype == DType::F32 && b.dtype == DType::F32;
    for r in tc.split(dst.nrows()) {
        let (i1, i2, i3) = dst.row_index(r);
        let drow = dst.row(i1, i2, i3);
        let arow = a.row(i1, i2, i3);
        let brow = b.row(i1 % b.ne[1], i2 % b.ne[2], i3 % b.ne[3]);
        let (sa, rest) = tc.scratch.split_at_mut(ne0.min(tc.scratch.len()));
        let (sb, sd) = rest.split_at_mut(ne10.min(rest.len()));
        if all_f32 {
            // SAFETY: rows of in-bounds indices of F32 tensors with dense rows (checked by the
            // support table); the destination row is written only by this thread, and sources
            // overlapping it are copied to scratch first.
            unsafe {
                let xa = f32_row_for_write(arow, ne0, drow, ne0 * 4, sa)?;
                let xb = f32_row_for_write(brow, ne10, drow, ne0 * 4, sb)?;
                apply_binop(&task.op, f32_row_mut(drow, ne0), xa, xb);
            }
        } else {
            let xa = scratch_slice(sa, ne0)?;
            let xb = scratch_slice(sb, ne10)?;
            let xd = scratch_slice(sd, ne0)?;
            // SAFETY: dense rows of in-bounds indices; the source slices are dropped before the
            // destination row is borrowed mutably, so aliasing rows are never borrowed twice.
            unsafe {
                row_to_f32(a.dtype, bytes(arow, a.row_bytes()), xa)?;
                row_to_f32(b.dtype, bytes(brow, b.row_bytes()), xb)?;
                apply_binop(&task.op, xd, xa, xb);
                row_from_f32(dst.dtype, xd, bytes_mut(drow, dst.row_bytes()))?;
            }
        }
    }
    Ok(())
}

/// Apply `f` elementwise from src0 to dst (both F32 with dense rows, same shape).
#[inline(always)]
fn map_rows(task: &NodeTask, tc: &mut ThreadCtx<'_>, f: impl Fn(f32) -> f32 + Copy) -> Result<()> {
    let (dst, a) = (&task.dst, task.src(0)?);
    let ne0 = dst.ne[0];
    for r in tc.split(dst.nrows()) {
        let (i1, i2, i3) = dst.row_index(r);
        let drow = dst.row(i1, i2, i3);
        // SAFETY: dense F32 rows of in-bounds indices; the destination row belongs to this
        // thread and an overlapping source row is copied to scratch first.
        unsafe {
            let x = f32_row_for_write(a.row(i1, i2, i3), ne0, drow, ne0 * 4, tc.scratch)?;
            for (d, &v) in f32_row_mut(drow, ne0).iter_mut().zip(x) {
                *d = f(v);
            }
        }
    }
    Ok(())
}

/// SILU over rows like ggml_vec_silu_f32 (ggml_v_silu on groups of 8, expf on the tail).
fn silu_rows(task: &NodeTask, tc: &mut ThreadCtx<'_>) -> Result<()> {
    let (dst, a) = (&task.dst, task.src(0)?);
    let ne0 = dst.ne[0];
    for r in tc.split(dst.nrows()) {
        let (i1, i2, i3) = dst.row_index(r);
        let drow = dst.row(i1, i2, i3);
        // SAFETY: as in `map_rows`.
        unsafe {
            let x = f32_row_for_write(a.row(i1, i2, i3), ne0, drow, ne0 * 4, tc.scratch)?;
            vexp::silu_row(task.features, f32_row_mut(drow, ne0), x, None);
        }
    }
    Ok(())
}

/// SCALE: `dst = src0 * scale + bias`.
pub(crate) fn scale(task: &NodeTask, tc: &mut ThreadCtx<'_>, s: f32, b: f32) -> Result<()> {
    map_rows(task, tc, move |x| x * s + b)
}

/// CLAMP: ggml's `MAX(MIN(x, max), min)`, with C's comparisons (a NaN becomes `max`).
pub(crate) fn clamp(task: &NodeTask, tc: &mut ThreadCtx<'_>, min: f32, max: f32) -> Result<()> {
    map_rows(task, tc, move |x| {
        let upper = if x < max { x } else { max };
        if upper > min {
            upper
        } else {
            min
        }
    })
}

/// SILU, GELU and TANH.
pub(crate) fn unary(task: &NodeTask, tc: &mut ThreadCtx<'_>, op: UnaryOp) -> Result<()> {
    match op {
        UnaryOp::Silu => silu_rows(task, tc),
        UnaryOp::Gelu => {
            let table = rgml::tables::gelu_f16_table();
            map_rows(task, tc, move |x| gelu_with(table, x))
        }
        // ggml_vec_tanh_f32: libm's tanhf per element.
        UnaryOp::Tanh => map_rows(task, tc, f32::tanh),
        // ggml-cpu's scalar formulas (`unary-ops.cpp`), on libm's expf/logf as its build.
        UnaryOp::Neg => map_rows(task, tc, |x| -x),
        UnaryOp::Sigmoid => map_rows(task, tc, |x| 1.0 / (1.0 + (-x).exp())),
        UnaryOp::Exp => map_rows(task, tc, f32::exp),
        UnaryOp::Softplus => map_rows(task, tc, |x| match x > 20.0 {
            true => x,
            false => (1.0 + x.exp()).ln(),
        }),
    }
}

/// GEGLU: `dst = gelu(src0) * src1`, as `ggml_vec_geglu_f32` (0 where `src0 <= -10`).
pub(crate) fn geglu(task: &NodeTask, tc: &mut ThreadCtx<'_>) -> Result<()> {
    let table = rgml::tables::gelu_f16_table();
    gated_rows(task, tc, |d, x, g| {
        for ((d, &x), &g) in d.iter_mut().zip(x).zip(g) {
            *d = if x <= -10.0 {
                0.0
            } else {
                gelu_with(table, x) * g
            };
        }
    })
}

/// SWIGLU: `dst = silu(src0) * src1`.
pub(crate) fn swiglu(task: &NodeTask, tc: &mut ThreadCtx<'_>) -> Result<()> {
    let features = task.features;
    // ggml_vec_swiglu_f32: ggml_v_silu on groups of 8, expf on the tail.
    gated_rows(task, tc, |d, x, g| vexp::silu_row(features, d, x, Some(g)))
}

/// gpt-oss's SwiGLU as ggml-cpu's `ggml_compute_forward_swiglu_oai_f32` computes it, element
/// by element: `std::min` and `std::clamp` (a NaN passes through), then the division by `1 +
/// expf(alpha * -x)`.
pub(crate) fn swiglu_oai(
    task: &NodeTask,
    tc: &mut ThreadCtx<'_>,
    alpha: f32,
    limit: f32,
) -> Result<()> {
    gated_rows(task, tc, |d, gate, up| {
        for ((d, &g), &u) in d.iter_mut().zip(gate).zip(up) {
            let x = if limit < g { limit } else { g };
            let y = if u < -limit {
                -limit
            } else if limit < u {
                limit
            } else {
                u
            };
            let glu = x / (1.0 + (alpha * -x).exp());
            *d = glu * (y + 1.0);
        }
    })
}

/// ADD_ID as ggml-cpu computes it: row `(i, t)` of src0 plus row `ids[i, t]` of src1
/// (`ggml_vec_add_f32`). An id outside src1's rows is an error.
pub(crate) fn add_id(task: &NodeTask, tc: &mut ThreadCtx<'_>) -> Result<()> {
    let (dst, a, b, ids) = (&task.dst, task.src(0)?, task.src(1)?, task.src(2)?);
    let ne0 = dst.ne[0];
    for r in tc.split(dst.nrows()) {
        let (i1, i2, i3) = dst.row_index(r);
        // SAFETY: element (i1, i2) of the I32 ids tensor, in bounds (the support check).
        let id = unsafe {
            ids.row(i2, 0, 0)
                .add(i1 * ids.nb[0])
                .cast::<i32>()
                .read_unaligned()
        };
        let row = usize::try_from(id)
            .ok()
            .filter(|&i| i < b.ne[1])
            .ok_or_else(|| rgml::Error::Backend {
                backend: "CPU".into(),
                message: format!("ADD_ID: row id {id} outside 0..{}", b.ne[1]),
            })?;
        let drow = dst.row(i1, i2, i3);
        let (sa, sb) = tc.scratch.split_at_mut(ne0.min(tc.scratch.len()));
        // SAFETY: dense F32 rows of in-bounds indices; the destination row belongs to this
        // thread and an overlapping source row is copied to scratch first.
        unsafe {
            let x = f32_row_for_write(a.row(i1, i2, i3), ne0, drow, ne0 * 4, sa)?;
            let y = f32_row_for_write(b.row(row, 0, 0), ne0, drow, ne0 * 4, sb)?;
            for ((d, &x), &y) in f32_row_mut(drow, ne0).iter_mut().zip(x).zip(y) {
                *d = x + y;
            }
        }
    }
    Ok(())
}

/// Run `f(dst_row, src0_row, src1_row)` over this thread's rows of a gated unit.
fn gated_rows(
    task: &NodeTask,
    tc: &mut ThreadCtx<'_>,
    f: impl Fn(&mut [f32], &[f32], &[f32]),
) -> Result<()> {
    let (dst, a, b) = (&task.dst, task.src(0)?, task.src(1)?);
    let ne0 = dst.ne[0];
    for r in tc.split(dst.nrows()) {
        let (i1, i2, i3) = dst.row_index(r);
        let drow = dst.row(i1, i2, i3);
        let (sa, sb) = tc.scratch.split_at_mut(ne0.min(tc.scratch.len()));
        // SAFETY: as in `map_rows`, for both sources.
        unsafe {
            let x = f32_row_for_write(a.row(i1, i2, i3), ne0, drow, ne0 * 4, sa)?;
            let g = f32_row_for_write(b.row(i1, i2, i3), ne0, drow, ne0 * 4, sb)?;
            f(f32_row_mut(drow, ne0), x, g);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn gelu_clamps_and_rounds_like_ggml() {
        let t = rgml::tables::gelu_f16_table();
        assert_eq!(super::gelu_with(t, -10.0), 0.0);
        assert_eq!(super::gelu_with(t, 12.5), 12.5);
        for x in [-3.7f32, -0.4, 0.013, 0.9, 2.2, 7.9] {
            let y = super::gelu_with(t, x);
            // Within an f16 rounding of the f32 formula at the f16-rounded input.
            let exact = rgml::tables::gelu_f32(half::f16::from_f32(x).to_f32());
            assert!(
                (y - exact).abs() <= exact.abs() * 1e-3 + 1e-6,
                "{x}: {y} vs {exact}"
            );
            assert_eq!(y, half::f16::from_f32(y).to_f32(), "{x}: an f16 value");
        }
    }
}
