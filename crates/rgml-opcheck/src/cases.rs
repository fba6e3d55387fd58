//! The case table: every op × dtypes × shapes the suite checks, each a named graph builder.
//!
//! A case only *builds* a graph (leaf tensors with how to fill them, and the ops on top); the
//! runner fills, allocates and computes it, and the reference interpreter evaluates the same
//! graph. Sizes are kept moderate so the whole table runs in seconds on a CPU, and deliberately
//! odd (not multiples of SIMD widths) so that kernel tails are exercised.

use rgml::op::{RopeMode, RopeParams};
use rgml::{Context, DType, OpKind, Result, TensorId};

/// How a leaf tensor is filled.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Init {
    /// Uniform floats in `[lo, hi)` (converted to the leaf's dtype).
    Uniform(f32, f32),
    /// Uniform integers in `0..n` (row indices, positions).
    Index(usize),
    /// Distinct integers in `0..n` along dim 0 (SET_ROWS indices: no row written twice).
    Distinct(usize),
    /// A causal mask: 0 where column `<= n_past + row`, -inf after.
    Causal(usize),
}

/// Collects the leafs of a case while its graph is built.
pub struct Builder<'a> {
    /// The case's context.
    pub(crate) ctx: &'a mut Context,
    /// Leafs and how to fill them.
    pub(crate) leaves: Vec<(TensorId, Init)>,
}

impl Builder<'_> {
    fn leaf(&mut self, dtype: DType, dims: &[usize], init: Init) -> Result<TensorId> {
        let id = self.ctx.new_tensor(dtype, dims)?;
        self.ctx.set_name(id, format!("in{}", self.leaves.len()))?;
        self.ctx.set_input(id)?;
        self.leaves.push((id, init));
        Ok(id)
    }

    fn uniform(&mut self, dtype: DType, dims: &[usize]) -> Result<TensorId> {
        self.leaf(dtype, dims, Init::Uniform(-1.0, 1.0))
    }
}

type BuildFn = dyn Fn(&mut Builder) -> Result<TensorId> + Send + Sync;

/// One conformance case: a named graph whose last node is compared with the reference.
pub struct Case {
    /// Unique name with the parameters, e.g. `MUL_MAT(type_a=q4_0,m=67,n=5,k=256,bs=[2,3])`.
    pub name: String,
    /// The op under test (used by op filters and reports).
    pub op: OpKind,
    /// The row of the support table this case belongs to (op and dtypes, without shapes).
    pub family: String,
    /// Largest normalized mean squared error that passes.
    pub threshold: f64,
    build: Box<BuildFn>,
}

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Case")
            .field("name", &self.name)
            .field("threshold", &self.threshold)
            .finish()
    }
}

impl Case {
    fn new(
        op: OpKind,
        family: String,
        params: String,
        threshold: f64,
        build: impl Fn(&mut Builder) -> Result<TensorId> + Send + Sync + 'static,
    ) -> Case {
        Case {
            name: format!("{}({params})", op.name()),
            op,
            family,
            threshold,
            build: Box::new(build),
        }
    }

    /// Build the case's graph into `b`; returns the node to compare.
    pub(crate) fn build(&self, b: &mut Builder) -> Result<TensorId> {
        (self.build)(b)
    }
}

/// Default NMSE threshold (ggml's test-backend-ops default).
pub const DEFAULT_NMSE: f64 = 1e-7;
/// MUL_MAT threshold: kernels may quantize or round src1 to the weight's dot type.
pub const MUL_MAT_NMSE: f64 = 5e-4;

/// Threshold for an output stored as `dtype`, compared with the reference's own round trip
/// through that type: a tenth of the type's typical quantization error, which tolerates a few
/// values that round to the neighbouring level while any real error is far above it.
pub fn output_threshold(dtype: DType) -> f64 {
    match dtype {
        DType::Q4_0 | DType::Q4_1 => 5e-4,
        DType::Q5_0 | DType::Q5_1 => 1.5e-4,
        DType::Q8_0 | DType::Q8_1 => 2e-6,
        DType::Q4_K => 1e-4,
        DType::Q5_K => 3e-5,
        DType::Q6_K | DType::Q8_K => 1e-5,
        DType::Q2_K => 6e-3,
        DType::Q3_K => 3e-3,
        DType::IQ4_NL | DType::IQ4_XS => 4e-4,
        // Power-of-two block scales: about 2e-2 on uniform data.
        DType::MXFP4 => 2e-3,
        _ => DEFAULT_NMSE,
    }
}

fn dims(ne: &[usize]) -> String {
    let v: Vec<String> = ne.iter().map(|n| n.to_string()).collect();
    format!("[{}]", v.join(","))
}

/// Every weight type of the common `llama-quantize` presets, and MXFP4 (gpt-oss's experts).
const QUANT: [DType; 13] = [
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q8_0,
    DType::Q4_K,
    DType::Q5_K,
    DType::Q6_K,
    DType::Q2_K,
    DType::Q3_K,
    DType::IQ4_NL,
    DType::IQ4_XS,
    DType::MXFP4,
];

fn with_plain(q: &[DType]) -> Vec<DType> {
    let mut v = vec![DType::F32, DType::F16, DType::BF16];
    v.extend_from_slice(q);
    v
}

/// A row length valid for `t` near `plain` (odd for plain types, a block multiple otherwise).
fn row_len(t: DType, plain: usize) -> usize {
    if t.block_size() == 1 {
        plain
    } else {
        2 * t.block_size()
    }
}

fn get_rows(cases: &mut Vec<Case>) {
    let mut types = with_plain(&QUANT);
    types.push(DType::I32);
    for t in types {
        for (ne0, nr, n, b) in [(37, 5, 3, [1, 1]), (37, 7, 9, [2, 3]), (11, 1, 4, [1, 2])] {
            let ne0 = row_len(t, ne0);
            let params = format!("type={t},n={ne0},m={nr},r={n},b={}", dims(&b));
            cases.push(Case::new(
                OpKind::GetRows,
                format!("GET_ROWS type={t}"),
                params,
                DEFAULT_NMSE,
                move |c| {
                    let init = if t == DType::I32 {
                        Init::Index(1000)
                    } else {
                        Init::Uniform(-1.0, 1.0)
                    };
                    let a = c.leaf(t, &[ne0, nr, b[0], b[1]], init)?;
                    let r = c.leaf(DType::I32, &[n, b[0], b[1]], Init::Index(nr))?;
                    c.ctx.get_rows(a, r)
                },
            ));
        }
    }
}

fn set_rows(cases: &mut Vec<Case>) {
    let types = with_plain(&QUANT[..5]);
    for t in types {
        // I64 indices (llama.cpp's KV cache writes) for the cache types.
        let index_types: &[DType] = if matches!(t, DType::F32 | DType::F16) {
            &[DType::I32, DType::I64]
        } else {
            &[DType::I32]
        };
        for &it in index_types {
            for (ne0, nr, n, b, k) in [
                (35, 7, 3, [1, 1], [1, 1]),
                (35, 9, 4, [2, 3], [2, 3]),
                (19, 5, 2, [2, 3], [1, 3]),
            ] {
                let ne0 = row_len(t, ne0);
                let params = format!(
                    "type={t},ne=[{ne0},{nr},{},{}],nr={n},idx={},type_idx={it}",
                    b[0],
                    b[1],
                    dims(&k)
                );
                cases.push(Case::new(
                    OpKind::SetRows,
                    format!("SET_ROWS type={t}"),
                    params,
                    output_threshold(t),
                    move |c| {
                        let dst = c.uniform(t, &[ne0, nr, b[0], b[1]])?;
                        let src = c.uniform(DType::F32, &[ne0, n, b[0], b[1]])?;
                        let idx = c.leaf(it, &[n, k[0], k[1]], Init::Distinct(nr))?;
                        c.ctx.set_rows(dst, src, idx)
                    },
                ));
            }
        }
    }
}

#[derive(Clone, Copy)]
enum Src0Layout {
    Contiguous,
    /// src0 is `permute([0,2,1,3])` of a leaf stored with dims 1 and 2 swapped.
    Permuted,
    /// src0 is a view of every other row of a leaf twice as tall.
    Strided,
}

