//! A graph prepared for the GPU: what a wgpu [`rgml::backend::GraphPlan`] holds.
//!
//! This module owns turning a graph's dispatches ([`Prep`]) into steps ready to encode (the
//! kernel's pipeline, a bind group of the parameters' slot and the four tensor buffers, the
//! workgroup counts) and the uniform buffer holding every step's parameters, written once
//! when the plan is made. Computing a plan again only encodes its steps into command buffers
//! (wgpu's command buffers are single-use) and submits them: no preparation, no allocation of
//! GPU objects, no read-back. The stream (`backend.rs`) decides when a plan applies.
//!
//! Nothing here depends on tensor values: ROPE's cos / sin tables are filled by a dispatch of
//! the plan from the positions as they are when it runs (see [`Prep`]), so new inputs set
//! with `tensor_set` need no new plan. Bind groups hold wgpu handles, not [`rgml::Buffer`]s:
//! a stale plan kept by the stream does not keep device memory alive (a dropped
//! `WgpuBuffer` destroys its wgpu buffer; a plan is only computed while its
//! context, which holds those buffers, is unchanged).

use crate::gpu::Gpu;
use crate::kernels::{Params, MAX_GROUPS, PARAM_STRIDE, WG};
use crate::ops::{Dispatch, Prep};
use rgml::graph::Graph;
use rgml::{Context, Result};
use std::ops::Range;
use std::sync::Arc;

/// One dispatch ready to encode.
struct Step {
    pipeline: wgpu::ComputePipeline,
    bind_group: wgpu::BindGroup,
    /// Workgroups in x and y.
    groups: [u32; 2],
}

/// A graph of one context made ready for one wgpu device.
pub(crate) struct Prepared {
    /// The device the pipelines, bind groups and buffers belong to.
    pub(crate) gpu: Arc<Gpu>,
    /// Made with the exact arithmetic's kernels (else the fast ones).
    pub(crate) exact: bool,
    steps: Vec<Step>,
    /// The graph node each step comes from (for trace spans).
    node_of: Vec<usize>,
    n_nodes: usize,
    /// The steps' parameters (bound by their bind groups; kept here to say who owns it).
    _uniforms: Option<wgpu::Buffer>,
}

impl Prepared {
    /// Prepare every node of `graph` for `gpu` in the exact or the fast arithmetic (`device`:
    /// the device name, for errors).
    pub(crate) fn new(
        gpu: &Arc<Gpu>,
        device: &str,
        exact: bool,
        ctx: &Context,
        graph: &Graph,
    ) -> Result<Prepared> {
        let mut prep = Prep::new(gpu, device, exact);
        let mut dispatches = Vec::new();
        let mut node_of = Vec::new();
        for (n, &id) in graph.nodes().iter().enumerate() {
            for d in prep.prepare(ctx, id)? {
                dispatches.push(d);
                node_of.push(n);
            }
        }
        if dispatches.is_empty() {
            return Ok(Prepared {
                gpu: gpu.clone(),
                exact,
                steps: Vec::new(),
                node_of,
                n_nodes: graph.n_nodes(),
                _uniforms: None,
            });
        }
        let uniforms = uniform_buffer(gpu, &dispatches);
        let steps = dispatches
            .iter()
            .enumerate()
            .map(|(i, d)| step(gpu, &uniforms, i, d))
            .collect::<Result<Vec<Step>>>()?;
        // Errors wgpu reported while making the bind groups and the uniform buffer.
        gpu.check()?;
        Ok(Prepared {
            gpu: gpu.clone(),
            exact,
            steps,
            node_of,
            n_nodes: graph.n_nodes(),
            _uniforms: Some(uniforms),
        })
    }

    /// How many dispatches the plan runs.
    pub(crate) fn len(&self) -> usize {
        self.steps.len()
    }

    /// The graph nodes that steps `range` (range `k` of the graph's command buffers) cover:
    /// from the range's first step's node (node 0 for the first range, so views before it ride
    /// along) to the next range's.
    pub(crate) fn nodes_of(&self, k: usize, range: &Range<usize>) -> Range<usize> {
        let first = if k == 0 {
            0
        } else {
            self.node_of
                .get(range.start)
                .copied()
                .unwrap_or(self.n_nodes)
        };
        let end = self.node_of.get(range.end).copied().unwrap_or(self.n_nodes);
        first..end.max(first)
    }

    /// Encode steps `range` into one command buffer, all in one compute pass: wgpu tracks
    /// the buffers each dispatch uses and places the barriers between dispatches itself, so a
    /// pass per dispatch (begin / end recorded hundreds of times per token) buys nothing.
    pub(crate) fn encode(&self, range: Range<usize>) -> wgpu::CommandBuffer {
        let mut encoder = self
            .gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("rgml graph"),
            });
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: None,
                timestamp_writes: None,
            });
            for step in self.steps.get(range).unwrap_or_default() {
                pass.set_pipeline(&step.pipeline);
                pass.set_bind_group(0, &step.bind_group, &[]);
                pass.dispatch_workgroups(step.groups[0], step.groups[1], 1);
            }
        }
        encoder.finish()
    }
}

/// A uniform buffer holding every dispatch's parameters, `PARAM_STRIDE` bytes apart (a
/// multiple of every adapter's uniform offset alignment).
fn uniform_buffer(gpu: &Gpu, dispatches: &[Dispatch]) -> wgpu::Buffer {
    let mut bytes = vec![0u8; dispatches.len() * PARAM_STRIDE as usize];
    for (i, d) in dispatches.iter().enumerate() {
        let at = i * PARAM_STRIDE as usize;
        bytes[at..at + std::mem::size_of::<Params>()]
            .copy_from_slice(bytemuck::bytes_of(&d.params));
    }
    let uniforms = gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("rgml node params"),
        size: bytes.len() as u64,
        usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    // Queued now, so it lands before the plan's first submit (the queue orders them).
    gpu.queue.write_buffer(&uniforms, 0, &bytes);
    uniforms
}

/// Dispatch `i` of a plan as a step: its pipeline, its bind group (parameter slot `i` of
/// `uniforms`, then buffers A, B, C, D) and its workgroups.
fn step(gpu: &Gpu, uniforms: &wgpu::Buffer, i: usize, d: &Dispatch) -> Result<Step> {
    let param_size = std::num::NonZeroU64::new(std::mem::size_of::<Params>() as u64);
    let mut entries = Vec::with_capacity(5);
    entries.push(wgpu::BindGroupEntry {
        binding: 0,
        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer: uniforms,
            offset: i as u64 * PARAM_STRIDE,
            size: param_size,
        }),
    });
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
        return Err(gpu.err("graph node too large for one dispatch"));
    }
    let pipeline = gpu
        .kernels
        .pipeline(d.kernel)
        .ok_or_else(|| gpu.err("kernel not compiled for this device"))?;
    Ok(Step {
        pipeline,
        bind_group,
        groups: [x as u32, y as u32],
    })
}
