//! CPU kernels: one module per op family, the per-node task description they run on, and the
//! support table ([`check_supported`]) that says exactly which (op, dtypes, layouts) they
//! implement.
//!
//! Which SIMD paths and which ggml build's arithmetic a kernel uses is decided by the
//! [`CpuFeatures`] of its node (`NodeTask::features`, the backend's, resolved once when the
//! device or backend was made; see [`isa`]): kernels never detect CPU features themselves.
//!
//! Kernels follow ggml's threading model: every thread of the backend calls the kernel of a node
//! with its index `ith` of `nth`, and the kernel picks its share of the work (usually a range of
//! destination rows). Phased kernels (MUL_MAT) synchronise with the shared barrier. Kernels
//! never allocate: per-thread scratch and the shared work area are sized in advance by
//! [`work_size`].
//!
//! Memory safety: a [`TensorView`] is a raw pointer into a host buffer whose exclusive
//! [`rgml::backend::HostAccess`] guard the backend holds for the whole graph, and whose extent
//! (`nbytes`) the backend checked against the buffer size. Every row pointer a kernel forms is
//! therefore in bounds. Threads write disjoint destination rows; a destination that overlaps a
//! source is accepted by the backend only as an exact alias (same pointer and layout) for the
//! in-place ops, and kernels copy such a source row to scratch before writing the row.

// The floors, bottom up (each imports only from the floors below it; see docs/ARCHITECTURE.md).
// Floor 0: SIMD primitives, scalar conversions, the CPU's features, the task a kernel runs on.
mod fp16;
pub mod isa;
pub(crate) mod simd;
pub(crate) mod task;
// Floor 1: block decoders and encoders per type family, and ggml's vector math.
pub(crate) mod blocks;
mod vexp;
// Floor 2: pair dots (one weight row by one activation row), with `vec_dot`'s arithmetic.
pub mod dots;
// Floor 3: tile kernels (register tiles, repacked rows, K-quant tiles, float and BF16 tiles).
pub(crate) mod tiles;
// Floor 4: MUL_MAT's path selection over the floors below, and MUL_MAT_ID's.
pub(crate) mod matmul;
mod mul_mat_id;
// Floor 5: the other ops.
mod ops;

pub(crate) use blocks::convert::quant_available;
#[cfg(target_arch = "x86_64")]
use ops::flash_attn;
use ops::hadamard;
use ops::{copy, elementwise, norm, recurrent, rope, rows, softmax, sort};
pub(crate) use task::{NodeTask, SharedWork, TensorView, ThreadCtx};

/// Row encoding, for the tests.
#[cfg(test)]
pub(crate) fn row_from_f32_for_tests(dtype: DType, src: &[f32], dst: &mut [u8]) -> Result<()> {
    blocks::convert::row_from_f32(dtype, src, dst)
}

/// ROPE's YaRN correction dims, for the reference in the tests.
#[cfg(test)]
pub(crate) fn rope_corr_dims_for_tests(p: &rgml::RopeParams) -> [f32; 2] {
    rope::corr_dims(p)
}

pub(crate) use isa::CpuFeatures;
use rgml::{Context, DType, Error, Op, OpKind, Result, Tensor, TensorId};

/// The error for a node the kernels do not implement.
fn unsupported(what: String) -> Error {
    Error::Unsupported {
        backend: "CPU".into(),
        what,
    }
}

/// `OP(dst <- src0, src1, ...)` with dtypes, for error messages.
fn describe(ctx: &Context, t: &Tensor) -> String {
    let srcs: Vec<String> = t
        .src
        .iter()
        .map(|&s| {
            ctx.get(s)
                .map(|s| s.dtype.name().to_string())
                .unwrap_or_else(|_| "?".into())
        })
        .collect();
    format!(
        "{} ({} <- {})",
        t.op.kind(),
        t.dtype.name(),
        srcs.join(", ")
    )
}

/// Whether the CPU kernels implement node `id` as it is (op, dtypes, layouts); the error says
/// what is missing. View ops are always supported (nothing runs for them).
pub fn check_supported(ctx: &Context, id: TensorId) -> Result<()> {
    let t = ctx.get(id)?;
    let kind = t.op.kind();
    if kind.is_view() {
        return Ok(());
    }
    let mut srcs = Vec::with_capacity(t.src.len());
    for &s in &t.src {
        srcs.push(ctx.get(s)?);
    }
    // Packed weights are read by the ops that know their layout, as the first source, whole.
    let packed_ok = !in_repack_memory(ctx, t)
        && srcs.iter().enumerate().all(|(i, src)| {
            !in_repack_memory(ctx, src)
                || (i == 0
                    && crate::buffer::packable(src)
                    && matches!(t.op, Op::MulMat { .. } | Op::GetRows))
        });
    let ok = packed_ok && supported(t, &srcs);
    if ok {
        Ok(())
    } else {
        Err(unsupported(describe(ctx, t)))
    }
}

