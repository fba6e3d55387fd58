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
use crate::kernels::{Kernel, Params, MAX_GROUPS, PARAM_STRIDE, WG};
use crate::ops::{Dispatch, Prep};
use rgml::graph::Graph;
use rgml::op::OpKind;
use rgml::{Context, Result};
use std::ops::Range;
use std::sync::Arc;

/// One dispatch ready to encode.
struct Step {
    pipeline: wgpu::ComputePipeline,
    bind_group: wgpu::BindGroup,
    /// Workgroups in x and y.
    groups: [u32; 2],
    /// The node's op and the kernel, for trace spans ([`Prepared::label`]).
    op: OpKind,
    kernel: Kernel,
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
        let mut ops = Vec::new();
        let nodes = graph.nodes();
        // Nodes fused into the dispatches of one before them (`Prep::prepare_fused`).
        let mut absorbed: Vec<rgml::TensorId> = Vec::new();
        for (n, &id) in nodes.iter().enumerate() {
            if let Some(i) = absorbed.iter().position(|&a| a == id) {
                absorbed.swap_remove(i);
                continue;
            }
            let op = ctx.get(id)?.op.kind();
            let upcoming = next_computing(ctx, &nodes[n + 1..], 2)?;
            let prepared = match prep.prepare_fused(ctx, id, &upcoming)? {
                Some((d, covered)) => {
                    absorbed.extend_from_slice(&upcoming[..covered]);
                    d
                }
                None => prep.prepare(ctx, id)?,
            };
            for d in prepared {
                ops.push(op);
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
            .zip(ops)
            .map(|((i, d), op)| step(gpu, &uniforms, i, d, op))
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

    /// The trace label of step `i`: its node's op and its kernel (`MUL_MAT Fast(MulMv, 5)`).
    pub(crate) fn label(&self, i: usize) -> String {
        self.steps
            .get(i)
            .map_or_else(String::new, |s| format!("{} {:?}", s.op, s.kernel))
    }

    /// Encode steps `range` into one command buffer, all in one compute pass: wgpu tracks
    /// the buffers each dispatch uses and places the barriers between dispatches itself, so a
    /// pass per dispatch (begin / end recorded hundreds of times per token) buys nothing.
    /// With `times` (made for this range), a timestamp goes before the first dispatch and
    /// after each one, and the command buffer ends by copying them where
    /// [`DispatchTimes::read`] finds them.
    pub(crate) fn encode(
        &self,
        range: Range<usize>,
        times: Option<&DispatchTimes>,
    ) -> wgpu::CommandBuffer {
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
            let timed = times.map_or(0, |t| t.timed_steps());
            if let Some(t) = times.filter(|_| timed > 0) {
                pass.write_timestamp(&t.queries, 0);
            }
            for (k, step) in self.steps.get(range).unwrap_or_default().iter().enumerate() {
                pass.set_pipeline(&step.pipeline);
                pass.set_bind_group(0, &step.bind_group, &[]);
                pass.dispatch_workgroups(step.groups[0], step.groups[1], 1);
                if let Some(t) = times.filter(|_| k < timed) {
                    pass.write_timestamp(&t.queries, k as u32 + 1);
                }
            }
        }
        if let Some(t) = times {
            t.copy_out(&mut encoder);
        }
        encoder.finish()
    }
}

/// GPU timestamps around the dispatches of one command buffer (for `--trace` on adapters with
/// `TIMESTAMP_QUERY_INSIDE_PASSES`): timestamp 0 before the first dispatch, timestamp k + 1
/// after dispatch k, so a dispatch's time includes the barrier before it. At most
/// `QUERY_SET_MAX_QUERIES - 1` dispatches of a command buffer are timed.
pub(crate) struct DispatchTimes {
    queries: wgpu::QuerySet,
    resolved: wgpu::Buffer,
    readback: wgpu::Buffer,
    count: u32,
    /// The plan's steps this command buffer runs.
    pub(crate) steps: Range<usize>,
}

impl DispatchTimes {
    /// Timestamps for the command buffer of `steps`.
    pub(crate) fn new(gpu: &Gpu, steps: Range<usize>) -> DispatchTimes {
        let count = (steps.len() as u32 + 1).min(wgpu::QUERY_SET_MAX_QUERIES);
        let bytes = u64::from(count) * wgpu::QUERY_SIZE as u64;
        let queries = gpu.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("rgml dispatch times"),
            ty: wgpu::QueryType::Timestamp,
            count,
        });
        let buffer = |usage| {
            gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("rgml dispatch times"),
                size: bytes,
                usage,
                mapped_at_creation: false,
            })
        };
        DispatchTimes {
            queries,
            resolved: buffer(wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC),
            readback: buffer(wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST),
            count,
            steps,
        }
    }

    fn timed_steps(&self) -> usize {
        self.count.saturating_sub(1) as usize
    }

    fn copy_out(&self, encoder: &mut wgpu::CommandEncoder) {
        encoder.resolve_query_set(&self.queries, 0..self.count, &self.resolved, 0);
        let bytes = u64::from(self.count) * wgpu::QUERY_SIZE as u64;
        encoder.copy_buffer_to_buffer(&self.resolved, 0, &self.readback, 0, bytes);
    }

    /// After the command buffer completed: each timed dispatch's start (on the GPU's clock)
    /// and duration, in nanoseconds.
    pub(crate) fn read(&self, gpu: &Gpu) -> Result<Vec<(f64, f64)>> {
        let ticks: Vec<u64> = gpu.read_mapped(
            &self.readback,
            "dispatch times",
            bytemuck::pod_collect_to_vec,
        )?;
        let period = f64::from(gpu.queue.get_timestamp_period());
        Ok(ticks
            .windows(2)
            .map(|w| {
                (
                    w[0] as f64 * period,
                    w[1].saturating_sub(w[0]) as f64 * period,
                )
            })
            .collect())
    }
}

/// The first `n` of `nodes` that compute something (views do not), in order.
fn next_computing(
    ctx: &Context,
    nodes: &[rgml::TensorId],
    n: usize,
) -> Result<Vec<rgml::TensorId>> {
    let mut found = Vec::with_capacity(n);
    for &id in nodes {
        if found.len() == n {
            break;
        }
        if !ctx.get(id)?.op.kind().is_view() {
            found.push(id);
        }
    }
    Ok(found)
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
fn step(gpu: &Gpu, uniforms: &wgpu::Buffer, i: usize, d: &Dispatch, op: OpKind) -> Result<Step> {
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
        op,
        kernel: d.kernel,
    })
}
