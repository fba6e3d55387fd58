//! What the kernels need from a graph node: the exact support check ([`supports_op`]) and
//! each node's dispatches, with their parameters and bound buffers ([`Prep`]).
//!
//! Above the kernels, the open device and its buffers; below plans and streams.

use crate::buffer::WgpuBuffer;
use crate::gpu::Gpu;
use crate::kernels::{FastKernel, Kernel, Params, MM_TILE, MV_COLS, MV_ROWS, WG};
use rgml::{Context, DType, Error, Op, Result, RopeMode, RopeParams, Tensor, TensorId, UnaryOp};
use std::sync::Arc;

/// Invocations per output of `mul_mv_q8` (ggml-cpu's 8 SIMD lanes of a Q8 dot product) and of
/// `mul_mv` (tinyBLAS's 16 lanes); their workgroups of [`WG`](crate::kernels::WG) hold whole outputs.
const MV_Q8_LANES: u64 = 8;
const MV_LANES: u64 = 16;

/// Bytes per 32-element block of quantized activations in the scratch buffer (`Q8_WORDS`
/// words in `common.wgsl`).
const Q8_BLOCK_BYTES: usize = 40;

/// Bytes per 32-element block of the DP4A mat-vec's activations (`quantize_q8_fast`).
const Q8_FAST_BLOCK_BYTES: usize = 48;

/// Whether MUL_MAT with `dtype` weights quantizes its activations first, as ggml-cpu does (the
/// weights whose dot product with Q8 activations the kernels mirror).
fn quantizes_activations(dtype: DType) -> bool {
    matches!(dtype, DType::Q4_0 | DType::Q4_1 | DType::Q8_0)
}

/// The exact kernels' code for an element type (`T_*` in `common.wgsl`), if they read it.
fn type_code(dtype: DType) -> Option<u32> {
    match dtype {
        DType::F32 | DType::I32 => Some(0),
        DType::F16 => Some(1),
        DType::Q4_0 => Some(2),
        DType::Q4_1 => Some(3),
        DType::Q8_0 => Some(4),
        DType::Q4_K => Some(5),
        DType::Q6_K => Some(6),
        _ => None,
    }
}

/// The fast kernels' code for a weight type (`T_*` in `common.wgsl` and `kernels_fast.wgsl`):
/// every type the CPU multiplies.
fn weight_code(dtype: DType) -> Option<u32> {
    match dtype {
        DType::I32 => None,
        DType::BF16 => Some(7),
        DType::Q5_0 => Some(8),
        DType::Q5_1 => Some(9),
        DType::Q2_K => Some(10),
        DType::Q3_K => Some(11),
        DType::Q5_K => Some(12),
        DType::IQ4_NL => Some(13),
        DType::IQ4_XS => Some(14),
        DType::MXFP4 => Some(15),
        _ => type_code(dtype),
    }
}

/// Whether the fast kernels take MUL_MAT of weights `a` by activations `b`: a weight type they
/// decode, rows of contiguous elements (or blocks), dimensions and offsets within their u32
/// arithmetic, f32 activations (any strides) and whole broadcasts.
fn fast_mul_mat(a: &Tensor, b: &Tensor) -> bool {
    let contiguous_rows = a.nb[0] == a.dtype.block_bytes();
    weight_code(a.dtype).is_some() && contiguous_rows && addressable(a) && f32_operand(a, b)
}

/// Whether the fast kernels take MUL_MAT_ID of expert weights `a` by activations `b` routed by
/// `ids`: what [`fast_mul_mat`] asks of one expert's matrix and its activations, and I32 ids.
fn fast_mul_mat_id(a: &Tensor, b: &Tensor, ids: &Tensor) -> bool {
    let contiguous_rows = a.nb[0] == a.dtype.block_bytes();
    weight_code(a.dtype).is_some()
        && contiguous_rows
        && addressable(a)
        && b.dtype == DType::F32
        && fits(b)
        && ids.dtype == DType::I32
        && fits(ids)
}

/// The longest rows the fast ARGSORT takes: it compares every pair of a row's elements (a
/// router's row has one element per expert).
const ARGSORT_MAX_ROW: usize = 1024;

/// Invocations per workgroup of the fast per-row kernels (`ROW_WG` in the WGSL).
const ROW_WG: usize = 256;

/// Flash attention splits the keys of fewer query rows than this (a decode: one workgroup per
/// row would leave most of a GPU idle at depth), into runs of about `FA_SPLIT_KEYS`, at most
/// `FA_MAX_SPLITS`.
const FA_SPLIT_BELOW_ROWS: usize = 256;
const FA_SPLIT_KEYS: usize = 512;
const FA_MAX_SPLITS: usize = 64;

/// The byte alignment of the rows and blocks of the weight types `mul_mv_blocks` decodes (4 for
/// F32, whose offsets are in elements; 2 for blocks of an even size that is no multiple of 4).
fn mv_blocks_alignment(dtype: DType) -> Option<u32> {
    match dtype {
        DType::F32 | DType::Q4_1 | DType::Q5_1 | DType::Q4_K | DType::Q5_K => Some(4),
        DType::F16 | DType::BF16 | DType::Q4_0 | DType::Q5_0 | DType::Q8_0 | DType::Q6_K => Some(2),
        _ => None,
    }
}

/// Whether `mul_mv_blocks` takes the mat-vec of weights `a` with parameters `p`: a type it
/// decodes, rows of whole blocks (of 32 elements for the float types) at its alignment, and
/// activations it reads as 16-byte vectors (contiguous rows starting at multiples of 4
/// elements).
fn mv_blocks_fit(p: &Params, a: &Tensor) -> bool {
    let Some(align) = mv_blocks_alignment(a.dtype) else {
        return false;
    };
    let block = a.dtype.block_size().max(32);
    let weights =
        p.off[0].is_multiple_of(align) && p.a_nb[1..].iter().all(|s| s.is_multiple_of(align));
    let acts = p.b_nb[0] == 1
        && p.off[1].is_multiple_of(4)
        && p.b_nb[1..].iter().all(|s| s.is_multiple_of(4));
    a.ne[0].is_multiple_of(block) && weights && acts
}

/// Bytes per unit of the kernels' strides and offsets for `dtype`: 4 for 4-byte elements
/// (f32, i32), 1 (bytes) for the rest.
fn unit(dtype: DType) -> usize {
    if matches!(dtype, DType::F32 | DType::I32) {
        4
    } else {
        1
    }
}

/// Whether `t`'s shape and strides fit the kernels' u32 arithmetic (in 4-byte elements for
/// f32 / i32, bytes for the rest, whose strides must be even: f16 values are read as halves of
/// 4-byte words) and the kernels read its type.
fn fits(t: &Tensor) -> bool {
    let align = if unit(t.dtype) == 4 { 4 } else { 2 };
    type_code(t.dtype).is_some() && t.nb.iter().all(|&b| b.is_multiple_of(align)) && addressable(t)
}

/// Whether `t`'s sizes, element count and extent (in the kernels' units) fit their u32
/// arithmetic (a stride that matters is below the extent).
fn addressable(t: &Tensor) -> bool {
    t.ne.iter().all(|&n| n <= u32::MAX as usize)
        && t.nelements() <= u32::MAX as usize
        && t.nbytes() / unit(t.dtype) <= u32::MAX as usize
}