fn binary(cases: &mut Vec<Case>) {
    let ops = [OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::Div];
    let mut configs: Vec<([usize; 4], [usize; 4], Src0Layout)> = Vec::new();
    let ne = [10, 5, 4, 3];
    for nr in [
        [1, 1, 1, 1],
        [2, 1, 1, 1],
        [1, 2, 1, 1],
        [1, 1, 2, 1],
        [1, 1, 1, 2],
        [1, 1, 2, 2],
        [2, 2, 2, 2],
    ] {
        configs.push((ne, nr, Src0Layout::Contiguous));
    }
    configs.push(([33, 1, 1, 1], [1, 7, 3, 2], Src0Layout::Contiguous));
    configs.push(([1, 1, 1, 1], [17, 3, 2, 1], Src0Layout::Contiguous));
    configs.push(([1027, 3, 1, 1], [1, 1, 1, 1], Src0Layout::Contiguous));
    configs.push((ne, [1, 1, 1, 1], Src0Layout::Permuted));
    configs.push((ne, [1, 1, 2, 1], Src0Layout::Permuted));
    configs.push((ne, [1, 1, 1, 1], Src0Layout::Strided));
    configs.push(([7, 3, 1, 1], [1, 1, 2, 3], Src0Layout::Strided));
    let pairs = [
        (DType::F32, DType::F32, configs.len()),
        (DType::F16, DType::F16, 4),
        (DType::F16, DType::F32, 4),
        (DType::BF16, DType::BF16, 4),
    ];
    for op in ops {
        for &(ta, tb, count) in &pairs {
            for &(ne1, nr, layout) in configs.iter().take(count) {
                let ne0 = [
                    ne1[0] * nr[0],
                    ne1[1] * nr[1],
                    ne1[2] * nr[2],
                    ne1[3] * nr[3],
                ];
                let lay = match layout {
                    Src0Layout::Contiguous => "",
                    Src0Layout::Permuted => ",src0=permuted",
                    Src0Layout::Strided => ",src0=strided",
                };
                let params = format!(
                    "type_a={ta},type_b={tb},ne={},nr={}{lay}",
                    dims(&ne1),
                    dims(&nr)
                );
                let b_init = if op == OpKind::Div {
                    Init::Uniform(0.5, 2.0)
                } else {
                    Init::Uniform(-1.0, 1.0)
                };
                cases.push(Case::new(
                    op,
                    format!("{} type_a={ta},type_b={tb}", op.name()),
                    params,
                    DEFAULT_NMSE,
                    move |c| {
                        let a = match layout {
                            Src0Layout::Contiguous => c.uniform(ta, &ne0)?,
                            Src0Layout::Permuted => {
                                let l = c.uniform(ta, &[ne0[0], ne0[2], ne0[1], ne0[3]])?;
                                c.ctx.permute(l, [0, 2, 1, 3])?
                            }
                            Src0Layout::Strided => {
                                let l = c.uniform(ta, &[ne0[0], 2 * ne0[1], ne0[2], ne0[3]])?;
                                let nb1 = c.ctx[l].nb[1];
                                c.ctx.view(
                                    l,
                                    &ne0,
                                    &[2 * nb1, 2 * nb1 * ne0[1], 2 * nb1 * ne0[1] * ne0[2]],
                                    nb1,
                                )?
                            }
                        };
                        let b = c.leaf(tb, &ne1, b_init)?;
                        match op {
                            OpKind::Add => c.ctx.add(a, b),
                            OpKind::Sub => c.ctx.sub(a, b),
                            OpKind::Mul => c.ctx.mul(a, b),
                            _ => c.ctx.div(a, b),
                        }
                    },
                ));
            }
        }
    }

    // Non-contiguous src1 (rows stay dense), broadcast in dim 2.
    for op in ops {
        cases.push(Case::new(
            op,
            format!("{} type_a=f32,type_b=f32", op.name()),
            "type_a=f32,type_b=f32,ne=[10,5,4,3],nr=[1,1,2,1],src1=permuted".into(),
            DEFAULT_NMSE,
            move |c| {
                let a = c.uniform(DType::F32, &[10, 5, 8, 3])?;
                let l = c.leaf(DType::F32, &[10, 4, 5, 3], Init::Uniform(0.5, 2.0))?;
                let b = c.ctx.permute(l, [0, 2, 1, 3])?;
                match op {
                    OpKind::Add => c.ctx.add(a, b),
                    OpKind::Sub => c.ctx.sub(a, b),
                    OpKind::Mul => c.ctx.mul(a, b),
                    _ => c.ctx.div(a, b),
                }
            },
        ));
    }
}

fn scale(cases: &mut Vec<Case>) {
    for (s, bias) in [(2.0f32, 0.0f32), (0.5, 1.25), (-1.5, -0.3)] {
        for ne in [[10, 5, 4, 3], [129, 3, 1, 1]] {
            cases.push(Case::new(
                OpKind::Scale,
                "SCALE type=f32".into(),
                format!("ne={},scale={s},bias={bias}", dims(&ne)),
                DEFAULT_NMSE,
                move |c| {
                    let a = c.uniform(DType::F32, &ne)?;
                    c.ctx.scale_bias(a, s, bias)
                },
            ));
        }
    }
    cases.push(Case::new(
        OpKind::Scale,
        "SCALE type=f32".into(),
        "ne=[10,5,4,3],scale=3,bias=0.5,src0=permuted".into(),
        DEFAULT_NMSE,
        move |c| {
            let a = c.uniform(DType::F32, &[10, 4, 5, 3])?;
            let p = c.ctx.permute(a, [0, 2, 1, 3])?;
            c.ctx.scale_bias(p, 3.0, 0.5)
        },
    ));
}

#[derive(Clone, Copy, PartialEq)]
enum Src1Layout {
    Contiguous,
    /// A leaf `[k, b2, n, b3]` permuted to `[k, n, b2, b3]`.
    Permuted,
    /// A leaf `[n, k]` transposed (dim 0 strided).
    Transposed,
}

/// (type_a, m, n, k, src0 batch dims 2-3, src1 repeats of them, src1 layout).
type MulMatCfg = (
    DType,
    usize,
    usize,
    usize,
    [usize; 2],
    [usize; 2],
    Src1Layout,
);

fn mul_mat(cases: &mut Vec<Case>) {
    let all = with_plain(&QUANT);
    let mut configs: Vec<MulMatCfg> = Vec::new();
    for &t in &all {
        for n in [1, 5, 32] {
            configs.push((t, 67, n, 256, [1, 1], [1, 1], Src1Layout::Contiguous));
        }
        configs.push((t, 35, 67, 256, [1, 1], [1, 1], Src1Layout::Contiguous));
        configs.push((t, 33, 7, 512, [2, 3], [1, 1], Src1Layout::Contiguous));
        configs.push((t, 19, 3, 256, [2, 1], [2, 3], Src1Layout::Contiguous));
        configs.push((t, 17, 1, 256, [1, 3], [3, 1], Src1Layout::Contiguous));
    }
    for t in [DType::F32, DType::F16, DType::BF16] {
        for (m, n, k) in [(13, 9, 37), (7, 1, 129), (1, 3, 65), (16, 16, 16)] {
            configs.push((t, m, n, k, [1, 1], [1, 1], Src1Layout::Contiguous));
        }
        configs.push((t, 11, 6, 67, [2, 1], [1, 2], Src1Layout::Permuted));
        configs.push((t, 11, 6, 67, [1, 1], [1, 1], Src1Layout::Transposed));
    }
    // Rows longer than a GPU mat-vec step (4 x 256 elements per invocation): several steps,
    // the last one partial.
    for t in [
        DType::F32,
        DType::F16,
        DType::Q4_0,
        DType::Q8_0,
        DType::Q4_K,
        DType::Q6_K,
    ] {
        configs.push((t, 9, 1, 2304, [1, 1], [1, 1], Src1Layout::Contiguous));
    }
    for t in [DType::Q4_0, DType::Q8_0, DType::Q4_K, DType::Q6_K] {
        configs.push((t, 11, 6, 256, [2, 1], [1, 2], Src1Layout::Permuted));
        configs.push((t, 11, 5, 256, [1, 1], [1, 1], Src1Layout::Transposed));
    }
    for (t, m, n, k, bs, nr, layout) in configs {
        let lay = match layout {
            Src1Layout::Contiguous => "",
            Src1Layout::Permuted => ",src1=permuted",
            Src1Layout::Transposed => ",src1=transposed",
        };
        let params = format!(
            "type_a={t},type_b=f32,m={m},n={n},k={k},bs={},nr={}{lay}",
            dims(&bs),
            dims(&nr)
        );
        cases.push(Case::new(
            OpKind::MulMat,
            format!("MUL_MAT type_a={t},type_b=f32"),
            params,
            MUL_MAT_NMSE,
            move |c| {
                let a = c.uniform(t, &[k, m, bs[0], bs[1]])?;
                let (b2, b3) = (bs[0] * nr[0], bs[1] * nr[1]);
                let b = match layout {
                    Src1Layout::Contiguous => c.uniform(DType::F32, &[k, n, b2, b3])?,
                    Src1Layout::Permuted => {
                        let l = c.uniform(DType::F32, &[k, b2, n, b3])?;
                        c.ctx.permute(l, [0, 2, 1, 3])?
                    }
                    Src1Layout::Transposed => {
                        let l = c.uniform(DType::F32, &[n, k, b2, b3])?;
                        c.ctx.transpose(l)?
                    }
                };
                c.ctx.mul_mat(a, b)
            },
        ));
    }
}

