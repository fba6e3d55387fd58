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
    QuantizeQ8,
    MulMatQ8,
    RmsNormF64,
    SoftMaxF64,
    MulMvQ8,
    MulMv,
    RopeCache,
    RopeCacheF64,
}

/// The WGSL module a kernel is in.
#[derive(Clone, Copy, PartialEq)]
enum Module {
    /// `kernels.wgsl`: f32 / i32 results.
    Plain,
    /// `kernels_f16.wgsl`: f16 results.
    F16,
    /// `kernels_f64.wgsl`: f64 sums, only where the adapter offers `SHADER_F64`.
    F64,
}

/// Each kernel's entry point and module.
const KERNELS: [(Kernel, &str, Module); 26] = [
    (Kernel::Binary, "binary", Module::Plain),
    (Kernel::Scale, "scale", Module::Plain),
    (Kernel::Silu, "silu", Module::Plain),
    (Kernel::Cpy, "cpy", Module::Plain),
    (Kernel::GetRows, "get_rows", Module::Plain),
    (Kernel::RmsNorm, "rms_norm", Module::Plain),
    (Kernel::SoftMax, "soft_max", Module::Plain),
    (Kernel::MulMat, "mul_mat", Module::Plain),
    (Kernel::CpyF16, "cpy_f16", Module::F16),
    (Kernel::Swiglu, "swiglu", Module::Plain),
    (Kernel::Gelu, "gelu", Module::Plain),
    (Kernel::DiagMaskInf, "diag_mask_inf", Module::Plain),
    (Kernel::Norm, "norm", Module::Plain),
    (Kernel::Rope, "rope", Module::Plain),
    (Kernel::SetRows, "set_rows", Module::Plain),
    (Kernel::Concat, "concat", Module::Plain),
    (Kernel::Argmax, "argmax", Module::Plain),
    (Kernel::SetRowsF16, "set_rows_f16", Module::F16),
    (Kernel::QuantizeQ8, "quantize_q8", Module::Plain),
    (Kernel::MulMatQ8, "mul_mat_q8", Module::Plain),
    (Kernel::RmsNormF64, "rms_norm_f64", Module::F64),
    (Kernel::SoftMaxF64, "soft_max_f64", Module::F64),
    (Kernel::MulMvQ8, "mul_mv_q8", Module::Plain),
    (Kernel::MulMv, "mul_mv", Module::Plain),
    (Kernel::RopeCache, "rope_cache", Module::Plain),
    (Kernel::RopeCacheF64, "rope_cache_f64", Module::F64),
];

/// Invocations per output of `mul_mv_q8` (ggml-cpu's 8 SIMD lanes of a Q8 dot product) and of
/// `mul_mv` (tinyBLAS's 16 lanes); their workgroups of [`WG`] hold whole outputs.
const MV_Q8_LANES: u64 = 8;
const MV_LANES: u64 = 16;

/// Bytes per 32-element block of quantized activations in the scratch buffer (`Q8_WORDS`
/// words in `common.wgsl`).
const Q8_BLOCK_BYTES: usize = 40;

/// Whether MUL_MAT with `dtype` weights quantizes its activations first, as ggml-cpu does (the
/// weights whose dot product with Q8 activations the kernels mirror).
fn quantizes_activations(dtype: DType) -> bool {
    matches!(dtype, DType::Q4_0 | DType::Q4_1 | DType::Q8_0)
}

/// A device-wide scratch buffer for intermediate results of a node (quantized activations),
/// grown on demand. Every node may reuse it from offset 0: wgpu orders the dispatches that use
/// one buffer, and all work of a device goes through its one queue.
#[derive(Default)]
pub(crate) struct Scratch {
    buffer: std::sync::Mutex<Option<wgpu::Buffer>>,
}

impl Scratch {
    /// A scratch buffer of at least `size` bytes.
    fn get(&self, device: &wgpu::Device, size: usize) -> wgpu::Buffer {
        let mut slot = self.buffer.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(b) = slot.as_ref() {
            if b.size() >= size as u64 {
                return b.clone();
            }
        }
        let old = slot.as_ref().map_or(0, |b| b.size());
        // Doubling keeps a graph of growing nodes from allocating once per node; the old
        // buffer lives on while queued work still uses it (wgpu counts references).
        let size = (size as u64)
            .max(old.saturating_mul(2))
            .max(4)
            .next_multiple_of(4);
        let b = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("rgml scratch"),
            size,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        *slot = Some(b.clone());
        b
    }
}

/// The kernels' code for an element type (`T_*` in `kernels.wgsl`), if they read it.
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
    /// By [`Kernel`]; `None` for the f64 kernels where the device has no f64.
    pipelines: Vec<Option<wgpu::ComputePipeline>>,
    /// The f64 kernels exist.
    pub(crate) f64: bool,
}

