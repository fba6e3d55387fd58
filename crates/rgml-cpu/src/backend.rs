//! The CPU backend (stream): plans a graph (buffers, layouts, work area), then runs its nodes in
//! order on a persistent thread pool, ggml-style: every thread visits every node, computes its
//! share, and meets the others at a barrier before the next node.
//!
//! This module owns the threading, the work area, the plans (prepared jobs) and the safety checks
//! that make the kernels' raw pointers sound (host guards, exclusive for the buffers a graph
//! writes and shared for those it only reads; in-bounds extents; no writes to read-only memory;
//! sources overlapping a destination only as exact in-place aliases).
//!
//! **Threads**: `n_threads - 1` workers of a [`Pool`] (started by the first graph that needs
//! them, rebuilt when the thread count changes) plus the thread that runs the job as thread 0:
//! the caller of `graph_compute` in synchronous mode, the backend's worker thread in
//! asynchronous mode. Launching a job allocates nothing.
//!
//! **Plans** (ggml's `graph_plan`): preparing a graph (support checks, views, extents,
//! barrier plan) builds a [`Job`], held by a [`GraphPlan`]. `graph_compute_async` keeps the
//! plans of the last few graphs (`PLAN_SLOTS`) and reuses one while the graph's uid and the
//! context's uid and epoch are those it was made for (see [`GraphPlan`]: every change of tensor
//! metadata advances the epoch), so a decode loop computing its graph again finds its plan with
//! a few integer comparisons and allocates nothing; anything else prepares anew. Values are
//! never part of a plan: it reads the tensors' current bytes like a new one. A kept plan holds
//! its buffers (`Arc`) until it is replaced or the backend dropped. `graph_plan_create` and
//! `graph_plan_compute_async` expose the same plans to callers that keep their own.
//!
//! **Asynchronous mode** (default for the `CPU0`, `CPU1`, ... devices, or backend parameter
//! `async=1`; the plain "CPU" device is synchronous unless `async=1`): the backend owns one
//! worker thread fed by an in-order queue. `graph_compute_async` checks the graph and builds the
//! node tasks right away, or takes the cached job (errors are reported at once), then queues
//! the [`Job`] (shared, `Arc`), which owns everything the run needs (raw views, clones of the
//! `Arc<Buffer>`s they point into), and returns; the worker takes the buffers' host guards
//! while it runs the job.
//! `synchronize` waits until the queue is empty and returns the first error of the queued work
//! (after an error, queued computations are skipped until `synchronize` reports it; event
//! markers still fire). `graph_compute` is `graph_compute_async` plus `synchronize`.
//! `event_record` queues a marker that signals the event when reached, `event_wait` queues a
//! wait (the worker blocks until the event is signaled: a dependency between streams).
//! `set_tensor_async` copies the bytes and queues their write; `cpy_tensor_async` waits for the
//! source backend, reads the source and queues the write into the destination: writes into
//! this backend's memory are so ordered after the work queued before them, which may still
//! read that memory. `get_tensor_async` keeps the trait's fallback (synchronize, then a
//! blocking read). Dropping the backend finishes the queued work and joins the worker.

use crate::barrier::SpinBarrier;
use crate::buffer::CPU_ALIGNMENT;
use crate::kernels::{self, CpuFeatures, NodeTask, SharedWork, TensorView, ThreadCtx};
use crate::pool::Pool;
use rgml::backend::AlignedMem;
use rgml::backend::{Event, EventImpl, GraphPlan, HostAccess};
use rgml::{Backend, Buffer, Context, DeviceRef, Error, Graph, Result, Tensor, TensorId};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// A callback polled between nodes; returning `true` stops the computation with
/// [`Error::Aborted`].
pub type AbortCallback = Box<dyn Fn() -> bool + Send>;

/// A CPU compute stream.
pub struct CpuBackend {
    device: DeviceRef,
    n_threads: usize,
    /// Threads, work area and abort callback; locked by whoever runs a job.
    engine: Arc<Mutex<Engine>>,
    /// The worker thread of asynchronous mode.
    worker: Option<Worker>,
    /// The plans of the last graphs computed, most recently used first.
    plans: Vec<GraphPlan>,
    /// What the kernels may use and which arithmetic they mirror; copied into every node task.
    features: CpuFeatures,
}

/// What running a job needs besides the job itself.
struct Engine {
    /// The device's name, for errors.
    name: Arc<str>,
    n_threads: usize,
    /// The compute threads, started by the first graph that needs more than one.
    pool: Option<Pool>,
    abort: Option<Mutex<AbortCallback>>,
    work: AlignedMem,
}

/// A checked graph, ready to run: owns everything it needs, borrows nothing.
struct Job {
    /// Buffers the tasks point into, sorted by id, with the base address and size the views
    /// were computed from, and whether a task writes into it (exclusive guard) or only reads
    /// it (shared guard: weights other computations may read at the same time).
    buffers: Vec<(Arc<Buffer>, usize, usize, bool)>,
    tasks: Vec<NodeTask>,
    shared: usize,
    per_thread: usize,
}