/// Whether `t`'s bytes (its own, or its view source's) live in repacked memory.
pub(crate) fn in_repack_memory(ctx: &Context, t: &Tensor) -> bool {
    let root = match t.view_src {
        Some(v) => ctx.get(v).ok(),
        None => Some(t),
    };
    root.and_then(|r| r.data.as_ref())
        .or(t.data.as_ref())
        .is_some_and(|d| crate::CpuRepackBufferType::is_repack(d.buffer.buffer_type()))
}

fn supported(t: &Tensor, s: &[&Tensor]) -> bool {
    use DType::*;
    let n = |k: usize| s.len() == k;
    let f32_rows = |x: &Tensor| x.dtype == F32 && x.rows_contiguous();
    let plain = |d: DType| matches!(d, F32 | F16 | BF16);
    // A kernel's dtype must be decodable (plain, or quantized with codecs available).
    let decodable = |d: DType| plain(d) || (d.is_quantized() && quant_available());
    let block_ok = |x: &Tensor| x.ne[0].is_multiple_of(x.dtype.block_size());
    if !block_ok(t) || s.iter().any(|x| !block_ok(x)) {
        return false;
    }
    match t.op {
        Op::FlashAttnExt { mask, sinks, .. } => flash_attn::supported(t, s, mask, sinks),
        Op::Dup | Op::Cont => n(1) && copy::supported(s[0], t),
        Op::Cpy => n(2) && copy::supported(s[0], t),
        Op::GetRows => {
            n(2) && s[1].dtype == I32
                && s[1].rows_contiguous()
                && t.rows_contiguous()
                && s[0].rows_contiguous()
                && t.ne == [s[0].ne[0], s[1].ne[0], s[1].ne[1], s[1].ne[2]]
                && s[0].ne[2] == s[1].ne[1]
                && s[0].ne[3] == s[1].ne[2]
                && s[1].ne[3] == 1
                && if s[0].dtype == I32 {
                    t.dtype == I32
                } else {
                    t.dtype == F32 && decodable(s[0].dtype)
                }
        }
        Op::SetRows => {
            n(3) && f32_rows(s[1])
                && matches!(s[2].dtype, I32 | I64)
                && s[2].rows_contiguous()
                && t.rows_contiguous()
                && t.ne[0] == s[1].ne[0]
                && t.ne[2] == s[1].ne[2]
                && t.ne[3] == s[1].ne[3]
                && s[2].ne[0] == s[1].ne[1]
                && s[2].ne[1] > 0
                && s[2].ne[2] > 0
                && s[1].ne[2].is_multiple_of(s[2].ne[1])
                && s[1].ne[3].is_multiple_of(s[2].ne[2])
                && s[2].ne[3] == 1
                && (plain(t.dtype)
                    || (quant_available() && matches!(t.dtype, Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0)))
        }
        Op::Add | Op::Sub | Op::Mul | Op::Div => {
            n(2) && plain(t.dtype)
                && t.dtype == s[0].dtype
                && plain(s[1].dtype)
                && t.rows_contiguous()
                && s[0].rows_contiguous()
                && s[1].rows_contiguous()
                && t.ne == s[0].ne
                && (0..4).all(|i| s[1].ne[i] > 0 && t.ne[i].is_multiple_of(s[1].ne[i]))
        }
        Op::Scale { .. }
        | Op::Clamp { .. }
        | Op::Unary(_)
        | Op::RmsNorm { .. }
        | Op::Norm { .. }
        | Op::DiagMaskInf { .. } => n(1) && f32_rows(t) && f32_rows(s[0]) && t.ne == s[0].ne,
        Op::Swiglu | Op::Geglu | Op::SwigluOai { .. } => {
            n(2) && f32_rows(t)
                && f32_rows(s[0])
                && f32_rows(s[1])
                && t.ne == s[0].ne
                && t.ne == s[1].ne
        }
        Op::SoftMax { sinks, .. } => {
            let n_mask = s.len().saturating_sub(1 + usize::from(sinks));
            n_mask <= 1
                && f32_rows(t)
                && f32_rows(s[0])
                && t.ne == s[0].ne
                && (!sinks
                    || s.last().is_some_and(|k| {
                        k.dtype == F32 && k.is_contiguous() && k.nelements() >= t.ne[2]
                    }))
                && s[1..1 + n_mask].iter().all(|m| {
                    matches!(m.dtype, F32 | F16)
                        && m.rows_contiguous()
                        && m.ne[0] == t.ne[0]
                        && m.ne[1] >= t.ne[1]
                        && m.ne[2] > 0
                        && m.ne[3] > 0
                        && t.ne[2].is_multiple_of(m.ne[2])
                        && t.ne[3].is_multiple_of(m.ne[3])
                })
        }
        Op::Rope(p) => {
            (n(2) || n(3))
                && f32_rows(t)
                && f32_rows(s[0])
                && t.ne == s[0].ne
                && s[1].dtype == I32
                && s[1].rows_contiguous()
                && s[1].ne[0] / p.mode.positions_per_token() >= t.ne[2]
                && p.n_dims.is_multiple_of(2)
                && p.n_dims <= t.ne[0]
                // Frequency factors: the first n_dims / 2 values of a dense f32 row.
                && s.get(2).is_none_or(|f| f32_rows(f) && f.ne[0] >= p.n_dims / 2)
        }
        Op::MulMat { hadamard: true, .. } => n(2) && hadamard::supported(s[0], s[1], t),
        Op::MulMat { .. } => n(2) && matmul::supported(s[0], s[1], t),
        Op::Repeat => n(1) && copy::repeat_supported(s[0], t),
        Op::Concat { dim } => {
            n(2) && dim < 4
                && s[0].dtype == t.dtype
                && s[1].dtype == t.dtype
                && !t.dtype.is_quantized()
                && (0..4).all(|i| {
                    if i == dim {
                        s[0].ne[i] + s[1].ne[i] == t.ne[i]
                    } else {
                        s[0].ne[i] == t.ne[i] && s[1].ne[i] == t.ne[i]
                    }
                })
        }
        Op::Argmax => {
            n(1) && f32_rows(s[0])
                && t.dtype == I32
                && t.rows_contiguous()
                && t.ne[0] == s[0].ne[1]
                && s[0].ne[2] == 1
                && s[0].ne[3] == 1
        }
        Op::MulMatId { .. } => n(3) && mul_mat_id::supported(s[0], s[1], s[2], t),
        Op::AddId => {
            n(3) && f32_rows(s[0])
                && f32_rows(s[1])
                && f32_rows(t)
                && s[2].dtype == I32
                && t.ne == s[0].ne
                && s[1].ne[0] == t.ne[0]
                && s[2].ne[0] == t.ne[1]
                && s[2].ne[1] == t.ne[2]
        }
        Op::SumRows => {
            n(1) && f32_rows(s[0]) && f32_rows(t) && t.ne == [1, s[0].ne[1], s[0].ne[2], s[0].ne[3]]
        }
        Op::Argsort { .. } => {
            n(1) && s[0].dtype == F32 && t.dtype == I32 && t.rows_contiguous() && t.ne == s[0].ne
        }
        Op::SsmConv => recurrent::ssm_conv_supported(t, s),
        Op::GatedDeltaNet { snapshots } => recurrent::delta_net_supported(t, s, snapshots),
        Op::None | Op::Reshape | Op::View { .. } | Op::Permute { .. } | Op::Transpose => true,
    }
}