impl Kernels {
    /// Compile every kernel (errors surface through the device's error slot); `hw_fma`: the
    /// device's `fma` rounds once (see [`probe_fused_fma`]).
    pub(crate) fn new(device: &wgpu::Device, hw_fma: bool) -> Kernels {
        let f64 = device.features().contains(wgpu::Features::SHADER_F64);
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
        let wide = f64.then(|| module("rgml f64 kernels", include_str!("kernels_f64.wgsl")));
        let pipelines = KERNELS
            .iter()
            .map(|(_, entry, m)| {
                let module = match m {
                    Module::Plain => &plain,
                    Module::F16 => &f16,
                    Module::F64 => wide.as_ref()?,
                };
                Some(
                    device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                        label: Some(entry),
                        layout: Some(&pipeline_layout),
                        module,
                        entry_point: Some(entry),
                        compilation_options: wgpu::PipelineCompilationOptions {
                            constants: &[("HW_FMA", if hw_fma { 1.0 } else { 0.0 })],
                            ..Default::default()
                        },
                        cache: None,
                    }),
                )
            })
            .collect();
        Kernels {
            layout,
            pipelines,
            f64,
        }
    }

    /// The kernel's pipeline (`None` only for f64 kernels on a device without f64, which
    /// [`Prep::prepare`] never picks).
    pub(crate) fn pipeline(&self, kernel: Kernel) -> Option<&wgpu::ComputePipeline> {
        // `pipelines` is built from KERNELS, whose order is the enum's.
        self.pipelines.get(kernel as usize)?.as_ref()
    }
}

/// Whether the device's WGSL `fma` rounds once, as IEEE's fused multiply-add does (WGSL leaves
/// it to the implementation: lavapipe, for one, rounds the product first). Computes
/// `(1 + 2^-23)(1 - 2^-23) - 1` from a buffer, so no compiler can fold it: fused, that is
/// `-2^-46`; rounded twice, 0. Any failure answers no (the integer path is exact everywhere,
/// only slower). Not called with [`crate::WgpuOptions::soft_fma`], which takes the integer path
/// on any device (for testing it).
pub(crate) fn probe_fused_fma(device: &wgpu::Device, queue: &wgpu::Queue) -> bool {
    use wgpu::util::DeviceExt;
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("rgml fma probe"),
        source: wgpu::ShaderSource::Wgsl(
            "@group(0) @binding(0) var<storage, read_write> v: array<f32>;\n\
             @compute @workgroup_size(1) fn main() { v[3] = fma(v[0], v[1], v[2]); }"
                .into(),
        ),
    });
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some("rgml fma probe"),
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
    let input = [1.0 + f32::EPSILON, 1.0 - f32::EPSILON, -1.0, 0.0];
    let data = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: Some("rgml fma probe"),
        contents: bytemuck::cast_slice(&input),
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
    });
    let read = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("rgml fma probe read-back"),
        size: 16,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let bind = device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &pipeline.get_bind_group_layout(0),
        entries: &[wgpu::BindGroupEntry {
            binding: 0,
            resource: data.as_entire_binding(),
        }],
    });
    let mut encoder = device.create_command_encoder(&Default::default());
    {
        let mut pass = encoder.begin_compute_pass(&Default::default());
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bind, &[]);
        pass.dispatch_workgroups(1, 1, 1);
    }
    encoder.copy_buffer_to_buffer(&data, 0, &read, 0, 16);
    queue.submit([encoder.finish()]);
    let (tx, rx) = std::sync::mpsc::channel();
    read.map_async(wgpu::MapMode::Read, .., move |r| {
        let _ = tx.send(r);
    });
    if device.poll(wgpu::PollType::wait_indefinitely()).is_err() {
        return false;
    }
    if !matches!(rx.recv(), Ok(Ok(()))) {
        return false;
    }
    let fused = match read.get_mapped_range(..) {
        Ok(view) => {
            let out: &[f32] = bytemuck::cast_slice(&view);
            out[3] != 0.0
        }
        Err(_) => false,
    };
    read.unmap();
    fused
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
            mscale *= 1.0 + 0.1 * (1.0 / rp.freq_scale).ln();
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

/// What a ROPE table depends on: the positions tensor, how many positions, the rotated dims
/// and the op's parameters.
type RopeTableKey = (TensorId, usize, usize, RopeParams);

/// A ROPE table made for the graph being prepared, and the bytes of its positions (buffer,
/// byte range): a node that writes there afterwards makes it stale.
struct RopeTable {
    key: RopeTableKey,
    table: wgpu::Buffer,
    positions: (wgpu::Buffer, std::ops::Range<usize>),
}

/// Prepares one graph's nodes for dispatch on `gpu` (`device`: the device name, for errors).
/// Preparation reads tensor metadata only, never values: what it makes stays valid while the
/// context's metadata does (a graph plan).
pub(crate) struct Prep<'a> {
    pub(crate) gpu: &'a Gpu,
    pub(crate) device: &'a str,
    /// ROPE tables made for this graph: every layer rotates at the same positions, so the first
    /// ROPE fills the table and the later ones read it.
    rope_tables: Vec<RopeTable>,
}

