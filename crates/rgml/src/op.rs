//! The closed set of operations and their parameters.
//!
//! [`Op`] carries typed parameters (ggml packs them into an `int32` array); [`OpKind`] is the
//! parameter-free tag used in errors, support tables and op filters.

use std::fmt;

/// Rotary-embedding layout: which pairs of elements rotate together, and by which position.
///
/// The multi-section modes (ggml's `ggml_rope_multi`, text form) take four positions per
/// token, stored as ggml lays them out: `pos[i]`, `pos[i + n]`, `pos[i + 2n]`, `pos[i + 3n]`
/// for token `i` of `n` (ggml's `t`, `h`, `w` and `e` positions). Pair `k` rotates by the
/// position [`RopeMode::position_of_pair`] names, with its angle's running product kept per
/// position as ggml's `ggml_mrope_cache_init` keeps them. Pairs are NeoX pairs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RopeMode {
    /// Adjacent pairs `(x[2i], x[2i+1])` (ggml mode 0, LLaMA GGUF files).
    Normal,
    /// Pairs split across halves `(x[i], x[i + n_dims/2])` (ggml mode 2, GPT-NeoX, Qwen).
    Neox,
    /// Multi-section RoPE (ggml mode 8, `GGML_ROPE_TYPE_MROPE`, Qwen2-VL's text): of each run
    /// of `sum(sections)` pairs, the first `sections[0]` rotate by position 0, the next
    /// `sections[1]` by position 1, the next `sections[2]` by position 2, the rest by
    /// position 3.
    Mrope {
        /// Pairs per section (ggml's `sections[4]`).
        sections: [u32; 4],
    },
    /// Interleaved multi-section RoPE (ggml mode 40, `GGML_ROPE_TYPE_IMROPE`, Qwen3-VL and
    /// Qwen3.5): sector `s = k % sum(sections)` of pair `k` rotates by position 1 when `s % 3
    /// == 1` and `s < 3 sections[1]`, 2 when `s % 3 == 2` and `s < 3 sections[2]`, 0 when `s %
    /// 3 == 0` and `s < 3 sections[0]`, else by position 3.
    Imrope {
        /// Pairs per section (ggml's `sections[4]`).
        sections: [u32; 4],
    },
}

/// Whether node `t` = SSM_CONV(`sx`, `c`) has the shapes [`crate::Context::ssm_conv`] builds:
/// the window `sx` `[d_conv - 1 + n_t, channels, n_s]`, the kernel `c` `[d_conv, channels]`,
/// the result `[channels, n_t, n_s]`. For backends, which also get nodes they did not build
/// (an RPC peer's graph).
pub fn ssm_conv_shapes(t: &crate::Tensor, sx: &crate::Tensor, c: &crate::Tensor) -> bool {
    let d_conv = c.ne[0];
    d_conv > 0
        && sx.ne[0] + 1 >= d_conv
        && sx.ne[1] == c.ne[1]
        && sx.ne[3] == 1
        && c.ne[2] == 1
        && c.ne[3] == 1
        && t.ne == [c.ne[1], sx.ne[0] + 1 - d_conv, sx.ne[2], 1]
}

/// Whether node `t` = GATED_DELTA_NET(q, k, v, g, beta, state) with `snapshots` states has the
/// shapes [`crate::Context::gated_delta_net`] builds (q and k heads and sequences broadcast
/// onto v's; a gate per head or per head and dimension). For backends, as
/// [`ssm_conv_shapes`].
pub fn gated_delta_net_shapes(
    t: &crate::Tensor,
    [q, k, v, g, beta, state]: [&crate::Tensor; 6],
    snapshots: usize,
) -> bool {
    let [s_v, h, n_tokens, n_seqs] = v.ne;
    let qk = |x: &crate::Tensor| {
        x.ne[0] == s_v
            && x.ne[1] > 0
            && x.ne[2] == n_tokens
            && x.ne[3] > 0
            && n_seqs.is_multiple_of(x.ne[3])
    };
    let rows = snapshots
        .checked_mul(s_v * n_seqs)
        .and_then(|r| r.checked_add(n_tokens * n_seqs));
    s_v > 0
        && snapshots > 0
        && qk(q)
        && qk(k)
        && (g.ne[0] == 1 || g.ne[0] == s_v)
        && g.ne[1..] == [h, n_tokens, n_seqs]
        && beta.ne == [1, h, n_tokens, n_seqs]
        && state.ne == [s_v, s_v, h, n_seqs]
        && Some(t.ne[1]) == rows
        && t.ne == [s_v * h, t.ne[1], 1, 1]
}