/// Whether node `id` runs on a stream of a wgpu device in the given arithmetic: exactly the
/// ops, dtypes and layouts its kernels implement (view ops always: nothing runs for them). The
/// fast arithmetic adds MUL_MAT of every weight type.
pub(crate) fn supports_op(ctx: &Context, id: TensorId, exact: bool) -> bool {
    let Ok(t) = ctx.get(id) else {
        return false;
    };
    if t.op.kind().is_view() {
        return true;
    }
    let Some(srcs) = t
        .src
        .iter()
        .map(|&s| ctx.get(s).ok())
        .collect::<Option<Vec<&Tensor>>>()
    else {
        return false;
    };
    let f32s = |ts: &[&Tensor]| ts.iter().all(|x| x.dtype == DType::F32 && fits(x));
    let f32_or_f16 = |x: &Tensor| matches!(x.dtype, DType::F32 | DType::F16) && fits(x);
    // Copies: f32 / f16 to f32 / f16.
    if matches!(t.op, Op::Cpy | Op::Dup | Op::Cont) {
        let dst_ok = f32_or_f16(t);
        return dst_ok
            && match (t.op, srcs.as_slice()) {
                (Op::Cpy, [a, b]) => {
                    f32_or_f16(a) && b.dtype == t.dtype && a.nelements() == t.nelements()
                }
                (Op::Dup | Op::Cont, [a]) => f32_or_f16(a) && a.nelements() == t.nelements(),
                _ => false,
            };
    }
    match (t.op, srcs.as_slice()) {
        (Op::SetRows, [dst, src, rows]) => {
            return f32_or_f16(t)
                && dst.dtype == t.dtype
                && f32s(&[src])
                && rows.dtype == DType::I32
                && fits(rows);
        }
        (Op::Argmax, [a]) => return t.dtype == DType::I32 && fits(t) && f32s(&[a]),
        // The fast arithmetic's ARGSORT puts equal values in index order, not in the order
        // ggml-cpu's unstable sort leaves them.
        (Op::Argsort { .. }, [a]) => {
            return !exact
                && t.dtype == DType::I32
                && fits(t)
                && f32s(&[a])
                && a.ne == t.ne
                && a.ne[0] <= ARGSORT_MAX_ROW;
        }
        _ => {}
    }
    if t.dtype != DType::F32 || !fits(t) {
        return false;
    }
    match (t.op, srcs.as_slice()) {
        (Op::Concat { dim }, [a, b]) => f32s(&[a, b]) && dim < 4,
        (Op::Add | Op::Sub | Op::Mul | Op::Div, [a, b]) => f32s(&[a, b]) && a.ne == t.ne,
        (
            Op::Scale { .. }
            | Op::Clamp { .. }
            | Op::Unary(UnaryOp::Silu | UnaryOp::Gelu)
            | Op::RmsNorm { .. }
            | Op::Norm { .. }
            | Op::DiagMaskInf { .. },
            [a],
        ) => f32s(&[a]) && a.ne == t.ne,
        (Op::Swiglu | Op::Geglu, [a, b]) => f32s(&[a, b]) && a.ne == t.ne && b.ne == t.ne,
        // The multi-section modes read four positions per token.
        (Op::Rope(rp), [a, pos, factors @ ..]) if factors.len() <= 1 => {
            f32s(&[a])
                && a.ne == t.ne
                && pos.dtype == DType::I32
                && fits(pos)
                && pos.ne[0] >= rp.mode.positions_per_token() * a.ne[2]
                && rp.n_dims <= a.ne[0]
                && u32::try_from(rp.n_dims).is_ok()
                // Frequency factors: the first n_dims / 2 values of a dense f32 row.
                && factors
                    .iter()
                    .all(|f| f32s(&[f]) && f.rows_contiguous() && f.ne[0] >= rp.n_dims / 2)
        }
        (Op::GetRows, [a, rows]) => fits(a) && rows.dtype == DType::I32 && fits(rows),
        (Op::AddId, [a, b, ids]) => {
            f32s(&[a, b]) && a.ne == t.ne && ids.dtype == DType::I32 && fits(ids)
        }
        (Op::SumRows, [a]) => !exact && f32s(&[a]) && t.ne == [1, a.ne[1], a.ne[2], a.ne[3]],
        (Op::Unary(op), [a]) if fast_unary_code(op).is_some() => {
            !exact && f32s(&[a]) && a.ne == t.ne
        }
        (Op::SsmConv, [sx, c]) => !exact && f32s(&[sx, c]) && rgml::op::ssm_conv_shapes(t, sx, c),
        (Op::GatedDeltaNet { snapshots }, srcs @ [q, k, v, g, beta, state]) => {
            !exact && f32s(srcs) && delta_net_fits(t, [q, k, v, g, beta, state], snapshots)
        }
        (Op::MulMatId { .. }, [a, b, ids]) => !exact && fast_mul_mat_id(a, b, ids),
        // Sinks stay on the CPU.
        (
            Op::SoftMax {
                max_bias,
                sinks: false,
                ..
            },
            srcs,
        ) if max_bias.is_finite() => match srcs {
            [a] => f32s(&[a]) && a.ne == t.ne,
            [a, mask] => f32s(&[a]) && f32_or_f16(mask) && a.ne == t.ne,
            _ => false,
        },
        // A Hadamard product stays on the CPU, whose transform is ggml's (this backend would
        // round the product with the matrix differently).
        (Op::MulMat { hadamard: true, .. }, _) => false,
        (Op::MulMat { .. }, [a, b]) => (!exact && fast_mul_mat(a, b)) || exact_mul_mat(a, b),
        (
            Op::FlashAttnExt {
                max_bias,
                softcap,
                sinks: false,
                ..
            },
            [q, k, v, mask @ ..],
        ) => !exact && max_bias == 0.0 && softcap == 0.0 && fast_flash_attn(q, k, v, mask),
        _ => false,
    }
}

/// Whether `flash_attn_fast` takes FLASH_ATTN_EXT of `q`, `k`, `v` (and a mask): an f16 cache
/// with 4-byte-aligned rows, head sizes it holds (dk even up to 512, dv a power of two from 2
/// to 512) and shapes within its u32 arithmetic. Keys and values must share a buffer, which is
/// checked when the node is prepared (a KV cache is one buffer).
fn fast_flash_attn(q: &Tensor, k: &Tensor, v: &Tensor, mask: &[&Tensor]) -> bool {
    let f16_rows =
        |t: &Tensor| t.dtype == DType::F16 && t.nb[1..].iter().all(|s| s.is_multiple_of(4));
    let (dk, dv) = (k.ne[0], v.ne[0]);
    let heads =
        dk.is_multiple_of(2) && dk <= 512 && dv.is_power_of_two() && (2..=512).contains(&dv);
    let mask_ok = mask.iter().all(|m| m.dtype == DType::F16 && fits(m));
    q.dtype == DType::F32
        && fits(q)
        && f16_rows(k)
        && f16_rows(v)
        && fits(k)
        && fits(v)
        && heads
        && mask_ok
}

/// Whether MUL_MAT's activations `b` are f32 that the kernels can address and its weights `a`
/// broadcast over them in whole multiples (dims 2 and 3).
fn f32_operand(a: &Tensor, b: &Tensor) -> bool {
    b.dtype == DType::F32
        && fits(b)
        && a.ne[2] > 0
        && a.ne[3] > 0
        && b.ne[2].is_multiple_of(a.ne[2])
        && b.ne[3].is_multiple_of(a.ne[3])
}

/// `unary_fast`'s code for `op` (its `misc.y`), for the unary ops it computes.
fn fast_unary_code(op: UnaryOp) -> Option<u32> {
    match op {
        UnaryOp::Tanh => Some(0),
        UnaryOp::Neg => Some(1),
        UnaryOp::Sigmoid => Some(2),
        UnaryOp::Exp => Some(3),
        UnaryOp::Softplus => Some(4),
        UnaryOp::Silu | UnaryOp::Gelu => None,
    }
}

/// GATED_DELTA_NET's shapes ([`rgml::op::gated_delta_net_shapes`]), a contiguous result, and
/// the scratch copies of q, g and beta addressable by u32 words.
fn delta_net_fits(t: &Tensor, srcs: [&Tensor; 6], snapshots: usize) -> bool {
    let [q, _, _, g, beta, _] = srcs;
    let scratch_words = q.nelements() + g.nelements() + beta.nelements();
    rgml::op::gated_delta_net_shapes(t, srcs, snapshots)
        && t.is_contiguous()
        && u32::try_from(scratch_words).is_ok()
}

/// Whether the exact kernels take MUL_MAT of weights `a` by activations `b`.
fn exact_mul_mat(a: &Tensor, b: &Tensor) -> bool {
    fits(a)
        && a.dtype != DType::I32
        && (!vec_dot_order(a, b) || a.ne[0].is_multiple_of(64))
        && f32_operand(a, b)
}

/// Whether ggml's AVX-512 build multiplies these f32 / f16 weights with tinyBLAS (two or more
/// activation rows, weight rows in whole groups of 4, rows of whole 16-lane vectors); otherwise
/// it takes `ggml_vec_dot_f16` / `_f32` pair by pair.
fn tinyblas_takes(a: &Tensor, b: &Tensor) -> bool {
    b.ne[1] >= 2 && a.ne[1].is_multiple_of(4) && a.ne[0].is_multiple_of(16)
}

/// f32 / f16 weights that ggml multiplies pair by pair, in `ggml_vec_dot`'s order.
fn vec_dot_order(a: &Tensor, b: &Tensor) -> bool {
    matches!(a.dtype, DType::F32 | DType::F16) && !tinyblas_takes(a, b)
}