fn norms(cases: &mut Vec<Case>) {
    for op in [OpKind::RmsNorm, OpKind::Norm] {
        for eps in [1e-6f32, 1e-5, 1e-1] {
            for ne in [[64, 5, 4, 3], [67, 3, 1, 1], [513, 2, 1, 1]] {
                cases.push(Case::new(
                    op,
                    format!("{} type=f32", op.name()),
                    format!("ne={},eps={eps:e}", dims(&ne)),
                    DEFAULT_NMSE,
                    move |c| {
                        // An offset makes NORM's mean matter.
                        let a = c.leaf(DType::F32, &ne, Init::Uniform(-0.5, 1.5))?;
                        if op == OpKind::RmsNorm {
                            c.ctx.rms_norm(a, eps)
                        } else {
                            c.ctx.norm(a, eps)
                        }
                    },
                ));
            }
        }
    }
}

fn rope(cases: &mut Vec<Case>) {
    struct Cfg {
        ne: [usize; 4],
        n_dims: usize,
        base: f32,
        fscale: f32,
        ext: f32,
        attn: f32,
        n_ctx_orig: usize,
        /// Number of frequency factors (0: none).
        n_ff: usize,
    }
    let cfg = |ne, n_dims, base, fscale, ext, attn, n_ctx_orig, n_ff| Cfg {
        ne,
        n_dims,
        base,
        fscale,
        ext,
        attn,
        n_ctx_orig,
        n_ff,
    };
    let cfgs = [
        cfg([64, 4, 7, 1], 64, 10000.0, 1.0, 0.0, 1.0, 0, 0),
        cfg([64, 4, 7, 1], 32, 10000.0, 1.0, 0.0, 1.0, 0, 0),
        cfg([128, 2, 5, 1], 128, 500000.0, 1.0, 0.0, 1.0, 0, 0),
        cfg([80, 3, 6, 1], 64, 10000.0, 0.5, 0.0, 1.0, 0, 0),
        cfg([64, 3, 5, 2], 64, 10000.0, 0.25, 1.0, 1.0, 4096, 0),
        cfg([64, 3, 5, 1], 48, 1000000.0, 0.125, 1.0, 1.3, 2048, 0),
        cfg([96, 2, 9, 1], 96, 10000.0, 1.0, 0.5, 0.8, 512, 0),
        cfg([10, 5, 3, 1], 6, 100.0, 1.0, 0.0, 1.0, 0, 0),
        // Frequency factors (Llama 3's `rope_freqs`): exactly n_dims / 2 of them, or more
        // (ggml reads the first n_dims / 2), with and without YaRN, odd shapes.
        cfg([64, 4, 7, 1], 64, 500000.0, 1.0, 0.0, 1.0, 0, 32),
        cfg([128, 3, 5, 1], 128, 500000.0, 1.0, 0.0, 1.0, 0, 64),
        cfg([80, 3, 6, 1], 64, 10000.0, 0.5, 0.0, 1.0, 0, 35),
        cfg([64, 3, 5, 2], 64, 10000.0, 0.25, 1.0, 1.0, 4096, 32),
        cfg([96, 2, 9, 1], 96, 500000.0, 1.0, 0.5, 0.8, 8192, 48),
        cfg([10, 5, 3, 1], 6, 100.0, 1.0, 0.0, 1.0, 0, 3),
        cfg([18, 3, 7, 1], 14, 10000.0, 1.0, 1.0, 1.0, 512, 9),
    ];
    for mode in [RopeMode::Normal, RopeMode::Neox] {
        for c0 in &cfgs {
            let mut p = RopeParams::new(mode, c0.n_dims, c0.base);
            p.freq_scale = c0.fscale;
            p.ext_factor = c0.ext;
            p.attn_factor = c0.attn;
            p.n_ctx_orig = c0.n_ctx_orig;
            let (ne, n_ff) = (c0.ne, c0.n_ff);
            let m = if mode == RopeMode::Normal {
                "normal"
            } else {
                "neox"
            };
            let mut params = format!(
                "type=f32,ne={},mode={m},n_dims={},freq_base={},freq_scale={},ext_factor={},attn_factor={},n_ctx_orig={}",
                dims(&ne), c0.n_dims, c0.base, c0.fscale, c0.ext, c0.attn, c0.n_ctx_orig
            );
            let mut family = format!("ROPE type=f32,mode={m}");
            if n_ff > 0 {
                params.push_str(&format!(",freq_factors={n_ff}"));
                family.push_str(",freq_factors");
            }
            cases.push(Case::new(
                OpKind::Rope,
                family,
                params,
                DEFAULT_NMSE,
                move |c| {
                    let a = c.uniform(DType::F32, &ne)?;
                    // Random, non-sequential positions.
                    let pos = c.leaf(DType::I32, &[ne[2]], Init::Index(300))?;
                    // Llama 3's factors range from 1 to 8.
                    let ff = match n_ff {
                        0 => None,
                        n => Some(c.leaf(DType::F32, &[n], Init::Uniform(1.0, 8.0))?),
                    };
                    c.ctx.rope_ext(a, pos, ff, p)
                },
            ));
        }
    }
}

/// Multi-section ROPE (ggml's `ggml_rope_multi`, text modes): four positions per token, with
/// Qwen3.5's and Qwen3-VL's sections, sections that wrap around the pairs and use the fourth
/// position, frequency factors and YaRN.
fn rope_multi(cases: &mut Vec<Case>) {
    /// (ne, n_dims, sections, freq_base, YaRN (freq_scale, n_ctx_orig), frequency factors)
    type Cfg = (
        [usize; 4],
        usize,
        [u32; 4],
        f32,
        Option<(f32, usize)>,
        usize,
    );
    let cfgs: [Cfg; 5] = [
        ([256, 2, 5, 1], 64, [11, 11, 10, 0], 1e7, None, 0),
        ([128, 3, 4, 1], 128, [24, 20, 20, 0], 5e6, None, 0),
        ([64, 2, 5, 2], 64, [3, 2, 2, 1], 10000.0, None, 0),
        ([64, 2, 5, 1], 48, [8, 8, 8, 0], 10000.0, None, 30),
        (
            [64, 2, 5, 1],
            64,
            [12, 10, 10, 0],
            10000.0,
            Some((0.25, 4096)),
            0,
        ),
    ];
    for interleaved in [false, true] {
        for (ne, n_dims, sections, base, yarn, n_ff) in cfgs {
            let (mode, m) = match interleaved {
                false => (RopeMode::Mrope { sections }, "mrope"),
                true => (RopeMode::Imrope { sections }, "imrope"),
            };
            let mut p = RopeParams::new(mode, n_dims, base);
            if let Some((fscale, n_ctx_orig)) = yarn {
                (p.freq_scale, p.ext_factor, p.n_ctx_orig) = (fscale, 1.0, n_ctx_orig);
            }
            let mut family = format!("ROPE type=f32,mode={m}");
            if n_ff > 0 {
                family.push_str(",freq_factors");
            }
            let params = format!(
                "type=f32,ne={},mode={m},n_dims={n_dims},sections={sections:?},freq_base={base},\
                 freq_scale={},ext_factor={},n_ctx_orig={},freq_factors={n_ff}",
                dims(&ne),
                p.freq_scale,
                p.ext_factor,
                p.n_ctx_orig
            );
            cases.push(Case::new(
                OpKind::Rope,
                family,
                params,
                DEFAULT_NMSE,
                move |c| {
                    let a = c.uniform(DType::F32, &ne)?;
                    let pos = c.leaf(DType::I32, &[4 * ne[2]], Init::Index(300))?;
                    let ff = match n_ff {
                        0 => None,
                        n => Some(c.leaf(DType::F32, &[n], Init::Uniform(1.0, 8.0))?),
                    };
                    c.ctx.rope_ext(a, pos, ff, p)
                },
            ));
        }
    }
}