impl RopeMode {
    /// The sections of a multi-section mode.
    pub const fn sections(self) -> Option<[u32; 4]> {
        match self {
            RopeMode::Normal | RopeMode::Neox => None,
            RopeMode::Mrope { sections } | RopeMode::Imrope { sections } => Some(sections),
        }
    }

    /// Positions per token: 4 for the multi-section modes, else 1.
    pub const fn positions_per_token(self) -> usize {
        match self.sections() {
            Some(_) => 4,
            None => 1,
        }
    }

    /// Which of a token's positions pair `k` rotates by (ggml's `ggml_mrope_cache_init`;
    /// always 0 for the one-position modes, and for sections that sum to 0, which the op
    /// builders refuse).
    pub fn position_of_pair(self, k: usize) -> usize {
        let (s, interleaved) = match self {
            RopeMode::Normal | RopeMode::Neox => return 0,
            RopeMode::Mrope { sections } => (sections.map(|v| v as usize), false),
            RopeMode::Imrope { sections } => (sections.map(|v| v as usize), true),
        };
        let total = s.iter().sum::<usize>();
        let Some(sector) = k.checked_rem(total) else {
            return 0;
        };
        if interleaved {
            match sector % 3 {
                1 if sector < 3 * s[1] => 1,
                2 if sector < 3 * s[2] => 2,
                0 if sector < 3 * s[0] => 0,
                _ => 3,
            }
        } else if sector < s[0] {
            0
        } else if sector < s[0] + s[1] {
            1
        } else if sector < s[0] + s[1] + s[2] {
            2
        } else {
            3
        }
    }
}

/// Parameters of ROPE, as ggml's `rope_ext` takes them (YaRN included).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeParams {
    /// Pair layout.
    pub mode: RopeMode,
    /// Number of leading dimensions that rotate (the rest pass through).
    pub n_dims: usize,
    /// Context length the model was trained with (YaRN correction range).
    pub n_ctx_orig: usize,
    /// θ base (10000 for LLaMA).
    pub freq_base: f32,
    /// Position scale (1 / linear scaling factor).
    pub freq_scale: f32,
    /// YaRN extrapolation mix factor (0 disables YaRN).
    pub ext_factor: f32,
    /// Magnitude scale.
    pub attn_factor: f32,
    /// YaRN low correction dimension.
    pub beta_fast: f32,
    /// YaRN high correction dimension.
    pub beta_slow: f32,
}

impl RopeParams {
    /// Plain rotary embedding without context extension.
    pub fn new(mode: RopeMode, n_dims: usize, freq_base: f32) -> Self {
        RopeParams {
            mode,
            n_dims,
            n_ctx_orig: 0,
            freq_base,
            freq_scale: 1.0,
            ext_factor: 0.0,
            attn_factor: 1.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
        }
    }
}

/// Elementwise activation functions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    /// `x * sigmoid(x)`.
    Silu,
    /// GELU, tanh approximation (ggml's `gelu`).
    Gelu,
    /// `tanh(x)` (soft-capping of logits).
    Tanh,
    /// `-x`.
    Neg,
    /// `1 / (1 + exp(-x))`.
    Sigmoid,
    /// `exp(x)`.
    Exp,
    /// `log(1 + exp(x))`, or `x` above 20 (ggml's cut-over).
    Softplus,
}