/// Work queued for the worker.
enum Item {
    Compute(Arc<Job>),
    /// Signal the event's generation when reached.
    Signal(Arc<EventState>, u64),
    /// Block until the event reaches the generation.
    Wait(Arc<EventState>, u64),
    /// Write the bytes into the buffer at the offset (checked when queued).
    Write(Arc<Buffer>, usize, Vec<u8>),
}

#[derive(Default)]
struct QueueState {
    items: VecDeque<Item>,
    /// Items queued or running.
    pending: usize,
    error: Option<Error>,
    shutdown: bool,
}

#[derive(Default)]
struct Queue {
    state: Mutex<QueueState>,
    /// Signaled when an item is queued or on shutdown.
    more: Condvar,
    /// Signaled when an item completes.
    done: Condvar,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn push(&self, item: Item) {
        let mut s = self.lock();
        s.items.push_back(item);
        s.pending += 1;
        self.more.notify_one();
    }

    /// Wait until nothing is queued or running; the first error stays for `synchronize`.
    fn drain(&self) -> MutexGuard<'_, QueueState> {
        let mut s = self.lock();
        while s.pending > 0 {
            s = self.done.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        s
    }
}

struct Worker {
    queue: Arc<Queue>,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn worker_main(queue: Arc<Queue>, engine: Arc<Mutex<Engine>>) {
    loop {
        let (item, skip) = {
            let mut s = queue.lock();
            loop {
                if let Some(item) = s.items.pop_front() {
                    break (item, s.error.is_some());
                }
                if s.shutdown {
                    return;
                }
                s = queue.more.wait(s).unwrap_or_else(|p| p.into_inner());
            }
        };
        let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match item {
            Item::Compute(_) if skip => Ok(()),
            Item::Compute(job) => {
                let mut engine = engine.lock().unwrap_or_else(|p| p.into_inner());
                engine.execute(&job)
            }
            Item::Write(_, _, _) if skip => Ok(()),
            Item::Write(buffer, offset, data) => buffer.set(offset, &data),
            Item::Signal(event, generation) => {
                event.signal(generation);
                Ok(())
            }
            Item::Wait(event, generation) => {
                event.wait_for(generation);
                Ok(())
            }
        }))
        .unwrap_or_else(|_| {
            let engine = engine.lock().unwrap_or_else(|p| p.into_inner());
            Err(Error::Backend {
                backend: engine.name.to_string(),
                message: "the worker panicked".into(),
            })
        });
        let mut s = queue.lock();
        s.pending -= 1;
        if let Err(e) = res {
            s.error.get_or_insert(e);
        }
        queue.done.notify_all();
    }
}

/// The shared state of a [`CpuEvent`]: how many times it was recorded and which recording was
/// last reached.
#[derive(Default)]
struct EventState {
    /// (generation of the last record, generation last reached).
    gens: Mutex<(u64, u64)>,
    reached: Condvar,
}

impl EventState {
    fn lock(&self) -> MutexGuard<'_, (u64, u64)> {
        self.gens.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new recording; returns its generation.
    fn record(&self) -> u64 {
        let mut g = self.lock();
        g.0 += 1;
        g.0
    }

    /// The generation of the last recording.
    fn recorded(&self) -> u64 {
        self.lock().0
    }

    fn signal(&self, generation: u64) {
        let mut g = self.lock();
        g.1 = g.1.max(generation);
        self.reached.notify_all();
    }

