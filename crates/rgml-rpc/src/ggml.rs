//! rgml's ops, dtypes and flags in ggml's numbering (ggml 0.25.3, `GGML_OP_COUNT` 101): what a
//! node becomes on the wire, and whether it can become anything at all.
//!
//! This module owns the translation table and nothing else: which ggml op each [`Op`] is, how
//! its parameters pack into ggml's 16 `int32` op parameters, and where its sources go in ggml's
//! source slots. An op it cannot express exactly is [`Unexpressible`], so the device refuses it
//! in `supports_op` and the scheduler keeps it local.

use rgml::{Op, OpKind, RopeMode, Tensor, TensorFlags, UnaryOp};

/// ggml's op numbers (`enum ggml_op`) for the ops rgml has.
#[allow(missing_docs)]
pub mod op {
    pub const NONE: u32 = 0;
    pub const DUP: u32 = 1;
    pub const ADD: u32 = 2;
    pub const ADD_ID: u32 = 3;
    pub const SUB: u32 = 6;
    pub const MUL: u32 = 7;
    pub const DIV: u32 = 8;
    pub const SUM_ROWS: u32 = 15;
    pub const ARGMAX: u32 = 18;
    pub const REPEAT: u32 = 20;
    pub const CONCAT: u32 = 22;
    pub const NORM: u32 = 24;
    pub const RMS_NORM: u32 = 25;
    pub const MUL_MAT: u32 = 29;
    pub const MUL_MAT_ID: u32 = 30;
    pub const SCALE: u32 = 32;
    pub const CPY: u32 = 34;
    pub const CONT: u32 = 35;
    pub const RESHAPE: u32 = 36;
    pub const VIEW: u32 = 37;
    pub const PERMUTE: u32 = 38;
    pub const TRANSPOSE: u32 = 39;
    pub const GET_ROWS: u32 = 40;
    pub const SET_ROWS: u32 = 42;
    pub const DIAG_MASK_INF: u32 = 44;
    pub const CLAMP: u32 = 50;
    pub const SOFT_MAX: u32 = 46;
    pub const ROPE: u32 = 48;
    pub const ARGSORT: u32 = 69;
    pub const FLASH_ATTN_EXT: u32 = 74;
    pub const SSM_CONV: u32 = 76;
    pub const GATED_DELTA_NET: u32 = 86;
    pub const UNARY: u32 = 91;
    pub const GLU: u32 = 100;
    /// One past the last op.
    pub const COUNT: u32 = 101;
}

/// ggml's `enum ggml_unary_op` values rgml uses.
#[allow(missing_docs)]
pub mod unary {
    pub const NEG: i32 = 2;
    pub const TANH: i32 = 4;
    pub const SIGMOID: i32 = 7;
    pub const EXP: i32 = 13;
    pub const SOFTPLUS: i32 = 15;
    pub const GELU: i32 = 8;
    pub const SILU: i32 = 10;
}

/// ggml's `enum ggml_glu_op` values rgml uses.
#[allow(missing_docs)]
pub mod glu {
    pub const GEGLU: i32 = 1;
    pub const SWIGLU: i32 = 2;
    pub const SWIGLU_OAI: i32 = 3;
}

/// ggml's `GGML_TENSOR_FLAG_*`.
#[allow(missing_docs)]
pub mod flag {
    pub const INPUT: i32 = 1;
    pub const OUTPUT: i32 = 2;
    pub const PARAM: i32 = 4;
    /// "Must be computed": ggml's CPU backend skips nodes without it.
    pub const COMPUTE: i32 = 16;
}