/// An operation with its parameters. Sources live in the tensor's `src` list.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    /// A leaf: no computation (weights, inputs).
    None,
    /// Copy `src0` into a new contiguous tensor of the same dtype.
    Dup,
    /// Copy `src0` into `src1` (converting dtype); the result is a view of `src1`.
    Cpy,
    /// Make `src0` contiguous (optionally reshaped).
    Cont,
    /// Same data, new shape (source must be contiguous).
    Reshape,
    /// A strided view into `src0` at a byte offset.
    View {
        /// Byte offset into the source.
        offset: usize,
    },
    /// Reorder dimensions: source dim `i` becomes result dim `axes[i]`.
    Permute {
        /// Destination of each source axis.
        axes: [usize; 4],
    },
    /// Swap dims 0 and 1.
    Transpose,
    /// Gather rows of `src0` at the I32 indices in `src1`.
    GetRows,
    /// Scatter rows of `src1` (f32) into `src0` at the I32 indices in `src2`; a view of `src0`.
    SetRows,
    /// `src0 + src1`, src1 broadcast.
    Add,
    /// `src0 - src1`, src1 broadcast.
    Sub,
    /// `src0 * src1`, src1 broadcast.
    Mul,
    /// `src0 / src1`, src1 broadcast.
    Div,
    /// `src0 * scale + bias`.
    Scale {
        /// Multiplier.
        scale: f32,
        /// Addend.
        bias: f32,
    },
    /// `src0ᵀ · src1` per ggml: result `[src0.ne1, src1.ne1, src1.ne2, src1.ne3]`.
    MulMat {
        /// Compute every src1 row with the arithmetic a product of that row alone takes.
        /// ggml's CPU kernels choose their arithmetic by src1's row count (tiled K-quant and
        /// tinyBLAS products from a few rows, `vec_dot` for one), so a token batched with
        /// other sequences' tokens would otherwise differ in the last bits from the same
        /// token decoded alone. Backends whose arithmetic does not depend on the row count
        /// ignore it.
        rows_alone: bool,
        /// src0 is the `n × n` Walsh-Hadamard matrix over `sqrt(n)` (ggml's
        /// `GGML_HINT_SRC0_IS_HADAMARD`, llama.cpp's rotation of quantized KV caches): ggml-cpu
        /// computes the product as a fast Walsh-Hadamard transform of each src1 row (scaled
        /// first, then butterflies of widths 1, 2, 4, ...), reading nothing of src0.
        hadamard: bool,
    },
    /// Expert products, with ggml's semantics (`ggml_mul_mat_id`): sources `as` (one weight
    /// matrix per expert, `[k, n, n_expert]`), `b` (f32 `[k, n_b, n_tokens]`, `n_b` dividing the
    /// experts per token) and `ids` (I32 `[n_used, n_tokens]`, the experts each token uses).
    /// Result f32 `[n, n_used, n_tokens]`: column `(slot, t)` is `as[ids[slot, t]]ᵀ ·
    /// b[:, slot % n_b, t]`.
    MulMatId {
        /// Compute every product with the arithmetic a lone row routed to its expert takes
        /// (see [`Op::MulMat`]'s `rows_alone`: ggml's CPU picks a tiled K-quant kernel per
        /// expert from 8 routed rows).
        rows_alone: bool,
    },
    /// gpt-oss's expert biases (ggml's `ggml_add_id`): `src0` `[n, n_used, n_tokens]` plus row
    /// `ids[slot, t]` of `src1` `[n, n_rows]` (`src2`: I32 `[n_used, n_tokens]`).
    AddId,
    /// Row-wise `x / sqrt(mean(x²) + eps)`.
    RmsNorm {
        /// Added to the mean square.
        eps: f32,
    },
    /// Row-wise `(x - mean) / sqrt(var + eps)`.
    Norm {
        /// Added to the variance.
        eps: f32,
    },
    /// Rotary position embedding with positions in `src1` (I32, one per `ne2` row, four for
    /// the multi-section modes: see [`RopeMode`]) and optional frequency factors in `src2`
    /// (f32, `n_dims / 2` of them: pair `i`'s angle is divided by factor `i`).
    Rope(RopeParams),
    /// Row-wise softmax of `src0 * scale + mask` (mask `src1` optional, broadcast over rows),
    /// with the f32 per-head sinks (`[ne2]`) last if `sinks`: head `i2`'s sink is one more
    /// score in each row's softmax that weighs no output (gpt-oss's attention sinks).
    SoftMax {
        /// Multiplier applied before the mask.
        scale: f32,
        /// ALiBi maximum bias (0 disables).
        max_bias: f32,
        /// Whether a sinks source comes last.
        sinks: bool,
    },
    /// Set elements with column `> n_past + row` to -inf (causal mask).
    DiagMaskInf {
        /// Number of past positions visible to every row.
        n_past: usize,
    },
    /// An elementwise activation.
    Unary(UnaryOp),
    /// `silu(src0) * src1`.
    Swiglu,
    /// `gelu(src0) * src1` (GELU's tanh approximation; ggml's GEGLU, split form).
    Geglu,
    /// gpt-oss's gated activation (ggml's SWIGLU_OAI, split form): with `x = min(src0,
    /// limit)` and `y = clamp(src1, -limit, limit)`, `x / (1 + exp(-alpha x)) * (y + 1)`.
    SwigluOai {
        /// The sigmoid's slope.
        alpha: f32,
        /// The bound of both operands.
        limit: f32,
    },
    /// `src0` tiled to the node's shape (ggml's `ggml_repeat` / `ggml_repeat_4d`): each dim of
    /// the result is a multiple of `src0`'s, and element `(i0, i1, i2, i3)` is `src0`'s
    /// `(i0 % ne00, i1 % ne01, i2 % ne02, i3 % ne03)`, copied exactly (same dtype).
    Repeat,
    /// Concatenate `src0` and `src1` along `dim`.
    Concat {
        /// Axis.
        dim: usize,
    },
    /// Index of the largest element of each row (I32 result).
    Argmax,
    /// The sum of each row (result `[1, ne1, ne2, ne3]`), accumulated in f64 in element order
    /// and rounded to f32 once, as ggml-cpu's `ggml_vec_sum_f32`.
    SumRows,
    /// Each element limited to `[min, max]`, as ggml's `MAX(MIN(x, max), min)` (a NaN becomes
    /// `max`).
    Clamp {
        /// Lower bound.
        min: f32,
        /// Upper bound.
        max: f32,
    },
    /// The indices that sort each row (I32, the source's shape), as ggml-cpu sorts them:
    /// libstdc++'s `std::sort` (not stable) with a strict `<` or `>` on the values, so ties come
    /// out in the order that algorithm leaves them (MoE routers pick experts by it).
    Argsort {
        /// Largest first (ggml's `GGML_SORT_ORDER_DESC`).
        descending: bool,
    },
    /// Attention in one op, with ggml's semantics (`ggml_flash_attn_ext`): sources `q` (f32
    /// `[dk, n_q, n_head, ne3]`), `k` (`[dk, n_kv, n_head_kv, ne3]`), `v` (`[dv, n_kv,
    /// n_head_kv, ne3]`), then the f16 mask (`[>= n_kv, >= n_q, ..]`, broadcast over heads and
    /// dim 3) if `mask`, then the f32 per-head sinks if `sinks`. Row `(q, head)` of the result
    /// (f32 `[dv, n_head, n_q, ne3]`) is `softmax(softcap(scale · k·q) + slope · mask) · v`.
    FlashAttnExt {
        /// Multiplier of `k·q`.
        scale: f32,
        /// ALiBi maximum bias (0 disables).
        max_bias: f32,
        /// Logit soft-capping `c · tanh(x / c)` (0 disables).
        softcap: f32,
        /// Whether a mask source follows `v`.
        mask: bool,
        /// Whether a sinks source comes last.
        sinks: bool,
    },
    /// The short causal convolution of Mamba and delta-net layers (ggml's `ggml_ssm_conv`):
    /// sources `sx` (f32 `[d_conv - 1 + n_t, d_inner, n_s]`: each channel's past inputs then
    /// its `n_t` new ones) and `c` (f32 `[d_conv, d_inner]`, one kernel per channel). Result
    /// f32 `[d_inner, n_t, n_s]`: element `(i, t, s)` is `sum_j sx[t + j, i, s] · c[j, i]`.
    SsmConv,
    /// The gated delta rule of Qwen3.5's and Kimi's linear attention (ggml's
    /// `ggml_gated_delta_net`), one recurrent state `S` (`S_v x S_v`) per head and sequence.
    /// Sources `q`, `k` (f32 `[S_v, H_k, n_tokens, B_k]`; head `h` reads head `h % H_k`,
    /// sequence `b` reads `b / (n_seqs / B_k)`), `v` (f32 `[S_v, H, n_tokens, n_seqs]`), `g`
    /// (f32 `[1, H, n_tokens, n_seqs]`, a scalar gate per head, or `[S_v, ..]`, a gate per row
    /// of `S`), `beta` (f32 `[1, H, n_tokens, n_seqs]`) and `state` (f32 `[S_v, S_v, H,
    /// n_seqs]`, each head's initial `S` stored transposed). Per token: `S *= exp(g)`, `d =
    /// (v - Sᵀk) · beta`, `S += k dᵀ`, `o = Sᵀq / sqrt(S_v)`. Result f32 `[S_v·H, rows]` with
    /// `rows = n_tokens·n_seqs + snapshots·S_v·n_seqs`: the outputs `o` (`[S_v, H, n_tokens,
    /// n_seqs]`), then `snapshots` states (each `[S_v, S_v, H, n_seqs]`): slot 0 after the last
    /// token, slot `i` `i` tokens before it. Slots from `n_tokens` on are not written by ggml;
    /// rgml's CPU writes zeros there.
    GatedDeltaNet {
        /// How many states to keep (ggml's `K`, at least 1).
        snapshots: usize,
    },
}