    fn wait_for(&self, generation: u64) {
        let mut g = self.lock();
        while g.1 < generation {
            g = self.reached.wait(g).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// An event of a CPU device: a point in a CPU stream's queue. A never-recorded event counts as
/// reached; waiting for an event waits for its last recording before the wait.
#[derive(Default)]
pub struct CpuEvent {
    state: Arc<EventState>,
}

impl CpuEvent {
    /// A new event, not recorded yet.
    pub fn new() -> CpuEvent {
        CpuEvent::default()
    }
}

impl EventImpl for CpuEvent {
    fn synchronize(&self) -> Result<()> {
        self.state.wait_for(self.state.recorded());
        Ok(())
    }
}

fn cpu_event(event: &Event) -> Option<Arc<EventState>> {
    event
        .imp()
        .downcast_ref::<CpuEvent>()
        .map(|e| e.state.clone())
}

impl std::fmt::Debug for CpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuBackend")
            .field("device", &self.device.name())
            .field("n_threads", &self.n_threads)
            .field("async", &self.worker.is_some())
            .finish()
    }
}

/// How many plans a backend keeps: enough for a few graphs computed in turn (a scheduler's
/// splits on this backend, a decode graph beside a prompt graph).
const PLAN_SLOTS: usize = 4;

/// What a CPU plan holds: the prepared job (`None`: the graph runs nothing, only views).
struct CpuPlan(Option<Arc<Job>>);

fn align64(n: usize) -> Result<usize> {
    n.checked_next_multiple_of(CPU_ALIGNMENT)
        .ok_or(Error::SizeOverflow)
}

/// Bytes from element 0 to one past the last element, with overflow checks.
fn span(t: &Tensor) -> Result<usize> {
    if t.ne.contains(&0) {
        return Ok(0);
    }
    let bs = t.dtype.block_size();
    let mut bytes = (t.ne[0] / bs)
        .checked_mul(t.nb[0])
        .ok_or(Error::SizeOverflow)?;
    if bs == 1 {
        bytes = (t.ne[0] - 1)
            .checked_mul(t.nb[0])
            .and_then(|b| b.checked_add(t.dtype.block_bytes()))
            .ok_or(Error::SizeOverflow)?;
    }
    for i in 1..4 {
        bytes = (t.ne[i] - 1)
            .checked_mul(t.nb[i])
            .and_then(|b| b.checked_add(bytes))
            .ok_or(Error::SizeOverflow)?;
    }
    Ok(bytes)
}

impl CpuBackend {
    /// A backend on the registered "CPU" device (or a private one when none is registered)
    /// with `n_threads` threads (0 means 1). Synchronous.
    pub fn new(n_threads: usize) -> Result<CpuBackend> {
        let device = rgml::registry::device("CPU")
            .ok()
            .filter(|d| d.is::<crate::CpuDevice>())
            .unwrap_or_else(|| crate::CpuDevice::new("CPU") as DeviceRef);
        Self::with_device(device, n_threads)
    }

    /// A synchronous backend on `device` with `n_threads` threads (0 means 1).
    /// Its features are the device's when it is a [`crate::CpuDevice`], else detected.
    pub fn with_device(device: DeviceRef, n_threads: usize) -> Result<CpuBackend> {
        let n_threads = n_threads.max(1);
        let name = Arc::from(device.name());
        let features = device
            .downcast_ref::<crate::CpuDevice>()
            .map_or_else(CpuFeatures::detect, crate::CpuDevice::features);
        Ok(CpuBackend {
            device,
            n_threads,
            engine: Arc::new(Mutex::new(Engine {
                name,
                n_threads,
                pool: None,
                abort: None,
                work: AlignedMem::new(0, CPU_ALIGNMENT, "CPU work area")?,
            })),
            worker: None,
            plans: Vec::with_capacity(PLAN_SLOTS),
            features,
        })
    }

    /// A backend on `device` with `n_threads` threads (0 means 1) that runs its work on its own
    /// worker thread when `asynchronous` (see the module documentation).
    pub fn with_mode(
        device: DeviceRef,
        n_threads: usize,
        asynchronous: bool,
    ) -> Result<CpuBackend> {
        let mut b = Self::with_device(device, n_threads)?;
        if asynchronous {
            let queue = Arc::new(Queue::default());
            let (q, e) = (queue.clone(), b.engine.clone());
            let thread = std::thread::Builder::new()
                .name(format!("rgml-{}-queue", b.device.name()))
                .spawn(move || worker_main(q, e))
                .map_err(|e| Error::Backend {
                    backend: b.device.name().to_string(),
                    message: format!("cannot start the worker thread: {e}"),
                })?;
            b.worker = Some(Worker {
                queue,
                thread: Some(thread),
            });
        }
        Ok(b)
    }

    /// The features the kernels run with (see [`CpuFeatures`]).
    pub fn features(&self) -> CpuFeatures {
        self.features
    }

    /// Run the next graphs with `features` (e.g. another arithmetic, from
    /// [`CpuFeatures::with_choice`]). Kept plans are dropped; queued work keeps the features
    /// it was prepared with.
    pub fn set_features(&mut self, features: CpuFeatures) {
        if features != self.features {
            self.features = features;
            self.plans.clear();
        }
    }

    /// Whether work runs on the backend's own worker thread.
    pub fn is_async(&self) -> bool {
        self.worker.is_some()
    }

    /// Number of compute threads.
    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// Wait for queued work (its first error stays for [`Backend::synchronize`]), then lock
    /// the engine for a change.
    fn engine_idle(&self) -> MutexGuard<'_, Engine> {
        if let Some(w) = &self.worker {
            drop(w.queue.drain());
        }
        self.engine.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Use `n` compute threads from the next graph on (0 means 1); queued work finishes first.
    pub fn set_n_threads(&mut self, n: usize) {
        let n = n.max(1);
        if n != self.n_threads {
            self.n_threads = n;
            let mut e = self.engine_idle();
            e.n_threads = n;
            e.pool = None;
        }
    }

    /// Poll `callback` between nodes; when it returns `true` compute stops with
    /// [`Error::Aborted`]. Queued work finishes first.
    pub fn set_abort_callback(&mut self, callback: AbortCallback) {
        self.engine_idle().abort = Some(Mutex::new(callback));
    }