fn dims(ne: [usize; 4]) -> [u32; 4] {
    // `supports_op` checked that every dimension fits.
    ne.map(|n| n as u32)
}

/// `t`'s strides in the kernels' units (see [`unit`]).
fn strides(t: &Tensor) -> [u32; 4] {
    let u = unit(t.dtype);
    t.nb.map(|b| (b / u) as u32)
}

/// YaRN's `[start, end]` correction dims in f32, as ggml-cpu computes them for its table.
fn rope_corr_dims(p: &RopeParams) -> [f32; 2] {
    let dim = |n_rot: f32| {
        p.n_dims as f32 * (p.n_ctx_orig as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln()
            / (2.0 * p.freq_base.ln())
    };
    let start = dim(p.beta_fast).floor();
    let end = dim(p.beta_slow).ceil();
    [start.max(0.0), end.min(p.n_dims as f32 - 1.0)]
}

/// What ROPE's cos / sin table depends on besides the positions' values, computed on the host
/// in f32 exactly as the CPU backend (`rgml-cpu`'s `kernels/rope.rs`, after ggml-cpu) does: the
/// rotated dims (even, at most ne0), θ scale, YaRN's correction dims and magnitude scale.
/// Parameters only: the table itself is made on the GPU from the positions (`rope_cache`).
struct RopeSetup {
    n_dims: usize,
    theta_scale: f32,
    corr: [f32; 2],
    mscale: f32,
}

impl RopeSetup {
    fn new(rp: &RopeParams, ne0: usize) -> RopeSetup {
        let n_dims = rp.n_dims.min(ne0) & !1;
        let mut mscale = rp.attn_factor;
        if rp.ext_factor != 0.0 {
            // ggml's `1.0f + 0.1f * logf(1.0f / freq_scale)`, contracted by GCC into an FMA.
            mscale *= 0.1f32.mul_add((1.0 / rp.freq_scale).ln(), 1.0);
        }
        RopeSetup {
            n_dims,
            theta_scale: rp.freq_base.powf(-2.0 / n_dims.max(1) as f32),
            corr: rope_corr_dims(rp),
            mscale,
        }
    }
}

/// One node ready to encode: its kernel, parameters, bound buffers (A, B, C, D) and threads.
pub(crate) struct Dispatch {
    pub(crate) kernel: Kernel,
    pub(crate) params: Params,
    pub(crate) buffers: [wgpu::Buffer; 4],
    pub(crate) threads: u64,
}

/// What a ROPE table depends on: the positions tensor, the frequency factors tensor (if any),
/// how many positions, the rotated dims and the op's parameters.
type RopeTableKey = (TensorId, Option<TensorId>, usize, usize, RopeParams);

/// A ROPE table made for the graph being prepared, and the bytes it was made from (buffer,
/// byte range: the positions, the frequency factors): a node that writes there afterwards
/// makes it stale.
struct RopeTable {
    key: RopeTableKey,
    table: wgpu::Buffer,
    inputs: Vec<(wgpu::Buffer, std::ops::Range<usize>)>,
}

/// Prepares one graph's nodes for dispatch on `gpu` (`device`: the device name, for errors).
/// Preparation reads tensor metadata only, never values: what it makes stays valid while the
/// context's metadata does (a graph plan).
pub(crate) struct Prep<'a> {
    pub(crate) gpu: &'a Gpu,
    pub(crate) device: &'a str,
    /// The exact arithmetic's kernels (else the fast ones, where they exist).
    exact: bool,
    /// ROPE tables made for this graph: every layer rotates at the same positions, so the first
    /// ROPE fills the table and the later ones read it.
    rope_tables: Vec<RopeTable>,
}

