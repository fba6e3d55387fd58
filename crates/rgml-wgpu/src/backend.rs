//! The backend (stream) and its events: encoding a graph into `n_cb` command buffers,
//! asynchronous compute, set / get / copy on the device's queue, events from queue
//! submissions, and trace spans for command buffers and copies.
//!
//! # Command buffers
//! A graph's dispatches (nodes that compute something) are split into `n_cb` contiguous ranges
//! of about equal size (ggml-metal's `n_cb`), each encoded into its own command encoder (one
//! compute pass per node), and all of them are submitted with one `queue.submit`, in order.
//! With several ranges of at least 32 dispatches each, the ranges are encoded on scoped
//! threads (Metal's n_cb), else one after another.
//!
//! The default is `n_cb=2`; `Vulkan0:n_cb=N` sets it. Measured on lavapipe (2 shared CPU
//! cores, `bench_n_cb` in `tests/stream.rs`, 300-node graphs): encoding a graph takes about
//! 2.2 ms sequentially whatever `n_cb`, and about 1.4–1.6 ms on 2–4 threads; a graph of tiny
//! nodes (where encoding is ~13% of the time) took ~18.6 ms with `n_cb=1` and ~15.4 ms with
//! `n_cb=2`, while matmul-heavy graphs (~160 ms, encoding ~1%) showed no difference beyond
//! the ±10% noise. More command buffers did not help further: the GPU cannot start before
//! the one submit, and each command buffer adds a fixed cost.
//!
//! # Asynchrony
//! [`Backend::graph_compute_async`] submits and returns; [`Backend::synchronize`] waits for
//! the queue and reports wgpu errors (validation or device loss) of the work submitted since.
//! The uniform buffer holding the nodes' parameters is kept until then. Every stream of a
//! device shares the device's one queue, so work is ordered across streams of the device.
//!
//! # Barriers and concurrency
//! wgpu's resource tracker, not this backend, places barriers: inside a compute pass and
//! between passes it inserts a buffer barrier whenever a buffer changes usage or is used with an
//! exclusive usage again. On Vulkan only read-only ("inclusive") usages skip it, and the
//! kernels bind every tensor buffer as read-write storage, so two dispatches touching the same
//! buffer (which graph-allocated tensors always do: they share the compute buffer) are
//! serialized by a barrier whether or not they depend on each other. Skipping barriers between
//! independent nodes would need wgpu-hal's unsafe command encoding, which this crate does not
//! use. The backend therefore never overlaps nodes, and reports no concurrency plan to the
//! graph allocator by default; with `concurrency=1` it reports the greedy dependency levels of
//! [`Concurrency::from_dependencies`] (and encodes in that order, which is graph order since
//! the groups are contiguous), so the allocator keeps the memory of nodes of one level apart,
//! ready for an encoder that can drop those barriers.
//!
//! # Events
//! An event records the index of a queue submission (an empty submit after the work to
//! cover); waiting polls the device until that submission is done. Waiting on an event of the
//! same device is a no-op for a stream, since the one queue already orders everything.
//!
//! # Trace
//! With a recorder ([`Backend::set_trace`]) every command buffer gets a `"command_buffer"`
//! span (name `cb K nodes A..B`, args: nodes, dispatches) and every asynchronous set / get /
//! copy a `"copy"` span (args: bytes). Spans are host-side times: a command buffer's span runs
//! from the start of its encoding to the moment the host saw its submission complete (at the
//! next synchronize), so it covers encode, queue wait and execution; copy spans cover the call
//! (a set / copy only queues the transfer).

use crate::device::{Gpu, WgpuBuffer, WgpuDevice};
use crate::ops::{Dispatch, Params, Prep, MAX_GROUPS, PARAM_STRIDE, WG};
use rgml::alloc::Concurrency;
use rgml::backend::{Backend, Event, EventImpl};
use rgml::graph::Graph;
use rgml::trace::{Trace, TraceArg};
use rgml::{Context, DeviceRef, Error, Result, TensorId};
use std::any::Any;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Fewest dispatches per command buffer for which encoding on threads pays off.
const MIN_THREADED_RANGE: usize = 32;

/// wgpu's copy granularity (`COPY_BUFFER_ALIGNMENT`).
const COPY_ALIGN: usize = 4;

/// A command buffer submitted but not yet seen complete, for its trace span.
struct PendingSpan {
    name: String,
    start: Instant,
    nodes: u64,
    dispatches: u64,
}