/// SSM_CONV: Qwen3.5's 4 taps and others, one to several tokens and sequences.
fn ssm_conv(cases: &mut Vec<Case>) {
    for (d_conv, d_inner, n_t, n_s) in [(4, 67, 5, 2), (3, 33, 1, 3), (1, 7, 3, 1), (13, 9, 6, 1)] {
        cases.push(Case::new(
            OpKind::SsmConv,
            "SSM_CONV type=f32".into(),
            format!("type=f32,d_conv={d_conv},d_inner={d_inner},n_t={n_t},n_s={n_s}"),
            DEFAULT_NMSE,
            move |c| {
                let sx = c.uniform(DType::F32, &[d_conv - 1 + n_t, d_inner, n_s])?;
                let w = c.uniform(DType::F32, &[d_conv, d_inner])?;
                c.ctx.ssm_conv(sx, w)
            },
        ));
    }
}

/// GATED_DELTA_NET: the scalar gate (Qwen3.5) and the vector gate (KDA), broadcast q/k heads
/// and sequences, one and several snapshots (more than tokens too).
fn gated_delta_net(cases: &mut Vec<Case>) {
    // (s_v, h, h_k, n_tokens, n_seqs, b_k, vector gate, snapshots)
    let shapes = [
        (128, 2, 1, 3, 1, 1, false, 1),
        (64, 2, 1, 2, 2, 1, false, 1),
        (48, 2, 2, 3, 1, 1, true, 1),
        (32, 2, 1, 5, 2, 2, false, 3),
        (20, 2, 1, 2, 2, 2, true, 4),
        (37, 3, 3, 1, 1, 1, false, 1),
    ];
    for (s_v, h, h_k, t, b, b_k, vector, snapshots) in shapes {
        let gate = if vector { "vector" } else { "scalar" };
        cases.push(Case::new(
            OpKind::GatedDeltaNet,
            format!("GATED_DELTA_NET type=f32,gate={gate}"),
            format!(
                "type=f32,s_v={s_v},h={h},h_k={h_k},n_tokens={t},n_seqs={b},b_k={b_k},\
                 gate={gate},snapshots={snapshots}"
            ),
            DEFAULT_NMSE,
            move |c| {
                // Keys of about unit length keep the delta rule stable.
                let r = 1.0 / (s_v as f32).sqrt();
                let q = c.uniform(DType::F32, &[s_v, h_k, t, b_k])?;
                let k = c.leaf(DType::F32, &[s_v, h_k, t, b_k], Init::Uniform(-r, r))?;
                let v = c.uniform(DType::F32, &[s_v, h, t, b])?;
                let g0 = if vector { s_v } else { 1 };
                let g = c.leaf(DType::F32, &[g0, h, t, b], Init::Uniform(-0.5, 0.1))?;
                let beta = c.leaf(DType::F32, &[1, h, t, b], Init::Uniform(0.05, 1.0))?;
                let s = c.uniform(DType::F32, &[s_v, s_v, h, b])?;
                c.ctx.gated_delta_net(q, k, v, g, beta, s, snapshots)
            },
        ));
    }
}

fn soft_max(cases: &mut Vec<Case>) {
    // (ne, mask: None | Some((dtype, mask_ne1_extra, mask broadcast in dims 2/3)), scale, max_bias)
    let shapes = [[16, 7, 4, 1], [33, 5, 2, 3], [257, 3, 1, 1]];
    for ne in shapes {
        for scale in [1.0f32, 0.125] {
            let mut masks: Vec<Option<(DType, usize, bool)>> = vec![None];
            for mt in [DType::F32, DType::F16] {
                masks.push(Some((mt, 0, true)));
                masks.push(Some((mt, 3, false)));
            }
            for mask in masks {
                for max_bias in [0.0f32, 8.0] {
                    if mask.is_none() && max_bias > 0.0 {
                        continue;
                    }
                    let (mdesc, mfam) = match mask {
                        None => ("none".to_string(), "none"),
                        Some((t, extra, bc)) => {
                            (format!("{t},mask_rows=+{extra},broadcast={bc}"), t.name())
                        }
                    };
                    cases.push(Case::new(
                        OpKind::SoftMax,
                        format!("SOFT_MAX type=f32,mask={mfam}"),
                        format!(
                            "type=f32,ne={},mask={mdesc},scale={scale},max_bias={max_bias}",
                            dims(&ne)
                        ),
                        DEFAULT_NMSE,
                        move |c| {
                            let a = c.leaf(DType::F32, &ne, Init::Uniform(-3.0, 3.0))?;
                            let m = match mask {
                                None => None,
                                Some((t, extra, bc)) => {
                                    let (m2, m3) = if bc { (1, 1) } else { (ne[2], ne[3]) };
                                    Some(c.uniform(t, &[ne[0], ne[1] + extra, m2, m3])?)
                                }
                            };
                            c.ctx.soft_max_ext(a, m, scale, max_bias)
                        },
                    ));
                }
            }
        }
    }
    // A causal mask with -inf entries (no row fully masked).
    for mt in [DType::F32, DType::F16] {
        cases.push(Case::new(
            OpKind::SoftMax,
            format!("SOFT_MAX type=f32,mask={mt}"),
            format!("type=f32,ne=[12,5,3,1],mask={mt},causal,n_past=4,scale=0.5,max_bias=4"),
            DEFAULT_NMSE,
            move |c| {
                let a = c.leaf(DType::F32, &[12, 5, 3, 1], Init::Uniform(-3.0, 3.0))?;
                let m = c.leaf(mt, &[12, 5, 1, 1], Init::Causal(4))?;
                c.ctx.soft_max_ext(a, Some(m), 0.5, 4.0)
            },
        ));
    }
    // Attention sinks (gpt-oss), with and without a causal mask.
    for (mask, n_past) in [(None, 0), (Some(DType::F16), 2), (Some(DType::F32), 0)] {
        let mdesc = mask.map_or("none".to_string(), |m| m.to_string());
        cases.push(Case::new(
            OpKind::SoftMax,
            format!("SOFT_MAX type=f32,mask={mdesc},sinks"),
            format!("type=f32,ne=[9,4,5,2],mask={mdesc},n_past={n_past},sinks,scale=0.7"),
            DEFAULT_NMSE,
            move |c| {
                let a = c.leaf(DType::F32, &[9, 4, 5, 2], Init::Uniform(-3.0, 3.0))?;
                let m = match mask {
                    Some(t) => Some(c.leaf(t, &[9, 4, 1, 1], Init::Causal(n_past))?),
                    None => None,
                };
                let sinks = c.leaf(DType::F32, &[5], Init::Uniform(-4.0, 4.0))?;
                c.ctx.soft_max_sinks(a, m, Some(sinks), 0.7, 0.0)
            },
        ));
    }
}

fn diag_mask(cases: &mut Vec<Case>) {
    for n_past in [0, 3, 7] {
        for ne in [[10, 10, 3, 1], [12, 8, 2, 2]] {
            cases.push(Case::new(
                OpKind::DiagMaskInf,
                "DIAG_MASK_INF type=f32".into(),
                format!("type=f32,ne={},n_past={n_past}", dims(&ne)),
                DEFAULT_NMSE,
                move |c| {
                    let a = c.uniform(DType::F32, &ne)?;
                    c.ctx.diag_mask_inf(a, n_past)
                },
            ));
        }
    }
}