    /// Stop polling an abort callback (queued work finishes first).
    pub fn clear_abort_callback(&mut self) {
        self.engine_idle().abort = None;
    }

    /// Bytes of the work area kept between graphs (queued work finishes first).
    pub fn work_size(&self) -> usize {
        self.engine_idle().work.len()
    }

    /// Check a write of `data` into tensor `id` at byte `offset` and queue it (in order with
    /// the queued computations, so it never overtakes work still reading that memory).
    fn queue_write(&self, ctx: &Context, id: TensorId, offset: usize, data: Vec<u8>) -> Result<()> {
        let Some(w) = &self.worker else {
            return ctx.tensor_set(id, offset, &data);
        };
        let t = ctx.get(id)?;
        let d = t
            .data
            .as_ref()
            .ok_or_else(|| Error::NoStorage(t.display_name().to_string()))?;
        t.check_range(offset, data.len())?;
        if d.buffer.is_read_only() {
            return Err(Error::ReadOnlyBuffer(d.buffer.name().to_string()));
        }
        let at = d.offset.checked_add(offset).ok_or(Error::SizeOverflow)?;
        if at
            .checked_add(data.len())
            .is_none_or(|end| end > d.buffer.size())
        {
            return Err(Error::OutOfBounds {
                what: format!("buffer '{}'", d.buffer.name()),
                offset: at,
                size: data.len(),
                limit: d.buffer.size(),
            });
        }
        w.queue.push(Item::Write(d.buffer.clone(), at, data));
        Ok(())
    }

    /// The job for `graph`: from a kept plan while the graph and the context are unchanged
    /// (three comparisons per plan, no allocation), else from a new plan, which replaces the
    /// least recently used one.
    fn job_for(&mut self, ctx: &Context, graph: &Graph) -> Result<Option<Arc<Job>>> {
        if let Some(i) = self.plans.iter().position(|p| p.is_for(ctx, graph)) {
            // Most recently used first (a rotation: no allocation).
            self.plans[..=i].rotate_right(1);
            return Ok(self.plans[0]
                .prepared::<CpuPlan>()
                .and_then(|p| p.0.clone()));
        }
        let plan = self.graph_plan_create(ctx, graph)?;
        let job = plan.prepared::<CpuPlan>().and_then(|p| p.0.clone());
        self.plans.truncate(PLAN_SLOTS - 1);
        self.plans.insert(0, plan);
        Ok(job)
    }

    /// Queue `job` (or run it now, in synchronous mode).
    fn launch(&mut self, job: Arc<Job>) -> Result<()> {
        match &self.worker {
            Some(w) => {
                w.queue.push(Item::Compute(job));
                Ok(())
            }
            None => self
                .engine
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .execute(&job),
        }
    }