/// A stream on a wgpu device.
pub struct WgpuBackend {
    device: Arc<WgpuDevice>,
    gpu: Arc<Gpu>,
    /// Command buffers per graph.
    n_cb: usize,
    /// Whether to report dependency levels to the graph allocator.
    concurrency: bool,
    /// Uniform buffers of submitted graphs, destroyed once a synchronize saw them complete.
    in_flight: Vec<wgpu::Buffer>,
    trace: Option<(Arc<Trace>, usize)>,
    pending_spans: Vec<PendingSpan>,
}

impl WgpuBackend {
    pub(crate) fn new(
        device: Arc<WgpuDevice>,
        gpu: Arc<Gpu>,
        n_cb: usize,
        concurrency: bool,
    ) -> WgpuBackend {
        WgpuBackend {
            device,
            gpu,
            n_cb: n_cb.max(1),
            concurrency,
            in_flight: Vec::new(),
            trace: None,
            pending_spans: Vec::new(),
        }
    }

    /// Command buffers per graph (the `n_cb` parameter).
    pub fn n_cb(&self) -> usize {
        self.n_cb
    }

    /// Set the number of command buffers per graph (at least 1).
    pub fn set_n_cb(&mut self, n_cb: usize) {
        self.n_cb = n_cb.max(1);
    }