fn unary(cases: &mut Vec<Case>) {
    let unary_ops = [
        OpKind::Silu,
        OpKind::Gelu,
        OpKind::Tanh,
        OpKind::Neg,
        OpKind::Sigmoid,
        OpKind::Exp,
        OpKind::Softplus,
    ];
    for op in unary_ops {
        for (ne, permuted) in [
            ([128, 7, 3, 1], false),
            ([5, 1, 1, 1], false),
            ([1037, 3, 1, 1], false),
            ([10, 5, 4, 3], true),
        ] {
            let p = if permuted { ",src0=permuted" } else { "" };
            cases.push(Case::new(
                op,
                format!("{} type=f32", op.name()),
                format!("type=f32,ne={}{p}", dims(&ne)),
                DEFAULT_NMSE,
                move |c| {
                    let a = if permuted {
                        let l = c.leaf(
                            DType::F32,
                            &[ne[0], ne[2], ne[1], ne[3]],
                            Init::Uniform(-6.0, 6.0),
                        )?;
                        c.ctx.permute(l, [0, 2, 1, 3])?
                    } else {
                        c.leaf(DType::F32, &ne, Init::Uniform(-6.0, 6.0))?
                    };
                    match op {
                        OpKind::Silu => c.ctx.silu(a),
                        OpKind::Tanh => c.ctx.tanh(a),
                        OpKind::Neg => c.ctx.neg(a),
                        OpKind::Sigmoid => c.ctx.sigmoid(a),
                        OpKind::Exp => c.ctx.exp(a),
                        OpKind::Softplus => c.ctx.softplus(a),
                        _ => c.ctx.gelu(a),
                    }
                },
            ));
        }
    }
    // gpt-oss's alpha and limit; operands beyond the limit on both sides.
    for ne in [[128, 7, 3, 1], [5, 1, 1, 1], [1037, 3, 1, 1]] {
        cases.push(Case::new(
            OpKind::SwigluOai,
            "SWIGLU_OAI type=f32".into(),
            format!("type=f32,ne={},alpha=1.702,limit=7", dims(&ne)),
            DEFAULT_NMSE,
            move |c| {
                let g = c.leaf(DType::F32, &ne, Init::Uniform(-10.0, 10.0))?;
                let u = c.leaf(DType::F32, &ne, Init::Uniform(-10.0, 10.0))?;
                c.ctx.swiglu_oai(g, u, 1.702, 7.0)
            },
        ));
    }
    for ne in [[128, 7, 3, 1], [5, 1, 1, 1], [1037, 3, 1, 1]] {
        cases.push(Case::new(
            OpKind::Swiglu,
            "SWIGLU type=f32".into(),
            format!("type=f32,ne={}", dims(&ne)),
            DEFAULT_NMSE,
            move |c| {
                let a = c.leaf(DType::F32, &ne, Init::Uniform(-6.0, 6.0))?;
                let b = c.uniform(DType::F32, &ne)?;
                c.ctx.swiglu(a, b)
            },
        ));
        // Wider than GELU's clamps at -10 and 10.
        cases.push(Case::new(
            OpKind::Geglu,
            "GEGLU type=f32".into(),
            format!("type=f32,ne={}", dims(&ne)),
            DEFAULT_NMSE,
            move |c| {
                let a = c.leaf(DType::F32, &ne, Init::Uniform(-12.0, 12.0))?;
                let b = c.uniform(DType::F32, &ne)?;
                c.ctx.geglu(a, b)
            },
        ));
    }
}

fn copies(cases: &mut Vec<Case>) {
    cpy(cases);
    dup(cases);
    cont(cases);
}

/// CPY between every pair of plain types and from/to f32 for every quantized type, in
/// the layouts of [`cpy_layouts`].
fn cpy(cases: &mut Vec<Case>) {
    let mut pairs = vec![
        (DType::F32, DType::F32),
        (DType::F32, DType::F16),
        (DType::F16, DType::F32),
        (DType::F16, DType::F16),
        (DType::F32, DType::BF16),
        (DType::BF16, DType::F32),
        (DType::BF16, DType::BF16),
    ];
    for q in QUANT {
        pairs.push((DType::F32, q));
        pairs.push((q, DType::F32));
    }
    for (ta, tb) in pairs {
        for (ne, perm, dst_t) in cpy_layouts(ta, tb) {
            let mut params = format!("type_src={ta},type_dst={tb},ne={}", dims(&ne));
            if let Some(p) = perm {
                params += &format!(",permute={}", dims(&p));
            }
            if dst_t {
                params += ",dst=transposed";
            }
            cases.push(Case::new(
                OpKind::Cpy,
                format!("CPY type_src={ta},type_dst={tb}"),
                params,
                output_threshold(tb),
                move |c| {
                    let src = match perm {
                        None => c.uniform(ta, &ne)?,
                        Some(p) => {
                            // Store the leaf so that permuting it yields shape `ne`.
                            let mut lne = [0; 4];
                            for i in 0..4 {
                                lne[i] = ne[p[i]];
                            }
                            let l = c.uniform(ta, &lne)?;
                            c.ctx.permute(l, p)?
                        }
                    };
                    let dst = if dst_t {
                        let l = c.uniform(tb, &[ne[1], ne[0], ne[2], ne[3]])?;
                        c.ctx.transpose(l)?
                    } else {
                        c.uniform(tb, &ne)?
                    };
                    c.ctx.cpy(src, dst)
                },
            ));
        }
    }
}

/// A CPY case's layout: (ne, permutation of the source or none, destination transposed).
type CpyLayout = ([usize; 4], Option<[usize; 4]>, bool);

/// The layouts a CPY from `ta` to `tb` is checked in.
fn cpy_layouts(ta: DType, tb: DType) -> Vec<CpyLayout> {
    let quant = ta.is_quantized() || tb.is_quantized();
    let mut layouts = Vec::new();
    if quant {
        layouts.push(([256, 4, 2, 1], None, false));
        layouts.push(([512, 3, 1, 1], None, false));
        if !ta.is_quantized() {
            layouts.push(([256, 3, 2, 1], Some([0, 2, 1, 3]), false));
        }
    } else {
        layouts.push(([37, 5, 3, 2], None, false));
        layouts.push(([37, 5, 3, 2], Some([1, 0, 2, 3]), false));
        layouts.push(([37, 5, 3, 2], Some([0, 2, 1, 3]), false));
        layouts.push(([8, 7, 2, 3], Some([2, 0, 3, 1]), false));
        if ta == tb {
            layouts.push(([9, 6, 2, 1], None, true));
        }
    }
    layouts
}

/// DUP of plain and permuted tensors.
fn dup(cases: &mut Vec<Case>) {
    for t in [DType::F32, DType::F16, DType::BF16, DType::I32] {
        for perm in [None, Some([0, 2, 1, 3]), Some([1, 0, 2, 3])] {
            let p = perm.map_or(String::new(), |p| format!(",permute={}", dims(&p)));
            cases.push(Case::new(
                OpKind::Dup,
                format!("DUP type={t}"),
                format!("type={t},ne=[10,5,4,3]{p}"),
                DEFAULT_NMSE,
                move |c| {
                    let init = if t == DType::I32 {
                        Init::Index(100000)
                    } else {
                        Init::Uniform(-1.0, 1.0)
                    };
                    let a = match perm {
                        None => c.leaf(t, &[10, 5, 4, 3], init)?,
                        Some(p) => {
                            let l = c.leaf(t, &[10, 5, 4, 3], init)?;
                            c.ctx.permute(l, p)?
                        }
                    };
                    c.ctx.dup(a)
                },
            ));
        }
    }
}

/// CONT of permuted tensors, with and without a reshape.
fn cont(cases: &mut Vec<Case>) {
    for t in [DType::F32, DType::F16, DType::BF16] {
        for (perm, reshape) in [
            ([1, 0, 2, 3], None),
            ([0, 2, 1, 3], None),
            ([2, 0, 1, 3], None),
            ([1, 0, 2, 3], Some([21, 10, 4, 1])),
            ([0, 2, 1, 3], Some([35, 24, 1, 1])),
        ] {
            let r = reshape.map_or(String::new(), |r| format!(",reshape={}", dims(&r)));
            cases.push(Case::new(
                OpKind::Cont,
                format!("CONT type={t}"),
                format!("type={t},ne=[7,6,5,4],permute={}{r}", dims(&perm)),
                DEFAULT_NMSE,
                move |c| {
                    let l = c.uniform(t, &[7, 6, 5, 4])?;
                    let p = c.ctx.permute(l, perm)?;
                    match reshape {
                        None => c.ctx.cont(p),
                        Some(r) => c.ctx.cont_shape(p, &r),
                    }
                },
            ));
        }
    }
}

