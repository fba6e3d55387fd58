//! The backend (stream): encodes a graph's nodes into one command encoder, one compute pass per
//! node, and submits once; plus the kernels' pipelines and the exact support check.

use crate::device::{Gpu, WgpuBuffer, WgpuDevice};
use rgml::backend::Backend;
use rgml::graph::Graph;
use rgml::{Context, DType, DeviceRef, Error, Op, Result, Tensor, TensorId, UnaryOp};
use std::any::Any;
use std::sync::Arc;

/// Invocations per workgroup (the kernels' `@workgroup_size`).
const WG: u64 = 64;
/// Bytes per node in the uniform buffer (a multiple of every adapter's uniform offset alignment).
const PARAM_STRIDE: u64 = 256;
/// Most workgroups in one dispatch dimension (the WebGPU default limit).
const MAX_GROUPS: u64 = 65535;

/// The uniform block every kernel reads (`struct P` in `kernels.wgsl`).
#[repr(C)]
#[derive(Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
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
}

/// The kernels of `kernels.wgsl`.
#[derive(Clone, Copy)]
enum Kernel {
    Binary,
    Scale,
    Silu,
    Cpy,
    GetRows,
    RmsNorm,
    SoftMax,
    MulMat,
}

const KERNELS: [(Kernel, &str); 8] = [
    (Kernel::Binary, "binary"),
    (Kernel::Scale, "scale"),
    (Kernel::Silu, "silu"),
    (Kernel::Cpy, "cpy"),
    (Kernel::GetRows, "get_rows"),
    (Kernel::RmsNorm, "rms_norm"),
    (Kernel::SoftMax, "soft_max"),
    (Kernel::MulMat, "mul_mat"),
];

/// The compiled kernels and their shared bind group layout.
pub(crate) struct Kernels {
    layout: wgpu::BindGroupLayout,
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
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("rgml kernels"),
            source: wgpu::ShaderSource::Wgsl(include_str!("kernels.wgsl").into()),
        });
        let pipelines = KERNELS
            .iter()
            .map(|(_, entry)| {
                device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some(entry),
                    layout: Some(&pipeline_layout),
                    module: &module,
                    entry_point: Some(entry),
                    compilation_options: Default::default(),
                    cache: None,
                })
            })
            .collect();
        Kernels { layout, pipelines }
    }

    fn pipeline(&self, kernel: Kernel) -> &wgpu::ComputePipeline {
        // `pipelines` is built from KERNELS, whose order is the enum's.
        &self.pipelines[kernel as usize]
    }
}

/// Whether `t`'s shape and strides fit the kernels' u32 element arithmetic.
fn fits(t: &Tensor) -> bool {
    t.nb.iter().all(|&b| b.is_multiple_of(4))
        && t.ne.iter().all(|&n| n <= u32::MAX as usize)
        && t.nelements() <= u32::MAX as usize
        && t.nbytes() / 4 <= u32::MAX as usize
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
    if t.dtype != DType::F32 || !fits(t) {
        return false;
    }
    match (t.op, srcs.as_slice()) {
        (Op::Add | Op::Sub | Op::Mul | Op::Div, [a, b]) => f32s(&[a, b]) && a.ne == t.ne,
        (Op::Scale { .. } | Op::Unary(UnaryOp::Silu) | Op::RmsNorm { .. }, [a]) => {
            f32s(&[a]) && a.ne == t.ne
        }
        (Op::Cpy, [a, b]) => f32s(&[a, b]) && a.nelements() == t.nelements(),
        (Op::Dup | Op::Cont, [a]) => f32s(&[a]) && a.nelements() == t.nelements(),
        (Op::GetRows, [a, rows]) => f32s(&[a]) && rows.dtype == DType::I32 && fits(rows),
        (Op::SoftMax { max_bias: 0.0, .. }, srcs) => match srcs {
            [a] => f32s(&[a]) && a.ne == t.ne,
            [a, mask] => f32s(&[a, mask]) && a.ne == t.ne,
            _ => false,
        },
        (Op::MulMat, [a, b]) => {
            f32s(&[a, b])
                && a.ne[2] > 0
                && a.ne[3] > 0
                && b.ne[2] % a.ne[2] == 0
                && b.ne[3] % a.ne[3] == 0
        }
        _ => false,
    }
}

/// A stream on a wgpu device.
pub struct WgpuBackend {
    device: Arc<WgpuDevice>,
    gpu: Arc<Gpu>,
}

impl WgpuBackend {
    pub(crate) fn new(device: Arc<WgpuDevice>, gpu: Arc<Gpu>) -> WgpuBackend {
        WgpuBackend { device, gpu }
    }
}

fn dims(ne: [usize; 4]) -> [u32; 4] {
    // `supports_op` checked that every dimension fits.
    ne.map(|n| n as u32)
}

fn strides(nb: [usize; 4]) -> [u32; 4] {
    nb.map(|b| (b / 4) as u32)
}

