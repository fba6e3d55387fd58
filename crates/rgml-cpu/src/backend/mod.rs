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

mod engine;
mod governor;
mod plan;
mod queue;

pub use engine::AbortCallback;
pub use queue::CpuEvent;

use crate::buffer::CPU_ALIGNMENT;
use crate::kernels::CpuFeatures;
use engine::Engine;
use plan::Job;
use queue::{cpu_event, worker_main, Item, Queue, Worker};
use rgml::backend::{AlignedMem, Event, GraphPlan};
use rgml::{Backend, Context, DeviceRef, Error, Graph, Result, TensorId};
use std::sync::{Arc, Mutex, MutexGuard};

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
                claims: Vec::new(),
                governor: governor::Governor::new(n_threads, true),
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
            // Cached jobs split some work by the old count (see `NodeTask::threads`).
            self.plans.clear();
            let mut e = self.engine_idle();
            e.n_threads = n;
            e.pool = None;
            e.governor = governor::Governor::new(n, e.governor.enabled());
        }
    }

    /// Whether graph runs may use fewer threads than [`CpuBackend::n_threads`] while other
    /// processes keep the cores busy (on by default; see `governor`). Off, every run uses
    /// them all, as for measuring what a fixed thread count does.
    pub fn set_adaptive_threads(&mut self, on: bool) {
        let mut e = self.engine_idle();
        let n = e.n_threads;
        e.governor = governor::Governor::new(n, on);
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
        let job = plan::prepare(
            self.device.name(),
            self.features,
            self.n_threads,
            ctx,
            graph,
        )?
        .map(Arc::new);
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