impl<'a> Prep<'a> {
    pub(crate) fn new(gpu: &'a Gpu, device: &'a str, exact: bool) -> Prep<'a> {
        Prep {
            gpu,
            device,
            exact,
            rope_tables: Vec::new(),
        }
    }

    fn err(&self, message: impl Into<String>) -> Error {
        self.gpu.err(message)
    }

    /// The wgpu buffer and offset of `t`'s storage, in the kernels' units (see [`unit`]).
    fn storage(&self, t: &Tensor) -> Result<(wgpu::Buffer, u32)> {
        let data = t
            .data
            .as_ref()
            .ok_or_else(|| Error::NoStorage(t.display_name().to_string()))?;
        let buf = data
            .buffer
            .imp()
            .downcast_ref::<WgpuBuffer>()
            .filter(|b| std::ptr::eq(&*b.gpu, self.gpu))
            .ok_or_else(|| {
                self.err(format!(
                    "tensor '{}' is in '{}' memory, not this device's",
                    t.display_name(),
                    data.buffer.name()
                ))
            })?;
        let u = unit(t.dtype);
        let align = if u == 4 { 4 } else { 2 };
        if !data.offset.is_multiple_of(align) {
            return Err(self.err(format!(
                "tensor '{}' is at an offset not aligned to {align} bytes",
                t.display_name()
            )));
        }
        let off = u32::try_from(data.offset / u)
            .map_err(|_| self.err(format!("tensor '{}' offset too large", t.display_name())))?;
        Ok((buf.buffer.clone(), off))
    }

    /// The dispatches that compute node `id` (none for views and empty tensors), in order.
    pub(crate) fn prepare(&mut self, ctx: &Context, id: TensorId) -> Result<Vec<Dispatch>> {
        let dispatches = self.prepare_node(ctx, id)?;
        if !dispatches.is_empty() {
            self.forget_overwritten_tables(ctx.get(id)?);
        }
        Ok(dispatches)
    }

    /// Node `id` fused with the first of `upcoming` (the graph's next computing nodes, in
    /// order), where the fast arithmetic takes them in one dispatch: the dispatches and how
    /// many of `upcoming` they cover, with every table the nodes overwrite forgotten; `None`
    /// where they do not fuse (prepare each with [`Prep::prepare`]).
    pub(crate) fn prepare_fused(
        &mut self,
        ctx: &Context,
        id: TensorId,
        upcoming: &[TensorId],
    ) -> Result<Option<(Vec<Dispatch>, usize)>> {
        let mut fused = None;
        if let [next, then, ..] = *upcoming {
            fused = self.swiglu_mat_vec(ctx, [id, next, then])?.map(|d| (d, 2));
        }
        if let (None, [next, then, ..]) = (&fused, upcoming) {
            fused = self
                .rms_norm_fused(ctx, Some(id), [*next, *then])?
                .map(|d| (vec![d], 2));
        }
        if let (None, [next, ..]) = (&fused, upcoming) {
            fused = self
                .rms_norm_fused(ctx, None, [id, *next])?
                .map(|d| (vec![d], 1));
        }
        let Some((dispatches, n)) = fused else {
            return Ok(None);
        };
        self.forget_overwritten_tables(ctx.get(id)?);
        for &u in &upcoming[..n] {
            self.forget_overwritten_tables(ctx.get(u)?);
        }
        Ok(Some((dispatches, n)))
    }

    /// A decode step's gate and up projections of one activation (`ids[0]`, `ids[1]`: MUL_MAT
    /// by the same columns, weights of one type, shape and wgpu buffer) and their SWIGLU
    /// (`ids[2]`) as one dispatch of `mul_mv_blocks` in its GLU form: the activations are read
    /// once for both, and the gate, the up and the SwiGLU results are all written (to one
    /// buffer). `None` in the exact arithmetic or where the nodes are not that pattern.
    fn swiglu_mat_vec(&self, ctx: &Context, ids: [TensorId; 3]) -> Result<Option<Vec<Dispatch>>> {
        let (g, u, s) = (ctx.get(ids[0])?, ctx.get(ids[1])?, ctx.get(ids[2])?);
        let mat_vecs = matches!(g.op, Op::MulMat { .. }) && matches!(u.op, Op::MulMat { .. });
        let fused = self.gpu.fuse_glu && self.gpu.kernels.mv_rows > 0;
        if self.exact || !fused || !mat_vecs || s.op != Op::Swiglu {
            return Ok(None);
        }
        let (&[wg, x], &[wu, xu], &[sg, su]) = (&g.src[..], &u.src[..], &s.src[..]) else {
            return Ok(None);
        };
        if x != xu || [sg, su] != [ids[0], ids[1]] {
            return Ok(None);
        }
        let (wg, wu, x) = (ctx.get(wg)?, ctx.get(wu)?, ctx.get(x)?);
        let twins = wg.dtype == wu.dtype && wg.ne == wu.ne && wg.nb == wu.nb;
        let outputs = [g, u, s]
            .iter()
            .all(|t| t.dtype == DType::F32 && t.ne == g.ne && t.nb == g.nb);
        let one_matrix = g.ne[1] <= MV_COLS && g.ne[2] * g.ne[3] == 1;
        if !(twins && outputs && one_matrix && fast_mul_mat(wg, x) && fast_mul_mat(wu, x)) {
            return Ok(None);
        }
        let (mut p, buffers) = self.bind(s, &[wg, x])?;
        p.misc[1] = 1;
        p.misc[2] = 1;
        let (wg_buf, _) = self.storage(wg)?;
        let (wu_buf, wu_off) = self.storage(wu)?;
        let (s_buf, _) = self.storage(s)?;
        let (g_buf, g_off) = self.storage(g)?;
        let (u_buf, u_off) = self.storage(u)?;
        let one_buffer = wg_buf == wu_buf && g_buf == s_buf && u_buf == s_buf;
        // Other workgroups still read the activations while one writes its results.
        let apart = !(self.shares_memory(g, x)?
            || self.shares_memory(u, x)?
            || self.shares_memory(s, x)?);
        if !(one_buffer && apart && mv_blocks_fit(&p, wg)) {
            return Ok(None);
        }
        p.c_ne = [wu_off, g_off, u_off, 0];
        let groups = (g.ne[0] as u64).div_ceil(self.gpu.kernels.mv_group_rows());
        Ok(Some(self.mv_blocks(p, buffers, wg, g.ne[1], true, groups)?))
    }

    /// RMS_NORM `ids[0]` and `ids[1]`, the MUL of its result by a row of f32 weights (its
    /// second source, broadcast over rows), with `add` the ADD whose result the norm takes, as
    /// one dispatch of `rms_norm_fast` (see its modes): every result is written, to the MUL's
    /// buffer. `None` in the exact arithmetic or where the nodes are not that pattern.
    fn rms_norm_fused(
        &self,
        ctx: &Context,
        add: Option<TensorId>,
        ids: [TensorId; 2],
    ) -> Result<Option<Dispatch>> {
        let (norm, mul) = (ctx.get(ids[0])?, ctx.get(ids[1])?);
        let Op::RmsNorm { eps } = norm.op else {
            return Ok(None);
        };
        if self.exact || mul.op != Op::Mul || mul.src.first() != Some(&ids[0]) {
            return Ok(None);
        }
        let (Some(&x), Some(&w)) = (norm.src.first(), mul.src.get(1)) else {
            return Ok(None);
        };
        // The inputs: the norm's, or the ADD's two.
        let (a, b, sum) = match add {
            Some(id) => {
                let sum = ctx.get(id)?;
                let (&[a, b], true) = (&sum.src[..], sum.op == Op::Add && x == id) else {
                    return Ok(None);
                };
                (ctx.get(a)?, ctx.get(b)?, Some(sum))
            }
            None => (ctx.get(x)?, ctx.get(x)?, None),
        };
        let w = ctx.get(w)?;
        let outputs: Vec<&Tensor> = [norm, mul].into_iter().chain(sum).collect();
        let f32_rows = [a, b, w]
            .iter()
            .chain(&outputs)
            .all(|u| u.dtype == DType::F32 && u.nb[0] == 4);
        let shapes = a.ne == norm.ne
            && b.ne == norm.ne
            && outputs.iter().all(|u| u.ne == norm.ne && u.nb == mul.nb);
        let weight_row = w.ne[0] == norm.ne[0] && w.ne[1..].iter().all(|&n| n == 1);
        // A workgroup holds its row in registers (up to 16 x ROW_WG elements) before it writes.
        let in_registers = norm.ne[0] <= 16 * ROW_WG;
        if !(f32_rows && shapes && weight_row && in_registers) {
            return Ok(None);
        }
        let (mul_buf, _) = self.storage(mul)?;
        let mut offsets = [0u32; 2];
        for (k, out) in [sum, Some(norm)].into_iter().enumerate() {
            if let Some(out) = out {
                let (buf, off) = self.storage(out)?;
                if buf != mul_buf {
                    return Ok(None);
                }
                offsets[k] = off;
            }
        }
        for out in &outputs {
            if !(self.in_place_or_apart(out, a)? && self.in_place_or_apart(out, b)?) {
                return Ok(None);
            }
        }
        let (mut p, buffers) = self.bind(mul, &[a, b, w])?;
        p.f[0] = eps;
        p.misc[1] = if sum.is_some() { 2 } else { 1 };
        p.misc[2] = offsets[0];
        p.misc[3] = offsets[1];
        let kernel = Kernel::Fast(FastKernel::RmsNorm, 0);
        // One workgroup per row (see `one_dispatch`).
        Ok(Some(self.dispatch(
            kernel,
            p,
            buffers,
            norm.nrows() as u64 * WG,
        )?))
    }

    /// Whether a kernel that writes each element of `out` after reading the same element of
    /// `input` (and no other) may take them: their storage is apart, or the same elements
    /// (in place).
    fn in_place_or_apart(&self, out: &Tensor, input: &Tensor) -> Result<bool> {
        let same = match (&out.data, &input.data) {
            (Some(o), Some(i)) => {
                Arc::ptr_eq(&o.buffer, &i.buffer)
                    && o.offset == i.offset
                    && out.ne == input.ne
                    && out.nb == input.nb
            }
            _ => false,
        };
        Ok(same || !self.shares_memory(out, input)?)
    }

    /// Whether the storage of `a` and `b` overlaps (in one wgpu buffer).
    fn shares_memory(&self, a: &Tensor, b: &Tensor) -> Result<bool> {
        let (a_buf, a_off) = self.storage(a)?;
        let (b_buf, b_off) = self.storage(b)?;
        // Offsets in units of `unit(dtype)`; in bytes for the comparison.
        let start = |off: u32, t: &Tensor| off as usize * unit(t.dtype);
        let (a0, b0) = (start(a_off, a), start(b_off, b));
        Ok(a_buf == b_buf && a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes())
    }

    /// Drop the ROPE tables whose positions or frequency factors node `t` overwrites: a later
    /// ROPE reading them must fill its table again, after `t`.
    fn forget_overwritten_tables(&mut self, t: &Tensor) {
        let Some(data) = t.data.as_ref() else {
            return;
        };
        let Some(buf) = data.buffer.imp().downcast_ref::<WgpuBuffer>() else {
            return;
        };
        let written = data.offset..data.offset + t.nbytes();
        self.rope_tables.retain(|rt| {
            rt.inputs.iter().all(|(b, range)| {
                *b != buf.buffer || range.end <= written.start || written.end <= range.start
            })
        });
    }

    fn prepare_node(&mut self, ctx: &Context, id: TensorId) -> Result<Vec<Dispatch>> {
        let t = ctx.get(id)?;
        if t.op.kind().is_view() || t.nelements() == 0 {
            return Ok(Vec::new());
        }
        if !supports_op(ctx, id, self.exact) {
            return Err(self.unsupported(t));
        }
        let srcs: Vec<&Tensor> = t.src.iter().map(|&s| ctx.get(s)).collect::<Result<_>>()?;
        let (mut p, buffers) = self.bind(t, &srcs)?;
        match t.op {
            Op::Rope(rp) => self.rope(p, buffers, t, &srcs, &rp),
            Op::SoftMax {
                scale, max_bias, ..
            } => {
                let d = self.soft_max(p, buffers, t, &srcs, scale, max_bias)?;
                Ok(vec![d])
            }
            Op::MulMat { .. } => self.mul_mat(p, buffers, t, &srcs),
            Op::MulMatId { .. } => self.mul_mat_id(p, buffers, t, &srcs),
            Op::FlashAttnExt { scale, .. } => self.flash_attn(p, buffers, t, &srcs, scale),
            Op::GatedDeltaNet { snapshots } => {
                self.gated_delta_net(p, buffers, t, &srcs, snapshots)
            }
            _ => {
                let (kernel, threads) = self
                    .one_dispatch(&mut p, t, &srcs)
                    .ok_or_else(|| self.unsupported(t))?;
                let mut buffers = buffers;
                if matches!(t.op, Op::Unary(UnaryOp::Gelu) | Op::Geglu) {
                    // ggml's GELU table, as binding C (unused by these ops otherwise).
                    buffers[2] = self.gpu.gelu_table();
                    p.off[2] = 0;
                }
                Ok(vec![self.dispatch(kernel, p, buffers, threads)?])
            }
        }
    }

    /// GATED_DELTA_NET in the fast arithmetic (`gated_delta_net_fast`): q, g and beta copied
    /// densely into the scratch buffer (the kernel's four bindings hold it, k, v and the
    /// result), the state source into the result's slot 0, then the kernel, which evolves the
    /// state there.
    fn gated_delta_net(
        &self,
        mut p: Params,
        mut buffers: [wgpu::Buffer; 4],
        t: &Tensor,
        srcs: &[&Tensor],
        snapshots: usize,
    ) -> Result<Vec<Dispatch>> {
        let [q, _, v, g, beta, state] = srcs else {
            return Err(self.unsupported(t));
        };
        let [s_v, h, n_tokens, n_seqs] = v.ne;
        let (q_words, g_words) = (q.nelements(), g.nelements());
        let words = q_words + g_words + beta.nelements();
        let scratch = self.gpu.scratch.get(&self.gpu.device, 4 * words);
        let (d_buf, d_off) = self.storage(t)?;
        // `supports_op` bounded the scratch's words and the result's elements by u32.
        let outputs = (s_v * h * n_tokens * n_seqs) as u32;
        let state_at = d_off
            .checked_add(outputs)
            .ok_or_else(|| self.err("GATED_DELTA_NET result beyond the kernels' u32 offsets"))?;
        let mut out = Vec::with_capacity(5);
        for (src, at) in [(q, 0), (g, q_words), (beta, q_words + g_words)] {
            out.push(self.dense_copy(src, &scratch, at as u32)?);
        }
        out.push(self.dense_copy(state, &d_buf, state_at)?);
        buffers[0] = scratch;
        p.off[0] = 0;
        p.a_nb = [
            g.ne[0] as u32,
            q_words as u32,
            (q_words + g_words) as u32,
            snapshots as u32,
        ];
        p.f[0] = 1.0 / (s_v as f32).sqrt();
        let kernel = Kernel::Fast(FastKernel::GatedDeltaNet, 0);
        out.push(self.dispatch(kernel, p, buffers, (s_v * h * n_seqs) as u64)?);
        Ok(out)
    }

    /// A copy of f32 tensor `src` (any strides) to `to` from word `at`, dense (`cpy`).
    fn dense_copy(&self, src: &Tensor, to: &wgpu::Buffer, at: u32) -> Result<Dispatch> {
        let (buf, off) = self.storage(src)?;
        let ne = dims(src.ne);
        let p = Params {
            a_ne: ne,
            a_nb: strides(src),
            d_ne: ne,
            d_nb: [1, ne[0], ne[0] * ne[1], ne[0] * ne[1] * ne[2]],
            off: [off, 0, 0, at],
            ..Params::default()
        };
        let buffers = [buf, to.clone(), to.clone(), to.clone()];
        self.dispatch(Kernel::Cpy, p, buffers, src.nelements() as u64)
    }

    /// FLASH_ATTN_EXT in the fast arithmetic (`flash_attn_fast`): a workgroup per query row;
    /// the values are read through the keys' binding, so both must be in one buffer, 4-byte
    /// aligned (see the kernel for where each parameter goes).
    fn flash_attn(
        &self,
        mut p: Params,
        buffers: [wgpu::Buffer; 4],
        t: &Tensor,
        srcs: &[&Tensor],
        scale: f32,
    ) -> Result<Vec<Dispatch>> {
        let [q, k, v, rest @ ..] = srcs else {
            return Err(self.unsupported(t));
        };
        let (k_buf, k_off) = self.storage(k)?;
        let (v_buf, v_off) = self.storage(v)?;
        if k_buf != v_buf || !k_off.is_multiple_of(4) || !v_off.is_multiple_of(4) {
            return Err(self.err(format!(
                "FLASH_ATTN_EXT '{}': keys and values must be in one buffer at 4-byte offsets",
                t.display_name()
            )));
        }
        let [a, _, _, d] = buffers;
        let v_nb = strides(v);
        p.c_ne[0] = v_nb[1];
        p.c_ne[1] = v_nb[2];
        p.misc[2] = v_nb[3];
        p.misc[3] = v_off;
        p.misc[1] = v.ne[2] as u32;
        // The mask as C (its strides replace v's, which `bind` put there).
        let (c, has_mask) = match rest.first() {
            Some(m) => {
                let (m_buf, m_off) = self.storage(m)?;
                p.off[2] = m_off;
                p.c_nb = strides(m);
                p.c_ne[2] = m.ne[2] as u32;
                p.c_ne[3] = m.ne[3] as u32;
                (m_buf, 1.0)
            }
            None => {
                p.c_nb = [0; 4];
                p.c_ne[2] = 1;
                p.c_ne[3] = 1;
                (a.clone(), 0.0)
            }
        };
        p.f[1] = has_mask;
        p.f[0] = scale;
        let rows = q.ne[1] * q.ne[2] * q.ne[3];
        // Few rows (a decode) over many keys: split the keys so more than one workgroup per
        // head runs, then add the splits (`flash_attn_merge`).
        let n_kv = k.ne[1];
        let splits = if rows < FA_SPLIT_BELOW_ROWS {
            n_kv.div_ceil(FA_SPLIT_KEYS).clamp(1, FA_MAX_SPLITS)
        } else {
            1
        };
        p.f[2] = splits as f32;
        p.f[3] = (n_kv.div_ceil(splits).div_ceil(ROW_WG) * ROW_WG) as f32;
        let kernel = Kernel::Fast(FastKernel::FlashAttn, 0);
        let groups = (rows * splits) as u64 * WG;
        if splits == 1 {
            return Ok(vec![self.dispatch(kernel, p, [a, k_buf, c, d], groups)?]);
        }
        let floats = rows * splits * (t.ne[0] + 2);
        let scratch = self.gpu.scratch.get(&self.gpu.device, floats * 4);
        let mut split = p;
        split.off[3] = 0;
        let parts = self.dispatch(
            kernel,
            split,
            [a.clone(), k_buf, c, scratch.clone()],
            groups,
        )?;
        let mut merge = p;
        merge.off[0] = 0;
        let kernel = Kernel::Fast(FastKernel::FlashAttnMerge, 0);
        let sums = self.dispatch(kernel, merge, [scratch, a.clone(), a, d], rows as u64 * WG)?;
        Ok(vec![parts, sums])
    }

    /// `mul_mv_blocks` of weights `a` by the `cols` activation columns `p` describes (B), in
    /// `groups` workgroups, GLU or not. With DP4A for a type it takes, the activations are
    /// quantized into the scratch buffer first (`quantize_q8_fast`), which the mat-vec then
    /// reads as B.
    fn mv_blocks(
        &self,
        p: Params,
        buffers: [wgpu::Buffer; 4],
        a: &Tensor,
        cols: usize,
        glu: bool,
        groups: u64,
    ) -> Result<Vec<Dispatch>> {
        let code =
            weight_code(a.dtype).ok_or_else(|| self.err("no fast kernel for the weights"))?;
        let dp4a = self.gpu.kernels.mv_dp4a
            && matches!(
                a.dtype,
                DType::Q4_0 | DType::Q8_0 | DType::Q4_K | DType::Q6_K
            );
        let cols = cols as u32;
        let kernel = Kernel::Fast(FastKernel::MulMvBlocks { cols, glu, dp4a }, code);
        if !dp4a {
            return Ok(vec![self.dispatch(kernel, p, buffers, groups * WG)?]);
        }
        let columns: usize = p.b_ne[1..].iter().map(|&n| n as usize).product();
        let blocks = (p.b_ne[0] as usize / 32) * columns;
        let quantize = (FastKernel::QuantizeQ8, blocks, Q8_FAST_BLOCK_BYTES);
        self.via_scratch(p, buffers, quantize, (kernel, groups * WG))
    }

    /// Two dispatches: `convert` (`items` invocations, `item_bytes` each) writes B's activations
    /// into the scratch buffer, then `product` (with its invocations) reads them there as B.
    fn via_scratch(
        &self,
        p: Params,
        buffers: [wgpu::Buffer; 4],
        convert: (FastKernel, usize, usize),
        product: (Kernel, u64),
    ) -> Result<Vec<Dispatch>> {
        let (kernel, items, item_bytes) = convert;
        let size = items
            .checked_mul(item_bytes)
            .filter(|&s| s / 4 <= u32::MAX as usize)
            .ok_or_else(|| self.err("MUL_MAT activations too large for the scratch buffer"))?;
        let scratch = self.gpu.scratch.get(&self.gpu.device, size);
        let [a, b, c, d] = buffers;
        let mut to_scratch = p;
        to_scratch.off[3] = 0;
        let first = self.dispatch(
            Kernel::Fast(kernel, 0),
            to_scratch,
            [a.clone(), b, c.clone(), scratch.clone()],
            items as u64,
        )?;
        let second = self.dispatch(product.0, p, [a, scratch, c, d], product.1)?;
        Ok(vec![first, second])
    }

    /// MUL_MAT in the fast arithmetic: `mul_mv_fast` for up to [`MV_COLS`] activation columns
    /// (two weight rows per workgroup), else `mul_mm_fast` (a tile of outputs per workgroup),
    /// each matrix of dims 2 and 3 in its own workgroups.
    fn mul_mat_fast(
        &self,
        p: Params,
        buffers: [wgpu::Buffer; 4],
        t: &Tensor,
        a: &Tensor,
    ) -> Result<Vec<Dispatch>> {
        let code = weight_code(a.dtype).ok_or_else(|| self.unsupported(t))?;
        let matrices = (t.ne[2] * t.ne[3]) as u64;
        let (m, n) = (t.ne[0] as u64, t.ne[1] as u64);
        let rows = self.gpu.kernels.mv_group_rows();
        if t.ne[1] <= MV_COLS && rows > 0 && mv_blocks_fit(&p, a) {
            let groups = m.div_ceil(rows) * matrices;
            return self.mv_blocks(p, buffers, a, t.ne[1], false, groups);
        }
        if t.ne[1] <= MV_COLS {
            let groups = m.div_ceil(MV_ROWS) * matrices;
            let kernel = Kernel::Fast(FastKernel::MulMv, code);
            return Ok(vec![self.dispatch(kernel, p, buffers, groups * WG)?]);
        }
        // Both take a 64 x 64 tile per workgroup (of 128 invocations for the coop one: the
        // count of workgroups is what `groups * WG` gives either way).
        let groups = m.div_ceil(MM_TILE) * n.div_ceil(MM_TILE) * matrices * WG;
        if self.gpu.kernels.coop.is_some() && a.ne[0].is_multiple_of(8) {
            return self.mul_mm_coop(p, buffers, t, code, groups);
        }
        let kernel = Kernel::Fast(FastKernel::MulMm, code);
        Ok(vec![self.dispatch(kernel, p, buffers, groups)?])
    }

    /// MUL_MAT_ID in the fast arithmetic: for a decode (up to [`MV_COLS`] tokens)
    /// `mul_mv_id_fast`, two weight rows of one column's expert per workgroup, every column
    /// (slot, token) apart; for a prompt the columns listed per expert (`mm_id_lists`, into
    /// the scratch buffer) and `mul_mm_id_fast`'s tiles over each expert's rows and columns.
    fn mul_mat_id(
        &self,
        p: Params,
        buffers: [wgpu::Buffer; 4],
        t: &Tensor,
        srcs: &[&Tensor],
    ) -> Result<Vec<Dispatch>> {
        let Some((a, code)) = srcs
            .first()
            .filter(|_| !self.exact)
            .and_then(|a| Some((a, weight_code(a.dtype)?)))
        else {
            return Err(self.unsupported(t));
        };
        if t.ne[2] > MV_COLS {
            return self.mul_mm_id(p, buffers, t, a.ne[2], code);
        }
        let columns = (t.ne[1] * t.ne[2]) as u64;
        let groups = (t.ne[0] as u64).div_ceil(MV_ROWS) * columns;
        let kernel = Kernel::Fast(FastKernel::MulMvId, code);
        Ok(vec![self.dispatch(kernel, p, buffers, groups * WG)?])
    }

    /// [`Self::mul_mat_id`] of a prompt: `mm_id_lists` writes each of the `experts`' counts and
    /// lists of columns into the scratch buffer (room for every column in each list), then
    /// `mul_mm_id_fast` reads them as C.
    fn mul_mm_id(
        &self,
        mut p: Params,
        buffers: [wgpu::Buffer; 4],
        t: &Tensor,
        experts: usize,
        code: u32,
    ) -> Result<Vec<Dispatch>> {
        // Counts and lists for each expert and for the columns whose id is none.
        let capacity = t.ne[1] * t.ne[2];
        let words = (experts + 1)
            .checked_mul(capacity + 1)
            .filter(|&w| w <= u32::MAX as usize / 4)
            .ok_or_else(|| self.err("MUL_MAT_ID routing too large for the scratch buffer"))?;
        let scratch = self.gpu.scratch.get(&self.gpu.device, 4 * words);
        let [a, b, ids, d] = buffers;
        let mut lists = p;
        lists.off[3] = 0;
        let list_bufs = [a.clone(), b.clone(), ids, scratch.clone()];
        let kernel = Kernel::Fast(FastKernel::MmIdLists, 0);
        let listed = self.dispatch(kernel, lists, list_bufs, (experts + 1) as u64 * WG)?;
        // Expert e's matrix: weight_row's dims 2 and 3 without broadcast.
        p.off[2] = 0;
        p.misc[1] = 1;
        p.misc[2] = 1;
        let tiles_m = t.ne[0].div_ceil(MM_TILE as usize);
        let tiles_n = capacity.div_ceil(MM_TILE as usize);
        let groups = ((experts + 1) * tiles_m * tiles_n) as u64;
        let kernel = Kernel::Fast(FastKernel::MulMmId, code);
        let tiles = self.dispatch(kernel, p, [a, b, scratch, d], groups * WG)?;
        Ok(vec![listed, tiles])
    }

    /// A prompt's MUL_MAT on cooperative matrices: the activations converted to f16 into the
    /// scratch buffer once (`to_f16_fast`, a word per two elements), then `mul_mm_coop` reading
    /// them there as B.
    fn mul_mm_coop(
        &self,
        p: Params,
        buffers: [wgpu::Buffer; 4],
        t: &Tensor,
        code: u32,
        groups: u64,
    ) -> Result<Vec<Dispatch>> {
        let words = t.ne[1] * t.ne[2] * t.ne[3] * (p.b_ne[0] as usize / 2);
        let product = Kernel::Fast(FastKernel::MulMmCoop, code);
        self.via_scratch(p, buffers, (FastKernel::ToF16, words, 4), (product, groups))
    }

    /// Whether the exact arithmetic's f64 kernels run: the exact arithmetic on a device with
    /// `SHADER_F64`.
    fn exact_f64(&self) -> bool {
        self.exact && self.gpu.kernels.f64
    }

    fn unsupported(&self, t: &Tensor) -> Error {
        Error::Unsupported {
            backend: self.device.to_string(),
            what: format!("{} of {} ('{}')", t.op.kind(), t.dtype, t.display_name()),
        }
    }

    /// The parameters and bindings every kernel shares: node `t` as D, its sources as A, B, C
    /// (shapes, strides, offsets); unused bindings hold D's buffer.
    fn bind(&self, t: &Tensor, srcs: &[&Tensor]) -> Result<(Params, [wgpu::Buffer; 4])> {
        let (d_buf, d_off) = self.storage(t)?;
        let mut p = Params {
            d_ne: dims(t.ne),
            d_nb: strides(t),
            ..Params::default()
        };
        p.off[3] = d_off;
        let mut buffers = [d_buf.clone(), d_buf.clone(), d_buf.clone(), d_buf];
        // Cpy's second source is its destination, bound as D already.
        let n_src = if t.op == Op::Cpy {
            1
        } else {
            srcs.len().min(3)
        };
        for (i, s) in srcs.iter().take(n_src).enumerate() {
            let (buf, off) = self.storage(s)?;
            buffers[i] = buf;
            p.off[i] = off;
            let (ne, nb) = match i {
                0 => (&mut p.a_ne, &mut p.a_nb),
                1 => (&mut p.b_ne, &mut p.b_nb),
                _ => (&mut p.c_ne, &mut p.c_nb),
            };
            *ne = dims(s.ne);
            *nb = strides(s);
        }
        Ok((p, buffers))
    }

    /// The kernel and invocations of an op computed by one dispatch on the shared bindings,
    /// with its own parameters set in `p`; `None` for the others (ROPE, SOFT_MAX, MUL_MAT have
    /// their own methods).
    fn one_dispatch(&self, p: &mut Params, t: &Tensor, srcs: &[&Tensor]) -> Option<(Kernel, u64)> {
        let elements = t.nelements() as u64;
        let rows = t.nrows() as u64;
        let f16 = t.dtype == DType::F16;
        Some(match t.op {
            Op::Add | Op::Sub | Op::Mul | Op::Div => {
                p.misc[1] = match t.op {
                    Op::Add => 0,
                    Op::Sub => 1,
                    Op::Mul => 2,
                    _ => 3,
                };
                (Kernel::Binary, elements)
            }
            Op::Scale { scale, bias } => {
                p.f = [scale, bias, 0.0, 0.0];
                (Kernel::Scale, elements)
            }
            Op::AddId => (Kernel::AddId, elements),
            Op::Clamp { min, max } => {
                p.f = [min, max, 0.0, 0.0];
                (Kernel::Clamp, elements)
            }
            // One workgroup per row (of ROW_WG invocations: the count of workgroups is what
            // `rows * WG` gives).
            Op::SumRows => (Kernel::Fast(FastKernel::SumRows, 0), rows * WG),
            Op::SsmConv => (Kernel::Fast(FastKernel::SsmConv, 0), elements),
            Op::Unary(op) if fast_unary_code(op).is_some() => {
                p.misc[1] = fast_unary_code(op)?;
                (Kernel::Fast(FastKernel::Unary, 0), elements)
            }
            Op::Argsort { descending } => {
                p.misc[1] = u32::from(descending);
                (Kernel::Fast(FastKernel::Argsort, 0), rows * WG)
            }
            Op::Unary(UnaryOp::Silu) | Op::Swiglu if self.exact_f64() => {
                // The rows' tails through glibc's `expf`, as ggml-cpu computes them.
                p.misc[1] = u32::from(t.op == Op::Swiglu);
                (Kernel::SiluF64, elements)
            }
            Op::Unary(UnaryOp::Silu) => (Kernel::Silu, elements),
            Op::Unary(UnaryOp::Gelu) => (Kernel::Gelu, elements),
            Op::Swiglu | Op::Geglu => {
                p.misc[1] = u32::from(t.op == Op::Geglu);
                (Kernel::Glu, elements)
            }
            Op::DiagMaskInf { n_past } => {
                // Columns beyond ne0 do not exist: clamping keeps `n_past + i1` in range.
                p.misc[1] = n_past.min(t.ne[0]) as u32;
                (Kernel::DiagMaskInf, elements)
            }
            Op::Norm { eps } => {
                p.f[0] = eps;
                match self.exact && self.gpu.kernels.f64 {
                    true => (Kernel::NormF64, rows),
                    false => (Kernel::Norm, rows),
                }
            }
            Op::RmsNorm { eps } => {
                p.f[0] = eps;
                if !self.exact {
                    // A workgroup per row.
                    // One workgroup per row (of ROW_WG invocations: the count of workgroups is
                    // what `rows * WG` gives).
                    (Kernel::Fast(FastKernel::RmsNorm, 0), rows * WG)
                } else if self.gpu.kernels.f64 {
                    (Kernel::RmsNormF64, rows)
                } else {
                    (Kernel::RmsNorm, rows)
                }
            }
            Op::Cpy | Op::Dup | Op::Cont => {
                p.misc[2] = type_code(srcs.first()?.dtype)?;
                (if f16 { Kernel::CpyF16 } else { Kernel::Cpy }, elements)
            }
            Op::SetRows => {
                p.misc[2] = type_code(t.dtype)?;
                let n = srcs.get(1)?.nelements() as u64;
                (
                    if f16 {
                        Kernel::SetRowsF16
                    } else {
                        Kernel::SetRows
                    },
                    n,
                )
            }
            Op::Concat { dim } => {
                p.misc[1] = dim as u32;
                (Kernel::Concat, elements)
            }
            Op::Argmax => (Kernel::Argmax, srcs.first()?.nrows() as u64),
            Op::GetRows => {
                p.misc[2] = type_code(srcs.first()?.dtype)?;
                (Kernel::GetRows, elements)
            }
            _ => return None,
        })
    }

    /// SOFT_MAX: scale, ALiBi slope bases, and the optional mask (moved to binding C, where the
    /// kernel reads it).
    fn soft_max(
        &self,
        mut p: Params,
        mut buffers: [wgpu::Buffer; 4],
        t: &Tensor,
        srcs: &[&Tensor],
        scale: f32,
        max_bias: f32,
    ) -> Result<Dispatch> {
        p.f[0] = scale;
        // ALiBi slopes' bases (1 without ALiBi: every slope is 1).
        let n_head = u32::try_from(t.ne[2]).unwrap_or(u32::MAX).max(1);
        let n_head_log2 = 1u32 << n_head.ilog2();
        p.f[1] = 2f32.powf(-max_bias / n_head_log2 as f32);
        p.f[2] = 2f32.powf(-(max_bias / 2.0) / n_head_log2 as f32);
        p.misc[3] = n_head_log2;
        if let Some(mask) = srcs.get(1) {
            p.misc[1] = 1;
            p.misc[2] = type_code(mask.dtype).unwrap_or(0);
            buffers[2] = buffers[1].clone();
            p.off[2] = p.off[1];
            p.c_ne = p.b_ne;
            p.c_nb = p.b_nb;
        } else {
            p.c_ne = [1; 4];
        }
        let rows = t.nrows() as u64;
        let (kernel, threads) = if !self.exact {
            // A workgroup per row.
            (Kernel::Fast(FastKernel::SoftMax, 0), rows * WG)
        } else if self.gpu.kernels.f64 {
            (Kernel::SoftMaxF64, rows)
        } else {
            (Kernel::SoftMax, rows)
        };
        self.dispatch(kernel, p, buffers, threads)
    }

    /// MUL_MAT: broadcast factors and the weights' type; the fast arithmetic's kernels
    /// ([`Prep::mul_mat_fast`]) where they take it; Q8-dotted weights quantize the
    /// activations first ([`Prep::mul_mat_q8`]), one activation column (generation) takes the
    /// matrix-vector kernels, whose lanes of one output run side by side.
    fn mul_mat(
        &self,
        mut p: Params,
        buffers: [wgpu::Buffer; 4],
        t: &Tensor,
        srcs: &[&Tensor],
    ) -> Result<Vec<Dispatch>> {
        let (Some(a), Some(b)) = (srcs.first(), srcs.get(1)) else {
            return Err(self.unsupported(t));
        };
        // Broadcast factors of the weights over the activations' dims 2 and 3.
        p.misc[1] = p.b_ne[2] / p.a_ne[2].max(1);
        p.misc[2] = p.b_ne[3] / p.a_ne[3].max(1);
        if !self.exact && fast_mul_mat(a, b) {
            return self.mul_mat_fast(p, buffers, t, a);
        }
        p.misc[3] = type_code(a.dtype).unwrap_or(0);
        let elements = t.nelements() as u64;
        let vector = b.ne[1] == 1;
        if quantizes_activations(a.dtype) {
            return self.mul_mat_q8(p, buffers, b, elements, vector);
        }
        let vec_dot_order = vec_dot_order(a, b);
        let d = if vector || vec_dot_order {
            // Unused by MUL_MAT otherwise (it has no third source): the lanes' order.
            p.c_ne[0] = u32::from(vec_dot_order);
            self.dispatch(Kernel::MulMv, p, buffers, elements * MV_LANES)?
        } else {
            self.dispatch(Kernel::MulMat, p, buffers, elements)?
        };
        Ok(vec![d])
    }

    /// ROPE: the (cos, sin) table of its positions (and frequency factors), filled by a
    /// `rope_cache` dispatch unless an earlier ROPE of the graph filled it for the same
    /// positions, factors and parameters, then the rotation, which reads the table through
    /// binding C.
    fn rope(
        &mut self,
        mut p: Params,
        mut buffers: [wgpu::Buffer; 4],
        t: &Tensor,
        srcs: &[&Tensor],
        rp: &RopeParams,
    ) -> Result<Vec<Dispatch>> {
        let (Some(&pos_id), Some(&pos)) = (t.src.get(1), srcs.get(1)) else {
            return Err(self.err("ROPE without positions"));
        };
        let factors = t.src.get(2).copied().zip(srcs.get(2).copied());
        let setup = RopeSetup::new(rp, t.ne[0]);
        // Pairs rotated with fused multiply-adds, as ggml's AVX-512 build (the CPU backend's
        // `fused_pairs`): NeoX all, and the multi-section modes, which rotate NeoX pairs (each
        // by its section's position, which the table holds); normal mode all but the last
        // n_pairs % 4, which GCC's vectorized loop leaves to code that rounds every product.
        let pairs = setup.n_dims / 2;
        let fused = match rp.mode {
            RopeMode::Neox | RopeMode::Mrope { .. } | RopeMode::Imrope { .. } => pairs,
            RopeMode::Normal => pairs - pairs % 4,
        };
        let mut out = Vec::with_capacity(2);
        if setup.n_dims > 0 {
            let key = (pos_id, factors.map(|f| f.0), t.ne[2], setup.n_dims, *rp);
            let (table, fill) = self.rope_table(key, pos, factors.map(|f| f.1), &setup, rp)?;
            out.extend(fill);
            buffers[2] = table;
            p.off[2] = 0;
        }
        p.misc[1] = setup.n_dims as u32;
        p.misc[2] = u32::from(rp.mode != RopeMode::Normal);
        p.misc[3] = fused as u32;
        // One invocation per pair of a row's elements.
        let pairs = t.ne[0].div_ceil(2) as u64;
        out.push(self.dispatch(Kernel::Rope, p, buffers, t.nrows() as u64 * pairs)?);
        Ok(out)
    }

    /// The table for `key` (positions, frequency factors, count of positions, rotated dims,
    /// parameters) and, when this graph has not filled it yet, the dispatch that does:
    /// (cos θ · mscale, sin θ · mscale) for every position and pair, computed on the GPU from
    /// the positions and factors as they are when the graph runs. Where the device has f64 the
    /// kernel computes cos / sin as the CPU's libm does (`rope_cache_f64`), bit for bit;
    /// elsewhere with the device's own.
    fn rope_table(
        &mut self,
        key: RopeTableKey,
        pos: &Tensor,
        factors: Option<&Tensor>,
        setup: &RopeSetup,
        rp: &RopeParams,
    ) -> Result<(wgpu::Buffer, Option<Dispatch>)> {
        if let Some(rt) = self.rope_tables.iter().find(|rt| rt.key == key) {
            return Ok((rt.table.clone(), None));
        }
        let (_, _, n_pos, n_dims, _) = key;
        let bytes = n_pos
            .checked_mul(n_dims * 4)
            .filter(|&b| b / 4 <= u32::MAX as usize)
            .ok_or_else(|| self.err("ROPE table too large"))?;
        let table = self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("rgml rope table"),
            size: bytes.max(4) as u64,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        let (pos_buf, pos_off) = self.storage(pos)?;
        let mut q = Params {
            b_ne: dims(pos.ne),
            b_nb: strides(pos),
            ..Params::default()
        };
        q.off[1] = pos_off;
        q.misc[1] = n_dims as u32;
        q.f = [
            setup.theta_scale,
            rp.freq_scale,
            rp.ext_factor,
            setup.mscale,
        ];
        q.g = [setup.corr[0], setup.corr[1], 0.0, 0.0];
        // The multi-section modes: each pair's position among the token's four (`rope_section`).
        if let Some(sections) = rp.mode.sections() {
            q.a_ne = sections;
            let mode = if matches!(rp.mode, RopeMode::Imrope { .. }) {
                2
            } else {
                1
            };
            q.a_nb = [mode, n_pos as u32, 0, 0];
        }
        let kernel = if self.gpu.kernels.f64 {
            Kernel::RopeCacheF64
        } else {
            Kernel::RopeCache
        };
        let byte_range = |t: &Tensor| {
            let start = t.data.as_ref().map_or(0, |d| d.offset);
            start..start + t.nbytes()
        };
        let mut inputs = vec![(pos_buf.clone(), byte_range(pos))];
        // The factors, if any, through binding C (misc.z = 1).
        let mut c_buf = table.clone();
        if let Some(f) = factors {
            let (f_buf, f_off) = self.storage(f)?;
            q.off[2] = f_off;
            q.c_ne = dims(f.ne);
            q.c_nb = strides(f);
            q.misc[2] = 1;
            inputs.push((f_buf.clone(), byte_range(f)));
            c_buf = f_buf;
        }
        let bufs = [table.clone(), pos_buf, c_buf, table.clone()];
        let fill = self.dispatch(kernel, q, bufs, (n_pos * n_dims / 2) as u64)?;
        self.rope_tables.push(RopeTable {
            key,
            table: table.clone(),
            inputs,
        });
        Ok((table, Some(fill)))
    }

    fn dispatch(
        &self,
        kernel: Kernel,
        mut params: Params,
        buffers: [wgpu::Buffer; 4],
        threads: u64,
    ) -> Result<Dispatch> {
        params.misc[0] = u32::try_from(threads).map_err(|_| self.err("too many invocations"))?;
        Ok(Dispatch {
            kernel,
            params,
            buffers,
            threads,
        })
    }

    /// MUL_MAT of Q8-dotted weights: quantize B into the scratch buffer, then the dot products
    /// (`mul_mat_q8` reads the quantized rows through binding C).
    fn mul_mat_q8(
        &self,
        p: Params,
        buffers: [wgpu::Buffer; 4],
        b: &Tensor,
        elements: u64,
        vector: bool,
    ) -> Result<Vec<Dispatch>> {
        let blocks = b.nelements() / 32;
        let size = blocks
            .checked_mul(Q8_BLOCK_BYTES)
            .filter(|&s| s / 4 <= u32::MAX as usize)
            .ok_or_else(|| self.err("MUL_MAT activations too large for the scratch buffer"))?;
        let scratch = self.gpu.scratch.get(&self.gpu.device, size);
        let [a, b_buf, _, d] = buffers;
        let mut q = p;
        q.off[3] = 0;
        let quantize = self.dispatch(
            Kernel::QuantizeQ8,
            q,
            [a.clone(), b_buf.clone(), d.clone(), scratch.clone()],
            blocks as u64,
        )?;
        let mut m = p;
        m.off[2] = 0;
        let dots = if vector {
            let bufs = [a, b_buf, scratch, d];
            self.dispatch(Kernel::MulMvQ8, m, bufs, elements * MV_Q8_LANES)?
        } else {
            self.dispatch(Kernel::MulMatQ8, m, [a, b_buf, scratch, d], elements)?
        };
        Ok(vec![quantize, dots])
    }
}