/// Whether source `i` of a node may be its destination (exact alias only): the operands of
/// ggml's in-place ops, which each row reads before writing it. Not ROPE's frequency factors:
/// every row reads all of them.
pub(crate) fn inplace_capable(op: &Op, i: usize) -> bool {
    if matches!((op, i), (Op::Rope(_), 2)) {
        return false;
    }
    matches!(
        op.kind(),
        OpKind::Scale
            | OpKind::Clamp
            | OpKind::DiagMaskInf
            | OpKind::Add
            | OpKind::AddId
            | OpKind::Sub
            | OpKind::Mul
            | OpKind::Div
            | OpKind::Silu
            | OpKind::Gelu
            | OpKind::Tanh
            | OpKind::Neg
            | OpKind::Sigmoid
            | OpKind::Exp
            | OpKind::Softplus
            | OpKind::Swiglu
            | OpKind::Geglu
            | OpKind::SwigluOai
            | OpKind::Rope
            | OpKind::RmsNorm
            | OpKind::Norm
            | OpKind::SoftMax
    )
}

/// Sources a node writes rather than reads (CPY's target, SET_ROWS's destination).
pub(crate) fn is_target_src(op: &Op, i: usize) -> bool {
    matches!((op, i), (Op::Cpy, 1) | (Op::SetRows, 0))
}