impl<'a> Prep<'a> {
    pub(crate) fn new(gpu: &'a Gpu, device: &'a str) -> Prep<'a> {
        Prep {
            gpu,
            device,
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

    /// Drop the ROPE tables whose positions node `t` overwrites: a later ROPE at those
    /// positions must fill its table again, after `t`.
    fn forget_overwritten_tables(&mut self, t: &Tensor) {
        let Some(data) = t.data.as_ref() else {
            return;
        };
        let Some(buf) = data.buffer.imp().downcast_ref::<WgpuBuffer>() else {
            return;
        };
        let written = data.offset..data.offset + t.nbytes();
        self.rope_tables.retain(|rt| {
            let (b, range) = &rt.positions;
            *b != buf.buffer || range.end <= written.start || written.end <= range.start
        });
    }

    fn prepare_node(&mut self, ctx: &Context, id: TensorId) -> Result<Vec<Dispatch>> {
        let t = ctx.get(id)?;
        if t.op.kind().is_view() || t.nelements() == 0 {
            return Ok(Vec::new());
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
            Op::Rope(rp) => return self.rope(p, buffers, t, &srcs, &rp, rows),
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
                if self.gpu.kernels.f64 {
                    (Kernel::RmsNormF64, rows)
                } else {
                    (Kernel::RmsNorm, rows)
                }
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
                if self.gpu.kernels.f64 {
                    (Kernel::SoftMaxF64, rows)
                } else {
                    (Kernel::SoftMax, rows)
                }
            }
            Op::MulMat => {
                p.misc[1] = p.b_ne[2] / p.a_ne[2].max(1);
                p.misc[2] = p.b_ne[3] / p.a_ne[3].max(1);
                p.misc[3] = type_code(srcs[0].dtype).unwrap_or(0);
                // One activation column (generation): lanes of one output run side by side.
                let vector = srcs[1].ne[1] == 1;
                if quantizes_activations(srcs[0].dtype) {
                    return self.mul_mat_q8(p, buffers, srcs[1], elements, vector);
                }
                if vector {
                    (Kernel::MulMv, elements * MV_LANES)
                } else {
                    (Kernel::MulMat, elements)
                }
            }
            _ => {
                return Err(Error::Unsupported {
                    backend: self.device.to_string(),
                    what: format!("{}", t.op.kind()),
                })
            }
        };
        self.dispatch(kernel, p, buffers, threads).map(|d| vec![d])
    }

    /// ROPE: the (cos, sin) table of its positions, filled by a `rope_cache` dispatch unless
    /// an earlier ROPE of the graph filled it for the same positions and parameters, then the
    /// rotation, which reads the table through binding C.
    fn rope(
        &mut self,
        mut p: Params,
        mut buffers: [wgpu::Buffer; 4],
        t: &Tensor,
        srcs: &[&Tensor],
        rp: &RopeParams,
        rows: u64,
    ) -> Result<Vec<Dispatch>> {
        let (Some(&pos_id), Some(&pos)) = (t.src.get(1), srcs.get(1)) else {
            return Err(self.err("ROPE without positions"));
        };
        let setup = RopeSetup::new(rp, t.ne[0]);
        let mut out = Vec::with_capacity(2);
        if setup.n_dims > 0 {
            let key = (pos_id, t.ne[2], setup.n_dims, *rp);
            let (table, fill) = self.rope_table(key, pos, &setup, rp)?;
            out.extend(fill);
            buffers[2] = table;
            p.off[2] = 0;
        }
        p.misc[1] = setup.n_dims as u32;
        p.misc[2] = u32::from(rp.mode == RopeMode::Neox);
        out.push(self.dispatch(Kernel::Rope, p, buffers, rows)?);
        Ok(out)
    }

    /// The table for `key` (positions, their count, rotated dims, parameters) and, when this
    /// graph has not filled it yet, the dispatch that does: (cos θ · mscale, sin θ · mscale)
    /// for every position and pair, computed on the GPU from the positions as they are when
    /// the graph runs. Where the device has f64 the kernel computes cos / sin as the CPU's libm
    /// does (`rope_cache_f64`), bit for bit; elsewhere with the device's own.
    fn rope_table(
        &mut self,
        key: RopeTableKey,
        pos: &Tensor,
        setup: &RopeSetup,
        rp: &RopeParams,
    ) -> Result<(wgpu::Buffer, Option<Dispatch>)> {
        if let Some(rt) = self.rope_tables.iter().find(|rt| rt.key == key) {
            return Ok((rt.table.clone(), None));
        }
        let (_, n_pos, n_dims, _) = key;
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
        let kernel = if self.gpu.kernels.f64 {
            Kernel::RopeCacheF64
        } else {
            Kernel::RopeCache
        };
        let bufs = [table.clone(), pos_buf.clone(), table.clone(), table.clone()];
        let fill = self.dispatch(kernel, q, bufs, (n_pos * n_dims / 2) as u64)?;
        let start = pos.data.as_ref().map_or(0, |d| d.offset);
        self.rope_tables.push(RopeTable {
            key,
            table: table.clone(),
            positions: (pos_buf, start..start + pos.nbytes()),
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