/// The parameter-free name of an [`Op`].
#[allow(missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OpKind {
    None,
    Dup,
    Cpy,
    Cont,
    Reshape,
    View,
    Permute,
    Transpose,
    GetRows,
    SetRows,
    Add,
    Sub,
    Mul,
    Div,
    Scale,
    MulMat,
    MulMatId,
    AddId,
    RmsNorm,
    Norm,
    Rope,
    SoftMax,
    DiagMaskInf,
    Silu,
    Gelu,
    Tanh,
    Neg,
    Sigmoid,
    Exp,
    Softplus,
    Swiglu,
    Geglu,
    SwigluOai,
    Repeat,
    Concat,
    Argmax,
    Argsort,
    SumRows,
    Clamp,
    FlashAttnExt,
    SsmConv,
    GatedDeltaNet,
}

impl OpKind {
    /// Every kind, in declaration order.
    pub const ALL: [OpKind; 42] = [
        OpKind::None,
        OpKind::Dup,
        OpKind::Cpy,
        OpKind::Cont,
        OpKind::Reshape,
        OpKind::View,
        OpKind::Permute,
        OpKind::Transpose,
        OpKind::GetRows,
        OpKind::SetRows,
        OpKind::Add,
        OpKind::Sub,
        OpKind::Mul,
        OpKind::Div,
        OpKind::Scale,
        OpKind::MulMat,
        OpKind::MulMatId,
        OpKind::AddId,
        OpKind::RmsNorm,
        OpKind::Norm,
        OpKind::Rope,
        OpKind::SoftMax,
        OpKind::DiagMaskInf,
        OpKind::Silu,
        OpKind::Gelu,
        OpKind::Tanh,
        OpKind::Neg,
        OpKind::Sigmoid,
        OpKind::Exp,
        OpKind::Softplus,
        OpKind::Swiglu,
        OpKind::Geglu,
        OpKind::SwigluOai,
        OpKind::Repeat,
        OpKind::Concat,
        OpKind::Argmax,
        OpKind::Argsort,
        OpKind::SumRows,
        OpKind::Clamp,
        OpKind::FlashAttnExt,
        OpKind::SsmConv,
        OpKind::GatedDeltaNet,
    ];

