//! The backend (stream) and its events: encoding a graph into `n_cb` command buffers,
//! asynchronous compute, set / get / copy on the device's queue, events from queue
//! submissions, and trace spans for command buffers and copies.
//!
//! # Command buffers
//! A graph's dispatches (nodes that compute something) are split into `n_cb` contiguous ranges
//! of about equal size (ggml-metal's `n_cb`), each encoded into its own command encoder (one
//! compute pass per range), and each is submitted as soon as it and every range before it are
//! encoded: the GPU runs the first while the host encodes the rest. With several ranges of at
//! least 32 dispatches each, the ranges are encoded on two scoped threads (taking every other
//! range), else one after another.
//!
//! The default is `n_cb=8`; `Vulkan0:n_cb=N` sets it. wgpu's encoding costs the host a few
//! microseconds per dispatch (its resource tracking): a decode step of an 8B Llama has ~700
//! dispatches, and on the H100 machine a dispatch runs in about as long, so a graph submitted
//! only once encoded leaves the GPU idle for the whole encoding. Measured on lavapipe before
//! (2 shared CPU cores, `bench_n_cb` in `tests/stream.rs`, 300-node graphs, one submit per
//! graph): encoding a graph takes about 2.2 ms sequentially whatever `n_cb`, and about
//! 1.4–1.6 ms on 2–4 threads.
//!
//! # Asynchrony
//! [`Backend::graph_compute_async`] submits and returns; [`Backend::synchronize`] waits for
//! the queue and reports wgpu errors (validation or device loss) of the work submitted since.
//! Every stream of a device shares the device's one queue, so work is ordered across streams of
//! the device.
//!
//! # Plans
//! `graph_compute_async` keeps the plans of the last few graphs (`PLAN_SLOTS`, ggml's
//! `graph_plan`, as the CPU backend does) and reuses one while the graph's uid and the
//! context's uid and epoch are those it was made for ([`GraphPlan`]): a decode step that
//! computes its graph again encodes the plan's ready steps (pipelines, bind groups, workgroup
//! counts; `plan.rs`) and submits, without preparing nodes, creating bind groups or writing
//! parameters. Inputs are values, not metadata: ROPE's tables are filled on the GPU from the
//! positions when the graph runs. `graph_plan_create` / `graph_plan_compute_async` expose the
//! same plans. wgpu keeps the buffers of submitted work alive until it completes, so a plan
//! may be replaced or dropped while its last submission runs.
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
//! (a set / copy only queues the transfer). Where the adapter writes timestamps inside compute
//! passes (`TIMESTAMP_QUERY_INSIDE_PASSES`: NVIDIA, AMD, Intel and lavapipe do), every dispatch
//! also gets a `"kernel"` span measured on the GPU, on the track `"<device> kernels"`, named by
//! its node's op and kernel (`MUL_MAT Fast(MulMv, 5)`): `rgml bench --trace` and
//! `scripts/trace-kernels.py` give the time per kernel. Timing costs a query set and two small
//! buffers per command buffer, made only while a trace is recorded.

use crate::buffer::{WgpuBuffer, COPY_ALIGN};
use crate::gpu::Gpu;
use crate::ops::supports_op;
use crate::plan::{DispatchTimes, Prepared};
use rgml::alloc::Concurrency;
use rgml::backend::{Backend, Event, EventImpl, GraphPlan};
use rgml::graph::Graph;
use rgml::trace::{Trace, TraceArg, TraceSpan};
use rgml::{Context, DeviceRef, Error, Result, TensorId};
use std::any::Any;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Fewest dispatches per command buffer for which encoding on threads pays off.
const MIN_THREADED_RANGE: usize = 32;

/// Threads encoding one graph's command buffers.
const ENCODER_THREADS: usize = 2;

/// Command buffers per graph unless the `n_cb` parameter says.
pub(crate) const DEFAULT_N_CB: usize = 8;

/// How many plans a stream keeps: enough for a few graphs computed in turn (a scheduler's
/// splits on this stream, a decode graph beside a prompt graph).
const PLAN_SLOTS: usize = 4;

/// What a wgpu plan holds (shared, so computing it clones a pointer).
struct WgpuPlan(Arc<Prepared>);

