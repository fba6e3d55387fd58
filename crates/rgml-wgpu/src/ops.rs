//! What the kernels need from a graph node: the kernels' pipelines, the exact support check,
//! and each node's parameters and bound buffers ([`prepare`]).

use crate::device::{Gpu, WgpuBuffer};
use rgml::{Context, DType, Error, Op, Result, RopeMode, RopeParams, Tensor, TensorId, UnaryOp};

/// Invocations per workgroup (the kernels' `@workgroup_size`).
pub(crate) const WG: u64 = 64;
/// Bytes per node in the uniform buffer (a multiple of every adapter's uniform offset alignment).
pub(crate) const PARAM_STRIDE: u64 = 256;
/// Most workgroups in one dispatch dimension (the WebGPU default limit).
pub(crate) const MAX_GROUPS: u64 = 65535;

/// The uniform block every kernel reads (`struct P` in `kernels.wgsl`).
#[repr(C)]
#[derive(Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct Params {
    a_ne: [u32; 4],
    a_nb: [u32; 4],
    b_ne: [u32; 4],
    b_nb: [u32; 4],
    c_ne: [u32; 4],
    c_nb: [u32; 4],
    d_ne: [u32; 4],
    d_nb: [u32; 4],
    off: [u32; 4],
    misc: [u32; 4],
    f: [f32; 4],
    g: [f32; 4],
}

/// The kernels of `kernels.wgsl`.
#[derive(Clone, Copy)]
pub(crate) enum Kernel {
    Binary,
    Scale,
    Silu,
    Cpy,
    GetRows,
    RmsNorm,
    SoftMax,
    MulMat,
    CpyF16,
    Swiglu,
    Gelu,
    DiagMaskInf,
    Norm,
    Rope,
    SetRows,
    Concat,
    Argmax,
    SetRowsF16,
}

/// Each kernel's entry point and whether it is in the f16-store module (`kernels_f16.wgsl`).
const KERNELS: [(Kernel, &str, bool); 18] = [
    (Kernel::Binary, "binary", false),
    (Kernel::Scale, "scale", false),
    (Kernel::Silu, "silu", false),
    (Kernel::Cpy, "cpy", false),
    (Kernel::GetRows, "get_rows", false),
    (Kernel::RmsNorm, "rms_norm", false),
    (Kernel::SoftMax, "soft_max", false),
    (Kernel::MulMat, "mul_mat", false),
    (Kernel::CpyF16, "cpy_f16", true),
    (Kernel::Swiglu, "swiglu", false),
    (Kernel::Gelu, "gelu", false),
    (Kernel::DiagMaskInf, "diag_mask_inf", false),
    (Kernel::Norm, "norm", false),
    (Kernel::Rope, "rope", false),
    (Kernel::SetRows, "set_rows", false),
    (Kernel::Concat, "concat", false),
    (Kernel::Argmax, "argmax", false),
    (Kernel::SetRowsF16, "set_rows_f16", true),
];

/// The kernels' code for an element type (`T_*` in `kernels.wgsl`), if they read it.
fn type_code(dtype: DType) -> Option<u32> {
    match dtype {
        DType::F32 | DType::I32 => Some(0),
        DType::F16 => Some(1),
        DType::Q4_0 => Some(2),
        DType::Q4_1 => Some(3),
        DType::Q8_0 => Some(4),
        _ => None,
    }
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

/// The compiled kernels and their shared bind group layout.
pub(crate) struct Kernels {
    pub(crate) layout: wgpu::BindGroupLayout,
    pipelines: Vec<wgpu::ComputePipeline>,
}

impl Kernels {
    /// Compile every kernel (errors surface through the device's error slot).
    pub(crate) fn new(device: &wgpu::Device) -> Kernels {
        let storage = |binding| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Storage { read_only: false },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        };
        let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("rgml kernels"),
            entries: &[
                wgpu::BindGroupLayoutEntry {
                    binding: 0,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Uniform,
                        has_dynamic_offset: false,
                        min_binding_size: None,
                    },
                    count: None,
                },
                storage(1),
                storage(2),
                storage(3),
                storage(4),
            ],
        });
        let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("rgml kernels"),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let common = include_str!("common.wgsl");
        let module = |label, body: &str| {
            device.create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(label),
                source: wgpu::ShaderSource::Wgsl(format!("{common}\n{body}").into()),
            })
        };
        let plain = module("rgml kernels", include_str!("kernels.wgsl"));
        let f16 = module("rgml f16 kernels", include_str!("kernels_f16.wgsl"));
        let pipelines = KERNELS
            .iter()
            .map(|(_, entry, in_f16)| {
                device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some(entry),
                    layout: Some(&pipeline_layout),
                    module: if *in_f16 { &f16 } else { &plain },
                    entry_point: Some(entry),
                    compilation_options: Default::default(),
                    cache: None,
                })
            })
            .collect();
        Kernels { layout, pipelines }
    }

    pub(crate) fn pipeline(&self, kernel: Kernel) -> &wgpu::ComputePipeline {
        // `pipelines` is built from KERNELS, whose order is the enum's.
        &self.pipelines[kernel as usize]
    }
}