/// View ops feed a compute op so that something runs; the case is filed under the view op.
fn views(cases: &mut Vec<Case>) {
    let mut perms = Vec::new();
    for a in 0..4 {
        for b in 0..4 {
            for c in 0..4 {
                for d in 0..4 {
                    let p = [a, b, c, d];
                    let mut seen = [false; 4];
                    p.iter().for_each(|&x| seen[x] = true);
                    if seen.iter().all(|&s| s) {
                        perms.push(p);
                    }
                }
            }
        }
    }
    for p in perms {
        cases.push(Case::new(
            OpKind::Permute,
            "PERMUTE type=f32".into(),
            format!("type=f32,ne=[3,4,5,6],axes={},then=CONT", dims(&p)),
            DEFAULT_NMSE,
            move |c| {
                let l = c.uniform(DType::F32, &[3, 4, 5, 6])?;
                let v = c.ctx.permute(l, p)?;
                c.ctx.cont(v)
            },
        ));
    }
    for (ne, then) in [
        ([9, 7, 1, 1], "CONT"),
        ([16, 5, 3, 1], "ADD"),
        ([33, 8, 1, 1], "MUL_MAT"),
    ] {
        cases.push(Case::new(
            OpKind::Transpose,
            "TRANSPOSE type=f32".into(),
            format!("type=f32,ne={},then={then}", dims(&ne)),
            if then == "MUL_MAT" {
                MUL_MAT_NMSE
            } else {
                DEFAULT_NMSE
            },
            move |c| {
                let l = c.uniform(DType::F32, &ne)?;
                let t = c.ctx.transpose(l)?;
                match then {
                    "CONT" => c.ctx.cont(t),
                    "ADD" => {
                        let b = c.uniform(DType::F32, &[ne[1], ne[0], ne[2], ne[3]])?;
                        c.ctx.add(t, b)
                    }
                    _ => {
                        let ct = c.ctx.cont(t)?;
                        let w = c.uniform(DType::F32, &[ne[1], 5])?;
                        c.ctx.mul_mat(w, ct)
                    }
                }
            },
        ));
    }
    for (from, to) in [
        ([6, 10, 2, 1], [12, 5, 2, 1]),
        ([64, 3, 1, 1], [8, 8, 3, 1]),
        ([5, 4, 3, 2], [120, 1, 1, 1]),
    ] {
        cases.push(Case::new(
            OpKind::Reshape,
            "RESHAPE type=f32".into(),
            format!("type=f32,ne={},to={},then=MUL", dims(&from), dims(&to)),
            DEFAULT_NMSE,
            move |c| {
                let l = c.uniform(DType::F32, &from)?;
                let r = c.ctx.reshape(l, &to)?;
                let b = c.uniform(DType::F32, &[to[0], 1, 1, 1])?;
                c.ctx.mul(r, b)
            },
        ));
    }
    // (leaf ne, view ne, row stride in rows of the leaf, offset in elements)
    for (lne, vne, stride, off, then) in [
        ([20, 6, 1, 1], [7, 4, 1, 1], 1, 3, "SCALE"),
        ([16, 10, 1, 1], [16, 3, 1, 1], 3, 16, "SILU"),
        ([12, 8, 2, 1], [5, 3, 2, 1], 2, 1, "CONT"),
        ([64, 6, 1, 1], [64, 2, 1, 1], 2, 64, "MUL_MAT"),
    ] {
        cases.push(Case::new(
            OpKind::View,
            "VIEW type=f32".into(),
            format!(
                "type=f32,ne={},view={},row_stride={stride},offset={off},then={then}",
                dims(&lne),
                dims(&vne)
            ),
            if then == "MUL_MAT" {
                MUL_MAT_NMSE
            } else {
                DEFAULT_NMSE
            },
            move |c| {
                let l = c.uniform(DType::F32, &lne)?;
                let nb1 = c.ctx[l].nb[1] * stride;
                let v = c.ctx.view(l, &vne[..3], &[nb1, nb1 * vne[1]], off * 4)?;
                match then {
                    "SCALE" => c.ctx.scale(v, 0.75),
                    "SILU" => c.ctx.silu(v),
                    "CONT" => c.ctx.cont(v),
                    _ => {
                        let b = c.uniform(DType::F32, &[vne[0], 3])?;
                        c.ctx.mul_mat(v, b)
                    }
                }
            },
        ));
    }
}

fn concat(cases: &mut Vec<Case>) {
    for t in [DType::F32, DType::F16, DType::I32] {
        for dim in 0..4 {
            for permuted_b in [false, true] {
                if permuted_b && t != DType::F32 {
                    continue;
                }
                let ne_a = [11, 5, 4, 3];
                let mut ne_b = ne_a;
                ne_b[dim] = 2 + dim;
                let pb = if permuted_b { ",src1=permuted" } else { "" };
                cases.push(Case::new(
                    OpKind::Concat,
                    format!("CONCAT type={t}"),
                    format!(
                        "type={t},ne_a={},ne_b={},dim={dim}{pb}",
                        dims(&ne_a),
                        dims(&ne_b)
                    ),
                    DEFAULT_NMSE,
                    move |c| {
                        let init = if t == DType::I32 {
                            Init::Index(1 << 20)
                        } else {
                            Init::Uniform(-1.0, 1.0)
                        };
                        let a = c.leaf(t, &ne_a, init)?;
                        let b = if permuted_b {
                            let l = c.leaf(t, &[ne_b[0], ne_b[2], ne_b[1], ne_b[3]], init)?;
                            c.ctx.permute(l, [0, 2, 1, 3])?
                        } else {
                            c.leaf(t, &ne_b, init)?
                        };
                        c.ctx.concat(a, b, dim)
                    },
                ));
            }
        }
    }
}

/// REPEAT of every type ggml-cpu repeats, along each dim and several at once, from dense
/// sources and from sources with permuted outer dims; and llama.cpp's per-expert scales
/// (`build_lora_mm_id`: `[1, n_expert, 1]` repeated over the tokens).
fn repeat(cases: &mut Vec<Case>) {
    // (source ne, result ne, permutation of the source's outer dims)
    type Shape = ([usize; 4], [usize; 4], Option<[usize; 4]>);
    let shapes: [Shape; 7] = [
        ([10, 5, 4, 3], [20, 5, 4, 3], None),
        ([10, 5, 4, 3], [10, 10, 4, 3], None),
        ([10, 5, 4, 3], [10, 5, 8, 6], None),
        ([7, 3, 2, 1], [21, 6, 4, 2], None),
        ([1, 128, 1, 1], [1, 128, 9, 1], None),
        ([1, 1, 1, 1], [13, 3, 2, 2], None),
        ([9, 4, 3, 2], [18, 8, 3, 4], Some([0, 2, 1, 3])),
    ];
    for t in [DType::F32, DType::F16, DType::BF16, DType::I32] {
        for (ne_a, ne, perm) in shapes {
            let p = perm.map_or(String::new(), |p| format!(",permute={}", dims(&p)));
            cases.push(Case::new(
                OpKind::Repeat,
                format!("REPEAT type={t}"),
                format!("type={t},ne_a={},ne={}{p}", dims(&ne_a), dims(&ne)),
                0.0,
                move |c| {
                    let init = if t == DType::I32 {
                        Init::Index(1 << 20)
                    } else {
                        Init::Uniform(-1.0, 1.0)
                    };
                    let a = match perm {
                        None => c.leaf(t, &ne_a, init)?,
                        Some(p) => {
                            // A leaf laid out so that the permutation gives `ne_a`.
                            let mut stored = [0; 4];
                            for (i, &to) in p.iter().enumerate() {
                                stored[i] = ne_a[to];
                            }
                            let l = c.leaf(t, &stored, init)?;
                            c.ctx.permute(l, p)?
                        }
                    };
                    c.ctx.repeat(a, &ne)
                },
            ));
        }
    }
}

fn argmax(cases: &mut Vec<Case>) {
    for ne in [[10, 5], [1031, 7], [32, 1], [1, 4]] {
        cases.push(Case::new(
            OpKind::Argmax,
            "ARGMAX type=f32".into(),
            format!("type=f32,ne={}", dims(&ne)),
            0.0,
            move |c| {
                let a = c.uniform(DType::F32, &ne)?;
                c.ctx.argmax(a)
            },
        ));
    }
}