/// A command buffer submitted but not yet seen complete, for its trace span.
struct PendingSpan {
    name: String,
    start: Instant,
    nodes: u64,
    dispatches: u64,
    /// The GPU's timestamps around its dispatches, where the adapter can write them, and the
    /// plan they belong to (for the kernels' labels).
    times: Option<(DispatchTimes, Arc<Prepared>)>,
}

/// A stream on a wgpu device.
pub struct WgpuBackend {
    device: DeviceRef,
    gpu: Arc<Gpu>,
    /// Command buffers per graph.
    n_cb: usize,
    /// Whether to report dependency levels to the graph allocator.
    concurrency: bool,
    /// Exact arithmetic (the CPU's bits) rather than fast.
    exact: bool,
    /// The plans of the last graphs computed, most recently used first.
    plans: Vec<GraphPlan>,
    trace: Option<(Arc<Trace>, usize)>,
    pending_spans: Vec<PendingSpan>,
}

impl WgpuBackend {
    pub(crate) fn new(
        device: DeviceRef,
        gpu: Arc<Gpu>,
        n_cb: usize,
        concurrency: bool,
        exact: bool,
    ) -> WgpuBackend {
        WgpuBackend {
            device,
            gpu,
            n_cb: n_cb.max(1),
            concurrency,
            exact,
            plans: Vec::with_capacity(PLAN_SLOTS),
            trace: None,
            pending_spans: Vec::new(),
        }
    }

    /// Whether this stream computes in exact arithmetic (the CPU backend's bits) rather than
    /// fast (the `exact` parameter; see the crate docs).
    pub fn is_exact(&self) -> bool {
        self.exact
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

    /// Trace spans for the timed dispatches of `spans`, on the track `"<device> kernels"`:
    /// one per dispatch, named by its node's op and kernel, placed on the host timeline from
    /// the start of the command buffers that were submitted together (GPU time zero is their
    /// first timestamp).
    fn kernel_spans(&self, trace: &Trace, spans: &[PendingSpan]) -> Result<()> {
        let track = trace.track(&format!("{} kernels", self.name()));
        // GPU time zero of the submission being placed: (its host start, its first timestamp).
        let mut zero: Option<(Instant, f64)> = None;
        for s in spans {
            let Some((times, prepared)) = &s.times else {
                continue;
            };
            let measured = times.read(&self.gpu)?;
            if zero.is_none_or(|(anchor, _)| anchor != s.start) {
                zero = measured.first().map(|&(start_ns, _)| (s.start, start_ns));
            }
            let Some((anchor, gpu_zero)) = zero else {
                continue;
            };
            for (k, (start_ns, duration_ns)) in measured.into_iter().enumerate() {
                let span = TraceSpan {
                    track,
                    name: prepared.label(times.steps.start + k),
                    category: "kernel",
                    start_us: (start_ns - gpu_zero) / 1e3,
                    duration_us: duration_ns / 1e3,
                    args: Vec::new(),
                };
                trace.span_at(anchor, span);
            }
        }
        Ok(())
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

    /// The prepared graph for `graph`: from a kept plan while the graph and the context are
    /// unchanged (three comparisons per plan), else from a new plan, which replaces the least
    /// recently used one.
    fn prepared_for(&mut self, ctx: &Context, graph: &Graph) -> Result<Arc<Prepared>> {
        if let Some(i) = self.plans.iter().position(|p| p.is_for(ctx, graph)) {
            // Most recently used first (a rotation: no allocation).
            self.plans[..=i].rotate_right(1);
            if let Some(WgpuPlan(prepared)) = self.plans[0].prepared::<WgpuPlan>() {
                return Ok(prepared.clone());
            }
        }
        let plan = self.graph_plan_create(ctx, graph)?;
        let prepared = self.own_plan(&plan)?.clone();
        self.plans.truncate(PLAN_SLOTS - 1);
        self.plans.insert(0, plan);
        Ok(prepared)
    }

    /// What `plan` holds, if this device's backend made it.
    fn own_plan<'p>(&self, plan: &'p GraphPlan) -> Result<&'p Arc<Prepared>> {
        match plan.prepared::<WgpuPlan>() {
            Some(WgpuPlan(prepared))
                if Arc::ptr_eq(&prepared.gpu, &self.gpu) && prepared.exact == self.exact =>
            {
                Ok(prepared)
            }
            _ => Err(Error::Unsupported {
                backend: self.name().to_string(),
                what: format!("a graph plan made by '{}'", plan.backend()),
            }),
        }
    }