/// Whether `t`'s shape and strides fit the kernels' u32 arithmetic (in 4-byte elements for
/// f32 / i32, bytes for the rest, whose strides must be even: f16 values are read as halves of
/// 4-byte words) and the kernels read its type.
fn fits(t: &Tensor) -> bool {
    let align = if unit(t.dtype) == 4 { 4 } else { 2 };
    type_code(t.dtype).is_some()
        && t.nb.iter().all(|&b| b.is_multiple_of(align))
        && t.ne.iter().all(|&n| n <= u32::MAX as usize)
        && t.nelements() <= u32::MAX as usize
        && t.nbytes() / unit(t.dtype) <= u32::MAX as usize
}

/// Whether node `id` runs on a wgpu device: exactly the ops, dtypes and layouts the kernels
/// implement (view ops always: nothing runs for them).
pub(crate) fn supports_op(ctx: &Context, id: TensorId) -> bool {
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
            | Op::Unary(UnaryOp::Silu | UnaryOp::Gelu)
            | Op::RmsNorm { .. }
            | Op::Norm { .. }
            | Op::DiagMaskInf { .. },
            [a],
        ) => f32s(&[a]) && a.ne == t.ne,
        (Op::Swiglu, [a, b]) => f32s(&[a, b]) && a.ne == t.ne && b.ne == t.ne,
        (Op::Rope(rp), [a, pos]) => {
            f32s(&[a])
                && a.ne == t.ne
                && pos.dtype == DType::I32
                && fits(pos)
                && rp.n_dims <= a.ne[0]
                && u32::try_from(rp.n_dims).is_ok()
        }
        (Op::GetRows, [a, rows]) => fits(a) && rows.dtype == DType::I32 && fits(rows),
        (Op::SoftMax { max_bias, .. }, srcs) if max_bias.is_finite() => match srcs {
            [a] => f32s(&[a]) && a.ne == t.ne,
            [a, mask] => f32s(&[a]) && f32_or_f16(mask) && a.ne == t.ne,
            _ => false,
        },
        (Op::MulMat, [a, b]) => {
            fits(a)
                && a.dtype != DType::I32
                && f32s(&[b])
                && a.ne[2] > 0
                && a.ne[3] > 0
                && b.ne[2] % a.ne[2] == 0
                && b.ne[3] % a.ne[3] == 0
        }
        _ => false,
    }
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

/// ggml's `ggml_rope_yarn_corr_dim`: the dimension whose wavelength fits `n_rot` rotations into
/// the original context.
fn yarn_corr_dim(n_dims: f64, n_ctx_orig: f64, n_rot: f64, base: f64) -> f64 {
    n_dims * (n_ctx_orig / (n_rot * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln())
}

/// ROPE's kernel parameters (see `rope` in `kernels.wgsl`), computed in f64 as the reference
/// does: θ scale, YaRN correction range and magnitude.
fn rope_params(p: &mut Params, rp: &RopeParams) {
    let nd = rp.n_dims as f64;
    let base = rp.freq_base as f64;
    let nco = rp.n_ctx_orig as f64;
    let start = yarn_corr_dim(nd, nco, rp.beta_fast as f64, base).floor();
    let end = yarn_corr_dim(nd, nco, rp.beta_slow as f64, base).ceil();
    let mut mscale = rp.attn_factor as f64;
    if rp.ext_factor != 0.0 {
        mscale *= 1.0 + 0.1 * (1.0 / rp.freq_scale as f64).ln();
    }
    p.misc[1] = rp.n_dims as u32;
    p.misc[2] = u32::from(rp.mode == RopeMode::Neox);
    p.f = [
        base.powf(-2.0 / nd) as f32,
        rp.freq_scale,
        rp.ext_factor,
        mscale as f32,
    ];
    p.g = [start.max(0.0) as f32, end.min(nd - 1.0) as f32, 0.0, 0.0];
}

/// One node ready to encode: its kernel, parameters, bound buffers (A, B, C, D) and threads.
pub(crate) struct Dispatch {
    pub(crate) kernel: Kernel,
    pub(crate) params: Params,
    pub(crate) buffers: [wgpu::Buffer; 4],
    pub(crate) threads: u64,
}

/// A node's dispatch on `gpu` (`device`: the device name, for errors).
pub(crate) struct Prep<'a> {
    pub(crate) gpu: &'a Gpu,
    pub(crate) device: &'a str,
}