    /// Check every node and build the node tasks: a job that owns everything it needs (`None`
    /// when there is nothing to run). Nothing is read or written here; the views' addresses are
    /// computed from the buffers' base addresses, which [`Engine::execute`] checks again under
    /// the buffers' guards before any access.
    fn prepare(&self, ctx: &Context, graph: &Graph) -> Result<Option<Job>> {
        let mut run: Vec<TensorId> = Vec::with_capacity(graph.n_nodes());
        // Each buffer touched, and whether a node writes into it.
        let mut buffers: Vec<(Arc<Buffer>, bool)> = Vec::new();
        let storage = |id: TensorId| -> Result<(&Tensor, &Arc<Buffer>, usize)> {
            let t = ctx.get(id)?;
            let d = t
                .data
                .as_ref()
                .ok_or_else(|| Error::NoStorage(t.display_name().to_string()))?;
            Ok((t, &d.buffer, d.offset))
        };
        for &id in graph.nodes() {
            let t = ctx.get(id)?;
            if t.op.kind().is_view() {
                continue;
            }
            kernels::check_supported(ctx, id)?;
            let (_, buf, _) = storage(id)?;
            if buf.is_read_only() {
                return Err(Error::ReadOnlyBuffer(format!(
                    "{} (destination of node '{}')",
                    buf.name(),
                    t.display_name()
                )));
            }
            buffers.push((buf.clone(), true));
            for &s in &t.src {
                buffers.push((storage(s)?.1.clone(), false));
            }
            run.push(id);
        }
        if run.is_empty() {
            return Ok(None);
        }
        // Writers first among equal ids, so the entry kept says whether any node writes.
        buffers.sort_by_key(|(b, writes)| (b.id(), !writes));
        buffers.dedup_by_key(|(b, _)| b.id());
        for (b, _) in &buffers {
            // Repacked weights are host memory to these kernels alone (see `check_supported`).
            if !b.is_host() && !crate::CpuRepackBufferType::is_repack(b.buffer_type()) {
                return Err(Error::Unsupported {
                    backend: self.device.name().to_string(),
                    what: format!("buffer '{}' is not host memory", b.name()),
                });
            }
        }
        // Base address and size of each buffer, in id order.
        let mut bases: Vec<(Arc<Buffer>, std::ptr::NonNull<u8>, usize, bool)> =
            Vec::with_capacity(buffers.len());
        for (b, writes) in buffers {
            let base = b.imp().base().ok_or_else(|| Error::Unsupported {
                backend: self.device.name().to_string(),
                what: format!("buffer '{}' is not host memory", b.name()),
            })?;
            let size = b.size();
            bases.push((b, base, size, writes));
        }
        let view = |id: TensorId| -> Result<(TensorView, u64, usize)> {
            let (t, buf, offset) = storage(id)?;
            let &(_, base, size, _) = bases
                .binary_search_by_key(&buf.id(), |(b, _, _, _)| b.id())
                .map(|i| &bases[i])
                .map_err(|_| Error::NoStorage(t.display_name().to_string()))?;
            let len = span(t)?;
            if offset.checked_add(len).is_none_or(|end| end > size) {
                return Err(Error::OutOfBounds {
                    what: format!("tensor '{}' in buffer '{}'", t.display_name(), buf.name()),
                    offset,
                    size: len,
                    limit: size,
                });
            }
            // Only an address here: it is dereferenced by the kernels once the worker holds the
            // buffer's guard and has checked that the base is unchanged.
            let ptr = base.as_ptr().wrapping_add(offset);
            if len > 0 && !(ptr as usize).is_multiple_of(t.dtype_align()) {
                return Err(Error::Unsupported {
                    backend: self.device.name().to_string(),
                    what: format!(
                        "tensor '{}' is misaligned for {}",
                        t.display_name(),
                        t.dtype
                    ),
                });
            }
            let mut v = TensorView::new(t, ptr);
            v.packed = crate::CpuRepackBufferType::is_repack(buf.buffer_type());
            Ok((v, buf.id(), len))
        };

        let mut tasks = Vec::with_capacity(run.len());
        let mut extents = Vec::with_capacity(run.len());
        let (mut shared, mut per_thread) = (0usize, 0usize);
        for &id in &run {
            let t = &ctx[id];
            let (dst, dbuf, dlen) = view(id)?;
            let mut src: [Option<TensorView>; 3] = [None; 3];
            let mut reads = [Extent::NONE; 3];
            for (i, &s) in t.src.iter().enumerate() {
                let (sv, sbuf, slen) = view(s)?;
                if let Some(r) = reads.get_mut(i) {
                    *r = Extent::new(sv.ptr, slen);
                }
                if i >= src.len() {
                    return Err(Error::Unsupported {
                        backend: self.device.name().to_string(),
                        what: format!("{} with {} sources", t.op.kind(), t.src.len()),
                    });
                }
                let exact = sv.ptr == dst.ptr && sv.ne == dst.ne && sv.nb == dst.nb;
                if !kernels::is_target_src(&t.op, i)
                    && sbuf == dbuf
                    && kernels::overlaps(sv.ptr, slen, dst.ptr, dlen)
                    && !(exact && sv.dtype == dst.dtype && kernels::inplace_capable(t.op.kind()))
                {
                    return Err(Error::Unsupported {
                        backend: self.device.name().to_string(),
                        what: format!(
                            "{}: source {i} overlaps destination '{}' (only exact in-place aliases are allowed)",
                            t.op.kind(),
                            t.display_name()
                        ),
                    });
                }
                src[i] = Some(sv);
            }
            let (sh, pt) = kernels::work_size(ctx, t, self.features)?;
            shared = shared.max(sh);
            per_thread = per_thread.max(pt);
            extents.push((reads, Extent::new(dst.ptr, dlen)));
            tasks.push(NodeTask {
                op: t.op,
                dst,
                src,
                sync_before: true,
                reuse_src1: false,
                features: self.features,
            });
        }
        plan_syncs(&mut tasks, &extents);

        Ok(Some(Job {
            buffers: bases
                .into_iter()
                .map(|(b, base, size, writes)| (b, base.as_ptr() as usize, size, writes))
                .collect(),
            tasks,
            shared,
            per_thread,
        }))
    }
}

/// A byte range of host memory a node reads or writes (addresses, so ranges of different
/// buffers never meet).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Extent {
    start: usize,
    end: usize,
}

impl Extent {
    /// Nothing.
    const NONE: Extent = Extent { start: 0, end: 0 };
    /// The shared work area (MUL_MAT's converted src1): address 0 is never a tensor's, so
    /// this range meets no tensor.
    const WORK: Extent = Extent { start: 0, end: 1 };

    fn new(ptr: *const u8, len: usize) -> Extent {
        let start = ptr as usize;
        Extent {
            start,
            end: start.saturating_add(len),
        }
    }

    fn meets(self, other: Extent) -> bool {
        self.start < other.end && other.start < self.end
    }
}