#[cfg(test)]
mod tests {
    use super::supports_op;
    use rgml::{Context, DType, RopeMode, RopeParams};

    /// Qwen3.5's ops: every ROPE mode is claimed in both arithmetics (the multi-section ones
    /// with four positions per token); SSM_CONV and GATED_DELTA_NET in the fast arithmetic
    /// only; REPEAT in neither.
    #[test]
    fn qwen35_ops_are_claimed_as_the_kernels_have_them() {
        let mut ctx = Context::new();
        let x = ctx.new_tensor(DType::F32, &[16, 2, 3]).unwrap();
        let pos1 = ctx.new_tensor(DType::I32, &[3]).unwrap();
        let pos4 = ctx.new_tensor(DType::I32, &[12]).unwrap();
        let sections = [3, 3, 2, 0];
        for (mode, pos, claimed) in [
            (RopeMode::Normal, pos1, true),
            (RopeMode::Neox, pos1, true),
            (RopeMode::Mrope { sections }, pos4, true),
            (RopeMode::Imrope { sections }, pos4, true),
        ] {
            let y = ctx
                .rope(x, pos, RopeParams::new(mode, 16, 10000.0))
                .unwrap();
            for exact in [true, false] {
                assert_eq!(supports_op(&ctx, y, exact), claimed, "{mode:?}");
            }
        }
        let sx = ctx.new_tensor(DType::F32, &[6, 8, 1]).unwrap();
        let c = ctx.new_tensor(DType::F32, &[4, 8]).unwrap();
        let conv = ctx.ssm_conv(sx, c).unwrap();
        let mut f32s = |ne: &[usize]| ctx.new_tensor(DType::F32, ne).unwrap();
        let (q, k, v) = (
            f32s(&[8, 2, 3, 1]),
            f32s(&[8, 2, 3, 1]),
            f32s(&[8, 2, 3, 1]),
        );
        let (g, beta, s) = (
            f32s(&[1, 2, 3, 1]),
            f32s(&[1, 2, 3, 1]),
            f32s(&[8, 8, 2, 1]),
        );
        let net = ctx.gated_delta_net(q, k, v, g, beta, s, 1).unwrap();
        for id in [conv, net] {
            assert!(!supports_op(&ctx, id, true) && supports_op(&ctx, id, false));
        }
        // REPEAT has no shader: it stays on the CPU.
        let scales = ctx.new_tensor(DType::F32, &[1, 8]).unwrap();
        let tiled = ctx.repeat(scales, &[1, 8, 5]).unwrap();
        assert!(!supports_op(&ctx, tiled, true) && !supports_op(&ctx, tiled, false));
    }
}