/// ggml's `GGML_ROPE_TYPE_*` and where ROPE's op parameters hold the sections.
#[allow(missing_docs)]
pub mod rope {
    pub const NORMAL: i32 = 0;
    pub const NEOX: i32 = 2;
    pub const MROPE: i32 = 8;
    /// ggml's vision form of the multi-section rotation, which rgml does not compute.
    pub const VISION: i32 = 24;
    pub const IMROPE: i32 = 40;
    /// The first of the four sections in the op parameters (`GGML_MROPE_SECTIONS`), then
    /// `n_offs` (ggml's `ggml_rope_set_offset`).
    pub const SECTIONS_AT: usize = 11;
    pub const N_OFFS_AT: usize = 15;
}

/// ggml's number of a ROPE mode.
fn rope_mode(mode: RopeMode) -> i32 {
    match mode {
        RopeMode::Normal => rope::NORMAL,
        RopeMode::Neox => rope::NEOX,
        RopeMode::Mrope { .. } => rope::MROPE,
        RopeMode::Imrope { .. } => rope::IMROPE,
    }
}

/// An op (or its parameters) that ggml's numbering cannot state with rgml's meaning.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{op} cannot be sent as a ggml op: {why}")]
pub struct Unexpressible {
    /// The op.
    pub op: OpKind,
    /// Why.
    pub why: &'static str,
}

/// A node as ggml states it: op number and packed parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GgmlOp {
    /// `enum ggml_op`.
    pub op: u32,
    /// `op_params` as 16 `int32`.
    pub params: [i32; 16],
}

struct Params([i32; 16]);

impl Params {
    fn new() -> Params {
        Params([0; 16])
    }
    fn i32(mut self, i: usize, v: i32) -> Params {
        self.0[i] = v;
        self
    }
    fn f32(self, i: usize, v: f32) -> Params {
        self.i32(i, v.to_bits() as i32)
    }
    fn done(self, op: u32) -> GgmlOp {
        GgmlOp { op, params: self.0 }
    }
}

fn small(op: OpKind, v: usize, why: &'static str) -> Result<i32, Unexpressible> {
    i32::try_from(v).map_err(|_| Unexpressible { op, why })
}