/// Which nodes need the threads synchronized before them, and which matrix products can
/// reuse the previous one's converted src1 (see [`NodeTask`]).
///
/// Threads run the nodes in order; between two barriers they may be at different nodes. A
/// node needs a barrier before it when it reads what a node since the last barrier writes, or
/// writes what such a node reads or writes. A MUL_MAT that converts src1 synchronizes inside
/// (after phase 1), so only phase 1's accesses (src1 in, work area out) count before it, and
/// the nodes before it are all finished after it starts its phase 2.
fn plan_syncs(tasks: &mut [NodeTask], extents: &[([Extent; 3], Extent)]) {
    let mut reads: Vec<Extent> = Vec::new();
    let mut writes: Vec<Extent> = Vec::new();
    // The src1 the work area holds, and how it was converted.
    let mut held: Option<(TensorView, kernels::matmul::Src1, Extent)> = None;
    for (j, (task, &(srcs, dst))) in tasks.iter_mut().zip(extents).enumerate() {
        let conversion = match (task.op, task.src[0], task.src[1]) {
            (rgml::Op::MulMat, Some(a), Some(b)) => {
                kernels::matmul::src1_conversion(task.features, a.dtype, b.rows_contiguous())
                    .map(|c| (b, c, srcs[1]))
            }
            _ => None,
        };
        // A node that writes the held src1 (or its converted copy) ends its reuse.
        if held.is_some_and(|(_, _, e)| dst.meets(e) || dst.meets(Extent::WORK)) {
            held = None;
        }
        task.reuse_src1 = matches!((conversion, held), (Some((b, c, _)), Some((hb, hc, _)))
            if c == hc && b.ptr == hb.ptr && b.ne == hb.ne && b.nb == hb.nb && b.dtype == hb.dtype);
        let conflict = |r: &[Extent], w: &[Extent], node_reads: &[Extent], node_write: Extent| {
            w.iter()
                .any(|x| node_write.meets(*x) || node_reads.iter().any(|y| y.meets(*x)))
                || r.iter().any(|x| node_write.meets(*x))
        };
        let node_reads: Vec<Extent> = srcs
            .iter()
            .copied()
            .chain(conversion.map(|_| Extent::WORK))
            .filter(|e| e.start < e.end)
            .collect();
        match conversion {
            Some((b, c, b_extent)) if !task.reuse_src1 => {
                // Phase 1 reads src1 and writes the work area, then every thread waits.
                task.sync_before = j == 0 || conflict(&reads, &writes, &[b_extent], Extent::WORK);
                reads.clear();
                writes.clear();
                held = Some((b, c, b_extent));
            }
            _ => {
                task.sync_before = j == 0 || conflict(&reads, &writes, &node_reads, dst);
                if task.sync_before {
                    reads.clear();
                    writes.clear();
                }
            }
        }
        reads.extend(node_reads);
        writes.push(dst);
    }
}

impl Engine {
    /// Check the job's buffers, size the work area and run the tasks while holding the
    /// buffers' guards (exclusive for those written, shared for those only read).
    fn execute(&mut self, job: &Job) -> Result<()> {
        let nth = self.n_threads;
        let shared_bytes = align64(job.shared)?;
        let pt_bytes = align64(job.per_thread.checked_mul(4).ok_or(Error::SizeOverflow)?)?;
        let total = pt_bytes
            .checked_mul(nth)
            .and_then(|b| b.checked_add(shared_bytes))
            .ok_or(Error::SizeOverflow)?;
        if self.work.len() < total {
            // Grow with headroom so a slowly growing context does not reallocate every token.
            self.work = AlignedMem::new(
                total.saturating_add(total / 4),
                CPU_ALIGNMENT,
                "CPU work area",
            )?;
        }
        // SAFETY (of the kernels' accesses in `run_tasks`): every view points inside one of
        // `job.buffers` (bounds checked in `prepare` against the size checked again by
        // `with_guards`); the memory stays allocated because the job holds an `Arc` of each
        // buffer; and `with_guards` holds each buffer's guard, whose base is the one the views
        // were computed from, until the run ends: exclusive for every buffer holding a node's
        // destination (the only memory kernels write), so no other safe code reads or writes
        // those bytes meanwhile, and shared for the buffers only read, so nothing writes them.
        with_guards(&self.name.clone(), &job.buffers, &mut || {
            self.run_tasks(&job.tasks, shared_bytes, pt_bytes)
        })
    }

