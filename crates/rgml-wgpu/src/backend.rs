//! The backend (stream): encodes a graph's nodes into one command encoder, one compute pass per
//! node, and submits once.

use crate::device::{Gpu, WgpuDevice};
use crate::ops::{Params, Prep, MAX_GROUPS, PARAM_STRIDE, WG};
use rgml::backend::Backend;
use rgml::graph::Graph;
use rgml::{Context, DeviceRef, Result, TensorId};
use std::any::Any;
use std::sync::Arc;

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
        let prep = Prep::new(&self.gpu, self.device.name_str());
        let mut dispatches = Vec::new();
        for &id in graph.nodes() {
            dispatches.extend(prep.prepare(ctx, id)?);
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
                return Err(self.gpu.err("graph node too large for one dispatch"));
            }
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: None,
                timestamp_writes: None,
            });
            let pipeline = gpu
                .kernels
                .pipeline(d.kernel)
                .ok_or_else(|| gpu.err("kernel not compiled for this device"))?;
            pass.set_pipeline(pipeline);
            pass.set_bind_group(0, &bind_group, &[]);
            pass.dispatch_workgroups(x as u32, y as u32, 1);
        }
        gpu.submit(encoder)?;
        gpu.wait()?;
        uniforms.destroy();
        Ok(())
    }

    fn supports_op(&self, ctx: &Context, id: TensorId) -> bool {
        crate::ops::supports_op(ctx, id)
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}