/// The ggml op and parameters of `tensor`'s op.
pub fn encode_op(tensor: &Tensor) -> Result<GgmlOp, Unexpressible> {
    let kind = tensor.op.kind();
    let plain = |op| Ok(Params::new().done(op));
    match tensor.op {
        Op::None => plain(op::NONE),
        Op::Dup => plain(op::DUP),
        Op::Cpy => plain(op::CPY),
        Op::Cont => plain(op::CONT),
        Op::Reshape => plain(op::RESHAPE),
        Op::Transpose => plain(op::TRANSPOSE),
        Op::GetRows => plain(op::GET_ROWS),
        Op::SetRows => plain(op::SET_ROWS),
        Op::Add => plain(op::ADD),
        Op::Sub => plain(op::SUB),
        Op::Mul => plain(op::MUL),
        Op::Div => plain(op::DIV),
        // ggml's hint in parameter 1 (`GGML_HINT_SRC0_IS_HADAMARD` = 1).
        Op::MulMat { hadamard, .. } => {
            Ok(Params::new().i32(1, i32::from(hadamard)).done(op::MUL_MAT))
        }
        Op::Argmax => plain(op::ARGMAX),
        Op::MulMatId { .. } => plain(op::MUL_MAT_ID),
        Op::SumRows => plain(op::SUM_ROWS),
        // The target shape is the node's own (`ggml_repeat_4d`); no parameters.
        Op::Repeat => plain(op::REPEAT),
        Op::AddId => plain(op::ADD_ID),
        Op::Clamp { min, max } => Ok(Params::new().f32(0, min).f32(1, max).done(op::CLAMP)),
        // `ggml_sort_order`: 0 ascending, 1 descending.
        Op::Argsort { descending } => Ok(Params::new()
            .i32(0, i32::from(descending))
            .done(op::ARGSORT)),
        Op::View { offset } => {
            // ggml stores the view's byte offset as a size_t in the first two parameters.
            let off = offset as u64;
            Ok(Params::new()
                .i32(0, off as u32 as i32)
                .i32(1, (off >> 32) as u32 as i32)
                .done(op::VIEW))
        }
        Op::Permute { axes } => {
            let mut p = Params::new();
            for (i, &a) in axes.iter().enumerate() {
                p = p.i32(i, small(kind, a, "axis out of range")?);
            }
            Ok(p.done(op::PERMUTE))
        }
        Op::Scale { scale, bias } => Ok(Params::new().f32(0, scale).f32(1, bias).done(op::SCALE)),
        Op::RmsNorm { eps } => Ok(Params::new().f32(0, eps).done(op::RMS_NORM)),
        Op::Norm { eps } => Ok(Params::new().f32(0, eps).done(op::NORM)),
        Op::Rope(r) => {
            let mut p = Params::new();
            // The multi-section modes' sections; zeros otherwise, as `ggml_rope_impl` leaves.
            for (i, &v) in r.mode.sections().unwrap_or_default().iter().enumerate() {
                let v = small(kind, v as usize, "rope section too large")?;
                p = p.i32(rope::SECTIONS_AT + i, v);
            }
            Ok(p.i32(1, small(kind, r.n_dims, "n_dims too large")?)
                .i32(2, rope_mode(r.mode))
                .i32(4, small(kind, r.n_ctx_orig, "n_ctx_orig too large")?)
                .f32(5, r.freq_base)
                .f32(6, r.freq_scale)
                .f32(7, r.ext_factor)
                .f32(8, r.attn_factor)
                .f32(9, r.beta_fast)
                .f32(10, r.beta_slow)
                .done(op::ROPE))
        }
        Op::SoftMax {
            scale, max_bias, ..
        } => Ok(Params::new()
            .f32(0, scale)
            .f32(1, max_bias)
            .done(op::SOFT_MAX)),
        Op::DiagMaskInf { n_past } => Ok(Params::new()
            .i32(0, small(kind, n_past, "n_past too large")?)
            .done(op::DIAG_MASK_INF)),
        Op::Unary(u) => {
            let which = match u {
                UnaryOp::Silu => unary::SILU,
                UnaryOp::Gelu => unary::GELU,
                UnaryOp::Tanh => unary::TANH,
                UnaryOp::Neg => unary::NEG,
                UnaryOp::Sigmoid => unary::SIGMOID,
                UnaryOp::Exp => unary::EXP,
                UnaryOp::Softplus => unary::SOFTPLUS,
            };
            Ok(Params::new().i32(0, which).done(op::UNARY))
        }
        // The split form (gate and up as two operands, not swapped).
        Op::Swiglu => Ok(Params::new().i32(0, glu::SWIGLU).done(op::GLU)),
        Op::Geglu => Ok(Params::new().i32(0, glu::GEGLU).done(op::GLU)),
        Op::SwigluOai { alpha, limit } => Ok(Params::new()
            .i32(0, glu::SWIGLU_OAI)
            .f32(2, alpha)
            .f32(3, limit)
            .done(op::GLU)),
        Op::Concat { dim } => Ok(Params::new()
            .i32(0, small(kind, dim, "axis out of range")?)
            .done(op::CONCAT)),
        // Parameter 3 is the precision, ggml's default (0).
        Op::FlashAttnExt {
            scale,
            max_bias,
            softcap,
            ..
        } => Ok(Params::new()
            .f32(0, scale)
            .f32(1, max_bias)
            .f32(2, softcap)
            .done(op::FLASH_ATTN_EXT)),
        Op::SsmConv => plain(op::SSM_CONV),
        // Parameter 0 is K, the snapshot count.
        Op::GatedDeltaNet { snapshots } => Ok(Params::new()
            .i32(0, small(kind, snapshots, "too many state snapshots")?)
            .done(op::GATED_DELTA_NET)),
    }
}