    /// Run the tasks on all threads: every thread runs every node in order (taking its share),
    /// with a barrier only before the nodes that `plan_syncs` marks.
    fn run_tasks(
        &mut self,
        tasks: &[NodeTask],
        shared_bytes: usize,
        pt_bytes: usize,
    ) -> Result<()> {
        let nth = self.n_threads;
        if nth > 1 && self.pool.as_ref().is_none_or(|p| p.n_threads() != nth) {
            self.pool = None;
            self.pool = Some(Pool::new(nth)?);
        }
        let base = SharedWork {
            ptr: self.work.ptr().as_ptr(),
            len: self.work.len(),
        };
        let barrier = SpinBarrier::new(nth);
        let stop_at = AtomicUsize::new(usize::MAX);
        let error: Mutex<Option<(usize, Error)>> = Mutex::new(None);
        let abort = self.abort.as_ref();
        let name: &str = &self.name;
        let record = |j: usize, e: Error| {
            let mut slot = error.lock().unwrap_or_else(|p| p.into_inner());
            if slot.as_ref().is_none_or(|(k, _)| j < *k) {
                *slot = Some((j, e));
            }
            stop_at.fetch_min(j + 1, Ordering::AcqRel);
        };
        let body = |ith: usize| {
            let pt_len = pt_bytes / 4;
            // SAFETY: the work area is `shared_bytes + nth * pt_bytes` bytes or more (sized in
            // `execute`), 64-byte aligned, and borrowed by this call for the whole run; thread
            // `ith` alone uses the range `[shared + ith * pt, shared + (ith + 1) * pt)`.
            let scratch: &mut [f32] = unsafe {
                std::slice::from_raw_parts_mut(
                    base.at(shared_bytes + ith * pt_bytes).cast::<f32>(),
                    pt_len,
                )
            };
            let shared = SharedWork {
                ptr: base.at(0),
                len: shared_bytes,
            };
            for (j, task) in tasks.iter().enumerate() {
                if task.sync_before {
                    if j > 0 {
                        barrier.wait();
                    }
                    // Checked only just after a barrier, where every thread sees the same
                    // errors, so all threads stop at the same node.
                    if stop_at.load(Ordering::Acquire) <= j {
                        break;
                    }
                }
                let mut tc = ThreadCtx {
                    ith,
                    nth,
                    scratch: &mut *scratch,
                    shared,
                    barrier: &barrier,
                };
                let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    kernels::compute(task, &mut tc)
                }));
                match res {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => record(j, e),
                    Err(_) => record(
                        j,
                        Error::Backend {
                            backend: name.to_string(),
                            message: format!("kernel for {} panicked", task.op.kind()),
                        },
                    ),
                }
                if ith == 0 {
                    if let Some(cb) = abort {
                        let cb = cb.lock().unwrap_or_else(|p| p.into_inner());
                        if cb() {
                            record(j, Error::Aborted);
                        }
                    }
                }
            }
        };
        match &mut self.pool {
            Some(pool) if nth > 1 => pool.run(&body)?,
            _ => body(0),
        }
        match error.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some((_, e)) => Err(e),
            None => Ok(()),
        }
    }
}