/// MUL_MAT_ID over 4 or 8 experts: one token (a decode step), a few tokens, and 40 tokens so
/// that K-quant experts get 8 or more routed rows (ggml's tiled kernel per expert), src1 per
/// slot or broadcast to every slot (n_b = 1, as llama.cpp's gate and up products have it).
fn mul_mat_id(cases: &mut Vec<Case>) {
    let types = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q4_0,
        DType::Q8_0,
        DType::Q4_K,
        DType::Q6_K,
        DType::IQ4_XS,
        DType::MXFP4,
    ];
    for t in types {
        for (n_expert, n_used, n_b, tokens) in
            [(4, 2, 1, 1), (4, 2, 2, 3), (8, 2, 1, 40), (4, 4, 4, 9)]
        {
            let (m, k) = (19, 256);
            cases.push(Case::new(
                OpKind::MulMatId,
                format!("MUL_MAT_ID type_a={t},type_b=f32"),
                format!("type_a={t},type_b=f32,n_mats={n_expert},n_used={n_used},b={},m={m},n={tokens},k={k}", n_b > 1),
                MUL_MAT_NMSE,
                move |c| {
                    let a = c.uniform(t, &[k, m, n_expert])?;
                    let b = c.uniform(DType::F32, &[k, n_b, tokens])?;
                    let ids = c.leaf(DType::I32, &[n_used, tokens], Init::Distinct(n_expert))?;
                    c.ctx.mul_mat_id(a, b, ids)
                },
            ));
        }
    }
}

/// ADD_ID: gpt-oss's expert biases, one row of `b` per (slot, token).
fn add_id(cases: &mut Vec<Case>) {
    for (n, n_rows, n_used, tokens) in [(64, 4, 2, 5), (1031, 8, 4, 3), (7, 32, 4, 40)] {
        cases.push(Case::new(
            OpKind::AddId,
            "ADD_ID type=f32".into(),
            format!("type=f32,n={n},n_rows={n_rows},n_used={n_used},n_tokens={tokens}"),
            DEFAULT_NMSE,
            move |c| {
                let a = c.uniform(DType::F32, &[n, n_used, tokens])?;
                let b = c.uniform(DType::F32, &[n, n_rows])?;
                let ids = c.leaf(DType::I32, &[n_used, tokens], Init::Distinct(n_rows))?;
                c.ctx.add_id(a, b, ids)
            },
        ));
    }
}

/// SUM_ROWS over rows of several lengths and dims (llama.cpp sums each token's expert
/// weights), and CLAMP with bounds inside and outside the values.
fn sum_rows_clamp(cases: &mut Vec<Case>) {
    for ne in [[8, 5, 1, 1], [1031, 3, 2, 1], [1, 4, 3, 2]] {
        cases.push(Case::new(
            OpKind::SumRows,
            "SUM_ROWS type=f32".into(),
            format!("type=f32,ne={}", dims(&ne)),
            DEFAULT_NMSE,
            move |c| {
                let a = c.uniform(DType::F32, &ne)?;
                c.ctx.sum_rows(a)
            },
        ));
    }
    for (min, max) in [(-0.5f32, 0.5f32), (6.1e-5, f32::INFINITY), (-2.0, 2.0)] {
        cases.push(Case::new(
            OpKind::Clamp,
            "CLAMP type=f32".into(),
            format!("type=f32,ne=[33,7,2,1],min={min},max={max}"),
            0.0,
            move |c| {
                let a = c.uniform(DType::F32, &[33, 7, 2])?;
                c.ctx.clamp(a, min, max)
            },
        ));
    }
}

/// ARGSORT of random rows (no equal values, so any correct sort agrees with the reference;
/// ggml's order of ties is checked against ggml itself in rgml-cpu's tests), in both orders,
/// across the insertion-sort threshold of 16, in 3 and 4 dimensions.
fn argsort(cases: &mut Vec<Case>) {
    for descending in [false, true] {
        for ne in [
            [16, 10, 1, 1],
            [17, 3, 1, 1],
            [128, 9, 1, 1],
            [1000, 2, 3, 1],
            [5, 3, 2, 2],
        ] {
            let order = if descending { "desc" } else { "asc" };
            cases.push(Case::new(
                OpKind::Argsort,
                format!("ARGSORT type=f32,order={order}"),
                format!("type=f32,ne={},order={order}", dims(&ne)),
                0.0,
                move |c| {
                    let a = c.uniform(DType::F32, &ne)?;
                    c.ctx.argsort(a, descending)
                },
            ));
        }
    }
}

/// A few larger shapes per hot op, so that kernels split work across threads and take their
/// blocked / tiled paths (the small cases above may fit in one thread's share).
fn large(cases: &mut Vec<Case>) {
    large_mul_mat(cases);
    large_quantized(cases);
    large_binary(cases);
    large_norm_soft_max(cases);
    large_rope(cases);
    large_unary(cases);
}

/// MUL_MAT of every weight type: a mat-mat and a mat-vec.
fn large_mul_mat(cases: &mut Vec<Case>) {
    for t in with_plain(&QUANT) {
        cases.push(Case::new(
            OpKind::MulMat,
            format!("MUL_MAT type_a={t},type_b=f32"),
            format!("type_a={t},type_b=f32,m=129,n=65,k=1024,bs=[1,1],nr=[1,1],large"),
            MUL_MAT_NMSE,
            move |c| {
                let a = c.uniform(t, &[1024, 129])?;
                let b = c.uniform(DType::F32, &[1024, 65])?;
                c.ctx.mul_mat(a, b)
            },
        ));
        cases.push(Case::new(
            OpKind::MulMat,
            format!("MUL_MAT type_a={t},type_b=f32"),
            format!("type_a={t},type_b=f32,m=515,n=1,k=1024,bs=[1,1],nr=[1,1],large"),
            MUL_MAT_NMSE,
            move |c| {
                let a = c.uniform(t, &[1024, 515])?;
                let b = c.uniform(DType::F32, &[1024, 1])?;
                c.ctx.mul_mat(a, b)
            },
        ));
    }
}

/// CPY to and GET_ROWS of every quantized type.
fn large_quantized(cases: &mut Vec<Case>) {
    for t in QUANT {
        cases.push(Case::new(
            OpKind::Cpy,
            format!("CPY type_src=f32,type_dst={t}"),
            format!("type_src=f32,type_dst={t},ne=[4096,33,1,1],large"),
            output_threshold(t),
            move |c| {
                let a = c.uniform(DType::F32, &[4096, 33])?;
                let b = c.uniform(t, &[4096, 33])?;
                c.ctx.cpy(a, b)
            },
        ));
        cases.push(Case::new(
            OpKind::GetRows,
            format!("GET_ROWS type={t}"),
            format!("type={t},n=4096,m=64,r=37,b=[1,1],large"),
            DEFAULT_NMSE,
            move |c| {
                let a = c.uniform(t, &[4096, 64])?;
                let r = c.leaf(DType::I32, &[37], Init::Index(64))?;
                c.ctx.get_rows(a, r)
            },
        ));
    }
}

/// ADD and MUL of a row broadcast over many rows.
fn large_binary(cases: &mut Vec<Case>) {
    for op in [OpKind::Add, OpKind::Mul] {
        cases.push(Case::new(
            op,
            format!("{} type_a=f32,type_b=f32", op.name()),
            "type_a=f32,type_b=f32,ne=[4097,1,1,1],nr=[1,67,1,1],large".into(),
            DEFAULT_NMSE,
            move |c| {
                let a = c.uniform(DType::F32, &[4097, 67])?;
                let b = c.uniform(DType::F32, &[4097, 1])?;
                if op == OpKind::Add {
                    c.ctx.add(a, b)
                } else {
                    c.ctx.mul(a, b)
                }
            },
        ));
    }
}

/// RMS_NORM and SOFT_MAX of long rows.
fn large_norm_soft_max(cases: &mut Vec<Case>) {
    cases.push(Case::new(
        OpKind::RmsNorm,
        "RMS_NORM type=f32".into(),
        "ne=[4097,33,1,1],eps=1e-6,large".into(),
        DEFAULT_NMSE,
        |c| {
            let a = c.leaf(DType::F32, &[4097, 33], Init::Uniform(-0.5, 1.5))?;
            c.ctx.rms_norm(a, 1e-6)
        },
    ));
    cases.push(Case::new(
        OpKind::SoftMax,
        "SOFT_MAX type=f32,mask=f16".into(),
        "type=f32,ne=[1025,64,4,1],mask=f16,mask_rows=+0,broadcast=true,scale=0.125,max_bias=0,large".into(),
        DEFAULT_NMSE,
        |c| {
            let a = c.leaf(DType::F32, &[1025, 64, 4], Init::Uniform(-3.0, 3.0))?;
            let m = c.uniform(DType::F16, &[1025, 64])?;
            c.ctx.soft_max_ext(a, Some(m), 0.125, 0.0)
        },
    ));
}