    /// ggml's upper-case name (`"MUL_MAT"`, `"SILU"`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            OpKind::None => "NONE",
            OpKind::Dup => "DUP",
            OpKind::Cpy => "CPY",
            OpKind::Cont => "CONT",
            OpKind::Reshape => "RESHAPE",
            OpKind::View => "VIEW",
            OpKind::Permute => "PERMUTE",
            OpKind::Transpose => "TRANSPOSE",
            OpKind::GetRows => "GET_ROWS",
            OpKind::SetRows => "SET_ROWS",
            OpKind::Add => "ADD",
            OpKind::Sub => "SUB",
            OpKind::Mul => "MUL",
            OpKind::Div => "DIV",
            OpKind::Scale => "SCALE",
            OpKind::MulMat => "MUL_MAT",
            OpKind::MulMatId => "MUL_MAT_ID",
            OpKind::AddId => "ADD_ID",
            OpKind::RmsNorm => "RMS_NORM",
            OpKind::Norm => "NORM",
            OpKind::Rope => "ROPE",
            OpKind::SoftMax => "SOFT_MAX",
            OpKind::DiagMaskInf => "DIAG_MASK_INF",
            OpKind::Silu => "SILU",
            OpKind::Gelu => "GELU",
            OpKind::Tanh => "TANH",
            OpKind::Neg => "NEG",
            OpKind::Sigmoid => "SIGMOID",
            OpKind::Exp => "EXP",
            OpKind::Softplus => "SOFTPLUS",
            OpKind::Swiglu => "SWIGLU",
            OpKind::Geglu => "GEGLU",
            OpKind::SwigluOai => "SWIGLU_OAI",
            OpKind::Repeat => "REPEAT",
            OpKind::Concat => "CONCAT",
            OpKind::Argmax => "ARGMAX",
            OpKind::Argsort => "ARGSORT",
            OpKind::SumRows => "SUM_ROWS",
            OpKind::Clamp => "CLAMP",
            OpKind::FlashAttnExt => "FLASH_ATTN_EXT",
            OpKind::SsmConv => "SSM_CONV",
            OpKind::GatedDeltaNet => "GATED_DELTA_NET",
        }
    }

    /// Parse a name as [`OpKind::name`] prints it (case-insensitive).
    pub fn from_name(name: &str) -> Option<OpKind> {
        OpKind::ALL
            .into_iter()
            .find(|k| k.name().eq_ignore_ascii_case(name))
    }

    /// Ops that only describe memory (no kernel runs): a backend computes nothing for them.
    pub const fn is_view(self) -> bool {
        matches!(
            self,
            OpKind::None | OpKind::Reshape | OpKind::View | OpKind::Permute | OpKind::Transpose
        )
    }
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Op {
    /// The parameter-free tag.
    pub const fn kind(&self) -> OpKind {
        match self {
            Op::None => OpKind::None,
            Op::Dup => OpKind::Dup,
            Op::Cpy => OpKind::Cpy,
            Op::Cont => OpKind::Cont,
            Op::Reshape => OpKind::Reshape,
            Op::View { .. } => OpKind::View,
            Op::Permute { .. } => OpKind::Permute,
            Op::Transpose => OpKind::Transpose,
            Op::GetRows => OpKind::GetRows,
            Op::SetRows => OpKind::SetRows,
            Op::Add => OpKind::Add,
            Op::Sub => OpKind::Sub,
            Op::Mul => OpKind::Mul,
            Op::Div => OpKind::Div,
            Op::Scale { .. } => OpKind::Scale,
            Op::MulMat { .. } => OpKind::MulMat,
            Op::MulMatId { .. } => OpKind::MulMatId,
            Op::AddId => OpKind::AddId,
            Op::RmsNorm { .. } => OpKind::RmsNorm,
            Op::Norm { .. } => OpKind::Norm,
            Op::Rope(_) => OpKind::Rope,
            Op::SoftMax { .. } => OpKind::SoftMax,
            Op::DiagMaskInf { .. } => OpKind::DiagMaskInf,
            Op::Unary(UnaryOp::Silu) => OpKind::Silu,
            Op::Unary(UnaryOp::Gelu) => OpKind::Gelu,
            Op::Unary(UnaryOp::Tanh) => OpKind::Tanh,
            Op::Unary(UnaryOp::Neg) => OpKind::Neg,
            Op::Unary(UnaryOp::Sigmoid) => OpKind::Sigmoid,
            Op::Unary(UnaryOp::Exp) => OpKind::Exp,
            Op::Unary(UnaryOp::Softplus) => OpKind::Softplus,
            Op::Swiglu => OpKind::Swiglu,
            Op::Geglu => OpKind::Geglu,
            Op::SwigluOai { .. } => OpKind::SwigluOai,
            Op::Repeat => OpKind::Repeat,
            Op::Concat { .. } => OpKind::Concat,
            Op::Argmax => OpKind::Argmax,
            Op::Argsort { .. } => OpKind::Argsort,
            Op::SumRows => OpKind::SumRows,
            Op::Clamp { .. } => OpKind::Clamp,
            Op::FlashAttnExt { .. } => OpKind::FlashAttnExt,
            Op::SsmConv => OpKind::SsmConv,
            Op::GatedDeltaNet { .. } => OpKind::GatedDeltaNet,
        }
    }
}