/// Which of rgml's sources sits in each of ggml's source slots (`None`: the slot is empty):
/// the same order for every op but SET_ROWS, whose ggml slots are (rows, indices,
/// destination) where rgml has (destination, rows, indices), and FLASH_ATTN_EXT and
/// SOFT_MAX, whose mask and sinks have fixed slots (3 and 4; 1 and 2) where rgml lists only
/// those present.
pub fn ggml_src_order(op: &Op, n_src: usize) -> Vec<Option<usize>> {
    match *op {
        Op::SetRows if n_src == 3 => vec![Some(1), Some(2), Some(0)],
        // SOFT_MAX's sinks have the fixed slot 2 (after the optional mask).
        Op::SoftMax { sinks: true, .. } => {
            let mask_slot = (n_src > 2).then_some(1);
            vec![Some(0), mask_slot, Some(n_src - 1)]
        }
        Op::FlashAttnExt { mask, sinks, .. } => {
            let mask_slot = mask.then_some(3);
            let sinks_slot = sinks.then_some(3 + usize::from(mask));
            vec![Some(0), Some(1), Some(2), mask_slot, sinks_slot]
        }
        _ => (0..n_src).map(Some).collect(),
    }
}

/// ggml's flags for a tensor with rgml's `flags`; `node`: a graph node that must be computed.
pub fn encode_flags(flags: TensorFlags, node: bool) -> i32 {
    let mut out = 0;
    for (ours, theirs) in [
        (TensorFlags::INPUT, flag::INPUT),
        (TensorFlags::OUTPUT, flag::OUTPUT),
        (TensorFlags::PARAM, flag::PARAM),
    ] {
        if flags.contains(ours) {
            out |= theirs;
        }
    }
    if node {
        out |= flag::COMPUTE;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rgml::{Context, DType, RopeParams};

    #[test]
    fn rope_packs_like_ggml_rope_ext() {
        let mut ctx = Context::new();
        let x = ctx.new_tensor(DType::F32, &[64, 4, 3, 1]).unwrap();
        let pos = ctx.new_tensor(DType::I32, &[3, 1, 1, 1]).unwrap();
        let mut p = RopeParams::new(RopeMode::Neox, 64, 10000.0);
        p.n_ctx_orig = 8192;
        p.freq_scale = 0.25;
        let r = ctx.rope(x, pos, p).unwrap();
        let g = encode_op(ctx.get(r).unwrap()).unwrap();
        assert_eq!(g.op, op::ROPE);
        assert_eq!(&g.params[..5], &[0, 64, 2, 0, 8192]);
        assert_eq!(f32::from_bits(g.params[5] as u32), 10000.0);
        assert_eq!(f32::from_bits(g.params[6] as u32), 0.25);
        assert_eq!(f32::from_bits(g.params[9] as u32), 32.0);
        assert_eq!(&g.params[11..], &[0; 5]);
    }

    #[test]
    fn rope_multi_ssm_conv_and_delta_net_pack_like_ggml() {
        let mut ctx = Context::new();
        let x = ctx.new_tensor(DType::F32, &[256, 2, 3, 1]).unwrap();
        let pos = ctx.new_tensor(DType::I32, &[12, 1, 1, 1]).unwrap();
        let sections = [11, 11, 10, 0];
        for (mode, number) in [
            (RopeMode::Mrope { sections }, 8),
            (RopeMode::Imrope { sections }, 40),
        ] {
            let r = ctx.rope(x, pos, RopeParams::new(mode, 64, 1e7)).unwrap();
            let g = encode_op(ctx.get(r).unwrap()).unwrap();
            assert_eq!(g.op, op::ROPE);
            assert_eq!(&g.params[..3], &[0, 64, number]);
            assert_eq!(&g.params[11..], &[11, 11, 10, 0, 0]);
        }
        let sx = ctx.new_tensor(DType::F32, &[6, 8, 1, 1]).unwrap();
        let c = ctx.new_tensor(DType::F32, &[4, 8, 1, 1]).unwrap();
        let conv = ctx.ssm_conv(sx, c).unwrap();
        let t = ctx.get(conv).unwrap();
        assert_eq!(encode_op(t).unwrap(), Params::new().done(op::SSM_CONV));
        assert_eq!(ggml_src_order(&t.op, 2), vec![Some(0), Some(1)]);
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
        let net = ctx.gated_delta_net(q, k, v, g, beta, s, 3).unwrap();
        let t = ctx.get(net).unwrap();
        let packed = encode_op(t).unwrap();
        assert_eq!((packed.op, packed.params[0]), (op::GATED_DELTA_NET, 3));
        // ggml's slots: q, k, v, g, beta, state, as rgml's.
        assert_eq!(
            ggml_src_order(&t.op, 6),
            (0..6).map(Some).collect::<Vec<_>>()
        );
    }

    #[test]
    fn views_set_rows_and_glu() {
        let mut ctx = Context::new();
        let a = ctx.new_tensor(DType::F32, &[8, 6, 1, 1]).unwrap();
        let v = ctx.view(a, &[8, 2], &[32], 5 << 30).err();
        // A view past the end is refused by the context; a real one carries its offset.
        assert!(v.is_some());
        let v = ctx.view(a, &[8, 2], &[32], 64).unwrap();
        let g = encode_op(ctx.get(v).unwrap()).unwrap();
        assert_eq!((g.op, g.params[0], g.params[1]), (op::VIEW, 64, 0));

        let b = ctx.new_tensor(DType::F32, &[8, 6, 1, 1]).unwrap();
        let s = ctx.swiglu(a, b).unwrap();
        let g = encode_op(ctx.get(s).unwrap()).unwrap();
        assert_eq!((g.op, g.params[0], g.params[1]), (op::GLU, glu::SWIGLU, 0));

        let rows = ctx.new_tensor(DType::F32, &[8, 2, 1, 1]).unwrap();
        let idx = ctx.new_tensor(DType::I32, &[2, 1, 1, 1]).unwrap();
        let sr = ctx.set_rows(a, rows, idx).unwrap();
        let t = ctx.get(sr).unwrap();
        assert_eq!(encode_op(t).unwrap().op, op::SET_ROWS);
        let order = ggml_src_order(&t.op, t.src.len());
        let slots: Vec<_> = order.iter().flatten().map(|&i| t.src[i]).collect();
        assert_eq!(slots, vec![rows, idx, a]);
    }

    #[test]
    fn soft_max_sinks_take_slot_two_with_or_without_a_mask() {
        let mut ctx = Context::new();
        let kq = ctx.new_tensor(DType::F32, &[8, 3, 4, 1]).unwrap();
        let mask = ctx.new_tensor(DType::F16, &[8, 3, 1, 1]).unwrap();
        let sinks = ctx.new_tensor(DType::F32, &[4, 1, 1, 1]).unwrap();
        for (m, want) in [
            (Some(mask), vec![Some(kq), Some(mask), Some(sinks)]),
            (None, vec![Some(kq), None, Some(sinks)]),
        ] {
            let s = ctx.soft_max_sinks(kq, m, Some(sinks), 0.5, 0.0).unwrap();
            let t = ctx.get(s).unwrap();
            assert_eq!(encode_op(t).unwrap().op, op::SOFT_MAX);
            let slots: Vec<_> = ggml_src_order(&t.op, t.src.len())
                .into_iter()
                .map(|i| i.map(|i| t.src[i]))
                .collect();
            assert_eq!(slots, want);
        }
    }

    #[test]
    fn flags_use_ggml_bits() {
        let mut f = TensorFlags::empty();
        f.insert(TensorFlags::INPUT);
        f.insert(TensorFlags::COMPUTE);
        assert_eq!(encode_flags(f, false), flag::INPUT);
        assert_eq!(encode_flags(f, true), flag::INPUT | flag::COMPUTE);
    }
}