    /// Encode `prepared` into `n_cb` command buffers and submit each as soon as it and those
    /// before it are encoded, so the GPU starts on the first while the rest are encoded.
    fn submit(&mut self, prepared: &Arc<Prepared>) -> Result<()> {
        if prepared.len() == 0 {
            return Ok(());
        }
        let ranges = split_even(prepared.len(), self.n_cb);
        let t0 = Instant::now();
        let mut times: Vec<Option<DispatchTimes>> = ranges
            .iter()
            .map(|r| {
                (self.trace.is_some() && self.gpu.times_kernels())
                    .then(|| DispatchTimes::new(&self.gpu, r.clone()))
            })
            .collect();
        // Several ranges of enough steps each: encode them on threads (measured faster on
        // lavapipe, see the module docs); small graphs are not worth the thread start-up.
        let threads = if prepared.len() >= ranges.len() * MIN_THREADED_RANGE {
            ranges.len().min(ENCODER_THREADS)
        } else {
            1
        };
        let queue = &self.gpu.queue;
        if threads > 1 {
            let (ranges, times) = (&ranges, &times);
            std::thread::scope(|scope| {
                let (tx, rx) = std::sync::mpsc::channel();
                for first in 0..threads {
                    let tx = tx.clone();
                    scope.spawn(move || {
                        for k in (first..ranges.len()).step_by(threads) {
                            let buffer = prepared.encode(ranges[k].clone(), times[k].as_ref());
                            if tx.send((k, buffer)).is_err() {
                                return;
                            }
                        }
                    });
                }
                drop(tx);
                // Submitted in order: the queue runs them one after another.
                let mut ready = std::collections::BTreeMap::new();
                let mut next = 0;
                for (k, buffer) in rx {
                    ready.insert(k, buffer);
                    while let Some(buffer) = ready.remove(&next) {
                        queue.submit([buffer]);
                        next += 1;
                    }
                }
                if next < ranges.len() {
                    return Err(self.gpu.err("encoder thread panicked"));
                }
                Ok(())
            })?;
        } else {
            for (r, t) in ranges.iter().zip(&times) {
                queue.submit([prepared.encode(r.clone(), t.as_ref())]);
            }
        }
        if self.trace.is_some() {
            for (k, r) in ranges.iter().enumerate() {
                let nodes = prepared.nodes_of(k, r);
                self.pending_spans.push(PendingSpan {
                    name: format!("cb {k} nodes {}..{}", nodes.start, nodes.end),
                    start: t0,
                    nodes: nodes.len() as u64,
                    dispatches: r.len() as u64,
                    times: times[k].take().map(|t| (t, prepared.clone())),
                });
            }
        }
        Ok(())
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
        self.device.name()
    }

    fn device(&self) -> DeviceRef {
        self.device.clone()
    }

    fn synchronize(&mut self) -> Result<()> {
        let waited = self.gpu.wait();
        let end = Instant::now();
        let spans = std::mem::take(&mut self.pending_spans);
        if let Some((trace, track)) = &self.trace {
            if waited.is_ok() {
                self.kernel_spans(trace, &spans)?;
            }
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
        let prepared = self.prepared_for(ctx, graph)?;
        self.submit(&prepared)
    }

    /// Every node prepared for this device: steps with their pipelines, bind groups and
    /// workgroup counts, and the uniform buffer of their parameters (see `plan.rs`).
    fn graph_plan_create(&mut self, ctx: &Context, graph: &Graph) -> Result<GraphPlan> {
        let prepared = Prepared::new(&self.gpu, self.device.name(), self.exact, ctx, graph)?;
        Ok(GraphPlan::new(
            ctx,
            graph,
            self.device.name(),
            Arc::new(WgpuPlan(Arc::new(prepared))),
        ))
    }

    fn graph_plan_compute_async(&mut self, ctx: &Context, plan: &GraphPlan) -> Result<()> {
        plan.check_current(ctx)?;
        let prepared = self.own_plan(plan)?.clone();
        self.submit(&prepared)
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
        supports_op(ctx, id, self.exact)
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