impl Prep<'_> {
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
            .as_any()
            .downcast_ref::<WgpuBuffer>()
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

    pub(crate) fn prepare(&self, ctx: &Context, id: TensorId) -> Result<Option<Dispatch>> {
        let t = ctx.get(id)?;
        if t.op.kind().is_view() || t.nelements() == 0 {
            return Ok(None);
        }
        if !supports_op(ctx, id) {
            return Err(Error::Unsupported {
                backend: self.device.to_string(),
                what: format!("{} of {} ('{}')", t.op.kind(), t.dtype, t.display_name()),
            });
        }
        let srcs: Vec<&Tensor> = t.src.iter().map(|&s| ctx.get(s)).collect::<Result<_>>()?;
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
        let elements = t.nelements() as u64;
        let rows = t.nrows() as u64;
        let (kernel, threads) = match t.op {
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
            Op::Unary(UnaryOp::Silu) => (Kernel::Silu, elements),
            Op::Unary(UnaryOp::Gelu) => (Kernel::Gelu, elements),
            Op::Swiglu => (Kernel::Swiglu, elements),
            Op::DiagMaskInf { n_past } => {
                // Columns beyond ne0 do not exist: clamping keeps `n_past + i1` in range.
                p.misc[1] = n_past.min(t.ne[0]) as u32;
                (Kernel::DiagMaskInf, elements)
            }
            Op::Norm { eps } => {
                p.f[0] = eps;
                (Kernel::Norm, rows)
            }
            Op::Rope(rp) => {
                rope_params(&mut p, &rp);
                (Kernel::Rope, rows)
            }
            Op::Cpy | Op::Dup | Op::Cont => {
                p.misc[2] = type_code(srcs[0].dtype).unwrap_or(0);
                if t.dtype == DType::F16 {
                    (Kernel::CpyF16, elements)
                } else {
                    (Kernel::Cpy, elements)
                }
            }
            Op::SetRows => {
                p.misc[2] = type_code(t.dtype).unwrap_or(0);
                let n = srcs[1].nelements() as u64;
                if t.dtype == DType::F16 {
                    (Kernel::SetRowsF16, n)
                } else {
                    (Kernel::SetRows, n)
                }
            }
            Op::Concat { dim } => {
                p.misc[1] = dim as u32;
                (Kernel::Concat, elements)
            }
            Op::Argmax => (Kernel::Argmax, srcs[0].nrows() as u64),
            Op::GetRows => {
                p.misc[2] = type_code(srcs[0].dtype).unwrap_or(0);
                (Kernel::GetRows, elements)
            }
            Op::RmsNorm { eps } => {
                p.f[0] = eps;
                (Kernel::RmsNorm, rows)
            }
            Op::SoftMax { scale, max_bias } => {
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
                    // The kernel takes the mask from binding C.
                    buffers[2] = buffers[1].clone();
                    p.off[2] = p.off[1];
                    p.c_ne = p.b_ne;
                    p.c_nb = p.b_nb;
                } else {
                    p.c_ne = [1; 4];
                }
                (Kernel::SoftMax, rows)
            }
            Op::MulMat => {
                p.misc[1] = p.b_ne[2] / p.a_ne[2].max(1);
                p.misc[2] = p.b_ne[3] / p.a_ne[3].max(1);
                p.misc[3] = type_code(srcs[0].dtype).unwrap_or(0);
                (Kernel::MulMat, elements)
            }
            _ => {
                return Err(Error::Unsupported {
                    backend: self.device.to_string(),
                    what: format!("{}", t.op.kind()),
                })
            }
        };
        p.misc[0] = u32::try_from(threads).map_err(|_| self.err("too many invocations"))?;
        Ok(Some(Dispatch {
            kernel,
            params: p,
            buffers,
            threads,
        }))
    }
}