/// ROPE of both modes on many heads and positions, with and without frequency factors.
fn large_rope(cases: &mut Vec<Case>) {
    for mode in [RopeMode::Normal, RopeMode::Neox] {
        let m = if mode == RopeMode::Normal {
            "normal"
        } else {
            "neox"
        };
        cases.push(Case::new(
            OpKind::Rope,
            format!("ROPE type=f32,mode={m}"),
            format!("type=f32,ne=[128,32,33,1],mode={m},n_dims=128,freq_base=10000,large"),
            DEFAULT_NMSE,
            move |c| {
                let a = c.uniform(DType::F32, &[128, 32, 33])?;
                let pos = c.leaf(DType::I32, &[33], Init::Index(300))?;
                c.ctx.rope(a, pos, RopeParams::new(mode, 128, 10000.0))
            },
        ));
        // Llama 3.x: θ base 500000 and a frequency factor per pair.
        cases.push(Case::new(
            OpKind::Rope,
            format!("ROPE type=f32,mode={m},freq_factors"),
            format!(
                "type=f32,ne=[128,32,33,1],mode={m},n_dims=128,freq_base=500000,freq_factors=64,large"
            ),
            DEFAULT_NMSE,
            move |c| {
                let a = c.uniform(DType::F32, &[128, 32, 33])?;
                let pos = c.leaf(DType::I32, &[33], Init::Index(8192))?;
                let ff = c.leaf(DType::F32, &[64], Init::Uniform(1.0, 8.0))?;
                c.ctx
                    .rope_ext(a, pos, Some(ff), RopeParams::new(mode, 128, 500000.0))
            },
        ));
    }
}

/// SILU and GELU of long rows.
fn large_unary(cases: &mut Vec<Case>) {
    for op in [OpKind::Silu, OpKind::Gelu] {
        cases.push(Case::new(
            op,
            format!("{} type=f32", op.name()),
            "type=f32,ne=[4099,17,1,1],large".into(),
            DEFAULT_NMSE,
            move |c| {
                let a = c.leaf(DType::F32, &[4099, 17], Init::Uniform(-6.0, 6.0))?;
                if op == OpKind::Silu {
                    c.ctx.silu(a)
                } else {
                    c.ctx.gelu(a)
                }
            },
        ));
    }
}

/// FLASH_ATTN_EXT as llama.cpp's attention sends it: f16, f32, q8_0 or q4_0 K/V (the quantized
/// ones on rows of whole blocks), grouped heads, an f16 causal mask (padded rows, as llama.cpp
/// pads the batch), ALiBi, soft-capping, sinks.
fn flash_attn(cases: &mut Vec<Case>) {
    // (dk, dv, n_q, n_kv, n_head, n_head_kv)
    let shapes = [
        (64, 64, 1, 37, 4, 2),
        (64, 64, 7, 40, 4, 4),
        (128, 64, 3, 19, 6, 2),
        (40, 40, 5, 600, 2, 1),
        // 64 queries and more: ggml's tiled kernel.
        (64, 64, 70, 150, 2, 2),
        (16, 16, 64, 64, 1, 1),
        // A decode at depth: the GPU splits the keys across workgroups and adds the parts.
        (64, 64, 1, 1100, 4, 2),
    ];
    for kv in [DType::F16, DType::F32, DType::Q8_0, DType::Q4_0] {
        for (dk, dv, nq, nkv, nh, nhk) in shapes {
            if dk % kv.block_size() != 0 || dv % kv.block_size() != 0 {
                continue;
            }
            for (mask, max_bias, softcap, sinks) in [
                (true, 0.0f32, 0.0f32, false),
                (false, 0.0, 0.0, false),
                (true, 8.0, 0.0, false),
                (true, 0.0, 30.0, true),
            ] {
                cases.push(Case::new(
                    OpKind::FlashAttnExt,
                    format!("FLASH_ATTN_EXT type_kv={kv}"),
                    format!(
                        "type_kv={kv},dk={dk},dv={dv},nq={nq},nkv={nkv},nh={nh},nh_kv={nhk},\
                         mask={mask},max_bias={max_bias},softcap={softcap},sinks={sinks}"
                    ),
                    5e-4,
                    move |c| {
                        let q = c.leaf(DType::F32, &[dk, nq, nh, 1], Init::Uniform(-1.0, 1.0))?;
                        let k = c.leaf(kv, &[dk, nkv, nhk, 1], Init::Uniform(-1.0, 1.0))?;
                        let v = c.leaf(kv, &[dv, nkv, nhk, 1], Init::Uniform(-1.0, 1.0))?;
                        let m = if mask {
                            let pad = nq.next_multiple_of(8);
                            Some(c.leaf(DType::F16, &[nkv, pad, 1, 1], Init::Causal(nkv - nq))?)
                        } else {
                            None
                        };
                        let sk = if sinks {
                            Some(c.leaf(DType::F32, &[nh], Init::Uniform(-2.0, 2.0))?)
                        } else {
                            None
                        };
                        let scale = 1.0 / (dk as f32).sqrt();
                        c.ctx
                            .flash_attn_ext(q, k, v, m, sk, scale, max_bias, softcap)
                    },
                ));
            }
        }
    }
}

/// MUL_MAT at the shapes of an 8B Llama block (`rgml-random-model --shape llama-8b`): the
/// 4096 x 4096 projections, the 14336 x 4096 gate / up and the 4096 x 14336 down, by one
/// activation column (a decode step's mat-vec) and by 512 (a prompt's mat-mat), for the
/// weight types its files use. For timing (`rgml test-ops --mode perf-model`); their
/// references are never computed.
pub fn model_shape_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for t in [
        DType::Q4_K,
        DType::Q6_K,
        DType::Q8_0,
        DType::Q4_0,
        DType::F16,
    ] {
        for (m, k) in [(4096, 4096), (14336, 4096), (4096, 14336)] {
            for n in [1, 512] {
                cases.push(Case::new(
                    OpKind::MulMat,
                    format!("MUL_MAT type_a={t},type_b=f32"),
                    format!("type_a={t},type_b=f32,m={m},n={n},k={k}"),
                    MUL_MAT_NMSE,
                    move |c| {
                        let a = c.uniform(t, &[k, m, 1, 1])?;
                        let b = c.uniform(DType::F32, &[k, n, 1, 1])?;
                        c.ctx.mul_mat(a, b)
                    },
                ));
            }
        }
    }
    cases
}

/// Every case of the suite, in a stable order.
pub fn all_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    get_rows(&mut cases);
    set_rows(&mut cases);
    binary(&mut cases);
    scale(&mut cases);
    mul_mat(&mut cases);
    norms(&mut cases);
    rope(&mut cases);
    rope_multi(&mut cases);
    soft_max(&mut cases);
    diag_mask(&mut cases);
    unary(&mut cases);
    copies(&mut cases);
    views(&mut cases);
    concat(&mut cases);
    repeat(&mut cases);
    argmax(&mut cases);
    argsort(&mut cases);
    mul_mat_id(&mut cases);
    add_id(&mut cases);
    sum_rows_clamp(&mut cases);
    flash_attn(&mut cases);
    ssm_conv(&mut cases);
    gated_delta_net(&mut cases);
    large(&mut cases);
    cases
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_every_op_is_covered() {
        let cases = all_cases();
        let mut names: Vec<&str> = cases.iter().map(|c| c.name.as_str()).collect();
        names.sort_unstable();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n, "duplicate case names");
        for op in OpKind::ALL {
            if op != OpKind::None {
                assert!(cases.iter().any(|c| c.op == op), "no case for {op}");
            }
        }
        assert!(n >= 300, "only {n} cases");
    }

    #[test]
    fn every_case_builds() {
        for case in all_cases() {
            let mut ctx = Context::new();
            let mut b = Builder {
                ctx: &mut ctx,
                leaves: Vec::new(),
            };
            let out = case.build(&mut b);
            assert!(out.is_ok(), "{}: {:?}", case.name, out.err());
        }
    }
}