/// The K and V types FLASH_ATTN_EXT takes ([`Op::FlashAttnExt`]): llama.cpp's cache types that
/// rgml's attention computes as ggml does.
pub const FLASH_ATTN_KV_TYPES: [crate::DType; 4] = [
    crate::DType::F32,
    crate::DType::F16,
    crate::DType::Q8_0,
    crate::DType::Q4_0,
];

#[cfg(test)]
mod tests {
    use super::RopeMode;

    /// Which position each pair rotates by, worked out by hand from ggml's
    /// `ggml_mrope_cache_init`.
    #[test]
    fn multi_section_positions_follow_ggml() {
        let pairs = |mode: RopeMode, n: usize| -> Vec<usize> {
            (0..n).map(|k| mode.position_of_pair(k)).collect()
        };
        let mrope = RopeMode::Mrope {
            sections: [2, 1, 1, 1],
        };
        assert_eq!(pairs(mrope, 7), [0, 0, 1, 2, 3, 0, 0]);
        let imrope = RopeMode::Imrope {
            sections: [2, 1, 1, 0],
        };
        assert_eq!(pairs(imrope, 6), [0, 1, 2, 0, 0, 1]);
        // Qwen3-VL's text sections: sectors 61 and 62 fall past 3·20 and take position 3.
        let qwen3_vl = RopeMode::Imrope {
            sections: [24, 20, 20, 0],
        };
        assert_eq!(pairs(qwen3_vl, 64)[58..], [1, 2, 0, 3, 3, 0]);
        for mode in [RopeMode::Normal, RopeMode::Neox] {
            assert_eq!(pairs(mode, 5), [0; 5]);
        }
        // Sections summing to 0 (refused by the builders) do not divide by zero.
        let empty = RopeMode::Mrope { sections: [0; 4] };
        assert_eq!(pairs(empty, 2), [0, 0]);
        assert_eq!(mrope.positions_per_token(), 4);
    }
}