/// Work a node needs on a backend with features `f` and `threads` threads: `(shared bytes,
/// per-thread scratch in f32 elements)`.
pub(crate) fn work_size(
    ctx: &Context,
    t: &Tensor,
    f: CpuFeatures,
    threads: usize,
) -> Result<(usize, usize)> {
    let mut widest = t.ne[0];
    for &s in &t.src {
        widest = widest.max(ctx.get(s)?.ne[0]);
    }
    let mut shared = match t.op {
        Op::MulMat {
            hadamard: false, ..
        } => {
            let (a, b) = (ctx.get(t.src[0])?, ctx.get(t.src[1])?);
            matmul::shared_size(f, a, b)?
        }
        Op::MulMatId { .. } => {
            let (a, b, ids) = (ctx.get(t.src[0])?, ctx.get(t.src[1])?, ctx.get(t.src[2])?);
            mul_mat_id::shared_size(f, a, b, ids)?
        }
        _ => 0,
    };
    // Up to four rows of the widest operand (sources copied out of the destination, converted
    // rows, ROPE's cos/sin cache, a packed group unpacked), plus slack to keep per-thread areas
    // on separate cache lines.
    let mut per_thread = widest.checked_mul(4).ok_or(Error::SizeOverflow)? + 16;
    if let Op::MulMat {
        hadamard: false, ..
    } = t.op
    {
        per_thread = per_thread.max(matmul::scratch_floats(f, ctx.get(t.src[0])?));
    }
    if let Op::MulMatId { .. } = t.op {
        per_thread = per_thread.max(mul_mat_id::scratch_floats(f, ctx.get(t.src[0])?)?);
    }
    if let Op::GatedDeltaNet { snapshots } = t.op {
        // v's rows (a node without v fails its support check first).
        let s_v = match t.src.get(2) {
            Some(&v) => ctx.get(v)?.ne[0],
            None => 0,
        };
        let floats = recurrent::delta_net_scratch(s_v, snapshots).ok_or(Error::SizeOverflow)?;
        per_thread = per_thread.max(floats.checked_add(16).ok_or(Error::SizeOverflow)?);
    }
    if let Op::FlashAttnExt { .. } = t.op {
        let srcs = t
            .src
            .iter()
            .map(|&s| ctx.get(s))
            .collect::<Result<Vec<_>>>()?;
        let (sh, pt) = flash_attn::work_size(&srcs, threads).ok_or(Error::SizeOverflow)?;
        shared = shared.max(sh);
        per_thread = per_thread.max(pt.checked_add(16).ok_or(Error::SizeOverflow)?);
    }
    Ok((shared, per_thread))
}

/// Run thread `tc.ith`'s share of `task`.
pub(crate) fn compute(task: &NodeTask, tc: &mut ThreadCtx<'_>) -> Result<()> {
    match task.op {
        Op::None | Op::Reshape | Op::View { .. } | Op::Permute { .. } | Op::Transpose => Ok(()),
        Op::Dup | Op::Cont | Op::Cpy => copy::dup(task, tc),
        Op::Repeat => copy::repeat(task, tc),
        Op::Concat { dim } => copy::concat(task, tc, dim),
        Op::GetRows => rows::get_rows(task, tc),
        Op::SetRows => rows::set_rows(task, tc),
        Op::Argmax => rows::argmax(task, tc),
        Op::Argsort { .. } => sort::argsort(task, tc),
        Op::SumRows => rows::sum_rows(task, tc),
        Op::AddId => elementwise::add_id(task, tc),
        Op::Clamp { min, max } => elementwise::clamp(task, tc, min, max),
        Op::MulMatId { .. } => mul_mat_id::mul_mat_id(task, tc),
        Op::Add | Op::Sub | Op::Mul | Op::Div => elementwise::binary(task, tc),
        Op::Scale { scale, bias } => elementwise::scale(task, tc, scale, bias),
        Op::Unary(u) => elementwise::unary(task, tc, u),
        Op::Swiglu => elementwise::swiglu(task, tc),
        Op::SwigluOai { alpha, limit } => elementwise::swiglu_oai(task, tc, alpha, limit),
        Op::Geglu => elementwise::geglu(task, tc),
        Op::RmsNorm { eps } => norm::rms_norm(task, tc, eps),
        Op::Norm { eps } => norm::norm(task, tc, eps),
        Op::SoftMax {
            scale,
            max_bias,
            sinks,
        } => softmax::soft_max(task, tc, scale, max_bias, sinks),
        Op::DiagMaskInf { n_past } => softmax::diag_mask_inf(task, tc, n_past),
        Op::Rope(p) => rope::rope(task, tc, &p),
        Op::SsmConv => recurrent::ssm_conv(task, tc),
        Op::GatedDeltaNet { snapshots } => recurrent::gated_delta_net(task, tc, snapshots),
        Op::MulMat { hadamard: true, .. } => hadamard::fwht(task, tc),
        Op::MulMat { .. } => matmul::mul_mat(task, tc),
        Op::FlashAttnExt {
            scale,
            max_bias,
            softcap,
            mask,
            sinks,
        } => flash_attn::flash_attn_ext(
            task,
            tc,
            &flash_attn::FlashParams {
                scale,
                max_bias,
                softcap,
                mask,
                sinks,
            },
        ),
    }
}