/// One node ready to encode: its kernel, parameters, bound buffers (A, B, C, D) and threads.
struct Dispatch {
    kernel: Kernel,
    params: Params,
    buffers: [wgpu::Buffer; 4],
    threads: u64,
}

impl WgpuBackend {
    fn err(&self, message: impl Into<String>) -> Error {
        self.gpu.err(message)
    }

    /// The wgpu buffer and element offset of `t`'s storage.
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
        if !data.offset.is_multiple_of(4) {
            return Err(self.err(format!(
                "tensor '{}' is at an offset not aligned to 4 bytes",
                t.display_name()
            )));
        }
        let off = u32::try_from(data.offset / 4)
            .map_err(|_| self.err(format!("tensor '{}' offset too large", t.display_name())))?;
        Ok((buf.buffer.clone(), off))
    }

    fn prepare(&self, ctx: &Context, id: TensorId) -> Result<Option<Dispatch>> {
        let t = ctx.get(id)?;
        if t.op.kind().is_view() || t.nelements() == 0 {
            return Ok(None);
        }
        if !supports_op(ctx, id) {
            return Err(Error::Unsupported {
                backend: self.device.name_str().to_string(),
                what: format!("{} of {} ('{}')", t.op.kind(), t.dtype, t.display_name()),
            });
        }
        let srcs: Vec<&Tensor> = t.src.iter().map(|&s| ctx.get(s)).collect::<Result<_>>()?;
        let (d_buf, d_off) = self.storage(t)?;
        let mut p = Params {
            d_ne: dims(t.ne),
            d_nb: strides(t.nb),
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
            *nb = strides(s.nb);
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
            Op::Cpy | Op::Dup | Op::Cont => (Kernel::Cpy, elements),
            Op::GetRows => (Kernel::GetRows, elements),
            Op::RmsNorm { eps } => {
                p.f[0] = eps;
                (Kernel::RmsNorm, rows)
            }
            Op::SoftMax { scale, .. } => {
                p.f[0] = scale;
                if srcs.len() > 1 {
                    p.misc[1] = 1;
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
                (Kernel::MulMat, elements)
            }
            _ => {
                return Err(Error::Unsupported {
                    backend: self.device.name_str().to_string(),
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

impl Backend for WgpuBackend {
    fn name(&self) -> &str {
        self.device.name_str()
    }

    fn device(&self) -> DeviceRef {
        self.device.clone()
    }

    fn synchronize(&mut self) -> Result<()> {
        self.gpu.wait()
    }

    fn graph_compute(&mut self, ctx: &Context, graph: &Graph) -> Result<()> {
        let mut dispatches = Vec::new();
        for &id in graph.nodes() {
            if let Some(d) = self.prepare(ctx, id)? {
                dispatches.push(d);
            }
        }
        if dispatches.is_empty() {
            return Ok(());
        }
        let gpu = &self.gpu;
        let mut uniform_bytes = vec![0u8; dispatches.len() * PARAM_STRIDE as usize];
        for (i, d) in dispatches.iter().enumerate() {
            let at = i * PARAM_STRIDE as usize;
            uniform_bytes[at..at + std::mem::size_of::<Params>()]
                .copy_from_slice(bytemuck::bytes_of(&d.params));
        }
        let uniforms = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("rgml node params"),
            size: uniform_bytes.len() as u64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        gpu.queue.write_buffer(&uniforms, 0, &uniform_bytes);
        let mut encoder = gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("rgml graph"),
            });
        for (i, d) in dispatches.iter().enumerate() {
            let param_size = std::num::NonZeroU64::new(std::mem::size_of::<Params>() as u64);
            let mut entries = vec![wgpu::BindGroupEntry {
                binding: 0,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: &uniforms,
                    offset: i as u64 * PARAM_STRIDE,
                    size: param_size,
                }),
            }];
            for (j, b) in d.buffers.iter().enumerate() {
                entries.push(wgpu::BindGroupEntry {
                    binding: j as u32 + 1,
                    resource: b.as_entire_binding(),
                });
            }
            let bind_group = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: None,
                layout: &gpu.kernels.layout,
                entries: &entries,
            });
            let groups = d.threads.div_ceil(WG).max(1);
            let x = groups.min(MAX_GROUPS);
            let y = groups.div_ceil(x);
            if y > MAX_GROUPS {
                return Err(self.err("graph node too large for one dispatch"));
            }
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: None,
                timestamp_writes: None,
            });
            pass.set_pipeline(gpu.kernels.pipeline(d.kernel));
            pass.set_bind_group(0, &bind_group, &[]);
            pass.dispatch_workgroups(x as u32, y as u32, 1);
        }
        gpu.submit(encoder)?;
        gpu.wait()?;
        uniforms.destroy();
        Ok(())
    }

    fn supports_op(&self, ctx: &Context, id: TensorId) -> bool {
        supports_op(ctx, id)
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}