    /// The device buffer behind tensor `id` and the tensor's byte offset in it, if the tensor
    /// lives in a buffer of this backend's device.
    fn device_buffer<'c>(
        &self,
        ctx: &'c Context,
        id: TensorId,
    ) -> Result<Option<(&'c WgpuBuffer, usize)>> {
        let t = ctx.get(id)?;
        let Some(data) = t.data.as_ref() else {
            return Ok(None);
        };
        Ok(data
            .buffer
            .imp()
            .downcast_ref::<WgpuBuffer>()
            .filter(|b| Arc::ptr_eq(&b.gpu, &self.gpu))
            .map(|b| (b, data.offset)))
    }

    fn copy_span(&self, name: String, start: Instant, bytes: usize) {
        if let Some((trace, track)) = &self.trace {
            trace.span(
                *track,
                name,
                "copy",
                start,
                Instant::now(),
                vec![("bytes".into(), TraceArg::Int(bytes as u64))],
            );
        }
    }

    /// Encode dispatches `range` of a graph into one command buffer.
    fn encode(
        &self,
        dispatches: &[Dispatch],
        range: std::ops::Range<usize>,
        uniforms: &wgpu::Buffer,
    ) -> Result<wgpu::CommandBuffer> {
        let gpu = &self.gpu;
        let mut encoder = gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("rgml graph"),
            });
        let param_size = std::num::NonZeroU64::new(std::mem::size_of::<Params>() as u64);
        for i in range {
            let d = &dispatches[i];
            let mut entries = vec![wgpu::BindGroupEntry {
                binding: 0,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: uniforms,
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
                return Err(gpu.err("graph node too large for one dispatch"));
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
        Ok(encoder.finish())
    }
}

/// `n` items in `parts` contiguous ranges of sizes differing by at most one (no empty range).
fn split_even(n: usize, parts: usize) -> Vec<std::ops::Range<usize>> {
    let parts = parts.clamp(1, n.max(1));
    (0..parts)
        .map(|k| (k * n / parts)..((k + 1) * n / parts))
        .filter(|r| !r.is_empty())
        .collect()
}

impl Backend for WgpuBackend {
    fn name(&self) -> &str {
        self.device.name_str()
    }

    fn device(&self) -> DeviceRef {
        self.device.clone()
    }

    fn synchronize(&mut self) -> Result<()> {
        let waited = self.gpu.wait();
        let end = Instant::now();
        // Completed or failed, the submissions are over: release their parameters.
        for b in self.in_flight.drain(..) {
            b.destroy();
        }
        let spans = std::mem::take(&mut self.pending_spans);
        if let Some((trace, track)) = &self.trace {
            for s in spans {
                trace.span(
                    *track,
                    s.name,
                    "command_buffer",
                    s.start,
                    end,
                    vec![
                        ("nodes".into(), TraceArg::Int(s.nodes)),
                        ("dispatches".into(), TraceArg::Int(s.dispatches)),
                    ],
                );
            }
        }
        waited
    }

    fn graph_compute_async(&mut self, ctx: &Context, graph: &Graph) -> Result<()> {
        let prep = Prep::new(&self.gpu, self.device.name_str());
        // Dispatches, and the graph node index each one comes from (for span names).
        let mut dispatches = Vec::new();
        let mut node_of = Vec::new();
        for (n, &id) in graph.nodes().iter().enumerate() {
            for d in prep.prepare(ctx, id)? {
                dispatches.push(d);
                node_of.push(n);
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
        let ranges = split_even(dispatches.len(), self.n_cb);
        let mut buffers = Vec::with_capacity(ranges.len());
        let mut spans = Vec::with_capacity(ranges.len());
        let this: &WgpuBackend = self;
        let t0 = Instant::now();
        // Several ranges of enough nodes each: encode them on threads (measured faster on
        // lavapipe, see the module docs); small graphs are not worth the thread start-up.
        let threaded: Option<Vec<Result<wgpu::CommandBuffer>>> =
            if ranges.len() > 1 && dispatches.len() >= ranges.len() * MIN_THREADED_RANGE {
                Some(std::thread::scope(|scope| {
                    let handles: Vec<_> = ranges
                        .iter()
                        .map(|r| {
                            let (d, u) = (&dispatches, &uniforms);
                            scope.spawn(move || this.encode(d, r.clone(), u))
                        })
                        .collect();
                    handles
                        .into_iter()
                        .map(|h| {
                            h.join()
                                .unwrap_or_else(|_| Err(this.gpu.err("encoder thread panicked")))
                        })
                        .collect()
                }))
            } else {
                None
            };
        let mut threaded = threaded.map(|v| v.into_iter());
        for (k, r) in ranges.iter().enumerate() {
            // Threaded ranges were all encoded from `t0` on.
            let start = if threaded.is_some() {
                t0
            } else {
                Instant::now()
            };
            let cb = match threaded.as_mut().and_then(|it| it.next()) {
                Some(cb) => cb,
                None => self.encode(&dispatches, r.clone(), &uniforms),
            };
            match cb {
                Ok(cb) => buffers.push(cb),
                Err(e) => {
                    uniforms.destroy();
                    return Err(e);
                }
            }
            if self.trace.is_some() {
                // The nodes from this range's first dispatch up to the next range's (views in
                // between compute nothing and ride along); the first range starts at node 0.
                let first = if k == 0 { 0 } else { node_of[r.start] };
                let end = node_of.get(r.end).copied().unwrap_or(graph.n_nodes());
                spans.push(PendingSpan {
                    name: format!("cb {k} nodes {first}..{end}"),
                    start,
                    nodes: (end - first) as u64,
                    dispatches: r.len() as u64,
                });
            }
        }
        // One submit, in order: the queue runs the command buffers one after another.
        gpu.queue.submit(buffers);
        self.in_flight.push(uniforms);
        self.pending_spans.extend(spans);
        Ok(())
    }

    fn graph_concurrency(&self, ctx: &Context, graph: &Graph) -> Result<Option<Concurrency>> {
        if !self.concurrency {
            return Ok(None);
        }
        Concurrency::from_dependencies(ctx, graph).map(Some)
    }

    fn set_trace(&mut self, trace: Option<(Arc<Trace>, usize)>) {
        self.trace = trace;
    }

    /// Aligned writes into this device's memory are queued (`queue.write_buffer` copies the
    /// bytes at once, and the queue orders the write after the work submitted before);
    /// anything else synchronizes and writes through the buffer.
    fn set_tensor_async(
        &mut self,
        ctx: &Context,
        id: TensorId,
        offset: usize,
        data: &[u8],
    ) -> Result<()> {
        let start = Instant::now();
        let t = ctx.get(id)?;
        t.check_range(offset, data.len())?;
        match self.device_buffer(ctx, id)? {
            Some((buffer, base))
                if (base + offset).is_multiple_of(COPY_ALIGN)
                    && data.len().is_multiple_of(COPY_ALIGN) =>
            {
                if !data.is_empty() {
                    self.gpu
                        .queue
                        .write_buffer(&buffer.buffer, (base + offset) as u64, data);
                }
            }
            _ => {
                self.synchronize()?;
                ctx.tensor_set(id, offset, data)?;
            }
        }
        self.copy_span(format!("set {}", t.display_name()), start, data.len());
        Ok(())
    }

    /// Synchronizes (the read must see all queued work), then reads.
    fn get_tensor_async(
        &mut self,
        ctx: &Context,
        id: TensorId,
        offset: usize,
        out: &mut [u8],
    ) -> Result<()> {
        let start = Instant::now();
        self.synchronize()?;
        ctx.tensor_get(id, offset, out)?;
        let name = format!("get {}", ctx.get(id)?.display_name());
        self.copy_span(name, start, out.len());
        Ok(())
    }

    /// A buffer-to-buffer copy on the queue when both tensors are contiguous, of one size, in
    /// memory of this device, at 4-byte-aligned offsets with a 4-byte-multiple size; otherwise
    /// `Ok(false)`. The source stream needs no wait: streams of one device share its queue.
    fn cpy_tensor_async(
        &mut self,
        src_backend: &mut dyn Backend,
        ctx: &Context,
        src: TensorId,
        dst: TensorId,
    ) -> Result<bool> {
        let start = Instant::now();
        let (ts, td) = (ctx.get(src)?, ctx.get(dst)?);
        let size = ts.nbytes();
        if size != td.nbytes() || !ts.is_contiguous() || !td.is_contiguous() {
            return Ok(false);
        }
        let same_queue = (&*src_backend as &dyn Any)
            .downcast_ref::<WgpuBackend>()
            .is_none_or(|b| Arc::ptr_eq(&b.gpu, &self.gpu));
        let (Some((sb, so)), Some((db, dof))) =
            (self.device_buffer(ctx, src)?, self.device_buffer(ctx, dst)?)
        else {
            return Ok(false);
        };
        if !same_queue || ![so, dof, size].iter().all(|x| x.is_multiple_of(COPY_ALIGN)) {
            return Ok(false);
        }
        if size > 0 {
            let mut encoder =
                self.gpu
                    .device
                    .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                        label: Some("rgml copy"),
                    });
            let size = size as u64;
            if sb.buffer == db.buffer {
                // wgpu refuses copies within one buffer: go through a scratch buffer on the
                // device (released by wgpu once the submission is done).
                let scratch = self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("rgml copy scratch"),
                    size,
                    usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                encoder.copy_buffer_to_buffer(&sb.buffer, so as u64, &scratch, 0, size);
                encoder.copy_buffer_to_buffer(&scratch, 0, &db.buffer, dof as u64, size);
            } else {
                encoder.copy_buffer_to_buffer(&sb.buffer, so as u64, &db.buffer, dof as u64, size);
            }
            self.gpu.queue.submit([encoder.finish()]);
        }
        self.copy_span(format!("copy {}", ts.display_name()), start, size);
        Ok(true)
    }

    fn event_record(&mut self, event: &Event) -> Result<()> {
        let ev = self.own_event(event)?;
        // An empty submit: its index completes after everything queued before it (including
        // pending `write_buffer`s, which wgpu flushes with the next submit).
        let index = self.gpu.queue.submit(std::iter::empty());
        *ev.index.lock().unwrap_or_else(|p| p.into_inner()) = Some(index);
        Ok(())
    }

    fn event_wait(&mut self, event: &Event) -> Result<()> {
        match event.imp().downcast_ref::<WgpuEvent>() {
            // One queue per device orders all its work: nothing to wait for.
            Some(ev) if Arc::ptr_eq(&ev.gpu, &self.gpu) => Ok(()),
            // Another device: block until it is reached (wgpu cannot wait across devices).
            _ => event.synchronize(),
        }
    }

    fn supports_op(&self, ctx: &Context, id: TensorId) -> bool {
        crate::ops::supports_op(ctx, id)
    }
}

impl WgpuBackend {
    fn own_event<'e>(&self, event: &'e Event) -> Result<&'e WgpuEvent> {
        event
            .imp()
            .downcast_ref::<WgpuEvent>()
            .filter(|ev| Arc::ptr_eq(&ev.gpu, &self.gpu))
            .ok_or_else(|| Error::Unsupported {
                backend: self.name().to_string(),
                what: format!("events of device {}", event.device().name()),
            })
    }
}

impl Drop for WgpuBackend {
    fn drop(&mut self) {
        // Let submitted work finish before its parameters go (errors have nowhere to go now).
        if !self.in_flight.is_empty() {
            let _ = self.gpu.wait();
            for b in self.in_flight.drain(..) {
                b.destroy();
            }
        }
    }
}

/// An event of a wgpu device: the queue submission it was last recorded at.
pub(crate) struct WgpuEvent {
    gpu: Arc<Gpu>,
    index: Mutex<Option<wgpu::SubmissionIndex>>,
}

impl WgpuEvent {
    pub(crate) fn new(gpu: Arc<Gpu>) -> WgpuEvent {
        WgpuEvent {
            gpu,
            index: Mutex::new(None),
        }
    }
}

impl EventImpl for WgpuEvent {
    /// Polls the device until the recorded submission is done (at once if never recorded).
    fn synchronize(&self) -> Result<()> {
        let index = self.index.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let Some(index) = index else {
            return Ok(());
        };
        self.gpu
            .device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(index),
                timeout: None,
            })
            .map_err(|e| self.gpu.err(e.to_string()))?;
        self.gpu.check()
    }
}