/// Take the guards of `buffers` (exclusive where the job writes, shared where it only reads; in
/// their order: id order, the order every compute path uses, so no deadlock), check each buffer
/// is where the job's views point, and run `f` while holding them all. Holds up to 8 guards per
/// call level instead of collecting them, so no allocation.
fn with_guards(
    name: &str,
    buffers: &[(Arc<Buffer>, usize, usize, bool)],
    f: &mut dyn FnMut() -> Result<()>,
) -> Result<()> {
    const AT_ONCE: usize = 8;
    let (now, rest) = buffers.split_at(buffers.len().min(AT_ONCE));
    let mut held: [Option<HostAccess<'_>>; AT_ONCE] = Default::default();
    for (slot, (b, base, size, writes)) in held.iter_mut().zip(now) {
        let g = if *writes {
            b.host_write()
        } else {
            b.host_read()
        };
        let g = g.ok_or_else(|| Error::Unsupported {
            backend: name.to_string(),
            what: format!("buffer '{}' is not host memory", b.name()),
        })?;
        if g.base().as_ptr() as usize != *base || g.size() != *size {
            return Err(Error::Backend {
                backend: name.to_string(),
                message: format!("buffer '{}' moved after the graph was prepared", b.name()),
            });
        }
        *slot = Some(g);
    }
    if rest.is_empty() {
        f()
    } else {
        with_guards(name, rest, f)
    }
}

/// Alignment a tensor's element 0 needs for the kernels' typed accesses.
trait DTypeAlign {
    fn dtype_align(&self) -> usize;
}

impl DTypeAlign for Tensor {
    fn dtype_align(&self) -> usize {
        match self.dtype {
            rgml::DType::F32 | rgml::DType::I32 => 4,
            _ => 2,
        }
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &str {
        self.device.name()
    }

    fn device(&self) -> DeviceRef {
        self.device.clone()
    }

    fn graph_compute_async(&mut self, ctx: &Context, graph: &Graph) -> Result<()> {
        match self.job_for(ctx, graph)? {
            Some(job) => self.launch(job),
            None => Ok(()),
        }
    }

    /// The checked job (views, extents, barrier plan) for `graph`, holding its buffers.
    fn graph_plan_create(&mut self, ctx: &Context, graph: &Graph) -> Result<GraphPlan> {
        let job = self.prepare(ctx, graph)?.map(Arc::new);
        Ok(GraphPlan::new(
            ctx,
            graph,
            self.device.name(),
            Arc::new(CpuPlan(job)),
        ))
    }

    fn graph_plan_compute_async(&mut self, ctx: &Context, plan: &GraphPlan) -> Result<()> {
        plan.check_current(ctx)?;
        let Some(CpuPlan(job)) = plan.prepared::<CpuPlan>() else {
            return Err(Error::Unsupported {
                backend: self.device.name().to_string(),
                what: format!("a graph plan made by '{}'", plan.backend()),
            });
        };
        match job {
            Some(job) => self.launch(job.clone()),
            None => Ok(()),
        }
    }

    /// Asynchronous mode: checked now, then queued in order with the computations (the bytes
    /// are copied, so the caller may reuse `data` at once).
    fn set_tensor_async(
        &mut self,
        ctx: &Context,
        id: TensorId,
        offset: usize,
        data: &[u8],
    ) -> Result<()> {
        self.queue_write(ctx, id, offset, data.to_vec())
    }

    /// Asynchronous mode: wait for `src_backend`, read `src` now and queue its write into
    /// `dst` (so the write is ordered after this stream's queued work). Synchronous mode: not
    /// supported (`Ok(false)`), the caller copies.
    fn cpy_tensor_async(
        &mut self,
        src_backend: &mut dyn Backend,
        ctx: &Context,
        src: TensorId,
        dst: TensorId,
    ) -> Result<bool> {
        if self.worker.is_none() {
            return Ok(false);
        }
        let (ts, td) = (ctx.get(src)?, ctx.get(dst)?);
        if ts.nbytes() != td.nbytes() || ts.dtype != td.dtype {
            return Ok(false);
        }
        src_backend.synchronize()?;
        let bytes = ctx.tensor_bytes(src)?;
        self.queue_write(ctx, dst, 0, bytes)?;
        Ok(true)
    }

    fn synchronize(&mut self) -> Result<()> {
        match &self.worker {
            Some(w) => match w.queue.drain().error.take() {
                Some(e) => Err(e),
                None => Ok(()),
            },
            None => Ok(()),
        }
    }

    fn event_record(&mut self, event: &Event) -> Result<()> {
        let state = cpu_event(event).ok_or_else(|| Error::Unsupported {
            backend: self.name().to_string(),
            what: format!("events of device {}", event.device().name()),
        })?;
        let generation = state.record();
        match &self.worker {
            Some(w) => w.queue.push(Item::Signal(state, generation)),
            // Synchronous: all work so far is done.
            None => state.signal(generation),
        }
        Ok(())
    }

    fn event_wait(&mut self, event: &Event) -> Result<()> {
        let Some(state) = cpu_event(event) else {
            return event.synchronize();
        };
        let generation = state.recorded();
        match &self.worker {
            Some(w) => w.queue.push(Item::Wait(state, generation)),
            None => state.wait_for(generation),
        }
        Ok(())
    }
}

impl Drop for CpuBackend {
    /// Finish the queued work and join the worker.
    fn drop(&mut self) {
        if let Some(w) = &mut self.worker {
            w.queue.lock().shutdown = true;
            w.queue.more.notify_all();
            if let Some(t) = w.thread.take() {
                let _ = t.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rgml::alloc::alloc_ctx_tensors;
    use rgml::{DType, Device};

    /// Three products of one activation (q/k/v) share its quantized copy and run without
    /// barriers between them; nodes reading their results wait for them.
    #[test]
    fn products_of_one_activation_share_it_and_skip_barriers() {
        let mut ctx = Context::new();
        let x = ctx.new_tensor(DType::F32, &[64, 2]).unwrap();
        let n = ctx.rms_norm(x, 1e-5).unwrap();
        let w: Vec<TensorId> = (0..3)
            .map(|_| ctx.new_tensor(DType::Q8_0, &[64, 64]).unwrap())
            .collect();
        let p: Vec<TensorId> = w.iter().map(|&w| ctx.mul_mat(w, n).unwrap()).collect();
        let s = ctx.add(p[0], p[1]).unwrap();
        let s = ctx.add(s, p[2]).unwrap();
        alloc_ctx_tensors(&mut ctx, &crate::CpuDevice::new("CPU").buffer_type()).unwrap();
        let graph = Graph::build(&mut ctx, &[s]).unwrap();
        let be = CpuBackend::new(2).unwrap();
        let job = be.prepare(&ctx, &graph).unwrap().unwrap();
        let flags: Vec<(rgml::OpKind, bool, bool)> = job
            .tasks
            .iter()
            .map(|t| (t.op.kind(), t.sync_before, t.reuse_src1))
            .collect();
        use rgml::OpKind::*;
        assert_eq!(
            flags,
            [
                (RmsNorm, true, false),
                (MulMat, true, false),
                (MulMat, false, true),
                // Reads both products: waits for them.
                (Add, true, false),
                // Independent of that sum: no barrier, and still the same converted src1.
                (MulMat, false, true),
                (Add, true, false),
            ]
        );
    }
}
